// The run summary as a person reads it at the end of `tessel train`: the values of
// summary.json rounded as `tessel report` shows them (4 significant digits, no decimals from
// 1000 on; accuracies in percent, seconds to 0.1 s, bytes in MiB); summary.json keeps every
// digit.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace tessel::train {

// printf's format f of args as a string of up to 255 characters (the console's lines).
template <typename... Args>
std::string fmt(const char* f, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// One value of the summary under `key`, rounded as above; objects and arrays show each member
// so (an array's entries by the array's key), strings and booleans as they are.
std::string shown(const std::string& key, const nlohmann::json& value);

// ddp.balance's record (summary.json's "balance") in a line: "deal 21/11 straggler rank 1
// (x2.00 per shard) absorbed: 94% of its cost recovered, x1.45 vs an even deal" (the progress
// line's tail too).
std::string balance_text(const nlohmann::json& balance);

// The whole console summary: a heading naming run_dir/summary.json, then one line per key
// ("ranks": the load balance and the slowest rank only; "balance": balance_text).
std::string summary_text(const nlohmann::json& summary);

}  // namespace tessel::train

// The console summary at the end of `tessel train`, rounded as apps/tessel/report.py's shown().
#include "tessel/train/summary_text.h"

#include <cmath>
#include <cstdio>

namespace tessel::train {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// An integer with thousands separators: 1234567 -> "1,234,567".
std::string grouped(long long v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string number(const std::string& key, const nlohmann::json& value) {
  const double v = value.get<double>();
  // peak_rss_bytes, and each entry of peak_rss_bytes_per_rank
  if (key.find("_bytes") != std::string::npos) return fmt("%.1f MiB", v / kMiB);
  if (value.is_number_integer()) return grouped(value.get<long long>());
  if (key.ends_with("accuracy")) return fmt("%.2f%%", 100 * v);
  if (key.ends_with("seconds")) return fmt("%.1f s", v);
  if (std::isfinite(v) && std::abs(v) >= 1000) return grouped(std::llround(v));
  return fmt("%.4g", v);
}

}  // namespace

std::string shown(const std::string& key, const nlohmann::json& value) {
  if (value.is_number()) return number(key, value);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) {
    std::string out = "{";
    for (const auto& [k, v] : value.items())
      out += (out.size() > 1 ? ", " : "") + k + ": " + shown(k, v);
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (const nlohmann::json& v : value) out += (out.size() > 1 ? ", " : "") + shown(key, v);
    return out + "]";
  }
  return value.dump();  // true, false, null
}

std::string balance_text(const nlohmann::json& b) {
  std::string deal;
  for (const nlohmann::json& n : b["shards_per_rank"]) {
    if (!deal.empty()) deal += '/';
    deal += std::to_string(n.get<long long>());
  }
  std::string out = "deal " + deal;
  if (const nlohmann::json& s = b["straggler"]; !s.is_null())
    out += fmt(" straggler rank %d (x%.2f per shard)", s["rank"].get<int>(),
               s["slowdown_per_shard"].get<double>()) +
           fmt(" absorbed: %.0f%% of its cost recovered,", 100 * s["recovered"].get<double>()) +
           fmt(" x%.2f vs an even deal", b["speedup_vs_even"].get<double>());
  return out;
}

std::string summary_text(const nlohmann::json& s) {
  std::string out = "\n== summary (" + s.value("run_dir", std::string()) + "/summary.json) ==\n";
  for (const auto& [key, value] : s.items()) {
    const std::string shown_value =
        key == "ranks"  // per-rank detail stays in the file; show the load balance here
            ? fmt("load balance (max/mean step time) %.3f, slowest rank %d",
                  value["load_balance_max_over_mean"].get<double>(),
                  value["slowest_rank"].get<int>())
            : key == "balance" ? balance_text(value) : shown(key, value);
    out += fmt("  %-20s ", key.c_str()) + shown_value + "\n";
  }
  return out;
}

}  // namespace tessel::train

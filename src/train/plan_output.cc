// `tessel plan`'s answer: a text table (one row per layout, feasible ones first) and JSON.
#include "tessel/core/error.h"
#include "tessel/train/plan.h"
#include "tessel/train/summary_text.h"

namespace tessel::train {

using nlohmann::json;

namespace {

constexpr MemCategory kShown[] = {MemCategory::kParameters, MemCategory::kGradients,
                                  MemCategory::kOptimizer,  MemCategory::kActivations,
                                  MemCategory::kComm,       MemCategory::kOther};

}  // namespace

std::string options_str(const parallel::ParallelSpec& s) {
  std::string out = s.ps_servers > 0 ? "" : str("z", s.zero_stage);
  out += str(out.empty() ? "" : " ", name_of(s.precision));
  if (s.recompute != nn::Recompute::kNone) out += str(" rc=", name_of(s.recompute));
  if (s.pp_stages > 1) out += str(" m=", s.pp_microbatches);
  return out;
}

std::string size_str(double bytes) {
  return bytes >= 1e9 ? fmt("%.1fG", bytes / (1 << 30)) : fmt("%.1fM", bytes / (1 << 20));
}

json plan_json(const std::vector<Candidate>& plan, const PlanOptions& options) {
  json rows = json::array();
  for (const Candidate& c : plan) {
    json mem = json::object();
    for (MemCategory k : kShown) mem[mem_category_name(k)] = c.memory[k];
    mem["total"] = c.memory.total();
    rows.push_back({{"layout", c.layout},
                    {"options", options_str(c.spec)},
                    {"set", c.sets},
                    {"memory_bytes", mem},
                    {"step_seconds",
                     {{"compute", c.time.compute},
                      {"exposed_comm", c.time.comm},
                      {"bubble", c.time.bubble},
                      {"total", c.time.total()}}},
                    {"samples_per_second", c.samples_per_s},
                    {"feasible", c.overflow.empty()},
                    {"overflow", c.overflow}});
  }
  return {{"workers", options.workers},
          {"hosts", options.hosts},
          {"memory_per_rank", options.memory_per_rank},
          {"layouts", rows}};
}

std::string plan_table(const std::vector<Candidate>& plan, const PlanOptions& options) {
  std::string out =
      str(plan.size(), " layouts of ", options.workers, " ranks",
          options.hosts > 1 ? str(" on ", options.hosts, " hosts") : "",
          options.memory_per_rank > 0
              ? ", at most " + size_str(static_cast<double>(options.memory_per_rank)) + " per rank"
              : "",
          "; memory of the fullest rank, time of the slowest\n");
  out += fmt("%4s  %-18s %-24s %7s %7s %7s %7s %7s %8s %9s %8s %7s %9s  %s\n", "#", "layout",
             "options", "params", "grads", "optim", "acts", "comm", "total", "compute", "comm",
             "bubble", "samples/s", "fits");
  int rank = 0;
  for (const Candidate& c : plan) {
    out += fmt("%4d  %-18s %-24s %7s %7s %7s %7s %7s %8s %7.1fms %6.1fms %5.1fms %9.1f  %s\n",
               ++rank, c.layout.c_str(), options_str(c.spec).c_str(),
               size_str(c.memory[MemCategory::kParameters]).c_str(),
               size_str(c.memory[MemCategory::kGradients]).c_str(),
               size_str(c.memory[MemCategory::kOptimizer]).c_str(),
               size_str(c.memory[MemCategory::kActivations]).c_str(),
               size_str(c.memory[MemCategory::kComm]).c_str(), size_str(c.memory.total()).c_str(),
               1e3 * c.time.compute, 1e3 * c.time.comm, 1e3 * c.time.bubble, c.samples_per_s,
               c.overflow.empty() ? "yes" : ("no: " + c.overflow).c_str());
  }
  if (!plan.empty() && plan.front().overflow.empty())
    out += "best: tessel train CONFIG --workers " + std::to_string(options.workers) + " --set " +
           [&] {
             std::string s;
             for (const std::string& k : plan.front().sets) s += (s.empty() ? "" : " --set ") + k;
             return s;
           }() +
           "\n";
  else
    out += "no layout fits: the smallest, " + plan.front().layout + " " +
           options_str(plan.front().spec) + ", needs " + size_str(plan.front().memory.total()) +
           ", most of it " + plan.front().overflow + "\n";
  return out;
}

}  // namespace tessel::train

// What a pipeline stage tells the run's plan and per-rank report: its chunks and every stage's
// task order, and per stage the times, bubble and traffic of the schedule beside the schedule's
// model of its bubble (bubble_model).
#include <algorithm>

#include "tessel/parallel/layout.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/parallel/schedule.h"

namespace tessel::parallel {

using nlohmann::json;

json PipelineExecutor::plan() const {
  json chunks = json::array();
  for (size_t c = 0; c < part_.chunks(); ++c)
    chunks.push_back(
        {{"stage", part_.stage[c]}, {"blocks", json::array({part_.begin[c], part_.begin[c + 1]})}});
  const auto& schedule = this->schedule();  // each stage's task order for a full batch
  json orders = json::array();
  for (const auto& order : schedule)
    orders.push_back(order_str(part_, static_cast<int>(schedule.size()), order));
  return {{"pipeline_chunks", chunks}, {"pipeline_orders", orders}};
}

json PipelineExecutor::report(const std::vector<RankStats>& ranks, const Layout& layout) const {
  json stages = json::array();
  double bubble_sum = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankStats& s = ranks[r];
    const double busy = s.forward_s + s.backward_s;
    const double bubble = s.schedule_s > 0 ? std::max(0.0, 1.0 - busy / s.schedule_s) : 0.0;
    bubble_sum += bubble;
    stages.push_back(
        {{"rank", r},
         {"stage", static_cast<int>(s.stage)},
         {"replica", layout.coord(static_cast<int>(r)).dp},
         {"forward_seconds", s.forward_s},
         {"backward_seconds", s.backward_s},
         {"send_seconds", s.send_s},
         {"recv_wait_seconds", s.recv_wait_s},
         {"idle_seconds", std::max(0.0, s.schedule_s - busy)},
         {"schedule_seconds", s.schedule_s},
         {"bubble_fraction", bubble},
         {"peak_activation_bytes", s.mem_peak[static_cast<size_t>(MemCategory::kActivations)]},
         {"peak_inflight_microbatches", static_cast<int>(s.peak_inflight)},
         {"sent_bytes", s.sent_bytes}});
  }
  std::vector<std::vector<std::string>> blocks(static_cast<size_t>(layout.pp));
  for (size_t c = 0; c < part_.chunks(); ++c)
    for (size_t i = part_.begin[c]; i < part_.begin[c + 1]; ++i)
      blocks[static_cast<size_t>(part_.stage[c])].push_back(model_.block_name(i));
  json out = {{"pipeline_schedule", name_of(spec_.pp_schedule)},
              {"pipeline_microbatches", spec_.pp_microbatches},
              {"pipeline_partition", spec_.pp_cuts.empty() ? name_of(spec_.pp_partition) : "cuts"},
              {"pipeline_stage_blocks", blocks},
              {"pipeline_virtual_stages", spec_.pp_virtual_stages},
              {"pipeline_bubble_fraction_model",
               bubble_model(spec_.pp_schedule, layout.pp, static_cast<int>(spec_.pp_microbatches),
                            static_cast<int>(spec_.pp_virtual_stages))},
              {"pipeline_bubble_fraction_measured", bubble_sum / static_cast<double>(ranks.size())},
              {"pipeline_stages", stages}};
  if (!device_comm_.empty()) out["pipeline_device_comm"] = device_comm_;  // nccl or staged
  return out;
}

}  // namespace tessel::parallel

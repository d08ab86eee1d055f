// The run folder's guard and record. A fresh run refuses a folder that already holds a run
// (its results and checkpoints would mix with the new run's, and a later --resume could pick up
// either); --resume continues the run in it, --overwrite first removes what tessel wrote there
// (kRunFiles and the checkpoints) and nothing else. Every start appends to run.json: the tessel
// version and commit, the command line, the host, the world size and how it started.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"

namespace tessel::train {

enum class RunStart { kFresh, kResume, kOverwrite };

// The files and folders tessel writes at the top of a run folder, besides checkpoints/ (whose
// step folders and `latest` it removes one by one). A new output of the run folder is added here.
inline const std::vector<std::string> kRunFiles = {"config.toml", "metrics.jsonl", "summary.json",
                                                   "run.json",    "trace.json",    "report.html",
                                                   "tensorboard"};

struct RunRecord {
  std::string command;         // the command line as typed (argv, shell-quoted)
  std::string layout;          // e.g. "dp=4"
  std::string resumed_from;    // the checkpoint folder a resume continues from
  nlohmann::json layout_auto;  // layout = auto: what the plan picked and why (null: not auto)
};

// Collective over world: rank 0 checks run_dir, then (on success) clears it for kOverwrite and
// appends `record` to run.json; every rank throws the same InvalidArgument when the folder
// holds a run and start is kFresh, naming --resume and --overwrite.
void prepare_run_folder(comm::Communicator& world, const std::string& run_dir, RunStart start,
                        const RunRecord& record);

// Rank 0, after a resume loaded `dir`: when that is not the checkpoint run.json's last start
// names (a damaged newer one was passed over), the start names `dir` as resumed_from and the
// damaged one as passed_over.
void record_resumed_from(const std::string& run_dir, const std::string& dir);

// This machine's name (gethostname; "" when it has none): run.json's host, the trace's and the
// plan cache's, TensorBoard's event file name.
std::string host_name();

// What of a run `run_dir` holds (a file name of kRunFiles, "checkpoints/"), in that order;
// empty when it holds none (missing, empty, or only other files).
std::vector<std::string> run_files_in(const std::string& run_dir);

}  // namespace tessel::train

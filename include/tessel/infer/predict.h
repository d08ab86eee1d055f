// tessel predict: a checkpoint's model over an input file, forward only. The input is cut into
// chunks of infer.chunk_rows rows; replicas -- runtime.workers ranks as threads of this
// process, or the processes of an MPI job, pp.stages ranks each -- run chunks, and the outputs
// are written in input order to a JSONL or CSV file (output.h), so the file is the same bytes
// for any number of workers. With threads, chunks go to whichever replica asks next
// (ChunkQueue), and a replica that fails or stalls has its chunk re-run by the others; under
// MPI, replica d runs chunks d, d + dp, ... and rank 0 writes. --resume continues a killed job
// after its last committed chunk (OrderedWriter). docs/inference.md has the details.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessel/config/config.h"

namespace tessel::infer {

struct PredictOptions {
  std::string checkpoint;  // run folder, checkpoints folder or step folder
  std::string input, output;
  bool resume = false;
};

// Runs the job on the layout the config asks for (runtime.backend, runtime.workers,
// pp.stages). Returns the summary on rank 0 (rows, chunks, rows_per_second, layout, re-runs,
// per-rank memory), null on other MPI ranks. Throws InvalidArgument / IoError naming what is
// wrong with the input, output, checkpoint or layout.
nlohmann::json predict(const train::Config& config, const PredictOptions& options);

}  // namespace tessel::infer

// predict: the entry point and the threads driver (ranks as threads of this process). The loop
// every rank runs is in predict_replica.cc, the MPI driver in predict_mpi.cc.
#include "tessel/infer/predict.h"

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "predict_mpi.h"
#include "predict_replica.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/mpi.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/infer/ordered_writer.h"
#include "tessel/ops/cpu.h"

namespace tessel::infer {
namespace detail {
namespace {

PredictSetup make_setup(const train::Config& config, const PredictOptions& options) {
  PredictSetup setup{config,
                     options,
                     model_info(config, options.checkpoint),
                     output_format(options.output),
                     config.parallel,
                     nlohmann::json()};
  setup.spec.ps_servers = 0;  // a training layout; inference runs replicas of pp stages
  setup.spec.zero_stage = 0;
  if (setup.info.generates() && (setup.spec.pp_stages > 1 || setup.spec.tp_size > 1)) {
    // A checkpoint of any layout loads whole: the training run's own config generates as is.
    log_info("predict: generation runs the whole gpt model on each worker; the config's ",
             "pp.stages = ", setup.spec.pp_stages, " and tp.size = ", setup.spec.tp_size,
             " are a training layout, so the workers run as data-parallel replicas");
    setup.spec.pp_stages = setup.spec.tp_size = 1;
  }
  open_input(options.input, setup.info, config.data);  // a bad input fails before any output
  std::error_code ec;
  const auto input_bytes = std::filesystem::file_size(options.input, ec);
  const train::InferSpec& s = config.infer;
  setup.identity = {{"input", std::filesystem::absolute(options.input).string()},
                    {"input_bytes", ec ? -1 : static_cast<int64_t>(input_bytes)},
                    {"checkpoint", setup.info.checkpoint->dir()},
                    {"chunk_rows", s.chunk_rows},
                    {"model", name_of(config.model.kind)}};
  if (setup.info.generates())
    setup.identity.update({{"max_new_tokens", s.max_new_tokens},
                           {"temperature", s.temperature},
                           {"sample_top_k", s.sample_top_k},
                           {"seed", config.seed}});
  else
    setup.identity["top_k"] = s.top_k;
  return setup;
}
// Ranks as threads: replicas take chunks from a shared queue.
class QueueChunkIo final : public ChunkIo {
 public:
  QueueChunkIo(ChunkQueue& queue, int replica) : queue_(queue), replica_(replica) {}
  bool take(Chunk& chunk) override { return queue_.take(replica_, chunk); }
  void finish(int64_t id, std::string bytes, int64_t rows) override {
    queue_.finish(replica_, id, std::move(bytes), rows);
  }
  void sleep(double seconds) override { queue_.sleep(seconds); }
  void die(const std::string& why) override { throw Error(why); }

 private:
  ChunkQueue& queue_;
  int replica_;
};

struct ThreadsRun {
  std::vector<int64_t> peak_bytes, chunks;
};

// One rank of the threads driver. Setup errors end the job (the exception leaves run_threads);
// a failure while running fails this rank's replica only, unless it is bad input.
void thread_rank(const PredictSetup& setup, comm::Communicator& world, ChunkQueue& queue,
                 ThreadsRun& run) {
  auto ledger = std::make_shared<MemoryLedger>(setup.config.parallel.memory_limit_mb << 20,
                                               str("rank ", world.rank()));
  MemoryScope memory(ledger, MemCategory::kOther);
  parallel::Mesh mesh(world, parallel::Layout::resolve(setup.spec, world.size()));
  const RankInReplica place = rank_in_replica(mesh);
  Replica replica(setup.config, setup.info, place.pp, place.tp);
  world.barrier();  // every replica loaded: none waits for a late one's chunks at the start
  QueueChunkIo io(queue, place.replica);
  const std::unique_ptr<ChunkIo> faulty = faulty_chunk_io(io, setup.config, world.rank());
  const size_t r = static_cast<size_t>(world.rank());
  try {
    run.chunks[r] = run_replica(setup, replica, faulty ? *faulty : io, place);
  } catch (const InvalidArgument&) {
    queue.abort(std::current_exception());
  } catch (const IoError&) {
    queue.abort(std::current_exception());
  } catch (const std::exception& e) {
    queue.fail(place.replica, str("rank ", world.rank(), ": ", e.what()));
    if (place.pp) place.pp->abort(e.what());
    if (place.tp) place.tp->abort(e.what());
  }
  run.peak_bytes[r] = ledger->peak_total();
}

nlohmann::json predict_threads(const PredictSetup& setup) {
  const int world = setup.config.runtime.workers;
  const parallel::Layout layout = parallel::Layout::resolve(setup.spec, world);
  OrderedWriter writer(setup.options.output, setup.identity,
                       setup.format == OutputFormat::kCsv
                           ? csv_header(setup.info.generates(), setup.info.spec.task,
                                        setup.config.infer.top_k, setup.info.spec.num_classes)
                           : "",
                       setup.options.resume, setup.config.infer.commit_every_s);
  const int64_t first_chunk = writer.next_chunk(), first_rows = writer.rows();
  nlohmann::json summary = {{"output", setup.options.output},
                            {"layout", layout.str()},
                            {"workers", world},
                            {"resumed_at_chunk", first_chunk}};
  if (writer.complete()) {  // resumed after the end: nothing to do
    summary.update({{"rows", writer.rows()}, {"complete", true}});
    return summary;
  }
  auto input = open_input(setup.options.input, setup.info, setup.config.data);
  ChunkQueue queue(*input, setup.config.infer.chunk_rows, first_chunk, layout.dp,
                   setup.config.infer.chunk_timeout_s);
  ThreadsRun run{std::vector<int64_t>(world), std::vector<int64_t>(world)};
  comm::CommOptions co;
  co.timeout_s = setup.config.comm.timeout_s;
  std::promise<void> ended;
  std::thread runner([&] {
    try {
      comm::run_threads(
          world, [&](comm::Communicator& w) { thread_rank(setup, w, queue, run); }, co);
    } catch (...) {
      queue.abort(std::current_exception());
    }
    ended.set_value();
  });
  try {
    std::vector<ChunkQueue::Output> ready;
    while (queue.next(ready)) {
      for (const auto& o : ready) writer.append(o.id, o.bytes, o.rows);
      if (writer.due()) writer.commit();
    }
    writer.finish();
  } catch (...) {
    queue.abort(std::current_exception());
    runner.join();
    throw;
  }
  const double seconds = now_seconds() - queue.started();
  // A replica stuck for good in a kernel cannot be joined; the job is done without it.
  if (ended.get_future().wait_for(std::chrono::duration<double>(setup.config.infer.chunk_timeout_s +
                                                                5)) == std::future_status::ready)
    runner.join();
  else
    runner.detach(), log_warn("predict: a worker is still stuck; leaving it behind");
  add_run_figures(summary, writer, first_rows, seconds, run.chunks, run.peak_bytes);
  summary.update({{"reruns", queue.reruns()}, {"failed_workers", queue.failed()}});
  return summary;
}

}  // namespace

}  // namespace detail

nlohmann::json predict(const train::Config& config, const PredictOptions& options) {
  const detail::PredictSetup setup = detail::make_setup(config, options);
  // One BLAS thread per rank everywhere: the same kernels, so the same bytes, in every layout.
  ops::set_blas_threads(1);
  retain_freed_memory();
  if (train::resolve_backend(config, comm::mpi_launched()) == comm::Backend::kMpi)
    return detail::predict_mpi(setup);
  return detail::predict_threads(setup);
}

}  // namespace tessel::infer

// predict: the job, the loop each rank runs, and the threads driver (the MPI driver is in
// predict_mpi.cc).
#include "tessel/infer/predict.h"

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "predict_internal.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/mpi.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/infer/generate.h"
#include "tessel/infer/ordered_writer.h"
#include "tessel/ops/cpu.h"

namespace tessel::infer {
namespace detail {
namespace {

// The output bytes of one chunk's rows (on the last stage; empty elsewhere).
// A first stage's tensor-parallel ranks all run the rows their lead read.
void share_rows(const Job& job, comm::Communicator& tp, Rows& rows, int64_t count) {
  if (tp.rank() != 0) {
    Shape shape = job.info.spec.input_shape;
    shape.insert(shape.begin(), count);
    rows.x = Tensor::empty(shape, job.info.input_dtype);
  }
  tp.broadcast(rows.x, 0);
}

std::string run_chunk(const Job& job, Replica& replica, int64_t id, const Rows& rows,
                      int64_t count) {
  const train::InferSpec& s = job.config.infer;
  const int64_t first = id * s.chunk_rows;
  if (!job.info.generates()) {
    const Tensor logits = replica.forward(rows.x, count, first);
    return replica.last_stage()
               ? format_classes(logits, first, s.top_k, job.format, job.info.spec.task)
               : "";
  }
  std::vector<Prompt> prompts;
  for (int64_t r = 0; r < count; ++r) {
    try {
      prompts.push_back({encode(rows.lines[r], job.info.tokenizer.get()), s.max_new_tokens,
                         static_cast<uint64_t>(first + r)});
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(
          str("predict: row ", first + r, " of ", job.options.input, ": ", e.what()));
    }
  }
  const SampleOptions opts{s.temperature, s.sample_top_k, job.config.seed, s.kv_cache};
  std::vector<std::string> texts;
  for (int64_t lo = 0; lo < count; lo += s.batch) {
    const std::vector<Prompt> batch(prompts.begin() + lo,
                                    prompts.begin() + std::min(count, lo + s.batch));
    try {
      for (const auto& t : generate(replica.model(), batch, opts))
        texts.push_back(decode(t, job.info.tokenizer.get()));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(str("predict: rows ", first + lo, "..", first + lo + batch.size() - 1,
                                " of ", job.options.input, ": ", e.what()));
    }
  }
  return format_texts(rows.lines, texts, first, job.format);
}

Job make_job(const train::Config& config, const PredictOptions& options) {
  Job job{config,
          options,
          model_info(config, options.checkpoint),
          output_format(options.output),
          config.parallel,
          nlohmann::json()};
  job.spec.ps_servers = 0;  // a training layout; inference runs replicas of pp stages
  job.spec.zero_stage = 0;
  if (job.info.generates() && (job.spec.pp_stages > 1 || job.spec.tp_size > 1)) {
    // A checkpoint of any layout loads whole: the training run's own config generates as is.
    log_info("predict: generation runs the whole gpt model on each worker; the config's ",
             "pp.stages = ", job.spec.pp_stages, " and tp.size = ", job.spec.tp_size,
             " are a training layout, so the workers run as data-parallel replicas");
    job.spec.pp_stages = job.spec.tp_size = 1;
  }
  open_input(options.input, job.info, config.data);  // a bad input fails before any output
  std::error_code ec;
  const auto input_bytes = std::filesystem::file_size(options.input, ec);
  const train::InferSpec& s = config.infer;
  job.identity = {{"input", std::filesystem::absolute(options.input).string()},
                  {"input_bytes", ec ? -1 : static_cast<int64_t>(input_bytes)},
                  {"checkpoint", job.info.checkpoint->dir()},
                  {"chunk_rows", s.chunk_rows},
                  {"model", name_of(config.model.kind)}};
  if (job.info.generates())
    job.identity.update({{"max_new_tokens", s.max_new_tokens},
                         {"temperature", s.temperature},
                         {"sample_top_k", s.sample_top_k},
                         {"seed", config.seed}});
  else
    job.identity["top_k"] = s.top_k;
  return job;
}

// Ranks as threads: replicas take chunks from a shared queue.
class QueueFeed final : public Feed {
 public:
  QueueFeed(ChunkQueue& queue, int replica) : queue_(queue), replica_(replica) {}
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
void thread_rank(const Job& job, comm::Communicator& world, ChunkQueue& queue, ThreadsRun& run) {
  auto ledger = std::make_shared<MemoryLedger>(job.config.parallel.memory_limit_mb << 20,
                                               str("rank ", world.rank()));
  MemoryScope memory(ledger, MemCategory::kOther);
  parallel::Mesh mesh(world, parallel::Layout::resolve(job.spec, world.size()));
  const Place place = place_of(mesh);
  Replica replica(job.config, job.info, place.pp, place.tp);
  world.barrier();  // every replica loaded: none waits for a late one's chunks at the start
  QueueFeed feed(queue, place.replica);
  const std::unique_ptr<Feed> faulty = faulty_feed(feed, job.config, world.rank());
  const size_t r = static_cast<size_t>(world.rank());
  try {
    run.chunks[r] = run_replica(job, replica, faulty ? *faulty : feed, place);
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

nlohmann::json predict_threads(const Job& job) {
  const int world = job.config.runtime.workers;
  const parallel::Layout layout = parallel::Layout::resolve(job.spec, world);
  OrderedWriter writer(job.options.output, job.identity,
                       job.format == OutputFormat::kCsv
                           ? csv_header(job.info.generates(), job.info.spec.task,
                                        job.config.infer.top_k, job.info.spec.num_classes)
                           : "",
                       job.options.resume, job.config.infer.commit_every_s);
  const int64_t first_chunk = writer.next_chunk(), first_rows = writer.rows();
  nlohmann::json summary = {{"output", job.options.output},
                            {"layout", layout.str()},
                            {"workers", world},
                            {"resumed_at_chunk", first_chunk}};
  if (writer.complete()) {  // resumed after the end: nothing to do
    summary.update({{"rows", writer.rows()}, {"complete", true}});
    return summary;
  }
  auto input = open_input(job.options.input, job.info, job.config.data);
  ChunkQueue queue(*input, job.config.infer.chunk_rows, first_chunk, layout.dp,
                   job.config.infer.chunk_timeout_s);
  ThreadsRun run{std::vector<int64_t>(world), std::vector<int64_t>(world)};
  comm::CommOptions co;
  co.timeout_s = job.config.comm.timeout_s;
  std::promise<void> ended;
  std::thread runner([&] {
    try {
      comm::run_threads(
          world, [&](comm::Communicator& w) { thread_rank(job, w, queue, run); }, co);
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
  if (ended.get_future().wait_for(std::chrono::duration<double>(job.config.infer.chunk_timeout_s +
                                                                5)) == std::future_status::ready)
    runner.join();
  else
    runner.detach(), log_warn("predict: a worker is still stuck; leaving it behind");
  add_run_figures(summary, writer, first_rows, seconds, run.chunks, run.peak_bytes);
  summary.update({{"reruns", queue.reruns()}, {"failed_workers", queue.failed()}});
  return summary;
}

}  // namespace

void add_run_figures(nlohmann::json& summary, const OrderedWriter& writer, int64_t first_rows,
                     double seconds, const std::vector<int64_t>& chunks,
                     const std::vector<int64_t>& peak_bytes) {
  const int64_t rows = writer.rows() - first_rows;
  summary.update({{"rows", writer.rows()},
                  {"chunks", writer.next_chunk()},
                  {"rows_this_run", rows},
                  {"seconds", seconds},
                  {"rows_per_second", seconds > 0 ? rows / seconds : 0.0},
                  {"chunks_per_rank", chunks},
                  {"peak_bytes_per_rank", peak_bytes},
                  {"huge_page_bytes", huge_page_bytes()},
                  {"complete", true}});
}

Place place_of(parallel::Mesh& mesh) {
  Place p;
  p.replica = mesh.coord().dp;
  if (mesh.layout().pp > 1) p.pp = &mesh.group(parallel::Axis::kPp);
  if (mesh.layout().tp > 1) p.tp = &mesh.group(parallel::Axis::kTp);
  return p;
}

namespace {

class FaultyFeed final : public Feed {
 public:
  // delay_s < 0: no sleep; kill_after < 0: no death.
  FaultyFeed(Feed& inner, double delay_s, int64_t kill_after, int rank)
      : inner_(inner), delay_s_(delay_s), kill_after_(kill_after), rank_(rank) {}

  bool take(Chunk& chunk) override { return inner_.take(chunk); }
  void finish(int64_t id, std::string bytes, int64_t rows) override {
    inner_.finish(id, std::move(bytes), rows);
  }
  void sleep(double seconds) override { inner_.sleep(seconds); }
  void die(const std::string& why) override { inner_.die(why); }
  void before_chunk(int64_t done) override {
    if (delay_s_ >= 0) inner_.sleep(delay_s_);
    if (done == kill_after_)
      inner_.die(str("debug.kill_rank: rank ", rank_, " dies after ", done, " chunks"));
  }

 private:
  Feed& inner_;
  double delay_s_;
  int64_t kill_after_;
  int rank_;
};

}  // namespace

std::unique_ptr<Feed> faulty_feed(Feed& feed, const train::Config& config, int rank) {
  const bool slow = rank == config.parallel.slow_rank, dies = rank == config.infer.kill_rank;
  if (!slow && !dies) return nullptr;
  return std::make_unique<FaultyFeed>(feed, slow ? config.parallel.delay_ms / 1000.0 : -1.0,
                                      dies ? config.infer.kill_after : -1, rank);
}

int64_t run_replica(const Job& job, Replica& replica, Feed& feed, const Place& place) {
  int64_t done = 0;
  for (;; ++done) {
    // The first stage's lead picks the chunk; the others learn its number and size (over tp
    // first: every stage's pp group then has it on its first stage).
    Chunk chunk;
    int64_t head[2] = {-1, 0};
    if (replica.first_stage() && place.lead() && feed.take(chunk))
      head[0] = chunk.id, head[1] = chunk.rows.count;
    if (place.tp) place.tp->broadcast(head, 2, comm::ElemType::kI64, 0);
    if (place.pp) place.pp->broadcast(head, 2, comm::ElemType::kI64, 0);
    if (head[0] < 0) return done;
    feed.before_chunk(done);
    if (place.tp && replica.first_stage()) share_rows(job, *place.tp, chunk.rows, head[1]);
    std::string bytes = run_chunk(job, replica, head[0], chunk.rows, head[1]);
    if (replica.last_stage() && place.lead()) feed.finish(head[0], std::move(bytes), head[1]);
  }
}

}  // namespace detail

nlohmann::json predict(const train::Config& config, const PredictOptions& options) {
  const detail::Job job = detail::make_job(config, options);
  // One BLAS thread per rank everywhere: the same kernels, so the same bytes, in every layout.
  ops::set_blas_threads(1);
  retain_freed_memory();
  std::string backend = config.runtime.backend;
  if (backend == "auto") backend = comm::mpi_launched() ? "mpi" : "threads";
  if (backend == "mpi") {
    if (config.runtime.workers > 1)
      throw InvalidArgument(
          "predict: runtime.workers (--workers) is for ranks as threads; under "
          "mpirun use -np instead");
    return detail::predict_mpi(job);
  }
  return detail::predict_threads(job);
}

}  // namespace tessel::infer

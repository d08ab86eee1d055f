// predict under MPI: one rank per process, no shared queue. Replica d runs chunks d, d + dp,
// d + 2 dp, ...; its first stage reads the input itself (skipping the other replicas' chunks)
// and its last stage sends each chunk's output bytes to rank 0, which writes them in input
// order: before it starts a chunk of its own it receives, in order, every output of the chunks
// before it. A killed job loses at most the chunks after the last commit; --resume (rank 0
// reads the progress file and tells every rank where to start) runs only those.
#include "predict_mpi.h"

#include <chrono>
#include <csignal>
#include <thread>

#include "tessel/comm/mpi.h"
#include "tessel/core/clock.h"
#include "tessel/infer/ordered_writer.h"

namespace tessel::infer::detail {
namespace {

constexpr int kOutputTag = 17;

class MpiChunkIo final : public ChunkIo {
 public:
  // input: on first stages; writer: on rank 0.
  MpiChunkIo(const PredictSetup& setup, comm::Communicator& world, const parallel::Layout& layout,
             int replica, InputReader* input, OrderedWriter* writer, int64_t first_chunk)
      : setup_(setup),
        world_(world),
        layout_(layout),
        replica_(replica),
        input_(input),
        writer_(writer),
        cursor_(first_chunk),
        next_commit_(first_chunk) {
    const int64_t skip = first_chunk * setup.config.infer.chunk_rows;
    if (input_ && skip > 0 && input_->skip(skip) < skip)
      throw InvalidArgument(str("predict: --resume: the progress file counts ", first_chunk,
                                " chunks but the input is shorter; resume with the same input"));
  }

  bool take(Chunk& chunk) override {
    const int64_t R = setup_.config.infer.chunk_rows;
    for (;; ++cursor_) {
      if (cursor_ % layout_.dp == replica_) {
        Rows rows = input_->read(R);
        if (rows.count == 0) break;
        collect(cursor_);
        chunk = {cursor_++, std::move(rows)};
        if (started_ == 0) started_ = now_seconds();
        return true;
      }
      if (input_->skip(R) == 0) break;
    }
    collect(cursor_);  // the input holds cursor_ chunks
    return false;
  }

  void finish(int64_t id, std::string bytes, int64_t rows) override {
    if (writer_) {  // rank 0 is this replica's last stage: the chunks before are written
      writer_->append(id, bytes, rows);
      ++next_commit_;
      dirty_ = true;  // committed with the next chunks collected, when due
      return;
    }
    const int64_t head[3] = {id, static_cast<int64_t>(bytes.size()), rows};
    world_.send(head, 3, comm::ElemType::kI64, 0, kOutputTag);
    world_.send(bytes.data(), bytes.size(), comm::ElemType::kU8, 0, kOutputTag);
  }

  void sleep(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  void die(const std::string&) override { std::raise(SIGKILL); }

  double started() const { return started_; }

 private:
  // Rank 0: receives, in order, the outputs of every chunk before `end` and commits them
  // (with its own chunks appended since the last commit).
  void collect(int64_t end) {
    if (!writer_) return;
    for (; next_commit_ < end; ++next_commit_, dirty_ = true) {
      const int replica = static_cast<int>(next_commit_ % layout_.dp);
      const int from = layout_.rank_of({replica, layout_.pp - 1, 0});
      TESSEL_CHECK(from != 0, "predict: chunk ", next_commit_, " of rank 0 is not committed");
      int64_t head[3];
      world_.recv(head, 3, comm::ElemType::kI64, from, kOutputTag);
      if (head[0] != next_commit_ || head[1] < 0)
        throw CommError(str("predict: rank 0 expected the output of chunk ", next_commit_,
                            " from rank ", from, ", got chunk ", head[0], " (", head[1],
                            " bytes); every rank must run the same config and input"));
      std::string bytes(static_cast<size_t>(head[1]), '\0');
      world_.recv(bytes.data(), bytes.size(), comm::ElemType::kU8, from, kOutputTag);
      writer_->append(next_commit_, bytes, head[2]);
    }
    if (dirty_ && writer_->due()) {
      writer_->commit();
      dirty_ = false;
    }
  }

  const PredictSetup& setup_;
  comm::Communicator& world_;
  const parallel::Layout& layout_;
  int replica_;
  InputReader* input_;
  OrderedWriter* writer_;
  int64_t cursor_, next_commit_;
  bool dirty_ = false;  // appended since the last commit
  double started_ = 0;
};

}  // namespace

nlohmann::json predict_mpi(const PredictSetup& setup) {
  comm::CommOptions co;
  co.timeout_s = setup.config.comm.timeout_s;
  comm::Communicator world = comm::mpi_world(co);
  const parallel::Layout layout = parallel::Layout::resolve(setup.spec, world.size());
  std::unique_ptr<OrderedWriter> writer;
  int64_t first[2] = {0, 0};  // first chunk, complete
  if (world.rank() == 0) {
    writer = std::make_unique<OrderedWriter>(
        setup.options.output, setup.identity,
        setup.format == OutputFormat::kCsv
            ? csv_header(setup.info.generates(), setup.info.spec.task, setup.config.infer.top_k,
                         setup.info.spec.num_classes)
            : "",
        setup.options.resume, setup.config.infer.commit_every_s);
    first[0] = writer->next_chunk();
    first[1] = writer->complete();
  }
  world.broadcast(first, 2, comm::ElemType::kI64, 0);
  nlohmann::json summary = {{"output", setup.options.output},
                            {"layout", layout.str()},
                            {"workers", world.size()},
                            {"backend", "mpi"},
                            {"resumed_at_chunk", first[0]}};
  if (first[1]) {
    if (world.rank() != 0) return nullptr;
    summary.update({{"rows", writer->rows()}, {"complete", true}});
    return summary;
  }
  const int64_t first_rows = writer ? writer->rows() : 0;
  auto ledger = std::make_shared<MemoryLedger>(setup.config.parallel.memory_limit_mb << 20,
                                               str("rank ", world.rank()));
  MemoryScope memory(ledger, MemCategory::kOther);
  parallel::Mesh mesh(world, layout);
  const RankInReplica place = rank_in_replica(mesh);
  Replica replica(setup.config, setup.info, place.pp, place.tp);
  std::unique_ptr<InputReader> input;
  if (replica.first_stage() && place.lead())
    input = open_input(setup.options.input, setup.info, setup.config.data);
  MpiChunkIo io(setup, world, layout, place.replica, input.get(), writer.get(), first[0]);
  const std::unique_ptr<ChunkIo> faulty = faulty_chunk_io(io, setup.config, world.rank());
  world.barrier();  // every replica loaded before the clock starts
  const int64_t chunks = run_replica(setup, replica, faulty ? *faulty : io, place);
  if (writer) writer->finish();
  // Every rank's chunk count and peak bytes, for rank 0's summary.
  std::vector<int64_t> mine = {chunks, ledger->peak_total()}, all(2 * world.size());
  world.allgather(mine.data(), all.data(), 2, comm::ElemType::kI64);
  if (world.rank() != 0) return nullptr;
  std::vector<int64_t> per_rank_chunks, peak;
  for (int r = 0; r < world.size(); ++r) {
    per_rank_chunks.push_back(all[2 * r]);
    peak.push_back(all[2 * r + 1]);
  }
  add_run_figures(summary, *writer, first_rows, now_seconds() - io.started(), per_rank_chunks,
                  peak);
  return summary;
}

}  // namespace tessel::infer::detail

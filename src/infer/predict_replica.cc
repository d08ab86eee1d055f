// The loop every rank of predict runs, whichever driver started it (predict_replica.h).
#include "predict_replica.h"

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/infer/generate.h"

namespace tessel::infer::detail {
namespace {

// A first stage's tensor-parallel ranks all run the rows their lead read.
void share_rows(const PredictSetup& setup, comm::Communicator& tp, Rows& rows, int64_t count) {
  if (tp.rank() != 0) {
    Shape shape = setup.info.spec.input_shape;
    shape.insert(shape.begin(), count);
    rows.x = Tensor::empty(shape, setup.info.input_dtype);
  }
  tp.broadcast(rows.x, 0);
}

// The output bytes of one chunk's rows (on the last stage; empty elsewhere).
std::string run_chunk(const PredictSetup& setup, Replica& replica, int64_t id, const Rows& rows,
                      int64_t count) {
  const train::InferSpec& s = setup.config.infer;
  const int64_t first = id * s.chunk_rows;
  if (!setup.info.generates()) {
    const Tensor logits = replica.forward(rows.x, count, first);
    return replica.last_stage()
               ? format_classes(logits, first, s.top_k, setup.format, setup.info.spec.task)
               : "";
  }
  std::vector<Prompt> prompts;
  for (int64_t r = 0; r < count; ++r) {
    try {
      prompts.push_back({encode(rows.lines[r], setup.info.tokenizer.get()), s.max_new_tokens,
                         static_cast<uint64_t>(first + r)});
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(
          str("predict: row ", first + r, " of ", setup.options.input, ": ", e.what()));
    }
  }
  const SampleOptions opts{s.temperature, s.sample_top_k, setup.config.seed, s.kv_cache};
  std::vector<std::string> texts;
  for (int64_t lo = 0; lo < count; lo += s.batch) {
    const std::vector<Prompt> batch(prompts.begin() + lo,
                                    prompts.begin() + std::min(count, lo + s.batch));
    try {
      for (const auto& t : generate(replica.model(), batch, opts))
        texts.push_back(decode(t, setup.info.tokenizer.get()));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(str("predict: rows ", first + lo, "..", first + lo + batch.size() - 1,
                                " of ", setup.options.input, ": ", e.what()));
    }
  }
  return format_texts(rows.lines, texts, first, setup.format);
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

RankInReplica rank_in_replica(parallel::Mesh& mesh) {
  RankInReplica p;
  p.replica = mesh.coord().dp;
  if (mesh.layout().pp > 1) p.pp = &mesh.group(parallel::Axis::kPp);
  if (mesh.layout().tp > 1) p.tp = &mesh.group(parallel::Axis::kTp);
  return p;
}

namespace {

class FaultyChunkIo final : public ChunkIo {
 public:
  // delay_s < 0: no sleep; kill_after < 0: no death.
  FaultyChunkIo(ChunkIo& inner, double delay_s, int64_t kill_after, int rank)
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
  ChunkIo& inner_;
  double delay_s_;
  int64_t kill_after_;
  int rank_;
};

}  // namespace

std::unique_ptr<ChunkIo> faulty_chunk_io(ChunkIo& io, const train::Config& config, int rank) {
  const bool slow = rank == config.parallel.slow_rank, dies = rank == config.infer.kill_rank;
  if (!slow && !dies) return nullptr;
  return std::make_unique<FaultyChunkIo>(io, slow ? config.parallel.delay_ms / 1000.0 : -1.0,
                                         dies ? config.infer.kill_after : -1, rank);
}

int64_t run_replica(const PredictSetup& setup, Replica& replica, ChunkIo& io,
                    const RankInReplica& place) {
  int64_t done = 0;
  for (;; ++done) {
    // The first stage's lead picks the chunk; the others learn its number and size (over tp
    // first: every stage's pp group then has it on its first stage).
    Chunk chunk;
    int64_t head[2] = {-1, 0};
    if (replica.first_stage() && place.lead() && io.take(chunk))
      head[0] = chunk.id, head[1] = chunk.rows.count;
    if (place.tp) place.tp->broadcast(head, 2, comm::ElemType::kI64, 0);
    if (place.pp) place.pp->broadcast(head, 2, comm::ElemType::kI64, 0);
    if (head[0] < 0) return done;
    io.before_chunk(done);
    if (place.tp && replica.first_stage()) share_rows(setup, *place.tp, chunk.rows, head[1]);
    std::string bytes = run_chunk(setup, replica, head[0], chunk.rows, head[1]);
    if (replica.last_stage() && place.lead()) io.finish(head[0], std::move(bytes), head[1]);
  }
}

}  // namespace tessel::infer::detail

// Gradient compression: the codecs' math (stochastic rounding, top-k, Gram-Schmidt), each
// codec's exchange on 2 and 4 ranks as threads against the plain sum, with the bytes the
// transport counted within 5% of the codec's formula; error feedback conserves the gradient;
// compressed data parallelism trains (fp16/bf16 close to f32; pipelined exchanges give the
// blocking ones' bits), reports its bytes, and so does every layout compression composes with
// (ZeRO-1/2, dp2 x pp2, tp2 x dp2, bf16/fp16 precision: within the codec's tolerance of the same
// layout uncompressed, bytes within 5% of the formula); a resumed compressed run (data parallel,
// ZeRO-2, or parameter-server top-k pushes) ends bit-identical to an uninterrupted one, and the
// push residuals also resume on other servers and buckets; parameter-server pushes travel as
// one message per unit shard, their bytes the formula's; bad keys are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "../../src/parallel/compress/codecs.h"
#include "tessel/comm/threads.h"
#include "tessel/ops/quantize.h"
#include "tessel/parallel/engine.h"
#include "tessel/parallel/parameter_server.h"
#include "tessel/parallel/units.h"
#include "train_on.h"

namespace tessel {
namespace {

using parallel::CompressKind;
using parallel::CompressSpec;
using parallel::compress::Codec;
using parallel::compress::Exchange;
using parallel::compress::Segment;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Runs one codec's exchanges on `world` ranks as threads, each rank encoding gradient g(rank);
// returns rank 0's decoded result and checks every rank decoded the same values and that the
// bytes each rank's transport sent are within 5% of the formula.
using Pool = parallel::compress::BufferPool;

std::vector<float> exchange_on(int world, const std::function<std::unique_ptr<Codec>(Pool&)>& make,
                               const std::function<std::vector<float>(int)>& g,
                               const std::vector<Segment>& segments, int64_t step = 0) {
  std::vector<std::vector<float>> out(static_cast<size_t>(world));
  comm::CommOptions options;
  options.thresholds.ring_min_bytes = 0;  // ring at every size: the formula's algorithm
  comm::run_threads(
      world,
      [&](comm::Communicator& c) {
        Pool pool(static_cast<int64_t>(g(0).size()));  // the codec's message buffers
        std::unique_ptr<Codec> codec = make(pool);
        std::vector<float> grad = g(c.rank());
        const uint64_t before = c.transport().sent_bytes();
        std::optional<Exchange> ex = codec->encode(grad.data(), {7, step, 3, c.rank(), world});
        double formula = 0;  // what the summaries report: each exchange's formula
        while (ex) {
          formula += ex->bytes(world);
          ex->start(c, false, {});
          ex = codec->next(grad.data());
        }
        const double sent = static_cast<double>(c.transport().sent_bytes() - before);
        EXPECT_NEAR(sent, formula, 0.05 * formula) << world;
        out[static_cast<size_t>(c.rank())] = grad;
      },
      options);
  for (int r = 1; r < world; ++r)  // the exchanged elements (the rest is each rank's own)
    for (const Segment& s : segments)
      for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
        EXPECT_EQ(out[0][i], out[static_cast<size_t>(r)][i]) << "rank " << r << " element " << i;
  return out[0];
}

std::vector<float> plain_sum(int world, const std::function<std::vector<float>(int)>& g) {
  std::vector<float> sum = g(0);
  for (int r = 1; r < world; ++r) {
    const std::vector<float> x = g(r);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  }
  return sum;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// A bucket of a 64 x 48 matrix, a 48-element bias (left alone by segments here) and another
// 32 x 40 matrix: offsets into one buffer.
const std::vector<Segment> kSegments = {{0, 64, 48}, {64 * 48 + 48, 32, 40}};
constexpr size_t kBucket = 64 * 48 + 48 + 32 * 40;

TEST(Compress, StochasticRoundingIsUnbiasedAndClamped) {
  const float x = 0.3f * 127 / 2.0f, inv = 1.0f;  // 19.05 steps
  double mean = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) mean += ops::quantize_int8(x, inv, (i + 0.5f) / n);
  EXPECT_NEAR(mean / n, x, 1e-3);
  EXPECT_EQ(ops::quantize_int8(1e6f, 1.0f, 0.99f), 127);
  EXPECT_EQ(ops::quantize_int8(-1e6f, 1.0f, 0.0f), -127);
}

TEST(Compress, TopKPicksTheLargestMagnitudes) {
  const std::vector<float> x = {0.1f, -5.0f, 2.0f, 2.0f, -0.5f, 3.0f};
  EXPECT_EQ(parallel::compress::top_k(x.data(), 6, 3), (std::vector<uint32_t>{1, 2, 5}));
  EXPECT_EQ(parallel::compress::top_k(x.data(), 6, 0).size(), 0u);
}

TEST(Compress, OrthonormalizedColumns) {
  std::vector<float> a = random_vector(20 * 3, 1);
  for (int r = 0; r < 20; ++r) a[r * 3 + 2] = 0;  // a zero column stays zero
  parallel::compress::orthonormalize_columns(a.data(), 20, 3);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      double dot = 0;
      for (int r = 0; r < 20; ++r) dot += a[r * 3 + i] * a[r * 3 + j];
      EXPECT_NEAR(dot, i == j && i < 2 ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
}

auto grad_of = [](int rank) { return random_vector(kBucket, 100 + rank); };

TEST(Compress, HalfPrecisionCodecsSumClose) {
  for (int world : {2, 4})
    for (DType t : {DType::kF16, DType::kBF16}) {
      const auto got = exchange_on(
          world, [&](Pool& pool) { return parallel::compress::dense_codec(kSegments, t, pool); },
          grad_of, kSegments);
      const auto want = plain_sum(world, grad_of);
      const double tol = t == DType::kF16 ? 0.01 : 0.08;
      for (const Segment& s : kSegments)
        for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
          ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << i;
    }
}

TEST(Compress, Int8SumWithinOneStepPerRank) {
  CompressSpec spec;
  for (int world : {2, 4}) {
    const auto got = exchange_on(
        world,
        [&](Pool& pool) {
          return parallel::compress::make_codec(CompressKind::kInt8, kSegments, spec, 7, 3, pool);
        },
        grad_of, kSegments);
    const auto want = plain_sum(world, grad_of);
    double err = 0;
    for (const Segment& s : kSegments)
      for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
        // each rank's value is within one quantisation step (at most 5 / 127 for these normals)
        ASSERT_LE(std::fabs(got[i] - want[i]), world * 6.0 / 127) << i;
        err += got[i] - want[i];
      }
    EXPECT_LT(std::fabs(err) / kBucket, 0.01);  // unbiased: the errors cancel
    // Reproducible: the same key gives the same bits.
    EXPECT_EQ(got, exchange_on(
                       world,
                       [&](Pool& pool) {
                         return parallel::compress::make_codec(CompressKind::kInt8, kSegments, spec,
                                                               7, 3, pool);
                       },
                       grad_of, kSegments));
  }
}

TEST(Compress, TopKSendsEachRanksLargestPairs) {
  CompressSpec spec;
  spec.ratio = 0.05;
  for (int world : {2, 4}) {
    const auto got = exchange_on(
        world,
        [&](Pool& pool) {
          return parallel::compress::make_codec(CompressKind::kTopk, kSegments, spec, 7, 3, pool);
        },
        grad_of, kSegments);
    std::vector<float> want(kBucket, 0.0f);
    for (int r = 0; r < world; ++r) {
      std::vector<float> flat;
      const auto g = grad_of(r);
      for (const Segment& s : kSegments)
        flat.insert(flat.end(), g.begin() + s.offset, g.begin() + s.offset + s.numel());
      const int64_t k = static_cast<int64_t>(std::ceil(0.05 * static_cast<double>(flat.size())));
      std::vector<int64_t> where;
      for (const Segment& s : kSegments)
        for (int64_t i = 0; i < s.numel(); ++i) where.push_back(s.offset + i);
      for (uint32_t i :
           parallel::compress::top_k(flat.data(), static_cast<int64_t>(flat.size()), k))
        want[where[i]] += flat[i];
    }
    for (const Segment& s : kSegments)
      for (int64_t i = s.offset; i < s.offset + s.numel(); ++i)
        ASSERT_FLOAT_EQ(got[i], want[i]) << i;
  }
}

TEST(Compress, TopKErrorFeedbackConservesTheGradient) {
  // One rank, 5 steps: what was sent plus the residual is every gradient summed.
  CompressSpec spec;
  spec.ratio = 0.02;
  Pool pool(kBucket);
  auto codec = parallel::compress::make_codec(CompressKind::kTopk, kSegments, spec, 7, 0, pool);
  std::vector<double> sent(kBucket, 0.0), total(kBucket, 0.0);
  for (int step = 0; step < 5; ++step) {
    std::vector<float> g = random_vector(kBucket, 300 + step);
    for (size_t i = 0; i < kBucket; ++i) total[i] += g[i];
    std::vector<float> all(g);
    const Exchange ex = codec->encode(g.data(), {7, step, 0, 0, 1});
    std::memcpy(ex.out, ex.in, ex.count);  // the all-gather of one rank
    ASSERT_FALSE(codec->next(g.data()));
    for (const Segment& s : kSegments)
      for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) sent[i] += g[i];
  }
  const std::vector<float>& residual = *codec->state();
  size_t at = 0;
  for (const Segment& s : kSegments)
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i, ++at)
      ASSERT_NEAR(sent[i] + residual[at], total[i], 1e-4) << i;
}

TEST(Compress, PowerSgdOfFullRankIsExactAndLowRankErrorIsKept) {
  CompressSpec spec;
  spec.rank = 32;  // min(rows, cols) of the 32 x 40 matrix: the projection keeps everything
  const std::vector<Segment> segs = {{0, 64, 48}, {64 * 48 + 48, 32, 40}};
  for (int world : {2, 4}) {
    const auto got = exchange_on(world,
                                 [&](Pool& pool) {
                                   return parallel::compress::make_codec(
                                       CompressKind::kPowerSgd, {segs[1]}, spec, 7, 3, pool);
                                 },
                                 grad_of, {segs[1]});
    const auto want = plain_sum(world, grad_of);
    for (int64_t i = segs[1].offset; i < segs[1].offset + segs[1].numel(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-3) << i;
  }
  // Rank 2 on one rank: output + residual is the gradient (error feedback loses nothing).
  spec.rank = 2;
  Pool pool(kBucket);
  auto codec = parallel::compress::make_codec(CompressKind::kPowerSgd, {segs[0]}, spec, 7, 0, pool);
  std::vector<float> g = random_vector(kBucket, 5), orig = g;
  std::optional<Exchange> ex = codec->encode(g.data(), {7, 0, 0, 0, 1});
  while (ex) ex = codec->next(g.data());
  const std::vector<float>& st = *codec->state();
  const size_t q = 48 * 2;  // the residual follows Q
  for (int64_t i = 0; i < 64 * 48; ++i) ASSERT_NEAR(g[i] + st[q + i], orig[i], 1e-4) << i;
  EXPECT_GT(max_abs_diff(g, orig), 0.1);  // and the rank-2 part alone is not the gradient
}

TEST(Compress, WorthCompressingLeavesVectorsAndSmallGains) {
  CompressSpec spec;
  using parallel::compress::worth_compressing;
  EXPECT_FALSE(worth_compressing(CompressKind::kFp16, {0, 1, 100}, spec, 2));  // a bias
  EXPECT_TRUE(worth_compressing(CompressKind::kInt8, {0, 10, 100}, spec, 4));
  EXPECT_FALSE(worth_compressing(CompressKind::kInt8, {0, 10, 100}, spec, 8));  // gathers too much
  // Under ZeRO against the f32 reduce-scatter (half an all-reduce): int8 pays on 2 ranks only.
  EXPECT_TRUE(worth_compressing(CompressKind::kInt8, {0, 10, 100}, spec, 2, true));
  EXPECT_FALSE(worth_compressing(CompressKind::kInt8, {0, 10, 100}, spec, 4, true));
  spec.rank = 4;
  EXPECT_TRUE(worth_compressing(CompressKind::kPowerSgd, {0, 64, 48}, spec, 2));
  EXPECT_FALSE(worth_compressing(CompressKind::kPowerSgd, {0, 6, 6}, spec, 2));
}

// ---- training ----

train::Config small(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {
      "data.kind=synthetic", "data.samples=600",       "data.features=12",
      "data.classes=4",      "data.test_fraction=0.2", "train.batch=24",
      "train.max_steps=20",  "train.prefetch=0",       "optim.lr=0.1",
      "model.kind=mlp",      "model.hidden=[64,32]",   "checkpoint.every_epochs=0",
      "ddp.bucket_mb=0.004"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "compress_test", o);
}

TEST(Compress, TrainsAndReportsBytesWithinFivePercentOfTheFormula) {
  // 2 and 4 ranks: small messages take halving-doubling's whole-buffer rounds on 4.
  for (int world : {2, 4}) {
    const auto plain = testing::train_on(small(), world);
    for (const char* kind : {"fp16", "bf16", "int8", "topk", "powersgd"}) {
      std::vector<float> blocking;  // pipelined exchanges (overlap on) give the same bits
      for (const char* overlap : {"ddp.overlap=off", "ddp.overlap=on"}) {
        const auto run = testing::train_on(
            small({str("compress.kind=", kind), "compress.ratio=0.1", overlap}), world);
        if (blocking.empty()) blocking = run.params;
        EXPECT_EQ(run.params, blocking) << kind << " " << overlap;
        const nlohmann::json& c = run.summary.at("compress");
        EXPECT_NEAR(c["bytes_per_step"].get<double>(), c["formula_bytes_per_step"].get<double>(),
                    0.05 * c["formula_bytes_per_step"].get<double>())
            << kind << " on " << world;
        EXPECT_GT(c["ratio"].get<double>(), 1.2) << kind;
        EXPECT_EQ(run.summary["engine"]["grad_sync"], "allreduce");
        EXPECT_EQ(run.summary["engine"]["compress"], kind);
        const double tol = std::string(kind) == "fp16"   ? 2e-3
                           : std::string(kind) == "bf16" ? 2e-2
                                                         : 1.0;
        EXPECT_LT(testing::max_rel_diff(plain.params, run.params), tol) << kind;
        EXPECT_GT(run.summary["test_accuracy"].get<double>(), 0.5) << kind;
      }
    }
  }
}

// Runs `kinds` on `world` ranks with `layout` and checks each against the same layout
// uncompressed: parameters within the kind's tolerance, bytes within 5% of the formula, fewer
// bytes than f32 (where the kind compresses anything on this layout), and it still learns.
void expect_tracks_uncompressed(const std::vector<std::string>& layout, int world,
                                const std::vector<std::string>& kinds, const std::string& sync) {
  const auto plain = testing::train_on(small(layout), world);
  for (const std::string& kind : kinds) {
    std::vector<std::string> keys = layout;
    keys.insert(keys.end(), {"compress.kind=" + kind, "compress.ratio=0.1"});
    const auto run = testing::train_on(small(keys), world);
    const std::string what = kind + " on " + std::to_string(world) + " ranks, " + layout.back();
    const nlohmann::json& c = run.summary.at("compress");
    EXPECT_NEAR(c["bytes_per_step"].get<double>(), c["formula_bytes_per_step"].get<double>(),
                0.05 * c["formula_bytes_per_step"].get<double>())
        << what;
    EXPECT_GT(c["ratio"].get<double>(), 1.1) << what;  // topk 10% on 4 ranks: 1.16
    EXPECT_EQ(run.summary["engine"]["grad_sync"], sync) << what;
    // Against a bf16 run, whose own messages are bf16, fp16 messages differ by bf16's rounding.
    const bool bf16 =
        std::find(layout.begin(), layout.end(), "train.precision=bf16") != layout.end();
    const double tol = kind == "fp16" && !bf16            ? 2e-3
                       : kind == "fp16" || kind == "bf16" ? 2e-2
                                                          : 1.0;
    EXPECT_LT(testing::max_rel_diff(plain.params, run.params), tol) << what;
    EXPECT_GT(run.summary["test_accuracy"].get<double>(), 0.5) << what;
  }
}

TEST(Compress, ZeroStagesOneAndTwo) {
  // int8 gathers 1.016n bytes per other rank: below f32's reduce-scatter on 2 ranks only.
  for (const char* stage : {"zero.stage=1", "zero.stage=2"}) {
    const std::string sync =
        std::string(stage) == "zero.stage=1" ? "reduce_scatter" : "reduce_scatter_shard";
    expect_tracks_uncompressed({"ddp.shared_memory=false", stage}, 2,
                               {"fp16", "bf16", "int8", "topk", "powersgd"}, sync);
    expect_tracks_uncompressed({"ddp.shared_memory=false", stage}, 4, {"fp16", "topk", "powersgd"},
                               sync);
  }
}

TEST(Compress, ComposesWithPipelinesTensorParallelismAndSixteenBitPrecision) {
  // A 16-bit precision run's exchange is the codec's alone: its bytes are the formula's.
  expect_tracks_uncompressed({"pp.stages=2"}, 4, {"int8", "powersgd"}, "allreduce");  // dp2 x pp2
  expect_tracks_uncompressed({"tp.size=2"}, 4, {"int8", "topk", "powersgd"},
                             "allreduce");  // tp2 x dp2
  expect_tracks_uncompressed({"train.precision=bf16"}, 2, {"fp16", "int8", "topk", "powersgd"},
                             "allreduce");
  expect_tracks_uncompressed({"train.precision=bf16", "zero.stage=2"}, 2, {"int8", "powersgd"},
                             "reduce_scatter_shard");
  expect_tracks_uncompressed({"train.precision=fp16"}, 2, {"int8"}, "allreduce");
}

TEST(Compress, SixteenBitKindsReduceScatterWholeUnitsUnderZero) {
  // Half the bytes of the f32 reduce-scatter, biases included.
  const auto run = testing::train_on(small({"zero.stage=2", "compress.kind=bf16"}), 4);
  EXPECT_NEAR(run.summary["compress"]["ratio"].get<double>(), 2.0, 0.01);
}

// An uninterrupted run of cfg on `workers` ranks, and one stopped after 7 steps and resumed.
std::pair<testing::RunResult, testing::RunResult> whole_and_resumed(const train::Config& cfg,
                                                                    int workers,
                                                                    const std::string& name) {
  auto whole = testing::train_on(cfg, workers);
  train::RunOptions first;
  first.run_dir = testing::test_run_dir(name);
  first.stop_after = 7;
  testing::train_on(cfg, workers, first);
  train::RunOptions second;
  second.run_dir = second.resume = first.run_dir;
  return {std::move(whole), testing::train_on(cfg, workers, second)};
}

TEST(Compress, ResumedRunEndsBitIdentical) {
  for (const char* kind : {"topk", "powersgd", "int8", "zero2_powersgd"}) {
    const bool zero = std::string(kind) == "zero2_powersgd";
    const train::Config cfg =
        small({zero ? "compress.kind=powersgd" : str("compress.kind=", kind),
               "compress.start_step=3", zero ? "zero.stage=2" : "zero.stage=0"});
    const auto [whole, resumed] = whole_and_resumed(cfg, 2, str("compress_resume_", kind));
    EXPECT_EQ(resumed.summary["steps"], 20);
    EXPECT_EQ(resumed.params, whole.params) << kind;
    EXPECT_EQ(resumed.summary["params_sha256"], whole.summary["params_sha256"]) << kind;
  }
}

TEST(Compress, ResumedParameterServerRunWithTopKEndsBitIdentical) {
  // Sync pushes: the workers' top-k residuals travel in the checkpoint (compress/rank<r>).
  const train::Config cfg =
      small({"ps.servers=1", "model.hidden=[32,16]", "compress.kind=topk", "compress.ratio=0.1"});
  const auto [whole, resumed] = whole_and_resumed(cfg, 3, "compress_resume_ps_topk");
  EXPECT_EQ(resumed.summary["steps"], 20);
  EXPECT_EQ(resumed.summary["params_sha256"], whole.summary["params_sha256"]);
  // The residuals are saved one per arena element: a run resumes on another server count and
  // other buckets. A state of another length (data parallelism's) is a clear error.
  train::RunOptions first;
  first.run_dir = testing::test_run_dir("compress_resume_ps_topk_other");
  first.stop_after = 7;
  testing::train_on(cfg, 3, first);
  train::RunOptions second;
  second.run_dir = second.resume = first.run_dir;
  train::Config other = cfg;
  other.parallel.ps_servers = 2;
  other.parallel.bucket_mb = 0.001;
  EXPECT_EQ(testing::train_on(other, 4, second).summary["steps"], 20);
  const train::Config dp = small({"compress.kind=topk", "compress.ratio=0.1"});
  first.run_dir = testing::test_run_dir("compress_resume_dp_topk");
  testing::train_on(dp, 2, first);
  second.run_dir = second.resume = first.run_dir;
  try {
    testing::train_on(small({"ps.servers=1", "compress.kind=topk", "compress.ratio=0.1"}), 3,
                      second);
    ADD_FAILURE() << "a data-parallel compression state resumed into parameter-server pushes";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("push residuals"), std::string::npos) << e.what();
  }
}

// The bytes of one worker's push: every unit shard (a unit's part of a server's range) one
// message of `message(n)` bytes for its n elements.
double push_formula(const train::Config& cfg, const std::function<double(double)>& message) {
  const data::Splits data = data::make_datasets(cfg.data);
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = data.train->input_shape();
  spec.num_classes = data.train->num_classes();
  const auto model = nn::build_model(spec);
  const parallel::Units units = parallel::make_units(*model, cfg.parallel.bucket_mb, {}, 1, 0);
  double bytes = 0;
  int shards = 0;
  for (const nn::Range& s :
       parallel::server_shards(*model, static_cast<int>(cfg.parallel.ps_servers)))
    for (const parallel::Unit& u : units.list)
      if (const int64_t n = std::min(u.range.hi, s.hi) - std::max(u.range.lo, s.lo); n > 0)
        bytes += message(static_cast<double>(n)), ++shards;
  EXPECT_GT(shards, 3) << "several unit shards, each its own message";
  return bytes;
}

TEST(Compress, ParameterServerPushes) {
  // 1 server x 2 workers, sync: fp16 pushes end close to f32 pushes (int8, topk: they learn).
  // 2 servers x 2 workers, buckets of 0.001 MB: every unit shard goes as its own message,
  // whose bytes (the server's bytes_in, exactly; the workers' transport counters, the summary's
  // compress figures, within 5%) are the codec's formula for its elements.
  const std::vector<std::string> ps = {"ps.servers=1", "model.hidden=[32,16]"};
  const auto plain = testing::train_on(small(ps), 3);
  const double plain_in = plain.summary["ranks"]["ps_servers"][0]["bytes_in"].get<double>();
  const int64_t n = plain.summary["ranks"]["ps_servers"][0]["elements"].get<int64_t>();
  EXPECT_DOUBLE_EQ(plain_in, 20.0 * 2 * 4 * static_cast<double>(n));
  const std::vector<std::pair<std::string, std::function<double(double)>>> kinds = {
      {"fp16", [](double e) { return 2.0 * e; }},
      {"int8", [](double e) { return e + 4 * std::ceil(e / 256); }},
      {"topk", [](double e) { return 8.0 * std::ceil(0.1 * e); }}};
  for (const auto& [kind, message] : kinds) {
    std::vector<std::string> keys = ps;
    keys.insert(keys.end(), {"compress.kind=" + kind, "compress.ratio=0.1"});
    const auto run = testing::train_on(small(keys), 3);
    EXPECT_LT(testing::max_rel_diff(plain.params, run.params), kind == "fp16" ? 2e-3 : 1.0) << kind;
    EXPECT_GT(run.summary["test_accuracy"].get<double>(), 0.5) << kind;

    keys.insert(keys.end(), {"ps.servers=2", "ddp.bucket_mb=0.001"});
    const train::Config cfg = small(keys);
    const auto two = testing::train_on(cfg, 4);
    const double push = push_formula(cfg, message);
    const nlohmann::json& servers = two.summary["ranks"]["ps_servers"];
    EXPECT_DOUBLE_EQ(servers[0]["bytes_in"].get<double>() + servers[1]["bytes_in"].get<double>(),
                     20.0 * 2 * push)
        << kind;
    const nlohmann::json& c = two.summary.at("compress");
    EXPECT_DOUBLE_EQ(c["formula_bytes_per_step"].get<double>(), push) << kind;
    EXPECT_NEAR(c["bytes_per_step"].get<double>(), push, 0.05 * push) << kind;
    EXPECT_GT(two.summary["test_accuracy"].get<double>(), 0.5) << kind;
  }
}

TEST(Compress, BadConfigsAreClearErrors) {
  auto error_of = [](std::vector<std::string> keys, int workers = 2) -> std::string {
    try {
      testing::train_on(small(std::move(keys)), workers);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"compress.kind=topp"}).find("did you mean 'topk'"), std::string::npos);
  EXPECT_NE(error_of({"compress.kind=topk", "compress.ratio=0"}).find("compress.ratio"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=topk", "compress.ratio=0.9"}).find("(0, 0.5]"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=powersgd", "compress.rank=0"}).find("compress.rank"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=int8", "zero.stage=3"}).find("zero.stage = 2"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=int8", "train.deterministic=true"}).find("deterministic"),
            std::string::npos);
  EXPECT_NE(
      error_of({"compress.kind=powersgd", "train.precision=fp16"}).find("train.precision = bf16"),
      std::string::npos);
  EXPECT_NE(error_of({"compress.kind=topk", "train.precision=fp16"}).find("error_feedback = false"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=topk", "compress.start_step=-1"}).find("start_step"),
            std::string::npos);
  EXPECT_NE(error_of({"compress.kind=powersgd", "ps.servers=1"}, 3).find("parameter-server"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel

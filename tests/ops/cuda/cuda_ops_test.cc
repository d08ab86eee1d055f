// The CUDA kernel table against the CPU ops (tessel/ops/cpu.h) on random inputs of odd shapes:
// elementwise, LayerNorm, cross-entropy (whole and vocab-parallel), the count of correct rows,
// embedding, AdamW, SGD and the sum of squares. f32 to 1e-5 relative, bf16 to 1e-2; every output
// poisoned with NaN before the run, every accumulated gradient started from random values. Without
// a device every test skips, saying why.
#include <array>
#include <cstring>

#include "cuda_test_util.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/cuda/kernels.h"
#include "tessel/optim/optimizer.h"
#include "tessel/optim/schedule.h"

namespace tessel::ops::cuda::testing {
namespace {

constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;
const DType kTypes[] = {DType::kF32, DType::kBF16};

double tol(DType t) { return t == DType::kF32 ? kF32Tol : kBf16Tol; }
Vec as_type(Vec v, DType t) { return t == DType::kF32 ? v : round_bf16(std::move(v)); }

class CudaOps : public Gpu {};

TEST_F(CudaOps, ElementwiseMatchCpu) {
  const int64_t n = 10007;
  for (DType t : kTypes) {
    const Vec x = as_type(randn(n, 1, 2.0f), t), y2 = as_type(randn(n, 2), t);
    const Vec dy = as_type(randn(n, 3), t);
    Vec relu(n), drelu(n), gelu(n), dgelu(n), sum(n);
    ops::relu_forward(relu.data(), x.data(), n);
    ops::relu_backward(drelu.data(), dy.data(), relu.data(), n);
    ops::gelu_forward(gelu.data(), x.data(), n);
    ops::gelu_backward(dgelu.data(), dy.data(), x.data(), n);
    ops::add_forward(sum.data(), x.data(), y2.data(), n);
    DeviceBuffer gx = upload(x, t), gy2 = upload(y2, t), gdy = upload(dy, t);
    DeviceBuffer grelu = poisoned(n, t), gdrelu = poisoned(n, t), ggelu = poisoned(n, t),
                 gdgelu = poisoned(n, t), gsum = poisoned(n, t);
    relu_forward(grelu.get(), gx.get(), n, t, nullptr);
    relu_backward(gdrelu.get(), gdy.get(), grelu.get(), n, t, nullptr);
    gelu_forward(ggelu.get(), gx.get(), n, t, nullptr);
    gelu_backward(gdgelu.get(), gdy.get(), gx.get(), n, t, nullptr);
    add_forward(gsum.get(), gx.get(), gy2.get(), n, 1, t, nullptr);
    const std::string ty = dtype_name(t);
    expect_close(download(grelu, n, t), as_type(relu, t), tol(t), "relu_forward " + ty);
    expect_close(download(gdrelu, n, t), as_type(drelu, t), tol(t), "relu_backward " + ty);
    expect_close(download(ggelu, n, t), as_type(gelu, t), tol(t), "gelu_forward " + ty);
    expect_close(download(gdgelu, n, t), as_type(dgelu, t), tol(t), "gelu_backward " + ty);
    expect_close(download(gsum, n, t), as_type(sum, t), tol(t), "add_forward " + ty);
  }
}

// The position table added to every sequence: one row of b over count rows of a, in place, for
// a row length that packs (768) and one that does not (10007): the CPU's bits.
TEST_F(CudaOps, AddForwardOfOneRowToManyIsTheCpus) {
  for (DType t : kTypes)
    for (int64_t n : {768, 10007}) {
      const int64_t count = 6;
      const Vec a = as_type(randn(n * count, 4), t), b = as_type(randn(n, 5), t);
      Vec want = a;
      if (t == DType::kF32) {
        ops::add_forward(want.data(), want.data(), b.data(), n, t, count);
      } else {
        std::vector<uint16_t> y16 = to_bf16(a);
        const std::vector<uint16_t> b16 = to_bf16(b);
        ops::add_forward(y16.data(), y16.data(), b16.data(), n, t, count);
        for (int64_t i = 0; i < n * count; ++i) want[i] = bf16_to_f32(y16[i]);
      }
      DeviceBuffer ga = upload(a, t), gb = upload(b, t);
      add_forward(ga.get(), ga.get(), gb.get(), n, count, t, nullptr);
      expect_same_bits(download(ga, n * count, t), want,
                       str("add_forward x", count, " ", dtype_name(t), " n=", n));
    }
}

TEST_F(CudaOps, ConvertRoundsToNearestEvenAsTheCpu) {
  const int64_t n = 4099;
  Vec x = randn(n, 7, 3.0f);
  x[0] = 1.00390625f;  // halfway between two bf16 values: ties to even
  x[1] = -0.0f;
  DeviceBuffer gx = upload(x), gb = poisoned(n, DType::kBF16), gback = poisoned(n);
  convert(gb.get(), DType::kBF16, gx.get(), DType::kF32, n, nullptr);
  convert(gback.get(), DType::kF32, gb.get(), DType::kBF16, n, nullptr);
  expect_same_bits(download(gback, n), round_bf16(x), "convert f32 -> bf16 -> f32");
}

TEST_F(CudaOps, LayerNormForwardAndBackwardMatchCpu) {
  for (DType t : kTypes)
    for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 771}, {5, 3}, {129, 768}}) {
      const Vec x = as_type(randn(N * C, 1, 2.0f), t), w = as_type(randn(C, 2), t);
      const Vec b = as_type(randn(C, 3), t), dy = as_type(randn(N * C, 4), t);
      const Vec dw0 = randn(C, 5), db0 = randn(C, 6);
      Vec y(N * C), mean(N), rstd(N), dx(N * C), dw = dw0, db = db0;
      ops::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                             C);
      ops::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
      DeviceBuffer gx = upload(x, t), gw = upload(w, t), gb = upload(b, t), gdy = upload(dy, t);
      DeviceBuffer gy = poisoned(N * C, t), gmean = poisoned(N), grstd = poisoned(N),
                   gdx = poisoned(N * C, t), gdw = upload(dw0), gdb = upload(db0);
      layernorm_forward(gy.get(), gmean.as<float>(), grstd.as<float>(), gx.get(), gw.get(),
                        gb.get(), N, C, t, nullptr);
      layernorm_backward(gdx.get(), gdw.as<float>(), gdb.as<float>(), gdy.get(), gx.get(), gw.get(),
                         gmean.as<float>(), grstd.as<float>(), N, C, t, nullptr);
      const std::string tag = str(" ", dtype_name(t), " ", N, "x", C);
      // The statistics are f32 on both sides whatever t: the f32 tolerance applies.
      expect_close(download(gmean, N), mean, kF32Tol, "layernorm mean" + tag);
      expect_close(download(grstd, N), rstd, kF32Tol, "layernorm rstd" + tag);
      expect_close(download(gy, N * C, t), as_type(y, t), tol(t), "layernorm y" + tag);
      expect_close(download(gdx, N * C, t), as_type(dx, t), tol(t), "layernorm dx" + tag);
      expect_close(download(gdw, C), dw, tol(t), "layernorm dw (accumulated)" + tag);
      expect_close(download(gdb, C), db, tol(t), "layernorm db (accumulated)" + tag);
    }
}

TEST_F(CudaOps, CrossEntropyMatchesCpuWithAndWithoutProbabilities) {
  for (DType t : kTypes)
    for (const auto& [N, C] : {std::pair<int64_t, int64_t>{33, 1001}, {1, 2}, {64, 50304}}) {
      const Vec logits = as_type(randn(N * C, 1, 3.0f), t);
      const auto labels = rand_ids(N, 0, static_cast<int32_t>(C), 2);
      Vec probs(N * C), dlogits(N * C);
      const float loss =
          ops::cross_entropy_forward(probs.data(), logits.data(), labels.data(), N, C);
      ops::cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, C, 0.75f);
      DeviceBuffer glogits = upload(logits, t), glabels = upload_ints(labels);
      DeviceBuffer gloss = poisoned(1), glosses = poisoned(N), glse = poisoned(N),
                   gprobs = poisoned(N * C), gd = poisoned(N * C, t);
      cross_entropy_forward(gloss.as<float>(), glosses.as<float>(), glse.as<float>(),
                            gprobs.as<float>(), glogits.get(), glabels.as<int32_t>(), N, C, t,
                            nullptr);
      cross_entropy_backward(gd.get(), glogits.get(), glse.as<float>(), glabels.as<int32_t>(), N, C,
                             0.75f, 0, t, nullptr);
      const std::string tag = str(" ", dtype_name(t), " ", N, "x", C);
      expect_close(download(gloss, 1), {loss}, kF32Tol, "cross_entropy loss" + tag);
      expect_close(download(gprobs, N * C), probs, kF32Tol, "cross_entropy probs" + tag);
      expect_close(download(gd, N * C, t), as_type(dlogits, t), tol(t),
                   "cross_entropy dlogits" + tag);
      // The fused path: no probabilities, backward in place over the logits.
      cross_entropy_forward(gloss.as<float>(), glosses.as<float>(), glse.as<float>(), nullptr,
                            glogits.get(), glabels.as<int32_t>(), N, C, t, nullptr);
      cross_entropy_backward(glogits.get(), glogits.get(), glse.as<float>(), glabels.as<int32_t>(),
                             N, C, 0.75f, 0, t, nullptr);
      expect_close(download(glogits, N * C, t), as_type(dlogits, t), tol(t),
                   "cross_entropy dlogits in place" + tag);
    }
}

// The count of rows whose first maximum is the label, against the CPU's scan: rows with tied
// maxima (the first must win), a NaN inside a row (never wins) and at column 0 (the answer is 0),
// the label on the first maximum in over half the rows; a GPT-2 vocabulary too.
TEST_F(CudaOps, CountCorrectIsTheCpusCount) {
  for (DType t : kTypes)
    for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 65}, {3, 1}, {64, 50304}}) {
      Vec logits = as_type(randn(N * C, 5, 2.0f), t);
      auto labels = rand_ids(N, 0, static_cast<int32_t>(C), 6);
      for (int64_t r = 0; r < N; ++r) {
        float* row = logits.data() + r * C;
        if (r % 4 == 1 && C > 2) row[C - 1] = row[C / 2] = 9.0f;  // tie: C / 2 wins
        if (r % 4 == 2) row[C / 3] = NAN;
        if (r % 7 == 3) row[0] = NAN;
        if (r % 2 == 0) {  // the label on the row's first maximum (0 when row[0] is NaN)
          int32_t best = 0;
          for (int32_t c = 1; c < C; ++c) best = row[c] > row[best] ? c : best;
          labels[r] = best;
        }
        if (r % 4 == 1) labels[r] = static_cast<int32_t>(C / 2);
      }
      const int64_t want = ops::count_correct(logits.data(), labels.data(), N, C);
      DeviceBuffer glogits = upload(logits, t), glabels = upload_ints(labels);
      DeviceBuffer gcount = poisoned(2);  // an int64
      count_correct(gcount.as<int64_t>(), glogits.get(), glabels.as<int32_t>(), N, C, t, nullptr);
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      int64_t got = -1;
      gcount.download(&got, sizeof got);
      EXPECT_EQ(got, want) << dtype_name(t) << " " << N << "x" << C;
      EXPECT_GT(want, 0) << "the labels must hit some rows";
    }
}

// A NaN or +inf logit makes its row's loss NaN, as on the CPU, wherever it sits in the row (the
// forward's running max and sum start empty in each thread: a NaN seen first must survive the
// merge); a -inf adds nothing; the other rows keep theirs. C = 64 reads rows in 16-byte packs,
// 65 one value at a time.
TEST_F(CudaOps, CrossEntropyOfANanOrInfiniteLogitIsNan) {
  const int64_t N = 4;
  for (int64_t C : {65, 64})
    for (DType t : kTypes) {
      Vec logits = as_type(randn(N * C, 7), t);
      logits[0 * C + 10] = -INFINITY;
      logits[1 * C + 21] = NAN;
      logits[2 * C + 0] = NAN;
      logits[3 * C + 40] = INFINITY;
      const std::vector<int32_t> labels{3, 5, 7, 9};
      DeviceBuffer glogits = upload(logits, t), glabels = upload_ints(labels);
      DeviceBuffer gloss = poisoned(1), glosses = poisoned(N), glse = poisoned(N);
      cross_entropy_forward(gloss.as<float>(), glosses.as<float>(), glse.as<float>(), nullptr,
                            glogits.get(), glabels.as<int32_t>(), N, C, t, nullptr);
      const Vec losses = download(glosses, N);
      EXPECT_TRUE(std::isfinite(losses[0])) << dtype_name(t) << " C=" << C;
      for (int64_t r = 1; r < N; ++r)
        EXPECT_TRUE(std::isnan(losses[r])) << dtype_name(t) << " C=" << C << " row " << r;
      EXPECT_TRUE(std::isnan(download(gloss, 1)[0])) << dtype_name(t) << " C=" << C;
    }
}

TEST_F(CudaOps, CrossEntropyBackwardOfAClassSliceSkipsOtherRanksLabels) {
  const int64_t N = 40, C = 97, lo = 50;  // this rank holds classes [50, 147) of 200
  const Vec logits = randn(N * C, 3);
  const auto labels = rand_ids(N, 0, 200, 4);
  // probs from the slice's own softmax are enough to check the one-hot placement.
  Vec probs(N * C), want(N * C);
  std::vector<int32_t> local(N, 0);
  ops::cross_entropy_forward(probs.data(), logits.data(), local.data(), N, C);
  ops::cross_entropy_backward(want.data(), probs.data(), labels.data(), N, C, 1.0f, lo);
  DeviceBuffer glogits = upload(logits), glabels = upload_ints(labels), glocal = upload_ints(local);
  DeviceBuffer gloss = poisoned(1), glosses = poisoned(N), glse = poisoned(N), gd = poisoned(N * C);
  cross_entropy_forward(gloss.as<float>(), glosses.as<float>(), glse.as<float>(), nullptr,
                        glogits.get(), glocal.as<int32_t>(), N, C, DType::kF32, nullptr);
  cross_entropy_backward(gd.get(), glogits.get(), glse.as<float>(), glabels.as<int32_t>(), N, C,
                         1.0f, lo, DType::kF32, nullptr);
  expect_close(download(gd, N * C), want, kF32Tol, "cross_entropy dlogits, class slice");
}

// Vocab-parallel cross-entropy of a vocabulary of 201 over 2 ranks (101 columns each, the last
// one padding on rank 1), the group's reductions done here between the steps: every rank's
// steps against the CPU's sliced_* ones.
TEST_F(CudaOps, VocabParallelStepsMatchCpu) {
  const int64_t N = 37, C = 101, V = 201;
  const auto labels = rand_ids(N, 0, static_cast<int32_t>(V), 5);
  for (DType t : kTypes) {
    const Vec logits[2] = {as_type(randn(N * C, 6, 3.0f), t), as_type(randn(N * C, 7, 3.0f), t)};
    Vec mx(N, -INFINITY), sums(N, 0.0f), target(N, 0.0f);
    Vec probs[2] = {Vec(N * C), Vec(N * C)}, part_sums(N), part_target(N), part_mx(N);
    DeviceBuffer glabels = upload_ints(labels), gmx = poisoned(N), gsums = poisoned(N),
                 gtarget = poisoned(N);
    DeviceBuffer glogits[2] = {upload(logits[0], t), upload(logits[1], t)};
    for (int64_t r = 0; r < 2; ++r) {  // (1) and the group's max
      ops::sliced_row_max(part_mx.data(), logits[r].data(), N, C, std::min(C, V - r * C));
      sliced_row_max(gmx.as<float>(), glogits[r].get(), N, C, std::min(C, V - r * C), t, nullptr);
      expect_close(download(gmx, N), part_mx, kF32Tol, str("sliced_row_max ", dtype_name(t)));
      for (int64_t i = 0; i < N; ++i) mx[i] = std::max(mx[i], part_mx[i]);
    }
    DeviceBuffer gmx_all = upload(mx);
    for (int64_t r = 0; r < 2; ++r) {  // (2) and the group's sums
      const int64_t valid = std::min(C, V - r * C);
      ops::sliced_exp(probs[r].data(), part_sums.data(), part_target.data(), logits[r].data(),
                      labels.data(), mx.data(), N, C, valid, r * C);
      sliced_exp_sum(gsums.as<float>(), gtarget.as<float>(), glogits[r].get(),
                     glabels.as<int32_t>(), gmx_all.as<float>(), N, C, valid, r * C, V, t, nullptr);
      const std::string tag = str(" ", dtype_name(t), " rank ", r);
      expect_close(download(gsums, N), part_sums, kF32Tol, "sliced_exp_sum sums" + tag);
      expect_close(download(gtarget, N), part_target, kF32Tol, "sliced_exp_sum target" + tag);
      for (int64_t i = 0; i < N; ++i) {
        sums[i] += part_sums[i];
        target[i] += part_target[i];
      }
    }
    DeviceBuffer gsums_all = upload(sums);
    for (int64_t r = 0; r < 2; ++r) {  // the backward
      const int64_t valid = std::min(C, V - r * C);
      Vec want(N * C);
      ops::sliced_normalize(probs[r].data(), sums.data(), N, C, valid);
      ops::cross_entropy_backward(want.data(), probs[r].data(), labels.data(), N, C, 0.75f, r * C);
      DeviceBuffer gd = poisoned(N * C, t);
      sliced_cross_entropy_backward(gd.get(), glogits[r].get(), gmx_all.as<float>(),
                                    gsums_all.as<float>(), glabels.as<int32_t>(), N, C, valid,
                                    r * C, 0.75f, t, nullptr);
      expect_close(download(gd, N * C, t), as_type(want, t), tol(t),
                   str("sliced_cross_entropy_backward ", dtype_name(t), " rank ", r));
    }
  }
}

// Tables of 97, 41 and 100 rows are summed in registers (at most 4 rows a block of 64), one of
// 1000 rows in global memory: all the CPU's bits.
TEST_F(CudaOps, EmbeddingMatchesCpuAndItsBackwardIsTheCpusBits) {
  for (DType t : kTypes) {
    const int64_t N = 300, C = 130;
    for (const auto& [V, lo, rows] :
         {std::array<int64_t, 3>{97, 0, 97}, {97, 20, 41}, {1000, 0, 1000}, {1000, 900, 100}}) {
      const Vec table = as_type(randn(rows * C, 1), t), dy = as_type(randn(N * C, 2), t);
      const Vec dt0 = randn(rows * C, 3);
      const auto ids = rand_ids(N, 0, static_cast<int32_t>(V), 4);
      Vec y(N * C), dtable = dt0;
      ops::embedding_forward(y.data(), ids.data(), table.data(), N, V, C, lo, rows);
      ops::embedding_backward(dtable.data(), dy.data(), ids.data(), N, C, lo, rows, DType::kF32);
      DeviceBuffer gtable = upload(table, t), gdy = upload(dy, t), gids = upload_ints(ids);
      DeviceBuffer gy = poisoned(N * C, t), gdt = upload(dt0);
      embedding_forward(gy.get(), gids.as<int32_t>(), gtable.get(), N, V, C, lo, rows, t, nullptr);
      embedding_backward(gdt.as<float>(), gdy.get(), gids.as<int32_t>(), N, C, lo, rows, t,
                         nullptr);
      const std::string tag = str(" ", dtype_name(t), " V=", V, " lo=", lo, " rows=", rows);
      expect_same_bits(download(gy, N * C, t), y, "embedding y" + tag);
      // Same additions in the same order (n ascending) as the CPU loop: the same bits.
      expect_same_bits(download(gdt, rows * C), dtable, "embedding dtable" + tag);
    }
  }
}

TEST_F(CudaOps, AdamWMatchesTheCpuOptimizerAndWritesTheBf16Copy) {
  const int64_t n = 10007;
  optim::OptimSpec spec;
  spec.kind = optim::OptimKind::kAdamw;
  spec.lr = 3e-3f;
  spec.weight_decay = 0.1f;
  spec.beta2 = 0.95f;
  auto cpu = optim::make_optimizer(spec, n);
  Vec params = randn(n, 1);
  DeviceBuffer gp = upload(params), gm = upload(Vec(n, 0.0f)), gv = upload(Vec(n, 0.0f));
  DeviceBuffer gwork = poisoned(n, DType::kBF16);
  for (int step = 1; step <= 3; ++step) {
    const Vec grads = randn(n, 10 + step);
    const optim::Segment seg{params.data(), grads.data(), n, 0};
    cpu->step({&seg, 1}, spec.lr, 0.5f);
    DeviceBuffer gg = upload(grads);
    AdamWStep k;
    k.lr = spec.lr;
    k.beta1 = spec.beta1;
    k.beta2 = spec.beta2;
    k.eps = spec.eps;
    k.weight_decay = spec.weight_decay;
    k.step = step;
    k.grad_scale = 0.5f;
    adamw_step(gp.as<float>(), gg.as<float>(), gm.as<float>(), gv.as<float>(), gwork.get(),
               DType::kBF16, n, k, nullptr);
  }
  const auto state = cpu->state();
  const Vec m(state[0].values.data<float>(), state[0].values.data<float>() + n);
  const Vec v(state[1].values.data<float>(), state[1].values.data<float>() + n);
  const Vec got = download(gp, n);
  expect_close(got, params, 1e-6, "adamw params, 3 steps");
  expect_close(download(gm, n), m, 1e-6, "adamw exp_avg");
  expect_close(download(gv, n), v, 1e-6, "adamw exp_avg_sq");
  expect_same_bits(download(gwork, n, DType::kBF16), round_bf16(got), "adamw bf16 working copy");
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i) same += std::memcmp(&got[i], &params[i], sizeof(float)) == 0;
  std::printf("[ cuda tests ] adamw params bit-identical to the CPU: %lld of %lld\n",
              static_cast<long long>(same), static_cast<long long>(n));
}

// Without momentum, with it (the first step seeds the buffer) and Nesterov's, 3 steps each.
TEST_F(CudaOps, SgdMatchesTheCpuOptimizerAndWritesTheBf16Copy) {
  const int64_t n = 10007;
  const std::pair<float, bool> cases[] = {{0.0f, false}, {0.9f, false}, {0.9f, true}};
  for (const auto& [mu, nesterov] : cases) {
    optim::OptimSpec spec;
    spec.lr = 0.05f;
    spec.momentum = mu;
    spec.nesterov = nesterov;
    spec.weight_decay = 0.01f;
    auto cpu = optim::make_optimizer(spec, n);
    Vec params = randn(n, 1);
    DeviceBuffer gp = upload(params), gbuf = upload(Vec(n, 0.0f));
    DeviceBuffer gwork = poisoned(n, DType::kBF16);
    for (int step = 0; step < 3; ++step) {
      const Vec grads = randn(n, 20 + step);
      const optim::Segment seg{params.data(), grads.data(), n, 0};
      cpu->step({&seg, 1}, spec.lr, 0.5f);
      DeviceBuffer gg = upload(grads);
      SgdStep k;
      k.lr = spec.lr;
      k.momentum = mu;
      k.weight_decay = spec.weight_decay;
      k.nesterov = nesterov;
      k.first = step == 0;
      k.grad_scale = 0.5f;
      sgd_step(gp.as<float>(), gg.as<float>(), gbuf.as<float>(), gwork.get(), DType::kBF16, n, k,
               nullptr);
    }
    const std::string what = str("sgd momentum ", mu, nesterov ? " nesterov" : "");
    const Vec got = download(gp, n);
    expect_close(got, params, 1e-6, what + " params, 3 steps");
    if (mu > 0.0f) {
      const Tensor& buf = cpu->state()[0].values;
      expect_close(download(gbuf, n), Vec(buf.data<float>(), buf.data<float>() + n), 1e-6,
                   what + " momentum");
    }
    expect_same_bits(download(gwork, n, DType::kBF16), round_bf16(got), what + " bf16 copy");
  }
}

TEST_F(CudaOps, SumSquaresIsTheCpusInF64AndRepeatsExactly) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    const Vec x = randn(n, 1);
    const double want = optim::sum_squares(x.data(), n);
    DeviceBuffer gx = upload(x), out(2 * sizeof(double)), parts(kSumSquaresParts * sizeof(double));
    double got[2];
    for (int run = 0; run < 2; ++run) {
      sum_squares(out.as<double>() + run, parts.as<double>(), gx.as<float>(), n, nullptr);
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    out.download(got, sizeof(got));
    EXPECT_NEAR(got[0], want, 1e-12 * (want + 1.0)) << "n=" << n;
    EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(double)), 0) << "n=" << n;
  }
}

TEST_F(CudaOps, BackwardsAreDeterministic) {
  const int64_t N = 513, C = 768, V = 50;
  const Vec x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3), dy = randn(N * C, 4);
  const auto ids = rand_ids(N, 0, V, 5);
  DeviceBuffer gx = upload(x), gw = upload(w), gb = upload(b), gdy = upload(dy),
               gids = upload_ints(ids);
  DeviceBuffer gy(N * C * 4), gmean(N * 4), grstd(N * 4), gdx(N * C * 4);
  layernorm_forward(gy.get(), gmean.as<float>(), grstd.as<float>(), gx.get(), gw.get(), gb.get(), N,
                    C, DType::kF32, nullptr);
  Vec runs[2][3];
  for (auto& run : runs) {
    DeviceBuffer gdw = upload(Vec(C, 0.0f)), gdb = upload(Vec(C, 0.0f)),
                 gdt = upload(Vec(V * C, 0.0f));
    layernorm_backward(gdx.get(), gdw.as<float>(), gdb.as<float>(), gdy.get(), gx.get(), gw.get(),
                       gmean.as<float>(), grstd.as<float>(), N, C, DType::kF32, nullptr);
    embedding_backward(gdt.as<float>(), gdy.get(), gids.as<int32_t>(), N, C, 0, V, DType::kF32,
                       nullptr);
    run[0] = download(gdw, C);
    run[1] = download(gdb, C);
    run[2] = download(gdt, V * C);
  }
  for (int k = 0; k < 3; ++k) expect_same_bits(runs[0][k], runs[1][k], str("backward output ", k));
}

}  // namespace
}  // namespace tessel::ops::cuda::testing

// Model contract: the flat layout (names, offsets, block ranges, overlaps, who uses whose
// parameters), deterministic init (materialize and init_values over any range agree), binding
// parameter memory (views move, unbound parameters throw, a ZeRO-3-like run that binds each
// block only around its own work equals the materialized run), memory charged by category.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "nn_testing.h"
#include "tessel/core/memory.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::cnn_spec;
using testing::gpt_spec;
using testing::materialized;
using testing::mlp_spec;
using testing::randn;
using testing::same_bits;
using testing::small_specs;

const Context kTrain{true, 77, 5, 0};

int64_t round64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// ---- layout ----

TEST(ModelLayout, BuildModelAllocatesNothing) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    auto ledger = std::make_shared<MemoryLedger>();
    std::unique_ptr<Model> m;
    {
      MemoryScope scope(ledger, MemCategory::kOther);
      m = build_model(spec);
    }
    EXPECT_EQ(ledger->peak_total(), 0) << name_of(spec.kind);
    EXPECT_THROW(m->values(), Error);
    EXPECT_THROW(m->grads(), Error);
    EXPECT_THROW(m->zero_grad(), Error);
    EXPECT_THROW(m->params_sha256(), Error);
    for (const Parameter* p : m->parameters()) {
      EXPECT_FALSE(p->value.defined()) << p->name;
      EXPECT_FALSE(p->grad.defined()) << p->name;
      EXPECT_THROW(p->value.data<float>(), Error) << p->name;
    }
    const auto [x, labels] = batch_for(spec, 2, 1);
    EXPECT_THROW(m->forward(x, kTrain, nullptr), Error) << name_of(spec.kind);  // unbound: no crash
  }
}

TEST(ModelLayout, ParametersAreNamedViewsOfOneArena) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    auto m = materialized(spec, 1);
    const Tensor& values = m->values();
    const Tensor& grads = m->grads();
    ASSERT_EQ(values.numel(), m->arena_numel());
    ASSERT_EQ(grads.numel(), m->arena_numel());
    int64_t total = 0, end = 0;
    std::set<std::string> names;
    for (size_t k = 0; k < m->parameters().size(); ++k) {
      const Parameter& p = *m->parameters()[k];
      EXPECT_TRUE(names.insert(p.name).second) << p.name;
      EXPECT_EQ(m->offset(k) % 16, 0) << p.name;  // 64-byte aligned
      EXPECT_GE(m->offset(k), end) << p.name;     // in order, disjoint
      EXPECT_EQ(m->param_range(k), (Range{m->offset(k), m->offset(k) + p.value.numel()}));
      EXPECT_EQ(p.value.raw(), values.data<float>() + m->offset(k)) << p.name;
      EXPECT_EQ(p.grad.raw(), grads.data<float>() + m->offset(k)) << p.name;
      EXPECT_EQ(p.value.shape(), p.shape);
      EXPECT_EQ(p.grad.shape(), p.shape);
      end = m->param_range(k).hi;
      total += p.value.numel();
    }
    EXPECT_EQ(m->num_parameters(), total);
    EXPECT_GE(m->arena_numel(), end);
    EXPECT_LT(m->arena_numel(), end + 16);
    // Block ranges: the span of the block's own parameters, in order; empty without any.
    size_t next = 0;
    for (size_t i = 0; i < m->num_blocks(); ++i) {
      auto [first, last] = m->block_parameters(i);
      EXPECT_EQ(first, next);
      EXPECT_EQ(last - first, m->block(i).parameters().size());
      for (size_t k = first; k < last; ++k)
        EXPECT_EQ(m->parameters()[k]->name.rfind(m->block_name(i) + ".", 0), 0u);
      const Range r = m->block_range(i);
      if (first == last) {
        EXPECT_TRUE(r.empty()) << m->block_name(i);
        EXPECT_TRUE(m->runs(r).empty());
      } else {
        EXPECT_EQ(r, (Range{m->offset(first), m->param_range(last - 1).hi}));
        const auto runs = m->runs(r);
        ASSERT_EQ(runs.size(), last - first) << m->block_name(i);
        for (size_t j = 0; j < runs.size(); ++j) {
          const Range pr = m->param_range(first + j);
          EXPECT_EQ(runs[j], (nn::Run{first + j, pr.lo, 0, pr.size()}));
          EXPECT_EQ(m->logical_offset(first + j), m->offset(first + j));
        }
      }
      next = last;
    }
    EXPECT_EQ(next, m->parameters().size());
  }
}

TEST(ModelLayout, RunsClipToTheRange) {
  auto m = build_model(mlp_spec());
  // From the middle of fc1.weight to the middle of fc2.weight.
  const Range r{m->offset(0) + 100, m->offset(2) + 7};
  const auto runs = m->runs(r);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], (nn::Run{0, 100, 100, m->param_range(0).size() - 100}));
  EXPECT_EQ(runs[1], (nn::Run{1, m->offset(1), 0, m->param_range(1).size()}));
  EXPECT_EQ(runs[2], (nn::Run{2, m->offset(2), 0, 7}));
  // Padding after fc1.bias (512 is a multiple of 16, fc3.bias has 10 elements: 6 of padding).
  const Range pad{m->param_range(5).hi, m->arena_numel()};
  EXPECT_EQ(pad.size(), 6);
  EXPECT_TRUE(m->runs(pad).empty());
  EXPECT_TRUE(m->runs({}).empty());
}

// A tensor-parallel group for layout alone: building a cut model needs its rank and size,
// never a collective.
class LayoutOnlyGroup final : public TensorParallel {
 public:
  LayoutOnlyGroup(int rank, int size) : TensorParallel(rank, size, false) {}
  void all_reduce_sum(void*, int64_t, DType) override { ADD_FAILURE(); }
  void all_reduce_max(float*, int64_t) override { ADD_FAILURE(); }
  void all_gather(const void*, void*, int64_t, DType) override { ADD_FAILURE(); }
  void reduce_scatter(const void*, void*, int64_t, DType) override { ADD_FAILURE(); }
};

// Every rank's part of a cut model starts with the whole model's values at the logical
// elements its runs name; the parts cover every element once (replicas aside) and padding is
// zero.
TEST(ModelLayout, CutModelsStartFromTheWholeModelsWeights) {
  ModelSpec mlp = mlp_spec();
  mlp.hidden = {64, 32, 16};   // column, row, column + the output layer as row
  ModelSpec gpt = gpt_spec();  // vocabulary 11: padded to 12 over 2 or 4 ranks
  gpt.heads = 4;
  for (const ModelSpec& spec : {mlp, gpt}) {
    auto whole = build_model(spec);
    std::vector<float> w(static_cast<size_t>(whole->arena_numel()));
    whole->init_values(w.data(), {0, whole->arena_numel()}, 5);
    for (int t : {2, 4}) {
      int64_t covered = 0;
      for (int r = 0; r < t; ++r) {
        LayoutOnlyGroup group(r, t);
        auto part = build_model(spec, &group);
        ASSERT_EQ(part->parameters().size(), whole->parameters().size());
        EXPECT_EQ(part->num_parameters(), whole->num_parameters());
        EXPECT_EQ(part->logical_numel(), whole->arena_numel());
        std::vector<float> v(static_cast<size_t>(part->arena_numel()));
        part->init_values(v.data(), {0, part->arena_numel()}, 5);
        std::vector<char> in_run(v.size(), 0);
        for (const nn::Run& run : part->runs({0, part->arena_numel()})) {
          const Parameter& p = *part->parameters()[run.param];
          EXPECT_EQ(part->logical_offset(run.param), whole->offset(run.param));
          EXPECT_EQ(p.split.replica, r > 0 && !p.is_split()) << p.name;
          for (int64_t e = 0; e < run.count; ++e) {
            in_run[static_cast<size_t>(run.local + e)] = 1;
            ASSERT_EQ(v[static_cast<size_t>(run.local + e)],
                      w[static_cast<size_t>(whole->offset(run.param) + run.logical + e)])
                << name_of(spec.kind) << " tp " << t << " rank " << r << " " << p.name
                << " element " << e;
          }
          if (!p.split.replica) covered += run.count;
        }
        for (size_t e = 0; e < v.size(); ++e) {
          if (!in_run[e]) {
            ASSERT_EQ(v[e], 0.0f) << "padding element " << e;
          }
        }
      }
      EXPECT_EQ(covered, whole->num_parameters()) << name_of(spec.kind) << " tp " << t;
    }
  }
}

TEST(ModelLayout, BadCutsNameTheKey) {
  LayoutOnlyGroup group(0, 4);
  ModelSpec mlp = mlp_spec();
  mlp.hidden = {30, 32};
  try {
    build_model(mlp, &group);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden[0] = 30"), std::string::npos) << e.what();
  }
  ModelSpec gpt = gpt_spec();  // 2 heads over 4 ranks
  try {
    build_model(gpt, &group);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.heads = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_model(cnn_spec(), &group), InvalidArgument);
}

TEST(ModelLayout, Names) {
  auto mlp = build_model(mlp_spec());
  std::vector<std::string> names;
  for (size_t i = 0; i < mlp->num_blocks(); ++i) names.push_back(mlp->block_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"fc1", "act1", "fc2", "act2", "fc3"}));
  names.clear();
  for (const Parameter* p : mlp->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(mlp->num_parameters(), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  for (size_t i = 0; i < mlp->num_blocks(); ++i) {
    EXPECT_EQ(mlp->blocks_using(i), std::vector<size_t>{i});  // nothing tied
    EXPECT_EQ(mlp->blocks_used_by(i), std::vector<size_t>{i});
    EXPECT_TRUE(mlp->borrowed(i).empty());
  }

  ModelSpec c = cnn_spec();
  c.dropout = 0.5f;
  auto cnn = build_model(c);
  names.clear();
  for (size_t i = 0; i < cnn->num_blocks(); ++i) names.push_back(cnn->block_name(i));
  // Each conv -> ReLU -> pool stage is one fused block named after its convolution.
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "conv2", "flatten", "fc1", "relu3", "dropout",
                                             "fc2"}));
  // 28 -> conv(pad 2) 28 -> pool 14 -> 14 -> 7: fc1 sees 32 * 7 * 7.
  EXPECT_EQ(cnn->parameters()[4]->name, "fc1.weight");
  EXPECT_EQ(cnn->parameters()[4]->shape, (Shape{128, 32 * 7 * 7}));

  auto gpt = build_model(gpt_spec());
  names.clear();
  for (size_t i = 0; i < gpt->num_blocks(); ++i) names.push_back(gpt->block_name(i));
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  names.clear();
  for (const Parameter* p : gpt->parameters()) names.push_back(p->name);
  EXPECT_EQ(names.front(), "embed.wte");
  EXPECT_EQ(names[2], "block0.ln1.weight");
  EXPECT_EQ(names[4], "block0.attn.qkv.weight");
  EXPECT_EQ(names.back(), "head.ln.bias");
  // Tied head: V*C counted once. Per block 12 C^2 + 13 C; embeddings (V + T) C; final LN 2C.
  const int64_t C = 16, V = 11, T = 8;
  EXPECT_EQ(gpt->num_parameters(), (V + T) * C + 2 * (12 * C * C + 13 * C) + 2 * C);
  // The head reads the embedding's token table: its users and uses say so.
  EXPECT_EQ(gpt->blocks_using(0), (std::vector<size_t>{0, 3}));
  EXPECT_EQ(gpt->blocks_using(1), (std::vector<size_t>{1}));
  EXPECT_EQ(gpt->blocks_using(3), (std::vector<size_t>{3}));
  EXPECT_EQ(gpt->blocks_used_by(3), (std::vector<size_t>{0, 3}));
  EXPECT_EQ(gpt->blocks_used_by(0), (std::vector<size_t>{0}));
  ASSERT_EQ(gpt->borrowed(3).size(), 1u);
  EXPECT_EQ(gpt->borrowed(3)[0]->name, "embed.wte");
  EXPECT_EQ(static_cast<LmHead&>(gpt->block(3)).token_table(), gpt->parameters()[0]);
}

// ---- init ----

TEST(ModelInit, DeterministicAndKeyedOnlyBySeed) {
  EXPECT_EQ(materialized(mlp_spec(), 7)->params_sha256(),
            materialized(mlp_spec(), 7)->params_sha256());
  EXPECT_NE(materialized(mlp_spec(), 7)->params_sha256(),
            materialized(mlp_spec(), 8)->params_sha256());
  EXPECT_EQ(materialized(gpt_spec(), 7)->params_sha256(),
            materialized(gpt_spec(), 7)->params_sha256());
  // Dropout blocks shift block indices but not parameter indices: same values.
  ModelSpec with_dropout = mlp_spec();
  with_dropout.dropout = 0.2f;
  EXPECT_EQ(materialized(with_dropout, 7)->params_sha256(),
            materialized(mlp_spec(), 7)->params_sha256());
  // Training changes the hash; materialize() twice is refused.
  auto m = materialized(mlp_spec(), 7);
  const std::string before = m->params_sha256();
  m->parameters()[0]->value.data<float>()[0] += 1.0f;
  EXPECT_NE(m->params_sha256(), before);
  EXPECT_THROW(m->materialize(7), Error);
}

TEST(ModelInit, Distributions) {
  auto mlp = materialized(mlp_spec(), 3);
  const Tensor w = mlp->parameters()[0]->value;
  const float bound = 1.0f / std::sqrt(784.0f);
  float lo = 1, hi = -1;
  double mean = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    lo = std::min(lo, w.data<float>()[i]);
    hi = std::max(hi, w.data<float>()[i]);
    mean += w.data<float>()[i];
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.99f * bound);
  EXPECT_GT(hi, 0.99f * bound);
  EXPECT_NEAR(mean / w.numel(), 0.0, 1e-3);

  auto gpt = materialized(gpt_spec(), 3);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += double{t.data<float>()[i]} * t.data<float>()[i];
    return std::sqrt(s / t.numel());
  };
  for (const Parameter* p : gpt->parameters()) {
    const std::string& n = p->name;
    const bool ln_weight = n.find("ln") != std::string::npos && n.ends_with(".weight");
    if (ln_weight || n.ends_with(".bias")) {
      const float expect = ln_weight ? 1.0f : 0.0f;
      for (int64_t i = 0; i < p->value.numel(); ++i)
        ASSERT_EQ(p->value.data<float>()[i], expect) << n;
    } else if (n.ends_with("proj.weight")) {
      EXPECT_NEAR(stddev(p->value), 0.02 / std::sqrt(4.0), 0.002) << n;
    } else {
      EXPECT_NEAR(stddev(p->value), 0.02, 0.003) << n;
    }
  }
}

// A rank initialises only what it holds: init_values over any range, on a model that has no
// memory, writes exactly what materialize() writes there (padding included, as zeros).
TEST(ModelInit, InitValuesOverAnyRangeEqualMaterialize) {
  for (const ModelSpec& spec : {mlp_spec(), cnn_spec(), gpt_spec()}) {
    const uint64_t seed = 11;
    auto full = materialized(spec, seed);
    auto bare = build_model(spec);
    const int64_t n = bare->arena_numel();
    std::vector<Range> ranges = {{0, n}, {0, 0}, {n - 1, n}, {0, 1}};
    for (size_t k = 0; k < bare->parameters().size(); ++k) {
      const Range p = bare->param_range(k);
      ranges.push_back(p);
      ranges.push_back({p.lo + p.size() / 3, std::min(n, p.hi + 5)});  // into the padding
      if (k > 0) ranges.push_back({bare->param_range(k - 1).hi - 1, p.lo + 1});
    }
    const CounterRng rng(3, mix_stream(RngPurpose::kData, 0x4A));
    for (uint64_t i = 0; i < 16; ++i) {
      const int64_t a = rng.bits(2 * i) % (n + 1), b = rng.bits(2 * i + 1) % (n + 1);
      ranges.push_back({std::min(a, b), std::max(a, b)});
    }
    for (const Range& r : ranges) {
      std::vector<float> got(r.size() + 1, -7.0f);  // one guard element past the end
      bare->init_values(got.data(), r, seed);
      ASSERT_EQ(std::memcmp(got.data(), full->values().data<float>() + r.lo, r.size() * 4), 0)
          << name_of(spec.kind) << " [" << r.lo << ", " << r.hi << ")";
      ASSERT_EQ(got.back(), -7.0f) << "wrote past the range";
    }
    std::vector<float> other(n);
    bare->init_values(other.data(), {0, n}, seed + 1);
    EXPECT_NE(std::memcmp(other.data(), full->values().data<float>(), n * 4), 0);
  }
}

// ---- memory ----

TEST(ModelMemory, MaterializeChargesParametersAndGradients) {
  auto ledger = std::make_shared<MemoryLedger>();
  {
    MemoryScope scope(ledger, MemCategory::kOther);
    auto m = build_model(gpt_spec());
    m->materialize(1);
    const int64_t arena = round64(m->arena_numel() * 4);
    EXPECT_EQ(ledger->current(MemCategory::kParameters), arena);
    EXPECT_EQ(ledger->current(MemCategory::kGradients), arena);
    EXPECT_EQ(ledger->current(MemCategory::kOther), 0);
    EXPECT_EQ(current_category(), MemCategory::kOther);  // materialize's scopes are closed
  }
  EXPECT_EQ(ledger->total(), 0);  // the model's memory went with it
}

TEST(ModelMemory, BindMovesViewsAndUnbindingThrows) {
  ModelSpec spec = small_specs()[0];
  spec.dropout = 0;
  auto m = materialized(spec, 2);
  m->set_input_grad(true);
  const auto [x, labels] = batch_for(spec, 3, 4);
  const Tensor y0 = m->forward(x, kTrain, nullptr);
  const Range r = m->block_range(0);  // fc1
  const auto [first, last] = m->block_parameters(0);

  // Values: a copy in other memory, then the views point there.
  Tensor mem = Tensor::empty({r.size() + 3});
  mem.view(0, {r.size()}).copy_from(m->values().view(r.lo, {r.size()}));
  m->bind_values(r, mem);
  for (size_t k = first; k < last; ++k)
    EXPECT_EQ(m->parameters()[k]->value.raw(), mem.data<float>() + (m->offset(k) - r.lo));
  EXPECT_TRUE(same_bits(m->forward(x, kTrain, nullptr), y0));
  m->values().data<float>()[r.lo] += 1.0f;  // the old arena is no longer read for fc1
  EXPECT_TRUE(same_bits(m->forward(x, kTrain, nullptr), y0));
  mem.data<float>()[0] += 1.0f;
  EXPECT_FALSE(same_bits(m->forward(x, kTrain, nullptr), y0));

  // Gradients of fc1 go to the new memory, the rest stays in the arena.
  Tensor gmem = Tensor::zeros({r.size()});
  m->bind_grads(r, gmem);
  m->zero_grad();
  Activations acts;
  const Tensor dy = randn(y0.shape(), 5);
  m->forward(x, kTrain, &acts);
  m->backward(dy, acts);
  double moved = 0, left = 0, rest = 0;
  for (int64_t i = 0; i < r.size(); ++i) moved += std::abs(gmem.data<float>()[i]);
  for (int64_t i = r.lo; i < r.hi; ++i) left += std::abs(m->grads().data<float>()[i]);
  for (int64_t i = r.hi; i < m->arena_numel(); ++i) rest += std::abs(m->grads().data<float>()[i]);
  EXPECT_GT(moved, 0);
  EXPECT_EQ(left, 0);
  EXPECT_GT(rest, 0);

  // Unbound: the views are undefined and touching them throws tessel::Error.
  m->bind_values(r, Tensor());
  for (size_t k = first; k < last; ++k) {
    EXPECT_FALSE(m->parameters()[k]->value.defined());
    EXPECT_THROW(m->parameters()[k]->value.data<float>(), Error);
    EXPECT_TRUE(m->parameters()[k]->grad.defined());
  }
  EXPECT_THROW(m->forward(x, kTrain, nullptr), Error);
  m->bind_values(r, mem);
  m->bind_grads(r, Tensor());
  m->forward(x, kTrain, &acts);
  EXPECT_THROW(m->backward(dy, acts), Error);

  // A range must hold whole parameters, and the memory must cover it.
  EXPECT_THROW(m->bind_values({r.lo + 1, r.hi}, mem), Error);
  EXPECT_THROW(m->bind_values({r.lo, r.hi - 1}, mem), Error);
  EXPECT_THROW(m->bind_values(r, Tensor::empty({r.size() - 1})), Error);
}

// ZeRO-3 in miniature: nothing is materialized; each block's parameters (and those it borrows,
// blocks_used_by) are gathered into fresh memory just before its forward and backward and
// released just after, and gradients land in one flat buffer bound block by block. The run
// equals the materialized one bit for bit, and no block reads a parameter outside its hooks
// (an unbound parameter throws).
TEST(ModelMemory, BindingEachBlockOnlyAroundItsWorkEqualsMaterialized) {
  for (const ModelSpec& spec : small_specs()) {
    const uint64_t seed = 5;
    const auto [x, labels] = batch_for(spec, 3, 6);
    auto ref = materialized(spec, seed);
    ref->zero_grad();
    Activations ref_acts;
    CrossEntropyLoss ref_loss;
    const float ref_l = ref_loss.forward(ref->forward(x, kTrain, &ref_acts), labels).mean;
    ref->backward(ref_loss.backward(1.0f), ref_acts);

    auto m = build_model(spec);
    const int64_t n = m->arena_numel();
    Tensor store = Tensor::empty({n});  // the "sharded" values, initialised without the model
    m->init_values(store.data<float>(), {0, n}, seed);
    Tensor grads = Tensor::zeros({n});
    auto gather = [&](size_t block) {
      for (size_t o : m->blocks_used_by(block)) {
        const Range r = m->block_range(o);
        if (r.empty()) continue;
        Tensor gathered = Tensor::empty({r.size()});
        gathered.copy_from(store.view(r.lo, {r.size()}));
        m->bind_values(r, gathered);
        m->bind_grads(r, grads.view(r.lo, {r.size()}));
      }
    };
    auto release = [&](size_t block) {
      for (size_t o : m->blocks_used_by(block)) {
        const Range r = m->block_range(o);
        if (r.empty()) continue;
        m->bind_values(r, Tensor());
        m->bind_grads(r, Tensor());
      }
    };
    const BlockHook hook = [&](Phase phase, size_t block) {
      if (phase == Phase::kBeforeForward || phase == Phase::kBeforeBackward) gather(block);
      if (phase == Phase::kAfterForward || phase == Phase::kAfterBackward) release(block);
    };
    Activations acts;
    CrossEntropyLoss loss;
    const float l = loss.forward(m->forward(x, kTrain, &acts, hook), labels).mean;
    m->backward(loss.backward(1.0f), acts, hook);
    EXPECT_EQ(l, ref_l) << name_of(spec.kind);
    EXPECT_TRUE(same_bits(grads, ref->grads())) << name_of(spec.kind);
    for (const Parameter* p : m->parameters()) EXPECT_FALSE(p->value.defined()) << p->name;
  }
}

}  // namespace
}  // namespace tessel::nn

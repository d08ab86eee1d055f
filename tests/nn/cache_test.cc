// What a forward keeps for its backward: the Cache (buffers reused across steps, kept tensors,
// children, a shared scratch) and the Activations a model runs through. Hooks around every
// block and block slices; two micro-batches in flight equal one after the other; inference
// keeps nothing; a steady-state step reuses every buffer and allocates nothing.
#include "tessel/nn/cache.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "nn_testing.h"
#include "tessel/core/memory.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::materialized;
using testing::randn;
using testing::same_bits;
using testing::small_specs;

const Context kTrain{true, 77, 5, 0};

// ---- Cache ----

TEST(Cache, BufferKeepsItsStorageWhileBigEnough) {
  Cache c;
  const Tensor a = c.buffer(0, {4, 6});
  EXPECT_EQ(a.shape(), (Shape{4, 6}));
  const Tensor smaller = c.buffer(0, {3, 5});
  EXPECT_EQ(smaller.shape(), (Shape{3, 5}));
  EXPECT_EQ(smaller.raw(), a.raw());
  EXPECT_EQ(c.buffer(0, {24}).raw(), a.raw());
  EXPECT_NE(c.buffer(1, {24}).raw(), a.raw());  // another slot, other storage
  const Tensor bigger = c.buffer(0, {5, 6});
  EXPECT_NE(bigger.raw(), a.raw());
  EXPECT_EQ(c.buffer(0, {4, 6}).raw(), bigger.raw());  // the slot keeps the grown storage
  EXPECT_EQ(c.buffer(0, {4}, DType::kI32).dtype(), DType::kI32);  // a dtype change reallocates
  const Tensor s = c.scratch(0, {24});
  EXPECT_NE(s.raw(), c.buffer(0, {24}).raw());  // scratch slots are apart from buffer slots
  EXPECT_EQ(c.scratch(0, {2}).raw(), s.raw());
}

TEST(Cache, KeepAndBytes) {
  Cache c;
  EXPECT_THROW(c.kept(0), Error);  // backward before forward
  const Tensor t = randn({3}, 1);
  c.keep(2, t);
  EXPECT_EQ(c.kept(2).raw(), t.raw());  // a reference, not a copy
  EXPECT_THROW(c.kept(1), Error);
  EXPECT_EQ(c.bytes(), 0);
  c.buffer(0, {10});
  c.child(1).buffer(0, {6});  // child 0 appears too, empty
  EXPECT_EQ(c.bytes(), 16 * 4);
  Cache& first = c.child(0);
  c.child(5);  // children added later leave earlier references valid
  first.buffer(3, {2});
  EXPECT_EQ(c.bytes(), 18 * 4);
}

// After a forward its workspace (the scratch slots) can go while what the backward reads stays:
// a slot's storage survives while a kept tensor still refers to it.
TEST(Cache, ReleaseScratchDropsOnlyTheScratchSlots) {
  Cache c;
  c.buffer(0, {10});
  c.scratch(0, {4});
  c.child(0).scratch(1, {3});
  c.child(0).buffer(1, {2});
  const Tensor kept = c.scratch(2, {5});
  c.keep(0, kept);
  EXPECT_EQ(c.bytes(), 24 * 4);
  c.release_scratch();
  EXPECT_EQ(c.bytes(), 12 * 4);  // the buffers of c and its child
  EXPECT_EQ(c.kept(0).raw(), kept.raw());
}

TEST(Cache, SharedScratchServesEveryCacheAndChild) {
  Cache shared, a, b;
  a.child(1);  // exists before sharing: share_scratch reaches it
  a.share_scratch(&shared);
  b.share_scratch(&shared);
  const Tensor sa = a.scratch(0, {8});
  EXPECT_EQ(b.scratch(0, {8}).raw(), sa.raw());
  EXPECT_EQ(a.child(1).scratch(2, {8}).raw(), b.child(1).scratch(2, {8}).raw());
  EXPECT_EQ(a.child(3).scratch(0, {8}).raw(), shared.child(3).buffer(0, {8}).raw());
  EXPECT_NE(a.buffer(0, {8}).raw(), b.buffer(0, {8}).raw());  // buffers stay per cache
  EXPECT_EQ(a.bytes(), 8 * 4);  // the shared scratch is not counted by its users
  a.share_scratch(nullptr);
  EXPECT_NE(a.scratch(0, {8}).raw(), sa.raw());
  EXPECT_NE(a.child(1).scratch(2, {8}).raw(), b.child(1).scratch(2, {8}).raw());
}

TEST(Cache, OutputWithoutCacheIsFreshStorage) {
  Cache c;
  EXPECT_EQ(output(&c, 0, {4}).raw(), output(&c, 0, {4}).raw());
  const Tensor a = output(nullptr, 0, {4});
  const Tensor b = output(nullptr, 0, {4});
  EXPECT_NE(a.raw(), b.raw());
  EXPECT_EQ(a.shape(), (Shape{4}));
  EXPECT_EQ(c.bytes(), 4 * 4);
}

// ---- running a model ----

using Event = std::pair<Phase, size_t>;

TEST(ModelRun, HooksRunAroundEveryBlockAndSlicesCompose) {
  for (const ModelSpec& spec : small_specs()) {
    auto m = materialized(spec, 1);
    m->set_input_grad(spec.kind != ModelKind::kGpt);
    const auto [x, labels] = batch_for(spec, 4, 1);
    std::vector<Event> events;
    const BlockHook record = [&](Phase p, size_t i) { events.push_back({p, i}); };
    Activations acts;
    const Tensor full_y = m->forward(x, kTrain, &acts, record).clone();
    const Tensor r = randn(full_y.shape(), 2);
    m->zero_grad();
    Tensor full_dx = m->backward(r, acts, record);
    if (full_dx.defined()) full_dx = full_dx.clone();
    const Tensor full_g = m->grads().clone();
    std::vector<Event> expect;
    for (size_t i = 0; i < m->num_blocks(); ++i)
      expect.insert(expect.end(), {{Phase::kBeforeForward, i}, {Phase::kAfterForward, i}});
    for (size_t i = m->num_blocks(); i-- > 0;)
      expect.insert(expect.end(), {{Phase::kBeforeBackward, i}, {Phase::kAfterBackward, i}});
    EXPECT_EQ(events, expect) << name_of(spec.kind);

    // The same blocks in two slices, through the same activations, give the same bits.
    const size_t cut = m->num_blocks() / 2;
    events.clear();
    const Tensor h = m->forward(x, kTrain, &acts, record, 0, cut);
    const Tensor y = m->forward(h, kTrain, &acts, record, cut);
    m->zero_grad();
    const Tensor dh = m->backward(r, acts, record, cut);
    EXPECT_TRUE(dh.defined());
    const Tensor dx = m->backward(dh, acts, record, 0, cut);
    EXPECT_EQ(events, expect) << name_of(spec.kind);
    EXPECT_TRUE(same_bits(y, full_y)) << name_of(spec.kind);
    EXPECT_EQ(dx.defined(), full_dx.defined());
    if (dx.defined()) {
      EXPECT_TRUE(same_bits(dx, full_dx)) << name_of(spec.kind);
    }
    EXPECT_TRUE(same_bits(m->grads(), full_g)) << name_of(spec.kind);
  }
}

// What data parallelism relies on: a block's gradients are untouched until the backward of the
// last block using them (in forward order) and complete after the first one's (the tied table:
// after the embedding's backward, although the head wrote into it first).
TEST(ModelRun, BlockGradientsAreCompleteAfterTheirFirstUsersBackward) {
  for (const ModelSpec& spec : small_specs()) {
    auto m = materialized(spec, 2);
    const auto [x, labels] = batch_for(spec, 3, 4);
    const size_t n = m->num_blocks();
    std::vector<Tensor> snapshot(n);
    auto grads_of = [&](size_t i) {
      const Range r = m->block_range(i);
      return m->grads().view(r.lo, {r.size()});
    };
    const BlockHook hook = [&](Phase p, size_t j) {
      for (size_t i = 0; i < n; ++i) {
        const std::vector<size_t>& users = m->blocks_using(i);
        if (m->block_range(i).empty()) continue;
        if (p == Phase::kBeforeBackward && users.back() == j) {
          EXPECT_EQ(testing::dot(grads_of(i), grads_of(i)), 0.0) << m->block_name(i);
        }
        if (p == Phase::kAfterBackward && users.front() == j) snapshot[i] = grads_of(i).clone();
      }
    };
    Activations acts;
    CrossEntropyLoss loss;
    loss.forward(m->forward(x, kTrain, &acts), labels);
    m->zero_grad();
    m->backward(loss.backward(1.0f), acts, hook);
    for (size_t i = 0; i < n; ++i) {
      if (m->block_range(i).empty()) continue;
      ASSERT_TRUE(snapshot[i].defined()) << m->block_name(i);
      EXPECT_TRUE(same_bits(snapshot[i], grads_of(i))) << m->block_name(i);
      EXPECT_GT(testing::dot(snapshot[i], snapshot[i]), 0.0) << m->block_name(i);
    }
  }
}

TEST(ModelRun, FirstBlockInputGradientIsOffByDefault) {
  ModelSpec spec = small_specs()[0];
  auto m = materialized(spec, 1);
  const auto [x, labels] = batch_for(spec, 3, 3);
  const Tensor r = randn({3, spec.num_classes}, 4);
  Activations acts;
  m->forward(x, kTrain, &acts);
  m->zero_grad();
  EXPECT_FALSE(m->backward(r, acts).defined());
  const Tensor without = m->grads().clone();
  m->set_input_grad(true);
  m->forward(x, kTrain, &acts);
  m->zero_grad();
  const Tensor dx = m->backward(r, acts);
  ASSERT_TRUE(dx.defined());
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_TRUE(same_bits(m->grads(), without));
}

// One training step's results, copied out of the buffers that hold them.
struct StepResult {
  float loss = 0;
  Tensor y, dx;
};

StepResult finish(Model& m, const Tensor& y, Activations& acts, CrossEntropyLoss& loss,
                  const Tensor& labels) {
  StepResult s;
  s.y = y.clone();
  s.loss = loss.forward(y, labels).mean;
  const Tensor dx = m.backward(loss.backward(1.0f), acts);
  if (dx.defined()) s.dx = dx.clone();
  return s;
}

void expect_same(const StepResult& a, const StepResult& b, const std::string& what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  EXPECT_TRUE(same_bits(a.y, b.y)) << what;
  EXPECT_EQ(a.dx.defined(), b.dx.defined()) << what;
  if (a.dx.defined()) {
    EXPECT_TRUE(same_bits(a.dx, b.dx)) << what;
  }
}

// What a pipeline does with micro-batches in flight: forwards of two micro-batches into two
// Activations before either backward. Outputs, input gradients and the accumulated parameter
// gradients equal running them one after the other (backwards in the same order), also when
// the two share one scratch Activations for their backward outputs.
TEST(InFlight, TwoMicroBatchesEqualOneAfterTheOther) {
  for (const ModelSpec& spec : small_specs()) {
    auto m = materialized(spec, 3);
    m->set_input_grad(spec.kind != ModelKind::kGpt);
    const auto [x1, l1] = batch_for(spec, 3, 10);
    const auto [x2, l2] = batch_for(spec, 2, 20);
    Context c1 = kTrain, c2 = kTrain;
    c2.first_sample = 3;  // the second micro-batch's rows, for dropout

    Activations one;
    CrossEntropyLoss loss;
    m->zero_grad();
    const StepResult s1 = finish(*m, m->forward(x1, c1, &one), one, loss, l1);
    const StepResult s2 = finish(*m, m->forward(x2, c2, &one), one, loss, l2);
    const Tensor sequential = m->grads().clone();

    for (bool share : {false, true}) {
      const std::string what = name_of(spec.kind) + std::string(share ? " (shared scratch)" : "");
      Activations a, b, scratch;
      if (share) {
        for (Activations* acts : {&a, &b, &scratch}) acts->caches.resize(m->num_blocks());
        for (size_t i = 0; i < m->num_blocks(); ++i) {
          a.caches[i].share_scratch(&scratch.caches[i]);
          b.caches[i].share_scratch(&scratch.caches[i]);
        }
      }
      CrossEntropyLoss loss_a, loss_b;
      m->zero_grad();
      const Tensor ya = m->forward(x1, c1, &a);
      const Tensor yb = m->forward(x2, c2, &b);
      EXPECT_NE(ya.raw(), yb.raw()) << what;
      expect_same(finish(*m, ya, a, loss_a, l1), s1, what);
      expect_same(finish(*m, yb, b, loss_b, l2), s2, what);
      EXPECT_TRUE(same_bits(m->grads(), sequential)) << what;
      if (share) {
        EXPECT_LT(a.bytes(), one.bytes()) << what;  // backward outputs live elsewhere
      }
    }
  }
}

// Inference (null activations) keeps nothing: its outputs are fresh storage the caller owns,
// nothing stays allocated once they are dropped, and they equal a training-mode forward with
// dropout off (or with the same dropout context).
TEST(Inference, KeepsNothingAndMatchesTheTrainingForward) {
  for (const ModelSpec& spec : small_specs()) {
    auto ledger = std::make_shared<MemoryLedger>();
    MemoryScope scope(ledger, MemCategory::kActivations);
    auto m = materialized(spec, 4);
    const auto [x, labels] = batch_for(spec, 3, 30);
    const auto [x2, labels2] = batch_for(spec, 3, 40);
    Context eval = kTrain;
    eval.training = false;
    for (const Context& ctx : {eval, kTrain}) {
      const std::string what =
          name_of(spec.kind) + std::string(ctx.training ? " training" : " eval");
      const int64_t before = ledger->total();
      {
        const Tensor y = m->forward(x, ctx, nullptr);
        const Tensor y_copy = y.clone();
        const Tensor y2 = m->forward(x2, ctx, nullptr);
        EXPECT_NE(y.raw(), y2.raw()) << what;
        EXPECT_TRUE(same_bits(y, y_copy)) << what;  // the second call left the first alone
        Activations acts;
        EXPECT_TRUE(same_bits(m->forward(x, ctx, &acts), y)) << what;
        EXPECT_GT(acts.bytes(), 0) << what;
      }
      EXPECT_EQ(ledger->total(), before) << what;
    }
    // Dropout off through the spec: a training-mode forward equals eval and inference.
    ModelSpec plain = spec;
    plain.dropout = 0;
    auto p = materialized(plain, 4);
    Activations acts;
    const Tensor y_train = p->forward(x, kTrain, &acts);
    EXPECT_TRUE(same_bits(p->forward(x, eval, nullptr), y_train)) << name_of(spec.kind);
    EXPECT_TRUE(same_bits(p->forward(x, kTrain, nullptr), y_train)) << name_of(spec.kind);
  }
}

// A second step with the same shapes through the same Activations reuses every buffer (same
// output and dlogits storage), allocates nothing at all, and gives the same results.
TEST(SteadyState, SecondStepReusesBuffersAllocatesNothingAndRepeats) {
  for (const ModelSpec& spec : small_specs()) {
    auto m = materialized(spec, 2);
    m->set_input_grad(spec.kind != ModelKind::kGpt);
    const auto [x, labels] = batch_for(spec, 3, 5);
    auto ledger = std::make_shared<MemoryLedger>();
    MemoryScope scope(ledger, MemCategory::kActivations);
    Activations acts;
    CrossEntropyLoss loss;
    auto step = [&](const void** out_ptr, const void** dlogits_ptr) {
      const Tensor y = m->forward(x, kTrain, &acts);
      const float l = loss.forward(y, labels).mean;
      m->zero_grad();
      const Tensor d = loss.backward(1.0f);
      m->backward(d, acts);
      *out_ptr = y.raw();
      *dlogits_ptr = d.raw();
      return l;
    };
    const void *y1, *d1, *y2, *d2;
    const float l1 = step(&y1, &d1);
    const Tensor g1 = m->grads().clone();
    const int64_t held = ledger->total();
    EXPECT_GE(held, acts.bytes()) << name_of(
        spec.kind);  // the caches' buffers, charged as activations
    EXPECT_EQ(ledger->current(MemCategory::kActivations), held) << name_of(spec.kind);
    ledger->reset_peaks();
    const float l2 = step(&y2, &d2);
    EXPECT_EQ(l1, l2) << name_of(spec.kind);
    EXPECT_EQ(y1, y2) << name_of(spec.kind);
    EXPECT_EQ(d1, d2) << name_of(spec.kind);
    EXPECT_TRUE(same_bits(m->grads(), g1)) << name_of(spec.kind);
    EXPECT_EQ(ledger->total(), held) << name_of(spec.kind);
    EXPECT_EQ(ledger->peak_total(), held) << name_of(spec.kind) << ": a transient allocation";
  }
}

}  // namespace
}  // namespace tessel::nn

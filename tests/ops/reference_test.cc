// The kernels against PyTorch 1.13: fixtures written by tests/fixtures/gen_fixtures.py hold
// float32 inputs and float64 reference outputs and gradients (F.linear, F.layer_norm, causal
// attention in our qkv layout, F.cross_entropy, tanh GELU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

using Json = nlohmann::json;
using Vec = std::vector<float>;

Json load(const std::string& name) {
  const std::string path = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/" + name;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path << "; regenerate it with gen_fixtures.py";
    return Json::object();
  }
  return Json::parse(in);
}

Vec floats(const Json& j) { return j.get<Vec>(); }

// Elementwise |got - want| <= 1e-5 * (|want| + max|want|): relative to each value, with a floor
// at the tensor's scale so values that are nearly zero are judged against their neighbours.
void expect_close(const std::string& what, const Vec& got, const Json& want_json) {
  const std::vector<double> want = want_json.get<std::vector<double>>();
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= 1e-5 * (std::abs(want[i]) + scale)) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", PyTorch " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(PyTorchReference, Linear) {
  const Json f = load("linear.json");
  const int64_t N = f["N"], C = f["C"], OC = f["OC"];
  Vec x = floats(f["x"]), w = floats(f["w"]), b = floats(f["b"]), dy = floats(f["dy"]);
  Vec y(N * OC), dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
  expect_close("y", y, f["y"]);
  expect_close("dx", dx, f["dx"]);
  expect_close("dw", dw, f["dw"]);
  expect_close("db", db, f["db"]);
}

TEST(PyTorchReference, LayerNorm) {
  const Json f = load("layernorm.json");
  const int64_t N = f["N"], C = f["C"];
  Vec x = floats(f["x"]), w = floats(f["w"]), b = floats(f["b"]), dy = floats(f["dy"]);
  Vec y(N * C), mean(N), rstd(N), dx(N * C), dw(C, 0.0f), db(C, 0.0f);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_close("y", y, f["y"]);
  expect_close("mean", mean, f["mean"]);
  expect_close("rstd", rstd, f["rstd"]);
  expect_close("dx", dx, f["dx"]);
  expect_close("dw", dw, f["dw"]);
  expect_close("db", db, f["db"]);
}

TEST(PyTorchReference, CausalAttention) {
  const Json f = load("attention.json");
  const int64_t B = f["B"], T = f["T"], C = f["C"], NH = f["NH"];
  Vec qkv = floats(f["qkv"]), dout = floats(f["dout"]);
  Vec out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_close("out", out, f["out"]);
  expect_close("att", att, f["att"]);
  expect_close("dqkv", dqkv, f["dqkv"]);
}

TEST(PyTorchReference, CrossEntropy) {
  const Json f = load("cross_entropy.json");
  const int64_t N = f["N"], C = f["C"];
  Vec logits = floats(f["logits"]);
  std::vector<int32_t> labels = f["labels"].get<std::vector<int32_t>>();
  const float dloss = f["dloss"];
  Vec probs(N * C), dlogits(N * C);
  const float loss = cross_entropy_forward(probs.data(), logits.data(), labels.data(), N, C);
  cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, C, dloss);
  const double want = f["loss"];
  EXPECT_NEAR(loss, want, 1e-5 * std::abs(want));
  expect_close("probs", probs, f["probs"]);
  expect_close("dlogits", dlogits, f["dlogits"]);
  EXPECT_EQ(count_correct(logits.data(), labels.data(), N, C), f["correct"].get<int64_t>());
}

TEST(PyTorchReference, GeluTanh) {
  const Json f = load("gelu.json");
  const int64_t n = f["n"];
  Vec x = floats(f["x"]), dy = floats(f["dy"]), y(n), dx(n);
  gelu_forward(y.data(), x.data(), n);
  gelu_backward(dx.data(), dy.data(), x.data(), n);
  expect_close("y", y, f["y"]);
  expect_close("dx", dx, f["dx"]);
}

}  // namespace
}  // namespace tessel::ops

// What one classifier request costs tessel serve apart from HTTP, stage by stage, on one thread:
// reading its KServe v2 JSON body into a tensor, the model's forward per row in a batch of B
// rows (B = 1 is the batch-size-1 server's, B = serve.max_batch the batched one's), and making
// its answer (the v2 body's JSON text from the row's outputs). The bound this puts on dynamic
// batching's gain: (parse + forward(1) + answer) / (parse + forward(B) / B + answer), before HTTP
// and the load generator, which both servers pay alike. Rounds alternate the stages (the machine is
// shared and noisy); medians over the rounds.
//
//   serve_costs CONFIG RUN_DIR BODY_JSON [--rounds R] [--batch B] [--iters N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "inputs_json.h"
#include "protocol.h"
#include "tessel/config/config.h"
#include "tessel/core/clock.h"
#include "tessel/infer/replica.h"
#include "tessel/ops/cpu.h"

using namespace tessel;
using namespace tessel::infer;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per call of f, over `iters` calls.
template <typename F>
double per_call_us(int iters, F f) {
  const double t0 = now_seconds();
  for (int i = 0; i < iters; ++i) f();
  return (now_seconds() - t0) / iters * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: serve_costs CONFIG RUN_DIR BODY_JSON [--rounds R] [--batch B] "
                 "[--iters N]\n");
    return 2;
  }
  int rounds = 5, batch = 64, iters = 2000;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::stoi(argv[i + 1]);
    if (flag == "--rounds") rounds = v;
    if (flag == "--batch") batch = v;
    if (flag == "--iters") iters = v;
  }
  ops::set_blas_threads(1);
  const train::Config config = train::load_config(argv[1], {});
  const ModelInfo info = model_info(config, argv[2]);
  Replica replica(config, info, nullptr, nullptr);
  std::ifstream in(argv[3]);
  const std::string body((std::istreambuf_iterator<char>(in)), {});
  const Tensor row = read_v2_inputs(body, info.spec.input_shape, 1);
  if (!row.defined()) {
    std::fprintf(stderr, "serve_costs: %s is not a one-row v2 FP32 body\n", argv[3]);
    return 2;
  }
  Shape shape = info.spec.input_shape;
  shape.insert(shape.begin(), batch);
  Tensor xb = Tensor::empty(shape);
  for (int r = 0; r < batch; ++r)
    std::memcpy(static_cast<char*>(xb.raw()) + r * row.nbytes(), row.raw(), row.nbytes());
  InferCall call;
  call.outputs = output_names(info);
  std::vector<double> parse, f1, fb, answer;
  for (int r = 0; r < rounds; ++r) {
    parse.push_back(per_call_us(iters, [&] { read_v2_inputs(body, info.spec.input_shape, 64); }));
    f1.push_back(per_call_us(iters, [&] { replica.forward(row, 1, 0); }));
    fb.push_back(per_call_us(std::max(1, iters / batch), [&] { replica.forward(xb, batch, 0); }) /
                 batch);
    const BatchOutput one_row{replica.forward(row, 1, 0), {}};
    answer.push_back(per_call_us(iters, [&] {
      infer_answer(config.name, call, BatchRows{&one_row, 0, 1}, config.infer.top_k,
                   info.spec.task);
    }));
  }
  const double p = median(parse), a = median(answer), one = median(f1), per = median(fb);
  std::printf("serve_costs %s: microseconds per request, medians of %d rounds\n",
              config.name.c_str(), rounds);
  std::printf(
      "  parse v2 body %8.1f\n  forward batch 1 %6.1f\n  forward batch %d %5.1f per row\n"
      "  answer %15.1f\n",
      p, one, batch, per, a);
  std::printf("  bound on the batched / batch-size-1 requests/s before HTTP: x%.2f\n",
              (p + one + a) / (p + per + a));
  return 0;
}

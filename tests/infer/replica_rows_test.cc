// A replica's output for a row does not depend on how many rows its call has or where the row
// sits among them (serve batches concurrent requests; predict deals rows to workers), at every
// ISA level of the host: 33 raw test images through the trained MLP's whole forward (the stored
// pixel map, the linear layers, ReLU), each row of calls of 2..33 rows against the row alone,
// bit for bit. Nothing here sets the BLAS thread count (see tests/ops/row_invariance_test.cc).
#include <cstring>

#include "infer_testing.h"
#include "tessel/infer/input.h"
#include "tessel/infer/replica.h"
#include "tessel/ops/isa.h"

namespace tessel::infer::testing {
namespace {

using ReplicaRows = TrainedMlp;

TEST_F(ReplicaRows, ARowsOutputDoesNotDependOnTheCallsRowCount) {
  constexpr int64_t kRows = 33;
  const train::Config config = train::load_config(TrainedMlp::config(), {"infer.batch=64"});
  const ModelInfo info = model_info(config, TrainedMlp::run_dir());
  const Rows rows = open_input(TrainedMlp::images(), info, config.data)->read(kRows);
  ASSERT_EQ(rows.count, kRows);
  Replica replica(config, info, nullptr, nullptr);
  const int64_t row_bytes = static_cast<int64_t>(rows.x.nbytes()) / kRows;
  auto forward = [&](int64_t first, int64_t n) {
    Shape s = rows.x.shape();
    s[0] = n;
    Tensor x = Tensor::empty(s, rows.x.dtype());
    std::memcpy(x.raw(), static_cast<const char*>(rows.x.raw()) + first * row_bytes, x.nbytes());
    return replica.forward(x, n, 0);
  };
  const ops::Isa saved = ops::isa();
  for (ops::Isa level : ops::supported_isas()) {
    ops::set_isa(level);
    std::vector<Tensor> alone;
    for (int64_t r = 0; r < kRows; ++r) alone.push_back(forward(r, 1));
    const int64_t C = alone[0].numel();
    for (int64_t n = 2; n <= kRows; ++n) {
      // The portable GEMM runs row by row (and its fma is a libm call): a few counts suffice.
      if (level == ops::Isa::kPortable && n != 2 && n != 7 && n != 16 && n != kRows) continue;
      const int64_t first = (n * 7) % (kRows - n + 1);
      const Tensor y = forward(first, n);
      for (int64_t r = 0; r < n; ++r)
        ASSERT_EQ(
            std::memcmp(y.data<float>() + r * C, alone[first + r].data<float>(), C * sizeof(float)),
            0)
            << ops::isa_name(level) << ": row " << r << " of " << n << " (image " << first + r
            << ") differs from the row alone";
    }
  }
  ops::set_isa(saved);
}

}  // namespace
}  // namespace tessel::infer::testing

// Pipeline layouts that cannot run fail at start with a message naming the keys (stages and
// blocks, cuts, micro-batches, virtual stages, schedule and recompute), a mismatched exchange
// names both stages, and the partitions (explicit cuts, balanced, uniform, round_robin,
// interleaved chunks) cut the model as documented.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pipeline_testing.h"
#include "tessel/comm/threads.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/train/trainer.h"

namespace tessel {
namespace {

using testing::config_for;

template <typename Fn>
void expect_invalid(Fn fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error; wanted one mentioning: " << what;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

TEST(Pipeline, BadLayoutsFailAtStart) {
  auto start = [](std::vector<std::string> keys, int workers) {
    return [keys, workers] {
      comm::run_threads(workers, [&](comm::Communicator& c) {
        train::RunOptions opts;
        opts.progress = false;
        opts.run_dir = ::testing::TempDir() + "/pp_bad";
        train::Trainer t(config_for("mlp", keys), opts, &c);
        t.run();
      });
    };
  };
  // The MLP has 7 blocks (fc, act, dropout twice, then fc).
  expect_invalid(start({"pp.stages=8"}, 8), "more than the model's 7 blocks");
  expect_invalid(start({"pp.stages=3", "pp.cuts=[4, 2]"}, 3), "strictly increasing");
  expect_invalid(start({"pp.stages=3", "pp.cuts=[2, 7]"}, 3), "must lie in [1, 6]");
  expect_invalid(start({"pp.stages=3", "pp.cuts=[2]"}, 3), "2 numbers");
  expect_invalid(start({"pp.stages=2", "pp.microbatches=5"}, 2), "does not divide the 24 rows");
  expect_invalid(start({"pp.stages=2", "pp.microbatches=5"}, 4), "does not divide the 12 rows");
  expect_invalid(start({"pp.stages=2"}, 3), "does not divide the 3 ranks");
  expect_invalid(start({"pp.stages=2", "pp.microbatches=2", "train.deterministic=true"}, 2),
                 "pp.microbatches = 1");
  expect_invalid(start({"pp.stages=2", "pp.virtual_stages=2"}, 2),
                 "pp.virtual_stages = 2 needs pp.schedule = interleaved (1f1b runs one chunk");
  expect_invalid(start({"pp.stages=2", "pp.schedule=interleaved"}, 2),
                 "needs pp.virtual_stages >= 2 chunks per stage, got 1");
  const std::vector<std::string> inter = {"pp.schedule=interleaved", "pp.virtual_stages=2"};
  auto with = [&](std::vector<std::string> keys) {
    keys.insert(keys.end(), inter.begin(), inter.end());
    return keys;
  };
  expect_invalid(start(with({"pp.stages=4"}), 4),
                 "pp.stages x pp.virtual_stages = 4 x 2 = 8 chunks is more than the model's 7 "
                 "blocks; every chunk needs at least one block, so use pp.stages <= 3 or "
                 "pp.schedule = 1f1b");
  expect_invalid(start({"pp.stages=2", "pp.schedule=interleaved", "pp.virtual_stages=4"}, 2),
                 "2 x 4 = 8 chunks is more than the model's 7 blocks; every chunk needs at least "
                 "one block, so use pp.virtual_stages <= 3");
  expect_invalid(start(with({"pp.stages=2", "pp.partition=round_robin"}), 2),
                 "use pp.partition = balanced or uniform");
  expect_invalid(start(with({"pp.stages=2", "pp.cuts=[3]"}), 2),
                 "first block of chunks 1..3 (3 numbers), got [3]; e.g. pp.cuts = [1, 3, 5] (4 "
                 "chunks of about equal block counts)");
  expect_invalid(start(with({"pp.stages=2", "pp.microbatches=3"}), 2),
                 "pp.microbatches must be at most 2 or a multiple of it, got 3; use 2 or 4");
  expect_invalid(start({"pp.stages=2", "pp.schedule=zb-h1", "train.recompute=full"}, 2),
                 "use train.recompute = selective or none, or pp.schedule = 1f1b");
  expect_invalid(start({"pp.stages=2", "pp.schedule=zb-h1", "pp.partition=round_robin"}, 2),
                 "zb-h1 runs one chunk per stage");
  expect_invalid(start({"pp.stages=2", "pp.schedule=zb-h1", "pp.virtual_stages=2"}, 2),
                 "pp.virtual_stages = 2 needs pp.schedule = interleaved (zb-h1 runs one chunk");
}

// Forward is the identity; backward returns a gradient one column short (a broken block).
class ShortGrad : public nn::Module {
 public:
  std::string kind() const override { return "short_grad"; }
  Tensor forward(const Tensor& x, const nn::Context&, nn::Cache*) override { return x; }
  Tensor backward(const Tensor& dy, nn::Cache&) override {
    return Tensor::zeros({dy.dim(0), dy.dim(1) - 1});
  }
};

TEST(Pipeline, MismatchedExchangeIsNamed) {
  try {
    comm::run_threads(2, [](comm::Communicator& c) {
      nn::Model model;
      model.add("fc", std::make_unique<nn::Linear>(4, 4));
      model.add("broken", std::make_unique<ShortGrad>());
      model.finalize();
      model.materialize(1);
      parallel::ParallelSpec spec;
      spec.pp_stages = 2;
      parallel::PipelineExecutor pipe(spec, c, model);
      nn::CrossEntropyLoss loss;
      parallel::Piece piece{Tensor::zeros({4, 4}), Tensor::zeros({4}, DType::kI32), nn::Context{},
                            1.0, true};
      pipe.train(piece, loss, [](nn::Phase, size_t, bool) {});
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0 expected the activation gradient from stage 1 "
                                         "as f32 [4, 4], got f32 [4, 3]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Pipeline, ExplicitCutsAndBalancedPartition) {
  auto model = nn::build_model([] {
    nn::ModelSpec s;
    s.kind = nn::ModelKind::kMlp;
    s.input_shape = {64};
    s.num_classes = 4;
    s.hidden = {256, 8};
    return s;
  }());
  parallel::ParallelSpec spec;
  spec.pp_cuts = {1, 3};
  auto p = parallel::make_partition(spec, *model, 3);
  EXPECT_EQ(p.begin, (std::vector<size_t>{0, 1, 3, 5}));
  spec.pp_cuts.clear();
  // fc1 (64x256) dominates: balanced gives it a stage of its own.
  p = parallel::make_partition(spec, *model, 2);
  EXPECT_EQ(p.begin, (std::vector<size_t>{0, 1, 5}));
  spec.pp_partition = parallel::PpPartition::kUniform;
  EXPECT_EQ(parallel::make_partition(spec, *model, 2).begin, (std::vector<size_t>{0, 2, 5}));
  spec.pp_partition = parallel::PpPartition::kRoundRobin;
  p = parallel::make_partition(spec, *model, 2);
  EXPECT_EQ(p.stage, (std::vector<int>{0, 1, 0, 1, 0}));
  // Interleaved: P x v chunks balanced by cost, chunk c on stage c mod P.
  spec.pp_partition = parallel::PpPartition::kBalanced;
  spec.pp_schedule = parallel::PpSchedule::kInterleaved;
  spec.pp_virtual_stages = 2;
  p = parallel::make_partition(spec, *model, 2);
  EXPECT_EQ(p.begin, (std::vector<size_t>{0, 1, 2, 3, 5}));
  EXPECT_EQ(p.stage, (std::vector<int>{0, 1, 0, 1}));
}

}  // namespace
}  // namespace tessel

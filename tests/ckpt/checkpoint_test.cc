// Saving sharded checkpoints: uneven writer layouts (one writing nothing), the checks on
// slices and on commits, crash safety, pruning to keep_last, re-saving a step, and
// write_file_atomic.
#include "tessel/ckpt/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckpt_testing.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/error.h"
#include "tessel/core/sha256.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::Contains;
using testing::deal;
using testing::expect_model;
using testing::f32;
using testing::io_error;
using testing::listing;
using testing::make_model;
using testing::Model;
using testing::read_bytes;
using testing::save;
using testing::TempDir;
using testing::write_bytes;

TEST(Checkpoint, ThreeWritersAndAnEmptyOneRoundTrip) {
  TempDir run;
  const Model m = make_model(3.0f);
  auto writers = deal(m, 5, 3);
  writers.emplace_back();  // a fourth writer that owns nothing
  const std::string dir = begin_checkpoint(run.path().string(), 100);
  EXPECT_EQ(dir, str(run / "checkpoints/step-000100.tmp-", ::getpid()));
  Manifest manifest = m.manifest;
  for (size_t r = 0; r < writers.size(); ++r)
    manifest.shards.push_back(write_shard(dir, static_cast<int>(r), writers[r]));
  EXPECT_EQ(manifest.shards[3].file, "");  // wrote nothing
  const std::string step_dir =
      commit_checkpoint(run.path().string(), dir, 100, manifest, m.trainer_json);
  EXPECT_EQ(step_dir, run / "checkpoints/step-000100");
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000100\n");
  EXPECT_EQ(listing(step_dir),
            (std::vector<std::string>{"manifest.json", "shard-00000.safetensors",
                                      "shard-00001.safetensors", "shard-00002.safetensors",
                                      "trainer.json"}));
  EXPECT_EQ(read_bytes(step_dir + "/trainer.json"), m.trainer_json);  // stored as given

  for (const std::string& p : {run.path().string(), run / "checkpoints", step_dir}) {
    EXPECT_EQ(resolve_checkpoint_dir(p), step_dir) << p;
    const CheckpointReader r(p);
    EXPECT_EQ(r.dir(), step_dir);
    expect_model(r, m);
    ASSERT_EQ(r.manifest().shards.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const ShardFile& s = r.manifest().shards[i];
      EXPECT_EQ(s.file, manifest.shards[i].file);
      EXPECT_EQ(s.bytes, manifest.shards[i].bytes);
      const std::string bytes = read_bytes(step_dir + "/" + s.file);
      EXPECT_EQ(s.bytes, static_cast<int64_t>(bytes.size()));
      EXPECT_EQ(s.sha256, sha256_hex(bytes.data(), bytes.size()));
    }
  }
  // A shard is a plain safetensors file: "<name>@<begin>" keys, described in __metadata__.
  const TensorFile shard = read_safetensors(step_dir + "/shard-00001.safetensors");
  const ShardSlice& first = writers[1][0];
  ASSERT_NE(shard.find(str(first.name, "@", first.begin)), nullptr);
  EXPECT_EQ(shard.metadata.at(str(first.name, "@", first.begin)),
            str("{\"name\":\"", first.name, "\",\"begin\":", first.begin, "}"));
}

TEST(Checkpoint, BadSlicesAreRejected) {
  TempDir run;
  const std::string dir = begin_checkpoint(run.path().string(), 1);
  const float v[8] = {};
  auto bad = [&](std::vector<ShardSlice> slices, int rank = 0) {
    EXPECT_THROW(write_shard(dir, rank, slices), InvalidArgument);
  };
  bad({{"w", 0, f32(v, 4)}, {"w", 3, f32(v, 2)}});  // overlap
  bad({{"w", 0, Tensor::empty({2, 2})}});
  bad({{"w", 0, Tensor::empty({2}, DType::kI32)}});
  bad({{"w", 0, Tensor()}});
  bad({{"w", -1, f32(v, 1)}});
  bad({{"", 0, f32(v, 1)}});
  bad({{"w", 0, f32(v, 1)}}, -1);
  try {
    write_shard(dir, 0, {{"w", 2, f32(v, 4)}, {"w", 0, f32(v, 3)}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "slices of 'w' overlap in writer 0, got [0, 3) and [2, 6)"));
  }
  EXPECT_TRUE(listing(dir).empty());  // no half-written shard left
  // Empty slices are no data, and slices of one tensor may touch.
  write_shard(dir, 0,
              {{"w", 4, f32(v, 0)}, {"w", 4, f32(v, 0)}, {"w", 0, f32(v, 4)}, {"w", 4, f32(v, 4)}});

  // Overlaps across writers and slices beyond the shape only show when reading.
  const Model m = make_model(1.0f);
  auto writers = deal(m, 5, 2);
  writers[1].push_back(writers[0][0]);
  save(run.path().string(), 2, m, writers);
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }), "twice"));
  writers = deal(m, 5, 2);
  writers[1].push_back({"fc1.bias", 4, f32(v, 1)});
  save(run.path().string(), 3, m, writers);
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }),
                       "holds elements of 'fc1.bias' up to 5, beyond the 4"));
}

TEST(Checkpoint, CommitChecksItsInputsAndCleansUp) {
  TempDir run;
  const std::string root = run / "checkpoints";
  const Model m = make_model(1.0f);
  save(run.path().string(), 5, m);
  // Not the folder begin_checkpoint made for this step.
  std::string dir = begin_checkpoint(run.path().string(), 6);
  EXPECT_THROW(commit_checkpoint(run.path().string(), dir, 7, m.manifest, ""), InvalidArgument);
  EXPECT_THROW(commit_checkpoint(run.path().string(), root, 6, m.manifest, ""), InvalidArgument);
  EXPECT_TRUE(fs::exists(dir));  // a folder named wrongly is not removed
  // A writer whose shard is not where the committing rank looks.
  Manifest manifest = m.manifest;
  manifest.shards.push_back(write_shard(dir, 0, deal(m, 5, 1)[0]));
  TempDir elsewhere;
  manifest.shards.push_back(write_shard(elsewhere.path().string(), 1, deal(m, 5, 1)[0]));
  EXPECT_TRUE(
      Contains(io_error([&] { commit_checkpoint(run.path().string(), dir, 6, manifest, "{}"); }),
               "shard-00001.safetensors is missing, expected "));
  EXPECT_FALSE(fs::exists(dir));  // the failed save's folder is gone
  EXPECT_EQ(read_bytes(root + "/latest"), "step-000005\n");
  expect_model(CheckpointReader(run.path().string()), m);

  dir = begin_checkpoint(run.path().string(), 6);
  manifest = m.manifest;
  manifest.parameters.push_back(manifest.parameters[0]);  // a repeated name
  EXPECT_THROW(commit_checkpoint(run.path().string(), dir, 6, manifest, ""), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir));
  // No model_io, or one inference could not use.
  for (const std::optional<ModelIo>& io :
       {std::optional<ModelIo>(), std::optional<ModelIo>(ModelIo{{}, DType::kF32, 2}),
        std::optional<ModelIo>(ModelIo{{3}, DType::kU8, 2}),
        std::optional<ModelIo>(ModelIo{{3}, DType::kF32, 0})}) {
    dir = begin_checkpoint(run.path().string(), 6);
    manifest = m.manifest;
    manifest.io = io;
    EXPECT_THROW(commit_checkpoint(run.path().string(), dir, 6, manifest, ""), InvalidArgument);
    EXPECT_FALSE(fs::exists(dir));
  }
  EXPECT_EQ(listing(root), (std::vector<std::string>{"latest", "step-000005"}));
}

TEST(Checkpoint, CrashLeavesThePreviousCheckpoint) {
  TempDir run;
  const std::string root = run / "checkpoints";
  save(run.path().string(), 5, make_model(5.0f));
  // A crash mid-save of step 6: this process's shards are written, the commit never comes; and
  // the half-written folder of a writer that is gone.
  const std::string own = begin_checkpoint(run.path().string(), 6);
  write_shard(own, 0, deal(make_model(6.0f), 5, 1)[0]);
  fs::create_directories(fs::path(root) / "step-000006.tmp-4194305");
  write_bytes(root + "/step-000006.tmp-4194305/manifest.json", "garbage");
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));
  fs::remove(fs::path(root) / "latest");  // even the fallback scan skips temporary folders
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));

  save(run.path().string(), 6, make_model(6.0f));  // replaces its own leftover
  expect_model(CheckpointReader(run.path().string()), make_model(6.0f));
  EXPECT_EQ(read_bytes(root + "/latest"), "step-000006\n");
  // pid 4194305 is above Linux's pid limit, so its leftover is known stale and removed.
  EXPECT_EQ(listing(root), (std::vector<std::string>{"latest", "step-000005", "step-000006"}));
}

TEST(Checkpoint, KeepLastPrunesOlderSteps) {
  TempDir run;
  for (int step = 1; step <= 5; ++step)
    save(run.path().string(), step * 10, make_model(float(step)), 2);
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000040", "step-000050"}));
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));
  expect_model(CheckpointReader(run / "checkpoints/step-000040"), make_model(4.0f));

  TempDir all;
  for (int step = 1; step <= 3; ++step) save(all.path().string(), step, make_model(float(step)), 0);
  EXPECT_EQ(listing(all.path() / "checkpoints").size(), 4u);  // 0 keeps everything
}

TEST(Checkpoint, OlderStepSavedLastIsKeptAndLatest) {
  // A run resumed from an early checkpoint writes lower step numbers than folders already
  // there; what it just wrote must survive pruning and become `latest`.
  TempDir run;
  save(run.path().string(), 200, make_model(2.0f), 2);
  save(run.path().string(), 300, make_model(3.0f), 2);
  save(run.path().string(), 50, make_model(0.5f), 2);
  EXPECT_TRUE(fs::exists(run.path() / "checkpoints/step-000050"));
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000050\n");
  expect_model(CheckpointReader(run.path().string()), make_model(0.5f));
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  TempDir run;
  save(run.path().string(), 7, make_model(1.0f), deal(make_model(1.0f), 5, 3));
  save(run.path().string(), 7, make_model(9.0f), deal(make_model(9.0f), 4, 2));
  expect_model(CheckpointReader(run.path().string()), make_model(9.0f));
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000007"}));
  EXPECT_EQ(listing(run.path() / "checkpoints/step-000007").size(), 4u);  // no third shard
}

TEST(Checkpoint, WriteFileAtomicReplacesWholeFile) {
  TempDir dir;
  write_file_atomic(dir / "f.txt", "first version, long");
  write_file_atomic(dir / "f.txt", "second");
  EXPECT_EQ(read_bytes(dir / "f.txt"), "second");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"f.txt"});  // no temporary left
  EXPECT_THROW(write_file_atomic(dir / "missing/f.txt", "x"), IoError);
  EXPECT_THROW(fsync_dir(dir / "missing"), IoError);
  EXPECT_THROW(begin_checkpoint(dir.path().string(), -1), InvalidArgument);
}

}  // namespace
}  // namespace tessel::ckpt

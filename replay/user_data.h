// A researcher's own data for replay runs (docs/replay.md, "Your own data"):
//   csv:PATH   one example per line: numeric feature columns and one label column; read
//              as a stream (line by line, hashed as it goes): memory holds the parsed
//              float32 values, not the text
//   npz:PATH   a NumPy archive (np.savez or np.savez_compressed) with arrays x [n, ...]
//              and y [n] (integer classes), and optionally x_test, y_test
//   libsvm:PATH  "label index:value ..." per line (libsvm / svmlight): sparse features, for
//              a model that reads Example::sparse_keys (replay's sparse-lr); streamed
// Errors name the file and the line, row or array. Thread-safe (no shared state).
#ifndef ONLINEPS_REPLAY_USER_DATA_H_
#define ONLINEPS_REPLAY_USER_DATA_H_

#include <string>

#include "common/status.h"
#include "replay/dataset.h"

namespace onlineps::replay {

// True for a dataset name this file loads ("csv:...", "npz:...", "libsvm:...").
bool IsUserDataset(const std::string& name);

// Loads `name` ("csv:PATH", "npz:PATH" or "libsvm:PATH") with `options` (label_column, header,
// test_file, normalize, and the seeded split when there is no test_file). Labels: a column of
// integers >= 0 gives the labels "0".."max"; any other column gives its distinct strings, sorted.
// Errors: kInvalidArgument (bad option, unknown label column), kNotFound (no file),
// kDataLoss naming PATH:LINE (ragged row, a cell that is not a number, NaN/Inf, a
// missing value, a label out of range or absent from the training file, an empty file).
StatusOr<Dataset> LoadUserDataset(const std::string& name, const DatasetOptions& options);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_USER_DATA_H_

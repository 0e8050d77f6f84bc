// CheckModelArchive: a TorchScript file (a zip archive, as torch.jit.save writes it) is
// whole: every entry's bytes match the CRC-32 its central directory records. libtorch
// reads the archive without checking them, so a file damaged in storage or transfer
// would load, and the worker would serve (and seed the shards with) wrong weights.
// Torch-free; reads the file once, in blocks.
#ifndef ONLINEPS_WORKER_MODEL_FILE_CHECK_H_
#define ONLINEPS_WORKER_MODEL_FILE_CHECK_H_

#include <string>

#include "common/status.h"

namespace onlineps::worker {

// Ok when every entry of the zip archive at `path` is intact (stored or deflated, zip64
// included). Otherwise kInvalidArgument naming the file, the entry and what is wrong
// (not a zip archive, truncated, an entry's CRC-32 or size not as recorded).
Status CheckModelArchive(const std::string& path);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_MODEL_FILE_CHECK_H_

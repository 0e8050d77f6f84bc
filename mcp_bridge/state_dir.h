// StateDir: the bridge's durable state (--state-dir), so that MCP sessions and their
// contexts survive a bridge restart. One JSON file per record under DIR/<kind>/, named by
// the record's hash: the SHA-256 of its key (HashOf), which the file does not hold. The
// directory thus reveals no session id: a restarted bridge knows its records by hash
// only, and finds one when a request brings its key. DIR and the kind folders are 0700,
// files 0600. Each write goes to a temporary file renamed into place, so a crash at any
// point leaves either the old record or the new one, never a torn one. A file's
// modification time is the record's last use (Touch moves it without rewriting). With
// fsync each write is flushed (and its directory) before Put returns: it survives a host
// crash too, not only a process crash. Thread-safe: records of different keys never
// share a file.
#ifndef ONLINEPS_MCP_BRIDGE_STATE_DIR_H_
#define ONLINEPS_MCP_BRIDGE_STATE_DIR_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/status.h"

namespace onlineps::bridge {

struct StateDirOptions {
  std::string path;
  bool fsync = false;
};

class StateDir {
 public:
  // Creates DIR and its kind folders 0700 when missing. An existing DIR that others can
  // reach is set to 0700 with a warning when this user owns it, and left as it is with a
  // warning when not (a volume's root, shared through its group): the kind folders are
  // the boundary. Fails naming the path when DIR is not a directory or is writable by
  // everyone (without the sticky bit) and not ours, when a kind folder is not a directory
  // of this user (tightened to 0700 when it is), or when one is not writable. Removes
  // temporary files a crash left behind.
  static StatusOr<std::unique_ptr<StateDir>> Open(StateDirOptions options,
                                                  const std::vector<std::string>& kinds);

  // A record's name in the directory: the SHA-256 of `key`, 64 hex digits.
  static std::string HashOf(const std::string& key);

  struct Record {
    std::string hash;  // HashOf(key): all the directory knows of the key
    nlohmann::json value;
    int64_t age_ms = 0;  // since the record was last written or touched
  };
  // Every readable record of a kind, the most recently used first (so that a caller
  // keeping only as many as its limit keeps those). A file it cannot read is skipped
  // with a warning: set aside as *.bad when named by a hash, removed otherwise (its
  // name may hold a key). Files of the format before hashing (named by the key's hex,
  // holding it as "key") are converted, keeping their time of last use.
  std::vector<Record> Load(const std::string& kind);
  // Replaces the record `hash` of `kind` with `value`, an object that must hold nothing
  // from which the key can be recovered. kInvalidArgument when `hash` is not one, or when
  // the record is larger than Load reads (1 MiB): refused rather than lost at a restart.
  Status Put(const std::string& kind, const std::string& hash, const nlohmann::json& value);
  // Marks the record used now; false when there is none.
  bool Touch(const std::string& kind, const std::string& hash);
  void Remove(const std::string& kind, const std::string& hash);

  const std::string& path() const { return options_.path; }
  // The file a record lives in (tests).
  std::string FileOf(const std::string& kind, const std::string& hash) const;

 private:
  StateDir(StateDirOptions options, FileLock lock)
      : options_(std::move(options)), lock_(std::move(lock)) {}
  // Rewrites a record of the old format under its hash; returns the hash, or "" when it
  // could not (then the file is removed or, when the write failed, left for next time).
  std::string Convert(const std::string& kind, const std::string& file, nlohmann::json* value);

  const StateDirOptions options_;
  FileLock lock_;  // DIR/lock: one bridge per directory
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_STATE_DIR_H_

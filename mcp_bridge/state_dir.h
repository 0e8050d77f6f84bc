// StateDir: the bridge's durable state (--state-dir), so that MCP sessions and their
// contexts survive a bridge restart. One JSON file per record under DIR/<kind>/, written
// to a temporary file and renamed into place, so a crash at any point leaves either the
// old record or the new one, never a torn one. A file's modification time is the
// record's last use (Touch moves it without rewriting). With fsync each write is flushed
// (and its directory) before Put returns: it survives a host crash too, not only a
// process crash. Loading skips, and renames to *.bad, a file it cannot read, with a
// warning naming it. Thread-safe: records of different keys never share a file.
#ifndef ONLINEPS_MCP_BRIDGE_STATE_DIR_H_
#define ONLINEPS_MCP_BRIDGE_STATE_DIR_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps::bridge {

struct StateDirOptions {
  std::string path;
  bool fsync = false;
};

class StateDir {
 public:
  // Creates DIR and its kind folders when missing; fails naming DIR when it cannot, or
  // when it is not writable. Removes temporary files a crash left behind.
  static StatusOr<std::unique_ptr<StateDir>> Open(StateDirOptions options,
                                                  const std::vector<std::string>& kinds);

  struct Record {
    std::string key;
    nlohmann::json value;
    int64_t age_ms = 0;  // since the record was last written or touched
  };
  // Every readable record of a kind, the most recently used first (so that a caller
  // keeping only as many as its limit keeps those).
  std::vector<Record> Load(const std::string& kind);
  // Replaces the record `key` of `kind` with `value` (an object; its "key" member is
  // set to `key`).
  Status Put(const std::string& kind, const std::string& key, nlohmann::json value);
  // Marks the record used now; false when there is none.
  bool Touch(const std::string& kind, const std::string& key);
  void Remove(const std::string& kind, const std::string& key);

  const std::string& path() const { return options_.path; }
  // The file a record lives in (tests).
  std::string FileOf(const std::string& kind, const std::string& key) const;

 private:
  explicit StateDir(StateDirOptions options) : options_(std::move(options)) {}

  const StateDirOptions options_;
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_STATE_DIR_H_

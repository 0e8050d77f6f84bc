#include "ps/replica_sidecar.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_io.h"

namespace onlineps::ps {

StatusOr<ReplicaSidecar> ReadReplicaSidecar(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("no replica sidecar " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  ReplicaSidecar s;
  try {
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    s.incarnation = std::stoull(j.at("incarnation").get<std::string>(), nullptr, 16);
    s.log_epoch = j.at("log_epoch").get<uint64_t>();
    s.lsn = j.at("lsn").get<uint64_t>();
    s.clean = j.at("clean").get<bool>();
    s.checkpoint_bytes = j.at("checkpoint_bytes").get<uint64_t>();
    s.checkpoint_checksum = j.value("checkpoint_checksum", uint64_t{0});
    s.epoch = j.value("epoch", uint64_t{0});
  } catch (const std::exception& e) {
    return DataLoss(path + ": not a replica sidecar: " + e.what());
  }
  return s;
}

uint64_t CheckpointTrailer(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return 0;
  const std::streamoff size = in.tellg();
  if (size < 8) return 0;
  in.seekg(size - 8);
  unsigned char b[8];
  if (!in.read(reinterpret_cast<char*>(b), 8)) return 0;
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];  // little-endian, as written
  return v;
}

Status WriteReplicaSidecar(const std::string& path, const ReplicaSidecar& s) {
  char inc[17];
  std::snprintf(inc, sizeof inc, "%016llx", static_cast<unsigned long long>(s.incarnation));
  nlohmann::json j = {{"incarnation", inc},
                      {"log_epoch", s.log_epoch},
                      {"lsn", s.lsn},
                      {"clean", s.clean},
                      {"checkpoint_bytes", s.checkpoint_bytes},
                      {"checkpoint_checksum", s.checkpoint_checksum},
                      {"epoch", s.epoch}};
  return WriteFileAtomic(path, j.dump() + "\n", /*sync=*/true, 0640);
}

}  // namespace onlineps::ps

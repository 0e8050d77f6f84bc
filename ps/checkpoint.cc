#include "ps/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/bytes.h"
#include "common/file_io.h"
#include "common/hash.h"

namespace onlineps::ps {

namespace {

constexpr char kMagic[8] = {'O', 'N', 'L', 'P', 'S', 'C', 'K', '1'};
// Format 1 ended in LegacyChecksum64; format 2 ends in a CRC-32. Both are read.
constexpr uint32_t kLegacyFormat = 1;
constexpr uint32_t kFormat = 2;
// A delta (incremental checkpoint): format 2's checksum, a chain position in the header.
constexpr uint32_t kDeltaFormat = 3;
constexpr size_t kFormatOffset = sizeof(kMagic);

// Reads a table (spec, then body) into `out`. `delta`: the body is a delta, applied to
// the table of that name in `out` (whose spec must be the same), or to a new one.
Status ReadTable(ByteReader* r, const ShardIdentity& id, const std::string& path,
                 std::map<std::string, std::shared_ptr<Table>>* out, bool delta = false) {
  uint64_t fields = 0;
  ONLINEPS_RETURN_IF_ERROR(r->Get(&fields, "table spec size"));
  std::map<std::string, std::string> spec_map;
  for (uint64_t i = 0; i < fields; ++i) {
    std::string k, v;
    ONLINEPS_RETURN_IF_ERROR(r->GetString(&k, "table spec key"));
    ONLINEPS_RETURN_IF_ERROR(r->GetString(&v, "table spec value"));
    spec_map[k] = v;
  }
  auto spec = DecodeSpec(spec_map);
  if (!spec.ok()) return DataLoss(path + ": bad table spec: " + spec.status().message());
  if (auto it = out->find(spec->name); delta && it != out->end()) {
    if (EncodeSpec(it->second->spec()) != spec_map) {
      return DataLoss(path + ": table '" + spec->name +
                      "' has another spec than in the checkpoint before it");
    }
    Status st = it->second->LoadDelta(r);
    return st.ok() ? st : st.WithContext(path + ": table '" + spec->name + "'");
  }
  if (!delta && out->count(spec->name) > 0) {
    return DataLoss(path + ": table '" + spec->name + "' appears twice");
  }
  auto table = Table::Create(*spec, id.shard, id.num_shards);
  if (!table.ok()) return DataLoss(path + ": " + table.status().message());
  Status st = delta ? (*table)->LoadDelta(r) : (*table)->Load(r);
  if (!st.ok()) return st.WithContext(path + ": table '" + spec->name + "'");
  (*out)[spec->name] = std::shared_ptr<Table>(std::move(table).value());
  return Status::Ok();
}

// The format field picks the checksum; it is read before the checksum is checked, so
// an unknown value may be a newer file or a corrupt one.
// The CRC-32 of a file's first n bytes: computed over memory, or read from the file.
using Crc32Of = std::function<StatusOr<uint32_t>(size_t n)>;

Status VerifyTrailer(std::string_view bytes, const std::string& path, const Crc32Of& crc32_of) {
  uint32_t format = 0;
  std::memcpy(&format, bytes.data() + kFormatOffset, sizeof(format));
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  const size_t n = bytes.size() - 8;
  uint64_t computed;
  if (format == kFormat || format == kDeltaFormat) {
    ONLINEPS_ASSIGN_OR_RETURN(computed, crc32_of(n));
  } else if (format == kLegacyFormat) {
    computed = LegacyChecksum64(bytes.data(), n);
  } else {
    return DataLoss(path + ": unknown format " + std::to_string(format) +
                    " (from a newer onlineps, or corrupt: no checksum of that format to check)");
  }
  if (computed != stored) {
    return DataLoss(path + ": checksum mismatch; the file is corrupt or truncated");
  }
  return Status::Ok();
}

using Tables = std::map<std::string, std::shared_ptr<Table>>;

// Where a delta must sit in its chain. `stale` is set, and nothing read, when the file
// is another delta (of an older chain: its seq or the file it names differ).
struct ChainPos {
  uint64_t seq = 0, prev_trailer = 0;
  bool stale = false;
};

// Parses a checkpoint into `tables` (a full one: into an empty map; a delta, `delta`
// set: on top of the tables of the files before it), with the CRC computed by crc32_of
// and, if set, `release` called every 8 MiB with the first byte not yet read. `dedup`
// gets the file's windows only when everything parsed.
Status ParseChecked(std::string_view bytes, const std::string& path, const ShardIdentity& id,
                    Dedup* dedup, const Crc32Of& crc32_of, std::function<void(const char*)> release,
                    Tables* tables, ChainPos* delta = nullptr);

}  // namespace

uint32_t Crc32(const void* data, size_t size) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, Z_NULL, 0), static_cast<const Bytef*>(data), static_cast<z_size_t>(size)));
}

uint64_t LegacyChecksum64(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Four interleaved FNV-1a lanes: ~4x faster than one on large files.
  uint64_t h[4] = {kFnv64Offset, 0x84222325cbf29ce4ULL, kFnv64Prime, 0x1b3ULL};
  size_t i = 0;
  for (; i + 4 <= size; i += 4) {
    for (int l = 0; l < 4; ++l) h[l] = Fnv1a64Step(h[l], p[i + l]);
  }
  for (; i < size; ++i) h[0] = Fnv1a64Step(h[0], p[i]);
  return Mix64(h[0] ^ Mix64(h[1] ^ Mix64(h[2] ^ Mix64(h[3] ^ size))));
}

namespace {

void PutSpec(ByteWriter* w, const std::map<std::string, std::string>& spec) {
  w->Put<uint64_t>(spec.size());
  for (const auto& [k, v] : spec) {
    w->PutString(k);
    w->PutString(v);
  }
}

// Everything but the trailing checksum.
void WriteSnapshotBody(ByteWriter* w, ShardSnapshot* snap) {
  const bool delta = snap->kind == SnapshotKind::kDelta;
  w->Append(kMagic, sizeof(kMagic));
  w->Put<uint32_t>(delta ? kDeltaFormat : kFormat);
  w->Put<uint32_t>(snap->id.shard);
  w->Put<uint32_t>(snap->id.num_shards);
  if (delta) {
    w->Put<uint64_t>(snap->seq);
    w->Put<uint64_t>(snap->prev_trailer);
  }
  w->Put<uint64_t>(snap->tables.size());
  for (ShardSnapshot::Entry& e : snap->tables) {
    PutSpec(w, e.spec);
    e.table->Write(w);
  }
  w->Append(snap->dedup.data(), snap->dedup.size());
}

// A file mapped read-only; unmapped on destruction.
class MappedFile {
 public:
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      return errno == ENOENT ? NotFound("no checkpoint at " + path)
                             : Unavailable("cannot open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return Unavailable("cannot stat " + path);
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return Status::Ok();
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) return Unavailable("cannot map " + path + ": " + std::strerror(errno));
    data_ = static_cast<char*>(p);
    return Status::Ok();
  }
  // The CRC-32 of the first n bytes, read with pread: the pages pass through the page
  // cache without becoming part of this process's resident set.
  StatusOr<uint32_t> Crc32Of(size_t n) const {
    std::vector<char> buf(4 << 20);
    uLong crc = crc32_z(0, Z_NULL, 0);
    for (size_t off = 0; off < n;) {
      const ssize_t got = ::pread(fd_, buf.data(), std::min(buf.size(), n - off), off);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Unavailable(std::string("cannot read: ") + std::strerror(errno));
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<z_size_t>(got));
      off += static_cast<size_t>(got);
    }
    return static_cast<uint32_t>(crc);
  }
  // Drops the mapped pages before p from the resident set (they stay in the page cache).
  void Release(const char* p) const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t len = static_cast<size_t>(p - data_) / page * page;
    if (len > 0) ::madvise(data_, len, MADV_DONTNEED);
  }
  std::string_view bytes() const { return {data_, size_}; }

 private:
  int fd_ = -1;
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

ShardSnapshot SnapshotShard(const ShardIdentity& id,
                            const std::map<std::string, std::shared_ptr<Table>>& tables,
                            const Dedup& dedup, SnapshotKind kind) {
  ShardSnapshot snap;
  snap.id = id;
  snap.kind = kind;
  for (const auto& [name, table] : tables) {
    snap.tables.push_back({EncodeSpec(table->spec()), table, table->BeginSnapshot(kind)});
  }
  ByteWriter w;
  dedup.Save(&w);
  snap.dedup = std::move(w.buffer());
  return snap;
}

std::string SerializeShard(const ShardIdentity& id,
                           const std::map<std::string, std::shared_ptr<Table>>& tables,
                           const Dedup& dedup) {
  ByteWriter w;
  w.Append(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kFormat);
  w.Put<uint32_t>(id.shard);
  w.Put<uint32_t>(id.num_shards);
  w.Put<uint64_t>(tables.size());
  for (const auto& [name, table] : tables) {
    PutSpec(&w, EncodeSpec(table->spec()));
    table->Save(&w);
  }
  dedup.Save(&w);
  w.Put<uint64_t>(Crc32(w.buffer().data(), w.buffer().size()));
  return w.buffer();
}

std::string SerializeSnapshot(ShardSnapshot* snap) {
  ByteWriter w;
  WriteSnapshotBody(&w, snap);
  w.Put<uint64_t>(Crc32(w.buffer().data(), w.buffer().size()));
  return std::move(w.buffer());
}

StatusOr<uint64_t> WriteSnapshot(const std::string& path, ShardSnapshot* snap,
                                 uint64_t* trailer_out) {
  // Streamed through a 1 MiB buffer: the file is never held in memory.
  // 0640: the model's parameters are not for every user of the host.
  AtomicFileWriter file(path, 0640);
  uLong crc = crc32_z(0, Z_NULL, 0);
  auto spill = [&](std::string* b) {
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(b->data()), b->size());
    (void)file.Write(*b);  // the first error sticks; Commit returns it
    b->clear();
  };
  ByteWriter w(spill, 1 << 20);
  WriteSnapshotBody(&w, snap);
  spill(&w.buffer());
  const uint64_t trailer = crc;
  ONLINEPS_RETURN_IF_ERROR(file.Write({reinterpret_cast<const char*>(&trailer), sizeof trailer}));
  ONLINEPS_RETURN_IF_ERROR(file.Commit(/*sync=*/true));
  if (trailer_out != nullptr) *trailer_out = trailer;
  return file.bytes_written();
}

StatusOr<uint64_t> WriteCheckpoint(const std::string& path, const ShardIdentity& id,
                                   const std::map<std::string, std::shared_ptr<Table>>& tables,
                                   const Dedup& dedup) {
  ShardSnapshot snap = SnapshotShard(id, tables, dedup);
  return WriteSnapshot(path, &snap);
}

namespace {

// The file at `path` parsed into `tables` (ParseChecked), mapped, checked with pread,
// then parsed with the pages already read dropped every 8 MiB: a restore holds the tables
// and a small window of the file, not both whole. `bytes` and `trailer` (optional) get
// the file's size and trailing checksum. kNotFound when there is no file.
Status ParseFile(const std::string& path, const ShardIdentity& id, Dedup* dedup, Tables* tables,
                 ChainPos* delta = nullptr, uint64_t* bytes = nullptr,
                 uint64_t* trailer = nullptr) {
  MappedFile file;
  ONLINEPS_RETURN_IF_ERROR(file.Open(path));
  ONLINEPS_RETURN_IF_ERROR(ParseChecked(
      file.bytes(), path, id, dedup, [&file](size_t n) { return file.Crc32Of(n); },
      [&file](const char* p) { file.Release(p); }, tables, delta));
  if (bytes != nullptr) *bytes = file.bytes().size();
  if (trailer != nullptr) std::memcpy(trailer, file.bytes().data() + file.bytes().size() - 8, 8);
  return Status::Ok();
}

}  // namespace

StatusOr<std::map<std::string, std::shared_ptr<Table>>> ReadCheckpoint(const std::string& path,
                                                                       const ShardIdentity& id,
                                                                       Dedup* dedup) {
  Tables tables;
  ONLINEPS_RETURN_IF_ERROR(ParseFile(path, id, dedup, &tables));
  return tables;
}

std::string DeltaPath(const std::string& path, uint64_t seq) {
  return path + ".d" + std::to_string(seq);
}

std::vector<DeltaFile> DeltaFiles(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".d";
  std::vector<DeltaFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(p.has_parent_path() ? p.parent_path() : fs::path("."), ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string digits = name.substr(std::min(name.size(), prefix.size()));
    if (name.compare(0, prefix.size(), prefix) != 0 || digits.empty() ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    out.push_back({digits.size() > 18 ? UINT64_MAX : std::stoull(digits), it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const DeltaFile& a, const DeltaFile& b) { return a.seq < b.seq; });
  return out;
}

std::vector<std::string> LeftoverTempFiles(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string name = p.filename().string();
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(p.has_parent_path() ? p.parent_path() : fs::path("."), ec), end;
       !ec && it != end; it.increment(ec)) {
    const std::string f = it->path().filename().string();
    if (f.size() < name.size() + 4 || f.compare(0, name.size(), name) != 0 ||
        f.compare(f.size() - 4, 4, ".tmp") != 0) {
      continue;
    }
    // Between the name and ".tmp": nothing (the full file) or ".d" and digits (a delta).
    const std::string mid = f.substr(name.size(), f.size() - 4 - name.size());
    const bool delta =
        mid.size() > 2 && mid.compare(0, 2, ".d") == 0 &&
        std::all_of(mid.begin() + 2, mid.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (mid.empty() || delta) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

StatusOr<RestoredShard> RestoreCheckpoint(const std::string& path, const ShardIdentity& id,
                                          Dedup* dedup) {
  RestoredShard out;
  Dedup windows;
  ONLINEPS_RETURN_IF_ERROR(
      ParseFile(path, id, &windows, &out.tables, nullptr, &out.base_bytes, &out.tip_trailer));
  out.tip = path;
  for (uint64_t seq = 1;; ++seq) {
    const std::string delta_path = DeltaPath(path, seq);
    ChainPos pos{seq, out.tip_trailer};
    uint64_t bytes = 0, trailer = 0;
    Status st = ParseFile(delta_path, id, &windows, &out.tables, &pos, &bytes, &trailer);
    if (st.code() == StatusCode::kNotFound) break;
    ONLINEPS_RETURN_IF_ERROR(st);
    if (pos.stale) break;
    out.tip = delta_path;
    out.tip_trailer = trailer;
    out.delta_bytes += bytes;
    out.deltas = seq;
  }
  // Whatever is left does not continue the chain: an older chain's, whose full
  // checkpoint was replaced before they were removed (they go last first, so what a
  // crash leaves is PATH.d1 ... PATH.dK, and PATH.d1 names the old file). A delta past a
  // missing one is damage from outside: refused, not dropped.
  const uint64_t next = out.deltas + 1;
  bool next_exists = false;
  std::vector<std::string> later;
  for (const DeltaFile& f : DeltaFiles(path)) {
    if (f.seq == next) next_exists = true;
    if (f.seq > out.deltas) (f.seq == next ? out.stale : later).push_back(f.path);
  }
  if (!later.empty() && !next_exists) {
    return DataLoss(later.front() + " follows a missing delta (" + DeltaPath(path, next) +
                    "): the updates between cannot be restored. Remove the deltas after " +
                    (out.deltas == 0 ? path : DeltaPath(path, out.deltas)) +
                    " to restore up to it, losing theirs");
  }
  out.stale.insert(out.stale.end(), later.begin(), later.end());
  // Last first, as a new full checkpoint removes them: a crash while they are removed
  // leaves PATH.d<next> ... again, not a gap.
  std::reverse(out.stale.begin(), out.stale.end());
  ByteWriter tmp;
  windows.Save(&tmp);
  ByteReader again(tmp.buffer().data(), tmp.buffer().size());
  ONLINEPS_RETURN_IF_ERROR(dedup->Load(&again));
  return out;
}

StatusOr<std::map<std::string, std::shared_ptr<Table>>> ParseShard(std::string_view bytes,
                                                                   const std::string& path,
                                                                   const ShardIdentity& id,
                                                                   Dedup* dedup) {
  Tables tables;
  ONLINEPS_RETURN_IF_ERROR(ParseChecked(
      bytes, path, id, dedup,
      [bytes](size_t n) -> StatusOr<uint32_t> { return Crc32(bytes.data(), n); }, nullptr,
      &tables));
  return tables;
}

namespace {

Status ParseBody(std::string_view bytes, const std::string& path, const ShardIdentity& id,
                 Dedup* dedup, const Crc32Of& crc32_of, std::function<void(const char*)> release,
                 Tables* tables, ChainPos* delta);

Status ParseChecked(std::string_view bytes, const std::string& path, const ShardIdentity& id,
                    Dedup* dedup, const Crc32Of& crc32_of, std::function<void(const char*)> release,
                    Tables* tables, ChainPos* delta) {
  Status st = ParseBody(bytes, path, id, dedup, crc32_of, std::move(release), tables, delta);
  // Every refusal names the file (the byte reader's own messages do not).
  if (!st.ok() && st.message().find(path) == std::string::npos) return st.WithContext(path);
  return st;
}

Status ParseBody(std::string_view bytes, const std::string& path, const ShardIdentity& id,
                 Dedup* dedup, const Crc32Of& crc32_of, std::function<void(const char*)> release,
                 Tables* tables, ChainPos* delta) {
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic))) {
    return DataLoss(path + " is not an onlineps checkpoint (bad magic or too short)");
  }
  ONLINEPS_RETURN_IF_ERROR(VerifyTrailer(bytes, path, crc32_of));
  ByteReader r(bytes.data() + sizeof(kMagic), bytes.size() - sizeof(kMagic) - 8);
  if (release) r.SetReleaseHook(std::move(release), size_t{8} << 20);
  uint32_t format = 0, shard = 0, num_shards = 0;
  uint64_t count = 0;
  ONLINEPS_RETURN_IF_ERROR(r.Get(&format, "format"));
  if (format == kDeltaFormat && delta == nullptr) {
    return DataLoss(path + " is a delta (an incremental checkpoint): it is read after " +
                    "the full checkpoint it follows, not alone");
  }
  if (format != kDeltaFormat && delta != nullptr) {
    return DataLoss(path + " is named as a delta but is a full checkpoint (format " +
                    std::to_string(format) + ")");
  }
  ONLINEPS_RETURN_IF_ERROR(r.Get(&shard, "shard"));
  ONLINEPS_RETURN_IF_ERROR(r.Get(&num_shards, "shard count"));
  if (shard != id.shard || num_shards != id.num_shards) {
    return FailedPrecondition(path + " belongs to shard " + std::to_string(shard) + " of " +
                              std::to_string(num_shards) + ", this is shard " +
                              std::to_string(id.shard) + " of " + std::to_string(id.num_shards));
  }
  if (delta != nullptr) {
    uint64_t seq = 0, prev = 0;
    ONLINEPS_RETURN_IF_ERROR(r.Get(&seq, "delta sequence number"));
    ONLINEPS_RETURN_IF_ERROR(r.Get(&prev, "delta's previous checksum"));
    if (seq != delta->seq || prev != delta->prev_trailer) {
      delta->stale = true;
      return Status::Ok();
    }
  }
  ONLINEPS_RETURN_IF_ERROR(r.Get(&count, "table count"));
  for (uint64_t i = 0; i < count; ++i) {
    ONLINEPS_RETURN_IF_ERROR(ReadTable(&r, id, path, tables, delta != nullptr));
  }
  Dedup loaded;
  ONLINEPS_RETURN_IF_ERROR(loaded.Load(&r));
  if (r.Remaining() != 0) {
    return DataLoss(path + ": " + std::to_string(r.Remaining()) +
                    " unexpected bytes after the last section");
  }
  ByteWriter tmp;
  loaded.Save(&tmp);
  ByteReader again(tmp.buffer().data(), tmp.buffer().size());
  return dedup->Load(&again);
}

}  // namespace

}  // namespace onlineps::ps

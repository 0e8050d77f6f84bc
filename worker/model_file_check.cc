#include "worker/model_file_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace onlineps::worker {

namespace {

constexpr uint32_t kEndSig = 0x06054b50;  // end of central directory
constexpr uint32_t kEnd64LocatorSig = 0x07064b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEndBytes = 22;
constexpr size_t kCentralBytes = 46;
constexpr size_t kLocalBytes = 30;
// A central directory larger than this is not a model's (a .pt has a few hundred entries).
constexpr uint64_t kMaxDirectoryBytes = 64 << 20;
constexpr size_t kBlock = 1 << 20;

uint16_t U16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t U32(const unsigned char* p) { return U16(p) | static_cast<uint32_t>(U16(p + 2)) << 16; }
uint64_t U64(const unsigned char* p) { return U32(p) | static_cast<uint64_t>(U32(p + 4)) << 32; }

std::string Hex(uint32_t v) {
  char buf[11];
  snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

class Archive {
 public:
  Archive(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}

  Status Check() {
    ONLINEPS_RETURN_IF_ERROR(FindDirectory());
    std::vector<unsigned char> dir(dir_bytes_);
    ONLINEPS_RETURN_IF_ERROR(Read(dir_offset_, dir.data(), dir.size(), "its central directory"));
    size_t pos = 0;
    for (uint64_t i = 0; i < entries_; ++i) {
      if (pos + kCentralBytes > dir.size() || U32(&dir[pos]) != kCentralSig) {
        return Damaged("its central directory ends at entry " + std::to_string(i) + " of " +
                       std::to_string(entries_));
      }
      const unsigned char* h = &dir[pos];
      Entry e;
      e.method = U16(h + 10);
      e.crc = U32(h + 16);
      e.packed = U32(h + 20);
      e.size = U32(h + 24);
      const size_t name_len = U16(h + 28), extra_len = U16(h + 30), comment_len = U16(h + 32);
      e.local = U32(h + 42);
      if (pos + kCentralBytes + name_len + extra_len + comment_len > dir.size()) {
        return Damaged("its central directory ends inside entry " + std::to_string(i));
      }
      e.name.assign(reinterpret_cast<const char*>(h + kCentralBytes), name_len);
      ONLINEPS_RETURN_IF_ERROR(ReadZip64Extra(h + kCentralBytes + name_len, extra_len, &e));
      ONLINEPS_RETURN_IF_ERROR(CheckEntry(e));
      pos += kCentralBytes + name_len + extra_len + comment_len;
    }
    return Status::Ok();
  }

 private:
  struct Entry {
    std::string name;
    uint16_t method = 0;
    uint32_t crc = 0;
    uint64_t packed = 0, size = 0, local = 0;
  };

  Status Damaged(const std::string& what) const {
    return InvalidArgument("model file " + path_ + " is damaged or not a TorchScript archive: " +
                           what + " (libtorch does not check; restore or re-export the file)");
  }

  Status Read(uint64_t offset, void* out, size_t n, const std::string& what) const {
    if (offset > size_ || n > size_ - offset) {
      return Damaged(what + " lies past the end of the file (" + std::to_string(size_) +
                     " bytes): truncated?");
    }
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return InvalidArgument("cannot read model file " + path_ + ": " +
                               (got < 0 ? std::strerror(errno) : "unexpected end"));
      }
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return Status::Ok();
  }

  Status FindDirectory() {
    // The end record is the last 22 bytes plus a comment of up to 65,535.
    const size_t tail = static_cast<size_t>(std::min<uint64_t>(size_, kEndBytes + 65535));
    if (tail < kEndBytes) return Damaged("it is " + std::to_string(size_) + " bytes");
    std::vector<unsigned char> buf(tail);
    ONLINEPS_RETURN_IF_ERROR(Read(size_ - tail, buf.data(), tail, "the end record"));
    size_t at = tail - kEndBytes + 1;
    do {
      --at;
      if (U32(&buf[at]) == kEndSig && at + kEndBytes + U16(&buf[at + 20]) == tail) break;
    } while (at > 0);
    if (U32(&buf[at]) != kEndSig) return Damaged("no end-of-directory record (not a zip file)");
    const uint64_t end_offset = size_ - tail + at;
    entries_ = U16(&buf[at + 10]);
    dir_bytes_ = U32(&buf[at + 12]);
    dir_offset_ = U32(&buf[at + 16]);
    if (entries_ == 0xffff || dir_bytes_ == 0xffffffff || dir_offset_ == 0xffffffff) {
      // Zip64: the locator sits right before the end record.
      unsigned char loc[20], rec[56];
      if (end_offset < sizeof loc) return Damaged("no zip64 locator");
      ONLINEPS_RETURN_IF_ERROR(Read(end_offset - sizeof loc, loc, sizeof loc, "the zip64 locator"));
      if (U32(loc) != kEnd64LocatorSig) return Damaged("no zip64 locator");
      ONLINEPS_RETURN_IF_ERROR(Read(U64(loc + 8), rec, sizeof rec, "the zip64 end record"));
      if (U32(rec) != kEnd64Sig) return Damaged("no zip64 end record where its locator points");
      entries_ = U64(rec + 32);
      dir_bytes_ = U64(rec + 40);
      dir_offset_ = U64(rec + 48);
    }
    if (dir_bytes_ > kMaxDirectoryBytes) {
      return Damaged("its central directory claims " + std::to_string(dir_bytes_) + " bytes");
    }
    return Status::Ok();
  }

  // The 64-bit sizes and offset of an entry whose 32-bit fields are 0xffffffff.
  Status ReadZip64Extra(const unsigned char* p, size_t n, Entry* e) const {
    for (size_t i = 0; i + 4 <= n;) {
      const uint16_t id = U16(p + i), len = U16(p + i + 2);
      if (i + 4 + len > n) break;
      if (id == 0x0001) {
        const unsigned char* f = p + i + 4;
        size_t left = len;
        for (uint64_t* field : {&e->size, &e->packed, &e->local}) {
          if (*field != 0xffffffff) continue;
          if (left < 8) return Damaged("entry '" + e->name + "' has a short zip64 field");
          *field = U64(f);
          f += 8;
          left -= 8;
        }
      }
      i += 4 + len;
    }
    return Status::Ok();
  }

  Status CheckEntry(const Entry& e) {
    unsigned char local[kLocalBytes];
    ONLINEPS_RETURN_IF_ERROR(Read(e.local, local, sizeof local, "entry '" + e.name + "'"));
    if (U32(local) != kLocalSig) return Damaged("entry '" + e.name + "' has no local header");
    const uint64_t data = e.local + kLocalBytes + U16(local + 26) + U16(local + 28);
    if (e.method != 0 && e.method != 8) {
      return Damaged("entry '" + e.name + "' uses compression method " + std::to_string(e.method) +
                     " (only stored and deflated are read)");
    }
    if (e.method == 0 && e.packed != e.size) {
      return Damaged("entry '" + e.name + "' is stored with two different sizes");
    }
    z_stream z{};
    if (e.method == 8 && inflateInit2(&z, -MAX_WBITS) != Z_OK) {
      return Internal("zlib inflateInit2 failed");
    }
    std::vector<unsigned char>& in = in_;
    std::vector<unsigned char>& out = out_;
    in.resize(kBlock);
    if (e.method == 8) out.resize(kBlock);
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t produced = 0;
    Status st = Status::Ok();
    for (uint64_t done = 0; done < e.packed && st.ok() && produced <= e.size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, e.packed - done));
      st = Read(data + done, in.data(), n, "entry '" + e.name + "'");
      if (!st.ok()) break;
      done += n;
      if (e.method == 0) {
        crc = crc32(crc, in.data(), static_cast<uInt>(n));
        produced += n;
        continue;
      }
      z.next_in = in.data();
      z.avail_in = static_cast<uInt>(n);
      while (z.avail_in > 0) {
        z.next_out = out.data();
        z.avail_out = static_cast<uInt>(out.size());
        const int r = inflate(&z, Z_NO_FLUSH);
        const size_t got = out.size() - z.avail_out;
        crc = crc32(crc, out.data(), static_cast<uInt>(got));
        produced += got;
        if (produced > e.size) break;  // more than recorded: damaged (or a deflate bomb)
        if (r == Z_STREAM_END) break;
        if (r != Z_OK && r != Z_BUF_ERROR) {
          st = Damaged("entry '" + e.name + "' does not inflate");
          break;
        }
        if (r == Z_BUF_ERROR && got == 0) break;
      }
    }
    if (e.method == 8) inflateEnd(&z);
    ONLINEPS_RETURN_IF_ERROR(st);
    if (produced != e.size) {
      return Damaged("entry '" + e.name + "' holds " + std::to_string(produced) +
                     " bytes, its directory says " + std::to_string(e.size));
    }
    if (crc != e.crc) {
      return Damaged("entry '" + e.name + "' fails its CRC-32 check (recorded " + Hex(e.crc) +
                     ", read " + Hex(static_cast<uint32_t>(crc)) + ")");
    }
    return Status::Ok();
  }

  const std::string path_;
  const int fd_;
  const uint64_t size_;
  uint64_t entries_ = 0, dir_bytes_ = 0, dir_offset_ = 0;
  std::vector<unsigned char> in_, out_;  // read and inflate buffers, reused by every entry
};

}  // namespace

Status CheckModelArchive(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return InvalidArgument("cannot open model file " + path + ": " + std::strerror(errno));
  struct stat st {};
  Status result =
      ::fstat(fd, &st) != 0
          ? InvalidArgument("cannot stat model file " + path + ": " + std::strerror(errno))
          : Archive(path, fd, static_cast<uint64_t>(st.st_size)).Check();
  ::close(fd);
  return result;
}

}  // namespace onlineps::worker

#include "replay/user_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_set>

#include "common/sha256.h"

namespace onlineps::replay {
namespace {

constexpr int64_t kMaxIntegerLabel = 65535;  // integer classes are 0..max: keep max sane

// One CSV line split into cells (RFC 4180 quoting within the line: "a,b" is one cell,
// "" inside quotes is a quote). A quote left open is an error.
StatusOr<std::vector<std::string>> Cells(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else if (c != '\r') {
      cells.back() += c;
    }
  }
  if (quoted) return InvalidArgument("a quoted cell is not closed on this line");
  for (std::string& cell : cells) {  // surrounding blanks are not part of a number
    const size_t b = cell.find_first_not_of(" \t"), e = cell.find_last_not_of(" \t");
    cell = b == std::string::npos ? "" : cell.substr(b, e - b + 1);
  }
  return cells;
}

// A cell or label as quoted in a message: at most 40 bytes of it.
std::string Clipped(const std::string& s) {
  return s.size() <= 40 ? s : s.substr(0, 40) + "... (" + std::to_string(s.size()) + " bytes)";
}

// A finite number, or why not ("" when it is one).
std::string NumberOf(const std::string& cell, double* out) {
  if (cell.empty()) return "is empty (a missing value)";
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(cell.c_str(), &end);
  if (end != cell.c_str() + cell.size()) return "'" + Clipped(cell) + "' is not a number";
  if (!std::isfinite(*out)) return "is " + Clipped(cell) + " (NaN or Inf)";
  // Features are stored as float32: a larger magnitude would become Inf there.
  if (!std::isfinite(static_cast<float>(*out))) {
    return "is " + Clipped(cell) + " (beyond the float32 range)";
  }
  return "";
}

bool IsNumber(const std::string& cell) {
  double v;
  return NumberOf(cell, &v).empty();
}

// The rows of one file, features as float32 and labels as their cells.
struct Table {
  std::vector<std::string> header;  // empty without one
  size_t columns = 0;
  std::vector<float> x;             // rows x (columns - 1)
  std::vector<std::string> labels;  // one cell per row
  std::vector<size_t> lines;        // the line each row came from
};

struct Layout {
  bool header = false;
  size_t label = 0;  // column index
};

// A text file read line by line and hashed as it goes: the file's own bytes, so the
// digest equals sha256sum's whether or not the last line ends in a newline.
class HashedLines {
 public:
  explicit HashedLines(const std::string& path) : path_(path), in_(path, std::ios::binary) {}
  // kNotFound when the file cannot be opened.
  Status Open() const { return in_ ? Status::Ok() : NotFound(path_ + ": " + std::strerror(errno)); }
  // The next line (without its newline) and its 1-based number; false at the end.
  bool Next(std::string* line, size_t* lineno) {
    if (!std::getline(in_, *line)) return false;
    hash_.Update(line->data(), line->size());
    bytes_ += line->size();
    if (!in_.eof()) {  // the newline getline consumed
      hash_.Update("\n", 1);
      ++bytes_;
    }
    *lineno = ++lines_;
    return true;
  }
  // After the last line: the file's record, or kDataLoss on a read error.
  StatusOr<DatasetFile> Finish() {
    if (in_.bad()) return DataLoss(path_ + ": read error");
    return DatasetFile{path_, hash_.HexDigest(), bytes_};
  }

 private:
  const std::string path_;
  std::ifstream in_;
  Sha256 hash_;
  uint64_t bytes_ = 0;
  size_t lines_ = 0;
};

// Reads `path` line by line, hashing its bytes into `file`. `layout` is settled from the
// first non-empty line when `first` is true (header detection, label column), and then
// holds for the other file too.
Status ReadTable(const std::string& path, const DatasetOptions& o, bool first, Layout* layout,
                 Table* t, DatasetFile* file) {
  HashedLines lines(path);
  ONLINEPS_RETURN_IF_ERROR(lines.Open());
  std::string line;
  size_t lineno = 0;
  bool seen_first = false;
  while (lines.Next(&line, &lineno)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    auto cells = Cells(line);
    if (!cells.ok()) return DataLoss(where + ": " + cells.status().message());
    if (!seen_first) {
      seen_first = true;
      t->columns = cells->size();
      if (t->columns < 2) {
        return DataLoss(where + ": " + std::to_string(t->columns) +
                        " column; need at least one feature and the label");
      }
      const std::string& want = o.label_column;
      const bool by_index =
          want.empty() || want == "-1" || want.find_first_not_of("0123456789") == std::string::npos;
      if (!first && layout->label >= t->columns) {
        return DataLoss(where + ": " + std::to_string(t->columns) +
                        " columns; the label is column " + std::to_string(layout->label) +
                        " of the training file");
      }
      if (first) {
        layout->label = want.empty() || want == "-1" ? t->columns - 1
                        : by_index                   ? std::strtoull(want.c_str(), nullptr, 10)
                                                     : 0;
        if (by_index && layout->label >= t->columns) {
          return InvalidArgument("--label-column " + want + ": " + path + " has " +
                                 std::to_string(t->columns) + " columns (0-based index)");
        }
      }
      // auto: a header names the label column, or has a feature cell that is a word (the
      // label cell may be a word in any row; an empty cell is a missing value).
      bool header = o.header == "yes";
      if (o.header == "auto") {
        header = !by_index;
        for (size_t c = 0; c < cells->size() && !header; ++c) {
          header = c != layout->label && !(*cells)[c].empty() && !IsNumber((*cells)[c]);
        }
      }
      if (first) {
        layout->header = header;
        if (!by_index) {
          auto it = header ? std::find(cells->begin(), cells->end(), want) : cells->end();
          if (it == cells->end()) {
            return InvalidArgument("--label-column '" + want + "' is not a column of " + path +
                                   (header ? "'s header" : " (it has no header)"));
          }
          layout->label = static_cast<size_t>(it - cells->begin());
        }
      } else if (header != layout->header) {
        return DataLoss(where + ": the training file " +
                        (layout->header ? "has a header and this one has none"
                                        : "has no header and this one has one"));
      }
      if (header) {
        t->header = std::move(*cells);
        continue;
      }
    }
    if (cells->size() != t->columns) {
      return DataLoss(where + ": " + std::to_string(cells->size()) + " cells; the " +
                      (t->header.empty() ? "first row has " : "header has ") +
                      std::to_string(t->columns));
    }
    for (size_t c = 0; c < cells->size(); ++c) {
      if (c == layout->label) continue;
      double v = 0;
      const std::string why = NumberOf((*cells)[c], &v);
      if (!why.empty()) {
        const std::string column = t->header.empty() ? std::to_string(c) : "'" + t->header[c] + "'";
        return DataLoss(where + ": column " + column + " " + why);
      }
      t->x.push_back(static_cast<float>(v));
    }
    if ((*cells)[layout->label].empty()) return DataLoss(where + ": the label is empty");
    t->labels.push_back(std::move((*cells)[layout->label]));
    t->lines.push_back(lineno);
  }
  ONLINEPS_ASSIGN_OR_RETURN(*file, lines.Finish());
  if (!seen_first) return DataLoss(path + ": the file is empty");
  if (t->labels.empty()) return DataLoss(path + ": a header and no rows");
  return Status::Ok();
}

// Class ids of every label cell: integers >= 0 stand for themselves (labels "0".."max"),
// anything else names a class (labels sorted). A test label must be a training class.
Status AssignLabels(const std::string& train_path, const Table& train, const std::string& test_path,
                    const Table* test, Dataset* ds, std::vector<int64_t>* train_y,
                    std::vector<int64_t>* test_y) {
  auto integer = [](const std::string& s, int64_t* v) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    errno = 0;
    *v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) *v = std::numeric_limits<int64_t>::max();
    return true;
  };
  int64_t v = 0;
  bool integers = std::all_of(train.labels.begin(), train.labels.end(),
                              [&](const std::string& s) { return integer(s, &v); });
  if (integers) {
    int64_t top = 0;
    for (size_t i = 0; i < train.labels.size(); ++i) {
      integer(train.labels[i], &v);
      if (v > kMaxIntegerLabel) {
        return DataLoss(train_path + ":" + std::to_string(train.lines[i]) + ": label " +
                        train.labels[i] + " out of range: integer labels are classes 0.." +
                        std::to_string(kMaxIntegerLabel));
      }
      top = std::max(top, v);
      train_y->push_back(v);
    }
    for (int64_t c = 0; c <= top; ++c) ds->labels.push_back(std::to_string(c));
    for (size_t i = 0; test && i < test->labels.size(); ++i) {
      if (!integer(test->labels[i], &v) || v > top) {
        return DataLoss(test_path + ":" + std::to_string(test->lines[i]) + ": label '" +
                        Clipped(test->labels[i]) + "' out of range: the training labels are 0.." +
                        std::to_string(top));
      }
      test_y->push_back(v);
    }
    return Status::Ok();
  }
  std::set<std::string> names(train.labels.begin(), train.labels.end());
  ds->labels.assign(names.begin(), names.end());
  std::map<std::string, int64_t> id;
  for (size_t i = 0; i < ds->labels.size(); ++i) id[ds->labels[i]] = static_cast<int64_t>(i);
  for (const std::string& l : train.labels) train_y->push_back(id[l]);
  for (size_t i = 0; test && i < test->labels.size(); ++i) {
    auto it = id.find(test->labels[i]);
    if (it == id.end()) {
      return DataLoss(test_path + ":" + std::to_string(test->lines[i]) + ": label '" +
                      Clipped(test->labels[i]) + "' does not occur in the training file " +
                      train_path);
    }
    test_y->push_back(it->second);
  }
  return Status::Ok();
}

// --normalize: kInvalidArgument unless standard, minmax or none.
Status CheckNormalize(const std::string& how) {
  if (how == "standard" || how == "minmax" || how == "none") return Status::Ok();
  return InvalidArgument("--normalize '" + how + "': expected standard, minmax or none");
}

// Fits the scaling `how` (CheckNormalize) on `train` (rows x dim) and applies it to both.
void Normalize(const std::string& how, size_t dim, std::vector<float>* train,
               std::vector<float>* test) {
  if (how == "none") return;
  const size_t n = train->size() / dim;
  std::vector<double> a(dim), b(dim);  // x' = (x - a) / b
  for (size_t j = 0; j < dim; ++j) {
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
    for (size_t i = 0; i < n; ++i) {
      const double x = (*train)[i * dim + j];
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
    }
    const double mean = sum / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) sq += std::pow((*train)[i * dim + j] - mean, 2);
    const double sd = std::sqrt(sq / static_cast<double>(n));
    a[j] = how == "minmax" ? lo : mean;
    b[j] = how == "minmax" ? hi - lo : sd;
    if (!(b[j] > 0)) b[j] = 1;  // a constant column stays constant
  }
  for (std::vector<float>* xs : {train, test}) {
    for (size_t i = 0; i < xs->size(); ++i) {
      const size_t j = i % dim;
      (*xs)[i] = static_cast<float>(((*xs)[i] - a[j]) / b[j]);
    }
  }
}

// Keeps the first `max` rows of a dense split (0: all).
void KeepFirst(size_t max, size_t dim, std::vector<float>* x, std::vector<int64_t>* y) {
  if (max == 0 || y->size() <= max) return;
  y->resize(max);
  x->resize(max * dim);
}

void TakeRows(const std::vector<float>& x, const std::vector<int64_t>& y, size_t dim,
              const std::vector<size_t>& rows, std::vector<float>* xs, std::vector<int64_t>* ys) {
  for (size_t r : rows) {
    xs->insert(xs->end(), x.begin() + static_cast<std::ptrdiff_t>(r * dim),
               x.begin() + static_cast<std::ptrdiff_t>((r + 1) * dim));
    ys->push_back(y[r]);
  }
}

StatusOr<Dataset> LoadCsv(const std::string& name, const std::string& path,
                          const DatasetOptions& o) {
  if (o.header != "auto" && o.header != "yes" && o.header != "no") {
    return InvalidArgument("--csv-header '" + o.header + "': expected auto, yes or no");
  }
  ONLINEPS_RETURN_IF_ERROR(CheckNormalize(o.normalize));
  if (o.test_file.empty() && !(o.test_fraction > 0 && o.test_fraction < 1)) {
    return InvalidArgument("test_fraction must be in (0, 1), got " +
                           std::to_string(o.test_fraction));
  }
  Dataset ds;
  ds.name = name;
  Layout layout;
  Table train, test;
  DatasetFile file;
  ONLINEPS_RETURN_IF_ERROR(ReadTable(path, o, true, &layout, &train, &file));
  ds.files.push_back(file);
  if (!o.test_file.empty()) {
    ONLINEPS_RETURN_IF_ERROR(ReadTable(o.test_file, o, false, &layout, &test, &file));
    if (test.columns != train.columns) {
      return DataLoss(o.test_file + ": " + std::to_string(test.columns) + " columns, " + path +
                      " has " + std::to_string(train.columns));
    }
    ds.files.push_back(file);
  }
  ds.dim = train.columns - 1;
  std::vector<int64_t> train_y, test_y;
  ONLINEPS_RETURN_IF_ERROR(AssignLabels(
      path, train, o.test_file, o.test_file.empty() ? nullptr : &test, &ds, &train_y, &test_y));
  if (o.test_file.empty()) {
    ds.split_seed = o.split_seed;
    ds.test_fraction = o.test_fraction;
    const Split split = SeededSplit(train_y.size(), o);
    TakeRows(train.x, train_y, ds.dim, split.train, &ds.train_x, &ds.train_y);
    TakeRows(train.x, train_y, ds.dim, split.test, &ds.test_x, &ds.test_y);
  } else {
    ds.train_x = std::move(train.x);
    ds.train_y = std::move(train_y);
    ds.test_x = std::move(test.x);
    ds.test_y = std::move(test_y);
    KeepFirst(o.max_train, ds.dim, &ds.train_x, &ds.train_y);
    KeepFirst(o.max_test, ds.dim, &ds.test_x, &ds.test_y);
  }
  if (ds.train_y.empty()) return DataLoss(path + ": no training rows after the split");
  Normalize(o.normalize, ds.dim, &ds.train_x, &ds.test_x);
  return ds;
}

// ---- npz:PATH: a NumPy archive (np.savez / np.savez_compressed) of x, y[, x_test, y_test]
//
// Streamed: the zip directory is read from the end of the file, then each array member is
// read (stored) or inflated (np.savez_compressed) in 64 KiB pieces and converted straight
// into the float32 rows of its split, so memory holds the dataset's floats and labels, not
// the archive, its members or a copy in doubles. Zip64 (members or archives over 4 GiB,
// which NumPy writes for large arrays) is read too.

uint64_t LeN(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t Le32(const std::string& s, size_t at) {
  return static_cast<uint32_t>(LeN(reinterpret_cast<const unsigned char*>(s.data()) + at, 4));
}
uint16_t Le16(const std::string& s, size_t at) {
  return static_cast<uint16_t>(LeN(reinterpret_cast<const unsigned char*>(s.data()) + at, 2));
}
uint64_t Le64(const std::string& s, size_t at) {
  return LeN(reinterpret_cast<const unsigned char*>(s.data()) + at, 8);
}

// `n` bytes at `offset` of the file into `out`, or DataLoss naming `what` when the file
// ends first.
Status ReadInto(int fd, uint64_t offset, void* out, size_t n, const std::string& what) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(fd, static_cast<char*>(out) + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return DataLoss(what + ": " + std::strerror(errno));
    if (r == 0) return DataLoss(what + " is truncated");
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}
StatusOr<std::string> ReadAt(int fd, uint64_t offset, size_t n, const std::string& what) {
  std::string out(n, '\0');
  ONLINEPS_RETURN_IF_ERROR(ReadInto(fd, offset, out.data(), n, what));
  return out;
}

struct ZipMember {
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint64_t data = 0;    // offset of its bytes in the file
  uint64_t csize = 0, usize = 0;
};

// The members of a zip archive by name, from its central directory (zip64 fields read).
StatusOr<std::map<std::string, ZipMember>> ZipDirectory(int fd, uint64_t size,
                                                        const std::string& path) {
  if (size < 22) return DataLoss(path + ": not a zip archive (too short)");
  const uint64_t tail_at = size - std::min<uint64_t>(size, 22 + 65535 + 20);
  ONLINEPS_ASSIGN_OR_RETURN(std::string tail, ReadAt(fd, tail_at, size - tail_at, path));
  size_t eocd = std::string::npos;
  for (size_t i = tail.size() - 22; i + 1 > 0; --i) {
    if (Le32(tail, i) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) return DataLoss(path + ": not a zip archive (no directory)");
  uint64_t entries = Le16(tail, eocd + 10), dir_size = Le32(tail, eocd + 12),
           dir_at = Le32(tail, eocd + 16);
  if (eocd >= 20 && Le32(tail, eocd - 20) == 0x07064b50) {  // zip64 end-of-directory locator
    const uint64_t at64 = Le64(tail, eocd - 20 + 8);
    ONLINEPS_ASSIGN_OR_RETURN(std::string end64, ReadAt(fd, at64, 56, path + ": zip64 directory"));
    if (Le32(end64, 0) != 0x06064b50) return DataLoss(path + ": zip64 directory is damaged");
    entries = Le64(end64, 32);
    dir_size = Le64(end64, 40);
    dir_at = Le64(end64, 48);
  }
  if (dir_at + dir_size > size || entries > dir_size / 46) {
    return DataLoss(path + ": zip directory is damaged");
  }
  ONLINEPS_ASSIGN_OR_RETURN(std::string dir, ReadAt(fd, dir_at, dir_size, path));
  std::map<std::string, ZipMember> out;
  size_t at = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (at + 46 > dir.size() || Le32(dir, at) != 0x02014b50) {
      return DataLoss(path + ": zip directory entry " + std::to_string(e) + " is damaged");
    }
    ZipMember m;
    m.method = Le16(dir, at + 10);
    m.csize = Le32(dir, at + 20);
    m.usize = Le32(dir, at + 24);
    const size_t name_len = Le16(dir, at + 28), extra_len = Le16(dir, at + 30),
                 comment = Le16(dir, at + 32);
    uint64_t local = Le32(dir, at + 42);
    if (at + 46 + name_len + extra_len > dir.size()) {
      return DataLoss(path + ": zip directory entry " + std::to_string(e) + " is damaged");
    }
    const std::string name = dir.substr(at + 46, name_len);
    // Zip64: each field saturated at 0xFFFFFFFF is in the 0x0001 extra field, in this order.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const size_t id = Le16(dir, x), len = Le16(dir, x + 2);
      if (id == 0x0001) {
        size_t f = x + 4;
        for (uint64_t* field : {&m.usize, &m.csize, &local}) {
          if (*field != 0xFFFFFFFF) continue;
          if (f + 8 > x + 4 + len) return DataLoss(path + ": member " + name + ": bad zip64 field");
          *field = Le64(dir, f);
          f += 8;
        }
      }
      x += 4 + len;
    }
    ONLINEPS_ASSIGN_OR_RETURN(std::string head, ReadAt(fd, local, 30, path + ": member " + name));
    if (Le32(head, 0) != 0x04034b50) return DataLoss(path + ": member " + name + " is damaged");
    m.data = local + 30 + Le16(head, 26) + Le16(head, 28);
    if (m.data + m.csize > size) return DataLoss(path + ": member " + name + " is truncated");
    if (m.method != 0 && m.method != 8) {
      return DataLoss(path + ": member " + name + " uses zip method " + std::to_string(m.method) +
                      " (stored and deflated are read)");
    }
    out[name] = m;
    at += 46 + name_len + extra_len + comment;
  }
  return out;
}

// A member's bytes in order, read from the file (stored) or inflated as they are read.
class MemberReader {
 public:
  MemberReader(int fd, const ZipMember& m, std::string where)
      : fd_(fd), m_(m), where_(std::move(where)) {}
  ~MemberReader() {
    if (inflating_) inflateEnd(&zs_);
  }
  MemberReader(const MemberReader&) = delete;  // zlib's state points back at zs_
  MemberReader& operator=(const MemberReader&) = delete;

  uint64_t left() const { return m_.usize - out_; }

  // Exactly n bytes into `out`; DataLoss if the member ends or does not inflate first.
  Status Read(void* out, size_t n) {
    if (n > left()) return DataLoss(where_ + " is truncated");
    if (m_.method == 0) {
      ONLINEPS_RETURN_IF_ERROR(ReadInto(fd_, m_.data + out_, out, n, where_));
      out_ += n;
      return Status::Ok();
    }
    if (!inflating_) {
      if (inflateInit2(&zs_, -MAX_WBITS) != Z_OK) return Internal("inflateInit2 failed");
      inflating_ = true;
      in_.resize(64 << 10);
    }
    zs_.next_out = static_cast<Bytef*>(out);
    zs_.avail_out = static_cast<uInt>(n);
    while (zs_.avail_out > 0) {
      if (zs_.avail_in == 0) {
        const uint64_t take = std::min<uint64_t>(in_.size(), m_.csize - in_read_);
        if (take == 0) return DataLoss(where_ + " does not inflate to its size");
        ONLINEPS_RETURN_IF_ERROR(ReadInto(fd_, m_.data + in_read_, in_.data(), take, where_));
        in_read_ += take;
        zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
        zs_.avail_in = static_cast<uInt>(take);
      }
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc != Z_OK && !(rc == Z_STREAM_END && zs_.avail_out == 0)) {
        return DataLoss(where_ + " does not inflate to its size");
      }
    }
    out_ += n;
    return Status::Ok();
  }

 private:
  const int fd_;
  const ZipMember m_;
  const std::string where_;
  uint64_t out_ = 0, in_read_ = 0;
  bool inflating_ = false;
  z_stream zs_{};
  std::vector<char> in_;
};

// An opened .npy member: its shape and dtype, the reader at the first value.
struct NpyArray {
  std::vector<size_t> shape;
  char kind = 'f';  // f, i, u, b
  size_t width = 4;
  uint64_t count = 1;
  std::unique_ptr<MemberReader> reader;

  // The next `n` values as doubles (REQUIRES: n <= 8192 and values remain).
  Status Next(size_t n, double* out) {
    char raw[8192 * 8];
    ONLINEPS_RETURN_IF_ERROR(reader->Read(raw, n * width));
    const char* p = raw;
    for (size_t i = 0; i < n; ++i, p += width) {
      double v = 0;
      if (kind == 'f' && width == 4) {
        float f;
        std::memcpy(&f, p, 4);
        v = f;
      } else if (kind == 'f') {
        std::memcpy(&v, p, 8);
      } else {
        uint64_t u = 0;
        std::memcpy(&u, p, width);  // little-endian host (x86-64, arm64)
        if (kind == 'i' && width < 8 && (u >> (8 * width - 1)) & 1)
          u |= ~uint64_t{0} << (8 * width);
        v = kind == 'i' ? static_cast<double>(static_cast<int64_t>(u)) : static_cast<double>(u);
      }
      out[i] = v;
    }
    return Status::Ok();
  }
};

// Opens member `name`.npy: reads and checks its header (little-endian f4/f8/i1-i8/u1-u8/b1,
// C order, as many data bytes as the shape says).
StatusOr<NpyArray> OpenNpy(int fd, const ZipMember& m, const std::string& where) {
  NpyArray a;
  a.reader = std::make_unique<MemberReader>(fd, m, where);
  char magic[12];
  if (m.usize < 10) return DataLoss(where + ": not a .npy array");
  ONLINEPS_RETURN_IF_ERROR(a.reader->Read(magic, 10));
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) return DataLoss(where + ": not a .npy array");
  const int major = static_cast<unsigned char>(magic[6]);
  if (major != 1) ONLINEPS_RETURN_IF_ERROR(a.reader->Read(magic + 10, 2));
  const std::string fixed(magic, major == 1 ? 10 : 12);
  const size_t len = major == 1 ? Le16(fixed, 8) : Le32(fixed, 8);
  if (len > a.reader->left() || len > (1 << 20)) return DataLoss(where + ": truncated .npy header");
  std::string header(len, '\0');
  ONLINEPS_RETURN_IF_ERROR(a.reader->Read(header.data(), len));
  auto field = [&](const std::string& key) {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) return std::string();
    size_t v = header.find(':', k) + 1;
    while (v < header.size() && header[v] == ' ') ++v;
    const char open = header[v];
    const char close = open == '\'' ? '\'' : open == '(' ? ')' : ',';
    const size_t end = header.find(close, v + 1);
    return header.substr(v + (open == '\'' || open == '(' ? 1 : 0),
                         end - v - (open == '\'' || open == '(' ? 1 : 0));
  };
  const std::string descr = field("descr"), order = field("fortran_order"), shape = field("shape");
  if (order.find("True") != std::string::npos) {
    return DataLoss(where + ": Fortran-order arrays are not supported (save np.ascontiguousarray)");
  }
  for (size_t i = 0; i < shape.size();) {
    while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i >= shape.size()) break;
    a.shape.push_back(std::strtoull(shape.c_str() + i, nullptr, 10));
    if (__builtin_mul_overflow(a.count, a.shape.back(), &a.count)) {
      return DataLoss(where + ": shape (" + shape + ") is too large");
    }
    while (i < shape.size() && shape[i] != ',') ++i;
  }
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|')) {
    return DataLoss(where + ": dtype '" + descr + "' (need little-endian numbers)");
  }
  a.kind = descr[1];
  a.width = std::strtoull(descr.c_str() + 2, nullptr, 10);
  if (!((a.kind == 'f' && (a.width == 4 || a.width == 8)) ||
        ((a.kind == 'i' || a.kind == 'u') &&
         (a.width == 1 || a.width == 2 || a.width == 4 || a.width == 8)) ||
        (a.kind == 'b' && a.width == 1))) {
    return DataLoss(where + ": dtype '" + descr + "' is not a supported number type");
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(a.count, uint64_t{a.width}, &bytes)) {
    return DataLoss(where + ": shape (" + shape + ") is too large");
  }
  if (a.reader->left() != bytes) {
    return DataLoss(where + ": " + std::to_string(a.reader->left()) + " data bytes for " +
                    std::to_string(a.count) + " values of " + std::to_string(a.width) + " bytes");
  }
  return a;
}

// Where each source row of a split goes: row `row` of train (split 0) or test (1), or
// nowhere (split -1: beyond --max-train / --max-test).
struct RowTarget {
  int split = -1;
  size_t row = 0;
};
// Given a split's labels, where each of its rows goes (and the splits sized to hold them).
using RowPlacer = std::function<std::vector<RowTarget>(const std::vector<int64_t>&)>;

// One split's arrays x [n, ...] (flattened per row) and y [n], streamed: y is read and
// checked, then `place(labels)` says where each row goes, then x is read row by row into
// xs[split] / ys[split] (already sized by `place`). Returns n.
StatusOr<size_t> ReadNpzSplit(int fd, const std::map<std::string, ZipMember>& members,
                              const std::string& path, const std::string& xname,
                              const std::string& yname, size_t* dim, const RowPlacer& place,
                              std::vector<float>* const xs[2], std::vector<int64_t>* const ys[2]) {
  auto xm = members.find(xname + ".npy"), ym = members.find(yname + ".npy");
  if (xm == members.end() || ym == members.end()) {
    return DataLoss(path + ": no array '" + (xm == members.end() ? xname : yname) +
                    "' (np.savez(path, x=..., y=...))");
  }
  ONLINEPS_ASSIGN_OR_RETURN(NpyArray xa, OpenNpy(fd, xm->second, path + ":" + xname));
  ONLINEPS_ASSIGN_OR_RETURN(NpyArray ya, OpenNpy(fd, ym->second, path + ":" + yname));
  if (xa.shape.size() < 2) return DataLoss(path + ":" + xname + ": need shape [rows, features...]");
  if (ya.shape.size() != 1 || ya.shape[0] != xa.shape[0]) {
    return DataLoss(path + ":" + yname + ": need shape [" + std::to_string(xa.shape[0]) + "]");
  }
  const size_t n = xa.shape[0], d = n == 0 ? 0 : xa.count / n;
  if (*dim != 0 && d != *dim) {
    return DataLoss(path + ":" + xname + ": " + std::to_string(d) + " features per row, x has " +
                    std::to_string(*dim));
  }
  if (n > 0 && d == 0) return DataLoss(path + ":" + xname + ": rows without features");
  *dim = d;
  std::vector<int64_t> labels(n);
  double buf[8192];
  for (size_t i = 0; i < n;) {
    const size_t k = std::min<size_t>(8192, n - i);
    ONLINEPS_RETURN_IF_ERROR(ya.Next(k, buf));
    for (size_t j = 0; j < k; ++j, ++i) {
      const double v = buf[j];
      if (!(v >= 0 && v <= kMaxIntegerLabel && v == std::floor(v))) {
        char label[32];
        std::snprintf(label, sizeof label, "%g", v);
        return DataLoss(path + ":" + yname + ": row " + std::to_string(i) + " label " + label +
                        " is not a class in 0.." + std::to_string(kMaxIntegerLabel));
      }
      labels[i] = static_cast<int64_t>(v);
    }
  }
  const std::vector<RowTarget> targets = place(labels);
  for (size_t i = 0; i < n; ++i) {
    if (targets[i].split >= 0) (*ys[targets[i].split])[targets[i].row] = labels[i];
  }
  size_t row = 0, col = 0;  // of value i
  for (uint64_t i = 0; i < xa.count;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(8192, xa.count - i));
    ONLINEPS_RETURN_IF_ERROR(xa.Next(k, buf));
    for (size_t j = 0; j < k; ++j, ++i) {
      if (!std::isfinite(static_cast<float>(buf[j]))) {
        return DataLoss(path + ":" + xname + ": row " + std::to_string(row) + " feature " +
                        std::to_string(col) + " is NaN or Inf");
      }
      const RowTarget& t = targets[row];
      if (t.split >= 0) (*xs[t.split])[t.row * d + col] = static_cast<float>(buf[j]);
      if (++col == d) {
        col = 0;
        ++row;
      }
    }
  }
  return n;
}

StatusOr<Dataset> LoadNpz(const std::string& name, const std::string& path,
                          const DatasetOptions& o) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return DataLoss(path + ": " + std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return DataLoss(path + ": the file is empty");
  ONLINEPS_ASSIGN_OR_RETURN(auto members, ZipDirectory(fd, size, path));
  Dataset ds;
  ds.name = name;
  ONLINEPS_ASSIGN_OR_RETURN(std::string sha, FileSha256(path));
  ds.files.push_back({path, sha, size});
  std::vector<float>* const xs[2] = {&ds.train_x, &ds.test_x};
  std::vector<int64_t>* const ys[2] = {&ds.train_y, &ds.test_y};
  const bool has_test = members.count("x_test.npy") || members.count("y_test.npy");
  if (!has_test && !(o.test_fraction > 0 && o.test_fraction < 1)) {
    return InvalidArgument("test_fraction must be in (0, 1)");
  }
  // Row i of x goes to row k of one split: the first --max-train / --max-test rows of
  // each file (x: train, x_test: test), or the seeded split's order.
  auto in_order = [&](int split, size_t max) {
    return [&, split, max](const std::vector<int64_t>& y) {
      const size_t keep = max == 0 ? y.size() : std::min(max, y.size());
      std::vector<RowTarget> t(y.size());
      for (size_t i = 0; i < keep; ++i) t[i] = {split, i};
      xs[split]->resize(keep * ds.dim);
      ys[split]->resize(keep);
      return t;
    };
  };
  auto seeded = [&](const std::vector<int64_t>& y) {
    const Split split = SeededSplit(y.size(), o);
    std::vector<RowTarget> t(y.size());
    for (int s = 0; s < 2; ++s) {
      const std::vector<size_t>& rows = s == 0 ? split.train : split.test;
      for (size_t k = 0; k < rows.size(); ++k) t[rows[k]] = {s, k};
      xs[s]->resize(rows.size() * ds.dim);
      ys[s]->resize(rows.size());
    }
    return t;
  };
  ONLINEPS_ASSIGN_OR_RETURN(
      const size_t rows,
      ReadNpzSplit(fd, members, path, "x", "y", &ds.dim,
                   has_test ? RowPlacer(in_order(0, o.max_train)) : RowPlacer(seeded), xs, ys));
  if (rows == 0) return DataLoss(path + ": x has no rows");
  if (has_test) {
    ONLINEPS_RETURN_IF_ERROR(ReadNpzSplit(fd, members, path, "x_test", "y_test", &ds.dim,
                                          in_order(1, o.max_test), xs, ys)
                                 .status());
  } else {
    ds.split_seed = o.split_seed;
    ds.test_fraction = o.test_fraction;
  }
  int64_t top = 0;
  for (int64_t v : ds.train_y) top = std::max(top, v);
  for (size_t i = 0; i < ds.test_y.size(); ++i) {
    if (ds.test_y[i] > top) {
      return DataLoss(path + ":y_test: row " + std::to_string(i) + " label " +
                      std::to_string(ds.test_y[i]) + " out of range: the training labels are 0.." +
                      std::to_string(top));
    }
  }
  for (int64_t c = 0; c <= top; ++c) ds.labels.push_back(std::to_string(c));
  Normalize(o.normalize, ds.dim, &ds.train_x, &ds.test_x);
  return ds;
}

// ---- libsvm:PATH: "label index:value index:value ... [# comment]" per line

struct SparseTable {
  std::vector<std::string> labels;
  std::vector<size_t> lines, offsets = {0};
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

// Reads `path` line by line (hashed as it goes). Indices are integers >= 1 (0 too, for
// zero-based files), each at most once per line; `qid:N` is skipped.
Status ReadSparse(const std::string& path, SparseTable* t, DatasetFile* file) {
  HashedLines lines(path);
  ONLINEPS_RETURN_IF_ERROR(lines.Open());
  std::string line;
  size_t lineno = 0;
  std::unordered_set<uint64_t> seen;
  while (lines.Next(&line, &lineno)) {
    const size_t hash_mark = line.find('#');
    if (hash_mark != std::string::npos) line.resize(hash_mark);
    std::istringstream tokens(line);
    std::string label, item;
    if (!(tokens >> label)) continue;  // blank or comment
    const std::string where = path + ":" + std::to_string(lineno);
    double number = 0;
    if (const std::string why = NumberOf(label, &number); !why.empty()) {
      return DataLoss(where + ": the label " + why);
    }
    seen.clear();
    while (tokens >> item) {
      if (item.rfind("qid:", 0) == 0) continue;
      const size_t colon = item.find(':');
      const std::string index = item.substr(0, colon);
      if (colon == std::string::npos || index.empty() ||
          index.find_first_not_of("0123456789") != std::string::npos || index.size() > 18) {
        return DataLoss(where + ": '" + item.substr(0, 40) + "' is not index:value");
      }
      double v = 0;
      if (const std::string why = NumberOf(item.substr(colon + 1), &v); !why.empty()) {
        return DataLoss(where + ": feature " + index + " value " + why);
      }
      const uint64_t k = std::strtoull(index.c_str(), nullptr, 10);
      if (!seen.insert(k).second) {
        return DataLoss(where + ": feature " + index + " appears twice");
      }
      t->keys.push_back(k);
      t->values.push_back(static_cast<float>(v));
    }
    t->labels.push_back(label);
    t->lines.push_back(lineno);
    t->offsets.push_back(t->keys.size());
  }
  ONLINEPS_ASSIGN_OR_RETURN(*file, lines.Finish());
  if (t->labels.empty()) return DataLoss(path + ": the file is empty (no example lines)");
  return Status::Ok();
}

// Appends rows `rows` of `t` (labels already ids in `y`) to one split of `ds`.
void TakeSparse(const SparseTable& t, const std::vector<int64_t>& y,
                const std::vector<size_t>& rows, std::vector<size_t>* offsets,
                std::vector<uint64_t>* keys, std::vector<float>* values, std::vector<int64_t>* ys) {
  offsets->assign(1, 0);
  for (size_t r : rows) {
    keys->insert(keys->end(), t.keys.begin() + static_cast<std::ptrdiff_t>(t.offsets[r]),
                 t.keys.begin() + static_cast<std::ptrdiff_t>(t.offsets[r + 1]));
    values->insert(values->end(), t.values.begin() + static_cast<std::ptrdiff_t>(t.offsets[r]),
                   t.values.begin() + static_cast<std::ptrdiff_t>(t.offsets[r + 1]));
    offsets->push_back(keys->size());
    ys->push_back(y[r]);
  }
}

// Labels: the distinct label values, in numeric order ("-1", "+1" -> classes 0, 1).
StatusOr<Dataset> LoadLibsvm(const std::string& name, const std::string& path,
                             const DatasetOptions& o) {
  if (o.test_file.empty() && !(o.test_fraction > 0 && o.test_fraction < 1)) {
    return InvalidArgument("test_fraction must be in (0, 1)");
  }
  Dataset ds;
  ds.name = name;
  ds.sparse = true;
  SparseTable train, test;
  DatasetFile file;
  ONLINEPS_RETURN_IF_ERROR(ReadSparse(path, &train, &file));
  ds.files.push_back(file);
  if (!o.test_file.empty()) {
    ONLINEPS_RETURN_IF_ERROR(ReadSparse(o.test_file, &test, &file));
    ds.files.push_back(file);
  }
  std::map<double, std::string> classes;  // numeric order, first spelling kept
  for (const std::string& l : train.labels) classes.emplace(std::strtod(l.c_str(), nullptr), l);
  std::map<double, int64_t> id;
  for (const auto& [value, spelling] : classes) {
    id[value] = static_cast<int64_t>(ds.labels.size());
    ds.labels.push_back(spelling);
  }
  std::vector<int64_t> train_y, test_y;
  for (const std::string& l : train.labels) train_y.push_back(id[std::strtod(l.c_str(), nullptr)]);
  for (size_t i = 0; i < test.labels.size(); ++i) {
    auto it = id.find(std::strtod(test.labels[i].c_str(), nullptr));
    if (it == id.end()) {
      return DataLoss(o.test_file + ":" + std::to_string(test.lines[i]) + ": label '" +
                      Clipped(test.labels[i]) + "' does not occur in the training file " + path);
    }
    test_y.push_back(it->second);
  }
  std::vector<size_t> train_rows(train_y.size()), test_rows(test_y.size());
  for (size_t i = 0; i < train_rows.size(); ++i) train_rows[i] = i;
  for (size_t i = 0; i < test_rows.size(); ++i) test_rows[i] = i;
  if (o.test_file.empty()) {
    ds.split_seed = o.split_seed;
    ds.test_fraction = o.test_fraction;
    const Split split = SeededSplit(train_y.size(), o);
    TakeSparse(train, train_y, split.train, &ds.train_offsets, &ds.train_keys, &ds.train_values,
               &ds.train_y);
    TakeSparse(train, train_y, split.test, &ds.test_offsets, &ds.test_keys, &ds.test_values,
               &ds.test_y);
  } else {
    if (o.max_train && train_rows.size() > o.max_train) train_rows.resize(o.max_train);
    if (o.max_test && test_rows.size() > o.max_test) test_rows.resize(o.max_test);
    TakeSparse(train, train_y, train_rows, &ds.train_offsets, &ds.train_keys, &ds.train_values,
               &ds.train_y);
    TakeSparse(test, test_y, test_rows, &ds.test_offsets, &ds.test_keys, &ds.test_values,
               &ds.test_y);
  }
  if (ds.train_y.empty()) return DataLoss(path + ": no training rows after the split");
  return ds;
}

}  // namespace

bool IsUserDataset(const std::string& name) {
  return name.rfind("csv:", 0) == 0 || name.rfind("npz:", 0) == 0 || name.rfind("libsvm:", 0) == 0;
}

StatusOr<Dataset> LoadUserDataset(const std::string& name, const DatasetOptions& options) {
  if (name.rfind("csv:", 0) == 0) {
    const std::string path = name.substr(4);
    if (path.empty()) return InvalidArgument("--dataset csv:PATH needs a path");
    return LoadCsv(name, path, options);
  }
  if (name.rfind("npz:", 0) == 0) {
    const std::string path = name.substr(4);
    if (path.empty()) return InvalidArgument("--dataset npz:PATH needs a path");
    ONLINEPS_RETURN_IF_ERROR(CheckNormalize(options.normalize));
    return LoadNpz(name, path, options);
  }
  if (name.rfind("libsvm:", 0) == 0) {
    const std::string path = name.substr(7);
    if (path.empty()) return InvalidArgument("--dataset libsvm:PATH needs a path");
    return LoadLibsvm(name, path, options);
  }
  return InvalidArgument("unknown dataset '" + name + "'");
}

}  // namespace onlineps::replay

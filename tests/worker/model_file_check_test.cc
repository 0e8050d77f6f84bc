// CheckModelArchive (worker/model_file_check.h): a TorchScript file whose bytes were
// damaged is refused, naming the entry, before libtorch (which checks no CRC) loads it.
#include "worker/model_file_check.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace onlineps::worker {
namespace {

const std::string kModel = ONLINEPS_TESTDATA_DIR "/tiny_model.pt";

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

uint32_t U16At(const std::string& s, size_t i) {
  return static_cast<unsigned char>(s[i]) | static_cast<unsigned char>(s[i + 1]) << 8;
}

// The offset of the first data byte of the first entry whose name contains `part`.
size_t DataOf(const std::string& zip, const std::string& part) {
  for (size_t at = zip.find("PK\x03\x04"); at != std::string::npos;
       at = zip.find("PK\x03\x04", at + 4)) {
    const size_t name_len = U16At(zip, at + 26), extra_len = U16At(zip, at + 28);
    if (zip.substr(at + 30, name_len).find(part) != std::string::npos) {
      return at + 30 + name_len + extra_len;
    }
  }
  return std::string::npos;
}

TEST(ModelFileCheckTest, IntactArchivesPass) {
  for (const char* name :
       {"tiny_model.pt", "frozen_head.pt", "frozen_jit.pt", "lora_r2.pt", "scalar_param.pt"}) {
    const std::string path = std::string(ONLINEPS_TESTDATA_DIR "/") + name;
    EXPECT_TRUE(CheckModelArchive(path).ok()) << CheckModelArchive(path).ToString();
  }
}

TEST(ModelFileCheckTest, AFlippedWeightByteIsRefusedNamingItsEntry) {
  std::string bytes = ReadAll(kModel);
  ASSERT_GT(bytes.size(), 1000u);
  const size_t at = DataOf(bytes, "/data/0");
  ASSERT_NE(at, std::string::npos) << "no weight entry in " << kModel;
  bytes[at + 1] ^= 0x10;  // one bit of one float
  const Status s = CheckModelArchive(WriteTemp("flipped.pt", bytes));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data/0' fails its CRC-32 check"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("flipped.pt"), std::string::npos) << s.ToString();
}

TEST(ModelFileCheckTest, TruncatedAndForeignFilesAreRefused) {
  const std::string bytes = ReadAll(kModel);
  const Status cut = CheckModelArchive(WriteTemp("cut.pt", bytes.substr(0, bytes.size() / 2)));
  EXPECT_EQ(cut.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cut.message().find("cut.pt is damaged"), std::string::npos) << cut.ToString();
  const Status text = CheckModelArchive(WriteTemp("text.pt", std::string(5000, 'x')));
  EXPECT_NE(text.message().find("not a zip file"), std::string::npos) << text.ToString();
  const Status empty = CheckModelArchive(WriteTemp("empty.pt", ""));
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  const Status missing = CheckModelArchive(::testing::TempDir() + "/no-such.pt");
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos) << missing.ToString();
}

// A zip written by Python's zipfile: `writes` are its statements on `z`. "" on failure.
std::string MakeZip(const std::string& name, const std::string& mode, const std::string& writes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  const std::string make = "python3 -c \"import zipfile; z = zipfile.ZipFile('" + path + "', 'w'" +
                           mode + "); " + writes + "; z.close()\"";
  return std::system(make.c_str()) == 0 ? path : "";
}

// CheckModelArchive of a copy of `path` with one bit flipped `offset` bytes into the data
// of the entry named `entry`.
Status CheckFlipped(const std::string& path, const std::string& entry, size_t offset) {
  std::string bytes = ReadAll(path);
  const size_t at = DataOf(bytes, entry);
  if (at == std::string::npos) return NotFound("no entry " + entry + " in " + path);
  bytes[at + offset] ^= 0x01;
  return CheckModelArchive(WriteTemp("flipped-" + entry.substr(entry.rfind('/') + 1), bytes));
}

// Deflated entries (torch.jit.save stores, but a re-zipped file may deflate) are
// inflated and checked too.
TEST(ModelFileCheckTest, DeflatedEntriesAreChecked) {
  const std::string path = MakeZip("deflated.zip", ", zipfile.ZIP_DEFLATED",
                                   "z.writestr('m/data/0', b'0123456789' * 5000); "
                                   "z.writestr('m/x', b'small')");
  ASSERT_FALSE(path.empty());
  EXPECT_TRUE(CheckModelArchive(path).ok()) << CheckModelArchive(path).ToString();
  const Status s = CheckFlipped(path, "m/data/0", 40);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("m/data/0'"), std::string::npos) << s.ToString();
}

// More than 65,535 entries: the counts are in the zip64 end record, found through its
// locator (as are the sizes of a model over 4 GiB).
TEST(ModelFileCheckTest, Zip64ArchivesAreRead) {
  const std::string path = MakeZip("many.zip", "",
                                   "[z.writestr('m/%d' % i, b'x') for i in range(65600)]; "
                                   "z.writestr('m/data/0', b'weights' * 100)");
  ASSERT_FALSE(path.empty());
  EXPECT_TRUE(CheckModelArchive(path).ok()) << CheckModelArchive(path).ToString();
  const Status s = CheckFlipped(path, "m/data/0", 3);
  EXPECT_NE(s.message().find("m/data/0' fails its CRC-32 check"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace onlineps::worker

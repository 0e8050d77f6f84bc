// Bad dataset files are refused naming the file and line (docs/replay.md), never loaded
// as something else: values beyond float32 (once stored as Inf), NUL bytes in cells (once
// read as 0), integer labels too large for a class index (once turned into class names),
// a test file with fewer columns than the label index (once read past the row).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "replay/dataset.h"

namespace onlineps::replay {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/onlineps-badinput-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

DatasetOptions Opts() {
  DatasetOptions o;
  o.normalize = "none";
  return o;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// docs/replay.md: "column 'hue' is nan (NaN or Inf)" is refused naming file:line. 1e39 is a
// finite double but +inf as the float32 the loader stores.
TEST(DatasetBadInputTest, CsvValueBeyondFloat32IsRefusedNotStoredAsInf) {
  const std::string p = WriteTemp("big.csv", "a,b,y\n1,2,0\n3,1e39,1\n4,5,0\n6,7,1\n8,9,0\n");
  auto ds = LoadDataset("csv:" + p, Opts());
  ASSERT_FALSE(ds.ok()) << "loaded; train_x all finite: " << AllFinite(ds->train_x)
                        << ", test_x all finite: " << AllFinite(ds->test_x);
  EXPECT_NE(ds.status().message().find(p + ":3:"), std::string::npos) << ds.status().message();
}

// With the default --normalize standard the same file trains on NaN features.
TEST(DatasetBadInputTest, CsvValueBeyondFloat32WithStandardScalingGivesNaN) {
  const std::string p = WriteTemp("big2.csv", "a,b,y\n1,2,0\n3,1e39,1\n4,5,0\n6,7,1\n8,9,0\n");
  DatasetOptions o;  // normalize = standard
  auto ds = LoadDataset("csv:" + p, o);
  ASSERT_FALSE(ds.ok()) << "loaded; train_x all finite: " << AllFinite(ds->train_x);
}

// A cell holding a NUL byte ("\0" "5") is not a number; it was read as 0.
TEST(DatasetBadInputTest, CsvNulByteInCellIsNotANumber) {
  std::string text = "a,b,y\n1,2,0\n3,";
  text += '\0';
  text += "5,1\n4,6,0\n5,7,1\n6,8,0\n";
  const std::string p = WriteTemp("nul.csv", text);
  DatasetOptions o = Opts();
  o.test_fraction = 0.2;
  auto ds = LoadDataset("csv:" + p, o);
  ASSERT_FALSE(ds.ok()) << "loaded " << ds->train_size() + ds->test_size() << " rows";
  EXPECT_NE(ds.status().message().find(p + ":3:"), std::string::npos) << ds.status().message();
}

// "an integer label above 65535" is refused; one of 13+ digits silently became a class name.
TEST(DatasetBadInputTest, CsvHugeIntegerLabelIsRefused) {
  const std::string p = WriteTemp("lab.csv", "1,2,0\n3,4,1\n5,6,0\n7,8,10000000000000\n9,1,1\n");
  auto ds = LoadDataset("csv:" + p, Opts());
  ASSERT_FALSE(ds.ok()) << "loaded with " << ds->labels.size() << " classes";
}

// A --test-file with fewer columns than the training file's label index: the label cell is
// read past the end of the row (out of bounds), before the column counts are compared.
TEST(DatasetBadInputTest, CsvTestFileWithFewerColumnsIsDataLoss) {
  const std::string train =
      WriteTemp("train5.csv", "f1,f2,f3,f4,label\n1,2,3,4,0\n2,3,4,5,1\n3,4,5,6,0\n");
  const std::string test = WriteTemp("test2.csv", "f1,label\n1,0\n2,1\n");
  DatasetOptions o = Opts();
  o.test_file = test;
  auto ds = LoadDataset("csv:" + train, o);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kDataLoss) << ds.status().ToString();
  EXPECT_NE(ds.status().message().find(test), std::string::npos) << ds.status().message();
}

// libsvm: "NaN/Inf values" are refused; 1e39 became +inf.
TEST(DatasetBadInputTest, LibsvmValueBeyondFloat32IsRefused) {
  const std::string p =
      WriteTemp("big.svm", "1 1:1e39 2:1\n0 1:2 2:3\n1 1:3 2:1\n0 1:1 2:2\n1 1:2\n");
  DatasetOptions o = Opts();
  auto ds = LoadDataset("libsvm:" + p, o);
  ASSERT_FALSE(ds.ok()) << "loaded; values all finite: " << AllFinite(ds->train_values) << " / "
                        << AllFinite(ds->test_values);
}

// npz: "data.npz:x: row 3 feature 2 is NaN or Inf"; a float64 1e300 became +inf in float32.
TEST(DatasetBadInputTest, NpzFloat64BeyondFloat32IsRefused) {
  const std::string p = WriteTemp("big.npz", "");
  const std::string cmd = "/usr/bin/python3 -c 'import numpy as np; np.savez(\"" + p +
                          "\", x=np.array([[1.0],[2.0],[1e300],[4.0],[5.0],[6.0]]), "
                          "y=np.array([0,1,0,1,0,1]))'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto ds = LoadDataset("npz:" + p, Opts());
  ASSERT_FALSE(ds.ok()) << "loaded; train_x all finite: " << AllFinite(ds->train_x) << " / "
                        << AllFinite(ds->test_x);
}

}  // namespace
}  // namespace onlineps::replay

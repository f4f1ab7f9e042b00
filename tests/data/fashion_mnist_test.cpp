#include "lockstep/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>

#include "io/test_files.h"

namespace lockstep {
namespace {

using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

bool dataset_installed() {
  struct stat info {};
  return ::stat((std::string(kFashionMnistDefaultDir) + "/t10k-labels-idx1-ubyte.gz").c_str(), &info) == 0;
}

// The first `n` bytes after `skip` of a gzip file, read with zlib directly.
Bytes gunzip_prefix(const std::string& path, size_t skip, size_t n) {
  gzFile file = gzopen(path.c_str(), "rb");
  Bytes out(skip + n);
  const int got = gzread(file, out.data(), static_cast<unsigned>(out.size()));
  gzclose(file);
  EXPECT_EQ(got, static_cast<int>(out.size()));
  return Bytes(out.begin() + static_cast<std::ptrdiff_t>(skip), out.end());
}

Bytes idx_u8(const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

TEST(FashionMnist, TestSetMatchesTheRawFiles) {
  if (!dataset_installed()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const TensorDataset test = load_fashion_mnist(kFashionMnistDefaultDir, Split::test);
  ASSERT_EQ(test[kImageField].shape(), (Shape{10000, 1, 28, 28}));
  ASSERT_EQ(test[kLabelField].shape(), (Shape{10000}));
  EXPECT_EQ(test[kImageField].dtype(), DType::f32);
  EXPECT_EQ(test[kLabelField].dtype(), DType::i64);
  EXPECT_EQ(test.size(), 10000);

  const std::string dir = kFashionMnistDefaultDir;
  const Bytes labels = gunzip_prefix(dir + "/t10k-labels-idx1-ubyte.gz", 8, 16);
  const Bytes pixels = gunzip_prefix(dir + "/t10k-images-idx3-ubyte.gz", 16, 2 * 784);
  EXPECT_EQ(labels[0], 9);  // the test set famously opens with an ankle boot
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(test[kLabelField].data<int64_t>()[i], labels[i]) << i;
  const float* images = test[kImageField].data<float>();
  for (size_t i = 0; i < pixels.size(); ++i) ASSERT_EQ(images[i], static_cast<float>(pixels[i]) / 255.0f) << i;

  // Every value in [0, 1], both ends reached, and all ten classes present.
  float low = 1, high = 0;
  for (int64_t i = 0; i < test[kImageField].numel(); ++i) {
    low = std::min(low, images[i]);
    high = std::max(high, images[i]);
  }
  EXPECT_EQ(low, 0.0f);
  EXPECT_EQ(high, 1.0f);
  std::vector<int> counts(kFashionMnistClasses, 0);
  for (int64_t i = 0; i < 10000; ++i) ++counts[static_cast<size_t>(test[kLabelField].data<int64_t>()[i])];
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test set is balanced
  EXPECT_STREQ(fashion_mnist_class_names()[9], "Ankle boot");
}

TEST(FashionMnist, TrainSetStatisticsMatchTheConstantsLong) {
  if (!dataset_installed()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const TensorDataset train = load_fashion_mnist();
  ASSERT_EQ(train[kImageField].shape(), (Shape{60000, 1, 28, 28}));
  double sum = 0, sum_sq = 0;
  const float* p = train[kImageField].data<float>();
  for (int64_t i = 0; i < train[kImageField].numel(); ++i) {
    sum += p[i];
    sum_sq += static_cast<double>(p[i]) * p[i];
  }
  const double n = static_cast<double>(train[kImageField].numel());
  const double mean = sum / n;
  EXPECT_NEAR(mean, kFashionMnistMean, 1e-6);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), kFashionMnistStd, 1e-6);
}

TEST(FashionMnist, MissingDatasetSaysWhereAndHowToFix) {
  TempDir dir;
  const std::string missing = dir.file("nowhere");
  expect_error([&] { load_fashion_mnist(missing, Split::test); },
               {missing + "/t10k-images-idx3-ubyte.gz", "apt-get install dataset-fashion-mnist", "--data DIR"});
}

TEST(FashionMnist, LoadsUncompressedFilesAndScalesToUnitRange) {
  TempDir dir;
  Bytes pixels(2 * 784);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 13);
  testing::write_bytes(dir.file("train-images-idx3-ubyte"), idx_u8({2, 28, 28}, pixels));
  testing::write_gzip(dir.file("train-labels-idx1-ubyte.gz"), idx_u8({2}, {4, 7}));
  const TensorDataset train = load_fashion_mnist(dir.path(), Split::train);
  EXPECT_EQ(train[kImageField].shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(train[kLabelField].to_vector<int64_t>(), (std::vector<int64_t>{4, 7}));
  const std::vector<float> values = train[kImageField].to_vector<float>();
  for (size_t i = 0; i < pixels.size(); ++i) {
    // Division in double then rounding equals the f32 division (both correctly rounded).
    ASSERT_EQ(values[i], static_cast<float>(pixels[i] / 255.0)) << i;
  }
}

TEST(FashionMnist, CountMismatchAndBadLabelsAreErrors) {
  TempDir dir;
  testing::write_gzip(dir.file("t10k-images-idx3-ubyte.gz"), idx_u8({2, 28, 28}, Bytes(2 * 784, 1)));
  testing::write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_u8({3}, {1, 2, 3}));
  expect_error([&] { load_fashion_mnist(dir.path(), Split::test); }, {"2 images", "3 labels"});

  testing::write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_u8({2}, {1, 12}));
  expect_error([&] { load_fashion_mnist(dir.path(), Split::test); }, {"label 12", "sample 1"});

  testing::write_gzip(dir.file("t10k-images-idx3-ubyte.gz"), idx_u8({2, 28, 27}, Bytes(2 * 28 * 27, 1)));
  expect_error([&] { load_fashion_mnist(dir.path(), Split::test); }, {"[2, 28, 27]", "[N, 28, 28]"});
}

TEST(FashionMnist, NormalizeImages) {
  const Tensor images = Tensor::from_vector<float>({0.0f, 0.5f, 1.0f, 0.25f}, {1, 1, 2, 2});
  const Tensor out = normalize_images(images, kFashionMnistMean, kFashionMnistStd);
  const std::vector<float> in = images.to_vector<float>();
  const std::vector<float> got = out.to_vector<float>();
  for (size_t i = 0; i < in.size(); ++i) {
    const double expected = (double{in[i]} - double{kFashionMnistMean}) / double{kFashionMnistStd};
    EXPECT_NEAR(got[i], expected, 1e-6) << i;
  }
  EXPECT_EQ(images.to_vector<float>()[1], 0.5f);  // the input is untouched
  EXPECT_THROW(normalize_images(images, 0.5f, 0.0f), Error);
}

}  // namespace
}  // namespace lockstep

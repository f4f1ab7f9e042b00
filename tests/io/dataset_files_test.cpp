// Datasets from files: .npy files written by numpy itself (Debian's python3-numpy) and a
// safetensors file, sampled by the DataLoader; errors that name the file and the fix.
#include "lockstep/io/dataset_files.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "io/test_files.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/io/npy.h"
#include "lockstep/io/safetensors.h"

namespace lockstep {
namespace {

using testing::TempDir;

// Runs a Python program with numpy in `dir`; true when it exits 0.
bool python(const TempDir& dir, const std::string& program) {
  const std::string command = "cd '" + dir.path() + "' && /usr/bin/python3 -c \"import numpy as np; " + program + "\"";
  return std::system(command.c_str()) == 0;
}

TEST(NpyDataset, ReadsWhatNumpyWrites) {
  TempDir dir;
  ASSERT_TRUE(python(dir,
                     "np.save('x.npy', np.arange(24, dtype=np.float32).reshape(6, 2, 2) / 4); "
                     "np.save('y.npy', np.arange(6, dtype=np.int64) * 3); "
                     "np.save('d.npy', np.array([[1.5, -2], [3, 4]], dtype=np.float64)); "
                     "np.save('h.npy', np.array([0.5, -1], dtype=np.float16)); "
                     "np.save('b.npy', np.array([7, 255], dtype=np.uint8)); "
                     "np.save('i.npy', np.array([-5], dtype=np.int32)); "
                     "np.save('s.npy', np.float32(2.5))"));
  const Tensor x = load_npy(dir.file("x.npy"));
  EXPECT_EQ(x.shape(), (Shape{6, 2, 2}));
  EXPECT_EQ(x.to_vector<float>()[5], 1.25f);
  EXPECT_EQ(load_npy(dir.file("d.npy")).to_vector<double>(), (std::vector<double>{1.5, -2, 3, 4}));
  EXPECT_EQ(load_npy(dir.file("h.npy")).to(DType::f32).to_vector<float>(), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(load_npy(dir.file("b.npy")).to_vector<uint8_t>(), (std::vector<uint8_t>{7, 255}));
  EXPECT_EQ(load_npy(dir.file("i.npy")).to_vector<int32_t>(), (std::vector<int32_t>{-5}));
  EXPECT_EQ(load_npy(dir.file("s.npy")).shape(), Shape{});

  const TensorDataset data = load_npy_dataset({{"x", dir.file("x.npy")}, {"y", dir.file("y.npy")}});
  EXPECT_EQ(data.size(), 6);
  DataLoader loader(data, {.batch_size = 4, .shuffle = true, .seed = 1});
  const std::optional<Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  const std::vector<int64_t> y = batch->samples["y"].to_vector<int64_t>();
  const std::vector<float> xs = batch->samples["x"].to_vector<float>();
  for (size_t i = 0; i < batch->indices.size(); ++i) {
    EXPECT_EQ(y[i], batch->indices[i] * 3);
    EXPECT_EQ(xs[i * 4], static_cast<float>(batch->indices[i] * 4) / 4);
  }
}

TEST(NpyDataset, ErrorsNameTheFileAndTheFix) {
  TempDir dir;
  ASSERT_TRUE(python(dir,
                     "np.save('u16.npy', np.zeros(3, dtype=np.uint16)); "
                     "np.save('big.npy', np.zeros(3, dtype='>f4')); "
                     "np.save('f.npy', np.asfortranarray(np.zeros((2, 3), dtype=np.float32))); "
                     "np.save('x.npy', np.zeros((4, 2), dtype=np.float32)); "
                     "np.save('y.npy', np.zeros(5, dtype=np.int64)); "
                     "open('junk.npy', 'w').write('hello')"));
  testing::expect_error([&] { load_npy(dir.file("u16.npy")); }, {"u16.npy", "<u2", "astype(np.float32)"});
  testing::expect_error([&] { load_npy(dir.file("big.npy")); }, {"big.npy", ">f4"});
  testing::expect_error([&] { load_npy(dir.file("f.npy")); }, {"Fortran-order", "ascontiguousarray"});
  testing::expect_error([&] { load_npy(dir.file("junk.npy")); }, {"junk.npy", "not a .npy file"});
  testing::expect_error([&] { load_npy(dir.file("nowhere.npy")); }, {"cannot open", "nowhere.npy"});
  testing::expect_error(
      [&] {
        load_npy_dataset({{"x", dir.file("x.npy")}, {"y", dir.file("y.npy")}});
      },
      {"y.npy", "field 'y' [5] has 5 samples", "x.npy", "has 4"});
}

TEST(SafetensorsDataset, FieldsAreTheFilesTensors) {
  TempDir dir;
  save_safetensors(dir.file("d.safetensors"), {{"features", Tensor::ones({3, 2})},
                                               {"target", Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3})}});
  const TensorDataset all = load_safetensors_dataset(dir.file("d.safetensors"));
  EXPECT_EQ(all.size(), 3);
  EXPECT_EQ(all.fields().fields()[0].first, "features");
  const TensorDataset some = load_safetensors_dataset(dir.file("d.safetensors"), {"target"});
  EXPECT_EQ(some.fields().fields().size(), 1u);
  EXPECT_EQ(some["target"].to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_THROW(load_safetensors_dataset(dir.file("d.safetensors"), {"label"}), Error);
}

}  // namespace
}  // namespace lockstep

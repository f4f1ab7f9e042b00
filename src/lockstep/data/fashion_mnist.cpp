#include "lockstep/data/fashion_mnist.h"

#include <sys/stat.h>

#include "lockstep/core/parallel.h"
#include "lockstep/data/idx.h"

namespace lockstep {
namespace {

bool is_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// The .gz file Debian installs, or the uncompressed one a user may have unpacked.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::string gz = dir + "/" + name + ".gz";
  if (is_file(gz)) return gz;
  if (is_file(dir + "/" + name)) return dir + "/" + name;
  LOCKSTEP_FAIL() << "Fashion-MNIST file not found: tried '" << gz << "' (and '" << name
                  << "' uncompressed). Install the dataset with `apt-get install dataset-fashion-mnist`, or pass "
                     "`--data DIR` naming a directory that holds "
                  << name << ".gz";
  return gz;
}

}  // namespace

const std::array<const char*, kFashionMnistClasses>& fashion_mnist_class_names() {
  static const std::array<const char*, kFashionMnistClasses> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  return names;
}

TensorDataset load_fashion_mnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const Tensor raw_images = read_idx(images_path);
  const Tensor raw_labels = read_idx(labels_path);

  LOCKSTEP_CHECK(raw_images.dtype() == DType::u8 && raw_images.dim() == 3 && raw_images.size(1) == 28 &&
                 raw_images.size(2) == 28)
      << "'" << images_path << "' holds " << dtype_name(raw_images.dtype()) << " " << shape_str(raw_images.shape())
      << ", but Fashion-MNIST images are unsigned bytes [N, 28, 28]";
  LOCKSTEP_CHECK(raw_labels.dtype() == DType::u8 && raw_labels.dim() == 1)
      << "'" << labels_path << "' holds " << dtype_name(raw_labels.dtype()) << " " << shape_str(raw_labels.shape())
      << ", but Fashion-MNIST labels are unsigned bytes [N]";
  const int64_t n = raw_images.size(0);
  LOCKSTEP_CHECK(raw_labels.size(0) == n)
      << "'" << images_path << "' holds " << n << " images but '" << labels_path << "' holds " << raw_labels.size(0)
      << " labels; the two files must come from the same split";

  const Tensor images = Tensor::empty({n, 1, 28, 28}, DType::f32);
  const uint8_t* pixels = raw_images.data<uint8_t>();
  float* out = images.data<float>();
  // Division (not multiplication by 1/255) so values match torchvision's ToTensor bit for bit.
  parallel_for(raw_images.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(pixels[i]) / 255.0f;
  });

  const Tensor label_tensor = Tensor::empty({n}, DType::i64);
  const uint8_t* labels = raw_labels.data<uint8_t>();
  int64_t* label_out = label_tensor.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK(labels[i] < kFashionMnistClasses)
        << "'" << labels_path << "': label " << int{labels[i]} << " of sample " << i << " is outside [0, "
        << kFashionMnistClasses << ")";
    label_out[i] = labels[i];
  }
  return TensorDataset{{kImageField, images}, {kLabelField, label_tensor}};
}

Tensor normalize_images(const Tensor& images, float mean, float std) {
  LOCKSTEP_CHECK(std > 0.0f) << "normalize_images: std must be positive, got " << std;
  LOCKSTEP_CHECK(images.dtype() == DType::f32)
      << "normalize_images: expected f32 images, got " << dtype_name(images.dtype());
  Tensor out = Tensor::empty(images.shape(), DType::f32);
  out.copy_from(images);
  float* p = out.data<float>();
  parallel_for(out.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = (p[i] - mean) / std;
  });
  return out;
}

}  // namespace lockstep

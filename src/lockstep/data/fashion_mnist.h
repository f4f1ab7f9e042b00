// Fashion-MNIST (Zalando's 28x28 grayscale clothing images, 10 classes), read from the IDX
// files Debian's dataset-fashion-mnist package installs. Images come out as f32 in [0, 1]
// (pixel / 255, as torchvision's ToTensor), labels as i64, ready for the DataLoader: the
// fields "image" (f32 [N, 1, 28, 28]) and "label" (i64 [N]).
#pragma once

#include <array>
#include <string>

#include "lockstep/core/tensor.h"
#include "lockstep/data/dataset.h"

namespace lockstep {

enum class Split { train, test };

inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;
// The dataset's fields.
inline constexpr const char* kImageField = "image";
inline constexpr const char* kLabelField = "label";
// Per-pixel mean and standard deviation of the training images in [0, 1], for users who
// want normalized inputs (the default models train on plain [0, 1]).
inline constexpr float kFashionMnistMean = 0.2860406f;
inline constexpr float kFashionMnistStd = 0.3530242f;

// The class names, indexed by label.
const std::array<const char*, kFashionMnistClasses>& fashion_mnist_class_names();

// Loads train-{images,labels} (60000 samples) or t10k-* (10000) from dir, as .gz or, when
// that is absent, uncompressed. A missing dataset is an Error naming the path and the fix.
TensorDataset load_fashion_mnist(const std::string& dir = kFashionMnistDefaultDir, Split split = Split::train);

// (images - mean) / std as a new f32 tensor, e.g. with kFashionMnistMean and kFashionMnistStd.
Tensor normalize_images(const Tensor& images, float mean, float std);

}  // namespace lockstep

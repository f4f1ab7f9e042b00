// Shape ops on each test device: every op's output and gradient against the CPU op on the same
// values, exactly (they only move elements), views sharing the device storage, copies of
// strided inputs, integer tensors, and gradients from several views summed into one leaf.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "lockstep/ops/shape_ops.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_identical;
using testing::leaf_on;
using testing::random_f64;

using Inputs = std::vector<Tensor>;

struct ShapeCase {
  std::string name;
  std::vector<Shape> inputs;
  std::function<Tensor(const Inputs&)> op;
  bool view;  // the output shares the first input's storage
};

std::vector<ShapeCase> shape_cases() {
  return {
      {"reshape",
       {{2, 3, 37}},
       [](const Inputs& in) {
         return reshape(in[0], {6, -1});
       },
       true},
      {"reshape of a transpose",
       {{2, 3, 37}},
       [](const Inputs& in) { return reshape(transpose(in[0], 0, 2), {-1}); },
       false},
      {"flatten", {{2, 3, 4, 5}}, [](const Inputs& in) { return flatten(in[0], 1, 2); }, true},
      {"transpose", {{5, 300}}, [](const Inputs& in) { return transpose(in[0], 0, 1); }, true},
      {"permute",
       {{2, 3, 4}},
       [](const Inputs& in) {
         return permute(in[0], {2, 0, 1});
       },
       true},
      {"slice with a step", {{2, 3, 40}}, [](const Inputs& in) { return slice(in[0], 2, -33, 39, 3); }, true},
      {"slice of a permute",
       {{2, 3, 4}},
       [](const Inputs& in) {
         return slice(permute(in[0], {1, 2, 0}), 0, 1, 3);
       },
       true},
      {"empty slice", {{4, 5}}, [](const Inputs& in) { return slice(in[0], 0, 3, 3); }, true},
      {"unsqueeze", {{3, 4}}, [](const Inputs& in) { return unsqueeze(in[0], 1); }, true},
      {"squeeze", {{3, 1, 4}}, [](const Inputs& in) { return squeeze(in[0], 1); }, true},
      {"concat", {{2, 3, 4}, {2, 5, 4}, {2, 0, 4}}, [](const Inputs& in) { return concat(in, 1); }, false},
      {"concat of views",
       {{3, 3}, {2, 3}},
       [](const Inputs& in) {
         return concat({transpose(in[0], 0, 1), slice(in[1], 0, 1, 2)}, 0);
       },
       false},
  };
}

class CudaShapeOps : public testing::DeviceTest {};

TEST_P(CudaShapeOps, OutputsAndGradientsMatchTheCpuExactly) {
  const Device device = GetParam();
  uint64_t seed = 1;
  for (const ShapeCase& c : shape_cases()) {
    for (DType dtype : {DType::f32, DType::f64}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      Inputs host, on_device;
      for (const Shape& shape : c.inputs) {
        const Tensor values = random_f64(shape, ++seed).to(dtype);
        host.push_back(leaf_on(values, Device::cpu()));
        on_device.push_back(leaf_on(values, device));
      }
      const Tensor expected = c.op(host);
      const Tensor actual = c.op(on_device);
      EXPECT_EQ(actual.device(), device);
      if (c.view) {
        EXPECT_EQ(actual.storage(), on_device[0].storage()) << "a view should not copy";
      }
      expect_identical(actual.to(Device::cpu()), expected);

      const Tensor projection = random_f64(expected.shape(), ++seed).to(dtype);
      expected.backward(projection);
      actual.backward(projection.to(device));
      for (size_t i = 0; i < host.size(); ++i) {
        SCOPED_TRACE("input " + std::to_string(i));
        ASSERT_TRUE(on_device[i].grad().defined());
        EXPECT_EQ(on_device[i].grad().device(), device);
        expect_identical(on_device[i].grad().to(Device::cpu()), host[i].grad());
      }
    }
  }
}

TEST_P(CudaShapeOps, IntegerTensors) {
  const Device device = GetParam();
  std::vector<int64_t> values(60);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i * i) - 700;
  const Tensor host = Tensor::from_vector(values, {3, 4, 5});
  const Tensor gpu = host.to(device);
  auto op = [](const Tensor& t) {
    return concat({reshape(transpose(t, 0, 2), {5, 12}), reshape(permute(slice(t, 1, 1, 4, 2), {2, 0, 1}), {5, -1})},
                  1);  // [5, 12 + 6]
  };
  expect_identical(op(gpu).to(Device::cpu()), op(host));
  const Tensor labels = host.to(DType::i32);
  expect_identical(op(labels.to(device)).to(Device::cpu()), op(labels));
}

TEST_P(CudaShapeOps, GradientsOfSeveralViewsAddUpInOneLeaf) {
  const Device device = GetParam();
  Tensor x = Tensor::zeros({4}, DType::f64, device);
  x.set_requires_grad(true);
  const Tensor y = concat({slice(x, 0, 0, 2), slice(x, 0, 1, 4)}, 0);  // x0, x1, x1, x2, x3
  y.backward(Tensor::ones({5}, DType::f64, device));
  EXPECT_EQ(x.grad().device(), device);
  testing::expect_all_close(x.grad(), std::vector<double>{1, 2, 1, 1}, 0, 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaShapeOps, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep

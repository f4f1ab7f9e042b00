// TensorBatch: named fields with the sample axis first, cut along it; errors name the field.
#include "lockstep/data/tensor_batch.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

std::string construction_error(NamedTensors fields) {
  try {
    TensorBatch batch(std::move(fields));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorBatch, SlicesEveryFieldAlongTheSampleAxis) {
  const TensorBatch batch{{"x", Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2})},
                          {"id", Tensor::from_vector(std::vector<int64_t>{10, 11, 12, 13}, {4})}};
  EXPECT_EQ(batch.size(), 4);
  const TensorBatch part = batch.slice(1, 2);
  EXPECT_EQ(part.size(), 2);
  EXPECT_EQ(part["x"].to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(part["id"].to_vector<int64_t>(), (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(part.fields()[0].first, "x");  // the order is kept
  EXPECT_TRUE(part.contains("id"));
  EXPECT_FALSE(part.contains("y"));
  EXPECT_THROW(batch.slice(3, 2), Error);
}

TEST(TensorBatch, BadFieldsAreErrorsThatNameThem) {
  EXPECT_NE(construction_error({{"x", Tensor::zeros({4, 2})}, {"y", Tensor::zeros({3})}})
                .find("batch field 'y' [3] has 3 samples on its first axis, but 'x' [4, 2] has 4"),
            std::string::npos);
  EXPECT_NE(construction_error({{"x", Tensor::scalar(1)}}).find("'x' is a 0-d tensor"), std::string::npos);
  EXPECT_NE(construction_error({{"x", Tensor::zeros({2})}, {"x", Tensor::zeros({2})}}).find("two fields named 'x'"),
            std::string::npos);
  EXPECT_NE(construction_error({{"", Tensor::zeros({2})}}).find("empty name"), std::string::npos);
}

}  // namespace
}  // namespace lockstep

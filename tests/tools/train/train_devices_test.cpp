#include "tools/train/train_devices.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

void expect_choice(const std::string& text, int gpus, DeviceType type, int count) {
  const DeviceChoice choice = parse_devices(text, gpus);
  EXPECT_EQ(choice.type, type) << "'" << text << "' with " << gpus << " GPUs";
  EXPECT_EQ(choice.count, count) << "'" << text << "' with " << gpus << " GPUs";
}

std::string usage_error(const std::string& text, int gpus) {
  try {
    parse_devices(text, gpus);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "--devices " << text << " with " << gpus << " GPUs was accepted";
  return "";
}

TEST(TrainDevices, DefaultsToEveryGpuElseEveryCore) {
  expect_choice("", 0, DeviceType::cpu, 0);
  expect_choice("", 4, DeviceType::cuda, 0);
  expect_choice("2", 0, DeviceType::cpu, 2);
  expect_choice("2", 8, DeviceType::cuda, 2);
}

TEST(TrainDevices, KindsAndLists) {
  expect_choice("cpu", 8, DeviceType::cpu, 0);
  expect_choice("cuda", 2, DeviceType::cuda, 0);
  expect_choice("cuda:0,cuda:1,cuda:2", 4, DeviceType::cuda, 3);
  expect_choice("cpu:0,cpu:1", 4, DeviceType::cpu, 2);
  expect_choice("cuda:0", 1, DeviceType::cuda, 1);
}

TEST(TrainDevices, BadListsSayWhatWorks) {
  EXPECT_NE(usage_error("cuda:1,cuda:3", 4).find("entry 0 must be cuda:0, not cuda:1"), std::string::npos);
  EXPECT_NE(usage_error("cuda:1,cuda:3", 4).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  EXPECT_NE(usage_error("cuda:0,cpu:1", 4).find("must be cuda:1, not cpu:1"), std::string::npos);
  EXPECT_NE(usage_error("cuda:0,cuda:1", 1).find("cuda:1 does not exist; this process sees cuda:0 to cuda:0"),
            std::string::npos);
  EXPECT_NE(usage_error("3", 2).find("more GPUs than there are: this process sees cuda:0 to cuda:1"),
            std::string::npos);
  EXPECT_NE(usage_error("cuda", 0).find("no GPU is visible"), std::string::npos);
  EXPECT_NE(usage_error("cuda:0", 0).find("no GPU is visible"), std::string::npos);
  EXPECT_NE(usage_error("0", 0).find("is not a count"), std::string::npos);
  EXPECT_NE(usage_error("two", 0).find("is not a count"), std::string::npos);
  EXPECT_NE(usage_error("tpu:0", 0).find("'tpu:0' is not a device"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::tools

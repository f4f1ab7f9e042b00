// The sentence that says which CUDA versions met when no GPU could be used.
#include "lockstep/core/cuda_versions.h"

#include <gtest/gtest.h>

#include "lockstep/core/cuda_device.h"

namespace lockstep::cuda {
namespace {

TEST(CudaVersions, ReadsTheEncodedVersion) {
  EXPECT_EQ(cuda_version_text(12040), "12.4");
  EXPECT_EQ(cuda_version_text(13000), "13.0");
  EXPECT_EQ(cuda_version_text(11080), "11.8");
}

TEST(CudaVersions, NoDriverSaysSo) {
  const std::string text = explain_cuda_versions(0, 13000);
  EXPECT_NE(text.find("no NVIDIA driver is loaded"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA 13.0"), std::string::npos) << text;
}

TEST(CudaVersions, ADriverTooOldNamesBothAndTheFix) {
  const std::string text = explain_cuda_versions(12040, 13000);
  EXPECT_NE(text.find("supports up to CUDA 12.4 and this build's runtime is CUDA 13.0"), std::string::npos) << text;
  EXPECT_NE(text.find("install a driver for CUDA 13.0 or newer"), std::string::npos) << text;
}

TEST(CudaVersions, ANewEnoughDriverIsNotBlamed) {
  const std::string text = explain_cuda_versions(13010, 13000);
  EXPECT_EQ(text.find("install"), std::string::npos) << text;
  EXPECT_NE(text.find("CUDA 13.1"), std::string::npos) << text;
}

// Here, with no GPU, the reason carries the versions (a build with the backend).
TEST(CudaVersions, TheNoGpuReasonCarriesThem) {
  if (!built() || device_count() > 0) GTEST_SKIP() << "needs a CUDA build on a machine without a usable GPU";
  const std::string reason = unavailable_reason();
  EXPECT_NE(reason.find("this build's runtime is CUDA "), std::string::npos) << reason;
}

}  // namespace
}  // namespace lockstep::cuda

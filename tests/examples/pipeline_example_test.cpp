// examples/pipeline.cpp, run as a user runs it: a user's Sequential in a 2-stage pipeline,
// and in 2 replicas of 4 stages, ends with one device's weights.
#include <gtest/gtest.h>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

TEST(PipelineExample, EveryLayoutEndsWithOneDevicesWeights) {
  const std::string binary = std::string(LOCKSTEP_BINARY_DIR) + "/bin/pipeline";
  std::string first;
  for (const std::string layout : {"", " --stages 4 --replicas 2"}) {
    const command_testing::Result result = command_testing::run_shell(binary + layout);
    ASSERT_EQ(result.exit_code, 0) << layout << "\n" << result.output;
    EXPECT_NE(result.output.find("one device's weights: the same bits"), std::string::npos) << result.output;
    const std::string hash = result.output.substr(result.output.rfind("weights_sha256 "));
    if (first.empty()) first = hash;
    EXPECT_EQ(hash, first) << layout;
  }
  EXPECT_EQ(command_testing::run_shell(binary + " --stages").exit_code, 2);
}

}  // namespace
}  // namespace lockstep

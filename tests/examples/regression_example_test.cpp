// examples/regression.cpp, run as a user runs it: a user's two-input model and MSE loss
// under DataParallel end with one weights_sha256 on 1, 2 and 4 CPU devices.
#include <gtest/gtest.h>

#include <regex>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

std::string last_line(const std::string& output) {
  const size_t end = output.find_last_not_of('\n');
  const size_t start = output.rfind('\n', end);
  return output.substr(start == std::string::npos ? 0 : start + 1,
                       end - (start == std::string::npos ? 0 : start + 1) + 1);
}

TEST(RegressionExample, SameWeightsOnOneTwoAndFourDevices) {
  const std::string binary = std::string(LOCKSTEP_BINARY_DIR) + "/bin/regression";
  std::string one;
  for (int devices : {1, 2, 4}) {
    const command_testing::Result result = command_testing::run_shell(binary + " --devices " + std::to_string(devices));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const std::string line = last_line(result.output);
    ASSERT_TRUE(std::regex_match(line, std::regex("weights_sha256 [0-9a-f]{64}"))) << "'" << line << "'";
    if (devices == 1) one = line;
    EXPECT_EQ(line, one) << devices << " devices";
  }
  // It learns: the last epoch's error is far below the targets' variance (about 0.78).
  const std::string output = command_testing::run_shell(binary).output;
  std::smatch match;
  ASSERT_TRUE(std::regex_search(output, match, std::regex("192 steps, mean squared error ([0-9.]+)"))) << output;
  EXPECT_LT(std::stod(match[1]), 0.2) << output;
}

TEST(RegressionExample, ABadFlagIsAUsageError) {
  const command_testing::Result result =
      command_testing::run_shell(std::string(LOCKSTEP_BINARY_DIR) + "/bin/regression --frobnicate");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("usage: regression"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace lockstep

// `lockstep bench` itself: --help lists the benchmarks; an unknown one is a usage error.
#include <gtest/gtest.h>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

using command_testing::Result;
using command_testing::run;

TEST(BenchCommand, HelpListsTheBenchmarks) {
  const Result help = run("bench --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("usage: lockstep bench collectives"), std::string::npos) << help.output;
  const Result unknown = run("bench matmul");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown benchmark 'matmul'"), std::string::npos) << unknown.output;
}

}  // namespace
}  // namespace lockstep

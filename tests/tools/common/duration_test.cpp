#include "tools/common/duration.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

TEST(Duration, SecondsMinutesAndHours) {
  EXPECT_DOUBLE_EQ(parse_duration("every", "90"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("every", "90s"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("every", "10m"), 600);
  EXPECT_DOUBLE_EQ(parse_duration("every", "1.5h"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("every", "0.25"), 0.25);
}

TEST(Duration, AnythingElseIsAUsageErrorNamingTheFlag) {
  for (const char* bad : {"", "m", "10x", "10 m", "-5m", "0", "nan", "inf", "1e400", "5mm"}) {
    try {
      parse_duration("checkpoint-interval", bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--checkpoint-interval"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::tools

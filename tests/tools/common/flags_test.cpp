#include "tools/common/flags.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

struct Parsed {
  std::string name = "x";
  int64_t count = 1;
  uint64_t seed = 0;
  double rate = 0.5;
  bool quiet = false;
};

Flags make_flags(Parsed& p) {
  Flags flags("lockstep demo", "A demo.");
  flags.add("name", &p.name, "a name");
  flags.add("count", &p.count, "a count");
  flags.add("seed", &p.seed, "a seed");
  flags.add("rate", &p.rate, "a rate (default: computed)");
  flags.add_switch("quiet", &p.quiet, "no output");
  return flags;
}

TEST(Flags, ParsesBothFormsAndSwitches) {
  Parsed p;
  Flags flags = make_flags(p);
  ASSERT_TRUE(flags.parse({"--name", "cnn", "--count=-3", "--seed", "7", "--rate=1e-3", "--quiet"}));
  EXPECT_EQ(p.name, "cnn");
  EXPECT_EQ(p.count, -3);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_DOUBLE_EQ(p.rate, 1e-3);
  EXPECT_TRUE(p.quiet);
  EXPECT_TRUE(flags.given("seed"));
  EXPECT_FALSE(Flags(make_flags(p)).given("seed"));
}

TEST(Flags, BadUsageIsAUsageErrorNamingTheFlag) {
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus", "1"}, {"--count", "many"}, {"--count", "3x"}, {"--seed", "-1"},
      {"--quiet=yes"},  {"--count"},         {"stray"},
  };
  for (const auto& args : bad) {
    Parsed p;
    Flags flags = make_flags(p);
    try {
      flags.parse(args);
      ADD_FAILURE() << "accepted " << args[0];
    } catch (const UsageError& e) {
      const std::string flag = args[0].substr(0, args[0].find('='));
      EXPECT_NE(std::string(e.what()).find(flag == "stray" ? "stray" : flag), std::string::npos) << e.what();
    }
  }
}

TEST(Flags, UsageShowsDefaultsUnlessTheHelpExplainsThem) {
  Parsed p;
  const std::string usage = make_flags(p).usage();
  EXPECT_NE(usage.find("a count (default 1)"), std::string::npos) << usage;
  EXPECT_NE(usage.find("a rate (default: computed)\n"), std::string::npos) << usage;
  EXPECT_EQ(usage.rfind("usage: lockstep demo [options]\n", 0), 0u) << usage;
}

}  // namespace
}  // namespace lockstep::tools

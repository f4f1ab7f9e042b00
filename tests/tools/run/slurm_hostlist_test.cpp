// Slurm's host lists, read as Slurm writes them: rank 0's host is the first.
#include "tools/run/slurm_hostlist.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

TEST(SlurmHostlist, TheFirstHostOfEachForm) {
  EXPECT_EQ(first_slurm_host("node01", "L"), "node01");
  EXPECT_EQ(first_slurm_host("a,b,c", "L"), "a");
  EXPECT_EQ(first_slurm_host("node[01-04,07],gpu3", "L"), "node01");
  EXPECT_EQ(first_slurm_host("gpu[7,9-12]", "L"), "gpu7");
  EXPECT_EQ(first_slurm_host("n[5]", "L"), "n5");
  EXPECT_EQ(first_slurm_host("rack1-n[001-010]", "L"), "rack1-n001");
  EXPECT_EQ(first_slurm_host("r[1-2]-n[08-09]", "L"), "r1-n08");
}

TEST(SlurmHostlist, ABrokenListIsAnErrorNamingTheVariable) {
  for (const std::string list : {"", "node[01-04", "[]", ",a"}) {
    try {
      first_slurm_host(list, "SLURM_STEP_NODELIST");
      ADD_FAILURE() << "accepted '" << list << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST='" + list + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::tools

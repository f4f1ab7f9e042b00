#include "lockstep/comm/env_sizes.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"

namespace lockstep::comm {
namespace {

TEST(EnvSizes, DefaultsWhenUnsetAndReadsWholeByteCounts) {
  EXPECT_EQ(shm_staging_bytes(std::nullopt), size_t{4} << 20);
  EXPECT_EQ(shm_staging_bytes("65536"), 65536u);
  EXPECT_EQ(shm_staging_bytes("65600"), 65600u);
  EXPECT_EQ(shm_staging_bytes("65601"), 65600u);  // rounded down to a cache line
  EXPECT_EQ(direct_all_reduce_bytes(std::nullopt, 777), 777u);
  EXPECT_EQ(direct_all_reduce_bytes("0", 777), 0u);
}

TEST(EnvSizes, ABadValueNamesTheVariableAndTheValue) {
  for (const char* bad : {"", "4k", "-1", "100"}) {
    try {
      shm_staging_bytes(std::string(bad));
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("LOCKSTEP_SHM_STAGING_BYTES must be a byte count of at least 4096, got '" +
                                           std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(direct_all_reduce_bytes("-5", 0), Error);
  EXPECT_THROW(direct_all_reduce_bytes("1e6", 0), Error);
}

}  // namespace
}  // namespace lockstep::comm

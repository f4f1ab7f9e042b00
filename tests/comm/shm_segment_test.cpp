// A shared-memory segment another user owns is refused, whoever named it: a stranger
// cannot hand a job a segment of their own to read its gradients or feed it others.
#include "lockstep/comm/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/test_files.h"

namespace lockstep::comm {
namespace {

TEST(ShmSegment, ASegmentOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a segment to another user needs root (CI has it)";
  const std::string name = "/lockstep-test-owner-" + std::to_string(getpid());
  { ShmSegment mine = ShmSegment::create(name, 4096); }
  EXPECT_NO_THROW(ShmSegment::open(name, 4096));
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);  // nobody's
  close(fd);
  testing::expect_error([&] { ShmSegment::open(name, 4096); }, {name, "belongs to user 65534", "refusing"});
  unlink_segment(name);
}

}  // namespace
}  // namespace lockstep::comm

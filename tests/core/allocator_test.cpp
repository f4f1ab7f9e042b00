// Running out of host memory is an Error that says how much was asked, how much tensors
// hold and what the host has, not an abort; the cache's blocks are given back before it
// gives up. In a child process under an address-space limit, so the test process keeps its
// memory.
#include "lockstep/core/allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "lockstep/core/error.h"
#include "lockstep/core/tensor.h"

namespace lockstep {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

TEST(HostAllocator, OutOfMemoryIsAnErrorThatSaysHowMuch) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers reserve address space of their own; the release build runs it";
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    rlimit limit{.rlim_cur = rlim_t{2} << 30, .rlim_max = rlim_t{2} << 30};
    setrlimit(RLIMIT_AS, &limit);
    std::string message = "no error";
    try {
      // A cached block first, then more than the limit allows.
      { const Tensor small = Tensor::empty({1 << 20}, DType::f32); }
      const Tensor huge = Tensor::empty({int64_t{1} << 31}, DType::f32);  // 8 GiB
    } catch (const Error& e) {
      message = e.what();
    }
    (void)!write(pipe_fds[1], message.data(), message.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string message;
  char buffer[1024];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) message.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit: it aborted";
  EXPECT_NE(message.find("out of host memory: 8192.0 MiB asked"), std::string::npos) << message;
  EXPECT_NE(message.find("of cached blocks given back first"), std::string::npos) << message;
  EXPECT_NE(message.find("available"), std::string::npos) << message;
}

}  // namespace
}  // namespace lockstep

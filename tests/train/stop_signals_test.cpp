// The stop signals: the first of SIGTERM, SIGINT, SIGUSR1 is recorded (the process goes on
// to its step boundary), a second one ends the process by its default action at once, and
// the previous handlers come back afterwards. Each case runs in a child process: signals
// are the process's.
#include "lockstep/train/stop_signals.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace lockstep::train {
namespace {

// Runs body in a child; its wait status.
template <typename Body>
int in_child(Body body) {
  const pid_t child = fork();
  if (child == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return status;
}

TEST(StopSignals, TheFirstSignalIsRecordedAndTheSecondEndsTheProcess) {
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) {
    const int recorded = in_child([signal] {
      StopSignals signals;
      std::raise(signal);
      _exit(signals.received() == signal ? 42 : 1);
    });
    ASSERT_TRUE(WIFEXITED(recorded)) << stop_signal_name(signal);
    EXPECT_EQ(WEXITSTATUS(recorded), 42) << stop_signal_name(signal);

    const int twice = in_child([signal] {
      StopSignals signals;
      std::raise(signal);
      std::raise(signal);
      _exit(1);  // not reached
    });
    ASSERT_TRUE(WIFSIGNALED(twice)) << stop_signal_name(signal);
    EXPECT_EQ(WTERMSIG(twice), signal);
  }
}

bool g_previous_ran = false;
void previous_handler(int) { g_previous_ran = true; }

TEST(StopSignals, ThePreviousHandlersComeBack) {
  const int status = in_child([] {
    std::signal(SIGUSR1, previous_handler);
    { StopSignals signals; }
    std::raise(SIGUSR1);
    _exit(g_previous_ran ? 42 : 1);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
  EXPECT_STREQ(stop_signal_name(SIGUSR1), "SIGUSR1");
}

}  // namespace
}  // namespace lockstep::train

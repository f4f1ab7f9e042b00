// `lockstep top` in a real terminal (tmux): the full-screen view shows the devices, q quits,
// and the terminal is given back (main screen, visible cursor, canonical echoing input).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

using namespace command_testing;

// One tmux server per test (its own -L socket), killed whatever the test's outcome.
class Tmux {
 public:
  explicit Tmux(const std::string& name) : socket_("lockstep-top-" + std::to_string(getpid()) + "-" + name) {}
  ~Tmux() { run_shell("tmux -L " + socket_ + " kill-server"); }

  // Empty when tmux started the session, else what tmux said.
  std::string start(const std::string& shell_command) {
    const Result r =
        run_shell("tmux -L " + socket_ + " -f /dev/null new-session -d -x 120 -y 40 '" + shell_command + "'");
    return r.exit_code == 0 ? "" : "tmux failed (" + std::to_string(r.exit_code) + "): " + r.output;
  }
  std::string screen() const { return run_shell("tmux -L " + socket_ + " capture-pane -p").output; }
  std::string pane(const std::string& format) const {
    return run_shell("tmux -L " + socket_ + " display-message -p '" + format + "'").output;
  }
  void keys(const std::string& keys) const { run_shell("tmux -L " + socket_ + " send-keys " + keys); }
  // Polls the screen until `done` holds or about ten seconds pass; the last screen.
  std::string wait_for(const std::function<bool(const std::string&)>& done) const {
    std::string last;
    for (int i = 0; i < 100; ++i) {
      last = screen();
      if (done(last)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return last;
  }

 private:
  std::string socket_;
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// After top: its exit code and what stty says of the two flags raw mode turns off.
const std::string kAfter =
    "; echo top-exited-$?; stty -a | tr \" ;\" \"\\n\\n\" | grep -E \"^-?(icanon|echo)$\" | tr \"\\n\" \" \"; "
    "echo stty-done; sleep 60";

void drive(const std::string& name, const std::string& env, const std::string& row) {
  if (access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  Tmux tmux(name);
  ASSERT_EQ("", tmux.start("trap : INT; env TERM=xterm-256color " + env + " " + kBinary + " top -l 0.2" + kAfter));
  const std::string view = tmux.wait_for([&](const std::string& s) { return has(s, row); });
  ASSERT_TRUE(has(view, row)) << view;
  EXPECT_TRUE(has(view, "lockstep top")) << view;
  EXPECT_TRUE(has(view, "(q quits)")) << view;
  EXPECT_EQ(tmux.pane("#{alternate_on}"), "1\n") << "the view is not on the alternate screen";
  EXPECT_EQ(tmux.pane("#{cursor_flag}"), "0\n") << "the cursor shows during the view";
  // History accumulates: a sparkline block appears within a few samples.
  const std::string later =
      tmux.wait_for([](const std::string& s) { return has(s, "▁") || has(s, "█") || has(s, "▂") || has(s, "▅"); });
  EXPECT_TRUE(has(later, "▁") || has(later, "█") || has(later, "▂") || has(later, "▅")) << later;

  tmux.keys("q");
  const std::string after = tmux.wait_for([](const std::string& s) { return has(s, "stty-done"); });
  EXPECT_TRUE(has(after, "top-exited-0")) << after;
  EXPECT_TRUE(has(after, "icanon echo")) << "terminal modes not restored:\n" << after;
  EXPECT_FALSE(has(after, row)) << "the view was left on the main screen:\n" << after;
  EXPECT_EQ(tmux.pane("#{alternate_on}"), "0\n");
  EXPECT_EQ(tmux.pane("#{cursor_flag}"), "1\n");
}

TEST(TopTerminal, CpuViewDrawsCoresAndQuitsOnQ) {
  drive("cpu", "LOCKSTEP_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1", "cpu0 ");
}

#if defined(LOCKSTEP_NVML_STANDIN)
TEST(TopTerminal, GpuViewDrawsEveryA100AndQuitsOnQ) {
  drive("a100",
        std::string("LOCKSTEP_NVML_LIBRARY=") + LOCKSTEP_NVML_STANDIN +
            " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/a100-8x-nvlink.json",
        "  7    ");
}
#endif

TEST(TopTerminal, CtrlCAlsoRestoresTheTerminal) {
  if (access("/usr/bin/tmux", X_OK) != 0) GTEST_SKIP() << "tmux is not installed";
  Tmux tmux("ctrlc");
  ASSERT_EQ("", tmux.start("trap : INT; env TERM=xterm-256color LOCKSTEP_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 " +
                           kBinary + " top -l 0.2" + kAfter));
  const std::string view = tmux.wait_for([](const std::string& s) { return has(s, "cpu0 "); });
  ASSERT_TRUE(has(view, "cpu0 ")) << view;
  tmux.keys("C-c");
  const std::string after = tmux.wait_for([](const std::string& s) { return has(s, "stty-done"); });
  EXPECT_TRUE(has(after, "top-exited-0")) << after;
  EXPECT_TRUE(has(after, "icanon echo")) << after;
  EXPECT_EQ(tmux.pane("#{alternate_on}"), "0\n");
}

}  // namespace
}  // namespace lockstep

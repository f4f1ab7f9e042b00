#include "lockstep/obs/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace lockstep {
namespace {

TEST(ProgressBar, FormatsDurations) {
  EXPECT_EQ(ProgressBar::format_duration(0), "0:00");
  EXPECT_EQ(ProgressBar::format_duration(62.4), "1:02");
  EXPECT_EQ(ProgressBar::format_duration(3723), "1:02:03");
  EXPECT_EQ(ProgressBar::format_duration(-1), "?");
}

// Not a terminal: plain lines, the first and the last step always written.
TEST(ProgressBar, WritesPlainLinesWhenNotATerminal) {
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBar bar(3, /*quiet=*/false, file);
  bar.update(1, 0, 2.5, 100);
  bar.update(2, 0, 2.0, 100);  // within the plain-line interval: skipped
  bar.update(3, 0, 1.5, 100);
  bar.finish();
  std::rewind(file);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), file));
  std::fclose(file);
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_NE(text.find("train 1/3"), std::string::npos) << text;
  EXPECT_EQ(text.find("train 2/3"), std::string::npos) << text;
  EXPECT_NE(text.find("train 3/3  epoch 0  100 samples/s  loss 1.5000"), std::string::npos) << text;
}

TEST(ProgressBar, QuietWritesNothing) {
  FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBar bar(2, /*quiet=*/true, file);
  bar.update(1, 0, 1.0, 10);
  bar.update(2, 0, 1.0, 10);
  bar.finish();
  EXPECT_EQ(std::ftell(file), 0);
  std::fclose(file);
}

// What a terminal of type `term` receives from a bar that draws two steps on it.
std::string drawn_on_terminal(const char* term) {
  int master = -1, slave = -1;
  if (openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) return "openpty failed";
  const char* old = std::getenv("TERM");
  const std::string saved = old ? old : "";
  setenv("TERM", term, 1);
  FILE* out = fdopen(slave, "w");
  {
    ProgressBar bar(2, /*quiet=*/false, out);
    bar.update(1, 0, 2.0, 100);
    bar.update(2, 0, 1.0, 100);  // the last step is always drawn
    bar.finish();
  }
  std::fclose(out);
  old ? setenv("TERM", saved.c_str(), 1) : unsetenv("TERM");
  fcntl(master, F_SETFL, O_NONBLOCK);
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(master, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  close(master);
  return text;
}

TEST(ProgressBar, ADumbTerminalGetsNoEscapeSequences) {
  const std::string dumb = drawn_on_terminal("dumb");
  EXPECT_EQ(dumb.find('\033'), std::string::npos) << dumb;
  EXPECT_NE(dumb.find("\r[="), std::string::npos) << dumb;  // redrawn in place with \r
  EXPECT_NE(dumb.find("2/2"), std::string::npos) << dumb;
  const std::string xterm = drawn_on_terminal("xterm");
  EXPECT_NE(xterm.find("\r\033[K"), std::string::npos) << xterm;
}

}  // namespace
}  // namespace lockstep

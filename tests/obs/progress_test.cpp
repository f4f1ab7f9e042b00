#include "lockstep/obs/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
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

}  // namespace
}  // namespace lockstep

#include "tools/train/printable_text.h"

#include <gtest/gtest.h>

namespace lockstep::tools {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(PrintableText, KeepsTextNewlinesAndTabs) {
  EXPECT_EQ(printable_text("a fortune\n\twith caf\xC3\xA9"), "a fortune\n\twith caf\xC3\xA9");
}

TEST(PrintableText, ReplacesControlBytesAndBrokenUtf8) {
  EXPECT_EQ(printable_text("\x1b[2J"), kReplacement + "[2J");  // ESC: clear screen
  EXPECT_EQ(printable_text("a\rb\x07\x7f"), "a" + kReplacement + "b" + kReplacement + kReplacement);
  EXPECT_EQ(printable_text("\xC2\x9B"
                           "31m"),
            kReplacement + "31m");                         // C1 CSI
  EXPECT_EQ(printable_text("x\xC3"), "x" + kReplacement);  // a cut-off character
}

}  // namespace
}  // namespace lockstep::tools

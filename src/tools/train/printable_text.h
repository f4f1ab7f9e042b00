// Bytes a model wrote, made safe to print and to store in JSON: broken UTF-8 sequences and
// control characters (C0 but newline and tab, DEL, C1) become U+FFFD, so a sample cannot
// move the cursor, clear the screen or retitle the user's terminal.
#pragma once

#include <string>

namespace lockstep::tools {

std::string printable_text(const std::string& bytes);

}  // namespace lockstep::tools

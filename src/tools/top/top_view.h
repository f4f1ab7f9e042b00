// `lockstep top`'s full-screen view: the screen for one sample as lines (device rows with
// history sparklines under each, processes, alerts), cut to the terminal's size, and the
// bytes that draw it over the previous frame without clearing it first (no flicker).
#pragma once

#include <string>
#include <vector>

#include "tools/top/top_history.h"
#include "tools/top/top_sample.h"

namespace lockstep::tools {

// A line cut to `columns` display columns (UTF-8 aware: a sparkline block is one column).
std::string fit_columns(const std::string& line, size_t columns);

std::vector<std::string> screen_lines(const TopSample& sample, const History& history, size_t columns, size_t rows);

// Cursor home, each line followed by erase-to-end-of-line, then erase below: every cell is
// overwritten in place, so the terminal never shows an empty screen between frames.
std::string frame_bytes(const std::vector<std::string>& lines);

}  // namespace lockstep::tools

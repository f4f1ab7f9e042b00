// `lockstep top --log FILE`: every sample of every device appended to FILE, as CSV (one row
// per device per sample, the header written once, when the file is new or empty) or as JSON
// lines (one object per sample, as --json prints it). The extension picks the format.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "tools/top/top_sample.h"

namespace lockstep::tools {

enum class LogFormat { kCsv, kJsonl };
// By extension: ".csv" or ".jsonl"; any other is a UsageError.
LogFormat log_format_for(const std::string& path);

std::string csv_header();
// GPUs: one row per GPU ("gpu0", ...). CPU view: a row "cpu" with the host's memory and the
// mean utilization, then one per core ("cpu0", ...). Each row lists the kinds of the alerts
// that name its device; alerts are also kept whole in the JSON lines log.
std::vector<std::string> csv_rows(const TopSample& sample);
// A CSV field, quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text);

class TopLog {
 public:
  TopLog(const std::string& path, LogFormat format);
  ~TopLog();
  TopLog(const TopLog&) = delete;
  TopLog& operator=(const TopLog&) = delete;

  void write(const TopSample& sample);  // flushed, so a reader (tail -f) sees each sample

 private:
  std::string path_;
  LogFormat format_;
  std::FILE* file_ = nullptr;
};

}  // namespace lockstep::tools

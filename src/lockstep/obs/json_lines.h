// Metrics as JSON lines: one object per line, flushed as written, so a crashed or running
// job's metrics.jsonl is readable with `tail -f` or pandas.read_json(lines=True).
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace lockstep {

class JsonLinesWriter {
 public:
  // Truncates, or with `append` adds to what is there (a resumed run's metrics); an Error
  // names the path if it cannot.
  explicit JsonLinesWriter(const std::string& path, bool append = false);
  ~JsonLinesWriter();
  JsonLinesWriter(const JsonLinesWriter&) = delete;
  JsonLinesWriter& operator=(const JsonLinesWriter&) = delete;
  void write(const nlohmann::json& object);

 private:
  std::string path_;
  FILE* file_;
};

// Writes a JSON document atomically (temporary file, then rename), pretty-printed.
void write_json_file(const std::string& path, const nlohmann::json& document);

}  // namespace lockstep

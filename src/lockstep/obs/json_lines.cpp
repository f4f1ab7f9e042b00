#include "lockstep/obs/json_lines.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep {

JsonLinesWriter::JsonLinesWriter(const std::string& path, bool append)
    : path_(path), file_(std::fopen(path.c_str(), append ? "a" : "w")) {
  LOCKSTEP_CHECK(file_ != nullptr) << "cannot write " << path << ": " << std::strerror(errno);
}

JsonLinesWriter::~JsonLinesWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonLinesWriter::write(const nlohmann::json& object) {
  const std::string line = object.dump() + "\n";
  LOCKSTEP_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0)
      << "cannot write " << path_ << ": " << std::strerror(errno);
}

void write_json_file(const std::string& path, const nlohmann::json& document) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  FILE* file = std::fopen(temporary.c_str(), "w");
  LOCKSTEP_CHECK(file != nullptr) << "cannot write " << temporary << ": " << std::strerror(errno);
  const std::string text = document.dump(2) + "\n";
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    LOCKSTEP_FAIL() << "cannot write " << path << ": " << std::strerror(error);
  }
}

}  // namespace lockstep

#include "lockstep/data/text_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <system_error>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

constexpr const char* kHowToGetText = "install the fortunes package: apt-get install fortunes, or pass --data FILE";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Records of a text separated by lines holding only "%"; a record keeps its lines' newlines.
// Empty records (a leading "%", two separators in a row) are dropped.
std::vector<std::string> split_records(const std::string& text) {
  std::vector<std::string> records;
  std::string record;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string_view line(text.data() + pos, end - pos);
    if (line == "%\n" || line == "%") {
      if (!record.empty()) records.push_back(std::move(record));
      record.clear();
    } else {
      record.append(line);
    }
    pos = end;
  }
  if (!record.empty()) records.push_back(std::move(record));
  return records;
}

void append_record(std::string& out, const std::string& record) {
  out += record;
  if (!ends_with(record, "\n")) out += '\n';
  out += "%\n";
}

}  // namespace

std::vector<std::string> fortune_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LOCKSTEP_CHECK(fs::is_directory(dir, ec))
      << "the fortunes directory '" << dir << "' does not exist; " << kHowToGetText;
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    // symlink_status: the .u8 names are links to files already listed.
    if (!fs::is_regular_file(entry.symlink_status())) continue;
    const std::string path = entry.path().string();
    if (!ends_with(path, ".dat")) files.push_back(path);
  }
  LOCKSTEP_CHECK(!ec) << "cannot list the fortunes directory '" << dir << "': " << ec.message();
  LOCKSTEP_CHECK(!files.empty()) << "the fortunes directory '" << dir << "' holds no fortune files; " << kHowToGetText;
  // Directory order differs between file systems; name order keeps the text, and so the split
  // and every window, the same on every machine.
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  LOCKSTEP_CHECK(std::filesystem::is_regular_file(path, ec))
      << "text file not found: '" << path << "'; " << kHowToGetText << " naming a file that exists";
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in.good()) << "cannot open the text file '" << path << "' (check its permissions)";
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LOCKSTEP_CHECK(!in.bad()) << "reading the text file '" << path << "' failed";
  return bytes;
}

TextSplits split_text(const std::string& text) {
  TextSplits splits;
  const std::vector<std::string> records = split_records(text);
  if (static_cast<int64_t>(records.size()) < kValidationEvery) {
    const size_t cut = text.size() - text.size() / static_cast<size_t>(kValidationEvery);
    splits.train = text.substr(0, cut);
    splits.validation = text.substr(cut);
    return splits;
  }
  for (size_t i = 0; i < records.size(); ++i) {
    const bool validation = (i + 1) % static_cast<size_t>(kValidationEvery) == 0;
    append_record(validation ? splits.validation : splits.train, records[i]);
  }
  return splits;
}

TextSplits load_text(const std::string& data_path) {
  if (!data_path.empty()) return split_text(read_text_file(data_path));
  std::string text;
  for (const std::string& file : fortune_files()) {
    text += read_text_file(file);
    // A file whose last fortune lacks its separator must not run into the next file's first.
    if (!text.empty() && !ends_with(text, "%\n")) text += ends_with(text, "\n") ? "%\n" : "\n%\n";
  }
  return split_text(text);
}

int64_t text_window_count(int64_t bytes, int64_t context) {
  LOCKSTEP_CHECK(context > 0) << "the context length must be positive, got " << context;
  LOCKSTEP_CHECK(bytes >= context + 1) << "a text of " << bytes << " bytes is too short for a context of " << context
                                       << ": one sample needs " << context + 1
                                       << " bytes; use a shorter --context or a longer text";
  return (bytes - 1) / context;
}

TensorDataset text_windows(const std::string& text, int64_t context) {
  const int64_t n = text_window_count(static_cast<int64_t>(text.size()), context);
  // Only the bytes the windows reach: [0, n*T + 1).
  const int64_t used = n * context + 1;
  Tensor bytes = Tensor::empty({used}, DType::i64);
  int64_t* out = bytes.data<int64_t>();
  for (int64_t i = 0; i < used; ++i) out[i] = static_cast<unsigned char>(text[static_cast<size_t>(i)]);
  return TensorDataset{{kTokensField, bytes.as_strided({n, context}, {context, 1}, 0)},
                       {kTargetsField, bytes.as_strided({n, context}, {context, 1}, 1)}};
}

}  // namespace lockstep

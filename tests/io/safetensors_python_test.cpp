// Our safetensors files against the reference Python package (pip's `safetensors`, run by
// Debian's /usr/bin/python3 with numpy): each side builds the same tensors from the formulas
// below, mirrored in safetensors_python.py, and checks what the other side wrote.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/test_files.h"
#include "lockstep/io/safetensors.h"

namespace lockstep {
namespace {

const char* const kPython = "/usr/bin/python3";
const std::string kScript = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/io/safetensors_python.py";
const Metadata kMetadata = {{"step", "1200"}, {"note", "lockstep \u2192 python"}};

// Runs the helper script on (mode, file) pairs; returns its exit status and output lines.
std::pair<int, std::vector<std::string>> run_script(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string command = std::string(kPython) + " " + kScript;
  for (const auto& [mode, file] : pairs) command += " " + mode + " '" + file + "'";
  command += " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, {"popen failed"}};
  std::vector<std::string> lines;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe) != nullptr) {
    std::string line = buffer.data();
    if (!line.empty() && line.back() == '\n') line.pop_back();
    lines.push_back(line);
  }
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, lines};
}

Tensor from_formula(DType dtype, const Shape& shape, double (*value)(int64_t)) {
  const Tensor values = Tensor::empty(shape, DType::f64);
  for (int64_t i = 0; i < values.numel(); ++i) values.data<double>()[i] = value(i);
  const Tensor out = Tensor::empty(shape, dtype);
  out.copy_from(values);
  return out;
}

NamedTensors expected_tensors() {
  return {
      {"f32", from_formula(DType::f32, {2, 3}, [](int64_t i) { return (i - 3) * 0.25; })},
      {"f64", from_formula(DType::f64, {4}, [](int64_t i) { return (i - 3) / 3.0; })},
      {"f16", from_formula(DType::f16, {3, 2}, [](int64_t i) { return (i - 3) * 0.5; })},
      {"bf16", from_formula(DType::bf16, {5}, [](int64_t i) { return (i - 3) * 0.5; })},
      {"i32", from_formula(DType::i32, {2, 2}, [](int64_t i) { return (i - 3) * 100000.0; })},
      {"i64", from_formula(DType::i64, {3}, [](int64_t i) { return (i - 3) * 1e12; })},
      {"u8", from_formula(DType::u8, {7}, [](int64_t i) { return static_cast<double>((i * 37) % 256); })},
      {"scalar", Tensor::scalar(-1.5)},
      {"empty", Tensor::empty({0, 4})},
  };
}

// Python checks a file of ours (and, so the check is known to bite, one with a changed
// element) and writes one that we read back.
TEST(SafetensorsPython, RoundTripWithThePythonPackage) {
  testing::TempDir dir;
  const std::string ours = dir.file("ours.safetensors");
  const std::string wrong = dir.file("wrong.safetensors");
  const std::string theirs = dir.file("python.safetensors");
  save_safetensors(ours, expected_tensors(), kMetadata);
  NamedTensors changed = expected_tensors();
  changed[4].second.data<int32_t>()[1] += 1;
  save_safetensors(wrong, changed, kMetadata);

  const auto [status, lines] = run_script({{"check", ours}, {"check", wrong}, {"write", theirs}});
  if (status == 3 || status == 127) {
    GTEST_SKIP() << kPython << " cannot run the check (" << (lines.empty() ? "" : lines[0])
                 << "); run scripts/install-deps, which pip-installs safetensors, to enable it";
  }
  ASSERT_EQ(status, 0);
  ASSERT_EQ(lines.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "ok") << "Python rejects our file";
  EXPECT_NE(lines[1].find("FAIL: Mismatch: i32"), std::string::npos) << lines[1];
  ASSERT_EQ(lines[2], "ok") << "Python could not write its file";

  const TensorFile file = load_safetensors(theirs);
  EXPECT_EQ(file.metadata, kMetadata);
  const NamedTensors expected = expected_tensors();
  EXPECT_EQ(file.tensors.size(), expected.size());
  for (const auto& [name, want] : expected) {
    ASSERT_TRUE(file.contains(name)) << name;
    const Tensor& got = file.at(name);
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>()) << name;
  }
}

}  // namespace
}  // namespace lockstep

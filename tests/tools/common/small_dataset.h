// Small datasets for tests that run `lockstep train`: a Fashion-MNIST look-alike for the image
// models and a text for the GPT. Reading and evaluating the real 70,000 images (or the
// fortunes' validation split) takes several seconds per process under the sanitizers, and a
// test that starts a job of four ranks five times pays it twenty times.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/core/philox.h"

namespace lockstep::command_testing {

inline void write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(file);
}

inline std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// `n` images and labels as `prefix`-images-idx3-ubyte.gz and `prefix`-labels-idx1-ubyte.gz:
// class c images are bright in row band c, so a model can learn it in a few steps.
inline void write_dataset(const std::filesystem::path& dir, const std::string& prefix, uint32_t n, uint64_t seed) {
  std::filesystem::create_directories(dir);
  std::string images = std::string("\0\0\x08\x03", 4) + be32(n) + be32(28) + be32(28);
  std::string labels = std::string("\0\0\x08\x01", 4) + be32(n);
  Philox rng(seed, 1);
  for (uint32_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(rng.next_below(10));
    labels.push_back(static_cast<char>(label));
    for (int p = 0; p < 28 * 28; ++p) {
      const bool band = p / 28 / 3 == label;
      images.push_back(static_cast<char>(band ? 200 + rng.next_below(56) : rng.next_below(40)));
    }
  }
  write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), images);
  write_gz(dir / (prefix + "-labels-idx1-ubyte.gz"), labels);
}

// The training and test sets `lockstep train --data dir` reads: 256 and 100 images.
inline void write_small_fashion_mnist(const std::filesystem::path& dir) {
  write_dataset(dir, "train", 256, 1);
  write_dataset(dir, "t10k", 100, 2);
}

// `records` short records in the fortunes' format (text, then a line "%"), twelve words of a
// ten-word vocabulary each; `lockstep train --model gpt` keeps every tenth for validation.
inline void write_small_text(const std::filesystem::path& path, int records) {
  std::ofstream out(path);
  const char* words[] = {"lock", "step", "tree", "sum", "bits", "device", "batch", "the", "same", "on"};
  for (int record = 0; record < records; ++record) {
    for (int w = 0; w < 12; ++w) out << words[(record * 7 + w * 3) % 10] << (w % 5 == 4 ? ".\n" : " ");
    out << "\n%\n";
  }
}

}  // namespace lockstep::command_testing

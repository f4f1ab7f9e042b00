#include "lockstep/data/text_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "io/test_files.h"
#include "lockstep/data/dataloader.h"

namespace lockstep {
namespace {

using testing::expect_error;
using testing::TempDir;

void write_text(const std::string& path, const std::string& text) {
  testing::write_bytes(path, testing::Bytes(text.begin(), text.end()));
}

// Every byte value 0..255 (NUL, "%", newlines and bytes past 127 included), then more.
std::string all_bytes(size_t size) {
  std::string text;
  for (size_t i = 0; i < size; ++i) text += static_cast<char>((i * 7 + 3) % 256);
  return text;
}

// Records "fortune 0", "fortune 1", ... each on one line, separated as the fortune files are.
std::string fortunes_text(int count) {
  std::string text;
  for (int i = 0; i < count; ++i) text += "fortune " + std::to_string(i) + "\n%\n";
  return text;
}

std::vector<int64_t> row(const Tensor& t, int64_t i) {
  const std::vector<int64_t> all = t.to_vector<int64_t>();
  const auto width = static_cast<size_t>(t.size(1));
  return {all.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * width),
          all.begin() + static_cast<ptrdiff_t>((static_cast<size_t>(i) + 1) * width)};
}

TEST(TextDataset, BytesRoundTripThroughAFile) {
  TempDir dir;
  const std::string text = all_bytes(1000);
  write_text(dir.file("corpus.bin"), text);
  EXPECT_EQ(read_text_file(dir.file("corpus.bin")), text);
}

TEST(TextDataset, WindowsHoldTheBytesAndTargetsAreTokensShiftedByOne) {
  const std::string text = all_bytes(301);
  const int64_t context = 16;
  const TensorDataset d = text_windows(text, context);
  ASSERT_EQ(d.size(), 300 / 16);
  ASSERT_EQ(d[kTokensField].shape(), (Shape{18, 16}));
  ASSERT_EQ(d[kTargetsField].shape(), (Shape{18, 16}));
  EXPECT_EQ(d[kTokensField].dtype(), DType::i64);
  EXPECT_EQ(d[kTargetsField].dtype(), DType::i64);
  for (int64_t i = 0; i < d.size(); ++i) {
    const std::vector<int64_t> tokens = row(d[kTokensField], i), targets = row(d[kTargetsField], i);
    for (int64_t t = 0; t < context; ++t) {
      const auto at = static_cast<size_t>(i * context + t);
      ASSERT_EQ(tokens[static_cast<size_t>(t)], static_cast<unsigned char>(text[at])) << i << "," << t;
      ASSERT_EQ(targets[static_cast<size_t>(t)], static_cast<unsigned char>(text[at + 1])) << i << "," << t;
      ASSERT_LT(tokens[static_cast<size_t>(t)], kByteVocabulary);
    }
  }
}

TEST(TextDataset, SampleCountIsBytesMinusOneOverContext) {
  EXPECT_EQ(text_window_count(9, 8), 1);   // exactly context + 1 bytes: one sample
  EXPECT_EQ(text_window_count(16, 8), 1);  // 15 targets: one full window, 7 left over
  EXPECT_EQ(text_window_count(17, 8), 2);
  EXPECT_EQ(text_window_count(1001, 10), 100);
  EXPECT_EQ(text_window_count(1000, 10), 99);
  for (int64_t bytes = 2; bytes < 60; ++bytes)
    for (int64_t context = 1; context < bytes; ++context) {
      // The naive count: windows i whose last target byte i*T + T lies inside the text.
      int64_t windows = 0;
      while (windows * context + context < bytes) ++windows;
      ASSERT_EQ(text_window_count(bytes, context), windows) << bytes << " bytes, context " << context;
      ASSERT_EQ(text_windows(all_bytes(static_cast<size_t>(bytes)), context).size(), windows);
    }
}

TEST(TextDataset, ShortTextAndContextTooLargeAreErrors) {
  expect_error([] { text_windows("12345678", 8); }, {"8 bytes", "context of 8", "9 bytes", "--context"});
  expect_error([] { text_windows("", 4); }, {"0 bytes", "too short"});
  expect_error([] { text_window_count(100, 0); }, {"context", "positive", "0"});
}

TEST(TextDataset, MissingFileErrorNamesThePathAndTheFix) {
  TempDir dir;
  const std::string missing = dir.file("no-such-corpus.txt");
  expect_error([&] { read_text_file(missing); }, {missing, "apt-get install fortunes", "--data FILE"});
  expect_error([&] { load_text(missing); }, {missing, "apt-get install fortunes"});
  expect_error([&] { fortune_files(dir.file("no-fortunes")); },
               {dir.file("no-fortunes"), "apt-get install fortunes", "--data FILE"});
  expect_error([&] { fortune_files(dir.path()); }, {dir.path(), "no fortune files", "apt-get install fortunes"});
}

TEST(TextDataset, FortuneFilesSkipIndexesLinksAndSubdirectories) {
  TempDir dir;
  write_text(dir.file("zippy"), "z\n%\n");
  write_text(dir.file("art"), "a\n%\n");
  write_text(dir.file("art.dat"), "index");
  std::filesystem::create_symlink("art", dir.file("art.u8"));
  std::filesystem::create_directory(dir.file("off"));
  write_text(dir.file("off/art"), "offensive\n%\n");
  EXPECT_EQ(fortune_files(dir.path()), (std::vector<std::string>{dir.file("art"), dir.file("zippy")}));
}

TEST(TextDataset, EveryTenthFortuneIsValidationAndTheSplitIsDisjointAndCovering) {
  const TextSplits s = split_text(fortunes_text(35));
  std::string train, validation;
  for (int i = 0; i < 35; ++i) ((i + 1) % 10 == 0 ? validation : train) += "fortune " + std::to_string(i) + "\n%\n";
  EXPECT_EQ(s.train, train);
  EXPECT_EQ(s.validation, validation);
  EXPECT_EQ(s.validation, "fortune 9\n%\nfortune 19\n%\nfortune 29\n%\n");

  // A last record without its separator, or without a final newline, gets both back.
  const TextSplits t = split_text(fortunes_text(19) + "last\nlines");
  EXPECT_EQ(t.validation, "fortune 9\n%\nlast\nlines\n%\n");
}

TEST(TextDataset, PlainTextGivesItsLastTenthToValidation) {
  const std::string text = all_bytes(1005);  // holds "%" bytes, but no line that is only "%"
  const TextSplits s = split_text(text);
  EXPECT_EQ(s.validation.size(), 100u);
  EXPECT_EQ(s.train + s.validation, text);
}

TEST(TextDataset, TrainingWindowsNeverReadValidationText) {
  // Records unique by content, so a validation record inside a training window would show.
  const TextSplits s = split_text(fortunes_text(200));
  const TensorDataset train = text_windows(s.train, 8);
  std::string seen;
  for (int64_t i = 0; i < train.size(); ++i)
    for (int64_t b : row(train[kTargetsField], i)) seen += static_cast<char>(b);
  for (int i = 9; i < 200; i += 10) EXPECT_EQ(seen.find("fortune " + std::to_string(i) + "\n"), std::string::npos) << i;
  EXPECT_NE(seen.find("fortune 8\n"), std::string::npos);
}

TEST(TextDataset, LoaderOrderIsTheImageLoadersPermutationPerSeedAndEpoch) {
  const TensorDataset windows = text_windows(all_bytes(4001), 10);  // 400 samples
  DataLoader loader(windows, {.batch_size = 32, .shuffle = true, .seed = 7, .drop_last = false});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    int64_t expected_first = 0;
    while (auto batch = loader.next()) {
      EXPECT_EQ(batch->epoch, epoch);
      EXPECT_EQ(batch->first_position, expected_first);
      expected_first += batch->size();
      ASSERT_EQ(batch->samples[kTokensField].shape(), (Shape{batch->size(), 10}));
      ASSERT_EQ(batch->samples[kTargetsField].shape(), (Shape{batch->size(), 10}));
      // Each batch row is the window its global index names, targets shifted by one.
      for (int64_t r = 0; r < batch->size(); ++r) {
        const int64_t sample = batch->indices[static_cast<size_t>(r)];
        EXPECT_EQ(row(batch->samples[kTokensField], r), row(windows[kTokensField], sample));
        EXPECT_EQ(row(batch->samples[kTargetsField], r)[0], row(batch->samples[kTokensField], r)[1]);
        EXPECT_EQ(row(batch->samples[kTargetsField], r), row(windows[kTargetsField], sample));
      }
      seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
    }
    EXPECT_EQ(seen, epoch_order(400, 7, epoch)) << "epoch " << epoch;
  }
  EXPECT_NE(epoch_order(400, 7, 0), epoch_order(400, 7, 1));
}

TEST(TextDataset, ValidationIsReadInOrder) {
  const std::string text = all_bytes(1001);
  DataLoader loader(text_windows(text, 10), {.batch_size = 30, .shuffle = false, .seed = 0, .drop_last = false});
  std::string read;
  int64_t next_index = 0;
  while (auto batch = loader.next()) {
    for (int64_t i : batch->indices) EXPECT_EQ(i, next_index++);
    for (int64_t b : batch->samples[kTokensField].to_vector<int64_t>()) read += static_cast<char>(b);
    const std::vector<int64_t> tokens = batch->samples[kTokensField].to_vector<int64_t>();
    const std::vector<int64_t> targets = batch->samples[kTargetsField].to_vector<int64_t>();
    for (size_t k = 0; k < targets.size(); ++k) {
      const size_t at = static_cast<size_t>(batch->first_position) * 10 + k;
      ASSERT_EQ(tokens[k], static_cast<unsigned char>(text[at])) << at;
      ASSERT_EQ(targets[k], static_cast<unsigned char>(text[at + 1])) << at;
    }
  }
  EXPECT_EQ(next_index, 100);
  EXPECT_EQ(read, text.substr(0, 1000));
}

TEST(TextDataset, EnglishFortunesLoadAndSplit) {
  if (!std::filesystem::is_directory(kFortunesDefaultDir))
    GTEST_SKIP() << "the fortunes package is not installed (apt-get install fortunes)";
  const std::vector<std::string> files = fortune_files();
  EXPECT_GE(files.size(), 3u);  // fortunes-min alone installs fortunes, literature, riddles
  const TextSplits s = load_text();
  // The English fortunes hold thousands of fortunes (15216 in Debian 12's): about a tenth
  // of the bytes goes to validation.
  EXPECT_GT(s.train.size(), 50000u);
  const double share =
      static_cast<double>(s.validation.size()) / static_cast<double>(s.train.size() + s.validation.size());
  EXPECT_GT(share, 0.05);
  EXPECT_LT(share, 0.15);
  EXPECT_TRUE(s.train.ends_with("%\n"));
  EXPECT_TRUE(s.validation.ends_with("%\n"));
  const TensorDataset train = text_windows(s.train, 256);
  EXPECT_EQ(train.size(), (static_cast<int64_t>(s.train.size()) - 1) / 256);
}

}  // namespace
}  // namespace lockstep

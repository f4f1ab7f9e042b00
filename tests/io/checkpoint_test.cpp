#include "lockstep/io/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>

#include "io/test_files.h"

namespace lockstep {
namespace {

using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

NamedTensors model_state(float scale, int64_t size = 16) {
  Tensor weight = Tensor::empty({size}, DType::f32);
  for (int64_t i = 0; i < size; ++i) weight.data<float>()[i] = scale * static_cast<float>(i);
  return {{"model.fc.weight", weight},
          {"optim.step", Tensor::from_vector<int64_t>({static_cast<int64_t>(scale)}, {1})}};
}

TEST(Checkpoint, RoundTripsTensorsAndMetadata) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  const Metadata metadata = {{"step", "300"}, {"epoch", "2"}, {"data.sample", "4096"}, {"rng", "7:2:1234"}};
  save_checkpoint(path, model_state(0.5f), metadata);
  const Checkpoint loaded = load_checkpoint(path);
  EXPECT_EQ(loaded.metadata, metadata);
  ASSERT_EQ(loaded.tensors.size(), 2u);
  EXPECT_EQ(loaded.tensors[0].first, "model.fc.weight");
  const std::vector<float> weight = loaded.at("model.fc.weight").to_vector<float>();
  for (size_t i = 0; i < weight.size(); ++i) EXPECT_EQ(weight[i], 0.5f * static_cast<float>(i));
  EXPECT_EQ(loaded.at("optim.step").item(), 0.0);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));  // no temp file left

  // Saving again replaces it.
  save_checkpoint(path, model_state(2.0f), {{"step", "400"}});
  EXPECT_EQ(load_checkpoint(path).metadata.at("step"), "400");
  EXPECT_EQ(load_checkpoint(path).at("model.fc.weight").to_vector<float>()[3], 6.0f);
}

// A save that fails part-way must leave the previous checkpoint byte for byte and no
// temporary file. The failure is real: the file-size limit makes write() fail with EFBIG.
TEST(Checkpoint, FailedWriteKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  save_checkpoint(path, model_state(1.0f), {{"step", "1"}});
  const Bytes before = testing::read_bytes(path);

  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // fail the write instead of killing us
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string message;
  try {
    save_checkpoint(path, model_state(3.0f, 100000), {{"step", "2"}});  // 400 KB > 4 KiB
  } catch (const Error& e) {
    threw = true;
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(threw);
  EXPECT_NE(message.find(".tmp."), std::string::npos) << message;
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors"}));
  EXPECT_EQ(load_checkpoint(path).metadata.at("step"), "1");
}

TEST(Checkpoint, FailureAfterWritingRemovesTheTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  save_checkpoint(path, model_state(1.0f));
  const Bytes before = testing::read_bytes(path);

  // The writer produces a partial file, then fails.
  expect_error(
      [&] {
        write_file_atomically(path, [](const std::string& temp) {
          testing::write_bytes(temp, Bytes(100, 0xAB));
          LOCKSTEP_FAIL() << "simulated failure while writing";
        });
      },
      {"simulated failure"});
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt"}));

  // The rename fails (the target is a non-empty directory): the temp file goes too.
  const std::string blocked = dir.file("blocked");
  std::filesystem::create_directories(blocked + "/inside");
  expect_error([&] { save_checkpoint(blocked, model_state(1.0f)); }, {"rename", blocked});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"blocked", "ckpt"}));
  EXPECT_TRUE(std::filesystem::is_directory(blocked + "/inside"));

  // A directory that does not exist.
  expect_error([&] { save_checkpoint(dir.file("missing/ckpt"), model_state(1.0f)); }, {"missing/ckpt"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"blocked", "ckpt"}));
}

TEST(Checkpoint, ValidationErrorsLeaveThePreviousCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  save_checkpoint(path, model_state(1.0f));
  const Bytes before = testing::read_bytes(path);
  NamedTensors duplicate = model_state(2.0f);
  duplicate.push_back(duplicate.front());
  expect_error([&] { save_checkpoint(path, duplicate); }, {"model.fc.weight"});
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt"}));
}

// A byte changed after the save, or a file cut short, is an error naming the file; the
// hash is checked against an independent one of the same fields.
TEST(Checkpoint, AChangedOrTruncatedFileIsRefusedByItsHash) {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  const NamedTensors state = model_state(1.0f);
  save_checkpoint(path, state, {{"step", "3"}});
  EXPECT_EQ(load_safetensors_metadata(path).at(kTensorsSha256Key), tensors_sha256(state));
  EXPECT_NE(tensors_sha256(state), tensors_sha256(model_state(2.0f)));
  // Renaming a tensor changes the hash too, not only its bytes.
  NamedTensors renamed = state;
  renamed[0].first = "model.fc.bias";
  EXPECT_NE(tensors_sha256(state), tensors_sha256(renamed));

  Bytes bytes = testing::read_bytes(path);
  bytes[bytes.size() - 9] ^= 0x01;  // inside the first tensor's last element
  testing::write_bytes(path, bytes);
  expect_error([&] { load_checkpoint(path); }, {path, "is corrupt"});

  save_checkpoint(path, state, {{"step", "3"}});
  bytes = testing::read_bytes(path);
  bytes.resize(bytes.size() - 4);
  testing::write_bytes(path, bytes);
  expect_error([&] { load_checkpoint(path); }, {path});
  expect_error([&] { save_checkpoint(path, state, {{kTensorsSha256Key, "x"}}); }, {"the checkpoint's own"});
}

}  // namespace
}  // namespace lockstep

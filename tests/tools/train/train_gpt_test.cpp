// `lockstep train --model gpt` on a small text: the step's tree holds for the transformer
// (the same weights and the same sample on 1, 2 and 4 devices, under ddp and zero2, and resumed on
// another device count), the validation loss falls, and bad input gets a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/common/command_testing.h"
#include "tools/common/small_dataset.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class TrainGpt : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-train-gpt-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    // Forty records: enough windows of 16 bytes for a few batches of 16, and four for
    // validation.
    write_small_text(root_ / "text.txt", 40);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string base() const {
    return "train --quiet --threads 1 --model gpt --layers 1 --heads 2 --width 16 --context 16 --sample 40 --data " +
           (root_ / "text.txt").string() + " --batch-size 16 --micro-batch 2";
  }
  nlohmann::json summary(const fs::path& out) const {
    std::ifstream in(out / "summary.json");
    return nlohmann::json::parse(in);
  }

  fs::path root_;
};

TEST_F(TrainGpt, SameWeightsAndSampleOnAnyDeviceCountAndUnderDdp) {
  const std::string flags = base() + " --steps 4";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  const nlohmann::json one = summary(root_ / "one");
  int index = 0;
  for (const std::string layout : {"--devices 2", "--devices 4", "--devices 1 --threads 2"}) {
    const fs::path out = root_ / std::to_string(index++);
    const Result r = run(flags + " " + layout + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    EXPECT_EQ(summary(out)["weights_sha256"], one["weights_sha256"]) << layout;
    EXPECT_EQ(summary(out)["sample"], one["sample"]) << layout;
  }
  // One process per device, and with ZeRO-2 (the tied embedding's gradient has two
  // contributions, both in before its bucket is reduce-scattered).
  for (const std::string strategy : {"ddp", "zero2"}) {
    const Result r = run("run -n 2 --log-dir " + (root_ / ("logs-" + strategy)).string() + " -- " + kBinary + " " +
                         flags + " --strategy " + strategy + " --out " + (root_ / strategy).string());
    ASSERT_EQ(r.exit_code, 0) << strategy << "\n" << r.output;
    EXPECT_EQ(summary(root_ / strategy)["weights_sha256"], one["weights_sha256"]) << strategy;
  }
}

// Recomputing each block in backward keeps less memory and changes no bit.
TEST_F(TrainGpt, CheckpointedActivationsGiveTheSameWeightsInLessMemory) {
  const std::string flags = base() + " --steps 3 --layers 4 --devices 1";
  ASSERT_EQ(run(flags + " --out " + (root_ / "kept").string()).exit_code, 0);
  const Result r = run(flags + " --checkpoint-activations --out " + (root_ / "recomputed").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json kept = summary(root_ / "kept"), recomputed = summary(root_ / "recomputed");
  EXPECT_EQ(recomputed["weights_sha256"], kept["weights_sha256"]);
  EXPECT_LT(recomputed["peak_memory_bytes"].get<int64_t>(), kept["peak_memory_bytes"].get<int64_t>());
}

TEST_F(TrainGpt, ResumesOnAnotherDeviceCountBitExactly) {
  const std::string flags = base() + " --lr-schedule cosine:total=8";
  ASSERT_EQ(run(flags + " --devices 1 --steps 8 --out " + (root_ / "whole").string()).exit_code, 0);
  ASSERT_EQ(run(flags + " --devices 2 --steps 8 --stop-after 3 --out " + (root_ / "split").string()).exit_code, 0);
  const Result resumed = run(flags + " --devices 4 --steps 8 --resume " + (root_ / "split").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
}

// The checkpoint remembers the model's shape: a resume needs no shape flags, and other
// ones are refused with the saved value.
TEST_F(TrainGpt, ResumeTakesTheShapeFromTheCheckpoint) {
  const std::string flags = base() + " --lr-schedule cosine:total=6 --devices 1";
  ASSERT_EQ(run(flags + " --layers 2 --steps 6 --out " + (root_ / "whole").string()).exit_code, 0);
  ASSERT_EQ(run(flags + " --layers 2 --steps 6 --stop-after 2 --out " + (root_ / "split").string()).exit_code, 0);
  const std::string text = (root_ / "text.txt").string();
  const Result resumed = run("train --quiet --threads 1 --model gpt --sample 40 --data " + text +
                             " --steps 6 --resume " + (root_ / "split").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
  EXPECT_EQ(summary(root_ / "split")["gpt"]["layers"], 2);
  const Result other = run(base() + " --layers 3 --resume " + (root_ / "split").string());
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_NE(other.output.find("a run with --layers 2, not 3"), std::string::npos) << other.output;
}

// Pipelines, alone or beside data parallelism, in one process or one per device, give the
// bits of one device; tensor
// parallelism sums its partial products in another order, so its loss is close, not equal.
TEST_F(TrainGpt, MeshLayoutsGiveTheWeightsOfOneDevice) {
  const std::string flags = base() + " --steps 4 --layers 2";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  const nlohmann::json one = summary(root_ / "one");
  int index = 0;
  for (const std::string layout : {"--pp 2", "--pp 2 --schedule gpipe", "--dp 2 --pp 2", "--devices 4 --pp 2",
                                   "--pp 2 --stages 1,1 --checkpoint-activations"}) {
    const fs::path out = root_ / std::to_string(index++);
    const Result r = run(flags + " " + layout + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    const nlohmann::json mesh = summary(out);
    EXPECT_EQ(mesh["weights_sha256"], one["weights_sha256"]) << layout;
    EXPECT_EQ(mesh["sample"], one["sample"]) << layout;
    EXPECT_EQ(mesh["strategy"], "mesh");
    EXPECT_EQ(mesh["collectives"]["backend"], "local");  // CPU devices' threads
    EXPECT_EQ(mesh["mesh"]["pp"], 2);
    EXPECT_GT(mesh["mesh"]["bubble_theory"].get<double>(), 0.0);
  }
  EXPECT_EQ(summary(root_ / "3")["mesh"]["dp"], 2);  // --devices 4 over 2 stages
  // One process per device, under the launcher.
  const Result processes = run("run -n 4 --log-dir " + (root_ / "logs").string() + " -- " + kBinary + " " + flags +
                               " --dp 2 --pp 2 --out " + (root_ / "processes").string());
  ASSERT_EQ(processes.exit_code, 0) << processes.output;
  EXPECT_EQ(summary(root_ / "processes")["weights_sha256"], one["weights_sha256"]);
  EXPECT_EQ(summary(root_ / "processes")["mesh"]["processes"], 4);
  EXPECT_EQ(summary(root_ / "processes")["collectives"]["backend"], "shm");
  for (const std::string layout : {"--tp 2", "--dp 2 --tp 2", "--tp 2 --pp 2"}) {
    const fs::path out = root_ / std::to_string(index++);
    const Result r = run(flags + " " + layout + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
    const double loss = summary(out)["validation_loss"], expected = one["validation_loss"];
    EXPECT_NEAR(loss, expected, 1e-5 * expected) << layout;
  }
}

// A checkpoint holds the full model: trained under one layout, it resumes under another.
TEST_F(TrainGpt, ResumesAcrossLayouts) {
  const std::string flags = base() + " --layers 2 --lr-schedule cosine:total=6";
  ASSERT_EQ(run(flags + " --devices 1 --steps 6 --out " + (root_ / "whole").string()).exit_code, 0);
  ASSERT_EQ(run(flags + " --pp 2 --steps 6 --stop-after 3 --out " + (root_ / "pipeline").string()).exit_code, 0);
  const Result on_one = run(flags + " --devices 2 --steps 6 --resume " + (root_ / "pipeline").string());
  ASSERT_EQ(on_one.exit_code, 0) << on_one.output;
  EXPECT_EQ(summary(root_ / "pipeline")["weights_sha256"], summary(root_ / "whole")["weights_sha256"]);
  // Tensor parallel, then a pipeline: the bits of tensor parallel, then one device.
  for (const std::string name : {"tp-then-pp", "tp-then-one"}) {
    ASSERT_EQ(run(flags + " --tp 2 --steps 6 --stop-after 3 --out " + (root_ / name).string()).exit_code, 0);
  }
  const Result on_pipeline = run("run -n 2 --log-dir " + (root_ / "logs").string() + " -- " + kBinary + " " + flags +
                                 " --pp 2 --steps 6 --resume " + (root_ / "tp-then-pp").string());
  ASSERT_EQ(on_pipeline.exit_code, 0) << on_pipeline.output;
  ASSERT_EQ(run(flags + " --devices 1 --steps 6 --resume " + (root_ / "tp-then-one").string()).exit_code, 0);
  EXPECT_EQ(summary(root_ / "tp-then-pp")["weights_sha256"], summary(root_ / "tp-then-one")["weights_sha256"]);
}

// --strategy zero1 with the mesh's flags shards each rank's optimizer state across its
// data-parallel group: the bits of the mesh without it (of one device without tensor
// parallelism), half the state per rank over two replicas, and a checkpoint that resumes
// on the mesh without ZeRO and under ddp as if the run had never stopped.
TEST_F(TrainGpt, Zero1OnTheMeshKeepsTheBitsAndResumesWithoutIt) {
  const std::string flags = base() + " --layers 2 --lr-schedule cosine:total=6 --steps 6";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "whole").string()).exit_code, 0);
  const nlohmann::json whole = summary(root_ / "whole");
  const Result zero = run(flags + " --strategy zero1 --dp 2 --pp 2 --out " + (root_ / "zero").string());
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(summary(root_ / "zero")["weights_sha256"], whole["weights_sha256"]);
  EXPECT_EQ(summary(root_ / "zero")["mesh"]["zero_stage"], 1);
  EXPECT_EQ(summary(root_ / "zero")["strategy"], "mesh");
  // Tensor parallelism: the same mesh without ZeRO is the reference; rank 0 holds half the
  // optimizer state.
  for (const std::string name : {"tp", "tp-zero"}) {
    const Result r =
        run(flags + " --dp 2 --tp 2" + (name == "tp" ? "" : " --strategy zero1") + " --out " + (root_ / name).string());
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
  const nlohmann::json tp = summary(root_ / "tp"), tp_zero = summary(root_ / "tp-zero");
  EXPECT_EQ(tp_zero["weights_sha256"], tp["weights_sha256"]);
  const double ratio = tp_zero["optimizer_state_bytes"].get<double>() / tp["optimizer_state_bytes"].get<double>();
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.55);
  EXPECT_EQ(tp["mesh"]["zero_stage"], 0);
  // Stopped under ZeRO-1, resumed on the mesh without it, and under ddp's processes.
  for (const std::string name : {"then-mesh", "then-ddp"}) {
    const Result r = run(flags + " --strategy zero1 --dp 2 --pp 2 --stop-after 3 --out " + (root_ / name).string());
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
  const Result on_mesh = run(flags + " --dp 2 --pp 2 --resume " + (root_ / "then-mesh").string());
  ASSERT_EQ(on_mesh.exit_code, 0) << on_mesh.output;
  EXPECT_EQ(summary(root_ / "then-mesh")["weights_sha256"], whole["weights_sha256"]);
  const Result on_ddp = run("run -n 2 --log-dir " + (root_ / "logs").string() + " -- " + kBinary + " " + flags +
                            " --strategy ddp --resume " + (root_ / "then-ddp").string());
  ASSERT_EQ(on_ddp.exit_code, 0) << on_ddp.output;
  EXPECT_EQ(summary(root_ / "then-ddp")["weights_sha256"], whole["weights_sha256"]);
}

TEST_F(TrainGpt, LayoutsThatDoNotDivideAreNamed) {
  const std::string flags = base() + " --steps 1 --layers 2 --out " + (root_ / "bad").string() + " ";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"--tp 4 --heads 2", "2 heads do not go to 4 ranks"},
           {"--pp 3", "2 transformer blocks cannot fill 3 pipeline stages"},
           {"--pp 2 --stages 2,1", "give 2 counts that sum to 2"},
           {"--devices 3 --tp 2", "--devices 3 is not a multiple of --tp x --pp = 2"},
           {"--dp 2 --tp 2 --devices 2", "needs 4 devices, not 2"},
           {"--dp 3", "3 devices cannot share"},
           {"--pp 2 --schedule zigzag", "--schedule must be gpipe"},
           {"--tp 2 --strategy ddp", "do not go with --strategy ddp"},
           {"--dp 2 --strategy zero2", "--strategy zero2 is not built for the mesh"},
           {"--dp 2 --strategy zero3", "--strategy zero3 is not built for the mesh"}}) {
    const Result r = run(flags + arguments);
    EXPECT_EQ(r.exit_code, 2) << arguments << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << arguments << "\n" << r.output;
  }
  const Result cnn = run("train --quiet --model mlp --tp 2 --steps 1");
  EXPECT_EQ(cnn.exit_code, 2) << cnn.output;
  EXPECT_NE(cnn.output.find("use --model gpt"), std::string::npos) << cnn.output;
}

TEST_F(TrainGpt, ReportsTheValidationLossWhichFallsAndASample) {
  ASSERT_EQ(run(base() + " --steps 0 --out " + (root_ / "start").string()).exit_code, 0);
  const Result r = run(base() + " --steps 30 --lr 0.01 --out " + (root_ / "trained").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("validation loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample:\n"), std::string::npos) << r.output;
  const nlohmann::json start = summary(root_ / "start"), trained = summary(root_ / "trained");
  // Untrained, every byte is about equally likely: ln 256.
  EXPECT_NEAR(start["validation_loss"].get<double>(), std::log(256.0), 0.1);
  EXPECT_LT(trained["validation_loss"].get<double>(), 0.8 * start["validation_loss"].get<double>());
  EXPECT_FALSE(trained.contains("test_accuracy"));
  EXPECT_EQ(trained["optimizer"], "adamw");  // the default for the transformer
  EXPECT_EQ(trained["gpt"]["context"], 16);
  // wte 256x16, wpe 16x16, one block (2 layer norms, c_attn, c_proj, c_fc, c_proj), ln_f.
  const int64_t width = 16, block = 4 * width + (width * 3 * width + 3 * width) + (width * width + width) +
                                    (width * 4 * width + 4 * width) + (4 * width * width + width);
  EXPECT_EQ(trained["gpt"]["parameters"], 256 * width + 16 * width + block + 2 * width);
  const std::string sample = trained["sample"];
  EXPECT_GE(sample.size(), 40u);  // 40 bytes; a broken UTF-8 byte becomes three
}

TEST_F(TrainGpt, BadInputIsNamed) {
  const Result missing = run("train --quiet --model gpt --steps 1 --data " + (root_ / "none.txt").string());
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find((root_ / "none.txt").string()), std::string::npos) << missing.output;
  for (const std::string& arguments :
       {std::string("--preset huge"), std::string("--heads 3 --width 16"), std::string("--layers -1"),
        std::string("--sample -2"), std::string("--temperature -1")}) {
    const Result r = run(base() + " --steps 1 --out " + (root_ / "bad").string() + " " + arguments);
    EXPECT_EQ(r.exit_code, 2) << arguments << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << arguments << "\n" << r.output;
  }
  const Result model = run("train --quiet --model transformer --steps 1");
  EXPECT_EQ(model.exit_code, 2) << model.output;
  EXPECT_NE(model.output.find("cnn, mlp, resnet (Fashion-MNIST) or gpt (text)"), std::string::npos) << model.output;
}

}  // namespace
}  // namespace lockstep

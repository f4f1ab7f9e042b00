// `lockstep plan` end to end: its JSON carries every field a script needs, a layout that does
// not fit says what does, bad input gets a usage error — and its predicted peak memory per
// device is within 10% of what `lockstep train` measures for the same layouts on this host's
// CPU devices (the devices without the full model a mesh is built from).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class PlanCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-plan-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::vector<nlohmann::json> json_lines(const std::string& output) const {
    std::vector<nlohmann::json> rows;
    std::istringstream in(output);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
    }
    return rows;
  }

  fs::path root_;
};

TEST_F(PlanCommand, JsonHasOneObjectPerLayoutWithItsPrediction) {
  const Result r = run("plan --preset tiny --batch-size 8 --devices 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> rows = json_lines(r.output);
  ASSERT_FALSE(rows.empty()) << r.output;
  bool saw_mesh = false, saw_zero2 = false;
  for (const nlohmann::json& row : rows) {
    for (const char* key : {"dp", "tp", "pp", "zero", "schedule", "micro_batch", "checkpoint_activations",
                            "memory_bytes", "fits", "step_seconds", "samples_per_second", "train_flags"}) {
      EXPECT_TRUE(row.contains(key)) << key << " in " << row.dump();
    }
    EXPECT_EQ(row["dp"].get<int>() * row["tp"].get<int>() * row["pp"].get<int>(), 2);
    EXPECT_GT(row["memory_bytes"].get<double>(), 0);
    EXPECT_GT(row["step_seconds"].get<double>(), 0);
    saw_mesh |= row["pp"] == 2;
    saw_zero2 |= row["zero"] == 2;
  }
  EXPECT_TRUE(saw_mesh && saw_zero2);
  EXPECT_TRUE(rows.front()["fits"].get<bool>());
}

// A report from a server of four 16 GB T4s, but with 3 MB each: data parallelism with 8
// samples per micro-batch does not fit; the plan says by how much and what does.
TEST_F(PlanCommand, ALayoutThatDoesNotFitSaysWhatDoes) {
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) devices.push_back({{"name", "Tesla T4"}, {"memory_total_bytes", 3000000}});
  const fs::path report = root_ / "doctor.json";
  std::ofstream(report) << nlohmann::json{{"facts", {{"gpus", {{"devices", devices}}}}}}.dump();
  const Result r = run("plan --preset tiny --batch-size 32 --machine " + report.string() + " --dp 4 --micro-batch 8");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("4x Tesla T4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dp 4, micro-batch 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("which has 2.9 MiB"), std::string::npos) << r.output;
  const size_t instead = r.output.find("what fits instead: ");
  ASSERT_NE(instead, std::string::npos) << r.output;
  // What fits is a pipeline or a cut, whose stages hold part of the model each.
  const std::string fits = r.output.substr(instead, r.output.find('\n', instead) - instead);
  EXPECT_NE(fits.find(" pp "), std::string::npos) << fits;
  EXPECT_NE(r.output.find("run it: lockstep train --model gpt --preset tiny --batch-size 32 --strategy "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" --pp "), std::string::npos) << r.output;
}

TEST_F(PlanCommand, BadInputIsAUsageError) {
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--machine nope", "unknown machine 'nope'; use one of this-host, a100-80g-8x"},
           {"--preset tiny --batch-size 6 --devices 4 --micro-batch 4", "no layout splits a batch of 6 over 4"},
           {"--preset tiny --precision fp8", "--precision must be f32, bf16 or f16"},
           {"--preset tiny --heads 5", "width 64 is not divisible by heads 5"},
           {"--preset tiny --devices 2 --batch-size 8 --tp 3", "no layout of 2 devices has the given"},
       }) {
    const Result r = run("plan " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// The validation the README's table comes from (bench/plan_validation.py prints it in full,
// step times beside): each layout the plan offers two CPU devices, trained for real.
TEST_F(PlanCommand, PredictedPeakMemoryIsWithinTenPercentOfTraining) {
  // A few hundred KiB of text: the dataset (8 bytes per byte, on each process's cpu:0) stays
  // about 1% of a device's peak.
  const fs::path text = root_ / "text.txt";
  {
    std::ofstream out(text);
    const char* words[] = {"lock", "step", "tree", "sum", "bits", "device", "batch", "the", "same", "on"};
    for (int record = 0; record < 400; ++record) {
      for (int w = 0; w < 14; ++w) out << words[(record * 7 + w * 3) % 10] << (w == 13 ? ".\n%\n" : " ");
    }
  }
  const std::string shape = "--preset small --batch-size 16 --micro-batch 4";
  const Result plan = run("plan " + shape + " --devices 2 --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  int compared = 0;
  for (const nlohmann::json& row : json_lines(plan.output)) {
    const bool mesh = row["tp"] != 1 || row["pp"] != 1;
    // Every layout once, plain and checkpointed, but for GPipe (its stage 1 holds what 1F1B's
    // does, times the micro-batches: the same terms).
    if (row["schedule"] == "gpipe" || (!mesh && row["zero"] == 1)) continue;
    const fs::path out = root_ / ("run-" + std::to_string(compared));
    std::string command = "train --quiet --model gpt --sample 0 --steps 3 --log-every 1 --checkpoint-every 0 --data " +
                          text.string() + " " + shape + " " + row["train_flags"].get<std::string>() + " --out " +
                          out.string();
    Result trained;
    if (mesh) {
      trained = run(command + " --devices 2");
    } else {
      trained = run("run -n 2 --log-dir " + (root_ / ("logs-" + std::to_string(compared))).string() + " -- " + kBinary +
                    " " + command);
    }
    ASSERT_EQ(trained.exit_code, 0) << command << "\n" << trained.output;
    double peak = 0;
    std::ifstream metrics(out / "metrics.jsonl");
    std::string line;
    // A mesh's cpu:1 (tensor parallelism's rank 1, the pipeline's last stage); a ddp
    // process's own device.
    const std::string device = mesh ? "cpu:1" : "cpu:0";
    while (std::getline(metrics, line)) {
      peak = std::max(peak, nlohmann::json::parse(line)["memory"][device]["peak_allocated_bytes"].get<double>());
    }
    const std::vector<double> stages = row["stage_memory_bytes"].get<std::vector<double>>();
    const double predicted = stages.back();
    EXPECT_NEAR(predicted / peak, 1.0, 0.10) << row["layout"] << ": predicted " << predicted << ", measured " << peak;
    ++compared;
  }
  EXPECT_GE(compared, 8);
}

}  // namespace
}  // namespace lockstep

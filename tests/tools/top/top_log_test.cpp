// --log FILE.csv and FILE.jsonl: what each sample appends, read back as a user's tool would.
#include "tools/top/top_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/core/error.h"
#include "tools/top/top_json.h"
#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class TopLogFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lockstep-top-log-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(TopLog, FormatComesFromTheExtension) {
  EXPECT_EQ(log_format_for("gpus.csv"), LogFormat::kCsv);
  EXPECT_EQ(log_format_for("/tmp/a.b/gpus.jsonl"), LogFormat::kJsonl);
  EXPECT_THROW(log_format_for("gpus.json"), UsageError);
  EXPECT_THROW(log_format_for("gpus.txt"), UsageError);
  EXPECT_THROW(log_format_for("csv"), UsageError);
}

TEST(TopLog, CsvFieldsAreQuotedOnlyWhenTheyMustBe) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
}

TEST_F(TopLogFile, CsvHasOneHeaderAndOneRowPerGpuPerSampleAcrossRuns) {
  const fs::path path = dir_ / "gpus.csv";
  TopSample sample = top_testing::two_gpu_sample();
  sample.alerts = {{"imbalance", {0, 1}, "x"}, {"thermal", {1}, "y"}};
  {
    TopLog log(path.string(), LogFormat::kCsv);
    log.write(sample);
    log.write(sample);
  }
  {
    TopLog again(path.string(), LogFormat::kCsv);  // appends; no second header
    again.write(sample);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u + 3 * 2);
  EXPECT_EQ(lines[0], csv_header());
  EXPECT_EQ(lines[0].substr(0, 25), "time,device,nvml_index,cu");
  EXPECT_EQ(lines[1],
            "2024-05-01T12:00:00.123Z,gpu0,0,1,NVIDIA A100-SXM4-80GB,GPU-00000000,97,45,71234,81920,64,312.400,"
            "400.000,1410,none,12345:alice:70000,imbalance");
  EXPECT_EQ(lines[2],
            "2024-05-01T12:00:00.123Z,gpu1,1,0,NVIDIA A100-SXM4-80GB,GPU-00000001,91,45,70000,81920,64,312.400,"
            "400.000,1410,none,12346:alice:69000 4242:?:1000,imbalance thermal");
  // Every row has the header's number of fields.
  const auto fields = [](const std::string& s) { return std::count(s.begin(), s.end(), ','); };
  for (const std::string& line : lines) EXPECT_EQ(fields(line), fields(lines[0])) << line;
}

TEST_F(TopLogFile, CsvOnTheCpuViewHasAHostRowThenOneRowPerCore) {
  const fs::path path = dir_ / "cpu.csv";
  {
    TopLog log(path.string(), LogFormat::kCsv);
    log.write(top_testing::cpu_sample());
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1], "2024-05-01T12:00:00.123Z,cpu,,,,,56.2,,12288,16384,,,,,,,");
  EXPECT_EQ(lines[2], "2024-05-01T12:00:00.123Z,cpu0,,,,,12.5,,,,,,,,,,");
  EXPECT_EQ(lines[3], "2024-05-01T12:00:00.123Z,cpu1,,,,,100.0,,,,,,,,,,");
}

TEST_F(TopLogFile, JsonlHasOneObjectPerSample) {
  const fs::path path = dir_ / "gpus.jsonl";
  TopSample sample = top_testing::two_gpu_sample();
  sample.alerts = {{"memory", {1}, "GPU 1 memory 96.0% full"}};
  {
    TopLog log(path.string(), LogFormat::kJsonl);
    log.write(sample);
    log.write(sample);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto json = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(json["time"], "2024-05-01T12:00:00.123Z");
  ASSERT_EQ(json["gpus"].size(), 2u);
  const auto& gpu1 = json["gpus"][1];
  EXPECT_EQ(gpu1["index"], 1);
  EXPECT_EQ(gpu1["cuda_index"], 0);
  EXPECT_EQ(gpu1["utilization_gpu"], 91);
  EXPECT_EQ(gpu1["memory_used"], 70000ull * 1024 * 1024);
  EXPECT_EQ(gpu1["memory_total"], 81920ull * 1024 * 1024);
  EXPECT_DOUBLE_EQ(gpu1["power_w"].get<double>(), 312.4);
  EXPECT_EQ(gpu1["processes"][0]["user"], "alice");
  EXPECT_EQ(gpu1["processes"][1]["in_this_namespace"], false);
  EXPECT_FALSE(gpu1["processes"][1].contains("command"));
  EXPECT_EQ(json["alerts"][0]["kind"], "memory");
  EXPECT_EQ(json["alerts"][0]["devices"], nlohmann::json::array({1}));
}

TEST(TopJson, XidErrorsPerGpuAndNullWhereTheKernelLogIsUnread) {
  TopSample sample = top_testing::two_gpu_sample();
  auto json = sample_json(sample);
  EXPECT_TRUE(json["gpus"][0]["xid_last"].is_null()) << json.dump();
  EXPECT_TRUE(json["gpus"][0]["xid_errors"].is_null());
  sample.xid_log_read = true;
  sample.xids["0000:07:00.0"] = {79, 4};
  json = sample_json(sample);
  EXPECT_EQ(json["gpus"][0]["xid_last"], 79);
  EXPECT_EQ(json["gpus"][0]["xid_errors"], 4);
  EXPECT_EQ(json["gpus"][1]["xid_last"], 0);
  EXPECT_EQ(json["gpus"][1]["xid_errors"], 0);
}

TEST(TopJson, CpuViewCarriesCoresMemoryAndTheReason) {
  const auto json = sample_json(top_testing::cpu_sample());
  EXPECT_FALSE(json.contains("gpus"));
  EXPECT_EQ(json["cpu"]["core_utilization"], nlohmann::json::array({12.5, 100.0}));
  EXPECT_EQ(json["cpu"]["memory_used"], 12288ull * 1024 * 1024);
  EXPECT_NE(json["no_gpu"].get<std::string>().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::tools

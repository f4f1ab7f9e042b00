// `lockstep top` as a user runs it into a pipe: the CPU view on a host without NVML, the
// GPU view through the stand-in NVML profiles, --json, --log, --serve, and bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

const std::string kWithoutNvml = "env " + kNoNvml + " ";

Result top(const std::string& env, const std::string& arguments) {
  return run_shell(env + kBinary + " top " + arguments + " </dev/null");
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

size_t online_cores() { return static_cast<size_t>(sysconf(_SC_NPROCESSORS_ONLN)); }

TEST(TopCommand, OnceWithoutNvmlShowsTheCpuCoresAndSaysWhy) {
  const Result r = top(kWithoutNvml, "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\ncpu0 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\ncpu" + std::to_string(online_cores() - 1) + " "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nmemory "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << "escape codes in plain output";
}

TEST(TopCommand, JsonCountTwoPrintsTwoObjectsOneLineEach) {
  const Result r = top(kWithoutNvml, "--json --count 2 -l 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const std::string& line : lines) {
    const auto json = nlohmann::json::parse(line);
    EXPECT_EQ(json["cpu"]["core_utilization"].size(), online_cores());
    EXPECT_GT(json["cpu"]["memory_total"].get<uint64_t>(), 0u);
    EXPECT_TRUE(json["alerts"].is_array());
  }
}

TEST(TopCommand, LogsEverySampleBesideThePlainOutput) {
  const fs::path path = fs::temp_directory_path() / ("lockstep-top-command-" + std::to_string(getpid()) + ".csv");
  fs::remove(path);
  const Result r = top(kWithoutNvml, "--count 2 -l 0.1 --log " + path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\ncpu0 "), std::string::npos) << r.output;
  std::ifstream in(path);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(line);
  fs::remove(path);
  // The header, then per sample the host row and one per core.
  ASSERT_EQ(rows.size(), 1 + 2 * (1 + online_cores()));
  EXPECT_EQ(rows[0].rfind("time,device,", 0), 0u);
  EXPECT_NE(rows[1].find(",cpu,"), std::string::npos) << rows[1];
}

TEST(TopCommand, BadInputIsAUsageErrorThatSaysWhatIsWrong) {
  struct Case {
    std::string arguments, message;
  };
  for (const Case& c :
       {Case{"-l 0", "more than 0 seconds"}, Case{"-l -1", "more than 0 seconds"}, Case{"-l 1e300", "at most a day"},
        Case{"-l soon", "--interval expects a number"}, Case{"--bogus", "unknown option --bogus"},
        Case{"--log samples.txt", "must end in .csv or .jsonl"}, Case{"--count -2", "--count must be 0"},
        Case{"--serve 9400", "expected :PORT or HOST:PORT"}}) {
    const Result r = top(kWithoutNvml, c.arguments);
    EXPECT_EQ(r.exit_code, 2) << c.arguments << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.arguments << "\n" << r.output;
  }
}

TEST(TopCommand, QueryGpuWithoutAGpuFailsAsNvidiaSmiDoes) {
  const Result r = top(kWithoutNvml, "--query-gpu=index --format=csv");
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_NE(r.output.find("no GPU to query"), std::string::npos) << r.output;
  EXPECT_EQ(top(kWithoutNvml, "--query-gpu=index").exit_code, 2);
  EXPECT_EQ(top(kWithoutNvml, "--format=csv").exit_code, 2);
}

TEST(TopCommand, ServeOnAPortInUseNamesThePort) {
  BusyPort busy;
  const int port = busy.port();
  ASSERT_GT(port, 0);
  const Result r = top(kWithoutNvml, "--once --serve 127.0.0.1:" + std::to_string(port));
  busy.close();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("port " + std::to_string(port) + " is in use"), std::string::npos) << r.output;
}

#if defined(LOCKSTEP_NVML_STANDIN)
std::string standin(const std::string& profile) {
  return std::string("env LOCKSTEP_NVML_LIBRARY=") + LOCKSTEP_NVML_STANDIN +
         " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/" + profile + " ";
}

// --query-gpu as scripts written for nvidia-smi call it; the expected values are the
// profile's own (shared-server.json: 4x RTX A6000, GPU 0 at 94% with 42165338112 bytes used).
TEST(TopCommand, QueryGpuPrintsNvidiaSmisCsvOnce) {
  const Result r = top(standin("shared-server.json"),
                       "--query-gpu=index,name,utilization.gpu,memory.used,memory.total --format=csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 5u) << r.output;
  EXPECT_EQ(lines[0], "index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]");
  EXPECT_EQ(lines[1], "0, NVIDIA RTX A6000, 94 %, " + std::to_string(42165338112 / (1 << 20)) + " MiB, " +
                          std::to_string(51527024640 / (1 << 20)) + " MiB");
  EXPECT_EQ(lines[4].rfind("3, NVIDIA RTX A6000, 0 %, ", 0), 0u) << lines[4];

  // -i picks GPUs by index or UUID; noheader and nounits as nvidia-smi's; -l repeats.
  const Result picked = top(standin("shared-server.json"),
                            "-i 2,GPU-223481a4-9caf-ce64-f9b7-28fb599b8fc0 --query-gpu=index,utilization.gpu "
                            "--format=csv,noheader,nounits -l 0.1 --count 2");
  ASSERT_EQ(picked.exit_code, 0) << picked.output;
  const std::vector<std::string> rows = lines_of(picked.output);
  ASSERT_EQ(rows.size(), 4u) << picked.output;
  EXPECT_EQ(rows[0], "0, 94");
  EXPECT_EQ(rows[1].rfind("2, ", 0), 0u) << rows[1];
  EXPECT_EQ(rows[2], "0, 99");  // the profile's second reading of GPU 0
}

// --query-compute-apps: the profile's four processes (shared-server.json), GPUs in order;
// "self" is this top itself, whose name NVML gives as its executable.
TEST(TopCommand, QueryComputeAppsPrintsNvidiaSmisCsv) {
  const Result r = top(standin("shared-server.json"),
                       "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv,nounits");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 5u) << r.output;
  EXPECT_EQ(lines[0], "gpu_bus_id, pid, process_name, used_gpu_memory");  // nounits: none in the header
  EXPECT_EQ(lines[1], "00000000:01:00.0, 2814467, [Not Found], " + std::to_string(42163240960 / (1 << 20)));
  EXPECT_NE(lines[4].find(", " + std::string(kBinary) + ", 1024"), std::string::npos) << lines[4];
  EXPECT_EQ(top(standin("shared-server.json"), "--query-compute-apps=pid --query-gpu=index --format=csv").exit_code, 2);
  EXPECT_EQ(top(standin("shared-server.json"), "--query-compute-apps=pid").exit_code, 2);
}

TEST(TopCommand, IdSelectsTheGpusOfTheViewAndRefusesOnesThatAreNotThere) {
  const Result r = top(standin("shared-server.json"), "-i 1 --once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  1    1 NVIDIA RTX A6000"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\n  0 "), std::string::npos) << r.output;
  const Result bad = top(standin("shared-server.json"), "--id 7 --once");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("no GPU is '7' (the GPUs are 0,1,2,3"), std::string::npos) << bad.output;
}

TEST(TopCommand, OnceOnEightA100sShowsEveryGpu) {
  const Result r = top(standin("a100-8x-nvlink.json"), "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("GPU CUDA NAME"), std::string::npos) << r.output;
  for (int i = 0; i < 8; ++i) {
    const std::string row = "\n  " + std::to_string(i) + " ";
    EXPECT_NE(r.output.find(row), std::string::npos) << "GPU " << i << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("A100"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no NVIDIA driver"), std::string::npos) << r.output;
}

TEST(TopCommand, JsonOnTheStandinMatchesTheProfile) {
  const Result r = top(standin("a100-8x-nvlink.json"), "--json --count 2 -l 0.05");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  std::ifstream in(std::string(LOCKSTEP_NVML_PROFILES) + "/a100-8x-nvlink.json");
  const auto profile = nlohmann::json::parse(in);
  const auto json = nlohmann::json::parse(lines[0]);
  ASSERT_EQ(json["gpus"].size(), 8u);
  EXPECT_NE(json["gpus"][0]["name"].get<std::string>().find("A100"), std::string::npos);
  EXPECT_NE(profile.dump().find(json["gpus"][3]["uuid"].get<std::string>()), std::string::npos)
      << "uuid not from the profile";
}

// GPM's activity (the H100s') is in --json from the second sample on, as fractions of the
// profile's percents; null in the first, and on GPUs without GPM.
TEST(TopCommand, GpmActivityFromTheSecondSampleOn) {
  const Result r = top(standin("h100-8x.json"), "--json --count 2 -l 0.05");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  EXPECT_TRUE(nlohmann::json::parse(lines[0])["gpus"][0]["gpm"].is_null()) << lines[0];
  const auto gpm = nlohmann::json::parse(lines[1])["gpus"][0]["gpm"];
  ASSERT_TRUE(gpm.is_object()) << lines[1];
  EXPECT_DOUBLE_EQ(gpm["sm"].get<double>(), 0.02);  // the profile's first sm_util, 2%
  EXPECT_DOUBLE_EQ(gpm["dram"].get<double>(), 0.04);
  EXPECT_TRUE(gpm["fp64"].is_null()) << "not in the profile: not counted";
  const Result a100 = top(standin("a100-8x-nvlink.json"), "--json --count 2 -l 0.05");
  EXPECT_TRUE(nlohmann::json::parse(lines_of(a100.output).at(1))["gpus"][0]["gpm"].is_null()) << a100.output;
}

// Xid reports in the kernel log (a fake one, LOCKSTEP_TOP_KERNEL_LOG) reach the GPU of their
// PCI bus id: an alert in the view, figures in --json.
TEST(TopCommand, XidErrorsInTheKernelLogReachTheirGpu) {
  const fs::path log = fs::temp_directory_path() / ("lockstep-top-kmsg-" + std::to_string(getpid()));
  {
    std::ofstream out(log);
    out << "[ 9.0] NVRM: Xid (PCI:0000:0f:00): 79, pid=7, name=python, GPU has fallen off the bus.\n"
        << "[ 9.5] NVRM: Xid (PCI:0000:0f:00): 79, pid=7, name=python, GPU has fallen off the bus.\n";
  }
  const std::string env = standin("a100-8x-nvlink.json") + "LOCKSTEP_TOP_KERNEL_LOG=" + log.string() + " ";
  const Result view = top(env, "--once");
  ASSERT_EQ(view.exit_code, 0) << view.output;
  EXPECT_NE(view.output.find("GPU 1: 2 Xid errors in the kernel log, the last Xid 79"), std::string::npos)
      << view.output;
  const Result json = top(env, "--json --once");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto sample = nlohmann::json::parse(lines_of(json.output).at(0));
  EXPECT_EQ(sample["gpus"][1]["xid_errors"], 2) << json.output;
  EXPECT_EQ(sample["gpus"][1]["xid_last"], 79);
  EXPECT_EQ(sample["gpus"][0]["xid_errors"], 0);
  fs::remove(log);
}

TEST(TopCommand, ShowsCudasIndexBesideNvmlsUnderCudaVisibleDevices) {
  // CUDA numbers the GPUs CUDA_VISIBLE_DEVICES names in its order; the others get none.
  const Result r = top(standin("h100-8x.json") + "CUDA_VISIBLE_DEVICES=3,1 ", "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  3    0 NVIDIA H100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  1    1 NVIDIA H100"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  0    - NVIDIA H100"), std::string::npos) << r.output;
}

TEST(TopCommand, SharedServerShowsOtherUsersProcesses) {
  const Result r = top(standin("shared-server.json"), "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pid "), std::string::npos) << r.output;
}

TEST(TopCommand, ThrottlingGpuRaisesAnAlert) {
  const Result r = top(standin("ecc-throttle.json"), "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ALERT GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("thermal throttling"), std::string::npos) << r.output;
}

TEST(TopCommand, AFailingNvmlCallBlanksItsColumnAndSaysWhy) {
  // The profile's power call fails everywhere and GPU 1's memory call fails: top still runs.
  const Result r = top(standin("failing-call.json"), "--once");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("unavailable: nvmlDeviceGetPowerUsage: Unknown Error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unavailable: nvmlDeviceGetMemoryInfo_v2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("- / 70 W"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("0 / 0 MiB"), std::string::npos) << r.output;
}
#endif

}  // namespace
}  // namespace lockstep

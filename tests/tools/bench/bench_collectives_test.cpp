// `lockstep bench collectives` as a user runs it: nccl-tests' flags, every row checked
// (#wrong 0), bus bandwidth from algbw by nccl-tests' factors, and process backends
// started under mpirun.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/core/cuda_device.h"

namespace lockstep {
namespace {

const std::string kBinary = std::string(LOCKSTEP_BINARY_DIR) + "/bin/lockstep";

struct Result {
  int exit_code = -1;
  std::string output;
  std::vector<nlohmann::json> rows;  // the lines that are JSON objects
};

// OpenMPI never frees what MPI_Init allocates: runs that start MPI (process backends,
// --compare mpi) leave LeakSanitizer out in sanitizer builds.
Result run(const std::string& arguments, bool uses_mpi = false) {
  const std::string env = uses_mpi ? "ASAN_OPTIONS=detect_leaks=0 " : "";
  FILE* pipe = popen((env + kBinary + " bench collectives " + arguments + " 2>&1").c_str(), "r");
  Result result;
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') result.rows.push_back(nlohmann::json::parse(line));
  }
  return result;
}

bool have_mpirun() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

void expect_rows_correct(const Result& result, const std::vector<std::string>& collectives, int ranks, size_t sizes) {
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_EQ(result.rows.size(), collectives.size() * sizes) << result.output;
  for (const nlohmann::json& row : result.rows) {
    EXPECT_EQ(row["wrong"], 0) << row.dump();
    EXPECT_EQ(row["ranks"], ranks) << row.dump();
    EXPECT_EQ(row["count"].get<int64_t>() * 4, row["size"].get<int64_t>()) << row.dump();
    const std::string what = row["collective"];
    const double n = ranks;
    const double factor = what == "all_reduce" ? 2 * (n - 1) / n : what == "broadcast" ? 1 : (n - 1) / n;
    EXPECT_NEAR(row["busbw"].get<double>(), row["algbw"].get<double>() * factor, 1e-9) << row.dump();
    EXPECT_EQ(row.contains("eta"), what == "all_reduce") << row.dump();
  }
}

TEST(BenchCollectives, LocalThreadsEveryCollectiveChecked) {
  const Result result = run("--backend local -g 3 -b 1K -e 256K -f 16 -n 2 -w 1 -c 1 --update-bytes 1M --json");
  ASSERT_NO_FATAL_FAILURE(
      expect_rows_correct(result, {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}, 3, 3));
  // Sizes: 1K, 16K, 256K rounded down to whole slices of 3 ranks x 8 bytes.
  EXPECT_EQ(result.rows[0]["size"], 1008);
  EXPECT_EQ(result.rows[2]["size"], 262128);
}

TEST(BenchCollectives, TableHasNcclTestsColumns) {
  const Result result = run("--backend local -g 2 -b 4K -e 4K -n 1 -w 0 --collective all_reduce --update-bytes 1M");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const char* column : {"size", "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong", "eta"}) {
    EXPECT_NE(result.output.find(column), std::string::npos) << column << "\n" << result.output;
  }
}

TEST(BenchCollectives, ShmUnderMpirunWithMpiComparison) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed";
  const Result result =
      run("--backend shm -g 2 -b 4K -e 64K -f 16 -n 2 -w 1 --collective all_reduce,broadcast --compare mpi "
          "--update-bytes 1M --json",
          true);
  ASSERT_NO_FATAL_FAILURE(expect_rows_correct(result, {"all_reduce", "broadcast"}, 2, 2));
  for (const nlohmann::json& row : result.rows) {
    EXPECT_GT(row["mpi_time_us"].get<double>(), 0) << row.dump();
    EXPECT_NEAR(row["speedup"].get<double>(), row["mpi_time_us"].get<double>() / row["time_us"].get<double>(), 1e-6);
  }
}

TEST(BenchCollectives, LocalWithMpiComparisonRunsMpiInAChildJob) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed";
  const Result result =
      run("--backend local -g 2 -b 8K -e 8K -n 2 -w 1 --collective all_reduce --compare mpi --update-bytes 1M --json",
          true);
  ASSERT_NO_FATAL_FAILURE(expect_rows_correct(result, {"all_reduce"}, 2, 1));
  EXPECT_GT(result.rows[0]["mpi_time_us"].get<double>(), 0) << result.output;
}

// Without a GPU --backend nccl fails at once and says why; the run on GPUs is scripts/gpu-check's.
TEST(BenchCollectives, NcclWithoutAGpuSaysWhy) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const Result result = run("--backend nccl --compare nccl -n 1 -w 0");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  // The reason is this build's: no CUDA backend (the sanitizer builds), or no usable GPU.
  const std::string expected = "--backend nccl needs GPUs, and this process sees none: " + cuda::unavailable_reason();
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
}

TEST(BenchCollectives, BadFlagsAreUsageErrors) {
  for (const char* args : {"--backend tcp", "-b 4Q", "-b 8K -e 4K", "--collective all_to_all", "-f 1", "--compare nccl",
                           "--backend nccl --compare mpi", "--compare ucc", "-d q8", "-n 0", "-w -1",
                           "--update-bytes 0", "-b nanK", "-b 1e30", "-e inf", "-c 2", "-g 0"}) {
    const Result result = run(args);
    EXPECT_EQ(result.exit_code, 2) << args << "\n" << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << args << "\n" << result.output;
  }
}

}  // namespace
}  // namespace lockstep

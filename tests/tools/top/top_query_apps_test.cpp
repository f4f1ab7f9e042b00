// nvidia-smi's --query-compute-apps for `lockstep top`: one line per process per GPU, its
// field names and aliases, "[Not Found]" for a process of another container, "[N/A]" for
// memory NVML does not know.
#include "tools/top/top_query_apps.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"
#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

TEST(TopQueryApps, OneLinePerProcessAsNvidiaSmiPrintsThem) {
  const std::vector<QueryField> fields = parse_compute_app_fields("pid,name,used_memory,gpu_uuid");
  EXPECT_EQ(query_header(fields, parse_query_format("csv")), "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n");
  TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[0].processes.push_back(top_testing::process(12400, "bob", "/usr/bin/python3 -m eval", 0));
  sample.gpus.devices[0].processes.back().used_bytes.reset();
  EXPECT_EQ(compute_app_rows(sample, fields, parse_query_format("csv")),
            "12345, python, 70000 MiB, GPU-00000000\n"
            "12400, /usr/bin/python3, [N/A], GPU-00000000\n"
            "12346, python, 69000 MiB, GPU-00000001\n"
            "4242, [Not Found], 1000 MiB, GPU-00000001\n");
  EXPECT_EQ(compute_app_rows(sample, parse_compute_app_fields("PID, used_gpu_memory"),
                             parse_query_format("csv,noheader,nounits"))
                .substr(0, 12),
            "12345, 70000");
}

TEST(TopQueryApps, NoProcessIsNoLine) {
  TopSample sample = top_testing::two_gpu_sample();
  for (gpu::GpuDevice& d : sample.gpus.devices) d.processes.clear();
  EXPECT_EQ(compute_app_rows(sample, parse_compute_app_fields("pid"), parse_query_format("csv")), "");
}

TEST(TopQueryApps, AFieldNvidiaSmiWouldNotTakeIsAUsageError) {
  for (const char* fields : {"pid,utilization.gpu", "", "index"}) {
    try {
      parse_compute_app_fields(fields);
      ADD_FAILURE() << "took " << fields;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--query-compute-apps"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::tools

// nvidia-smi's --query-gpu and -i for `lockstep top`: the header and values as nvidia-smi
// prints them (units, "[N/A]", its aliases), the formats, and GPUs chosen by index, UUID or
// PCI bus id.
#include "tools/top/top_query.h"

#include <gtest/gtest.h>

#include "lockstep/core/error.h"
#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

TEST(TopQuery, HeaderAndRowsAsNvidiaSmiPrintsThem) {
  const std::vector<QueryField> fields =
      parse_query_fields("index,name,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu,uuid");
  const QueryFormat csv = parse_query_format("csv");
  EXPECT_EQ(query_header(fields, csv),
            "index, name, utilization.gpu [%], memory.used [MiB], power.draw [W], clocks.current.sm [MHz], "
            "temperature.gpu, uuid\n");
  TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[1].power_mw.reset();  // a reading NVML did not give
  EXPECT_EQ(query_rows(sample, fields, csv),
            "0, NVIDIA A100-SXM4-80GB, 97 %, 71234 MiB, 312.40 W, 1410 MHz, 64, GPU-00000000\n"
            "1, NVIDIA A100-SXM4-80GB, 91 %, 70000 MiB, [N/A], 1410 MHz, 64, GPU-00000001\n");
  const QueryFormat bare = parse_query_format("csv,noheader,nounits");
  EXPECT_FALSE(bare.header);
  EXPECT_EQ(query_header(fields, bare).find('['), std::string::npos);
  EXPECT_EQ(query_rows(sample, parse_query_fields("memory.used, power.draw"), bare), "71234, 312.40\n70000, [N/A]\n");
}

TEST(TopQuery, PcieLinkAndMemoryClockFieldsAreNvidiaSmis) {
  const std::vector<QueryField> fields = parse_query_fields(
      "clocks.mem,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max");
  const QueryFormat csv = parse_query_format("csv");
  EXPECT_EQ(query_header(fields, csv),
            "clocks.current.memory [MHz], pcie.link.gen.current, pcie.link.gen.max, pcie.link.width.current, "
            "pcie.link.width.max\n");
  TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[1].pcie_width = 8;
  sample.gpus.devices[1].pcie_generation = 1;  // idle
  EXPECT_EQ(query_rows(sample, fields, csv), "1593 MHz, 4, 4, 16, 16\n1593 MHz, 1, 4, 8, 16\n");
}

TEST(TopQuery, AliasesAndCaseAreNvidiaSmis) {
  const std::vector<QueryField> fields = parse_query_fields("GPU_NAME,gpu_bus_id,clocks.current.sm");
  ASSERT_EQ(fields.size(), 3u);
  EXPECT_EQ(fields[0].name, "name");
  EXPECT_EQ(fields[1].name, "pci.bus_id");
  EXPECT_EQ(fields[2].unit, "MHz");
}

TEST(TopQuery, UnknownFieldsAndFormatsAreRefusedByName) {
  try {
    parse_query_fields("index,fan.speedd");
    FAIL() << "fan.speedd was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"fan.speedd\" is not a valid field"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_query_fields(""), UsageError);
  for (const char* bad : {"json", "csv,noheaders", ""}) EXPECT_THROW(parse_query_format(bad), UsageError) << bad;
  EXPECT_TRUE(parse_query_format("csv,nounits").header);
}

TEST(TopQuery, GpusAreChosenByIndexUuidOrBusIdInNvmlOrder) {
  const TopSample sample = top_testing::two_gpu_sample();
  EXPECT_EQ(select_gpus(sample.gpus, "1,0"), (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(select_gpus(sample.gpus, "GPU-00000001"), (std::vector<unsigned>{1}));
  EXPECT_EQ(select_gpus(sample.gpus, "0000:07:00.0"), (std::vector<unsigned>{0}));  // the driver's spelling
  try {
    select_gpus(sample.gpus, "0,5");
    FAIL() << "GPU 5 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU is '5' (the GPUs are 0,1"), std::string::npos) << e.what();
  }
}

TEST(TopQuery, KeptGpusKeepTheirCudaNumbers) {
  TopSample sample = top_testing::two_gpu_sample();  // CUDA numbers them 1, 0
  keep_gpus(sample, {1});
  ASSERT_EQ(sample.gpus.devices.size(), 1u);
  EXPECT_EQ(sample.gpus.devices[0].index, 1u);
  EXPECT_EQ(sample.cuda_index_of(0), std::optional<unsigned>(0));
}

}  // namespace
}  // namespace lockstep::tools

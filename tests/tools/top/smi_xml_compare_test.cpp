// scripts/smi_xml_compare.py, which gpu-check runs on a GPU machine to set `lockstep top
// --json` beside `nvidia-smi -q -x`, run here on the stand-in NVML: Lockstep's JSON comes from
// the built binary under tests/gpu/profiles/h100-8x.json, nvidia-smi's from a report written
// by hand for that machine (tests/gpu/nvidia-smi-q-x-h100-8x.xml, GPUs 0 and 2). The report
// as written matches everywhere; each change of one value is named, and fails the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

#if defined(LOCKSTEP_NVML_STANDIN)
const std::string kScript = std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/smi_xml_compare.py";
const std::string kFixture = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/gpu/nvidia-smi-q-x-h100-8x.xml";

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class SmiXmlCompare : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lockstep-smi-xml-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `lockstep top --json --once` with these arguments under the H100 profile, in a file.
  fs::path top_json(const std::string& arguments) {
    const fs::path out = dir_ / "top.json";
    const Result r = run_shell(std::string("env LOCKSTEP_NVML_LIBRARY=") + LOCKSTEP_NVML_STANDIN +
                               " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/h100-8x.json " + kBinary +
                               " top --json --once " + arguments + " </dev/null >" + out.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }

  // The fixture with the first `from` of each pair (GPU 0's, where both GPUs have one) made `to`.
  fs::path fixture_with(const std::vector<std::pair<std::string, std::string>>& changes) {
    std::string xml = read_file(kFixture);
    for (const auto& [from, to] : changes) {
      const size_t at = xml.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) xml.replace(at, from.size(), to);
    }
    const fs::path out = dir_ / "changed.xml";
    std::ofstream(out) << xml;
    return out;
  }

  Result compare(const fs::path& xml, const fs::path& top) {
    return run_shell("/usr/bin/python3 " + kScript + " --xml " + xml.string() + " --top " + top.string());
  }

  fs::path dir_;
};

TEST_F(SmiXmlCompare, TheReportWrittenForTheProfileIsTheSameEverywhere) {
  const Result r = compare(kFixture, top_json("-i 0,2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // 2 system fields and 21 per GPU; retired pages (2 fields) are neither side's on Hopper.
  EXPECT_NE(r.output.find("summary: 44 same, 0 differ, 0 missing, 4 n/a on both"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("gpu 2 00000000:3A:00.0  remapped_rows/remapped_row_corr: same (3)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("gpu 0 00000000:18:00.0  fb_memory_usage/total: same (81559 MiB)"), std::string::npos)
      << r.output;
}

// The same report read from stdin, as gpu-check could pipe it.
TEST_F(SmiXmlCompare, ReadsTheReportFromStdin) {
  const Result r =
      run_shell("/usr/bin/python3 " + kScript + " --xml - --top " + top_json("-i 0,2").string() + " <" + kFixture);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

struct Change {
  std::string name;      // the test's name
  std::string from, to;  // in the fixture, GPU 0's unless the value is GPU 2's alone
  std::string line;      // what the comparison must print
};

void PrintTo(const Change& change, std::ostream* out) { *out << change.name; }

class SmiXmlCompareChange : public SmiXmlCompare, public ::testing::WithParamInterface<Change> {};

TEST_P(SmiXmlCompareChange, NamesTheFieldAndFails) {
  const Change& change = GetParam();
  const Result r = compare(fixture_with({{change.from, change.to}}), top_json("-i 0,2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(change.line), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("0 differ, 0 missing"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    OneValue, SmiXmlCompareChange,
    ::testing::Values(
        Change{"RemappedRows", "<remapped_row_corr>3<", "<remapped_row_corr>4<",
               "gpu 2 00000000:3A:00.0  remapped_rows/remapped_row_corr: differs: ours 3, nvidia-smi 4"},
        Change{"MaxSmClock", "<sm_clock>1980 MHz<", "<sm_clock>1755 MHz<",
               "gpu 0 00000000:18:00.0  max_clocks/sm_clock: differs: ours 1980 MHz, nvidia-smi 1755 MHz"},
        Change{"MemoryTotal", "<total>81559 MiB<", "<total>81920 MiB<",
               "fb_memory_usage/total: differs: ours 81559 MiB, nvidia-smi 81920 MiB"},
        Change{"PowerLimit", "<current_power_limit>700.00 W<", "<current_power_limit>699.99 W<",
               "gpu_power_readings/current_power_limit: differs: ours 700.00 W, nvidia-smi 699.99 W"},
        Change{"LinkWidth", "<current_link_width>16x<", "<current_link_width>8x<",
               "link_widths/current_link_width: differs: ours 16x, nvidia-smi 8x"},
        Change{"GpuPcieGeneration", "<max_device_link_gen>5<", "<max_device_link_gen>4<",
               "pcie_gen/max_device_link_gen: differs: ours 5, nvidia-smi 4"},
        Change{"PersistenceMode", "<persistence_mode>Enabled<", "<persistence_mode>Disabled<",
               "persistence_mode: differs: ours Enabled, nvidia-smi Disabled"},
        Change{"EccErrors", "<dram_uncorrectable>0<", "<dram_uncorrectable>2<",
               "ecc_errors/volatile (uncorrected, summed): differs: ours 0, nvidia-smi 2"},
        Change{"SramEccErrors", "<sram_uncorrectable_secded>0<", "<sram_uncorrectable_secded>1<",
               "ecc_errors/volatile (uncorrected, summed): differs: ours 0, nvidia-smi 1"},
        Change{"RemapPending", "<remapped_row_pending>No<", "<remapped_row_pending>Yes<",
               "remapped_rows/remapped_row_pending: differs: ours No, nvidia-smi Yes"},
        Change{"FabricState", "<state>Completed<", "<state>In Progress<",
               "fabric/state: differs: ours completed, nvidia-smi in_progress"},
        Change{"Uuid", "<uuid>GPU-344e1aa0", "<uuid>GPU-344e1aa1",
               "uuid: differs: ours GPU-344e1aa0-d0ea-ba06-729f-5261a1d94e06, nvidia-smi "
               "GPU-344e1aa1-d0ea-ba06-729f-5261a1d94e06"},
        Change{"CudaVersion", "<cuda_version>12.4<", "<cuda_version>12.2<",
               "cuda_version: differs: ours 12.4, nvidia-smi 12.2"},
        // A reading one side lacks fails as surely as one that differs.
        Change{"PowerLimitNotGiven", "<current_power_limit>700.00 W<", "<current_power_limit>N/A<",
               "gpu_power_readings/current_power_limit: missing on nvidia-smi: ours 700.00 W, nvidia-smi -"},
        Change{"RemappedRowsLeftOut", "<remapped_row_corr>0</remapped_row_corr>", "",
               "gpu 0 00000000:18:00.0  remapped_rows/remapped_row_corr: missing on nvidia-smi: ours 0, nvidia-smi -"},
        Change{"RetiredPagesOnOneSide", "<retired_count>N/A<", "<retired_count>0<",
               "retired_pages/retired_count (single + double bit): missing on ours: ours -, nvidia-smi 0"}),
    [](const ::testing::TestParamInfo<Change>& info) { return info.param.name; });

// Drivers before R530 write the enforced power limit under power_readings and the volatile
// ECC errors as single- and double-bit totals (as R470's reports do); read the same.
TEST_F(SmiXmlCompare, ReadsTheLayoutOfOlderDrivers) {
  const std::string old_ecc =
      "<volatile>\n<single_bit>\n<device_memory>0</device_memory>\n<register_file>0</register_file>\n"
      "<l1_cache>0</l1_cache>\n<l2_cache>0</l2_cache>\n<texture_memory>N/A</texture_memory>\n"
      "<texture_shm>N/A</texture_shm>\n<cbu>N/A</cbu>\n<total>0</total>\n</single_bit>\n<double_bit>\n"
      "<device_memory>0</device_memory>\n<register_file>0</register_file>\n<l1_cache>0</l1_cache>\n"
      "<l2_cache>0</l2_cache>\n<texture_memory>N/A</texture_memory>\n<texture_shm>N/A</texture_shm>\n"
      "<cbu>N/A</cbu>\n<total>0</total>\n</double_bit>\n</volatile>";
  const std::string fixture = read_file(kFixture);
  const size_t begin = fixture.find("<volatile>");
  const size_t end = fixture.find("</volatile>") + std::string("</volatile>").size();
  const std::string new_ecc = fixture.substr(begin, end - begin);
  const Result r = compare(fixture_with({{"<gpu_power_readings>", "<power_readings>"},
                                         {"<current_power_limit>700.00 W</current_power_limit>",
                                          "<power_limit>700.00 W</power_limit>\n<default_power_limit>700.00 W"
                                          "</default_power_limit>\n<enforced_power_limit>700.00 W"
                                          "</enforced_power_limit>"},
                                         {"</gpu_power_readings>", "</power_readings>"},
                                         {new_ecc, old_ecc}}),
                           top_json("-i 0,2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("summary: 44 same, 0 differ, 0 missing"), std::string::npos) << r.output;
  const Result changed = compare(
      fixture_with({{new_ecc, old_ecc}, {"<total>0</total>\n</double_bit>", "<total>5</total>\n</double_bit>"}}),
      top_json("-i 0,2"));
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_NE(changed.output.find("ecc_errors/volatile (uncorrected, summed): differs: ours 0, nvidia-smi 5"),
            std::string::npos)
      << changed.output;
}

// A reading every GPU has (here the SM's highest clock) that neither side gives fails too:
// nothing was compared. Lockstep's side is edited to null, as where NVML's call fails.
TEST_F(SmiXmlCompare, ARequiredReadingNeitherSideGivesFails) {
  const fs::path top = top_json("-i 0,2");
  std::string json = read_file(top);
  const std::string reading = "\"sm_clock_max_mhz\":1980";
  ASSERT_NE(json.find(reading), std::string::npos) << json;
  json.replace(json.find(reading), reading.size(), "\"sm_clock_max_mhz\":null");
  std::ofstream(top) << json;
  const Result r = compare(fixture_with({{"<sm_clock>1980 MHz<", "<sm_clock>N/A<"}}), top);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("gpu 0 00000000:18:00.0  max_clocks/sm_clock: missing on both sides"), std::string::npos)
      << r.output;
}

// A GPU on one side only is named: top's 8 GPUs against the report's 2, and top's GPU 0
// against the report's 0 and 2.
TEST_F(SmiXmlCompare, AGpuOnOneSideOnlyFails) {
  Result r = compare(kFixture, top_json(""));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("gpu 1 00000000:2A:00.0  not in nvidia-smi's report"), std::string::npos) << r.output;
  r = compare(kFixture, top_json("-i 0"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("00000000:3A:00.0  in nvidia-smi's report, not in ours"), std::string::npos) << r.output;
}

TEST_F(SmiXmlCompare, InputThatIsNotAReportIsAnError) {
  const fs::path top = top_json("-i 0,2");
  Result r = compare(top, top);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const fs::path other = dir_ / "other.xml";
  std::ofstream(other) << "<?xml version=\"1.0\" ?>\n<log><gpu id=\"00000000:18:00.0\"/></log>\n";
  r = compare(other, top);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not nvidia-smi's XML"), std::string::npos) << r.output;
  r = compare(kFixture, kFixture);
  EXPECT_EQ(r.exit_code, 2) << r.output;
}
#endif

}  // namespace
}  // namespace lockstep

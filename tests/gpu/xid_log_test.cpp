// The driver's Xid lines as /dev/kmsg, dmesg and the journal print them, parsed into events;
// the lines are the driver's own wording (NVIDIA's Xid catalog and bug reports).
#include "lockstep/gpu/xid_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep::gpu {
namespace {

TEST(XidLog, ParsesAKmsgRecord) {
  XidEvent event;
  ASSERT_TRUE(parse_xid_line(
      "6,1234,5678901,-;NVRM: Xid (PCI:0000:07:00): 79, pid=1234, name=python, GPU has fallen off the bus.", event));
  EXPECT_EQ(event.pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(event.xid, 79);
  EXPECT_EQ(event.message, "pid=1234, name=python, GPU has fallen off the bus.");
}

TEST(XidLog, ParsesDmesgAndJournalLinesAndOldDriversWithoutPci) {
  XidEvent event;
  ASSERT_TRUE(
      parse_xid_line("[  123.456789] NVRM: Xid (PCI:0000:3B:00): 48, pid='<unknown>', name=<unknown>, An "
                     "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
                     event));
  EXPECT_EQ(event.pci_bus_id, "0000:3b:00.0");  // lower case, like the driver's folder names
  EXPECT_EQ(event.xid, 48);
  ASSERT_TRUE(parse_xid_line("Jan 18 11:38:05 gpu7 kernel: NVRM: Xid (0000:01:00): 13, Graphics Exception", event));
  EXPECT_EQ(event.pci_bus_id, "0000:01:00.0");
  EXPECT_EQ(event.xid, 13);
  EXPECT_EQ(event.message, "Graphics Exception");
}

TEST(XidLog, ParsesAMigInstanceAndAnXidWithNoMessage) {
  XidEvent event;
  ASSERT_TRUE(parse_xid_line("NVRM: Xid (PCI:0000:c1:00 GPU-I:05): 43, pid=88, Ch 00000010", event));
  EXPECT_EQ(event.pci_bus_id, "0000:c1:00.0");
  EXPECT_EQ(event.xid, 43);
  ASSERT_TRUE(parse_xid_line("NVRM: Xid (PCI:0000:07:00): 154", event));
  EXPECT_EQ(event.xid, 154);
  EXPECT_EQ(event.message, "");
}

TEST(XidLog, IgnoresOtherLinesAndBrokenOnes) {
  XidEvent event;
  EXPECT_FALSE(parse_xid_line("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", event));
  EXPECT_FALSE(parse_xid_line("NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.", event));
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (43, pid: 5678): ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", event));
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (PCI:0000:07:00): pid=1, no number", event));
  EXPECT_FALSE(parse_xid_line("NVRM: Xid (PCI:0000:07:00", event));
  EXPECT_FALSE(parse_xid_line("", event));
}

TEST(XidLog, ParsesEveryXidOfALogInOrder) {
  const std::string log =
      "6,900,100,-;nvidia: loading out-of-tree module taints kernel.\n"
      "4,901,200,-;NVRM: Xid (PCI:0000:07:00): 94, pid=77, name=python3, Contained: SM (0x1). RST: No, D-RST: No\n"
      " SUBSYSTEM=pci\n"  // a kmsg record's dictionary line
      "4,902,300,-;NVRM: Xid (PCI:0000:0f:00): 31, pid=78, name=python3, Ch 00000008, intr 00000000. MMU Fault\n"
      "4,903,400,-;NVRM: Xid (PCI:0000:07:00): 94, pid=79, name=python3, Contained: SM (0x1).";  // no final newline
  const std::vector<XidEvent> events = parse_xid_log(log);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].xid, 94);
  EXPECT_EQ(events[1].pci_bus_id, "0000:0f:00.0");
  EXPECT_EQ(events[1].xid, 31);
  EXPECT_EQ(events[2].message, "pid=79, name=python3, Contained: SM (0x1).");
  EXPECT_TRUE(parse_xid_log("").empty());
}

TEST(XidLog, KnowsWhichXidsAreSerious) {
  for (int xid : {32, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 140, 154}) {
    EXPECT_TRUE(xid_meaning(xid).serious) << xid;
    EXPECT_FALSE(xid_meaning(xid).text.empty()) << xid;
  }
  for (int xid : {13, 31, 43, 45, 68, 69}) {
    EXPECT_FALSE(xid_meaning(xid).serious) << xid;
    EXPECT_FALSE(xid_meaning(xid).text.empty()) << xid;
  }
  EXPECT_EQ(xid_meaning(79).text, "GPU has fallen off the bus");
  EXPECT_EQ(xid_meaning(74).text, "NVLink error");
  EXPECT_TRUE(xid_meaning(9999).text.empty());
  EXPECT_FALSE(xid_meaning(9999).serious);
}

// top follows the log: each read hands out only what was added since the last, and a line
// still being written waits until it is whole. A fake log is a regular file, as in doctor's tests.
TEST(XidLog, AFollowerReadsOnlyWhatWasAddedAndWholeLinesOnly) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("lockstep-kmsg-" + std::to_string(getpid()));
  {
    std::ofstream out(path);
    out << "[ 1.0] Linux version 6.1.0\n"
        << "[ 5.0] NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
        << "[ 6.0] NVRM: Xid (PCI:0000:0f:00): 13, Graphics Exception\n";
  }
  XidLogFollower log(path.string());
  std::vector<XidEvent> events;
  ASSERT_TRUE(log.read(events));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(events[0].xid, 79);
  EXPECT_EQ(events[1].xid, 13);
  events.clear();
  ASSERT_TRUE(log.read(events));
  EXPECT_TRUE(events.empty()) << "the same reports read twice";
  {
    std::ofstream out(path, std::ios::app);
    out << "[ 7.0] NVRM: Xid (PCI:0000:07:00): 48, An uncorrectable double bit error\n"
        << "[ 8.0] NVRM: Xid (PCI:0000:07:00): 9";  // still being written
  }
  ASSERT_TRUE(log.read(events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].xid, 48);
  events.clear();
  {
    std::ofstream out(path, std::ios::app);
    out << "4, GSP error\n";
  }
  ASSERT_TRUE(log.read(events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].xid, 94);
  std::filesystem::remove(path);

  XidLogFollower missing((path.string() + ".none"));
  EXPECT_FALSE(missing.read(events)) << "an unreadable log is unknown, not clean";
}

}  // namespace
}  // namespace lockstep::gpu

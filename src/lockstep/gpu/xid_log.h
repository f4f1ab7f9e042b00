// Xid errors: the NVIDIA driver's reports of GPU faults, which it writes only to the kernel
// log ("NVRM: Xid (PCI:0000:07:00): 79, pid=1234, name=python, GPU has fallen off the bus.").
// NVML has no history of them, so a GPU that fell off the bus an hour ago and came back
// after a reset leaves its trace only here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::gpu {

struct XidEvent {
  std::string pci_bus_id;  // normalized like the driver's folder names: "0000:07:00.0"
  int xid = 0;
  std::string message;  // what follows the Xid number: "pid=1234, name=python, GPU has fallen off the bus."
};

// The event in one kernel log line: a /dev/kmsg record ("6,1234,5678901,-;NVRM: Xid ..."),
// a dmesg line ("[  123.456] NVRM: Xid ...") or a journal line; false when it is none.
bool parse_xid_line(std::string_view line, XidEvent& event);

// Every Xid event in a text of such lines, in their order.
std::vector<XidEvent> parse_xid_log(std::string_view text);

// What an Xid means, from NVIDIA's Xid catalog. Serious ones are the hardware's or the
// driver's (the GPU needs a reset, a reboot or a replacement); the others are usually a
// program's fault (a bad memory access, a killed process) and the GPU is fine.
struct XidMeaning {
  std::string text;  // "GPU has fallen off the bus"; empty for an Xid this table does not know
  bool serious = false;
};
XidMeaning xid_meaning(int xid);

// Follows a kernel log for `lockstep top`: each read() hands out the Xid events added since
// the last one (the first, every one the log still holds). /dev/kmsg is opened once, without
// blocking, and reads on from its last record (records the kernel overwrote meanwhile are
// lost, EPIPE); a regular file (tests' fake log) is read on from where the last read ended,
// a last line without its newline kept until it is whole.
class XidLogFollower {
 public:
  explicit XidLogFollower(std::string path = "/dev/kmsg");
  ~XidLogFollower();
  XidLogFollower(const XidLogFollower&) = delete;
  XidLogFollower& operator=(const XidLogFollower&) = delete;
  // Appends the new events to events; false when the log cannot be read (it needs root or
  // CAP_SYSLOG, which a container seldom has), whatever earlier reads gave.
  bool read(std::vector<XidEvent>& events);

 private:
  std::string path_;
  int fd_ = -1;
  bool records_ = false;  // a character device: one record per read()
  std::string partial_;   // a regular file's unfinished last line
};

}  // namespace lockstep::gpu

#include "lockstep/gpu/xid_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>

#include "lockstep/gpu/pci_bus_id.h"

namespace lockstep::gpu {
namespace {

constexpr std::string_view kXidMarker = "NVRM: Xid (";

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool is_hex_or_separator(char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; }

// "PCI:0000:07:00" (or "0000:07:00", and under MIG "PCI:0000:07:00 GPU-I:05") → "0000:07:00.0".
// The driver leaves the function out of the Xid line; GPUs are function 0.
bool parse_bus_id(std::string_view inside, std::string& bus_id) {
  inside = trim(inside);
  if (inside.substr(0, 4) == "PCI:") inside.remove_prefix(4);
  inside = inside.substr(0, inside.find(' '));
  if (inside.find(':') == std::string_view::npos) return false;
  for (char c : inside) {
    if (!is_hex_or_separator(c)) return false;
  }
  bus_id = normalize_pci_bus_id(std::string(inside));
  if (bus_id.find('.') == std::string::npos) bus_id += ".0";
  return true;
}

}  // namespace

bool parse_xid_line(std::string_view line, XidEvent& event) {
  const auto marker = line.find(kXidMarker);
  if (marker == std::string_view::npos) return false;
  std::string_view rest = line.substr(marker + kXidMarker.size());
  const auto close = rest.find("):");
  if (close == std::string_view::npos || !parse_bus_id(rest.substr(0, close), event.pci_bus_id)) return false;
  rest = trim(rest.substr(close + 2));
  size_t digits = 0;
  while (digits < rest.size() && digits < 6 && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
  if (digits == 0) return false;
  event.xid = std::stoi(std::string(rest.substr(0, digits)));
  rest.remove_prefix(digits);
  if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
  event.message = std::string(trim(rest));
  return true;
}

std::vector<XidEvent> parse_xid_log(std::string_view text) {
  std::vector<XidEvent> events;
  while (!text.empty()) {
    const auto end = text.find('\n');
    XidEvent event;
    if (parse_xid_line(text.substr(0, end), event)) events.push_back(std::move(event));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return events;
}

// NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors), shortened; "serious" follows its
// resolution buckets: a reset, a reboot or service, rather than restarting the program.
XidMeaning xid_meaning(int xid) {
  switch (xid) {
    case 13:
      return {"graphics engine exception (an out-of-range access or illegal instruction in a kernel)", false};
    case 31:
      return {"GPU memory page fault (a kernel used an invalid address)", false};
    case 32:
      return {
          "invalid or corrupted push buffer stream (the driver's commands were corrupted on the way: PCIe or "
          "system memory)",
          true};
    case 43:
      return {"GPU stopped processing (a program's fault ended its channel)", false};
    case 45:
      return {"preemptive cleanup (a process was killed or ended after an earlier error)", false};
    case 48:
      return {"double-bit ECC error (an uncorrectable memory error)", true};
    case 61:
      return {"internal micro-controller breakpoint or warning", true};
    case 62:
      return {"internal micro-controller halt", true};
    case 63:
      return {"ECC page retirement or row remapping recorded (takes effect at the next GPU reset)", true};
    case 64:
      return {"ECC page retirement or row remapping failed", true};
    case 68:
      return {"video decoder (NVDEC) exception", false};
    case 69:
      return {"graphics engine class error (an invalid operation in a program's commands)", false};
    case 74:
      return {"NVLink error", true};
    case 79:
      return {"GPU has fallen off the bus", true};
    case 92:
      return {"high single-bit ECC error rate", true};
    case 94:
      return {"contained ECC error (an uncorrectable memory error, confined to the program that hit it)", true};
    case 95:
      return {"uncontained ECC error (an uncorrectable memory error any program on the GPU may have read)", true};
    case 119:
      return {"GSP RPC timeout (the GPU System Processor stopped answering the driver)", true};
    case 120:
      return {"GSP error (the GPU System Processor faulted)", true};
    case 121:
      return {"C2C link error (the chip-to-chip link between a Grace CPU and its GPU)", true};
    case 140:
      return {"unrecovered ECC error", true};
    case 154:
      return {"GPU recovery action changed (the driver asks for a GPU reset, a reboot or a drain)", true};
    default:
      return {"", false};
  }
}

XidLogFollower::XidLogFollower(std::string path) : path_(std::move(path)) {}

XidLogFollower::~XidLogFollower() {
  if (fd_ >= 0) close(fd_);
}

bool XidLogFollower::read(std::vector<XidEvent>& events) {
  if (fd_ < 0) {
    fd_ = open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) return false;
    struct stat info {};
    records_ = fstat(fd_, &info) == 0 && S_ISCHR(info.st_mode);
  }
  std::vector<char> buffer(16384);                // above the kernel's 8 KiB limit on one record
  constexpr size_t kMaxBytes = size_t{64} << 20;  // a log growing as fast as it is read stops here
  for (size_t total = 0; total < kMaxBytes;) {
    const ssize_t n = ::read(fd_, buffer.data(), buffer.size());
    if (n < 0 && (errno == EINTR || (records_ && errno == EPIPE))) continue;
    if (n == 0 || (n < 0 && errno == EAGAIN)) return true;
    if (n < 0) return false;
    total += static_cast<size_t>(n);
    if (records_) {
      // A record is "prefix;message\n", then its dictionary (" SUBSYSTEM=pci", …) on more lines.
      const std::string_view record(buffer.data(), static_cast<size_t>(n));
      XidEvent event;
      if (parse_xid_line(record.substr(0, record.find('\n')), event)) events.push_back(std::move(event));
      continue;
    }
    partial_.append(buffer.data(), static_cast<size_t>(n));
    const auto last_newline = partial_.rfind('\n');
    if (last_newline == std::string::npos) continue;
    for (XidEvent& event : parse_xid_log(std::string_view(partial_).substr(0, last_newline)))
      events.push_back(std::move(event));
    partial_.erase(0, last_newline + 1);
  }
  return true;
}

}  // namespace lockstep::gpu

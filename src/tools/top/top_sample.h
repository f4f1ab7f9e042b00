// One sample of `lockstep top`: the GPUs as NVML read them or, on a host without NVML, the
// CPU cores and memory, with the alerts they raise. Every output (the full-screen view,
// plain lines, JSON, the log, the Prometheus page) renders this one value, so each can be
// tested with samples built by hand.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/gpu/gpu_state.h"
#include "lockstep/gpu/pci_bus_id.h"
#include "tools/top/cpu_usage.h"

namespace lockstep::tools {

struct Alert {
  std::string kind;               // "imbalance", "memory", "thermal", "power", "xid"
  std::vector<unsigned> devices;  // NVML indexes
  std::string message;            // one line a person reads
};

// The Xid errors the kernel log holds for one GPU since `lockstep top` started reading it
// (the first read takes in all the log still keeps, so usually since boot).
struct XidTally {
  int last = 0;        // the last Xid seen: dcgm-exporter's DCGM_FI_DEV_XID_ERRORS; 0 for none
  uint64_t count = 0;  // how many reports
};

struct TopSample {
  std::chrono::system_clock::time_point taken;
  gpu::GpuState gpus;
  // Where CUDA numbers each GPU (by position in gpus.devices), when known; and a line that
  // says so where CUDA's order differs from NVML's.
  std::vector<std::optional<unsigned>> cuda_index;
  std::string order_warning;
  // GPUs `lockstep run` jobs lease (gpu/gpu_leases.h), by NVML index: what holds each.
  std::map<unsigned, std::string> leases;
  CpuSample cpu;                   // the view when there is no GPU to show
  std::string nvml_library_tried;  // the file NVML was looked for in, for the no-GPU line
  std::vector<Alert> alerts;
  // The kernel log's Xid errors by GPU, keyed by normalize_pci_bus_id (gpu/pci_bus_id.h);
  // xid_log_read false when the log cannot be read (root or CAP_SYSLOG): no figures then.
  bool xid_log_read = false;
  std::map<std::string, XidTally> xids;

  bool shows_gpus() const { return gpus.loaded() && !gpus.devices.empty(); }
  // A GPU's tally (zero where the log holds none for it); none when the log is unread.
  std::optional<XidTally> xids_of(const gpu::GpuDevice& device) const {
    if (!xid_log_read) return std::nullopt;
    const auto found = xids.find(gpu::normalize_pci_bus_id(device.pci_bus_id));
    return found == xids.end() ? XidTally{} : found->second;
  }
  std::optional<unsigned> cuda_index_of(size_t position) const {
    return position < cuda_index.size() ? cuda_index[position] : std::nullopt;
  }
};

}  // namespace lockstep::tools

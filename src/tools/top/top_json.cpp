#include "tools/top/top_json.h"

#include "tools/top/top_lines.h"

namespace lockstep::tools {
namespace {

template <typename T>
nlohmann::json or_null(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json watts(const std::optional<unsigned>& milliwatts) {
  return milliwatts ? nlohmann::json(*milliwatts / 1000.0) : nlohmann::json(nullptr);
}

// GPM's activity since the previous sample as fractions; null before the second sample and
// on GPUs without GPM.
nlohmann::json gpm_json(const std::optional<gpu::GpmActivity>& gpm) {
  if (!gpm) return nullptr;
  return {{"graphics_engine", or_null(gpm->graphics_engine)},
          {"sm", or_null(gpm->sm)},
          {"sm_occupancy", or_null(gpm->sm_occupancy)},
          {"tensor", or_null(gpm->tensor)},
          {"dram", or_null(gpm->dram)},
          {"fp64", or_null(gpm->fp64)},
          {"fp32", or_null(gpm->fp32)},
          {"fp16", or_null(gpm->fp16)}};
}

// The health readings that stay put between samples, which `nvidia-smi -q` shows too
// (scripts/smi_xml_compare.py compares them on a GPU machine). A section the GPU does not
// have (retired pages from Ampere on, remapped rows before Ampere, the fabric without
// NVSwitches) is null; within one, an unknown reading is null.
nlohmann::json ecc_json(const gpu::GpuDevice& device) {
  return {{"enabled", or_null(device.ecc_enabled)},
          {"corrected_volatile", or_null(device.ecc_corrected_volatile)},
          {"uncorrected_volatile", or_null(device.ecc_uncorrected_volatile)}};
}

nlohmann::json retired_pages_json(const gpu::GpuDevice& device) {
  if (!device.retired_pages) return nullptr;
  return {{"count", *device.retired_pages}, {"pending", or_null(device.retired_pages_pending)}};
}

nlohmann::json remapped_rows_json(const gpu::GpuDevice& device) {
  if (!device.remapped_rows_correctable) return nullptr;
  return {{"correctable", *device.remapped_rows_correctable},
          {"uncorrectable", or_null(device.remapped_rows_uncorrectable)},
          {"pending", or_null(device.remap_pending)},
          {"failure", or_null(device.remap_failed)}};
}

nlohmann::json fabric_json(const gpu::GpuDevice& device) {
  if (!device.fabric_state) return nullptr;
  const char* state = "completed";
  if (*device.fabric_state == gpu::FabricState::kNotStarted) state = "not_started";
  if (*device.fabric_state == gpu::FabricState::kInProgress) state = "in_progress";
  return {{"state", state}, {"error", device.fabric_error}};
}

nlohmann::json device_json(const gpu::GpuDevice& device, std::optional<unsigned> cuda_index) {
  nlohmann::json processes = nlohmann::json::array();
  for (const gpu::GpuProcess& p : device.processes) {
    nlohmann::json process = {{"pid", p.pid}, {"used_bytes", or_null(p.used_bytes)}};
    process["sm_utilization"] = or_null(p.sm_utilization);
    process["memory_utilization"] = or_null(p.memory_utilization);
    process["in_this_namespace"] = p.in_this_namespace;
    if (p.in_this_namespace) {
      process["user"] = p.user;
      process["command"] = p.command;
    }
    processes.push_back(process);
  }
  return {{"index", device.index},
          {"cuda_index", or_null(cuda_index)},
          {"name", device.name},
          {"uuid", device.uuid},
          {"pci_bus_id", device.pci_bus_id},
          {"utilization_gpu", or_null(device.utilization_gpu)},
          {"utilization_memory", or_null(device.utilization_memory)},
          {"memory_used", device.memory_used},
          {"memory_total", device.memory_total},
          {"memory_reserved", device.memory_reserved},
          {"temperature_c", or_null(device.temperature_c)},
          {"power_w", watts(device.power_mw)},
          {"power_limit_w", watts(device.power_limit_mw)},
          {"sm_clock_mhz", or_null(device.sm_clock_mhz)},
          {"sm_clock_max_mhz", or_null(device.sm_clock_max_mhz)},
          {"memory_clock_mhz", or_null(device.memory_clock_mhz)},
          {"energy_mj", or_null(device.energy_mj)},
          {"pcie",
           {{"generation", or_null(device.pcie_generation)},
            {"generation_max", or_null(device.pcie_generation_max)},
            {"generation_gpu_max", or_null(device.pcie_generation_gpu_max)},
            {"width", or_null(device.pcie_width)},
            {"width_max", or_null(device.pcie_width_max)},
            {"tx_kb_per_s", or_null(device.pcie_tx_kb_per_s)},
            {"rx_kb_per_s", or_null(device.pcie_rx_kb_per_s)}}},
          {"throttle_reasons", device.throttle_reasons
                                   ? nlohmann::json(gpu::throttle_reason_names(*device.throttle_reasons))
                                   : nlohmann::json(nullptr)},
          {"persistence_mode", or_null(device.persistence_mode)},
          {"ecc", ecc_json(device)},
          {"retired_pages", retired_pages_json(device)},
          {"remapped_rows", remapped_rows_json(device)},
          {"fabric", fabric_json(device)},
          {"gpm", gpm_json(device.gpm)},
          {"processes", processes},
          {"unavailable", device.unavailable}};
}

}  // namespace

nlohmann::json sample_json(const TopSample& sample) {
  nlohmann::json out = {{"time", utc_timestamp(sample.taken)}};
  if (sample.shows_gpus()) {
    out["driver_version"] = sample.gpus.driver_version;
    out["cuda_driver_version"] = sample.gpus.cuda_driver_version;
    out["nvml_library"] = sample.gpus.library_path;
    if (!sample.order_warning.empty()) out["order_warning"] = sample.order_warning;
    nlohmann::json gpus = nlohmann::json::array();
    for (size_t i = 0; i < sample.gpus.devices.size(); ++i) {
      nlohmann::json device = device_json(sample.gpus.devices[i], sample.cuda_index_of(i));
      if (const auto lease = sample.leases.find(sample.gpus.devices[i].index); lease != sample.leases.end())
        device["lease"] = lease->second;
      // The kernel log's Xid errors (null where it cannot be read): the last Xid, 0 for none.
      const std::optional<XidTally> xids = sample.xids_of(sample.gpus.devices[i]);
      device["xid_last"] = xids ? nlohmann::json(xids->last) : nlohmann::json(nullptr);
      device["xid_errors"] = xids ? nlohmann::json(xids->count) : nlohmann::json(nullptr);
      gpus.push_back(device);
    }
    out["gpus"] = gpus;
  } else {
    out["no_gpu"] = cpu_view_reason(sample);
    out["cpu"] = {{"core_utilization", sample.cpu.core_utilization},
                  {"memory_used", sample.cpu.memory.used()},
                  {"memory_total", sample.cpu.memory.total}};
  }
  nlohmann::json alerts = nlohmann::json::array();
  for (const Alert& alert : sample.alerts)
    alerts.push_back({{"kind", alert.kind}, {"devices", alert.devices}, {"message", alert.message}});
  out["alerts"] = alerts;
  return out;
}

}  // namespace lockstep::tools

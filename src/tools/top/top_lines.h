// `lockstep top`'s text: the rows the full-screen view and the plain output share, and the
// plain block printed per sample when stdout is not a terminal (no escape codes).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tools/top/top_sample.h"

namespace lockstep::tools {

// "2024-05-01 12:00:00" in local time, for people; logs use utc_timestamp.
std::string local_time(std::chrono::system_clock::time_point when);
// "2024-05-01T12:00:00.123Z", for logs and JSON.
std::string utc_timestamp(std::chrono::system_clock::time_point when);

// "driver 535.129.03  CUDA 12.2  NVML /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
std::string driver_line(const TopSample& sample);
// "no NVIDIA driver found (libnvidia-ml.so.1: ...); showing the CPU cores"
std::string cpu_view_reason(const TopSample& sample);

std::string device_header();
// "  0    0 NVIDIA A100-SXM4-80GB       97%    45%  71234 / 81920 MiB   64C  312 / 400 W  1410 MHz  none"
std::string device_row(const gpu::GpuDevice& device, std::optional<unsigned> cuda_index);
// One row per NVML call that failed for the device ("unavailable: nvmlDeviceGetPowerUsage:
// Unknown Error"), then one per process: "pid 12345  71000 MiB  alice  python train.py", or
// for a process from another PID namespace, a row that says so.
std::vector<std::string> process_rows(const gpu::GpuDevice& device);
// The row under a GPU that a `lockstep run` job leases ("leased by pid 12 (user ana): ..."),
// or none.
std::vector<std::string> lease_rows(const TopSample& sample, const gpu::GpuDevice& device);

std::string core_header();
std::string core_row(size_t core, double percent);
std::string host_memory_row(const HostMemory& memory);

std::string alert_row(const Alert& alert);

// Every row of one sample, ending with a newline, for pipes and files.
std::string plain_block(const TopSample& sample);

}  // namespace lockstep::tools

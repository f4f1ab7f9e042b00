#include "tools/top/top_metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

struct Metric {
  const char* name;
  const char* type;
  const char* help;  // dcgm-exporter's wording, units included
  std::function<std::optional<std::string>(const gpu::GpuDevice&)> value;
};

template <typename T>
std::optional<std::string> text(const std::optional<T>& value) {
  return value ? std::optional<std::string>(std::to_string(*value)) : std::nullopt;
}

std::optional<std::string> watts(const std::optional<unsigned>& milliwatts) {
  if (!milliwatts) return std::nullopt;
  char out[32];
  std::snprintf(out, sizeof(out), "%.3f", *milliwatts / 1000.0);
  return out;
}

// Framebuffer figures in MiB; none when the memory call failed (total 0).
std::optional<std::string> mib(const gpu::GpuDevice& d, uint64_t bytes) {
  return d.memory_total == 0 ? std::nullopt : std::optional<std::string>(std::to_string(bytes / kMiB));
}

// NVML's KB/s as bytes per second: DCGM's profiling PCIe fields are rates in bytes.
std::optional<std::string> bytes_per_second(const std::optional<unsigned>& kb_per_s) {
  return kb_per_s ? std::optional<std::string>(std::to_string(uint64_t{*kb_per_s} * 1024)) : std::nullopt;
}

// GPM's activity as DCGM's profiling fields give it: a ratio, 0 to 1.
std::optional<std::string> ratio(const gpu::GpuDevice& d, std::optional<double> gpu::GpmActivity::*field) {
  if (!d.gpm || !(*d.gpm.*field)) return std::nullopt;
  char out[32];
  std::snprintf(out, sizeof(out), "%.6f", *(*d.gpm.*field));
  return out;
}

template <typename Field>
std::optional<std::string> nvlink(const gpu::GpuDevice& d, Field field) {
  return d.nvlink_errors ? std::optional<std::string>(std::to_string(field(*d.nvlink_errors))) : std::nullopt;
}

// dcgm-exporter's names (etc/default-counters.csv and the DCGM field list).
const std::vector<Metric>& metrics() {
  static const std::vector<Metric> kMetrics = {
      {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
       [](const gpu::GpuDevice& d) { return text(d.sm_clock_mhz); }},
      {"DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
       [](const gpu::GpuDevice& d) { return text(d.memory_clock_mhz); }},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
       [](const gpu::GpuDevice& d) { return text(d.energy_mj); }},
      // NVML's 20 ms sample of the link's traffic, where DCGM counts it in hardware.
      {"DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus (in bytes per second).",
       [](const gpu::GpuDevice& d) { return bytes_per_second(d.pcie_tx_kb_per_s); }},
      {"DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus (in bytes per second).",
       [](const gpu::GpuDevice& d) { return bytes_per_second(d.pcie_rx_kb_per_s); }},
      {"DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.",
       [](const gpu::GpuDevice& d) { return text(d.pcie_generation); }},
      {"DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.",
       [](const gpu::GpuDevice& d) { return text(d.pcie_width); }},
      {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
       [](const gpu::GpuDevice& d) { return nvlink(d, [](const gpu::NvlinkErrors& e) { return e.replay; }); }},
      {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors.",
       [](const gpu::GpuDevice& d) { return nvlink(d, [](const gpu::NvlinkErrors& e) { return e.recovery; }); }},
      {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors.",
       [](const gpu::GpuDevice& d) { return nvlink(d, [](const gpu::NvlinkErrors& e) { return e.crc_flit; }); }},
      {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors.",
       [](const gpu::GpuDevice& d) { return nvlink(d, [](const gpu::NvlinkErrors& e) { return e.crc_data; }); }},
      {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
       [](const gpu::GpuDevice& d) { return text(d.temperature_c); }},
      {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
       [](const gpu::GpuDevice& d) { return watts(d.power_mw); }},
      {"DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).",
       [](const gpu::GpuDevice& d) { return watts(d.power_limit_mw); }},
      {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
       [](const gpu::GpuDevice& d) { return text(d.utilization_gpu); }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
       [](const gpu::GpuDevice& d) { return text(d.utilization_memory); }},
      {"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
       [](const gpu::GpuDevice& d) { return mib(d, d.memory_free); }},
      {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
       [](const gpu::GpuDevice& d) { return mib(d, d.memory_used); }},
      {"DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
       [](const gpu::GpuDevice& d) { return mib(d, d.memory_reserved); }},
      {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons.",
       [](const gpu::GpuDevice& d) { return text(d.throttle_reasons); }},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
       [](const gpu::GpuDevice& d) { return text(d.ecc_corrected_volatile); }},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
       [](const gpu::GpuDevice& d) { return text(d.ecc_uncorrected_volatile); }},
      // NVML's GPU Performance Monitoring (Hopper and later) over the time since the
      // previous sample, where DCGM reads the same counters.
      {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::graphics_engine); }},
      {"DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::sm); }},
      {"DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::sm_occupancy); }},
      {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::tensor); }},
      {"DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
       "Ratio of cycles the device memory interface is active sending or "
       "receiving data.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::dram); }},
      {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::fp64); }},
      {"DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::fp32); }},
      {"DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.",
       [](const gpu::GpuDevice& d) { return ratio(d, &gpu::GpmActivity::fp16); }},
  };
  return kMetrics;
}

// A label value with Prometheus's escapes: backslash, double quote, line feed.
std::string label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

std::string labels(const gpu::GpuDevice& d, const std::string& hostname) {
  return "{gpu=\"" + std::to_string(d.index) + "\",UUID=\"" + label_value(d.uuid) + "\",pci_bus_id=\"" +
         label_value(d.pci_bus_id) + "\",device=\"nvidia" + std::to_string(d.index) + "\",modelName=\"" +
         label_value(d.name) + "\",Hostname=\"" + label_value(hostname) + "\"}";
}

std::string cpu_text(const TopSample& sample, const std::string& hostname) {
  const std::string host = "Hostname=\"" + label_value(hostname) + "\"";
  std::string out =
      "# HELP lockstep_cpu_core_utilization CPU core utilization (in %).\n"
      "# TYPE lockstep_cpu_core_utilization gauge\n";
  char value[32];
  for (size_t i = 0; i < sample.cpu.core_utilization.size(); ++i) {
    std::snprintf(value, sizeof(value), "%.1f", sample.cpu.core_utilization[i]);
    out += "lockstep_cpu_core_utilization{core=\"" + std::to_string(i) + "\"," + host + "} " + value + "\n";
  }
  out += "# HELP lockstep_host_memory_used Host memory used (in MiB).\n# TYPE lockstep_host_memory_used gauge\n";
  out += "lockstep_host_memory_used{" + host + "} " + std::to_string(sample.cpu.memory.used() / kMiB) + "\n";
  // Not "_total": Prometheus keeps that suffix for counters (promtool check metrics says so).
  out +=
      "# HELP lockstep_host_memory_capacity Host memory in all (in MiB).\n"
      "# TYPE lockstep_host_memory_capacity gauge\n";
  out += "lockstep_host_memory_capacity{" + host + "} " + std::to_string(sample.cpu.memory.total / kMiB) + "\n";
  return out;
}

void write_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away: nothing to tell it
    sent += static_cast<size_t>(n);
  }
}

std::string response(const char* status, const char* type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

std::string prometheus_text(const TopSample& sample, const std::string& hostname) {
  if (!sample.shows_gpus()) return cpu_text(sample, hostname);
  std::string out;
  for (const Metric& metric : metrics()) {
    out +=
        std::string("# HELP ") + metric.name + " " + metric.help + "\n# TYPE " + metric.name + " " + metric.type + "\n";
    for (const gpu::GpuDevice& device : sample.gpus.devices)
      if (const auto value = metric.value(device)) out += metric.name + labels(device, hostname) + " " + *value + "\n";
  }
  // From the kernel log, when it can be read: dcgm-exporter's last Xid (0 for none), and how
  // many reports, which DCGM does not count.
  if (sample.xid_log_read) {
    out +=
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n";
    for (const gpu::GpuDevice& device : sample.gpus.devices)
      out += "DCGM_FI_DEV_XID_ERRORS" + labels(device, hostname) + " " + std::to_string(sample.xids_of(device)->last) +
             "\n";
    out +=
        "# HELP lockstep_gpu_xid_errors_total Xid errors the kernel log reports for the GPU.\n"
        "# TYPE lockstep_gpu_xid_errors_total counter\n";
    for (const gpu::GpuDevice& device : sample.gpus.devices)
      out += "lockstep_gpu_xid_errors_total" + labels(device, hostname) + " " +
             std::to_string(sample.xids_of(device)->count) + "\n";
  }
  return out;
}

ListenAddress parse_listen_address(const std::string& text) {
  const auto colon = text.rfind(':');
  const auto bad = [&] {
    throw UsageError("--serve " + text + ": expected :PORT or HOST:PORT (e.g. --serve :9400), port 0..65535");
  };
  if (colon == std::string::npos || colon + 1 == text.size()) bad();
  ListenAddress address;
  address.host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) bad();
  address.port = std::stoi(port);
  if (address.port > 65535) bad();
  return address;
}

MetricsServer::MetricsServer(const ListenAddress& address) {
  const std::string where = (address.host.empty() ? "" : address.host) + ":" + std::to_string(address.port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int looked_up = getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(),
                                    std::to_string(address.port).c_str(), &hints, &found);
  LOCKSTEP_CHECK(looked_up == 0) << "--serve " << where << ": cannot resolve '" << address.host
                                 << "': " << gai_strerror(looked_up);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) freeaddrinfo(found);
  LOCKSTEP_CHECK(listen_fd_ >= 0) << "socket: " << std::strerror(errno);
  const int one = 1;
  // A restarted top can take its port back while old connections linger in TIME_WAIT.
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = bind(listen_fd_, found->ai_addr, found->ai_addrlen) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (!bound || listen(listen_fd_, 16) != 0) {
    close(listen_fd_);
    LOCKSTEP_CHECK(bind_errno != EADDRINUSE)
        << "--serve " << where << ": port " << address.port
        << " is in use by another program; pick another port (dcgm-exporter itself uses 9400)";
    LOCKSTEP_FAIL() << "--serve " << where << ": cannot listen on port " << address.port << ": "
                    << std::strerror(bind_errno);
  }
  sockaddr_in bound_address{};
  socklen_t length = sizeof(bound_address);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound_address), &length);
  port_ = ntohs(bound_address.sin_port);
  LOCKSTEP_CHECK(pipe2(stop_pipe_, O_CLOEXEC) == 0) << "pipe: " << std::strerror(errno);
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const char stop = 's';
    (void)!write(stop_pipe_[1], &stop, 1);
    thread_.join();
  }
  {
    // Every client's thread ends within its deadline.
    std::unique_lock<std::mutex> lock(clients_mutex_);
    clients_done_.wait(lock, [this] { return clients_ == 0; });
  }
  for (int fd : {listen_fd_, stop_pipe_[0], stop_pipe_[1]})
    if (fd >= 0) close(fd);
}

void MetricsServer::set_metrics(std::string text) {
  std::lock_guard<std::mutex> lock(mutex_);
  metrics_ = std::move(text);
}

namespace {

constexpr int kMaxClients = 16;
constexpr std::chrono::seconds kClientDeadline{2};

}  // namespace

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    {
      std::lock_guard<std::mutex> lock(clients_mutex_);
      if (clients_ >= kMaxClients) {
        close(client);  // busy: a scraper retries at its next interval
        continue;
      }
      ++clients_;
    }
    std::thread([this, client] {
      answer(client);
      close(client);
      std::lock_guard<std::mutex> lock(clients_mutex_);
      --clients_;
      clients_done_.notify_all();
    }).detach();
  }
}

void MetricsServer::answer(int client) {
  // The request line and headers, up to a blank line, within a deadline for the whole
  // request (a client trickling a byte at a time is dropped too), and the answer sent
  // within one as well.
  const auto deadline = std::chrono::steady_clock::now() + kClientDeadline;
  const timeval send_within{.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(kClientDeadline).count(),
                            .tv_usec = 0};
  setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &send_within, sizeof(send_within));
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd fd = {client, POLLIN, 0};
    if (left.count() <= 0 || poll(&fd, 1, static_cast<int>(left.count())) <= 0) return;
    const ssize_t n = recv(client, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  const auto first_space = line.find(' ');
  const auto second_space = line.find(' ', first_space + 1);
  const std::string method = line.substr(0, first_space);
  std::string path =
      first_space == std::string::npos ? "" : line.substr(first_space + 1, second_space - first_space - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET") {
    write_all(client, response("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET is served\n"));
  } else if (path != "/metrics") {
    write_all(client, response("404 Not Found", "text/plain; charset=utf-8", "not found; metrics are at /metrics\n"));
  } else {
    std::string body;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body = metrics_;
    }
    write_all(client, response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body));
  }
}

}  // namespace lockstep::tools

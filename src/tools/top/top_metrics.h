// `lockstep top --serve :PORT`: the latest sample as Prometheus metrics on GET /metrics,
// under dcgm-exporter's metric names, labels and units (FB in MiB, power in W, clocks in
// MHz), so Grafana dashboards made for dcgm-exporter work unchanged. The server is a small
// HTTP/1.1 loop on a plain socket in its own thread: one request per connection.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "tools/top/top_sample.h"

namespace lockstep::tools {

// The exposition text: # HELP and # TYPE per metric, then one line per GPU labelled
// gpu, UUID, pci_bus_id, device ("nvidia<N>"), modelName, Hostname. Readings NVML could not
// give are left out, as dcgm-exporter does. On the CPU view: lockstep_cpu_* and
// lockstep_host_memory_* metrics instead.
std::string prometheus_text(const TopSample& sample, const std::string& hostname);

// "HOST:PORT" or ":PORT" (every interface). A bad form is a UsageError.
struct ListenAddress {
  std::string host;  // empty: 0.0.0.0
  int port = 0;      // 0: the kernel picks one (tests)
};
ListenAddress parse_listen_address(const std::string& text);

class MetricsServer {
 public:
  // Binds and listens now, so a port in use is an Error naming it before any sample is taken.
  explicit MetricsServer(const ListenAddress& address);
  ~MetricsServer();  // stops the thread and closes the socket
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  void set_metrics(std::string text);

 private:
  void serve();
  void answer(int client);

  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::mutex mutex_;
  std::string metrics_;
  std::thread thread_;
  // Each client is answered on a thread of its own, so a slow one stalls no other; at most
  // kMaxClients at once, each within a deadline. The destructor waits for them.
  std::mutex clients_mutex_;
  std::condition_variable clients_done_;
  int clients_ = 0;
};

}  // namespace lockstep::tools

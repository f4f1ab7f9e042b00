// The Prometheus page under dcgm-exporter's names, labels and units, and the HTTP server
// that serves it, asked over a real socket.
#include "tools/top/top_metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "lockstep/core/error.h"
#include "tools/top/top_testing.h"

namespace lockstep::tools {
namespace {

const char* kLabels0 =
    "{gpu=\"0\",UUID=\"GPU-00000000\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\","
    "modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"node1\"}";

TEST(TopMetrics, UsesDcgmExportersNamesLabelsAndUnits) {
  TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[0].throttle_reasons = gpu::kThrottleSwPowerCap | gpu::kThrottleHwThermalSlowdown;
  const std::string text = prometheus_text(sample, "node1");
  const auto has = [&](const std::string& line) {
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
  };
  has("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).");
  has("# TYPE DCGM_FI_DEV_GPU_UTIL gauge");
  has(std::string("DCGM_FI_DEV_GPU_UTIL") + kLabels0 + " 97");
  has(std::string("DCGM_FI_DEV_MEM_COPY_UTIL") + kLabels0 + " 45");
  // Framebuffer in MiB: used 71234; free = 81920 - 512 reserved - 71234.
  has(std::string("DCGM_FI_DEV_FB_USED") + kLabels0 + " 71234");
  has(std::string("DCGM_FI_DEV_FB_FREE") + kLabels0 + " 10174");
  has(std::string("DCGM_FI_DEV_GPU_TEMP") + kLabels0 + " 64");
  has(std::string("DCGM_FI_DEV_POWER_USAGE") + kLabels0 + " 312.400");  // watts
  has(std::string("DCGM_FI_DEV_SM_CLOCK") + kLabels0 + " 1410");
  has(std::string("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") + kLabels0 + " 68");  // 0x4 | 0x40
  has(std::string("DCGM_FI_DEV_MEM_CLOCK") + kLabels0 + " 1593");
  has("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter");
  has(std::string("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") + kLabels0 + " 912345678");  // mJ
  has(std::string("DCGM_FI_PROF_PCIE_TX_BYTES") + kLabels0 + " 1536000");              // 1500 KB/s in bytes/s
  has(std::string("DCGM_FI_PROF_PCIE_RX_BYTES") + kLabels0 + " 256000000");
  has(std::string("DCGM_FI_DEV_PCIE_LINK_GEN") + kLabels0 + " 4");
  has(std::string("DCGM_FI_DEV_PCIE_LINK_WIDTH") + kLabels0 + " 16");
  has(std::string("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") + kLabels0 + " 3");
  has(std::string("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") + kLabels0 + " 41");
  has(std::string("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") + kLabels0 + " 0");
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-00000001\""), std::string::npos);
  EXPECT_EQ(text.rfind("# HELP DCGM_FI_DEV_SM_CLOCK ", 0), 0u) << text;
  EXPECT_EQ(text.find("DCGM_FI_PROF_SM_ACTIVE{"), std::string::npos) << "no GPM reading, no profiling field";
}

// GPM's activity (Hopper and later, from the second reading on) under DCGM's profiling
// names, as ratios; a metric the GPU does not count is left out.
TEST(TopMetrics, GpmActivityAsDcgmsProfilingFields) {
  TopSample sample = top_testing::two_gpu_sample();
  gpu::GpmActivity activity;
  activity.graphics_engine = 0.91;
  activity.sm = 0.875;
  activity.tensor = 0.5;
  activity.dram = 0.25;
  sample.gpus.devices[0].gpm = activity;
  const std::string text = prometheus_text(sample, "node1");
  const auto has = [&](const std::string& line) {
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
  };
  has("# TYPE DCGM_FI_PROF_SM_ACTIVE gauge");
  has(std::string("DCGM_FI_PROF_GR_ENGINE_ACTIVE") + kLabels0 + " 0.910000");
  has(std::string("DCGM_FI_PROF_SM_ACTIVE") + kLabels0 + " 0.875000");
  has(std::string("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") + kLabels0 + " 0.500000");
  has(std::string("DCGM_FI_PROF_DRAM_ACTIVE") + kLabels0 + " 0.250000");
  EXPECT_EQ(text.find("DCGM_FI_PROF_PIPE_FP64_ACTIVE{"), std::string::npos) << "not counted, not served";
  EXPECT_EQ(text.find("DCGM_FI_PROF_SM_ACTIVE{gpu=\"1\""), std::string::npos) << "GPU 1 has no GPM reading";
}

TEST(TopMetrics, LeavesOutReadingsNvmlCouldNotGiveAndEscapesLabels) {
  TopSample sample = top_testing::two_gpu_sample();
  sample.gpus.devices[0].power_mw.reset();
  sample.gpus.devices[0].name = "GPU \"quoted\" \\ name";
  const std::string text = prometheus_text(sample, "node1");
  EXPECT_EQ(text.find("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\""), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_POWER_USAGE{gpu=\"1\""), std::string::npos);
  EXPECT_NE(text.find("modelName=\"GPU \\\"quoted\\\" \\\\ name\""), std::string::npos) << text;
}

// The kernel log's Xid reports, mapped to GPUs by PCI bus id: dcgm-exporter's last Xid (0
// for none) and Lockstep's count; neither where the log cannot be read.
TopSample sample_with_xids() {
  TopSample sample = top_testing::two_gpu_sample();
  sample.xid_log_read = true;
  sample.xids["0000:07:00.0"] = {48, 2};
  return sample;
}

TEST(TopMetrics, XidErrorsFromTheKernelLogAsDcgmExportersLastXidAndACount) {
  const std::string text = prometheus_text(sample_with_xids(), "node1");
  const std::string labels1 =
      "{gpu=\"1\",UUID=\"GPU-00000001\",pci_bus_id=\"00000000:08:00.0\",device=\"nvidia1\","
      "modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"node1\"}";
  for (const std::string& line :
       {std::string("# TYPE DCGM_FI_DEV_XID_ERRORS gauge"), std::string("DCGM_FI_DEV_XID_ERRORS") + kLabels0 + " 48",
        "DCGM_FI_DEV_XID_ERRORS" + labels1 + " 0", std::string("# TYPE lockstep_gpu_xid_errors_total counter"),
        std::string("lockstep_gpu_xid_errors_total") + kLabels0 + " 2",
        "lockstep_gpu_xid_errors_total" + labels1 + " 0"})
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
  const std::string unread = prometheus_text(top_testing::two_gpu_sample(), "node1");
  EXPECT_EQ(unread.find("XID"), std::string::npos);
  EXPECT_EQ(unread.find("xid"), std::string::npos);
}

TEST(TopMetrics, CpuViewServesCoreAndHostMemoryMetrics) {
  const std::string text = prometheus_text(top_testing::cpu_sample(), "node1");
  EXPECT_NE(text.find("\nlockstep_cpu_core_utilization{core=\"1\",Hostname=\"node1\"} 100.0\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\nlockstep_host_memory_used{Hostname=\"node1\"} 12288\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("DCGM_"), std::string::npos);
}

// Prometheus's own linter on both views, a real promtool. The CPU view is Lockstep's own and
// passes clean. The GPU view keeps dcgm-exporter's names so its dashboards work, and
// dcgm-exporter's own page fails the linter the same two ways (its `modelName` label, its
// ECC counters without "_total"): those are the only findings allowed.
struct Lint {
  int exit_code = -1;
  std::vector<std::string> findings;
};

Lint promtool(const std::string& text) {
  char path[] = "/tmp/lockstep-metrics-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  Lint lint;
  FILE* pipe = popen(("promtool check metrics < " + std::string(path) + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  unlink(path);
  lint.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) lint.findings.push_back(line);
  }
  return lint;
}

TEST(TopMetrics, PrometheusLinterAcceptsTheCpuViewAndOnlyDcgmExportersOwnNamesInTheGpuView) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not installed (scripts/install-deps installs Debian's prometheus package)";
  }
  const Lint cpu = promtool(prometheus_text(top_testing::cpu_sample(), "node1"));
  EXPECT_EQ(cpu.exit_code, 0);
  EXPECT_TRUE(cpu.findings.empty()) << cpu.findings.front();

  const Lint gpus = promtool(prometheus_text(sample_with_xids(), "node1"));
  EXPECT_NE(gpus.exit_code, 1) << "promtool could not parse the page";
  for (const std::string& finding : gpus.findings) {
    const bool model_name = finding.find("label names should be written in 'snake_case'") != std::string::npos;
    // dcgm-exporter's counters keep DCGM's field names (ECC, energy, NVLink), which
    // Prometheus's naming rules would end in a lower-case "_total".
    const bool dcgm_counter = finding.rfind("DCGM_FI_DEV_", 0) == 0 &&
                              finding.find("counter metrics should have \"_total\" suffix") != std::string::npos;
    // Lockstep's own Xid counter keeps dcgm-exporter's labels (the same series join) and
    // nothing else: a finding about its name would be neither of these.
    EXPECT_TRUE(model_name || dcgm_counter) << finding;
  }
  const std::string page = prometheus_text(sample_with_xids(), "node1");
  EXPECT_NE(page.find("lockstep_gpu_xid_errors_total{"), std::string::npos) << "the linted page has the Xid metrics";
}

TEST(TopMetrics, ListenAddressForms) {
  EXPECT_EQ(parse_listen_address(":9400").port, 9400);
  EXPECT_EQ(parse_listen_address(":9400").host, "");
  EXPECT_EQ(parse_listen_address("127.0.0.1:80").host, "127.0.0.1");
  for (const char* bad : {"9400", ":", ":http", ":70000", "host:-1"})
    EXPECT_THROW(parse_listen_address(bad), UsageError) << bad;
}

// One HTTP/1.1 request to 127.0.0.1:port; the whole response.
std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n";
  (void)!send(fd, request.data(), request.size(), 0);
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) response.append(buffer, static_cast<size_t>(n));
  close(fd);
  return response;
}

TEST(TopMetricsServer, ServesTheLatestMetricsAndNothingElse) {
  MetricsServer server(parse_listen_address("127.0.0.1:0"));
  ASSERT_GT(server.port(), 0);
  server.set_metrics("first 1\n");
  server.set_metrics("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 97\n");
  const std::string ok = http_get(server.port(), "/metrics");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("Content-Length: 33\r\n"), std::string::npos) << ok;
  EXPECT_EQ(ok.substr(ok.find("\r\n\r\n") + 4), "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 97\n");
  const std::string missing = http_get(server.port(), "/");
  EXPECT_EQ(missing.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u) << missing;
  EXPECT_EQ(http_get(server.port(), "/metrics?x=1").rfind("HTTP/1.1 200", 0), 0u);
}

// A client that trickles its request a byte every 300 ms (each read in time, the request
// never whole) holds no other scrape: the page is served while it is still trickling.
TEST(TopMetricsServer, ASlowClientStallsNoOtherScrape) {
  MetricsServer server(parse_listen_address("127.0.0.1:0"));
  server.set_metrics("up 1\n");
  const int slow = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(slow, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::atomic<bool> trickling{true};
  std::thread trickler([&] {
    for (int i = 0; i < 10; ++i) {
      (void)!send(slow, "G", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    trickling = false;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the slow one is being served
  const std::string answer = http_get(server.port(), "/metrics");
  const bool during = trickling;
  trickler.join();
  close(slow);
  EXPECT_EQ(answer.substr(answer.find("\r\n\r\n") + 4), "up 1\n") << answer;
  EXPECT_TRUE(during) << "the scrape waited for the trickling client";
}

TEST(TopMetricsServer, APortInUseIsAnErrorNamingIt) {
  MetricsServer first(parse_listen_address("127.0.0.1:0"));
  try {
    MetricsServer second(parse_listen_address("127.0.0.1:" + std::to_string(first.port())));
    FAIL() << "a second server took port " << first.port();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(first.port()) + " is in use"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::tools

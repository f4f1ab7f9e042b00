// `lockstep top`: live per-device utilization, memory, temperature, power, clocks,
// throttling and processes, like `nvidia-smi -l 1` and nvtop, with logging and Prometheus.
//
//   lockstep top [-l SECONDS] [--once] [--json] [--count N] [--log FILE.csv|FILE.jsonl] [--serve [HOST]:PORT]
//   lockstep top [-i IDS] --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-l SECONDS]
//   lockstep top [-i IDS] --query-compute-apps=FIELDS --format=csv[,noheader][,nounits] [-l SECONDS]
//
// On a terminal: the full-screen view with history sparklines (q or Ctrl-C quits). Into a
// pipe or file: a plain block per sample. Without NVML: the CPU cores and host memory.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>

#include "lockstep/core/device.h"
#include "lockstep/core/error.h"
#include "lockstep/gpu/device_order.h"
#include "lockstep/gpu/gpu_leases.h"
#include "lockstep/gpu/nvml.h"
#include "lockstep/gpu/pci_bus_id.h"
#include "lockstep/gpu/xid_log.h"
#include "tools/common/commands.h"
#include "tools/common/flags.h"
#include "tools/top/cpu_usage.h"
#include "tools/top/top_alerts.h"
#include "tools/top/top_history.h"
#include "tools/top/top_json.h"
#include "tools/top/top_lines.h"
#include "tools/top/top_log.h"
#include "tools/top/top_metrics.h"
#include "tools/top/top_query.h"
#include "tools/top/top_query_apps.h"
#include "tools/top/top_terminal.h"
#include "tools/top/top_view.h"

namespace lockstep::tools {
namespace {

volatile sig_atomic_t g_stop = 0;

void on_stop(int) { g_stop = 1; }
void on_resize(int) {}  // only interrupts the wait, so the view redraws at the new size

// Stop and resize signals interrupt waits (no SA_RESTART) and only set a flag: the loop
// ends normally and every destructor (the terminal's above all) runs.
void install_signal_handlers() {
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_handler = on_stop;
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  action.sa_handler = on_resize;
  sigaction(SIGWINCH, &action, nullptr);
}

struct TopOptions {
  double interval = 1.0;
  int64_t count = 0;  // 0: until stopped
  bool json = false;
  std::string log_path;
  std::string serve;
};

// nvidia-smi's "-l SECONDS" and "-i IDS" beside the long forms.
std::vector<std::string> long_flags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& arg : args) out.push_back(arg == "-l" ? "--interval" : arg == "-i" ? "--id" : arg);
  return out;
}

// CUDA's number for each GPU (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER as this process
// sees them), and one warning line when it differs from NVML's.
void add_cuda_order(TopSample& sample) {
  const gpu::CudaDevices cuda = gpu::cuda_devices_from_environment(sample.gpus);
  for (const gpu::GpuDevice& device : sample.gpus.devices) sample.cuda_index.push_back(cuda.cuda_index(device.index));
  for (const std::string& problem : cuda.problems)
    sample.order_warning += (sample.order_warning.empty() ? "" : "; ") + problem;
}

// The kernel log top reads Xid errors from: /dev/kmsg, or LOCKSTEP_TOP_KERNEL_LOG (a file of
// kernel log lines, for tests).
std::string kernel_log_path() {
  const char* path = std::getenv("LOCKSTEP_TOP_KERNEL_LOG");
  return path != nullptr && *path != '\0' ? path : "/dev/kmsg";
}

class Sampler {
 public:
  // ids: --id's GPUs ("" all of them).
  explicit Sampler(std::string ids) : ids_(std::move(ids)) {}

  TopSample take() {
    TopSample sample;
    sample.gpus = nvml_.read({.processes = true, .topology = false});
    sample.taken = std::chrono::system_clock::now();
    sample.nvml_library_tried = gpu::Nvml::requested_library();
    // CUDA numbers the GPUs over all of them, so before --id keeps some.
    if (sample.shows_gpus()) add_cuda_order(sample);
    if (!ids_.empty()) keep_gpus(sample, select_gpus(sample.gpus, ids_));
    if (!sample.shows_gpus()) {
      if (!cpu_) cpu_.emplace();
      sample.cpu = cpu_->read();
    }
    if (sample.shows_gpus()) add_xids(sample);
    sample.alerts = find_alerts(sample.gpus);
    for (Alert& alert : xid_alerts(sample)) sample.alerts.push_back(std::move(alert));
    if (sample.shows_gpus()) sample.leases = gpu::leased_gpus(sample.gpus);
    return sample;
  }

 private:
  // The kernel log's new Xid reports added to the tallies so far, by PCI bus id.
  void add_xids(TopSample& sample) {
    std::vector<gpu::XidEvent> events;
    xid_log_read_ = xid_log_.read(events);
    for (const gpu::XidEvent& event : events) {
      XidTally& tally = xids_[gpu::normalize_pci_bus_id(event.pci_bus_id)];
      tally.last = event.xid;
      ++tally.count;
    }
    sample.xid_log_read = xid_log_read_;
    sample.xids = xids_;
  }

  gpu::XidLogFollower xid_log_{kernel_log_path()};
  bool xid_log_read_ = false;
  std::map<std::string, XidTally> xids_;
  std::string ids_;
  gpu::Nvml nvml_;
  std::optional<CpuReader> cpu_;
};

void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int top_main(const std::vector<std::string>& args) {
  TopOptions options;
  bool once = false;
  Flags flags("lockstep top",
              "Live per-device utilization, memory, temperature, power, clocks, throttling and processes\n"
              "(the CPU cores and memory on a host with no NVIDIA driver):\n"
              "  lockstep top [-l SECONDS] [--once] [--json] [--count N] [--log FILE.csv|FILE.jsonl] [--serve :PORT]\n"
              "  lockstep top [-i IDS] --query-gpu=index,name,memory.used --format=csv[,noheader][,nounits]\n"
              "  lockstep top [-i IDS] --query-compute-apps=pid,process_name,used_memory --format=csv\n"
              "Full screen on a terminal (q quits), plain lines into a pipe or file.");
  flags.add("interval", &options.interval, "seconds between samples, fractions allowed (-l, like nvidia-smi -l)");
  flags.add_switch("once", &once, "one sample, plain output, then exit");
  flags.add_switch("json", &options.json, "one JSON object per sample, one line each");
  flags.add("count", &options.count, "stop after this many samples (default 0: until q or Ctrl-C)");
  flags.add("log", &options.log_path, "append every sample to FILE.csv or FILE.jsonl (the extension picks)");
  flags.add("serve", &options.serve, "Prometheus metrics on GET /metrics at [HOST]:PORT, dcgm-exporter's names");
  std::string ids, gpu_query, apps_query, format;
  flags.add("id", &ids, "only these GPUs: NVML indices, UUIDs or PCI bus ids, comma-separated (-i, like nvidia-smi)");
  flags.add("query-gpu", &gpu_query,
            "nvidia-smi's query: --query-gpu=index,name,utilization.gpu,memory.used (with --format); once unless -l");
  flags.add("query-compute-apps", &apps_query,
            "nvidia-smi's query of the compute processes: --query-compute-apps=pid,process_name,used_memory (with "
            "--format); once unless -l");
  flags.add("format", &format,
            "for --query-gpu and --query-compute-apps: csv, csv,noheader, csv,nounits or csv,noheader,nounits");
  if (!flags.parse(long_flags(args))) return 0;
  if (!gpu_query.empty() && !apps_query.empty())
    throw UsageError("--query-gpu and --query-compute-apps print different lines: give one of them");
  const std::string query = !gpu_query.empty() ? gpu_query : apps_query;
  const std::string query_flag = !gpu_query.empty() ? "--query-gpu" : "--query-compute-apps";
  if (!query.empty() && format.empty()) throw UsageError(query_flag + " needs --format, like --format=csv");
  if (query.empty() && !format.empty()) throw UsageError("--format goes with --query-gpu or --query-compute-apps");
  const std::vector<QueryField> fields = !gpu_query.empty()    ? parse_query_fields(gpu_query)
                                         : !apps_query.empty() ? parse_compute_app_fields(apps_query)
                                                               : std::vector<QueryField>();
  const QueryFormat query_format = format.empty() ? QueryFormat{} : parse_query_format(format);
  if (!query.empty()) {
    if (flags.given("once") || flags.given("json") || flags.given("serve")) {
      throw UsageError(query_flag + " prints its own lines: leave out --once, --json and --serve");
    }
    if (!flags.given("interval") && !flags.given("count")) options.count = 1;  // nvidia-smi: once, unless -l
  }
  // A GPU --id does not name is a usage error before anything starts.
  if (!ids.empty()) select_gpus(gpu::Nvml().read({}), ids);
  // A day at most: a larger number overflows the clock's ticks and would sample in a busy loop.
  if (!(options.interval > 0) || options.interval > 86400)
    throw UsageError("--interval " + flag_number(options.interval) +
                     ": the interval must be more than 0 seconds and at most a day (86400)");
  if (options.count < 0) throw UsageError("--count must be 0 (until stopped) or more");
  if (once) {
    if (flags.given("count") && options.count != 1) throw UsageError("--once is --count 1; give one or the other");
    options.count = 1;
  }
  // Checked before anything starts: a typo must not cost the first sample.
  std::unique_ptr<TopLog> log;
  if (!options.log_path.empty()) log = std::make_unique<TopLog>(options.log_path, log_format_for(options.log_path));
  std::unique_ptr<MetricsServer> server;
  if (!options.serve.empty()) server = std::make_unique<MetricsServer>(parse_listen_address(options.serve));

  install_signal_handlers();
  const bool full_screen = !once && !options.json && query.empty() && stdout_is_capable_terminal();
  std::unique_ptr<TerminalSession> terminal;
  if (full_screen) terminal = std::make_unique<TerminalSession>();

  Sampler sampler(ids);
  History history;
  const std::string host = host_name();
  const auto period = std::chrono::duration<double>(options.interval);
  auto next = std::chrono::steady_clock::now();
  for (int64_t taken = 0; !g_stop && (options.count == 0 || taken < options.count);) {
    const TopSample sample = sampler.take();
    ++taken;
    history.add(sample);
    if (log) log->write(sample);
    if (server) server->set_metrics(prometheus_text(sample, host));
    const auto draw = [&] {
      if (terminal) terminal->draw(frame_bytes(screen_lines(sample, history, terminal->columns(), terminal->rows())));
    };
    if (!query.empty()) {
      if (!sample.shows_gpus()) {
        std::fprintf(stderr, "lockstep top: %s: no GPU to query (%s)\n", query_flag.c_str(),
                     sample.gpus.loaded() ? "NVML lists none" : sample.gpus.load_error.c_str());
        return 6;  // nvidia-smi's "a query to find an object was unsuccessful"
      }
      print((taken == 1 && query_format.header ? query_header(fields, query_format) : "") +
            (!gpu_query.empty() ? query_rows(sample, fields, query_format)
                                : compute_app_rows(sample, fields, query_format)));
    } else if (terminal) {
      draw();
    } else if (options.json) {
      print(sample_json(sample).dump() + "\n");
    } else {
      print(plain_block(sample) + (options.count == 1 ? "" : "\n"));
    }
    if (options.count != 0 && taken >= options.count) break;
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    // Wait for the next sample; a resize redraws this one, q or a stop signal ends top.
    for (auto now = std::chrono::steady_clock::now(); now < next && !g_stop; now = std::chrono::steady_clock::now()) {
      const double left = std::chrono::duration<double>(next - now).count();
      if (terminal) {
        if (terminal->wait_for_quit(left)) g_stop = 1;
        draw();
      } else {
        usleep(static_cast<useconds_t>(std::min(left, 0.25) * 1e6));
      }
    }
    // A sample that took longer than the interval starts the next one now, not a burst.
    next = std::max(next, std::chrono::steady_clock::now());
  }
  return 0;
}

}  // namespace lockstep::tools

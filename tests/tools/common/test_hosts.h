// Test hosts for the multi-host tests: scripts/test-hosts' network namespaces, made for one
// test process (its own names and subnet, so tests running at once keep apart) and removed
// when the object goes, also when the test fails.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "tools/common/command_testing.h"

namespace lockstep::command_testing {

class TestHosts {
 public:
  // Why hosts cannot be made here ("" when they can): the tests that need them skip.
  static std::string unavailable() {
    if (::geteuid() != 0) return "test hosts need root (network namespaces)";
    if (!on_path("ip")) return "test hosts need iproute2's ip";
    if (!on_path("unshare")) return "test hosts need unshare (util-linux)";
    // Root in a container may still lack the network administration capability.
    const std::string probe = "lhprobe" + std::to_string(::getpid());
    const Result made = run_shell("ip netns add " + probe + " && ip netns del " + probe);
    if (made.exit_code != 0) return "this machine cannot make network namespaces: " + made.output;
    return "";
  }

  explicit TestHosts(int count, const std::string& options = "") {
    net_ = static_cast<int>(::getpid() % 250) + 1;
    env_ = "LOCKSTEP_TEST_HOSTS_PREFIX=lh" + std::to_string(net_) + " LOCKSTEP_TEST_HOSTS_NET=" + std::to_string(net_);
    const Result up = run_shell("env " + env_ + " " + script() + " up " + std::to_string(count) + " " + options);
    ok_ = up.exit_code == 0;
    error_ = up.output;
  }
  ~TestHosts() { run_shell("env " + env_ + " " + script() + " down"); }
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;

  bool ok() const { return ok_; }
  // "env LOCKSTEP_TEST_HOSTS_...=...": what scripts/test-hosts and test-slurm need to find them.
  std::string env() const { return "env " + env_; }
  const std::string& error() const { return error_; }
  std::string address(int host) const { return "10.231." + std::to_string(net_) + "." + std::to_string(11 + host); }
  std::string subnet() const { return "10.231." + std::to_string(net_) + ".0/24"; }

  // A shell command line that runs `command` inside host `host` (with its hostname).
  std::string on(int host, const std::string& command) const {
    return "env " + env_ + " " + script() + " run " + std::to_string(host) + " " + command;
  }
  // The host's own network interface (gloo's GLOO_SOCKET_IFNAME there).
  std::string interface(int host) const { return "lh" + std::to_string(net_) + "p" + std::to_string(host); }

  // `mpirun` over these hosts, `per_host` ranks on each of the first `hosts`, started by the
  // rsh agent inside each host's namespace, all traffic on the hosts' subnet. `exports`
  // names variables to pass on (mpirun -x).
  std::string mpirun(int hosts, int per_host, const std::string& exports = "") const {
    std::string list;
    for (int h = 0; h < hosts; ++h) list += (h ? "," : "") + address(h) + ":" + std::to_string(per_host);
    std::string x;
    for (const std::string& name : split_words(exports + " CUDA_VISIBLE_DEVICES ASAN_OPTIONS")) x += " -x " + name;
    return "env " + env_ +
           " CUDA_VISIBLE_DEVICES= ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" "
           "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 300 mpirun --allow-run-as-root --bind-to none "
           "--host " +
           list + " -n " + std::to_string(hosts * per_host) + " --mca plm_rsh_agent \"" + script() +
           " rsh\" --mca oob_tcp_if_include " + subnet() + " --mca btl_tcp_if_include " + subnet() +
           " --mca btl self,vader,tcp" + x + " ";
  }

 private:
  static std::string script() { return std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/test-hosts"; }

  int net_ = 0;
  std::string env_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace lockstep::command_testing

// Test hosts for the multi-host tests: scripts/test-hosts' network namespaces, made for one
// test process (its own names and subnet, so tests running at once keep apart) and removed
// when the object goes, also when the test fails.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
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
    claim_net();
    if (net_ == 0) {
      error_ = "every test-host subnet 10.231.1-250 is held by another test process";
      return;
    }
    env_ = "LOCKSTEP_TEST_HOSTS_PREFIX=lh" + std::to_string(net_) + " LOCKSTEP_TEST_HOSTS_NET=" + std::to_string(net_);
    const Result up = run_shell("env " + env_ + " " + script() + " up " + std::to_string(count) + " " + options);
    ok_ = up.exit_code == 0;
    error_ = up.output;
  }
  ~TestHosts() {
    if (net_ != 0) run_shell("env " + env_ + " " + script() + " down");
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }
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

  // A subnet number no other live test process holds: the first free lock of 250, searched
  // from one the process id suggests. A number derived from the pid alone is shared by two
  // processes whose pids differ by a multiple of 250, and the later one's `up` (which first
  // removes what has its names) tore down the other's hosts mid-test. The lock goes with the
  // process, however it ends, so a crashed test's number is free again (its leftover hosts
  // are removed by the next `up` of that number).
  void claim_net() {
    const int start = static_cast<int>(::getpid() % 250);
    for (int i = 0; i < 250; ++i) {
      const int net = (start + i) % 250 + 1;
      const std::string path = "/tmp/lockstep-test-hosts-" + std::to_string(net) + ".lock";
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        net_ = net;
        lock_fd_ = fd;
        return;
      }
      ::close(fd);
    }
  }

  int net_ = 0;
  int lock_fd_ = -1;
  std::string env_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace lockstep::command_testing

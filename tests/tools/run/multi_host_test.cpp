// Past one host: jobs started by mpirun on two test hosts (scripts/test-hosts: network
// namespaces joined by a shaped bridge), their ranks talking over TCP as on a cluster.
// `lockstep train` gives one device's weights across hosts under ddp (all-reduced by host:
// shared memory within, MPI across; and flat; with f32 and bf16 gradients), ZeRO-1 and 2 and the GPT
// mesh, and a rank killed on one host ends the job on both, named. A PyTorch script runs
// across them under `lockstep run`: under mpirun, and as torchrun's multi-node form.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "lockstep/comm/flight_recorder.h"
#include "lockstep/core/error.h"
#include "tools/common/command_testing.h"
#include "tools/common/flight_testing.h"
#include "tools/common/small_dataset.h"
#include "tools/common/test_hosts.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = TestHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
    if (!on_path("mpirun")) GTEST_SKIP() << "mpirun is not on PATH (install openmpi-bin)";
    root_ = fs::temp_directory_path() / ("lockstep-multi-host-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    data_ = root_ / "data";
    write_small_fashion_mnist(data_);
    hosts_ = std::make_unique<TestHosts>(2, "--rate 1gbit");
    ASSERT_TRUE(hosts_->ok()) << hosts_->error();
  }
  void TearDown() override {
    hosts_.reset();
    fs::remove_all(root_);
  }

  nlohmann::json summary(const std::string& run) const {
    std::ifstream in(root_ / run / "summary.json");
    return nlohmann::json::parse(in);
  }
  std::string sha(const std::string& run) const { return summary(run).value("weights_sha256", ""); }

  fs::path root_, data_;  // data_: a small Fashion-MNIST look-alike
  std::unique_ptr<TestHosts> hosts_;
};

// Two sets of test hosts alive at once (as two tests under ctest -j) get subnets and names
// of their own: making the second leaves the first one's hosts up and reachable.
TEST(TestHostsTest, TwoSetsAliveAtOnceKeepApart) {
  if (const std::string why = TestHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
  const TestHosts first(1);
  ASSERT_TRUE(first.ok()) << first.error();
  const TestHosts second(1);
  ASSERT_TRUE(second.ok()) << second.error();
  EXPECT_NE(first.subnet(), second.subnet());
  const Result reached = run_shell(first.on(0, "ip -o addr show " + first.interface(0)));
  EXPECT_EQ(reached.exit_code, 0) << reached.output;
  EXPECT_NE(reached.output.find(first.address(0)), std::string::npos) << reached.output;
}

TEST_F(MultiHost, DdpAndZeroAcrossTwoHostsGiveOneDevicesBits) {
  const std::string flags =
      "train --quiet --data " + data_.string() + " --model mlp --steps 4 --batch-size 32 --micro-batch 8 --threads 1";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  for (const std::string strategy : {"ddp", "zero1", "zero2"}) {
    const Result r = run_shell(hosts_->mpirun(2, 2) + kBinary + " " + flags + " --strategy " + strategy +
                               " --backend mpi --out " + (root_ / strategy).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(sha(strategy), sha("one")) << strategy << " on 2 hosts x 2 ranks";
    EXPECT_EQ(summary(strategy)["collectives"].value("route", ""), "2 hosts x 2 ranks: shm within a host, mpi across");
  }
  // The flat route, for comparison: the same bits.
  const Result flat = run_shell("LOCKSTEP_MPI_HIERARCHY=0 " + hosts_->mpirun(2, 2, "LOCKSTEP_MPI_HIERARCHY") + kBinary +
                                " " + flags + " --strategy ddp --backend mpi --out " + (root_ / "flat").string());
  ASSERT_EQ(flat.exit_code, 0) << flat.output;
  EXPECT_EQ(sha("flat"), sha("one"));
  EXPECT_EQ(summary("flat")["collectives"].value("route", "?"), "");
}

// bf16 gradients cross the hosts as bf16 partial sums (rounded_sum): one process's bits, not f32's.
TEST_F(MultiHost, BfloatGradientsAcrossHostsGiveOneProcesssBits) {
  const std::string flags =
      "train --quiet --data " + data_.string() +
      " --model mlp --steps 4 --batch-size 32 --micro-batch 8 --threads 1 --strategy ddp --grad-dtype "
      "bf16";
  ASSERT_EQ(run(flags + " --out " + (root_ / "one").string()).exit_code, 0);
  const Result r =
      run_shell(hosts_->mpirun(2, 2) + kBinary + " " + flags + " --backend mpi --out " + (root_ / "hosts").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sha("hosts"), sha("one"));
  EXPECT_EQ(summary("hosts").value("grad_dtype", ""), "bf16");
}

TEST_F(MultiHost, TheGptMeshAcrossHostsKeepsItsBits) {
  // A text of a few hundred windows: the fortunes' validation split alone would take most
  // of the test's time to evaluate on every run.
  const fs::path text = root_ / "text.txt";
  write_small_text(text, 200);
  const std::string flags =
      "train --quiet --model gpt --preset tiny --steps 3 --batch-size 8 --micro-batch 2 "
      "--threads 1 --sample 0 --data " +
      text.string();
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  // Data parallel across the hosts, the pipeline's two stages within each.
  const Result r = run_shell(hosts_->mpirun(2, 2) + kBinary + " " + flags +
                             " --strategy mesh --dp 2 --pp 2 --backend mpi --out " + (root_ / "mesh").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(sha("mesh"), sha("one"));
}

// A rank SIGKILLed on the second host: the job ends on both hosts, and mpirun names it.
TEST_F(MultiHost, ARankKilledOnOneHostEndsTheJobOnBoth) {
  const fs::path flight = root_ / "flight";
  auto job = std::async(std::launch::async, [&] {
    return run_shell("env LOCKSTEP_FLIGHT_DIR=" + flight.string() + " " + hosts_->mpirun(2, 2, "LOCKSTEP_FLIGHT_DIR") +
                     kBinary + " train --quiet --data " + data_.string() +
                     " --model mlp --steps 100000 --batch-size 32 --micro-batch 8 --threads 1 "
                     "--strategy ddp --backend mpi --out " +
                     (root_ / "killed").string());
  });
  // Rank 3 (the second host's second rank) says in its flight record when it trains, and
  // its pid.
  const pid_t rank3 = wait_for_step(flight / "rank3.flight.json", 3);
  ASSERT_GT(rank3, 0) << "rank 3 never reached step 3";
  const auto killed = std::chrono::steady_clock::now();
  kill(rank3, SIGKILL);
  const Result r = job.get();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 60) << "the job outlived its killed rank:\n" << r.output;
  EXPECT_NE(r.output.find("rank 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

// torchrun's multi-node form: a launcher on each host, node 0's serving the launchers'
// store; a PyTorch DDP script (gloo) sees torchrun's variables and its 4 ranks agree.
class MultiNodeRun : public MultiHost {
 protected:
  // `lockstep run --nnodes 2` on both hosts at once, each with `env` and `options`; their outputs.
  std::vector<Result> launch_both(const std::string& env, const std::string& options, const std::string& command) {
    std::vector<std::future<Result>> launchers;
    for (int node = 0; node < 2; ++node) {
      launchers.push_back(std::async(std::launch::async, [&, node] {
        return run_shell("env GLOO_SOCKET_IFNAME=" + hosts_->interface(node) + " " + env + " " +
                         hosts_->on(node, kBinary + " run --nnodes 2 --node-rank " + std::to_string(node) +
                                              " --master-addr " + hosts_->address(0) + " --master-port 29650 -n 2 " +
                                              options + " --log-dir " +
                                              (root_ / ("node" + std::to_string(node))).string() + " -- " + command));
      }));
    }
    std::vector<Result> results;
    for (auto& launcher : launchers) results.push_back(launcher.get());
    return results;
  }
  const std::string script_ =
      "/usr/bin/python3 " + std::string(LOCKSTEP_SOURCE_DIR) + "/tests/tools/run/torch_ddp_env.py";
};

TEST_F(MultiNodeRun, APyTorchDdpScriptRunsAcrossTwoNodes) {
  const std::vector<Result> nodes = launch_both("", "", script_);
  if (nodes[0].output.find("SKIP") != std::string::npos) GTEST_SKIP() << nodes[0].output;
  std::string weights;
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(nodes[node].exit_code, 0) << "node " << node << ":\n" << nodes[node].output;
    for (int local = 0; local < 2; ++local) {
      const int rank = node * 2 + local;
      const std::string prefix = "[rank " + std::to_string(rank) + "] ";
      EXPECT_NE(nodes[node].output.find(prefix + "elastic True group " + std::to_string(node) + " of 2"),
                std::string::npos)
          << nodes[node].output;
      const size_t at = nodes[node].output.find(prefix + "weights ");
      ASSERT_NE(at, std::string::npos) << nodes[node].output;
      const std::string mine =
          nodes[node].output.substr(at + prefix.size(), nodes[node].output.find('\n', at) - at - prefix.size());
      if (weights.empty()) weights = mine;
      EXPECT_EQ(mine, weights) << "rank " << rank;
    }
  }
}

// Under mpirun across hosts the ranks exist already; `lockstep run --master-addr` names rank
// 0's host, and the PyTorch script's env:// group meets there: its 4 ranks agree.
TEST_F(MultiNodeRun, UnderMpirunAPyTorchScriptMeetsAtTheGivenMasterAddr) {
  // gloo's interface is the host's own one (the test hosts' names do not resolve).
  const std::string command = "sh -c 'GLOO_SOCKET_IFNAME=$(ls /sys/class/net | grep -vx lo) exec " + script_ + "'";
  const Result r =
      run_shell(hosts_->mpirun(2, 2) + kBinary + " run --master-addr " + hosts_->address(0) + " -- " + command);
  if (r.output.find("SKIP") != std::string::npos) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // mpirun relays the ranks' output unsplit: two lines may run together.
  std::vector<std::string> weights;
  for (size_t at = r.output.find("weights "); at != std::string::npos; at = r.output.find("weights ", at + 1))
    weights.push_back(r.output.substr(at + 8, r.output.find_first_not_of("-0123456789.", at + 8) - at - 8));
  ASSERT_EQ(weights.size(), 4u) << r.output;
  for (const std::string& w : weights) EXPECT_EQ(w, weights[0]) << r.output;
  // Not torchelastic's launch, but torchrun's node group: rank 2 is node 1's first.
  EXPECT_NE(r.output.find("elastic False group 1 of 2"), std::string::npos) << r.output;
}

// Rank 3 (on node 1) raises: node 1's launcher shows its Python error from torchrun's
// error file, and node 0's stops its own workers, saying why.
TEST_F(MultiNodeRun, AFailureOnOneNodeStopsEveryNode) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Result> nodes = launch_both("FAIL_RANK=3", "--grace 2", script_);
  if (nodes[0].output.find("SKIP") != std::string::npos) GTEST_SKIP() << nodes[0].output;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 60);
  EXPECT_NE(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_NE(nodes[1].output.find("lockstep run: rank 3 failed first (exit code 1)"), std::string::npos)
      << nodes[1].output;
  EXPECT_NE(nodes[1].output.find("its error: ValueError: rank 3 gives up"), std::string::npos) << nodes[1].output;
  EXPECT_NE(nodes[0].exit_code, 0) << nodes[0].output;
  // Node 0 hears of it from node 1, or its own ranks fail first when their peer is gone.
  EXPECT_TRUE(nodes[0].output.find("node 1: rank 3 failed (exit code 1); this node's workers were stopped") !=
                  std::string::npos ||
              nodes[0].output.find("failed first") != std::string::npos)
      << nodes[0].output;
}

// The launchers' rendezvous across hosts proves the job's secret: a node started with
// another secret is refused, saying why, and node 0 gives up waiting for it.
TEST_F(MultiNodeRun, ANodeWithoutTheJobsSecretIsRefused) {
  const std::string ours(64, 'a'), theirs(64, 'b');
  std::vector<std::future<Result>> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(std::async(std::launch::async, [&, node] {
      return run_shell("env LOCKSTEP_JOB_SECRET=" + (node == 0 ? ours : theirs) + " " +
                       hosts_->on(node, kBinary + " run --nnodes 2 --node-rank " + std::to_string(node) +
                                            " --master-addr " + hosts_->address(0) +
                                            " --master-port 29660 --join-timeout 5 -n 1 -- /bin/true"));
    }));
  }
  const Result node0 = launchers[0].get(), node1 = launchers[1].get();
  EXPECT_NE(node1.exit_code, 0) << node1.output;
  EXPECT_NE(node1.output.find("do not share the job's secret"), std::string::npos) << node1.output;
  EXPECT_NE(node0.exit_code, 0) << node0.output;
  EXPECT_NE(node0.output.find("only 1 of 2 nodes' launchers came"), std::string::npos) << node0.output;
}

TEST_F(MultiNodeRun, NodesOfOneJobMustAllCome) {
  // Only node 0 starts: it gives up after --join-timeout, saying what is missing.
  const Result alone = run_shell(hosts_->on(0, kBinary + " run --nnodes 2 --node-rank 0 --master-addr " +
                                                   hosts_->address(0) + " --join-timeout 2 -n 1 -- /bin/true"));
  EXPECT_EQ(alone.exit_code, 1) << alone.output;
  EXPECT_NE(alone.output.find("only 1 of 2 nodes' launchers came within 2 s"), std::string::npos) << alone.output;
}

}  // namespace
}  // namespace lockstep

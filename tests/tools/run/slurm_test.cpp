// A real Slurm on the test hosts (scripts/test-slurm: munged, slurmctld, a slurmd in each
// host's namespace): `srun -N 2 -n 4 lockstep train` gives one device's bits over MPI
// (PMIx), and an sbatch job's `--signal=USR1@N` reaches the training loop, which stops with a
// checkpoint from which the run continues to the uninterrupted run's bits.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/io/checkpoint.h"
#include "lockstep/io/safetensors.h"
#include "tools/common/command_testing.h"
#include "tools/common/test_hosts.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

const std::string kTrain = "train --quiet --model mlp --batch-size 32 --micro-batch 8 --threads 1";

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = TestHosts::unavailable(); !why.empty()) GTEST_SKIP() << why;
    for (const char* tool : {"slurmctld", "slurmd", "munged", "srun", "sbatch"}) {
      if (!on_path(tool))
        GTEST_SKIP() << tool << " is not installed (apt-get install slurmctld slurmd munge slurm-client)";
    }
    if (!on_path("mpirun")) GTEST_SKIP() << "OpenMPI is not installed";
    root_ = fs::path("/tmp") / ("lockstep-slurm-test-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    hosts_ = std::make_unique<TestHosts>(2);
    ASSERT_TRUE(hosts_->ok()) << hosts_->error();
    const Result up = run_shell(hosts_->env() + " " + std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/test-slurm up");
    ASSERT_EQ(up.exit_code, 0) << up.output;
    conf_ = split_words(up.output).back();
  }
  void TearDown() override {
    if (hosts_) run_shell(hosts_->env() + " " + std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/test-slurm down");
    hosts_.reset();
    fs::remove_all(root_);
  }

  // The environment of a Slurm command: this cluster, CPU devices, MPI on the hosts' subnet.
  std::string slurm_env() const {
    return "env SLURM_CONF=" + conf_ + " CUDA_VISIBLE_DEVICES= OMPI_MCA_btl_tcp_if_include=" + hosts_->subnet() +
           " OMPI_MCA_oob_tcp_if_include=" + hosts_->subnet() + " OMPI_MCA_btl=self,vader,tcp ";
  }
  nlohmann::json summary(const std::string& run) const {
    std::ifstream in(root_ / run / "summary.json");
    return in ? nlohmann::json::parse(in) : nlohmann::json::object();
  }

  fs::path root_;
  std::unique_ptr<TestHosts> hosts_;
  std::string conf_;
};

TEST_F(Slurm, SrunOnTwoNodesGivesOneDevicesBits) {
  ASSERT_EQ(run(kTrain + " --steps 4 --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  const Result r = run_shell(slurm_env() + "timeout 120 srun -N 2 -n 4 --mpi=pmix " + kBinary + " " + kTrain +
                             " --steps 4 --strategy ddp --backend mpi --out " + (root_ / "srun").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(summary("srun")["weights_sha256"], summary("one")["weights_sha256"]);
}

// Slurm's warning before a time limit, as a batch script asks for it: the training loop
// stops at a step boundary with a checkpoint, and the run continues from it (here on one
// device) to the bits of a run that never stopped. Slurm sends the signal up to a minute
// early (its timer's resolution), from the job's first seconds on: the run is long enough
// that the signal always comes before its end, and handled from its first instant.
TEST_F(Slurm, SbatchSignalStopsTheRunWithACheckpointThatContinuesExactly) {
  const std::string script = (root_ / "job.sh").string();
  std::ofstream(script) << "#!/bin/sh\n"
                           "#SBATCH --nodes=2 --ntasks=4 --time=1 --signal=USR1@55 --output="
                        << (root_ / "job.out").string() << "\n"
                        << "srun --mpi=pmix " << kBinary << " " << kTrain
                        << " --steps 1000000 --strategy ddp --backend mpi --out " << (root_ / "batch").string() << "\n";
  const Result submitted = run_shell(slurm_env() + "sbatch --wait " + script);
  std::ifstream out(root_ / "job.out");
  const std::string job_output{std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>()};
  // A stopped run's result is its checkpoint (no summary until it finishes).
  const size_t at = job_output.find("lockstep train: stopped after step ");
  ASSERT_NE(at, std::string::npos) << submitted.output << job_output;
  EXPECT_NE(job_output.find(" of 1000000 by SIGUSR1; checkpoint ", at), std::string::npos) << job_output;
  EXPECT_NE(job_output.find("continue with: lockstep train --resume "), std::string::npos) << job_output;
  const fs::path checkpoint = root_ / "batch" / "checkpoint.safetensors";
  ASSERT_TRUE(fs::exists(checkpoint));
  EXPECT_FALSE(fs::exists(root_ / "batch" / "summary.json"));

  // A few steps on from the stop, resumed on one device and straight from the start.
  const std::string until =
      " --stop-after " + std::to_string(std::stoll(load_safetensors_metadata(checkpoint.string()).at("step")) + 5);
  const Result resumed = run("train --quiet --devices 1 --resume " + (root_ / "batch").string() + until);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(run(kTrain + " --steps 1000000 --devices 1" + until + " --out " + (root_ / "straight").string()).exit_code,
            0);
  EXPECT_EQ(load_safetensors_metadata(checkpoint.string()).at(kTensorsSha256Key),
            load_safetensors_metadata((root_ / "straight" / "checkpoint.safetensors").string()).at(kTensorsSha256Key));
}

}  // namespace
}  // namespace lockstep

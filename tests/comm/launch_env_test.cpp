// launch_info_from_env under each launcher's variables, their precedence and every error;
// rendezvous_store's choice of store.
#include "lockstep/comm/launch_env.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/comm/file_store.h"
#include "lockstep/comm/tcp_store.h"
#include "lockstep/core/error.h"

namespace lockstep::comm {
namespace {

using namespace std::chrono_literals;

const std::string kTestSecret(32, 's');

// Every variable launch_info_from_env reads. The guard clears them all, so the environment
// the tests run in cannot leak in, and puts them back afterwards.
const char* const kLaunchVariables[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
};

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kLaunchVariables) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

  EnvGuard& set(const char* name, const std::string& value) {
    ::setenv(name, value.c_str(), 1);
    return *this;
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

// The Error launch_info_from_env throws; a failure if it throws none.
std::string launch_error() {
  try {
    launch_info_from_env();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected launch_info_from_env to throw";
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(LaunchEnv, NoLauncherIsAJobOfOne) {
  EnvGuard env;
  const LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.master_addr, "");
  EXPECT_EQ(info.master_port, 0);
  EXPECT_EQ(info.job_id, "ppid-" + std::to_string(::getppid()));
}

TEST(LaunchEnv, Torchrun) {
  EnvGuard env;
  env.set("RANK", "2")
      .set("WORLD_SIZE", "4")
      .set("LOCAL_RANK", "0")
      .set("LOCAL_WORLD_SIZE", "2")
      .set("MASTER_ADDR", "node7")
      .set("MASTER_PORT", "29500")
      .set("TORCHELASTIC_RUN_ID", "run-42");
  const LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.job_id, "run-42");
}

TEST(LaunchEnv, TorchrunWithoutLocalVariablesIsOneHost) {
  EnvGuard env;
  env.set("RANK", "1").set("WORLD_SIZE", "3");
  const LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.job_id, "ppid-" + std::to_string(::getppid()));
}

TEST(LaunchEnv, OpenMpi) {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "5")
      .set("OMPI_COMM_WORLD_SIZE", "8")
      .set("OMPI_COMM_WORLD_LOCAL_RANK", "1")
      .set("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
      .set("PMIX_NAMESPACE", "prterun-host-123@1")
      .set("OMPI_MCA_ess_base_jobid", "98765");
  LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "");
  EXPECT_EQ(info.job_id, "98765");
  ::unsetenv("OMPI_MCA_ess_base_jobid");
  EXPECT_EQ(launch_info_from_env().job_id, "prterun-host-123@1");
}

TEST(LaunchEnv, Slurm) {
  EnvGuard env;
  env.set("SLURM_PROCID", "6")
      .set("SLURM_NTASKS", "8")
      .set("SLURM_LOCALID", "2")
      .set("SLURM_TASKS_PER_NODE", "4(x2)")
      .set("SLURM_JOB_ID", "1234")
      .set("SLURM_STEP_ID", "0");
  LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.job_id, "1234.0");
  // SLURM_NTASKS_PER_NODE, when given, wins over the list.
  env.set("SLURM_NTASKS_PER_NODE", "3");
  EXPECT_EQ(launch_info_from_env().local_world_size, 3);
}

TEST(LaunchEnv, SlurmTasksPerNodePicksThisNode) {
  EnvGuard env;
  env.set("SLURM_PROCID", "7").set("SLURM_NTASKS", "8").set("SLURM_LOCALID", "1");
  env.set("SLURM_TASKS_PER_NODE", "3(x2),2").set("SLURM_NODEID", "2");
  EXPECT_EQ(launch_info_from_env().local_world_size, 2);
  env.set("SLURM_NODEID", "1");
  EXPECT_EQ(launch_info_from_env().local_world_size, 3);
  ::unsetenv("SLURM_NODEID");  // no node id: the first node's count
  EXPECT_EQ(launch_info_from_env().local_world_size, 3);
  env.set("SLURM_NODEID", "3");
  EXPECT_TRUE(contains(launch_error(), "SLURM_NODEID=3")) << launch_error();
}

TEST(LaunchEnv, SlurmHalfPairIsNoLaunch) {
  EnvGuard env;
  env.set("SLURM_NTASKS", "4").set("SLURM_JOB_ID", "77");  // an salloc shell
  EXPECT_EQ(launch_info_from_env().launcher, "none");
  EXPECT_EQ(launch_info_from_env().world_size, 1);
}

TEST(LaunchEnv, TorchrunWinsOverOpenMpiAndSlurm) {
  EnvGuard env;
  env.set("RANK", "1").set("WORLD_SIZE", "2");
  env.set("OMPI_COMM_WORLD_RANK", "3").set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("SLURM_PROCID", "5").set("SLURM_NTASKS", "6");
  LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  info = launch_info_from_env();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
}

TEST(LaunchEnv, MasterAddressUnderAnyLauncher) {
  EnvGuard env;
  env.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "2").set("MASTER_ADDR", "10.0.0.1").set("MASTER_PORT", "1");
  LaunchInfo info = launch_info_from_env();
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 1);
  env.set("MASTER_PORT", "65535");
  EXPECT_EQ(launch_info_from_env().master_port, 65535);
}

TEST(LaunchEnv, IntegersAreParsedStrictly) {
  EnvGuard env;
  env.set("WORLD_SIZE", "4");
  for (const char* bad : {"abc", "1.0", "2x", " 1", "1 ", "+1", "0x1"}) {
    env.set("RANK", bad);
    EXPECT_EQ(launch_error(), "RANK='" + std::string(bad) + "' is not an integer");
  }
  env.set("RANK", "99999999999");
  EXPECT_TRUE(contains(launch_error(), "RANK=99999999999 is out of range")) << launch_error();
}

TEST(LaunchEnv, RankMustBeInsideTheWorld) {
  EnvGuard env;
  env.set("RANK", "4").set("WORLD_SIZE", "4");
  EXPECT_TRUE(contains(launch_error(), "RANK=4 is outside 0..3")) << launch_error();
  env.set("RANK", "-1");
  EXPECT_TRUE(contains(launch_error(), "RANK=-1 is outside 0..3")) << launch_error();
  env.set("RANK", "0").set("WORLD_SIZE", "0");
  EXPECT_TRUE(contains(launch_error(), "WORLD_SIZE=0 must be at least 1")) << launch_error();
  env.set("OMPI_COMM_WORLD_RANK", "2").set("OMPI_COMM_WORLD_SIZE", "2");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_TRUE(contains(launch_error(), "OMPI_COMM_WORLD_RANK=2 is outside 0..1")) << launch_error();
}

TEST(LaunchEnv, LocalRankMustBeInsideTheHost) {
  EnvGuard env;
  env.set("RANK", "1").set("WORLD_SIZE", "4").set("LOCAL_RANK", "2").set("LOCAL_WORLD_SIZE", "2");
  EXPECT_TRUE(contains(launch_error(), "LOCAL_RANK=2 is outside 0..1")) << launch_error();
  env.set("LOCAL_RANK", "0").set("LOCAL_WORLD_SIZE", "5");
  EXPECT_TRUE(contains(launch_error(), "LOCAL_WORLD_SIZE=5 must be in 1..4")) << launch_error();
  env.set("LOCAL_WORLD_SIZE", "0");
  EXPECT_TRUE(contains(launch_error(), "LOCAL_WORLD_SIZE=0")) << launch_error();
}

TEST(LaunchEnv, HalfATorchrunOrOpenMpiPairIsAnError) {
  EnvGuard env;
  env.set("RANK", "0");
  EXPECT_TRUE(contains(launch_error(), "RANK is set but WORLD_SIZE is not")) << launch_error();
  ::unsetenv("RANK");
  env.set("WORLD_SIZE", "2");
  EXPECT_TRUE(contains(launch_error(), "WORLD_SIZE is set but RANK is not")) << launch_error();
  ::unsetenv("WORLD_SIZE");
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_TRUE(contains(launch_error(), "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"))
      << launch_error();
}

TEST(LaunchEnv, MasterPortErrors) {
  EnvGuard env;
  env.set("MASTER_ADDR", "node1");
  EXPECT_TRUE(contains(launch_error(), "MASTER_ADDR=node1 is set but MASTER_PORT is not")) << launch_error();
  for (const char* bad : {"0", "65536", "-5"}) {
    env.set("MASTER_PORT", bad);
    EXPECT_TRUE(contains(launch_error(), "MASTER_PORT=" + std::string(bad) + " is not a TCP port")) << launch_error();
  }
  env.set("MASTER_PORT", "http");
  EXPECT_EQ(launch_error(), "MASTER_PORT='http' is not an integer");
}

TEST(LaunchEnv, MalformedSlurmTaskList) {
  EnvGuard env;
  env.set("SLURM_PROCID", "0").set("SLURM_NTASKS", "4");
  for (const char* bad : {"2(y3)", "2(x3", "(x2)", "2,,1", "0"}) {
    env.set("SLURM_TASKS_PER_NODE", bad);
    EXPECT_TRUE(contains(launch_error(), "SLURM_TASKS_PER_NODE")) << bad << ": " << launch_error();
  }
}

// ---- rendezvous_store ----

TEST(LaunchEnv, RendezvousOfOneIsInMemory) {
  LaunchInfo info;
  EXPECT_NE(dynamic_cast<MemoryStore*>(rendezvous_store(info, 1s).get()), nullptr);
}

TEST(LaunchEnv, RendezvousOverTcpWhenMasterAddressIsGiven) {
  // A free port: bound by a probe server, then released.
  int port = 0;
  {
    auto probe = TcpStore::create("127.0.0.1", 0, true, 1s, kTestSecret);
    port = probe->port();
  }
  LaunchInfo info;
  info.world_size = 2;
  info.local_world_size = 2;
  info.master_addr = "127.0.0.1";
  info.master_port = port;
  std::shared_ptr<Store> server = rendezvous_store(info, 5s);
  ASSERT_NE(dynamic_cast<TcpStore*>(server.get()), nullptr);
  info.rank = 1;
  std::shared_ptr<Store> client = rendezvous_store(info, 5s);
  client->set("from", "rank 1");
  EXPECT_EQ(server->get("from", 1s), "rank 1");
}

TEST(LaunchEnv, RendezvousInAFileStoreOtherwise) {
  LaunchInfo info;
  info.world_size = 2;
  info.local_world_size = 2;
  info.launcher = "openmpi";
  info.job_id = "test/" + std::to_string(::getpid()) + " x";
  const std::string prefix =
      "/tmp/lockstep-rendezvous-test_" + std::to_string(::getpid()) + "_x-" + std::to_string(::getuid()) + "-";
  std::string directory;
  {
    std::shared_ptr<Store> rank0 = rendezvous_store(info, 1s);
    auto* file_store = dynamic_cast<FileStore*>(rank0.get());
    ASSERT_NE(file_store, nullptr);
    directory = file_store->directory();
    // The job id and user, then a tag of the job's secret that no other user can compute.
    EXPECT_EQ(directory.rfind(prefix, 0), 0u) << directory;
    EXPECT_EQ(directory.size(), prefix.size() + 16) << directory;
    info.rank = 1;
    std::shared_ptr<Store> rank1 = rendezvous_store(info, 1s);
    rank1->set("from", "rank 1");
    EXPECT_EQ(rank0->get("from", 1s), "rank 1");
    rank1.reset();
    struct stat status {};
    EXPECT_EQ(::stat(directory.c_str(), &status), 0);  // rank 1 leaves it
  }
  struct stat status {};
  EXPECT_NE(::stat(directory.c_str(), &status), 0);  // rank 0 removed it
}

TEST(LaunchEnv, RendezvousAcrossHostsNeedsMasterAddress) {
  LaunchInfo info;
  info.world_size = 8;
  info.local_world_size = 4;
  info.job_id = "j";
  std::string message;
  try {
    rendezvous_store(info, 1s);
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_TRUE(contains(message, "MASTER_ADDR")) << message;
  EXPECT_TRUE(contains(message, "several hosts")) << message;
}

TEST(LaunchEnv, RendezvousWithoutJobIdOrMasterAddressIsAnError) {
  LaunchInfo info;
  info.world_size = 2;
  info.local_world_size = 2;
  info.job_id = "";
  std::string message;
  try {
    rendezvous_store(info, 1s);
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_TRUE(contains(message, "set MASTER_ADDR")) << message;
}

}  // namespace
}  // namespace lockstep::comm

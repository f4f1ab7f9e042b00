// `lockstep train` as a user runs it: the binary, a small dataset written here, and the
// files it leaves behind.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "comm/process_launcher.h"
#include "lockstep/io/checkpoint.h"
#include "lockstep/io/safetensors.h"
#include "tools/common/command_testing.h"
#include "tools/common/small_dataset.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

class TrainCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-train-test-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    data_ = root_ / "data";
    write_small_fashion_mnist(data_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string base(const std::string& model = "mlp") const {
    return "train --quiet --threads 1 --model " + model + " --data " + data_.string() + " --batch-size 32";
  }
  nlohmann::json summary(const fs::path& out) const {
    std::ifstream in(out / "summary.json");
    return nlohmann::json::parse(in);
  }
  // `lockstep <flags>` as `processes` ranks of one job; each must exit 0.
  static void run_processes(int processes, const std::string& flags) {
    const auto exits = comm::testing::launch_program(processes, kBinary, split_words(flags), {});
    for (const auto& e : exits) EXPECT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
  }

  fs::path root_, data_;
};

TEST_F(TrainCommand, WritesSummaryMetricsAndCheckpoint) {
  const Result r = run(base() + " --steps 12 --log-every 4 --out " + (root_ / "a").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  const nlohmann::json s = summary(root_ / "a");
  EXPECT_EQ(s["steps"], 12);
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.5);  // the bands are easy to tell apart
  EXPECT_GT(s["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(s["weights_sha256"].get<std::string>().size(), 64u);
  std::ifstream metrics(root_ / "a" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto object = nlohmann::json::parse(line);
    EXPECT_EQ(object["step"], 4 * (lines + 1));
    EXPECT_TRUE(object["memory"].contains("cpu:0"));
    ++lines;
  }
  EXPECT_EQ(lines, 3);
  EXPECT_TRUE(fs::exists(root_ / "a" / "checkpoint.safetensors"));
}

// Stopping after 5 of 12 steps and resuming (crossing an epoch: 8 batches per epoch) gives
// the same weights, bit for bit, as 12 steps in one go: the checkpoint keeps the recipe,
// the default schedule's length included, so the resume needs no flags but the folder.
TEST_F(TrainCommand, ResumeContinuesBitExactly) {
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const std::string flags = base() + " --optimizer " + optimizer;
    const fs::path whole = root_ / (optimizer + "-whole"), split = root_ / (optimizer + "-split");
    ASSERT_EQ(run(flags + " --steps 12 --out " + whole.string()).exit_code, 0);
    const Result stopped = run(flags + " --steps 12 --stop-after 5 --out " + split.string());
    ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
    EXPECT_FALSE(fs::exists(split / "summary.json")) << "a stopped run has no result yet";
    const Result resumed = run("train --quiet --threads 1 --resume " + split.string());
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(summary(whole)["weights_sha256"], summary(split)["weights_sha256"]) << optimizer;
    EXPECT_EQ(summary(split)["steps"], 12);
  }
}

// The step is a tree: for a fixed (seed, batch, micro-batch), 1, 2 and 4 devices, and one
// device with two threads, end with the same weights, bit for bit, for both models (the
// CNN with dropout, whose masks are keyed by sample).
TEST_F(TrainCommand, SameWeightsOnOneTwoAndFourDevices) {
  for (const std::string model : {"mlp", "cnn", "resnet"}) {  // the ResNet's BatchNorm statistics too
    const std::string flags = base(model) + " --steps 4 --micro-batch 8";
    std::string first;
    int index = 0;
    for (const std::string layout : {"--devices 1", "--devices 2", "--devices 4", "--devices 1 --threads 2"}) {
      const fs::path out = root_ / (model + "-" + std::to_string(index++));
      const Result r = run(flags + " " + layout + " --out " + out.string());
      ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
      const nlohmann::json s = summary(out);
      if (first.empty()) first = s["weights_sha256"];
      EXPECT_EQ(s["weights_sha256"], first) << model << " " << layout;
      EXPECT_EQ(s["micro_batch"], 8);
      EXPECT_EQ(s["accumulation_steps"].get<int64_t>() * static_cast<int64_t>(s["devices"].size()), 4) << layout;
    }
  }
}

// A run checkpointed on 2 devices and resumed on 4 (crossing an epoch) ends with the
// weights of an uninterrupted run on 1.
TEST_F(TrainCommand, ResumesOnAnotherDeviceCountBitExactly) {
  const std::string flags = base() + " --lr-schedule cosine:total=12 --micro-batch 8";
  ASSERT_EQ(run(flags + " --devices 1 --steps 12 --out " + (root_ / "whole").string()).exit_code, 0);
  ASSERT_EQ(run(flags + " --devices 2 --steps 12 --stop-after 5 --out " + (root_ / "split").string()).exit_code, 0);
  const Result resumed =
      run(base() + " --lr-schedule cosine:total=12 --devices 4 --steps 12 --resume " + (root_ / "split").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary(root_ / "split")["micro_batch"], 8);  // from the checkpoint
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
}

// One process per device (torchrun's variables, the shm backend; mpirun with shm and with
// mpi): the weights of one device, bit for bit.
TEST_F(TrainCommand, DdpProcessesGiveTheBitsOfOneDevice) {
  const std::string flags = base("cnn") + " --steps 6 --micro-batch 8";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "one").string()).exit_code, 0);
  const std::string reference = summary(root_ / "one")["weights_sha256"];

  const auto exits = comm::testing::launch_program(
      2, kBinary, split_words(flags + " --strategy ddp --out " + (root_ / "ddp").string()), {});
  for (const auto& e : exits) ASSERT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
  const nlohmann::json s = summary(root_ / "ddp");
  EXPECT_EQ(s["weights_sha256"], reference);
  EXPECT_EQ(s["strategy"], "ddp");
  EXPECT_EQ(s["devices"].size(), 2u);
  EXPECT_EQ(exits[1].output, "");  // only rank 0 reports
  EXPECT_EQ(comm::testing::leftover_segments(exits), std::vector<std::string>{});

  // ZeRO-1, 2 and 3: the same bits. Processes that share memory (shm) keep one copy of the
  // weights and each steps its shard, under ddp as under ZeRO-1 and 2; under ZeRO-3 each
  // keeps its half: half the optimizer state on each of the two ranks, and the allocator's
  // peak below one device's by more than that half.
  for (const std::string strategy : {"zero1", "zero2", "zero3"}) {
    const auto sharded = comm::testing::launch_program(
        2, kBinary, split_words(flags + " --strategy " + strategy + " --out " + (root_ / strategy).string()), {});
    for (const auto& e : sharded) ASSERT_EQ(e.exit_code, 0) << comm::testing::describe(sharded);
    EXPECT_EQ(summary(root_ / strategy)["weights_sha256"], reference) << strategy;
  }
  const double whole = summary(root_ / "one")["optimizer_state_bytes"];
  const double one_peak = summary(root_ / "one")["peak_memory_bytes"];
  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    const nlohmann::json run_summary = summary(root_ / strategy);
    EXPECT_NEAR(run_summary["optimizer_state_bytes"].get<double>(), whole / 2, 64) << strategy << " " << whole;
    EXPECT_LT(run_summary["peak_memory_bytes"].get<double>(), one_peak - 0.4 * whole)
        << strategy << ": one device's peak " << one_peak << ", optimizer state " << whole;
  }

  if (!on_path("mpirun")) GTEST_SKIP() << "mpirun is not on PATH (install openmpi-bin)";
  for (const std::string backend : {"auto", "mpi"}) {
    const fs::path out = root_ / ("mpi-" + backend);
    const Result r = run_mpi(2, flags + " --strategy ddp --backend " + backend + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(summary(out)["weights_sha256"], reference) << backend;
  }
  // MPI's ranks share no memory: each keeps its weights and steps all of them; under ZeRO-2
  // each steps its half and the halves are all-gathered.
  EXPECT_NEAR(summary(root_ / "mpi-mpi")["optimizer_state_bytes"].get<double>(), whole, 64);
  const fs::path zero2 = root_ / "mpi-zero2";
  const Result r = run_mpi(2, flags + " --strategy zero2 --backend mpi --out " + zero2.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(summary(zero2)["weights_sha256"], reference);
  EXPECT_NEAR(summary(zero2)["optimizer_state_bytes"].get<double>(), whole / 2, 64);
}

// --micro-batch auto on CPU devices, where memory is plentiful: the whole share of each of
// two devices (16 of the batch of 32), printed with the flag that repeats the run, which
// gives the same weights; ddp processes choose alike. A word that is neither is refused.
TEST_F(TrainCommand, MicroBatchAutoPicksTheShareOnCpuDevices) {
  const std::string flags = base() + " --steps 3";
  const Result chosen = run(flags + " --devices 2 --micro-batch auto --out " + (root_ / "auto").string());
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("micro-batch auto: 16, the largest predicted to fit"), std::string::npos)
      << chosen.output;
  EXPECT_NE(chosen.output.find("give --micro-batch 16 to repeat this run"), std::string::npos) << chosen.output;
  EXPECT_EQ(summary(root_ / "auto")["micro_batch"], 16);
  ASSERT_EQ(run(flags + " --devices 2 --micro-batch 16 --out " + (root_ / "given").string()).exit_code, 0);
  EXPECT_EQ(summary(root_ / "auto")["weights_sha256"], summary(root_ / "given")["weights_sha256"]);
  run_processes(2, flags + " --strategy zero3 --micro-batch auto --out " + (root_ / "zero3").string());
  EXPECT_EQ(summary(root_ / "zero3")["weights_sha256"], summary(root_ / "given")["weights_sha256"]);
  const Result bad = run(flags + " --micro-batch many");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("--micro-batch expects an integer or auto, got 'many'"), std::string::npos) << bad.output;
}

// LOCKSTEP_CPU_DEVICE_MEMORY gives CPU devices a GPU's fixed memory: --micro-batch auto plans
// for it (and still trains), and a value that is not a size is named.
TEST_F(TrainCommand, CpuDevicesGivenAGpusMemory) {
  const auto with_memory = [&](const std::string& size, const std::string& flags) {
    return run_shell("CUDA_VISIBLE_DEVICES= LOCKSTEP_CPU_DEVICE_MEMORY=" + size + " " + kBinary + " " + base() +
                     " --steps 2 --devices 2 " + flags);
  };
  const Result planned = with_memory("64M", "--micro-batch auto --out " + (root_ / "auto").string());
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  EXPECT_NE(planned.output.find("of the 64.0 MiB of each device"), std::string::npos) << planned.output;
  EXPECT_EQ(summary(root_ / "auto")["micro_batch_changes"], nlohmann::json::array());
  const Result bad = with_memory("lots", "--micro-batch 16");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("LOCKSTEP_CPU_DEVICE_MEMORY='lots' is not a size"), std::string::npos) << bad.output;
}

// Evaluation's forward over a thousand images needs more than a step at micro-batch 4: on a
// device given 24 MiB it halves its batch until it fits, and scores as a device with room.
TEST_F(TrainCommand, EvaluationHalvesItsBatchWhereItRunsOut) {
  write_dataset(data_, "t10k", 2000, 2);
  const std::string flags = base("cnn") + " --micro-batch 4 --steps 2 --devices 1 --out " + root_.string() + "/";
  ASSERT_EQ(run(flags + "roomy").exit_code, 0);
  const Result tight =
      run_shell("CUDA_VISIBLE_DEVICES= LOCKSTEP_CPU_DEVICE_MEMORY=24M " + kBinary + " " + flags + "tight");
  ASSERT_EQ(tight.exit_code, 0) << tight.output;
  EXPECT_NE(tight.output.find("evaluating 1000 samples at a time ran out of memory on cpu:0: tried to allocate"),
            std::string::npos)
      << tight.output;
  EXPECT_NE(tight.output.find("; taking 500"), std::string::npos) << tight.output;
  EXPECT_NEAR(summary(root_ / "tight")["test_accuracy"].get<double>(),
              summary(root_ / "roomy")["test_accuracy"].get<double>(), 0.01);
}

// --micro-batch auto under ddp (2 processes over shm): the training set on cpu:0 counts
// against LOCKSTEP_CPU_DEVICE_MEMORY and the plan leaves it out (docs/plan.md), so with a
// large one and the limit between the measured peaks of micro-batches 64 and 128 the plan
// picks 128, which runs out on both ranks; they agree, take step 1 again with 64 and end
// with the weights of a run at 64, which summary.json and the checkpoint say. zero3 cannot
// take a step again and says so before the first.
TEST_F(TrainCommand, DdpHalvesTheMicroBatchOnEveryRankWhenAutosPickRunsOut) {
  const fs::path big = root_ / "big";
  write_dataset(big, "train", 8192, 3);
  write_dataset(big, "t10k", 20, 4);  // evaluated at once, it must fit beside the training set
  const std::string flags = "train --threads 1 --model cnn --data " + big.string() +
                            " --batch-size 256 --steps 2 --strategy ddp --out " + root_.string() + "/";
  const auto train = [&](const std::string& run, const std::string& micro_batch, const std::string& memory) {
    const auto exits =
        comm::testing::launch_program(2, kBinary, split_words(flags + run + " --micro-batch " + micro_batch),
                                      {{"CUDA_VISIBLE_DEVICES", ""}, {"LOCKSTEP_CPU_DEVICE_MEMORY", memory}});
    for (const auto& e : exits) EXPECT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
    return exits[0].output;
  };
  train("small", "64", "0");
  train("large", "128", "0");
  const int64_t small = summary(root_ / "small")["peak_memory_bytes"],
                large = summary(root_ / "large")["peak_memory_bytes"];
  ASSERT_GT(large, small + (int64_t{4} << 20)) << "the micro-batch should decide the peak";
  const std::string output = train("auto", "auto", std::to_string((small + large) / 2));
  EXPECT_NE(output.find("micro-batch auto: 128"), std::string::npos) << output;
  EXPECT_NE(output.find("step 1 ran out of memory with micro-batch 128 (rank 0 (and 1 other rank): out of memory on "
                        "cpu:0"),
            std::string::npos)
      << output;
  const nlohmann::json halved = summary(root_ / "auto");
  EXPECT_EQ(halved["weights_sha256"], summary(root_ / "small")["weights_sha256"]);
  EXPECT_EQ(halved["micro_batch"], 64);
  ASSERT_EQ(halved["micro_batch_changes"].size(), 1u) << halved.dump();
  EXPECT_EQ(halved["micro_batch_changes"][0]["step"], 1);
  EXPECT_EQ(halved["micro_batch_changes"][0]["from"], 128);
  EXPECT_EQ(halved["micro_batch_changes"][0]["to"], 64);
  EXPECT_EQ(load_safetensors_metadata((root_ / "auto" / "checkpoint.safetensors").string()).at("micro_batch"), "64");

  const auto zero3 = comm::testing::launch_program(
      2, kBinary,
      split_words(base() + " --steps 1 --strategy zero3 --micro-batch auto --out " + (root_ / "z3").string()),
      {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(zero3[0].exit_code, 0) << comm::testing::describe(zero3);
  EXPECT_NE(zero3[0].output.find("--micro-batch auto: --strategy zero3 cannot take a step that runs out of memory "
                                 "again with half the micro-batch (ZeRO-3 gathers each unit"),
            std::string::npos)
      << zero3[0].output;
}

// A rank killed mid-run (kill -9) ends the job: the survivor stops with an error that
// names the dead rank, well before the collective timeout, and leaves nothing in /dev/shm.
TEST_F(TrainCommand, AKilledRankEndsTheJobNamingIt) {
  const auto started = std::chrono::steady_clock::now();
  const auto exits = comm::testing::launch_program(
      2, kBinary, split_words(base() + " --steps 1000000 --strategy ddp --out " + (root_ / "ddp").string()), {}, 120,
      [](const std::vector<int>& pids) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        kill(pids[1], SIGKILL);
      });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(exits[1].signal, SIGKILL);
  EXPECT_NE(exits[0].exit_code, 0) << comm::testing::describe(exits);
  EXPECT_NE(exits[0].output.find("rank 1"), std::string::npos) << exits[0].output;
  EXPECT_LT(seconds, 60) << "the survivor waited for a timeout instead of noticing the death";
  EXPECT_EQ(comm::testing::leftover_segments(exits), std::vector<std::string>{});
}

// A checkpoint written by 2 ZeRO-2 processes (the optimizer state gathered whole) resumes
// under ZeRO-3 (the weights too), whose checkpoint resumes under ZeRO-1, whose checkpoint
// resumes on one process with 2 devices, ending with the weights of an uninterrupted run.
TEST_F(TrainCommand, ZeroCheckpointsResumeOnEveryLayout) {
  const std::string flags = base() + " --optimizer adamw --lr-schedule cosine:total=10 --micro-batch 8 --steps 10";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "whole").string()).exit_code, 0);
  const std::string split = (root_ / "split").string();
  for (const std::string leg : {" --strategy zero2 --stop-after 3 --out ", " --strategy zero3 --stop-after 5 --resume ",
                                " --strategy zero1 --stop-after 7 --resume "}) {
    const auto exits = comm::testing::launch_program(2, kBinary, split_words(flags + leg + split), {});
    for (const auto& e : exits) ASSERT_EQ(e.exit_code, 0) << leg << comm::testing::describe(exits);
  }
  EXPECT_EQ(load_safetensors_metadata(split + "/checkpoint.safetensors").at("step"), "7");
  const Result resumed = run(flags + " --devices 2 --resume " + split);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
}

// Local SGD (--sync-every 4) over 2 processes: a stop asked after step 5 waits for the
// averaging after step 8, whose checkpoint holds the one state; the resume ends with the
// weights of an uninterrupted run.
TEST_F(TrainCommand, LocalSgdStopsWhereReplicasAgreeAndResumesExactly) {
  const std::string flags = base() + " --strategy ddp --micro-batch 8 --steps 12 --sync-every 4";
  const auto run_two = [&](const std::string& extra) { run_processes(2, flags + extra); };
  run_two(" --out " + (root_ / "whole").string());
  run_two(" --stop-after 5 --out " + (root_ / "split").string());
  EXPECT_EQ(load_safetensors_metadata((root_ / "split" / "checkpoint.safetensors").string()).at("step"), "8");
  run_two(" --resume " + (root_ / "split").string());
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
  EXPECT_EQ(summary(root_ / "whole")["sync_every"], 4);
}

// PowerSGD over 2 processes: each rank's error feedback is in the checkpoint, so a stop
// and a resume end with the weights of an uninterrupted run.
TEST_F(TrainCommand, PowerSgdResumesExactly) {
  const std::string flags = base() + " --strategy ddp --micro-batch 8 --steps 12 --powersgd-rank 2 --powersgd-start 2";
  const auto run_two = [&](const std::string& extra) { run_processes(2, flags + extra); };
  run_two(" --out " + (root_ / "whole").string());
  run_two(" --stop-after 5 --out " + (root_ / "split").string());
  run_two(" --resume " + (root_ / "split").string());
  EXPECT_EQ(summary(root_ / "whole")["weights_sha256"], summary(root_ / "split")["weights_sha256"]);
  const Result one = run(base() + " --strategy ddp --resume " + (root_ / "split").string());
  EXPECT_EQ(one.exit_code, 1);
  EXPECT_NE(one.output.find("error feedback is of 2 ranks; each rank's is its own, so resume on 2 ranks, not 1"),
            std::string::npos)
      << one.output;
}

int metrics_lines(const fs::path& file) {
  std::ifstream in(file);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

std::string tensors_hash(const fs::path& checkpoint) {
  return load_safetensors_metadata(checkpoint.string()).at(kTensorsSha256Key);
}

// SIGTERM (a preemption) or SIGUSR1 (Slurm's --signal) mid-run: the run stops at the next
// step boundary with a checkpoint, says how to continue and exits 128 + the signal; the
// resumed run is the same run, bit for bit (weights and optimizer state), as one that was
// never stopped. The steps are many, so the signal always arrives while training.
TEST_F(TrainCommand, ASignalStopsAtAStepWithACheckpointAndTheResumeIsExact) {
  for (const int signal : {SIGTERM, SIGUSR1}) {
    const fs::path out = root_ / ("signalled-" + std::to_string(signal));
    const auto exits = comm::testing::launch_program(
        1, kBinary, split_words(base() + " --steps 1000000 --log-every 10 --out " + out.string()),
        {{"CUDA_VISIBLE_DEVICES", ""}}, 120, [&](const std::vector<int>& pids) {
          for (int i = 0; i < 1500 && metrics_lines(out / "metrics.jsonl") < 3; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          kill(pids[0], signal);
        });
    ASSERT_EQ(exits[0].exit_code, 128 + signal) << comm::testing::describe(exits);
    EXPECT_NE(exits[0].output.find(std::string(" by ") + (signal == SIGTERM ? "SIGTERM" : "SIGUSR1")),
              std::string::npos)
        << exits[0].output;
    EXPECT_NE(exits[0].output.find("continue with: lockstep train --resume " + out.string()), std::string::npos)
        << exits[0].output;
    const int64_t stopped = std::stoll(load_safetensors_metadata((out / "checkpoint.safetensors").string()).at("step"));
    EXPECT_GE(stopped, 30);
    const std::string until = " --stop-after " + std::to_string(stopped + 7);
    const Result resumed = run("train --quiet --threads 1 --resume " + out.string() + until);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const fs::path straight = root_ / ("straight-" + std::to_string(signal));
    ASSERT_EQ(run(base() + " --steps 1000000" + until + " --out " + straight.string()).exit_code, 0);
    EXPECT_EQ(tensors_hash(out / "checkpoint.safetensors"), tensors_hash(straight / "checkpoint.safetensors"));
  }
}

// One command line for the first start and every restart: `lockstep run --max-restarts 1`
// of two ddp ranks with --resume auto, rank 1 killed by SIGKILL mid-run in the first
// attempt. The group restarts from the newest checkpoint and ends with the weights of one
// uninterrupted run on one device.
// On CPU devices the optimizer state is in host memory already: --offload-optimizer says it
// does nothing, and the run is the run without it.
TEST_F(TrainCommand, OffloadingTheOptimizerOnCpuDevicesSaysItDoesNothing) {
  const std::string flags = base("mlp") + " --steps 3 --devices 1";
  ASSERT_EQ(run(flags + " --out " + (root_ / "plain").string()).exit_code, 0);
  const Result r = run(flags + " --offload-optimizer --out " + (root_ / "offload").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--offload-optimizer does nothing on CPU devices"), std::string::npos) << r.output;
  EXPECT_EQ(summary(root_ / "offload")["optimizer_offload"], false);
  EXPECT_EQ(summary(root_ / "offload")["weights_sha256"], summary(root_ / "plain")["weights_sha256"]);
}

TEST_F(TrainCommand, ARestartedGroupContinuesFromItsCheckpoint) {
  // Enough steps after the tenth that the kill lands before the run ends: sanitized steps
  // are ten times slower, so a quarter of them leave it more time.
  const int steps = kSanitized ? 100 : 400;
  const std::string flags = base() + " --steps " + std::to_string(steps) + " --micro-batch 8 --checkpoint-every 5";
  ASSERT_EQ(run(flags + " --devices 1 --out " + (root_ / "whole").string()).exit_code, 0);
  const fs::path out = root_ / "restarted", marker = root_ / "killed-once";
  // Rank 1's first attempt is killed once its group has saved step 10.
  const std::string worker = "if [ $RANK = 1 ] && [ ! -e " + marker.string() + " ]; then touch " + marker.string() +
                             "; (while [ ! -e " + (out / "checkpoint-00000010.safetensors").string() +
                             " ]; do sleep 0.01; done; kill -9 $$) & fi; exec " + kBinary + " " + flags +
                             " --strategy ddp --resume auto --out " + out.string();
  const Result r =
      run("run -n 2 --max-restarts 1 --log-dir " + (root_ / "logs").string() + " -- sh -c '" + worker + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting the group (1 of 1)"), std::string::npos) << r.output;
  EXPECT_GT(summary(out)["steps"], 10);
  EXPECT_EQ(summary(out)["weights_sha256"], summary(root_ / "whole")["weights_sha256"]);
}

// examples/ddp_train.cpp, the program users copy: on 2 processes it prints the losses it
// prints on one, digit for digit.
TEST_F(TrainCommand, TheDdpExampleGivesOneProcesssLosses) {
  const std::string example = std::string(LOCKSTEP_BINARY_DIR) + "/bin/ddp_train";
  if (!fs::exists(example)) GTEST_SKIP() << example << " is not built (this configuration builds the tests only)";
  const Result alone = run_shell("env -u RANK -u WORLD_SIZE " + example + " 16 " + data_.string());
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const auto exits = comm::testing::launch_program(2, example, {"16", data_.string()}, {});
  for (const auto& e : exits) ASSERT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
  EXPECT_NE(alone.output.find("step 16  loss"), std::string::npos) << alone.output;
  EXPECT_EQ(exits[0].output, alone.output);
  EXPECT_EQ(exits[1].output, "");
}

TEST_F(TrainCommand, WritesTheDeviceTableAndATrace) {
  const fs::path trace = root_ / "steps.trace.json";
  const Result r = run("train --threads 2 --devices 2 --model mlp --data " + data_.string() +
                       " --batch-size 32 --steps 3 --trace " + trace.string() + " --out " + (root_ / "a").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("slowest device cpu:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("communication"), std::string::npos) << r.output;
  const nlohmann::json s = summary(root_ / "a");
  ASSERT_EQ(s["devices"].size(), 2u);
  EXPECT_EQ(s["devices"][1]["device"], "cpu:1");
  EXPECT_GT(s["devices"][1]["compute_s"].get<double>(), 0);
  // Each replica lives on its own device: device 1's memory is its own, not device 0's.
  EXPECT_GT(s["devices"][1]["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_LT(s["devices"][1]["peak_memory_bytes"].get<int64_t>(), s["devices"][0]["peak_memory_bytes"].get<int64_t>());
  EXPECT_NE(r.output.find("peak MiB"), std::string::npos) << r.output;
  std::ifstream metrics(root_ / "a" / "metrics.jsonl");
  std::string last;
  for (std::string line; std::getline(metrics, line);) last = line;
  EXPECT_TRUE(nlohmann::json::parse(last)["memory"].contains("cpu:1")) << last;
  std::ifstream in(trace);
  const nlohmann::json events = nlohmann::json::parse(in);
  int spans = 0;
  for (const auto& event : events) spans += event["ph"] == "X";
  EXPECT_EQ(spans, 3 * 2 * 4);  // steps x devices x (compute, wait, all-reduce, optimizer)
}

// Under one process per device every rank is traced: one named process row per rank, the
// step's number on each span, merged into the one file, no part left beside it.
TEST_F(TrainCommand, TracesEveryRankOfADistributedJob) {
  const fs::path trace = root_ / "ranks.trace.json";
  const auto exits = comm::testing::launch_program(
      2, kBinary,
      split_words(base() + " --strategy ddp --steps 3 --trace " + trace.string() + " --out " + (root_ / "a").string()),
      {});
  for (const auto& e : exits) ASSERT_EQ(e.exit_code, 0) << comm::testing::describe(exits);
  std::ifstream in(trace);
  const nlohmann::json events = nlohmann::json::parse(in);
  std::map<int, int> spans;
  std::map<int, std::string> names;
  std::set<int64_t> steps;
  for (const auto& event : events) {
    if (event["ph"] == "X") {
      ++spans[event["pid"].get<int>()];
      steps.insert(event["args"]["step"].get<int64_t>());
    }
    if (event["name"] == "process_name") names[event["pid"].get<int>()] = event["args"]["name"];
  }
  EXPECT_EQ(spans, (std::map<int, int>{{0, 3 * 4}, {1, 3 * 4}}));  // steps x (compute, wait, all-reduce, optimizer)
  EXPECT_EQ(names, (std::map<int, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  EXPECT_EQ(steps, (std::set<int64_t>{1, 2, 3}));
  EXPECT_FALSE(fs::exists(trace.string() + ".rank1"));
}

// Label smoothing changes the weights, is part of the recipe a checkpoint keeps (a resume
// with another value is refused by name) and goes into summary.json.
TEST_F(TrainCommand, LabelSmoothingIsPartOfTheRecipe) {
  const fs::path plain = root_ / "plain", smoothed = root_ / "smoothed";
  ASSERT_EQ(run(base() + " --steps 4 --out " + plain.string()).exit_code, 0);
  const Result stopped = run(base() + " --steps 4 --stop-after 2 --label-smoothing 0.1 --out " + smoothed.string());
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const Result other = run("train --quiet --threads 1 --label-smoothing 0.2 --resume " + smoothed.string());
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_NE(other.output.find("label-smoothing"), std::string::npos) << other.output;
  const Result resumed = run("train --quiet --threads 1 --resume " + smoothed.string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(summary(smoothed)["label_smoothing"], 0.1);
  EXPECT_EQ(summary(plain)["label_smoothing"], 0.0);
  EXPECT_NE(summary(smoothed)["weights_sha256"], summary(plain)["weights_sha256"]);
}

TEST_F(TrainCommand, SameSeedSameWeightsOtherSeedOtherWeights) {
  ASSERT_EQ(run(base() + " --steps 3 --seed 7 --out " + (root_ / "a").string()).exit_code, 0);
  ASSERT_EQ(run(base() + " --steps 3 --seed 7 --out " + (root_ / "b").string()).exit_code, 0);
  ASSERT_EQ(run(base() + " --steps 3 --seed 8 --out " + (root_ / "c").string()).exit_code, 0);
  EXPECT_EQ(summary(root_ / "a")["weights_sha256"], summary(root_ / "b")["weights_sha256"]);
  EXPECT_NE(summary(root_ / "a")["weights_sha256"], summary(root_ / "c")["weights_sha256"]);
}

// --steps 0 evaluates the starting weights. Given --init with a trained run's weights under
// PyTorch's names (the checkpoint's "model." entries, renamed), it reproduces that run's test
// loss exactly; from the seed, it is worse.
TEST_F(TrainCommand, StepsZeroEvaluatesInitWeights) {
  ASSERT_EQ(run(base() + " --steps 12 --out " + (root_ / "a").string()).exit_code, 0);
  NamedTensors weights;
  for (const auto& [name, tensor] : load_checkpoint((root_ / "a" / "checkpoint.safetensors").string()).tensors)
    if (name.rfind("model.", 0) == 0) weights.emplace_back(name.substr(6), tensor);
  ASSERT_EQ(weights.size(), 6u);  // fc1..fc3, weight and bias
  save_safetensors((root_ / "weights.safetensors").string(), weights);

  const Result loaded = run(base() + " --steps 0 --init " + (root_ / "weights.safetensors").string() + " --out " +
                            (root_ / "b").string());
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_EQ(summary(root_ / "b")["steps"], 0);
  EXPECT_EQ(summary(root_ / "b")["test_loss"], summary(root_ / "a")["test_loss"]);
  EXPECT_EQ(summary(root_ / "b")["weights_sha256"], summary(root_ / "a")["weights_sha256"]);

  ASSERT_EQ(run(base() + " --steps 0 --out " + (root_ / "c").string()).exit_code, 0);
  EXPECT_GT(summary(root_ / "c")["test_loss"].get<double>(), summary(root_ / "a")["test_loss"].get<double>());

  // A run's own checkpoint is taken as it is: its model's weights.
  const Result from_checkpoint = run(base() + " --steps 0 --init " + (root_ / "a" / "checkpoint.safetensors").string() +
                                     " --out " + (root_ / "d").string());
  ASSERT_EQ(from_checkpoint.exit_code, 0) << from_checkpoint.output;
  EXPECT_EQ(summary(root_ / "d")["weights_sha256"], summary(root_ / "a")["weights_sha256"]);
  // Weights of another model: one line that names what differs.
  const Result other = run(base("cnn") + " --steps 0 --init " + (root_ / "weights.safetensors").string() + " --out " +
                           (root_ / "e").string());
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_NE(other.output.find("does not fit model 'cnn': "), std::string::npos) << other.output;
  EXPECT_NE(other.output.find(" missing (conv1.weight, "), std::string::npos) << other.output;
  EXPECT_NE(other.output.find(" of another shape (fc1.weight [512, 784] in the file, [128, 1600] here"),
            std::string::npos)
      << other.output;
  EXPECT_EQ(std::count(other.output.begin(), other.output.end(), '\n'), 1) << other.output;
}

TEST_F(TrainCommand, BadInputGetsOneLineErrorAndExitCode) {
  struct Case {
    std::string arguments;
    int exit_code;
    std::string must_mention;
  };
  const fs::path corrupt = root_ / "corrupt";
  fs::create_directories(corrupt);
  fs::copy(data_ / "t10k-images-idx3-ubyte.gz", corrupt / "t10k-images-idx3-ubyte.gz");
  fs::copy(data_ / "t10k-labels-idx1-ubyte.gz", corrupt / "t10k-labels-idx1-ubyte.gz");
  fs::copy(data_ / "train-labels-idx1-ubyte.gz", corrupt / "train-labels-idx1-ubyte.gz");
  {
    // A truncated gzip stream.
    std::ifstream in(data_ / "train-images-idx3-ubyte.gz", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(corrupt / "train-images-idx3-ubyte.gz", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  std::ofstream(root_ / "bad.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\0\0\0\0{", 9);
  ASSERT_EQ(run(base("cnn") + " --steps 1 --out " + (root_ / "cnn").string()).exit_code, 0);
  // A test split with no image: nothing to report an accuracy on.
  const fs::path no_test = root_ / "no-test";
  write_dataset(no_test, "train", 64, 1);
  write_dataset(no_test, "t10k", 0, 2);

  const std::vector<Case> cases = {
      {base() + " --data " + (root_ / "nowhere").string(), 1, "apt-get install dataset-fashion-mnist"},
      {base() + " --data " + corrupt.string(), 1, "train-images-idx3-ubyte.gz"},
      {base() + " --data " + no_test.string(), 1, "the test set in " + no_test.string() + " is empty"},
      {base() + " --batch-size 0", 2, "--batch-size must be at least 1, got 0"},
      {base() + " --epochs -1", 2, "--epochs must be 0 or more, got -1"},
      {base() + " --lr -0.5", 2, "--lr must be a positive number, got -0.5"},
      {base() + " --lr-schedule warp:3", 2, "--lr-schedule: "},
      {base() + " --init " + (root_ / "bad.safetensors").string(), 1, "bad.safetensors"},
      {base() + " --resume " + (root_ / "cnn").string(), 1, "--model cnn"},
      {base() + " --resume " + (root_ / "empty").string(), 1, "checkpoint.safetensors"},
      {base() + " --model vgg", 2, "vgg"},
      {base() + " --bogus 3", 2, "--bogus"},
      {base() + " --steps many", 2, "--steps"},
      {base() + " --micro-batch 4 --devices 3", 2, "8 micro-batches, which 3 devices cannot share"},
      {base() + " --micro-batch 5", 2, "multiple of the micro-batch (5)"},
      {base() + " --devices -1", 2, "--devices -1 is not a count"},
      {base() + " --devices cuda:1,cuda:3", 2, "must be cuda:0, not cuda:1"},
      {base() + " --devices cuda:0", 2, "no GPU is visible"},
      {base() + " --precision bf16", 2, "--precision bf16 runs on GPU devices"},
      {base() + " --precision f8", 2, "--precision must be f32, bf16 or f16"},
      {base() + " --strategy zero9", 2, "--strategy"},
      {base() + " --strategy ddp --devices 2", 2, "one device per process"},
      {base() + " --label-smoothing 1.5", 2, "--label-smoothing must lie in [0, 1], got 1.5"},
      {base("gpt") + " --label-smoothing 0.1", 2, "--label-smoothing is for the Fashion-MNIST models"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.arguments);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.arguments << "\n" << r.output;
    EXPECT_NE(r.output.find(c.must_mention), std::string::npos) << c.arguments << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line expected:\n" << r.output;
  }
}

// The accuracy of one epoch with the defaults (batch 32 in micro-batches of 4, AdamW lr
// 0.004 after 100 warm-up steps, cosine decay; the ResNet at lr 0.006 in micro-batches of 16
// with label smoothing 0.1) on the real dataset: the targets, 85% for the MLP, 88% for the
// CNN and 90.5% for the ResNet. The runs are deterministic (MLP 0.8628, CNN 0.8856, ResNet
// 0.9066 here, on any device count); other OpenBLAS kernels round differently, and seeds 1
// and 2 give the CNN 0.8838 and 0.8855 and the ResNet 0.9045 and 0.9097, so the ResNet's
// bound keeps a margin below its target. bench/torch_accuracy.py runs the same recipe in PyTorch.
TEST(TrainCommandLong, DefaultRunsReachTheirAccuracy) {
  if (kSanitized) GTEST_SKIP() << "a full epoch is too slow under sanitizers; the release build runs it";
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const fs::path out = fs::temp_directory_path() / ("lockstep-accuracy-" + std::to_string(getpid()));
  for (const auto& [model, target] :
       std::vector<std::pair<std::string, double>>{{"mlp", 0.85}, {"cnn", 0.88}, {"resnet", 0.9}}) {
    const Result r = run("train --quiet --model " + model + " --out " + (out / model).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(out / model / "summary.json");
    const double accuracy = nlohmann::json::parse(in)["test_accuracy"];
    EXPECT_GE(accuracy, target) << model;
    std::printf("%s: test accuracy %.4f after one epoch\n", model.c_str(), accuracy);
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace lockstep

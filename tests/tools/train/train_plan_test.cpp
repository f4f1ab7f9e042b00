// The plan of `lockstep train`, made for hosts and launchers this machine is not: every
// default settled from the environment it is given (cores, GPUs, a launcher's ranks), a
// checkpoint's settings taken or checked against the flags, and bad combinations refused
// as usage errors naming the flags.
#include "tools/train/train_plan.h"

#include <gtest/gtest.h>

#include <set>

#include "lockstep/core/error.h"
#include "tools/train/train_recipe.h"

namespace lockstep::tools {
namespace {

// Flags as parsed: the options with the fields `given` names set by the test.
struct Command {
  TrainOptions flags;
  std::set<std::string> given;
};

TrainPlan plan(const Command& command, const TrainEnvironment& environment) {
  return plan_training(
      command.flags, [&](const std::string& flag) { return command.given.contains(flag); }, environment);
}

TrainEnvironment host(int cores, int gpus = 0) {
  TrainEnvironment environment;
  environment.visible_gpus = gpus;
  environment.host_cores = cores;
  environment.fresh_out_dir = "runs/fresh";
  return environment;
}

// A process of a job of `world` processes, `per_host` to a host.
TrainEnvironment launched(int rank, int world, int per_host, int cores, int gpus = 0) {
  TrainEnvironment environment = host(cores, gpus);
  environment.launch.rank = rank;
  environment.launch.world_size = world;
  environment.launch.local_rank = rank % per_host;
  environment.launch.local_world_size = per_host;
  environment.launch.launcher = "torchrun";
  return environment;
}

std::string usage_error(const Command& command, const TrainEnvironment& environment) {
  try {
    plan(command, environment);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no usage error";
  return "";
}

TEST(TrainPlan, DefaultsComeFromTheHost) {
  const TrainPlan p = plan({}, host(4));
  EXPECT_EQ(p.settings.strategy, "dp");
  EXPECT_EQ(p.settings.device_type, DeviceType::cpu);
  EXPECT_EQ(p.settings.devices, 4);  // one CPU device per core
  EXPECT_EQ(p.settings.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(p.settings.lr, 4e-3);
  EXPECT_EQ(p.settings.micro_batch, 4);  // an eighth of the batch of 32
  EXPECT_EQ(p.accumulation, 2);          // 8 micro-batches over 4 devices
  EXPECT_EQ(p.process_threads, 4);
  EXPECT_EQ(p.threads_per_device, 1);
  EXPECT_TRUE(p.leader);
  EXPECT_EQ(p.out_dir, "runs/fresh");
  EXPECT_EQ(p.resume_from, "");
  EXPECT_EQ(p.lr_schedule(1000), "cosine:warmup=100");
  EXPECT_EQ(p.lr_schedule(30), "cosine:warmup=3");  // a tenth of a short run
}

TEST(TrainPlan, DevicesShareTheStepsMicroBatchesOrAreFewer) {
  // 8 micro-batches do not split over 3 devices as the tree needs: 2 of them.
  EXPECT_EQ(plan({}, host(3)).settings.devices, 2);
  // Every visible GPU when there are some, and its threads are the host's.
  const TrainPlan gpus = plan({}, host(16, 8));
  EXPECT_EQ(gpus.settings.device_type, DeviceType::cuda);
  EXPECT_EQ(gpus.settings.devices, 8);
  EXPECT_EQ(gpus.threads_per_device, 2);
  Command cpu;
  cpu.flags.devices_flag = "cpu";
  cpu.given = {"devices"};
  EXPECT_EQ(plan(cpu, host(16, 8)).settings.device_type, DeviceType::cpu);
}

TEST(TrainPlan, ADistributedProcessIsOneDeviceOfItsJob) {
  Command ddp;
  ddp.flags.strategy = "zero1";
  ddp.given = {"strategy"};
  const TrainPlan p = plan(ddp, launched(3, 4, 2, 8));
  EXPECT_EQ(p.settings.devices, 4);
  EXPECT_EQ(p.processes, 4);
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_FALSE(p.leader);
  EXPECT_EQ(p.process_threads, 4);  // 8 cores shared by the host's 2 processes
  EXPECT_EQ(p.accumulation, 2);
  // On GPUs the backend becomes NCCL, and a local rank needs a GPU of its own.
  EXPECT_EQ(plan(ddp, launched(1, 2, 2, 8, 2)).settings.backend, "nccl");
  EXPECT_NE(usage_error(ddp, launched(1, 2, 2, 8, 1)).find("local rank 1 has no GPU"), std::string::npos);
  ddp.flags.devices_flag = "2";
  ddp.given.insert("devices");
  EXPECT_NE(usage_error(ddp, launched(0, 4, 4, 8)).find("this job has 4 process(es), not --devices 2"),
            std::string::npos);
}

// --offload-optimizer offloads on GPUs; on CPU devices it does nothing, and the plan says
// so for the run to print. The mesh steps its optimizer on its devices: refused there.
TEST(TrainPlan, OffloadingTheOptimizerIsForGpus) {
  Command offload;
  offload.flags.offload_optimizer = true;
  offload.flags.strategy = "zero2";
  offload.given = {"offload-optimizer", "strategy"};
  const TrainPlan gpus = plan(offload, launched(0, 2, 2, 8, 2));
  EXPECT_TRUE(gpus.offload_optimizer);
  EXPECT_FALSE(gpus.offload_ignored);
  const TrainPlan cpus = plan(offload, launched(0, 2, 2, 8));
  EXPECT_FALSE(cpus.offload_optimizer);
  EXPECT_TRUE(cpus.offload_ignored);
  EXPECT_FALSE(plan({}, host(4, 2)).offload_optimizer);
  Command mesh = offload;
  mesh.flags.model = "gpt";
  mesh.flags.strategy = "mesh";
  mesh.flags.tp = 2;
  mesh.given.insert({"model", "tp"});
  EXPECT_NE(usage_error(mesh, host(4))
                .find("--offload-optimizer keeps the optimizer state of --strategy dp, ddp and "
                      "zero1-3 in host memory"),
            std::string::npos);
}

TEST(TrainPlan, MeshFlagsLayOutAGptMesh) {
  Command mesh;
  mesh.flags.model = "gpt";
  mesh.flags.tp = 2;
  mesh.flags.devices_flag = "4";
  mesh.given = {"model", "tp", "devices"};
  const TrainPlan p = plan(mesh, host(4));
  EXPECT_EQ(p.settings.strategy, "mesh");
  EXPECT_EQ(p.mesh.mesh.dp, 2);  // --devices / (tp x pp)
  EXPECT_EQ(p.mesh.mesh.tp, 2);
  EXPECT_EQ(p.replicas, 2);
  EXPECT_EQ(p.processes, 1);
  EXPECT_EQ(p.settings.layers, nn::gpt_preset("tiny").layers);  // the resolved shape, for the checkpoint
  EXPECT_EQ(p.lr_schedule(100), "cosine");

  // Under a launcher each process is one device of the mesh.
  const TrainPlan process = plan({mesh.flags, {"model", "tp"}}, launched(2, 4, 4, 4));
  EXPECT_EQ(process.processes, 4);
  EXPECT_EQ(process.rank, 2);

  mesh.flags.strategy = "ddp";
  mesh.given.insert("strategy");
  EXPECT_NE(usage_error(mesh, host(4)).find("they do not go with --strategy ddp"), std::string::npos);
  Command cnn;
  cnn.flags.pp = 2;
  cnn.given = {"pp"};
  EXPECT_NE(usage_error(cnn, host(4)).find("use --model gpt"), std::string::npos);
}

// --strategy zero1 beside the mesh's flags shards the mesh's optimizer state across each
// data-parallel group; zero2 is not built there, and the error says what to use.
TEST(TrainPlan, Zero1WithMeshFlagsShardsTheMeshsOptimizerState) {
  Command mesh;
  mesh.flags.model = "gpt";
  mesh.flags.dp = 2;
  mesh.flags.pp = 2;
  mesh.given = {"model", "dp", "pp"};
  EXPECT_EQ(plan(mesh, host(4)).mesh.zero_stage, 0);
  mesh.flags.strategy = "zero1";
  mesh.given.insert("strategy");
  const TrainPlan p = plan(mesh, host(4));
  EXPECT_EQ(p.settings.strategy, "mesh");
  EXPECT_EQ(p.mesh.zero_stage, 1);
  EXPECT_EQ(p.mesh.mesh.dp, 2);
  EXPECT_EQ(p.mesh.mesh.pp, 2);
  EXPECT_EQ(p.processes, 1);
  const TrainPlan process = plan(mesh, launched(1, 4, 4, 4));  // one device per process
  EXPECT_EQ(process.processes, 4);
  EXPECT_EQ(process.mesh.zero_stage, 1);
  // Without mesh flags zero1 stays ddp's.
  Command ddp;
  ddp.flags.model = "gpt";
  ddp.flags.strategy = "zero1";
  ddp.given = {"model", "strategy"};
  EXPECT_EQ(plan(ddp, launched(0, 2, 2, 4)).settings.strategy, "zero1");
  for (const std::string strategy : {"zero2", "zero3"}) {
    mesh.flags.strategy = strategy;
    const std::string error = usage_error(mesh, host(4));
    EXPECT_NE(error.find("--strategy " + strategy + " is not built for the mesh"), std::string::npos) << error;
    EXPECT_NE(error.find("use --strategy zero1 with them"), std::string::npos) << error;
  }
  mesh.flags.strategy = "dp";
  EXPECT_NE(usage_error(mesh, host(4)).find("or give zero1 to shard the optimizer state"), std::string::npos);
}

TEST(TrainPlan, ACheckpointFixesItsSettingsAndRefusesOthers) {
  TrainOptions first;
  first.model = "mlp";
  first.optimizer = "sgd";
  first.lr = 0.05;
  first.micro_batch = 16;
  first.steps = 500;
  Metadata checkpoint = train_recipe(first);
  checkpoint["seed"] = "7";  // the Trainer's own keys
  checkpoint["batch_size"] = "64";
  checkpoint["micro_batch"] = "16";
  TrainEnvironment environment = host(2);
  environment.checkpoint_path = "runs/a/checkpoint.safetensors";
  environment.checkpoint = checkpoint;
  Command resume;
  resume.flags.resume_dir = "runs/a";
  resume.given = {"resume"};
  const TrainPlan p = plan(resume, environment);
  EXPECT_EQ(p.settings.model, "mlp");
  EXPECT_EQ(p.settings.seed, 7u);
  EXPECT_EQ(p.settings.batch_size, 64);
  EXPECT_EQ(p.settings.micro_batch, 16);
  EXPECT_DOUBLE_EQ(p.settings.lr, 0.05);
  EXPECT_EQ(p.settings.steps, 500);
  EXPECT_EQ(p.resume_from, "runs/a");
  EXPECT_EQ(p.out_dir, "runs/a");

  resume.flags.batch_size = 32;
  resume.given.insert("batch-size");
  try {
    plan(resume, environment);
    ADD_FAILURE() << "a contradicting --batch-size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a run with --batch-size 64, not 32"), std::string::npos) << e.what();
  }

  environment.checkpoint->at("seed") = "-1";
  resume.flags.batch_size = 64;
  EXPECT_THROW(plan(resume, environment), Error);

  // The run's length is part of its recipe: --stop-after ends it early instead.
  environment.checkpoint->at("seed") = "7";
  Command longer;
  longer.flags.resume_dir = "runs/a";
  longer.flags.steps = 1000;
  longer.given = {"resume", "steps"};
  try {
    plan(longer, environment);
    ADD_FAILURE() << "a contradicting --steps was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a run with --steps 500, not 1000"), std::string::npos) << e.what();
  }
  // --resume auto in a folder without a checkpoint is a fresh start there; it needs --out.
  Command automatic;
  automatic.flags.resume_dir = "auto";
  automatic.flags.out_dir = "runs/b";
  automatic.given = {"resume", "out"};
  const TrainPlan fresh = plan(automatic, host(2));
  EXPECT_EQ(fresh.resume_from, "");
  EXPECT_EQ(fresh.out_dir, "runs/b");
  automatic.flags.out_dir = "";
  EXPECT_NE(usage_error(automatic, host(2)).find("give --out DIR"), std::string::npos);
}

TEST(TrainPlan, OutOfRangeValuesAreUsageErrors) {
  const auto error_of = [](auto set, const std::string& flag) {
    Command command;
    set(command.flags);
    command.given = {flag};
    return usage_error(command, host(2));
  };
  EXPECT_NE(error_of([](TrainOptions& o) { o.batch_size = 0; }, "batch-size").find("--batch-size must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.lr = -1; }, "lr").find("--lr must be a positive number"),
            std::string::npos);
  // -1 and 0 mean "the default" inside, not when given.
  EXPECT_NE(
      error_of([](TrainOptions& o) { o.micro_batch = -3; }, "micro-batch").find("--micro-batch must be 1 or more"),
      std::string::npos);
  EXPECT_NE(error_of(
                [](TrainOptions& o) {
                  o.model = "gpt";
                  o.heads = 0;
                },
                "heads")
                .find("--heads must be 1 or more"),
            std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.steps = -1; }, "steps").find("--steps must be 0 or more"),
            std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.precision = "bf16"; }, "precision").find("runs on GPU devices"),
            std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.precision = "f8"; }, "precision").find("must be f32, bf16 or f16"),
            std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.model = "vit"; }, "model").find("--model must be"), std::string::npos);
  EXPECT_NE(error_of([](TrainOptions& o) { o.lr_schedule = "linear"; }, "lr-schedule").find("--lr-schedule"),
            std::string::npos);
}

// The GPT trains on GPUs like the other models, and its mesh takes every GPU this process
// sees (a thread each) or, launched, one per process over NCCL.
TEST(TrainPlan, TheGptAndItsMeshTrainOnGpus) {
  Command gpt;
  gpt.flags.model = "gpt";
  gpt.given = {"model"};
  const TrainPlan dp = plan(gpt, host(4, 2));
  EXPECT_EQ(dp.settings.device_type, DeviceType::cuda);
  EXPECT_EQ(dp.settings.devices, 2);
  EXPECT_EQ(dp.settings.strategy, "dp");

  Command mesh = gpt;
  mesh.flags.tp = 2;
  mesh.flags.precision = "bf16";
  mesh.given.insert({"tp", "precision"});
  const TrainPlan every_gpu = plan(mesh, host(4, 4));
  EXPECT_EQ(every_gpu.settings.device_type, DeviceType::cuda);
  EXPECT_EQ(every_gpu.mesh.mesh.dp, 2);  // 4 GPUs / tp 2
  EXPECT_EQ(every_gpu.mesh.mesh.size(), 4);
  EXPECT_EQ(every_gpu.mesh.precision, DType::bf16);
  EXPECT_EQ(every_gpu.processes, 1);

  Command too_big = mesh;
  too_big.flags.pp = 2;
  too_big.given.insert("pp");
  EXPECT_NE(usage_error(too_big, host(4, 2))
                .find("a mesh of dp 1 x tp 2 x pp 2 needs 4 GPUs, one per rank; this "
                      "process sees 2"),
            std::string::npos);
  const TrainPlan process = plan(too_big, launched(3, 4, 4, 8, 4));
  EXPECT_EQ(process.settings.backend, "nccl");
  EXPECT_EQ(process.local_rank, 3);
  EXPECT_NE(usage_error(too_big, launched(3, 4, 4, 8, 2)).find("local rank 3 has no GPU"), std::string::npos);

  Command f16 = mesh;
  f16.flags.precision = "f16";
  EXPECT_NE(usage_error(f16, host(4, 4)).find("f16 needs a loss scale that every stage agrees on"), std::string::npos);
}

// A GPT too large for the host is refused before a block is allocated, whether its shape
// comes from the flags or from a checkpoint's metadata.
TEST(TrainPlan, AModelLargerThanTheHostsMemoryIsRefused) {
  TrainEnvironment environment = host(2);
  environment.host_memory_bytes = int64_t{8} << 30;
  Command huge;
  huge.flags.model = "gpt";
  huge.flags.layers = 100000;
  huge.flags.width = 1024;
  huge.flags.heads = 8;
  huge.given = {"model", "layers", "width", "heads"};
  const std::string error = usage_error(huge, environment);
  EXPECT_NE(error.find("100000 layers of width 1024"), std::string::npos) << error;
  EXPECT_NE(error.find("more than this host's 8.0 GiB of memory"), std::string::npos) << error;

  TrainOptions small;
  small.model = "gpt";
  Metadata checkpoint = train_recipe(plan({.flags = small, .given = {"model"}}, environment).settings);
  checkpoint["seed"] = "0";
  checkpoint["batch_size"] = "64";
  checkpoint["micro_batch"] = "8";
  checkpoint["layers"] = "1000000000";
  environment.checkpoint_path = "runs/a/checkpoint.safetensors";
  environment.checkpoint = checkpoint;
  Command resume;
  resume.flags.resume_dir = "runs/a";
  resume.given = {"resume"};
  EXPECT_NE(usage_error(resume, environment).find("1000000000 layers"), std::string::npos);

  environment.checkpoint->at("layers") = "2";  // what fits is planned
  EXPECT_EQ(plan(resume, environment).gpt.layers, 2);
}

}  // namespace
}  // namespace lockstep::tools

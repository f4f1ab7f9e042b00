// The Python-stack rules on facts built by hand, each mismatch people hit: a wheel built for
// a newer CUDA than the driver, a CPU-only build on a GPU server, two NCCLs in one process, a
// framework whose import fails, cuDNN refusing to load. The expected verdicts follow CUDA's
// compatibility rules and the wheels each project publishes, not earlier output.
#include <gtest/gtest.h>

#include "tools/doctor/doctor_checks.h"
#include "tools/doctor/framework_builds.h"

namespace lockstep::tools {
namespace {

// A host with `gpus` GPUs whose driver supports CUDA `driver_cuda` (none when 0 GPUs).
DoctorInput host(int gpus, int driver_cuda, const std::string& driver = "535.129.03") {
  DoctorInput in;
  if (gpus > 0) {
    in.gpus.library_path = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
    in.gpus.driver_version = driver;
    in.gpus.cuda_driver_version = driver_cuda;
    for (int i = 0; i < gpus; ++i) {
      gpu::GpuDevice d;
      d.index = static_cast<unsigned>(i);
      d.name = "NVIDIA A100-SXM4-80GB";
      in.gpus.devices.push_back(d);
    }
  }
  in.host.cores_online = in.host.cores_allowed = 16;
  return in;
}

FrameworkFacts torch(const std::string& version, const std::string& cuda) {
  FrameworkFacts f;
  f.name = "torch";
  f.installed = true;
  f.version = version;
  f.cuda = cuda;
  if (!cuda.empty()) {
    f.cudnn = "8.9.2";
    f.nccl = "2.18.1";
    f.gpu_usable = true;
    f.gpu_count = 8;
  }
  return f;
}

PythonFacts python_with(std::vector<FrameworkFacts> installed) {
  PythonFacts p;
  p.interpreter = "/opt/venv/bin/python";
  p.origin = "python3 on PATH";
  p.version = "3.11.9";
  p.prefix = "/opt/venv";
  p.environment = "virtualenv";
  for (const std::string& name : kFrameworks) {
    auto it = std::find_if(installed.begin(), installed.end(), [&](const FrameworkFacts& f) { return f.name == name; });
    if (it != installed.end()) {
      p.frameworks.push_back(*it);
    } else {
      FrameworkFacts missing;
      missing.name = name;
      p.frameworks.push_back(missing);
    }
  }
  return p;
}

// The check named `name` the Python rules give.
Check check_named(const DoctorInput& in, const std::string& name) {
  for (const Check& c : check_python_stack(in)) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no check " << name;
  return {};
}

TEST(PythonChecks, CudaVersionsParseAsCudaNumbersThem) {
  EXPECT_EQ(parse_cuda_version("12.1"), 12010);
  EXPECT_EQ(parse_cuda_version("11.8.0"), 11080);
  EXPECT_EQ(parse_cuda_version("12"), 12000);
  EXPECT_EQ(parse_cuda_version(""), 0);
  EXPECT_EQ(parse_cuda_version("none"), 0);
  EXPECT_EQ(cuda_support(12040, 12010), CudaSupport::kFull);
  EXPECT_EQ(cuda_support(12020, 12040), CudaSupport::kMinorVersionCompatibility);
  EXPECT_EQ(cuda_support(11080, 12010), CudaSupport::kNeedsNewerDriver);
}

TEST(PythonChecks, Cu121WheelOnADriverForCuda11FailsAndNamesTheCu118Wheel) {
  DoctorInput in = host(4, 11040, "470.199.02");
  FrameworkFacts f = torch("2.3.1+cu121", "12.1");
  f.gpu_usable = false;
  f.gpu_count = 0;
  f.warnings = {"CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."};
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail) << c.summary;
  EXPECT_NE(c.summary.find("CUDA 12.1"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("525.60.13"), std::string::npos) << c.summary;
  EXPECT_EQ(c.fix,
            "/opt/venv/bin/python -m pip install torch==2.3.1 --index-url https://download.pytorch.org/whl/cu118");
}

TEST(PythonChecks, ANewerMinorThanTheDriverRunsUnderMinorVersionCompatibility) {
  DoctorInput in = host(2, 12020);
  in.pythons = {python_with({torch("2.4.0+cu124", "12.4")})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kWarn) << c.summary;
  EXPECT_NE(c.summary.find("minor-version compatibility"), std::string::npos) << c.summary;
  // The newest build of 2.4 the 12.2 driver fully supports.
  EXPECT_NE(c.fix.find("torch==2.4.0 --index-url https://download.pytorch.org/whl/cu121"), std::string::npos) << c.fix;
}

TEST(PythonChecks, AMatchingBuildPassesAndSaysWhatItSees) {
  DoctorInput in = host(8, 12040, "550.54.15");
  in.pythons = {python_with({torch("2.4.0+cu121", "12.1")})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kPass) << c.summary;
  EXPECT_NE(c.summary.find("sees 8 GPUs"), std::string::npos) << c.summary;
  EXPECT_NE(c.details[0].find("CUDA 12.1, cuDNN 8.9.2, NCCL 2.18.1"), std::string::npos) << c.details[0];
  EXPECT_EQ(check_named(in, "python").status, Status::kPass);
}

TEST(PythonChecks, ACompatibleBuildThatFindsNoGpuFailsWithWhatItSaid) {
  DoctorInput in = host(2, 12040);
  FrameworkFacts f = torch("2.4.0+cu121", "12.1");
  f.gpu_usable = false;
  f.warnings = {"CUDA initialization: CUDA driver initialization failed, you might not have a CUDA gpu."};
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail) << c.summary;
  EXPECT_NE(c.summary.find("CUDA driver initialization failed"), std::string::npos) << c.summary;
  in.env.cuda_visible_devices = "";
  EXPECT_NE(check_named(in, "torch").fix.find("CUDA_VISIBLE_DEVICES is ''"), std::string::npos);
}

TEST(PythonChecks, CpuBuildFailsOnAGpuServerAndIsInfoWithoutGpus) {
  DoctorInput gpu_host = host(8, 12040);
  gpu_host.pythons = {python_with({torch("2.4.0+cpu", "")})};
  const Check on_gpus = check_named(gpu_host, "torch");
  EXPECT_EQ(on_gpus.status, Status::kFail) << on_gpus.summary;
  EXPECT_NE(on_gpus.summary.find("CPU-only build"), std::string::npos);
  EXPECT_NE(on_gpus.summary.find("8 GPUs"), std::string::npos);
  EXPECT_NE(on_gpus.fix.find("torch==2.4.0 --index-url https://download.pytorch.org/whl/cu124"), std::string::npos)
      << on_gpus.fix;

  DoctorInput cpu_host = host(0, 0);
  cpu_host.pythons = gpu_host.pythons;
  const Check on_cpu = check_named(cpu_host, "torch");
  EXPECT_EQ(on_cpu.status, Status::kInfo) << on_cpu.summary;
  EXPECT_TRUE(on_cpu.fix.empty());
  EXPECT_EQ(exit_code(check_python_stack(cpu_host)), 0);
}

TEST(PythonChecks, ACudaBuildOnAHostWithoutGpusIsNotAFailure) {
  DoctorInput in = host(0, 0);
  FrameworkFacts f = torch("2.4.0+cu121", "12.1");
  f.gpu_usable = false;
  in.pythons = {python_with({f})};
  EXPECT_EQ(check_named(in, "torch").status, Status::kInfo);
}

TEST(PythonChecks, AReleaseWithNoBuildForTheDriverPointsAtTheNewestThatHasOne) {
  DoctorInput in = host(2, 11040, "470.199.02");
  in.pythons = {python_with({torch("2.8.0+cu128", "12.8")})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.fix.find("'torch==2.7.*' --index-url https://download.pytorch.org/whl/cu118"), std::string::npos)
      << c.fix;
  EXPECT_NE(c.fix.find("or upgrade the NVIDIA driver to 525.60.13 or newer"), std::string::npos) << c.fix;
}

TEST(PythonChecks, TwoNcclsInOneProcessFailAndNameBoth) {
  DoctorInput in = host(8, 12040);
  FrameworkFacts f = torch("2.1.2+cu121", "12.1");
  f.loaded_nccl = {{"/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", "2.21.5"}};
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail) << c.summary;
  EXPECT_NE(c.summary.find("two NCCLs"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("torch reports NCCL 2.18.1"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("libnccl.so.2.21.5 is 2.21.5"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("LD_PRELOAD"), std::string::npos) << c.fix;

  // The framework's own NCCL, loaded once: nothing to say.
  f.loaded_nccl = {{"/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2", "2.18.1"}};
  in.pythons = {python_with({f})};
  EXPECT_EQ(check_named(in, "torch").status, Status::kPass);
}

TEST(PythonChecks, AFailingImportFailsWithTheErrorAndAReinstall) {
  DoctorInput in = host(8, 12040);
  FrameworkFacts f;
  f.name = "torch";
  f.installed = true;
  f.import_error = "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory";
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("libcudnn.so.9"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("-m pip install --force-reinstall torch"), std::string::npos) << c.fix;
}

TEST(PythonChecks, ACudnnThatRefusesToLoadFails) {
  DoctorInput in = host(8, 12040);
  FrameworkFacts f = torch("2.1.2+cu121", "12.1");
  f.cudnn = "";
  f.cudnn_error =
      "RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (8, 9, 2) but found "
      "runtime version (8, 5, 0).";
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("cuDNN version incompatibility"), std::string::npos) << c.summary;
  EXPECT_NE(c.fix.find("nvidia-cudnn-cu12"), std::string::npos) << c.fix;
}

TEST(PythonChecks, AnInterpreterThatCannotBeAskedFails) {
  DoctorInput in = host(0, 0);
  PythonFacts p;
  p.interpreter = "/opt/broken/bin/python";
  p.origin = "--python";
  p.probe_error = "cannot run '/opt/broken/bin/python': No such file or directory";
  in.pythons = {p};
  const std::vector<Check> checks = check_python_stack(in);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].status, Status::kFail);
  EXPECT_NE(checks[0].summary.find("No such file"), std::string::npos);
}

TEST(PythonChecks, RocmBuildOnNvidiaGpusFails) {
  DoctorInput in = host(2, 12040);
  FrameworkFacts f = torch("2.4.0+rocm6.1", "");
  f.rocm = "6.1.40091";
  in.pythons = {python_with({f})};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.status, Status::kFail);
  EXPECT_NE(c.summary.find("ROCm"), std::string::npos);
  EXPECT_NE(c.fix.find("whl/cu124"), std::string::npos) << c.fix;
}

TEST(PythonChecks, TensorflowAndJaxGetTheirOwnPackages) {
  DoctorInput old_driver = host(2, 11080, "520.61.05");
  FrameworkFacts tf;
  tf.name = "tensorflow";
  tf.installed = true;
  tf.version = "2.17.0";
  tf.cuda = "12.3";
  tf.cudnn = "8";
  tf.gpu_usable = false;
  old_driver.pythons = {python_with({tf})};
  const Check tf_check = check_named(old_driver, "tensorflow");
  EXPECT_EQ(tf_check.status, Status::kFail);
  EXPECT_NE(tf_check.fix.find("'tensorflow==2.13.*'"), std::string::npos) << tf_check.fix;

  DoctorInput new_driver = host(8, 13000, "580.65.06");
  FrameworkFacts jax;
  jax.name = "jax";
  jax.installed = true;
  jax.version = "0.7.1";
  new_driver.pythons = {python_with({jax})};
  const Check jax_check = check_named(new_driver, "jax");
  EXPECT_EQ(jax_check.status, Status::kFail) << jax_check.summary;
  EXPECT_NE(jax_check.fix.find("'jax[cuda13]'"), std::string::npos) << jax_check.fix;
}

TEST(PythonChecks, TheDistributionsOwnPythonGetsAVirtualenvInTheFix) {
  DoctorInput in = host(2, 12040);
  PythonFacts p = python_with({torch("1.13.0a0", "")});
  p.interpreter = "/usr/bin/python3";
  p.environment = "system";
  p.externally_managed = true;
  in.pythons = {p};
  const Check c = check_named(in, "torch");
  EXPECT_EQ(c.fix,
            "/usr/bin/python3 -m venv ~/venv && ~/venv/bin/python -m pip install 'torch==1.13.*' --index-url "
            "https://download.pytorch.org/whl/cu117");
}

TEST(PythonChecks, SeveralInterpretersNameThemselvesInEachFrameworkLine) {
  DoctorInput in = host(0, 0);
  PythonFacts venv = python_with({torch("2.4.0+cpu", "")});
  PythonFacts system = venv;
  system.interpreter = "/usr/bin/python3";
  in.pythons = {venv, system};
  const std::vector<Check> checks = check_python_stack(in);
  ASSERT_EQ(checks.size(), 4u);
  EXPECT_EQ(checks[1].summary.rfind("/opt/venv/bin/python: torch", 0), 0u) << checks[1].summary;
  EXPECT_EQ(checks[3].summary.rfind("/usr/bin/python3: torch", 0), 0u) << checks[3].summary;
}

TEST(PythonChecks, NothingInstalledIsInfo) {
  DoctorInput in = host(8, 12040);
  in.pythons = {python_with({})};
  const std::vector<Check> checks = check_python_stack(in);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].status, Status::kInfo);
  EXPECT_NE(checks[0].summary.find("none of torch, tensorflow, jax is installed"), std::string::npos);
}

// --- the job's environment (lockstep doctor -- CMD) ---

DoctorInput job_with(std::map<std::string, std::string> variables) {
  DoctorInput in = host(8, 12040);
  in.job = JobCommand{{"python3", "train.py"}, "the command runs it", std::move(variables)};
  return in;
}

TEST(JobEnvironment, NothingSetPasses) {
  const Check c = check_job_environment(job_with({{"HOME", "/root"}, {"PATH", "/usr/bin"}}));
  EXPECT_EQ(c.status, Status::kPass);
  EXPECT_NE(c.summary.find("defaults apply"), std::string::npos) << c.summary;
}

TEST(JobEnvironment, EachVariableSaysWhatItDoesAndSlowSettingsWarn) {
  const Check c = check_job_environment(
      job_with({{"NCCL_DEBUG", "INFO"}, {"CUDA_VISIBLE_DEVICES", "0,1"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}}));
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.summary.find("3 variables"), std::string::npos) << c.summary;
  EXPECT_NE(c.summary.find("TORCH_NCCL_ASYNC_ERROR_HANDLING is set to slow"), std::string::npos) << c.summary;
  EXPECT_EQ(c.fix, "unset TORCH_NCCL_ASYNC_ERROR_HANDLING unless you are debugging");
  bool described = false;
  for (const std::string& line : c.details) described |= line.rfind("NCCL_DEBUG=INFO: NCCL's log", 0) == 0;
  EXPECT_TRUE(described);
  // The same variables without the harmful value only inform.
  EXPECT_EQ(check_job_environment(job_with({{"NCCL_DEBUG", "INFO"}})).status, Status::kPass);
}

TEST(JobEnvironment, AMisspelledNcclNameIsCaught) {
  const Check c = check_job_environment(job_with({{"NCCL_SOCKET_IFNAM", "eth0"}, {"NCCL_FUTURE_KNOB", "1"}}));
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_EQ(c.fix, "rename NCCL_SOCKET_IFNAM to NCCL_SOCKET_IFNAME");
  // A name far from every known one is listed, not blamed.
  const Check unknown = check_job_environment(job_with({{"NCCL_FUTURE_KNOB", "1"}}));
  EXPECT_EQ(unknown.status, Status::kPass);
  EXPECT_NE(unknown.details[0].find("not a variable this doctor knows"), std::string::npos);
}

TEST(JobEnvironment, MoreOpenmpThreadsThanCoresWarns) {
  EXPECT_EQ(check_job_environment(job_with({{"OMP_NUM_THREADS", "16"}})).status, Status::kPass);
  const Check c = check_job_environment(job_with({{"OMP_NUM_THREADS", "64"}}));
  EXPECT_EQ(c.status, Status::kWarn);
  EXPECT_NE(c.fix.find("OMP_NUM_THREADS"), std::string::npos);
}

TEST(JobEnvironment, InfinibandOffWarnsOnlyWhereThereIsInfiniband) {
  DoctorInput in = job_with({{"NCCL_IB_DISABLE", "1"}});
  EXPECT_EQ(check_job_environment(in).status, Status::kPass);
  in.host.infiniband_devices = {"mlx5_0"};
  EXPECT_EQ(check_job_environment(in).status, Status::kWarn);
}

}  // namespace
}  // namespace lockstep::tools

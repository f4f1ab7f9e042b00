// `lockstep doctor` on the user's Python stack, as a user runs it: this machine's real
// python3-torch (a CPU build), framework modules that report what a CUDA build would (on a
// PYTHONPATH, read by the real interpreter through the real probe), and fake interpreters
// that hang, crash while importing, answer nonsense or report two NCCLs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/common/command_testing.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using namespace command_testing;

const std::string kDoctor = "env -u CUDA_VISIBLE_DEVICES " + kNoNvml + " " + kBinary + " doctor ";

// The report line of check `name`: "STATUS  name  summary".
std::string line_of(const std::string& output, const std::string& name) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > 6 && line.compare(6, name.size() + 1, name + " ") == 0) return line;
  }
  return "";
}

// Whether `pid` still runs (a zombie nobody has reaped yet does not).
bool alive(pid_t pid) {
  for (int tries = 0; tries < 40; ++tries) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos || close + 2 >= text.size() || text[close + 2] == 'Z') return false;
    usleep(50'000);
  }
  return true;
}

class DoctorPython : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lockstep-doctor-python-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file under the test's folder; executable when `mode` says so.
  std::string write(const std::string& name, const std::string& text, mode_t mode = 0644) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path.string();
  }

  // A fake interpreter: a shell script that answers the probe for `torch` with `torch_answer`
  // (shell code) and says "not installed" for the other frameworks. The probe passes the
  // framework as its third argument (python -c SCRIPT NAME).
  std::string fake_python(const std::string& torch_answer) {
    const std::string not_installed =
        R"(echo 'lockstep-doctor-probe: {"python": "3.12.1", "prefix": "/opt/fake", "done": true, )"
        R"("framework": {"name": "'"$3"'", "installed": false}}')";
    return write("fake/bin/python3",
                 "#!/bin/sh\nif [ \"$3\" = torch ]; then\n" + torch_answer + "\nelse\n" + not_installed + "\nfi\n",
                 0755);
  }

  fs::path dir_;
};

TEST_F(DoctorPython, ThisMachinesPyTorchIsReadAsItReportsItself) {
  // The reference: what torch itself says, asked directly.
  const Result direct =
      run_shell("/usr/bin/python3 -c 'import torch; print(torch.__version__); print(torch.version.cuda)'");
  if (direct.exit_code != 0) GTEST_SKIP() << "/usr/bin/python3 cannot import torch (python3-torch): " << direct.output;
  std::istringstream said(direct.output);
  std::string version, cuda;
  std::getline(said, version);
  std::getline(said, cuda);

  const Result r = run_shell(kDoctor + "--python /usr/bin/python3 --json 2>/dev/null");
  const nlohmann::json out = nlohmann::json::parse(r.output);
  const nlohmann::json& python = out["facts"]["python"][0];
  EXPECT_EQ(python["interpreter"], "/usr/bin/python3");
  EXPECT_EQ(python["probe_error"], "");
  const nlohmann::json& torch = python["frameworks"][0];
  EXPECT_EQ(torch["name"], "torch");
  EXPECT_TRUE(torch["installed"].get<bool>());
  EXPECT_EQ(torch["version"], version);
  EXPECT_EQ(torch["cuda"], cuda == "None" ? "" : cuda);
  EXPECT_EQ(torch["import_error"], "");
  for (const auto& check : out["checks"]) {
    if (check["name"] != "torch") continue;
    // No GPU here (NVML cannot load): a CPU build is what this host can use, not a failure.
    EXPECT_EQ(check["status"], "info") << check.dump();
    EXPECT_NE(check["summary"].get<std::string>().find(version), std::string::npos);
  }
  EXPECT_NE(r.exit_code, 2) << r.output;
}

TEST_F(DoctorPython, AHangingImportIsKilledWithItsChildrenAndReported) {
  const std::string pid_file = (dir_ / "child.pid").string();
  const std::string python =
      fake_python(R"(echo 'lockstep-doctor-probe: {"python": "3.12.1", "prefix": "/opt/fake", "done": false, )"
                  R"("framework": {"name": "torch", "installed": true}}'
sleep 300 & echo $! > )" +
                  pid_file + "\nwait");
  const Result r = run_shell(kDoctor + "--python " + python + " --python-timeout 1s");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string torch = line_of(r.output, "torch");
  EXPECT_EQ(torch.rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(torch.find("importing torch did not finish within 1 s"), std::string::npos) << torch;
  std::ifstream pid_in(pid_file);
  pid_t child = 0;
  ASSERT_TRUE(pid_in >> child) << "the fake interpreter did not start its child";
  EXPECT_FALSE(alive(child)) << "the hung import's child " << child << " outlived the probe";
}

TEST_F(DoctorPython, AnImportThatCrashesPythonIsTheFrameworksFailure) {
  const std::string python =
      fake_python(R"(echo 'lockstep-doctor-probe: {"python": "3.12.1", "prefix": "/opt/fake", "done": false, )"
                  R"("framework": {"name": "torch", "installed": true, "version": "2.2.0"}}'
echo 'Fatal Python error: Segmentation fault' >&2
kill -SEGV $$)");
  const Result r = run_shell(kDoctor + "--python " + python);
  const std::string torch = line_of(r.output, "torch");
  EXPECT_EQ(torch.rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(torch.find("killed by signal 11"), std::string::npos) << torch;
  EXPECT_NE(torch.find("Segmentation fault"), std::string::npos) << torch;
  // The interpreter itself answered: its line passes.
  EXPECT_EQ(line_of(r.output, "python").rfind("PASS", 0), 0u) << r.output;
}

TEST_F(DoctorPython, TwoNcclsReportedByTheProbeFail) {
  const std::string python =
      fake_python(R"(echo 'lockstep-doctor-probe: {"python": "3.12.1", "prefix": "/opt/fake", "done": true, )"
                  R"("framework": {"name": "torch", "installed": true, "version": "2.1.2+cu121", "cuda": "12.1", )"
                  R"("nccl": "2.18.1", "loaded_nccl": [{"path": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", )"
                  R"("version": "2.21.5"}]}}')");
  const Result r = run_shell(kDoctor + "--python " + python);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string torch = line_of(r.output, "torch");
  EXPECT_NE(torch.find("two NCCLs in one process"), std::string::npos) << r.output;
}

TEST_F(DoctorPython, WhatIsNotAPythonInterpreterFails) {
  Result r = run_shell(kDoctor + "--python /bin/echo");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(line_of(r.output, "python").find("printed no answer to the probe"), std::string::npos) << r.output;
  r = run_shell(kDoctor + "--python /nonexistent/bin/python3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(line_of(r.output, "python").find("No such file or directory"), std::string::npos) << r.output;
}

TEST_F(DoctorPython, TheCommandsInterpreterRunsTheProbeWithTheCommandsEnvironment) {
  // The fake answers with the CUDA_VISIBLE_DEVICES it was given, as a warning line.
  const std::string python =
      fake_python(R"(echo 'lockstep-doctor-probe: {"python": "3.12.1", "prefix": "/opt/fake", "done": true, )"
                  R"("framework": {"name": "torch", "installed": true, "version": "2.4.0+cpu", )"
                  R"("warnings": ["visible='"$CUDA_VISIBLE_DEVICES"'"]}}')");
  const Result r = run_shell(kDoctor + "-- env CUDA_VISIBLE_DEVICES=3 NCCL_P2P_DISABLE=1 " + python + " train.py");
  EXPECT_NE(line_of(r.output, "python").find(python + " (the command runs it)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("said: visible=3"), std::string::npos) << r.output;
  const std::string environment = line_of(r.output, "environment");
  EXPECT_EQ(environment.rfind("WARN", 0), 0u) << r.output;
  EXPECT_NE(environment.find("NCCL_P2P_DISABLE is set to slow"), std::string::npos) << environment;
  EXPECT_NE(r.output.find("CUDA_VISIBLE_DEVICES=3: the GPUs the program sees"), std::string::npos) << r.output;
}

TEST_F(DoctorPython, ACommandThatRunsNoPythonChecksOnlyItsEnvironment) {
  const std::string script = write("job.sh", "#!/bin/sh\nexit 0\n", 0755);
  const Result r = run_shell(kDoctor + "-- " + script);
  EXPECT_NE(line_of(r.output, "python").find("not a Python script"), std::string::npos) << r.output;
  EXPECT_EQ(line_of(r.output, "environment").rfind("PASS", 0), 0u) << r.output;
  EXPECT_EQ(run_shell(kDoctor + "--no-python -- " + script).exit_code, 0);
}

TEST_F(DoctorPython, UsageErrors) {
  EXPECT_EQ(run_shell(kDoctor + "--").exit_code, 2);
  EXPECT_EQ(run_shell(kDoctor + "--no-python --python /usr/bin/python3").exit_code, 2);
  const Result r = run_shell(kDoctor + "--python-timeout soon");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--python-timeout"), std::string::npos) << r.output;
}

#ifdef LOCKSTEP_NVML_STANDIN
// Framework modules that report what CUDA builds would, read by the real interpreter through
// the real probe, on the stand-in driver 470 (CUDA 11.4 at most) with two V100s.
TEST_F(DoctorPython, CudaBuildsNewerThanTheDriverFailWithThePackageToInstall) {
  if (run_shell("/usr/bin/python3 -c 'print(1)'").exit_code != 0) GTEST_SKIP() << "no /usr/bin/python3";
  write("site/torch/__init__.py", R"(import warnings
__version__ = "2.3.1+cu121"
class version:
    cuda = "12.1"
    hip = None
class backends:
    class cudnn:
        @staticmethod
        def version():
            return 8902
class cuda:
    @staticmethod
    def is_available():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).")
        return False
    @staticmethod
    def device_count():
        return 0
    class nccl:
        @staticmethod
        def version():
            return (2, 20, 5)
)");
  write("site/tensorflow/__init__.py", R"(__version__ = "2.17.0"
class sysconfig:
    @staticmethod
    def get_build_info():
        return {"is_cuda_build": True, "cuda_version": "12.3", "cudnn_version": "8"}
class config:
    @staticmethod
    def list_physical_devices(kind):
        return []
)");
  write("site/jax/__init__.py", "__version__ = \"0.4.30\"\n");
  const Result r =
      run_shell("env -u CUDA_VISIBLE_DEVICES PYTHONPATH=" + (dir_ / "site").string() +
                " LOCKSTEP_NVML_LIBRARY=" + LOCKSTEP_NVML_STANDIN + " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES +
                "/old-driver.json " + kBinary + " doctor --python /usr/bin/python3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string torch = line_of(r.output, "torch");
  EXPECT_EQ(torch.rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(torch.find("built with CUDA 12.1"), std::string::npos) << torch;
  EXPECT_NE(r.output.find("torch==2.3.1 --index-url https://download.pytorch.org/whl/cu118"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("said: CUDA initialization: The NVIDIA driver on your system is too old"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("cuDNN 8.9.2, NCCL 2.20.5"), std::string::npos) << r.output;
  EXPECT_EQ(line_of(r.output, "tensorflow").rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("'tensorflow==2.13.*'"), std::string::npos) << r.output;
  const std::string jax = line_of(r.output, "jax");
  EXPECT_EQ(jax.rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(jax.find("CPU-only build"), std::string::npos) << jax;
}

// This machine's real torch, a CPU build, on a stand-in server of eight A100s: a CPU-only
// build installed by accident is a failure there, with the CUDA wheel to install.
TEST_F(DoctorPython, ThisMachinesCpuTorchFailsOnAGpuServer) {
  const Result direct = run_shell("/usr/bin/python3 -c 'import torch; assert torch.version.cuda is None'");
  if (direct.exit_code != 0) GTEST_SKIP() << "/usr/bin/python3 has no CPU-only torch: " << direct.output;
  const Result r = run_shell("env -u CUDA_VISIBLE_DEVICES LOCKSTEP_NVML_LIBRARY=" + std::string(LOCKSTEP_NVML_STANDIN) +
                             " LOCKSTEP_NVML_PROFILE=" + LOCKSTEP_NVML_PROFILES + "/a100-8x-nvlink.json " + kBinary +
                             " doctor --python /usr/bin/python3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::string torch = line_of(r.output, "torch");
  EXPECT_EQ(torch.rfind("FAIL", 0), 0u) << r.output;
  EXPECT_NE(torch.find("CPU-only build: it cannot use the 8 GPUs"), std::string::npos) << torch;
  EXPECT_NE(r.output.find("--index-url https://download.pytorch.org/whl/cu"), std::string::npos) << r.output;
}
#endif

}  // namespace
}  // namespace lockstep

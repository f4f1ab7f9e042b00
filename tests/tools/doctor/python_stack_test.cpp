// Finding the interpreters a job will use and reading the probe's answer: PATH, virtualenvs,
// a command's own interpreter (directly, after `env`, or from a script's #! line), and the
// probe output an interpreter or a crashing import leaves.
#include "tools/doctor/python_stack.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

class PythonStack : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-python-stack-" + std::to_string(getpid()));
    fs::create_directories(root_ / "usr/bin");
    fs::create_directories(root_ / "venv/bin");
    executable(root_ / "usr/bin/python3", "#!/bin/sh\n");
    executable(root_ / "venv/bin/python3", "#!/bin/sh\n");
    executable(root_ / "venv/bin/python", "#!/bin/sh\n");
    executable(root_ / "usr/bin/torchrun", "#!" + (root_ / "venv/bin/python3").string() + "\nimport sys\n");
    executable(root_ / "usr/bin/trainer", "#!/usr/bin/env -S python3 -u\n");
    executable(root_ / "usr/bin/job.sh", "#!/bin/bash\n");
    path_ = (root_ / "usr/bin").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  static void executable(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
  }

  fs::path root_;
  std::string path_;
};

TEST_F(PythonStack, TheCommandsInterpreterIsFoundAsTheShellWouldRunIt) {
  std::string why;
  EXPECT_EQ(command_interpreter({"python3", "train.py"}, path_, &why), path_ + "/python3");
  EXPECT_EQ(command_interpreter({"env", "NCCL_DEBUG=INFO", "-u", "X", "python3", "train.py"}, path_, &why),
            path_ + "/python3");
  EXPECT_EQ(command_interpreter({"torchrun", "--nproc-per-node", "8", "train.py"}, path_, &why),
            (root_ / "venv/bin/python3").string());
  EXPECT_NE(why.find("torchrun"), std::string::npos) << why;
  EXPECT_EQ(command_interpreter({"trainer"}, path_, &why), path_ + "/python3");
  EXPECT_EQ(command_interpreter({"job.sh"}, path_, &why), "");
  EXPECT_NE(why.find("not a Python script"), std::string::npos) << why;
  EXPECT_EQ(command_interpreter({"python3.99", "x.py"}, path_, &why), "");
  EXPECT_NE(why.find("not on PATH"), std::string::npos) << why;
}

TEST(EnvPrefix, EnvsWordsAreReadAsEnvReadsThem) {
  const EnvPrefix prefix = env_prefix(
      {"/usr/bin/env", "-u", "OMP_NUM_THREADS", "-i", "NCCL_DEBUG=INFO", "-C", "/tmp", "A=b=c", "python3", "X=1"});
  EXPECT_EQ(prefix.unset, std::vector<std::string>{"OMP_NUM_THREADS"});
  EXPECT_EQ(prefix.assigned, (std::map<std::string, std::string>{{"NCCL_DEBUG", "INFO"}, {"A", "b=c"}}));
  EXPECT_EQ(prefix.program, 8u);  // python3; its own X=1 is an argument
  EXPECT_EQ(env_prefix({"python3", "A=1"}).program, 0u);
  EXPECT_TRUE(env_prefix({"python3", "A=1"}).assigned.empty());
}

TEST_F(PythonStack, EachEnvironmentIsCheckedOnce) {
  PythonSources sources;
  sources.path_env = (root_ / "venv/bin").string() + ":" + path_;
  sources.virtual_env = (root_ / "venv").string();  // the same environment as python3 on PATH
  std::vector<PythonCandidate> found = python_candidates(sources);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].interpreter, (root_ / "venv/bin/python3").string());

  sources.path_env = path_;  // the virtualenv is active but not first on PATH
  found = python_candidates(sources);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[1].interpreter, (root_ / "venv/bin/python").string());
  EXPECT_NE(found[1].origin.find("virtualenv"), std::string::npos);

  // --python and a command replace the interpreters found around.
  sources.explicit_pythons = {"/nonexistent/python"};
  found = python_candidates(sources);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].interpreter, "/nonexistent/python");
  sources.explicit_pythons.clear();
  sources.command = {"torchrun", "train.py"};
  found = python_candidates(sources);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].interpreter, (root_ / "venv/bin/python3").string());
}

TEST(PythonProbeOutput, TheLastAnswerCountsAndAnUnfinishedImportIsTold) {
  PythonFacts facts;
  bool done = true;
  const std::string first = std::string(kProbeMarker) +
                            R"({"python": "3.11.2", "prefix": "/usr", "externally_managed": true, "done": false, )"
                            R"("framework": {"name": "torch", "installed": true}})";
  FrameworkFacts f = parse_probe_output("noise\n" + first + "\n", facts, &done);
  EXPECT_TRUE(facts.probe_error.empty()) << facts.probe_error;
  EXPECT_FALSE(done);
  EXPECT_TRUE(f.installed);
  EXPECT_TRUE(facts.externally_managed);
  EXPECT_EQ(facts.environment, "system");

  const std::string last = std::string(kProbeMarker) +
                           R"({"python": "3.11.2", "prefix": "/usr", "done": true, "framework": {"name": "torch", )"
                           R"("installed": true, "version": "2.1.2", "cuda": "12.1", "nccl": "2.18.1", )"
                           R"("gpu_usable": false, "gpu_count": 0, "warnings": ["too old"], )"
                           R"("loaded_nccl": [{"path": "/x/libnccl.so.2", "version": "2.18.1"}], )"
                           R"("wheels": {"nvidia-nccl-cu12": "2.18.1"}}})";
  f = parse_probe_output(first + "\n" + last + "\n", facts, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(f.cuda, "12.1");
  ASSERT_TRUE(f.gpu_usable.has_value());
  EXPECT_FALSE(*f.gpu_usable);
  ASSERT_EQ(f.loaded_nccl.size(), 1u);
  EXPECT_EQ(f.loaded_nccl[0].version, "2.18.1");
  EXPECT_EQ(f.wheels.at("nvidia-nccl-cu12"), "2.18.1");
}

TEST(PythonProbeOutput, NoAnswerOrGarbageIsAProbeError) {
  PythonFacts facts;
  bool done = false;
  parse_probe_output("Python 2.7.18\n", facts, &done);
  EXPECT_NE(facts.probe_error.find("no answer"), std::string::npos);
  facts = {};
  parse_probe_output(std::string(kProbeMarker) + "{not json\n", facts, &done);
  EXPECT_NE(facts.probe_error.find("not the JSON object"), std::string::npos);
}

TEST(PythonProbeOutput, OnlyALineThatStartsWithTheMarkerIsAnAnswer) {
  // What /bin/echo prints when run as the interpreter: the script, with the marker indented.
  PythonFacts facts;
  bool done = false;
  parse_probe_output(std::string("-c ") + kPythonProbeScript + " torch\n", facts, &done);
  EXPECT_NE(facts.probe_error.find("no answer"), std::string::npos) << facts.probe_error;
  EXPECT_NE(std::string(kPythonProbeScript).find(kProbeMarker), std::string::npos)
      << "the script prints another marker than the parser reads";
}

}  // namespace
}  // namespace lockstep::tools

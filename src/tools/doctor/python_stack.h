// What a Python interpreter that will run the user's job has inside: which of torch,
// tensorflow and jax are installed, and each one's CUDA, cuDNN and NCCL as the framework
// itself reports them. Read by running the interpreter on a small probe script with a
// short timeout, one framework per process (an import that crashes or hangs costs only
// its own answer); the rules of doctor_python_checks.cpp judge the facts.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::tools {

// A libnccl the process had mapped after importing the framework, with the version its
// ncclGetVersion answered ("" when it could not be asked).
struct LoadedNccl {
  std::string path;
  std::string version;
};

struct FrameworkFacts {
  std::string name;  // "torch", "tensorflow", "jax"
  bool installed = false;
  std::string version;       // "2.3.1+cu121"
  std::string location;      // the package's folder: "/usr/lib/python3/dist-packages/torch"
  std::string import_error;  // importing it raised: "ImportError: libcudnn.so.8: cannot open …"
  std::string cuda;          // the CUDA it was built with ("12.1"; "12" when only the major is known); "" = none
  std::string rocm;          // a ROCm (HIP) build of torch: its HIP version
  std::string cudnn, cudnn_error;
  std::string nccl, nccl_error;
  std::optional<bool> gpu_usable;  // whether it found a GPU it can use (asked only of CUDA builds)
  int gpu_count = 0;
  std::vector<std::string> warnings;          // what it warned or logged while looking for GPUs
  std::vector<LoadedNccl> loaded_nccl;        // after its import
  std::map<std::string, std::string> wheels;  // the nvidia-* and plugin wheels installed: name -> version
};

struct PythonFacts {
  std::string interpreter;                 // the program run: "/usr/bin/python3"
  std::string origin;                      // why it is checked: "python3 on PATH", "the active virtualenv", …
  std::string probe_error;                 // it could not be run or did not answer: why; nothing else is known then
  std::string version;                     // "3.11.2"
  std::string prefix;                      // sys.prefix
  std::string environment;                 // "system", "virtualenv", "conda"
  bool externally_managed = false;         // PEP 668: the distribution's Python, where pip refuses to install
  std::vector<FrameworkFacts> frameworks;  // torch, tensorflow, jax, in that order
};

// An interpreter to check and why.
struct PythonCandidate {
  std::string interpreter;
  std::string origin;
};

// Where interpreters come from: the environment of `lockstep doctor` and its arguments.
struct PythonSources {
  std::string path_env;                       // PATH
  std::string virtual_env, conda_prefix;      // VIRTUAL_ENV, CONDA_PREFIX ("" when unset)
  std::vector<std::string> explicit_pythons;  // --python PATH, in order
  std::vector<std::string> command;           // the job after `--`, when given
};

// The frameworks the probe asks about, in report order.
inline const std::vector<std::string> kFrameworks = {"torch", "tensorflow", "jax"};

// A command's leading `env [-u NAME] [-C DIR] [NAME=VALUE …]`: what it sets and unsets, and
// where the program it runs starts (0 for a command without `env`).
struct EnvPrefix {
  std::map<std::string, std::string> assigned;
  std::vector<std::string> unset;
  size_t program = 0;
};
EnvPrefix env_prefix(const std::vector<std::string>& command);

// The interpreter that runs `command` ("python3 train.py", "env X=1 python3 …", "torchrun …"
// or any script whose #! line names Python); empty when the command runs no Python that
// can be seen. `why` says how it was found or why none was.
std::string command_interpreter(const std::vector<std::string>& command, const std::string& path_env, std::string* why);
// The interpreters to check: the command's and --python's when given, otherwise python3 on
// PATH and the active virtualenv's and conda environment's (each environment once).
std::vector<PythonCandidate> python_candidates(const PythonSources& sources);

// Runs the probe for every framework (each in its own process, `timeout` each), with
// `extra_env` on top of this process's environment (a command's `env NAME=VALUE` words).
PythonFacts probe_python(const PythonCandidate& candidate, std::chrono::milliseconds timeout,
                         const std::map<std::string, std::string>& extra_env = {});

// One probe's output, understood: fills `facts` (the interpreter's lines) and returns the
// framework's; the probe's line missing or unreadable sets `facts.probe_error`. `done` is
// false when only the answer printed before the import came (the import crashed or hung).
FrameworkFacts parse_probe_output(const std::string& output, PythonFacts& facts, bool* done);
inline constexpr const char* kProbeMarker = "lockstep-doctor-probe: ";

// The probe script: `python -c kPythonProbeScript <framework>` prints one line, kProbeMarker
// followed by a JSON object (python_probe_script.cpp).
extern const char* const kPythonProbeScript;

}  // namespace lockstep::tools

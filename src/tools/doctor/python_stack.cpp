#include "tools/doctor/python_stack.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tools/common/captured_run.h"
#include "tools/common/path_lookup.h"

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

bool is_python_name(const std::string& program) { return base_name(program).rfind("python", 0) == 0; }

bool is_assignment(const std::string& word) {
  const size_t equals = word.find('=');
  return equals != std::string::npos && equals > 0 && word[0] != '-';
}

// The interpreter a `#!` line names: "#!/usr/bin/env python3" is python3 on PATH.
std::string shebang_python(const std::string& script, const std::string& path_env) {
  std::ifstream in(script);
  std::string line;
  if (!std::getline(in, line) || line.rfind("#!", 0) != 0) return "";
  std::istringstream words(line.substr(2));
  std::string program;
  words >> program;
  if (base_name(program) == "env") {
    while (words >> program && (program.rfind("-", 0) == 0 || is_assignment(program))) {
    }
  }
  if (!is_python_name(program)) return "";
  return find_on_path(path_env, program);
}

// The environment an interpreter belongs to, so python3 on PATH and $VIRTUAL_ENV/bin/python
// count once: the folder above its bin/.
std::string environment_key(const std::string& interpreter) {
  std::error_code error;
  const fs::path folder = fs::weakly_canonical(fs::absolute(interpreter).parent_path().parent_path(), error);
  return error ? interpreter : folder.string();
}

std::string text(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string last_lines(const std::string& output, size_t count) {
  size_t start = output.size();
  while (start > 0 && output[start - 1] == '\n') --start;
  const size_t end = start;
  for (size_t lines = 0; start > 0 && lines < count; --start) {
    if (output[start - 1] == '\n' && ++lines == count) break;
  }
  return output.substr(start, end - start);
}

std::string duration_text(std::chrono::milliseconds timeout) {
  const long long ms = timeout.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

EnvPrefix env_prefix(const std::vector<std::string>& command) {
  EnvPrefix prefix;
  if (command.empty() || base_name(command[0]) != "env") return prefix;
  size_t i = 1;
  for (; i < command.size(); ++i) {
    const std::string& word = command[i];
    if (word == "-u" || word == "--unset") {
      if (i + 1 < command.size()) prefix.unset.push_back(command[++i]);
    } else if (word == "-C" || word == "--chdir") {
      ++i;
    } else if (is_assignment(word)) {
      const size_t equals = word.find('=');
      prefix.assigned[word.substr(0, equals)] = word.substr(equals + 1);
    } else if (word.rfind("-", 0) != 0) {
      break;  // the program
    }
  }
  prefix.program = i;
  return prefix;
}

std::string command_interpreter(const std::vector<std::string>& command, const std::string& path_env,
                                std::string* why) {
  const size_t first = env_prefix(command).program;
  if (first >= command.size()) {
    *why = "the command names no program";
    return "";
  }
  const std::string& program = command[first];
  const std::string found = find_on_path(path_env, program);
  if (found.empty()) {
    *why = "the command's program '" + program + "' is not " +
           (program.find('/') != std::string::npos ? "an executable file" : "on PATH");
    return "";
  }
  if (is_python_name(program)) {
    *why = "the command runs it";
    return found;
  }
  const std::string interpreter = shebang_python(found, path_env);
  if (interpreter.empty()) {
    *why = "the command's program " + found + " is not a Python script (no #! line naming Python)";
    return "";
  }
  *why = "the interpreter of " + found;
  return interpreter;
}

std::vector<PythonCandidate> python_candidates(const PythonSources& sources) {
  std::vector<PythonCandidate> found;
  std::set<std::string> environments;
  auto add = [&](const std::string& interpreter, const std::string& origin) {
    if (interpreter.empty() || !environments.insert(environment_key(interpreter)).second) return;
    found.push_back({interpreter, origin});
  };
  for (const std::string& python : sources.explicit_pythons) {
    // A path that is not there is still checked, so the report says so.
    const std::string resolved = find_on_path(sources.path_env, python);
    found.push_back({resolved.empty() ? python : resolved, "--python"});
    environments.insert(environment_key(found.back().interpreter));
  }
  if (!sources.command.empty()) {
    std::string why;
    add(command_interpreter(sources.command, sources.path_env, &why), why);
  }
  if (!sources.explicit_pythons.empty() || !sources.command.empty()) return found;
  add(find_on_path(sources.path_env, "python3"), "python3 on PATH");
  if (!sources.virtual_env.empty()) add(sources.virtual_env + "/bin/python", "the active virtualenv (VIRTUAL_ENV)");
  if (!sources.conda_prefix.empty()) add(sources.conda_prefix + "/bin/python", "the active conda environment");
  return found;
}

FrameworkFacts parse_probe_output(const std::string& output, PythonFacts& facts, bool* done) {
  FrameworkFacts framework;
  // The last line that starts with the marker (a program that echoes its arguments prints
  // the script, where the marker is indented).
  size_t at = output.rfind(kProbeMarker);
  while (at != std::string::npos && at > 0 && output[at - 1] != '\n') {
    at = at == 0 ? std::string::npos : output.rfind(kProbeMarker, at - 1);
  }
  if (at == std::string::npos) {
    facts.probe_error = "it printed no answer to the probe";
    return framework;
  }
  const size_t start = at + std::string(kProbeMarker).size();
  const std::string line = output.substr(start, output.find('\n', start) - start);
  const nlohmann::json report = nlohmann::json::parse(line, nullptr, false);
  if (report.is_discarded() || !report.is_object() || !report.contains("framework") ||
      !report["framework"].is_object()) {
    facts.probe_error = "its answer to the probe is not the JSON object expected: " + line.substr(0, 200);
    return framework;
  }
  *done = report.value("done", false);
  facts.version = text(report, "python");
  facts.prefix = text(report, "prefix");
  facts.environment = report.value("conda", false)        ? "conda"
                      : report.value("virtualenv", false) ? "virtualenv"
                                                          : "system";
  facts.externally_managed = report.value("externally_managed", false);
  const nlohmann::json& f = report["framework"];
  framework.name = text(f, "name");
  framework.installed = f.value("installed", false);
  framework.version = text(f, "version");
  framework.location = text(f, "location");
  framework.import_error = text(f, "import_error");
  framework.cuda = text(f, "cuda");
  framework.rocm = text(f, "rocm");
  framework.cudnn = text(f, "cudnn");
  framework.cudnn_error = text(f, "cudnn_error");
  framework.nccl = text(f, "nccl");
  framework.nccl_error = text(f, "nccl_error");
  if (f.contains("gpu_usable") && f["gpu_usable"].is_boolean()) framework.gpu_usable = f["gpu_usable"].get<bool>();
  if (f.contains("gpu_count") && f["gpu_count"].is_number_integer()) framework.gpu_count = f["gpu_count"].get<int>();
  if (f.contains("warnings") && f["warnings"].is_array()) {
    for (const auto& w : f["warnings"]) {
      if (w.is_string()) framework.warnings.push_back(w.get<std::string>());
    }
  }
  if (f.contains("loaded_nccl") && f["loaded_nccl"].is_array()) {
    for (const auto& library : f["loaded_nccl"]) {
      if (library.is_object()) framework.loaded_nccl.push_back({text(library, "path"), text(library, "version")});
    }
  }
  if (f.contains("wheels") && f["wheels"].is_object()) {
    for (const auto& [name, version] : f["wheels"].items()) {
      if (version.is_string()) framework.wheels[name] = version.get<std::string>();
    }
  }
  return framework;
}

PythonFacts probe_python(const PythonCandidate& candidate, std::chrono::milliseconds timeout,
                         const std::map<std::string, std::string>& extra_env) {
  PythonFacts facts;
  facts.interpreter = candidate.interpreter;
  facts.origin = candidate.origin;
  for (const std::string& name : kFrameworks) {
    const CapturedRun run = run_captured({candidate.interpreter, "-c", kPythonProbeScript, name}, timeout, extra_env);
    if (!run.started) {
      facts.probe_error = run.error;
      facts.frameworks.clear();
      return facts;
    }
    bool done = false;
    FrameworkFacts framework = parse_probe_output(run.out, facts, &done);
    const std::string ended = run.timed_out     ? "did not finish within " + duration_text(timeout)
                              : run.signal != 0 ? "was killed by signal " + std::to_string(run.signal)
                                                : "exited with status " + std::to_string(run.exit_code);
    const std::string said = last_lines(run.err.empty() ? run.out : run.err, 3);
    if (!facts.probe_error.empty()) {
      // Not even the first answer: the interpreter itself does not run Python.
      facts.probe_error += "; it " + ended + (said.empty() ? "" : ": " + said);
      facts.frameworks.clear();
      return facts;
    }
    if (!done) framework.import_error = "importing " + name + " " + ended + (said.empty() ? "" : ": " + said);
    facts.frameworks.push_back(std::move(framework));
  }
  return facts;
}

}  // namespace lockstep::tools

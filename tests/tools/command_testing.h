// Running the lockstep binary as a user does, for the command tests: through a shell, with
// stdout and stderr together, plain or under mpirun.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::command_testing {

inline const std::string kBinary = std::string(LOCKSTEP_BINARY_DIR) + "/bin/lockstep";

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline Result run_shell(const std::string& command_line) {
  const std::string command = command_line + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Result result;
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// `lockstep <arguments>`.
inline Result run(const std::string& arguments) { return run_shell(kBinary + " " + arguments); }

inline bool on_path(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null").c_str()) == 0;
}

// `lockstep <arguments>` as `ranks` processes under mpirun on this host.
inline Result run_mpi(int ranks, const std::string& arguments) {
  return run_shell(
      "env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" OMPI_ALLOW_RUN_AS_ROOT=1 "
      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 300 mpirun "
      "--oversubscribe --allow-run-as-root --bind-to none -x ASAN_OPTIONS -np " +
      std::to_string(ranks) + " " + kBinary + " " + arguments);
}

inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace lockstep::command_testing

// Running the lockstep binary as a user does, for the command tests: through a shell, with
// stdout and stderr together, plain or under mpirun.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

// The command tests compare training runs on CPU devices, bit for bit: with a GPU visible,
// `lockstep train` would pick it by default. Training commands therefore run with no GPU
// visible (CUDA_VISIBLE_DEVICES empty); GPU training has its own tests.
inline std::string cpu_training(const std::string& arguments) {
  const bool trains = (" " + arguments + " ").find(" train ") != std::string::npos;
  return trains ? "CUDA_VISIBLE_DEVICES= " : "";
}

// `lockstep <arguments>`.
inline Result run(const std::string& arguments) {
  return run_shell(cpu_training(arguments) + kBinary + " " + arguments);
}

// An environment assignment under which NVML cannot load: the host looks GPU-less
// whatever it has.
inline const std::string kNoNvml = "LOCKSTEP_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1";

// A TCP port someone listens on (all addresses), for as long as this object lives.
class BusyPort {
 public:
  BusyPort() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof(address);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd_, 1) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port_ = ntohs(address.sin_port);
    }
  }
  ~BusyPort() { close(); }
  BusyPort(const BusyPort&) = delete;
  BusyPort& operator=(const BusyPort&) = delete;
  int port() const { return port_; }  // 0 when the socket could not be set up
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  int port_ = 0;
};

inline bool on_path(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null").c_str()) == 0;
}

// `lockstep <arguments>` as `ranks` processes under mpirun on this host.
inline Result run_mpi(int ranks, const std::string& arguments) {
  return run_shell(cpu_training(arguments) +
                   "env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" OMPI_ALLOW_RUN_AS_ROOT=1 "
                   "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 300 mpirun "
                   "--oversubscribe --allow-run-as-root --bind-to none -x ASAN_OPTIONS " +
                   (cpu_training(arguments).empty() ? "" : "-x CUDA_VISIBLE_DEVICES ") + "-np " +
                   std::to_string(ranks) + " " + kBinary + " " + arguments);
}

inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace lockstep::command_testing

#include "comm/process_launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace lockstep::comm::testing {
namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

const char* worker_mode() { return std::getenv("LOCKSTEP_TEST_WORKER"); }

std::vector<RankExit> launch_ranks(int ranks, const std::string& worker_test,
                                   const std::map<std::string, std::string>& env, int timeout_s) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  return launch_program(ranks, self, {"--gtest_filter=" + worker_test}, env, timeout_s);
}

std::vector<RankExit> launch_program(int ranks, const std::string& program, const std::vector<std::string>& args,
                                     const std::map<std::string, std::string>& env, int timeout_s,
                                     const std::function<void(const std::vector<int>& pids)>& while_running) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) {
    vars.erase(name);
  }
  vars["WORLD_SIZE"] = std::to_string(ranks);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(ranks);
  vars["MASTER_ADDR"] = "127.0.0.1";
  vars["MASTER_PORT"] = std::to_string(free_port());
  vars["OMP_NUM_THREADS"] = "1";
  for (const auto& [k, v] : env) vars[k] = v;

  const std::string log_dir = std::filesystem::temp_directory_path() / ("lockstep-ranks-" + std::to_string(getpid()));
  std::filesystem::create_directories(log_dir);

  std::vector<RankExit> exits(ranks);
  for (int r = 0; r < ranks; ++r) {
    vars["RANK"] = vars["LOCAL_RANK"] = std::to_string(r);
    std::vector<std::string> entries;
    for (const auto& [k, v] : vars) entries.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : entries) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log = log_dir + "/rank" + std::to_string(r) + ".log";
    const pid_t pid = fork();
    if (pid == 0) {
      FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (out) dup2(fileno(stdout), STDERR_FILENO);
      std::vector<char*> argv{const_cast<char*>(program.c_str())};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execve(program.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    exits[r].pid = pid;
  }
  if (while_running) {
    std::vector<int> pids;
    for (const RankExit& e : exits) pids.push_back(e.pid);
    while_running(pids);
  }

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int running = ranks;
  while (running > 0) {
    for (RankExit& e : exits) {
      if (e.exit_code != -1 || e.signal != 0) continue;
      int status = 0;
      if (waitpid(e.pid, &status, WNOHANG) == e.pid) {
        if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
        --running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (RankExit& e : exits) kill(e.pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < ranks; ++r) exits[r].output = read_file(log_dir + "/rank" + std::to_string(r) + ".log");
  std::filesystem::remove_all(log_dir);
  return exits;
}

std::string describe(const std::vector<RankExit>& exits) {
  std::ostringstream out;
  for (size_t r = 0; r < exits.size(); ++r) {
    out << "---- rank " << r << " (pid " << exits[r].pid << "): ";
    if (exits[r].signal) {
      out << "killed by signal " << exits[r].signal;
    } else {
      out << "exit " << exits[r].exit_code;
    }
    out << "\n" << exits[r].output << "\n";
  }
  return out.str();
}

std::vector<std::string> leftover_segments(const std::vector<RankExit>& exits) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename();
    for (const RankExit& e : exits) {
      if (name.rfind("lockstep-" + std::to_string(e.pid) + "-", 0) == 0) found.push_back(name);
    }
  }
  return found;
}

}  // namespace lockstep::comm::testing

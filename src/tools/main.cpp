// The lockstep command: one binary, one folder per subcommand (train/, run/, top/, doctor/, bench/, plan/) and common/.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/core/error.h"
#include "tools/common/commands.h"
#include "tools/common/error_file.h"

namespace {

void print_usage(FILE* out) {
  std::fprintf(
      out,
      "usage: lockstep <command> [options]\n"
      "\n"
      "commands:\n"
      "  train     train a model (Fashion-MNIST CNN by default); see 'lockstep train --help'\n"
      "  run       one process per device for any program (torchrun's contract); see 'lockstep run --help'\n"
      "  doctor    is this machine ready: GPUs, driver vs CUDA/NCCL, topology, /dev/shm, ...; exit 0/1/2\n"
      "  top       live per-GPU utilization, memory, power, processes; logs and Prometheus; see 'lockstep top --help'\n"
      "  plan      which layouts of a model fit the devices, and how fast each trains; see 'lockstep plan --help'\n"
      "  bench     benchmarks beside their references; 'lockstep bench collectives --help'\n"
      "  version   print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "train") return lockstep::tools::train_main(args);
    if (command == "bench") return lockstep::tools::bench_main(args);
    if (command == "run") return lockstep::tools::run_main(args);
    if (command == "doctor") return lockstep::tools::doctor_main(args);
    if (command == "top") return lockstep::tools::top_main(args);
    if (command == "plan") return lockstep::tools::plan_main(args);
    if (command == "version" || command == "--version") {
      std::printf("lockstep %s\n", LOCKSTEP_VERSION);
      return 0;
    }
    if (command == "help" || command == "--help" || command == "-h") {
      print_usage(stdout);
      return 0;
    }
    std::fprintf(stderr, "lockstep: unknown command '%s'\n\n", command.c_str());
    print_usage(stderr);
    return 2;
  } catch (const lockstep::UsageError& e) {
    std::fprintf(stderr, "lockstep %s: %s\n", command.c_str(), e.what());
    lockstep::tools::write_error_file("lockstep " + command + ": " + e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep %s: error: %s\n", command.c_str(), e.what());
    lockstep::tools::write_error_file("lockstep " + command + ": error: " + e.what());
    return 1;
  }
}

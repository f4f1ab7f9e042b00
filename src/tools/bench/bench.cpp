// `lockstep bench <what>`: benchmarks that print Lockstep's figure beside a reference's,
// measured in the same run.
#include <cstdio>

#include "lockstep/core/error.h"
#include "tools/common/commands.h"

namespace lockstep::tools {

int bench_main(const std::vector<std::string>& args) {
  const std::string what = args.empty() ? "" : args.front();
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (what == "collectives") return bench_collectives_main(rest);
  if (what == "--help" || what == "-h" || what == "help") {
    std::printf(
        "usage: lockstep bench collectives [options]\n\n"
        "Benchmarks:\n"
        "  collectives   all-reduce, reduce-scatter, all-gather, broadcast over this host's devices, beside MPI\n\n"
        "'lockstep bench collectives --help' lists its options.\n");
    return 0;
  }
  throw UsageError("usage: lockstep bench collectives [options]; 'lockstep bench collectives --help' lists them" +
                   (what.empty() ? std::string() : " (unknown benchmark '" + what + "')"));
}

}  // namespace lockstep::tools

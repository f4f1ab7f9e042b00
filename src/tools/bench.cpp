// `lockstep bench <what>`: benchmarks that print Lockstep's figure beside a reference's,
// measured in the same run.
#include "lockstep/core/error.h"
#include "tools/commands.h"

namespace lockstep::tools {

int bench_main(const std::vector<std::string>& args) {
  const std::string what = args.empty() ? "" : args.front();
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (what == "collectives") return bench_collectives_main(rest);
  throw UsageError("usage: lockstep bench collectives [options]; 'lockstep bench collectives --help' lists them" +
                   (what.empty() ? std::string() : " (unknown benchmark '" + what + "')"));
}

}  // namespace lockstep::tools

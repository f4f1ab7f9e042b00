#include "lockstep/core/error.h"
#include "tools/commands.h"

namespace lockstep::tools {

int train_main(const std::vector<std::string>&) {
  LOCKSTEP_FAIL() << "train: not built yet";
  return 1;
}

}  // namespace lockstep::tools

// Entry points of the subcommands; each returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace lockstep::tools {

int train_main(const std::vector<std::string>& args);
int bench_main(const std::vector<std::string>& args);
int run_main(const std::vector<std::string>& args);
int top_main(const std::vector<std::string>& args);
int bench_collectives_main(const std::vector<std::string>& args);
int doctor_main(const std::vector<std::string>& args);
int plan_main(const std::vector<std::string>& args);

}  // namespace lockstep::tools

#include "tools/run/ramp.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::tools {

namespace fs = std::filesystem;

namespace {

// A program's throughput from its readings: the first holds warm-up, so the mean of the rest,
// or the only one.
std::optional<double> mean_after_first(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  if (values.size() == 1) return values[0];
  double sum = 0;
  for (size_t i = 1; i < values.size(); ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - 1);
}

}  // namespace

std::vector<int> parse_ramp(const std::string& text) {
  const std::string usage = "--ramp takes rising worker counts, like 1,2,4; got '" + text + "'";
  std::vector<int> scales;
  std::stringstream in(text);
  for (std::string word; std::getline(in, word, ',');) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(word, &used);
    } catch (const std::exception&) {
      throw UsageError(usage);
    }
    if (used != word.size() || value < 1 || (!scales.empty() && value <= scales.back())) throw UsageError(usage);
    scales.push_back(value);
  }
  if (scales.empty() || text.back() == ',') throw UsageError(usage);
  return scales;
}

std::optional<double> metric_in_output(const std::string& output, const std::string& pattern) {
  std::regex regex;
  try {
    regex = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw UsageError("--ramp-metric '" + pattern + "' is not a regular expression: " + e.what());
  }
  if (regex.mark_count() != 1) {
    throw UsageError("--ramp-metric '" + pattern + "' needs one group around the number, like 'samples/s=([0-9.]+)'");
  }
  std::vector<double> values;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), regex); it != std::sregex_iterator(); ++it) {
    try {
      values.push_back(std::stod((*it)[1].str()));
    } catch (const std::exception&) {
      // a match whose group is not a number says nothing
    }
  }
  return mean_after_first(values);
}

void read_train_figures(const std::string& out_dir, RampScale& scale) {
  if (std::ifstream in(fs::path(out_dir) / "summary.json"); in) {
    const nlohmann::json summary = nlohmann::json::parse(in, nullptr, false);
    if (summary.is_object() && summary.contains("samples_per_second")) {
      scale.throughput = summary["samples_per_second"].get<double>();
      scale.source = "summary.json samples_per_second";
      scale.steps = summary.value("steps", int64_t{0});
      scale.weights_sha256 = summary.value("weights_sha256", "");
      return;
    }
  }
  std::ifstream in(fs::path(out_dir) / "metrics.jsonl");
  std::vector<double> values;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json step = nlohmann::json::parse(line, nullptr, false);
    if (step.is_object() && step.contains("samples_per_second"))
      values.push_back(step["samples_per_second"].get<double>());
  }
  if (values.empty()) return;
  scale.throughput = mean_after_first(values);
  scale.source = "metrics.jsonl samples_per_second";
}

bool is_lockstep_train(const std::vector<std::string>& command, const std::string& self_path) {
  if (command.size() < 2 || command[1] != "train") return false;
  if (fs::path(command[0]).filename() == "lockstep") return true;
  std::error_code error;
  return !self_path.empty() && fs::equivalent(command[0], self_path, error);
}

std::string out_dir_of(const std::vector<std::string>& command) {
  for (size_t i = 2; i < command.size(); ++i) {
    if (command[i] == "--out" && i + 1 < command.size()) return command[i + 1];
    if (command[i].rfind("--out=", 0) == 0) return command[i].substr(6);
  }
  return "";
}

std::vector<std::string> with_out_dir(std::vector<std::string> command, const std::string& out) {
  for (size_t i = 2; i < command.size(); ++i) {
    if (command[i] == "--out" && i + 1 < command.size()) {
      command[i + 1] = out;
      return command;
    }
    if (command[i].rfind("--out=", 0) == 0) {
      command[i] = "--out=" + out;
      return command;
    }
  }
  command.insert(command.begin() + 2, {"--out", out});
  return command;
}

int first_scale_with_other_weights(const std::vector<RampScale>& scales) {
  if (scales.empty() || scales[0].weights_sha256.empty()) return -1;
  for (size_t i = 1; i < scales.size(); ++i) {
    const RampScale& s = scales[i];
    if (s.steps == scales[0].steps && !s.weights_sha256.empty() && s.weights_sha256 != scales[0].weights_sha256)
      return static_cast<int>(i);
  }
  return -1;
}

std::string ramp_table(const std::vector<RampScale>& scales) {
  // Speed-up and efficiency are against the first scale; without a figure there, none.
  const RampScale* base = !scales.empty() && scales[0].throughput && *scales[0].throughput > 0 ? &scales[0] : nullptr;
  std::string table = "workers  throughput  speed-up  efficiency  source\n";
  char line[512];
  for (const RampScale& s : scales) {
    std::string source = s.failed ? "failed" : s.source.empty() ? "no figure found" : s.source;
    if (s.timed) source += ", stopped after --ramp-seconds";
    if (s.throughput && base != nullptr) {
      const double speed_up = *s.throughput / *base->throughput;
      const double efficiency = speed_up * base->workers / s.workers;
      std::snprintf(line, sizeof line, "%7d  %10.1f  %7.2fx  %9.0f%%  %s\n", s.workers, *s.throughput, speed_up,
                    100 * efficiency, source.c_str());
    } else if (s.throughput) {
      std::snprintf(line, sizeof line, "%7d  %10.1f  %8s  %10s  %s\n", s.workers, *s.throughput, "-", "-",
                    source.c_str());
    } else {
      std::snprintf(line, sizeof line, "%7d  %10s  %8s  %10s  %s\n", s.workers, "-", "-", "-", source.c_str());
    }
    table += line;
  }
  if (const int other = first_scale_with_other_weights(scales); other >= 0) {
    table += "weights: " + std::to_string(scales[static_cast<size_t>(other)].workers) +
             " workers end with other weights than " + std::to_string(scales[0].workers) + " (" +
             scales[static_cast<size_t>(other)].weights_sha256.substr(0, 16) + " against " +
             scales[0].weights_sha256.substr(0, 16) + ")\n";
  } else if (!scales.empty() && !scales[0].weights_sha256.empty()) {
    std::string alike;  // the scales compared: "1, 2, 4"
    for (const RampScale& s : scales) {
      if (s.steps == scales[0].steps && !s.weights_sha256.empty())
        alike += (alike.empty() ? "" : ", ") + std::to_string(s.workers);
    }
    if (alike.find(',') != std::string::npos) {
      table += "weights: " + alike + " workers end " + std::to_string(scales[0].steps.value_or(0)) +
               " steps with the same weights_sha256 " + scales[0].weights_sha256.substr(0, 16) + "\n";
    }
  }
  return table;
}

std::string ramp_gpus(const std::string& gpus, int workers, int most) {
  if (gpus.empty() || gpus == "auto") return gpus;
  std::vector<std::string> entries;
  std::istringstream list(gpus);
  for (std::string entry; std::getline(list, entry, ',');) entries.push_back(entry);
  if (static_cast<int>(entries.size()) < most) {
    throw UsageError("--gpus " + gpus + " names " + std::to_string(entries.size()) + " GPU" +
                     (entries.size() == 1 ? "" : "s") + " for a ramp up to " + std::to_string(most) +
                     " workers: list at least " + std::to_string(most) + " (each scale takes the first ones)");
  }
  std::string chosen;
  for (int i = 0; i < workers; ++i) chosen += (i ? "," : "") + entries[static_cast<size_t>(i)];
  return chosen;
}

}  // namespace lockstep::tools

// `lockstep run --ramp 1,2,4`: start small, then scale. The same command runs with each
// number of workers in turn, the ramp stops at the first scale that fails, and a table sets
// each scale's throughput beside the first one's: speed-up and scaling efficiency. For
// `lockstep train` every scale must also end with the first one's weights_sha256 (the step is
// a tree); the first that does not is named. These are the ramp's pure parts; run.cpp runs
// the scales.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lockstep::tools {

// What one scale gave.
struct RampScale {
  int workers = 0;
  bool failed = false;               // a worker failed (not stopped by the ramp's clock)
  bool timed = false;                // the ramp stopped it after --ramp-seconds
  std::optional<double> throughput;  // the job's, in the metric's own unit
  std::string source;                // where the throughput comes from
  std::optional<int64_t> steps;      // lockstep train's summary.json: steps taken ...
  std::string weights_sha256;        // ... and the weights they ended with
};

// "1,2,4" -> {1, 2, 4}: positive and rising; UsageError otherwise.
std::vector<int> parse_ramp(const std::string& text);

// The number `pattern` (an ECMAScript regex with one group around it) finds in `output`: the
// mean of every match after the first (the first holds warm-up), or the only one; nullopt
// when nothing matches. UsageError for a pattern that does not compile or has no group.
std::optional<double> metric_in_output(const std::string& output, const std::string& pattern);

// lockstep train's own figures: summary.json's samples_per_second, steps and weights (a
// whole run), else the mean of metrics.jsonl's samples_per_second after its first line (a
// run stopped early). Leaves `scale` as it is when `out_dir` holds neither.
void read_train_figures(const std::string& out_dir, RampScale& scale);

// Whether `command` is `lockstep train` (its program named lockstep, or this executable).
bool is_lockstep_train(const std::vector<std::string>& command, const std::string& self_path);
// The folder lockstep train's --out names in `command`, or "" when it has none.
std::string out_dir_of(const std::vector<std::string>& command);
// `command` with its --out (added when missing) set to `out`.
std::vector<std::string> with_out_dir(std::vector<std::string> command, const std::string& out);

// The GPUs of one scale when --gpus lists them: its first `workers` entries ("0,2,3,5" at 2
// workers is "0,2"), so every scale runs on the GPUs the user chose. "" and "auto" stay as
// they are. UsageError when the list is shorter than the ramp's largest scale, `most`.
std::string ramp_gpus(const std::string& gpus, int workers, int most);

// The table: workers, throughput, speed-up and efficiency against the first scale that has a
// throughput, and its source; then one line naming the first scale whose weights differ
// from the first scale's (steps alike), if any.
std::string ramp_table(const std::vector<RampScale>& scales);

// The index of the first scale that took the first scale's steps but ended with other
// weights; -1 when every comparable scale agrees.
int first_scale_with_other_weights(const std::vector<RampScale>& scales);

}  // namespace lockstep::tools

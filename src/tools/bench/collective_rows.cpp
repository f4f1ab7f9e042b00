#include "tools/bench/collective_rows.h"

#include <cstdio>

namespace lockstep::tools {
namespace {

std::string format(const char* pattern, auto... values) {
  char line[512];
  std::snprintf(line, sizeof(line), pattern, values...);
  return line;
}

}  // namespace

nlohmann::json row_json(const Row& row, const RowSettings& settings) {
  nlohmann::json j;
  j["collective"] = collective_label(row.what);
  j["backend"] = settings.backend;
  if (!settings.route.empty()) j["route"] = settings.route;
  j["ranks"] = settings.ranks;
  j["size"] = row.bytes;
  j["count"] = row.bytes / static_cast<int64_t>(dtype_size(settings.dtype));
  j["type"] = dtype_name(settings.dtype);
  j["redop"] = settings.op;
  const double factor = bus_factor(row.what, settings.ranks);
  if (row.ours.seconds > 0) {
    const double algbw = static_cast<double>(row.bytes) / row.ours.seconds / 1e9;
    j["time_us"] = row.ours.seconds * 1e6;
    j["algbw"] = algbw;
    j["busbw"] = algbw * factor;
    j["wrong"] = row.ours.wrong;
    // eta: all_reduce moves N·S bytes in and N·S out, as an in-place update of N·S does.
    if (row.what == Collective::all_reduce && settings.update_bandwidth > 0) {
      j["eta"] = static_cast<double>(row.bytes) * settings.ranks / row.ours.seconds / settings.update_bandwidth;
    }
  }
  if (row.reference_seconds > 0) {
    j[settings.reference + "_time_us"] = row.reference_seconds * 1e6;
    j[settings.reference + "_busbw"] = static_cast<double>(row.bytes) / row.reference_seconds / 1e9 * factor;
    if (row.reference_wrong >= 0) j[settings.reference + "_wrong"] = row.reference_wrong;
    if (row.ours.seconds > 0) j["speedup"] = row.reference_seconds / row.ours.seconds;
  }
  return j;
}

std::string rows_table(const std::vector<Row>& rows, const RowSettings& settings) {
  const bool compared = !settings.reference.empty();
  const std::string route = settings.route.empty() ? "" : " (" + settings.route + ")";
  const std::string type = dtype_name(settings.dtype);
  std::string out = format(
      "# lockstep bench collectives: backend %s%s, %d ranks, %s %s, %lld iterations after %lld "
      "warm-up\n",
      settings.backend.c_str(), route.c_str(), settings.ranks, type.c_str(), settings.op.c_str(),
      static_cast<long long>(settings.iters), static_cast<long long>(settings.warmup));
  if (settings.update_bandwidth > 0) {
    out += format("# B_update (in-place update bandwidth of the same %d ranks, for eta): %.2f GB/s\n", settings.ranks,
                  settings.update_bandwidth / 1e9);
  }
  out += "#\n";
  out += format("# %-14s %12s %11s %5s %5s %10s %8s %8s %7s %6s", "collective", "size", "count", "type", "redop",
                "time(us)", "algbw", "busbw", "#wrong", "eta");
  if (compared) {
    out += format(" %14s %12s %8s", (settings.reference + " time(us)").c_str(), (settings.reference + " busbw").c_str(),
                  "speedup");
  }
  out += "\n";
  for (const Row& row : rows) {
    const nlohmann::json j = row_json(row, settings);
    const std::string wrong = row.ours.wrong < 0 ? "-" : std::to_string(row.ours.wrong);
    const std::string eta = j.contains("eta") ? format("%.2f", j["eta"].get<double>()) : "-";
    out += format("  %-14s %12lld %11lld %5s %5s %10.1f %8.2f %8.2f %7s %6s", collective_label(row.what),
                  static_cast<long long>(row.bytes), static_cast<long long>(j["count"].get<int64_t>()), type.c_str(),
                  settings.op.c_str(), j.value("time_us", 0.0), j.value("algbw", 0.0), j.value("busbw", 0.0),
                  wrong.c_str(), eta.c_str());
    if (compared) {
      out += format(" %14.1f %12.2f %7.2fx", j.value(settings.reference + "_time_us", 0.0),
                    j.value(settings.reference + "_busbw", 0.0), j.value("speedup", 0.0));
    }
    out += "\n";
  }
  out +=
      "# algbw = size / time; busbw = algbw x 2(N-1)/N (all_reduce), (N-1)/N (reduce_scatter, all_gather), 1 "
      "(broadcast); GB/s = 1e9 bytes/s";
  if (compared) out += "; speedup = " + settings.reference + " time / ours";
  out += "\n";
  return out;
}

}  // namespace lockstep::tools

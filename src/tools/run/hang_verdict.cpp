#include "tools/run/hang_verdict.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::tools {
namespace {

using comm::CallState;
using comm::FlightCall;
using comm::FlightReport;

// "rank 1", "ranks 0, 2-5, 7".
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out << ", ";
    out << ranks[i];
    if (j > i) out << (j == i + 1 ? ", " : "-") << ranks[j];
    i = j + 1;
  }
  return out.str();
}

// The call a rank is held in: its oldest that has not ended, or else the last that failed
// (what a rank's record says after a peer died under it).
const FlightCall* held_in(const FlightReport& report) {
  for (const FlightCall& call : report.calls) {
    if (call.state == CallState::issued || call.state == CallState::waiting) return &call;
  }
  for (auto it = report.calls.rbegin(); it != report.calls.rend(); ++it) {
    if (it->state == CallState::failed) return &*it;
  }
  return nullptr;
}

int64_t held_ms(const FlightCall& call, int64_t now_ms) {
  const int64_t since = call.started_ms > 0 ? call.started_ms : call.issued_ms;
  return (call.ended_ms > 0 ? call.ended_ms : now_ms) - since;
}

// A live rank rewrites its record every second (flight_recorder.h); one this much older
// than now is stopped (SIGSTOP, a debugger) or frozen (stuck in the kernel, swapping).
constexpr int64_t kFrozenMs = 3000;

// Ranks that say the same thing, said once, with the longest time any of them has said it.
struct Clause {
  std::vector<int> ranks;
  int64_t longest_ms = 0;
};
using Clauses = std::map<std::string, Clause>;  // by what they say

void add(Clauses& clauses, const std::string& text, int rank, int64_t ms) {
  Clause& clause = clauses[text];
  clause.ranks.push_back(rank);
  clause.longest_ms = std::max(clause.longest_ms, ms);
}

}  // namespace

std::vector<std::optional<comm::FlightReport>> read_flight_reports(const std::string& dir, int first_rank,
                                                                   int workers) {
  std::vector<std::optional<FlightReport>> reports(static_cast<size_t>(std::max(0, workers)));
  for (int i = 0; i < workers; ++i) {
    std::ifstream in(std::filesystem::path(dir) / ("rank" + std::to_string(first_rank + i) + ".flight.json"));
    if (!in) continue;
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      reports[static_cast<size_t>(i)] = comm::parse_flight_report(text);
    } catch (const Error&) {
      // Torn or foreign: this rank has no record.
    }
  }
  return reports;
}

int64_t newest_progress_ms(const std::vector<std::optional<comm::FlightReport>>& reports) {
  int64_t newest = 0;
  for (const auto& report : reports) {
    if (report) newest = std::max(newest, report->last_progress_ms);
  }
  return newest;
}

std::string hang_verdict(const std::vector<std::optional<comm::FlightReport>>& reports, int failed_rank,
                         const std::string& failure, int64_t now_ms, int first_rank) {
  if (newest_progress_ms(reports) == 0) return "";
  // How far each group's collectives have been issued by any of its ranks: a rank that
  // issued fewer on a group is behind there.
  std::map<std::string, uint64_t> furthest;
  for (const auto& report : reports) {
    if (!report) continue;
    for (const comm::FlightGroup& group : report->groups) {
      furthest[group.name] = std::max(furthest[group.name], group.issued);
    }
  }
  std::string failed;
  Clauses frozen, holding_back, waiting, waited, elsewhere, exited;
  std::vector<int> silent;
  for (int i = 0; i < static_cast<int>(reports.size()); ++i) {
    const int rank = first_rank + i;
    const auto& report = reports[static_cast<size_t>(i)];
    const FlightCall* call = report ? held_in(*report) : nullptr;
    if (rank == failed_rank) {
      failed = "rank " + std::to_string(rank) + " failed (" + failure + ")";
      if (report) failed += " in " + comm::describe_activity(report->activity);
      if (call != nullptr) failed += ", in " + comm::describe_call(*call);
      continue;
    }
    if (!report) {
      silent.push_back(rank);
      continue;
    }
    if (report->reason != "exit" && now_ms - report->written_ms > kFrozenMs) {
      add(frozen, comm::describe_activity(report->activity), rank, now_ms - report->written_ms);
      continue;
    }
    if (call != nullptr) {
      add(call->state == CallState::failed ? waited : waiting, comm::describe_call(*call), rank,
          held_ms(*call, now_ms));
      continue;
    }
    if (report->reason == "exit") {
      add(exited, comm::describe_activity(report->activity), rank, 0);
      continue;
    }
    const bool behind = std::any_of(report->groups.begin(), report->groups.end(),
                                    [&](const comm::FlightGroup& g) { return g.issued < furthest[g.name]; });
    add(behind ? holding_back : elsewhere, comm::describe_activity(report->activity), rank,
        now_ms - report->activity.since_ms);
  }

  std::vector<std::string> clauses;
  if (!failed.empty()) clauses.push_back(failed);
  for (const auto& [activity, clause] : frozen) {
    const bool one = clause.ranks.size() == 1;
    clauses.push_back(rank_list(clause.ranks) + (one ? " has" : " have") + " not written a record for " +
                      comm::describe_duration(clause.longest_ms) +
                      " (stopped or frozen): " + (one ? "it was" : "they were") + " in " + activity);
  }
  for (const auto& [activity, clause] : holding_back) {
    const bool one = clause.ranks.size() == 1;
    clauses.push_back(rank_list(clause.ranks) + (one ? " holds" : " hold") +
                      " the others back: " + (one ? "it is" : "they are") + " in " + activity + ", for " +
                      comm::describe_duration(clause.longest_ms));
  }
  for (const auto& [call, clause] : waiting) {
    clauses.push_back(rank_list(clause.ranks) + (clause.ranks.size() == 1 ? " waits" : " wait") + " in " + call +
                      " for " + comm::describe_duration(clause.longest_ms));
  }
  for (const auto& [call, clause] : waited) {
    clauses.push_back(rank_list(clause.ranks) + " waited in " + call + " for " +
                      comm::describe_duration(clause.longest_ms) + " until it failed");
  }
  for (const auto& [activity, clause] : elsewhere) {
    clauses.push_back(rank_list(clause.ranks) + (clause.ranks.size() == 1 ? " is" : " are") + " in " + activity +
                      ", for " + comm::describe_duration(clause.longest_ms));
  }
  for (const auto& [activity, clause] : exited) {
    clauses.push_back(rank_list(clause.ranks) + " exited after " + activity);
  }
  if (!silent.empty()) clauses.push_back(rank_list(silent) + " left no flight record");
  std::string verdict;
  for (const std::string& clause : clauses) verdict += (verdict.empty() ? "" : "; ") + clause;
  return verdict;
}

}  // namespace lockstep::tools

#include "lockstep/comm/store.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <sstream>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

namespace detail {

std::string seconds_text(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  std::ostringstream out;
  out << ms / 1000;
  if (int64_t frac = ms % 1000; frac != 0) {
    std::string digits = std::to_string(1000 + (frac < 0 ? -frac : frac)).substr(1);
    while (digits.back() == '0') digits.pop_back();
    out << '.' << digits;
  }
  return out.str();
}

std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24 * 365);
  return std::clamp(timeout, std::chrono::milliseconds(0), kLongest);
}

std::string key_timeout_message(const std::string& key, std::chrono::milliseconds timeout, const std::string& where) {
  return "timed out after " + seconds_text(timeout) + " s waiting for key '" + key + "' in the store" + where;
}

int64_t parse_counter(const std::string& key, const std::string& value) {
  int64_t result = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, result);
  LOCKSTEP_CHECK(!value.empty() && ec == std::errc() && ptr == end)
      << "store key '" << key << "' holds '" << value
      << "', not an integer: add() counts only on keys that add() created; use another key for counting";
  return result;
}

}  // namespace detail

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const bool found = changed_.wait_for(lock, detail::clamp_timeout(timeout), [&] { return values_.count(key) != 0; });
  if (!found) throw CommError(detail::key_timeout_message(key, timeout, ""));
  return values_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    result = (it == values_.end() ? 0 : detail::parse_counter(key, it->second)) + delta;
    values_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

bool MemoryStore::check(const std::string& key) {
  std::lock_guard lock(mutex_);
  return values_.count(key) != 0;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "rank" << (ranks.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Gets key_of(r) for each of ranks, all within deadline. On timeout, returns the ranks whose
// keys are still missing (all of them, not just the first) and leaves values partly filled.
std::vector<int> get_all(Store& store, const std::function<std::string(int)>& key_of, const std::vector<int>& ranks,
                         Clock::time_point deadline, std::vector<std::string>& values) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      values[r] = store.get(key_of(r), std::max(left, std::chrono::milliseconds(0)));
      continue;
    } catch (const CommError&) {
      // Timed out, or the store failed: then check() fails the same way and that propagates.
    }
    std::vector<int> missing;
    for (size_t j = i; j < ranks.size(); ++j) {
      if (!store.check(key_of(ranks[j]))) missing.push_back(ranks[j]);
    }
    if (!missing.empty()) return missing;
    values[r] = store.get(key_of(r), std::chrono::milliseconds(0));  // it came just after the deadline
  }
  return {};
}

}  // namespace

std::vector<std::string> store_all_gather(Store& store, const std::string& prefix, int rank, int size,
                                          const std::string& value, std::chrono::milliseconds timeout,
                                          const std::string& what) {
  LOCKSTEP_CHECK(size >= 1 && rank >= 0 && rank < size)
      << what << ": rank " << rank << " is outside a group of " << size;
  const Clock::time_point deadline = Clock::now() + detail::clamp_timeout(timeout);
  auto value_key = [&](int r) { return prefix + "/" + std::to_string(r); };
  auto done_key = [&](int r) { return prefix + "/done/" + std::to_string(r); };
  store.set(value_key(rank), value);

  std::vector<int> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank) others.push_back(r);
  }
  std::vector<std::string> values(size);
  values[rank] = value;
  if (std::vector<int> missing = get_all(store, value_key, others, deadline, values); !missing.empty()) {
    throw CommError(what + ": " + rank_list(missing) + " of " + std::to_string(size) + " did not arrive within " +
                    detail::seconds_text(timeout) +
                    " s; check that every rank was started and uses the same MASTER_ADDR/MASTER_PORT");
  }

  // Rank 0 hosts the store (TcpStore's server, FileStore's directory), so it returns only
  // once every rank has read all it needs: then it may drop the store right after the
  // last gather without pulling it from under a slower reader.
  if (rank != 0) {
    store.set(done_key(rank), "");
  } else if (size > 1) {
    std::vector<std::string> ignored(size);
    if (std::vector<int> missing = get_all(store, done_key, others, deadline, ignored); !missing.empty()) {
      throw CommError(what + ": " + rank_list(missing) + " of " + std::to_string(size) +
                      " arrived but did not finish reading the others' values within " + detail::seconds_text(timeout) +
                      " s; did it exit or crash? see its output");
    }
  }
  return values;
}

}  // namespace lockstep::comm

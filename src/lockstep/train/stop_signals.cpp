#include "lockstep/train/stop_signals.h"

#include <signal.h>

#include <array>
#include <atomic>
#include <cstdio>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

constexpr std::array<int, 3> kStopSignals = {SIGTERM, SIGINT, SIGUSR1};

std::atomic<int> first_signal{0};
std::atomic<bool> installed{false};
std::array<struct sigaction, kStopSignals.size()> previous{};

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (first_signal.compare_exchange_strong(none, signal)) return;  // the first: stop at the step boundary
  // The second: now. The default action ends the process (async-signal-safe calls only).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  raise(signal);
}

}  // namespace

StopSignals::StopSignals() {
  LOCKSTEP_CHECK(!installed.exchange(true)) << "StopSignals: another one is already installed in this process";
  first_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls in progress go on; the loop polls at the boundary
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &action, &previous[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &previous[i], nullptr);
  installed = false;
}

int StopSignals::received() const { return first_signal.load(); }

bool stop_signals_installed() { return installed.load(); }
int stop_signal_received() { return installed.load() ? first_signal.load() : 0; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace lockstep::train

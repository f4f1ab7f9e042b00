// SIGTERM, SIGINT and SIGUSR1 (what Slurm's --signal sends before a time limit) as a request
// to stop at the next step boundary with a checkpoint. A second one ends the process at
// once, by the signal's default action. While a StopSignals lives it owns the three
// signals' handlers; it gives the previous ones back when it goes. One at a time per process.
#pragma once

namespace lockstep::train {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received, or 0.
  int received() const;
};

// Whether a StopSignals is installed in this process now, and the first signal it received
// (0: none): a program that installs one at start-up, before its Trainer exists, so that a
// signal arriving while it starts is not fatal, lets the Trainer read that one.
bool stop_signals_installed();
int stop_signal_received();

// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
const char* stop_signal_name(int signal);

}  // namespace lockstep::train

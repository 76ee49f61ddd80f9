// Ctrl-C (SIGINT) and SIGTERM during training. While a StopOnSignal lives, the first such
// signal only records itself; the training loop reads it after each step, saves a checkpoint
// and returns, and the app exits with 128 + the signal's number, as a shell expects of a
// process ended by it. A second signal ends the process at once (the signal's default action:
// the checkpoint written last stays whole, since every write is atomic).
#pragma once

namespace clustr {

class StopOnSignal {
 public:
  StopOnSignal();   // installs the handlers and forgets an earlier signal
  ~StopOnSignal();  // restores the handlers that were there before
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  // The signal received since construction (SIGINT or SIGTERM), or 0.
  static int pending();
};

// "SIGINT", "SIGTERM", or "signal N".
const char* signal_name(int sig);

}  // namespace clustr

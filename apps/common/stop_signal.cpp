// The training loops' stop request on SIGINT / SIGTERM (stop_signal.h).
#include "apps/common/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <cstdio>

namespace clustr {

namespace {

std::atomic<int> received{0};
struct sigaction previous_int, previous_term;

// Async-signal-safe: one lock-free atomic store. SA_RESETHAND puts the default action back
// before the handler runs, so a second signal ends the process.
extern "C" void on_stop_signal(int sig) { received.store(sig, std::memory_order_relaxed); }

}  // namespace

StopOnSignal::StopOnSignal() {
  static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free atomic");
  received.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, &previous_int);
  sigaction(SIGTERM, &sa, &previous_term);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

int StopOnSignal::pending() { return received.load(std::memory_order_relaxed); }

const char* signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local char buf[24];
  std::snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

}  // namespace clustr

// Device emulation's schedules (see core/cuda/emulation.h, part 2): the order in which a launch
// runs its blocks and a block its threads (forward, reverse, or a random permutation drawn for
// every launch, block and round from CLUSTR_EMULATION_SCHEDULE's seed). The launcher
// (emulation_launch.cpp) asks for them through emulation_state.h. Compiled only with
// -DCLUSTR_CUDA=EMULATE.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/emulation.h"
#include "core/cuda/emulation_state.h"
#include "core/error.h"

namespace clustr::cuda::emulation {

const char* order_name(Order o) {
  switch (o) {
    case Order::forward: return "forward";
    case Order::reverse: return "reverse";
    case Order::random: return "random";
  }
  return "?";
}

Schedule parse_schedule(const char* text) {
  const std::string t = text == nullptr ? "" : text;
  if (t == "forward") return {Order::forward, 0};
  if (t == "reverse") return {Order::reverse, 0};
  if (t == "random") return {Order::random, 1};
  if (t.rfind("random:", 0) == 0 && t.size() > 7 && t.size() <= 7 + 20 &&
      t.find_first_not_of("0123456789", 7) == std::string::npos) {
    errno = 0;
    const unsigned long long seed = std::strtoull(t.c_str() + 7, nullptr, 10);
    if (errno == 0) return {Order::random, seed};
  }
  throw Error(detail::cat("CLUSTR_EMULATION_SCHEDULE='", t, "': expected forward, reverse, "
                          "random or random:SEED (SEED a decimal number below 2^64)"));
}

namespace {

struct ScheduleState {
  std::mutex mu;
  bool set = false;
  Schedule schedule;
  std::string error;  // a CLUSTR_EMULATION_SCHEDULE that parse_schedule refused
};

ScheduleState& schedule_state() {
  static ScheduleState* s = [] {
    auto* st = new ScheduleState;
    if (const char* v = std::getenv("CLUSTR_EMULATION_SCHEDULE")) {
      try {
        st->schedule = parse_schedule(v);
      } catch (const Error& e) {
        st->error = e.what();
      }
    }
    return st;
  }();
  return *s;
}

// splitmix64: the stream of one (seed, launch, block, round) of a random schedule.
uint64_t mix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t stream_of(const Schedule& s, uint64_t launch, uint64_t block, uint64_t round) {
  uint64_t x = s.seed;
  uint64_t h = mix(x) ^ launch;
  h = mix(h) ^ block;
  h = mix(h) ^ round;
  return mix(h);
}

}  // namespace

void thread_order(const Schedule& s, uint64_t launch, uint64_t block, uint64_t round,
                  std::vector<unsigned>& out, unsigned n) {
  out.resize(n);
  for (unsigned i = 0; i < n; ++i) out[i] = s.order == Order::reverse ? n - 1 - i : i;
  if (s.order != Order::random) return;
  uint64_t x = stream_of(s, launch, block, round);
  for (unsigned i = n; i > 1; --i) std::swap(out[i - 1], out[mix(x) % i]);  // Fisher-Yates
}

BlockOrder::BlockOrder(const Schedule& s, uint64_t launch, uint64_t n)
    : order(s.order), blocks(n) {
  if (order != Order::random || n < 2) return;
  uint64_t x = stream_of(s, launch, ~uint64_t{0}, 0);
  add = mix(x) % n;
  mul = mix(x) % n;
  while (std::gcd(mul, n) != 1) mul = (mul + 1) % n;
}

uint64_t BlockOrder::operator()(uint64_t i) const {
  if (order == Order::reverse) return blocks - 1 - i;
  if (order == Order::forward) return i;
  __extension__ typedef unsigned __int128 Wide;  // mul * i may pass 2^64
  return static_cast<uint64_t>((static_cast<Wide>(mul) * i + add) % blocks);
}

Schedule current_schedule() {
  ScheduleState& st = schedule_state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.set && !st.error.empty()) throw Error(st.error);
  return st.schedule;
}

void set_schedule(Schedule s) {
  ScheduleState& st = schedule_state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.schedule = s;
  st.set = true;
}

}  // namespace clustr::cuda::emulation

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator. The numbers depend only on (key, counter), never on the order in
// which threads ask for them, so a seed gives the same stream at any thread count and on both
// devices. This header is shared by the CPU and CUDA backends.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace clustr {

struct Philox4 {
  uint32_t v[4];
};

CLUSTR_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Four 32-bit random words for block number `counter` of the stream with key `seed`.
// A position in a Philox stream that a kernel may read from device memory: *at when at is set
// (a draw that a CUDA graph's replays refill, core/random.h's DrawPlan), else value.
// A plain value converts to one (what a host draw gives); host code reads value() of one it has
// checked is not `at` (on the CPU there is no device memory to read).
struct PhiloxOffset {
  const uint64_t* at = nullptr;
  uint64_t value = 0;
  PhiloxOffset() = default;
  CLUSTR_HD PhiloxOffset(uint64_t v) : value(v) {}  // NOLINT: implicit on purpose
  CLUSTR_HD PhiloxOffset(const uint64_t* a, uint64_t v) : at(a), value(v) {}
  CLUSTR_HD uint64_t get() const { return at ? *at : value; }
};

CLUSTR_HD Philox4 philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from the top 24 bits (every value exactly representable).
CLUSTR_HD float uint_to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
// Uniform float in (0, 1], safe for log() in Box-Muller.
CLUSTR_HD float uint_to_unit_open0(uint32_t x) {
  return static_cast<float>((x >> 8) + 1) * (1.0f / 16777216.0f);
}

}  // namespace clustr

// The run's random generator: Philox4x32-10 keyed by the user's seed, with a counter that
// advances as numbers are drawn. Element i of a fill draws from counter block (offset + i/4),
// lane i%4, so results are identical for any thread count and on any device.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace clustr {

namespace detail {
// While a CUDA graph is being captured on this thread (cuda::Graph), a graph would repeat at
// every replay the numbers drawn once at capture: every draw from a Generator then throws,
// naming it (freeze_host_draws is cuda::Graph::capture's).
extern thread_local bool t_host_draws_frozen;
void freeze_host_draws(bool frozen);
[[noreturn]] void refuse_frozen_draw();
}  // namespace detail

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // counter blocks used so far
  // Saved and restored by checkpoints so a resumed run draws the same numbers.
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed, offset_ = offset; }

  // Reserves `blocks` counter blocks (4 x 32 random bits each); returns the first.
  uint64_t reserve(uint64_t blocks) {
    if (detail::t_host_draws_frozen) detail::refuse_frozen_draw();
    uint64_t first = offset_;
    offset_ += blocks;
    return first;
  }

  // One uniform 32-bit word and one uniform float in [0, 1), for sequential host code
  // (each call uses a whole counter block; use the fills below for bulk numbers).
  uint32_t next_u32();
  float next_unit();

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// In-place fills of an f32 tensor (cpu).
void uniform_(Tensor& t, Generator& gen, float low = 0.0f, float high = 1.0f);
void normal_(Tensor& t, Generator& gen, float mean = 0.0f, float stddev = 1.0f);
void bernoulli_(Tensor& t, Generator& gen, float p);  // 1 with probability p, else 0

// A uniformly random permutation of 0..n-1 (i32), by Fisher-Yates.
Tensor randperm(int64_t n, Generator& gen);

}  // namespace clustr

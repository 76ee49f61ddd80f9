// The run's random generator: Philox4x32-10 keyed by the user's seed, with a counter that
// advances as numbers are drawn. Element i of a fill draws from counter block (offset + i/4),
// lane i%4, so results are identical for any thread count and on any device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"

namespace clustr {

namespace detail {
// While a CUDA graph is being captured on this thread (cuda::Graph), a graph would repeat at
// every replay the numbers drawn once at capture: every draw from a Generator then throws,
// naming it (freeze_host_draws is cuda::Graph::capture's).
// (A function, not an extern thread_local: UBSan's null check misreads GCC's access to another
// file's thread_local through its TLS wrapper.)
bool host_draws_frozen();
void freeze_host_draws(bool frozen);
[[noreturn]] void refuse_frozen_draw();
}  // namespace detail

class DrawPlan;

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // counter blocks used so far
  // Saved and restored by checkpoints so a resumed run draws the same numbers.
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed, offset_ = offset; }

  // Reserves `blocks` counter blocks (4 x 32 random bits each); returns the first.
  uint64_t reserve(uint64_t blocks) {
    if (detail::host_draws_frozen()) detail::refuse_frozen_draw();
    uint64_t first = offset_;
    offset_ += blocks;
    return first;
  }

  // One uniform 32-bit word and one uniform float in [0, 1), for sequential host code
  // (each call uses a whole counter block; use the fills below for bulk numbers).
  uint32_t next_u32();
  float next_unit();

  // While set (a CUDA graph's capture), the device draws below are noted in `plan` instead of
  // drawn (DrawPlan); null: they draw.
  void record_into(DrawPlan* plan) { plan_ = plan; }
  DrawPlan* recording() const { return plan_; }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  DrawPlan* plan_ = nullptr;
};

// ---- draws that a kernel reads on the device ----------------------------------------------------
// reserve_device: gen.reserve(blocks) as a PhiloxOffset (its value). normal_device: an f32 tensor
// of `shape` on `device` filled as normal_ fills it (drawn on the host, then copied). While gen
// records into a DrawPlan, neither draws: each takes a slot of the plan's device memory, which
// the kernels then read (the offset's `at`, the tensor's storage), and the plan's fill() draws
// them before each replay.
PhiloxOffset reserve_device(Generator& gen, uint64_t blocks);
// The value of an offset that host code (a CPU kernel) uses; one in device memory (`at`, a draw
// of a captured graph) is refused, naming op.
uint64_t host_offset(PhiloxOffset offset, const char* op);
Tensor normal_device(const Shape& shape, Generator& gen, Device device, float mean = 0.0f,
                     float stddev = 1.0f);

// The draws of a step captured into a CUDA graph (core/cuda/cuda.h), which must draw new numbers
// at every replay, from the run's generator, in the order the step draws them when it runs
// without a graph. Made before the capture with device memory for `capacity` words; the capture
// (gen.record_into(&plan)) notes each device draw and gives it a slot. Before each replay,
// fill() makes the draws on the host, in order, into a buffer laid out as the plan's memory, and
// the caller copies that to memory() (e.g. with the step's batch). Draws that are not device
// draws (reserve(), normal_() on a host tensor) are refused during a capture, naming them.
class DrawPlan {
 public:
  DrawPlan(int64_t capacity, Device device);
  // The words in use (the end of the last slot): what fill() writes and memory() must receive.
  int64_t words() const { return used_; }
  bool empty() const { return draws_.empty(); }
  // The draws of one replay, from gen (advancing it as the step would), into host[0, words()).
  void fill(Generator& gen, float* host) const;
  // The device memory the captured kernels read: (capacity) f32 words.
  const Tensor& memory() const { return memory_; }

 private:
  friend PhiloxOffset reserve_device(Generator&, uint64_t);
  friend Tensor normal_device(const Shape&, Generator&, Device, float, float);
  struct Draw {
    bool normal;     // a normal_ fill of `count` floats, else a reserve of `count` blocks
    uint64_t count;
    int64_t at;      // the slot's first word
    float mean, stddev;
  };
  int64_t take(int64_t words, int64_t align);
  Tensor memory_;
  int64_t used_ = 0;
  std::vector<Draw> draws_;
};

// In-place fills of an f32 tensor (cpu).
void uniform_(Tensor& t, Generator& gen, float low = 0.0f, float high = 1.0f);
void normal_(Tensor& t, Generator& gen, float mean = 0.0f, float stddev = 1.0f);
void bernoulli_(Tensor& t, Generator& gen, float p);  // 1 with probability p, else 0

// A uniformly random permutation of 0..n-1 (i32), by Fisher-Yates.
Tensor randperm(int64_t n, Generator& gen);

}  // namespace clustr

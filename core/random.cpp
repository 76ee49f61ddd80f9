#include "core/random.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/philox.h"

namespace clustr {

namespace detail {
namespace {
thread_local bool t_host_draws_frozen = false;
}  // namespace
bool host_draws_frozen() { return t_host_draws_frozen; }
void freeze_host_draws(bool frozen) { t_host_draws_frozen = frozen; }
void refuse_frozen_draw() {
  throw Error("a random draw from the host's generator while a CUDA graph is being captured: "
              "the graph would repeat the numbers drawn at capture at every replay (dropout's "
              "masks, Reformer's hash rotations: draws that are not device draws, "
              "core/random.h); run such a step without a graph");
}
}  // namespace detail

uint32_t Generator::next_u32() { return philox4x32(seed_, reserve(1)).v[0]; }

// ---- device draws and the plans of CUDA graphs ---------------------------------------------

DrawPlan::DrawPlan(int64_t capacity, Device device)
    : memory_(Tensor::zeros({capacity}, DType::f32, device)) {}

int64_t DrawPlan::take(int64_t words, int64_t align) {
  const int64_t at = (used_ + align - 1) / align * align;
  CLUSTR_CHECK(at + words <= memory_.numel(), "DrawPlan: the step's random draws need more than "
               "the plan's ", memory_.numel(), " words (", at + words, "); make it larger");
  used_ = at + words;
  return at;
}

void DrawPlan::fill(Generator& gen, float* host) const {
  for (const Draw& d : draws_) {
    if (d.normal) {
      Tensor t = Tensor::empty({static_cast<int64_t>(d.count)});
      normal_(t, gen, d.mean, d.stddev);
      std::memcpy(host + d.at, t.f32(), d.count * sizeof(float));
    } else {
      const uint64_t first = gen.reserve(d.count);
      std::memcpy(host + d.at, &first, sizeof first);
    }
  }
}

uint64_t host_offset(PhiloxOffset offset, const char* op) {
  CLUSTR_CHECK(offset.at == nullptr, op, ": a random stream offset in device memory (a draw of ",
               "a CUDA graph's capture) reached a CPU kernel, which cannot read it");
  return offset.value;
}

PhiloxOffset reserve_device(Generator& gen, uint64_t blocks) {
  DrawPlan* plan = gen.recording();
  if (!plan) return {nullptr, gen.reserve(blocks)};
  const int64_t at = plan->take(2, 2);  // a 64-bit word
  plan->draws_.push_back({false, blocks, at, 0.0f, 0.0f});
  return {reinterpret_cast<const uint64_t*>(plan->memory_.f32() + at), 0};
}

Tensor normal_device(const Shape& shape, Generator& gen, Device device, float mean,
                     float stddev) {
  DrawPlan* plan = gen.recording();
  if (!plan) {
    Tensor t = Tensor::empty(shape);
    normal_(t, gen, mean, stddev);
    return device == Device::cpu ? t : t.to(device);
  }
  CLUSTR_CHECK(device == plan->memory_.device(), "normal_device: a draw for ",
               device == Device::cpu ? "the cpu" : "the device", " while recording into a plan "
               "whose memory is on the other");
  const int64_t n = numel(shape);
  const int64_t at = plan->take(n, 1);
  plan->draws_.push_back({true, static_cast<uint64_t>(n), at, mean, stddev});
  return plan->memory_.rows(at, at + n).reshape(shape);
}
float Generator::next_unit() { return uint_to_unit(next_u32()); }

namespace {

void check_fill(const Tensor& t, const char* op) {
  CLUSTR_CHECK(t.defined() && t.dtype() == DType::f32 && t.device() == Device::cpu, op,
               ": expected an f32 tensor on cpu, got ", describe(t));
}

// Calls f(i, block) for every group of four elements; block = the four random words of
// element 4*g. The counter range is reserved up front, so threads can run in any order.
template <typename F>
void for_each_block(int64_t n, Generator& gen, F f) {
  int64_t blocks = (n + 3) / 4;
  uint64_t base = gen.reserve(static_cast<uint64_t>(blocks));
  uint64_t seed = gen.seed();
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < blocks; ++g) f(4 * g, philox4x32(seed, base + static_cast<uint64_t>(g)));
}

}  // namespace

void uniform_(Tensor& t, Generator& gen, float low, float high) {
  check_fill(t, "uniform_");
  float* p = t.f32();
  int64_t n = t.numel();
  float scale = high - low;
  for_each_block(n, gen, [&](int64_t i, Philox4 r) {
    for (int l = 0; l < 4 && i + l < n; ++l) p[i + l] = low + scale * uint_to_unit(r.v[l]);
  });
}

void normal_(Tensor& t, Generator& gen, float mean, float stddev) {
  check_fill(t, "normal_");
  float* p = t.f32();
  int64_t n = t.numel();
  // Box-Muller on lane pairs (0,1) and (2,3): two normals from each pair.
  for_each_block(n, gen, [&](int64_t i, Philox4 r) {
    float z[4];
    for (int pair = 0; pair < 2; ++pair) {
      float u1 = uint_to_unit_open0(r.v[2 * pair]);
      float u2 = uint_to_unit(r.v[2 * pair + 1]);
      float radius = std::sqrt(-2.0f * std::log(u1));
      float angle = 6.283185307179586f * u2;
      z[2 * pair] = radius * std::cos(angle);
      z[2 * pair + 1] = radius * std::sin(angle);
    }
    for (int l = 0; l < 4 && i + l < n; ++l) p[i + l] = mean + stddev * z[l];
  });
}

void bernoulli_(Tensor& t, Generator& gen, float p) {
  check_fill(t, "bernoulli_");
  CLUSTR_CHECK(p >= 0.0f && p <= 1.0f, "bernoulli_: probability ", p, " is outside [0, 1]");
  float* out = t.f32();
  int64_t n = t.numel();
  for_each_block(n, gen, [&](int64_t i, Philox4 r) {
    for (int l = 0; l < 4 && i + l < n; ++l) out[i + l] = uint_to_unit(r.v[l]) < p ? 1.0f : 0.0f;
  });
}

Tensor randperm(int64_t n, Generator& gen) {
  CLUSTR_CHECK(n >= 0 && n <= INT32_MAX, "randperm: n = ", n, " is outside [0, 2^31)");
  Tensor t = Tensor::empty({n}, DType::i32);
  int32_t* p = t.i32();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i);
  if (n < 2) return t;
  // One 64-bit draw per swap (two words of a block); the modulo bias is below 2^-32 for n < 2^31.
  uint64_t base = gen.reserve(static_cast<uint64_t>(n - 1));
  for (int64_t i = n - 1; i > 0; --i) {
    Philox4 r = philox4x32(gen.seed(), base + static_cast<uint64_t>(n - 1 - i));
    uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    int64_t j = static_cast<int64_t>(x % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return t;
}

}  // namespace clustr

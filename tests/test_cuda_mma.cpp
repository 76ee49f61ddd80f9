// The tensor-core building blocks of core/cuda/mma.h (ldmatrix, mma.sync in bf16 and TF32,
// cp.async with its commit and wait), each against a scalar model of the PTX ISA's per-lane
// layout written here from the ISA's formulas, lane by lane; then the three together in a small
// product, as the attention kernels use them. In a GPU build this file is compiled by nvcc
// (LANGUAGE CUDA in tests/CMakeLists.txt), so the same checks run on a GPU (sm_80 or later) and
// on the emulated device. Planted bugs show what the checks catch: a wrong fragment index (here
// and on a GPU), and, on the emulated device only, a missing cp.async wait, a wait for too few
// groups, and copies never waited for. Part of the test_cuda program (tests/test_cuda.cpp has
// its main); empty in a build without the CUDA backend.
#include <doctest/doctest.h>

#if defined(CLUSTR_WITH_CUDA)

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/mma.h"
#include "core/error.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;
namespace mma = clustr::cuda::mma;
using cuda::Thread;

namespace {

// ---- kernels -------------------------------------------------------------------------------------

// One warp copies a 16 x 16 tile of 16-bit elements into shared memory (rows 48 bytes apart, a
// padded stride) and loads it with ldmatrix: the four 8 x 8 quadrants are matrices 0-3 (0: rows
// 0-7, columns 0-7; 1: rows 8-15; 2: columns 8-15; 3: both), lane l naming row l % 8 of matrix
// l / 8. out[l * 4 + i] = register i of lane l.
struct LdmatrixKernel {
  static constexpr bool kUsesBarrier = true;
  static constexpr int kStride = 24;  // elements
  const uint16_t* tile;
  int32_t* out;
  int matrices;
  bool trans;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    uint16_t* s = t.shared<uint16_t>();
    const unsigned l = mma::lane(t);
    for (unsigned e = l; e < 256; e += 32) s[(e / 16) * kStride + e % 16] = tile[e];
    t.sync();
    const unsigned i = l / 8, r = l % 8;
    const uint16_t* row = s + (r + 8 * (i % 2)) * kStride + 8 * (i / 2);
    uint32_t reg[4] = {0, 0, 0, 0};
    if (matrices == 4) {
      uint32_t x[4];
      if (trans)
        mma::ldmatrix_x4_trans(t, x, row);
      else
        mma::ldmatrix_x4(t, x, row);
      for (int k = 0; k < 4; ++k) reg[k] = x[k];
    } else {
      uint32_t x[2];
      if (trans)
        mma::ldmatrix_x2_trans(t, x, row);
      else
        mma::ldmatrix_x2(t, x, row);
      reg[0] = x[0];
      reg[1] = x[1];
    }
    for (int k = 0; k < 4; ++k) out[l * 4 + k] = static_cast<int32_t>(reg[k]);
  }
};

// How the product kernels build a fragment: as the ISA lays it out, or with one planted wrong
// index (A's register 1 taken from row g instead of g + 8).
enum class Fragments { documented, planted_wrong_index };

// d = c + a b for one m16n8k16 bf16 tile: each lane builds its registers straight from global
// memory (A 16 x 16 row-major, B 16 x 8 with k down, C and D 16 x 8 row-major), by the layouts
// of core/cuda/mma.h, independently of ldmatrix.
struct MmaBf16Kernel {
  static constexpr bool kUsesBarrier = true;
  const uint16_t *a, *b;
  const float* c;
  float* d;
  Fragments how;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned l = mma::lane(t), g = l / 4, q = l % 4;
    auto pair = [](const uint16_t* p0, const uint16_t* p1) {
      return static_cast<uint32_t>(*p0) | (static_cast<uint32_t>(*p1) << 16);
    };
    auto at = [&](unsigned row, unsigned col) { return a + row * 16 + col; };
    mma::FragA fa;
    fa.x[0] = pair(at(g, 2 * q), at(g, 2 * q + 1));
    fa.x[1] = how == Fragments::documented ? pair(at(g + 8, 2 * q), at(g + 8, 2 * q + 1))
                                           : pair(at(g, 2 * q), at(g, 2 * q + 1));
    fa.x[2] = pair(at(g, 2 * q + 8), at(g, 2 * q + 9));
    fa.x[3] = pair(at(g + 8, 2 * q + 8), at(g + 8, 2 * q + 9));
    mma::FragB fb;
    fb.x[0] = pair(b + (2 * q) * 8 + g, b + (2 * q + 1) * 8 + g);
    fb.x[1] = pair(b + (2 * q + 8) * 8 + g, b + (2 * q + 9) * 8 + g);
    mma::FragC fc;
    for (unsigned i = 0; i < 4; ++i) fc.x[i] = c[(g + 8 * (i / 2)) * 8 + 2 * q + i % 2];
    mma::mma_bf16(t, fc, fa, fb);
    for (unsigned i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * q + i % 2] = fc.x[i];
  }
};

// d = c + a b for one m16n8k8 TF32 tile: A 16 x 8, B 8 x 8 (k down), C and D 16 x 8, floats
// rounded to TF32 in the kernel (mma::to_tf32).
struct MmaTf32Kernel {
  static constexpr bool kUsesBarrier = true;
  const float *a, *b, *c;
  float* d;
  Fragments how;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned l = mma::lane(t), g = l / 4, q = l % 4;
    mma::FragA8 fa;
    fa.x[0] = mma::to_tf32(a[g * 8 + q]);
    fa.x[1] = mma::to_tf32(how == Fragments::documented ? a[(g + 8) * 8 + q] : a[g * 8 + q]);
    fa.x[2] = mma::to_tf32(a[g * 8 + q + 4]);
    fa.x[3] = mma::to_tf32(a[(g + 8) * 8 + q + 4]);
    mma::FragB8 fb;
    fb.x[0] = mma::to_tf32(b[q * 8 + g]);
    fb.x[1] = mma::to_tf32(b[(q + 4) * 8 + g]);
    mma::FragC fc;
    for (unsigned i = 0; i < 4; ++i) fc.x[i] = c[(g + 8 * (i / 2)) * 8 + 2 * q + i % 2];
    mma::mma_tf32(t, fc, fa, fb);
    for (unsigned i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * q + i % 2] = fc.x[i];
  }
};

// How the streaming kernel waits for its copies: as it should, not at all, for one group too
// few (wait_group 2 where 1 is right), or not before it ends.
enum class Waits { right, none, one_group_short, never_at_the_end };

// 128 threads stream `tiles` tiles of 512 floats (one 16-byte chunk a thread) from src through
// two shared buffers with cp.async, the next tile's copy in flight while the current one is
// read. Each thread writes out the chunk of its neighbour (thread + 1), so the block's barrier
// matters as much as the thread's own wait. Chunks of `zero_tile` are copied with src_bytes 0
// (zero-filled).
struct StreamKernel {
  static constexpr bool kUsesBarrier = true;
  const float* src;
  float* out;
  int tiles, zero_tile;
  Waits waits;
  CLUSTR_DEVICE void issue(const Thread& t, float* buffer, int tile) const {
    const unsigned i = t.thread_idx().x;
    mma::cp_async16(t, buffer + 4 * i, src + tile * 512 + 4 * i, tile == zero_tile ? 0u : 16u);
    mma::cp_async_commit(t);
  }
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* buffers = t.shared<float>();
    const unsigned i = t.thread_idx().x, next = (i + 1) % 128;
    issue(t, buffers, 0);
    for (int j = 0; j < tiles; ++j) {
      if (j + 1 < tiles) issue(t, buffers + ((j + 1) % 2) * 512, j + 1);
      else mma::cp_async_commit(t);  // an empty group keeps one group per round
      if (waits == Waits::right) mma::cp_async_wait<1>(t);
      if (waits == Waits::one_group_short) mma::cp_async_wait<2>(t);
      if (waits == Waits::never_at_the_end && j + 1 < tiles) mma::cp_async_wait<1>(t);
      t.sync();
      const float* buffer = buffers + (j % 2) * 512;
      for (int k = 0; k < 4; ++k) out[j * 512 + 4 * next + k] = buffer[4 * next + k];
      t.sync();
    }
    if (waits == Waits::none || waits == Waits::one_group_short) mma::cp_async_wait<0>(t);
  }
};

// The three together, as the attention kernels use them: D (16 x 16) = A (16 x 32) B, A and
// B copied to shared memory with cp.async, A's fragments by ldmatrix_x4, B's by ldmatrix_x4
// from B stored transposed (n x k, as K's rows) or by ldmatrix_x4_trans from B stored k x n (as
// V's rows), two n-tiles and two k-steps of mma_bf16. Rows are 80 bytes apart (padded).
struct SmallProductKernel {
  static constexpr bool kUsesBarrier = true;
  static constexpr int kStride = 40;  // elements: 32 and 8 of padding
  const uint16_t* a;  // 16 x 32
  const uint16_t* b;  // 16 x 32 (n x k) when b_rows_are_n, else 32 x 16 (k x n)
  float* d;           // 16 x 16
  bool b_rows_are_n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    uint16_t* sa = t.shared<uint16_t>();
    uint16_t* sb = sa + 16 * kStride;
    const unsigned l = mma::lane(t), g = l / 4, q = l % 4;
    // A: 16 rows of 4 chunks; B: 16 rows of 4 chunks, or 32 rows of 2.
    for (unsigned c = l; c < 64; c += 32)
      mma::cp_async16(t, sa + (c / 4) * kStride + (c % 4) * 8, a + (c / 4) * 32 + (c % 4) * 8, 16);
    for (unsigned c = l; c < 64; c += 32) {
      const unsigned row = b_rows_are_n ? c / 4 : c / 2, chunk = b_rows_are_n ? c % 4 : c % 2;
      const unsigned width = b_rows_are_n ? 32 : 16;
      mma::cp_async16(t, sb + row * kStride + chunk * 8, b + row * width + chunk * 8, 16);
    }
    mma::cp_async_commit(t);
    mma::cp_async_wait<0>(t);
    t.sync();
    mma::FragC acc[2] = {{{0, 0, 0, 0}}, {{0, 0, 0, 0}}};
    for (unsigned kk = 0; kk < 2; ++kk) {
      mma::FragA fa;
      mma::ldmatrix_x4(t, fa.x, sa + (l % 16) * kStride + kk * 16 + 8 * (l / 16));
      uint32_t r[4];
      if (b_rows_are_n) {
        // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        mma::ldmatrix_x4(t, r, sb + ((l % 8) + 8 * (l / 16)) * kStride + kk * 16 + 8 * ((l / 8) % 2));
      } else {
        // matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
        mma::ldmatrix_x4_trans(t, r, sb + (kk * 16 + l % 16) * kStride + 8 * (l / 16));
      }
      const mma::FragB b0{{r[0], r[1]}}, b1{{r[2], r[3]}};
      mma::mma_bf16(t, acc[0], fa, b0);
      mma::mma_bf16(t, acc[1], fa, b1);
    }
    for (unsigned n = 0; n < 2; ++n)
      for (unsigned i = 0; i < 4; ++i)
        d[(g + 8 * (i / 2)) * 16 + n * 8 + 2 * q + i % 2] = acc[n].x[i];
  }
};

// ---- host side -----------------------------------------------------------------------------------

// The device under test can run these (sm_80 or later); the tests return early otherwise.
bool tensor_cores() { return cuda::available() && cuda::device_info().capability >= 80; }

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// n random bf16 bit patterns of values in [-1, 1).
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> h;
  for (float x : random_floats(n, seed)) h.push_back(clustr::float_to_bf16(x));
  return h;
}

Tensor bf16_tensor(const std::vector<uint16_t>& h, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(shape, DType::bf16, Device::cpu);
  std::copy(h.begin(), h.end(), t.bf16());
  return t.to(Device::cuda);
}

uint32_t pair_bits(uint16_t lo, uint16_t hi) { return lo | (static_cast<uint32_t>(hi) << 16); }

// The worst |actual - expected| relative to scale (one number per element) over a product's
// outputs, with the element and both values.
struct Worst {
  double error = 0.0;
  std::string where;
};
Worst worst_error(const std::vector<float>& actual, const std::vector<double>& expected,
                  const std::vector<double>& scale, int64_t cols) {
  Worst w;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double e = std::fabs(actual[i] - expected[i]) / scale[i];
    if (!(e <= w.error)) {  // NaN counts as the worst
      w.error = std::isnan(e) ? INFINITY : e;
      std::ostringstream os;
      os.precision(9);
      os << "(" << i / cols << ", " << i % cols << "): device " << actual[i] << ", model "
         << expected[i];
      w.where = os.str();
    }
  }
  return w;
}

// The bf16 product c + a b of one m16n8k16 tile, through MmaBf16Kernel, against double.
Worst bf16_tile(Fragments how, uint32_t seed) {
  const std::vector<uint16_t> a = random_bf16(256, seed), b = random_bf16(128, seed + 1);
  const std::vector<float> c = random_floats(128, seed + 2);
  Tensor ta = bf16_tensor(a, {16, 16}), tb = bf16_tensor(b, {16, 8});
  Tensor tc = Tensor::from_vector(c, {16, 8}, Device::cuda);
  Tensor td = Tensor::empty({16, 8}, DType::f32, Device::cuda);
  cuda::launch("mma bf16 tile", {1}, {32}, 0,
               MmaBf16Kernel{ta.bf16(), tb.bf16(), tc.f32(), td.f32(), how});
  std::vector<double> expected(128), scale(128);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = c[i * 8 + j], mag = std::fabs(s);
      for (int k = 0; k < 16; ++k) {
        const double p = double(clustr::bf16_to_float(a[i * 16 + k])) *
                         clustr::bf16_to_float(b[k * 8 + j]);
        s += p;
        mag += std::fabs(p);
      }
      expected[i * 8 + j] = s;
      scale[i * 8 + j] = mag;
    }
  return worst_error(td.to_vector(), expected, scale, 8);
}

// x rounded to TF32 as cvt.rna does (to nearest, ties away from zero), in double arithmetic.
double tf32_rna(float x) {
  int e = 0;
  const double m = std::frexp(double(x), &e);  // x = m 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::round(std::ldexp(m, 11)), e - 11);
}

Worst tf32_tile(Fragments how, uint32_t seed) {
  const std::vector<float> a = random_floats(128, seed), b = random_floats(64, seed + 1),
                           c = random_floats(128, seed + 2);
  Tensor ta = Tensor::from_vector(a, {16, 8}, Device::cuda);
  Tensor tb = Tensor::from_vector(b, {8, 8}, Device::cuda);
  Tensor tc = Tensor::from_vector(c, {16, 8}, Device::cuda);
  Tensor td = Tensor::empty({16, 8}, DType::f32, Device::cuda);
  cuda::launch("mma tf32 tile", {1}, {32}, 0,
               MmaTf32Kernel{ta.f32(), tb.f32(), tc.f32(), td.f32(), how});
  std::vector<double> expected(128), scale(128);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = c[i * 8 + j], mag = std::fabs(s);
      for (int k = 0; k < 8; ++k) {
        const double p = tf32_rna(a[i * 8 + k]) * tf32_rna(b[k * 8 + j]);
        s += p;
        mag += std::fabs(p);
      }
      expected[i * 8 + j] = s;
      scale[i * 8 + j] = mag;
    }
  return worst_error(td.to_vector(), expected, scale, 8);
}

// A few float roundings of a sum of 17 terms (the tensor cores' own order and rounding on a GPU,
// k order in float on the emulated device).
constexpr double kProductTol = 1e-6;

std::vector<float> stream(int tiles, int zero_tile, Waits waits, const std::vector<float>& src) {
  Tensor s = Tensor::from_vector(src, {static_cast<int64_t>(src.size())}, Device::cuda);
  Tensor out = Tensor::empty({static_cast<int64_t>(tiles) * 512}, DType::f32, Device::cuda);
  cuda::launch("cp.async stream", {1}, {128}, 2 * 512 * sizeof(float),
               StreamKernel{s.f32(), out.f32(), tiles, zero_tile, waits});
  return out.to_vector();
}

bool any_nan(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return true;
  return false;
}

}  // namespace

TEST_CASE("cuda mma: ldmatrix gives each lane the elements the PTX ISA names, x4 and x2, plain "
          "and transposed") {
  if (!tensor_cores()) return;
  const std::vector<uint16_t> tile = [] {
    std::vector<uint16_t> v(256);
    for (int e = 0; e < 256; ++e) v[e] = static_cast<uint16_t>(0x3000 + e);  // distinct values
    return v;
  }();
  Tensor in = bf16_tensor(tile, {16, 16});
  for (int matrices : {4, 2})
    for (bool trans : {false, true}) {
      CAPTURE(matrices);
      CAPTURE(trans);
      Tensor out = Tensor::zeros({32 * 4}, DType::i32, Device::cuda);
      cuda::launch("ldmatrix", {1}, {32}, 16 * LdmatrixKernel::kStride * 2,
                   LdmatrixKernel{in.bf16(), out.i32(), matrices, trans});
      const std::vector<int32_t> got = out.to_int_vector();
      int wrong = 0;
      std::string first;
      for (int l = 0; l < 32; ++l)
        for (int i = 0; i < matrices; ++i) {
          // Matrix i is the quadrant at rows 8 (i % 2), columns 8 (i / 2); lane l = 4 g + c
          // holds its (g, 2c), (g, 2c + 1), or transposed (2c, g), (2c + 1, g).
          const int g = l / 4, c = l % 4, r0 = 8 * (i % 2), c0 = 8 * (i / 2);
          auto at = [&](int r, int col) { return tile[(r0 + r) * 16 + c0 + col]; };
          const uint32_t want = trans ? pair_bits(at(2 * c, g), at(2 * c + 1, g))
                                      : pair_bits(at(g, 2 * c), at(g, 2 * c + 1));
          const uint32_t have = static_cast<uint32_t>(got[l * 4 + i]);
          if (have != want && wrong++ == 0)
            first = "lane " + std::to_string(l) + " register " + std::to_string(i) + ": " +
                    std::to_string(have) + " instead of " + std::to_string(want);
        }
      CHECK_MESSAGE(wrong == 0, wrong << " registers differ from the model; first: " << first);
    }
}

TEST_CASE("cuda mma: mma.sync m16n8k16 bf16 and m16n8k8 tf32 match the documented fragments; a "
          "planted wrong fragment index is caught") {
  if (!tensor_cores()) return;
  for (uint32_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    const Worst bf = bf16_tile(Fragments::documented, 10 * seed);
    CHECK_MESSAGE(bf.error <= kProductTol, "bf16: worst relative error " << bf.error << " at "
                                                                        << bf.where);
    const Worst tf = tf32_tile(Fragments::documented, 10 * seed);
    CHECK_MESSAGE(tf.error <= kProductTol, "tf32: worst relative error " << tf.error << " at "
                                                                        << tf.where);
  }
  // A's register 1 from row g instead of g + 8: rows 8-15 of the product are wrong by far more
  // than rounding.
  const Worst bf = bf16_tile(Fragments::planted_wrong_index, 7);
  CHECK_MESSAGE(bf.error > 100 * kProductTol, "bf16 planted: " << bf.error);
  const Worst tf = tf32_tile(Fragments::planted_wrong_index, 7);
  CHECK_MESSAGE(tf.error > 100 * kProductTol, "tf32 planted: " << tf.error);
}

TEST_CASE("cuda mma: to_tf32 rounds as cvt.rna.tf32.f32 and pack_bf16 as cvt.rn.bf16x2.f32") {
  // Host and device share these functions: checked here on the host, for every kind of value.
  const float xs[] = {1.0f, 1.00048828125f, 1.000732421875f, -1.000732421875f, 3.14159265f,
                      1e-30f, -7.5e12f, 65504.0f};
  for (float x : xs) {
    CAPTURE(x);
    CHECK(clustr::bits_float(mma::to_tf32(x)) == static_cast<float>(tf32_rna(x)));
  }
  CHECK(mma::to_tf32(INFINITY) == clustr::float_bits(INFINITY));
  const uint32_t p = mma::pack_bf16(1.0f, -2.5f);
  CHECK((p & 0xffffu) == clustr::float_to_bf16(1.0f));
  CHECK((p >> 16) == clustr::float_to_bf16(-2.5f));
}

TEST_CASE("cuda mma: cp.async streams tiles through two buffers, zero-fills, and the three "
          "instructions make a product") {
  if (!tensor_cores()) return;
  const int tiles = 5;
  const std::vector<float> src = random_floats(tiles * 512, 41);
  const std::vector<float> got = stream(tiles, 3, Waits::right, src);
  int wrong = 0;
  for (int j = 0; j < tiles; ++j)
    for (int e = 0; e < 512; ++e)
      wrong += got[j * 512 + e] != (j == 3 ? 0.0f : src[j * 512 + e]);
  CHECK_MESSAGE(wrong == 0, wrong << " streamed elements differ");

  for (bool b_rows_are_n : {true, false}) {
    CAPTURE(b_rows_are_n);
    const std::vector<uint16_t> a = random_bf16(16 * 32, 51), b = random_bf16(16 * 32, 52);
    Tensor ta = bf16_tensor(a, {16, 32}), tb = bf16_tensor(b, {16, 32});
    Tensor td = Tensor::empty({16, 16}, DType::f32, Device::cuda);
    const size_t shared = 2 * 32 * SmallProductKernel::kStride * sizeof(uint16_t);
    cuda::launch("small product", {1}, {32}, shared,
                 SmallProductKernel{ta.bf16(), tb.bf16(), td.f32(), b_rows_are_n});
    std::vector<double> expected(256), scale(256);
    for (int i = 0; i < 16; ++i)
      for (int n = 0; n < 16; ++n) {
        double s = 0.0, mag = 0.0;
        for (int k = 0; k < 32; ++k) {
          const uint16_t bk = b_rows_are_n ? b[n * 32 + k] : b[k * 16 + n];
          const double p = double(clustr::bf16_to_float(a[i * 32 + k])) * clustr::bf16_to_float(bk);
          s += p;
          mag += std::fabs(p);
        }
        expected[i * 16 + n] = s;
        scale[i * 16 + n] = mag > 0 ? mag : 1.0;
      }
    const Worst w = worst_error(td.to_vector(), expected, scale, 16);
    CHECK_MESSAGE(w.error <= kProductTol, "worst relative error " << w.error << " at " << w.where);
  }
}

TEST_CASE("cuda mma: the emulator catches a missing cp.async wait, a wait for too few groups, "
          "and copies never waited for") {
  if (!cuda::emulated()) return;  // a race on a GPU: it may or may not show
  const std::vector<float> src = random_floats(4 * 512, 43);
  // The copies land at the wait: without it, or one group short, the reads see NaN.
  CHECK(any_nan(stream(4, -1, Waits::none, src)));
  CHECK(any_nan(stream(4, -1, Waits::one_group_short, src)));
  CHECK_FALSE(any_nan(stream(4, -1, Waits::right, src)));
  // The last tile's copy (issued in the round before) is never waited for.
  CHECK_THROWS_WITH_AS(stream(4, -1, Waits::never_at_the_end, src),
                       doctest::Contains("cp.async copies it never waited for"), clustr::Error);
}

#endif  // CLUSTR_WITH_CUDA

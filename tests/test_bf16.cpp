// bf16, the storage dtype (core/bf16.h, core/tensor.h): the conversions against references that
// share no code with them, the tensor core's bf16 storage (astype, to_vector, fill, item, views,
// copies), the ops that reject bf16 by name, and BF16 in safetensors files (round trips, a file
// written by an independent Python writer, corrupt files). The device's conversions are in
// test_cuda_convert.cpp.
//
// Two references for float -> bf16 rounding, neither of them core/bf16.h's add-and-shift:
//   - exact arithmetic: the two bf16 neighbours of the value, decoded into doubles (where the
//     differences are exact), the nearer one, a tie to the even one; past the largest finite
//     bf16 the upper neighbour is 2^128, i.e. inf;
//   - where the CPU has AVX512-BF16, the hardware instruction vcvtneps2bf16, which rounds the
//     same way except that it flushes subnormal inputs to zero (so those are left out there).
// Each runs over every upper half of the float32 bit pattern (65536) combined with a set of
// lower halves (ties, neighbours of ties, the extremes, random ones), plus the 2^24 contiguous
// patterns of [0.5, 2): about a second for both in a release build. A case that doctest skips
// by default checks all 2^32 patterns (run it with --no-skip; about a minute).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "autograd/variable.h"
#include "check.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "layers/checkpoint.h"
#include "layers/linear.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;
using clustr::test::error_of;
using clustr::test::TempDir;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

// ---- the exact reference --------------------------------------------------------------------

// The value of a float32 magnitude pattern (sign bit clear, not NaN or inf), decoded from its
// fields: mantissa * 2^(exponent - 150), with the implicit bit for normal numbers.
double f32_magnitude(uint32_t u) {
  const uint32_t e = u >> 23, m = u & 0x7fffffu;
  return e == 0 ? std::ldexp(double(m), -149) : std::ldexp(double(m | 0x800000u), int(e) - 150);
}

// The value of a bf16 magnitude pattern in [0, 0x7f80]: 0x7f80 decodes as 2^128, the value
// after the largest finite bf16 if the exponent had no limit (what rounds there overflows).
double bf16_magnitude(uint32_t h) {
  const uint32_t e = h >> 7, m = h & 0x7fu;
  return e == 0 ? std::ldexp(double(m), -133) : std::ldexp(double(m | 0x80u), int(e) - 134);
}

// float32 pattern -> bf16 pattern, round to nearest, ties to even, by comparing the distances
// to the two neighbours. The doubles hold both values and both differences exactly (at most 25
// significant bits). NaN: the rule core/bf16.h documents (sign and the upper half of the
// payload kept, the quiet bit set).
uint16_t reference_bf16(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7fc0u | ((mag >> 16) & 0x3fu));
  if (mag == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7f80u);
  const uint32_t lo = mag >> 16, hi = lo + 1;  // the bf16 magnitudes at and just above |x|
  const double x = f32_magnitude(mag);
  const double below = x - bf16_magnitude(lo), above = bf16_magnitude(hi) - x;
  const bool up = above < below || (above == below && (lo & 1u) != 0);
  return static_cast<uint16_t>(sign | (up ? hi : lo));
}

// ---- the hardware reference ------------------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
bool has_hardware_bf16() { return __builtin_cpu_supports("avx512bf16"); }

// vcvtneps2bf16 on 16 floats at a time (the tail through a zero-padded block).
__attribute__((target("avx512bf16,avx512f,avx512vl"))) void hardware_bf16(const float* x,
                                                                          uint16_t* y, size_t n) {
  float block[16];
  for (size_t i = 0; i < n; i += 16) {
    const size_t m = n - i < 16 ? n - i : 16;
    const float* src = x + i;
    if (m < 16) {
      std::memset(block, 0, sizeof block);
      std::memcpy(block, x + i, m * sizeof(float));
      src = block;
    }
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(src));
    std::memcpy(y + i, &r, m * sizeof(uint16_t));
  }
}
#else
bool has_hardware_bf16() { return false; }
void hardware_bf16(const float*, uint16_t*, size_t) {}
#endif

// ---- pattern sets ------------------------------------------------------------------------------

// Every upper half combined with lower halves that matter: exact (0), just above it (1), just
// below and at and above the tie (0x7fff, 0x8000, 0x8001), the top (0xffff), four random ones.
std::vector<uint32_t> sampled_patterns() {
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::mt19937 rng(20240611);
  for (int i = 0; i < 4; ++i) lows.push_back(rng() & 0xffffu);
  std::vector<uint32_t> v;
  v.reserve(lows.size() << 16);
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : lows) v.push_back(hi << 16 | lo);
  return v;
}

// The 2^24 patterns of [0.5, 2): every tie, both parities, and the carries into the exponent
// at 1 and 2.
std::vector<uint32_t> contiguous_patterns() {
  std::vector<uint32_t> v(size_t(1) << 24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0x3f000000u + static_cast<uint32_t>(i);
  return v;
}

// got[i] == want[i] for every i; on failure the count and the first few mismatches, with the
// input pattern of each.
void check_patterns(const std::string& what, const std::vector<uint32_t>& in,
                    const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  REQUIRE(got.size() == in.size());
  REQUIRE(want.size() == in.size());
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t w = want[i];
    if (got[i] == w) continue;
    if (bad++ < 5)
      first += "\n  f32 " + hex(in[i], 8) + " (" + std::to_string(float_of(in[i])) + "): got " +
               hex(got[i], 4) + ", expected " + hex(w, 4);
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << in.size()
                               << " patterns rounded wrongly; the first:" << first);
}

// got == want word for word (bf16 or float32 bit patterns); on failure the count and the first
// few differences.
template <class T>
void check_words(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] == want[i]) continue;
    if (bad++ < 5)
      first += "\n  [" + std::to_string(i) + "] got " + hex(got[i], 2 * sizeof(T)) + ", expected " +
               hex(want[i], 2 * sizeof(T));
  }
  CHECK_MESSAGE((bad == 0 && got.size() == want.size()),
                what << ": " << got.size() << " words, expected " << want.size() << "; " << bad
                     << " differ; the first:" << first);
}

std::vector<uint16_t> scalar_bf16(const std::vector<uint32_t>& in) {
  std::vector<uint16_t> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_bf16(float_of(in[i]));
  return out;
}

std::vector<uint16_t> reference_bf16(const std::vector<uint32_t>& in) {
  std::vector<uint16_t> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = reference_bf16(in[i]);
  return out;
}

// A cpu f32 tensor holding the bit patterns as they are (signalling NaNs included).
Tensor f32_of_bits(const std::vector<uint32_t>& in, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  REQUIRE(static_cast<size_t>(t.numel()) == in.size());
  if (!in.empty()) std::memcpy(t.f32(), in.data(), in.size() * 4);
  return t;
}

std::vector<uint16_t> bf16_bits(const Tensor& t) {
  REQUIRE(t.dtype() == DType::bf16);
  const Tensor h = t.to(Device::cpu);
  return std::vector<uint16_t>(h.bf16(), h.bf16() + h.numel());
}

std::vector<uint32_t> f32_bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

Tensor bf16_of_bits(const std::vector<uint16_t>& bits, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  REQUIRE(static_cast<size_t>(t.numel()) == bits.size());
  if (!bits.empty()) std::memcpy(t.bf16(), bits.data(), bits.size() * 2);
  return t;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// A safetensors file with the given header text and data bytes.
std::string safetensors_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return s + header + data;
}

}  // namespace

// ---- the conversions -------------------------------------------------------------------------

TEST_CASE("bf16: float_to_bf16 rounds to nearest even, named cases") {
  struct Case {
    uint32_t in;
    uint16_t want;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1.0 exactly"},
      {0x3f808000, 0x3f80, "a tie, kept bit even: stays"},
      {0x3f818000, 0x3f82, "a tie, kept bit odd: up to even"},
      {0xbf818000, 0xbf82, "a negative tie, kept bit odd: away from zero to even"},
      {0x3f807fff, 0x3f80, "just below a tie: down"},
      {0x3f808001, 0x3f81, "just above a tie: up"},
      {0x3fff8000, 0x4000, "a tie that carries into the exponent: 2.0"},
      {0x3fffffff, 0x4000, "the largest float below 2: 2.0"},
      {0x3f7fffff, 0x3f80, "the largest float below 1: 1.0"},
      {0x7f7f7fff, 0x7f7f, "just below the overflow tie: the largest finite bf16"},
      {0x7f7f8000, 0x7f80, "the overflow tie: inf (the largest finite bf16 is odd)"},
      {0x7f7fffff, 0x7f80, "FLT_MAX: inf"},
      {0xff7f8000, 0xff80, "the negative overflow tie: -inf"},
      {0x7f800000, 0x7f80, "inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x7fc00000, 0x7fc0, "the quiet NaN"},
      {0xffc00000, 0xffc0, "a quiet NaN with the sign set: sign kept"},
      {0x7fc0ffff, 0x7fc0, "a quiet NaN with low payload bits: not rounded into the exponent"},
      {0x7f800001, 0x7fc0, "a signalling NaN, payload only in the low half: NaN, not inf"},
      {0xff800001, 0xffc0, "the same with the sign set"},
      {0x7f80ffff, 0x7fc0, "a signalling NaN, full low payload: NaN, not inf"},
      {0x7fa00000, 0x7fe0, "a signalling NaN, payload in the upper half: kept, quieted"},
      {0xffbfffff, 0xffff, "the largest negative signalling NaN: quieted, upper payload kept"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0: sign kept"},
      {0x00000001, 0x0000, "the smallest subnormal: to +0"},
      {0x80000001, 0x8000, "the smallest negative subnormal: to -0"},
      {0x00008000, 0x0000, "a subnormal tie, kept bit even: +0"},
      {0x00018000, 0x0002, "a subnormal tie, kept bit odd: up"},
      {0x00008001, 0x0001, "just above a subnormal tie: the smallest bf16 subnormal"},
      {0x00010000, 0x0001, "the smallest bf16 subnormal exactly (not flushed)"},
      {0x007fffff, 0x0080, "the largest subnormal: up to FLT_MIN"},
      {0x807f8000, 0x8080, "a negative subnormal tie, kept bit odd: up to -FLT_MIN"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.what));
    const uint16_t got = float_to_bf16(float_of(c.in));
    CHECK_MESSAGE(got == c.want, "f32 " << hex(c.in, 8) << ": got " << hex(got, 4) << ", expected "
                                        << hex(c.want, 4));
    // The exact reference agrees with the table (it is checked here, and used below).
    CHECK_MESSAGE(reference_bf16(c.in) == c.want,
                  "reference for f32 " << hex(c.in, 8) << ": " << hex(reference_bf16(c.in), 4));
  }
  // round_to_bf16 is the value of the rounded pattern.
  CHECK(bits_of(round_to_bf16(float_of(0x3f818000))) == 0x3f820000u);
  CHECK(std::isnan(round_to_bf16(float_of(0x7f800001))));
}

TEST_CASE("bf16: float_to_bf16 and astype match the exact reference on 18 million patterns") {
  for (const auto& [name, in] : {std::pair<std::string, std::vector<uint32_t>>{
                                     "every upper half x 10 lower halves", sampled_patterns()},
                                 {"the 2^24 patterns of [0.5, 2)", contiguous_patterns()}}) {
    CAPTURE(name);
    const std::vector<uint16_t> want = reference_bf16(in);
    check_patterns("float_to_bf16", in, scalar_bf16(in), want);
    // The tensor path (the cpu loop of Tensor::astype, threaded).
    const Tensor t = f32_of_bits(in, {static_cast<int64_t>(in.size())});
    check_patterns("Tensor::astype(bf16)", in, bf16_bits(t.astype(DType::bf16)), want);
  }
}

TEST_CASE("bf16: float_to_bf16 matches the AVX512-BF16 instruction (where the CPU has it)") {
  if (!has_hardware_bf16()) {
    MESSAGE("this CPU has no AVX512-BF16; the comparison with vcvtneps2bf16 is skipped");
    return;
  }
  for (std::vector<uint32_t> in : {sampled_patterns(), contiguous_patterns()}) {
    // vcvtneps2bf16 treats subnormal inputs as zero; those are checked against the exact
    // reference only.
    in.erase(std::remove_if(in.begin(), in.end(),
                            [](uint32_t u) { return (u & 0x7f800000u) == 0 && (u & 0x7fffffu); }),
             in.end());
    std::vector<float> x(in.size());
    std::memcpy(x.data(), in.data(), in.size() * 4);
    std::vector<uint16_t> hw(in.size());
    hardware_bf16(x.data(), hw.data(), x.size());
    check_patterns("float_to_bf16 vs vcvtneps2bf16", in, scalar_bf16(in), hw);
  }
}

TEST_CASE("bf16: float_to_bf16_ftz is float_to_bf16 with subnormals to signed zero, as the "
          "AVX512-BF16 instruction converts (where the CPU has it)") {
  for (const std::vector<uint32_t>& in : {sampled_patterns(), contiguous_patterns()}) {
    std::vector<uint16_t> got(in.size()), want(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const uint32_t u = in[i];
      got[i] = float_to_bf16_ftz(float_of(u));
      // Zero and subnormal inputs: the signed zero; everything else: float_to_bf16.
      want[i] = (u & 0x7f800000u) == 0 ? static_cast<uint16_t>((u >> 16) & 0x8000u)
                                       : float_to_bf16(float_of(u));
    }
    check_patterns("float_to_bf16_ftz", in, got, want);
    if (!has_hardware_bf16()) continue;
    std::vector<float> x(in.size());
    std::memcpy(x.data(), in.data(), in.size() * 4);
    std::vector<uint16_t> hw(in.size());
    hardware_bf16(x.data(), hw.data(), x.size());
    check_patterns("float_to_bf16_ftz vs vcvtneps2bf16", in, got, hw);
  }
}

TEST_CASE("bf16: every float32 pattern against the exact reference" * doctest::skip()) {
  // All 2^32 patterns, in blocks; about a minute on two cores. Run with --no-skip.
  constexpr uint64_t kBlock = uint64_t(1) << 24;
  int64_t bad = 0;
  std::string first;
  for (uint64_t start = 0; start < (uint64_t(1) << 32); start += kBlock) {
    int64_t bad_here = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad_here)
    for (int64_t k = 0; k < int64_t(kBlock); ++k) {
      const uint32_t u = static_cast<uint32_t>(start + uint64_t(k));
      if (float_to_bf16(float_of(u)) != reference_bf16(u)) ++bad_here;
    }
    for (uint64_t k = 0; bad_here > 0 && first.empty() && k < kBlock; ++k) {
      const uint32_t u = static_cast<uint32_t>(start + k);
      const uint16_t got = float_to_bf16(float_of(u)), want = reference_bf16(u);
      if (got != want)
        first = "f32 " + hex(u, 8) + ": got " + hex(got, 4) + ", expected " + hex(want, 4);
    }
    bad += bad_here;
  }
  CHECK_MESSAGE(bad == 0, bad << " of 2^32 float32 patterns round differently from the reference; "
                              << "the first: " << first);
}

TEST_CASE("bf16: bf16 -> f32 is exact for all 65536 patterns; the round trips are identities") {
  int64_t bad_value = 0, bad_bits = 0, bad_trip = 0, bad_nan = 0;
  std::string first;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    // The bits are the pattern followed by 16 zero bits...
    if (bits_of(f) != h << 16) {
      if (bad_bits++ == 0) first += "\n  bits of " + hex(h, 4) + ": " + hex(bits_of(f), 8);
    }
    const uint32_t mag = h & 0x7fffu;
    const bool nan = mag > 0x7f80u;
    if (nan) {
      // ...a NaN stays a NaN with its sign, and converts back with the quiet bit set.
      const uint16_t back = float_to_bf16(f);
      if (!std::isnan(f) || back != (h | 0x0040u)) {
        if (bad_nan++ == 0) first += "\n  NaN " + hex(h, 4) + " came back as " + hex(back, 4);
      }
      continue;
    }
    // ...and the value is the one the fields encode (decoded independently).
    const double want = (h & 0x8000u ? -1.0 : 1.0) *
                        (mag == 0x7f80u ? double(INFINITY) : bf16_magnitude(mag));
    if (double(f) != want) {
      if (bad_value++ == 0)
        first += "\n  value of " + hex(h, 4) + ": " + std::to_string(f) + ", expected " +
                 std::to_string(want);
    }
    // bf16 -> f32 -> bf16 -> f32 -> bf16: the same pattern each time.
    const uint16_t once = float_to_bf16(f), twice = float_to_bf16(bf16_to_float(once));
    if (once != h || twice != h) {
      if (bad_trip++ == 0)
        first += "\n  round trip of " + hex(h, 4) + ": " + hex(once, 4) + ", " + hex(twice, 4);
    }
  }
  CHECK_MESSAGE(bad_bits + bad_value + bad_trip + bad_nan == 0,
                "bits " << bad_bits << ", values " << bad_value << ", round trips " << bad_trip
                        << ", NaNs " << bad_nan << " wrong; the first:" << first);

  // And from the float side: rounding is idempotent on every sampled pattern (NaNs included,
  // once quieted).
  const std::vector<uint32_t> in = sampled_patterns();
  const std::vector<uint16_t> once = scalar_bf16(in);
  std::vector<uint16_t> twice(once.size());
  for (size_t i = 0; i < once.size(); ++i) twice[i] = float_to_bf16(bf16_to_float(once[i]));
  check_patterns("f32 -> bf16 -> f32 -> bf16", in, twice, once);
}

// ---- the tensor core ---------------------------------------------------------------------------

TEST_CASE("bf16 tensors: dtype, size, accessors, memory") {
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(std::string(to_string(DType::bf16)) == "bf16");
  CHECK(std::string(to_string(DType::f32)) == "f32");
  CHECK(std::string(to_string(DType::i32)) == "i32");

  const int64_t before = memory_stats(Device::cpu).live_bytes;
  {
    Tensor t = Tensor::empty({3, 5}, DType::bf16);
    CHECK(t.dtype() == DType::bf16);
    CHECK(t.nbytes() == 30);
    CHECK(memory_stats(Device::cpu).live_bytes == before + 30);
    CHECK(describe(t) == "bf16 (3, 5) on cpu");
    CHECK(t.bf16() == static_cast<uint16_t*>(t.raw()));
    CHECK_ERROR(t.f32(), "Tensor::f32", "bf16 (3, 5) on cpu", "is not f32");
    CHECK_ERROR(t.i32(), "Tensor::i32", "bf16 (3, 5) on cpu", "is not i32");
    CHECK_ERROR(t.to_int_vector(), "is not i32");
  }
  CHECK(memory_stats(Device::cpu).live_bytes == before);
  CHECK_ERROR(Tensor::zeros({2}).bf16(), "Tensor::bf16", "f32 (2,) on cpu", "is not bf16");
  CHECK_ERROR(Tensor::from_int_vector({1}, {1}).bf16(), "Tensor::bf16", "i32", "is not bf16");
  CHECK_ERROR(Tensor().bf16(), "undefined");
}

TEST_CASE("bf16 tensors: astype round trips, to_vector, item") {
  std::vector<float> v = test::random_values(1000, 7, -100.0f, 100.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-45f, 3.4e38f,
                            -3.39e38f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1e-38f};
  for (size_t i = 0; i < std::size(specials); ++i) v[i * 37] = specials[i];
  const Tensor x = Tensor::from_vector(v, {8, 125});

  const Tensor h = x.astype(DType::bf16);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.shape() == x.shape());
  CHECK(h.device() == Device::cpu);
  const std::vector<uint32_t> in = f32_bits(v);
  check_patterns("astype(bf16)", in, bf16_bits(h), reference_bf16(in));

  // bf16 -> f32: each element's exact value; to_vector reads the same values.
  const Tensor back = h.astype(DType::f32);
  CHECK(back.dtype() == DType::f32);
  CHECK(back.shape() == x.shape());
  const std::vector<uint16_t> hb = bf16_bits(h);
  std::vector<uint32_t> want(hb.size());
  for (size_t i = 0; i < hb.size(); ++i) want[i] = uint32_t(hb[i]) << 16;
  check_words("astype(f32)", f32_bits(back.to_vector()), want);
  check_words("to_vector of bf16", f32_bits(h.to_vector()), want);
  // f32 -> bf16 -> f32 -> bf16 keeps the bf16 bits.
  check_words("astype(f32).astype(bf16)", bf16_bits(back.astype(DType::bf16)), hb);

  // item of a one-element bf16 tensor: its exact value.
  CHECK(Tensor::scalar(1.0f / 3).astype(DType::bf16).item() == round_to_bf16(1.0f / 3));
  CHECK(bits_of(Tensor::from_vector({-0.0f}, {1, 1}).astype(DType::bf16).item()) == 0x80000000u);
  CHECK_ERROR(h.item(), "item", "bf16 (8, 125)", "exactly one element");
  CHECK_ERROR(Tensor::from_int_vector({3}, {}).item(), "item", "i32", "not f32 or bf16");
  CHECK_ERROR(Tensor::from_int_vector({3}, {1}).to_vector(), "to_vector", "i32 (1,)",
              "to_int_vector");

  // Empty and rank-0 tensors.
  const Tensor empty = Tensor::empty({0, 4}).astype(DType::bf16);
  CHECK(empty.shape() == Shape{0, 4});
  CHECK(empty.to_vector().empty());
  CHECK(empty.astype(DType::f32).numel() == 0);
}

TEST_CASE("bf16 tensors: astype to the same dtype copies; i32 conversions are errors") {
  const Tensor f = Tensor::from_vector({1.5f, -2.25f}, {2});
  const Tensor h = f.astype(DType::bf16);
  const Tensor i = Tensor::from_int_vector({4, -5}, {2});
  for (const Tensor* t : {&f, &h, &i}) {
    const Tensor c = t->astype(t->dtype());
    CHECK(c.dtype() == t->dtype());
    CHECK_FALSE(c.shares_storage(*t));
    CHECK(std::memcmp(c.raw(), t->raw(), t->nbytes()) == 0);
  }
  CHECK_ERROR(i.astype(DType::bf16), "Tensor::astype", "cannot convert i32 (2,) on cpu to bf16",
              "f32 <-> bf16", "i32 converts to nothing else");
  CHECK_ERROR(i.astype(DType::f32), "Tensor::astype", "cannot convert i32 (2,) on cpu to f32");
  CHECK_ERROR(f.astype(DType::i32), "Tensor::astype", "cannot convert f32 (2,) on cpu to i32");
  CHECK_ERROR(h.astype(DType::i32), "Tensor::astype", "cannot convert bf16 (2,) on cpu to i32");
  CHECK_ERROR(Tensor().astype(DType::bf16), "Tensor::astype", "undefined");
}

TEST_CASE("bf16 tensors: fill and zeros round to nearest even") {
  Tensor t = Tensor::zeros({4, 3}, DType::bf16);
  check_words("zeros", bf16_bits(t), std::vector<uint16_t>(12, 0));
  for (float value : {1.0f / 3, -2.5f, -0.0f, float_of(0x7f7fffff), 1e-40f, -INFINITY,
                      float_of(0x7f800001), float_of(0x3f818000)}) {
    CAPTURE(value);
    t.fill(value);
    const uint16_t want = reference_bf16(bits_of(value));
    const std::vector<uint16_t> got = bf16_bits(t);
    CHECK_MESSAGE(got == std::vector<uint16_t>(12, want),
                  "fill(" << hex(bits_of(value), 8) << "): element 0 " << hex(got[0], 4)
                          << ", expected " << hex(want, 4));
  }
  // A view fills only its rows.
  t.fill(1.0f);
  t.rows(1, 3).fill(-2.0f);
  const std::vector<float> v = t.to_vector();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c)
      CHECK(v[r * 3 + c] == (r == 1 || r == 2 ? -2.0f : 1.0f));
  Tensor empty = Tensor::empty({0}, DType::bf16);
  empty.fill(1.0f);  // nothing to do, no error
}

TEST_CASE("bf16 tensors: views and copies keep the bits") {
  std::vector<uint16_t> bits(24);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3f80 + 3 * i);
  bits[5] = 0x7fc1;  // a NaN payload that a float round trip through arithmetic could lose
  bits[6] = 0x8001;  // a negative subnormal
  const Tensor t = bf16_of_bits(bits, {4, 6});

  // reshape and rows are views: offsets count 2-byte elements.
  const Tensor r = t.reshape({2, -1, 3});
  CHECK(r.shape() == Shape{2, 4, 3});
  CHECK(r.shares_storage(t));
  check_words("reshape", bf16_bits(r), bits);
  const Tensor rows = t.rows(1, 3);
  CHECK(rows.shape() == Shape{2, 6});
  CHECK(rows.bf16() == t.bf16() + 6);
  CHECK(rows.nbytes() == 24);
  check_words("rows(1, 3)", bf16_bits(rows), {bits.begin() + 6, bits.begin() + 18});
  check_words("rows of a view", bf16_bits(rows.reshape({12}).rows(2, 5)),
              {bits.begin() + 8, bits.begin() + 11});

  // clone, to, copy_from: bitwise copies.
  const Tensor c = t.clone();
  CHECK_FALSE(c.shares_storage(t));
  CHECK(c.dtype() == DType::bf16);
  check_words("clone", bf16_bits(c), bits);
  check_words("to(cpu)", bf16_bits(t.to(Device::cpu)), bits);
  Tensor dst = Tensor::zeros({2, 6}, DType::bf16);
  dst.copy_from(t.rows(2, 4));
  check_words("copy_from", bf16_bits(dst), {bits.begin() + 12, bits.end()});
  Tensor f32_dst = Tensor::zeros({2, 6});
  CHECK_ERROR(f32_dst.copy_from(rows), "copy_from", "f32 (2, 6) on cpu", "bf16 (2, 6) on cpu",
              "differ in shape or dtype");
  CHECK_ERROR(dst.copy_from(Tensor::zeros({2, 6})), "copy_from", "differ in shape or dtype");
}

// ---- ops that do not take bf16 --------------------------------------------------------------

TEST_CASE("bf16 tensors: ops that compute in f32 reject bf16, naming the op") {
  const Tensor h = Tensor::zeros({2, 3}, DType::bf16);
  const Tensor f = Tensor::zeros({2, 3});
  const Tensor g3 = Tensor::zeros({3}), b3 = Tensor::zeros({3});
  const Tensor idx = Tensor::from_int_vector({0, 1}, {2});
  struct Case {
    const char* op;
    std::string msg;
  };
  const Case cases[] = {
      {"add", error_of([&] { add(h, f); })},
      {"sub", error_of([&] { sub(f, h); })},
      {"add", error_of([&] { add(f, h); })},
      {"mul", error_of([&] { mul(h, 2.0f); })},
      {"relu", error_of([&] { relu(h); })},
      {"add_", error_of([&] { Tensor d = h; add_(d, f); })},
      {"sum", error_of([&] { sum(h, 0); })},
      {"argmax", error_of([&] { argmax(h, 1); })},
      {"sum_all", error_of([&] { sum_all(h); })},
      {"softmax", error_of([&] { softmax(h); })},
      {"log_softmax", error_of([&] { log_softmax(h); })},
      {"permute", error_of([&] { permute(h, {1, 0}); })},
      {"transpose", error_of([&] { transpose(h, 0, 1); })},
      {"broadcast_to", error_of([&] { broadcast_to(h, {4, 2, 3}); })},
      {"slice", error_of([&] { slice(h, 1, 0, 2); })},
      {"sum_to", error_of([&] { sum_to(h, {3}); })},
      {"slice_add_", error_of([&] { Tensor d = f; slice_add_(d, 1, 0, h); })},
      {"scatter_add_rows_", error_of([&] { Tensor d = f; scatter_add_rows_(d, idx, h); })},
      {"softmax_backward", error_of([&] { softmax_backward(h, f); })},
      {"concat", error_of([&] { concat({h, h}, 0); })},
      {"concat", error_of([&] { concat({f, h}, 0); })},
      {"gather_rows", error_of([&] { gather_rows(h, idx); })},
      {"layer_norm", error_of([&] { layer_norm(h, g3, b3, 1e-5f); })},
      {"layer_norm", error_of([&] { layer_norm(f, g3.astype(DType::bf16), b3, 1e-5f); })},
      {"cross_entropy",
       error_of([&] { cross_entropy(h, idx, Tensor(), -100, Reduction::mean); })},
      {"dropout", error_of([&] { dropout_apply(h, 0.5f, 1, 0); })},
      {"linear_forward", error_of([&] { linear_forward(h, Tensor::zeros({3, 4}), Tensor()); })},
      {"uniform_", error_of([&] { Tensor d = h; Generator gen(1); uniform_(d, gen, 0, 1); })},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.op));
    CHECK_MESSAGE(test::contains_all(c.msg, {c.op, "bf16 (", "on cpu"}),
                  "error message: \"" << c.msg << "\"");
  }
  // The hint of the front doors' dtype checks.
  CHECK_ERROR(add(h, f), "add: expected a to be f32, got bf16 (2, 3) on cpu",
              "convert with astype(DType::f32)");
  CHECK_ERROR(permute(h, {1, 0}), "permute: expected an f32 or i32 tensor, got bf16 (2, 3)",
              "astype(DType::f32)");
  CHECK_ERROR(concat({f, h}, 0), "concat: expected xs[1] to be f32 or i32, got bf16 (2, 3)");
  // Autograd: a bf16 leaf cannot require grad.
  CHECK_ERROR(Variable(h, true), "Variable", "only f32 tensors can require grad", "bf16 (2, 3)");
}

// ---- safetensors -------------------------------------------------------------------------------

TEST_CASE("bf16 safetensors: BF16 beside F32 and I32 round trips bit for bit") {
  TempDir dir;
  const std::string path = dir.file("mixed.safetensors");
  const std::vector<uint16_t> bits = {0x3f80, 0x7fc1, 0xff80, 0x8001, 0x0000, 0x8000, 0x4049,
                                      0x7f7f, 0xabcd};
  const Tensor h = bf16_of_bits(bits, {3, 3});
  const Tensor f = Tensor::from_vector({1.5f, NAN, -0.0f}, {3});
  const Tensor i = Tensor::from_int_vector({-7, 8}, {2, 1});
  const Tensor h0 = Tensor::empty({0, 2}, DType::bf16);
  save_safetensors(path, {{"f", f}, {"h", h}, {"i", i}, {"h.empty", h0}, {"h.view", h.rows(1, 2)}},
                   {{"what", "bf16"}});

  const SafetensorsFile file = load_safetensors(path);
  REQUIRE(file.tensors.size() == 5);
  CHECK(file.get("h").dtype() == DType::bf16);
  CHECK(file.get("h").shape() == Shape{3, 3});
  check_words("h read back", bf16_bits(file.get("h")), bits);
  check_words("h.view read back", bf16_bits(file.get("h.view")),
              {bits.begin() + 3, bits.begin() + 6});
  CHECK(file.get("h.empty").dtype() == DType::bf16);
  CHECK(file.get("h.empty").shape() == Shape{0, 2});
  CHECK(std::memcmp(file.get("f").raw(), f.raw(), f.nbytes()) == 0);
  CHECK(file.get("i").to_int_vector() == std::vector<int32_t>{-7, 8});
  CHECK(file.meta("what") == "bf16");

  // On disk: "BF16", 2 bytes per element, little-endian.
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  for (int k = 7; k >= 0; --k) header_len = header_len << 8 | static_cast<unsigned char>(bytes[k]);
  const std::string header = bytes.substr(8, header_len);
  INFO("header: " << header);
  CHECK(header.find(R"("h":{"data_offsets":[12,30],"dtype":"BF16","shape":[3,3]})") !=
        std::string::npos);
  const size_t h_at = 8 + header_len + 12;
  for (size_t k = 0; k < bits.size(); ++k) {
    CAPTURE(k);
    CHECK(static_cast<unsigned char>(bytes[h_at + 2 * k]) == (bits[k] & 0xff));
    CHECK(static_cast<unsigned char>(bytes[h_at + 2 * k + 1]) == (bits[k] >> 8));
  }
}

TEST_CASE("bf16 safetensors: a file written by an independent Python writer") {
  // tests/fixtures/make_bf16_fixture.py wrote it with struct and json, and rounded `source` to
  // `rounded` with exact rational arithmetic.
  const std::string path = std::string(CLUSTR_FIXTURE_DIR) + "/bf16/mixed.safetensors";
  const SafetensorsFile file = load_safetensors(path);
  CHECK(file.meta("writer") == "make_bf16_fixture.py");
  const Tensor& source = file.get("source");
  const Tensor& rounded = file.get("rounded");
  const Tensor& values = file.get("values");
  REQUIRE(source.dtype() == DType::f32);
  REQUIRE(rounded.dtype() == DType::bf16);
  REQUIRE(values.dtype() == DType::f32);
  REQUIRE(rounded.shape() == source.shape());
  // Our rounding gives Python's bits, and reading BF16 gives its values, bit for bit.
  const std::vector<uint16_t> want = bf16_bits(rounded);
  const std::vector<uint16_t> got = bf16_bits(source.astype(DType::bf16));
  for (int64_t k = 0; k < source.numel(); ++k) {
    const uint32_t in = bits_of(source.f32()[k]);
    CHECK_MESSAGE(got[k] == want[k], "source " << hex(in, 8) << ": clustr " << hex(got[k], 4)
                                               << ", Python " << hex(want[k], 4));
  }
  check_words("BF16 'rounded' read as floats vs F32 'values'", f32_bits(rounded.to_vector()),
              f32_bits(values.to_vector()));
  const Tensor& matrix = file.get("matrix");
  CHECK(matrix.dtype() == DType::bf16);
  CHECK(matrix.shape() == Shape{2, 3});
  check_words("matrix", f32_bits(matrix.to_vector()),
              f32_bits({1.0f, -2.0f, 0.5f, 3.140625f, -0.0f, 65280.0f}));
  CHECK(file.get("index").to_int_vector() == std::vector<int32_t>{7, -1, 123456789});

  // Written again by clustr and read back: the same tensors.
  TempDir dir;
  const std::string again = dir.file("again.safetensors");
  const std::vector<std::pair<std::string, Tensor>> all(file.tensors.begin(), file.tensors.end());
  save_safetensors(again, all, file.metadata);
  const SafetensorsFile reread = load_safetensors(again);
  for (const auto& [name, t] : file.tensors) {
    CAPTURE(name);
    const Tensor& u = reread.get(name);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.shape() == t.shape());
    CHECK(std::memcmp(u.raw(), t.raw(), t.nbytes()) == 0);
  }
}

TEST_CASE("bf16 safetensors: corrupt BF16 entries are rejected with clear errors") {
  TempDir dir;
  int count = 0;
  auto rejected = [&](const std::string& header, const std::string& data,
                      std::initializer_list<const char*> parts) {
    const std::string path = dir.file("bad" + std::to_string(count++) + ".safetensors");
    write_bytes(path, safetensors_file(header, data));
    const std::string msg = error_of([&] { load_safetensors(path); });
    CHECK_MESSAGE((msg.find(path) != std::string::npos && test::contains_all(msg, parts)),
                  "error message: \"" << msg << "\"");
  };
  // An odd byte count: not a whole number of elements.
  rejected(R"({"h": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 5]}})",
           std::string(5, '\0'),
           {"tensor 'h' has data_offsets [0, 5] spanning 5 bytes (not a whole number of 2-byte "
            "BF16 elements), but BF16 shape (3,) needs 6"});
  // F32 data labelled BF16: twice the bytes the shape needs.
  rejected(R"({"h": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})",
           std::string(16, '\0'), {"spanning 16 bytes, but BF16 shape (2, 2) needs 8"});
  // BF16 data labelled F32: half.
  rejected(R"({"h": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})",
           std::string(8, '\0'), {"spanning 8 bytes, but F32 shape (4,) needs 16"});
  // The file ends inside the tensor, or has a byte after it.
  rejected(R"({"h": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}})",
           std::string(5, '\0'), {"past the end of the data section (5 bytes)"});
  rejected(R"({"h": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}})",
           std::string(7, '\0'), {"trailing bytes after the last tensor"});
  // Two BF16 tensors that overlap by one element.
  rejected(R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},)"
           R"( "b": {"dtype": "BF16", "shape": [2], "data_offsets": [2, 6]}})",
           std::string(6, '\0'), {"tensors 'a' and 'b' overlap"});
  // Other 16-bit floats are still not read, and the message lists what is.
  rejected(R"({"h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})",
           std::string(4, '\0'),
           {"tensor 'h' has dtype F16, which clustr does not support (only F32, BF16 and I32)"});
  rejected(R"({"h": {"dtype": "bf16", "shape": [2], "data_offsets": [0, 4]}})",
           std::string(4, '\0'),
           {"tensor 'h' has an unknown dtype \"bf16\" (clustr reads F32, BF16 and I32)"});
}

TEST_CASE("bf16 checkpoints: a bf16 tensor for an f32 parameter is a dtype mismatch") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  Generator gen(3);
  Linear model(4, 2, true, gen);
  const std::vector<float> before = model.weight().data().to_vector();

  // Extras may be bf16: they come back as they were saved.
  const Tensor extra = Tensor::from_vector({0.1f, 0.2f}, {2}).astype(DType::bf16);
  save_checkpoint(path, model, {0, {}, {{"optimizer.extra", extra}}, std::nullopt});
  const LoadedCheckpoint loaded = load_checkpoint(path, model);
  REQUIRE(loaded.extras.count("optimizer.extra"));
  check_words("bf16 extra", bf16_bits(loaded.extras.at("optimizer.extra")), bf16_bits(extra));

  // The weight stored as bf16: refused by name, and the model left as it was.
  SafetensorsFile file = load_safetensors(path);
  std::vector<std::pair<std::string, Tensor>> tensors(file.tensors.begin(), file.tensors.end());
  for (auto& [name, t] : tensors)
    if (name == "weight") t = t.astype(DType::bf16);
  save_safetensors(path, tensors, file.metadata);
  CHECK_ERROR(load_checkpoint(path, model),
              "tensor 'weight' has the wrong dtype: expected f32, found bf16");
  CHECK(model.weight().data().to_vector() == before);
}

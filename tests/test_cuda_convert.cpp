// bf16 on the device: the conversion kernels (core/cuda/convert.cu) and the bf16 fill against
// the cpu, bit for bit, through cuda::f32_to_bf16 / bf16_to_f32 / fill_u16 and through the
// tensor core (astype, fill, to_vector, item, copies). Both devices evaluate core/bf16.h's
// functions, integer operations only, so they must agree exactly on a GPU as in emulation,
// NaN payloads, infinities and subnormals included. The rounding itself is checked against
// independent references in test_bf16.cpp.
// Part of the test_cuda program (tests/test_cuda.cpp has its main): run on a GPU or on the
// emulated device, skipped elsewhere.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Shape;
using clustr::Tensor;
namespace cuda = clustr::cuda;

namespace {

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every upper half of a float32 pattern with lower halves that matter (exact, ties and their
// neighbours, the top, two random ones): 524288 patterns with every NaN, inf, subnormal and
// zero class in both signs.
std::vector<uint32_t> patterns() {
  std::vector<uint32_t> lows = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  std::mt19937 rng(7);
  for (int i = 0; i < 2; ++i) lows.push_back(rng() & 0xffffu);
  std::vector<uint32_t> v;
  v.reserve(lows.size() << 16);
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : lows) v.push_back(hi << 16 | lo);
  return v;
}

Tensor f32_of_bits(const std::vector<uint32_t>& bits, Device d) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())});
  if (!bits.empty()) std::memcpy(t.f32(), bits.data(), bits.size() * 4);
  return t.to(d);
}

Tensor bf16_of_bits(const std::vector<uint16_t>& bits, Device d) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::bf16);
  if (!bits.empty()) std::memcpy(t.bf16(), bits.data(), bits.size() * 2);
  return t.to(d);
}

template <class T>
std::vector<T> host_words(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  std::vector<T> out(static_cast<size_t>(h.numel()));
  if (!out.empty()) std::memcpy(out.data(), h.raw(), h.nbytes());
  return out;
}

// device (got) == cpu (expected) word for word; on failure the count and the first few, with
// their inputs.
template <class T, class In>
void check_same_words(const std::string& what, const std::vector<In>& in,
                      const std::vector<T>& device, const std::vector<T>& cpu) {
  REQUIRE(device.size() == cpu.size());
  REQUIRE(in.size() == cpu.size());
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (device[i] == cpu[i]) continue;
    if (bad++ < 5)
      first += "\n  [" + std::to_string(i) + "] input " + hex(in[i], 2 * sizeof(In)) + ": got " +
               hex(device[i], 2 * sizeof(T)) + ", expected " + hex(cpu[i], 2 * sizeof(T));
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << cpu.size()
                               << " elements differ; the first:" << first);
}

// got == want word for word, for copies (the input is the expected word itself).
template <class T>
void check_words(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  check_same_words(what, want, got, want);
}

}  // namespace

TEST_CASE("cuda convert: f32 -> bf16 on the device rounds bit for bit as the cpu") {
  const std::vector<uint32_t> in = patterns();
  const Tensor host = f32_of_bits(in, Device::cpu);
  const Tensor dev = host.to(Device::cuda);
  const std::vector<uint16_t> cpu = host_words<uint16_t>(host.astype(DType::bf16));

  // The scalar function agrees with the cpu tensor path (so either is "the cpu").
  std::vector<uint16_t> scalar(in.size());
  for (size_t i = 0; i < in.size(); ++i) scalar[i] = clustr::float_to_bf16(float_of(in[i]));
  check_same_words("cpu astype vs float_to_bf16", in, cpu, scalar);

  // Through the tensor core: astype on the device, result on the device.
  const Tensor d16 = dev.astype(DType::bf16);
  CHECK(d16.device() == Device::cuda);
  CHECK(d16.dtype() == DType::bf16);
  CHECK(d16.shape() == host.shape());
  check_same_words("Tensor::astype(bf16) on cuda", in, host_words<uint16_t>(d16), cpu);

  // The kernel directly, on an interior range that starts at an odd 2-byte word: the words
  // around it stay untouched.
  const int64_t n = dev.numel();
  Tensor out = bf16_of_bits(std::vector<uint16_t>(in.size(), 0xdead), Device::cuda);
  cuda::f32_to_bf16(dev.f32() + 1, out.bf16() + 1, n - 2);
  std::vector<uint16_t> want = cpu;
  want.front() = want.back() = 0xdead;
  check_same_words("cuda::f32_to_bf16 on [1, n-1)", in, host_words<uint16_t>(out), want);
}

TEST_CASE("cuda convert: bf16 -> f32 on the device is exact for all 65536 patterns") {
  std::vector<uint16_t> in(0x10000);
  for (uint32_t h = 0; h < 0x10000u; ++h) in[h] = static_cast<uint16_t>(h);
  const Tensor host = bf16_of_bits(in, Device::cpu);
  const Tensor dev = host.to(Device::cuda);
  std::vector<uint32_t> exact(in.size());
  for (size_t h = 0; h < in.size(); ++h) exact[h] = uint32_t(in[h]) << 16;

  const Tensor d32 = dev.astype(DType::f32);
  CHECK(d32.device() == Device::cuda);
  CHECK(d32.dtype() == DType::f32);
  check_same_words("Tensor::astype(f32) on cuda", in, host_words<uint32_t>(d32), exact);
  check_same_words("cpu astype(f32)", in, host_words<uint32_t>(host.astype(DType::f32)), exact);

  // to_vector of a device bf16 tensor: the same exact values.
  const std::vector<float> v = dev.to_vector();
  std::vector<uint32_t> vb(v.size());
  std::memcpy(vb.data(), v.data(), v.size() * 4);
  check_same_words("to_vector of a cuda bf16 tensor", in, vb, exact);

  // The kernel directly on an odd interior range.
  Tensor out = Tensor::full({0x10000}, -1.0f, Device::cuda);
  cuda::bf16_to_f32(dev.bf16() + 1, out.f32() + 1, 0x10000 - 2);
  std::vector<uint32_t> want = exact;
  want.front() = want.back() = 0xbf800000u;  // -1.0f
  check_same_words("cuda::bf16_to_f32 on [1, n-1)", in, host_words<uint32_t>(out), want);

  // f32 -> bf16 -> f32 -> bf16 on the device: the bf16 bits come back (NaNs quieted once).
  std::vector<uint16_t> once(in.size());
  for (size_t h = 0; h < in.size(); ++h)
    once[h] = clustr::float_to_bf16(clustr::bf16_to_float(in[h]));
  const Tensor trip = dev.astype(DType::f32).astype(DType::bf16);
  check_same_words("bf16 -> f32 -> bf16 on cuda", in, host_words<uint16_t>(trip), once);
  check_same_words("... and once more", in,
                   host_words<uint16_t>(trip.astype(DType::f32).astype(DType::bf16)), once);
}

TEST_CASE("cuda convert: bf16 fill, zeros, item, views and copies match the cpu") {
  // Rounded up, exact, -0, overflowing to inf, subnormal, -inf, NaNs (a signalling one with its
  // payload in the low half, a negative one), a tie.
  const float values[] = {1.0f / 3, -2.5f, -0.0f, float_of(0x7f7fffff), 1e-40f, -INFINITY, NAN,
                          float_of(0x7f800001), float_of(0xffa00001), float_of(0x3f818000)};
  Tensor dev = Tensor::zeros({3, 1001}, DType::bf16, Device::cuda);
  check_words("zeros", host_words<uint16_t>(dev), std::vector<uint16_t>(3003, 0));
  Tensor cpu = Tensor::empty({3, 1001}, DType::bf16);
  for (float value : values) {
    uint32_t vb;
    std::memcpy(&vb, &value, 4);
    CAPTURE(hex(vb, 8));
    dev.fill(value);
    cpu.fill(value);
    const std::vector<uint16_t> c = host_words<uint16_t>(cpu);
    CHECK(c.front() == clustr::float_to_bf16(value));
    check_same_words("fill", std::vector<uint32_t>(c.size(), vb), host_words<uint16_t>(dev), c);
  }
  // A view fills only its row; past one grid's worth of threads.
  dev.fill(1.0f);
  dev.rows(1, 2).fill(-7.0f);
  std::vector<float> want(3003, 1.0f);
  std::fill(want.begin() + 1001, want.begin() + 2002, -7.0f);
  CHECK_CLOSE(dev.to_vector(), want, 0.0, 0.0);
  Tensor big = Tensor::empty({1'100'003}, DType::bf16, Device::cuda);
  big.fill(0.1f);
  const std::vector<uint16_t> bw = host_words<uint16_t>(big);
  CHECK(std::count(bw.begin(), bw.end(), clustr::float_to_bf16(0.1f)) == 1'100'003);

  // item, memory, copies.
  CHECK(Tensor::scalar(0.1f, Device::cuda).astype(DType::bf16).item() ==
        clustr::round_to_bf16(0.1f));
  const int64_t live = clustr::memory_stats(Device::cuda).live_bytes;
  {
    Tensor t = Tensor::empty({7, 3}, DType::bf16, Device::cuda);
    CHECK(clustr::memory_stats(Device::cuda).live_bytes == live + 42);
  }
  std::vector<uint16_t> bits(24);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x7f81 + 977 * i);
  const Tensor h = bf16_of_bits(bits, Device::cpu).reshape({4, 6});
  const Tensor d = h.to(Device::cuda);
  CHECK(d.dtype() == DType::bf16);
  check_words("to(cuda)", host_words<uint16_t>(d), bits);
  check_words("clone on cuda", host_words<uint16_t>(d.clone()), bits);
  check_words("rows(1, 3) on cuda", host_words<uint16_t>(d.rows(1, 3)),
              {bits.begin() + 6, bits.begin() + 18});
  Tensor into = Tensor::zeros({2, 6}, DType::bf16, Device::cuda);
  into.copy_from(d.rows(2, 4));  // device to device, from a view
  check_words("copy_from device view", host_words<uint16_t>(into), {bits.begin() + 12, bits.end()});
  into.copy_from(h.rows(0, 2));  // host to device
  check_words("copy_from host view", host_words<uint16_t>(into),
              {bits.begin(), bits.begin() + 12});

  // Saved from the device: a host copy goes to the file.
  clustr::test::TempDir dir;
  clustr::save_safetensors(dir.file("d.safetensors"), {{"d", d}});
  check_words("saved from cuda",
              host_words<uint16_t>(clustr::load_safetensors(dir.file("d.safetensors")).get("d")),
              bits);
}

TEST_CASE("cuda convert: conversion errors and empty ranges") {
  const Tensor i = Tensor::from_int_vector({1, 2}, {2}, Device::cuda);
  CHECK_ERROR(i.astype(DType::bf16), "Tensor::astype", "cannot convert i32 (2,) on cuda to bf16");
  CHECK_ERROR(Tensor::zeros({2}, DType::bf16, Device::cuda).astype(DType::i32), "Tensor::astype",
              "bf16 (2,) on cuda to i32");
  CHECK_ERROR(cuda::f32_to_bf16(nullptr, nullptr, -1), "cuda::f32_to_bf16",
              "negative element count -1");
  CHECK_ERROR(cuda::bf16_to_f32(nullptr, nullptr, -3), "cuda::bf16_to_f32",
              "negative element count -3");
  CHECK_ERROR(cuda::fill_u16(nullptr, 0, -2), "cuda::fill_u16", "negative element count -2");
  cuda::f32_to_bf16(nullptr, nullptr, 0);  // n == 0: no-ops, even without memory
  cuda::bf16_to_f32(nullptr, nullptr, 0);
  cuda::fill_u16(nullptr, 0, 0);
  const Tensor e = Tensor::empty({0, 3}, DType::f32, Device::cuda).astype(DType::bf16);
  CHECK(e.shape() == Shape{0, 3});
  CHECK(e.device() == Device::cuda);
  CHECK(e.astype(DType::f32).to_vector().empty());
  // An op that computes in f32 names itself and bf16, on the device as on the cpu.
  const Tensor h = Tensor::zeros({2, 3}, DType::bf16, Device::cuda);
  CHECK_ERROR(clustr::softmax(h), "softmax", "bf16 (2, 3) on cuda");
  CHECK_ERROR(clustr::permute(h, {1, 0}), "permute", "bf16 (2, 3) on cuda");
}

// Pieces shared by the clustered attention ops (clustered.cpp, eq. 3-6, and
// improved_clustered{,_cpu}.cpp, eq. 9-11): sizes, kernel parameters, scratch carving, small row
// helpers, the attention-dropout mask, the grouping of queries by cluster, the centroids and
// centroid weights of one (b, h) pair, the argument checks, and the device kernels' parameters.
// Internal to those two files.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence (lengths[b], or S).
//
// Threads: one (b, h) pair per task when there are at least as many pairs as threads; with
// fewer, each pair in turn on all threads (`inner`: cpu::gemm's own threads for the products,
// OpenMP for the per-cluster and per-query loops). Either way gives the same bits
// (docs/ARCHITECTURE.md, "Threads and determinism").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cpu/row_clones.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops_check.h"
#include "core/parallel.h"
#include "core/philox.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "layers/attention/clustered.h"
#include "layers/attention/cuda/clustered.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace clustr::clustered_detail {

struct Dims {
  int64_t B = 0, H = 0, N = 0, S = 0, E = 0, M = 0, C = 0;
};

// What the kernels read besides the tensors; pointers into (b, h)-major buffers.
struct Params {
  const int32_t* lengths = nullptr;  // (B) or null
  const int32_t* assignment = nullptr;  // (B, H, N), values in [-1, C)
  float temperature = 1.0f;          // > 0
  bool bf16 = false;                 // the C x S products with bf16 operands (cluster_product)
};

// Attention dropout (clustered.h, improved_clustered.h): element idx of the mask keeps when
// uint_to_unit(philox4x32(seed, offset + idx / 4).v[idx % 4]) >= p, and a kept weight is
// scaled by 1 / (1 - p). Off when p == 0.
struct Dropout {
  float p = 0.0f, scale = 1.0f;
  uint64_t seed = 0;
  PhiloxOffset offset;
  CLUSTR_HD bool on() const { return p > 0.0f; }
};

inline Dropout dropout_of(float p, uint64_t seed, PhiloxOffset offset) {
  Dropout d;
  d.p = p;
  d.scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  d.seed = seed;
  d.offset = offset;
  return d;
}

// f(c, word) for c < n with the 32-bit word of mask element idx0 + c: one Philox call per four
// elements.
template <class F>
inline void for_each_mask_word(const Dropout& drop, uint64_t idx0, int64_t n, F f) {
  uint64_t idx = idx0;
  int64_t c = 0;
  while (c < n) {
    const Philox4 r = philox4x32(drop.seed, drop.offset.get() + idx / 4);
    for (uint64_t lane = idx % 4; lane < 4 && c < n; ++lane, ++idx, ++c) f(c, r.v[lane]);
  }
}

// y[c] = x[c] scale where mask element idx0 + c keeps, else 0, for c < n (y may be x).
inline void dropout_row(const Dropout& drop, uint64_t idx0, int64_t n, const float* x, float* y) {
  for_each_mask_word(drop, idx0, n, [&](int64_t c, uint32_t word) {
    y[c] = math::dropout_value(x[c], word, drop.p, drop.scale);
  });
}

// Scratch carved from one f32 tensor, so the allocator's statistics count it. Each piece starts
// on a 64-byte line. Run a layout once with a null base to count, then on the tensor.
struct Carve {
  float* base = nullptr;
  int64_t used = 0;  // floats
  float* f32(int64_t n) {
    float* p = base ? base + used : nullptr;
    used += (n + 15) / 16 * 16;
    return p;
  }
  int32_t* i32(int64_t n) { return reinterpret_cast<int32_t*>(f32(n)); }
};

// `layout(Carve&)` describes the pieces; returns the tensor that holds them (keep it alive).
template <class Layout>
inline Tensor carve(Layout layout) {
  Carve count;
  layout(count);
  Tensor t = Tensor::empty({count.used + 1});
  Carve real{t.f32(), 0};
  layout(real);
  return t;
}

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline void fill(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

// fill() shared by the threads when `inner`.
inline void fill_shared(float* x, int64_t n, float value, [[maybe_unused]] bool inner) {
  constexpr int64_t kPiece = 16384;
#pragma omp parallel for schedule(static) if (inner && n > kPiece)
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) fill(x + i0, std::min(kPiece, n - i0), value);
}

// C(rows, cols) = alpha op(A) op(B) + beta C with inner size `inner` (beta = 0: overwritten),
// skipping the empty cases cpu::gemm's leading-dimension checks would refuse (M = 0 gives
// ld = 0).
inline void product(bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner, float alpha,
                    const float* A, int64_t lda, const float* Bm, int64_t ldb, float* Cm,
                    int64_t ldc, float beta = 0.0f) {
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    if (beta == 0.0f)
      for (int64_t r = 0; r < rows; ++r) fill(Cm + r * ldc, cols, 0.0f);
    return;
  }
  cpu::gemm(ta, tb, rows, cols, inner, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
}

// A product of the clustered types' C x S work (the centroids against the keys and what
// follows from Ac: eq. 3, Ac V, the remainder R and their gradients): product(), or under the
// bf16 policy (p.bf16) the bf16 GEMM on the same f32 operands, rounded as it packs them, with
// f32 sums. These are the products that are GEMMs of some size (C x S x E per pair); the
// per-cluster products of improved clustered attention (a cluster's members against its top-k
// keys: a few rows by k) and the hashing stay f32 (docs/ARCHITECTURE.md, "Mixed precision").
inline void cluster_product(const Params& p, bool ta, bool tb, int64_t rows, int64_t cols,
                            int64_t inner, float alpha, const float* A, int64_t lda,
                            const float* Bm, int64_t ldb, float* Cm, int64_t ldc,
                            float beta = 0.0f) {
  if (!p.bf16 || rows == 0 || cols == 0 || inner == 0)
    return product(ta, tb, rows, cols, inner, alpha, A, lda, Bm, ldb, Cm, ldc, beta);
  cpu::gemm_bf16_call({ta, tb, rows, cols, inner, alpha, A, cpu::Operand::f32, lda, Bm,
                       cpu::Operand::f32, ldb, beta, Cm, ldc, cpu::GemmEpilogue{}, nullptr,
                       nullptr});
}

using cpu::kLanes;
using cpu::lanes_sum;

// Row softmax over the first n of x[0..S) (n >= 1), the rest set to 0; numerically stable (the
// max is subtracted, so every exp is <= 1 and the sum is >= 1). A NaN in the row makes the row
// NaN.
inline void softmax_row(float* x, int64_t n, int64_t S) {
  const float mx = cpu::row_max(x, n);
  int64_t c = 0;
  float acc[kLanes] = {};
  for (; c + kLanes <= n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      x[c + k] = math::exp(x[c + k] - mx);
      acc[k] += x[c + k];
    }
  for (; c < n; ++c) {
    x[c] = math::exp(x[c] - mx);
    acc[0] += x[c];
  }
  const float inv = 1.0f / lanes_sum(acc);
  for (c = 0; c < n; ++c) x[c] *= inv;
  fill(x + n, S - n, 0.0f);
}

// Row loops for the callers below, compiled for each instruction set (clustered_rows.cpp).
// softmax_row(x, n, S), as above.
void softmax_row_vectors(float* x, int64_t n, int64_t S);
// g[c] = w[c] (g[c] - sum_l w[l] g[l]) for c < n: the softmax backward of one row.
void softmax_backward_row(const float* w, float* g, int64_t n);
// y[c] += x[c] for c < n.
void add_row(const float* x, int64_t n, float* y);

// The keys of a top-k row T (kw entries, -1 padded): its entries before the first -1.
inline int64_t topk_size(const int32_t* T, int64_t kw) {
  int64_t kk = 0;
  while (kk < kw && T[kk] >= 0) ++kk;
  return kk;
}

// The queries of each cluster of one pair, in query order: order[start[j] .. start[j + 1]).
struct Members {
  int32_t* count = nullptr;  // (C) |j|
  int32_t* start = nullptr;  // (C + 1)
  int32_t* order = nullptr;  // (N) (the valid queries only)
  int64_t largest = 0;       // max |j|
};

// Fills m from the pair's assignment a (N) (a stable counting sort).
inline void group(const Dims& d, const int32_t* a, Members& m) {
  for (int64_t j = 0; j < d.C; ++j) m.count[j] = 0;
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] >= 0) ++m.count[a[i]];
  m.start[0] = 0;
  m.largest = 0;
  for (int64_t j = 0; j < d.C; ++j) {
    m.start[j + 1] = m.start[j] + m.count[j];
    m.largest = std::max<int64_t>(m.largest, m.count[j]);
  }
  for (int64_t j = 0; j < d.C; ++j) m.count[j] = 0;  // reused as the fill position
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] >= 0) m.order[m.start[a[i]] + m.count[a[i]]++] = static_cast<int32_t>(i);
}

// y_j = sum over the members i of cluster j of x_i (rows of width w), summed in query order
// from 0; writes y (C, w), 0 for empty clusters.
inline void sum_members(const Dims& d, const Members& m, const float* x, int64_t w, float* y,
                        [[maybe_unused]] bool inner) {
#pragma omp parallel for schedule(dynamic, 4) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    float* row = y + j * w;
    fill(row, w, 0.0f);
    for (int32_t r = m.start[j]; r < m.start[j + 1]; ++r)
      add_row(x + static_cast<int64_t>(m.order[r]) * w, w, row);
  }
}

// eq. 4-5: Qc_j = (1 / |j|) sum_{i in j} Q_i (summed in query order) for the pair's queries
// q (N, E); writes qc (C, E), 0 for empty clusters.
inline void centroids(const Dims& d, const Members& m, const float* q, float* qc, bool inner) {
  sum_members(d, m, q, d.E, qc, inner);
  for (int64_t j = 0; j < d.C; ++j)
    if (m.count[j] > 1) {
      const float n = static_cast<float>(m.count[j]);
      for (int64_t e = 0; e < d.E; ++e) qc[j * d.E + e] /= n;
    }
}

// eq. 3: Ac = softmax(t Qc K^T) over the L valid keys of keys k (S, E); writes ac (C, S), whose
// masked columns and the rows of empty clusters (or all rows when L = 0) are 0.
inline void centroid_weights(const Dims& d, const Params& p, int64_t L, const float* qc,
                             const int32_t* count, const float* k, float* ac, [[maybe_unused]] bool inner) {
  cluster_product(p, false, true, d.C, L, d.E, p.temperature, qc, d.E, k, d.E, ac, d.S);
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    float* row = ac + j * d.S;
    if (count[j] == 0 || L == 0)
      fill(row, d.S, 0.0f);
    else
      softmax_row_vectors(row, L, d.S);
  }
}

// Softmax backward of eq. 3 in place, row by row: g = w (g - sum_l w[l] g[l]) over the L valid
// columns of g (C, S), w = Ac (C, S) (an empty cluster has w = 0 and gets 0).
inline void softmax_backward_rows(const Dims& d, int64_t L, const float* w, float* g,
                                  [[maybe_unused]] bool inner) {
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t j = 0; j < d.C; ++j) softmax_backward_row(w + j * d.S, g + j * d.S, L);
}

using detail::check_f32;

// Names the first value of assignment (B, H, N) outside [-1, C) (a host copy of a device one).
inline void check_assignment_values(const char* op, const Tensor& assignment, const Dims& d) {
  std::vector<int32_t> copy;
  const int32_t* a = detail::host_i32(assignment, copy);
  for (int64_t i = 0; i < d.B * d.H * d.N; ++i)
    CLUSTR_CHECK(a[i] >= -1 && a[i] < d.C, op, ": assignment value ", a[i], " at (",
                 i / (d.H * d.N), ", ", i / d.N % d.H, ", ", i % d.N, ") is outside [-1, C = ",
                 d.C, ") (-1 marks a padded query)");
}

// Checks dtypes, devices, shapes, lengths (values in [0, S]), the assignment (values in
// [-1, C)), C and the temperature against Q's shape (B, H, N, E); returns the sizes. Tensors on
// the CUDA device are refused unless `cuda_ok` (the op has device kernels); a device
// assignment's values are checked by device_params' grouping (below). Without
// `assignment_values` the assignment's values are not looked at (a backward on the device that
// reuses its forward's grouping of the same, checked, assignment).
inline Dims check_inputs(const char* op, const Shape& q_shape, const Tensor& K, const Tensor& V,
                  const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                  float temperature, bool cuda_ok = false, bool assignment_values = true) {
  check_f32(op, "K", K);
  check_f32(op, "V", V);
  detail::check_dtype(op, "assignment", assignment, DType::i32);
  detail::check_same_device(op, K, V);
  detail::check_same_device(op, K, assignment);
  if (!cuda_ok) detail::require_cpu(op, K);
  const std::string Q = "Q " + to_string(q_shape);
  CLUSTR_CHECK(q_shape.size() == 4, op, ": expected Q of shape (B, H, N, E), got ", Q);
  Dims d;
  d.B = q_shape[0], d.H = q_shape[1], d.N = q_shape[2], d.E = q_shape[3], d.C = clusters;
  CLUSTR_CHECK(d.E >= 1, op, ": expected Q with E >= 1 (the last axis), got ", Q);
  CLUSTR_CHECK(d.N < INT32_MAX, op, ": expected fewer than 2^31 - 1 queries (N), got ", Q);
  CLUSTR_CHECK(K.rank() == 4 && K.size(0) == d.B && K.size(1) == d.H && K.size(3) == d.E, op,
               ": expected K of shape (B, H, S, E) = (", d.B, ", ", d.H, ", S, ", d.E,
               ") to match ", Q, ", got ", describe(K));
  d.S = K.size(2);
  CLUSTR_CHECK(V.rank() == 4 && V.size(0) == d.B && V.size(1) == d.H && V.size(2) == d.S, op,
               ": expected V of shape (B, H, S, M) = (", d.B, ", ", d.H, ", ", d.S,
               ", M) to match K ", describe(K), ", got ", describe(V));
  d.M = V.size(3);
  CLUSTR_CHECK(clusters >= 1, op, ": expected clusters >= 1, got ", clusters);
  CLUSTR_CHECK(std::isfinite(temperature), op,
               ": expected a finite temperature (<= 0 for 1/sqrt(E)), got ", temperature);
  CLUSTR_CHECK(assignment.shape() == (Shape{d.B, d.H, d.N}), op,
               ": expected assignment of shape (B, H, N) = (", d.B, ", ", d.H, ", ", d.N,
               ") to match ", Q, ", got ", describe(assignment));
  // A device assignment is checked where device_params groups its members (one integer, the
  // count of values outside [-1, C), comes back with no extra launch); only a bad one is
  // copied, to name the first bad value. When the device's checks are deferred, a kernel
  // records the first bad one (the kernels leave such a query's row alone).
  const bool on_device = assignment.device() == Device::cuda;
  if (!assignment_values) {
    // checked by the forward
  } else if (on_device && cuda::deferring_checks()) {
    cuda::check_range_on_device(op, "assignment", assignment.i32(), d.B * d.H * d.N, -1,
                                static_cast<int32_t>(clusters));
  } else if (!on_device) {
    check_assignment_values(op, assignment, d);
  }
  if (lengths.defined()) detail::check_lengths_deferrable(op, lengths, d.B, d.S, "S", "K", K);
  return d;
}

// The temperature the kernels use: the given one, or 1 / sqrt(E) when it is <= 0.
inline float effective_temperature(float temperature, int64_t E) {
  return temperature > 0.0f ? temperature
                            : static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
}

inline Params params_of(const Dims& d, const Tensor& lengths, const Tensor& assignment,
                        float temperature, Precision precision) {
  Params p;
  p.lengths = lengths.defined() ? lengths.i32() : nullptr;
  p.assignment = assignment.i32();
  p.temperature = effective_temperature(temperature, d.E);
  p.bf16 = precision == Precision::bf16;
  return p;
}

inline void check_saved(const char* op, const char* what, const Tensor& t, const Tensor& like,
                 DType dtype, const Shape& shape) {
  detail::check_dtype(op, what, t, dtype);
  detail::check_same_device(op, like, t);
  CLUSTR_CHECK(t.shape() == shape, op, ": expected ", what, " of shape ", to_string(shape),
               ", got ", describe(t));
}

// Queries, keys and values stacked as one tensor (3, B, H, N, E), as one projection of the
// tokens makes them: views of its three slices (no copy).
struct Stacked {
  Tensor q, k, v;
};
inline Stacked unstack(const char* op, const Tensor& qkv) {
  CLUSTR_CHECK(qkv.defined() && qkv.rank() == 5 && qkv.size(0) == 3, op,
               ": expected queries, keys and values stacked as (3, B, H, N, E), got ",
               qkv.defined() ? describe(qkv) : "undefined");
  const Shape s{qkv.size(1), qkv.size(2), qkv.size(3), qkv.size(4)};
  return {qkv.rows(0, 1).reshape(s), qkv.rows(1, 2).reshape(s), qkv.rows(2, 3).reshape(s)};
}

// A gradient for QKV stacked (3, B, H, N, E), Q of shape (B, H, N, E) like `q`: the tensor, and
// its slices as the `into` of a backward (ClusteredAttentionGrads or its improved twin).
template <class Grads>
Tensor stacked_grads(const char* op, const Tensor& q, Grads& into) {
  Tensor g = Tensor::empty({3, q.size(0), q.size(1), q.size(2), q.size(3)}, DType::f32,
                           q.device());
  const Stacked s = unstack(op, g);
  into = {s.q, s.k, s.v};
  return g;
}

// Whether a node is needed for any of `inputs` (record_needed over a vector).
inline bool any_record_needed(const std::vector<Variable>& inputs) {
  for (const Variable& x : inputs)
    if (record_needed({&x})) return true;
  return false;
}

// A backward's gradient for `like`: `into` when defined (of like's shape, on its device: the
// caller's buffer, e.g. a slice of a stacked gradient), else a new tensor.
inline Tensor grad_buffer(const char* op, const char* what, const Tensor& into, const Shape& shape,
                          const Tensor& like) {
  if (!into.defined()) return Tensor::empty(shape, DType::f32, like.device());
  check_saved(op, what, into, like, DType::f32, shape);
  return into;
}

// The device kernels' parameters (cuda/clustered.h): the members of each cluster grouped on
// the device (cuda::group_members: the arrays of the CPU's group(), so sums over members run
// in the CPU's order); the lengths on both sides.
struct DeviceParams {
  std::vector<int32_t> lengths_host;
  Tensor count, start, order;  // i32 on the device: (B, H, C), (B, H, C + 1), (B, H, N)
  cuda::ClusteredParams p;
};
// With `start` defined, (count, start, order) are this assignment's grouping already (a
// forward's, which its backward reuses); otherwise the members are grouped here, and the
// grouping's count of values outside [-1, C) checks the assignment (check_inputs left it here;
// deferred checks read it on the device instead).
inline void device_params(const char* op, const Dims& d, const Tensor& lengths,
                          const Tensor& assignment, float temperature,
                          const ClusteredDropout& dropout, Precision precision, DeviceParams& r,
                          const Tensor& count = Tensor(), const Tensor& start = Tensor(),
                          const Tensor& order = Tensor()) {
  const int64_t BH = d.B * d.H;
  if (start.defined()) {
    r.count = count, r.start = start, r.order = order;
  } else {
    // + each pair's count of values outside [-1, C)
    const Tensor counts = Tensor::empty({BH * (d.C + 1)}, DType::i32, Device::cuda);
    r.count = counts.rows(0, BH * d.C).reshape({d.B, d.H, d.C});
    r.start = Tensor::empty({BH * (d.C + 1)}, DType::i32, Device::cuda);
    r.order = Tensor::empty({BH * d.N}, DType::i32, Device::cuda);
    cuda::group_members({d.B, d.H, d.N, d.S, d.E, d.M, d.C}, assignment.i32(), counts.i32(),
                        r.start.i32(), r.order.i32());
    if (!cuda::deferring_checks() && BH > 0) {
      std::vector<int32_t> bad(static_cast<size_t>(BH));
      cuda::copy_d2h(bad.data(), counts.i32() + BH * d.C, bad.size() * sizeof(int32_t));
      if (std::any_of(bad.begin(), bad.end(), [](int32_t b) { return b > 0; }))
        check_assignment_values(op, assignment, d);
    }
  }
  if (lengths.defined()) {
    // The GEMMs are sized per run of equal lengths from a host copy, except in a step that
    // must not wait for the host (cuda::deferring_checks(): a graph's capture): there they span
    // all S keys and the kernels' masks, which read the lengths on the device, write zeros for
    // the padded keys' weights, their dropped-out copies and their gradients. The sums then hold
    // extra zero terms: the same values, and the same bits where a product sums in order (the
    // emulator) or every length is S.
    if (!cuda::deferring_checks()) {
      r.lengths_host = lengths.to_int_vector();
      r.p.lengths_host = r.lengths_host.data();
    }
    r.p.lengths = lengths.i32();
  }
  r.p.assignment = assignment.i32();
  r.p.count = r.count.i32();
  r.p.start = r.start.i32();
  r.p.order = r.order.i32();
  r.p.temperature = effective_temperature(temperature, d.E);
  r.p.dropout = dropout.p;
  r.p.seed = dropout.seed;
  r.p.offset = dropout.offset;
  r.p.bf16 = precision == Precision::bf16;
}

inline Tensor device_workspace(int64_t floats) {
  return Tensor::empty({floats > 0 ? floats : 1}, DType::f32, Device::cuda);
}

}  // namespace clustr::clustered_detail

// CUDA kernels of lsh and shared-full attention (reformer_cuda.h gives the contract, reformer.h
// the semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in
// device emulation.
//
// Legend as in reformer_cuda.h; L the valid positions of a pair (lengths[b], or N), a and b
// sorted positions (indices into a round's order), i and j the positions they hold.
//
// Every sum has one owner, so nothing needs atomics and the result is the same run after run:
//   - unit keys and buckets: a thread per position (per position and round);
//   - the sort: a thread per (pair, round), a counting sort over the pair's valid positions;
//   - forward, one launch per round: a thread per query updates that query's online softmax
//     (running max, sum and weighted sum of values, kept across the rounds' launches), reading
//     the keys of its chunk and the one before; a last launch divides;
//   - backward, two launches per round: a thread per query adds its dq; a thread per key adds its
//     dv and dk over the queries that see it (its own chunk's and the next chunk's); a last
//     launch takes dk through the normalisation into dq.
// Each thread walks its keys one by one (no shared-memory tiles): a plain first version, whose
// speed on a GPU is still to be measured.
#include "layers/attention/reformer_cuda.h"

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"
#include "layers/attention/reformer_mask.h"

namespace clustr::cuda {

namespace {

constexpr unsigned kChunkThreads = 64;

CLUSTR_DEVICE int64_t valid_positions(const int32_t* lengths, int64_t bh, int64_t H, int64_t N) {
  return lengths ? lengths[bh / H] : N;
}

CLUSTR_DEVICE float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// The dropout factor of query position i and key position j (pair-major indices bh N + i and
// bh N + j) in round x (reformer.h's mask); 1 without dropout.
CLUSTR_DEVICE float keep_factor(const ReformerDropout& drop, int64_t i, int64_t j, int64_t N,
                                int64_t X, int64_t x) {
  if (drop.p <= 0.0f) return 1.0f;
  const uint64_t idx = reformer_detail::mask_index(N, X, i / N, x, i % N, j % N);
  return reformer_detail::keep_factor(drop.seed, drop.offset, idx, drop.p, drop.scale);
}

// k = q / |q| (0 for q = 0) and |q|, a thread per position of every pair.
struct UnitKeyKernel {
  static constexpr bool kUsesBarrier = false;
  const float* q;
  float *k, *norm;
  int64_t E, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      const float* qp = q + p * E;
      double s = 0.0;
      for (int64_t e = 0; e < E; ++e) s += double(qp[e]) * qp[e];
      const float n = static_cast<float>(::sqrt(s));
      norm[p] = n;
      const float inv = n > 0.0f ? 1.0f / n : 0.0f;
      for (int64_t e = 0; e < E; ++e) k[p * E + e] = qp[e] * inv;
    }
  }
};

// Each position's bucket in each round, a thread per (pair, round, position): the argmax of
// [k W, -k W] (ties: the lower index); -1 where padded, 0 for everyone with one bucket.
struct HashKernel {
  static constexpr bool kUsesBarrier = false;
  const float *k, *W;  // W (X, E, R / 2), or null (R = 1)
  const int32_t* lengths;
  int32_t* bucket;  // (B, H, X, N)
  int64_t H, N, E, X, R, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t half = R / 2;
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      const int64_t j = p % N, x = (p / N) % X, bh = p / (N * X);
      if (j >= valid_positions(lengths, bh, H, N)) {
        bucket[p] = -1;
        continue;
      }
      if (R == 1) {
        bucket[p] = 0;
        continue;
      }
      const float* kj = k + (bh * N + j) * E;
      const float* w = W + x * E * half;
      // Each projection once, as the candidates +s (bucket c) and -s (bucket half + c); a tie
      // keeps the lower bucket, as the CPU's scan in bucket order does.
      int32_t arg = 0;
      float best = 0.0f;
      for (int64_t c = 0; c < half; ++c) {
        float s = 0.0f;
        for (int64_t e = 0; e < E; ++e) s += kj[e] * w[e * half + c];
        // Every bucket seen so far is below c or a negative one above it; half + c is above all.
        if (c == 0 || s > best || (s == best && c < arg)) best = s, arg = int32_t(c);
        if (-s > best) best = -s, arg = int32_t(half + c);
      }
      bucket[p] = arg;
    }
  }
};

// Each round's order of the valid positions by (bucket, position), a thread per (pair, round):
// a counting sort (count: R + 1 integers of scratch per thread). Entries past L are 0.
struct SortKernel {
  static constexpr bool kUsesBarrier = false;
  const int32_t* bucket;  // (B, H, X, N)
  const int32_t* lengths;
  int32_t *order, *count;  // (B, H, X, N), (B, H, X, R + 1)
  int64_t H, N, X, R, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      const int64_t L = valid_positions(lengths, p / X, H, N);
      const int32_t* b = bucket + p * N;
      int32_t* o = order + p * N;
      int32_t* c = count + p * (R + 1);
      for (int64_t r = 0; r <= R; ++r) c[r] = 0;
      for (int64_t j = 0; j < L; ++j) ++c[b[j] + 1];
      for (int64_t r = 0; r < R; ++r) c[r + 1] += c[r];
      for (int64_t j = 0; j < L; ++j) o[c[b[j]]++] = int32_t(j);
      for (int64_t a = L; a < N; ++a) o[a] = 0;
    }
  }
};

// The online softmax's state: max -inf, sum 0, weighted sum 0, a thread per position.
struct InitKernel {
  static constexpr bool kUsesBarrier = false;
  float *mx, *l, *acc;
  int64_t M, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      mx[p] = -INFINITY;
      l[p] = 0.0f;
      for (int64_t c = 0; c < M; ++c) acc[p * M + c] = 0.0f;
    }
  }
};

// Round x of the forward, one block per (pair, chunk), a thread per query of the chunk: the
// query's scores on the keys of its chunk and the one before (itself left out), folded into its
// online softmax (the sum of the whole weights, the values weighted by the dropped ones).
struct ForwardRoundKernel {
  static constexpr bool kUsesBarrier = false;
  ReformerDropout drop;
  const float *q, *k, *v;
  const int32_t *order, *lengths;
  float *mx, *l, *acc;
  int64_t H, N, E, M, X, m, chunks, x;
  float temperature;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / chunks, c = t.block_idx().x % chunks;
    const int64_t L = valid_positions(lengths, bh, H, N);
    const int64_t q0 = c * m, q1 = q0 + m < L ? q0 + m : L, k0 = c > 0 ? q0 - m : 0;
    const int32_t* o = order + (bh * X + x) * N;
    const float *kb = k + bh * N * E, *vb = v + bh * N * M;
    for (int64_t a = q0 + t.thread_idx().x; a < q1; a += t.block_dim().x) {
      if (q1 - k0 < 2) break;  // nothing but itself
      const int64_t i = bh * N + o[a];
      const float* qi = q + i * E;
      float top = -INFINITY;
      for (int64_t b = k0; b < q1; ++b)
        if (b != a) {
          const float s = temperature * dot(qi, kb + o[b] * E, E);
          top = s > top ? s : top;
        }
      const float m_new = mx[i] > top ? mx[i] : top;
      const float scale = l[i] > 0.0f ? math::exp(mx[i] - m_new) : 0.0f;
      float* ai = acc + i * M;
      for (int64_t cc = 0; cc < M; ++cc) ai[cc] *= scale;
      float sum = 0.0f;
      for (int64_t b = k0; b < q1; ++b) {
        if (b == a) continue;
        const float w = math::exp(temperature * dot(qi, kb + o[b] * E, E) - m_new);
        sum += w;
        const float wd = w * keep_factor(drop, i, bh * N + o[b], N, X, x);
        const float* vj = vb + o[b] * M;
        for (int64_t cc = 0; cc < M; ++cc) ai[cc] += wd * vj[cc];
      }
      l[i] = l[i] * scale + sum;
      mx[i] = m_new;
    }
  }
};

// out = acc / l and z = max + log(l); a query that saw nothing but itself takes its own value
// (z = -inf); padded queries 0. A thread per position.
struct FinishKernel {
  static constexpr bool kUsesBarrier = false;
  const float *v, *mx, *l, *acc;
  const int32_t* lengths;
  float *out, *z;
  int64_t H, N, M, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      const bool valid = p % N < valid_positions(lengths, p / N, H, N);
      const bool own = valid && l[p] == 0.0f;
      for (int64_t c = 0; c < M; ++c)
        out[p * M + c] = !valid ? 0.0f : own ? v[p * M + c] : acc[p * M + c] / l[p];
      z[p] = valid && !own ? mx[p] + logf(l[p]) : -INFINITY;
    }
  }
};

// delta = dout . out, and the gradients' accumulators zeroed; a thread per position.
struct DeltaKernel {
  static constexpr bool kUsesBarrier = false;
  const float *out, *g;
  float *delta, *dq, *dk, *dv;
  int64_t E, M, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      delta[p] = dot(g + p * M, out + p * M, M);
      for (int64_t e = 0; e < E; ++e) dq[p * E + e] = dk[p * E + e] = 0.0f;
      for (int64_t c = 0; c < M; ++c) dv[p * M + c] = 0.0f;
    }
  }
};

// What backward reads of every pair.
struct BackwardArgs {
  ReformerDropout drop;
  const float *q, *k, *v, *g, *z, *delta;
  const int32_t *order, *lengths;
  int64_t H, N, E, M, X, m, chunks, x;
  float temperature;

  // dS of query i (sorted a) and key j: p (dp keep - delta_i), with p = exp(s - z_i), dp =
  // dout_i . v_j and keep the dropout factor; the dropped weight p keep through `weight`.
  CLUSTR_DEVICE float ds(int64_t i, int64_t j, float& weight) const {
    const float p =
        z[i] == -INFINITY ? 0.0f : math::exp(temperature * dot(q + i * E, k + j * E, E) - z[i]);
    const float keep = keep_factor(drop, i, j, N, X, x);
    weight = p * keep;
    return p * (dot(g + i * M, v + j * M, M) * keep - delta[i]);
  }
};

// Round x, a thread per query: dq_i += t sum_j dS_ij k_j.
struct QueryGradKernel {
  static constexpr bool kUsesBarrier = false;
  BackwardArgs a;
  float* dq;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / a.chunks, c = t.block_idx().x % a.chunks;
    const int64_t L = valid_positions(a.lengths, bh, a.H, a.N);
    const int64_t q0 = c * a.m, q1 = q0 + a.m < L ? q0 + a.m : L, k0 = c > 0 ? q0 - a.m : 0;
    const int32_t* o = a.order + (bh * a.X + a.x) * a.N;
    for (int64_t s = q0 + t.thread_idx().x; s < q1; s += t.block_dim().x) {
      const int64_t i = bh * a.N + o[s];
      float* dqi = dq + i * a.E;
      for (int64_t b = k0; b < q1; ++b) {
        if (b == s) continue;
        const int64_t j = bh * a.N + o[b];
        float w;
        const float d = a.temperature * a.ds(i, j, w);
        for (int64_t e = 0; e < a.E; ++e) dqi[e] += d * a.k[j * a.E + e];
      }
    }
  }
};

// Round x, a thread per key (sorted b in chunk c): over the queries that see it, those of chunk c
// and of chunk c + 1, dv_j += p dout_i and dk_j += t dS_ij q_i.
struct KeyGradKernel {
  static constexpr bool kUsesBarrier = false;
  BackwardArgs a;
  float *dk, *dv;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / a.chunks, c = t.block_idx().x % a.chunks;
    const int64_t L = valid_positions(a.lengths, bh, a.H, a.N);
    const int64_t b0 = c * a.m, b1 = b0 + a.m < L ? b0 + a.m : L;
    const int64_t s1 = b0 + 2 * a.m < L ? b0 + 2 * a.m : L;  // the queries that see chunk c
    const int32_t* o = a.order + (bh * a.X + a.x) * a.N;
    for (int64_t b = b0 + t.thread_idx().x; b < b1; b += t.block_dim().x) {
      const int64_t j = bh * a.N + o[b];
      float *dkj = dk + j * a.E, *dvj = dv + j * a.M;
      for (int64_t s = b0; s < s1; ++s) {
        if (s == b) continue;
        const int64_t i = bh * a.N + o[s];
        float w;
        const float d = a.temperature * a.ds(i, j, w);
        for (int64_t cc = 0; cc < a.M; ++cc) dvj[cc] += w * a.g[i * a.M + cc];
        for (int64_t e = 0; e < a.E; ++e) dkj[e] += d * a.q[i * a.E + e];
      }
    }
  }
};

// dq += (dk - k (k . dk)) / |q| (through the normalisation), and dv_i += dout_i where the query
// took its own value; a thread per valid position.
struct GradFinishKernel {
  static constexpr bool kUsesBarrier = false;
  const float *k, *norm, *dk, *g, *z;
  const int32_t* lengths;
  float *dq, *dv;
  int64_t H, N, E, M, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t p = global_x(t); p < total; p += grid_stride_x(t)) {
      if (p % N >= valid_positions(lengths, p / N, H, N)) continue;
      if (z[p] == -INFINITY)
        for (int64_t c = 0; c < M; ++c) dv[p * M + c] += g[p * M + c];
      if (norm[p] == 0.0f) continue;
      const float* kp = k + p * E;
      const float* dkp = dk + p * E;
      const float kd = dot(kp, dkp, E), inv = 1.0f / norm[p];
      for (int64_t e = 0; e < E; ++e) dq[p * E + e] += (dkp[e] - kp[e] * kd) * inv;
    }
  }
};

unsigned blocks(int64_t n) { return elementwise_blocks(n); }

int64_t chunks_of(const ReformerDims& d) { return (d.N + d.m - 1) / d.m; }

unsigned chunk_grid(const ReformerDims& d) {
  return static_cast<unsigned>(d.B * d.H * chunks_of(d));
}

unsigned chunk_threads(const ReformerDims& d) {
  return static_cast<unsigned>(d.m < kChunkThreads ? d.m : kChunkThreads);
}

// Unit keys, buckets and the sorted orders of every round.
void sort_positions(const ReformerDims& d, const int32_t* lengths, const float* Q,
                    const float* rotations, float* k, float* norm, int32_t* bucket,
                    int32_t* order) {
  const int64_t P = d.B * d.H * d.N, PX = P * d.X;
  launch("cuda::reformer (unit keys)", {blocks(P)}, {kElementwiseThreads}, 0,
         UnitKeyKernel{Q, k, norm, d.E, P});
  launch("cuda::reformer (hash)", {blocks(PX)}, {kElementwiseThreads}, 0,
         HashKernel{k, rotations, lengths, bucket, d.H, d.N, d.E, d.X, d.R, PX});
  if (!order) return;
  Scratch<int32_t> count(d.B * d.H * d.X * (d.R + 1));
  launch("cuda::reformer (sort)", {blocks(d.B * d.H * d.X)}, {kElementwiseThreads}, 0,
         SortKernel{bucket, lengths, order, count.get(), d.H, d.N, d.X, d.R, d.B * d.H * d.X});
}

}  // namespace

void reformer_attention_forward(const ReformerDims& d, const int32_t* lengths, float temperature,
                                const ReformerDropout& dropout, const float* Q, const float* V,
                                const float* rotations, float* out, int32_t* order,
                                float* logsumexp) {
  const int64_t P = d.B * d.H * d.N;
  if (P == 0) return;
  Scratch<float> k(P * d.E), norm(P), mx(P), l(P), acc(P * d.M);
  Scratch<int32_t> bucket(P * d.X);
  sort_positions(d, lengths, Q, rotations, k.get(), norm.get(), bucket.get(), order);
  launch("cuda::reformer (init)", {blocks(P)}, {kElementwiseThreads}, 0,
         InitKernel{mx.get(), l.get(), acc.get(), d.M, P});
  for (int64_t x = 0; x < d.X; ++x)
    launch("cuda::reformer (forward round)", {chunk_grid(d)}, {chunk_threads(d)}, 0,
           ForwardRoundKernel{dropout, Q, k.get(), V, order, lengths, mx.get(), l.get(), acc.get(),
                              d.H, d.N, d.E, d.M, d.X, d.m, chunks_of(d), x, temperature});
  launch("cuda::reformer (finish)", {blocks(P)}, {kElementwiseThreads}, 0,
         FinishKernel{V, mx.get(), l.get(), acc.get(), lengths, out, logsumexp, d.H, d.N, d.M, P});
}

void reformer_attention_backward(const ReformerDims& d, const int32_t* lengths, float temperature,
                                 const ReformerDropout& dropout, const float* Q, const float* V,
                                 const float* out, const int32_t* order, const float* logsumexp,
                                 const float* dout, float* dQ, float* dV) {
  const int64_t P = d.B * d.H * d.N;
  if (P == 0) return;
  Scratch<float> k(P * d.E), norm(P), delta(P), dk(P * d.E);
  launch("cuda::reformer (unit keys)", {blocks(P)}, {kElementwiseThreads}, 0,
         UnitKeyKernel{Q, k.get(), norm.get(), d.E, P});
  launch("cuda::reformer (delta)", {blocks(P)}, {kElementwiseThreads}, 0,
         DeltaKernel{out, dout, delta.get(), dQ, dk.get(), dV, d.E, d.M, P});
  BackwardArgs a{};
  a.drop = dropout;
  a.q = Q, a.k = k.get(), a.v = V, a.g = dout, a.z = logsumexp, a.delta = delta.get();
  a.order = order, a.lengths = lengths;
  a.H = d.H, a.N = d.N, a.E = d.E, a.M = d.M, a.X = d.X, a.m = d.m, a.chunks = chunks_of(d);
  a.temperature = temperature;
  for (int64_t x = 0; x < d.X; ++x) {
    a.x = x;
    launch("cuda::reformer (query gradients)", {chunk_grid(d)}, {chunk_threads(d)}, 0,
           QueryGradKernel{a, dQ});
    launch("cuda::reformer (key gradients)", {chunk_grid(d)}, {chunk_threads(d)}, 0,
           KeyGradKernel{a, dk.get(), dV});
  }
  launch("cuda::reformer (gradient finish)", {blocks(P)}, {kElementwiseThreads}, 0,
         GradFinishKernel{k.get(), norm.get(), dk.get(), dout, logsumexp, lengths, dQ, dV, d.H, d.N,
                          d.E, d.M, P});
}

void reformer_buckets(const ReformerDims& d, const int32_t* lengths, const float* Q,
                      const float* rotations, int32_t* buckets) {
  const int64_t P = d.B * d.H * d.N;
  if (P == 0) return;
  Scratch<float> k(P * d.E), norm(P);
  sort_positions(d, lengths, Q, rotations, k.get(), norm.get(), buckets, nullptr);
}

}  // namespace clustr::cuda

// CUDA kernels of lsh and shared-full attention (cuda/reformer.h gives the contract, reformer.h
// the semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in
// device emulation.
//
// Legend as in cuda/reformer.h; L the valid positions of a pair (lengths[b], or N), a and b
// sorted positions (indices into a round's order), i and j the positions they hold.
//
// Every sum has one owner, so nothing needs atomics and the result is the same run after run:
//   - unit keys and buckets: a thread per position (per position and round);
//   - the sort: a block per (pair, round), a stable counting sort: each thread counts the buckets
//     of its own span of positions, a scan over (bucket, span) gives every span its place in
//     each bucket, and each thread places its span's positions in order;
//   - forward, one launch per round: a warp per query updates that query's online softmax
//     (running max, sum and weighted sum of values, kept across the rounds' launches), reading
//     the keys of its chunk and the one before; a last launch divides;
//   - backward, two launches per round: a warp per query adds its dq; a warp per key adds its
//     dv and dk over the queries that see it (its own chunk's and the next chunk's); a last
//     launch takes dk through the normalisation into dq.
// In a warp, lane l holds the entries l, l + 32, ... of a row: every row is read and written
// whole by the warp at once (coalesced), and a dot product is the lanes' partial sums added by a
// butterfly of shuffles, the same in every lane and run after run. The warp walks its keys one
// by one, without shared-memory tiles.
#include "layers/attention/cuda/reformer.h"

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"
#include "layers/attention/reformer_mask.h"

namespace clustr::cuda {

namespace {

constexpr unsigned kWarp = 32;
constexpr unsigned kChunkWarps = 4;  // warps of a (pair, chunk) block
constexpr unsigned kSortThreads = 256;

struct AddFloat {
  CLUSTR_HD float operator()(float a, float b) const { return a + b; }
};

CLUSTR_DEVICE int64_t valid_positions(const int32_t* lengths, int64_t bh, int64_t H, int64_t N) {
  return lengths ? lengths[bh / H] : N;
}

CLUSTR_DEVICE float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// a . b over n entries, lane `lane` of the warp taking entries lane, lane + 32, ...; every lane
// of the warp calls it and gets the same sum.
CLUSTR_DEVICE float warp_dot(const Thread& t, unsigned lane, const float* a, const float* b,
                             int64_t n) {
  float s = 0.0f;
  for (int64_t e = lane; e < n; e += kWarp) s += a[e] * b[e];
  return warp_reduce(t, s, AddFloat{});
}

// y += alpha x over n entries, lane `lane` taking entries lane, lane + 32, ...
CLUSTR_DEVICE void warp_axpy(unsigned lane, float alpha, const float* x, float* y, int64_t n) {
  for (int64_t e = lane; e < n; e += kWarp) y[e] += alpha * x[e];
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

// a[0..n) replaced by the sum of the entries before each (integers: exact); returns their total.
CLUSTR_DEVICE int32_t exclusive_scan(int32_t* a, int64_t n) {
  int32_t before = 0;
  for (int64_t u = 0; u < n; ++u) {
    const int32_t x = a[u];
    a[u] = before;
    before += x;
  }
  return before;
}

// Each round's order of the valid positions by (bucket, position), a block per (pair, round): a
// stable counting sort. Thread s takes the span [j0, j1) of the valid positions (block_span) and
// counts its buckets into count(b, s) (scratch, R x threads integers per block); thread b then
// turns row b into the places of each span's first position of bucket b within the bucket, and
// the bucket's total into shared memory, whose exclusive sum (thread 0) gives each bucket's
// start; thread s then places its span's positions in order. Entries past L are 0.
struct SortKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t* bucket;  // (B, H, X, N)
  const int32_t* lengths;
  int32_t *order, *count;  // (B, H, X, N), (B, H, X, R, threads)
  int64_t H, N, X, R;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t p = t.block_idx().x, S = t.block_dim().x, s = t.thread_idx().x;
    const int64_t L = valid_positions(lengths, p / X, H, N);
    const int32_t* b = bucket + p * N;
    int32_t* o = order + p * N;
    int32_t* c = count + p * R * S;  // c[r * S + s]
    int32_t* start = t.shared<int32_t>();  // (R)
    const Span span = block_span(t, L);
    for (int64_t r = 0; r < R; ++r) c[r * S + s] = 0;
    for (int64_t j = span.begin; j < span.end; ++j) ++c[b[j] * S + s];
    t.sync();
    for (int64_t r = s; r < R; r += S) start[r] = exclusive_scan(c + r * S, S);
    t.sync();
    if (s == 0) exclusive_scan(start, R);
    t.sync();
    for (int64_t j = span.begin; j < span.end; ++j) {
      const int32_t r = b[j];
      o[start[r] + c[r * S + s]++] = int32_t(j);
    }
    for (int64_t a = L + s; a < N; a += S) o[a] = 0;
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

// Round x of the forward, one block per (pair, chunk), a warp per query of the chunk: the
// query's scores on the keys of its chunk and the one before (itself left out), folded into its
// online softmax (the sum of the whole weights, the values weighted by the dropped ones).
struct ForwardRoundKernel {
  static constexpr bool kUsesBarrier = true;  // the warps' shuffles
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
    const unsigned lane = t.thread_idx().x % kWarp, warps = t.block_dim().x / kWarp;
    const int32_t* o = order + (bh * X + x) * N;
    const float *kb = k + bh * N * E, *vb = v + bh * N * M;
    if (q1 - k0 < 2) return;  // nothing but itself (the whole warp leaves together)
    for (int64_t a = q0 + t.thread_idx().x / kWarp; a < q1; a += warps) {
      const int64_t i = bh * N + o[a];
      const float* qi = q + i * E;
      float top = -INFINITY;
      for (int64_t b = k0; b < q1; ++b)
        if (b != a) {
          const float s = temperature * warp_dot(t, lane, qi, kb + o[b] * E, E);
          top = s > top ? s : top;
        }
      // mx[i] and l[i] are read by lane 0 alone, which writes them below, and handed to the
      // warp: a shuffle orders no memory, so another lane's read would race with that write.
      const float mx_i = warp_reduce(t, lane == 0 ? mx[i] : -INFINITY, math::Maximum{});
      const float l_i = warp_reduce(t, lane == 0 ? l[i] : 0.0f, AddFloat{});
      const float m_new = mx_i > top ? mx_i : top;
      const float scale = l_i > 0.0f ? math::exp(mx_i - m_new) : 0.0f;
      float* ai = acc + i * M;
      for (int64_t cc = lane; cc < M; cc += kWarp) ai[cc] *= scale;
      float sum = 0.0f;
      for (int64_t b = k0; b < q1; ++b) {
        if (b == a) continue;
        const float w =
            math::exp(temperature * warp_dot(t, lane, qi, kb + o[b] * E, E) - m_new);
        sum += w;
        warp_axpy(lane, w * keep_factor(drop, i, bh * N + o[b], N, X, x), vb + o[b] * M, ai, M);
      }
      if (lane == 0) {
        l[i] = l_i * scale + sum;
        mx[i] = m_new;
      }
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

  // dS of query i and key j: p (dp keep - delta_i), with p = exp(s - z_i), dp = dout_i . v_j
  // and keep the dropout factor; the dropped weight p keep through `weight`. Every lane of the
  // warp calls it and gets the same values.
  CLUSTR_DEVICE float ds(const Thread& t, unsigned lane, int64_t i, int64_t j,
                         float& weight) const {
    const float s = temperature * warp_dot(t, lane, q + i * E, k + j * E, E);
    const float dp = warp_dot(t, lane, g + i * M, v + j * M, M);
    const float p = z[i] == -INFINITY ? 0.0f : math::exp(s - z[i]);
    const float keep = keep_factor(drop, i, j, N, X, x);
    weight = p * keep;
    return p * (dp * keep - delta[i]);
  }
};

// Round x, a warp per query: dq_i += t sum_j dS_ij k_j.
struct QueryGradKernel {
  static constexpr bool kUsesBarrier = true;  // the warps' shuffles
  BackwardArgs a;
  float* dq;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / a.chunks, c = t.block_idx().x % a.chunks;
    const int64_t L = valid_positions(a.lengths, bh, a.H, a.N);
    const int64_t q0 = c * a.m, q1 = q0 + a.m < L ? q0 + a.m : L, k0 = c > 0 ? q0 - a.m : 0;
    const unsigned lane = t.thread_idx().x % kWarp, warps = t.block_dim().x / kWarp;
    const int32_t* o = a.order + (bh * a.X + a.x) * a.N;
    for (int64_t s = q0 + t.thread_idx().x / kWarp; s < q1; s += warps) {
      const int64_t i = bh * a.N + o[s];
      for (int64_t b = k0; b < q1; ++b) {
        if (b == s) continue;
        const int64_t j = bh * a.N + o[b];
        float w;
        const float d = a.temperature * a.ds(t, lane, i, j, w);
        warp_axpy(lane, d, a.k + j * a.E, dq + i * a.E, a.E);
      }
    }
  }
};

// Round x, a warp per key (sorted b in chunk c): over the queries that see it, those of chunk c
// and of chunk c + 1, dv_j += p dout_i and dk_j += t dS_ij q_i.
struct KeyGradKernel {
  static constexpr bool kUsesBarrier = true;  // the warps' shuffles
  BackwardArgs a;
  float *dk, *dv;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / a.chunks, c = t.block_idx().x % a.chunks;
    const int64_t L = valid_positions(a.lengths, bh, a.H, a.N);
    const int64_t b0 = c * a.m, b1 = b0 + a.m < L ? b0 + a.m : L;
    const int64_t s1 = b0 + 2 * a.m < L ? b0 + 2 * a.m : L;  // the queries that see chunk c
    const unsigned lane = t.thread_idx().x % kWarp, warps = t.block_dim().x / kWarp;
    const int32_t* o = a.order + (bh * a.X + a.x) * a.N;
    for (int64_t b = b0 + t.thread_idx().x / kWarp; b < b1; b += warps) {
      const int64_t j = bh * a.N + o[b];
      for (int64_t s = b0; s < s1; ++s) {
        if (s == b) continue;
        const int64_t i = bh * a.N + o[s];
        float w;
        const float d = a.temperature * a.ds(t, lane, i, j, w);
        warp_axpy(lane, w, a.g + i * a.M, dv + j * a.M, a.M);
        warp_axpy(lane, d, a.q + i * a.E, dk + j * a.E, a.E);
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

// A warp per query of a chunk, up to kChunkWarps warps (a block's size is a multiple of 32).
unsigned chunk_threads(const ReformerDims& d) {
  return kWarp * static_cast<unsigned>(d.m < kChunkWarps ? d.m : kChunkWarps);
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
  Scratch<int32_t> count(d.B * d.H * d.X * d.R * kSortThreads);
  launch("cuda::reformer (sort)", {static_cast<unsigned>(d.B * d.H * d.X)}, {kSortThreads},
         d.R * sizeof(int32_t),
         SortKernel{bucket, lengths, order, count.get(), d.H, d.N, d.X, d.R});
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

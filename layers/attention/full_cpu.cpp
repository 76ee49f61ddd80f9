// CPU kernels of the fused full attention (full_cpu.h gives the contract and the legend).
//
// A task is one query block (Bq rows) of one (b, h). It walks the key tiles (Bk columns) the
// block can see: scores = t Q_blk K_tile^T by cpu::gemm into a Bq x Bk scratch tile, then the
// per-row work (max, exp, sums) in loops that vectorise, then the products with V (forward) or
// with dO, K and Q (backward), again by cpu::gemm. Only the keys a block sees are computed:
// keys >= lengths[b] and, with causal, the tiles past the block's last row are skipped, and
// padded query rows (rows >= lengths[b] when N == S) are left out of the products.
//
// Forward uses the online softmax (Milakov & Gimelshein 2018): each row keeps its running max m
// and sum l; when a tile raises m, the row's accumulated output is multiplied by exp(m_old -
// m_new). Backward (FlashAttention-2) recomputes P = exp(t q . k - lse) tile by tile.
//
// Threads: the tasks are shared by an OpenMP team, and cpu::gemm inside a task runs on the
// calling thread alone (each thread sets its own thread count to 1 inside the region: an
// OpenMP ICV of that thread's task, gone when the region ends). dK and dV are sums over query
// blocks; to keep them race-free and independent of the thread count, the query blocks of each
// (b, h) are dealt round-robin into G chunks (G from the shape only: enough (b, h, chunk) tasks
// for kBackwardTasks threads). Chunk 0 accumulates into dK, dV themselves, chunk g > 0 into a
// scratch copy, and the copies are added in chunk order at the end. With B H >= kBackwardTasks,
// G = 1 and no copy is made. A chunk of a single query block (short sequences) writes its dK
// and dV rows with its products instead of adding to zeroed rows.
//
// Each tensor's rows are found through its HeadStrides (full_cpu.h): the same kernels serve
// contiguous (B, H, N, E) heads and the heads of a fused q | k | v projection in place.
//
// The per-row loops are compiled for AVX-512, AVX2 and plain x86-64 (target_clones: the loader
// picks one for this CPU, as gemm.cpp picks its micro-kernel). They sum in the same order in
// each, but the AVX-512 version fuses multiply-adds, so the last bits can differ between CPUs;
// on one CPU a result never depends on the run or the thread count.
#include "layers/attention/full_cpu.h"

#include <cmath>

#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cpu/row_clones.h"
#include "core/math.h"
#include "core/parallel.h"
#include "core/philox.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace clustr::cpu {

namespace {

// A 128 x 512 tile (256 KiB) keeps the scores, and in backward their gradient too, in a 1 MiB
// L2. On the development machine (6 heads x 64, N = 2048 and 4096) every Bq in 64..256 and Bk
// in 256..2048 timed within the noise of this choice except Bq = 64 (about 15% slower); the
// smaller blocks give more tasks to share among threads.
constexpr int64_t kBlockQ = 128;       // Bq
constexpr int64_t kTileK = 512;        // Bk
constexpr int64_t kBackwardTasks = 8;  // (b, h, chunk) tasks backward aims for

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }  // floats: one cache line

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

struct Layout {
  int64_t bq, bk;    // block rows and tile columns, clipped to N and S
  int64_t qblocks;   // query blocks per (b, h)
};
Layout layout_of(const FullAttentionDims& d) {
  Layout l;
  l.bq = max64(1, min64(kBlockQ, d.N));
  l.bk = max64(1, min64(kTileK, d.S));
  l.qblocks = ceil_div(d.N, l.bq);
  return l;
}

// One product of a task, on the calling thread: cpu::gemm, or with bf16 operands the bf16 GEMM
// on the same f32 operands (rounded as it packs them).
void product(const FullAttentionParams& p, bool trans_a, bool trans_b, int64_t M, int64_t N,
             int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
             float beta, float* C, int64_t ldc) {
  if (!p.bf16) return gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_bf16_call({trans_a, trans_b, M, N, K, alpha, A, Operand::f32, lda, B, Operand::f32, ldb,
                  beta, C, ldc, GemmEpilogue{}, nullptr, nullptr});
}

// Which columns of a tile a row sees: row r (query i0 + r) sees the tile's columns
// c < limit(r), the keys j = k0 + c below `length` and, with causal, not after the query.
struct RowLimits {
  int64_t i0, k0, length;
  bool causal;
  int64_t tc;  // columns in the tile
  int64_t limit(int64_t r) const {
    return max64(0, min64(tc, math::attention_keys_seen(i0 + r, length, causal) - k0));
  }
};

// The rows of one query block that are not padding, and the keys they see.
struct Block {
  int64_t bh, i0, i1;  // (b, h) and the block's rows [i0, i1)
  int64_t rows;        // rows [i0, i0 + rows) are real queries; the rest are padding
  int64_t length;      // keys j < length are valid
  int64_t key_end;     // keys [0, key_end) are seen by some row of the block
};
Block block_of(const FullAttentionDims& d, const FullAttentionParams& p, const Layout& lay,
               int64_t bh, int64_t qb) {
  Block k;
  k.bh = bh;
  k.i0 = qb * lay.bq;
  k.i1 = min64(d.N, k.i0 + lay.bq);
  k.length = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int64_t query_end = (p.lengths && d.N == d.S) ? k.length : d.N;
  k.rows = max64(0, min64(k.i1, query_end) - k.i0);
  // The last real row sees the most keys.
  k.key_end = k.rows == 0 ? 0 : math::attention_keys_seen(k.i0 + k.rows - 1, k.length, p.causal);
  return k;
}

// Dropout words of one row: bits[c] for the element idx0 + c, c < n (full_cpu.h).
void dropout_bits(uint64_t seed, uint64_t offset, uint64_t idx0, int64_t n, uint32_t* bits) {
  uint64_t idx = idx0;
  int64_t c = 0;
  while (c < n) {
    const Philox4 r = philox4x32(seed, offset + idx / 4);
    for (uint64_t lane = idx % 4; lane < 4 && c < n; ++lane, ++idx, ++c) bits[c] = r.v[lane];
  }
}

// One online-softmax step over a tile (rows x tc, row stride ld) of scores s: with m, l (rows)
// the running max and sum of each row, s becomes exp(s - m_new) on the row's visible columns
// and 0 on the others, l = l exp(m - m_new) + sum, and corr = exp(m - m_new) is the factor for
// the row's accumulated output (0 while m = -inf: nothing accumulated yet).
CLUSTR_ROW_CLONES
void softmax_tile(float* s, int64_t ld, int64_t rows, RowLimits lim, float* m, float* l,
                  float* corr) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    const int64_t n = lim.limit(r);
    if (n == 0) {
      for (int64_t c = 0; c < lim.tc; ++c) x[c] = 0.0f;
      corr[r] = 1.0f;
      continue;
    }
    const float mx = math::Maximum{}(m[r], row_max(x, n));
    float acc[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const float e = math::exp(x[c + k] - mx);
        x[c + k] = e;
        acc[k] += e;
      }
    for (; c < n; ++c) {
      const float e = math::exp(x[c] - mx);
      x[c] = e;
      acc[0] += e;
    }
    for (; c < lim.tc; ++c) x[c] = 0.0f;
    const float sum = lanes_sum(acc);
    // exp(-inf) = 0 without the scalar exp: the row's first tile, and so every row of a
    // sequence that fits in one tile.
    corr[r] = m[r] == -INFINITY ? 0.0f : math::exp(m[r] - mx);
    l[r] = l[r] * corr[r] + sum;
    m[r] = mx;
  }
}

// Dropout for the backward tile (identity when p == 0).
struct TileDropout {
  float p = 0.0f, scale = 1.0f;
  uint64_t seed = 0, offset = 0;
  uint64_t idx0 = 0, row_stride = 0;  // element index of the tile's (0, 0), and per row
  uint32_t* bits = nullptr;           // scratch, tile columns
};

// Backward over a tile (rows x tc, row stride ld): s holds the scores t q . k and becomes
// Pd = P keep scale; dp holds dO V^T and becomes dS = P (dp keep scale - D). P = exp(s - lse)
// on the visible columns; every other column of both is 0, as is every column of a row with
// lse = -inf (it saw no key).
// With d_from_tile (no dropout, and the tile holds every key the rows see), D is computed here
// as D_i = sum_j P_ij dP_ij, which equals dO_i . O_i (O = P V) and needs no pass over dO and
// O: their rows are strided and cold in memory, and that pass cost as much as this one.
CLUSTR_ROW_CLONES
void backward_tile(float* s, float* dp, int64_t ld, int64_t rows, RowLimits lim,
                   const float* lse, float* D, bool d_from_tile, const TileDropout& drop) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = s + r * ld;
    float* g = dp + r * ld;
    const float lr = lse[r];
    const int64_t n = lr == -INFINITY ? 0 : lim.limit(r);
    int64_t c = 0;
    if (d_from_tile) {
      float acc[kLanes] = {};
      for (; c + kLanes <= n; c += kLanes)
        for (int k = 0; k < kLanes; ++k) {
          const float pr = math::exp(x[c + k] - lr);
          x[c + k] = pr;
          acc[k] += pr * g[c + k];
        }
      for (; c < n; ++c) {
        x[c] = math::exp(x[c] - lr);
        acc[0] += x[c] * g[c];
      }
      D[r] = lanes_sum(acc);
    }
    const float dr = D[r];
    c = 0;
    if (d_from_tile) {
      for (; c < n; ++c) g[c] = math::softmax_dx(x[c], g[c], dr);
    } else if (drop.p > 0.0f) {
      dropout_bits(drop.seed, drop.offset, drop.idx0 + r * drop.row_stride, n, drop.bits);
      const uint32_t* bits = drop.bits;
      const float p = drop.p, scale = drop.scale;
      for (; c < n; ++c) {
        const float pr = math::exp(x[c] - lr);
        x[c] = math::dropout_value(pr, bits[c], p, scale);
        g[c] = math::softmax_dx(pr, math::dropout_value(g[c], bits[c], p, scale), dr);
      }
    } else {
      for (; c < n; ++c) {
        const float pr = math::exp(x[c] - lr);
        x[c] = pr;
        g[c] = math::softmax_dx(pr, g[c], dr);
      }
    }
    for (; c < lim.tc; ++c) x[c] = g[c] = 0.0f;
  }
}

// D (rows) = the dot products of the rows of a and b (rows, M), rows ld apart.
CLUSTR_ROW_CLONES
void row_dots(const float* a, const float* b, int64_t rows, int64_t M, int64_t ld, float* D) {
  for (int64_t r = 0; r < rows; ++r) D[r] = dot_lanes(a + r * ld, b + r * ld, M);
}

void fill_rows(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

// rows x width elements, rows ld apart, = value.
void fill_strided(float* x, int64_t rows, int64_t width, int64_t ld, float value) {
  for (int64_t r = 0; r < rows; ++r) fill_rows(x + r * ld, width, value);
}

// Per-thread scratch of forward: scores tile, m, l, corr, dropout words.
int64_t forward_scratch(const Layout& lay) {
  return round16(lay.bq * lay.bk) + 3 * round16(lay.bq) + round16(lay.bk);
}
// Of backward: scores tile, dP tile, D, dropout words.
int64_t backward_scratch(const Layout& lay) {
  return 2 * round16(lay.bq * lay.bk) + round16(lay.bq) + round16(lay.bk);
}

void forward_block(const FullAttentionDims& d, const FullAttentionLayout& hl,
                   const FullAttentionParams& p, const Layout& lay, const Block& k,
                   const float* Q, const float* K, const float* V, float* out, float* logsumexp,
                   float* scratch) {
  const int64_t b = k.bh / d.H, h = k.bh % d.H;
  const int64_t row0 = k.bh * d.N + k.i0;  // (b, h, i0) in logsumexp
  const int64_t ldo = hl.o.row;
  float* o = out + hl.o.at(b, h) + k.i0 * ldo;
  float* lse = logsumexp + row0;
  // Padding rows, and rows that see no key: 0 and -inf. (The first key tile's product
  // overwrites the other rows.)
  const int64_t real = k.key_end == 0 ? 0 : k.rows;
  fill_strided(o + real * ldo, k.i1 - k.i0 - real, d.M, ldo, 0.0f);
  fill_rows(lse, k.i1 - k.i0, -INFINITY);
  if (real == 0) return;

  float* s = scratch;
  float* m = s + round16(lay.bq * lay.bk);
  float* l = m + round16(lay.bq);
  float* corr = l + round16(lay.bq);
  uint32_t* bits = reinterpret_cast<uint32_t*>(corr + round16(lay.bq));
  fill_rows(m, k.rows, -INFINITY);
  fill_rows(l, k.rows, 0.0f);
  const float* q = Q + hl.q.at(b, h) + k.i0 * hl.q.row;
  const float* kh = K + hl.k.at(b, h);
  const float* vh = V + hl.v.at(b, h);
  const float scale = 1.0f / (1.0f - p.dropout);
  for (int64_t k0 = 0; k0 < k.key_end; k0 += lay.bk) {
    const int64_t tc = min64(lay.bk, k.key_end - k0);
    const RowLimits lim{k.i0, k0, k.length, p.causal, tc};
    product(p, false, true, k.rows, tc, d.E, p.temperature, q, hl.q.row, kh + k0 * hl.k.row,
         hl.k.row, 0.0f, s, lay.bk);
    softmax_tile(s, lay.bk, k.rows, lim, m, l, corr);
    // The normalised weights are dropped (the sum l above is over all of them), so dropping
    // the unnormalised ones now is the same.
    if (p.dropout > 0.0f)
      for (int64_t r = 0; r < k.rows; ++r) {
        float* x = s + r * lay.bk;
        const int64_t n = lim.limit(r);
        dropout_bits(p.seed, p.offset.value, math::attention_dropout_index(k.bh, d.N, k.i0 + r, d.S, k0),
                     n, bits);
        for (int64_t c = 0; c < n; ++c)
          x[c] = math::dropout_value(x[c], bits[c], p.dropout, scale);
      }
    if (k0 > 0)  // rescale what the earlier tiles accumulated
      for (int64_t r = 0; r < k.rows; ++r)
        if (corr[r] != 1.0f)
          for (int64_t c = 0; c < d.M; ++c) o[r * ldo + c] *= corr[r];
    product(p, false, false, k.rows, d.M, tc, 1.0f, s, lay.bk, vh + k0 * hl.v.row, hl.v.row,
         k0 == 0 ? 0.0f : 1.0f, o, ldo);
  }
  for (int64_t r = 0; r < k.rows; ++r) {
    // l >= 1 for a row that saw a key (its max contributes exp(0)); 0 for one that did not.
    if (l[r] == 0.0f) continue;
    const float inv = 1.0f / l[r];
    for (int64_t c = 0; c < d.M; ++c) o[r * ldo + c] *= inv;
    lse[r] = math::attention_lse(m[r], l[r]);
  }
}

// Where one chunk's gradients of one (b, h) go: dQ rows (the head's own; every chunk writes
// only its own query blocks), and the chunk's dK and dV accumulators, with their row strides.
struct Grads {
  float* dq;
  int64_t ldq;
  float *dk, *dv;
  int64_t ldk, ldv;
};

// With `overwrite` this block is the only one adding into g.dk and g.dv: its products
// overwrite the rows of the keys it sees, and it zeroes the others.
void backward_block(const FullAttentionDims& d, const FullAttentionLayout& hl,
                    const FullAttentionParams& p, const Layout& lay, const Block& k,
                    const float* Q, const float* K, const float* V, const float* out,
                    const float* logsumexp, const float* dout, Grads g, bool overwrite,
                    float* scratch) {
  const int64_t b = k.bh / d.H, h = k.bh % d.H;
  const int64_t row0 = k.bh * d.N + k.i0;
  if (overwrite) {  // keys no query of the block sees
    fill_strided(g.dk + k.key_end * g.ldk, d.S - k.key_end, d.E, g.ldk, 0.0f);
    fill_strided(g.dv + k.key_end * g.ldv, d.S - k.key_end, d.M, g.ldv, 0.0f);
  }
  float* dq = g.dq + k.i0 * g.ldq;
  fill_strided(dq + k.rows * g.ldq, k.i1 - k.i0 - k.rows, d.E, g.ldq, 0.0f);  // padding rows
  if (k.rows == 0) return;
  if (k.key_end == 0) return fill_strided(dq, k.rows, d.E, g.ldq, 0.0f);

  float* s = scratch;
  float* dp = s + round16(lay.bq * lay.bk);
  float* D = dp + round16(lay.bq * lay.bk);
  TileDropout drop;
  if (p.dropout > 0.0f) {
    drop.p = p.dropout;
    drop.scale = 1.0f / (1.0f - p.dropout);
    drop.seed = p.seed;
    drop.offset = p.offset.value;
    drop.row_stride = static_cast<uint64_t>(d.S);
    drop.bits = reinterpret_cast<uint32_t*>(D + round16(lay.bq));
  }
  const int64_t ldq = hl.q.row, ldk = hl.k.row, ldv = hl.v.row, ldo = hl.o.row;
  const float* q = Q + hl.q.at(b, h) + k.i0 * ldq;
  const float* dO = dout + hl.o.at(b, h) + k.i0 * ldo;
  const bool d_from_tile = k.key_end <= lay.bk && p.dropout == 0.0f;  // see backward_tile
  if (!d_from_tile) row_dots(dO, out + hl.o.at(b, h) + k.i0 * ldo, k.rows, d.M, ldo, D);
  const float t = p.temperature;
  for (int64_t k0 = 0; k0 < k.key_end; k0 += lay.bk) {
    const int64_t tc = min64(lay.bk, k.key_end - k0);
    const float* kt = K + hl.k.at(b, h) + k0 * ldk;
    const float* vt = V + hl.v.at(b, h) + k0 * ldv;
    product(p, false, true, k.rows, tc, d.E, t, q, ldq, kt, ldk, 0.0f, s, lay.bk);
    product(p, false, true, k.rows, tc, d.M, 1.0f, dO, ldo, vt, ldv, 0.0f, dp, lay.bk);
    drop.idx0 = math::attention_dropout_index(k.bh, d.N, k.i0, d.S, k0);
    backward_tile(s, dp, lay.bk, k.rows, RowLimits{k.i0, k0, k.length, p.causal, tc},
                  logsumexp + row0, D, d_from_tile, drop);
    // dV_tile += Pd^T dO, dQ_blk (+)= t dS K_tile, dK_tile += t dS^T Q_blk.
    const float beta_kv = overwrite ? 0.0f : 1.0f;
    product(p, true, false, tc, d.M, k.rows, 1.0f, s, lay.bk, dO, ldo, beta_kv, g.dv + k0 * g.ldv,
         g.ldv);
    product(p, false, false, k.rows, d.E, tc, t, dp, lay.bk, kt, ldk, k0 == 0 ? 0.0f : 1.0f, dq,
         g.ldq);
    product(p, true, false, tc, d.E, k.rows, t, dp, lay.bk, q, ldq, beta_kv, g.dk + k0 * g.ldk,
         g.ldk);
  }
}

}  // namespace

int64_t full_attention_backward_chunks(const FullAttentionDims& d) {
  const int64_t pairs = max64(1, d.B * d.H);
  return max64(1, min64(layout_of(d).qblocks, ceil_div(kBackwardTasks, pairs)));
}

int64_t full_attention_forward_workspace(const FullAttentionDims& d, int threads) {
  return forward_scratch(layout_of(d)) * threads;
}

int64_t full_attention_backward_workspace(const FullAttentionDims& d, int threads) {
  const int64_t copies = full_attention_backward_chunks(d) - 1;
  return copies * d.B * d.H * d.S * (d.E + d.M) + backward_scratch(layout_of(d)) * threads;
}

void full_attention_forward(const FullAttentionDims& d, const FullAttentionLayout& hl,
                            const FullAttentionParams& p, const float* Q, const float* K,
                            const float* V, float* out, float* logsumexp, float* workspace,
                            [[maybe_unused]] int threads) {
  const Layout lay = layout_of(d);
  const int64_t tasks = d.B * d.H * lay.qblocks;
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    float* scratch = workspace + thread_id() * forward_scratch(lay);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task)
      forward_block(d, hl, p, lay, block_of(d, p, lay, task / lay.qblocks, task % lay.qblocks),
                    Q, K, V, out, logsumexp, scratch);
  }
}

void full_attention_backward(const FullAttentionDims& d, const FullAttentionLayout& hl,
                             const FullAttentionParams& p, const float* Q, const float* K,
                             const float* V, const float* out, const float* logsumexp,
                             const float* dout, float* dQ, float* dK, float* dV, float* workspace,
                             [[maybe_unused]] int threads) {
  const Layout lay = layout_of(d);
  const int64_t G = full_attention_backward_chunks(d);
  const int64_t pairs = d.B * d.H;
  // Chunk g > 0 accumulates into contiguous copies: its dK (pairs, S, E), then its dV
  // (pairs, S, M).
  const int64_t nk = pairs * d.S * d.E, nv = pairs * d.S * d.M;
  float* copies = workspace;
  float* scratch0 = workspace + (G - 1) * (nk + nv);
  auto dk_row = [&](int64_t pair, int64_t j) {  // row j of dK for (b, h) = pair
    return dK + hl.k.at(pair / d.H, pair % d.H) + j * hl.k.row;
  };
  auto dv_row = [&](int64_t pair, int64_t j) {
    return dV + hl.v.at(pair / d.H, pair % d.H) + j * hl.v.row;
  };
  // A chunk that holds one query block (every chunk when qblocks <= G) writes its dK and dV
  // rows with its products; the others start from zero.
  const bool one_block = lay.qblocks <= G;
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    float* scratch = scratch0 + thread_id() * backward_scratch(lay);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < (G - 1) * (nk + nv); ++i) copies[i] = 0.0f;
    auto run_task = [&](int64_t task) {
      const int64_t bh = task / G, chunk = task % G;
      Grads grads{dQ + hl.q.at(bh / d.H, bh % d.H), hl.q.row, dk_row(bh, 0), dv_row(bh, 0),
                  hl.k.row, hl.v.row};
      if (chunk > 0) {
        float* base = copies + (chunk - 1) * (nk + nv);
        grads.dk = base + bh * d.S * d.E;
        grads.dv = base + nk + bh * d.S * d.M;
        grads.ldk = d.E;
        grads.ldv = d.M;
      } else if (!one_block) {  // this (b, h)'s rows of dK and dV start at 0
        fill_strided(grads.dk, d.S, d.E, grads.ldk, 0.0f);
        fill_strided(grads.dv, d.S, d.M, grads.ldv, 0.0f);
      }
      for (int64_t qb = chunk; qb < lay.qblocks; qb += G)
        backward_block(d, hl, p, lay, block_of(d, p, lay, bh, qb), Q, K, V, out, logsumexp,
                       dout, grads, chunk == 0 && one_block, scratch);
    };
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < pairs * G; ++task) run_task(task);
    if (G > 1) {
      // The copies, added in chunk order, row by row.
#pragma omp for schedule(static)
      for (int64_t r = 0; r < pairs * d.S; ++r) {
        float* k_dst = dk_row(r / d.S, r % d.S);
        float* v_dst = dv_row(r / d.S, r % d.S);
        for (int64_t chunk = 1; chunk < G; ++chunk) {
          const float* base = copies + (chunk - 1) * (nk + nv);
          for (int64_t c = 0; c < d.E; ++c) k_dst[c] += base[r * d.E + c];
          for (int64_t c = 0; c < d.M; ++c) v_dst[c] += base[nk + r * d.M + c];
        }
      }
    }
  }
}

}  // namespace clustr::cpu

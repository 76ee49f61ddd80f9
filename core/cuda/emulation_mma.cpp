// Device emulation of the warp matrix instructions and asynchronous copies of core/cuda/mma.h
// (declared in core/cuda/emulation.h): ldmatrix and mma.sync as warp instructions whose
// completion follows the PTX ISA's fragment layouts element by element, and cp.async as copies
// that land at the wait. Compiled only with -DCLUSTR_CUDA=EMULATE.
#include <cstdint>
#include <cstring>

#include "core/bf16.h"
#include "core/cuda/emulation.h"
#include "core/cuda/emulation_state.h"
#include "core/error.h"

// The completions run in the scheduler, between the fibers, on records the lanes wrote: they are
// not instrumented for ThreadSanitizer (each lane has touched what it names itself; mma.h).
#if defined(__SANITIZE_THREAD__)
#define CLUSTR_NO_TSAN __attribute__((no_sanitize("thread")))
#else
#define CLUSTR_NO_TSAN
#endif

namespace clustr::cuda::emulation {

namespace {

constexpr unsigned kLanes = 32;

void require_block(Fibers* block, const char* kernel, const char* what) {
  if (block == nullptr)
    throw Error(detail::cat("kernel '", kernel, "' uses ", what, " but declares kUsesBarrier = "
                            "false; set it to true (the emulator then runs the block's threads "
                            "as fibers, which warp instructions and asynchronous copies need)"));
}

std::string where(const WarpView& w) {
  return detail::cat("kernel '", w.kernel, "': warp ", w.warp, " of block (", w.block[0], ", ",
                     w.block[1], ", ", w.block[2], ")");
}

// ---- ldmatrix ----

struct LdmatrixRecord {
  const unsigned char* row;
  unsigned matrices;
  bool trans;
  uint32_t out[4];
};

// The 16-bit element (r, c) of matrix i, whose rows lanes 8i .. 8i+7 address.
CLUSTR_NO_TSAN uint16_t element(void* const* records, unsigned i, unsigned r, unsigned c) {
  const auto* rec = static_cast<const LdmatrixRecord*>(records[8 * i + r]);
  const unsigned char* p = rec->row + 2 * c;
  return static_cast<uint16_t>(p[0] | (p[1] << 8));  // little-endian, as the GPU
}

// Each lane checked its own row address before arriving (ldmatrix below).
CLUSTR_NO_TSAN void ldmatrix_complete(void* const* records, const WarpView& w) {
  const auto* first = static_cast<const LdmatrixRecord*>(records[0]);
  const unsigned n = first->matrices;
  for (unsigned l = 0; l < kLanes; ++l) {
    const auto* rec = static_cast<const LdmatrixRecord*>(records[l]);
    if (rec->matrices != n || rec->trans != first->trans)
      throw Error(where(w) + ": lanes of one ldmatrix disagree on its form");
  }
  for (unsigned l = 0; l < kLanes; ++l) {
    auto* rec = static_cast<LdmatrixRecord*>(records[l]);
    const unsigned g = l / 4, c = l % 4;
    for (unsigned i = 0; i < n; ++i) {
      const uint16_t lo =
          first->trans ? element(records, i, 2 * c, g) : element(records, i, g, 2 * c);
      const uint16_t hi =
          first->trans ? element(records, i, 2 * c + 1, g) : element(records, i, g, 2 * c + 1);
      rec->out[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

// ---- mma.sync ----

struct MmaRecord {
  MmaShape shape;
  uint32_t a[4], b[2];
  float d[4];
};

// A TF32 operand as the multiplier reads it: the float's bits with the low 13 mantissa bits
// dropped.
float tf32_value(uint32_t bits) { return bits_float(bits & 0xffffe000u); }
float bf16_half(uint32_t reg, unsigned half) {
  return bf16_to_float(static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu));
}

CLUSTR_NO_TSAN void mma_complete(void* const* records, const WarpView& w) {
  const MmaShape shape = static_cast<const MmaRecord*>(records[0])->shape;
  const unsigned K = shape == MmaShape::m16n8k16_bf16 ? 16 : 8;
  float A[16][16], B[16][8], C[16][8];
  for (unsigned l = 0; l < kLanes; ++l) {
    const auto* r = static_cast<const MmaRecord*>(records[l]);
    if (r->shape != shape) throw Error(where(w) + ": lanes of one mma disagree on its shape");
    const unsigned g = l / 4, c = l % 4;
    if (shape == MmaShape::m16n8k16_bf16) {
      // A: x[0] (g, 2c..), x[1] (g+8, 2c..), x[2] (g, 2c+8..), x[3] (g+8, 2c+8..).
      for (unsigned reg = 0; reg < 4; ++reg)
        for (unsigned h = 0; h < 2; ++h)
          A[g + 8 * (reg % 2)][2 * c + h + 8 * (reg / 2)] = bf16_half(r->a[reg], h);
      // B: x[0] (2c.., g), x[1] (2c+8.., g).
      for (unsigned reg = 0; reg < 2; ++reg)
        for (unsigned h = 0; h < 2; ++h) B[2 * c + h + 8 * reg][g] = bf16_half(r->b[reg], h);
    } else {
      // A: x[0] (g, c), x[1] (g+8, c), x[2] (g, c+4), x[3] (g+8, c+4); B: x[0] (c, g), x[1] (c+4, g).
      for (unsigned reg = 0; reg < 4; ++reg)
        A[g + 8 * (reg % 2)][c + 4 * (reg / 2)] = tf32_value(r->a[reg]);
      for (unsigned reg = 0; reg < 2; ++reg) B[c + 4 * reg][g] = tf32_value(r->b[reg]);
    }
    // C: x[0], x[1] (g, 2c..), x[2], x[3] (g+8, 2c..).
    for (unsigned i = 0; i < 4; ++i) C[g + 8 * (i / 2)][2 * c + i % 2] = r->d[i];
  }
  for (unsigned l = 0; l < kLanes; ++l) {
    auto* r = static_cast<MmaRecord*>(records[l]);
    const unsigned g = l / 4, c = l % 4;
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = g + 8 * (i / 2), col = 2 * c + i % 2;
      float acc = C[row][col];
      for (unsigned k = 0; k < K; ++k) {
        const float p = A[row][k] * B[k][col];  // exact: two significands of at most 11 bits
        acc = acc + p;
      }
      r->d[i] = acc;
    }
  }
}

// ---- cp.async ----

// Performs a copy: src_bytes from src, the rest of `bytes` zeros. Instrumented: the thread that
// waits writes dst, as the GPU's memory model has it.
void land(const AsyncCopy& c) {
  if (c.src_bytes > 0) std::memcpy(c.dst, c.src, c.src_bytes);
  if (c.src_bytes < c.bytes) std::memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
}

}  // namespace

void ldmatrix(Fibers* block, const char* kernel, unsigned lane, uint32_t* out, const void* row,
              unsigned matrices, bool trans, SyncSite site) {
  require_block(block, kernel, "ldmatrix");
  if (lane < 8 * matrices) {
    // This lane's row is read: it must lie in shared memory. The lane reads it here itself, so
    // that ThreadSanitizer sees this thread read those bytes (the completion, which takes the
    // values once the whole warp has arrived, is not instrumented).
    unsigned char* shared = nullptr;
    size_t shared_bytes = 0;
    shared_memory(block, &shared, &shared_bytes);
    const auto a = reinterpret_cast<uintptr_t>(row), s = reinterpret_cast<uintptr_t>(shared);
    if (a % 16 != 0 || a < s || a + 16 > s + shared_bytes)
      throw Error(detail::cat("kernel '", kernel, "': ", running_thread(block),
                              " gives ldmatrix the row address ", row, ", which is not a "
                              "16-byte aligned row inside the block's ", shared_bytes,
                              " bytes of shared memory"));
    uint64_t words[2];
    std::memcpy(words, row, sizeof words);
    volatile uint64_t seen = words[0] ^ words[1];
    (void)seen;
  }
  LdmatrixRecord rec{static_cast<const unsigned char*>(row), matrices, trans, {0, 0, 0, 0}};
  warp_instruction(block, &rec, &ldmatrix_complete, site);
  for (unsigned i = 0; i < matrices; ++i) out[i] = rec.out[i];
}

void mma(Fibers* block, const char* kernel, MmaShape shape, float* d, const uint32_t* a,
         const uint32_t* b, SyncSite site) {
  require_block(block, kernel, "mma");
  MmaRecord rec{shape, {a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {d[0], d[1], d[2], d[3]}};
  warp_instruction(block, &rec, &mma_complete, site);
  for (unsigned i = 0; i < 4; ++i) d[i] = rec.d[i];
}

void cp_async(Fibers* block, const char* kernel, void* dst, const void* src, unsigned bytes,
              unsigned src_bytes) {
  require_block(block, kernel, "cp.async");
  unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
  shared_memory(block, &shared, &shared_bytes);
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(shared);
  const auto fail = [&](const std::string& what) {
    throw Error(detail::cat("kernel '", kernel, "': ", running_thread(block), ": cp.async ", what));
  };
  if (bytes != 4 && bytes != 8 && bytes != 16)
    fail(detail::cat("copies 4, 8 or 16 bytes, not ", bytes));
  if (src_bytes > bytes) fail(detail::cat("reads at most its ", bytes, " bytes, not ", src_bytes));
  if (d % bytes != 0 || d < s || d + bytes > s + shared_bytes)
    fail(detail::cat("destination ", dst, " is not a ", bytes, "-byte aligned place inside the "
                     "block's ", shared_bytes, " bytes of shared memory"));
  if (src_bytes > 0 && (reinterpret_cast<uintptr_t>(src) % bytes != 0 ||
                        !state::in_one_allocation(src, src_bytes)))
    fail(detail::cat("source ", src, " is not ", bytes, "-byte aligned inside one device "
                     "allocation"));
  AsyncCopies& mine = async_copies(block);
  mine.pending.push_back({static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src),
                          bytes, src_bytes, mine.open_group});
  std::memset(dst, 0xff, bytes);  // NaN until the wait
}

void cp_async_commit(Fibers* block, const char* kernel) {
  require_block(block, kernel, "cp.async.commit_group");
  ++async_copies(block).open_group;
}

void cp_async_wait(Fibers* block, const char* kernel, unsigned pending) {
  require_block(block, kernel, "cp.async.wait_group");
  AsyncCopies& mine = async_copies(block);
  // Groups [0, open_group) are committed; all but the `pending` newest of them finish.
  const uint64_t done = mine.open_group > pending ? mine.open_group - pending : 0;
  size_t n = 0;
  while (n < mine.pending.size() && mine.pending[n].group < done) land(mine.pending[n++]);
  mine.pending.erase(mine.pending.begin(), mine.pending.begin() + static_cast<long>(n));
}

}  // namespace clustr::cuda::emulation

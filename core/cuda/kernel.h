// The launch abstraction of the CUDA backend: every kernel is written once, as a functor, against
// the few primitives below, and runs either on a GPU (compiled by nvcc) or in device emulation
// (compiled by the host compiler with CLUSTR_CUDA_EMULATION; see core/cuda/emulation.h).
//
// A kernel is a struct holding its arguments by value, with
//   static constexpr bool kUsesBarrier = ...;   // does the body call t.sync()?
//   CLUSTR_DEVICE void operator()(const Thread& t) const { ... }
// and is launched from host code with
//   launch("softmax", grid, block, shared_bytes, SoftmaxKernel{...});
// which is an ordinary <<<grid, block, shared_bytes, stream>>> launch on the calling thread's
// current stream (cuda.h) under nvcc, followed by the launch check (cudaGetLastError, the error
// named after the kernel; with CLUSTR_CUDA_DEBUG_SYNC also a synchronize of that stream), and
// the host launcher in emulation (given the same stream, which it checks), followed by the
// same check.
//
// The primitives a body may use (and nothing else of CUDA's):
//   t.thread_idx(), t.block_idx(), t.block_dim(), t.grid_dim()   threadIdx, blockIdx, ... (Dim3)
//   t.shared<T>()          the block's dynamic shared memory (shared_bytes of the launch)
//   t.sync()               block barrier, __syncthreads(); only when kUsesBarrier is true
//   t.sync_warp()          the barrier of this thread's warp, __syncwarp() (every lane calls it,
//                          in a block whose size is a multiple of 32; kUsesBarrier true)
//   (and, for sm_80 and later, the tensor-core instructions of core/cuda/mma.h)
//   atomic_add(p, v)       atomicAdd on a float or an int32 in global or shared memory
//   atomic_cas(p, e, d)    atomicCAS on an int32: *p = d if *p == e; returns the old *p
//   arrive(counter)        atomicAdd(counter, 1) with device-wide release and acquire fences
//                          around it (returns the old count); reset(counter) sets it to 0
//   last_to_arrive(t, counter, arrivals, flag)   (below) whether this block is the last of
//                          `arrivals` to arrive at a counter of cuda::arrival_counters
//   block_reduce(t, v, scratch, op)   a reduction over the block (built on shared memory and
//                          t.sync(), so no warp shuffles are needed)
//   block_exclusive_sum(t, v, scratch) the sum of v over the threads before this one
//   block_span(t, n)       this thread's contiguous share [begin, end) of n items
//   InTurn<A, B>{a, b}     a kernel running a then b, a barrier between (two launches in one)
//   t.shfl_xor(v, m)       __shfl_xor_sync over the full warp: the value v (a float or an
//                          integer of 4 or 8 bytes) of lane (lane ^ m)
//                          of this thread's warp (lanes: 32 consecutive threads of the block);
//                          every lane calls it, in a block whose size is a multiple of 32
//   warp_reduce(t, v, op)  op over the warp's 32 values, the same in every lane (a butterfly
//                          of shuffles); kernels using either declare kUsesBarrier = true
// plus the host+device math of core/math.h and core/philox.h. As on a GPU, t.sync() must be
// reached by every thread of the block; the emulator reports a block where some threads wait at
// a barrier while others have returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/hostdevice.h"

#if defined(__CUDACC__)
#define CLUSTR_DEVICE __device__ __forceinline__
#else
#define CLUSTR_DEVICE inline
#endif

// Before a loop over a kernel's register tiles (fragments, accumulators): unrolled, so that
// every index into them is a constant and they stay in registers.
#if defined(__CUDACC__)
#define CLUSTR_UNROLL _Pragma("unroll")
#else
#define CLUSTR_UNROLL _Pragma("GCC unroll 16")
#endif

#include "core/cuda/check.h"  // the toolkit's headers, or in emulation core/cuda/emulation.h
#include "core/cuda/cuda.h"   // current_stream()

namespace clustr::cuda {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

#if defined(__CUDACC__)

struct Thread {
  CLUSTR_DEVICE Dim3 thread_idx() const { return {threadIdx.x, threadIdx.y, threadIdx.z}; }
  CLUSTR_DEVICE Dim3 block_idx() const { return {blockIdx.x, blockIdx.y, blockIdx.z}; }
  CLUSTR_DEVICE Dim3 block_dim() const { return {blockDim.x, blockDim.y, blockDim.z}; }
  CLUSTR_DEVICE Dim3 grid_dim() const { return {gridDim.x, gridDim.y, gridDim.z}; }
  template <class T>
  CLUSTR_DEVICE T* shared() const {
    extern __shared__ __align__(16) unsigned char clustr_dynamic_shared[];
    return reinterpret_cast<T*>(clustr_dynamic_shared);
  }
  CLUSTR_DEVICE void sync() const { __syncthreads(); }
  CLUSTR_DEVICE void sync_warp() const { __syncwarp(); }
  template <class T>
  CLUSTR_DEVICE T shfl_xor(T v, unsigned lane_mask) const {
    return __shfl_xor_sync(0xffffffffu, v, static_cast<int>(lane_mask));
  }
};

CLUSTR_DEVICE float atomic_add(float* p, float v) { return atomicAdd(p, v); }
CLUSTR_DEVICE int32_t atomic_add(int32_t* p, int32_t v) { return atomicAdd(p, v); }
CLUSTR_DEVICE int32_t atomic_cas(int32_t* p, int32_t expected, int32_t desired) {
  return atomicCAS(p, expected, desired);
}
// What this thread wrote before is seen device-wide before the new count, and what it reads
// after comes after every earlier arrival's writes.
CLUSTR_DEVICE unsigned arrive(unsigned* counter) {
  __threadfence();
  const unsigned before = atomicAdd(counter, 1u);
  __threadfence();
  return before;
}
CLUSTR_DEVICE void reset(unsigned* counter) { atomicExch(counter, 0u); }

template <class K>
__global__ void kernel_entry(K k) {
  // Only the emulator acts on kUsesBarrier; requiring it here keeps GPU-only kernels honest.
  constexpr bool declared = K::kUsesBarrier || !K::kUsesBarrier;
  static_assert(declared, "a kernel declares static constexpr bool kUsesBarrier");
  k(Thread{});
}

// Launches k over grid x block threads with shared_bytes of dynamic shared memory on the current
// stream; an empty grid or block launches nothing. Past 48 KiB of shared memory the kernel is
// first opted in to as much as it asks (up to cuda::device_info().max_shared_per_block; more
// fails, naming the kernel).
template <class K>
void launch(const char* name, Dim3 grid, Dim3 block, size_t shared_bytes, const K& k) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
      block.z == 0)
    return;
  if (shared_bytes > 48 * 1024)
    CLUSTR_CUDA_CHECK_NAMED(cudaFuncSetAttribute(kernel_entry<K>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(shared_bytes)),
                            name);
  const cudaStream_t stream = current_stream();
  counting::kernel_launch();
  kernel_entry<K><<<dim3(grid.x, grid.y, grid.z), dim3(block.x, block.y, block.z), shared_bytes,
                    stream>>>(k);
  CLUSTR_CUDA_CHECK_NAMED(cudaGetLastError(), name);
#ifdef CLUSTR_CUDA_DEBUG_SYNC
  CLUSTR_CUDA_CHECK_NAMED(cudaStreamSynchronize(stream), name);
#endif
}

#else  // device emulation: the same bodies, called by the host launcher

struct Thread {
  Dim3 thread_idx_, block_idx_, block_dim_, grid_dim_;
  unsigned char* shared_ = nullptr;
  emulation::Fibers* fibers_ = nullptr;  // null when the kernel declares no barrier
  const char* kernel_ = "";

  Dim3 thread_idx() const { return thread_idx_; }
  Dim3 block_idx() const { return block_idx_; }
  Dim3 block_dim() const { return block_dim_; }
  Dim3 grid_dim() const { return grid_dim_; }
  template <class T>
  T* shared() const {
    return reinterpret_cast<T*>(shared_);
  }
  // The defaults are the caller's file and line: the emulator checks that a block's threads
  // all wait at the same t.sync().
  void sync(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    if (fibers_ == nullptr) emulation::sync_without_barrier(kernel_);
    emulation::block_sync(fibers_, {file, line});
  }
  void sync_warp(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) const {
    if (fibers_ == nullptr) emulation::sync_without_barrier(kernel_);
    emulation::warp_sync(fibers_, {file, line});
  }
  // The warp's lanes exchange their values at a warp barrier (the emulator checks that all 32
  // lanes take part, at the same call).
  template <class T>
  T shfl_xor(T v, unsigned lane_mask, const char* file = __builtin_FILE(),
             unsigned line = __builtin_LINE()) const {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    if (fibers_ == nullptr) emulation::sync_without_barrier(kernel_);
    uint64_t bits = 0;
    __builtin_memcpy(&bits, &v, sizeof v);
    bits = emulation::warp_shfl_xor(fibers_, bits, lane_mask, {file, line});
    __builtin_memcpy(&v, &bits, sizeof v);
    return v;
  }
};

inline float atomic_add(float* p, float v) { return emulation::atomic_add_f32(p, v); }
inline int32_t atomic_add(int32_t* p, int32_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline int32_t atomic_cas(int32_t* p, int32_t expected, int32_t desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;  // the old value, whether or not it was replaced
}
inline unsigned arrive(unsigned* counter) {
  return __atomic_fetch_add(counter, 1u, __ATOMIC_ACQ_REL);
}
inline void reset(unsigned* counter) { __atomic_store_n(counter, 0u, __ATOMIC_RELAXED); }

template <class K>
void launch(const char* name, Dim3 grid, Dim3 block, size_t shared_bytes, const K& k) {
  emulation::Launch l;
  l.name = name;
  const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  for (int d = 0; d < 3; ++d) {
    l.grid[d] = g[d];
    l.block[d] = b[d];
  }
  l.shared_bytes = shared_bytes;
  l.stream = current_stream();
  l.uses_barrier = K::kUsesBarrier;
  l.kernel = &k;
  l.run = [](const void* kernel, const emulation::ThreadState& s) {
    Thread t;
    t.thread_idx_ = {s.thread[0], s.thread[1], s.thread[2]};
    t.block_idx_ = {s.block[0], s.block[1], s.block[2]};
    t.block_dim_ = {s.block_dim[0], s.block_dim[1], s.block_dim[2]};
    t.grid_dim_ = {s.grid_dim[0], s.grid_dim[1], s.grid_dim[2]};
    t.shared_ = s.shared;
    t.fibers_ = s.fibers;
    t.kernel_ = s.kernel_name;
    (*static_cast<const K*>(kernel))(t);
  };
  l.clone = [](const void* kernel) -> std::shared_ptr<const void> {
    return std::make_shared<const K>(*static_cast<const K*>(kernel));
  };
  if (grid.x && grid.y && grid.z && block.x && block.y && block.z)  // as the GPU's launch above
    counting::kernel_launch();
  emulation::launch(l);  // records a bad configuration or stream for cudaGetLastError, as a GPU
  CLUSTR_CUDA_CHECK_NAMED(cudaGetLastError(), name);
}

#endif

// ---- helpers built on the primitives -----------------------------------------------------------

// The linear index of this thread in a 1-D launch, and the number of threads of the grid (for
// grid-stride loops, which let a fixed, modest grid cover any n).
CLUSTR_DEVICE int64_t global_x(const Thread& t) {
  return static_cast<int64_t>(t.block_idx().x) * t.block_dim().x + t.thread_idx().x;
}
CLUSTR_DEVICE int64_t grid_stride_x(const Thread& t) {
  return static_cast<int64_t>(t.block_dim().x) * t.grid_dim().x;
}

// This thread's contiguous share [begin, end) of n items split over the threads of its block
// (ceil(n / block_dim) each, the last ones shorter or empty): what a thread owns when the order
// of the items matters, e.g. before block_exclusive_sum.
struct Span {
  int64_t begin, end;
};
CLUSTR_DEVICE Span block_span(const Thread& t, int64_t n) {
  const int64_t nt = t.block_dim().x, span = (n + nt - 1) / nt;
  const int64_t begin = t.thread_idx().x * span < n ? t.thread_idx().x * span : n;
  return {begin, begin + span < n ? begin + span : n};
}

// op over the value v of every thread of a 1-D block, returned to every thread. scratch holds
// block_dim().x values of T (shared memory, or a part of it). A tree over shared memory: at each
// step the lower half adds the upper half (any block size, not only powers of two), with a
// barrier between steps; the order of the combinations is fixed, so the result is deterministic.
// Every thread of the block must call it (it contains barriers).
// AddDouble is its op (and warp_reduce's) for sums kept in double.
struct AddDouble {
  CLUSTR_HD double operator()(double a, double b) const { return a + b; }
};
template <class T, class Op>
CLUSTR_DEVICE T block_reduce(const Thread& t, T v, T* scratch, Op op) {
  const unsigned n = t.block_dim().x, i = t.thread_idx().x;
  scratch[i] = v;
  t.sync();
  unsigned half = 1;
  while (half * 2 < n) half *= 2;  // the largest power of two below n (1 when n <= 2)
  for (unsigned s = n > 1 ? half : 0; s > 0; s /= 2) {
    if (i < s && i + s < n) scratch[i] = op(scratch[i], scratch[i + s]);
    t.sync();
  }
  const T r = scratch[0];
  t.sync();  // every thread has read the result before the scratch is reused
  return r;
}

// Whether this block is the last of `arrivals` to arrive at `counter` (one of
// cuda::arrival_counters, zero before the first arrival), returned to every thread of the
// block: the last block sees everything the others wrote before they arrived, and can finish
// what needs all of it (e.g. add their partial sums in a fixed order) in the same launch. Every
// thread of the block calls it after its own writes (its barriers gather them; thread 0
// arrives for the block). The last block sets the counter back to zero, for the next kernel.
// flag: one int of shared memory.
CLUSTR_DEVICE bool last_to_arrive(const Thread& t, unsigned* counter, unsigned arrivals,
                                  int* flag) {
  t.sync();
  const Dim3 i = t.thread_idx();
  if (i.x == 0 && i.y == 0 && i.z == 0) {
    const bool last = arrive(counter) + 1 == arrivals;
    if (last) reset(counter);
    *flag = last;
  }
  t.sync();
  const bool last = *flag != 0;
  t.sync();  // every thread has read the flag before the shared memory is used again
  return last;
}

// Two kernels in one launch, in turn: for kernels that give each block its own share of the
// work (the same grid and block for both; e.g. block b the row b), where block b's share in
// the second reads only what block b wrote in the first, so that a barrier between them is all
// the ordering they need. Its shared memory is the larger of the two's (each starts at offset
// 0). Nest them for three.
template <class First, class Second>
struct InTurn {
  static constexpr bool kUsesBarrier = true;
  First first;
  Second second;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    first(t);
    t.sync();  // the first's writes (global and shared) seen, its shared memory free
    second(t);
  }
};

// The sum of v over the threads before this one in a 1-D block (an exclusive prefix sum in
// thread order), returned to every thread. scratch holds block_dim().x ints. Thread 0 adds the
// values in order (integers: exact); the block's threads wait at two barriers. Every thread of
// the block must call it. For writing each thread's items at their offset in thread order.
CLUSTR_DEVICE int block_exclusive_sum(const Thread& t, int v, int* scratch) {
  const unsigned n = t.block_dim().x, i = t.thread_idx().x;
  scratch[i] = v;
  t.sync();
  if (i == 0) {
    int before = 0;
    for (unsigned x = 0; x < n; ++x) {
      const int mine = scratch[x];
      scratch[x] = before;
      before += mine;
    }
  }
  t.sync();
  const int r = scratch[i];
  t.sync();  // every thread has read its offset before the scratch is reused
  return r;
}

// op over the 32 values of this thread's warp, in every lane: five shuffle rounds (lane i with
// lane i ^ 16, then ^ 8, ...), so every lane combines the same values in the same order.
template <class T, class Op>
CLUSTR_DEVICE T warp_reduce(const Thread& t, T v, Op op) {
  for (unsigned m = 16; m > 0; m /= 2) v = op(v, t.shfl_xor(v, m));
  return v;
}

// Threads per block for a grid-stride element-wise kernel, and its block count: a fixed cap of
// blocks (several full waves on any current GPU); more would only add scheduling work to a
// memory-bound loop.
constexpr unsigned kElementwiseThreads = 256;
inline unsigned elementwise_blocks(int64_t n, int64_t per_thread = 1) {
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t work = (n + per_thread - 1) / per_thread;
  const int64_t b = (work + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

// Threads per block for a kernel that gives each row of `len` elements to one block (row
// reductions, softmax, layer norm, cross-entropy): a power of two from 32 (one warp) to 256, no
// more than the row needs. Blocks: one per row, at most kMaxRowBlocks; beyond that the blocks
// stride over the rows.
inline unsigned row_threads(int64_t len) {
  unsigned t = 32;
  while (t < 256 && t < len) t *= 2;
  return t;
}
constexpr int64_t kMaxRowBlocks = 65535;
inline unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
}

}  // namespace clustr::cuda

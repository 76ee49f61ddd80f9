// The CUDA backend's host-side interface. Always declared; implemented by core/cuda/*.cu when
// the toolkit is found at configure time, and by core/cuda/no_cuda.cpp otherwise (where every
// call that needs a GPU throws a clear clustr::Error).
//
// Raw pointers here are device pointers unless the name says host (h2d: host to device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/ops.h"
#include "core/tensor.h"

// The runtime's opaque stream and event types: cudaStream_t is CUstream_st*, cudaEvent_t is
// CUevent_st* (in the toolkit, and in device emulation's core/cuda/emulation.h).
struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;

namespace clustr::cuda {

bool compiled();                 // built with the CUDA backend (a GPU build or device emulation)
bool emulated();                 // built with device emulation (-DCLUSTR_CUDA=EMULATE)
// True on the emulated device with its exact numerics: kernels without contracted
// multiply-adds, cuBLAS's products added in order of k, and the forward schedule (so atomic
// additions happen in thread order). Where a test expects the device to match the CPU bit for
// bit, it does so only then; on a GPU, under the emulation's GPU-like numerics
// (-DCLUSTR_EMULATION_NUMERICS=gpu) or another schedule (CLUSTR_EMULATION_SCHEDULE), it allows
// for rounding and near-ties.
bool exact_numerics();
bool available();                // compiled, and a usable GPU is present
std::string unavailable_reason();  // why available() is false ("" when it is true)
void require(const char* what);  // throws, naming `what`, when no usable GPU is present

// The current GPU's compute capability (major * 10 + minor), multiprocessors, and the most
// dynamic shared memory one block may use (bytes; launch() opts a kernel in past the default
// 48 KiB). The emulated device reports an H100's figures (90, 132, 227 KiB). Asked once; needs a
// usable GPU (require).
struct DeviceInfo {
  int capability = 0;
  int multiprocessors = 0;
  size_t max_shared_per_block = 0;
};
const DeviceInfo& device_info();
// In a build without the CUDA backend only: throws the error that says so, naming `what`. The
// no-CUDA twins of every component's kernels (core/cuda/no_cuda.cpp,
// layers/attention/cuda/no_cuda.cpp, optim/cuda/no_cuda.cpp) are one line each around it.
[[noreturn]] void no_backend(const char* what);

// What this process has queued on the device since it started (all host threads, all
// streams): kernel launches (every cuda::launch, core/cuda/kernel.h) and cuBLAS GEMM calls
// (each one or a few kernels of cuBLAS's own). A training step's count (the difference across
// it) says how launch-bound it is on a GPU, where each launch costs a few microseconds of host
// time however small its kernel. Zero in a build without the CUDA backend.
// A launch or call made while this thread captures a graph (cuda::Graph) queues nothing and is
// not counted; each replay of a graph counts as one in `graphs`.
struct LaunchCounts {
  uint64_t kernels = 0, blas = 0, graphs = 0;
};
LaunchCounts launch_counts();
namespace counting {
void kernel_launch();  // launch_counts().kernels += 1: cuda::launch calls it
void blas_call();      // launch_counts().blas += 1: each cuBLAS GEMM call
}  // namespace counting

// ---- streams and events (core/cuda/runtime.cu) -------------------------------------------------
//
// Work queued on one stream runs in order; work on two streams may run concurrently. Every
// kernel launch, cuBLAS call and copy of this backend goes on the calling host thread's
// *current stream*: the legacy default stream unless a StreamGuard has made a Stream current.
// Code that never makes a Stream current runs exactly as before, all on the default stream.
//
//   cuda::Stream side;                       // a new stream
//   cuda::Event ready;
//   ready.record();                          // what the default stream has queued so far...
//   {
//     cuda::StreamGuard guard(side);         // ...this thread's work now goes on `side`
//     ready.wait();                          // `side` waits for it (the host does not)
//     Tensor y = softmax(x);                 // allocated, computed on `side`
//   }                                        // back on the default stream
//
// Streams are non-blocking (they do not wait for the legacy default stream), so work on two
// streams is ordered only by Events or synchronization, as in PyTorch.
//
// The allocator's rule: a block is reused only by allocations made on the stream that was
// current when it was allocated (see alloc()). So a tensor that is used on a second stream must
// be kept alive until that stream's work on it is done (or that stream synchronized): freed
// earlier, its block could be handed to new work on its own stream while the second stream
// still reads it.

using StreamHandle = ::CUstream_st*;            // a cudaStream_t
constexpr StreamHandle kDefaultStream = nullptr;  // the legacy default stream

// This host thread's current stream (kDefaultStream unless a StreamGuard says otherwise).
StreamHandle current_stream();

// Owns one stream. Movable, not copyable; a moved-from Stream holds none, and using it throws.
// Destroying a Stream waits for its queued work, then destroys it; the allocator's blocks
// that belonged to it (cached ones, and live ones when they are freed later) go to the
// default stream. A Stream must outlive every StreamGuard made from it: an allocation while a
// destroyed stream is current throws a clustr::Error (a launch there is undefined on a GPU).
class Stream {
 public:
  Stream();  // a new non-blocking stream; throws without a usable GPU
  ~Stream();
  Stream(Stream&& other) noexcept : h_(other.h_) { other.h_ = nullptr; }
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  StreamHandle handle() const;  // the cudaStream_t, for use with other CUDA code
  void synchronize() const;     // the host waits until everything queued on it has finished

 private:
  StreamHandle h_ = nullptr;  // null: moved from
};

// Makes a stream current on this host thread for its scope and restores the previous one.
// Guards nest; other host threads are not affected.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  // kDefaultStream, or the handle() of a live Stream (anything else throws).
  explicit StreamGuard(StreamHandle s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamHandle previous_;
};

// A marker in a stream's queue: record() captures the work queued so far, wait() makes another
// stream's later work wait for it on the device, without blocking the host. Created without
// timing (cudaEventDisableTiming): it orders work, it does not measure it. Movable, not
// copyable; a moved-from Event holds none, and using it throws.
class Event {
 public:
  Event();  // throws without a usable GPU
  ~Event();
  Event(Event&& other) noexcept : h_(other.h_) { other.h_ = nullptr; }
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record();                 // on the current stream
  void record(const Stream& s);
  void wait() const;             // the current stream waits for the recorded work
  void wait(const Stream& s) const;
  bool query() const;            // has the recorded work finished? (true if nothing recorded)
  void synchronize() const;      // the host waits for the recorded work

 private:
  ::CUevent_st* h_ = nullptr;  // null: moved from
};

// ---- CUDA graphs (core/cuda/runtime.cu) --------------------------------------------------------
//
// A Graph records what a piece of host code queues on the current stream (kernel launches,
// cuBLAS products, device-to-device copies) without running it, then replays all of it with one
// launch, which is what a training step of small kernels needs: the host's cost per launch,
// not the work, bounds such a step.
//
//   cuda::Stream side;
//   cuda::StreamGuard on_side(side);   // the legacy default stream cannot capture
//   cuda::Graph step;
//   step.capture([&] { train_step(); });  // nothing runs on the device yet
//   for (...) { refill_inputs(); step.replay(); }
//
// The body must be free of host work that depends on the device: a copy to or from host memory
// (item(), to_vector(), a tensor moved to the cpu), a synchronization, or a random draw on the
// host (dropout masks and clustering planes come from the host's generator: a graph would draw
// the same numbers at every replay). Each is refused during capture with a clustr::Error that
// names it, the capture is abandoned and the stream usable again. Inputs that change between
// replays must live in device buffers made before capture and refilled in place; outputs stay
// at their addresses and each replay overwrites them.
// Memory: while capturing, allocations on the capturing stream come from the graph's own pool,
// and blocks freed during capture go back to it; the pool keeps its blocks until the graph is
// destroyed (tensors the body made and the caller kept hold theirs), so every replay finds its
// scratch where the capture put it, and nothing else is handed those blocks meanwhile.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records body() on the current stream, which must be a cuda::Stream's (throws otherwise,
  // and when already captured). On an error in body() or in the capture, throws it, prefixed
  // by what was being captured, and leaves this Graph empty.
  // share_pool_of: a captured graph whose pool this one takes its blocks from and adds its
  // own to (the pool lives until the last graph holding it is destroyed), so that graphs of
  // steps that never run at the same time hold one step's scratch, not one each. They must
  // be replayed one after another, on one stream: each replay overwrites what the pool's
  // free blocks held.
  void capture(const std::function<void()>& body, const Graph* share_pool_of = nullptr);
  // Runs the recorded work on the current stream; throws when nothing was captured.
  void replay();
  bool captured() const { return exec_ != nullptr; }
  size_t pool_bytes() const;  // device memory the graph's pool holds (its scratch)

 private:
  void release() noexcept;
  ::CUgraphExec_st* exec_ = nullptr;
  uint64_t pool_ = 0;  // the allocator's pool of this graph (0: none)
};

// Whether this host thread is capturing a graph now (inside Graph::capture's body).
bool capturing();

// ---- arrival counters (core/cuda/runtime.cu) ---------------------------------------------------
//
// Counters, zero between kernels, for kernels in which the last block to finish a piece of
// work goes on to a step that needs all of it (kernel.h's last_to_arrive: a sum over the other
// blocks' partial sums, in one launch instead of two). Each such kernel takes n of them for
// the current stream and leaves them at zero. Work on one stream runs in order, so the kernels
// of a stream share one set; a graph's kernels use their pool's own set, as its replays may run
// on another stream beside that one. n at most kArrivalCounters.
constexpr int64_t kArrivalCounters = 256;
unsigned* arrival_counters(int64_t n, const char* kernel);

// ---- checks made on the device (core/cuda/device_checks.cu) ------------------------------------
//
// The ops check values that live in device memory (indices, lengths, class targets) on a host
// copy, which makes the host wait for the device. In a step that must not wait (while a graph
// is being captured, or inside a DeferredChecks scope) such a check is a kernel instead: it
// records the first value out of range in a device word, and raise_device_errors(), which
// waits for the device, throws it as a clustr::Error naming the op, what was checked, the
// element and the range. The kernels that index with such values clamp them meanwhile, so a bad
// value reads no memory outside its tensor (the result is then wrong, and the error says so).
class DeferredChecks {
 public:
  DeferredChecks();
  ~DeferredChecks();
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;

 private:
  bool previous_;
};
// Whether the checks of device values are deferred on this thread (capturing, or a scope).
bool deferring_checks();
// values[0, n) each in [lo, hi) or equal to `also` (e.g. an ignore index; INT32_MIN: none),
// checked on the device; `op` and `what` (string literals) name them in the error.
void check_range_on_device(const char* op, const char* what, const int32_t* values, int64_t n,
                           int32_t lo, int32_t hi, int32_t also = INT32_MIN);
// values[0, n) each >= lo (a NaN fails), checked on the device.
void check_not_below_on_device(const char* op, const char* what, const float* values, int64_t n,
                               float lo);
// Throws the first failure the device checks have recorded (and clears it); waits for the
// device. Nothing recorded: returns.
void raise_device_errors();
// Makes the device record of those checks (once; Graph::capture and DeferredChecks call it).
void make_device_check_record();

// ---- memory and copies (core/cuda/runtime.cu) --------------------------------------------------

// Caching allocator: freed blocks are kept for reuse (by rounded size) instead of cudaFree, in
// one free list per stream. alloc() serves the current stream: it takes a block that was freed
// on that stream, or a new one, and the block remembers that stream; free() puts it back on
// that stream's list. Reuse is then ordered after the work that used the block (the rule for
// tensors used on a second stream is in the streams section above).
void* alloc(size_t bytes);
void free(void* ptr, size_t bytes);
MemoryStats memory_stats();  // live/peak bytes of tensor storage on the device
void reset_peak();
void empty_cache();           // synchronizes the device, then returns cached blocks to the driver
size_t cached_bytes();        // bytes held in the cache (every stream's), not in use

// On the current stream. copy_h2d and copy_d2h return when the host buffer may be reused or
// read (they synchronize the current stream); copy_d2d does not wait.
void copy_h2d(void* dst, const void* src_host, size_t bytes);
void copy_d2h(void* dst_host, const void* src, size_t bytes);
void copy_d2d(void* dst, const void* src, size_t bytes);
// Pinned (page-locked) host memory, cudaMallocHost's: a copy from it to the device is queued on
// the current stream and the host goes on at once (copy_h2d_async), so that it can prepare the
// next input while the device works. The copy runs when the stream gets to it: the host may
// write the buffer again only after waiting for it (an Event recorded after the copy,
// synchronized; or the stream, or the device). The emulated device stops the process, naming
// the address, when the host writes the buffer before that.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);  // throws without a usable GPU
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept : p_(other.p_), bytes_(other.bytes_) {
    other.p_ = nullptr;
    other.bytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};
// On the current stream, after the work queued there; returns without waiting. src_pinned lies
// in a PinnedBuffer (from pageable memory the toolkit may copy at once, or not). Refused while
// capturing a graph, as every copy from host memory.
void copy_h2d_async(void* dst, const void* src_pinned, size_t bytes);
void fill_f32(float* dst, float value, int64_t n);
void fill_i32(int32_t* dst, int32_t value, int64_t n);
void synchronize();  // the host waits for all work on every stream (cudaDeviceSynchronize)

// Row-major GEMM on device memory, same arguments and meaning as cpu::gemm (core/cpu/gemm.h):
// C(M,N) = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. Runs through cuBLAS.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, int64_t lda, int64_t stride_a,
                          const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                          int64_t ldc, int64_t stride_c, int64_t batch);

// bf16 operands (core/bf16.h: the bit patterns in uint16_t), float32 accumulation and result,
// through cuBLAS's cublasGemmEx / cublasGemmStridedBatchedEx (CUDA_R_16BF inputs,
// CUBLAS_COMPUTE_32F, tensor cores). Same arguments, meaning, checks and errors as gemm above
// (strides in elements). A product of two bf16 values is exact in float32, so C differs from
// the exact sum of the bf16 products by float32 accumulation error only; the TF32 setting
// below does not change them. (core/cuda/blas.cu)
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
void gemm_bf16_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                               float alpha, const uint16_t* A, int64_t lda, int64_t stride_a,
                               const uint16_t* B, int64_t ldb, int64_t stride_b, float beta,
                               float* C, int64_t ldc, int64_t stride_c, int64_t batch);
// TF32 for the float32 GEMMs above (gemm, gemm_strided_batched): off by default (full FP32
// arithmetic, results agree with the CPU's to FP32 rounding). On: cuBLAS may use TF32 tensor
// cores (sm_80 and later), which read each float32 operand with a 10-bit mantissa (a relative
// error up to 2^-11, rounded, or 2^-10, truncated) and accumulate in FP32: results then differ
// from the CPU's by about 1e-3 relative, several times faster. A process-wide setting
// (cublasSetMathMode on the one cuBLAS handle), changed under the lock every GEMM holds while
// it is queued, so each GEMM runs wholly in one mode; tf32() reports it. set_tf32 throws
// without a usable GPU. (core/cuda/blas.cu) Full attention's tensor-core kernels read it too
// (layers/attention/cuda/flash.h): on, their f32 products are single TF32 products; off, three
// (3xTF32, f32's accuracy).
void set_tf32(bool on);
bool tf32();

// Row-major GEMMs with a fused epilogue, each one cuBLASLt call (core/cuda/blas_lt.cu):
//   C(M,N) = op(A) op(B), then
//   bias:       C[i][j] += vec[j]           (vec: N floats, read)
//   relu_bias:  C[i][j] = max(C[i][j] + vec[j], 0)
//   a_row_sums: vec[i] = sum over k of op(A)[i][k]   (vec: M floats, written; the bias gradient
//               of a linear layer when op(A) is dy^T)
// A and B both float (TF32 as set_tf32 says) or both bf16, C float, leading dimensions as gemm.
// Returns true once the call is queued on the current stream. Returns false, queuing nothing,
// when cuBLASLt offers no algorithm for the product (the caller then composes it from gemm and
// its own kernels), for an empty product (M, N or K zero), or when CLUSTR_GEMM_EPILOGUES=off is
// set in the environment (to compare the two paths); another value of it is an error.
enum class GemmEpilogue { bias, relu_bias, a_row_sums };
struct EpilogueGemm {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  bool bf16 = false;  // A and B hold bf16 (uint16_t) elements; else float
  float* C = nullptr;
  int64_t ldc = 0;
  GemmEpilogue epilogue = GemmEpilogue::bias;
  float* vec = nullptr;
};
bool gemm_epilogue(const EpilogueGemm& g);

// float32 <-> bf16 conversion, element-wise: y[i] = float_to_bf16(x[i]) (round to nearest
// even, core/bf16.h) and y[i] = bf16_to_float(x[i]) (exact). (core/cuda/convert.cu)
void f32_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
// dst[i] = value for i in [0, n): 16-bit words, for Tensor::fill of bf16 tensors (value is
// the bit pattern, already rounded by float_to_bf16 on the host). (core/cuda/fill.cu)
void fill_u16(uint16_t* dst, uint16_t value, int64_t n);

// ---- kernels: the CUDA twins of core/cpu/kernels.h and core/cpu/nn.h, same arguments and
// meaning (device pointers). Every output is overwritten unless the comment says accumulated.

// out[idx] = op(a[idx . a_strides], b[idx . b_strides]) over every index idx of out_shape (rank
// dims, row-major). A stride of 0 broadcasts that axis. (core/cuda/elementwise.cu)
void binary(BinaryOp op, int rank, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out);
void binary_scalar(BinaryOp op, const float* a, float s, float* out, int64_t n);  // out = a op s
void unary(UnaryOp op, const float* x, float* y, int64_t n);                    // y = op(x)
void axpy(float alpha, const float* src, float* dst, int64_t n);  // dst += alpha src (accumulated)

// x viewed as (outer, len, inner); y (outer, inner) = op over the middle axis. len > 0 unless
// op is sum. (core/cuda/reduce.cu)
void reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len, int64_t inner);
// x (outer, len, inner) -> y (outer, inner) i32 (=): the first index of the maximum, NaN
// counting as the largest (math::argmax_beats); len >= 1.
void argmax(const float* x, int32_t* y, int64_t outer, int64_t len, int64_t inner);
// *y (=) = the number of i in [0, n) with b[i] != ignore and a[i] == b[i], by one block.
void count_equal(const int32_t* a, const int32_t* b, int32_t ignore, int64_t n, float* y);
// x, y (rows, cols); per row over cols (core/cuda/softmax.cu).
void softmax(const float* x, float* y, int64_t rows, int64_t cols);
void log_softmax(const float* x, float* y, int64_t rows, int64_t cols);

// Inverted dropout with the Philox stream of core/ops.h's dropout_apply: x, y (n).
// (core/cuda/nn.cu)
void dropout(const float* x, float p, uint64_t seed, PhiloxOffset offset, float* y, int64_t n);

// The unary derivatives of core/cpu/nn.h (core/cuda/nn.cu).
// x, y, dy, dx (n): dx = dy * f'(x) for y = unary(op, x); the one of x and y that the
// derivative does not read may be null (cpu::unary_grad_inputs).
void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                    int64_t n);
// y, dy, dx (rows, cols), per row over cols (core/cuda/softmax.cu).
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);
void log_softmax_backward(const float* y, const float* dy, float* dx, int64_t rows,
                          int64_t cols);

// Layer norm (core/cuda/layer_norm.cu). x, y (R, D); gamma, beta (D); mean, rstd (R), all
// written (=). Backward: dy, x, dx (R, D); mean, rstd (R); gamma, dgamma, dbeta (D); dx, dgamma
// and dbeta overwritten (=), dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy.
void layer_norm(const float* x, const float* gamma, const float* beta, float eps, float* y,
                float* mean, float* rstd, int64_t R, int64_t D);
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t R,
                         int64_t D);
// The same of a residual sum x = a + b (a, b (R, D)), formed as each kernel reads it (the
// float sum the CPU's add_layer_norm forms) instead of stored first: one launch fewer each way.
void add_layer_norm(const float* a, const float* b, const float* gamma, const float* beta,
                    float eps, float* y, float* mean, float* rstd, int64_t R, int64_t D);
void add_layer_norm_backward(const float* dy, const float* a, const float* b, const float* mean,
                             const float* rstd, const float* gamma, float* dx, float* dgamma,
                             float* dbeta, int64_t R, int64_t D);

// The linear layer's GEMM epilogue (core/cuda/fused.cu), what cpu::gemm_fused's GemmEpilogue
// does to the product: y (R, N) = y + bias (bias (N), or null for none), then ReLU when relu
// (NaN kept, as math::relu); in place.
void bias_activation(float* y, const float* bias, bool relu, int64_t R, int64_t N);

// Cross-entropy (core/cuda/cross_entropy.cu). logits (R, V); target (R), each in [0, V) or
// ignore_index (checked by the caller, maybe on the device: a bad one makes the loss NaN);
// weight (R) or null; lse (R) = logsumexp of each row (=); loss, weight_sum, loss_scale () (=),
// as math::cross_entropy_totals gives them (mean or sum); predictions (R) (=) each row's argmax
// (the first largest logit), or null for none. Backward: dlogits (R, V) (=) =
// dloss * loss_scale * w_r * (softmax(logits_r) - onehot(target_r)), 0 on rows with w_r = 0
// and everywhere when the scale is 0; dloss and loss_scale are read on the device.
void cross_entropy(const float* logits, const int32_t* target, const float* weight,
                   int32_t ignore_index, float* lse, int64_t R, int64_t V, bool mean, float* loss,
                   float* weight_sum, float* loss_scale, int32_t* predictions = nullptr);
void cross_entropy_backward(const float* dloss, const float* loss_scale, const float* logits,
                            const int32_t* target, const float* weight, const float* lse,
                            int32_t ignore_index, float* dlogits, int64_t R, int64_t V);

// Layout (core/cuda/layout.cu), the twins of core/cpu/kernels.h's. y = x with axes permuted:
// y.shape[i] = in_shape[perm[i]], 4-byte words (f32 and i32 alike); in_shape and perm are host
// arrays.
void permute(const uint32_t* x, uint32_t* y, int rank, const int64_t* in_shape, const int* perm);
// out (n, D) = table[index[i], :] (=), + added[i mod P, :] when added (P, D) is not null; table
// (V, D). Indices are checked by the caller (maybe on the device: a row whose index is outside
// [0, V) is then NaN).
void gather_rows(const float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                 const float* added, int64_t P, float* out);
// table[index[i], :] += src[i, :] (accumulated, each element's sources in index order, as on
// the cpu); table (V, D), src (n, D). Groups the indices on the device (nothing read back);
// an index outside [0, V) (a check deferred to the device) is left out.
void scatter_add_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src);
// The same into a table that starts at 0 (=: every row written, 0 where no index points): the
// bits of a zero fill then scatter_add_rows. A small table (V n <= 2^20: an embedding of a
// few symbols) takes one launch, a block per row reading every index in order; a larger one
// the fill and the grouping above.
void scatter_sum_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src);

// Shape ops (core/cuda/shape_ops.cu), the twins of core/cpu/shape_ops.h, same arguments; shape,
// stride and keep arrays, and concat's array of pointers, live on the host.
void broadcast_to(const uint32_t* x, const int64_t* x_strides, int rank, const int64_t* out_shape,
                  uint32_t* out);
void sum_to(const float* x, int rank, const int64_t* x_shape, const uint8_t* keep, float* y);
void slice(const uint32_t* x, int64_t outer, int64_t len, int64_t inner, int64_t start,
           int64_t length, uint32_t* y);
// dst (outer, len, inner)[:, start:start+length, :] += src (outer, length, inner) (accumulated).
void slice_add(float* dst, int64_t outer, int64_t len, int64_t inner, int64_t start,
               const float* src, int64_t length);
void concat(int n, const uint32_t* const* xs, const int64_t* lens, int64_t outer, int64_t inner,
            uint32_t* y);
void split(const uint32_t* x, int64_t outer, int64_t inner, int n, const int64_t* lens,
           uint32_t* const* ys);

}  // namespace clustr::cuda

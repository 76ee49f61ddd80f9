// The CUDA backend when clustr is built without the toolkit: every call that needs a GPU
// throws a clear error; queries answer "not available".
#include "core/cuda/cuda.h"
#include "core/error.h"

namespace clustr::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

bool compiled() { return false; }
bool emulated() { return false; }
bool exact_numerics() { return false; }
bool available() { return false; }
std::string unavailable_reason() { return "clustr was built without the CUDA backend"; }
void require(const char* what) { no_cuda(what); }
LaunchCounts launch_counts() { return {}; }

// Nothing can be queued, so the current stream is always the default one; a Stream or an Event
// cannot be made (their other members are reachable only through a moved-from object).
StreamHandle current_stream() { return kDefaultStream; }

Stream::Stream() { no_cuda("cuda::Stream"); }
Stream::~Stream() {}
Stream& Stream::operator=(Stream&& other) noexcept {
  h_ = other.h_;
  other.h_ = nullptr;
  return *this;
}
StreamHandle Stream::handle() const { no_cuda("cuda::Stream::handle"); }
void Stream::synchronize() const { no_cuda("cuda::Stream::synchronize"); }

StreamGuard::StreamGuard(const Stream& s) : StreamGuard(s.handle()) {}
StreamGuard::StreamGuard(StreamHandle s) : previous_(kDefaultStream) {
  if (s != kDefaultStream) no_cuda("cuda::StreamGuard");
}
StreamGuard::~StreamGuard() {}

Event::Event() { no_cuda("cuda::Event"); }
Event::~Event() {}
Event& Event::operator=(Event&& other) noexcept {
  h_ = other.h_;
  other.h_ = nullptr;
  return *this;
}
void Event::record() { no_cuda("cuda::Event::record"); }
void Event::record(const Stream&) { no_cuda("cuda::Event::record"); }
void Event::wait() const { no_cuda("cuda::Event::wait"); }
void Event::wait(const Stream&) const { no_cuda("cuda::Event::wait"); }
bool Event::query() const { no_cuda("cuda::Event::query"); }
void Event::synchronize() const { no_cuda("cuda::Event::synchronize"); }

void* alloc(size_t) { no_cuda("cuda::alloc"); }
void free(void*, size_t) {}
MemoryStats memory_stats() { return {}; }
void reset_peak() {}
void empty_cache() {}
size_t cached_bytes() { return 0; }

void copy_h2d(void*, const void*, size_t) { no_cuda("cuda::copy_h2d"); }
void copy_d2h(void*, const void*, size_t) { no_cuda("cuda::copy_d2h"); }
void copy_d2d(void*, const void*, size_t) { no_cuda("cuda::copy_d2d"); }
void fill_f32(float*, float, int64_t) { no_cuda("cuda::fill_f32"); }
void fill_i32(int32_t*, int32_t, int64_t) { no_cuda("cuda::fill_i32"); }
void synchronize() {}

void gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
          int64_t, float, float*, int64_t) {
  no_cuda("cuda::gemm");
}
void gemm_strided_batched(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          int64_t, const float*, int64_t, int64_t, float, float*, int64_t,
                          int64_t, int64_t) {
  no_cuda("cuda::gemm_strided_batched");
}
void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
               const uint16_t*, int64_t, float, float*, int64_t) {
  no_cuda("cuda::gemm_bf16");
}
void gemm_bf16_strided_batched(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*,
                               int64_t, int64_t, const uint16_t*, int64_t, int64_t, float, float*,
                               int64_t, int64_t, int64_t) {
  no_cuda("cuda::gemm_bf16_strided_batched");
}
void set_tf32(bool) { no_cuda("cuda::set_tf32"); }
bool tf32() { return false; }
void f32_to_bf16(const float*, uint16_t*, int64_t) { no_cuda("cuda::f32_to_bf16"); }
void bf16_to_f32(const uint16_t*, float*, int64_t) { no_cuda("cuda::bf16_to_f32"); }
void fill_u16(uint16_t*, uint16_t, int64_t) { no_cuda("cuda::fill_u16"); }

void binary(BinaryOp, int, const int64_t*, const float*, const int64_t*, const float*,
            const int64_t*, float*) {
  no_cuda("cuda::binary");
}
void binary_scalar(BinaryOp, const float*, float, float*, int64_t) {
  no_cuda("cuda::binary_scalar");
}
void unary(UnaryOp, const float*, float*, int64_t) { no_cuda("cuda::unary"); }
void axpy(float, const float*, float*, int64_t) { no_cuda("cuda::axpy"); }
void reduce(ReduceOp, const float*, float*, int64_t, int64_t, int64_t) { no_cuda("cuda::reduce"); }
void argmax(const float*, int32_t*, int64_t, int64_t, int64_t) { no_cuda("cuda::argmax"); }
void softmax(const float*, float*, int64_t, int64_t) { no_cuda("cuda::softmax"); }
void log_softmax(const float*, float*, int64_t, int64_t) { no_cuda("cuda::log_softmax"); }
void dropout(const float*, float, uint64_t, uint64_t, float*, int64_t) { no_cuda("cuda::dropout"); }
void unary_backward(UnaryOp, const float*, const float*, const float*, float*, int64_t) {
  no_cuda("cuda::unary_backward");
}
void softmax_backward(const float*, const float*, float*, int64_t, int64_t) {
  no_cuda("cuda::softmax_backward");
}
void log_softmax_backward(const float*, const float*, float*, int64_t, int64_t) {
  no_cuda("cuda::log_softmax_backward");
}
void layer_norm(const float*, const float*, const float*, float, float*, float*, float*, int64_t,
                int64_t) {
  no_cuda("cuda::layer_norm");
}
void layer_norm_backward(const float*, const float*, const float*, const float*, const float*,
                         float*, float*, float*, int64_t, int64_t) {
  no_cuda("cuda::layer_norm_backward");
}
void bias_activation(float*, const float*, bool, int64_t, int64_t) {
  no_cuda("cuda::bias_activation");
}
CrossEntropySums cross_entropy(const float*, const int32_t*, const float*, int32_t, float*,
                               int64_t, int64_t) {
  no_cuda("cuda::cross_entropy");
}
void cross_entropy_backward(float, const float*, const int32_t*, const float*, const float*,
                            int32_t, float*, int64_t, int64_t) {
  no_cuda("cuda::cross_entropy_backward");
}
void permute(const uint32_t*, uint32_t*, int, const int64_t*, const int*) {
  no_cuda("cuda::permute");
}
void gather_rows(const float*, int64_t, const int32_t*, int64_t, float*) {
  no_cuda("cuda::gather_rows");
}
void scatter_add_rows(float*, int64_t, int64_t, const int32_t*, int64_t, const float*) {
  no_cuda("cuda::scatter_add_rows");
}
void broadcast_to(const uint32_t*, const int64_t*, int, const int64_t*, uint32_t*) {
  no_cuda("cuda::broadcast_to");
}
void sum_to(const float*, int, const int64_t*, const uint8_t*, float*) { no_cuda("cuda::sum_to"); }
void slice(const uint32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t*) {
  no_cuda("cuda::slice");
}
void slice_add(float*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t) {
  no_cuda("cuda::slice_add");
}
void concat(int, const uint32_t* const*, const int64_t*, int64_t, int64_t, uint32_t*) {
  no_cuda("cuda::concat");
}

}  // namespace clustr::cuda

// The CUDA backend when clustr is built without the toolkit: every call that needs a GPU
// throws a clear error; queries answer "not available".
#include "core/cuda/cuda.h"
#include "core/error.h"

namespace clustr {

void cuda::no_backend(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}

bool cuda::compiled() { return false; }
bool cuda::emulated() { return false; }
bool cuda::exact_numerics() { return false; }
bool cuda::available() { return false; }
std::string cuda::unavailable_reason() { return "clustr was built without the CUDA backend"; }
void cuda::require(const char* what) { no_backend(what); }
cuda::LaunchCounts cuda::launch_counts() { return {}; }

// Nothing can be queued, so the current stream is always the default one; a Stream or an Event
// cannot be made (their other members are reachable only through a moved-from object).
cuda::StreamHandle cuda::current_stream() { return kDefaultStream; }

cuda::Stream::Stream() { no_backend("cuda::Stream"); }
cuda::Stream::~Stream() {}
cuda::Stream& cuda::Stream::operator=(Stream&& other) noexcept {
  h_ = other.h_;
  other.h_ = nullptr;
  return *this;
}
cuda::StreamHandle cuda::Stream::handle() const { no_backend("cuda::Stream::handle"); }
void cuda::Stream::synchronize() const { no_backend("cuda::Stream::synchronize"); }

cuda::StreamGuard::StreamGuard(const Stream& s) : StreamGuard(s.handle()) {}
cuda::StreamGuard::StreamGuard(StreamHandle s) : previous_(kDefaultStream) {
  if (s != kDefaultStream) no_backend("cuda::StreamGuard");
}
cuda::StreamGuard::~StreamGuard() {}

cuda::Event::Event() { no_backend("cuda::Event"); }
cuda::Event::~Event() {}
cuda::Event& cuda::Event::operator=(Event&& other) noexcept {
  h_ = other.h_;
  other.h_ = nullptr;
  return *this;
}
void cuda::Event::record() { no_backend("cuda::Event::record"); }
void cuda::Event::record(const Stream&) { no_backend("cuda::Event::record"); }
void cuda::Event::wait() const { no_backend("cuda::Event::wait"); }
void cuda::Event::wait(const Stream&) const { no_backend("cuda::Event::wait"); }
bool cuda::Event::query() const { no_backend("cuda::Event::query"); }
void cuda::Event::synchronize() const { no_backend("cuda::Event::synchronize"); }

cuda::Graph::~Graph() {}
cuda::Graph::Graph(Graph&& other) noexcept : exec_(other.exec_), pool_(other.pool_) {}
cuda::Graph& cuda::Graph::operator=(Graph&&) noexcept { return *this; }
void cuda::Graph::release() noexcept {}
void cuda::Graph::capture(const std::function<void()>&, const Graph*) {
  no_backend("cuda::Graph::capture");
}
void cuda::Graph::replay() { no_backend("cuda::Graph::replay"); }
size_t cuda::Graph::pool_bytes() const { return 0; }
bool cuda::capturing() { return false; }
unsigned* cuda::arrival_counters(int64_t, const char* kernel) {
  no_backend(kernel);
  return nullptr;
}
cuda::DeferredChecks::DeferredChecks() : previous_(false) { no_backend("cuda::DeferredChecks"); }
cuda::DeferredChecks::~DeferredChecks() {}
bool cuda::deferring_checks() { return false; }
void cuda::check_range_on_device(const char*, const char*, const int32_t*, int64_t, int32_t,
                                 int32_t, int32_t) {
  no_backend("cuda::check_range_on_device");
}
void cuda::check_not_below_on_device(const char*, const char*, const float*, int64_t, float) {
  no_backend("cuda::check_not_below_on_device");
}
void cuda::raise_device_errors() {}
void cuda::make_device_check_record() {}

void* cuda::alloc(size_t) { no_backend("cuda::alloc"); }
void cuda::free(void*, size_t) {}
MemoryStats cuda::memory_stats() { return {}; }
void cuda::reset_peak() {}
void cuda::empty_cache() {}
size_t cuda::cached_bytes() { return 0; }

void cuda::copy_h2d(void*, const void*, size_t) { no_backend("cuda::copy_h2d"); }
void cuda::copy_d2h(void*, const void*, size_t) { no_backend("cuda::copy_d2h"); }
void cuda::copy_d2d(void*, const void*, size_t) { no_backend("cuda::copy_d2d"); }
cuda::PinnedBuffer::PinnedBuffer(size_t) { no_backend("cuda::PinnedBuffer"); }
cuda::PinnedBuffer::~PinnedBuffer() {}
cuda::PinnedBuffer& cuda::PinnedBuffer::operator=(PinnedBuffer&&) noexcept { return *this; }
void cuda::copy_h2d_async(void*, const void*, size_t) { no_backend("cuda::copy_h2d_async"); }
void cuda::fill_f32(float*, float, int64_t) { no_backend("cuda::fill_f32"); }
void cuda::fill_i32(int32_t*, int32_t, int64_t) { no_backend("cuda::fill_i32"); }
void cuda::synchronize() {}

void cuda::gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                int64_t, float, float*, int64_t) {
  no_backend("cuda::gemm");
}
void cuda::gemm_strided_batched(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                int64_t, const float*, int64_t, int64_t, float, float*, int64_t,
                                int64_t, int64_t) {
  no_backend("cuda::gemm_strided_batched");
}
void cuda::gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, int64_t,
                     const uint16_t*, int64_t, float, float*, int64_t) {
  no_backend("cuda::gemm_bf16");
}
void cuda::gemm_bf16_strided_batched(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*,
                                     int64_t, int64_t, const uint16_t*, int64_t, int64_t, float,
                                     float*, int64_t, int64_t, int64_t) {
  no_backend("cuda::gemm_bf16_strided_batched");
}
void cuda::set_tf32(bool) { no_backend("cuda::set_tf32"); }
bool cuda::gemm_epilogue(const EpilogueGemm&) { no_backend("cuda::gemm_epilogue"); }
bool cuda::tf32() { return false; }
void cuda::f32_to_bf16(const float*, uint16_t*, int64_t) { no_backend("cuda::f32_to_bf16"); }
void cuda::bf16_to_f32(const uint16_t*, float*, int64_t) { no_backend("cuda::bf16_to_f32"); }
void cuda::fill_u16(uint16_t*, uint16_t, int64_t) { no_backend("cuda::fill_u16"); }

void cuda::binary(BinaryOp, int, const int64_t*, const float*, const int64_t*, const float*,
                  const int64_t*, float*) {
  no_backend("cuda::binary");
}
void cuda::binary_scalar(BinaryOp, const float*, float, float*, int64_t) {
  no_backend("cuda::binary_scalar");
}
void cuda::unary(UnaryOp, const float*, float*, int64_t) { no_backend("cuda::unary"); }
void cuda::axpy(float, const float*, float*, int64_t) { no_backend("cuda::axpy"); }
void cuda::reduce(ReduceOp, const float*, float*, int64_t, int64_t, int64_t) {
  no_backend("cuda::reduce");
}
void cuda::argmax(const float*, int32_t*, int64_t, int64_t, int64_t) { no_backend("cuda::argmax"); }
void cuda::count_equal(const int32_t*, const int32_t*, int32_t, int64_t, float*) {
  no_backend("cuda::count_equal");
}
void cuda::softmax(const float*, float*, int64_t, int64_t) { no_backend("cuda::softmax"); }
void cuda::log_softmax(const float*, float*, int64_t, int64_t) { no_backend("cuda::log_softmax"); }
void cuda::dropout(const float*, float, uint64_t, PhiloxOffset, float*, int64_t) {
  no_backend("cuda::dropout");
}
void cuda::unary_backward(UnaryOp, const float*, const float*, const float*, float*, int64_t) {
  no_backend("cuda::unary_backward");
}
void cuda::softmax_backward(const float*, const float*, float*, int64_t, int64_t) {
  no_backend("cuda::softmax_backward");
}
void cuda::log_softmax_backward(const float*, const float*, float*, int64_t, int64_t) {
  no_backend("cuda::log_softmax_backward");
}
void cuda::layer_norm(const float*, const float*, const float*, float, float*, float*, float*,
                      int64_t, int64_t) {
  no_backend("cuda::layer_norm");
}
void cuda::layer_norm_backward(const float*, const float*, const float*, const float*, const float*,
                               float*, float*, float*, int64_t, int64_t) {
  no_backend("cuda::layer_norm_backward");
}
void cuda::add_layer_norm(const float*, const float*, const float*, const float*, float, float*,
                          float*, float*, int64_t, int64_t) {
  no_backend("cuda::add_layer_norm");
}
void cuda::add_layer_norm_backward(const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*, int64_t,
                                   int64_t) {
  no_backend("cuda::add_layer_norm_backward");
}
void cuda::bias_activation(float*, const float*, bool, int64_t, int64_t) {
  no_backend("cuda::bias_activation");
}
void cuda::cross_entropy(const float*, const int32_t*, const float*, int32_t, float*, int64_t,
                         int64_t, bool, float*, float*, float*, int32_t*) {
  no_backend("cuda::cross_entropy");
}
void cuda::cross_entropy_backward(const float*, const float*, const float*, const int32_t*,
                                  const float*, const float*, int32_t, float*, int64_t, int64_t) {
  no_backend("cuda::cross_entropy_backward");
}
void cuda::permute(const uint32_t*, uint32_t*, int, const int64_t*, const int*) {
  no_backend("cuda::permute");
}
void cuda::gather_rows(const float*, int64_t, int64_t, const int32_t*, int64_t, const float*,
                       int64_t, float*) {
  no_backend("cuda::gather_rows");
}
void cuda::scatter_add_rows(float*, int64_t, int64_t, const int32_t*, int64_t, const float*) {
  no_backend("cuda::scatter_add_rows");
}
void cuda::scatter_sum_rows(float*, int64_t, int64_t, const int32_t*, int64_t, const float*) {
  no_backend("cuda::scatter_sum_rows");
}
void cuda::broadcast_to(const uint32_t*, const int64_t*, int, const int64_t*, uint32_t*) {
  no_backend("cuda::broadcast_to");
}
void cuda::sum_to(const float*, int, const int64_t*, const uint8_t*, float*) {
  no_backend("cuda::sum_to");
}
void cuda::slice(const uint32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t*) {
  no_backend("cuda::slice");
}
void cuda::slice_add(float*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t) {
  no_backend("cuda::slice_add");
}
void cuda::split(const uint32_t*, int64_t, int64_t, int, const int64_t*, uint32_t* const*) {
  no_backend("cuda::split");
}
void cuda::concat(int, const uint32_t* const*, const int64_t*, int64_t, int64_t, uint32_t*) {
  no_backend("cuda::concat");
}

}  // namespace clustr

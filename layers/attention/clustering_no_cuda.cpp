// The query clustering CUDA kernels when clustr is built without the CUDA backend: every call
// throws a clear error (no tensor can be on a CUDA device in such a build, so these are reached
// only by calling them directly).
#include "core/error.h"
#include "layers/attention/clustering_cuda.h"

namespace clustr::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

void cluster_hash(const ClusteringDims&, const float*, const float*, const int32_t*, uint64_t,
                  uint64_t, uint64_t*) {
  no_cuda("cuda::cluster_hash");
}
void cluster_seed(const ClusteringDims&, const uint64_t*, const int32_t*, uint64_t, uint64_t,
                  uint64_t*, int32_t*) {
  no_cuda("cuda::cluster_seed");
}
void cluster_lloyd(const ClusteringDims&, const uint64_t*, const int32_t*, const int32_t*,
                   uint64_t*, int32_t*, int32_t*) {
  no_cuda("cuda::cluster_lloyd");
}

}  // namespace clustr::cuda

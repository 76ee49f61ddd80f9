// The attention types' and the clustering's CUDA kernels when clustr is built without the CUDA
// backend (clustr_cuda_sources' NO_CUDA sources): each throws cuda::no_backend's error. No tensor
// can be on a CUDA device in such a build, so they are reached only by calling them directly.
#include "core/cuda/cuda.h"
#include "layers/attention/cuda/clustered.h"
#include "layers/attention/cuda/clustering.h"
#include "layers/attention/cuda/flash.h"
#include "layers/attention/cuda/full.h"
#include "layers/attention/cuda/improved_clustered.h"
#include "layers/attention/cuda/reformer.h"

namespace clustr {

// cuda/full.h
int64_t cuda::full_attention_forward_workspace(const cpu::FullAttentionDims&) {
  no_backend("cuda::full_attention_forward_workspace");
}
int64_t cuda::full_attention_backward_workspace(const cpu::FullAttentionDims&) {
  no_backend("cuda::full_attention_backward_workspace");
}
void cuda::full_attention_forward(const cpu::FullAttentionDims&, const cpu::FullAttentionParams&,
                                  const float*, const float*, const float*, float*, float*,
                                  float*) {
  no_backend("cuda::full_attention_forward");
}
void cuda::full_attention_backward(const cpu::FullAttentionDims&, const cpu::FullAttentionParams&,
                                   const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*, float*) {
  no_backend("cuda::full_attention_backward");
}

// cuda/flash.h
bool cuda::flash_attention_applies(const cpu::FullAttentionDims&, const cpu::FullAttentionLayout&,
                                   const cpu::FullAttentionParams&,
                                   std::initializer_list<const float*>) {
  no_backend("cuda::flash_attention_applies");
}
int64_t cuda::flash_attention_forward_workspace(const cpu::FullAttentionDims&,
                                                const cpu::FullAttentionParams&) {
  no_backend("cuda::flash_attention_forward_workspace");
}
int64_t cuda::flash_attention_backward_workspace(const cpu::FullAttentionDims&,
                                                 const cpu::FullAttentionParams&) {
  no_backend("cuda::flash_attention_backward_workspace");
}
void cuda::flash_attention_forward(const cpu::FullAttentionDims&, const cpu::FullAttentionLayout&,
                                   const cpu::FullAttentionParams&, const int32_t*, const float*,
                                   const float*, const float*, float*, float*, float*) {
  no_backend("cuda::flash_attention_forward");
}
void cuda::flash_attention_backward(const cpu::FullAttentionDims&,
                                    const cpu::FullAttentionLayout&,
                                    const cpu::FullAttentionParams&, const int32_t*, const float*,
                                    const float*, const float*, const float*, const float*,
                                    const float*, float*, float*, float*, float*) {
  no_backend("cuda::flash_attention_backward");
}

// cuda/clustering.h
void cuda::cluster_hash(const ClusteringDims&, const float*, const float*, const int32_t*, uint64_t,
                        PhiloxOffset, uint64_t*) {
  no_backend("cuda::cluster_hash");
}
void cuda::cluster_seed(const ClusteringDims&, const uint64_t*, const int32_t*, uint64_t,
                        PhiloxOffset, uint64_t*, int32_t*) {
  no_backend("cuda::cluster_seed");
}
void cuda::cluster_lloyd(const ClusteringDims&, const uint64_t*, const int32_t*, const int32_t*,
                         uint64_t*, int32_t*, int32_t*) {
  no_backend("cuda::cluster_lloyd");
}
void cuda::cluster_seed_lloyd(const ClusteringDims&, const uint64_t*, const int32_t*, uint64_t,
                              PhiloxOffset, uint64_t*, int32_t*, int32_t*, int32_t*) {
  no_backend("cuda::cluster_seed_lloyd");
}

// cuda/clustered.h
int64_t cuda::clustered_attention_forward_workspace(const ClusteredDims&, const ClusteredParams&) {
  no_backend("cuda::clustered_attention_forward_workspace");
}
int64_t cuda::clustered_attention_backward_workspace(const ClusteredDims&, const ClusteredParams&) {
  no_backend("cuda::clustered_attention_backward_workspace");
}
void cuda::clustered_attention_forward(const ClusteredDims&, const ClusteredParams&, const float*,
                                       const float*, const float*, float*, float*, float*, float*) {
  no_backend("cuda::clustered_attention_forward");
}
void cuda::clustered_attention_backward(const ClusteredDims&, const ClusteredParams&, const float*,
                                        const float*, const float*, const float*, const float*,
                                        float*, float*, float*, float*) {
  no_backend("cuda::clustered_attention_backward");
}

void cuda::group_members(const ClusteredDims&, const int32_t*, int32_t*, int32_t*, int32_t*) {
  no_backend("cuda::group_members");
}

// cuda/improved_clustered.h
int64_t cuda::improved_clustered_attention_forward_workspace(const ClusteredDims&, int64_t,
                                                             const ClusteredParams&) {
  no_backend("cuda::improved_clustered_attention_forward_workspace");
}
int64_t cuda::improved_clustered_attention_backward_workspace(const ClusteredDims&, int64_t,
                                                              const ClusteredParams&) {
  no_backend("cuda::improved_clustered_attention_backward_workspace");
}
void cuda::improved_clustered_attention_forward(const ClusteredDims&, const ClusteredParams&,
                                                int64_t, int64_t, const float*, const float*,
                                                const float*, float*, float*, float*, int32_t*,
                                                float*, float*) {
  no_backend("cuda::improved_clustered_attention_forward");
}
void cuda::improved_clustered_attention_backward(const ClusteredDims&, const ClusteredParams&,
                                                 int64_t, const float*, const float*, const float*,
                                                 const float*, const float*, const int32_t*,
                                                 const float*, const float*, float*, float*, float*,
                                                 float*) {
  no_backend("cuda::improved_clustered_attention_backward");
}

// cuda/reformer.h
void cuda::reformer_attention_forward(const ReformerDims&, const int32_t*, float,
                                      const ReformerDropout&, const float*, const float*,
                                      const float*, float*, int32_t*, float*) {
  no_backend("cuda::reformer_attention_forward");
}
void cuda::reformer_attention_backward(const ReformerDims&, const int32_t*, float,
                                       const ReformerDropout&, const float*, const float*,
                                       const float*, const int32_t*, const float*, const float*,
                                       float*, float*) {
  no_backend("cuda::reformer_attention_backward");
}
void cuda::reformer_buckets(const ReformerDims&, const int32_t*, const float*, const float*,
                            int32_t*) {
  no_backend("cuda::reformer_buckets");
}

}  // namespace clustr

// CPU kernels of improved clustered attention (improved_clustered.h gives the semantics, the
// front doors in improved_clustered.cpp check the arguments): raw pointers in the layouts of
// improved_clustered.h, the sizes and parameters of clustered_common.h, OpenMP inside. Every
// output is overwritten (=); deterministic at any thread count (docs/ARCHITECTURE.md, "Threads
// and determinism"; improved_clustered_cpu.cpp says how).
#pragma once

#include <cstdint>

#include "layers/attention/clustered_common.h"

namespace clustr::cpu {

// out, weights (Ac), centroids, counts, topk (T_j, ascending, -1 padded; kw = min(k, S)) and
// mass (m_j) for Q, K, V.
void improved_clustered_attention_forward(const clustered_detail::Dims& d,
                                          const clustered_detail::Params& p,
                                          const clustered_detail::Dropout& drop, int64_t topk,
                                          int64_t kw, const float* q, const float* k,
                                          const float* v, float* out, float* ac, float* qc,
                                          int32_t* count, int32_t* tk, float* mass);

// dQ, dK, dV from dout and the forward's ac, qc, tk and mass.
void improved_clustered_attention_backward(const clustered_detail::Dims& d,
                                           const clustered_detail::Params& p,
                                           const clustered_detail::Dropout& drop, int64_t kw,
                                           const float* q, const float* k, const float* v,
                                           const float* ac, const float* qc, const int32_t* tk,
                                           const float* mass, const float* dout, float* dQ,
                                           float* dK, float* dV);

}  // namespace clustr::cpu

// CLUSTR_HD marks functions that are compiled for both the host and a CUDA device. Per-element
// math that both backends use is written once with it (see core/math.h, core/philox.h).
#pragma once

#if defined(__CUDACC__)
#define CLUSTR_HD __host__ __device__ __forceinline__
#else
#define CLUSTR_HD inline
#endif

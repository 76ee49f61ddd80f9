// The clustered types' row loops (clustered_common.h) compiled for AVX-512, AVX2 and plain
// x86-64 (CLUSTR_ROW_CLONES): the library's other files are compiled for plain x86-64, where
// these loops would run four floats at a time. Without contracted multiply-adds, so that the
// vector lanes and a row's scalar tail compute alike: equal scores give equal weights wherever
// they stand in the row, and the top-k sets break such ties by index alone, as on the device.
#include "core/cpu/row_clones.h"
#include "layers/attention/clustered_common.h"

namespace clustr::clustered_detail {

CLUSTR_ROW_CLONES_NO_CONTRACT
void softmax_row_vectors(float* x, int64_t n, int64_t S) { softmax_row(x, n, S); }

CLUSTR_ROW_CLONES_NO_CONTRACT
void softmax_backward_row(const float* w, float* g, int64_t n) {
  const float dot = cpu::dot_lanes(g, w, n);
  for (int64_t c = 0; c < n; ++c) g[c] = w[c] * (g[c] - dot);
}

CLUSTR_ROW_CLONES_NO_CONTRACT
void add_row(const float* x, int64_t n, float* y) {
  for (int64_t c = 0; c < n; ++c) y[c] += x[c];
}

}  // namespace clustr::clustered_detail

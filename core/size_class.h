// Size classes of the caching allocators (host storage in core/tensor.cpp, device storage in
// core/cuda/runtime.cu): a request is rounded up so that nearby sizes share a class and a freed
// block can serve the next request of about the same size. Multiples of 512 bytes below 4 KiB,
// above that 8 classes per power of two (waste under 12.5%).
#pragma once

#include <cstddef>

namespace clustr {

inline size_t size_class(size_t bytes) {
  size_t step = 512;
  if (bytes >= 4096) {
    size_t p = 1;  // the largest power of two <= bytes
    while (p <= bytes / 2) p <<= 1;
    step = p / 8;
  }
  return (bytes + step - 1) / step * step;
}

}  // namespace clustr

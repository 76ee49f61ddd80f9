// Thread count for the CPU kernels (OpenMP). Results never depend on it.
#pragma once

namespace clustr {
int num_threads();           // threads the next parallel region will use
void set_num_threads(int n);  // n >= 1
}  // namespace clustr

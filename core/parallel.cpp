#include "core/parallel.h"

#include "core/error.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace clustr {

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
  CLUSTR_CHECK(n >= 1, "set_num_threads: expected n >= 1, got ", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

}  // namespace clustr

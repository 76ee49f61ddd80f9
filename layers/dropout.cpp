// The dropout module (see dropout.h).
#include "layers/dropout.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

// ---- Dropout --------------------------------------------------------------------------------

Dropout::Dropout(float p) : p_(p) {
  CLUSTR_CHECK(p >= 0.0f && p < 1.0f, "Dropout: expected a drop probability p in [0, 1), got ", p);
}

Variable Dropout::forward(const Variable& x, Generator& gen) const {
  return dropout(x, p_, gen, training());
}

}  // namespace clustr

// The layer norm module (see layer_norm.h).
#include "layers/layer_norm.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

// ---- LayerNorm ------------------------------------------------------------------------------

LayerNorm::LayerNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  CLUSTR_CHECK(dim > 0, "LayerNorm: expected a positive dimension, got ", dim);
  CLUSTR_CHECK(eps > 0.0f, "LayerNorm: expected eps > 0, got ", eps);
  weight_ = register_parameter("weight", Tensor::full({dim}, 1.0f));
  bias_ = register_parameter("bias", Tensor::zeros({dim}));
}

Variable LayerNorm::forward(const Variable& x) const {
  CLUSTR_CHECK(x.defined(), "LayerNorm(", dim_, "): x is undefined");
  CLUSTR_CHECK(x.rank() >= 1 && x.shape().back() == dim_, "LayerNorm(", dim_,
               "): expected x (..., ", dim_, "), got ", describe(x.data()));
  return layer_norm(x, weight_, bias_, eps_);
}

Variable LayerNorm::forward(const Variable& a, const Variable& b) const {
  CLUSTR_CHECK(a.defined() && b.defined(), "LayerNorm(", dim_, "): a or b is undefined");
  CLUSTR_CHECK(a.rank() >= 1 && a.shape().back() == dim_ && b.shape() == a.shape(), "LayerNorm(",
               dim_, "): expected a and b of one shape (..., ", dim_, "), got ",
               describe(a.data()), " and ", describe(b.data()));
  return add_layer_norm(a, b, weight_, bias_, eps_);
}

}  // namespace clustr

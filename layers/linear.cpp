// The linear layer and the feed-forward block (see linear.h). Each forward checks its input
// once and names the layer and the shapes in its error, then composes differentiable ops.
#include "layers/linear.h"

#include <cmath>

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

// ---- Linear ---------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen)
    : in_(in_features), out_(out_features) {
  CLUSTR_CHECK(in_features > 0 && out_features > 0,
               "Linear: expected positive in and out features, got in=", in_features,
               " out=", out_features);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  Tensor w = Tensor::empty({out_features, in_features});
  uniform_(w, gen, -bound, bound);
  weight_ = register_parameter("weight", std::move(w));
  if (bias) {
    Tensor b = Tensor::empty({out_features});
    uniform_(b, gen, -bound, bound);
    bias_ = register_parameter("bias", std::move(b));
  }
}

Variable Linear::forward(const Variable& x) const {
  CLUSTR_CHECK(x.defined(), "Linear(in=", in_, ", out=", out_, "): x is undefined");
  CLUSTR_CHECK(x.rank() >= 1 && x.shape().back() == in_, "Linear(in=", in_, ", out=", out_,
               "): expected x (..., ", in_, "), got ", describe(x.data()));
  return linear(x, weight_, bias_);
}

// ---- activations ------------------------------------------------------------------------------

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  throw Error(detail::cat("unknown activation '", name, "' (expected relu or gelu)"));
}

const char* activation_name(Activation activation) {
  return activation == Activation::relu ? "relu" : "gelu";
}

Variable apply_activation(Activation activation, const Variable& x) {
  return activation == Activation::relu ? relu(x) : gelu(x);
}

// ---- FeedForward ------------------------------------------------------------------------------

FeedForward::FeedForward(int64_t dim, int64_t hidden, Activation activation, float dropout_p,
                         Generator& gen)
    : activation_(activation) {
  linear1_ = register_module("linear1", std::make_shared<Linear>(dim, hidden, true, gen));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout_p));
  linear2_ = register_module("linear2", std::make_shared<Linear>(hidden, dim, true, gen));
}

Variable FeedForward::forward(const Variable& x, Generator& gen) const {
  // (..., D) -> (..., F) -> (..., D)
  const int64_t D = linear1_->in_features(), F = linear1_->out_features();
  CLUSTR_CHECK(x.defined(), "FeedForward(D=", D, ", F=", F, "): x is undefined");
  CLUSTR_CHECK(x.rank() >= 1 && x.shape().back() == D, "FeedForward(D=", D, ", F=", F,
               "): expected x (..., ", D, "), got ", describe(x.data()));
  // Without dropout, ReLU's block is one fused op (bias and ReLU in the first GEMM's store,
  // ReLU's gradient in the GEMM that makes it); the same result as the chain below.
  if (activation_ == Activation::relu && (dropout_->p() == 0.0f || !dropout_->training()))
    return feed_forward_relu(x, linear1_->weight(), linear1_->bias(), linear2_->weight(),
                             linear2_->bias());
  Variable h = apply_activation(activation_, linear1_->forward(x));
  return linear2_->forward(dropout_->forward(h, gen));
}

}  // namespace clustr

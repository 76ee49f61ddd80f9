// The basic layers (see basic.h). Each forward checks its input once and names the layer and
// the shapes in its error, then composes differentiable ops (autograd/ops.h).
#include "layers/basic.h"

#include <cmath>
#include <vector>

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

// ---- Embedding ------------------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen)
    : num_(num_embeddings), dim_(dim) {
  CLUSTR_CHECK(num_embeddings > 0 && dim > 0,
               "Embedding: expected a positive vocabulary and dimension, got V=", num_embeddings,
               " D=", dim);
  Tensor w = Tensor::empty({num_embeddings, dim});
  normal_(w, gen, 0.0f, 1.0f);
  weight_ = register_parameter("weight", std::move(w));
}

Variable Embedding::forward(const Tensor& index) const {
  CLUSTR_CHECK(index.defined() && index.dtype() == DType::i32, "Embedding(V=", num_, ", D=", dim_,
               "): expected an i32 index tensor, got ",
               index.defined() ? describe(index) : std::string("an undefined tensor"));
  return embedding(weight_, index);  // checks the index values against V
}

// ---- Dropout --------------------------------------------------------------------------------

Dropout::Dropout(float p) : p_(p) {
  CLUSTR_CHECK(p >= 0.0f && p < 1.0f, "Dropout: expected a drop probability p in [0, 1), got ", p);
}

Variable Dropout::forward(const Variable& x, Generator& gen) const {
  return dropout(x, p_, gen, training());
}

// ---- positional encoding ---------------------------------------------------------------------

Tensor sinusoidal_positional_encoding(int64_t positions, int64_t dim, Device device) {
  CLUSTR_CHECK(positions >= 0 && dim > 0,
               "sinusoidal_positional_encoding: expected positions >= 0 and dim > 0, got "
               "positions=",
               positions, " dim=", dim);
  std::vector<float> table(static_cast<size_t>(positions * dim));
  // The frequencies are shared by all positions: 1 / 10000^(2i/D) for column pair i.
  std::vector<double> inv_freq(static_cast<size_t>((dim + 1) / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
  for (int64_t pos = 0; pos < positions; ++pos) {
    float* row = table.data() + pos * dim;
    for (int64_t c = 0; c < dim; ++c) {
      const double angle = static_cast<double>(pos) * inv_freq[static_cast<size_t>(c / 2)];
      row[c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return Tensor::from_vector(table, {positions, dim}, device);
}

PositionalEncoding::PositionalEncoding(int64_t dim) : dim_(dim) {
  CLUSTR_CHECK(dim > 0, "PositionalEncoding: expected a positive dimension, got ", dim);
}

Variable PositionalEncoding::forward(const Variable& x) const {
  CLUSTR_CHECK(x.defined(), "PositionalEncoding(", dim_, "): x is undefined");
  CLUSTR_CHECK(x.rank() == 3 && x.size(2) == dim_, "PositionalEncoding(", dim_,
               "): expected x (B, N, ", dim_, "), got ", describe(x.data()));
  const Variable pe(sinusoidal_positional_encoding(x.size(1), dim_, x.device()));
  return add(x, pe);  // (B, N, D) + (N, D)
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

// Token embeddings and the sinusoidal positional encoding (see embedding.h).
#include "layers/embedding.h"

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

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

Variable Embedding::forward(const Tensor& index, const Tensor& added) const {
  CLUSTR_CHECK(index.defined() && index.dtype() == DType::i32, "Embedding(V=", num_, ", D=", dim_,
               "): expected an i32 index tensor, got ",
               index.defined() ? describe(index) : std::string("an undefined tensor"));
  return embedding(weight_, index, added);  // checks the index values against V, added's shape
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

void PositionalEncoding::reserve(int64_t n, Device device) const {
  if (table_.defined() && table_.device() == device && table_.size(0) >= n) return;
  table_ = sinusoidal_positional_encoding(n, dim_, device);
  ++generation_;
}

Variable PositionalEncoding::forward(const Variable& x) const {
  CLUSTR_CHECK(x.defined(), "PositionalEncoding(", dim_, "): x is undefined");
  CLUSTR_CHECK(x.rank() == 3 && x.size(2) == dim_, "PositionalEncoding(", dim_,
               "): expected x (B, N, ", dim_, "), got ", describe(x.data()));
  return add(x, Variable(table(x.size(1), x.device())));  // (B, N, D) + (N, D)
}

Tensor PositionalEncoding::table(int64_t n, Device device) const {
  CLUSTR_CHECK(n >= 0, "PositionalEncoding(", dim_, "): expected n >= 0 positions, got ", n);
  reserve(n, device);
  return table_.size(0) == n ? table_ : table_.rows(0, n);
}

}  // namespace clustr

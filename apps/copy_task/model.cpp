// The copy-task model (model.h).
#include "apps/copy_task/model.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr::copy {

CopyModel::CopyModel(const ModelOptions& o, int64_t vocab, Generator& gen)
    : vocab_(vocab), precision_(o.precision) {
  CLUSTR_CHECK(vocab >= 1, "CopyModel: vocabulary must be >= 1, got ", vocab);
  const int64_t D = o.dim();
  embedding_ = register_module("embedding", std::make_shared<Embedding>(vocab, D, gen));
  position_ = register_module("position", std::make_shared<PositionalEncoding>(D));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  encoder_ = register_module(
      "encoder", std::make_shared<Encoder>(o.layers, D, o.heads, o.feedforward, o.attention,
                                           o.dropout, Activation::relu, o.pre_norm, gen));
  output_ = register_module("output", std::make_shared<Linear>(D, vocab, /*bias=*/true, gen));
}

Variable CopyModel::forward(const Tensor& input, const Tensor& lengths, Generator& gen) const {
  CLUSTR_CHECK(input.defined() && input.dtype() == DType::i32 && input.rank() == 2,
               "CopyModel: expected input i32 (B, N), got ",
               input.defined() ? describe(input) : std::string("an undefined tensor"));
  const PrecisionScope scope(precision_);
  // (B, N, D): the token's row plus its position's, in one pass
  Variable x = embedding_->forward(input, position_->table(input.size(1), input.device()));
  x = dropout_->forward(x, gen);
  x = encoder_->forward(x, lengths, gen);        // (B, N, D)
  return output_->forward(x);                    // (B, N, V)
}

}  // namespace clustr::copy

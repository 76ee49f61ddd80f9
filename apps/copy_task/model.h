// The copy-task model: token embedding + sinusoidal positional encoding + dropout + transformer
// encoder (any attention type) + a linear output layer over the vocabulary.
//
// Legend: B batch, N = 2 length + 2 positions, D = H x E model width, V = symbols + 2
// vocabulary (data/copy_task.h).
// Parameter names: embedding.weight (V, D), encoder.layers.<i>.* (layers/encoder.h),
// encoder.norm.* (pre-norm only), output.weight (V, D), output.bias (V).
//
// The embedding is not scaled: its N(0, 1) rows already have norm about sqrt(D), larger than
// the positional encoding's sqrt(D / 2), so the symbol dominates and the position still shows
// (the sqrt(D) factor of "Attention is all you need" goes with a N(0, 1/D) initialisation).
#pragma once

#include <cstdint>
#include <memory>

#include "apps/copy_task/options.h"
#include "autograd/variable.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/encoder.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace clustr::copy {

class CopyModel : public Module {
 public:
  // Parameters are initialised from gen (layers' PyTorch defaults).
  CopyModel(const ModelOptions& options, int64_t vocab, Generator& gen);

  // input i32 (B, N) token ids in [0, V), lengths i32 (B) -> logits (B, N, V). gen draws
  // dropout masks (training) and the clustered types' hashing.
  Variable forward(const Tensor& input, const Tensor& lengths, Generator& gen) const;

  // Every encoder layer's attention (evaluate a trained model with another type).
  void set_attention(const AttentionConfig& attention) { encoder_->set_attention(attention); }
  // The precision of the model's products (forward sets it for its ops; backward follows).
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }
  int64_t vocab() const { return vocab_; }

 private:
  int64_t vocab_;
  Precision precision_;
  std::shared_ptr<Embedding> embedding_;
  std::shared_ptr<PositionalEncoding> position_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<Linear> output_;
};

}  // namespace clustr::copy

// The speech model: stacked filterbank frames -> Linear to D -> sinusoidal positions -> dropout
// -> transformer encoder (any attention type) -> Linear to the V output classes (blank 0),
// trained with CTC (layers/ctc.h).
//
// Legend: B utterances, T stacked frames (padded), D model width, V classes (the tokens file:
// blank + 39 phones = 40); `features` = k x 40 values per stacked frame, as a word.
// Parameter names: input.weight (D, features), input.bias (D), encoder.layers.<i>.*
// (layers/encoder.h), encoder.norm.* (pre-norm only), output.weight (V, D), output.bias (V).
#pragma once

#include <cstdint>
#include <memory>

#include "apps/speech/options.h"
#include "autograd/variable.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/encoder.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace clustr::speech {

class SpeechModel : public Module {
 public:
  // Parameters are initialised from gen (layers' PyTorch defaults).
  SpeechModel(const ModelOptions& options, int64_t features, int64_t classes, Generator& gen);

  // features f32 (B, T, features), lengths i32 (B) -> logits (B, T, V). gen draws dropout masks
  // (training) and the clustered types' hashing.
  Variable forward(const Tensor& features, const Tensor& lengths, Generator& gen) const;
  // The encoder's input: features (B, T, features) -> (B, T, D) (projection, positions, dropout).
  Variable embed(const Tensor& features, Generator& gen) const;

  // Makes the positional table hold T positions on `device` (PositionalEncoding::reserve); a
  // table made anew shows as a new positions_generation().
  void reserve_positions(int64_t T, Device device) const { position_->reserve(T, device); }
  uint64_t positions_generation() const { return position_->generation(); }

  Encoder& encoder() const { return *encoder_; }
  void set_attention(const AttentionConfig& attention) { encoder_->set_attention(attention); }
  // The precision of the model's products (forward and embed set it for their ops; backward
  // follows).
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }
  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }

 private:
  int64_t features_, classes_;
  Precision precision_;
  std::shared_ptr<Linear> input_;
  std::shared_ptr<PositionalEncoding> position_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<Linear> output_;
};

}  // namespace clustr::speech

// The speech model (model.h).
#include "apps/speech/model.h"

#include "core/error.h"

namespace clustr::speech {

SpeechModel::SpeechModel(const ModelOptions& o, int64_t features, int64_t classes,
                         Generator& gen)
    : features_(features), classes_(classes), precision_(o.precision) {
  CLUSTR_CHECK(features >= 1 && classes >= 2, "SpeechModel: need >= 1 features and >= 2 "
               "classes (blank + labels), got ", features, " and ", classes);
  const int64_t D = o.dim();
  input_ = register_module("input", std::make_shared<Linear>(features, D, /*bias=*/true, gen));
  position_ = register_module("position", std::make_shared<PositionalEncoding>(D));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  encoder_ = register_module(
      "encoder", std::make_shared<Encoder>(o.layers, D, o.heads, o.feedforward, o.attention,
                                           o.dropout, Activation::relu, o.pre_norm, gen));
  output_ = register_module("output", std::make_shared<Linear>(D, classes, /*bias=*/true, gen));
}

Variable SpeechModel::embed(const Tensor& features, Generator& gen) const {
  CLUSTR_CHECK(features.defined() && features.dtype() == DType::f32 && features.rank() == 3 &&
                   features.size(2) == features_,
               "SpeechModel: expected features f32 (B, T, ", features_, "), got ",
               features.defined() ? describe(features) : std::string("an undefined tensor"));
  const PrecisionScope scope(precision_);
  Variable x = input_->forward(Variable(features));  // (B, T, D)
  return dropout_->forward(position_->forward(x), gen);
}

Variable SpeechModel::forward(const Tensor& features, const Tensor& lengths,
                              Generator& gen) const {
  const PrecisionScope scope(precision_);
  const Variable x = encoder_->forward(embed(features, gen), lengths, gen);  // (B, T, D)
  return output_->forward(x);                                               // (B, T, C)
}

}  // namespace clustr::speech

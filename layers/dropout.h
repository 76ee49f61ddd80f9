// The dropout module (the op: autograd/ops.h's dropout).
#pragma once

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/module.h"

namespace clustr {

// Inverted dropout with probability p while training (x itself in evaluation); the mask comes
// from the Generator passed to forward. No parameters.
class Dropout : public Module {
 public:
  explicit Dropout(float p);

  // x (any shape) -> the same shape.
  Variable forward(const Variable& x, Generator& gen) const;

  float p() const { return p_; }

 private:
  float p_;
};

}  // namespace clustr

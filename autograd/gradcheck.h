// gradcheck: compares an op's analytical gradient with central finite differences.
//
// For a function f of some inputs, it draws fixed random weights W of f's output shape and
// checks the gradient of the scalar L = sum(f(x) * W) with respect to every input that
// requires grad: analytical (one backward with W as the upstream gradient) against
// (L(x + eps e_i) - L(x - eps e_i)) / (2 eps) for every element i, with L summed in double.
//
// Tolerances: the inputs and outputs are float32, so a difference quotient carries a rounding
// error of about 1e-7 * |L| / eps on top of the truncation error eps^2 * |f'''| / 6. With the
// defaults eps = 1e-2 (inputs of order 1), the check passes when
//   |analytical - numerical| <= atol + rtol * |numerical|, atol = 2e-3, rtol = 2e-2,
// which is tight enough to catch a wrong factor, sign, missing term or transposition (a test
// shows a deliberately wrong backward failing), and loose enough for float rounding. Keep
// inputs away from kinks (relu at 0, |x| at 0) where the difference quotient is meaningless.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace clustr {

struct GradcheckOptions {
  double eps = 1e-2;
  double atol = 2e-3;
  double rtol = 2e-2;
  uint64_t seed = 1234;  // for the output weights W
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // on failure: input, element index, analytical, numerical
  double max_abs_error = 0;
};

// inputs: values of f's arguments; requires_grad[i] says which to check (all when empty).
GradcheckResult gradcheck(const std::function<Variable(const std::vector<Variable>&)>& f,
                          const std::vector<Tensor>& inputs,
                          const std::vector<bool>& requires_grad = {},
                          const GradcheckOptions& options = {});

}  // namespace clustr

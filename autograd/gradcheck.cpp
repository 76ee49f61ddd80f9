#include "autograd/gradcheck.h"

#include <cmath>

#include "core/error.h"
#include "core/random.h"

namespace clustr {

namespace {

// sum(out * W) in double.
double weighted_sum(const Tensor& out, const std::vector<float>& w) {
  std::vector<float> o = out.to_vector();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += static_cast<double>(o[i]) * w[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Variable(const std::vector<Variable>&)>& f,
                          const std::vector<Tensor>& inputs, const std::vector<bool>& requires_grad,
                          const GradcheckOptions& options) {
  CLUSTR_CHECK(requires_grad.empty() || requires_grad.size() == inputs.size(), "gradcheck: ",
               requires_grad.size(), " requires_grad flags for ", inputs.size(), " inputs");
  auto checked = [&](size_t i) {
    return inputs[i].dtype() == DType::f32 && (requires_grad.empty() || requires_grad[i]);
  };

  // Analytical: one backward with W as the upstream gradient.
  std::vector<Variable> vars;
  for (size_t i = 0; i < inputs.size(); ++i) vars.emplace_back(inputs[i].clone(), checked(i));
  Variable out = f(vars);
  Tensor W = Tensor::empty(out.shape());
  Generator gen(options.seed);
  uniform_(W, gen, -1.0f, 1.0f);
  std::vector<float> w = W.to_vector();
  out.backward(W);

  GradcheckResult result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!checked(i)) continue;
    Tensor analytical = vars[i].grad();
    std::vector<float> a = analytical.defined() ? analytical.to_vector()
                                                : std::vector<float>(inputs[i].numel(), 0.0f);
    int64_t bad = 0;
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      // Central difference over the step that float arithmetic actually takes.
      std::vector<Variable> shifted;
      for (const Tensor& t : inputs) shifted.emplace_back(t.clone(), false);
      float* x = shifted[i].data().f32() + j;
      const float x0 = *x;
      const float hi = x0 + static_cast<float>(options.eps), lo = x0 - static_cast<float>(options.eps);
      double losses[2];
      {
        NoGradGuard no_grad;
        *x = hi;
        losses[0] = weighted_sum(f(shifted).data(), w);
        *x = lo;
        losses[1] = weighted_sum(f(shifted).data(), w);
      }
      double numerical = (losses[0] - losses[1]) / (static_cast<double>(hi) - lo);
      double err = std::fabs(a[j] - numerical);
      result.max_abs_error = std::max(result.max_abs_error, err);
      if (!(err <= options.atol + options.rtol * std::fabs(numerical))) {
        if (bad++ == 0)
          result.message = detail::cat("gradcheck: input ", i, " ", to_string(inputs[i].shape()),
                                       " element ", j, ": analytical ", a[j], ", numerical ",
                                       numerical, " (atol ", options.atol, ", rtol ",
                                       options.rtol, ", eps ", options.eps, ")");
        result.ok = false;
      }
    }
    if (bad > 1) result.message += detail::cat("; ", bad, " elements of input ", i, " differ");
  }
  return result;
}

}  // namespace clustr

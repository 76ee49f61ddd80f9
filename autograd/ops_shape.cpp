// Differentiable shape ops and reductions. None of these saves a tensor: each backward needs
// only shapes, axes and offsets.
//   reshape:    dx = reshape(dy, x.shape)              (a view both ways)
//   permute:    dx = permute(dy, inverse(perm))
//   slice:      dx = zeros(x.shape); dx[..., start:start+len, ...] += dy
//   concat:     dx_k = slice(dy, axis, offset_k, len_k), all k at once (split)
//   sum(axis):  dx = broadcast_to(dy with the axis kept as 1, x.shape); mean scales by 1/len
//   sum_all:    dx = broadcast_to(dy, x.shape);        mean_all scales by 1/numel
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops.h"

namespace clustr {

namespace {

class ReshapeNode : public Node {
 public:
  explicit ReshapeNode(Shape x_shape) : x_shape_(std::move(x_shape)) {}
  const char* name() const override { return "reshape"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {g.reshape(x_shape_)}; }

 private:
  Shape x_shape_;
};

class PermuteNode : public Node {
 public:
  explicit PermuteNode(std::vector<int> inverse) : inverse_(std::move(inverse)) {}
  const char* name() const override { return "permute"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {permute(g, inverse_)}; }

 private:
  std::vector<int> inverse_;
};

class TransposeNode : public Node {
 public:
  TransposeNode(int axis0, int axis1) : axis0_(axis0), axis1_(axis1) {}
  const char* name() const override { return "transpose"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {transpose(g, axis0_, axis1_)};  // a swap is its own inverse
  }

 private:
  int axis0_, axis1_;
};

class SliceNode : public Node {
 public:
  SliceNode(Shape x_shape, int axis, int64_t start)
      : x_shape_(std::move(x_shape)), axis_(axis), start_(start) {}
  const char* name() const override { return "slice"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::zeros(x_shape_, DType::f32, g.device());
    slice_add_(dx, axis_, start_, g);
    return {dx};
  }

 private:
  Shape x_shape_;
  int axis_;
  int64_t start_;
};

class ConcatNode : public Node {
 public:
  ConcatNode(int axis, std::vector<int64_t> lens) : axis_(axis), lens_(std::move(lens)) {}
  const char* name() const override { return "concat"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    if (axis_ == 0) {  // blocks of g's rows: views, no copy
      std::vector<Tensor> parts;
      int64_t begin = 0;
      for (int64_t len : lens_) {
        parts.push_back(g.rows(begin, begin + len));
        begin += len;
      }
      return parts;
    }
    std::vector<bool> wanted(lens_.size());
    for (size_t k = 0; k < lens_.size(); ++k) wanted[k] = needs_grad(k);
    return split(g, axis_, lens_, wanted);  // one pass over g
  }

 private:
  int axis_;
  std::vector<int64_t> lens_;
};

// sum or mean over one axis: keepdim_shape is x's shape with that axis set to 1, scale is 1 for
// sum and 1/len for mean. The scale is applied to dy, which is smaller than dx.
class SumNode : public Node {
 public:
  SumNode(const char* name, Shape x_shape, Shape keepdim_shape, float scale)
      : name_(name), x_shape_(std::move(x_shape)), keepdim_shape_(std::move(keepdim_shape)),
        scale_(scale) {}
  const char* name() const override { return name_; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor gk = g.reshape(keepdim_shape_);
    if (scale_ != 1.0f) gk = mul(gk, scale_);
    return {broadcast_to(gk, x_shape_)};
  }

 private:
  const char* name_;
  Shape x_shape_, keepdim_shape_;
  float scale_;
};

Variable reduce_axis(const char* name, const Variable& x, int axis, bool keepdim, bool is_mean) {
  Tensor y = is_mean ? mean(x.data(), axis, keepdim) : sum(x.data(), axis, keepdim);
  if (!record_needed({&x})) return Variable(std::move(y));
  const int a = normalize_axis(axis, x.rank(), name);
  Shape keepdim_shape = x.shape();
  keepdim_shape[a] = 1;
  const float scale = is_mean ? 1.0f / static_cast<float>(x.shape()[a]) : 1.0f;
  return attach(std::move(y), std::make_shared<SumNode>(name, x.shape(), keepdim_shape, scale),
                {&x});
}

}  // namespace

// x (s) -> shape (same number of elements; one size may be -1). A view of x's storage.
Variable reshape(const Variable& x, const Shape& shape) {
  Tensor y = x.data().reshape(shape);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<ReshapeNode>(x.shape()), {&x});
}

// x (s) -> (s[perm[0]], ..., s[perm[r-1]]).
Variable permute(const Variable& x, const std::vector<int>& perm) {
  Tensor y = permute(x.data(), perm);  // validates perm
  if (!record_needed({&x})) return Variable(std::move(y));
  const int r = x.rank();
  std::vector<int> inverse(perm.size());
  for (int i = 0; i < r; ++i) inverse[perm[i] < 0 ? perm[i] + r : perm[i]] = i;
  return attach(std::move(y), std::make_shared<PermuteNode>(std::move(inverse)), {&x});
}

Variable transpose(const Variable& x, int axis0, int axis1) {
  Tensor y = transpose(x.data(), axis0, axis1);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<TransposeNode>(axis0, axis1), {&x});
}

// x (..., n, ...) -> (..., length, ...).
Variable slice(const Variable& x, int axis, int64_t start, int64_t length) {
  Tensor y = slice(x.data(), axis, start, length);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<SliceNode>(x.shape(), axis, start), {&x});
}

namespace {

// Pieces laid side by side in one storage (Tensor::adjacent_rows: a layer's stacked weights)
// concatenate along axis 0 as a view of them; others are copied.
Tensor concat_or_view(const std::vector<Tensor>& xs, int axis) {
  if (!xs.empty() && xs[0].defined() && xs[0].rank() >= 1 &&
      (axis == 0 || axis == -xs[0].rank()))
    if (Tensor v = Tensor::adjacent_rows(xs); v.defined()) return v;
  return concat(xs, axis);
}

}  // namespace

// xs[k] (..., len_k, ...) -> (..., sum_k len_k, ...).
Variable concat(const std::vector<Variable>& xs, int axis) {
  std::vector<Tensor> data;
  data.reserve(xs.size());
  for (size_t k = 0; k < xs.size(); ++k) {
    CLUSTR_CHECK(xs[k].defined(), "concat: xs[", k, "] is an undefined Variable");
    data.push_back(xs[k].data());
  }
  Tensor y = concat_or_view(data, axis);  // validates shapes and the axis
  bool record = false;
  if (grad_enabled())
    for (const Variable& x : xs) record = record || x.requires_grad();
  if (!record) return Variable(std::move(y));
  const int a = normalize_axis(axis, y.rank(), "concat");
  std::vector<int64_t> lens(xs.size());
  for (size_t k = 0; k < xs.size(); ++k) lens[k] = xs[k].shape()[a];
  return attach(std::move(y), std::make_shared<ConcatNode>(a, std::move(lens)), xs);
}

// x (..., n, ...) -> (..., ...) or (..., 1, ...) with keepdim.
Variable sum(const Variable& x, int axis, bool keepdim) {
  return reduce_axis("sum", x, axis, keepdim, false);
}
Variable mean(const Variable& x, int axis, bool keepdim) {
  return reduce_axis("mean", x, axis, keepdim, true);
}

// x (any shape) -> ().
Variable sum_all(const Variable& x) {
  Tensor y = sum_all(x.data());
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<SumNode>("sum_all", x.shape(), Shape{}, 1.0f),
                {&x});
}

// x (any shape, at least one element) -> ().
Variable mean_all(const Variable& x) {
  const int64_t n = x.numel();
  CLUSTR_CHECK(n > 0, "mean_all: x ", describe(x.data()),
               " has no elements; the mean has no value");
  // The mean of the flattened tensor divides the double sum by n before rounding to float.
  Tensor y = mean(x.data().reshape({n}), 0).reshape({});
  if (!record_needed({&x})) return Variable(std::move(y));
  const float scale = 1.0f / static_cast<float>(n);
  return attach(std::move(y), std::make_shared<SumNode>("mean_all", x.shape(), Shape{}, scale),
                {&x});
}

}  // namespace clustr

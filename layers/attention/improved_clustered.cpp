// Improved clustered attention for a fixed clustering (improved_clustered.h, eq. 9-11): the front
// doors (checks, the results' tensors, the choice of device) and the autograd node. The CPU
// kernels and the backward's derivation are in improved_clustered_cpu.cpp, the CUDA ones in
// cuda/improved_clustered.cu.
#include "layers/attention/improved_clustered.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/random.h"
#include "layers/attention/clustered_common.h"
#include "layers/attention/improved_clustered_cpu.h"
#include "layers/attention/cuda/improved_clustered.h"

namespace clustr {

namespace {

using namespace clustered_detail;

void check_topk(const char* op, int64_t topk) {
  CLUSTR_CHECK(topk >= 1, op, ": expected topk >= 1 (the keys kept per cluster), got ", topk);
}

void check_dropout(const char* op, const ClusteredDropout& drop) {
  CLUSTR_CHECK(drop.p >= 0.0f && drop.p < 1.0f, op,
               ": expected a dropout probability in [0, 1), got ", drop.p);
}

// With `stacked_` its one input is QKV (3, B, H, N, E) and its gradient one tensor of that
// shape, whose slices backward writes.
class ImprovedClusteredAttentionNode : public Node {
 public:
  const char* name() const override { return "improved_clustered_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ImprovedClusteredAttentionGrads into;
    const Tensor stacked = stacked_ ? stacked_grads(name(), Q_, into) : Tensor();
    ImprovedClusteredAttentionGrads d = improved_clustered_attention_backward(
        g, Q_, K_, V_, lengths_, assignment_, saved_, temperature_, into);
    if (stacked_) return {stacked};
    return {std::move(d.dQ), std::move(d.dK), std::move(d.dV)};
  }
  void release() override {
    Q_ = K_ = V_ = lengths_ = assignment_ = Tensor();
    saved_ = ImprovedClusteredAttentionOutput();
  }

  Tensor Q_, K_, V_, lengths_, assignment_;
  ImprovedClusteredAttentionOutput saved_;  // out left undefined
  float temperature_ = 0.0f;
  bool stacked_ = false;
};

}  // namespace

uint64_t improved_clustered_attention_dropout_blocks(const Tensor& Q, const Tensor& K,
                                                     int64_t clusters, int64_t topk) {
  CLUSTR_CHECK(Q.rank() == 4 && K.rank() == 4 && clusters >= 1 && topk >= 1,
               "improved_clustered_attention_dropout_blocks: expected Q (B, H, N, E), K (B, H, ",
               "S, E), clusters >= 1 and topk >= 1, got ", describe(Q), ", ", describe(K), ", ",
               clusters, " and ", topk);
  const int64_t BH = Q.size(0) * Q.size(1), S = K.size(2);
  const uint64_t n = static_cast<uint64_t>(BH * clusters * S + BH * Q.size(2) * std::min(topk, S));
  return (n + 3) / 4;
}

ImprovedClusteredAttentionOutput improved_clustered_attention_forward(
    const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, int64_t clusters, int64_t topk, float temperature,
    const ClusteredDropout& dropout, Precision precision) {
  const char* op = "improved_clustered_attention";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  check_topk(op, topk);
  check_dropout(op, dropout);
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature,
                              true);
  const int64_t kw = std::min(topk, d.S);
  ImprovedClusteredAttentionOutput r;
  r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Q.device());
  r.weights = Tensor::empty({d.B, d.H, d.C, d.S}, DType::f32, Q.device());
  r.centroids = Tensor::empty({d.B, d.H, d.C, d.E}, DType::f32, Q.device());
  r.counts = Tensor::empty({d.B, d.H, d.C}, DType::i32, Q.device());
  r.topk = Tensor::empty({d.B, d.H, d.C, kw}, DType::i32, Q.device());
  r.mass = Tensor::empty({d.B, d.H, d.C}, DType::f32, Q.device());
  r.dropout = dropout;
  r.precision = precision;
  if (Q.device() == Device::cuda) {
    DeviceParams dp;
    device_params(op, d, lengths, assignment, temperature, dropout, precision, dp);
    const cuda::ClusteredDims cd{d.B, d.H, d.N, d.S, d.E, d.M, d.C};
    const Tensor ws =
        device_workspace(cuda::improved_clustered_attention_forward_workspace(cd, kw, dp.p));
    cuda::improved_clustered_attention_forward(cd, dp.p, topk, kw, Q.f32(), K.f32(), V.f32(),
                                               r.out.f32(), r.weights.f32(), r.centroids.f32(),
                                               r.topk.i32(), r.mass.f32(), ws.f32());
    r.counts = dp.count;
    r.start = dp.start;
    r.order = dp.order;
    return r;
  }
  cpu::improved_clustered_attention_forward(
      d, params_of(d, lengths, assignment, temperature, precision),
      dropout_of(dropout.p, dropout.seed,
                 host_offset(dropout.offset, "improved_clustered_attention")),
      topk, kw, Q.f32(), K.f32(), V.f32(),
      r.out.f32(), r.weights.f32(), r.centroids.f32(), r.counts.i32(), r.topk.i32(),
      r.mass.f32());
  return r;
}

ImprovedClusteredAttentionGrads improved_clustered_attention_backward(
    const Tensor& dout, const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, const ImprovedClusteredAttentionOutput& forward,
    float temperature, const ImprovedClusteredAttentionGrads& into) {
  const char* op = "improved_clustered_attention_backward";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  CLUSTR_CHECK(forward.topk.defined() && forward.topk.rank() == 4, op,
               ": expected the forward's topk of shape (B, H, C, min(k, S)), got ",
               forward.topk.defined() ? describe(forward.topk) : "undefined");
  check_dropout(op, forward.dropout);
  const int64_t clusters = forward.topk.size(2), kw = forward.topk.size(3);
  // On the device the forward's grouping of the assignment is reused (its values were checked
  // there); the assignment must be the forward's.
  const bool grouped = K.device() == Device::cuda && forward.start.defined();
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature,
                              true, !grouped);
  check_saved(op, "dout", dout, K, DType::f32, {d.B, d.H, d.N, d.M});
  check_saved(op, "weights", forward.weights, K, DType::f32, {d.B, d.H, d.C, d.S});
  check_saved(op, "centroids", forward.centroids, K, DType::f32, {d.B, d.H, d.C, d.E});
  check_saved(op, "counts", forward.counts, K, DType::i32, {d.B, d.H, d.C});
  check_saved(op, "mass", forward.mass, K, DType::f32, {d.B, d.H, d.C});
  check_saved(op, "topk", forward.topk, K, DType::i32, {d.B, d.H, d.C, kw});
  CLUSTR_CHECK(kw <= d.S, op, ": the forward's topk width ", kw, " exceeds S = ", d.S);
  if (grouped) {
    check_saved(op, "start", forward.start, K, DType::i32, {d.B * d.H * (d.C + 1)});
    check_saved(op, "order", forward.order, K, DType::i32, {d.B * d.H * d.N});
  }
  ImprovedClusteredAttentionGrads g;
  g.dQ = grad_buffer(op, "dQ", into.dQ, Q.shape(), K);
  g.dK = grad_buffer(op, "dK", into.dK, K.shape(), K);
  g.dV = grad_buffer(op, "dV", into.dV, V.shape(), K);
  if (K.device() == Device::cuda) {
    DeviceParams dp;
    device_params(op, d, lengths, assignment, temperature, forward.dropout, forward.precision, dp,
                  forward.counts, forward.start, forward.order);
    const cuda::ClusteredDims cd{d.B, d.H, d.N, d.S, d.E, d.M, d.C};
    const Tensor ws =
        device_workspace(cuda::improved_clustered_attention_backward_workspace(cd, kw, dp.p));
    cuda::improved_clustered_attention_backward(
        cd, dp.p, kw, Q.f32(), K.f32(), V.f32(), forward.weights.f32(), forward.centroids.f32(),
        forward.topk.i32(), forward.mass.f32(), dout.f32(), g.dQ.f32(), g.dK.f32(), g.dV.f32(),
        ws.f32());
    return g;
  }
  cpu::improved_clustered_attention_backward(
      d, params_of(d, lengths, assignment, temperature, forward.precision),
      dropout_of(forward.dropout.p, forward.dropout.seed,
                 host_offset(forward.dropout.offset, "improved_clustered_attention")),
      kw, Q.f32(),
      K.f32(), V.f32(), forward.weights.f32(), forward.centroids.f32(), forward.topk.i32(),
      forward.mass.f32(), dout.f32(), g.dQ.f32(), g.dK.f32(), g.dV.f32());
  return g;
}

namespace {

// The differentiable op on Q, K, V (three inputs) or on QKV stacked (one input).
Variable improved_clustered_attention_op(const std::vector<Variable>& inputs, const Tensor& Q,
                                         const Tensor& K, const Tensor& V, const Tensor& lengths,
                                         const Tensor& assignment, int64_t clusters, int64_t topk,
                                         float temperature, const ClusteredDropout& dropout) {
  ImprovedClusteredAttentionOutput r = improved_clustered_attention_forward(
      Q, K, V, lengths, assignment, clusters, topk, temperature, dropout, current_precision());
  if (!any_record_needed(inputs)) return Variable(std::move(r.out));
  auto node = std::make_shared<ImprovedClusteredAttentionNode>();
  node->stacked_ = inputs.size() == 1;
  node->Q_ = Q;
  node->K_ = K;
  node->V_ = V;
  node->lengths_ = lengths;
  node->assignment_ = assignment;
  Tensor out = std::move(r.out);
  node->saved_ = std::move(r);  // out left undefined
  node->temperature_ = temperature;
  return attach(std::move(out), std::move(node), inputs);
}

}  // namespace

Variable improved_clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                                      const Tensor& lengths, const Tensor& assignment,
                                      int64_t clusters, int64_t topk, float temperature,
                                      const ClusteredDropout& dropout) {
  return improved_clustered_attention_op({Q, K, V}, Q.data(), K.data(), V.data(), lengths,
                                         assignment, clusters, topk, temperature, dropout);
}

Variable improved_clustered_attention(const Variable& QKV, const Tensor& lengths,
                                      const Tensor& assignment, int64_t clusters, int64_t topk,
                                      float temperature, const ClusteredDropout& dropout) {
  const Stacked s = unstack("improved_clustered_attention", QKV.data());
  return improved_clustered_attention_op({QKV}, s.q, s.k, s.v, lengths, assignment, clusters,
                                         topk, temperature, dropout);
}

}  // namespace clustr

// Front doors of the fused full attention (full.h) and its autograd nodes. They check dtypes,
// shapes, devices, lengths and options once, allocate the outputs and the kernels' scratch
// (as tensors, so that memory_stats counts it) on the inputs' device, and call the CPU kernels
// (full_cpu.cpp) or their CUDA twins (cuda/full.cu) with the same raw-pointer arguments.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim.
#include "layers/attention/full.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/attention/full_cpu.h"
#include "layers/attention/cuda/flash.h"
#include "layers/attention/cuda/full.h"

namespace clustr {

namespace {

using detail::check_f32;

void check_options(const char* op, const FullAttentionOptions& options) {
  CLUSTR_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, op,
               ": expected a dropout probability in [0, 1), got ", options.dropout);
  CLUSTR_CHECK(std::isfinite(options.temperature), op,
               ": expected a finite temperature (<= 0 for 1/sqrt(E)), got ",
               options.temperature);
}

// Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), lengths i32 (B) with values in [0, S] or
// undefined, and the options; returns the sizes.
cpu::FullAttentionDims check_inputs(const char* op, const Tensor& Q, const Tensor& K,
                                    const Tensor& V, const Tensor& lengths,
                                    const FullAttentionOptions& options) {
  check_f32(op, "Q", Q);
  check_f32(op, "K", K);
  check_f32(op, "V", V);
  detail::check_same_device(op, Q, K);
  detail::check_same_device(op, Q, V);
  CLUSTR_CHECK(Q.rank() == 4, op, ": expected Q of shape (B, H, N, E), got ", describe(Q));
  cpu::FullAttentionDims d;
  d.B = Q.size(0), d.H = Q.size(1), d.N = Q.size(2), d.E = Q.size(3);
  CLUSTR_CHECK(d.E >= 1, op, ": expected Q with E >= 1 (the last axis), got ", describe(Q));
  CLUSTR_CHECK(K.rank() == 4 && K.size(0) == d.B && K.size(1) == d.H && K.size(3) == d.E, op,
               ": expected K of shape (B, H, S, E) = (", d.B, ", ", d.H, ", S, ", d.E,
               ") to match Q ", describe(Q), ", got ", describe(K));
  d.S = K.size(2);
  CLUSTR_CHECK(V.rank() == 4 && V.size(0) == d.B && V.size(1) == d.H && V.size(2) == d.S, op,
               ": expected V of shape (B, H, S, M) = (", d.B, ", ", d.H, ", ", d.S,
               ", M) to match K ", describe(K), ", got ", describe(V));
  d.M = V.size(3);
  CLUSTR_CHECK(!options.causal || d.N == d.S, op,
               ": causal masking needs as many queries as keys (N == S), got Q ", describe(Q),
               " and K ", describe(K));
  check_options(op, options);
  if (lengths.defined()) detail::check_lengths_deferrable(op, lengths, d.B, d.S, "S", "K", K);
  return d;
}

// qkv (B, N, 3 D) with D = heads E, lengths and the options; returns the sizes (S = N, M = E).
cpu::FullAttentionDims check_qkv(const char* op, const Tensor& qkv, int64_t heads,
                                 const Tensor& lengths, const FullAttentionOptions& options) {
  check_f32(op, "qkv", qkv);
  CLUSTR_CHECK(heads >= 1, op, ": expected at least one head, got ", heads);
  CLUSTR_CHECK(qkv.rank() == 3 && qkv.size(2) % (3 * heads) == 0 && qkv.size(2) > 0, op,
               ": expected qkv of shape (B, N, 3 D) with D a multiple of the ", heads,
               " heads, got ", describe(qkv));
  cpu::FullAttentionDims d;
  d.B = qkv.size(0), d.H = heads, d.N = d.S = qkv.size(1), d.E = d.M = qkv.size(2) / 3 / heads;
  check_options(op, options);
  if (lengths.defined())
    detail::check_lengths_deferrable(op, lengths, d.B, d.N, "N", "qkv", qkv);
  return d;
}

// Where the heads of qkv (and dqkv) and of out (and dout) live: q, k, v at column offsets 0,
// D and 2 D of each token's row of 3 D.
cpu::FullAttentionLayout qkv_layout(const cpu::FullAttentionDims& d) {
  const int64_t D = d.H * d.E;
  const cpu::HeadStrides in = cpu::heads_interleaved(d.N, d.E, 3 * D);
  return {in, in, in, cpu::heads_interleaved(d.N, d.E, D)};
}

// The kernels' parameters, without the lengths: the CPU's and the blocked device kernels read
// them on the host (with_host_lengths), the tensor-core ones on the device, so that their step
// reads nothing back.
cpu::FullAttentionParams params_of(const cpu::FullAttentionDims& d,
                                   const FullAttentionOptions& options) {
  cpu::FullAttentionParams p;
  p.lengths = nullptr;
  p.causal = options.causal;
  p.temperature = options.temperature > 0.0f
                      ? options.temperature
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.E)));
  p.dropout = options.dropout;
  p.seed = options.seed;
  p.offset = options.offset;
  p.bf16 = options.precision == Precision::bf16;
  return p;
}

void check_shape(const char* op, const char* what, const Tensor& t, const Tensor& like,
                 const Shape& shape) {
  check_f32(op, what, t);
  detail::check_same_device(op, like, t);
  CLUSTR_CHECK(t.shape() == shape, op, ": expected ", what, " of shape ", to_string(shape),
               ", got ", describe(t));
}

// The blocked device kernels (cuda/full.h) take contiguous heads, so for them the qkv variant
// permutes the fused projection's heads out and back (the tensor-core kernels of cuda/flash.h
// read and write them in place). cuBLAS could read the interleaved heads in place through the
// leading dimensions, as the CPU kernels do, but the products' outputs (out, dQ, dK, dV) would
// then be batches of interleaved column blocks, which gemm_strided_batched refuses (it requires
// each batch entry's C to lie past the previous one); a permute each way is the simpler correct
// choice, and one pass over qkv is small next to the attention itself.
// qkv (B, N, 3 D) -> (3, B, H, N, E): Q, K, V one after another.
Tensor split_qkv(const Tensor& qkv, const cpu::FullAttentionDims& d) {
  return permute(qkv.reshape({d.B, d.N, 3, d.H, d.E}), {2, 0, 3, 1, 4});
}
// (B, N, D) <-> (B, H, N, E).
Tensor split_heads(const Tensor& x, const cpu::FullAttentionDims& d) {
  return permute(x.reshape({d.B, d.N, d.H, d.E}), {0, 2, 1, 3});
}
Tensor merge_heads(const Tensor& x, const cpu::FullAttentionDims& d) {
  return permute(x, {0, 2, 1, 3}).reshape({d.B, d.N, d.H * d.E});
}

// p with the lengths as a host array (for device lengths a copy, kept in host_copy), checked
// here when the front door's check went to the device (check_lengths_deferrable).
cpu::FullAttentionParams with_host_lengths(cpu::FullAttentionParams p, const Tensor& lengths,
                                           std::vector<int32_t>& host_copy,
                                           const cpu::FullAttentionDims& d) {
  p.lengths = lengths.defined() ? detail::host_i32(lengths, host_copy) : nullptr;
  for (int64_t b = 0; p.lengths && b < d.B; ++b)
    CLUSTR_CHECK(p.lengths[b] >= 0 && p.lengths[b] <= d.S, "full_attention: lengths[", b,
                 "] = ", p.lengths[b], " is outside [0, S = ", d.S, "]");
  return p;
}

// with_host_lengths for a CPU kernel, which reads the dropout's offset on the host.
cpu::FullAttentionParams for_cpu(const cpu::FullAttentionParams& p, const Tensor& lengths,
                                 std::vector<int32_t>& host_copy,
                                 const cpu::FullAttentionDims& d) {
  host_offset(p.offset, "full_attention");
  return with_host_lengths(p, lengths, host_copy, d);
}

// Scratch for a kernel: `floats` floats (an undefined tensor when none are needed).
Tensor workspace(int64_t floats, Device device) {
  return floats > 0 ? Tensor::empty({floats}, DType::f32, device) : Tensor();
}
float* data_of(Tensor& ws) { return ws.defined() ? ws.f32() : nullptr; }

// The lengths as the fused device kernels read them (on the device, as check_lengths requires).
const int32_t* device_lengths(const Tensor& lengths) {
  return lengths.defined() ? lengths.i32() : nullptr;
}

// On the device, calls that cuda::flash_attention_applies to run the tensor-core kernels
// (cuda/flash.h), reading and writing the heads in place in any layout; the others run the
// blocked kernels of cuda/full.h on contiguous heads.
void device_forward(const cpu::FullAttentionDims& d, const cpu::FullAttentionLayout& lay,
                    const cpu::FullAttentionParams& p, const Tensor& lengths, const float* Q,
                    const float* K, const float* V, float* out, float* logsumexp) {
  if (cuda::flash_attention_applies(d, lay, p, {Q, K, V, out})) {
    Tensor ws = workspace(cuda::flash_attention_forward_workspace(d, p), Device::cuda);
    cuda::flash_attention_forward(d, lay, p, device_lengths(lengths), Q, K, V, out, logsumexp,
                                  data_of(ws));
    return;
  }
  Tensor ws = workspace(cuda::full_attention_forward_workspace(d), Device::cuda);
  std::vector<int32_t> host_lengths;
  cuda::full_attention_forward(d, with_host_lengths(p, lengths, host_lengths, d), Q, K, V, out,
                               logsumexp, data_of(ws));
}
void device_backward(const cpu::FullAttentionDims& d, const cpu::FullAttentionLayout& lay,
                     const cpu::FullAttentionParams& p, const Tensor& lengths, const float* Q,
                     const float* K, const float* V, const float* out, const float* logsumexp,
                     const float* dout, float* dQ, float* dK, float* dV) {
  if (cuda::flash_attention_applies(d, lay, p, {Q, K, V, out, dout, dQ, dK, dV})) {
    Tensor ws = workspace(cuda::flash_attention_backward_workspace(d, p), Device::cuda);
    cuda::flash_attention_backward(d, lay, p, device_lengths(lengths), Q, K, V, out, logsumexp,
                                   dout, dQ, dK, dV, data_of(ws));
    return;
  }
  Tensor ws = workspace(cuda::full_attention_backward_workspace(d), Device::cuda);
  std::vector<int32_t> host_lengths;
  cuda::full_attention_backward(d, with_host_lengths(p, lengths, host_lengths, d), Q, K, V, out,
                                logsumexp, dout, dQ, dK, dV, data_of(ws));
}

// The options of a differentiable op: bf16 products when the options or this thread's
// precision say so (recorded in the node, so that backward uses the same).
FullAttentionOptions with_thread_precision(FullAttentionOptions options) {
  if (current_precision() == Precision::bf16) options.precision = Precision::bf16;
  return options;
}

// Saves the inputs, the output and the per-row log-sum-exp; backward recomputes the weights.
class FullAttentionNode : public Node {
 public:
  const char* name() const override { return "full_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    FullAttentionGrads d = full_attention_backward(g, Q_, K_, V_, out_, lse_, lengths_, options_);
    return {std::move(d.dQ), std::move(d.dK), std::move(d.dV)};
  }
  void release() override { Q_ = K_ = V_ = out_ = lse_ = lengths_ = Tensor(); }

  Tensor Q_, K_, V_, out_, lse_, lengths_;
  FullAttentionOptions options_;
};

class FullAttentionQkvNode : public Node {
 public:
  const char* name() const override { return "full_attention_qkv"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {full_attention_qkv_backward(g, qkv_, heads_, out_, lse_, lengths_, options_)};
  }
  void release() override { qkv_ = out_ = lse_ = lengths_ = Tensor(); }

  Tensor qkv_, out_, lse_, lengths_;
  int64_t heads_ = 1;
  FullAttentionOptions options_;
};

}  // namespace

FullAttentionOutput full_attention_forward(const Tensor& Q, const Tensor& K, const Tensor& V,
                                           const Tensor& lengths,
                                           const FullAttentionOptions& options) {
  const char* op = "full_attention";
  const cpu::FullAttentionDims d = check_inputs(op, Q, K, V, lengths, options);
  FullAttentionOutput r;
  r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Q.device());
  r.logsumexp = Tensor::empty({d.B, d.H, d.N}, DType::f32, Q.device());
  if (d.B * d.H * d.N == 0) return r;
  const cpu::FullAttentionParams p = params_of(d, options);
  if (Q.device() == Device::cuda) {
    device_forward(d, cpu::contiguous_layout(d), p, lengths, Q.f32(), K.f32(), V.f32(),
                   r.out.f32(), r.logsumexp.f32());
    return r;
  }
  const int threads = num_threads();
  Tensor ws = workspace(cpu::full_attention_forward_workspace(d, threads), Q.device());
  std::vector<int32_t> host_lengths;
  cpu::full_attention_forward(d, cpu::contiguous_layout(d),
                              for_cpu(p, lengths, host_lengths, d), Q.f32(), K.f32(), V.f32(),
                              r.out.f32(), r.logsumexp.f32(), ws.defined() ? ws.f32() : nullptr,
                              threads);
  return r;
}

FullAttentionGrads full_attention_backward(const Tensor& dout, const Tensor& Q, const Tensor& K,
                                           const Tensor& V, const Tensor& out,
                                           const Tensor& logsumexp, const Tensor& lengths,
                                           const FullAttentionOptions& options) {
  const char* op = "full_attention_backward";
  const cpu::FullAttentionDims d = check_inputs(op, Q, K, V, lengths, options);
  check_shape(op, "dout", dout, Q, {d.B, d.H, d.N, d.M});
  check_shape(op, "out", out, Q, {d.B, d.H, d.N, d.M});
  check_shape(op, "logsumexp", logsumexp, Q, {d.B, d.H, d.N});
  FullAttentionGrads g;
  g.dQ = Tensor::empty(Q.shape(), DType::f32, Q.device());
  g.dK = Tensor::empty(K.shape(), DType::f32, Q.device());
  g.dV = Tensor::empty(V.shape(), DType::f32, Q.device());
  if (d.B * d.H * d.N == 0) {  // no query: dQ is empty, and dK = dV = 0
    g.dK.fill(0.0f);
    g.dV.fill(0.0f);
    return g;
  }
  const cpu::FullAttentionParams p = params_of(d, options);
  if (Q.device() == Device::cuda) {
    device_backward(d, cpu::contiguous_layout(d), p, lengths, Q.f32(), K.f32(), V.f32(),
                    out.f32(), logsumexp.f32(), dout.f32(), g.dQ.f32(), g.dK.f32(), g.dV.f32());
    return g;
  }
  const int threads = num_threads();
  Tensor ws = workspace(cpu::full_attention_backward_workspace(d, threads), Q.device());
  std::vector<int32_t> host_lengths;
  cpu::full_attention_backward(d, cpu::contiguous_layout(d),
                               for_cpu(p, lengths, host_lengths, d), Q.f32(), K.f32(), V.f32(),
                               out.f32(), logsumexp.f32(), dout.f32(), g.dQ.f32(), g.dK.f32(),
                               g.dV.f32(), ws.defined() ? ws.f32() : nullptr, threads);
  return g;
}

Variable full_attention(const Variable& Q, const Variable& K, const Variable& V,
                        const Tensor& lengths, const FullAttentionOptions& given) {
  const FullAttentionOptions options = with_thread_precision(given);
  FullAttentionOutput r = full_attention_forward(Q.data(), K.data(), V.data(), lengths, options);
  if (!record_needed({&Q, &K, &V})) return Variable(std::move(r.out));
  auto node = std::make_shared<FullAttentionNode>();
  node->Q_ = Q.data();
  node->K_ = K.data();
  node->V_ = V.data();
  node->out_ = r.out;
  node->lse_ = std::move(r.logsumexp);
  node->lengths_ = lengths;
  node->options_ = options;
  return attach(std::move(r.out), std::move(node), {&Q, &K, &V});
}

FullAttentionOutput full_attention_qkv_forward(const Tensor& qkv, int64_t heads,
                                               const Tensor& lengths,
                                               const FullAttentionOptions& options) {
  const char* op = "full_attention_qkv";
  const cpu::FullAttentionDims d = check_qkv(op, qkv, heads, lengths, options);
  const int64_t D = d.H * d.E;
  FullAttentionOutput r;
  if (qkv.device() == Device::cuda) {
    r.logsumexp = Tensor::empty({d.B, d.H, d.N}, DType::f32, Device::cuda);
    if (d.B * d.N == 0) {
      r.out = Tensor::empty({d.B, d.N, D}, DType::f32, Device::cuda);
      return r;
    }
    const cpu::FullAttentionParams p = params_of(d, options);
    Tensor merged = Tensor::empty({d.B, d.N, D}, DType::f32, Device::cuda);
    const float* x = qkv.f32();
    if (cuda::flash_attention_applies(d, qkv_layout(d), p, {x, x + D, x + 2 * D,
                                                            merged.f32()})) {
      // The heads read and written in place.
      device_forward(d, qkv_layout(d), p, lengths, x, x + D, x + 2 * D, merged.f32(),
                     r.logsumexp.f32());
      r.out = std::move(merged);
      return r;
    }
    const Tensor parts = split_qkv(qkv, d);
    const float* q = parts.f32();
    const int64_t n = d.B * d.H * d.N * d.E;
    Tensor out = Tensor::empty({d.B, d.H, d.N, d.E}, DType::f32, Device::cuda);
    device_forward(d, cpu::contiguous_layout(d), p, lengths, q, q + n, q + 2 * n, out.f32(),
                   r.logsumexp.f32());
    r.out = merge_heads(out, d);
    return r;
  }
  r.out = Tensor::empty({d.B, d.N, D});
  r.logsumexp = Tensor::empty({d.B, d.H, d.N});
  if (d.B * d.N == 0) return r;
  const int threads = num_threads();
  Tensor ws = workspace(cpu::full_attention_forward_workspace(d, threads), Device::cpu);
  const float* q = qkv.f32();
  std::vector<int32_t> host_lengths;
  cpu::full_attention_forward(d, qkv_layout(d),
                              for_cpu(params_of(d, options), lengths, host_lengths, d), q,
                              q + D, q + 2 * D, r.out.f32(), r.logsumexp.f32(),
                              ws.defined() ? ws.f32() : nullptr, threads);
  return r;
}

Tensor full_attention_qkv_backward(const Tensor& dout, const Tensor& qkv, int64_t heads,
                                   const Tensor& out, const Tensor& logsumexp,
                                   const Tensor& lengths, const FullAttentionOptions& options) {
  const char* op = "full_attention_qkv_backward";
  const cpu::FullAttentionDims d = check_qkv(op, qkv, heads, lengths, options);
  const int64_t D = d.H * d.E;
  check_shape(op, "dout", dout, qkv, {d.B, d.N, D});
  check_shape(op, "out", out, qkv, {d.B, d.N, D});
  check_shape(op, "logsumexp", logsumexp, qkv, {d.B, d.H, d.N});
  if (qkv.device() == Device::cuda) {
    if (d.B * d.N == 0) return Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
    const cpu::FullAttentionParams p = params_of(d, options);
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
    const float* x = qkv.f32();
    float* dx = dqkv.f32();
    if (cuda::flash_attention_applies(d, qkv_layout(d), p,
                                      {x, x + D, x + 2 * D, out.f32(), dout.f32(), dx, dx + D,
                                       dx + 2 * D})) {
      // The heads read and written in place.
      device_backward(d, qkv_layout(d), p, lengths, x, x + D, x + 2 * D, out.f32(),
                      logsumexp.f32(), dout.f32(), dx, dx + D, dx + 2 * D);
      return dqkv;
    }
    const Tensor parts = split_qkv(qkv, d);
    const float* q = parts.f32();
    const int64_t n = d.B * d.H * d.N * d.E;
    Tensor dheads = Tensor::empty({3, d.B, d.H, d.N, d.E}, DType::f32, Device::cuda);
    float* dq = dheads.f32();
    device_backward(d, cpu::contiguous_layout(d), p, lengths, q, q + n, q + 2 * n,
                    split_heads(out, d).f32(), logsumexp.f32(), split_heads(dout, d).f32(), dq,
                    dq + n, dq + 2 * n);
    return permute(dheads, {1, 3, 0, 2, 4}).reshape(qkv.shape());  // (B, N, 3, H, E)
  }
  Tensor dqkv = Tensor::empty(qkv.shape());
  if (d.B * d.N == 0) return dqkv;
  const int threads = num_threads();
  Tensor ws = workspace(cpu::full_attention_backward_workspace(d, threads), Device::cpu);
  const float* q = qkv.f32();
  float* dq = dqkv.f32();
  std::vector<int32_t> host_lengths;
  cpu::full_attention_backward(d, qkv_layout(d),
                               for_cpu(params_of(d, options), lengths, host_lengths, d), q,
                               q + D, q + 2 * D, out.f32(), logsumexp.f32(), dout.f32(), dq,
                               dq + D, dq + 2 * D, ws.defined() ? ws.f32() : nullptr, threads);
  return dqkv;
}

Variable full_attention_qkv(const Variable& qkv, int64_t heads, const Tensor& lengths,
                            const FullAttentionOptions& given) {
  const FullAttentionOptions options = with_thread_precision(given);
  FullAttentionOutput r = full_attention_qkv_forward(qkv.data(), heads, lengths, options);
  if (!record_needed({&qkv})) return Variable(std::move(r.out));
  auto node = std::make_shared<FullAttentionQkvNode>();
  node->qkv_ = qkv.data();
  node->out_ = r.out;
  node->lse_ = std::move(r.logsumexp);
  node->lengths_ = lengths;
  node->heads_ = heads;
  node->options_ = options;
  return attach(std::move(r.out), std::move(node), {&qkv});
}

uint64_t full_attention_dropout_blocks(const Tensor& Q, const Tensor& K) {
  CLUSTR_CHECK(Q.defined() && Q.rank() == 4 && K.defined() && K.rank() == 4,
               "full_attention_dropout_blocks: expected Q (B, H, N, E) and K (B, H, S, E), got ",
               Q.defined() ? describe(Q) : "undefined", " and ",
               K.defined() ? describe(K) : "undefined");
  return full_attention_dropout_blocks(Q.size(0), Q.size(1), Q.size(2), K.size(2));
}

uint64_t full_attention_dropout_blocks(int64_t B, int64_t H, int64_t N, int64_t S) {
  const uint64_t elements = static_cast<uint64_t>(B * H * N * S);
  return (elements + 3) / 4;
}

}  // namespace clustr

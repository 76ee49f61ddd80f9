// Oracle-top attention (see oracle_top.h): the k best keys of each query's full-attention row.
#include "layers/attention/oracle_top.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/ops_check.h"

namespace clustr {

Variable oracle_top_attention(const Variable& Q, const Variable& K, const Variable& V,
                              const Tensor& lengths, int64_t topk, float temperature) {
  const char* op = "oracle_top_attention";
  CLUSTR_CHECK(Q.defined() && K.defined() && V.defined(), op, ": use of an undefined Variable");
  CLUSTR_CHECK(!(grad_enabled() &&
                 (Q.requires_grad() || K.requires_grad() || V.requires_grad())),
               op, ": oracle-top attention is for evaluation only (its choice of keys has no "
               "gradient); train with full, clustered or improved-clustered attention, or "
               "evaluate under a NoGradGuard");
  const Tensor &q = Q.data(), &k = K.data(), &v = V.data();
  for (const Tensor* t : {&q, &k, &v}) detail::check_f32(op, "Q, K and V", *t);
  detail::check_same_device(op, q, k);
  detail::check_same_device(op, q, v);
  CLUSTR_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && q.size(0) == k.size(0) &&
                   q.size(1) == k.size(1) && q.size(3) == k.size(3) &&
                   v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
               op, ": expected Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), got Q ",
               describe(q), ", K ", describe(k), ", V ", describe(v));
  CLUSTR_CHECK(topk >= 1, op, ": expected topk >= 1, got ", topk);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), E = q.size(3), S = k.size(2),
                M = v.size(3);
  if (lengths.defined()) detail::check_lengths(op, lengths, B, S, "S", "K", k);
  const double t = temperature > 0.0f ? temperature : 1.0 / std::sqrt(static_cast<double>(E));

  // The inputs where they are on the cpu, host copies of device ones; the result goes back to
  // the inputs' device.
  std::vector<int32_t> len_copy;
  std::vector<float> q_copy, k_copy, v_copy;
  const int32_t* len = lengths.defined() ? detail::host_i32(lengths, len_copy) : nullptr;
  const float *qv = detail::host_f32(q, q_copy), *kv = detail::host_f32(k, k_copy),
              *vv = detail::host_f32(v, v_copy);
  std::vector<float> out(static_cast<size_t>(B * H * N * M), 0.0f);
#pragma omp parallel if (B * H > 1)
  {
    std::vector<double> score(static_cast<size_t>(S)), weight(static_cast<size_t>(S));
    std::vector<int64_t> order(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t L = len ? len[bh / H] : S;
      const int64_t kk = std::min<int64_t>(topk, L);
      for (int64_t i = 0; i < N; ++i) {
        if (kk == 0 || (N == S && i >= L)) continue;  // no key, or a padded query: 0
        const float* qi = qv + (bh * N + i) * E;
        for (int64_t l = 0; l < L; ++l) {
          const float* kl = kv + (bh * S + l) * E;
          double dot = 0.0;
          for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(qi[e]) * kl[e];
          score[static_cast<size_t>(l)] = t * dot;
        }
        std::iota(order.begin(), order.begin() + L, int64_t{0});
        std::partial_sort(order.begin(), order.begin() + kk, order.begin() + L,
                          [&](int64_t a, int64_t b) {
                            const double sa = score[static_cast<size_t>(a)],
                                         sb = score[static_cast<size_t>(b)];
                            return sa > sb || (sa == sb && a < b);
                          });
        const double top = score[static_cast<size_t>(order[0])];
        double sum = 0.0;
        for (int64_t c = 0; c < kk; ++c) {
          weight[static_cast<size_t>(c)] = std::exp(score[static_cast<size_t>(order[c])] - top);
          sum += weight[static_cast<size_t>(c)];
        }
        float* o = out.data() + (bh * N + i) * M;
        for (int64_t m = 0; m < M; ++m) {
          double acc = 0.0;
          for (int64_t c = 0; c < kk; ++c)
            acc += weight[static_cast<size_t>(c)] * vv[(bh * S + order[c]) * M + m];
          o[m] = static_cast<float>(acc / sum);
        }
      }
    }
  }
  return Variable(Tensor::from_vector(out, {B, H, N, M}, q.device()));
}

}  // namespace clustr

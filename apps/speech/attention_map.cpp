// Attention-map figure of a speech model (attention_map.h).
#include "apps/speech/attention_map.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/plot.h"
#include "core/error.h"
#include "core/ops.h"
#include "layers/attention/attention.h"
#include "layers/attention/clustering.h"

namespace clustr::speech {

namespace {

// (1, T, D) -> (1, H, T, E).
Tensor split_heads(const Tensor& x, int64_t heads) {
  const int64_t T = x.size(1), D = x.size(2);
  return permute(x.reshape({1, T, heads, D / heads}), {0, 2, 1, 3});
}

}  // namespace

void write_attention_maps(SpeechModel& model, const AttentionConfig& attention,
                          const SpeechExample& example, int layer, int head, uint64_t seed,
                          const std::string& path) {
  Encoder& encoder = model.encoder();
  CLUSTR_CHECK(layer >= 0 && size_t(layer) < encoder.num_layers(), "--map-layer must be in [0, ",
               encoder.num_layers(), "), got ", layer);
  EncoderLayer& L = encoder.layer(size_t(layer));
  const int64_t H = L.attention().heads();
  CLUSTR_CHECK(head >= 0 && head < H, "--map-head must be in [0, ", H, "), got ", head);
  NoGradGuard no_grad;
  model.eval();
  Generator gen(seed);
  const int64_t T = example.features.size(0);
  const Device device = device_of(model);
  const Tensor features =
      on_device(example.features.reshape({1, T, example.features.size(1)}), device);
  const Tensor lengths = Tensor::from_int_vector({int32_t(T)}, {1}, device);
  Variable x = model.embed(features, gen);
  for (int i = 0; i < layer; ++i) x = encoder.layer(size_t(i)).forward(x, lengths, gen);
  if (L.pre_norm()) x = L.norm1().forward(x);
  const Tensor Q = split_heads(L.attention().query().forward(x).data(), H);  // (1, H, T, E)
  const Tensor K = split_heads(L.attention().key().forward(x).data(), H);

  const AttentionType types[] = {AttentionType::full, AttentionType::clustered,
                                 AttentionType::improved_clustered};
  std::vector<Tensor> maps;  // each (1, H, T, T)
  for (AttentionType t : types) {
    Tensor assignment;
    if (t != AttentionType::full)
      assignment = cluster_queries(Q, lengths,
                                   ClusteringOptions{attention.clusters, attention.bits,
                                                     attention.iterations},
                                   gen)
                       .assignment;
    maps.push_back(on_device(  // read on the host below
        attention_matrix(t, Q, K, lengths, assignment, attention.clusters, attention.topk),
        Device::cpu));
  }
  std::vector<std::string> titles = {"full", "clustered", "improved-clustered"};
  if (shares_query_key(attention.type)) {  // the model's own type too: shared-full or lsh-X
    titles.push_back(attention.type == AttentionType::lsh ? detail::cat("lsh-", attention.rounds)
                                                          : "shared-full");
    maps.push_back(on_device(shared_attention_matrix(attention, on_device(Q, Device::cpu),
                                                     on_device(lengths, Device::cpu), gen),
                             Device::cpu));
  }
  double top = 0;
  for (const Tensor& m : maps) {
    const float* w = m.f32() + int64_t(head) * T * T;
    for (int64_t i = 0; i < T * T; ++i) top = std::max(top, double(w[i]));
  }
  // Each weight becomes a block of `scale` x `scale` pixels.
  std::vector<plot::Panel> panels;
  for (size_t p = 0; p < maps.size(); ++p) {
    const float* w = maps[p].f32() + int64_t(head) * T * T;
    plot::Panel panel{titles[p], int(T), int(T), std::vector<double>(size_t(T * T))};
    for (int64_t i = 0; i < T * T; ++i)
      panel.values[size_t(i)] = top > 0 ? std::sqrt(double(w[i]) / top) : 0;
    panels.push_back(std::move(panel));
  }
  plot::PanelOptions o;
  o.title = detail::cat(example.id, ": layer ", layer, ", head ", head,
                        ", colour sqrt(weight / largest weight)");
  o.x_label = "key position (encoder frame)";
  o.y_label = "query position";
  o.scale = int(std::max<int64_t>(1, 360 / std::max<int64_t>(T, 1)));
  plot::write_image_panels(path, panels, o);
}

}  // namespace clustr::speech

// Attention-map figure of a speech model (attention_map.h).
#include "apps/speech/attention_map.h"

#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "layers/attention/clustering.h"
#include "layers/attention/improved_clustered.h"

namespace clustr::speech {

namespace {

struct Rgb {
  unsigned char r, g, b;
};

// Viridis at t in [0, 1], linear between nine samples of matplotlib's table.
Rgb viridis(double t) {
  static constexpr Rgb stops[] = {{68, 1, 84},    {71, 45, 123},  {59, 82, 139},
                                  {44, 114, 142}, {33, 145, 140}, {39, 173, 129},
                                  {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  constexpr int n = sizeof stops / sizeof stops[0];
  t = std::clamp(t, 0.0, 1.0) * (n - 1);
  const int i = std::min(static_cast<int>(t), n - 2);
  const double f = t - i;
  auto mix = [f](unsigned char a, unsigned char b) {
    return static_cast<unsigned char>(std::lround(a + (b - a) * f));
  };
  return {mix(stops[i].r, stops[i + 1].r), mix(stops[i].g, stops[i + 1].g),
          mix(stops[i].b, stops[i + 1].b)};
}

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
  const Tensor features = example.features.reshape({1, T, example.features.size(1)});
  const Tensor lengths = Tensor::from_int_vector({int32_t(T)}, {1});
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
    maps.push_back(attention_matrix(t, Q, K, lengths, assignment, attention.clusters,
                                    attention.topk));
  }
  double top = 0;
  for (const Tensor& m : maps) {
    const float* w = m.f32() + int64_t(head) * T * T;
    for (int64_t i = 0; i < T * T; ++i) top = std::max(top, double(w[i]));
  }
  // Each weight becomes a block of `scale` x `scale` pixels; panels are separated by a gap.
  const int scale = int(std::max<int64_t>(1, 360 / std::max<int64_t>(T, 1)));
  const int side = int(T) * scale, gap = 12;
  const int width = 3 * side + 4 * gap, height = side + 2 * gap;
  std::vector<unsigned char> img(size_t(width) * size_t(height) * 3, 255);
  for (int p = 0; p < 3; ++p) {
    const float* w = maps[size_t(p)].f32() + int64_t(head) * T * T;
    const int x0 = gap + p * (side + gap);
    for (int py = 0; py < side; ++py)
      for (int px = 0; px < side; ++px) {
        const double v = top > 0 ? std::sqrt(double(w[(py / scale) * T + px / scale]) / top) : 0;
        const Rgb c = viridis(v);
        unsigned char* o = &img[(size_t(gap + py) * size_t(width) + size_t(x0 + px)) * 3];
        o[0] = c.r, o[1] = c.g, o[2] = c.b;
      }
  }
  const std::string tmp = path + ".tmp.png";
  CLUSTR_CHECK(stbi_write_png(tmp.c_str(), width, height, 3, img.data(), width * 3) != 0,
               "attention map: cannot write ", tmp);
  std::filesystem::rename(tmp, path);
}

}  // namespace clustr::speech

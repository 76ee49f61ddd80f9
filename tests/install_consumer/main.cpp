// Trains a one-layer encoder with improved-clustered attention to reproduce its input for 150
// Adam steps through the installed clustr package; exits 0 when the loss fell by a third.
#include <cstdio>

#include "autograd/ops.h"
#include "core/random.h"
#include "layers/encoder.h"
#include "optim/optimizer.h"

int main() try {
  using namespace clustr;
  Generator gen(3);
  AttentionConfig attention;
  attention.type = AttentionType::improved_clustered;
  attention.clusters = 4;
  attention.topk = 8;
  Encoder encoder(/*layers=*/1, /*D=*/16, /*heads=*/2, /*ff=*/32, attention, /*dropout=*/0.0f,
                  Activation::relu, /*pre_norm=*/false, gen);
  Tensor x0 = Tensor::empty({4, 24, 16});
  normal_(x0, gen);
  optim::AdamOptions options;
  options.lr = 3e-2f;
  optim::Adam opt(encoder.named_parameters(), options);
  float first = 0.0f, last = 0.0f;
  for (int step = 0; step < 150; ++step) {
    const Variable x(x0);
    const Variable diff = encoder.forward(x, Tensor(), gen) - x;
    const Variable loss = mean_all(diff * diff);
    loss.backward();
    opt.step();
    opt.zero_grad();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("consumer: loss %.4f -> %.4f after 150 steps\n", first, last);
  return last < first * 2.0f / 3.0f ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}

// What the text app's two training loops (finetune, pretrain) share: the order of an epoch's
// examples, BERT's learning-rate schedule, and the step after the backward pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "apps/common/training.h"
#include "core/error.h"
#include "optim/optimizer.h"

namespace clustr::text {

// The order of epoch `epoch`'s n examples: a Fisher-Yates shuffle with its own stream, so a
// resumed run finds the same order at any step.
inline std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(derive_key(seed, 1000 + static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[i], order[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
  return order;
}

// The lr after `done` of `total` steps: linear warm-up over the first warmup * total, then a
// linear decay to 0 (BERT's schedule).
inline float lr_at(int64_t done, int64_t total, float lr, float warmup) {
  const double w = std::max(1.0, std::floor(double(warmup) * double(total)));
  const double t = double(done) + 1;
  if (t <= w) return float(lr * t / w);
  return float(lr * std::max(0.0, (double(total) - t + 1) / std::max(1.0, double(total) - w)));
}

// After the backward pass of step `step` (from 0): clips the gradients to `clip` (0: measures
// their norm only) and takes the optimizer's step; when the loss or the norm is not finite,
// forgets the gradients instead and counts the skip (`non_finite` stops the run after too many
// in a row, naming `checkpoint` as what is kept). Returns whether the step was taken.
inline bool step_or_skip(optim::Optimizer& optimizer, double loss, float clip, int64_t step,
                         NonFiniteSteps& non_finite, std::FILE* log,
                         const std::string& checkpoint) {
  const double norm = clip_or_measure(optimizer.parameters(), clip);
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    optimizer.zero_grad();
    non_finite.skipped(detail::cat("step ", step + 1, ": loss ", loss, ", norm ", norm), log,
                       checkpoint);
    return false;
  }
  optimizer.step();
  non_finite.stepped();
  return true;
}

}  // namespace clustr::text

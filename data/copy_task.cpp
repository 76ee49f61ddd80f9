#include "data/copy_task.h"

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/philox.h"

namespace clustr {

void check_copy_task_config(const CopyTaskConfig& c) {
  // N = 2L + 2 must fit the i32 lengths tensor.
  CLUSTR_CHECK(c.length >= 1 && c.length <= (INT32_MAX - 2) / 2,
               "copy task: length must be in [1, ", (INT32_MAX - 2) / 2, "], got ", c.length);
  CLUSTR_CHECK(c.symbols >= 1 && c.symbols <= 1000,
               "copy task: symbols must be in [1, 1000], got ", c.symbols);
  // At most one copy of each word position may be masked, so at most half the symbols.
  CLUSTR_CHECK(c.mask_ratio >= 0.0f && c.mask_ratio <= 0.5f,
               "copy task: mask_ratio must be in [0, 0.5] (a word position is masked in at most "
               "one copy, so that it stays recoverable), got ",
               c.mask_ratio);
}

CopyTaskBatch make_copy_task_batch(const CopyTaskConfig& config, int64_t batch, Generator& gen) {
  check_copy_task_config(config);
  CLUSTR_CHECK(batch >= 1, "make_copy_task_batch: batch must be >= 1, got ", batch);
  const int64_t L = config.length, N = sequence_length(config);
  const uint64_t S = static_cast<uint64_t>(config.symbols);
  const int32_t mask = mask_token(config);
  const float r = config.mask_ratio;

  CopyTaskBatch out;
  out.input = Tensor::empty({batch, N}, DType::i32);
  out.target = Tensor::empty({batch, N}, DType::i32);
  out.lengths = Tensor::empty({batch}, DType::i32);
  int32_t* in = out.input.i32();
  int32_t* tg = out.target.i32();
  int32_t* len = out.lengths.i32();

  const uint64_t base = gen.reserve(static_cast<uint64_t>(batch) * static_cast<uint64_t>(L));
  const uint64_t seed = gen.seed();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* x = in + b * N;
    int32_t* y = tg + b * N;
    len[b] = static_cast<int32_t>(N);
    x[0] = x[L + 1] = 0;
    y[0] = y[L + 1] = kCopyTaskIgnoreIndex;
    for (int64_t j = 0; j < L; ++j) {
      Philox4 rnd = philox4x32(seed, base + static_cast<uint64_t>(b * L + j));
      // Multiply-shift maps 32 bits onto 1..S; the bias is below S / 2^32.
      const auto symbol = static_cast<int32_t>(1 + ((static_cast<uint64_t>(rnd.v[0]) * S) >> 32));
      const float u = uint_to_unit(rnd.v[1]);
      const int64_t first = 1 + j, second = L + 2 + j;
      const bool mask_first = u < r, mask_second = !mask_first && u < 2.0f * r;
      x[first] = mask_first ? mask : symbol;
      y[first] = mask_first ? symbol : kCopyTaskIgnoreIndex;
      x[second] = mask_second ? mask : symbol;
      y[second] = mask_second ? symbol : kCopyTaskIgnoreIndex;
    }
  }
  return out;
}

double masked_accuracy(const Tensor& scores, const Tensor& target) {
  CLUSTR_CHECK(target.defined() && target.dtype() == DType::i32 && target.rank() == 2,
               "masked_accuracy: expected target i32 (B, N), got ",
               target.defined() ? describe(target) : std::string("an undefined tensor"));
  const int64_t B = target.size(0), N = target.size(1);
  CLUSTR_CHECK(scores.defined(), "masked_accuracy: scores are undefined");
  const std::vector<int32_t> y = target.to_int_vector();
  std::vector<int32_t> pred(static_cast<size_t>(B * N));
  if (scores.dtype() == DType::f32) {
    CLUSTR_CHECK(scores.rank() == 3 && scores.size(0) == B && scores.size(1) == N &&
                     scores.size(2) >= 1,
                 "masked_accuracy: expected logits f32 (", B, ", ", N, ", V) to match target ",
                 describe(target), ", got ", describe(scores));
    const int64_t V = scores.size(2);
    const std::vector<float> s = scores.to_vector();
    for (int64_t i = 0; i < B * N; ++i) {
      const float* row = s.data() + i * V;
      int64_t best = 0;
      for (int64_t v = 1; v < V; ++v)
        if (row[v] > row[best]) best = v;
      pred[static_cast<size_t>(i)] = static_cast<int32_t>(best);
    }
  } else {
    // Not f32: only i32 predictions are accepted (bf16 logits or anything else is an error).
    CLUSTR_CHECK(scores.dtype() == DType::i32 && scores.rank() == 2 && scores.size(0) == B &&
                     scores.size(1) == N,
                 "masked_accuracy: expected logits f32 (", B, ", ", N, ", V) or predictions i32 (",
                 B, ", ", N, ") to match target, got ", describe(scores));
    pred = scores.to_int_vector();
  }
  int64_t counted = 0, correct = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == kCopyTaskIgnoreIndex) continue;
    ++counted;
    correct += pred[i] == y[i];
  }
  return counted ? static_cast<double>(correct) / static_cast<double>(counted) : 0.0;
}

}  // namespace clustr

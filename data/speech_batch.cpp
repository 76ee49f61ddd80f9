// Frame stacking, length buckets and padded batches (speech_batch.h).
#include "data/speech_batch.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace clustr {

int64_t stacked_length(int64_t frames, int k) {
  CLUSTR_CHECK(k >= 1, "stacked_length: the stacking factor must be >= 1, got ", k);
  CLUSTR_CHECK(frames >= 0, "stacked_length: frames must be >= 0, got ", frames);
  return (frames + k - 1) / k;
}

Tensor stack_frames(const Tensor& features, int k) {
  CLUSTR_CHECK(features.defined() && features.dtype() == DType::f32 && features.rank() == 2 &&
                   features.device() == Device::cpu,
               "stack_frames: expected f32 (T, bins) features on cpu, got ",
               features.defined() ? describe(features) : std::string("an undefined tensor"));
  CLUSTR_CHECK(k >= 1, "stack_frames: the stacking factor must be >= 1, got ", k);
  const Tensor& src = features;
  const int64_t T = src.size(0), bins = src.size(1), Tk = stacked_length(T, k);
  Tensor out = Tensor::zeros({Tk, k * bins});
  // Row-major (T, bins) read as (T', k bins) is exactly the stacking; only the tail group is short.
  if (T * bins > 0) std::memcpy(out.f32(), src.f32(), sizeof(float) * size_t(T * bins));
  return out;
}

int64_t ctc_min_frames(const std::vector<int32_t>& labels) {
  int64_t n = int64_t(labels.size());
  for (size_t i = 1; i < labels.size(); ++i) n += labels[i] == labels[i - 1];
  return n;
}

std::vector<std::vector<size_t>> make_length_buckets(const std::vector<int64_t>& lengths,
                                                     const BucketOptions& o) {
  CLUSTR_CHECK(o.batch_size >= 0 && o.max_frames >= 0,
               "make_length_buckets: batch_size and max_frames must be >= 0, got ", o.batch_size,
               " and ", o.max_frames);
  CLUSTR_CHECK(o.batch_size > 0 || o.max_frames > 0,
               "make_length_buckets: give a batch size or a frame budget (both are 0)");
  for (size_t i = 0; i < lengths.size(); ++i)
    CLUSTR_CHECK(lengths[i] >= 0, "make_length_buckets: length ", i, " is negative (",
                 lengths[i], ")");
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  std::vector<std::vector<size_t>> batches;
  std::vector<size_t> current;
  int64_t longest = 0;  // sorted: the newest member is the longest
  for (size_t i : order) {
    const int64_t n = int64_t(current.size()) + 1;
    const bool fits = (o.batch_size == 0 || n <= o.batch_size) &&
                      (o.max_frames == 0 || n * std::max(longest, lengths[i]) <= o.max_frames);
    if (!current.empty() && !fits) {
      batches.push_back(std::move(current));
      current.clear();
    }
    current.push_back(i);
    longest = lengths[i];
  }
  if (!current.empty()) batches.push_back(std::move(current));
  return batches;
}

void shuffle_batches(std::vector<std::vector<size_t>>& batches, Generator& gen) {
  for (size_t i = batches.size(); i > 1; --i) {
    // Multiply-shift maps a 32-bit draw onto [0, i) without a modulo's bias toward small values.
    const size_t j = size_t((uint64_t(gen.next_u32()) * uint64_t(i)) >> 32);
    std::swap(batches[i - 1], batches[j]);
  }
}

SpeechBatch collate_speech(const std::vector<SpeechExample>& examples,
                           const std::vector<size_t>& indices) {
  CLUSTR_CHECK(!indices.empty(), "collate_speech: no utterances to batch");
  int64_t width = -1, Tmax = 0, Umax = 0;
  for (size_t i : indices) {
    CLUSTR_CHECK(i < examples.size(), "collate_speech: index ", i, " out of range (",
                 examples.size(), " examples)");
    const SpeechExample& e = examples[i];
    CLUSTR_CHECK(e.features.defined() && e.features.dtype() == DType::f32 &&
                     e.features.rank() == 2,
                 "collate_speech: utterance '", e.id, "' has no f32 (T, features) features");
    if (width < 0) width = e.features.size(1);
    CLUSTR_CHECK(e.features.size(1) == width, "collate_speech: utterance '", e.id, "' has ",
                 e.features.size(1), " features per frame, the batch's first has ", width);
    Tmax = std::max(Tmax, e.features.size(0));
    Umax = std::max(Umax, int64_t(e.labels.size()));
  }
  const int64_t B = int64_t(indices.size());
  SpeechBatch b;
  b.indices = indices;
  b.features = Tensor::zeros({B, Tmax, width});
  b.lengths = Tensor::zeros({B}, DType::i32);
  b.targets = Tensor::zeros({B, std::max<int64_t>(Umax, 1)}, DType::i32);
  b.target_lengths = Tensor::zeros({B}, DType::i32);
  float* x = b.features.f32();
  int32_t* len = b.lengths.i32();
  int32_t* tgt = b.targets.i32();
  int32_t* tlen = b.target_lengths.i32();
  const int64_t Sw = b.targets.size(1);
  for (int64_t r = 0; r < B; ++r) {
    const SpeechExample& e = examples[indices[size_t(r)]];
    const Tensor& f = e.features;
    const int64_t T = f.size(0);
    if (T * width > 0)
      std::memcpy(x + r * Tmax * width, f.f32(), sizeof(float) * size_t(T * width));
    len[r] = int32_t(T);
    tlen[r] = int32_t(e.labels.size());
    std::copy(e.labels.begin(), e.labels.end(), tgt + r * Sw);
    b.frames += T;
    b.input_frames += e.frames;
  }
  return b;
}

}  // namespace clustr

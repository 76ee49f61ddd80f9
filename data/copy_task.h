// The masked copy task (paper supp. C.2). A sequence is `0 w 0 w`: separator 0, a random word w
// of L symbols drawn uniformly from 1..S, the separator again and the word again (N = 2L + 2).
// Some symbol positions of the input are replaced by MASK = S + 1 (vocabulary V = S + 2); the
// model must predict the original symbols there, which it can always do by looking at the other
// copy: a word position is never masked in both copies.
//
// How the mask is drawn: for each word position j (0..L-1) one uniform u in [0, 1):
//   u < r        -> mask copy 1 at j  (sequence index 1 + j)
//   r <= u < 2r  -> mask copy 2 at j  (sequence index L + 2 + j)
//   otherwise    -> mask neither.
// So every symbol position is masked with probability exactly r, the number masked per word
// position is 0 or 1 (the recoverability invariant), and r can be at most 0.5. Separators are
// never masked.
//
// Randomness: sequence b, word position j uses Philox counter block (base + b * L + j), where
// base is reserved from the Generator for the whole batch; lane 0 picks the symbol, lane 1 the
// mask. A seed gives the same batches at any thread count.
//
// Shapes: B batch, N = 2L + 2 sequence length, V = S + 2 vocabulary.
#pragma once

#include <cstdint>

#include "core/random.h"
#include "core/tensor.h"

namespace clustr {

struct CopyTaskConfig {
  int length = 32;          // L, symbols per copy of the word (>= 1)
  int symbols = 10;         // S, the word's alphabet is 1..S (1..1000)
  float mask_ratio = 0.2f;  // r, probability that a symbol position is masked ([0, 0.5])
};

struct CopyTaskBatch {
  Tensor input;    // i32 (B, N): 0 w 0 w with masked positions = S + 1
  Tensor target;   // i32 (B, N): the original symbol at masked positions, -100 elsewhere
  Tensor lengths;  // i32 (B): every entry N (all sequences have the same length)
};

constexpr int32_t kCopyTaskIgnoreIndex = -100;  // cross_entropy's ignore_index for the targets

inline int vocab_size(const CopyTaskConfig& config) { return config.symbols + 2; }  // V = S + 2
inline int mask_token(const CopyTaskConfig& config) { return config.symbols + 1; }
inline int64_t sequence_length(const CopyTaskConfig& config) {  // N = 2L + 2
  return 2 * int64_t(config.length) + 2;
}

// Throws clustr::Error naming the bad field when the config is out of range.
void check_copy_task_config(const CopyTaskConfig& config);

// A batch of `batch` (>= 1) sequences on cpu, drawn from gen (B * L counter blocks).
CopyTaskBatch make_copy_task_batch(const CopyTaskConfig& config, int64_t batch, Generator& gen);

// Fraction of positions with target != -100 where the prediction equals the target.
// scores: f32 (B, N, V) logits (prediction = first argmax over V) or i32 (B, N) predictions;
// target: i32 (B, N). Either device. Returns 0 when no position is counted.
double masked_accuracy(const Tensor& scores, const Tensor& target);

}  // namespace clustr

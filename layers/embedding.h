// Token embeddings and the sinusoidal positional encoding.
//
// Legend: B batch, N positions, D model width, V vocabulary.
// Initialisation follows PyTorch's defaults (named at each layer), drawn from the run's
// Generator, so a model is reproducible from its seed.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/module.h"

namespace clustr {

// A lookup table "weight" (V, D), init normal(0, 1) (torch.nn.Embedding).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen);

  // index i32 of any shape, values in [0, V) -> (index.shape..., D). With `added` (N, D), N
  // index's last size: those rows added to the looked-up ones in the same pass, broadcast over
  // the leading axes (PositionalEncoding::table: the lookup and the encoding in one launch).
  Variable forward(const Tensor& index, const Tensor& added = Tensor()) const;

  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }
  const Variable& weight() const { return weight_; }

 private:
  int64_t num_, dim_;
  Variable weight_;
};

// The fixed table of "Attention is all you need" (sec. 3.5), (N, D) f32 on `device`:
//   PE[pos, 2i] = sin(pos / 10000^(2i/D)),  PE[pos, 2i+1] = cos(pos / 10000^(2i/D)).
// Computed in double and rounded once. D may be odd (the last column is then a sine).
Tensor sinusoidal_positional_encoding(int64_t positions, int64_t dim, Device device = Device::cpu);

// Adds the sinusoidal table to a batch of sequences: x (B, N, D) -> x + PE[:N] (broadcast over
// B). No parameters; the table is kept on x's device for the longest N seen so far (a longer N
// or another device computes it again), so a step copies nothing to the device once it has
// seen its length, and any length works.
class PositionalEncoding : public Module {
 public:
  explicit PositionalEncoding(int64_t dim);

  // x (B, N, D) -> (B, N, D).
  Variable forward(const Variable& x) const;
  // The table's first n rows (n, D) on `device` (a view; reserve(n, device) first), for
  // Embedding::forward's `added`.
  Tensor table(int64_t n, Device device) const;

  int64_t dim() const { return dim_; }
  // Makes the table hold at least n positions on `device` now, so that no forward of up to n
  // positions replaces it: a CUDA graph keeps reading the table it was captured with (one made
  // anew shows as a new generation()).
  void reserve(int64_t n, Device device) const;
  // How many times the table was made: a graph captured at one count reads a freed table at
  // another (the table also grows in a forward outside any graph, e.g. an evaluation's).
  uint64_t generation() const { return generation_; }

 private:
  int64_t dim_;
  mutable Tensor table_;
  mutable uint64_t generation_ = 0;  // (M, D) on the last forward's device, M the longest N seen
};

}  // namespace clustr

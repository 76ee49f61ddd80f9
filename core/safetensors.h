// Reading and writing the safetensors format (https://github.com/huggingface/safetensors), used
// for checkpoints and for the PyTorch reference fixtures of the tests.
//
// Layout of a file:
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    a JSON object, padded with spaces so that N is a multiple of 8:
//                         {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//                          ..., "__metadata__": {"key": "value", ...}}
//   bytes [8 + N, end)  the data section: each tensor's elements, row-major, little-endian;
//                       data_offsets are relative to its start, and the tensors cover it exactly
//                       (no gaps, no overlaps, nothing after the last one).
// clustr reads and writes the dtypes it has: F32 (DType::f32), I32 (DType::i32) and BF16
// (DType::bf16: each element the upper 16 bits of a float32, 2 bytes little-endian, as PyTorch
// writes torch.bfloat16). Anything else (F16, F64, ...) is a clear error.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace clustr {

// The contents of a safetensors file: every tensor (on the cpu) and the metadata strings.
struct SafetensorsFile {
  std::string path;  // where it was read from, for error messages
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  // The tensor called `name`; throws naming the file and the tensors it does have.
  const Tensor& get(const std::string& name) const;
  // The metadata value of `key`; throws naming the file and the keys it does have.
  const std::string& meta(const std::string& key) const;
};

// Writes `tensors` (in this order) and `metadata` to `path`, atomically: the bytes go to a
// temporary file in the same directory, which is flushed to disk (fsync) and then renamed over
// `path`, so a crash leaves either the old file or the new one, never half of one. On any error
// the temporary file is removed and clustr::Error says what failed. Tensors on cuda are copied
// to the host. Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file into cpu tensors. Every structural problem (truncated file, absurd header
// length, invalid JSON, a missing or malformed field, an unsupported dtype, offsets that do not
// match the shape or do not tile the data section, duplicate names) throws clustr::Error naming
// the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace clustr

// The safetensors reader (core/safetensors.h) on arbitrary bytes: the header's length, its
// JSON, dtypes, shapes and data offsets. A file it accepts is read back through the tensors.
#include <cstdint>
#include <string>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "fuzz_input.h"
#include "safetensors_mutator.h"  // its custom mutator, half the mutations

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = clustr::fuzz::write_file(
      "input.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  clustr::fuzz::expect_clear_errors([&] {
    const clustr::SafetensorsFile f = clustr::load_safetensors(path);
    double sum = 0;  // every element read: a tensor that claims more bytes than it has shows
    for (const auto& [name, t] : f.tensors)
      if (t.dtype() == clustr::DType::f32)
        for (float v : t.to_vector()) sum += v;
    (void)sum;
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  using clustr::Tensor;
  clustr::save_safetensors(dir + "/mixed.safetensors",
                           {{"w", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})},
                            {"ids", Tensor::from_int_vector({7, 8}, {2})},
                            {"scalar", Tensor::from_vector({0.5f}, {})},
                            {"half",
                             Tensor::from_vector({1, -2}, {2}).astype(clustr::DType::bf16)}},
                           {{"format", "pt"}, {"note", "a seed"}});
  clustr::save_safetensors(dir + "/empty.safetensors", {});
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}

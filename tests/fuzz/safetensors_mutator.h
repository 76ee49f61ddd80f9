// A mutator that knows the safetensors layout (8 bytes of header length, a JSON header, the
// data), for the targets that read safetensors files (fuzz_safetensors, fuzz_checkpoint).
// libFuzzer's byte mutations rarely keep the JSON valid and the length right, so checks behind
// the parser (an offsets pair with one entry, a shape holding a string, a missing key) are
// reached by luck. Half of the mutations here parse the header and make one change to its
// structure, then write it back with its new length and the data as it was:
//   an array loses an element or gains one; a value becomes another JSON type or an edge
//   number; an object loses a key, gains one of the format's keys, or has a key renamed.
// The other half, and every input whose header does not parse, get libFuzzer's own mutations
// (`fallback`, i.e. LLVMFuzzerMutate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace clustr::fuzz {

using ByteMutator = size_t (*)(uint8_t* data, size_t size, size_t max_size);

namespace detail {

inline void collect(nlohmann::json& j, std::vector<nlohmann::json*>& nodes) {
  nodes.push_back(&j);
  if (j.is_array() || j.is_object())
    for (auto& child : j) collect(child, nodes);
}

// A value of another kind: the types and the edge numbers a reader must refuse or bound.
inline nlohmann::json other_value(std::minstd_rand& rng) {
  switch (rng() % 10) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return -1;
    case 3: return 1.5;
    case 4: return "F32";
    case 5: return nlohmann::json::array();
    case 6: return nlohmann::json::object();
    case 7: return std::numeric_limits<uint64_t>::max();
    case 8: return uint64_t{1} << 53;
    default: return 0;
  }
}

// One change to the structure of j; false when the chosen node does not allow it.
inline bool change(nlohmann::json& j, std::minstd_rand& rng) {
  std::vector<nlohmann::json*> nodes;
  collect(j, nodes);
  nlohmann::json& v = *nodes[rng() % nodes.size()];
  static const char* const kKeys[] = {"dtype", "shape", "data_offsets", "__metadata__"};
  switch (rng() % 6) {
    case 0:  // an array loses an element
      if (!v.is_array() || v.empty()) return false;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(rng() % v.size()));
      return true;
    case 1:  // an array gains one (a copy of one of its own, or another value)
      if (!v.is_array()) return false;
      v.push_back(!v.empty() && rng() % 2 ? v[rng() % v.size()] : other_value(rng));
      return true;
    case 2:  // a value of another kind
      if (&v == &j) return false;
      v = other_value(rng);
      return true;
    case 3: {  // an object loses a key
      if (!v.is_object() || v.empty()) return false;
      auto it = v.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % v.size()));
      v.erase(it);
      return true;
    }
    case 4:  // an object gains one of the format's keys
      if (!v.is_object()) return false;
      v[kKeys[rng() % 4]] = other_value(rng);
      return true;
    default: {  // an object's key renamed (to one of the format's, or changed by a letter)
      if (!v.is_object() || v.empty()) return false;
      auto it = v.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % v.size()));
      const std::string name = it.key();
      nlohmann::json value = it.value();
      v.erase(it);
      v[rng() % 2 ? std::string(kKeys[rng() % 4]) : name + "x"] = std::move(value);
      return true;
    }
  }
}

}  // namespace detail

inline size_t mutate_safetensors(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                                 ByteMutator fallback) {
  std::minstd_rand rng(seed);
  uint64_t n = 0;
  if (rng() % 2 == 0 || size < 8) return fallback(data, size, max_size);
  std::memcpy(&n, data, 8);  // little-endian, as the format (and the hosts fuzzing) are
  if (n > size - 8) return fallback(data, size, max_size);
  nlohmann::json header = nlohmann::json::parse(data + 8, data + 8 + n, nullptr, false);
  if (header.is_discarded()) return fallback(data, size, max_size);
  bool changed = false;
  for (int tries = 0; tries < 8 && !changed; ++tries) changed = detail::change(header, rng);
  if (!changed) return fallback(data, size, max_size);
  const std::string text = header.dump();
  const size_t rest = size - 8 - static_cast<size_t>(n);
  if (8 + text.size() + rest > max_size) return fallback(data, size, max_size);
  std::vector<uint8_t> out(8 + text.size() + rest);
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::memcpy(out.data() + 8 + text.size(), data + 8 + n, rest);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace clustr::fuzz

// The target that includes this header gets it as libFuzzer's custom mutator when built for
// libFuzzer (the ordinary suite's replay program compiles the targets without libFuzzer).
#if defined(CLUSTR_LIBFUZZER)
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  return clustr::fuzz::mutate_safetensors(data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif

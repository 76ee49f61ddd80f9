// Which attention a multi-head attention layer runs, and its parameters. Apps fill it from
// flags (--attention full|clustered|improved-clustered --clusters 100 --topk 32 --bits 63
// --iterations 10); a model trained with one type can be evaluated with another by changing
// only this struct (the paper's Table 1: "train with X, evaluate with Y"), since no type adds
// parameters.
#pragma once

#include <string>

namespace clustr {

// oracle_top (oracle_top.h) is for evaluation only: the paper's reference row of Table 1.
enum class AttentionType { full, clustered, improved_clustered, oracle_top };

struct AttentionConfig {
  AttentionType type = AttentionType::full;
  int clusters = 100;   // C: clustered types
  int topk = 32;        // k: improved-clustered, oracle-top
  int bits = 63;        // hash bits for clustering (<= 63)
  int iterations = 10;  // Lloyd iterations of Hamming K-means
  bool causal = false;  // full attention only
  float dropout = 0.0f; // on the attention weights, in training

  // Throws clustr::Error naming the bad field and its allowed range.
  void validate() const;
  // "full", "clustered (C=100, bits=63, iterations=10)", ...
  std::string describe() const;
};

// "full", "clustered", "improved-clustered", "oracle-top" <-> AttentionType; throws on anything
// else, listing the accepted names.
AttentionType parse_attention_type(const std::string& name);
const char* attention_type_name(AttentionType type);

}  // namespace clustr

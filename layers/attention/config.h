// Which attention a multi-head attention layer runs, and its parameters. Apps fill it from
// flags (--attention full|clustered|improved-clustered|shared-full|lsh --clusters 100 --topk 32
// --bits 63 --iterations 10 --rounds 4 --buckets 32 --chunk 32); a model trained with one type
// can be evaluated with another by changing only this struct (the paper's Table 1: "train with
// X, evaluate with Y"), since no type adds parameters; shared-full and lsh need a model trained
// with one of them (shares_query_key).
#pragma once

#include <string>

namespace clustr {

// oracle_top (oracle_top.h) is for evaluation only: the paper's reference row of Table 1.
// shared_full and lsh (reformer.h) need a layer whose queries and keys share one projection
// (shares_query_key); a layer built for them has one, and runs the other types with keys equal
// to the queries.
enum class AttentionType { full, clustered, improved_clustered, oracle_top, shared_full, lsh };

// Whether a layer trained with `type` shares one projection between queries and keys.
bool shares_query_key(AttentionType type);
// Whether `type` groups the queries into clusters (AttentionConfig::clusters).
bool uses_clusters(AttentionType type);

struct AttentionConfig {
  AttentionType type = AttentionType::full;
  int clusters = 100;   // C: clustered types
  int topk = 32;        // k: improved-clustered, oracle-top
  int bits = 63;        // hash bits for clustering (<= 63)
  int iterations = 10;  // Lloyd iterations of Hamming K-means
  int rounds = 1;       // lsh: hashing rounds X (lsh-X)
  int buckets = 32;     // lsh: hash buckets per round (even)
  int chunk = 32;       // lsh: sorted positions per chunk
  bool causal = false;  // full attention only
  float dropout = 0.0f; // on the attention weights, in training

  // Throws clustr::Error naming the bad field and its allowed range.
  void validate() const;
  // "full", "clustered (C=100, bits=63, iterations=10)", ...
  std::string describe() const;
};

// "full", "clustered", "improved-clustered", "oracle-top", "shared-full", "lsh" <->
// AttentionType; throws on anything else, listing the accepted names.
AttentionType parse_attention_type(const std::string& name);
const char* attention_type_name(AttentionType type);

// A type as the paper names it in its tables: a type name, or "lsh-X" for lsh with X hashing
// rounds (rounds 0 for the others).
struct NamedAttention {
  AttentionType type;
  int rounds;
};
NamedAttention parse_attention_name(const std::string& name);

}  // namespace clustr

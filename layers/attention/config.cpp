// AttentionConfig checks and names (config.h).
#include "layers/attention/config.h"

#include <sstream>

#include "core/error.h"

namespace clustr {

void AttentionConfig::validate() const {
  const char* type_name = attention_type_name(type);
  CLUSTR_CHECK(clusters >= 1, "AttentionConfig: clusters must be >= 1, got ", clusters);
  CLUSTR_CHECK(topk >= 1, "AttentionConfig: topk must be >= 1, got ", topk);
  CLUSTR_CHECK(bits >= 1 && bits <= 63, "AttentionConfig: bits must be in [1, 63], got ", bits);
  CLUSTR_CHECK(iterations >= 1, "AttentionConfig: iterations must be >= 1, got ", iterations);
  CLUSTR_CHECK(rounds >= 1, "AttentionConfig: rounds must be >= 1, got ", rounds);
  CLUSTR_CHECK(buckets >= 2 && buckets % 2 == 0,
               "AttentionConfig: buckets must be an even number >= 2, got ", buckets);
  CLUSTR_CHECK(chunk >= 1, "AttentionConfig: chunk must be >= 1, got ", chunk);
  CLUSTR_CHECK(dropout >= 0.0f && dropout < 1.0f,
               "AttentionConfig: dropout must be in [0, 1), got ", dropout);
  // Clustering groups queries from the whole sequence, so a query's cluster centroid would
  // see keys after the query: the clustered types cannot be causal.
  CLUSTR_CHECK(!causal || type == AttentionType::full, "AttentionConfig: causal masking is ",
               "supported by full attention only, not by ", type_name,
               " attention (use --attention full)");
}

std::string AttentionConfig::describe() const {
  std::ostringstream os;
  os << attention_type_name(type);
  switch (type) {
    case AttentionType::full:
      break;
    case AttentionType::clustered:
      os << " (C=" << clusters << ", bits=" << bits << ", iterations=" << iterations << ")";
      break;
    case AttentionType::improved_clustered:
      os << " (C=" << clusters << ", k=" << topk << ", bits=" << bits
         << ", iterations=" << iterations << ")";
      break;
    case AttentionType::oracle_top:
      os << " (k=" << topk << ")";
      break;
    case AttentionType::shared_full:
      break;
    case AttentionType::lsh:
      os << " (rounds=" << rounds << ", buckets=" << buckets << ", chunk=" << chunk << ")";
      break;
  }
  if (causal) os << ", causal";
  if (dropout > 0.0f) os << ", dropout " << dropout;
  return os.str();
}

AttentionType parse_attention_type(const std::string& name) {
  for (AttentionType t : {AttentionType::full, AttentionType::clustered,
                          AttentionType::improved_clustered, AttentionType::oracle_top,
                          AttentionType::shared_full, AttentionType::lsh})
    if (name == attention_type_name(t)) return t;
  throw Error(detail::cat("unknown attention type '", name,
                          "'; expected one of: full, clustered, improved-clustered, oracle-top, "
                          "shared-full, lsh"));
}

NamedAttention parse_attention_name(const std::string& name) {
  if (name.rfind("lsh-", 0) == 0 && name.size() > 4 && name.size() < 8 &&
      name.find_first_not_of("0123456789", 4) == std::string::npos) {
    const int rounds = std::stoi(name.substr(4));
    CLUSTR_CHECK(rounds >= 1, "attention '", name, "': lsh needs at least 1 hashing round");
    return {AttentionType::lsh, rounds};
  }
  return {parse_attention_type(name), 0};
}

bool shares_query_key(AttentionType type) {
  return type == AttentionType::shared_full || type == AttentionType::lsh;
}

bool uses_clusters(AttentionType type) {
  return type == AttentionType::clustered || type == AttentionType::improved_clustered;
}

const char* attention_type_name(AttentionType type) {
  switch (type) {
    case AttentionType::full:
      return "full";
    case AttentionType::clustered:
      return "clustered";
    case AttentionType::improved_clustered:
      return "improved-clustered";
    case AttentionType::oracle_top:
      return "oracle-top";
    case AttentionType::shared_full:
      return "shared-full";
    case AttentionType::lsh:
      return "lsh";
  }
  throw Error(detail::cat("attention_type_name: unknown AttentionType value ",
                          static_cast<int>(type)));
}

}  // namespace clustr

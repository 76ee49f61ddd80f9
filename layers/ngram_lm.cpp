// The label n-gram model: counting, interpolated Kneser-Ney, and its JSON form (ngram_lm.h).
#include "layers/ngram_lm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace clustr {

namespace {

constexpr const char* kFormat = "clustr-ngram-lm";
constexpr int kVersion = 1;

std::vector<int32_t> ids_of(const std::string& key) {
  std::vector<int32_t> ids(key.size() / sizeof(int32_t));
  if (!ids.empty()) std::memcpy(ids.data(), key.data(), key.size());
  return ids;
}

}  // namespace

NgramLm::Key NgramLm::key_of(const int32_t* ids, int n) {
  return Key(reinterpret_cast<const char*>(ids), size_t(n) * sizeof(int32_t));
}

NgramLm NgramLm::estimate(const std::vector<LabelSequence>& sequences, int32_t classes, int order) {
  CLUSTR_CHECK(order >= 1 && order <= kMaxOrder, "n-gram model: the order must be in [1, ",
               kMaxOrder, "], got ", order);
  CLUSTR_CHECK(classes >= 2,
               "n-gram model: expected at least 2 classes (the blank and a label), got ", classes);
  NgramLm lm;
  lm.order_ = order;
  lm.classes_ = classes;
  std::vector<int32_t> padded;
  for (size_t s = 0; s < sequences.size(); ++s) {
    padded.assign(size_t(order - 1), 0);  // <s> ... <s>
    for (size_t i = 0; i < sequences[s].size(); ++i) {
      const int32_t l = sequences[s][i];
      CLUSTR_CHECK(l >= 1 && l < classes, "n-gram model: sequence ", s, ", position ", i,
                   ": label ", l, " is outside the labels [1, ", classes, ")");
      padded.push_back(l);
    }
    padded.push_back(classes);  // </s>
    for (size_t i = 0; i + size_t(order) <= padded.size(); ++i)
      ++lm.counts_[key_of(padded.data() + i, order)];
  }
  lm.build();
  return lm;
}

void NgramLm::build() {
  histories_.assign(size_t(order_), {});
  discount_.assign(size_t(order_), 0.5);
  // Order N: the counts themselves; order k < N: continuation counts from order k + 1's types.
  // (The counts are whole numbers, so the totals do not depend on the order of the sums.)
  std::unordered_map<Key, double> level;  // order k's n-grams -> c_k
  for (const auto& [k, c] : counts_) level.emplace(k, double(c));
  for (int k = order_; k >= 1; --k) {
    auto& hist = histories_[size_t(k - 1)];
    int64_t n1 = 0, n2 = 0;
    for (const auto& [gram, c] : level) {
      const std::vector<int32_t> ids = ids_of(gram);
      History& h = hist[key_of(ids.data(), k - 1)];
      h.total += c;
      h.next.emplace_back(ids.back(), c);
      n1 += c == 1;
      n2 += c == 2;
    }
    if (n1 > 0 && n2 > 0) discount_[size_t(k - 1)] = double(n1) / double(n1 + 2 * n2);
    if (k == 1) break;
    std::unordered_map<Key, double> lower;  // each order-k type adds 1 to its (k - 1)-suffix
    for (const auto& [gram, c] : level) lower[gram.substr(sizeof(int32_t))] += 1;
    level = std::move(lower);
  }
}

std::vector<int64_t> NgramLm::distinct_ngrams() const {
  std::vector<int64_t> out;
  for (const auto& hist : histories_) {
    int64_t n = 0;
    for (const auto& [key, h] : hist) n += int64_t(h.next.size());
    out.push_back(n);
  }
  return out;
}

void NgramLm::probabilities(const int32_t* context, double* p) const {
  std::fill(p, p + classes_ + 1, 1.0 / double(classes_));
  p[0] = 0;
  for (int k = 1; k <= order_; ++k) {
    const auto& hist = histories_[size_t(k - 1)];
    auto it = hist.find(key_of(context + (order_ - k), k - 1));
    if (it == hist.end()) continue;
    const History& h = it->second;
    const double d = discount_[size_t(k - 1)];
    const double gamma = d * double(h.next.size()) / h.total;  // D_k N_k(h) / c_k(h)
    for (int32_t w = 1; w <= classes_; ++w) p[w] *= gamma;
    for (const auto& [w, c] : h.next) p[w] += std::max(c - d, 0.0) / h.total;
  }
}

double NgramLm::log_prob(const LabelSequence& history, int32_t next) const {
  CLUSTR_CHECK(next >= 1 && next <= classes_,
               "n-gram model: the predicted symbol must be a label in [1, ", classes_,
               ") or </s> = ", classes_, ", got ", next);
  std::vector<int32_t> context(size_t(std::max(order_ - 1, 0)), 0);
  const size_t take = std::min(context.size(), history.size());
  std::copy(history.end() - std::ptrdiff_t(take), history.end(),
            context.end() - std::ptrdiff_t(take));
  std::vector<double> p(size_t(classes_) + 1);
  probabilities(context.data(), p.data());
  return std::log(p[size_t(next)]);
}

void NgramLm::log_probs(const int32_t* context, float* out) const {
  std::vector<double> p(size_t(classes_) + 1);
  probabilities(context, p.data());
  out[0] = -std::numeric_limits<float>::infinity();
  for (size_t w = 1; w < p.size(); ++w) out[w] = static_cast<float>(std::log(p[w]));
}

double NgramLm::sequence_log_prob(const LabelSequence& labels) const {
  double sum = 0;
  LabelSequence history;
  for (int32_t l : labels) {
    sum += log_prob(history, l);
    history.push_back(l);
  }
  return sum + log_prob(history, end());
}

std::string NgramLm::to_json(const std::vector<std::string>& tokens) const {
  CLUSTR_CHECK(int64_t(tokens.size()) == classes_, "n-gram model: expected ", classes_,
               " tokens to save with the model, got ", tokens.size());
  nlohmann::json counts = nlohmann::json::array();
  std::map<Key, int64_t> sorted(counts_.begin(), counts_.end());
  for (const auto& [gram, c] : sorted) {
    nlohmann::json row = ids_of(gram);
    row.push_back(c);
    counts.push_back(std::move(row));
  }
  nlohmann::json j = {{"format", kFormat},
                      {"version", kVersion},
                      {"order", order_},
                      {"tokens", tokens},
                      {"counts", std::move(counts)}};
  return j.dump() + "\n";
}

NgramLm NgramLm::from_json(const std::string& text, const std::string& source,
                           std::vector<std::string>* tokens) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::cat(source, ": not an n-gram model (not JSON: ", e.what(), ")"));
  }
  auto field = [&](const char* name) -> const nlohmann::json& {
    CLUSTR_CHECK(j.is_object() && j.contains(name), source,
                 ": not an n-gram model (expected a JSON object with \"", name, "\")");
    return j.at(name);
  };
  CLUSTR_CHECK(field("format") == kFormat, source, ": expected format \"", kFormat, "\", got ",
               field("format").dump());
  CLUSTR_CHECK(field("version") == kVersion, source, ": n-gram model version ",
               field("version").dump(), " is not the supported ", kVersion);
  const nlohmann::json& o = field("order");
  CLUSTR_CHECK(o.is_number_integer() && o.get<int64_t>() >= 1 && o.get<int64_t>() <= kMaxOrder,
               source, ": \"order\" must be an integer in [1, ", kMaxOrder, "], got ", o.dump());
  const nlohmann::json& t = field("tokens");
  CLUSTR_CHECK(t.is_array() && t.size() >= 2 &&
                   std::all_of(t.begin(), t.end(), [](const auto& x) { return x.is_string(); }),
               source, ": \"tokens\" must be an array of at least 2 strings");
  const nlohmann::json& c = field("counts");
  CLUSTR_CHECK(c.is_array(), source, ": \"counts\" must be an array");
  NgramLm lm;
  lm.order_ = o.get<int>();
  lm.classes_ = static_cast<int32_t>(t.size());
  std::vector<int32_t> ids(size_t(lm.order_));
  for (size_t r = 0; r < c.size(); ++r) {
    const nlohmann::json& row = c[r];
    CLUSTR_CHECK(row.is_array() && row.size() == size_t(lm.order_) + 1 &&
                     std::all_of(row.begin(), row.end(),
                                 [](const auto& x) { return x.is_number_integer(); }),
                 source, ": counts[", r, "] must be ", lm.order_, " ids and a count, got ",
                 row.dump());
    for (int i = 0; i < lm.order_; ++i) {
      const int64_t id = row[size_t(i)].get<int64_t>();
      // <s> (0) only before the first label, </s> (classes) only last.
      const bool last = i == lm.order_ - 1;
      const bool ok = last ? (id >= 1 && id <= lm.classes_) : (id >= 0 && id < lm.classes_);
      CLUSTR_CHECK(ok, source, ": counts[", r, "][", i, "] = ", id, " is not a ",
                   last ? "label or </s>" : "label or <s>", " of the ", lm.classes_, " tokens");
      ids[size_t(i)] = static_cast<int32_t>(id);
    }
    const int64_t n = row.back().get<int64_t>();
    CLUSTR_CHECK(n >= 1, source, ": counts[", r, "]: the count must be >= 1, got ", n);
    auto [it, fresh] = lm.counts_.emplace(key_of(ids.data(), lm.order_), n);
    CLUSTR_CHECK(fresh, source, ": counts[", r, "] repeats the n-gram ",
                 nlohmann::json(ids).dump());
  }
  CLUSTR_CHECK(!lm.counts_.empty(), source, ": the n-gram model has no counts");
  lm.build();
  if (tokens) *tokens = t.get<std::vector<std::string>>();
  return lm;
}

}  // namespace clustr

// A label n-gram language model (interpolated Kneser-Ney), for decoding CTC outputs with prior
// knowledge of which label sequences are likely (layers/ctc_decode.h, "shallow fusion").
//
// The labels are those of a token table (data/manifest.h): classes [1, classes), where class 0
// is the CTC blank, which never occurs in a label sequence. Each sequence is read as
//   <s> ... <s> l1 l2 ... ln </s>
// with order - 1 start symbols; the model predicts the labels and the end </s>, never <s> or
// the blank. Internally <s> takes the blank's id 0 and </s> the id `classes`.
//
// Smoothing (Chen and Goodman 1999, interpolated Kneser-Ney with one discount per order):
//   p_k(w | h) = max(c_k(h w) - D_k, 0) / c_k(h) + D_k N_k(h) / c_k(h) * p_{k-1}(w | h')
// where h' is h without its first symbol, c_k(h) = sum over w of c_k(h w) and N_k(h) the number
// of distinct w with c_k(h w) > 0. At the top order c_N are the counts of the training text; at
// the lower orders, continuation counts: c_k(h w) = the number of distinct symbols x with
// c_{k+1}(x h w) > 0. A history never seen at order k hands over to p_{k-1} whole. p_0 is
// uniform over the classes - 1 labels and </s>. D_k = n1 / (n1 + 2 n2), n1 and n2 the numbers
// of order-k n-grams whose count is 1 and 2 (0.5 when either is 0). Every distribution sums to 1
// over the labels and </s>, and no label has probability 0.
//
// The model is kept as its top-order counts (everything else follows from them), which is also
// what its JSON form stores:
//   {"format": "clustr-ngram-lm", "version": 1, "order": N, "tokens": [the token table],
//    "counts": [[s1, ..., sN, count], ...]}
// with ids as above (0: <s>, classes: </s>).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "layers/error_rate.h"

namespace clustr {

class NgramLm {
 public:
  static constexpr int kMaxOrder = 8;

  // Counts the n-grams of `sequences` (labels in [1, classes)) and builds the model. Throws on
  // an order outside [1, kMaxOrder], fewer than 2 classes, or a label out of range (naming the
  // sequence and position).
  static NgramLm estimate(const std::vector<LabelSequence>& sequences, int32_t classes, int order);

  int order() const { return order_; }
  int32_t classes() const { return classes_; }
  int32_t end() const { return classes_; }  // the id of </s>
  // The number of distinct n-grams at each order (1..order), for reports.
  std::vector<int64_t> distinct_ngrams() const;

  // ln p(next | history): history = the labels so far (only the last order - 1 count; fewer
  // are padded with <s>), next a label in [1, classes) or end().
  double log_prob(const LabelSequence& history, int32_t next) const;
  // ln p of every symbol after `context`, the order - 1 ids before it (<s> = 0 where the
  // history is shorter): out[0] (the blank, never predicted) is -inf, out[1 .. classes - 1] the
  // labels, out[classes] </s>. `out` holds classes + 1 floats.
  void log_probs(const int32_t* context, float* out) const;
  // The sum of ln p over a whole sequence, its </s> included.
  double sequence_log_prob(const LabelSequence& labels) const;

  // The JSON form (the header comment) with the token table's strings (tokens.size() must be
  // classes), and back. `source` names the text in error messages (a file name): a text that is
  // not such a model, or whose counts are out of range, is refused with what and where.
  std::string to_json(const std::vector<std::string>& tokens) const;
  static NgramLm from_json(const std::string& text, const std::string& source,
                           std::vector<std::string>* tokens = nullptr);

 private:
  struct History {
    double total = 0;                              // c_k(h)
    std::vector<std::pair<int32_t, double>> next;  // (w, c_k(h w)), c > 0; N_k(h) = its size
  };
  using Key = std::string;  // the bytes of a history's ids
  static Key key_of(const int32_t* ids, int n);
  void build();  // the lower orders and the discounts, from counts_
  // p of every symbol after `context` (order - 1 ids) into p[0 .. classes], p[0] = 0: the one
  // place the smoothing is computed, for log_prob and log_probs alike.
  void probabilities(const int32_t* context, double* p) const;

  int order_ = 0;
  int32_t classes_ = 0;
  std::unordered_map<Key, int64_t> counts_;                  // top-order n-grams (order ids each)
  std::vector<std::unordered_map<Key, History>> histories_;  // [k - 1]: order k's histories
  std::vector<double> discount_;                             // [k - 1]: D_k
};

}  // namespace clustr

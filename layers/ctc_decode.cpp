// CTC decoding (greedy and prefix beam search), edit distance and the corpus error rate.
//
// Prefix beam search keeps, for each prefix in the beam, ln p_b (alignments so far that end in
// a blank) and ln p_nb (that end in the prefix's last label). For a frame with
// log-probabilities lp and a prefix y with last label l:
//   y            += (p_b + p_nb) * p(blank)           the blank extends y itself
//   y            += p_nb * p(l)                        l held: the same prefix
//   y + l        += p_b * p(l)                         l repeated: needs the blank in between
//   y + c (c!=l) += (p_b + p_nb) * p(c)
// (products are sums in log space, + is log-add-exp). Prefixes live in a trie (parent, label)
// so that a prefix is one integer; candidates that extend the trie are only added as nodes when
// they survive the pruning, so the trie holds at most T * beam_width nodes.
#include "layers/ctc_decode.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/math.h"

namespace clustr {

namespace {

constexpr int64_t kParallelMin = 32768;  // frames x classes (x beam); below, one thread

struct Checked {
  int64_t B, T, V;
  const float* x;
  const int32_t* lengths;
};

Checked check_decode_inputs(const char* op, const Tensor& logits, const Tensor& input_lengths,
                            int blank) {
  CLUSTR_CHECK(logits.defined() && logits.dtype() == DType::f32 && logits.rank() == 3 &&
                   logits.device() == Device::cpu,
               op, ": expected logits f32 (B, T, V) on cpu, got ",
               logits.defined() ? describe(logits) : std::string("an undefined tensor"));
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  CLUSTR_CHECK(V >= 1, op, ": expected at least one class, got logits ", describe(logits));
  CLUSTR_CHECK(blank >= 0 && blank < V, op, ": blank = ", blank, " is outside the ", V,
               " classes [0, ", V, ")");
  CLUSTR_CHECK(
      input_lengths.defined() && input_lengths.dtype() == DType::i32 && input_lengths.rank() == 1 &&
          input_lengths.size(0) == B && input_lengths.device() == Device::cpu,
      op, ": expected input_lengths i32 (", B, ") on cpu, got ",
      input_lengths.defined() ? describe(input_lengths) : std::string("an undefined tensor"));
  const int32_t* il = input_lengths.i32();
  for (int64_t b = 0; b < B; ++b)
    CLUSTR_CHECK(il[b] >= 0 && il[b] <= T, op, ": input_lengths[", b, "] = ", il[b],
                 " is outside [0, T = ", T, "]");
  return {B, T, V, logits.f32(), il};
}

// lp (V) = log_softmax(x (V)).
void log_softmax_frame(const float* x, int64_t V, float* lp) {
  float m = x[0];
  for (int64_t c = 1; c < V; ++c) m = math::Maximum{}(m, x[c]);
  double s = 0;
  for (int64_t c = 0; c < V; ++c) s += std::exp(static_cast<double>(x[c] - m));
  const float shift = m + static_cast<float>(std::log(s));
  for (int64_t c = 0; c < V; ++c) lp[c] = x[c] - shift;
}

// The prefixes seen so far: node 0 is the empty prefix.
struct Trie {
  std::vector<int32_t> parent{-1}, label{-1};
  std::unordered_map<uint64_t, int32_t> children;  // key(parent, label) -> node

  static uint64_t key(int32_t p, int32_t c) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(p)) << 32) | static_cast<uint32_t>(c);
  }
  int32_t find(int32_t p, int32_t c) const {
    auto it = children.find(key(p, c));
    return it == children.end() ? -1 : it->second;
  }
  int32_t add(int32_t p, int32_t c) {
    const int32_t node = static_cast<int32_t>(parent.size());
    parent.push_back(p);
    label.push_back(c);
    children.emplace(key(p, c), node);
    return node;
  }
  LabelSequence labels_of(int32_t node) const {
    LabelSequence out;
    for (; node > 0; node = parent[node]) out.push_back(label[node]);
    std::reverse(out.begin(), out.end());
    return out;
  }
};

// A prefix in the beam or a candidate for it: an existing trie node, or (node < 0) the
// extension of `parent` by `label`, not in the trie yet.
struct Prefix {
  int32_t node, parent, label;
  float pb, pnb;  // ln p of the alignments ending in a blank / in the last label
  float total() const { return math::log_add_exp(pb, pnb); }
};

CtcHypothesis beam_search_one(const float* x, int64_t frames, int64_t V, int beam_width,
                              int blank) {
  Trie trie;
  std::vector<Prefix> beam{{0, -1, -1, 0.0f, -INFINITY}}, cand;
  std::unordered_map<uint64_t, size_t> index;  // candidate key -> position in cand
  std::vector<float> lp(static_cast<size_t>(V));
  std::vector<size_t> order;

  // The candidate for `y`'s extension by c (c < 0: y itself), created at -inf when new.
  auto slot = [&](const Prefix& y, int32_t c) -> Prefix& {
    int32_t node = y.node, parent = -1;
    if (c >= 0) {
      node = trie.find(y.node, c);
      parent = y.node;
    }
    // Existing nodes are keyed by their id; new extensions by (parent, label) above 2^32.
    const uint64_t k = node >= 0 ? static_cast<uint64_t>(node) : Trie::key(parent + 1, c);
    auto [it, inserted] = index.emplace(k, cand.size());
    if (inserted) cand.push_back({node, parent, c, -INFINITY, -INFINITY});
    return cand[it->second];
  };

  for (int64_t t = 0; t < frames; ++t) {
    log_softmax_frame(x + t * V, V, lp.data());
    cand.clear();
    index.clear();
    for (const Prefix& y : beam) {
      const float total = y.total();
      Prefix& same = slot(y, -1);
      same.pb = math::log_add_exp(same.pb, total + lp[blank]);
      const int32_t last = trie.label[y.node];
      for (int32_t c = 0; c < V; ++c) {
        if (c == blank) continue;
        if (c == last) {
          Prefix& held = slot(y, -1);
          held.pnb = math::log_add_exp(held.pnb, y.pnb + lp[c]);
          Prefix& repeated = slot(y, c);
          repeated.pnb = math::log_add_exp(repeated.pnb, y.pb + lp[c]);
        } else {
          Prefix& extended = slot(y, c);
          extended.pnb = math::log_add_exp(extended.pnb, total + lp[c]);
        }
      }
    }
    // Keep the best beam_width, ties to the earlier candidate.
    order.resize(cand.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const size_t keep = std::min(order.size(), static_cast<size_t>(beam_width));
    std::vector<float> score(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) {
      const float v = cand[i].total();
      score[i] = std::isnan(v) ? -INFINITY : v;  // NaN logits must not break the ordering
    }
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](size_t a, size_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    beam.clear();
    for (size_t i = 0; i < keep; ++i) {
      Prefix p = cand[order[i]];
      if (p.node < 0) p.node = trie.add(p.parent, p.label);
      beam.push_back(p);
    }
  }
  const Prefix& best = beam.front();  // beam is sorted, best first
  return {trie.labels_of(best.node), static_cast<double>(best.total())};
}

}  // namespace

std::vector<LabelSequence> ctc_greedy_decode(const Tensor& logits, const Tensor& input_lengths,
                                             int blank) {
  const Checked in = check_decode_inputs("ctc_greedy_decode", logits, input_lengths, blank);
  std::vector<LabelSequence> out(static_cast<size_t>(in.B));
#pragma omp parallel for schedule(dynamic, 1) if (in.B * in.T * in.V >= kParallelMin)
  for (int64_t b = 0; b < in.B; ++b) {
    int32_t previous = -1;
    for (int64_t t = 0; t < in.lengths[b]; ++t) {
      const float* xt = in.x + (b * in.T + t) * in.V;
      int32_t best = 0;
      for (int32_t c = 1; c < in.V; ++c)
        if (xt[c] > xt[best]) best = c;
      if (best != previous && best != blank) out[b].push_back(best);
      previous = best;
    }
  }
  return out;
}

std::vector<CtcHypothesis> ctc_beam_search(const Tensor& logits, const Tensor& input_lengths,
                                           int beam_width, int blank) {
  const Checked in = check_decode_inputs("ctc_beam_search", logits, input_lengths, blank);
  CLUSTR_CHECK(beam_width >= 1, "ctc_beam_search: expected beam_width >= 1, got ", beam_width);
  std::vector<CtcHypothesis> out(static_cast<size_t>(in.B));
#pragma omp parallel for schedule(dynamic, 1) if (in.B * in.T * in.V * beam_width >= kParallelMin)
  for (int64_t b = 0; b < in.B; ++b)
    out[b] = beam_search_one(in.x + b * in.T * in.V, in.lengths[b], in.V, beam_width, blank);
  return out;
}

std::vector<LabelSequence> target_sequences(const Tensor& targets, const Tensor& target_lengths) {
  CLUSTR_CHECK(
      target_lengths.defined() && target_lengths.dtype() == DType::i32 &&
          target_lengths.rank() == 1 && target_lengths.device() == Device::cpu,
      "target_sequences: expected target_lengths i32 (B) on cpu, got ",
      target_lengths.defined() ? describe(target_lengths) : std::string("an undefined tensor"));
  const int64_t B = target_lengths.size(0);
  CLUSTR_CHECK(targets.defined() && targets.dtype() == DType::i32 &&
                   targets.device() == Device::cpu &&
                   (targets.rank() == 1 || (targets.rank() == 2 && targets.size(0) == B)),
               "target_sequences: expected targets i32 (B = ", B, ", Umax) or (sum of ",
               "target_lengths) on cpu, got ",
               targets.defined() ? describe(targets) : std::string("an undefined tensor"));
  const int32_t* tl = target_lengths.i32();
  const int32_t* tg = targets.i32();
  std::vector<LabelSequence> out(static_cast<size_t>(B));
  int64_t offset = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = targets.rank() == 2 ? b * targets.size(1) : offset;
    const int64_t limit = targets.rank() == 2 ? targets.size(1) : targets.numel() - offset;
    CLUSTR_CHECK(tl[b] >= 0 && tl[b] <= limit, "target_sequences: target_lengths[", b,
                 "] = ", tl[b], " does not fit targets ", describe(targets));
    out[b].assign(tg + start, tg + start + tl[b]);
    offset += tl[b];
  }
  return out;
}

}  // namespace clustr

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
//
// With a language model (shallow fusion), p_b and p_nb stay the CTC's own: the model's
// ln p of a prefix is a property of its trie node (its parent's plus ln p_lm(label | the
// parent's last labels)), added with its weight and the length bonus only where prefixes are
// ranked. The model's distribution after a context is computed once per distinct context.
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
  std::vector<int32_t> parent{-1}, label{-1}, depth{0};
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
    depth.push_back(depth[size_t(p)] + 1);
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

// The fusion's side of the search for one utterance: per trie node, ln p_lm of its labels and
// (when asked) the model's distribution after them.
struct LmScorer {
  LmScorer(const LmFusion& f, int64_t V)
      : fusion(f), width(size_t(V) + 1), context(size_t(f.lm ? f.lm->order() - 1 : 0)) {}

  bool with_lm() const { return fusion.lm && fusion.weight != 0; }
  bool on() const { return with_lm() || fusion.bonus != 0; }

  // ln p_lm of each symbol after `node`'s labels ((V + 1) floats, </s> last).
  const float* after(const Trie& trie, int32_t node) {
    if (node_dist.size() <= size_t(node)) node_dist.resize(size_t(node) + 1, -1);
    if (node_dist[size_t(node)] < 0) {
      std::fill(context.begin(), context.end(), 0);  // <s>
      int32_t n = node;
      for (size_t i = context.size(); i > 0 && n > 0; --i, n = trie.parent[size_t(n)])
        context[i - 1] = trie.label[size_t(n)];
      const std::string key(reinterpret_cast<const char*>(context.data()),
                            context.size() * sizeof(int32_t));
      auto [it, fresh] = by_context.emplace(key, int32_t(by_context.size()));
      if (fresh) {
        table.resize(table.size() + width);
        fusion.lm->log_probs(context.data(), table.data() + table.size() - width);
      }
      node_dist[size_t(node)] = it->second;
    }
    return table.data() + size_t(node_dist[size_t(node)]) * width;
  }
  // ln p_lm of `node`'s labels; nodes are scored in the order they are added, parents first.
  double lm_of(const Trie& trie, int32_t node) {
    while (node_lm.size() <= size_t(node)) {
      const auto n = int32_t(node_lm.size());
      node_lm.push_back(n == 0 ? 0.0
                               : node_lm[size_t(trie.parent[size_t(n)])] +
                                     after(trie, trie.parent[size_t(n)])[trie.label[size_t(n)]]);
    }
    return node_lm[size_t(node)];
  }
  // The ranking's addition for a prefix `depth` labels long with ln p_lm = lm.
  double bonus_of(double lm, int32_t depth) const {
    return fusion.weight * lm + fusion.bonus * double(depth);
  }

  const LmFusion& fusion;
  size_t width;
  std::vector<int32_t> context;
  std::vector<float> table;
  std::unordered_map<std::string, int32_t> by_context;
  std::vector<int32_t> node_dist;
  std::vector<double> node_lm;
};

// A prefix in the beam or a candidate for it: an existing trie node, or (node < 0) the
// extension of `parent` by `label`, not in the trie yet.
struct Prefix {
  int32_t node, parent, label;
  float pb, pnb;  // ln p of the alignments ending in a blank / in the last label
  float total() const { return math::log_add_exp(pb, pnb); }
};

CtcHypothesis beam_search_one(const float* x, int64_t frames, int64_t V, int beam_width,
                              int blank, const LmFusion& fusion) {
  Trie trie;
  LmScorer lm(fusion, V);
  const bool fused = lm.on(), with_lm = lm.with_lm();
  // The ranking's addition for a candidate: its node's, or its parent's plus the label's.
  auto addition = [&](const Prefix& p) -> double {
    if (!fused) return 0;
    if (p.node >= 0)
      return lm.bonus_of(with_lm ? lm.lm_of(trie, p.node) : 0, trie.depth[size_t(p.node)]);
    const double l =
        with_lm ? lm.lm_of(trie, p.parent) + lm.after(trie, p.parent)[p.label] : 0;
    return lm.bonus_of(l, trie.depth[size_t(p.parent)] + 1);
  };
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
      const float v = static_cast<float>(cand[i].total() + addition(cand[i]));
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
  // The beam is sorted, best first; with a language model the end of the sequence counts too.
  size_t best = 0;
  double best_score = -INFINITY;
  for (size_t i = 0; i < beam.size(); ++i) {
    double v = double(beam[i].total()) + addition(beam[i]);
    if (with_lm) v += fusion.weight * lm.after(trie, beam[i].node)[V];
    if (std::isnan(v)) v = -INFINITY;
    if (i == 0 || v > best_score) best = i, best_score = v;
  }
  return {trie.labels_of(beam[best].node), static_cast<double>(beam[best].total()), best_score};
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
                                           int beam_width, int blank, const LmFusion& fusion) {
  const Checked in = check_decode_inputs("ctc_beam_search", logits, input_lengths, blank);
  CLUSTR_CHECK(beam_width >= 1, "ctc_beam_search: expected beam_width >= 1, got ", beam_width);
  CLUSTR_CHECK(std::isfinite(fusion.weight) && fusion.weight >= 0 && std::isfinite(fusion.bonus),
               "ctc_beam_search: expected a finite language-model weight >= 0 and a finite "
               "bonus, got ", fusion.weight, " and ", fusion.bonus);
  if (fusion.lm)
    CLUSTR_CHECK(fusion.lm->classes() == in.V && blank == 0, "ctc_beam_search: the language "
                 "model's ", fusion.lm->classes(), " classes must be the logits' V = ", in.V,
                 ", with the blank 0 (got blank = ", blank, ")");
  std::vector<CtcHypothesis> out(static_cast<size_t>(in.B));
#pragma omp parallel for schedule(dynamic, 1) if (in.B * in.T * in.V * beam_width >= kParallelMin)
  for (int64_t b = 0; b < in.B; ++b)
    out[b] = beam_search_one(in.x + b * in.T * in.V, in.lengths[b], in.V, beam_width, blank,
                             fusion);
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

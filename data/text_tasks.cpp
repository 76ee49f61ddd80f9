// The text app's two fine-tuning tasks from WordNet (data/text_tasks.h gives their recipes,
// which the comments here cite by step), their JSON-lines files, statistics and metrics.
#include "data/text_tasks.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace clustr {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // fields in the order written

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A stream seeded by (seed, text): SplitMix64, the same on every platform. below(n) takes the
// remainder (a bias under n / 2^64, nothing for these sizes) instead of std's distributions,
// whose results differ between standard libraries.
class Rng {
 public:
  Rng(uint64_t seed, const std::string& text) : state_(splitmix64(seed) ^ fnv1a(text)) {}
  uint64_t next() { return splitmix64(state_++ * 0x9e3779b97f4a7c15ull); }
  size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
  template <class T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

std::string lower(std::string s) {
  for (char& c : s) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
  return s;
}

// A sentence as compared between splits: lower case, runs of spaces made one, no end spaces.
std::string sentence_key(const std::string& s) {
  std::string out;
  for (char c : lower(s)) {
    if (c == ' ' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

const std::string& text_of(const WordNet& wn, const LemmaInExample& f) {
  return wn.synsets[f.synset].examples[f.example];
}

// ---- Task A ----

using LemmaKey = std::pair<std::string, PartOfSpeech>;

// Step 1: each lemma's sentences, the ambiguous ones left out, one per text.
std::map<LemmaKey, std::vector<LemmaInExample>> lemma_sentences(const WordNet& wn) {
  std::map<LemmaKey, std::vector<LemmaInExample>> all;
  for (LemmaInExample& f : lemmas_in_examples(wn))
    all[{f.lemma, wn.synsets[f.synset].pos}].push_back(std::move(f));
  for (auto& [key, found] : all) {
    std::map<std::string, std::set<size_t>> synsets_of;
    for (const LemmaInExample& f : found) synsets_of[sentence_key(text_of(wn, f))].insert(f.synset);
    std::vector<LemmaInExample> kept;
    std::set<std::string> seen;
    for (LemmaInExample& f : found) {
      const std::string k = sentence_key(text_of(wn, f));
      if (synsets_of[k].size() == 1 && seen.insert(k).second) kept.push_back(std::move(f));
    }
    found = std::move(kept);
  }
  return all;
}

// Steps 2 and 3: one lemma's pairs.
std::vector<WicExample> lemma_pairs(const LemmaKey& key, const std::vector<LemmaInExample>& occ,
                                    const WordNet& wn, const WicOptions& options) {
  std::vector<std::pair<size_t, size_t>> candidates[2];  // [label]
  for (size_t i = 0; i < occ.size(); ++i)
    for (size_t j = i + 1; j < occ.size(); ++j)
      candidates[occ[i].synset == occ[j].synset ? 1 : 0].push_back({i, j});
  Rng rng(options.seed, key.first + "/" + pos_letter(key.second));
  std::vector<bool> used(occ.size(), false);
  std::vector<WicExample> out;
  for (int label : {1, 0}) {
    const size_t cap = size_t(std::max(0, label ? options.max_positives_per_lemma
                                                : options.max_negatives_per_lemma));
    std::vector<std::pair<size_t, size_t>>& c = candidates[label];
    rng.shuffle(c);
    std::vector<bool> taken(c.size(), false);
    size_t n = 0;
    for (int pass = 0; pass < 2; ++pass)  // pass 0: pairs of unused sentences only
      for (size_t k = 0; k < c.size() && n < cap; ++k) {
        auto [a, b] = c[k];
        if (taken[k] || (pass == 0 && (used[a] || used[b]))) continue;
        taken[k] = used[a] = used[b] = true, ++n;
        if (rng.next() & 1) std::swap(a, b);
        out.push_back({key.first, key.second, text_of(wn, occ[a]), text_of(wn, occ[b]), occ[a].span,
                       occ[b].span, wn.synsets[occ[a].synset].id(),
                       wn.synsets[occ[b].synset].id(), label});
      }
  }
  return out;
}

// Drops, in dev and then train, the examples with a sentence of an earlier split in the order
// test, dev, train; returns the number dropped per split.
template <class T, class Keys>
std::array<int64_t, 3> drop_shared(std::array<std::vector<T>, 3>& splits, Keys keys) {
  std::array<int64_t, 3> dropped{};
  std::unordered_set<std::string> claimed;
  for (int s : {2, 1, 0}) {
    std::vector<T> kept;
    for (T& x : splits[size_t(s)]) {
      bool shared = false;
      for (const std::string& k : keys(x)) shared = shared || claimed.count(k);
      if (shared) ++dropped[size_t(s)];
      else kept.push_back(std::move(x));
    }
    for (const T& x : kept)
      for (const std::string& k : keys(x)) claimed.insert(k);
    splits[size_t(s)] = std::move(kept);
  }
  return dropped;
}

}  // namespace

const char* split_name(Split split) {
  static const char* const names[] = {"train", "dev", "test"};
  return names[int(split)];
}

Split split_of(const std::string& lemma, PartOfSpeech pos, uint64_t seed) {
  const uint64_t h = splitmix64(fnv1a(lower(lemma) + '\0' + pos_letter(pos)) ^ splitmix64(seed));
  const uint64_t bucket = h % 10;
  return bucket < 8 ? Split::train : bucket == 8 ? Split::dev : Split::test;
}

std::array<WicSplit, 3> build_wic(const WordNet& wn, const WicOptions& options) {
  std::array<std::vector<WicExample>, 3> pairs;
  for (const auto& [key, occ] : lemma_sentences(wn))
    for (WicExample& x : lemma_pairs(key, occ, wn, options))
      pairs[size_t(split_of(key.first, key.second, options.seed))].push_back(std::move(x));
  const auto dropped = drop_shared(pairs, [](const WicExample& x) {
    return std::array<std::string, 2>{sentence_key(x.sentence1), sentence_key(x.sentence2)};
  });
  std::array<WicSplit, 3> out;
  for (size_t s = 0; s < 3; ++s) {
    WicSplit& split = out[s];
    split.split = Split(int(s));
    split.dropped_shared_sentence = dropped[s];
    Rng rng(options.seed, std::string("wic/") + split_name(split.split));
    std::vector<WicExample> by_label[2];
    for (WicExample& x : pairs[s]) by_label[x.label].push_back(std::move(x));
    const size_t n = std::min(by_label[0].size(), by_label[1].size());
    for (auto& v : by_label) {
      rng.shuffle(v);
      split.dropped_for_balance += int64_t(v.size() - n);
      v.resize(n);
      for (WicExample& x : v) split.examples.push_back(std::move(x));
    }
    rng.shuffle(split.examples);
  }
  return out;
}

// ---- Task B ----

namespace {

struct PoolEntry {
  size_t synset;
  const std::string* sentence;
};

// Word pieces of pool sentences, counted once each, when first needed.
class PieceCounts {
 public:
  explicit PieceCounts(const BertTokenizer& t) : tokenizer_(t) {}
  int64_t operator()(const std::string& s) {
    const auto it = counts_.find(&s);
    if (it != counts_.end()) return it->second;
    return counts_[&s] = int64_t(tokenizer_.encode(s).size());
  }

 private:
  const BertTokenizer& tokenizer_;
  std::unordered_map<const std::string*, int64_t> counts_;
};

// Steps 3 and 4 for one question; nothing when its passage stays short or the answer example
// is too long (`long_answer` says which).
std::optional<SpanExample> build_passage(const WordNet& wn, const LemmaInExample& q,
                                         const std::vector<PoolEntry>& pool, PieceCounts& pieces,
                                         const BertTokenizer& tokenizer, const SpanOptions& o,
                                         bool& long_answer) {
  const Synset& s = wn.synsets[q.synset];
  const std::string& answer = s.examples[q.example];
  const int64_t max_example = o.target_pieces / 4;
  int64_t total = pieces(answer);
  long_answer = total > max_example;
  if (long_answer) return std::nullopt;
  std::vector<LemmaPattern> patterns;
  for (const std::string& l : s.lemmas)
    patterns.push_back(LemmaPattern::any_pos(l, &wn.morphology));
  std::unordered_set<std::string> own;
  for (const std::string& e : s.examples) own.insert(sentence_key(e));
  Rng rng(o.seed, "passage/" + s.id());
  std::vector<const std::string*> parts;
  std::unordered_set<std::string> in_passage;  // the passage's texts
  for (int draw = 0; draw < 1000 && total < o.target_pieces && !pool.empty(); ++draw) {
    const PoolEntry& entry = pool[rng.below(pool.size())];
    const std::string& e = *entry.sentence;
    const std::string key = sentence_key(e);
    if (entry.synset == q.synset || own.count(key) || in_passage.count(key)) continue;
    const int64_t p = pieces(e);
    if (p > max_example || total + p > o.target_pieces + o.tolerance) continue;
    if (std::any_of(patterns.begin(), patterns.end(),
                    [&](const LemmaPattern& m) { return m.find(e).has_value(); }))
      continue;
    parts.push_back(&e), in_passage.insert(key), total += p;
  }
  if (total < o.target_pieces) return std::nullopt;
  const size_t at = rng.below(parts.size() + 1);
  parts.insert(parts.begin() + std::ptrdiff_t(at), &answer);
  SpanExample x{s.id(), s.definition(), "", {}, "", q.lemma, s.pos, 0};
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k) x.context += ' ';
    if (k == at) x.answer = {x.context.size() + q.span.begin, x.context.size() + q.span.end};
    x.context += *parts[k];
  }
  x.answer_text = x.context.substr(x.answer.begin, x.answer.end - x.answer.begin);
  x.context_pieces = int64_t(tokenizer.encode(x.context).size());
  return x;
}

}  // namespace

std::array<SpanSplit, 3> build_span_task(const WordNet& wn, const BertTokenizer& tokenizer,
                                         const SpanOptions& o) {
  CLUSTR_CHECK(o.target_pieces >= 8 && o.tolerance >= 0, "build_span_task: expected "
               "target_pieces >= 8 and tolerance >= 0, got ", o.target_pieces, " and ",
               o.tolerance);
  // Steps 1 and 2: each synset's question, drawn among its examples, and its split.
  std::vector<std::vector<LemmaInExample>> found(wn.synsets.size());
  for (LemmaInExample& f : lemmas_in_examples(wn))  // the first lemma of each example
    if (found[f.synset].empty() || found[f.synset].back().example != f.example)
      found[f.synset].push_back(std::move(f));
  std::vector<std::optional<LemmaInExample>> questions(wn.synsets.size());
  std::array<std::vector<size_t>, 3> members;
  for (size_t i = 0; i < wn.synsets.size(); ++i) {
    Rng rng(o.seed, "question/" + wn.synsets[i].id());
    if (!wn.synsets[i].definitions.empty() && !found[i].empty())
      questions[i] = found[i][rng.below(found[i].size())];
    const std::vector<std::string>& lemmas = wn.synsets[i].lemmas;
    const std::string lemma = questions[i] ? questions[i]->lemma
                                           : lower(lemmas.empty() ? "" : lemmas[0]);
    members[size_t(split_of(lemma, wn.synsets[i].pos, o.seed))].push_back(i);
  }
  // The pools, each text in one split (test first, then dev, then train).
  std::array<std::vector<PoolEntry>, 3> pools;
  for (size_t s = 0; s < 3; ++s)
    for (size_t i : members[s])
      for (const std::string& e : wn.synsets[i].examples) pools[s].push_back({i, &e});
  drop_shared(pools, [](const PoolEntry& p) {
    return std::array<std::string, 1>{sentence_key(*p.sentence)};
  });
  std::array<SpanSplit, 3> out;
  PieceCounts pieces(tokenizer);
  for (size_t s = 0; s < 3; ++s) {
    SpanSplit& split = out[s];
    split.split = Split(int(s));
    std::unordered_set<std::string> pool_keys;
    for (const PoolEntry& p : pools[s]) pool_keys.insert(sentence_key(*p.sentence));
    std::vector<LemmaInExample> qs;
    for (size_t i : members[s]) {
      if (!questions[i]) continue;
      const LemmaInExample& q = *questions[i];
      if (pool_keys.count(sentence_key(wn.synsets[i].examples[q.example]))) qs.push_back(q);
      else ++split.dropped_shared_sentence;
    }
    split.questions = int64_t(qs.size());
    Rng rng(o.seed, std::string("span/") + split_name(split.split));
    rng.shuffle(qs);
    for (size_t k = 0; k < qs.size() && int64_t(split.examples.size()) < o.max_examples[s]; ++k) {
      bool long_answer = false;
      if (auto x = build_passage(wn, qs[k], pools[s], pieces, tokenizer, o, long_answer))
        split.examples.push_back(std::move(*x));
      else
        ++(long_answer ? split.dropped_long_answer : split.dropped_short);
    }
  }
  return out;
}

// ---- Files ----

namespace {

void write_lines(const std::string& path, const std::vector<std::string>& lines, bool overwrite) {
  std::error_code ec;
  CLUSTR_CHECK(overwrite || !fs::exists(path, ec), "text tasks: ", path,
               " exists; pass overwrite to replace it");
  const fs::path p(path);
  const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
  CLUSTR_CHECK(fs::is_directory(folder, ec), "text tasks: cannot write ", path, ": the folder ",
               folder.string(), " does not exist");
  const fs::path tmp = folder / ("." + p.filename().string() + ".tmp" + std::to_string(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    for (const std::string& line : lines) out << line << '\n';
    out.flush();
    if (!out.good()) {
      fs::remove(tmp, ec);
      throw Error(detail::cat("text tasks: cannot write ", tmp.string()));
    }
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw Error(detail::cat("text tasks: cannot rename ", tmp.string(), " to ", path, ": ", why));
  }
}

// Each example as one line of JSON (text that is not UTF-8 throws naming the example).
template <class T, class F>
void write_examples(const std::string& path, const std::vector<T>& examples, bool overwrite,
                    F to_json) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < examples.size(); ++i) {
    try {
      lines.push_back(to_json(examples[i]).dump());
    } catch (const json::exception& e) {
      throw Error(detail::cat("text tasks: cannot write ", path, ": example ", i, ": ", e.what()));
    }
  }
  write_lines(path, lines, overwrite);
}

// One parsed line of a JSON-lines file, whose getters name file:line and the field.
class Record {
 public:
  Record(const std::string& text, std::string where) : where_(std::move(where)) {
    try {
      j_ = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(detail::cat("text tasks: ", where_, ": expected a JSON object: ", e.what()));
    }
    CLUSTR_CHECK(j_.is_object(), "text tasks: ", where_, ": expected a JSON object, got ", text);
  }
  const json& field(const char* name, bool (json::*is)() const noexcept, const char* type) const {
    const auto it = j_.find(name);
    CLUSTR_CHECK(it != j_.end(), "text tasks: ", where_, ": field \"", name, "\" is missing");
    CLUSTR_CHECK(((*it).*is)(), "text tasks: ", where_, ": field \"", name, "\" should be ", type,
                 ", got ", it->dump());
    return *it;
  }
  std::string str(const char* name) const {
    return field(name, &json::is_string, "a string").get<std::string>();
  }
  int64_t integer(const char* name, int64_t lo, int64_t hi) const {
    const int64_t v = field(name, &json::is_number_integer, "an integer").get<int64_t>();
    CLUSTR_CHECK(v >= lo && v <= hi, "text tasks: ", where_, ": field \"", name,
                 "\" should be in [", lo, ", ", hi, "], got ", v);
    return v;
  }
  PartOfSpeech pos(const char* name) const {
    const std::string p = str(name);
    CLUSTR_CHECK(p.size() == 1 && std::string("nvar").find(p[0]) != std::string::npos,
                 "text tasks: ", where_, ": field \"", name, "\" should be n, v, a or r, got ", p);
    return pos_from_letter(p[0]);
  }
  // A [begin, end) span of `text` from fields `b` and `e`.
  Span span(const char* b, const char* e, const std::string& text) const {
    const size_t begin = size_t(integer(b, 0, int64_t(text.size())));
    return {begin, size_t(integer(e, int64_t(begin), int64_t(text.size())))};
  }
  const std::string& where() const { return where_; }

 private:
  json j_;
  std::string where_;
};

template <class T, class F>
std::vector<T> read_lines(const std::string& path, F parse) {
  std::error_code ec;
  CLUSTR_CHECK(fs::is_regular_file(path, ec), "text tasks: cannot read ", path, ": ",
               fs::exists(path, ec) ? "not a file" : "it does not exist");
  std::ifstream in(path, std::ios::binary);
  CLUSTR_CHECK(in.good(), "text tasks: cannot read ", path);
  std::vector<T> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number)
    if (!line.empty()) out.push_back(parse(Record(line, path + ":" + std::to_string(number))));
  return out;
}

}  // namespace

void write_wic_jsonl(const std::string& path, const std::vector<WicExample>& examples,
                     bool overwrite) {
  write_examples(path, examples, overwrite, [](const WicExample& x) {
    return json{{"lemma", x.lemma}, {"pos", std::string(1, pos_letter(x.pos))},
                {"sentence1", x.sentence1}, {"start1", x.span1.begin}, {"end1", x.span1.end},
                {"synset1", x.synset1}, {"sentence2", x.sentence2}, {"start2", x.span2.begin},
                {"end2", x.span2.end}, {"synset2", x.synset2}, {"label", x.label}};
  });
}

std::vector<WicExample> read_wic_jsonl(const std::string& path) {
  return read_lines<WicExample>(path, [](const Record& r) {
    WicExample x;
    x.lemma = r.str("lemma");
    x.pos = r.pos("pos");
    x.sentence1 = r.str("sentence1");
    x.span1 = r.span("start1", "end1", x.sentence1);
    x.synset1 = r.str("synset1");
    x.sentence2 = r.str("sentence2");
    x.span2 = r.span("start2", "end2", x.sentence2);
    x.synset2 = r.str("synset2");
    x.label = int(r.integer("label", 0, 1));
    return x;
  });
}

void write_span_jsonl(const std::string& path, const std::vector<SpanExample>& examples,
                      bool overwrite) {
  write_examples(path, examples, overwrite, [](const SpanExample& x) {
    return json{{"id", x.id}, {"question", x.question}, {"context", x.context},
                {"answer_start", x.answer.begin}, {"answer_end", x.answer.end},
                {"answer", x.answer_text}, {"lemma", x.lemma},
                {"pos", std::string(1, pos_letter(x.pos))}, {"context_pieces", x.context_pieces}};
  });
}

std::vector<SpanExample> read_span_jsonl(const std::string& path) {
  return read_lines<SpanExample>(path, [](const Record& r) {
    SpanExample x;
    x.id = r.str("id");
    x.question = r.str("question");
    x.context = r.str("context");
    x.answer = r.span("answer_start", "answer_end", x.context);
    x.answer_text = r.str("answer");
    CLUSTR_CHECK(x.answer_text == x.context.substr(x.answer.begin, x.answer.end - x.answer.begin),
                 "text tasks: ", r.where(), ": field \"answer\" (", x.answer_text, ") should be "
                 "the context's bytes [answer_start, answer_end)");
    x.lemma = r.str("lemma");
    x.pos = r.pos("pos");
    x.context_pieces = r.integer("context_pieces", 0, INT64_MAX);
    return x;
  });
}

// ---- Statistics ----

namespace {

struct RangeOf {  // accumulates a Range
  Range r;
  int64_t n = 0;
  void add(double v) {
    r.min = n ? std::min(r.min, v) : v, r.max = n ? std::max(r.max, v) : v;
    r.mean += (v - r.mean) / double(++n);
  }
};

int64_t count_words(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) n += s[i] != ' ' && (i == 0 || s[i - 1] == ' ');
  return n;
}

std::string fixed(double v, int digits = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

std::string range_text(const Range& r) {
  return fixed(r.min, 0) + " / " + fixed(r.mean) + " / " + fixed(r.max, 0);
}

std::string str(int64_t v) { return std::to_string(v); }

template <size_t N>
std::string slashed(const std::array<int64_t, N>& v) {  // "1 / 2 / 3"
  std::string out;
  for (size_t i = 0; i < N; ++i) out += (i ? " / " : "") + str(v[i]);
  return out;
}

// A Markdown table: the header row, then the rows; numbers (after the first column) go right.
std::string markdown(const std::vector<std::vector<std::string>>& rows) {
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const std::string& cell : rows[r]) out += "| " + cell + " ";
    out += "|\n";
    for (size_t c = 0; r == 0 && c <= rows[0].size(); ++c)
      out += c == rows[0].size() ? "|\n" : c ? "|--:" : "|---";
  }
  return out;
}

}  // namespace

WicStats wic_stats(const WicSplit& split) {
  WicStats st;
  st.split = split_name(split.split);
  std::set<std::string> lemmas, sentences;
  RangeOf words;
  for (const WicExample& x : split.examples) {
    ++st.examples, ++(x.label ? st.positives : st.negatives), ++st.by_pos[size_t(x.pos)];
    lemmas.insert(x.lemma + "/" + pos_letter(x.pos));
    for (const std::string* s : {&x.sentence1, &x.sentence2})
      if (sentences.insert(sentence_key(*s)).second) words.add(double(count_words(*s)));
  }
  st.lemmas = int64_t(lemmas.size()), st.sentences = int64_t(sentences.size());
  st.sentence_words = words.r;
  st.dropped_shared_sentence = split.dropped_shared_sentence;
  st.dropped_for_balance = split.dropped_for_balance;
  return st;
}

std::string wic_stats_markdown(const std::vector<WicStats>& stats) {
  std::vector<std::vector<std::string>> rows = {
      {"split", "pairs", "label 1", "label 0", "lemmas", "n / v / a / r", "sentences",
       "words per sentence (min / mean / max)", "dropped: shared sentence", "dropped: balance"}};
  for (const WicStats& s : stats)
    rows.push_back({s.split, str(s.examples), str(s.positives), str(s.negatives), str(s.lemmas),
                    slashed(s.by_pos), str(s.sentences), range_text(s.sentence_words),
                    str(s.dropped_shared_sentence), str(s.dropped_for_balance)});
  return markdown(rows);
}

SpanStats span_stats(const SpanSplit& split) {
  SpanStats st;
  st.split = split_name(split.split);
  std::set<std::string> lemmas;
  RangeOf pieces, words;
  for (const SpanExample& x : split.examples) {
    ++st.examples;
    lemmas.insert(x.lemma + "/" + pos_letter(x.pos));
    pieces.add(double(x.context_pieces)), words.add(double(count_words(x.question)));
    st.over_256 += x.context_pieces > 256;
    if (!x.context.empty())
      ++st.answer_quarter[std::min<size_t>(3, 4 * x.answer.begin / x.context.size())];
  }
  st.lemmas = int64_t(lemmas.size());
  st.context_pieces = pieces.r, st.question_words = words.r;
  st.questions = split.questions;
  st.dropped_shared_sentence = split.dropped_shared_sentence;
  st.dropped_long_answer = split.dropped_long_answer;
  st.dropped_short = split.dropped_short;
  return st;
}

std::string span_stats_markdown(const std::vector<SpanStats>& stats) {
  std::vector<std::vector<std::string>> rows = {
      {"split", "questions", "examples", "lemmas", "context pieces (min / mean / max)",
       "over 256 pieces", "answers by quarter of the context", "question words (min / mean / max)",
       "dropped: shared sentence / long answer / short passage"}};
  for (const SpanStats& s : stats)
    rows.push_back({s.split, str(s.questions), str(s.examples), str(s.lemmas),
                    range_text(s.context_pieces), str(s.over_256), slashed(s.answer_quarter),
                    range_text(s.question_words),
                    slashed(std::array<int64_t, 3>{s.dropped_shared_sentence, s.dropped_long_answer,
                                                   s.dropped_short})});
  return markdown(rows);
}

// ---- Metrics ----

double accuracy(const std::vector<int>& predictions, const std::vector<int>& labels) {
  CLUSTR_CHECK(!labels.empty() && predictions.size() == labels.size(), "accuracy: expected as "
               "many predictions as labels (at least one), got ", predictions.size(), " and ",
               labels.size());
  int64_t right = 0;
  for (size_t i = 0; i < labels.size(); ++i) right += predictions[i] == labels[i];
  return double(right) / double(labels.size());
}

namespace {

std::vector<std::string> normalized_words(const std::string& text) {
  const std::string punctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";  // Python's
  std::vector<std::string> words;
  std::string word;
  for (char c : lower(text) + " ") {
    if (punctuation.find(c) != std::string::npos) continue;
    if (std::string(" \t\n\r\f\v").find(c) == std::string::npos) {
      word += c;
      continue;
    }
    if (!word.empty() && word != "a" && word != "an" && word != "the") words.push_back(word);
    word.clear();
  }
  return words;
}

double f1_one(const std::vector<std::string>& pred, const std::vector<std::string>& gold) {
  if (pred.empty() || gold.empty()) return pred.empty() && gold.empty() ? 1.0 : 0.0;
  std::map<std::string, int64_t> counts;
  for (const std::string& w : gold) ++counts[w];
  int64_t same = 0;
  for (const std::string& w : pred)
    if (counts[w] > 0) --counts[w], ++same;
  if (same == 0) return 0.0;
  const double p = double(same) / double(pred.size()), r = double(same) / double(gold.size());
  return 2 * p * r / (p + r);
}

}  // namespace

std::string squad_normalize(const std::string& text) {
  std::string out;
  for (const std::string& w : normalized_words(text)) out += (out.empty() ? "" : " ") + w;
  return out;
}

double squad_exact_match(const std::string& prediction, const std::vector<std::string>& answers) {
  CLUSTR_CHECK(!answers.empty(), "squad_exact_match: expected at least one answer, got none");
  double best = 0;
  for (const std::string& a : answers)
    best = std::max(best, squad_normalize(prediction) == squad_normalize(a) ? 1.0 : 0.0);
  return best;
}

double squad_f1(const std::string& prediction, const std::vector<std::string>& answers) {
  CLUSTR_CHECK(!answers.empty(), "squad_f1: expected at least one answer, got none");
  double best = 0;
  for (const std::string& a : answers)
    best = std::max(best, f1_one(normalized_words(prediction), normalized_words(a)));
  return best;
}

}  // namespace clustr

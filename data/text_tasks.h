// The two downstream tasks that the text app fine-tunes a pretrained BERT model on, built from
// WordNet's usage examples (data/wordnet.h), with their files, statistics and metrics.
//
// Task A, word in context (in the spirit of SuperGLUE's WiC, Pilehvar & Camacho-Collados 2019):
// a lemma and two sentences that contain it (a WordNet usage example each, the lemma found by
// LemmaPattern); label 1 when both are examples of the same synset, 0 when of two different
// synsets of that lemma. Per lemma (lower case + part of speech):
//   1. its sentences: the examples of its synsets in which it is found, each text once; a
//      text that is an example of two of its synsets is left out, since its sense is ambiguous
//      (texts compare ignoring case and runs of spaces, here and below);
//   2. candidates: label 1 for each pair of sentences of one synset, label 0 for each pair from
//      two different synsets;
//   3. at most max_positives_per_lemma of label 1 and max_negatives_per_lemma of label 0 (the
//      cap, 2 and 2 by default, so that no word dominates), drawn at random from the
//      candidates, pairs of not-yet-used sentences first; the order in a pair is random.
// A lemma's pairs all go to one split: split_of(lemma, pos, seed). Then, for sentences:
// test keeps its pairs, dev drops each pair with a sentence of test, train each pair with a
// sentence of test or dev, so that no sentence is in two splits (the drops are counted). Last, each split drops pairs of its larger label at
// random until both labels have as many (counted), and is shuffled. Every draw comes from a
// generator seeded with the options' seed and the lemma or split, so a seed gives the same task.
//
// Task B, extractive spans over long contexts (in the spirit of SQuAD, Rajpurkar et al. 2016):
// the question is a synset's definition; the context is a passage of usage examples of many
// synsets joined by single spaces, about target_pieces word pieces long
// (BertTokenizer::encode(context).size()); the answer is the occurrence of one of the synset's
// lemmas in the one example of the passage that belongs to the synset.
//   1. a synset with a definition and an example in which one of its lemmas is found is a
//      question synset: one such example is drawn, its question lemma L is the first lemma
//      found in it;
//   2. every synset goes to split_of(L, pos, seed), a synset without a question by its first
//      lemma; a split's pool is its synsets' examples, each text in one split (test keeps its
//      own, dev loses those of test, train those of test and dev), and a question whose
//      answer example is not in its split's pool is dropped (counted);
//   3. the questions are shuffled and built in turn until max_examples; an answer example of
//      more than target_pieces / 4 pieces drops its question (counted); examples are drawn from
//      the pool and added while the passage is shorter than target_pieces, each skipped that
//      is longer than target_pieces / 4, is an example of the question's synset (or the same
//      text), contains a lemma of the synset in any form of any part of speech
//      (LemmaPattern::any_pos), is in the passage already, or would make it longer than
//      target_pieces + tolerance; a passage still short after 1000 draws drops its question
//      (counted);
//   4. the answer example goes to a random place among the others.
// A synset gives at most one question, so splits are disjoint by synset and by question lemma.
//
// Files are JSON lines, one example per line, offsets in bytes, pos one of "n" "v" "a" "r":
//   task A: lemma, pos, sentence1, start1, end1, synset1, sentence2, start2, end2, synset2,
//           label
//   task B: id, question, context, answer_start, answer_end, answer, lemma, pos, context_pieces
// Writing goes through a temporary file in the same folder and a rename, and refuses to
// replace an existing file unless `overwrite`; reading checks every field (type, range, spans
// inside their text, answer = the context's bytes there) and names file:line and the field.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/bert_tokenizer.h"
#include "data/wordnet.h"

namespace clustr {

enum class Split { train = 0, dev = 1, test = 2 };
const char* split_name(Split split);  // "train", "dev", "test"

// The split of a lemma: a stable 64-bit hash (FNV-1a of the lower-case lemma and the pos
// letter, mixed with the seed by SplitMix64) modulo 10: 0-7 train, 8 dev, 9 test.
Split split_of(const std::string& lemma, PartOfSpeech pos, uint64_t seed);

// ---- Task A: word in context ----

struct WicExample {
  std::string lemma;  // lower case
  PartOfSpeech pos = PartOfSpeech::noun;
  std::string sentence1, sentence2;
  Span span1, span2;             // the lemma's occurrence in each sentence (bytes)
  std::string synset1, synset2;  // Synset::id() of each sentence's synset
  int label = 0;                 // 1: the same synset, 0: two different synsets
};

struct WicOptions {
  uint64_t seed = 1;
  int max_positives_per_lemma = 2;
  int max_negatives_per_lemma = 2;
};

struct WicSplit {
  Split split = Split::train;
  std::vector<WicExample> examples;
  int64_t dropped_shared_sentence = 0;  // pairs with a sentence of another split
  int64_t dropped_for_balance = 0;      // pairs of the larger label dropped
};

// The three splits, train, dev, test, in that order.
std::array<WicSplit, 3> build_wic(const WordNet& wordnet, const WicOptions& options = {});

// ---- Task B: extractive spans ----

struct SpanExample {
  std::string id;        // the question synset's Synset::id()
  std::string question;  // its definition
  std::string context;
  Span answer;              // the answer's bytes in context
  std::string answer_text;  // context.substr(answer.begin, answer.end - answer.begin)
  std::string lemma;        // lower case: the lemma that the answer is a form of
  PartOfSpeech pos = PartOfSpeech::noun;
  int64_t context_pieces = 0;  // BertTokenizer::encode(context).size()
};

struct SpanOptions {
  uint64_t seed = 1;
  int target_pieces = 320;  // the least context length, in word pieces
  int tolerance = 32;       // and the most beyond it
  std::array<int64_t, 3> max_examples = {6000, 600, 600};  // train, dev, test
};

struct SpanSplit {
  Split split = Split::train;
  std::vector<SpanExample> examples;
  int64_t questions = 0;  // question synsets the split had before the cap
  int64_t dropped_shared_sentence = 0;  // questions whose answer example is another split's
  int64_t dropped_long_answer = 0;      // questions whose answer example is too long
  int64_t dropped_short = 0;            // questions whose passage stayed too short
};

std::array<SpanSplit, 3> build_span_task(const WordNet& wordnet, const BertTokenizer& tokenizer,
                                         const SpanOptions& options = {});

// ---- Files ----

void write_wic_jsonl(const std::string& path, const std::vector<WicExample>& examples,
                     bool overwrite = false);
std::vector<WicExample> read_wic_jsonl(const std::string& path);
void write_span_jsonl(const std::string& path, const std::vector<SpanExample>& examples,
                      bool overwrite = false);
std::vector<SpanExample> read_span_jsonl(const std::string& path);

// ---- Statistics ----

struct Range {  // of a length over a split's examples
  double min = 0, mean = 0, max = 0;
};

struct WicStats {
  std::string split;
  int64_t examples = 0, positives = 0, negatives = 0;
  int64_t lemmas = 0, sentences = 0;  // distinct
  std::array<int64_t, 4> by_pos{};    // examples per PartOfSpeech
  Range sentence_words;               // words (separated by spaces) per sentence
  int64_t dropped_shared_sentence = 0, dropped_for_balance = 0;
};
WicStats wic_stats(const WicSplit& split);
std::string wic_stats_markdown(const std::vector<WicStats>& stats);

struct SpanStats {
  std::string split;
  int64_t examples = 0, lemmas = 0;      // lemmas: distinct answer lemmas
  Range context_pieces, question_words;
  int64_t over_256 = 0;                  // contexts of more than 256 word pieces
  std::array<int64_t, 4> answer_quarter{};  // answers that start in each quarter of the context
  int64_t questions = 0, dropped_shared_sentence = 0, dropped_long_answer = 0, dropped_short = 0;
};
SpanStats span_stats(const SpanSplit& split);
std::string span_stats_markdown(const std::vector<SpanStats>& stats);

// ---- Metrics ----

// The fraction of equal entries; throws when the sizes differ or are 0.
double accuracy(const std::vector<int>& predictions, const std::vector<int>& labels);
// SQuAD's answer normalisation: lower case (ASCII), ASCII punctuation removed, the words a, an,
// the removed, runs of whitespace made one space, no space at either end.
std::string squad_normalize(const std::string& text);
// 1 when the normalised prediction equals a normalised answer, else 0 (max over `answers`).
double squad_exact_match(const std::string& prediction, const std::vector<std::string>& answers);
// SQuAD's F1 over the normalised words as bags (a repeated word counts as often as it is in
// both, as Counter's intersection): 2PR / (P + R); 1 when both are empty, 0 when only one is;
// the max over `answers`. Both throw when `answers` is empty.
double squad_f1(const std::string& prediction, const std::vector<std::string>& answers);

}  // namespace clustr

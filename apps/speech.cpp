// Speech recognition with CTC (the paper's sec. 4.2): a transformer encoder with full, clustered
// or improved-clustered attention maps 40-dim filterbank frames to phone posteriors.
//
//   speech train --corpus DIR [--preset cpu|paper] [--attention TYPE] [--out DIR] [--resume DIR]
//   speech evaluate --checkpoint DIR --manifest FILE [--attention TYPE] [--beam N]
//   speech decode --checkpoint DIR --manifest FILE [--beam N]
//   speech lm --manifest FILE [--order N] --out FILE.json [--dev FILE]
//   (evaluate and decode: --lm FILE.json [--lm-weight W...] [--lm-bonus B...] with --beam N)
//   speech matrix --checkpoints DIR_FULL DIR_CLUSTERED DIR_IMPROVED --manifest FILE
//                 [--cluster-counts C1 C2] [--attention-map FILE.png]
//   speech tradeoff --checkpoints DIR... --manifest FILE [--cluster-counts C...] [--csv FILE]
//                   [--png FILE]
//
// Every command takes --device cpu|cuda (the model is built on the CPU, then moved) and
// --precision fp32|bf16 (train: the products' precision; the others: default as trained).
// train writes into --out (default: the first free one of runs/speech, runs/speech-2, ...); a
// new run refuses a folder holding files (--overwrite replaces them, --resume continues the
// run there), and Ctrl-C (SIGINT) or SIGTERM stops it after the current step with
// last.safetensors saved. A corpus is what data/make_speech_corpus.py writes (train.tsv, dev.tsv, test.tsv,
// tokens.txt). The pieces live in apps/speech/.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "apps/common/run_folder.h"
#include "apps/common/train_command.h"
#include "apps/common/training.h"
#include "apps/speech/attention_map.h"
#include "apps/speech/dataset.h"
#include "apps/speech/lm.h"
#include "apps/speech/options.h"
#include "apps/speech/train.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/corpus_import.h"
#include "data/lexicon.h"

namespace {

using namespace clustr;
using namespace clustr::speech;

// What evaluate, decode and matrix share: a manifest and how to read and decode it.
struct EvalFlags {
  std::string manifest, tokens, cache;
  int beam = 1;
  int64_t max_utts = 0;
  int64_t max_frames = 4000;
  int threads = 0;
  uint64_t seed = 1;
  std::string device = "cpu";
  Device on = Device::cpu;  // --device, checked by check_eval_flags
  AttentionConfig attention;  // the overriding attention (only the flags given count)
  Precision precision = Precision::fp32;  // the overriding precision (when given)
  bool tf32 = false;
  bool non_strict = false;  // --non-strict: load a checkpoint that lacks parameters
  // evaluate and decode: the language model fused into the beam search, and its settings
  std::string lm;
  // The defaults: the best pair on the synthetic corpus's dev set, beam 8, a 6-gram model of
  // its phones (docs/RESULTS.md); labels of another kind want their own.
  std::vector<double> lm_weights{0.7}, lm_bonuses{2.0};
};

void add_lm_flags(CLI::App& app, EvalFlags& f) {
  app.add_option("--lm", f.lm, "a label language model (speech lm) to fuse into the beam "
                 "search (needs --beam >= 2)");
  app.add_option("--lm-weight", f.lm_weights, "the language model's weight (evaluate: several "
                 "values score each, with each --lm-bonus)")->capture_default_str();
  app.add_option("--lm-bonus", f.lm_bonuses, "the score added per label, against the pull "
                 "towards short outputs (evaluate: several values as for --lm-weight)")
      ->capture_default_str();
}

// The language model of --lm for the model's `tokens`, with every weight x bonus.
LanguageModel load_lm(const EvalFlags& f, const TokenTable& tokens, const CLI::App& app) {
  if (f.lm.empty()) {
    CLUSTR_CHECK(!app.count("--lm-weight") && !app.count("--lm-bonus"),
                 "--lm-weight and --lm-bonus need --lm");
    return {};
  }
  CLUSTR_CHECK(f.beam >= 2, "--lm is used by the beam search: it needs --beam >= 2, got --beam ",
               f.beam);
  for (double w : f.lm_weights)
    CLUSTR_CHECK(std::isfinite(w) && w >= 0, "--lm-weight must be finite and >= 0, got ", w);
  for (double b : f.lm_bonuses)
    CLUSTR_CHECK(std::isfinite(b), "--lm-bonus must be finite, got ", b);
  return load_language_model(f.lm, tokens, f.lm_weights, f.lm_bonuses);
}

void add_eval_flags(CLI::App& app, EvalFlags& f) {
  app.add_option("--manifest", f.manifest, "manifest to evaluate (e.g. <corpus>/test.tsv)")
      ->required();
  app.add_option("--tokens", f.tokens, "tokens file; it must be the model's token table, which the checkpoint holds (default: "
                 "tokens.txt beside the manifest, else the checkpoint's table)");
  app.add_option("--cache", f.cache, "feature cache (default fbank-cache beside the manifest)");
  app.add_option("--beam", f.beam, "prefix beam search width (1: greedy only)")
      ->capture_default_str();
  app.add_option("--max-utterances", f.max_utts, "only the first N utterances (0: all)")
      ->capture_default_str();
  app.add_option("--max-frames", f.max_frames, "most padded positions per batch")
      ->capture_default_str();
  app.add_option("--threads", f.threads, "OpenMP threads (0: the default)")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the clustered types' hashing")->capture_default_str();
  app.add_option("--device", f.device, "cpu | cuda")->capture_default_str();
  app.add_option_function<std::string>(
      "--precision", [&f](const std::string& s) { f.precision = parse_precision(s); },
      "fp32 | bf16: the products' precision (default: the one the model was trained with; the "
      "weights are f32 either way)");
  app.add_flag("--tf32", f.tf32,
               "with --device cuda: TF32 tensor cores for the f32 products (off: full f32)");
  app.add_flag("--non-strict", f.non_strict,
               "load a checkpoint that lacks some of the model's parameters (they keep their "
               "initial values) or holds other tensors (ignored), listing them; without it "
               "either is an error");
}

// The model's precision: the checkpoint's, or --precision when given.
void override_precision(LoadedModel& m, const EvalFlags& f, const CLI::App& app) {
  if (app.count("--precision")) m.model->set_precision(f.precision);
}

void check_eval_flags(EvalFlags& f) {
  // Prefix beam search costs grow with the width times the alphabet per frame; 256 is far
  // past where wider beams stop helping (a width of 100000 took minutes per utterance).
  CLUSTR_CHECK(f.beam >= 1 && f.beam <= 256, "--beam must be in [1, 256], got ", f.beam);
  CLUSTR_CHECK(f.max_utts >= 0, "--max-utterances must be >= 0, got ", f.max_utts);
  CLUSTR_CHECK(f.max_frames >= 1, "--max-frames must be >= 1, got ", f.max_frames);
  check_threads(f.threads);
  if (f.threads > 0) set_num_threads(f.threads);
  f.on = resolve_device(f.device);
  apply_tf32(f.tf32, f.on);
}

// The attention to evaluate with: the trained one, with the type and parameters given on the
// command line replacing its own.
AttentionConfig override_attention(const AttentionConfig& trained, const AttentionConfig& given,
                                   const CLI::App& app) {
  return override_attention(trained, given,
                            [&app](const std::string& flag) { return app.count(flag) > 0; });
}

// The manifest's utterances for model m (refused when none is usable).
SpeechSet load_set(const EvalFlags& f, const LoadedModel& m, TokenTable& tokens) {
  tokens = model_tokens(m.tokens, m.model->classes(),
                        f.tokens.empty() ? default_tokens(f.manifest) : f.tokens,
                        !f.tokens.empty(), m.file);
  FeatureCache cache(f.cache.empty() ? default_cache(f.manifest) : f.cache);
  SpeechSet set =
      load_speech_set(f.manifest, tokens, cache, m.options.stacking, f.max_utts, stdout);
  CLUSTR_CHECK(!set.examples.empty(), f.manifest, ": no usable utterances");
  return set;
}

// A checkpoint to evaluate, on --device, in --precision when given.
LoadedModel load_for_eval(const EvalFlags& f, const std::string& path, const char* flag,
                          const CLI::App& app) {
  LoadedModel m = load_trained_model(path, flag, f.on, !f.non_strict, stdout);
  override_precision(m, f, app);
  return m;
}

// Labels that spell words (characters, word pieces) are scored as words too: the word error
// rate of `e`'s hypotheses (the beam search's when there is one), or nothing for phones.
void print_word_errors(const TokenTable& tokens, const SpeechSet& set, const Evaluation& e) {
  if (!labels_spell_words(tokens)) return;
  std::vector<LabelSequence> references;
  for (const SpeechExample& x : set.examples) references.push_back(x.labels);
  const ErrorRate w = word_errors(tokens, references, e.hypotheses);
  std::printf("WER %.4f (%lld edits / %lld words)\n", w.rate(), static_cast<long long>(w.edits),
              static_cast<long long>(w.reference_length));
}

// What the labels are, for messages: the error rate called PER is over these.
const char* label_unit(const TokenTable& tokens) {
  return labels_spell_words(tokens) ? "labels" : "phones";
}

// A hypothesis as text: its words where the labels spell words, else its labels.
std::string hypothesis_text(const TokenTable& tokens, const LabelSequence& labels) {
  if (!labels_spell_words(tokens)) return label_string(tokens, labels);
  std::string text;
  for (const std::string& w : label_words(tokens, labels)) text += (text.empty() ? "" : " ") + w;
  return text;
}

int cmd_evaluate(EvalFlags& f, const std::string& checkpoint, const CLI::App& app) {
  check_eval_flags(f);
  LoadedModel m = load_for_eval(f, checkpoint, "--checkpoint", app);
  const AttentionConfig a = override_attention(m.options.attention, f.attention, app);
  TokenTable tokens;
  const SpeechSet set = load_set(f, m, tokens);
  const LanguageModel lm = load_lm(f, tokens, app);
  m.model->set_attention(a);
  const Evaluation e = evaluate_set(*m.model, set, f.max_frames, f.beam, f.seed, lm.fusions);
  std::printf("checkpoint %s (step %lld), trained with %s in %s\n", m.file.c_str(),
              static_cast<long long>(m.step), m.options.attention.describe().c_str(),
              to_string(m.options.precision));
  std::printf("evaluated with %s in %s on %s: %lld utterances, %lld %s\n",
              a.describe().c_str(), to_string(m.model->precision()), f.manifest.c_str(),
              static_cast<long long>(e.utterances),
              static_cast<long long>(e.greedy.reference_length), label_unit(tokens));
  std::printf("loss %.4f  PER greedy %.4f", e.loss, e.greedy.rate());
  if (f.beam > 1) std::printf("  PER beam %d %.4f", f.beam, e.beam.rate());
  std::printf("  (impossible alignments %lld, %.1f s, %.0f frames/s)\n",
              static_cast<long long>(e.impossible), e.seconds,
              double(e.input_frames) / std::max(e.seconds, 1e-9));
  for (size_t i = 0; i < lm.fusions.size(); ++i)
    std::printf("PER beam %d + language model %s (order %d, weight %g, bonus %g) %.4f\n", f.beam,
                lm.file.c_str(), lm.lm->order(), lm.fusions[i].weight, lm.fusions[i].bonus,
                e.fused[i].rate());
  print_word_errors(tokens, set, e);
  return 0;
}

int cmd_decode(EvalFlags& f, const std::string& checkpoint, const CLI::App& app) {
  check_eval_flags(f);
  LoadedModel m = load_for_eval(f, checkpoint, "--checkpoint", app);
  m.model->set_attention(override_attention(m.options.attention, f.attention, app));
  TokenTable tokens;
  const SpeechSet set = load_set(f, m, tokens);
  const LanguageModel lm = load_lm(f, tokens, app);
  CLUSTR_CHECK(lm.fusions.size() <= 1, "decode takes one --lm-weight and one --lm-bonus, got ",
               f.lm_weights.size(), " and ", f.lm_bonuses.size());
  const Evaluation e = evaluate_set(*m.model, set, f.max_frames, f.beam, f.seed, lm.fusions);
  for (size_t i = 0; i < set.examples.size(); ++i)
    std::printf("%s\t%s\n", set.examples[i].id.c_str(),
                hypothesis_text(tokens, e.hypotheses[i]).c_str());
  const ErrorRate& er = !e.fused.empty() ? e.fused[0] : f.beam > 1 ? e.beam : e.greedy;
  std::printf("PER %.4f (%lld edits / %lld %s)\n", er.rate(), static_cast<long long>(er.edits),
              static_cast<long long>(er.reference_length), label_unit(tokens));
  print_word_errors(tokens, set, e);
  return 0;
}

// A trained model's row label: the type, with lsh's rounds and, when the matrix evaluates at
// several cluster counts, a clustered type's C.
std::string matrix_row_name(const AttentionConfig& a, bool with_clusters) {
  if (a.type == AttentionType::lsh) return detail::cat("lsh-", a.rounds);
  const std::string name = attention_type_name(a.type);
  return uses_clusters(a.type) && with_clusters ? detail::cat(name, "-", a.clusters) : name;
}

int cmd_matrix(EvalFlags& f, const std::vector<std::string>& checkpoints,
               const std::vector<int64_t>& cluster_counts, const std::string& map_path,
               int map_layer, int map_head, int64_t map_utt, const CLI::App& app) {
  check_eval_flags(f);
  for (int64_t c : cluster_counts)
    CLUSTR_CHECK(c >= 1, "--cluster-counts: each count must be >= 1, got ", c);
  // The paper's Table 1 evaluates with full, shared-full, lsh-1, lsh-4, the clustered types and
  // oracle-top (each query's top keys of full attention, renormalised: are they enough?).
  // shared-full and lsh need a model trained with one of them (keys = queries): "-" elsewhere.
  // The clustered types are evaluated at each of --cluster-counts (the paper: 100 and 200), or
  // at the model's own C without it.
  struct Column {
    std::string name;
    AttentionType type;
    int rounds = 0;        // lsh
    int64_t clusters = 0;  // clustered types; 0: the model's own
  };
  std::vector<Column> columns = {{"full", AttentionType::full},
                                 {"shared-full", AttentionType::shared_full},
                                 {"lsh-1", AttentionType::lsh, 1},
                                 {"lsh-4", AttentionType::lsh, 4}};
  for (AttentionType t : {AttentionType::clustered, AttentionType::improved_clustered}) {
    if (cluster_counts.empty()) columns.push_back({attention_type_name(t), t});
    for (int64_t c : cluster_counts)
      columns.push_back({detail::cat(attention_type_name(t), "-", c), t, 0, c});
  }
  columns.push_back({"oracle-top", AttentionType::oracle_top});
  std::vector<std::vector<double>> per;
  std::vector<std::string> rows;
  TokenTable tokens;
  for (const std::string& c : checkpoints) {
    LoadedModel m = load_for_eval(f, c, "--checkpoints", app);
    const SpeechSet set = load_set(f, m, tokens);
    const AttentionConfig& trained = m.options.attention;
    rows.push_back(matrix_row_name(trained, !cluster_counts.empty()));
    per.emplace_back();
    for (const Column& col : columns) {
      if (shares_query_key(col.type) && !shares_query_key(trained.type)) {
        per.back().push_back(std::nan(""));  // no shared projection to evaluate with
        continue;
      }
      AttentionConfig a = trained;
      a.type = col.type;
      if (col.rounds > 0) a.rounds = col.rounds;
      if (col.clusters > 0) a.clusters = col.clusters;
      m.model->set_attention(a);
      const Evaluation e = evaluate_set(*m.model, set, f.max_frames, f.beam, f.seed);
      per.back().push_back(f.beam > 1 ? e.beam.rate() : e.greedy.rate());
      std::printf("trained with %s, evaluated with %s: PER %.4f (%.1f s)\n", rows.back().c_str(),
                  a.describe().c_str(), per.back().back(), e.seconds);
    }
    if (!map_path.empty() && rows.size() == 1) {
      m.model->set_attention(m.options.attention);
      CLUSTR_CHECK(map_utt >= 0 && map_utt < int64_t(set.examples.size()),
                   "--map-utterance must be in [0, ", set.examples.size(), "), got ", map_utt);
      write_attention_maps(*m.model, m.options.attention, set.examples[size_t(map_utt)],
                           map_layer, map_head, f.seed, map_path);
      std::printf("attention maps of %s (layer %d, head %d; full | clustered | "
                  "improved-clustered%s): %s\n",
                  set.examples[size_t(map_utt)].id.c_str(), map_layer, map_head,
                  shares_query_key(m.options.attention.type)
                      ? detail::cat(" | ", rows.back()).c_str()
                      : "",
                  map_path.c_str());
    }
  }
  std::printf("\nPER (%s decoding) on %s\n", f.beam > 1 ? "beam" : "greedy", f.manifest.c_str());
  std::printf("%-20s", "train \\ evaluate");
  for (const Column& col : columns) std::printf(" %*s", std::max<int>(7, int(col.name.size())), col.name.c_str());
  std::printf("\n");
  for (size_t r = 0; r < rows.size(); ++r) {
    std::printf("%-20s", rows[r].c_str());
    for (size_t k = 0; k < columns.size(); ++k) {
      const int w = std::max<int>(7, int(columns[k].name.size()));
      if (std::isnan(per[r][k]))
        std::printf(" %*s", w, "-");
      else
        std::printf(" %*.4f", w, per[r][k]);
    }
    std::printf("\n");
  }
  return 0;
}

// The paper's Figure 1a: each checkpoint evaluated with the attention it was trained with, its
// PER on the manifest against the time of its forward passes over it (the median of --reps
// evaluations; decoding and the loss left out). A checkpoint of a clustered type is evaluated
// at each of `cluster_counts` (empty: its own C). One line per attention type in the PNG, lsh's
// per number of rounds (lsh-1, lsh-4) as in the paper's figure.
int cmd_tradeoff(EvalFlags& f, const std::vector<std::string>& checkpoints,
                 const std::vector<int64_t>& cluster_counts, int reps,
                 const std::string& csv_path, const std::string& png_path, const CLI::App& app) {
  check_eval_flags(f);
  CLUSTR_CHECK(reps >= 1 && reps <= 100, "--reps must be in [1, 100], got ", reps);
  for (int64_t c : cluster_counts)
    CLUSTR_CHECK(c >= 1, "--cluster-counts: each count must be >= 1, got ", c);
  struct Point {
    std::string file, series, attention;
    int64_t layers = 0;
    double per = 0, seconds = 0;
  };
  std::vector<Point> points;
  TokenTable tokens;
  for (const std::string& c : checkpoints) {
    LoadedModel m = load_for_eval(f, c, "--checkpoints", app);
    const SpeechSet set = load_set(f, m, tokens);
    const AttentionConfig& trained = m.options.attention;
    std::vector<AttentionConfig> configs;
    for (int64_t count : uses_clusters(trained.type) ? cluster_counts : std::vector<int64_t>{}) {
      configs.push_back(trained);
      configs.back().clusters = count;
    }
    if (configs.empty()) configs.push_back(trained);
    for (const AttentionConfig& a : configs) {
      m.model->set_attention(a);
      std::vector<double> times;
      double per = 0;
      for (int r = 0; r < reps; ++r) {
        const Evaluation e = evaluate_set(*m.model, set, f.max_frames, f.beam, f.seed);
        times.push_back(e.forward_seconds);
        if (r == 0) per = f.beam > 1 ? e.beam.rate() : e.greedy.rate();
      }
      std::sort(times.begin(), times.end());
      points.push_back({m.file, matrix_row_name(a, false), a.describe(), m.options.layers, per,
                        times[times.size() / 2]});
      std::printf("%s: %lld layers, %s: PER %.4f, forward %.3f s\n", m.file.c_str(),
                  static_cast<long long>(m.options.layers), a.describe().c_str(), per,
                  points.back().seconds);
    }
  }
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    CLUSTR_CHECK(csv.good(), "--csv: cannot write ", csv_path);
    csv << "checkpoint,series,attention,layers,per,forward_seconds\n";
    for (const Point& p : points)
      csv << p.file << ',' << p.series << ",\"" << p.attention << "\"," << p.layers << ','
          << p.per << ',' << p.seconds << '\n';
    CLUSTR_CHECK(csv.good(), "--csv: writing ", csv_path, " failed");
    std::printf("wrote %s\n", csv_path.c_str());
  }
  if (!png_path.empty()) {
    // Each line from its fastest point to its slowest.
    std::vector<Point> by_time = points;
    std::stable_sort(by_time.begin(), by_time.end(),
                     [](const Point& a, const Point& b) { return a.seconds < b.seconds; });
    std::vector<plot::Series> series;
    for (const Point& p : by_time) {
      auto s = std::find_if(series.begin(), series.end(),
                            [&](const plot::Series& x) { return x.label == p.series; });
      if (s == series.end()) s = series.insert(series.end(), plot::Series{p.series, {}, {}});
      s->x.push_back(p.seconds);
      s->y.push_back(p.per);
    }
    plot::Options o;
    o.title = detail::cat("PER against forward time on ", f.manifest);
    o.x_label = "forward passes over the set (s)";
    o.y_label = f.beam > 1 ? "PER (beam)" : "PER (greedy)";
    plot::write_line_plot(png_path, series, o);
    std::printf("wrote %s\n", png_path.c_str());
  }
  return 0;
}

// What `import` takes.
struct ImportFlags {
  std::string format, in, out, units = "phones";
  std::string lexicon = "/usr/share/festival/dicts/cmu/cmudict-0.4.out";  // Debian's festlex-cmu
  std::string piece_model;  // default: pieces.model beside the manifest
  int vocab_size = 0;       // > 0: learn that many word pieces from this import's transcripts
  bool overwrite = false;   // replace an existing --out
};

// The word pieces of an import: learnt from its transcripts (--vocab-size) and saved, never over
// an existing model, or read from the model that an earlier import learnt.
WordPieces import_pieces(const ImportFlags& f, const std::vector<CorpusUtterance>& utts) {
  const std::string path =
      !f.piece_model.empty()
          ? f.piece_model
          : (std::filesystem::path(f.out).parent_path() / "pieces.model").string();
  if (f.vocab_size == 0) {
    CLUSTR_CHECK(std::filesystem::exists(path), "--units pieces: no word-piece model at ", path,
                 ": learn one from the training split first (--vocab-size N), then import the "
                 "other splits with it");
    WordPieces w = WordPieces::load(path);
    std::printf("word pieces: %s (%zu pieces)\n", path.c_str(), w.pieces().size());
    return w;
  }
  CLUSTR_CHECK(!std::filesystem::exists(path), "--vocab-size: ", path, " exists already; to "
               "encode with it leave out --vocab-size, to learn a new one delete it first");
  std::vector<std::string> sentences;
  for (const CorpusUtterance& u : utts) {
    std::string s = word_sentence(u.transcript);
    if (!s.empty()) sentences.push_back(std::move(s));
  }
  WordPieces w = WordPieces::train(sentences, f.vocab_size);
  w.save(path);
  std::printf("word pieces: learnt %d from %zu transcripts, saved to %s\n", f.vocab_size,
              sentences.size(), path.c_str());
  return w;
}

int cmd_import(const ImportFlags& f) {
  CLUSTR_CHECK(f.units == "phones" || f.units == "chars" || f.units == "pieces",
               "--units must be phones, chars or pieces, got '", f.units, "'");
  CLUSTR_CHECK(f.units == "pieces" || (f.vocab_size == 0 && f.piece_model.empty()),
               "--vocab-size and --piece-model are for --units pieces");
  CLUSTR_CHECK(f.vocab_size >= 0, "--vocab-size must be positive, got ", f.vocab_size);
  check_output_file("--out", f.out, f.overwrite, /*folder_must_exist=*/false);  // it is made
  std::vector<CorpusUtterance> utts;
  if (f.format == "librispeech")
    utts = import_librispeech(f.in);
  else if (f.format == "kaldi")
    utts = import_kaldi(f.in);
  else if (f.format == "nemo")
    utts = import_nemo(f.in);
  else
    throw Error(detail::cat("--format must be librispeech, kaldi or nemo, got '", f.format, "'"));
  std::printf("%s: %zu utterances listed\n", f.in.c_str(), utts.size());
  probe_durations(utts);
  std::optional<Lexicon> lexicon;
  std::optional<WordPieces> pieces;
  LabelUnits units = LabelUnits::chars;
  if (f.units == "phones") {
    units = LabelUnits::phones;
    lexicon = Lexicon::read(f.lexicon);
    std::printf("lexicon %s: %zu words\n", f.lexicon.c_str(), lexicon->size());
  } else if (f.units == "pieces") {
    units = LabelUnits::pieces;
    pieces = import_pieces(f, utts);
  }
  const ImportReport r =
      write_manifest(utts, units, lexicon ? &*lexicon : nullptr, f.out, pieces ? &*pieces : nullptr);
  double seconds = 0;
  for (const CorpusUtterance& u : utts) seconds += u.seconds;
  std::printf("wrote %s (%lld utterances; %.0f s = %.1f h of audio listed) and tokens.txt beside "
              "it (%s)\n",
              f.out.c_str(), static_cast<long long>(r.written), seconds, seconds / 3600,
              f.units.c_str());
  // The list of what was left out belongs to the manifest: rewritten with it, and an earlier
  // one removed when nothing was left out this time.
  const std::string skipped = f.out + ".skipped.txt";
  if (r.problems.empty()) {
    std::filesystem::remove(skipped);
  } else {
    write_lines_atomically(skipped, r.problems);
    std::printf("%zu utterances left out, all listed in %s; the first:\n  %s\n",
                r.problems.size(), skipped.c_str(), r.problems.front().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  RunOptions o = preset_options(find_preset(argc, argv));
  CLI::App app{"clustr speech recognition with CTC (Vyas et al. 2020, sec. 4.2): train a "
               "transformer encoder with full, clustered or improved-clustered attention on "
               "filterbank features and phone targets"};
  app.require_subcommand(1);

  CLI::App* train = app.add_subcommand("train", "train a model on a corpus");
  add_train_flags(*train, o);
  std::string resume;
  train->add_option("--resume", resume,
                    "continue from last.safetensors (a file or its folder; --out defaults to it)");

  EvalFlags f;
  std::string checkpoint;
  CLI::App* evaluate = app.add_subcommand("evaluate", "loss and PER of a checkpoint on a manifest");
  evaluate->add_option("--checkpoint", checkpoint, "checkpoint file, or a run folder")->required();
  add_eval_flags(*evaluate, f);
  add_lm_flags(*evaluate, f);
  add_attention_flags(*evaluate, f.attention);

  CLI::App* decode = app.add_subcommand("decode", "print the decoded phones of each utterance");
  decode->add_option("--checkpoint", checkpoint, "checkpoint file, or a run folder")->required();
  add_eval_flags(*decode, f);
  add_lm_flags(*decode, f);
  add_attention_flags(*decode, f.attention);

  LmFlags lmf;
  CLI::App* lm = app.add_subcommand(
      "lm", "count a manifest's label sequences into an n-gram language model (interpolated "
            "Kneser-Ney) for evaluate and decode --lm");
  lm->add_option("--manifest", lmf.manifest, "the text to count: a manifest's labels (e.g. "
                 "<corpus>/train.tsv; never the sets you report)")->required();
  lm->add_option("--tokens", lmf.tokens, "tokens file (default: tokens.txt beside the manifest)");
  lm->add_option("--order", lmf.order, "n: labels of history + 1")->capture_default_str();
  lm->add_option("--dev", lmf.dev, "also report the perplexity on this manifest");
  lm->add_option("--out", lmf.out, "the JSON file to write")->required();
  lm->add_flag("--overwrite", lmf.overwrite, "replace --out if it exists");

  std::vector<std::string> checkpoints;
  std::string map_path;
  int map_layer = 0, map_head = 0;
  int64_t map_utt = 0;
  std::vector<int64_t> cluster_counts;
  CLI::App* matrix = app.add_subcommand(
      "matrix", "evaluate checkpoints trained with each attention type under every type (the "
                "paper's Table 1)");
  matrix->add_option("--checkpoints", checkpoints, "checkpoints (files or run folders)")
      ->required();
  matrix->add_option("--cluster-counts", cluster_counts,
                     "evaluate the clustered types at each of these cluster counts (columns "
                     "clustered-C, improved-clustered-C; default: each model's own C)");
  add_eval_flags(*matrix, f);
  matrix->add_option("--attention-map", map_path,
                     "also write a PNG of the first checkpoint's attention weights for one "
                     "utterance under the three types side by side (the paper's Figure 8)");
  bool outputs_overwrite = false;
  matrix->add_flag("--overwrite", outputs_overwrite, "replace --attention-map if it exists");
  matrix->add_option("--map-layer", map_layer, "layer of the attention map")->capture_default_str();
  matrix->add_option("--map-head", map_head, "head of the attention map")->capture_default_str();
  matrix->add_option("--map-utterance", map_utt, "index of the utterance in the manifest's kept "
                     "utterances")->capture_default_str();

  int tradeoff_reps = 3;
  std::string tradeoff_csv, tradeoff_png;
  std::vector<std::string> tradeoff_checkpoints;
  CLI::App* tradeoff = app.add_subcommand(
      "tradeoff", "each checkpoint's PER against the time of its forward passes, with the "
                  "attention it was trained with (the paper's Figure 1a)");
  tradeoff->add_option("--checkpoints", tradeoff_checkpoints, "checkpoints (files or run folders)")
      ->required();
  add_eval_flags(*tradeoff, f);
  std::vector<int64_t> tradeoff_counts;
  tradeoff->add_option("--cluster-counts", tradeoff_counts,
                       "evaluate a checkpoint of a clustered type at each of these cluster "
                       "counts (default: its own C)");
  tradeoff->add_option("--reps", tradeoff_reps, "evaluations per checkpoint (the median time)")
      ->capture_default_str();
  tradeoff->add_option("--csv", tradeoff_csv, "write the points to this CSV file");
  tradeoff->add_option("--png", tradeoff_png,
                       "draw them, a line per attention type (lsh: per number of rounds), in this "
                       "PNG");
  tradeoff->add_flag("--overwrite", outputs_overwrite, "replace --csv and --png if they exist");

  ImportFlags imp;
  CLI::App* import = app.add_subcommand(
      "import", "a LibriSpeech-style folder, a Kaldi data folder or a NeMo manifest to this "
                "app's manifest (and tokens.txt beside it)");
  import->add_option("--format", imp.format, "librispeech | kaldi | nemo")->required();
  import->add_option("--in", imp.in, "the corpus folder (librispeech, kaldi) or manifest (nemo)")
      ->required();
  import->add_option("--out", imp.out, "the manifest to write (e.g. data/libri/train.tsv)")
      ->required();
  import->add_flag("--overwrite", imp.overwrite, "replace --out if it exists");
  import->add_option("--units", imp.units, "phones (through --lexicon) | chars (letters, "
                     "digits, ' and | between words) | pieces (word pieces, SentencePiece's "
                     "unigram model)")->capture_default_str();
  import->add_option("--vocab-size", imp.vocab_size, "with --units pieces: learn this many word "
                     "pieces from this import's transcripts (the training split) and save them "
                     "as --piece-model; without it the splits are encoded with that model");
  import->add_option("--piece-model", imp.piece_model, "with --units pieces: the word-piece "
                     "model (default: pieces.model beside --out)");
  import->add_option("--lexicon", imp.lexicon, "the pronunciation dictionary: Festival's CMU "
                     "lexicon (Debian's festlex-cmu) or a CMUdict text file")
      ->capture_default_str();

  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  check_integer_flags(app);
  if (*train)
    note_memory_flags(detail::cat("--batch ", o.train.batch, ", --max-frames ",
                                  o.train.max_frames, ", --stacking ", o.model.stacking,
                                  ", --layers ", o.model.layers, ", --heads ", o.model.heads,
                                  " x --head-dim ", o.model.head_dim, " and --feedforward ",
                                  o.model.feedforward));
  else
    note_memory_flags(detail::cat("--max-frames ", f.max_frames, " and --beam ", f.beam));

  if (*evaluate) return cmd_evaluate(f, checkpoint, *evaluate);
  if (*decode) return cmd_decode(f, checkpoint, *decode);
  // The files these write, checked before the evaluations that lead to them.
  if (*tradeoff) {
    if (!tradeoff_csv.empty()) check_output_file("--csv", tradeoff_csv, outputs_overwrite, true);
    if (!tradeoff_png.empty()) check_output_file("--png", tradeoff_png, outputs_overwrite, true);
    return cmd_tradeoff(f, tradeoff_checkpoints, tradeoff_counts, tradeoff_reps, tradeoff_csv,
                        tradeoff_png, *tradeoff);
  }
  if (*matrix) {
    if (!map_path.empty()) check_output_file("--attention-map", map_path, outputs_overwrite, true);
    return cmd_matrix(f, checkpoints, cluster_counts, map_path, map_layer, map_head, map_utt,
                      *matrix);
  }
  if (*import) return cmd_import(imp);
  if (*lm) {
    build_language_model(lmf, stdout);
    return 0;
  }

  out_mode(!resume.empty(), o.output.overwrite);  // --overwrite with --resume: refused at once
  if (!resume.empty()) {
    const auto saved = read_checkpoint_config(resume_file(resume));
    adopt_locked_settings(saved, *train, o);
    // The precision may change on resume (the weights are f32), but is kept unless given.
    if (train->count("--precision") == 0 && saved.count("precision"))
      o.model.precision = parse_precision(saved.at("precision"));
  }
  const TrainResult r = train_command<Trainer>(o, resume, train->count("--out") > 0);
  if (r.interrupted_by) return 128 + r.interrupted_by;
  return 0;
} catch (const std::exception& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "speech: error: %s\n", error_text(e).c_str());
  return 1;
}

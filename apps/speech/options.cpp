// Flags, presets, checks and config maps of the speech app (options.h).
#include "apps/speech/options.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "apps/common/training.h"
#include "core/error.h"

namespace clustr::speech {

namespace {

// The shortest decimal that reads back as exactly v, so configs round-trip and read well.
std::string str(double v) {
  for (int digits = 6;; ++digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (digits >= 17 || std::strtod(buf, nullptr) == v) return buf;
  }
}
std::string str(float v) {
  for (int digits = 6;; ++digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    if (digits >= 9 || std::strtof(buf, nullptr) == v) return buf;
  }
}
std::string str(bool v) { return v ? "true" : "false"; }
std::string str(int64_t v) { return std::to_string(v); }
std::string str(int v) { return std::to_string(v); }
std::string str(uint64_t v) { return std::to_string(v); }

const std::string& need(const std::map<std::string, std::string>& c, const std::string& key) {
  auto it = c.find(key);
  CLUSTR_CHECK(it != c.end(), "checkpoint config lacks '", key,
               "' (was it written by the speech app?)");
  return it->second;
}

int parse_int(const std::map<std::string, std::string>& c, const std::string& key) {
  const std::string& s = need(c, key);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  CLUSTR_CHECK(!s.empty() && *end == '\0' && errno == 0, "checkpoint config '", key, "' is \"",
               s, "\", not an integer");
  return int(v);
}

float parse_float(const std::map<std::string, std::string>& c, const std::string& key) {
  const std::string& s = need(c, key);
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  CLUSTR_CHECK(!s.empty() && *end == '\0', "checkpoint config '", key, "' is \"", s,
               "\", not a number");
  return v;
}

template <typename T>
void check_min(T value, T lo, const char* flag) {
  CLUSTR_CHECK(value >= lo, flag, " must be >= ", lo, ", got ", value);
}

}  // namespace

RunOptions preset_options(const std::string& name) {
  RunOptions o;
  o.preset = name;
  if (name == "cpu") {
    // The defaults of options.h: D = 128, 4 layers, x4 stacking (about 150 positions for a 6 s
    // utterance), Adam with warm-up; clusters and k scaled to the shorter sequences.
    o.model.attention.clusters = 25;
    o.model.attention.topk = 16;
    return o;
  }
  if (name == "paper") {
    o.model.layers = 9;
    o.model.heads = 6;
    o.model.head_dim = 32;
    o.model.feedforward = 768;
    o.model.dropout = 0.1f;
    o.model.stacking = 1;  // WSJ's 40-dim filterbanks at 10 ms, about 780 frames on average
    o.model.attention.clusters = 100;
    o.model.attention.topk = 32;
    o.train.optimizer = "radam";
    o.train.lr = 1e-4f;
    o.train.clip = 10.0f;
    o.train.weight_decay = 0.01f;
    o.train.decoupled_weight_decay = true;
    o.train.lr_schedule = "plateau";
    o.train.warmup = 0;  // R-Adam needs none
    o.train.plateau_patience = 2;
    o.train.epochs = 100;
    o.train.max_frames = 16000;
    o.train.batch = 32;
    o.output.out = "runs/speech_paper";
    return o;
  }
  throw Error(detail::cat("unknown --preset '", name, "'; expected cpu or paper"));
}

std::string find_preset(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--preset=", 0) == 0) return a.substr(9);
  }
  return "cpu";
}

void add_attention_flags(CLI::App& app, AttentionConfig& a) {
  app.add_option_function<std::string>(
         "--attention", [&a](const std::string& s) { a.type = parse_attention_type(s); },
         "full | clustered | improved-clustered")
      ->default_str(attention_type_name(a.type));
  app.add_option("--clusters", a.clusters, "clusters C (clustered types)")->capture_default_str();
  app.add_option("--topk", a.topk, "top-k keys per cluster (improved-clustered)")
      ->capture_default_str();
  app.add_option("--bits", a.bits, "hash bits for clustering (<= 63)")->capture_default_str();
  app.add_option("--iterations", a.iterations, "Lloyd iterations of the clustering")
      ->capture_default_str();
}

void add_precision_flag(CLI::App& app, Precision& precision) {
  app.add_option_function<std::string>(
         "--precision", [&precision](const std::string& s) { precision = parse_precision(s); },
         "fp32 | bf16 (matrix products with bf16 operands and f32 sums; weights, optimizer, "
         "softmax, norms and CTC stay f32)")
      ->default_str(to_string(precision));
}

void add_train_flags(CLI::App& app, RunOptions& o) {
  ModelOptions& m = o.model;
  DataOptions& d = o.data;
  TrainOptions& t = o.train;
  OutputOptions& u = o.output;
  app.add_option("--preset", o.preset,
                 "cpu (a small model for two cores) or paper (the paper's WSJ model); other "
                 "flags override the preset's values")
      ->capture_default_str();
  // Data.
  app.add_option("--corpus", d.corpus,
                 "corpus folder with train.tsv, dev.tsv and tokens.txt (as "
                 "data/make_speech_corpus.py writes it)");
  app.add_option("--train-manifest", d.train, "training manifest (default <corpus>/train.tsv)");
  app.add_option("--dev-manifest", d.dev, "dev manifest (default <corpus>/dev.tsv)");
  app.add_option("--tokens", d.tokens, "tokens file (default tokens.txt beside the manifest)");
  app.add_option("--cache", d.cache,
                 "feature cache folder (default fbank-cache beside the manifests)");
  app.add_option("--max-train", d.max_train, "use the first N training utterances (0: all)")
      ->capture_default_str();
  app.add_option("--max-dev", d.max_dev, "use the first N dev utterances (0: all)")
      ->capture_default_str();
  // Model.
  app.add_option("--layers", m.layers, "encoder layers")->capture_default_str();
  app.add_option("--heads", m.heads, "attention heads H")->capture_default_str();
  app.add_option("--head-dim", m.head_dim, "dims per head E (model width D = H x E)")
      ->capture_default_str();
  app.add_option("--feedforward", m.feedforward, "feed-forward width")->capture_default_str();
  app.add_option("--dropout", m.dropout, "dropout rate")->capture_default_str();
  app.add_flag("--pre-norm", m.pre_norm, "pre-norm layers (default: post-norm, as the paper)");
  app.add_option("--stacking", m.stacking, "frames stacked per encoder position: 1, 2 or 4")
      ->capture_default_str();
  add_attention_flags(app, m.attention);
  add_precision_flag(app, m.precision);
  // Training.
  app.add_option("--epochs", t.epochs, "epochs over the training set")->capture_default_str();
  app.add_option("--max-steps", t.max_steps, "stop after this many steps in all (0: no limit)")
      ->capture_default_str();
  app.add_option("--time-limit", t.time_limit, "seconds of training before stopping (0: none)")
      ->capture_default_str();
  app.add_option("--batch", t.batch, "most utterances per batch (0: only --max-frames)")
      ->capture_default_str();
  app.add_option("--max-frames", t.max_frames,
                 "most padded encoder positions (utterances x longest) per batch (0: none)")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "learning rate (peak, after warm-up)")->capture_default_str();
  app.add_option("--optimizer", t.optimizer, "radam | adam | adamw")->capture_default_str();
  app.add_option("--weight-decay", t.weight_decay, "weight decay")->capture_default_str();
  app.add_flag("--decoupled-weight-decay", t.decoupled_weight_decay,
               "AdamW-style decay for adam and radam");
  app.add_option("--clip", t.clip, "max global gradient norm (0: no clipping)")
      ->capture_default_str();
  app.add_option("--lr-schedule", t.lr_schedule,
                 "constant | warmup | plateau (warm-up, then lowered when the dev loss stalls)")
      ->capture_default_str();
  app.add_option("--warmup", t.warmup, "linear warm-up steps")->capture_default_str();
  app.add_option("--plateau-factor", t.plateau_factor, "lr factor on a plateau")
      ->capture_default_str();
  app.add_option("--plateau-patience", t.plateau_patience,
                 "epochs without a lower dev loss before lowering the lr")
      ->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "the plateau schedule's floor")->capture_default_str();
  app.add_option("--seed", t.seed, "seed of every random draw")->capture_default_str();
  app.add_option("--max-skipped-steps", t.max_skipped_steps,
                 "steps in a row with a non-finite loss or gradient norm (each skipped) "
                 "before the run stops")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "OpenMP threads (0: the default)")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda")->capture_default_str();
  app.add_flag("--tf32", o.tf32,
               "with --device cuda: TF32 tensor cores for the f32 products (off: full f32)");
  // Output.
  app.add_option("--out", u.out, "output folder; a new run refuses one that holds files. "
                 "Default: the first of runs/speech, runs/speech-2, ... that is free")
      ->capture_default_str();
  app.add_flag("--overwrite", u.overwrite,
               "let a new run replace the run in --out (its metrics, checkpoints and plots)");
  app.add_option("--log-interval", u.log_interval, "steps between progress lines")
      ->capture_default_str();
  app.add_option("--examples", u.examples, "decoded dev utterances shown after each epoch")
      ->capture_default_str();
  app.add_flag("!--no-plots", u.write_plots, "do not write PNG plots");
}

void validate(const RunOptions& o) {
  const ModelOptions& m = o.model;
  const TrainOptions& t = o.train;
  check_min(m.layers, 1, "--layers");
  check_min(m.heads, 1, "--heads");
  check_min(m.head_dim, 1, "--head-dim");
  check_min(m.feedforward, 1, "--feedforward");
  CLUSTR_CHECK(m.dropout >= 0.0f && m.dropout < 1.0f, "--dropout must be in [0, 1), got ",
               m.dropout);
  CLUSTR_CHECK(m.stacking == 1 || m.stacking == 2 || m.stacking == 4,
               "--stacking must be 1, 2 or 4, got ", m.stacking);
  CLUSTR_CHECK(m.attention.clusters >= 1, "--clusters must be >= 1, got ", m.attention.clusters);
  CLUSTR_CHECK(m.attention.topk >= 1, "--topk must be >= 1, got ", m.attention.topk);
  CLUSTR_CHECK(m.attention.bits >= 1 && m.attention.bits <= 63, "--bits must be in [1, 63], got ",
               m.attention.bits);
  CLUSTR_CHECK(m.attention.iterations >= 0, "--iterations must be >= 0, got ",
               m.attention.iterations);
  m.attention.validate();
  check_min<int64_t>(t.epochs, 1, "--epochs");
  check_min<int64_t>(t.max_steps, 0, "--max-steps");
  CLUSTR_CHECK(t.time_limit >= 0, "--time-limit must be >= 0, got ", t.time_limit);
  check_min<int64_t>(t.batch, 0, "--batch");
  check_min<int64_t>(t.max_frames, 0, "--max-frames");
  CLUSTR_CHECK(t.batch > 0 || t.max_frames > 0,
               "--batch and --max-frames are both 0: give at least one batch limit");
  CLUSTR_CHECK(t.lr > 0.0f && std::isfinite(t.lr), "--lr must be > 0, got ", t.lr);
  CLUSTR_CHECK(t.optimizer == "radam" || t.optimizer == "adam" || t.optimizer == "adamw",
               "--optimizer must be radam, adam or adamw, got '", t.optimizer, "'");
  CLUSTR_CHECK(t.weight_decay >= 0.0f, "--weight-decay must be >= 0, got ", t.weight_decay);
  CLUSTR_CHECK(t.clip >= 0.0f, "--clip must be >= 0, got ", t.clip);
  check_min<int64_t>(t.max_skipped_steps, 1, "--max-skipped-steps");
  CLUSTR_CHECK(t.lr_schedule == "constant" || t.lr_schedule == "warmup" ||
                   t.lr_schedule == "plateau",
               "--lr-schedule must be constant, warmup or plateau, got '", t.lr_schedule, "'");
  check_min<int64_t>(t.warmup, 0, "--warmup");
  CLUSTR_CHECK(t.plateau_factor > 0 && t.plateau_factor < 1,
               "--plateau-factor must be in (0, 1), got ", t.plateau_factor);
  check_min<int64_t>(t.plateau_patience, 0, "--plateau-patience");
  CLUSTR_CHECK(t.min_lr >= 0, "--min-lr must be >= 0, got ", t.min_lr);
  check_min<int64_t>(o.data.max_train, 0, "--max-train");
  check_min<int64_t>(o.data.max_dev, 0, "--max-dev");
  check_min<int64_t>(o.output.log_interval, 1, "--log-interval");
  check_min<int64_t>(o.output.examples, 0, "--examples");
  check_threads(o.threads);
  CLUSTR_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '",
               o.device, "'");
  CLUSTR_CHECK(!o.tf32 || o.device == "cuda", "--tf32 applies to the GPU's f32 products; this "
               "run is on the cpu (give --device cuda, or leave --tf32 out)");
  CLUSTR_CHECK(!o.data.corpus.empty() || (!o.data.train.empty() && !o.data.dev.empty()),
               "give --corpus, or both --train-manifest and --dev-manifest");
}

std::vector<std::pair<std::string, std::string>> config_entries(const RunOptions& o) {
  const ModelOptions& m = o.model;
  const TrainOptions& t = o.train;
  return {{"preset", o.preset},
          {"corpus", o.data.corpus},
          {"train-manifest", o.data.train},
          {"dev-manifest", o.data.dev},
          {"tokens", o.data.tokens},
          {"max-train", str(o.data.max_train)},
          {"max-dev", str(o.data.max_dev)},
          {"layers", str(m.layers)},
          {"heads", str(m.heads)},
          {"head-dim", str(m.head_dim)},
          {"feedforward", str(m.feedforward)},
          {"dropout", str(m.dropout)},
          {"pre-norm", str(m.pre_norm)},
          {"stacking", str(m.stacking)},
          {"precision", to_string(m.precision)},
          {"attention", attention_type_name(m.attention.type)},
          {"clusters", str(m.attention.clusters)},
          {"topk", str(m.attention.topk)},
          {"bits", str(m.attention.bits)},
          {"iterations", str(m.attention.iterations)},
          {"epochs", str(t.epochs)},
          {"max-steps", str(t.max_steps)},
          {"time-limit", str(t.time_limit)},
          {"batch", str(t.batch)},
          {"max-frames", str(t.max_frames)},
          {"lr", str(t.lr)},
          {"optimizer", t.optimizer},
          {"weight-decay", str(t.weight_decay)},
          {"decoupled-weight-decay", str(t.decoupled_weight_decay)},
          {"clip", str(t.clip)},
          {"lr-schedule", t.lr_schedule},
          {"warmup", str(t.warmup)},
          {"plateau-factor", str(t.plateau_factor)},
          {"plateau-patience", str(t.plateau_patience)},
          {"min-lr", str(t.min_lr)},
          {"seed", str(t.seed)},
          {"max-skipped-steps", str(t.max_skipped_steps)},
          {"threads", str(o.threads)},
          {"device", o.device},
          {"tf32", str(o.tf32)},
          {"out", o.output.out}};
}

std::map<std::string, std::string> to_config(const RunOptions& o) {
  std::map<std::string, std::string> c;
  for (auto& [k, v] : config_entries(o)) c[k] = v;
  return c;
}

ModelOptions model_from_config(const std::map<std::string, std::string>& c) {
  ModelOptions m;
  m.layers = parse_int(c, "layers");
  m.heads = parse_int(c, "heads");
  m.head_dim = parse_int(c, "head-dim");
  m.feedforward = parse_int(c, "feedforward");
  m.dropout = parse_float(c, "dropout");
  const std::string& pre = need(c, "pre-norm");
  CLUSTR_CHECK(pre == "true" || pre == "false", "checkpoint config 'pre-norm' is \"", pre,
               "\", not true or false");
  m.pre_norm = pre == "true";
  m.stacking = parse_int(c, "stacking");
  // Checkpoints from before mixed precision were trained in fp32.
  m.precision = c.count("precision") ? parse_precision(c.at("precision")) : Precision::fp32;
  m.attention.type = parse_attention_type(need(c, "attention"));
  m.attention.clusters = parse_int(c, "clusters");
  m.attention.topk = parse_int(c, "topk");
  m.attention.bits = parse_int(c, "bits");
  m.attention.iterations = parse_int(c, "iterations");
  return m;
}

namespace {

// The settings a run cannot change on resume (the model's shape and the optimizer kind): each
// key with how it is taken from a checkpoint's config. resume_locked_keys() and
// adopt_locked_settings() both read this one table.
struct LockedSetting {
  const char* key;
  void (*adopt)(RunOptions& o, const ModelOptions& saved_model, const std::string& saved_value);
};

const std::vector<LockedSetting>& locked_settings() {
  using S = const std::string&;
  static const std::vector<LockedSetting> table = {
      {"layers", [](RunOptions& o, const ModelOptions& m, S) { o.model.layers = m.layers; }},
      {"heads", [](RunOptions& o, const ModelOptions& m, S) { o.model.heads = m.heads; }},
      {"head-dim", [](RunOptions& o, const ModelOptions& m, S) { o.model.head_dim = m.head_dim; }},
      {"feedforward",
       [](RunOptions& o, const ModelOptions& m, S) { o.model.feedforward = m.feedforward; }},
      {"pre-norm", [](RunOptions& o, const ModelOptions& m, S) { o.model.pre_norm = m.pre_norm; }},
      {"stacking", [](RunOptions& o, const ModelOptions& m, S) { o.model.stacking = m.stacking; }},
      {"attention",
       [](RunOptions& o, const ModelOptions& m, S) { o.model.attention.type = m.attention.type; }},
      {"clusters",
       [](RunOptions& o, const ModelOptions& m, S) {
         o.model.attention.clusters = m.attention.clusters;
       }},
      {"topk",
       [](RunOptions& o, const ModelOptions& m, S) { o.model.attention.topk = m.attention.topk; }},
      {"bits",
       [](RunOptions& o, const ModelOptions& m, S) { o.model.attention.bits = m.attention.bits; }},
      {"iterations",
       [](RunOptions& o, const ModelOptions& m, S) {
         o.model.attention.iterations = m.attention.iterations;
       }},
      {"optimizer", [](RunOptions& o, const ModelOptions&, S v) { o.train.optimizer = v; }}};
  return table;
}

}  // namespace

const std::vector<std::string>& resume_locked_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const LockedSetting& s : locked_settings()) k.push_back(s.key);
    return k;
  }();
  return keys;
}

void adopt_locked_settings(const std::map<std::string, std::string>& saved, const CLI::App& app,
                           RunOptions& o) {
  const ModelOptions m = model_from_config(saved);
  for (const LockedSetting& s : locked_settings()) {
    auto it = saved.find(s.key);
    if (app.count(std::string("--") + s.key) == 0 && it != saved.end()) s.adopt(o, m, it->second);
  }
}

std::vector<std::string> config_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now,
                                            const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto a = saved.find(k), b = now.find(k);
    const std::string va = a == saved.end() ? "(absent)" : a->second;
    const std::string vb = b == now.end() ? "(absent)" : b->second;
    if (va != vb) out.push_back("--" + k + ": checkpoint " + va + ", now " + vb);
  }
  return out;
}

}  // namespace clustr::speech

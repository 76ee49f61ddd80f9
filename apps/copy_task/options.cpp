// Flags, presets, checks and config maps of a copy-task run (options.h).
#include "apps/copy_task/options.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "apps/common/training.h"
#include "core/error.h"

namespace clustr::copy {

namespace {

constexpr double kMaxHeldOutTokens = 1e8;

std::string str(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
// The shortest decimal that reads back as exactly v (9 digits do for any float, 17 for any
// double), so configs round-trip and still read well ("0.2", not "0.200000003").
std::string str(float v) {
  for (int digits = 6;; ++digits) {
    std::string s = str(double(v), digits);
    if (digits >= 9 || std::strtof(s.c_str(), nullptr) == v) return s;
  }
}
std::string str(double v) {
  for (int digits = 15;; ++digits) {
    std::string s = str(v, digits);
    if (digits >= 17 || std::strtod(s.c_str(), nullptr) == v) return s;
  }
}
std::string str(bool v) { return v ? "true" : "false"; }
std::string str(int64_t v) { return std::to_string(v); }
std::string str(int v) { return std::to_string(v); }

const std::string& need(const std::map<std::string, std::string>& config, const std::string& key) {
  auto it = config.find(key);
  CLUSTR_CHECK(it != config.end(), "checkpoint config lacks '", key,
               "' (was it written by copy_task?)");
  return it->second;
}

long long parse_int(const std::map<std::string, std::string>& config, const std::string& key) {
  const std::string& s = need(config, key);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  CLUSTR_CHECK(!s.empty() && *end == '\0' && errno == 0, "checkpoint config '", key, "' is \"",
               s, "\", not an integer");
  return v;
}

double parse_real(const std::map<std::string, std::string>& config, const std::string& key) {
  const std::string& s = need(config, key);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  CLUSTR_CHECK(!s.empty() && *end == '\0', "checkpoint config '", key, "' is \"", s,
               "\", not a number");
  return v;
}

bool parse_bool(const std::map<std::string, std::string>& config, const std::string& key) {
  const std::string& s = need(config, key);
  CLUSTR_CHECK(s == "true" || s == "false", "checkpoint config '", key, "' is \"", s,
               "\", not true or false");
  return s == "true";
}

}  // namespace

RunOptions preset_options(const std::string& name) {
  RunOptions o;
  o.preset = name;
  o.model.attention.type = AttentionType::improved_clustered;
  o.model.attention.topk = 32;
  // 30 clusters, not 15: at N = 128, 15 clusters held some seeds near 99.2% held-out accuracy
  // for 1000 steps (the same weights scored 99.9% with full attention), 30 reach 99.5% in
  // about 600 steps at nearly the same cost per step.
  o.model.attention.clusters = 30;
  if (name == "cpu") return o;  // the defaults in options.h
  if (name == "paper") {
    // Supplementary C.2. The paper gives no warm-up, clipping or schedule for R-Adam.
    o.model.attention.clusters = 15;
    o.model.layers = 4;
    o.model.heads = 6;
    o.model.head_dim = 32;
    o.model.feedforward = 768;
    o.train.optimizer = "radam";
    o.train.lr = 2e-4f;
    o.train.batch = 32;
    o.train.steps = 5000;
    o.train.lr_schedule = "constant";
    o.train.warmup = 0;
    o.train.clip = 0.0f;
    o.train.target_accuracy = 0.0;
    o.train.time_limit = 0.0;
    o.output.eval_interval = 500;
    o.output.checkpoint_interval = 1000;
    o.output.out = "runs/copy_task_paper";
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

void add_model_task_train_flags(CLI::App& app, RunOptions& o, bool grid_axes) {
  ModelOptions& m = o.model;
  TrainOptions& t = o.train;
  app.add_option("--preset", o.preset, "cpu (the default run) or paper (supp. C.2 settings); "
                 "other flags override the preset's values")->capture_default_str();
  // Model.
  app.add_option("--layers", m.layers, "encoder layers")->capture_default_str();
  app.add_option("--heads", m.heads, "attention heads H")->capture_default_str();
  app.add_option("--head-dim", m.head_dim, "dims per head E (model width D = H x E)")
      ->capture_default_str();
  app.add_option("--feedforward", m.feedforward, "feed-forward width")->capture_default_str();
  app.add_option("--dropout", m.dropout, "dropout on residual branches and feed-forward")
      ->capture_default_str();
  app.add_flag("--pre-norm", m.pre_norm, "pre-norm layers (default: post-norm, as the paper)");
  app.add_option_function<std::string>(
         "--precision", [&m](const std::string& s) { m.precision = parse_precision(s); },
         "fp32 | bf16 (matrix products with bf16 operands and f32 sums; weights, optimizer, "
         "softmax, norms and losses stay f32)")
      ->default_str(to_string(m.precision));
  if (grid_axes) {
    app.add_option_function<std::string>(
           "--attention",
           [&m](const std::string& s) { m.attention.type = parse_attention_type(s); },
           "full | clustered | improved-clustered")
        ->default_str(attention_type_name(m.attention.type));
    app.add_option("--clusters", m.attention.clusters, "clusters C (clustered types)")
        ->capture_default_str();
  }
  app.add_option("--topk", m.attention.topk, "top-k keys per cluster (improved-clustered)")
      ->capture_default_str();
  app.add_option("--bits", m.attention.bits, "hash bits for clustering (<= 63)")
      ->capture_default_str();
  app.add_option("--iterations", m.attention.iterations, "Lloyd iterations of Hamming K-means")
      ->capture_default_str();
  // Task.
  if (grid_axes)
    app.add_option("--length", o.task.length, "symbols per copy L (sequence length N = 2L + 2)")
        ->capture_default_str();
  app.add_option("--symbols", o.task.symbols, "alphabet size S (symbols 1..S)")
      ->capture_default_str();
  app.add_option("--mask-ratio", o.task.mask_ratio, "fraction of symbol positions masked")
      ->capture_default_str();
  // Training.
  app.add_option("--batch", t.batch, "sequences per step")->capture_default_str();
  app.add_option("--steps", t.steps, "optimizer steps in all (a resumed run continues to it)")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  app.add_option("--optimizer", t.optimizer, "radam | adam | adamw | sgd")->capture_default_str();
  app.add_option("--weight-decay", t.weight_decay, "weight decay")->capture_default_str();
  app.add_flag("--decoupled-weight-decay", t.decoupled_weight_decay,
               "decoupled weight decay for adam/radam (adamw always decouples; sgd never)");
  app.add_option("--momentum", t.momentum, "momentum (sgd)")->capture_default_str();
  app.add_option("--clip", t.clip, "max global gradient norm (0: no clipping)")
      ->capture_default_str();
  app.add_option("--lr-schedule", t.lr_schedule,
                 "constant | warmup (linear warm-up, then constant) | plateau (warm-up, then "
                 "reduce on plateau of the held-out loss at each evaluation)")
      ->capture_default_str();
  app.add_option("--warmup", t.warmup, "warm-up steps (warmup, plateau)")->capture_default_str();
  app.add_option("--plateau-factor", t.plateau_factor, "plateau: lr factor")
      ->capture_default_str();
  app.add_option("--plateau-patience", t.plateau_patience,
                 "plateau: evaluations without improvement before lowering")
      ->capture_default_str();
  app.add_option("--plateau-threshold", t.plateau_threshold, "plateau: relative improvement")
      ->capture_default_str();
  app.add_option("--plateau-cooldown", t.plateau_cooldown, "plateau: evaluations to wait after")
      ->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "plateau: lowest lr")->capture_default_str();
  app.add_option("--target-accuracy", t.target_accuracy,
                 "stop when the held-out masked accuracy reaches this (0: run all steps)")
      ->capture_default_str();
  app.add_option("--time-limit", t.time_limit, "stop training after this many seconds (0: none)")
      ->capture_default_str();
  app.add_option("--seed", t.seed, "seed of the model, data and held-out streams")
      ->capture_default_str();
  app.add_option("--max-skipped-steps", t.max_skipped_steps,
                 "steps in a row with a non-finite loss or gradient norm (each skipped) "
                 "before the run stops")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: OpenMP's default)")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda")->capture_default_str();
  app.add_flag("--tf32", o.tf32,
               "with --device cuda: TF32 tensor cores for the f32 products (off: full f32)");
}

void add_output_flags(CLI::App& app, RunOptions& o) {
  OutputOptions& u = o.output;
  app.add_option("--out", u.out, "output folder (metrics.csv, checkpoint.safetensors, PNGs); "
                 "a new run refuses one that holds files. Default: the first of "
                 "runs/copy_task, runs/copy_task-2, ... that is free")
      ->capture_default_str();
  app.add_flag("--overwrite", u.overwrite,
               "let a new run replace the run in --out (its metrics, checkpoint and plots)");
  app.add_option("--log-interval", u.log_interval, "steps per log line")->capture_default_str();
  app.add_option("--eval-interval", u.eval_interval, "steps between held-out evaluations")
      ->capture_default_str();
  app.add_option("--eval-batches", u.eval_batches, "held-out batches per evaluation")
      ->capture_default_str();
  app.add_option("--final-eval-batches", u.final_eval_batches,
                 "batches of the larger held-out set evaluated after training")
      ->capture_default_str();
  app.add_option("--checkpoint-interval", u.checkpoint_interval,
                 "steps between checkpoints (0: only the final one)")
      ->capture_default_str();
}

void validate(const RunOptions& o) {
  const ModelOptions& m = o.model;
  const TrainOptions& t = o.train;
  const OutputOptions& u = o.output;
  auto at_least = [](const char* flag, int64_t v, int64_t lo) {
    CLUSTR_CHECK(v >= lo, flag, " must be >= ", lo, ", got ", v);
  };
  at_least("--layers", m.layers, 1);
  at_least("--heads", m.heads, 1);
  at_least("--head-dim", m.head_dim, 1);
  at_least("--feedforward", m.feedforward, 1);
  CLUSTR_CHECK(m.dropout >= 0.0f && m.dropout < 1.0f, "--dropout must be in [0, 1), got ",
               m.dropout);
  at_least("--clusters", m.attention.clusters, 1);
  at_least("--topk", m.attention.topk, 1);
  CLUSTR_CHECK(m.attention.bits >= 1 && m.attention.bits <= 63,
               "--bits must be in [1, 63], got ", m.attention.bits);
  at_least("--iterations", m.attention.iterations, 1);
  m.attention.validate();

  CLUSTR_CHECK(o.task.length >= 1 && o.task.length <= 1000000,
               "--length must be in [1, 1000000], got ", o.task.length);
  CLUSTR_CHECK(o.task.symbols >= 1 && o.task.symbols <= 1000,
               "--symbols must be in [1, 1000], got ", o.task.symbols);
  CLUSTR_CHECK(o.task.mask_ratio > 0.0f && o.task.mask_ratio <= 0.5f,
               "--mask-ratio must be in (0, 0.5] (a word position is masked in at most one of "
               "its two copies, so that it stays recoverable), got ",
               o.task.mask_ratio);

  at_least("--batch", t.batch, 1);
  at_least("--steps", t.steps, 1);
  CLUSTR_CHECK(std::isfinite(t.lr) && t.lr > 0.0f, "--lr must be > 0, got ", t.lr);
  CLUSTR_CHECK(t.optimizer == "radam" || t.optimizer == "adam" || t.optimizer == "adamw" ||
                   t.optimizer == "sgd",
               "--optimizer must be radam, adam, adamw or sgd, got '", t.optimizer, "'");
  CLUSTR_CHECK(t.weight_decay >= 0.0f, "--weight-decay must be >= 0, got ", t.weight_decay);
  CLUSTR_CHECK(!t.decoupled_weight_decay || t.optimizer != "sgd",
               "--decoupled-weight-decay applies to radam, adam and adamw, not sgd");
  CLUSTR_CHECK(t.momentum >= 0.0f && t.momentum < 1.0f, "--momentum must be in [0, 1), got ",
               t.momentum);
  CLUSTR_CHECK(t.momentum == 0.0f || t.optimizer == "sgd", "--momentum is for sgd only");
  CLUSTR_CHECK(t.clip >= 0.0f, "--clip must be >= 0 (0: no clipping), got ", t.clip);
  CLUSTR_CHECK(t.lr_schedule == "constant" || t.lr_schedule == "warmup" ||
                   t.lr_schedule == "plateau",
               "--lr-schedule must be constant, warmup or plateau, got '", t.lr_schedule, "'");
  at_least("--warmup", t.warmup, 0);
  CLUSTR_CHECK(t.plateau_factor > 0.0 && t.plateau_factor < 1.0,
               "--plateau-factor must be in (0, 1), got ", t.plateau_factor);
  at_least("--plateau-patience", t.plateau_patience, 0);
  CLUSTR_CHECK(t.plateau_threshold >= 0.0 && t.plateau_threshold < 1.0,
               "--plateau-threshold must be in [0, 1), got ", t.plateau_threshold);
  at_least("--plateau-cooldown", t.plateau_cooldown, 0);
  CLUSTR_CHECK(t.min_lr >= 0.0, "--min-lr must be >= 0, got ", t.min_lr);
  CLUSTR_CHECK(t.target_accuracy >= 0.0 && t.target_accuracy <= 1.0,
               "--target-accuracy must be in [0, 1] (0: run all steps), got ", t.target_accuracy);
  CLUSTR_CHECK(t.time_limit >= 0.0, "--time-limit must be >= 0 seconds, got ", t.time_limit);
  at_least("--max-skipped-steps", t.max_skipped_steps, 1);
  check_threads(o.threads);
  CLUSTR_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '",
               o.device, "'");
  CLUSTR_CHECK(!o.tf32 || o.device == "cuda", "--tf32 applies to the GPU's f32 products; this "
               "run is on the cpu (give --device cuda, or leave --tf32 out)");

  CLUSTR_CHECK(!u.out.empty(), "--out must name a folder");
  at_least("--log-interval", u.log_interval, 1);
  at_least("--eval-interval", u.eval_interval, 1);
  at_least("--eval-batches", u.eval_batches, 1);
  at_least("--final-eval-batches", u.final_eval_batches, 1);
  // The held-out sets are drawn at once and kept: bounded by what they hold, in tokens (8
  // bytes each, input and target), so that a typo cannot take the machine's memory.
  const double n = 2.0 * double(o.task.length) + 2.0;
  for (const auto& [flag, batches] : {std::pair<const char*, int64_t>{"--eval-batches",
                                                                      u.eval_batches},
                                      {"--final-eval-batches", u.final_eval_batches}})
    CLUSTR_CHECK(double(batches) * double(t.batch) * n <= kMaxHeldOutTokens, flag, " ", batches,
                 " x --batch ", t.batch, " x N ", int64_t(n), " is more than ",
                 int64_t(kMaxHeldOutTokens), " held-out tokens (", int64_t(kMaxHeldOutTokens) * 8 /
                 (1 << 20), " MiB); give fewer batches");
  at_least("--checkpoint-interval", u.checkpoint_interval, 0);
}

std::vector<std::pair<std::string, std::string>> config_entries(const RunOptions& o) {
  const ModelOptions& m = o.model;
  const TrainOptions& t = o.train;
  const OutputOptions& u = o.output;
  return {
      {"preset", o.preset},
      {"layers", str(m.layers)},
      {"heads", str(m.heads)},
      {"head-dim", str(m.head_dim)},
      {"feedforward", str(m.feedforward)},
      {"dropout", str(m.dropout)},
      {"pre-norm", str(m.pre_norm)},
      {"precision", to_string(m.precision)},
      {"attention", attention_type_name(m.attention.type)},
      {"clusters", str(m.attention.clusters)},
      {"topk", str(m.attention.topk)},
      {"bits", str(m.attention.bits)},
      {"iterations", str(m.attention.iterations)},
      {"length", str(o.task.length)},
      {"symbols", str(o.task.symbols)},
      {"mask-ratio", str(o.task.mask_ratio)},
      {"batch", str(t.batch)},
      {"steps", str(t.steps)},
      {"lr", str(t.lr)},
      {"optimizer", t.optimizer},
      {"weight-decay", str(t.weight_decay)},
      {"decoupled-weight-decay", str(t.decoupled_weight_decay)},
      {"momentum", str(t.momentum)},
      {"clip", str(t.clip)},
      {"lr-schedule", t.lr_schedule},
      {"warmup", str(t.warmup)},
      {"plateau-factor", str(t.plateau_factor)},
      {"plateau-patience", str(t.plateau_patience)},
      {"plateau-threshold", str(t.plateau_threshold)},
      {"plateau-cooldown", str(t.plateau_cooldown)},
      {"min-lr", str(t.min_lr)},
      {"target-accuracy", str(t.target_accuracy)},
      {"seed", std::to_string(t.seed)},
      {"time-limit", str(t.time_limit)},
      {"max-skipped-steps", str(t.max_skipped_steps)},
      {"threads", str(o.threads)},
      {"device", o.device},
      {"tf32", str(o.tf32)},
      {"out", u.out},
      {"log-interval", str(u.log_interval)},
      {"eval-interval", str(u.eval_interval)},
      {"eval-batches", str(u.eval_batches)},
      {"final-eval-batches", str(u.final_eval_batches)},
      {"checkpoint-interval", str(u.checkpoint_interval)},
  };
}

std::map<std::string, std::string> to_config(const RunOptions& o) {
  const auto entries = config_entries(o);
  return {entries.begin(), entries.end()};
}

void apply_checkpoint_config(const std::map<std::string, std::string>& c, RunOptions& o) {
  ModelOptions& m = o.model;
  m.layers = int(parse_int(c, "layers"));
  m.heads = int(parse_int(c, "heads"));
  m.head_dim = int(parse_int(c, "head-dim"));
  m.feedforward = int(parse_int(c, "feedforward"));
  m.dropout = float(parse_real(c, "dropout"));
  m.pre_norm = parse_bool(c, "pre-norm");
  // Checkpoints from before mixed precision were trained in fp32.
  m.precision = c.count("precision") ? parse_precision(c.at("precision")) : Precision::fp32;
  m.attention.type = parse_attention_type(need(c, "attention"));
  m.attention.clusters = int(parse_int(c, "clusters"));
  m.attention.topk = int(parse_int(c, "topk"));
  m.attention.bits = int(parse_int(c, "bits"));
  m.attention.iterations = int(parse_int(c, "iterations"));
  o.task.length = int(parse_int(c, "length"));
  o.task.symbols = int(parse_int(c, "symbols"));
  o.task.mask_ratio = float(parse_real(c, "mask-ratio"));
  o.train.batch = parse_int(c, "batch");
  const std::string& seed = need(c, "seed");
  char* end = nullptr;
  o.train.seed = std::strtoull(seed.c_str(), &end, 10);
  CLUSTR_CHECK(!seed.empty() && *end == '\0', "checkpoint config 'seed' is \"", seed,
               "\", not an integer");
}

const std::vector<std::string>& resume_locked_keys() {
  static const std::vector<std::string> keys = {
      "layers",   "heads",      "head-dim", "feedforward", "pre-norm", "attention",
      "clusters", "topk",       "bits",     "iterations",  "length",   "symbols",
      "mask-ratio", "optimizer"};
  return keys;
}

const std::vector<std::string>& resume_noted_keys() {
  static const std::vector<std::string> keys = {
      "dropout",   "precision",      "batch",            "lr",               "weight-decay",
      "decoupled-weight-decay",      "momentum",         "clip",
      "lr-schedule", "warmup",       "plateau-factor",   "plateau-patience",
      "plateau-threshold",           "plateau-cooldown", "min-lr",
      "seed",      "eval-interval",  "eval-batches",   "tf32"};
  return keys;
}

std::vector<std::string> config_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now,
                                            const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto a = saved.find(k), b = now.find(k);
    const std::string va = a == saved.end() ? "(absent)" : a->second;
    const std::string vb = b == now.end() ? "(absent)" : b->second;
    if (va != vb) out.push_back(detail::cat("--", k, ": checkpoint ", va, ", now ", vb));
  }
  return out;
}

}  // namespace clustr::copy

// The settings every training app shares (settings.h).
#include "apps/common/settings.h"

#include <cmath>

#include "apps/common/training.h"
#include "core/error.h"

namespace clustr {

std::string find_preset(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--preset=", 0) == 0) return a.substr(9);
  }
  return "cpu";
}

void apply_preset(FlagTable& t, const std::string& name,
                  const std::vector<std::pair<std::string, std::string>>& presets) {
  std::string names;
  for (size_t i = 0; i < presets.size(); ++i) {
    if (presets[i].first == name) return t.set(presets[i].second);
    names += (i == 0 ? "" : i + 1 == presets.size() ? " or " : ", ") + presets[i].first;
  }
  throw Error(detail::cat("unknown --preset '", name, "'; expected ", names));
}

void add_attention_settings(FlagTable& t, AttentionConfig& a, bool with_type) {
  if (with_type)
    t.add_text(
         "attention", [&a] { return std::string(attention_type_name(a.type)); },
         [&a](const std::string& s) { a.type = parse_attention_type(s); },
         "full | clustered | improved-clustered | shared-full | lsh (oracle-top: evaluation "
         "only; shared-full and lsh share one projection between queries and keys)")
        .resume(Resume::locked);
  t.add("clusters", a.clusters, "clusters C (clustered types)").at_least(1)
      .resume(Resume::locked);
  t.add("topk", a.topk, "top-k keys per cluster (improved-clustered) or query (oracle-top)")
      .at_least(1)
      .resume(Resume::locked);
  t.add("bits", a.bits, "hash bits for clustering (<= 63)").within(1, 63)
      .resume(Resume::locked);
  t.add("iterations", a.iterations, "Lloyd iterations of Hamming K-means").at_least(1)
      .resume(Resume::locked);
  // Checkpoints from before lsh attention hold the defaults.
  t.add("rounds", a.rounds, "hashing rounds X of lsh attention (lsh-X)").at_least(1)
      .resume(Resume::locked)
      .when_absent("1");
  t.add("buckets", a.buckets, "hash buckets per round (lsh; even)")
      .check([&a] { return a.buckets >= 2 && a.buckets % 2 == 0; }, "must be even and >= 2")
      .resume(Resume::locked)
      .when_absent("32");
  t.add("chunk", a.chunk, "sorted positions per chunk (lsh)").at_least(1)
      .resume(Resume::locked)
      .when_absent("32");
}

AttentionConfig override_attention(const AttentionConfig& trained, const AttentionConfig& given,
                                   const std::function<bool(const std::string&)>& given_flag) {
  AttentionConfig a = trained;
  if (given_flag("--attention")) a.type = given.type;
  if (given_flag("--clusters")) a.clusters = given.clusters;
  if (given_flag("--topk")) a.topk = given.topk;
  if (given_flag("--bits")) a.bits = given.bits;
  if (given_flag("--iterations")) a.iterations = given.iterations;
  if (given_flag("--rounds")) a.rounds = given.rounds;
  if (given_flag("--buckets")) a.buckets = given.buckets;
  if (given_flag("--chunk")) a.chunk = given.chunk;
  a.validate();
  return a;
}

void add_encoder_settings(FlagTable& t, EncoderOptions& m, const std::string& dropout_help) {
  t.add("layers", m.layers, "encoder layers").at_least(1).resume(Resume::locked);
  t.add("heads", m.heads, "attention heads H").at_least(1).resume(Resume::locked);
  t.add("head-dim", m.head_dim, "dims per head E (model width D = H x E)").at_least(1)
      .resume(Resume::locked);
  t.add("feedforward", m.feedforward, "feed-forward width").at_least(1).resume(Resume::locked);
  t.add("dropout", m.dropout, dropout_help)
      .check([&m] { return m.dropout >= 0.0f && m.dropout < 1.0f; }, "must be in [0, 1)")
      .resume(Resume::noted);
  t.add("pre-norm", m.pre_norm, "pre-norm layers (default: post-norm, as the paper)")
      .resume(Resume::locked);
  t.add_text(
       "precision", [&m] { return std::string(to_string(m.precision)); },
       [&m](const std::string& s) { m.precision = parse_precision(s); },
       "fp32 | bf16 (matrix products with bf16 operands and f32 sums; weights, optimizer, "
       "softmax, norms and losses stay f32)")
      .resume(Resume::noted)
      .when_absent("fp32");  // checkpoints from before mixed precision were trained in fp32
  add_attention_settings(t, m.attention);
}

void add_optimizer_settings(FlagTable& t, TrainingOptions& o,
                            const std::vector<std::string>& optimizers,
                            const std::string& evaluation) {
  bool sgd = false;
  std::string listed;
  for (size_t i = 0; i < optimizers.size(); ++i) {
    sgd = sgd || optimizers[i] == "sgd";
    listed += (i ? " | " : "") + optimizers[i];
  }
  t.add("lr", o.lr, "peak learning rate")
      .check([&o] { return std::isfinite(o.lr) && o.lr > 0.0f; }, "must be > 0")
      .resume(Resume::noted);
  t.add("optimizer", o.optimizer, listed).one_of(optimizers).resume(Resume::locked);
  t.add("weight-decay", o.weight_decay, "weight decay").at_least(0).resume(Resume::noted);
  t.add("decoupled-weight-decay", o.decoupled_weight_decay,
        "decoupled weight decay for adam/radam (adamw always decouples; sgd never)")
      .check([&o] { return !o.decoupled_weight_decay || o.optimizer != "sgd"; },
             "applies to radam, adam and adamw, not sgd")
      .resume(Resume::noted);
  if (sgd)
    t.add("momentum", o.momentum, "momentum (sgd)")
        .check([&o] { return o.momentum >= 0.0f && o.momentum < 1.0f; }, "must be in [0, 1)")
        .check([&o] { return o.momentum == 0.0f || o.optimizer == "sgd"; }, "is for sgd only")
        .resume(Resume::noted);
  t.add("clip", o.clip, "max global gradient norm (0: no clipping)")
      .at_least(0)
      .resume(Resume::noted);
  t.add("lr-schedule", o.lr_schedule,
        "constant | warmup (linear warm-up, then constant) | plateau (warm-up, then lowered "
        "when the held-out loss stops improving for --plateau-patience " + evaluation + ")")
      .one_of({"constant", "warmup", "plateau"})
      .resume(Resume::noted);
  t.add("warmup", o.warmup, "warm-up steps (warmup, plateau)").at_least(0).resume(Resume::noted);
  t.add("plateau-factor", o.plateau_factor, "plateau: lr factor")
      .check([&o] { return o.plateau_factor > 0.0 && o.plateau_factor < 1.0; },
             "must be in (0, 1)")
      .resume(Resume::noted);
  t.add("plateau-patience", o.plateau_patience,
        "plateau: " + evaluation + " without improvement before lowering")
      .at_least(0)
      .resume(Resume::noted);
  t.add("plateau-threshold", o.plateau_threshold, "plateau: relative improvement")
      .check([&o] { return o.plateau_threshold >= 0.0 && o.plateau_threshold < 1.0; },
             "must be in [0, 1)")
      .resume(Resume::noted);
  t.add("plateau-cooldown", o.plateau_cooldown, "plateau: " + evaluation + " to wait after")
      .at_least(0)
      .resume(Resume::noted);
  t.add("min-lr", o.min_lr, "plateau: lowest lr").at_least(0).resume(Resume::noted);
}

void add_run_settings(FlagTable& t, TrainingOptions& o, const std::string& seed_help) {
  t.add("seed", o.seed, seed_help).resume(Resume::noted);
  t.add("time-limit", o.time_limit, "stop training after this many seconds (0: none)")
      .at_least(0);
  t.add("max-skipped-steps", o.max_skipped_steps,
        "steps in a row with a non-finite loss or gradient norm (each skipped) before the run "
        "stops")
      .at_least(1);
}

void add_machine_settings(FlagTable& t, MachineOptions& m) {
  t.add("threads", m.threads, "CPU threads (0: OpenMP's default)").within(0, kMaxThreads);
  t.add("device", m.device, "cpu | cuda").one_of({"cpu", "cuda"});
  t.add("tf32", m.tf32, "with --device cuda: TF32 tensor cores for the f32 products (off: full "
        "f32)")
      .check([&m] { return !m.tf32 || m.device == "cuda"; },
             "applies to the GPU's f32 products; this run is on the cpu (give --device cuda, "
             "or leave --tf32 out)",
             /*show_value=*/false)
      .resume(Resume::noted);
  t.add("cuda-graphs", m.cuda_graphs, "with --device cuda: on (capture the training step into "
        "a CUDA graph and replay it, where the step allows; the results are the same bits) or "
        "off")
      .one_of({"on", "off"})
      .not_stored();
}

void add_out_settings(FlagTable& t, std::string& out, bool& overwrite,
                      const std::string& default_folder, const std::string& what) {
  t.add("out", out,
        "output folder (" + what + "); a new run refuses one that holds files. Default: the "
        "first of " + default_folder + ", " + default_folder + "-2, ... that is free")
      .check([&out] { return !out.empty(); }, "must name a folder");
  t.add("overwrite", overwrite, "let a new run replace the run in --out (" + what + ")")
      .not_stored();
}

}  // namespace clustr

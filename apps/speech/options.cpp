// Flags, presets, checks and config maps of the speech app (options.h).
#include "apps/speech/options.h"

#include <CLI/CLI.hpp>

#include "apps/common/training.h"
#include "core/error.h"

namespace clustr::speech {

RunOptions preset_options(const std::string& name) {
  return preset_of<RunOptions>(
      name,
      {// The defaults of options.h: D = 128, 4 layers, x4 stacking (about 150 positions for a
       // 6 s utterance), Adam with warm-up; clusters and k scaled to the shorter sequences.
       {"cpu", "clusters=25 topk=16"},
       // Sec. 4.2 and supp. C.3; stacking 1: WSJ's 40-dim filterbanks at 10 ms, about 780
       // frames on average; no warm-up, R-Adam needs none.
       {"paper",
        "layers=9 heads=6 head-dim=32 feedforward=768 dropout=0.1 stacking=1 clusters=100 "
        "topk=32 optimizer=radam lr=1e-4 clip=10 weight-decay=0.01 decoupled-weight-decay=true "
        "lr-schedule=plateau warmup=0 plateau-patience=2 epochs=100 max-frames=16000 batch=32 "
        "out=runs/speech_paper"}});
}

void add_attention_flags(CLI::App& app, AttentionConfig& a) {
  FlagTable f;
  add_attention_settings(f, a);
  f.add_to(app);
  // A value left out is the checkpoint's, not the one `a` holds: the help says so.
  for (const auto& entry : f.entries()) {
    CLI::Option* option = app.get_option("--" + entry.first);
    option->default_str("");
    option->description(option->get_description() + " (default: the model's)");
  }
}

void add_precision_flag(CLI::App& app, Precision& precision) {
  FlagTable f;
  f.add_text(
      "precision", [&precision] { return std::string(to_string(precision)); },
      [&precision](const std::string& s) { precision = parse_precision(s); },
      "fp32 | bf16: the products' precision (default: the one the model was trained with; the "
      "weights are f32 either way)");
  f.add_to(app);
}

namespace {

// A setting in [lo, hi] that a resumed run may change, with a note.
template <typename T>
void add_noted(FlagTable& f, const std::string& name, T& field, double lo, double hi,
               const std::string& help) {
  f.add(name, field, help).within(lo, hi).resume(Resume::noted);
}

// SpecAugment's settings (data/augment.h).
void add_spec_augment_settings(FlagTable& f, SpecAugmentOptions& s) {
  add_noted(f, "spec-freq-masks", s.freq_masks, 0, 16,
            "SpecAugment: mel-bin bands masked per training utterance (0: none)");
  add_noted(f, "spec-freq-width", s.freq_width, 0, 80,
            "SpecAugment: the widest band, in mel bins");
  add_noted(f, "spec-time-masks", s.time_masks, 0, 16,
            "SpecAugment: stretches of frames masked per training utterance (0: none)");
  add_noted(f, "spec-time-width", s.time_width, 0, 1000,
            "SpecAugment: the longest stretch, in 10 ms frames");
  add_noted(f, "spec-time-ratio", s.max_time_ratio, 0, 1,
            "SpecAugment: a stretch covers at most this share of its utterance");
}

// The waveform augmentation's settings (data/wave_augment.h), all noted on resume. A spread
// ("1.1", "0.9,1,1.1" or "0.9:1.1") is checked by WaveAugmentOptions::validate, which names the
// flag of a value out of its bounds.
void add_wave_augment_settings(FlagTable& f, WaveAugmentOptions& w) {
  const auto spread = [&f, &w](const std::string& name, Spread& field, const std::string& help) {
    f.add_text(
         name, [&field] { return field.text(); },
         [&field, name](const std::string& s) { field = Spread::parse(s, "--" + name); }, help)
        .check([&w] { return w.validate(), true; }, "")
        .resume(Resume::noted);
  };
  const auto bounded = [&f](const std::string& name, double& field, double hi,
                            const std::string& help) { add_noted(f, name, field, 0, hi, help); };
  spread("speed-perturb", w.speed, "speed perturbation of training utterances: a factor (1: "
         "none), a list to choose from (0.9,1,1.1) or a range (0.9:1.1)");
  spread("vtlp", w.vtlp, "vocal-tract-length perturbation: the filterbank's warp factor (1: "
         "none), a list or a range (0.9:1.1)");
  bounded("gain-db", w.gain_db, 40, "random gain of training utterances, uniform in +-this "
          "many dB");
  bounded("noise-prob", w.noise_prob, 1, "share of training utterances that get white, pink "
          "or brown noise added");
  spread("noise-snr", w.noise_snr, "signal-to-noise ratio of the added noise, dB (a value, a "
         "list or a range)");
  bounded("reverb-prob", w.reverb_prob, 1, "share of training utterances reverberated in a "
          "simulated room");
  spread("reverb-rt60", w.reverb_rt60, "the simulated rooms' reverberation time RT60, seconds "
         "(a value, a list or a range)");
}

}  // namespace

FlagTable settings_table(RunOptions& o) {
  ModelOptions& m = o.model;
  DataOptions& d = o.data;
  TrainOptions& t = o.train;
  OutputOptions& u = o.output;
  FlagTable f;
  f.add("preset", o.preset, "cpu (a small model for two cores) or paper (the paper's WSJ "
        "model); other flags override the preset's values");
  // Data.
  f.add("corpus", d.corpus, "corpus folder with train.tsv, dev.tsv and tokens.txt (as "
        "data/make_speech_corpus.py writes it)");
  f.add("train-manifest", d.train, "training manifest (default <corpus>/train.tsv)");
  f.add("dev-manifest", d.dev, "dev manifest (default <corpus>/dev.tsv)");
  f.add("tokens", d.tokens, "tokens file (default tokens.txt beside the manifest)");
  f.add("cache", d.cache, "feature cache folder (default fbank-cache beside the manifests)")
      .not_stored();
  f.add("max-train", d.max_train, "use the first N training utterances (0: all)").at_least(0);
  f.add("max-dev", d.max_dev, "use the first N dev utterances (0: all)").at_least(0);
  // Model.
  add_encoder_settings(f, m, "dropout after the input projection, on residual branches and "
                       "in the feed-forward");
  f.add("stacking", m.stacking, "frames stacked per encoder position: 1, 2 or 4")
      .check([&m] { return m.stacking == 1 || m.stacking == 2 || m.stacking == 4; },
             "must be 1, 2 or 4")
      .resume(Resume::locked);
  // Training.
  f.add("epochs", t.epochs, "epochs over the training set").at_least(1);
  f.add("max-steps", t.max_steps, "stop after this many steps in all (0: no limit)").at_least(0);
  f.add("batch", t.batch, "most utterances per batch (0: only --max-frames)")
      .at_least(0)
      .resume(Resume::noted);
  f.add("max-frames", t.max_frames,
        "most padded encoder positions (utterances x longest) per batch (0: none)")
      .at_least(0)
      .resume(Resume::noted);
  add_spec_augment_settings(f, t.spec);
  add_wave_augment_settings(f, t.wave);
  f.add("max-graphs", t.max_graphs,
        "with --device cuda and --cuda-graphs on: the most CUDA graphs kept, one per batch shape "
        "(the least recently used is dropped; they share one step's scratch memory)")
      .at_least(1)
      .not_stored();
  add_optimizer_settings(f, t, {"radam", "adam", "adamw"}, "epochs");
  add_run_settings(f, t, "seed of every random draw");
  add_machine_settings(f, o);
  // Output.
  add_out_settings(f, u.out, u.overwrite, "runs/speech",
                   "metrics.csv, checkpoints, plots, skipped.txt");
  f.add("log-interval", u.log_interval, "steps between progress lines").at_least(1).not_stored();
  f.add("examples", u.examples, "decoded dev utterances shown after each epoch")
      .at_least(0)
      .not_stored();
  return f;
}

void add_train_flags(CLI::App& app, RunOptions& o) {
  settings_table(o).add_to(app);
  app.add_flag("!--no-plots", o.output.write_plots, "do not write PNG plots");
}

void validate(const RunOptions& o) {
  RunOptions copy = o;
  settings_table(copy).validate();
  o.model.attention.validate();
  CLUSTR_CHECK(o.model.attention.type != AttentionType::oracle_top,
               "--attention oracle-top is for evaluation only: it chooses each query's keys "
               "from full attention's weights and has no gradient "
               "(evaluate a trained model with it: speech evaluate --attention oracle-top, or speech matrix)");
  CLUSTR_CHECK(o.train.batch > 0 || o.train.max_frames > 0,
               "--batch and --max-frames are both 0: give at least one batch limit");
  CLUSTR_CHECK(!o.data.corpus.empty() || (!o.data.train.empty() && !o.data.dev.empty()),
               "give --corpus, or both --train-manifest and --dev-manifest");
}

namespace {

// The keys that rebuild a trained model: its shape and attention (the locked keys, but the
// optimizer's), its dropout and its precision.
std::vector<std::string> model_keys(const FlagTable& f) {
  std::vector<std::string> keys;
  for (const std::string& k : f.keys(Resume::locked))
    if (k != "optimizer") keys.push_back(k);
  keys.push_back("dropout");
  keys.push_back("precision");
  return keys;
}

}  // namespace

ModelOptions model_from_config(const std::map<std::string, std::string>& c) {
  RunOptions o;
  FlagTable f = settings_table(o);
  f.apply(c, model_keys(f));
  return o.model;
}

void adopt_locked_settings(const std::map<std::string, std::string>& saved, const CLI::App& app,
                           RunOptions& o) {
  FlagTable f = settings_table(o);
  std::vector<std::string> keys;
  for (const std::string& k : f.keys(Resume::locked))
    if (app.count("--" + k) == 0 && saved.count(k)) keys.push_back(k);
  f.apply(saved, keys);
}

}  // namespace clustr::speech

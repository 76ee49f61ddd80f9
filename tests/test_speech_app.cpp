// The speech app and its batching: frame stacking, length buckets, padding
// (data/speech_batch.h); a tiny synthetic corpus (one tone per label, written here, so no speech
// synthesizer is needed) read with its bad utterances skipped and counted; a short training run
// whose loss falls; checkpoints that evaluate and resume; flag checks.
//
// ctest also runs the executable on the synthetic corpus (train, evaluate, decode, matrix, bad
// flags): the test case "speech app: write the synthetic corpus" writes it into the folder named
// by CLUSTR_SPEECH_TEST_CORPUS (tests/CMakeLists.txt).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "apps/speech/dataset.h"
#include "apps/speech/options.h"
#include "apps/speech/train.h"
#include "check.h"
#include "tone_corpus.h"
#include "data/augment.h"
#include "data/wave_augment.h"
#include "data/corpus_import.h"
#include "data/speech_batch.h"
#include "data/audio.h"
#include "core/safetensors.h"

using namespace clustr;
using namespace clustr::speech;
using clustr::test::TempDir;
using clustr::test::write_tone_corpus;

namespace {

RunOptions tiny_run(const std::string& corpus, const std::string& out) {
  RunOptions o = preset_options("cpu");
  o.data.corpus = corpus;
  o.model.layers = 1;
  o.model.heads = 2;
  o.model.head_dim = 16;
  o.model.feedforward = 64;
  o.model.dropout = 0.0f;
  o.model.stacking = 2;
  o.model.attention.clusters = 4;
  o.model.attention.topk = 8;
  o.train.batch = 8;
  o.train.epochs = 100;
  o.train.max_steps = 60;
  o.train.lr = 3e-3f;
  o.train.warmup = 10;
  o.train.lr_schedule = "warmup";
  o.output.out = out;
  o.output.log_interval = 10;
  o.output.write_plots = false;
  return o;
}

// Trains `o` again into `folder`, stopped after `first` steps and resumed from there to its
// --max-steps: the losses of the two pieces must be those of the uninterrupted run `all`, bit
// for bit.
void check_resumes_exactly(const RunOptions& o, const TrainResult& all, const std::string& folder,
                           size_t first) {
  const auto steps = size_t(o.train.max_steps);
  REQUIRE(all.losses.size() == steps);
  RunOptions head = o;
  head.output.out = folder;
  head.train.max_steps = int64_t(first);
  TrainResult r1;
  {
    Trainer a(head, nullptr);
    r1 = a.run();
  }
  RunOptions tail = o;
  tail.output.out = folder;
  Trainer b(tail, nullptr);
  b.resume(folder);
  const TrainResult r2 = b.run();
  REQUIRE(r1.losses.size() == first);
  REQUIRE(r2.losses.size() == steps - first);
  for (size_t i = 0; i < steps; ++i) {
    CAPTURE(i);
    const float split = i < first ? r1.losses[i] : r2.losses[i - first];
    CHECK(std::memcmp(&split, &all.losses[i], sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("speech batch: frame stacking pads the last group with zero frames") {
  CHECK(stacked_length(0, 4) == 0);
  CHECK(stacked_length(8, 4) == 2);
  CHECK(stacked_length(9, 4) == 3);
  CHECK(stacked_length(5, 1) == 5);
  // 5 frames of 2 bins: value = 10 t + m.
  std::vector<float> v;
  for (int t = 0; t < 5; ++t)
    for (int m = 0; m < 2; ++m) v.push_back(float(10 * t + m));
  const Tensor x = Tensor::from_vector(v, {5, 2});
  const Tensor s2 = stack_frames(x, 2);
  REQUIRE(s2.shape() == Shape{3, 4});
  const std::vector<float> want2 = {0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 0, 0};
  for (size_t i = 0; i < want2.size(); ++i) CHECK(s2.f32()[i] == want2[i]);
  const Tensor s4 = stack_frames(x, 4);
  REQUIRE(s4.shape() == Shape{2, 8});
  CHECK(s4.f32()[8] == 40.0f);
  CHECK(s4.f32()[10] == 0.0f);
  CHECK(stack_frames(x, 1).shape() == Shape{5, 2});
  CHECK_ERROR(stack_frames(x, 0), "stacking factor must be >= 1");
  CHECK_ERROR(stack_frames(Tensor::zeros({2, 2, 2}), 2), "stack_frames", "(T, bins)");
}

TEST_CASE("speech batch: CTC needs a blank between repeated labels") {
  CHECK(ctc_min_frames({}) == 0);
  CHECK(ctc_min_frames({1, 2, 3}) == 3);
  CHECK(ctc_min_frames({1, 1, 2, 2, 2}) == 8);
}

TEST_CASE("speech batch: length buckets respect both limits and cover every utterance once") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> len(1, 200);
  std::vector<int64_t> lengths(300);
  for (int64_t& l : lengths) l = len(rng);
  lengths[17] = 5000;  // longer than the frame budget on its own
  BucketOptions o;
  o.batch_size = 16;
  o.max_frames = 1000;
  const auto batches = make_length_buckets(lengths, o);
  std::set<size_t> seen;
  int64_t previous_longest = 0;
  for (const auto& b : batches) {
    REQUIRE(!b.empty());
    CHECK(int64_t(b.size()) <= o.batch_size);
    int64_t longest = 0, shortest = 1 << 30;
    for (size_t i : b) {
      CHECK(seen.insert(i).second);
      longest = std::max(longest, lengths[i]);
      shortest = std::min(shortest, lengths[i]);
    }
    if (b.size() > 1) CHECK(int64_t(b.size()) * longest <= o.max_frames);
    CHECK(shortest >= previous_longest);  // sorted: batches do not overlap in length
    previous_longest = longest;
  }
  CHECK(seen.size() == lengths.size());
  CHECK(batches.back() == std::vector<size_t>{17});

  // Only a batch size: full batches of 16 in length order.
  const auto by_count = make_length_buckets(lengths, {16, 0});
  CHECK(by_count.size() == 19);
  CHECK(by_count.front().size() == 16);
  CHECK_ERROR(make_length_buckets(lengths, {0, 0}), "give a batch size or a frame budget");
  CHECK_ERROR(make_length_buckets({3, -1}, {4, 0}), "length 1 is negative");
}

TEST_CASE("speech batch: the batch order shuffles reproducibly from the generator") {
  std::vector<std::vector<size_t>> a;
  for (size_t i = 0; i < 50; ++i) a.push_back({i});
  auto b = a, c = a;
  Generator g1(5), g2(5), g3(6);
  shuffle_batches(b, g1);
  shuffle_batches(c, g2);
  CHECK(b == c);
  auto d = a;
  shuffle_batches(d, g3);
  CHECK(d != b);
  CHECK(b != a);
  std::sort(b.begin(), b.end());
  CHECK(b == a);  // a permutation
}

TEST_CASE("speech batch: collate pads features and targets and keeps the lengths") {
  std::vector<SpeechExample> ex(3);
  ex[0] = {"a", Tensor::full({2, 3}, 1.0f), {1, 2}, 4};
  ex[1] = {"b", Tensor::full({4, 3}, 2.0f), {3}, 8};
  ex[2] = {"c", Tensor::full({1, 3}, 3.0f), {4, 4, 4}, 2};
  const SpeechBatch b = collate_speech(ex, {1, 0});
  REQUIRE(b.features.shape() == Shape{2, 4, 3});
  CHECK(b.lengths.i32()[0] == 4);
  CHECK(b.lengths.i32()[1] == 2);
  CHECK(b.features.f32()[12] == 1.0f);           // row 1, frame 0
  CHECK(b.features.f32()[12 + 2 * 3] == 0.0f);   // row 1, frame 2: padding
  REQUIRE(b.targets.shape() == Shape{2, 2});
  CHECK(b.targets.i32()[0] == 3);
  CHECK(b.targets.i32()[1] == 0);
  CHECK(b.targets.i32()[2] == 1);
  CHECK(b.targets.i32()[3] == 2);
  CHECK(b.target_lengths.i32()[0] == 1);
  CHECK(b.target_lengths.i32()[1] == 2);
  CHECK(b.frames == 6);
  CHECK(b.input_frames == 12);
  CHECK_ERROR(collate_speech(ex, {}), "no utterances");
  CHECK_ERROR(collate_speech(ex, {7}), "index 7 out of range");
  ex[2].features = Tensor::zeros({1, 5});
  CHECK_ERROR(collate_speech(ex, {0, 2}), "'c' has 5 features per frame");
}

TEST_CASE("speech app: bad utterances are skipped and counted with file and line") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 4, 2, /*bad=*/true);
  const TokenTable tokens = read_tokens(dir.file("corpus/tokens.txt"));
  FeatureCache cache(dir.file("cache"));
  const SpeechSet set =
      load_speech_set(dir.file("corpus/train.tsv"), tokens, cache, 2, 0, nullptr);
  CHECK(set.examples.size() == 4);
  CHECK(set.bad_lines == 1);
  CHECK(set.bad_audio == 1);
  CHECK(set.too_short == 1);
  REQUIRE(set.problems.size() == 3);
  CHECK(set.problems[0].find("train.tsv:5") != std::string::npos);
  CHECK(set.problems[1].find("train.tsv:6") != std::string::npos);
  CHECK(set.problems[1].find("cut.wav") != std::string::npos);
  CHECK(set.problems[2].find("train.tsv:7") != std::string::npos);
  CHECK(set.problems[2].find("labels need at least 10") != std::string::npos);
  CHECK(set.summary().find("skipped 3") != std::string::npos);
}

TEST_CASE("speech app: a short run on tone utterances lowers the loss, then evaluates") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 48, 8, /*bad=*/false);
  const RunOptions o = tiny_run(dir.file("corpus"), dir.file("run"));
  TrainResult r;
  {
    Trainer trainer(o, nullptr);
    r = trainer.run();
  }
  INFO("first loss " << r.first_loss << ", last loss " << r.last_loss << ", dev PER "
                     << r.best_per);
  CHECK(r.steps == 60);
  CHECK(r.skipped_steps == 0);
  CHECK(r.last_loss < 0.5 * r.first_loss);
  CHECK(r.best_per < 0.9);
  CHECK(std::filesystem::exists(dir.file("run/best.safetensors")));
  CHECK(std::filesystem::exists(dir.file("run/last.safetensors")));
  CHECK(std::filesystem::exists(dir.file("run/metrics.csv")));

  // The best checkpoint rebuilds the model from its config alone, under another attention too.
  LoadedModel m = load_trained_model(dir.file("run"), "--checkpoint");
  CHECK(m.options.stacking == 2);
  const TokenTable tokens = read_tokens(dir.file("corpus/tokens.txt"));
  FeatureCache cache(dir.file("cache"));
  const SpeechSet dev = load_speech_set(dir.file("corpus/dev.tsv"), tokens, cache, 2, 0, nullptr);
  const Evaluation e = evaluate_set(*m.model, dev, 4000, 4, 1);
  CHECK(e.greedy.rate() == doctest::Approx(r.best_per).epsilon(1e-9));
  CHECK(e.beam.rate() <= e.greedy.rate() + 0.1);
  AttentionConfig a = m.options.attention;
  a.type = AttentionType::improved_clustered;
  m.model->set_attention(a);
  const Evaluation ei = evaluate_set(*m.model, dev, 4000, 1, 1);
  CHECK(std::isfinite(ei.loss));
  CHECK(ei.utterances == 8);

  // Resume from last.safetensors and continue to 70 steps.
  RunOptions more = o;
  more.train.max_steps = 70;
  Trainer again(more, nullptr);
  again.resume(dir.file("run"));
  CHECK(again.step() == 60);
  const TrainResult r2 = again.run();
  CHECK(r2.steps == 70);

  // Resuming with another model shape is refused, naming the flag.
  RunOptions other = o;
  other.model.layers = 2;
  Trainer wrong(other, nullptr);
  CHECK_ERROR(wrong.resume(dir.file("run")), "other settings", "--layers: checkpoint 1, now 2");
}

// A NaN in the output layer's bias makes every batch's loss NaN: each step must be skipped and
// reported, no weight, moment or step count may take the NaN in, and no checkpoint is written
// from such a model: the run stops at the epoch's end (the bias cannot be saved), or before,
// after --max-skipped-steps skipped steps in a row.
TEST_CASE("speech app: a non-finite loss skips the step and is reported") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 16, 4, /*bad=*/false);
  for (int64_t limit : {10, 2}) {
    CAPTURE(limit);
    const std::string out = dir.file("run" + std::to_string(limit));
    RunOptions o = tiny_run(dir.file("corpus"), out);
    o.train.epochs = 2;
    o.train.max_steps = 0;
    o.train.max_skipped_steps = limit;
    std::FILE* log = std::tmpfile();
    REQUIRE(log != nullptr);
    Trainer trainer(o, log);
    std::vector<std::pair<std::string, Tensor>> before;
    for (const auto& [name, p] : trainer.model().named_parameters())
      before.emplace_back(name, p.data().clone());
    Tensor bias;
    for (const auto& [name, p] : trainer.model().named_parameters())
      if (name == "output.bias") bias = p.data();
    REQUIRE(bias.defined());
    bias.f32()[0] = std::numeric_limits<float>::quiet_NaN();
    // 16 utterances in batches of 8: two skipped steps, then the epoch's end.
    if (limit == 10)
      CHECK_ERROR(trainer.run(), "not writing the checkpoint", "best.safetensors",
                  "output.bias holds a non-finite value (nan at element 0)");
    else
      CHECK_ERROR(trainer.run(), "training stopped: 2 steps in a row had a non-finite loss",
                  "epoch 1 batch 2: non-finite loss", "no checkpoint was written",
                  "--max-skipped-steps");
    CHECK(trainer.step() == 0);
    CHECK_FALSE(std::filesystem::exists(out + "/best.safetensors"));
    CHECK_FALSE(std::filesystem::exists(out + "/last.safetensors"));
    for (const auto& [name, p] : trainer.model().named_parameters()) {
      if (name == "output.bias") continue;
      const Tensor& old = std::find_if(before.begin(), before.end(),
                                       [&](const auto& b) { return b.first == name; })->second;
      INFO("parameter " << name);
      CHECK(std::memcmp(old.f32(), p.data().f32(), size_t(old.numel()) * 4) == 0);
    }
    std::rewind(log);
    std::string text;
    for (int c; (c = std::fgetc(log)) != EOF;) text += char(c);
    std::fclose(log);
    INFO("log:\n" << text);
    CHECK(text.find("epoch 1 batch 1: non-finite loss (") != std::string::npos);
    CHECK(text.find("nan, 8 utterances from 'train") != std::string::npos);
    CHECK(text.find("step skipped (2 in a row; the run stops at " + std::to_string(limit) + ")") !=
          std::string::npos);
  }
}

TEST_CASE("speech app: flag checks name the flag") {
  RunOptions o = preset_options("cpu");
  o.data.corpus = "x";
  validate(o);
  RunOptions b = o;
  b.model.stacking = 3;
  CHECK_ERROR(validate(b), "--stacking must be 1, 2 or 4, got 3");
  b = o;
  b.train.optimizer = "sgd";
  CHECK_ERROR(validate(b), "--optimizer must be radam, adam or adamw");
  b = o;
  b.train.batch = 0;
  b.train.max_frames = 0;
  CHECK_ERROR(validate(b), "--batch and --max-frames are both 0");
  b = o;
  b.data.corpus.clear();
  CHECK_ERROR(validate(b), "give --corpus");
  b = o;
  b.train.wave.speed = Spread::parse("0.8:2.5", "--speed-perturb");
  CHECK_ERROR(validate(b), "--speed-perturb must keep to [0.5, 2]", "got 0.8:2.5");
  b = o;
  b.train.wave.noise_prob = 1.2;
  CHECK_ERROR(validate(b), "--noise-prob must be in [0, 1], got 1.2");
  b = o;
  CHECK_ERROR(settings_table(b).set("vtlp=0.9;1.1"), "--vtlp '0.9;1.1' is not a value");
  // The augmentation settings survive the checkpoint config as they were spelled.
  settings_table(b).set("speed-perturb=0.9,1.0,1.1 reverb-rt60=0.3:0.9 noise-snr=10");
  const std::map<std::string, std::string> c = to_config(b);
  CHECK(c.at("speed-perturb") == "0.9,1,1.1");
  CHECK(c.at("reverb-rt60") == "0.3:0.9");
  CHECK(c.at("noise-snr") == "10");
  CHECK(c.at("vtlp") == "1");
  RunOptions back = o;
  FlagTable t = settings_table(back);
  t.apply(c, {"speed-perturb", "reverb-rt60", "noise-snr"});
  CHECK(back.train.wave.speed.text() == "0.9,1,1.1");
  CHECK(back.train.wave.reverb_rt60.text() == "0.3:0.9");
  CHECK_ERROR(preset_options("gpu"), "unknown --preset 'gpu'");
  const RunOptions p = preset_options("paper");
  CHECK(p.model.layers == 9);
  CHECK(p.model.heads == 6);
  CHECK(p.model.feedforward == 768);
  CHECK(p.train.optimizer == "radam");
  CHECK(p.model.attention.clusters == 100);
  CHECK(p.model.attention.topk == 32);
  // The model options survive the checkpoint config.
  const ModelOptions m = model_from_config(to_config(p));
  CHECK(m.layers == 9);
  CHECK(m.stacking == 1);
  CHECK(m.attention.topk == 32);
}

// Writes the synthetic corpus that the ctest entries of the executable use (skipped unless
// CLUSTR_SPEECH_TEST_CORPUS names a folder).
TEST_CASE("speech app: write the synthetic corpus" * doctest::skip()) {
  const char* dir = std::getenv("CLUSTR_SPEECH_TEST_CORPUS");
  REQUIRE_MESSAGE(dir != nullptr, "set CLUSTR_SPEECH_TEST_CORPUS to the output folder");
  std::filesystem::remove_all(dir);
  write_tone_corpus(dir, 48, 8, /*bad=*/true);
}

TEST_CASE("speech app: a short bf16 run tracks the f32 run's losses and evaluates in either") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 48, 8, /*bad=*/false);
  RunOptions f = tiny_run(dir.file("corpus"), dir.file("fp32"));
  f.train.max_steps = 40;
  RunOptions b = f;
  b.model.precision = Precision::bf16;
  b.output.out = dir.file("bf16");
  TrainResult rf, rb;
  {
    Trainer t(f, nullptr);
    rf = t.run();
  }
  {
    Trainer t(b, nullptr);
    rb = t.run();
  }
  // The same weights and batches; the losses differ by the products' rounding only (each
  // product within 2u = 2^-7, averaging out over the sums behind the loss). The bound, 1% of
  // the f32 loss at every step (measured: at most 0.1%), allows for 40 steps of Adam carrying
  // the rounding of each step forward in the weights.
  REQUIRE(rb.losses.size() == rf.losses.size());
  REQUIRE(rb.losses.size() == 40);
  CHECK(rb.losses != rf.losses);
  for (size_t i = 0; i < rb.losses.size(); ++i) {
    INFO("step ", i, ": bf16 ", rb.losses[i], ", f32 ", rf.losses[i]);
    CHECK(std::fabs(rb.losses[i] - rf.losses[i]) <= 0.01 * rf.losses[i]);
  }
  CHECK(rb.last_loss < 0.7 * rb.first_loss);
  // The checkpoint says bf16 and evaluates in f32 too (its weights are f32), to within 0.2% of
  // its bf16 dev loss (measured 0.02%).
  LoadedModel m = load_trained_model(dir.file("bf16"), "--checkpoint");
  CHECK(m.options.precision == Precision::bf16);
  CHECK(m.model->precision() == Precision::bf16);
  const TokenTable tokens = read_tokens(dir.file("corpus/tokens.txt"));
  FeatureCache cache(dir.file("cache"));
  const SpeechSet dev = load_speech_set(dir.file("corpus/dev.tsv"), tokens, cache, 2, 0, nullptr);
  const Evaluation in_bf16 = evaluate_set(*m.model, dev, 4000, 1, 1);
  m.model->set_precision(Precision::fp32);
  const Evaluation in_f32 = evaluate_set(*m.model, dev, 4000, 1, 1);
  INFO("dev loss bf16 ", in_bf16.loss, ", f32 ", in_f32.loss);
  CHECK(std::fabs(in_f32.loss - in_bf16.loss) <= 0.002 * in_bf16.loss);
}

// A checkpoint that lacks a parameter is refused unless --non-strict (which lists it); the
// checkpoint stores its token table, and a tokens file in another order is refused (the
// model's outputs would be read as other phones), while no tokens file at all uses the
// checkpoint's own table.
TEST_CASE("speech app: checkpoints load strictly and carry their token table") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 16, 4, /*bad=*/false);
  RunOptions o = tiny_run(dir.file("corpus"), dir.file("run"));
  o.train.max_steps = 2;
  Trainer(o, nullptr).run();
  const std::string best = dir.file("run/best.safetensors");
  LoadedModel m = load_trained_model(best, "--checkpoint");
  const TokenTable file_tokens = read_tokens(dir.file("corpus/tokens.txt"));
  CHECK(m.tokens == file_tokens.tokens);

  // One parameter removed from the file.
  SafetensorsFile f = load_safetensors(best);
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const auto& [name, t] : f.tensors)
    if (name != "output.bias") kept.emplace_back(name, t);
  const std::string cut = dir.file("cut.safetensors");
  save_safetensors(cut, kept, f.metadata);
  CHECK_ERROR(load_trained_model(cut, "--checkpoint"), "output.bias");
  LoadedModel loose = load_trained_model(cut, "--checkpoint", Device::cpu, /*strict=*/false);
  CHECK(loose.missing == std::vector<std::string>{"output.bias"});

  // The token table: the same file passes, a reordered one is refused, none uses the table.
  const std::string ckpt = m.file;
  CHECK(model_tokens(m.tokens, m.model->classes(), dir.file("corpus/tokens.txt"), true, ckpt)
            .tokens == file_tokens.tokens);
  std::vector<std::string> swapped = file_tokens.tokens;
  std::swap(swapped[1], swapped[2]);
  {
    std::ofstream out(dir.file("swapped.txt"));
    for (const std::string& t : swapped) out << t << "\n";
  }
  const std::string differs = "token 1 is '" + swapped[1] + "' there and '" +
                              file_tokens.tokens[1] + "' in the checkpoint";
  CHECK_ERROR(model_tokens(m.tokens, m.model->classes(), dir.file("swapped.txt"), true, ckpt),
              "is not the token table", differs.c_str());
  CHECK(model_tokens(m.tokens, m.model->classes(), dir.file("none.txt"), false, ckpt).tokens ==
        file_tokens.tokens);
  // An old checkpoint (no table): only the count is checked.
  CHECK_ERROR(model_tokens({}, m.model->classes() + 1, dir.file("corpus/tokens.txt"), false, ckpt),
              "has ", "tokens but");
  // Resuming training with a reordered tokens file is refused too.
  RunOptions again = o;
  again.data.tokens = dir.file("swapped.txt");
  again.train.max_steps = 4;
  Trainer t(again, nullptr);
  CHECK_ERROR(t.resume(dir.file("run")), "is not the token table", differs.c_str());
}

// ---- SpecAugment (data/augment.h) ------------------------------------------------------------

namespace {

// A batch of `n` utterances of random features: lengths 40, 28, 16, ... positions, k M wide.
SpeechBatch random_batch(int n, int64_t bins, int k, uint32_t seed) {
  std::vector<SpeechExample> ex;
  for (int i = 0; i < n; ++i) {
    SpeechExample e;
    e.id = "u" + std::to_string(i);
    const int64_t T = 4 * (40 - 12 * (i % 3));  // whole groups of k = 1, 2, 4
    e.frames = T;
    e.features = stack_frames(test::random_tensor({T, bins}, seed + uint32_t(i)), k);
    e.labels = {1, 2};
    ex.push_back(std::move(e));
  }
  std::vector<size_t> idx(ex.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  return collate_speech(ex, idx);
}

}  // namespace

TEST_CASE("SpecAugment: identity at zero strength, seeded, and the same as masking before "
          "stacking") {
  const int64_t M = 40;
  SpecAugmentOptions o;
  o.freq_masks = 2;
  o.time_masks = 2;
  {  // zero widths, or no masks: nothing changes, nothing is drawn
    SpeechBatch b = random_batch(3, M, 1, 10);
    const std::vector<float> before = b.features.to_vector();
    SpecAugmentOptions zero = o;
    zero.freq_width = zero.time_width = 0;
    Generator gen(1);
    spec_augment(b, M, 1, zero, gen);
    CHECK(b.features.to_vector() == before);
    Generator idle(1);
    spec_augment(b, M, 1, SpecAugmentOptions{}, idle);
    CHECK(idle.offset() == 0);
  }
  SpeechBatch a = random_batch(3, M, 1, 10), b = random_batch(3, M, 1, 10);
  Generator g1(7), g2(7), g3(8);
  spec_augment(a, M, 1, o, g1);
  spec_augment(b, M, 1, o, g2);
  CHECK(a.features.to_vector() == b.features.to_vector());  // the same seed, the same masks
  SpeechBatch c = random_batch(3, M, 1, 10);
  spec_augment(c, M, 1, o, g3);
  CHECK(c.features.to_vector() != a.features.to_vector());
  CHECK(g1.offset() == 3 * 2 * (2 + 2));  // two draws per mask
  // Stacked by 4 with the same draws: the stacked form of the masked frames.
  SpeechBatch s = random_batch(3, M, 4, 10);
  Generator g4(7);
  spec_augment(s, M, 4, o, g4);
  const std::vector<float> av = a.features.to_vector(), sv = s.features.to_vector();
  for (int64_t u = 0; u < 3; ++u) {
    CAPTURE(u);
    const int64_t T = a.lengths.to_int_vector()[size_t(u)];
    const auto first = av.begin() + u * a.features.size(1) * M;
    const std::vector<float> frames(first, first + T * M);
    const std::vector<float> want = stack_frames(Tensor::from_vector(frames, {T, M}), 4).to_vector();
    const auto sfirst = sv.begin() + u * s.features.size(1) * 4 * M;
    CHECK(std::vector<float>(sfirst, sfirst + int64_t(want.size())) == want);
  }
}

TEST_CASE("SpecAugment: masks keep to their widths, bounds and padding") {
  const int64_t M = 40;
  SpecAugmentOptions o;
  o.freq_masks = 1;
  o.freq_width = 8;
  o.time_masks = 1;
  o.time_width = 30;
  o.max_time_ratio = 0.2;
  Generator gen(3);
  double band_sum = 0;
  int bands = 0;
  for (int trial = 0; trial < 200; ++trial) {
    SpeechBatch b = random_batch(3, M, 1, 100 + uint32_t(trial));
    spec_augment(b, M, 1, o, gen);
    const std::vector<int32_t> len = b.lengths.to_int_vector();
    for (int64_t u = 0; u < 3; ++u) {
      const int64_t Tmax = b.features.size(1);
      const float* x = b.features.f32() + u * Tmax * M;
      int zero_cols = 0, zero_rows = 0;
      for (int64_t f = 0; f < M; ++f) {
        bool all = true;
        for (int64_t t = 0; t < len[size_t(u)] && all; ++t) all = x[t * M + f] == 0.0f;
        zero_cols += all;
      }
      for (int64_t t = 0; t < len[size_t(u)]; ++t) {
        bool all = true;
        for (int64_t f = 0; f < M && all; ++f) all = x[t * M + f] == 0.0f;
        zero_rows += all;
      }
      bool padding_zero = true;  // padding stays zero, untouched
      for (int64_t t = len[size_t(u)]; t < Tmax; ++t)
        for (int64_t f = 0; f < M; ++f) padding_zero = padding_zero && x[t * M + f] == 0.0f;
      CHECK(padding_zero);
      CHECK(zero_cols <= 8);
      CHECK(zero_rows <= std::min<int64_t>(30, int64_t(0.2 * len[size_t(u)])));
      band_sum += zero_cols;
      ++bands;
    }
  }
  // A band's width is uniform in 0..8: its mean 4 (600 bands: the mean's sd is about 0.1).
  CHECK(band_sum / bands == doctest::Approx(4.0).epsilon(0.1));
  o.freq_width = 81;
  CHECK_ERROR(o.validate(), "--spec-freq-width must be in [0, 80] bins, got 81");
}

// With SpecAugment on, the masks come from the training stream: N steps, a checkpoint, then M
// more give the losses and weights of N + M steps, bit for bit; and the masks change the run.
TEST_CASE("speech app: SpecAugment runs resume exactly and differ from unaugmented runs") {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 32, 4, /*bad=*/false);
  RunOptions o = tiny_run(dir.file("corpus"), dir.file("whole"));
  o.train.max_steps = 8;
  o.train.spec.freq_masks = 2;
  o.train.spec.time_masks = 2;
  o.train.spec.time_width = 20;
  TrainResult all;
  {
    Trainer whole(o, nullptr);
    all = whole.run();
  }
  check_resumes_exactly(o, all, dir.file("split"), 3);
  RunOptions plain = o;
  plain.output.out = dir.file("plain");
  plain.train.spec = SpecAugmentOptions{};
  const TrainResult p = Trainer(plain, nullptr).run();
  CHECK(p.losses != all.losses);
}

// With waveform augmentation every epoch reads its utterances again, each augmented from its own
// stream: a run stopped inside an epoch and resumed gives the losses of the uninterrupted run
// bit for bit, in that epoch and the next; and the augmentation changes the run.
TEST_CASE("speech app: waveform-augmented runs resume exactly and differ from plain runs" *
          doctest::skip(!audio_compiled())) {
  TempDir dir;
  write_tone_corpus(dir.file("corpus"), 32, 4, /*bad=*/false);
  RunOptions o = tiny_run(dir.file("corpus"), dir.file("whole"));
  o.train.max_steps = 8;  // 4 batches an epoch: two epochs
  WaveAugmentOptions& w = o.train.wave;
  w.speed = Spread::parse("0.9,1,1.1", "--speed-perturb");
  w.vtlp = Spread::parse("0.9:1.1", "--vtlp");
  w.gain_db = 3;
  w.noise_prob = 0.5;
  w.reverb_prob = 0.5;
  TempDir logs;
  std::FILE* log = std::fopen(logs.file("log").c_str(), "w+");
  REQUIRE(log);
  TrainResult all;
  {
    Trainer whole(o, log);
    all = whole.run();
  }
  std::fflush(log);
  std::rewind(log);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), log));
  std::fclose(log);
  CHECK(text.find("epoch 1: 32 training utterances augmented") != std::string::npos);
  CHECK(text.find("epoch 2: 32 training utterances augmented") != std::string::npos);
  check_resumes_exactly(o, all, dir.file("split"), 3);
  RunOptions plain = o;
  plain.output.out = dir.file("plain");
  plain.train.wave = WaveAugmentOptions{};
  const TrainResult p = Trainer(plain, nullptr).run();
  CHECK(p.losses.size() == 8);
  CHECK(p.losses != all.losses);
}

// A LibriSpeech-style folder (FLAC files, a .trans.txt per chapter) imported with character
// labels trains: one tone per letter a..e, words of them.
TEST_CASE("speech app: trains on an imported LibriSpeech-style folder") {
  TempDir dir;
  const std::string ls = dir.file("libri/7/11");
  std::filesystem::create_directories(ls);
  std::mt19937 rng(3);
  std::ofstream trans(ls + "/7-11.trans.txt");
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> labels;
    std::string text;
    const int n = 3 + i % 3;
    for (int k = 0; k < n; ++k) {
      labels.push_back(1 + int32_t(rng() % 5));
      text += char('A' + labels.back() - 1);
      if (k == 0) text += ' ';  // two words: the first letter, then the rest
    }
    char id[32];
    std::snprintf(id, sizeof id, "7-11-%04d", i);
    write_audio(ls + "/" + id + ".flac", test::tone_utterance(labels, rng), 1, 16000, "flac16");
    trans << id << ' ' << text << '\n';
  }
  trans.close();
  std::vector<CorpusUtterance> all = import_librispeech(dir.file("libri"));
  probe_durations(all);
  REQUIRE(all.size() == 24);
  const std::vector<CorpusUtterance> train(all.begin(), all.begin() + 18), dev(all.begin() + 18,
                                                                               all.end());
  CHECK(write_manifest(train, LabelUnits::chars, nullptr, dir.file("data/train.tsv")).written == 18);
  CHECK(write_manifest(dev, LabelUnits::chars, nullptr, dir.file("data/dev.tsv")).written == 6);
  RunOptions o = tiny_run("", dir.file("run"));
  o.data.corpus.clear();
  o.data.train = dir.file("data/train.tsv");
  o.data.dev = dir.file("data/dev.tsv");
  o.train.max_steps = 4;
  Trainer t(o, nullptr);
  const TrainResult r = t.run();
  CHECK(r.steps == 4);
  CHECK(std::isfinite(r.last_loss));
  CHECK(t.model().classes() == 1 + 26 + 10 + 2);  // the blank, letters, digits, ' and |
}

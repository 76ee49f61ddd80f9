// The speech executable on the command line, on the synthetic corpus of tone utterances that
// test_speech_app's case "speech app: write the synthetic corpus" writes (ctest test
// speech_app_corpus, the fixture speech_corpus): a short run, evaluating, decoding and the
// matrix of its checkpoint, resuming, refused flags and folders, divergence, the emulated
// device. Each test case is one ctest test of the same name (tests/CMakeLists.txt:
// app_cli_test), whose fixtures order them. Ctrl-C and the folder lock:
// tests/app_signal_test.sh.
//
// A refused command checks for a status other than 0 (CLI11's own refusals end with its exit
// codes, the app's with 1).
#include "app_cli.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

using clustr::test::AppRun;
using clustr::test::cat;
using clustr::test::RunOptions;
using Args = std::vector<std::string>;

const std::string corpus = CLUSTR_APP_SPEECH_CORPUS;  // written by speech_app_corpus
const std::string speech_out = CLUSTR_APP_SPEECH_OUT;  // the runs' folders (in the build tree)

AppRun speech(const Args& args, const RunOptions& options = {}) {
  return clustr::test::run_app(cat({{CLUSTR_APP_SPEECH}, args}), options);
}

// A tiny model (60 steps take a few seconds).
const Args speech_tiny = {"--layers", "1", "--heads", "2", "--head-dim", "16", "--feedforward",
                          "64", "--dropout", "0", "--stacking", "2", "--clusters", "4",
                          "--topk", "8", "--batch", "8", "--threads", "2", "--log-interval",
                          "10", "--lr", "3e-3", "--warmup", "10", "--lr-schedule", "warmup",
                          "--no-plots"};

const RunOptions no_gpu = {{{"CLUSTR_CUDA_EMULATION_DEVICES", "0"}, {"CUDA_VISIBLE_DEVICES", ""}}};

}  // namespace

// 60 steps of a tiny model; the bad lines the corpus holds are counted; the configuration
// table ends with the build and the kernels that run.
TEST_CASE("speech_app_train") {
  const AppRun r = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--epochs", "100", "--max-steps", "60", "--out",
                                speech_out + "/full", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "speech configuration\n.*\nbuild\n  compiler .*GEMM micro-kernel +"
                          "[a-z0-9]+\n  bf16 GEMM kernel +[a-z0-9]+.*\n  threads +2\n");
  CHECK_OUTPUT_MATCHES(r, "skipped 3 \\(1 bad manifest lines, 1 unreadable audio, 1 too short.*"
                 "3 utterances left out [^\n]*all listed in [^\n]*full/skipped.txt.*"
                 "trained 60 steps");
  CHECK_STATUS(r, 0);
}

// The same with every waveform augmentation on, from the command line.
TEST_CASE("speech_app_train_augmented") {
  const AppRun r = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--epochs", "100", "--max-steps", "20", "--speed-perturb",
                                "0.9,1,1.1", "--vtlp", "0.9:1.1", "--gain-db", "6",
                                "--noise-prob", "0.5", "--noise-snr", "5:20", "--reverb-prob",
                                "0.5", "--reverb-rt60", "0.2:0.5", "--out",
                                speech_out + "/augmented", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "--speed-perturb +0.9,1,1.1.*--vtlp +0.9:1.1.*"
                 "epoch 1: [0-9]+ training utterances augmented.*trained 20 steps");
  CHECK_STATUS(r, 0);
}

TEST_CASE("speech_app_bad_speed") {
  CHECK_FAILS(speech({"train", "--corpus", corpus, "--speed-perturb", "0.3:1"}),
              "--speed-perturb must keep to [0.5, 2]");
}

// A switch given a number past 64 bits: CLI11 (2.1) reads it with std::stoll, whose exception
// parse_flags turns into an error naming the argument (it said only "stoll"; found by fuzzing).
TEST_CASE("speech_app_switch_value_out_of_range") {
  CHECK_FAILS(speech({"train", "--corpus", corpus, "--no-plots=99999999999999999999"}),
              "--no-plots 99999999999999999999: out of range");
}

TEST_CASE("speech_app_bad_vtlp") {
  CHECK_FAILS(speech({"train", "--corpus", corpus, "--vtlp", "1,x"}),
              "--vtlp '1,x' is not a value");
}

TEST_CASE("speech_app_evaluate") {
  const AppRun r = speech({"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--attention", "improved-clustered", "--beam",
                           "4"});
  CHECK_OUTPUT_MATCHES(
      r, "evaluated with improved-clustered.*PER greedy [0-9.]+  PER beam 4 [0-9.]+");
  CHECK_STATUS(r, 0);
}

TEST_CASE("speech_app_decode") {
  const AppRun r = speech({"decode", "--checkpoint", speech_out + "/full/best.safetensors",
                           "--manifest", corpus + "/dev.tsv"});
  CHECK_OUTPUT_MATCHES(r, "dev0\t.*PER [0-9.]+ \\([0-9]+ edits");
  CHECK_STATUS(r, 0);
}

// The matrix and its attention map, which a second run refuses to write over before it
// evaluates anything.
TEST_CASE("speech_app_matrix") {
  const std::string png = speech_out + "/attention.png";
  std::filesystem::remove(png);
  const Args matrix = {"matrix", "--checkpoints", speech_out + "/full", "--manifest",
                       corpus + "/dev.tsv", "--attention-map", png};
  const AppRun r = speech(matrix);
  CHECK_OUTPUT_MATCHES(r, "attention maps of dev0.*train \\\\ evaluate +full +shared-full +"
                 "lsh-1 +lsh-4 +clustered +improved-clustered +oracle-top\n"
                 "full +[0-9.]+ +- +- +- +[0-9.]+ +[0-9.]+ +[0-9.]+\n");
  CHECK_STATUS(r, 0);
  const AppRun again = speech(matrix);
  CHECK_OUTPUT_HAS(again, png + " exists: pass --overwrite to replace it");
  CHECK_MESSAGE(again.output.find("evaluate") == std::string::npos, again.output);
  CHECK_STATUS(again, 1);
}

// The clustered types at two cluster counts: a column for each type and count; a count below
// 1 is refused.
TEST_CASE("speech_app_matrix_cluster_counts") {
  const AppRun r = speech({"matrix", "--checkpoints", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--cluster-counts", "2", "5"});
  CHECK_OUTPUT_MATCHES(r, "evaluated with clustered \\(C=5,.*"
                 "train \\\\ evaluate +full +shared-full +lsh-1 +lsh-4 +clustered-2 +clustered-5 +"
                 "improved-clustered-2 +improved-clustered-5 +oracle-top\n"
                 "full +[0-9.]+ +- +- +- +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\n");
  CHECK_STATUS(r, 0);
  CHECK_FAILS(speech({"matrix", "--checkpoints", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--cluster-counts", "4", "0"}),
              "--cluster-counts: each count must be >= 1, got 0");
}

// A model trained with lsh attention (one projection for queries and keys): evaluated with
// every type in the matrix, beside the full-attention run, whose row has no shared-full and lsh
// cells; that run refuses lsh.
TEST_CASE("speech_app_lsh") {
  const AppRun t = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--attention", "lsh", "--rounds", "2", "--buckets", "4",
                                "--chunk", "8", "--epochs", "100", "--max-steps", "10", "--out",
                                speech_out + "/lsh", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(t, "attention +lsh \\(rounds=2, buckets=4, chunk=8\\).*trained 10 steps");
  CHECK_STATUS(t, 0);
  const AppRun m = speech({"matrix", "--checkpoints", speech_out + "/full", speech_out + "/lsh",
                           "--manifest", corpus + "/dev.tsv"});
  CHECK_OUTPUT_MATCHES(m, "\nfull +[0-9.]+ +- +- +- +[0-9.]+ +[0-9.]+ +[0-9.]+\n"
                          "lsh-2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\n");
  CHECK_STATUS(m, 0);
  // Its attention map has a fourth panel: the dense weights of its own lsh-2.
  std::filesystem::remove(speech_out + "/lsh_attention.png");
  const AppRun map = speech({"matrix", "--checkpoints", speech_out + "/lsh", "--manifest",
                             corpus + "/dev.tsv", "--attention-map",
                             speech_out + "/lsh_attention.png"});
  CHECK_OUTPUT_MATCHES(map, "attention maps of dev0 \\(layer 0, head 0; full \\| clustered \\| "
                            "improved-clustered \\| lsh-2\\): [^\n]*lsh_attention.png");
  CHECK_STATUS(map, 0);
  CHECK(std::filesystem::file_size(speech_out + "/lsh_attention.png") > 1000);
  CHECK_FAILS(speech({"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--attention", "lsh"}),
              "lsh attention needs a model whose queries and keys share one projection");
}

// Figure 1a's points: each checkpoint with its own attention, PER against forward time, in a CSV
// and a PNG; --reps outside [1, 100] is refused.
TEST_CASE("speech_app_tradeoff") {
  const std::string csv = speech_out + "/tradeoff.csv", png = speech_out + "/tradeoff.png";
  std::filesystem::remove(csv);
  std::filesystem::remove(png);
  const AppRun r = speech({"tradeoff", "--checkpoints", speech_out + "/full", speech_out + "/lsh",
                           "--manifest", corpus + "/dev.tsv", "--reps", "2", "--csv", csv,
                           "--png", png});
  CHECK_OUTPUT_MATCHES(r, "full/best.safetensors: 1 layers, full: PER [0-9.]+, forward [0-9.]+ s\n"
                          "[^\n]*\n[^\n]*lsh/best.safetensors: 1 layers, lsh \\(rounds=2, "
                          "buckets=4, chunk=8\\): PER [0-9.]+, forward [0-9.]+ s\n");
  CHECK_STATUS(r, 0);
  std::ifstream in(csv);
  std::string header, full, lsh;
  std::getline(in, header);
  std::getline(in, full);
  std::getline(in, lsh);
  CHECK(header == "checkpoint,series,attention,layers,per,forward_seconds");
  CHECK_MESSAGE(full.find(",full,\"full\",1,") != std::string::npos, full);
  CHECK_MESSAGE(lsh.find(",lsh-2,\"lsh (rounds=2, buckets=4, chunk=8)\",1,") != std::string::npos,
                lsh);
  CHECK(std::filesystem::file_size(png) > 1000);
  CHECK_FAILS_WITH(speech({"tradeoff", "--checkpoints", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--png", png}),
                   png + " exists: pass --overwrite to replace it");
  CHECK_FAILS(speech({"tradeoff", "--checkpoints", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--reps", "0"}),
              "--reps must be in [1, 100], got 0");
}

// With --cluster-counts a clustered checkpoint gives a point per count, the others their one
// point; a count below 1 is refused.
TEST_CASE("speech_app_tradeoff_cluster_counts") {
  const AppRun t = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--attention", "clustered", "--epochs", "100", "--max-steps", "5",
                                "--out", speech_out + "/clustered", "--overwrite"}}));
  CHECK_STATUS(t, 0);
  const AppRun r = speech({"tradeoff", "--checkpoints", speech_out + "/full",
                           speech_out + "/clustered", "--manifest", corpus + "/dev.tsv",
                           "--reps", "1", "--cluster-counts", "2", "3"});
  CHECK_OUTPUT_MATCHES(r, "full/best.safetensors: 1 layers, full: PER [0-9.]+, forward [0-9.]+ s\n"
                          "[^\n]*\n[^\n]*clustered/best.safetensors: 1 layers, clustered \\(C=2,"
                          "[^\n]*\n[^\n]*clustered/best.safetensors: 1 layers, clustered \\(C=3,");
  CHECK_STATUS(r, 0);
  CHECK_FAILS(speech({"tradeoff", "--checkpoints", speech_out + "/clustered", "--manifest",
                      corpus + "/dev.tsv", "--cluster-counts", "0"}),
              "--cluster-counts: each count must be >= 1, got 0");
}

// Resuming takes the model's shape and the attention settings from the checkpoint (none of
// the tiny model's flags is repeated); a model flag that contradicts it is refused.
TEST_CASE("speech_app_resume") {
  const AppRun r = speech({"train", "--corpus", corpus, "--resume", speech_out + "/full",
                           "--dropout", "0", "--batch", "8", "--threads", "2", "--log-interval",
                           "10", "--lr", "3e-3", "--warmup", "10", "--lr-schedule", "warmup",
                           "--no-plots", "--epochs", "100", "--max-steps", "70", "--out",
                           speech_out + "/resumed"});
  CHECK_OUTPUT_MATCHES(r, "resumed from .* at step 60.*trained 70 steps");
  CHECK_STATUS(r, 0);
}

TEST_CASE("speech_app_resume_other_model") {
  const AppRun r = speech({"train", "--corpus", corpus, "--resume", speech_out + "/full",
                           "--layers", "2", "--out", speech_out + "/resumed_wrong"});
  CHECK_OUTPUT_MATCHES(r, "other settings.*--layers: checkpoint 1, now 2");
  CHECK_RUN(r, r.status != 0);
}

// A new run refuses the folder of an earlier one; --clip 0 trains without clipping.
TEST_CASE("speech_app_refuses_earlier_run") {
  const AppRun r = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--max-steps", "2", "--out", speech_out + "/full"}}));
  CHECK_OUTPUT_MATCHES(
      r, "--out [^\n]*full already holds files \\(best.safetensors.*--resume.*--overwrite");
  CHECK_RUN(r, r.status != 0);
}

TEST_CASE("speech_app_clip_zero") {
  const AppRun r = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--clip", "0", "--epochs", "1", "--max-steps", "3", "--out",
                                speech_out + "/clip0", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "--clip +0\n.*trained 3 steps");
  CHECK_STATUS(r, 0);
}

// Divergence without clipping: every step skipped, the run stops after --max-skipped-steps in
// a row and writes no checkpoint.
TEST_CASE("speech_app_diverges") {
  const AppRun r = speech({"train", "--corpus", corpus, "--layers", "1", "--heads", "2",
                           "--head-dim", "16", "--feedforward", "64", "--dropout", "0",
                           "--stacking", "2", "--clusters", "4", "--topk", "8", "--batch", "8",
                           "--threads", "2", "--no-plots", "--lr", "1e30", "--clip", "0",
                           "--warmup", "0", "--lr-schedule", "constant", "--max-skipped-steps",
                           "3", "--out", speech_out + "/diverges", "--overwrite"});
  CHECK_OUTPUT_MATCHES(
      r, "training stopped: 3 steps in a row had a non-finite (loss|gradient norm).*"
         "no checkpoint was written");
  CHECK_RUN(r, r.status != 0);
}

TEST_CASE("speech_app_evaluate_bf16") {
  const AppRun r = speech({"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--precision", "bf16"});
  CHECK_OUTPUT_MATCHES(r, "trained with [^\n]* in fp32.*evaluated with [^\n]* in bf16 on");
  CHECK_STATUS(r, 0);
}

TEST_CASE("speech_app_bad_precision") {
  CHECK_FAILS(speech({"train", "--corpus", "x", "--precision", "fp16"}),
              "unknown precision 'fp16'");
}

TEST_CASE("speech_app_no_command") {
  CHECK_FAILS(speech({}), "A subcommand is required");
}

// evaluate and decode take the attention's settings from the checkpoint unless given: their
// help must not show the library's defaults (100 clusters, full attention) as if they applied.
TEST_CASE("speech_app_eval_help") {
  for (const char* command : {"evaluate", "decode"}) {
    const AppRun r = speech({command, "--help"});
    INFO(r.command, "\n", r.output);
    REQUIRE(r.status == 0);
    CHECK(r.output.find("--clusters INT=") == std::string::npos);
    CHECK(r.output.find("--attention TEXT=") == std::string::npos);
    CHECK(r.output.find("clusters C (clustered types) (default: the model's)") !=
          std::string::npos);
  }
}

TEST_CASE("speech_app_bad_stacking") {
  CHECK_FAILS(speech({"train", "--corpus", "x", "--stacking", "3"}),
              "--stacking must be 1, 2 or 4, got 3");
}

TEST_CASE("speech_app_bad_attention") {
  CHECK_FAILS(speech({"train", "--corpus", "x", "--attention", "linear"}),
              "unknown attention type 'linear'");
}

TEST_CASE("speech_app_no_corpus") {
  CHECK_FAILS(speech({"train"}), "give --corpus, or both --train-manifest and --dev-manifest");
}

TEST_CASE("speech_app_missing_corpus") {
  const AppRun r = speech({"train", "--corpus", speech_out + "/nowhere"});
  CHECK_OUTPUT_MATCHES(r, "speech: error: read_tokens: cannot open .*nowhere/tokens.txt");
  CHECK_RUN(r, r.status != 0);
}

TEST_CASE("speech_app_import_bad_format") {
  CHECK_FAILS(speech({"import", "--format", "timit", "--in", "x", "--out", "y.tsv"}),
              "--format must be librispeech, kaldi or nemo, got 'timit'");
}

TEST_CASE("speech_app_import_missing") {
  const AppRun r = speech({"import", "--format", "kaldi", "--in", speech_out + "/nowhere",
                           "--out", speech_out + "/imported.tsv"});
  CHECK_OUTPUT_MATCHES(r, "import kaldi: cannot open [^\n]*nowhere/wav.scp: does not exist");
  CHECK_RUN(r, r.status != 0);
}

// Word pieces end to end: NeMo manifests of the corpus's audio with words as transcripts, the
// training split imported with pieces learnt from it (never over an existing model), the dev
// split encoded with them, a short run, and the word error rate of evaluate.
TEST_CASE("speech_app_import_pieces") {
  const std::string dir = speech_out + "/pieces";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<std::string> words = {"bad", "dab", "a", "bed", "dead", "bead", "cab", "ace"};
  for (const char* split : {"train", "dev"}) {
    std::ofstream out(dir + "/" + split + ".json");
    for (int i = 0; i < (split[0] == 't' ? 30 : 6); ++i)
      out << "{\"audio_filepath\": \"" << corpus << "/wav/" << split << i
          << ".wav\", \"text\": \"" << words[size_t(i % 8)] << " " << words[size_t(i * 3 % 8)]
          << "\"}\n";
  }
  const Args train = {"import", "--format", "nemo", "--in", dir + "/train.json", "--out",
                      dir + "/data/train.tsv", "--units", "pieces"};
  const Args dev = {"import", "--format", "nemo", "--in", dir + "/dev.json", "--out",
                    dir + "/data/dev.tsv", "--units", "pieces"};
  const AppRun missing = speech(dev);
  CHECK_OUTPUT_MATCHES(missing, "no word-piece model at [^\n]*pieces/data/pieces.model: learn "
                                "one from the training split first \\(--vocab-size N\\)");
  CHECK_STATUS(missing, 1);
  const AppRun learnt = speech(cat({train, {"--vocab-size", "10"}}));
  CHECK_OUTPUT_MATCHES(learnt, "word pieces: learnt 10 from 30 transcripts, saved to "
                               "[^\n]*data/pieces.model.*wrote [^\n]*train.tsv \\(30 "
                               "utterances");
  CHECK_STATUS(learnt, 0);
  const AppRun again = speech(cat({train, {"--vocab-size", "12", "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(again, "pieces.model exists already; to encode with it leave out "
                              "--vocab-size");
  CHECK_STATUS(again, 1);
  const AppRun encoded = speech(dev);
  CHECK_OUTPUT_MATCHES(encoded, "word pieces: [^\n]*pieces.model \\(9 pieces\\).*wrote "
                                "[^\n]*dev.tsv \\(6 utterances");
  CHECK_STATUS(encoded, 0);
  const AppRun run = speech(cat({{"train", "--train-manifest", dir + "/data/train.tsv",
                                  "--dev-manifest", dir + "/data/dev.tsv"},
                                 speech_tiny,
                                 {"--epochs", "2", "--out", dir + "/run", "--overwrite"}}));
  CHECK_STATUS(run, 0);
  const AppRun e = speech({"evaluate", "--checkpoint", dir + "/run", "--manifest",
                           dir + "/data/dev.tsv"});
  CHECK_OUTPUT_MATCHES(e, "6 utterances, [0-9]+ labels.*PER greedy [0-9.]+.*\nWER [0-9.]+ "
                          "\\([0-9]+ edits / 12 words\\)");
  CHECK_STATUS(e, 0);
  CHECK_FAILS(speech({"import", "--format", "nemo", "--in", "x", "--out", "y.tsv",
                      "--vocab-size", "10"}),
              "--vocab-size and --piece-model are for --units pieces");
}

// What an import writes is never put over what is there: an existing manifest needs
// --overwrite, a folder's tokens.txt is kept and must hold the same table, and the list of the
// utterances left out goes with its manifest (removed when nothing is left out).
TEST_CASE("speech_app_import_overwrite") {
  const std::string dir = speech_out + "/import_overwrite";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto nemo = [&](const std::string& name, const std::string& second_text) {
    std::ofstream out(dir + "/" + name);
    out << "{\"audio_filepath\": \"" << corpus << "/wav/train0.wav\", \"text\": \"a bed\"}\n"
        << "{\"audio_filepath\": \"" << corpus << "/wav/train1.wav\", \"text\": \""
        << second_text << "\"}\n";
  };
  nemo("bad.json", "caf\u00e9");  // a character the letters do not cover
  nemo("good.json", "a cab");
  const std::string manifest = dir + "/data/train.tsv";
  auto import = [&](const std::string& json, const Args& more) {
    return speech(cat({{"import", "--format", "nemo", "--in", dir + "/" + json, "--out",
                        manifest, "--units", "chars"},
                       more}));
  };
  const AppRun first = import("bad.json", {});
  CHECK_OUTPUT_MATCHES(first, "1 utterances left out, all listed in [^\n]*train.tsv.skipped.txt");
  CHECK_STATUS(first, 0);
  CHECK(std::filesystem::exists(manifest + ".skipped.txt"));
  CHECK_FAILS_WITH(import("good.json", {}), manifest + " exists: pass --overwrite to replace it");
  CHECK(std::filesystem::exists(manifest + ".skipped.txt"));
  CHECK_STATUS(import("good.json", {"--overwrite"}), 0);
  CHECK(!std::filesystem::exists(manifest + ".skipped.txt"));
  std::filesystem::create_directories(dir + "/other");
  std::ofstream(dir + "/other/tokens.txt") << "<blank>\nA\nB\n";
  CHECK_FAILS_WITH(speech({"import", "--format", "nemo", "--in", dir + "/good.json", "--out",
                           dir + "/other/train.tsv", "--units", "chars"}),
                   "import: " + dir + "/other/tokens.txt holds another token table (3 tokens "
                   "against this import's 39; line 2: 'A' where this import has 'a'): the "
                   "manifests beside it use it; write this import to another folder, or "
                   "delete that tokens.txt if no manifest there needs it");
  CHECK(!std::filesystem::exists(dir + "/other/train.tsv"));
  CHECK_FAILS_WITH(speech({"import", "--format", "nemo", "--in", dir + "/good.json", "--out",
                           dir + "/data"}),
                   "--out " + dir + "/data: is a folder; expected the file to write");
}

// A label language model counted from the training manifest, fused into the beam search.
TEST_CASE("speech_app_lm") {
  const std::string lm = speech_out + "/lm.json";
  const AppRun built = speech({"lm", "--manifest", corpus + "/train.tsv", "--order", "3",
                               "--dev", corpus + "/dev.tsv", "--out", lm, "--overwrite"});
  CHECK_OUTPUT_MATCHES(built, "train.tsv: [0-9]+ sequences, [0-9]+ labels; order 3.*"
                       "perplexity per label: [0-9.]+ on the training text, [0-9.]+ on [^\n]*"
                       "dev.tsv.*wrote [^\n]*lm.json");
  CHECK_STATUS(built, 0);
  CHECK_FAILS(speech({"lm", "--manifest", corpus + "/train.tsv", "--out", lm}),
              "lm.json exists: pass --overwrite to replace it");
  CHECK_FAILS(speech({"lm", "--manifest", corpus + "/train.tsv", "--out", lm, "--overwrite",
                      "--order", "9"}),
              "--order must be in [1, 8], got 9");
  // The message names the file asked for, not only the temporary one written first.
  CHECK_FAILS(speech({"lm", "--manifest", corpus + "/train.tsv", "--out",
                      speech_out + "/no_folder/lm.json"}),
              "--out " + speech_out + "/no_folder/lm.json: the folder " + speech_out +
                  "/no_folder does not exist");

  const Args eval = {"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                     corpus + "/dev.tsv", "--beam", "4", "--lm", lm};
  const AppRun r = speech(cat({eval, {"--lm-weight", "0", "0.5", "--lm-bonus", "0", "1"}}));
  CHECK_OUTPUT_MATCHES(r, "PER beam 4 [0-9.]+.*"
                       "PER beam 4 \\+ language model [^\n]*lm.json \\(order 3, weight 0, bonus "
                       "0\\) [0-9.]+\n.*weight 0, bonus 1\\).*weight 0.5, bonus 0\\).*"
                       "weight 0.5, bonus 1\\) [0-9.]+\n");
  CHECK_STATUS(r, 0);
  // Weight and bonus 0 is the plain beam search.
  std::smatch plain, zero;
  CHECK(std::regex_search(r.output, plain, std::regex("PER beam 4 ([0-9.]+)")));
  CHECK(std::regex_search(r.output, zero, std::regex("weight 0, bonus 0\\) ([0-9.]+)")));
  CHECK(plain[1].str() == zero[1].str());

  CHECK_FAILS(speech({"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--lm", lm}),
              "--lm is used by the beam search: it needs --beam >= 2, got --beam 1");
  CHECK_FAILS(speech(cat({eval, {"--lm-weight", "-1"}})), "--lm-weight must be finite and >= 0");
  CHECK_FAILS(speech({"decode", "--checkpoint", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--beam", "4", "--lm", lm, "--lm-weight", "0.1",
                      "0.2"}),
              "decode takes one --lm-weight and one --lm-bonus, got 2 and 1");
  CHECK_FAILS(speech({"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                      corpus + "/dev.tsv", "--beam", "4", "--lm-weight", "0.1"}),
              "--lm-weight and --lm-bonus need --lm");
  CHECK_FAILS(speech(cat({{"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--beam", "4", "--lm", speech_out}})),
              "--lm: cannot open " + speech_out + ": is a folder, not a file");
  const std::string other = speech_out + "/lm_other.json";
  std::ofstream(other) << R"({"format": "clustr-ngram-lm", "version": 1, "order": 1, )"
                          R"("tokens": ["<blank>", "zz"], "counts": [[1, 1]]})";
  CHECK_FAILS(speech(cat({{"evaluate", "--checkpoint", speech_out + "/full", "--manifest",
                           corpus + "/dev.tsv", "--beam", "4", "--lm", other}})),
              "counted over another token table: its token 1 is 'zz'");
}

TEST_CASE("speech_app_bad_beam") {
  CHECK_FAILS(speech({"evaluate", "--checkpoint", "x", "--manifest", "y", "--beam", "0"}),
              "--beam must be in [1, 256], got 0");
}

TEST_CASE("speech_app_huge_beam") {
  CHECK_FAILS(speech({"evaluate", "--checkpoint", "x", "--manifest", "y", "--beam",
                      "100000"}),
              "--beam must be in [1, 256], got 100000");
}

TEST_CASE("speech_app_negative_seed") {
  CHECK_FAILS(speech({"train", "--corpus", "x", "--seed", "-1"}),
              "--seed -1: expected a whole number from 0");
}

TEST_CASE("speech_app_missing_checkpoint") {
  CHECK_FAILS(speech({"evaluate", "--checkpoint", speech_out + "/nowhere", "--manifest",
                      "y"}),
              "no such checkpoint file or folder");
}

// --device cuda without a usable GPU (hidden as for copy_task_cuda): refused before any data
// is read (the corpus does not exist).
TEST_CASE("speech_app_cuda_train") {
  const AppRun r = speech({"train", "--corpus", speech_out + "/nowhere", "--device", "cuda"},
                          no_gpu);
  CHECK_OUTPUT_MATCHES(
      r, "--device cuda: (clustr was built without the CUDA backend|no usable GPU)");
  CHECK_RUN(r, r.status != 0);
}

TEST_CASE("speech_app_cuda_evaluate") {
  const AppRun r = speech({"evaluate", "--checkpoint", "x", "--manifest", "y", "--device",
                           "cuda"},
                          no_gpu);
  CHECK_OUTPUT_MATCHES(
      r, "--device cuda: (clustr was built without the CUDA backend|no usable GPU)");
  CHECK_RUN(r, r.status != 0);
}

#ifdef CLUSTR_APP_CLI_CUDA_EMULATION
// The app on the emulated device: a few steps, then evaluate (with beam search on host copies
// of the logits) and decode on the device.
TEST_CASE("speech_app_cuda_run") {
  const AppRun r = speech(cat({{"train", "--corpus", corpus}, speech_tiny,
                               {"--attention", "full", "--epochs", "1", "--max-steps", "3",
                                "--device", "cuda", "--out", speech_out + "/cuda",
                                "--overwrite"}}));
  CHECK_OUTPUT_MATCHES(r, "--device +cuda.*trained 3 steps");
  CHECK_STATUS(r, 0);
}

TEST_CASE("speech_app_cuda_evaluate_run") {
  const AppRun r = speech({"evaluate", "--checkpoint", speech_out + "/cuda", "--device", "cuda",
                           "--manifest", corpus + "/dev.tsv", "--beam", "4"});
  CHECK_OUTPUT_MATCHES(r, "PER greedy [0-9.]+  PER beam 4 [0-9.]+");
  CHECK_STATUS(r, 0);
}
#endif

// Text with a BERT-family encoder: a pretrained model (all-MiniLM-L6-v2, which
// data/prepare_pretrained.py prepares) read from its folder and run with any attention type,
// so that a model trained with full attention can be run with clustered attention without
// retraining (the paper's sec. 4.3, Table 4).
//
//   text embed "A sentence." "Another one." [--file FILE] [--model DIR] [--attention TYPE]
//              [--out FILE.safetensors]
//       sentence embeddings as sentence-transformers computes them (mean pooling, L2
//       normalisation); prints their cosine similarities (up to 12 sentences), and with
//       --compare-with TYPE the cosine between each sentence's embedding under --attention and
//       under TYPE; --out writes them (S, D) with the sentences in its metadata.
//   text tasks --out DIR        the two WordNet tasks (word in context; spans in long contexts)
//                               as JSON lines, DIR/wic/ and DIR/span/, with DIR/STATS.md
//   text finetune --task wic|span --data DIR [--out RUN] [--resume RUN]
//                               fine-tunes the pretrained model (full attention by default)
//   text evaluate --checkpoint RUN [--split test] [--attention TYPE]
//   text pretrain [--corpus PATH...] [--out RUN]
//                               a masked language model learnt from text (a SentencePiece
//                               vocabulary learnt first); RUN is then a model folder for --model
//   text table4 [--out DIR] [--quick]
//                               the paper's Table 4 in one command (apps/text/experiment.h)
//   text matrix --checkpoint RUN [--split test]
//                               the fine-tuned model under full, clustered, improved-clustered
//                               and oracle-top attention, without retraining (Table 4's layout)
//
// Every command takes --device cpu|cuda (the model is read on the CPU, then moved), --precision
// fp32|bf16 (the matrix products' precision) and --threads. The pieces live in apps/text/.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flag_table.h"
#include "apps/common/flags.h"
#include "apps/common/metrics_file.h"
#include "apps/common/run_folder.h"
#include "apps/common/settings.h"
#include "apps/common/training.h"
#include "apps/text/experiment.h"
#include "apps/text/finetune.h"
#include "apps/text/pretrain.h"
#include "apps/text/pretrained.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace {

using namespace clustr;
using namespace clustr::text;

struct EmbedOptions {
  std::string model = default_pretrained_dir();
  std::vector<std::string> sentences;
  std::string file;
  std::string compare_with;
  std::string out;
  bool overwrite = false;
  int64_t batch = 32;
  int repeat = 1;
  std::string precision = "fp32";
  AttentionConfig attention;
  MachineOptions machine;
};

// The lines of `path` ("-": standard input), each a sentence; empty lines are kept (an empty
// sentence is [CLS] [SEP]) except a last one left by the final newline.
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    CLUSTR_CHECK(file, "--file: cannot open ", path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  CLUSTR_CHECK(!in.bad(), "--file: reading ", path, " failed");
  return lines;
}

int embed_command(EmbedOptions& o, FlagTable& table) {
  table.validate();
  const size_t from_arguments = o.sentences.size();
  if (!o.file.empty()) {
    const std::vector<std::string> lines = read_lines(o.file);
    o.sentences.insert(o.sentences.end(), lines.begin(), lines.end());
  }
  // Where sentence s (from 0) came from, for error messages.
  const auto source = [&](size_t s) {
    return s < from_arguments ? detail::cat("argument ", s + 1)
                              : detail::cat(o.file, " line ", s - from_arguments + 1);
  };
  CLUSTR_CHECK(!o.sentences.empty(), "embed: no sentences (give them as arguments or --file)");
  CLUSTR_CHECK(o.batch >= 1, "--batch must be >= 1, got ", o.batch);
  CLUSTR_CHECK(o.repeat >= 1, "--repeat must be >= 1, got ", o.repeat);
  if (!o.out.empty()) check_output_file("--out", o.out, o.overwrite, /*folder_must_exist=*/true);
  const Precision precision = parse_precision(o.precision);
  o.attention.validate();
  AttentionConfig other = o.attention;
  if (!o.compare_with.empty()) {
    other.type = parse_attention_type(o.compare_with);
    other.validate();
  }
  const Device device = prepare_machine(o.machine);

  Generator gen(1);
  PretrainedModel m = load_pretrained(o.model, o.attention, gen);
  m.model->to(device);
  const BertConfig& c = m.model->config();
  std::printf("model %s: %lld layers, D %lld, %lld heads, %lld parameters, vocabulary %d, "
              "max length %lld%s\n",
              o.model.c_str(), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.heads),
              static_cast<long long>(m.model->parameter_count()), m.tokenizer->size(),
              static_cast<long long>(m.max_length), m.normalize ? ", normalised" : "");
  std::printf("attention %s, device %s, products %s, %zu sentences\n",
              attention_type_name(o.attention.type), o.machine.device.c_str(),
              to_string(precision), o.sentences.size());

  // --repeat: the same sentences again, each pass timed; the fastest pass is reported.
  Tensor e;
  double seconds = 0;
  for (int r = 0; r < o.repeat; ++r) {
    const auto t0 = Clock::now();
    e = embed(m, o.sentences, o.batch, precision, gen, source);
    synchronize_device(device);
    const double t = seconds_since(t0);
    seconds = r == 0 ? t : std::min(seconds, t);
  }
  const int64_t S = e.size(0), D = e.size(1);
  const std::vector<float> v = e.to_vector();
  std::printf("embedded in %.4f s (%.1f sentences/s%s)\n", seconds, double(S) / seconds,
              o.repeat > 1 ? ", the fastest of --repeat passes" : "");
  if (S <= 12) {
    std::printf("cosine similarity:\n");
    for (int64_t a = 0; a < S; ++a) {
      std::printf("  [%2lld]", static_cast<long long>(a));
      for (int64_t b = 0; b < S; ++b) std::printf(" %6.3f", cosine(&v[a * D], &v[b * D], D));
      const std::string& s = o.sentences[a];
      std::printf("  %s\n", s.size() > 60 ? (s.substr(0, 57) + "...").c_str() : s.c_str());
    }
  }
  if (!o.compare_with.empty()) {
    m.model->set_attention(other);
    const Tensor f = embed(m, o.sentences, o.batch, precision, gen, source);
    const std::vector<float> w = f.to_vector();
    double sum = 0, lowest = 2;
    for (int64_t s = 0; s < S; ++s) {
      const double cs = cosine(&v[s * D], &w[s * D], D);
      sum += cs;
      lowest = std::min(lowest, cs);
    }
    std::printf("%s against %s: mean cosine %.4f, lowest %.4f over %lld sentences\n",
                attention_type_name(other.type), attention_type_name(o.attention.type),
                sum / double(S), lowest, static_cast<long long>(S));
  }
  if (!o.out.empty()) {
    std::map<std::string, std::string> meta = {{"model", o.model},
                                               {"attention", attention_type_name(o.attention.type)},
                                               {"sentences", std::to_string(S)}};
    for (int64_t s = 0; s < S; ++s) meta["sentence." + std::to_string(s)] = o.sentences[s];
    save_safetensors(o.out, {{"embeddings", e}}, meta);
    std::printf("wrote %s: embeddings (%lld, %lld)\n", o.out.c_str(), static_cast<long long>(S),
                static_cast<long long>(D));
  }
  return 0;
}

// ---- tasks -----------------------------------------------------------------------------------

// ---- evaluate and matrix ------------------------------------------------------------------------

struct EvaluateOptions {
  std::string checkpoint, model, data, split = "test", precision = "fp32";
  int64_t batch = 32;
  int64_t max_examples = 0;
  AttentionConfig attention;
  MachineOptions machine;
};

// The score line of one evaluation: the task's metrics.
std::string score_text(Task task, const Score& s) {
  if (task == Task::wic)
    return detail::cat("accuracy ", exact_text(float(s.accuracy)), ", loss ",
                       exact_text(float(s.loss)));
  char buf[160];
  std::snprintf(buf, sizeof buf, "F1 %.4f, exact match %.4f, loss %.4f", s.f1, s.exact_match,
                s.loss);
  return buf;
}

int evaluate_command(EvaluateOptions& o, bool matrix) {
  const Device device = prepare_machine(o.machine);
  const Precision precision = parse_precision(o.precision);
  AttentionConfig given = o.attention;
  FinetunedModel f = load_finetuned(o.checkpoint, o.model, AttentionConfig{});
  f.model->to(device);
  const std::string data = o.data.empty() ? f.data : o.data;
  EncodedSet set = load_split(f.task, data, o.split, *f.tokenizer, f.max_length);
  if (o.max_examples > 0 && static_cast<int64_t>(set.examples.size()) > o.max_examples)
    set.examples.resize(o.max_examples);
  std::printf("checkpoint %s: task %s, %zu %s examples of %s (dropped %lld)\n",
              f.checkpoint.c_str(), task_name(f.task), set.examples.size(), o.split.c_str(),
              data.c_str(), static_cast<long long>(set.dropped_too_long + set.dropped_unaligned));
  const std::vector<AttentionConfig> types =
      matrix ? table4_attentions(given) : std::vector<AttentionConfig>{given};
  std::printf("%-24s %s\n", "attention", "score");
  for (const AttentionConfig& a : types) {
    a.validate();
    f.model->bert().set_attention(a);
    const Score s = evaluate_task(*f.model, set.examples, *f.tokenizer, o.batch, precision);
    std::printf("%-24s %s  (%.1f s)\n", attention_label(a).c_str(), score_text(f.task, s).c_str(),
                s.seconds);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr text: a pretrained BERT-family encoder (all-MiniLM-L6-v2) run with full, "
               "clustered or improved-clustered attention (Vyas et al. 2020, sec. 4.3)"};
  app.require_subcommand(1);

  EmbedOptions e;
  e.attention.clusters = 25;  // the paper's Table 4
  FlagTable embed_table;
  add_attention_settings(embed_table, e.attention);
  add_machine_settings(embed_table, e.machine);
  CLI::App* embed = app.add_subcommand("embed", "sentence embeddings of the pretrained model, "
                                                "and their cosine similarities");
  embed->add_option("sentences", e.sentences, "the sentences");
  embed->add_option("--file", e.file, "a file of sentences, one per line (- reads standard input)");
  embed->add_option("--model", e.model, "the pretrained model's folder")->capture_default_str();
  embed->add_option("--batch", e.batch, "sentences per forward pass")->capture_default_str();
  embed->add_option("--repeat", e.repeat, "embed the sentences this many times and report the "
                    "fastest pass (a timing)")->capture_default_str();
  embed->add_option("--precision", e.precision, "fp32 | bf16: the matrix products' precision")
      ->capture_default_str();
  embed->add_option("--compare-with", e.compare_with,
                    "an attention type: also embed with it and print the cosine between each "
                    "sentence's two embeddings");
  embed->add_option("--out", e.out, "write the embeddings to this safetensors file");
  embed->add_flag("--overwrite", e.overwrite, "let --out replace an existing file");
  embed_table.add_to(*embed, {"cuda-graphs"});

  TasksOptions t;
  t.model = default_pretrained_dir();
  CLI::App* tasks = app.add_subcommand("tasks", "build the two WordNet tasks into a folder");
  tasks->add_option("--out", t.out, "the folder (wic/ and span/ with train, dev and test "
                    "JSON lines, and STATS.md)")->required();
  tasks->add_option("--wordnet", t.wordnet, "WordNet's data folder (Debian's wordnet-base)")
      ->capture_default_str();
  tasks->add_option("--model", t.model, "the pretrained model's folder (its tokenizer measures "
                    "the contexts)")->capture_default_str();
  tasks->add_option("--seed", t.seed, "the tasks' seed")->capture_default_str();
  tasks->add_option("--span-pieces", t.span_pieces, "span task: the contexts' length in word "
                    "pieces")->capture_default_str();
  tasks->add_option("--span-examples", t.span_examples, "span task: at most this many train, "
                    "dev and test examples")->expected(3);
  tasks->add_flag("--overwrite", t.overwrite, "replace the task files in --out");

  FinetuneOptions f;
  f.model = default_pretrained_dir();
  f.attention.clusters = 25;
  FlagTable finetune_table;
  add_attention_settings(finetune_table, f.attention);
  add_machine_settings(finetune_table, f.machine);
  std::string task = "wic";
  CLI::App* finetune_cmd = app.add_subcommand("finetune", "fine-tune the pretrained model on a "
                                                          "task");
  finetune_cmd->add_option("--task", task, "wic | span")->capture_default_str();
  finetune_cmd->add_option("--data", f.data, "the task folder (`text tasks`)")->required();
  finetune_cmd->add_option("--model", f.model, "the pretrained model's folder")
      ->capture_default_str();
  finetune_cmd->add_option("--out", f.out, "the run folder (default: the first free one of "
                           "runs/text-<task>, -2, ...)");
  finetune_cmd->add_flag("--overwrite", f.overwrite, "let a new run replace the run in --out");
  finetune_cmd->add_option("--resume", f.resume, "continue the run in this folder exactly");
  finetune_cmd->add_option("--epochs", f.epochs)->capture_default_str();
  finetune_cmd->add_option("--batch", f.batch)->capture_default_str();
  finetune_cmd->add_option("--lr", f.lr, "AdamW's peak learning rate")->capture_default_str();
  finetune_cmd->add_option("--weight-decay", f.weight_decay)->capture_default_str();
  finetune_cmd->add_option("--warmup", f.warmup, "fraction of the steps in the linear warm-up "
                           "(then a linear decay to 0)")->capture_default_str();
  finetune_cmd->add_option("--clip", f.clip, "max global gradient norm")->capture_default_str();
  finetune_cmd->add_option("--max-train", f.max_train, "use the first N training examples "
                           "only (0: all)")->capture_default_str();
  finetune_cmd->add_option("--max-dev", f.max_dev, "evaluate on the first N dev examples only "
                           "(0: all)")->capture_default_str();
  finetune_cmd->add_option("--max-steps", f.max_steps, "stop after N steps in all (0: at the "
                           "end of --epochs; the schedule spans --epochs either way)")
      ->capture_default_str();
  finetune_cmd->add_option("--max-length", f.max_length, "word pieces per input")
      ->capture_default_str();
  finetune_cmd->add_option("--log-interval", f.log_interval)->capture_default_str();
  finetune_cmd->add_option("--seed", f.seed)->capture_default_str();
  finetune_cmd->add_option("--precision", f.precision, "fp32 | bf16")->capture_default_str();
  finetune_table.add_to(*finetune_cmd, {"cuda-graphs"});

  PretrainOptions pt;
  FlagTable pretrain_table;
  add_attention_settings(pretrain_table, pt.attention);
  add_machine_settings(pretrain_table, pt.machine);
  CLI::App* pretrain_cmd = app.add_subcommand("pretrain", "pretrain a BERT-style encoder from "
                                                          "scratch as a masked language model");
  pretrain_cmd->add_option("--corpus", pt.corpus, "text files or folders (default: the fortune "
                           "files and the Python documentation, where installed)");
  pretrain_cmd->add_option("--max-corpus-bytes", pt.max_corpus_bytes, "read at most this much "
                           "text (0: all)")->capture_default_str();
  pretrain_cmd->add_option("--out", pt.out, "the run folder, which is also the model's folder "
                           "(default: the first free one of runs/text-pretrain, -2, ...)");
  pretrain_cmd->add_flag("--overwrite", pt.overwrite, "let a new run replace the run in --out");
  pretrain_cmd->add_option("--resume", pt.resume, "continue the run in this folder exactly");
  pretrain_cmd->add_option("--vocab", pt.vocab, "SentencePiece pieces (the special ones "
                           "included)")->capture_default_str();
  pretrain_cmd->add_option("--layers", pt.layers)->capture_default_str();
  pretrain_cmd->add_option("--hidden", pt.hidden, "the model width D")->capture_default_str();
  pretrain_cmd->add_option("--heads", pt.heads)->capture_default_str();
  pretrain_cmd->add_option("--intermediate", pt.intermediate, "the feed-forward width")
      ->capture_default_str();
  pretrain_cmd->add_option("--length", pt.length, "pieces per sequence, [CLS] and [SEP] "
                           "included (also the positions the model knows)")->capture_default_str();
  pretrain_cmd->add_option("--batch", pt.batch)->capture_default_str();
  pretrain_cmd->add_option("--steps", pt.steps, "the schedule's steps")->capture_default_str();
  pretrain_cmd->add_option("--max-steps", pt.max_steps, "stop after N steps in all (0: --steps; "
                           "the schedule spans --steps either way)")->capture_default_str();
  pretrain_cmd->add_option("--lr", pt.lr, "AdamW's peak learning rate")->capture_default_str();
  pretrain_cmd->add_option("--weight-decay", pt.weight_decay)->capture_default_str();
  pretrain_cmd->add_option("--warmup", pt.warmup, "fraction of the steps in the linear warm-up "
                           "(then a linear decay to 0)")->capture_default_str();
  pretrain_cmd->add_option("--clip", pt.clip, "max global gradient norm")->capture_default_str();
  pretrain_cmd->add_option("--mask", pt.mask, "the fraction of pieces predicted (80% [MASK], "
                           "10% random, 10% kept)")->capture_default_str();
  pretrain_cmd->add_option("--dropout", pt.dropout)->capture_default_str();
  pretrain_cmd->add_option("--eval-interval", pt.eval_interval, "steps between evaluations on "
                           "dev (each writes the model's files)")->capture_default_str();
  pretrain_cmd->add_option("--max-dev", pt.max_dev, "dev sequences evaluated")
      ->capture_default_str();
  pretrain_cmd->add_option("--log-interval", pt.log_interval)->capture_default_str();
  pretrain_cmd->add_option("--seed", pt.seed)->capture_default_str();
  pretrain_cmd->add_option("--precision", pt.precision, "fp32 | bf16")->capture_default_str();
  pretrain_table.add_to(*pretrain_cmd, {"cuda-graphs"});

  EvaluateOptions ev, mx;
  ev.attention.clusters = mx.attention.clusters = 25;
  FlagTable evaluate_table, matrix_table;
  add_attention_settings(evaluate_table, ev.attention);
  add_machine_settings(evaluate_table, ev.machine);
  add_attention_settings(matrix_table, mx.attention, /*with_type=*/false);
  add_machine_settings(matrix_table, mx.machine);
  CLI::App* evaluate_cmd = app.add_subcommand("evaluate", "a fine-tuned model's score on a split, "
                                                          "with any attention");
  CLI::App* matrix_cmd = app.add_subcommand("matrix", "a fine-tuned model's score with full, "
                                                      "clustered, improved-clustered and "
                                                      "oracle-top attention (Table 4)");
  for (auto [cmd, opt, table] : {std::make_tuple(evaluate_cmd, &ev, &evaluate_table),
                                 std::make_tuple(matrix_cmd, &mx, &matrix_table)}) {
    cmd->add_option("--checkpoint", opt->checkpoint, "a checkpoint, or a run folder (best, then "
                    "last)")->required();
    cmd->add_option("--split", opt->split, "train | dev | test")->capture_default_str();
    cmd->add_option("--data", opt->data, "the task folder (default: the one it was trained on)");
    cmd->add_option("--model", opt->model, "the pretrained model's folder (default: the one it "
                    "was trained from)");
    cmd->add_option("--batch", opt->batch)->capture_default_str();
    cmd->add_option("--max-examples", opt->max_examples, "the first N examples of the split "
                    "only (0: all)")->capture_default_str();
    cmd->add_option("--precision", opt->precision, "fp32 | bf16")->capture_default_str();
    table->add_to(*cmd, {"cuda-graphs"});
  }

  Table4Options x;
  x.model = default_pretrained_dir();
  x.attention.clusters = 25;
  FlagTable table4_table;
  add_attention_settings(table4_table, x.attention, /*with_type=*/false);
  add_machine_settings(table4_table, x.machine);
  CLI::App* table4_cmd = app.add_subcommand("table4", "the paper's Table 4, one command: "
                                                      "fine-tune, pretrain, and evaluate every "
                                                      "model with each attention");
  table4_cmd->add_option("--out", x.out, "the experiment's folder (a stopped experiment goes on "
                         "where it stopped)")->capture_default_str();
  table4_cmd->add_option("--data", x.data, "the tasks' folder (default: built in --out)");
  table4_cmd->add_option("--model", x.model, "the pretrained model's folder")
      ->capture_default_str();
  table4_cmd->add_option("--wordnet", x.wordnet, "WordNet's data folder")->capture_default_str();
  table4_cmd->add_option("--corpus", x.corpus, "text to pretrain on (default: the fortune "
                         "files and the Python documentation)");
  table4_cmd->add_flag("--quick", x.quick, "small sizes: checks the pipeline in minutes");
  table4_cmd->add_option("--precision", x.precision, "fp32 | bf16")->capture_default_str();
  table4_table.add_to(*table4_cmd, {"cuda-graphs"});

  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  check_integer_flags(app);
  if (embed->parsed()) return embed_command(e, embed_table);
  if (tasks->parsed()) {
    write_tasks(t, stdout);
    return 0;
  }
  if (finetune_cmd->parsed()) {
    finetune_table.validate();
    f.task = parse_task(task);
    f.out_given = finetune_cmd->count("--out") > 0;
    if (!f.out_given) f.out = std::string("runs/text-") + task_name(f.task);
    return finetune(f, stdout);
  }
  if (pretrain_cmd->parsed()) {
    pretrain_table.validate();
    pt.out_given = pretrain_cmd->count("--out") > 0;
    if (!pt.out_given) pt.out = "runs/text-pretrain";
    return pretrain(pt, stdout);
  }
  if (table4_cmd->parsed()) {
    table4_table.validate();
    return table4(x, stdout);
  }
  if (evaluate_cmd->parsed()) {
    evaluate_table.validate();
    return evaluate_command(ev, false);
  }
  if (matrix_cmd->parsed()) {
    matrix_table.validate();
    return evaluate_command(mx, true);
  }
  return 0;
} catch (const std::exception& ex) {
  std::fprintf(stderr, "text: %s\n", error_text(ex).c_str());
  return 1;
}

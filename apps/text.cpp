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
#include <map>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/flag_table.h"
#include "apps/common/flags.h"
#include "apps/common/run_folder.h"
#include "apps/common/settings.h"
#include "apps/common/training.h"
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

float cosine(const std::vector<float>& e, int64_t D, int64_t a, int64_t b) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double x = e[a * D + d], y = e[b * D + d];
    dot += x * y, na += x * x, nb += y * y;
  }
  return na > 0 && nb > 0 ? static_cast<float>(dot / std::sqrt(na * nb)) : 0.0f;
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
      for (int64_t b = 0; b < S; ++b) std::printf(" %6.3f", cosine(v, D, a, b));
      const std::string& s = o.sentences[a];
      std::printf("  %s\n", s.size() > 60 ? (s.substr(0, 57) + "...").c_str() : s.c_str());
    }
  }
  if (!o.compare_with.empty()) {
    m.model->set_attention(other);
    const Tensor f = embed(m, o.sentences, o.batch, precision, gen, source);
    const std::vector<float> w = f.to_vector();
    double sum = 0, lowest = 2;
    std::vector<float> joined(static_cast<size_t>(2 * D));
    for (int64_t s = 0; s < S; ++s) {
      std::copy(v.begin() + s * D, v.begin() + (s + 1) * D, joined.begin());
      std::copy(w.begin() + s * D, w.begin() + (s + 1) * D, joined.begin() + D);
      const double cs = cosine(joined, D, 0, 1);
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

  CLI11_PARSE(app, argc, argv);
  check_integer_flags(app);
  if (embed->parsed()) return embed_command(e, embed_table);
  return 0;
} catch (const std::exception& ex) {
  std::fprintf(stderr, "text: %s\n", error_text(ex).c_str());
  return 1;
}

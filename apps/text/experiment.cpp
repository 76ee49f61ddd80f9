// The paper's Table 4 with the text app, one command (see experiment.h).
#include "apps/text/experiment.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "apps/common/device.h"
#include "apps/common/metrics_file.h"
#include "apps/common/training.h"
#include "apps/text/finetune.h"
#include "apps/text/pretrain.h"
#include "apps/text/pretrained.h"
#include "core/error.h"
#include "data/text_tasks.h"
#include "data/wordnet.h"

namespace clustr::text {

namespace fs = std::filesystem;

// ---- the tasks' folder -----------------------------------------------------------------------

void write_tasks(const TasksOptions& o, std::FILE* log) {
  CLUSTR_CHECK(o.span_examples.size() == 3, "--span-examples takes three counts (train dev "
               "test), got ", o.span_examples.size());
  for (const char* task : {"wic", "span"})
    for (const char* split : {"train", "dev", "test"}) {
      const std::string path = o.out + "/" + task + "/" + split + ".jsonl";
      CLUSTR_CHECK(o.overwrite || !fs::exists(path), path, " exists (--overwrite replaces it)");
    }
  const auto t0 = Clock::now();
  const WordNet wordnet = read_wordnet(o.wordnet);
  const TextTokenizer tokenizer = TextTokenizer::load(o.model);
  CLUSTR_CHECK(tokenizer.bert(), "tasks: --model ", o.model, " has a ", tokenizer.kind(),
               " tokenizer; the tasks measure their contexts in a WordPiece vocabulary's pieces "
               "(a pretrained model's folder, such as all-MiniLM-L6-v2)");
  WicOptions wo;
  wo.seed = o.seed;
  const auto wic = build_wic(wordnet, wo);
  SpanOptions so;
  so.seed = o.seed;
  so.target_pieces = o.span_pieces;
  so.max_examples = {o.span_examples[0], o.span_examples[1], o.span_examples[2]};
  const auto span = build_span_task(wordnet, *tokenizer.bert(), so);
  fs::create_directories(o.out + "/wic");
  fs::create_directories(o.out + "/span");
  std::vector<WicStats> ws;
  std::vector<SpanStats> ss;
  for (int i = 0; i < 3; ++i) {
    const std::string split = split_name(static_cast<Split>(i));
    write_wic_jsonl(o.out + "/wic/" + split + ".jsonl", wic[i].examples, o.overwrite);
    write_span_jsonl(o.out + "/span/" + split + ".jsonl", span[i].examples, o.overwrite);
    ws.push_back(wic_stats(wic[i]));
    ss.push_back(span_stats(span[i]));
  }
  const std::string stats = "# The WordNet tasks (seed " + std::to_string(o.seed) +
                            ")\n\n## Word in context\n\n" + wic_stats_markdown(ws) +
                            "\n## Spans in long contexts\n\n" + span_stats_markdown(ss);
  write_lines_atomically(o.out + "/STATS.md", {stats});
  logf(log, "%s\nwrote %s/wic and %s/span in %.1f s\n", stats.c_str(), o.out.c_str(),
       o.out.c_str(), seconds_since(t0));
}

// ---- what the commands share -----------------------------------------------------------------

float cosine(const float* x, const float* y, int64_t D) {
  double dot = 0, nx = 0, ny = 0;
  for (int64_t d = 0; d < D; ++d) dot += double(x[d]) * y[d], nx += double(x[d]) * x[d],
                                  ny += double(y[d]) * y[d];
  return nx > 0 && ny > 0 ? static_cast<float>(dot / std::sqrt(nx * ny)) : 0.0f;
}

std::vector<AttentionConfig> table4_attentions(const AttentionConfig& base) {
  std::vector<AttentionConfig> out;
  for (AttentionType t : {AttentionType::full, AttentionType::clustered,
                          AttentionType::improved_clustered, AttentionType::oracle_top}) {
    AttentionConfig a = base;
    a.type = t;
    out.push_back(a);
  }
  return out;
}

std::string attention_label(const AttentionConfig& a) {
  std::string name = attention_type_name(a.type);
  if (uses_clusters(a.type)) name += "-" + std::to_string(a.clusters);
  if (a.type == AttentionType::oracle_top) name += "-" + std::to_string(a.topk);
  return name;
}

// ---- the experiment --------------------------------------------------------------------------

namespace {

// A tab-separated file of rows, each keyed by its first `key` fields; a later row replaces an
// earlier one with the same key (a step that was interrupted after writing its rows and before
// being marked done writes them again).
using Rows = std::map<std::vector<std::string>, std::vector<std::string>>;

Rows read_rows(const std::string& path, size_t key) {
  Rows rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::istringstream ls(line);
    for (std::string f; std::getline(ls, f, '\t');) fields.push_back(f);
    if (fields.size() <= key) continue;
    rows[std::vector<std::string>(fields.begin(), fields.begin() + key)] = fields;
  }
  return rows;
}

void append_rows(const std::string& path, const std::vector<std::vector<std::string>>& rows) {
  std::ofstream out(path, std::ios::app);
  for (const auto& r : rows) {
    std::string line;
    for (const std::string& f : r) line += (line.empty() ? "" : "\t") + f;
    out << line << "\n";
  }
  out.flush();
  CLUSTR_CHECK(out.good(), "table4: cannot write ", path);
}

std::string fixed(double v, int digits = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// The sizes of each step: the budget (at most two hours on two CPU cores) or --quick.
struct Plan {
  FinetuneOptions minilm_wic, minilm_span, own_wic, own_span;
  PretrainOptions pretrain;
  int64_t max_test = 0;     // > 0: the first N test examples only
  int64_t max_sentences = 0;  // > 0: embed the first N sentences only
};

Plan make_plan(const Table4Options& o, const std::string& data) {
  Plan p;
  FinetuneOptions base;
  base.data = data;
  base.precision = o.precision;
  base.machine = o.machine;
  base.log_interval = 50;
  p.minilm_wic = base;
  p.minilm_wic.task = Task::wic;
  p.minilm_wic.model = o.model;
  p.minilm_wic.epochs = 2;
  p.minilm_wic.batch = 32;
  p.minilm_wic.lr = 3e-5f;
  p.minilm_span = base;
  p.minilm_span.task = Task::span;
  p.minilm_span.model = o.model;
  p.minilm_span.epochs = 3;
  p.minilm_span.batch = 16;
  p.minilm_span.lr = 1e-4f;
  p.minilm_span.max_train = 3000;
  p.minilm_span.max_dev = 200;

  PretrainOptions& t = p.pretrain;
  t.corpus = o.corpus;
  t.out = o.out + "/pretrain";
  t.out_given = true;
  t.length = 512;  // the span task's contexts take up to about 450 of its pieces
  t.batch = 16;
  t.steps = 1200;
  t.eval_interval = 500;
  t.max_dev = 64;
  t.log_interval = 50;
  t.precision = o.precision;
  t.machine = o.machine;

  const std::string own = o.out + "/pretrain";
  p.own_wic = p.minilm_wic;
  p.own_wic.model = own;
  p.own_wic.epochs = 3;
  p.own_wic.lr = 2e-4f;
  p.own_span = p.minilm_span;
  p.own_span.model = own;
  p.own_span.lr = 3e-4f;
  p.own_span.max_length = 512;
  if (o.quick) {
    for (FinetuneOptions* f : {&p.minilm_wic, &p.minilm_span, &p.own_wic, &p.own_span}) {
      f->epochs = 1;
      f->max_train = f->task == Task::wic ? 128 : 32;
      f->max_dev = 32;
      f->batch = 16;
      f->log_interval = 4;
    }
    t.max_corpus_bytes = 2000000;
    t.vocab = 4000;
    t.layers = 2;
    t.hidden = 64;
    t.heads = 2;
    t.intermediate = 128;
    t.batch = 8;
    t.steps = 40;
    t.eval_interval = 40;
    t.max_dev = 8;
    t.log_interval = 10;
    p.max_test = 48;
    p.max_sentences = 48;
  }
  return p;
}

// The sentences whose embeddings are compared: the span task's test contexts, then the word-
// in-context task's test sentences (each once).
std::vector<std::string> test_sentences(const std::string& data, int64_t max_sentences) {
  std::vector<std::string> out;
  for (const SpanExample& e : read_span_jsonl(data + "/span/test.jsonl")) out.push_back(e.context);
  std::set<std::string> seen;
  for (const WicExample& e : read_wic_jsonl(data + "/wic/test.jsonl"))
    for (const std::string* s : {&e.sentence1, &e.sentence2})
      if (seen.insert(*s).second) out.push_back(*s);
  if (max_sentences > 0 && static_cast<int64_t>(out.size()) > max_sentences) {
    // Half contexts, half sentences, so that a quick run has both.
    std::vector<std::string> some(out.begin(), out.begin() + max_sentences / 2);
    some.insert(some.end(), out.end() - (max_sentences - max_sentences / 2), out.end());
    out = some;
  }
  return out;
}

}  // namespace

int table4(const Table4Options& o, std::FILE* log) {
  const auto t0 = Clock::now();
  fs::create_directories(o.out);
  const std::string progress = o.out + "/progress.tsv", scores = o.out + "/scores.tsv",
                    cosines = o.out + "/cosines.tsv";
  const std::string data = o.data.empty() ? o.out + "/tasks" : o.data;
  const Plan plan = make_plan(o, data);
  const Precision precision = parse_precision(o.precision);
  const Device device = prepare_machine(o.machine);
  int status = 0;

  // The settings that decide what the steps compute: a folder keeps one experiment's.
  const std::vector<std::vector<std::string>> settings = {
      {"data", data},
      {"model", o.model},
      {"quick", o.quick ? "yes" : "no"},
      {"precision", o.precision},
      {"clusters", std::to_string(o.attention.clusters)},
      {"topk", std::to_string(o.attention.topk)}};
  const std::string settings_file = o.out + "/settings.tsv";
  if (fs::exists(settings_file)) {
    const Rows saved = read_rows(settings_file, 1);
    for (const auto& s : settings) {
      const auto it = saved.find({s[0]});
      const std::string was = it == saved.end() ? "(absent)" : it->second[1];
      CLUSTR_CHECK(was == s[1], "table4: the experiment in ", o.out, " was run with ", s[0], " ",
                   was, ", now ", s[1], " (another --out starts another experiment)");
    }
  } else {
    append_rows(settings_file, settings);
  }

  // Runs `step` unless progress.tsv has it; records its time. A step returning non-zero (a
  // signal) stops the experiment.
  const auto run_step = [&](const std::string& name, const std::function<int()>& step) {
    if (status != 0) return;
    if (read_rows(progress, 1).count({name})) {
      logf(log, "== %s: done already\n", name.c_str());
      return;
    }
    logf(log, "== %s\n", name.c_str());
    const auto ts = Clock::now();
    status = step();
    if (status == 0) append_rows(progress, {{name, fixed(seconds_since(ts), 1)}});
  };
  // A fine-tuning or pretraining run: fresh, or resumed where an earlier one stopped.
  const auto run_training = [&](auto options, const std::string& folder, auto train) {
    options.out = folder;
    options.out_given = true;
    const bool started = fs::exists(folder + "/last.safetensors");
    if (started) options.resume = folder;
    options.overwrite = !started;  // a run that never saved a checkpoint starts again
    return train(options, log);
  };

  if (o.data.empty() && !fs::exists(data + "/STATS.md"))
    run_step("tasks", [&] {
      TasksOptions t;
      t.out = data;
      t.wordnet = o.wordnet;
      t.model = o.model;
      t.overwrite = true;
      write_tasks(t, log);
      return 0;
    });
  const auto run_finetune = [&](const std::string& name, const FinetuneOptions& f) {
    run_step(name, [&] {
      return run_training(f, o.out + "/" + name,
                          [](const FinetuneOptions& x, std::FILE* l) { return finetune(x, l); });
    });
  };
  run_finetune("minilm-wic", plan.minilm_wic);
  run_finetune("minilm-span", plan.minilm_span);
  run_step("pretrain", [&] {
    return run_training(plan.pretrain, o.out + "/pretrain",
                        [](const PretrainOptions& x, std::FILE* l) { return pretrain(x, l); });
  });
  run_finetune("own-wic", plan.own_wic);
  run_finetune("own-span", plan.own_span);

  // Each fine-tuned model on the test split under the four attentions.
  for (const char* name : {"minilm-wic", "minilm-span", "own-wic", "own-span"})
    run_step(std::string("scores-") + name, [&] {
      FinetunedModel f = load_finetuned(o.out + "/" + name, "", AttentionConfig{});
      f.model->to(device);
      EncodedSet set = load_split(f.task, data, "test", *f.tokenizer, f.max_length);
      if (plan.max_test > 0 && static_cast<int64_t>(set.examples.size()) > plan.max_test)
        set.examples.resize(plan.max_test);
      std::vector<std::vector<std::string>> rows;
      for (const AttentionConfig& a : table4_attentions(o.attention)) {
        a.validate();
        f.model->bert().set_attention(a);
        const Score s = evaluate_task(*f.model, set.examples, *f.tokenizer, 32, precision);
        const double score = f.task == Task::wic ? s.accuracy : s.f1;
        logf(log, "%s, %s: %s %.4f (%lld examples, %.1f s)\n", name, attention_label(a).c_str(),
             f.task == Task::wic ? "accuracy" : "F1", score,
             static_cast<long long>(s.examples), s.seconds);
        rows.push_back({name, attention_label(a), fixed(score), fixed(s.exact_match),
                        fixed(s.loss), std::to_string(s.examples), fixed(s.seconds, 1)});
      }
      append_rows(scores, rows);
      return 0;
    });

  // Each pretrained model alone: its embeddings under each approximation against full's.
  const std::vector<std::pair<std::string, std::string>> encoders = {
      {"minilm", o.model}, {"own", o.out + "/pretrain"}};
  for (const auto& [name, dir] : encoders)
    run_step("cosines-" + name, [&, name = name, dir = dir] {
      Generator gen(1);
      PretrainedModel m = load_pretrained(dir, AttentionConfig{}, gen);
      m.model->to(device);
      const std::vector<std::string> sentences = test_sentences(data, plan.max_sentences);
      const auto ts = Clock::now();
      const std::vector<float> full = embed(m, sentences, 32, precision, gen).to_vector();
      const int64_t S = static_cast<int64_t>(sentences.size()), D = m.model->config().hidden;
      std::vector<std::vector<std::string>> rows = {
          {name, "full", fixed(1.0), fixed(1.0), std::to_string(S), fixed(seconds_since(ts), 1)}};
      for (const AttentionConfig& a : table4_attentions(o.attention)) {
        if (a.type == AttentionType::full) continue;
        a.validate();
        m.model->set_attention(a);
        const auto ta = Clock::now();
        const std::vector<float> e = embed(m, sentences, 32, precision, gen).to_vector();
        double sum = 0, lowest = 2;
        for (int64_t s = 0; s < S; ++s) {
          const double c = cosine(&full[s * D], &e[s * D], D);
          sum += c;
          lowest = std::min(lowest, c);
        }
        logf(log, "%s, %s: mean cosine to full %.4f, lowest %.4f over %lld sentences\n",
             name.c_str(), attention_label(a).c_str(), sum / double(S), lowest,
             static_cast<long long>(S));
        rows.push_back({name, attention_label(a), fixed(sum / double(S)), fixed(lowest),
                        std::to_string(S), fixed(seconds_since(ta), 1)});
      }
      append_rows(cosines, rows);
      return 0;
    });
  if (status != 0) return status;

  // The table.
  const Rows score_rows = read_rows(scores, 2), cosine_rows = read_rows(cosines, 2);
  const std::vector<AttentionConfig> columns = table4_attentions(o.attention);
  std::string md = "# Table 4 with clustr's text app\n\n";
  md += detail::cat("Machine: ", cpu_model(), ", device ", o.machine.device, ", products ",
                    o.precision, o.quick ? "; --quick sizes (a check of the pipeline, not the "
                                           "paper's claims)" : "", ".\n\n");
  md += "Each model is fine-tuned with full attention, then evaluated on the test split with "
        "each attention, without retraining.\n\n| model | task (test metric) |";
  for (const AttentionConfig& a : columns) md += " " + attention_label(a) + " |";
  md += "\n|---|---|";
  for (size_t i = 0; i < columns.size(); ++i) md += "--:|";
  md += "\n";
  const std::vector<std::pair<const char*, const char*>> run_names = {
      {"minilm-wic", "all-MiniLM-L6-v2 | word in context (accuracy)"},
      {"minilm-span", "all-MiniLM-L6-v2 | spans (F1)"},
      {"own-wic", "clustr-pretrained | word in context (accuracy)"},
      {"own-span", "clustr-pretrained | spans (F1)"}};
  for (const auto& [run, label] : run_names) {
    md += std::string("| ") + label + " |";
    for (const AttentionConfig& a : columns) {
      const auto it = score_rows.find({run, attention_label(a)});
      md += " " + (it == score_rows.end() ? std::string("-") : it->second[2]) + " |";
    }
    md += "\n";
  }
  md += "\nThe pretrained models alone (no fine-tuning): the mean cosine between each test "
        "sentence's or context's embedding under an attention and under full attention "
        "(lowest in brackets).\n\n| model | sentences |";
  for (size_t i = 1; i < columns.size(); ++i) md += " " + attention_label(columns[i]) + " |";
  md += "\n|---|--:|";
  for (size_t i = 1; i < columns.size(); ++i) md += "--:|";
  md += "\n";
  for (const auto& [name, label] : std::vector<std::pair<const char*, const char*>>{
           {"minilm", "all-MiniLM-L6-v2"}, {"own", "clustr-pretrained"}}) {
    const auto full = cosine_rows.find({name, "full"});
    md += std::string("| ") + label + " | " + (full == cosine_rows.end() ? "-" : full->second[4]) +
          " |";
    for (size_t i = 1; i < columns.size(); ++i) {
      const auto it = cosine_rows.find({name, attention_label(columns[i])});
      md += it == cosine_rows.end() ? " - |" : " " + it->second[2] + " (" + it->second[3] + ") |";
    }
    md += "\n";
  }
  md += "\nSteps and their time (seconds):\n\n| step | seconds |\n|---|--:|\n";
  double total = 0;
  std::ifstream steps(progress);
  for (std::string line; std::getline(steps, line);) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    md += "| " + line.substr(0, tab) + " | " + line.substr(tab + 1) + " |\n";
    total += std::stod(line.substr(tab + 1));
  }
  md += "| all | " + fixed(total, 1) + " |\n";
  write_lines_atomically(o.out + "/TABLE4.md", {md});
  logf(log, "%s\nwrote %s/TABLE4.md (this invocation: %.1f s)\n", md.c_str(), o.out.c_str(),
       seconds_since(t0));
  return 0;
}

}  // namespace clustr::text

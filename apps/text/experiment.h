// The paper's Table 4 with the text app, one command (`text table4`): a pretrained model
// fine-tuned with full attention, then evaluated with clustered, improved-clustered and
// oracle-top attention without retraining; the same for a model that clustr pretrains itself;
// and, for each pretrained model alone, how close its sentence embeddings stay to full
// attention's under each approximation.
//
// Steps, each in its own folder under --out, each skipped when progress.tsv says it is done (so
// an interrupted experiment goes on where it stopped; a fine-tuning or pretraining run stopped
// half-way resumes exactly):
//   tasks/                    the WordNet tasks (unless --data names a folder of them)
//   minilm-wic/, minilm-span/ the pretrained model fine-tuned on each task, full attention
//   pretrain/                 a masked language model pretrained on Debian text
//   own-wic/, own-span/       that model fine-tuned on each task
//   then each fine-tuned model scored on the test split under the four attentions
//   (scores.tsv), and each pretrained model's embeddings of the test sentences and contexts
//   under the four attentions against full (cosines.tsv).
// TABLE4.md gathers them in Table 4's layout, with each step's time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/common/settings.h"
#include "layers/attention/config.h"

namespace clustr::text {

// ---- the tasks' folder ----

struct TasksOptions {
  std::string out;
  std::string wordnet = "/usr/share/wordnet";
  std::string model;  // a folder with a WordPiece vocabulary, which measures the contexts
  uint64_t seed = 1;
  int span_pieces = 320;
  std::vector<int64_t> span_examples = {6000, 600, 600};
  bool overwrite = false;
};
// Builds both tasks into o.out (wic/, span/, STATS.md), printing the statistics to `log`.
void write_tasks(const TasksOptions& o, std::FILE* log);

// ---- what the experiment's commands share ----

// The cosine of two D-vectors (0 when either is zero).
float cosine(const float* x, const float* y, int64_t D);

// Table 4's columns: full, clustered, improved-clustered and oracle-top, each with base's
// sizes (clusters, top-k, ...).
std::vector<AttentionConfig> table4_attentions(const AttentionConfig& base);
// "full", "clustered-25", "improved-clustered-25", "oracle-top-32".
std::string attention_label(const AttentionConfig& a);

// ---- the experiment ----

struct Table4Options {
  std::string out = "runs/text-table4";
  std::string data;        // the tasks' folder; empty: out/tasks, built when absent
  std::string model;       // the pretrained model's folder (all-MiniLM-L6-v2)
  std::string wordnet = "/usr/share/wordnet";
  std::vector<std::string> corpus;  // text to pretrain on; empty: default_corpus()
  bool quick = false;      // a few minutes' sizes: checks the pipeline, not the paper's claims
  std::string precision = "fp32";
  AttentionConfig attention;  // the approximations' sizes (clusters 25, top-k 32)
  MachineOptions machine;
};

// Runs the steps not yet done, then writes and prints TABLE4.md. Returns the exit status (0, or
// 128 + a signal's number when a step was stopped by Ctrl-C or SIGTERM).
int table4(const Table4Options& o, std::FILE* log);

}  // namespace clustr::text

// Fine-tuning a pretrained BERT model on the two WordNet tasks (data/text_tasks.h), and
// evaluating it with any attention type (the paper's Table 4: trained with full attention,
// evaluated with clustered attention without retraining).
//
// Legend: B batch, N positions, D model width.
//
// The model is TaskModel: the BERT encoder ("bert", layers/bert.h) and one linear head ("head",
// D -> 2):
//   wic:  [CLS] lemma : sentence1 [SEP] sentence2 [SEP]; the head reads BERT's pooler output
//         tanh(W h_[CLS] + b), giving the logits of "different sense" (0) and "same sense" (1);
//         the loss is their cross-entropy.
//   span: [CLS] question [SEP] context [SEP]; the head reads every token, giving its start and
//         end logits; positions outside the context are masked (-1e4 added), and the loss is
//         the mean of the start and end positions' cross-entropies (BERT's SQuAD head). A
//         prediction is the best-scoring span of at most kMaxAnswerPieces pieces with
//         end >= start; its text is its pieces joined ("##" pieces glued to the piece before),
//         scored against the answer with SQuAD's exact match and F1.
// The answer's pieces are found by encoding the context in three parts (before the answer, the
// answer, after it): the answer starts and ends at word boundaries, where BERT's tokenizer
// splits anyway, so the parts' pieces are the whole context's; an example where they are not,
// or whose question and context do not fit in max_length, is left out and counted.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/settings.h"
#include "autograd/variable.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/tensor.h"
#include "apps/text/tokenizer.h"
#include "data/text_tasks.h"
#include "layers/bert.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace clustr::text {

enum class Task { wic, span };
Task parse_task(const std::string& name);  // "wic" | "span"; throws listing them
const char* task_name(Task task);

constexpr int kMaxAnswerPieces = 30;

class TaskModel : public Module {
 public:
  TaskModel(Task task, const BertConfig& config, const AttentionConfig& attention,
            Generator& gen);
  Task task() const { return task_; }
  BertModel& bert() const { return *bert_; }
  Linear& head() const { return *head_; }

 private:
  Task task_;
  std::shared_ptr<BertModel> bert_;
  std::shared_ptr<Linear> head_;
};

// One example as the model reads it.
struct Encoded {
  std::vector<int32_t> ids, types;
  int32_t label = 0;                   // wic
  int32_t start = 0, end = 0;          // span: the answer's first and last piece (positions)
  int32_t context_begin = 0, context_end = 0;  // span: the context's positions [begin, end)
  std::string answer;                  // span: the answer's text
};

struct EncodedSet {
  std::vector<Encoded> examples;
  int64_t dropped_too_long = 0;    // span: question + context over max_length
  int64_t dropped_unaligned = 0;   // span: the answer's pieces are not the context's
};

EncodedSet encode_wic(const std::vector<WicExample>& examples, const TextTokenizer& tokenizer,
                      int max_length);
EncodedSet encode_span(const std::vector<SpanExample>& examples, const TextTokenizer& tokenizer,
                       int max_length);

// A padded batch on `device`: ids and types (B, N), lengths (B); target i32 (B) (the label, or
// the start); target_end (B) (span); mask f32 (B, N), 0 inside the context and -1e4 elsewhere
// (span).
struct Batch {
  Tensor ids, types, lengths, target, target_end, mask;
};
Batch make_batch(const std::vector<Encoded>& examples, const std::vector<int64_t>& rows,
                 int32_t pad_id, Task task, Device device);

// The model's output for a batch: wic (B, 2) logits; span (B, N, 2) start and end logits.
Variable task_forward(const TaskModel& model, const Batch& batch, Generator& gen);
// The batch's mean loss (shape ()).
Variable task_loss(Task task, const Batch& batch, const Variable& output);

struct Score {
  double loss = 0;      // mean over the examples
  double accuracy = 0;  // wic
  double exact_match = 0, f1 = 0;  // span, in [0, 1]
  int64_t examples = 0;
  double seconds = 0;
};
// The model (in evaluation mode) on every example, `batch` at a time, longest first.
Score evaluate_task(const TaskModel& model, const std::vector<Encoded>& examples,
                    const TextTokenizer& tokenizer, int64_t batch, Precision precision);

// The data of a task folder (`text tasks` writes wic/ and span/ folders of train.jsonl,
// dev.jsonl, test.jsonl) encoded for the model: the split's file, read and encoded.
EncodedSet load_split(Task task, const std::string& data_dir, const std::string& split,
                      const TextTokenizer& tokenizer, int max_length);

struct FinetuneOptions {
  Task task = Task::wic;
  std::string model;        // the pretrained model's folder
  std::string data;         // the task folder
  std::string out;          // the run folder
  bool out_given = false, overwrite = false;
  std::string resume;       // a run folder to continue
  int epochs = 3;
  int64_t batch = 16;
  float lr = 3e-5f;
  float weight_decay = 0.01f;
  float warmup = 0.1f;      // fraction of the steps with a linear warm-up, then linear decay
  float clip = 1.0f;
  int64_t max_train = 0;    // > 0: the first max_train training examples only
  int64_t max_dev = 0;      // > 0: the first max_dev dev examples only
  int64_t max_steps = 0;    // > 0: stop after this many steps in all (the schedule still
                            // spans --epochs, so that a resumed run goes on along it)
  int64_t log_interval = 20;
  int max_length = 384;
  uint64_t seed = 1;
  std::string precision = "fp32";
  AttentionConfig attention;
  MachineOptions machine;
};

// The run's settings as a checkpoint stores them (task, model, data, max-length, attention, the
// training settings).
std::map<std::string, std::string> run_config_of(const FinetuneOptions& options);

// Trains, evaluating on dev after each epoch, into the run folder: metrics.csv, loss.png,
// dev.png, last.safetensors (each epoch, and on Ctrl-C), best.safetensors (best dev score).
// Returns the exit status (0, or 128 + a signal's number after Ctrl-C or SIGTERM).
int finetune(const FinetuneOptions& options, std::FILE* log);

// A fine-tuned checkpoint (a file or a run folder: best, then last) read back with the model
// folder and task it was trained with. `model_dir` given (non-empty) replaces the folder the
// checkpoint names.
struct FinetunedModel {
  Task task = Task::wic;
  std::string checkpoint, model_dir, data;
  int max_length = 384;
  std::unique_ptr<TaskModel> model;
  std::unique_ptr<TextTokenizer> tokenizer;
};
FinetunedModel load_finetuned(const std::string& path, const std::string& model_dir,
                              const AttentionConfig& attention);

}  // namespace clustr::text

// Pretraining a BERT-family encoder from scratch as a masked language model (Devlin et al.
// 2019), so that a user without a pretrained model can make one: `text pretrain`.
//
// Legend: B batch, L sequence length (pieces, [CLS] and [SEP] included), D model width,
// V vocabulary, M masked positions in a batch.
//
// The corpus is plain text files (a folder: every file below it, in path order). A file holding
// a NUL byte or invalid UTF-8 is not text and is skipped (counted); a file's paragraphs end at
// a blank line or a line of "%" alone (the fortune files' separator), their whitespace runs
// becoming single spaces. One paragraph in 100 (chosen by a hash of its text, so the choice
// does not depend on the file order) is held out for dev.
//
// The vocabulary is a SentencePiece unigram model (Kudo 2018) learnt on the training
// paragraphs, with NFKC normalisation and case folding, and [PAD] [CLS] [SEP] [MASK] as control
// pieces. Each split's paragraphs are encoded and concatenated, and cut into sequences of L - 2
// pieces, each read as [CLS] pieces [SEP] (the last, shorter piece of a split is left out).
//
// BERT's masking: each piece of a sequence is chosen with probability --mask (at least one per
// sequence); a chosen piece becomes [MASK] with probability 0.8, a random piece of the
// vocabulary with 0.1, and stays itself with 0.1. The model (MaskedLmModel) predicts the chosen
// pieces; the loss is the cross-entropy over them. Masks come from a stream keyed by the seed,
// the epoch and the sequence, so a resumed run masks exactly as the run it continues; dev is
// masked once and the same at every evaluation.
//
// The run folder is also a model folder that `embed`, `finetune` and `matrix` read with
// --model: config.json, model.safetensors (Hugging Face BertForMaskedLM's names; rewritten at
// each evaluation), pieces.model and sentence_bert_config.json (max_seq_length L). It also
// holds metrics.csv, loss.png and last.safetensors (model, optimizer and stream, for --resume).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/settings.h"
#include "autograd/variable.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/bert.h"
#include "layers/module.h"

namespace clustr::text {

// The Debian text that `text pretrain` reads by default, where installed: the fortune files
// (fortunes) and the Python documentation's reStructuredText sources (python3-doc).
std::vector<std::string> default_corpus();

struct Corpus {
  std::vector<std::string> train, dev;  // paragraphs
  int64_t files = 0, skipped_files = 0, bytes = 0;
};
// Reads the files and folders of `paths` (at most max_bytes of text in all when > 0). Throws
// naming a path that does not exist, and when no paragraph is found.
Corpus read_corpus(const std::vector<std::string>& paths, int64_t max_bytes = 0);

// The encoder and its masked-language-model head: submodules "bert" (BertModel) and "mlm"
// (MaskedLmHead, tied to bert's word embeddings).
class MaskedLmModel : public Module {
 public:
  MaskedLmModel(const BertConfig& config, const AttentionConfig& attention, Generator& gen);
  BertModel& bert() const { return *bert_; }
  MaskedLmHead& mlm() const { return *mlm_; }

 private:
  std::shared_ptr<BertModel> bert_;
  std::shared_ptr<MaskedLmHead> mlm_;
};

// A batch of masked sequences: ids i32 (B, L) after masking; positions i32 (M), the chosen
// pieces' flat indices b * L + n; targets i32 (M), their original ids.
struct MaskedBatch {
  Tensor ids, positions, targets;
};
// Masks `sequences` (each L ids, [CLS] ... [SEP]) as the header says, drawing from a stream
// keyed by `key` and each sequence's index in `rows`; the specials ([CLS], [SEP]) are never
// chosen; random replacements are drawn from [first_plain, vocab).
MaskedBatch mask_sequences(const std::vector<std::vector<int32_t>>& sequences,
                           const std::vector<int64_t>& rows, float fraction, int32_t mask_id,
                           int32_t first_plain, int32_t vocab, uint64_t key, Device device);

// The loss (shape ()) and the logits (M, V) of a masked batch.
struct MaskedLmOutput {
  Variable loss, logits;
};
MaskedLmOutput masked_lm_forward(const MaskedLmModel& model, const MaskedBatch& batch,
                                 Generator& gen);

struct PretrainOptions {
  std::vector<std::string> corpus;  // files and folders; empty: default_corpus()
  int64_t max_corpus_bytes = 0;     // > 0: read at most this much text
  std::string out;                  // the run folder
  bool out_given = false, overwrite = false;
  std::string resume;               // a run folder to continue
  int vocab = 8000;                 // pieces, the unknown and special ones included
  int64_t layers = 4, hidden = 256, heads = 4, intermediate = 1024;
  int length = 128;                 // L
  int64_t batch = 32;
  int64_t steps = 2000;             // the schedule's length
  int64_t max_steps = 0;            // > 0: stop after this many steps in all
  float lr = 5e-4f;
  float weight_decay = 0.01f;
  float warmup = 0.06f;             // fraction of the steps with a linear warm-up
  float clip = 1.0f;
  float mask = 0.15f;
  float dropout = 0.1f;
  int64_t eval_interval = 250;      // steps between evaluations on dev (and model.safetensors)
  int64_t max_dev = 256;            // dev sequences evaluated (the first ones)
  int64_t log_interval = 20;
  uint64_t seed = 1;
  std::string precision = "fp32";
  AttentionConfig attention;
  MachineOptions machine;
};

// The run's settings as a checkpoint stores them (a resumed run must have the same).
std::map<std::string, std::string> pretrain_config_of(const PretrainOptions& options);

// Trains into the run folder (see the header). Returns the exit status (0, or 128 + a
// signal's number after Ctrl-C or SIGTERM).
int pretrain(const PretrainOptions& options, std::FILE* log);

}  // namespace clustr::text

// A pretrained sentence encoder as data/prepare_pretrained.py writes it to a folder: the BERT
// model (config.json, model.safetensors), its WordPiece tokenizer (vocab.txt,
// tokenizer_config.json; a model that `text pretrain` made has pieces.model instead) and sentence-transformers' pooling (1_Pooling/config.json, modules.json,
// sentence_bert_config.json). embed() turns sentences into sentence embeddings as
// SentenceTransformer.encode does: [CLS] text [SEP] cut to the model's maximum length, the
// encoder, mean pooling over the valid tokens, and L2 normalisation when the model has it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/precision.h"
#include "core/random.h"
#include "core/tensor.h"
#include "apps/text/tokenizer.h"
#include "layers/attention/config.h"
#include "layers/bert.h"

namespace clustr::text {

// What a model folder holds; where it is the default (models/all-MiniLM-L6-v2 of the
// repository, or $CLUSTR_PRETRAINED_DIR).
std::string default_pretrained_dir();

struct PretrainedModel {
  std::string dir;
  std::unique_ptr<BertModel> model;
  std::unique_ptr<TextTokenizer> tokenizer;
  int64_t max_length = 512;  // the sentence model's max_seq_length (its inputs are cut there)
  bool normalize = true;     // modules.json ends with sentence-transformers' Normalize
};

// The configuration of a pretrained model's folder (config.json), after checking that the
// folder holds the config, the weights and the vocabulary (saying how to make it when absent).
BertConfig read_pretrained_config(const std::string& dir);

// Reads the folder; the model is on the cpu in evaluation mode, with `attention` in its layers.
// Throws clustr::Error naming the folder and the file for anything missing or malformed (the
// pooling must be mean pooling: the only one implemented), and says how to make the folder
// when it does not exist.
PretrainedModel load_pretrained(const std::string& dir, const AttentionConfig& attention,
                                Generator& gen);

// The sentences' embeddings, (S, D) f32 on the cpu, in the given order. Sentences are sorted by
// length and run `batch` at a time on the model's device, with products in `precision`. A
// sentence the tokenizer refuses (not UTF-8) throws naming it: name(s) when given (e.g. the
// file and line it came from), else its number from 1.
Tensor embed(const PretrainedModel& m, const std::vector<std::string>& sentences, int64_t batch,
             Precision precision, Generator& gen,
             const std::function<std::string(size_t)>& name = {});

}  // namespace clustr::text

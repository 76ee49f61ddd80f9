// A BERT-family encoder (Devlin et al. 2019) that loads other frameworks' pretrained weights:
// the embeddings (token + position + token type, then a layer norm), a post-norm stack of
// clustr's EncoderLayer with GELU, and BERT's first-token pooler; mean pooling and L2
// normalisation as sentence-transformers computes a sentence embedding. Any attention type
// runs in the layers (`set_attention`), so a model trained with full attention can be evaluated
// with clustered attention without retraining (the paper's Table 4).
//
// Legend: B batch, N positions, D model width (hidden), H heads, F feed-forward width
// (intermediate), V vocabulary, P positions the model knows (max_positions), T token types.
//
// clustr's parameter names and the names of Hugging Face's BertModel that map to them (a file
// may prefix the latter with "bert.", as BertForMaskedLM and its relatives save them):
//   embeddings.word.weight (V, D)           embeddings.word_embeddings.weight
//   embeddings.position.weight (P, D)       embeddings.position_embeddings.weight
//   embeddings.token_type.weight (T, D)     embeddings.token_type_embeddings.weight
//   embeddings.norm.weight/bias (D)         embeddings.LayerNorm.weight/bias
//   encoder.layers.i.attention.query/key/value.weight (D, D), .bias (D)
//                                           encoder.layer.i.attention.self.query/key/value.*
//   encoder.layers.i.attention.out.*        encoder.layer.i.attention.output.dense.*
//   encoder.layers.i.norm1.*                encoder.layer.i.attention.output.LayerNorm.*
//   encoder.layers.i.feedforward.linear1.* (F, D), (F)   encoder.layer.i.intermediate.dense.*
//   encoder.layers.i.feedforward.linear2.* (D, F), (D)   encoder.layer.i.output.dense.*
//   encoder.layers.i.norm2.*                encoder.layer.i.output.LayerNorm.*
//   pooler.weight (D, D), pooler.bias (D)   pooler.dense.weight/bias
// One difference from BertModel in training: EncoderLayer's feed-forward block applies dropout
// after the activation as well (PyTorch's TransformerEncoderLayer does; BERT does not). Outputs
// without dropout (evaluation) are the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/attention/config.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/encoder.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace clustr {

// The encoder's sizes, as Hugging Face's BertConfig (config.json) states them; defaults are
// all-MiniLM-L6-v2's.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden = 384;
  int64_t layers = 6;
  int64_t heads = 12;
  int64_t intermediate = 1536;
  int64_t max_positions = 512;
  int64_t type_vocab_size = 2;
  float layer_norm_eps = 1e-12f;
  float dropout = 0.1f;            // hidden_dropout_prob: embeddings and residual branches
  float attention_dropout = 0.1f;  // attention_probs_dropout_prob
  Activation activation = Activation::gelu;

  // Reads a config.json. Throws clustr::Error naming the file and the key for a missing or
  // mistyped entry, and for what this model does not implement (a model_type other than bert,
  // an activation other than gelu or relu, position embeddings other than absolute).
  static BertConfig read(const std::string& path);
  // The config.json text that read() reads back (model_type bert, Hugging Face's key names).
  std::string to_json() const;
  // Throws clustr::Error for sizes that cannot make a model (e.g. D not a multiple of H).
  void validate() const;
};

// Token, position and token-type embeddings, summed, layer-normalised and dropped out.
// Submodules "word", "position", "token_type" (Embedding) and "norm" (LayerNorm).
class BertEmbeddings : public Module {
 public:
  BertEmbeddings(const BertConfig& config, Generator& gen);

  // ids i32 (B, N) in [0, V); types i32 (B, N) in [0, T) or undefined (all 0) -> (B, N, D).
  // Position n gets row n of the position table (N <= P).
  Variable forward(const Tensor& ids, const Tensor& types, Generator& gen) const;

  Embedding& word() const { return *word_; }

 private:
  std::shared_ptr<Embedding> word_, position_, token_type_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Dropout> dropout_;
};

class BertModel : public Module {
 public:
  // A model of `config`'s sizes, initialised as BERT is (weights normal(0, 0.02), biases 0,
  // layer norms 1 and 0), with `attention` in every layer.
  BertModel(const BertConfig& config, const AttentionConfig& attention, Generator& gen);

  // ids, types as BertEmbeddings; lengths i32 (B), the valid length of each row (padding at
  // the end, as BERT's attention mask), or undefined (all N valid) -> (B, N, D), the last
  // layer's token outputs. Rows past a sequence's length are 0: the layers run on the valid
  // tokens alone, packed (layers/token_packing.h); lengths are read on the host for that.
  Variable forward(const Tensor& ids, const Tensor& types, const Tensor& lengths,
                   Generator& gen) const;
  // BERT's pooler: tanh(pooler(tokens[:, 0])), tokens (B, N, D) -> (B, D).
  Variable pool_first(const Variable& tokens) const;

  const BertConfig& config() const { return config_; }
  BertEmbeddings& embeddings() const { return *embeddings_; }
  Encoder& encoder() const { return *encoder_; }
  Linear& pooler() const { return *pooler_; }
  // The attention of every layer (e.g. clustered attention on a model trained with full).
  void set_attention(const AttentionConfig& attention) { encoder_->set_attention(attention); }

 private:
  BertConfig config_;
  std::shared_ptr<BertEmbeddings> embeddings_;
  std::shared_ptr<Encoder> encoder_;
  std::shared_ptr<Linear> pooler_;
};

// BERT's masked-language-model head (BertForMaskedLM's cls.predictions): a dense layer D -> D,
// the model's activation and a layer norm, then a score for every piece of the vocabulary from
// the word embeddings' own table (tied, as BERT ties them) plus a bias. Submodules "transform"
// (Linear) and "norm" (LayerNorm), parameter "bias" (V); initialised as BERT's (normal(0, 0.02)
// weights, zero biases).
class MaskedLmHead : public Module {
 public:
  MaskedLmHead(const BertConfig& config, Generator& gen);
  // x (..., D) token outputs, table the model's word embeddings (V, D) -> (..., V) logits.
  Variable forward(const Variable& x, const Variable& table) const;

 private:
  BertConfig config_;
  std::shared_ptr<Linear> transform_;
  std::shared_ptr<LayerNorm> norm_;
  Variable bias_;
};

// The mean of each row's first lengths[b] token vectors (sentence-transformers' mean pooling):
// tokens (B, N, D), lengths i32 (B) on any device, each in [1, N] -> (B, D).
Variable mean_pool(const Variable& tokens, const Tensor& lengths);
// Each row divided by its L2 norm (torch.nn.functional.normalize, the sentence model's last
// module): x (B, D) -> (B, D). A zero row stays zero.
Variable l2_normalize(const Variable& x);

// The Hugging Face name of clustr parameter `name` of a BertModel (table above); throws
// clustr::Error for a name the table does not cover.
std::string bert_reference_name(const std::string& name);

// What load_bert_weights found besides the parameters it copied.
struct BertWeightsReport {
  std::vector<std::string> ignored;  // tensors of the file that no parameter reads (listed)
};

// Copies the weights of a Hugging Face BERT checkpoint (a safetensors file, float32 or bf16,
// names as in the table, with or without "bert.") into `model`. Tensors that a BertModel does
// not have but such files carry are ignored and reported: the masked-LM and next-sentence
// heads (cls.*) and the position_ids buffer. Throws clustr::Error, with the model unchanged,
// listing every problem one per line: a parameter the file lacks, a tensor of an unexpected
// name, a shape that differs from the model's.
BertWeightsReport load_bert_weights(const std::string& path, BertModel& model);

}  // namespace clustr

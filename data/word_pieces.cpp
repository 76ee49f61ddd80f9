#include "data/word_pieces.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/file_reason.h"

#if CLUSTR_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace clustr {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWordStart = "\xE2\x96\x81";  // "▁", U+2581: a piece that starts a word

bool starts_word(const std::string& piece) { return piece.rfind(kWordStart, 0) == 0; }

#if CLUSTR_WITH_SENTENCEPIECE
// SentencePiece's messages begin with its source position ("./src/x.cc(660) [condition] "):
// the reason is what follows.
std::string reason(const sentencepiece::util::Status& s) {
  std::string m = s.message();
  const size_t cut = m.find("] ");
  if (m.rfind("./src/", 0) == 0 && cut != std::string::npos) m = m.substr(cut + 2);
  return m.empty() ? s.ToString() : m;
}

class Sentences : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};
#else
[[noreturn]] void no_sentencepiece() {
  throw Error(
      "word pieces: this build has no SentencePiece (install libsentencepiece-dev and "
      "configure again)");
}
#endif

}  // namespace

#if CLUSTR_WITH_SENTENCEPIECE
struct WordPieces::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string proto;  // the serialized model, for save()
};
#else
struct WordPieces::Impl {};
#endif

WordPieces::WordPieces() : impl_(std::make_unique<Impl>()) {}
WordPieces::WordPieces(WordPieces&&) noexcept = default;
WordPieces& WordPieces::operator=(WordPieces&&) noexcept = default;
WordPieces::~WordPieces() = default;

#if CLUSTR_WITH_SENTENCEPIECE

WordPieces WordPieces::train(const std::vector<std::string>& sentences, int vocab_size,
                             const WordPieceOptions& options) {
  CLUSTR_CHECK(!sentences.empty(), "word pieces: no transcripts to learn them from");
  CLUSTR_CHECK(vocab_size >= 2, "word pieces: the vocabulary size must be at least 2, got ",
               vocab_size);
  WordPieces w;
  Sentences it(sentences);
  std::string controls;
  for (const std::string& c : options.control_symbols)
    controls += (controls.empty() ? "" : ",") + c;
  std::unordered_map<std::string, std::string> args = {
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "unigram"},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"normalization_rule_name", options.normalization},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"unk_id", "0"},
      {"num_threads", "1"},          // the model depends on the sentences alone
      {"input_sentence_size", "0"},  // all of them, no sampling
      {"max_sentence_length", "65536"},
      {"minloglevel", "2"}};
  if (!controls.empty()) args["control_symbols"] = controls;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &w.impl_->proto);
  CLUSTR_CHECK(st.ok(), "word pieces: cannot learn ", vocab_size, " pieces from ", sentences.size(),
               " transcripts: ", reason(st));
  const auto ld = w.impl_->sp.LoadFromSerializedProto(w.impl_->proto);
  CLUSTR_CHECK(ld.ok(), "word pieces: the learnt model does not load: ", reason(ld));
  return w;
}

WordPieces WordPieces::load(const std::string& path) {
  const std::string why = unreadable_reason(path);
  CLUSTR_CHECK(why.empty(), "word pieces: cannot read ", path, ": ", why);
  std::ifstream in(path, std::ios::binary);
  CLUSTR_CHECK(in.good(), "word pieces: cannot read ", path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  WordPieces w;
  w.impl_->proto = bytes.str();
  sentencepiece::util::Status st;
  try {
    st = w.impl_->sp.LoadFromSerializedProto(w.impl_->proto);
  } catch (const std::exception& e) {
    // SentencePiece's trie builder throws on some malformed piece lists (an empty piece, a NUL
    // byte in one) instead of returning a status.
    throw Error(detail::cat("word pieces: ", path, " is not a SentencePiece model (", e.what(),
                            ")"));
  }
  CLUSTR_CHECK(st.ok() && w.impl_->sp.GetPieceSize() > 1, "word pieces: ", path,
               " is not a SentencePiece model (", st.ok() ? "no pieces" : reason(st), ")");
  return w;
}

void WordPieces::save(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    CLUSTR_CHECK(out.good(), "word pieces: cannot write ", tmp);
    out.write(impl_->proto.data(), std::streamsize(impl_->proto.size()));
    out.flush();
    CLUSTR_CHECK(out.good(), "word pieces: cannot write ", tmp);
  }
  fs::rename(tmp, path, ec);
  CLUSTR_CHECK(!ec, "word pieces: cannot rename ", tmp, " to ", path, ": ", ec.message());
}

std::vector<std::string> WordPieces::pieces() const {
  std::vector<std::string> out;
  for (int i = 0; i < impl_->sp.GetPieceSize(); ++i)
    if (!impl_->sp.IsUnknown(i) && !impl_->sp.IsControl(i)) out.push_back(impl_->sp.IdToPiece(i));
  return out;
}

std::vector<std::string> WordPieces::encode(const std::string& sentence) const {
  std::vector<int> ids;
  std::vector<std::string> out;  // an unknown stretch comes out as its characters
  auto st = impl_->sp.Encode(sentence, &ids);
  if (st.ok()) st = impl_->sp.Encode(sentence, &out);
  CLUSTR_CHECK(st.ok() && ids.size() == out.size(), "word pieces: cannot encode '", sentence,
               "': ", st.ok() ? "the pieces and their ids disagree" : reason(st));
  for (size_t i = 0; i < ids.size(); ++i)
    CLUSTR_CHECK(!impl_->sp.IsUnknown(ids[i]), "the characters '",
                 starts_word(out[i]) ? out[i].substr(3) : out[i], "' are in no word piece");
  return out;
}

std::vector<int32_t> WordPieces::encode_ids(const std::string& text) const {
  std::vector<int> ids;
  const auto st = impl_->sp.Encode(text, &ids);
  CLUSTR_CHECK(st.ok(), "word pieces: cannot encode '", text, "': ", reason(st));
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string WordPieces::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in;
  for (int32_t i : ids) {
    CLUSTR_CHECK(i >= 0 && i < size(), "word pieces: id ", i, " is outside the vocabulary's [0, ",
                 size(), ")");
    in.push_back(i);
  }
  std::string text;
  const auto st = impl_->sp.Decode(in, &text);
  CLUSTR_CHECK(st.ok(), "word pieces: cannot decode: ", reason(st));
  return text;
}

int32_t WordPieces::size() const { return impl_->sp.GetPieceSize(); }

int32_t WordPieces::id(const std::string& piece) const {
  const int i = impl_->sp.PieceToId(piece);
  return impl_->sp.IdToPiece(i) == piece ? i : -1;
}

std::string WordPieces::piece(int32_t id) const {
  CLUSTR_CHECK(id >= 0 && id < size(), "word pieces: id ", id, " is outside the vocabulary's [0, ",
               size(), ")");
  return impl_->sp.IdToPiece(id);
}

#else

WordPieces WordPieces::train(const std::vector<std::string>&, int, const WordPieceOptions&) {
  no_sentencepiece();
}
std::vector<int32_t> WordPieces::encode_ids(const std::string&) const { no_sentencepiece(); }
std::string WordPieces::decode(const std::vector<int32_t>&) const { no_sentencepiece(); }
int32_t WordPieces::size() const { no_sentencepiece(); }
int32_t WordPieces::id(const std::string&) const { no_sentencepiece(); }
std::string WordPieces::piece(int32_t) const { no_sentencepiece(); }
WordPieces WordPieces::load(const std::string&) { no_sentencepiece(); }
void WordPieces::save(const std::string&) const { no_sentencepiece(); }
std::vector<std::string> WordPieces::pieces() const { no_sentencepiece(); }
std::vector<std::string> WordPieces::encode(const std::string&) const { no_sentencepiece(); }

#endif

bool labels_spell_words(const TokenTable& tokens) {
  for (const std::string& t : tokens.tokens)
    if (t == "|" || starts_word(t)) return true;
  return false;
}

std::vector<std::string> label_words(const TokenTable& tokens, const std::vector<int32_t>& labels) {
  std::vector<std::string> words;
  bool open = false;  // the last word may still grow
  for (int32_t l : labels) {
    CLUSTR_CHECK(l > 0 && l < tokens.size(), "label_words: label ", l, " is not a token");
    std::string t = tokens.tokens[size_t(l)];
    if (t == "|") {
      open = false;
      continue;
    }
    if (starts_word(t)) {
      t = t.substr(3);
      open = false;
    }
    if (t.empty()) continue;  // a lone "▁": the next piece starts the word
    if (open)
      words.back() += t;
    else
      words.push_back(t);
    open = true;
  }
  return words;
}

ErrorRate word_errors(const TokenTable& tokens, const std::vector<LabelSequence>& references,
                      const std::vector<LabelSequence>& hypotheses) {
  CLUSTR_CHECK(references.size() == hypotheses.size(), "word_errors: ", references.size(),
               " references against ", hypotheses.size(), " hypotheses");
  std::unordered_map<std::string, int32_t> ids;
  auto as_ids = [&](const LabelSequence& labels) {
    LabelSequence out;
    for (const std::string& w : label_words(tokens, labels))
      out.push_back(ids.emplace(w, int32_t(ids.size())).first->second);
    return out;
  };
  ErrorRate e;
  for (size_t i = 0; i < references.size(); ++i)
    e.add(as_ids(references[i]), as_ids(hypotheses[i]));
  return e;
}

}  // namespace clustr

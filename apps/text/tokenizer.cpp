// The tokenizer of a model folder (see tokenizer.h).
#include "apps/text/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace clustr::text {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  CLUSTR_CHECK(in, "cannot open ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::cat(path, ": not valid JSON (", e.what(), ")"));
  }
}

bool json_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& path) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  CLUSTR_CHECK(j[key].is_boolean(), path, ": expected \"", key, "\" to be true or false, got ",
               j[key].dump());
  return j[key].get<bool>();
}

namespace {

// tokenizer_config.json's do_lower_case (true when the file or the key is absent).
bool lower_case_of(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return true;
  return json_bool(read_json_file(path), "do_lower_case", true, path);
}

}  // namespace

TextTokenizer TextTokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "vocab.txt"))
    return TextTokenizer(BertTokenizer::load(dir + "/vocab.txt", lower_case_of(dir)));
  const std::string model = dir + "/pieces.model";
  CLUSTR_CHECK(fs::exists(model), dir, ": the model folder has no tokenizer (expected vocab.txt, "
               "a WordPiece vocabulary, or pieces.model, a SentencePiece model)");
  return TextTokenizer(WordPieces::load(model), model);
}

TextTokenizer::TextTokenizer(BertTokenizer tokenizer)
    : bert_(std::make_shared<const BertTokenizer>(std::move(tokenizer))),
      pad_(bert_->pad_id()),
      cls_(bert_->cls_id()),
      sep_(bert_->sep_id()),
      mask_(bert_->mask_id()) {}

TextTokenizer::TextTokenizer(WordPieces pieces, const std::string& source)
    : pieces_(std::make_shared<const WordPieces>(std::move(pieces))) {
  int32_t* ids[] = {&pad_, &cls_, &sep_, &mask_};
  for (size_t i = 0; i < kSpecialPieces.size(); ++i) {
    *ids[i] = pieces_->id(kSpecialPieces[i]);
    CLUSTR_CHECK(*ids[i] >= 0, source, ": the SentencePiece model has no ", kSpecialPieces[i],
                 " piece (expected [PAD] [CLS] [SEP] [MASK] as control pieces, as `text "
                 "pretrain` writes them)");
  }
}

std::vector<int32_t> TextTokenizer::encode(const std::string& text) const {
  return bert_ ? bert_->encode(text) : pieces_->encode_ids(text);
}

BertEncoding TextTokenizer::encode(const std::string& a, const std::string* b,
                                   int max_length) const {
  check_room(max_length, b != nullptr);
  std::vector<int32_t> ib;
  if (b) ib = encode(*b);
  return bert_inputs(encode(a), b ? &ib : nullptr, max_length, cls_, sep_);
}

std::string TextTokenizer::text(const std::vector<int32_t>& ids, int64_t first,
                                int64_t last) const {
  CLUSTR_CHECK(first >= 0 && last < static_cast<int64_t>(ids.size()), "text: pieces [", first,
               ", ", last, "] of ", ids.size());
  if (pieces_)
    return pieces_->decode(std::vector<int32_t>(ids.begin() + first, ids.begin() + last + 1));
  std::string text;
  for (int64_t i = first; i <= last; ++i) {
    const std::string& p = bert_->piece(ids[i]);
    if (p.rfind("##", 0) == 0)
      text += p.substr(2);
    else
      text += (text.empty() ? "" : " ") + p;
  }
  return text;
}

int32_t TextTokenizer::size() const { return bert_ ? bert_->size() : pieces_->size(); }

}  // namespace clustr::text

#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/mmap_file.h"
#include "format/model_file.h"
#include "tokenizer/hf_common.h"
#include "tokenizer/loaders.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizer.h"

namespace shoal {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, special);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id, special_);
  const size_t n = tok::utf8_complete_prefix(pending_);
  std::string out = tok::replace_ill_formed_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tok::replace_ill_formed_utf8(pending_);
  pending_.clear();
  return out;
}

namespace {

// config.json / generation_config.json ids override the tokenizer's own for SentencePiece
// folders (whose token names tokenizer_config.json cannot resolve), and fill gaps otherwise.
Result<std::unique_ptr<Tokenizer>> make(Result<tok::Vocab> vocab, const json& model_config = json(),
                                        const json& generation_config = json()) {
  if (!vocab.ok()) return vocab.status();
  const bool sp = vocab->type == tok::VocabType::kSpm;
  tok::apply_model_config(*vocab, model_config, sp);
  tok::apply_model_config(*vocab, generation_config, sp);
  SHOAL_ASSIGN_OR_RETURN(auto t, tok::VocabTokenizer::create(std::move(vocab).value()));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

// A JSON file beside the tokenizer, or null when it is not there.
Result<json> optional_json(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return json();
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(p.string()));
  return tok::parse_json(text, p.string());
}

bool looks_like_tiktoken(std::string_view data) {
  const size_t eol = std::min(data.find('\n'), data.size());
  const std::string_view line = data.substr(0, eol);
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size()) return false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    const bool ok = i < sp ? (std::isalnum(uint8_t(c)) || c == '+' || c == '/' || c == '=')
                           : i == sp || std::isdigit(uint8_t(c)) || (c == '\r' && i + 1 == line.size());
    if (!ok) return false;
  }
  return true;
}

// tokenizer.model: tiktoken text or a SentencePiece protobuf.
Result<tok::Vocab> load_tokenizer_model(const fs::path& file, const json& tok_config) {
  SHOAL_ASSIGN_OR_RETURN(std::string data, read_file(file.string()));
  if (looks_like_tiktoken(data)) return tok::vocab_from_tiktoken(data, file.string());
  return tok::vocab_from_sentencepiece(data, tok_config, file.string());
}

// An HF folder: tokenizer.json, else vocab.json + merges.txt, else tokenizer.model.
Result<std::unique_ptr<Tokenizer>> load_from_folder(const fs::path& dir, const json* model_config) {
  std::error_code ec;
  SHOAL_ASSIGN_OR_RETURN(json tok_config, optional_json(dir / "tokenizer_config.json"));
  json cfg;
  if (model_config) {
    cfg = *model_config;
  } else {
    SHOAL_ASSIGN_OR_RETURN(cfg, optional_json(dir / "config.json"));
  }
  SHOAL_ASSIGN_OR_RETURN(json gen, optional_json(dir / "generation_config.json"));
  if (fs::is_regular_file(dir / "tokenizer.json", ec)) {
    SHOAL_ASSIGN_OR_RETURN(std::string text, read_file((dir / "tokenizer.json").string()));
    return make(tok::vocab_from_tokenizer_json(text, tok_config, (dir / "tokenizer.json").string()), cfg, gen);
  }
  if (fs::is_regular_file(dir / "vocab.json", ec) && fs::is_regular_file(dir / "merges.txt", ec)) {
    SHOAL_ASSIGN_OR_RETURN(std::string vocab, read_file((dir / "vocab.json").string()));
    SHOAL_ASSIGN_OR_RETURN(std::string merges, read_file((dir / "merges.txt").string()));
    return make(tok::vocab_from_vocab_merges(vocab, merges, tok_config, dir.string()), cfg, gen);
  }
  if (fs::is_regular_file(dir / "tokenizer.model", ec)) {
    return make(load_tokenizer_model(dir / "tokenizer.model", tok_config), cfg, gen);
  }
  return make_error(Code::kNotFound,
                    "{}: no tokenizer (looked for tokenizer.json, vocab.json + merges.txt, tokenizer.model)",
                    dir.string());
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFile& model) {
  if (model.format == ModelFormat::kGguf) return make(tok::vocab_from_gguf(model.metadata, model.path));
  // A checkpoint folder, or one .safetensors file whose side files sit beside it.
  std::error_code ec;
  const fs::path path(model.path);
  return load_from_folder(fs::is_regular_file(path, ec) ? path.parent_path() : path, &model.hf_config);
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_from_path(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return load_from_folder(p, nullptr);
  if (!fs::exists(p, ec)) return make_error(Code::kNotFound, "'{}': no such file or folder", path);
  if (!fs::is_regular_file(p, ec)) return make_error(Code::kInvalidArgument, "'{}' is not a regular file", path);
  // tokenizer.json, or a checkpoint's weights (one .safetensors file, its shard index): the folder.
  if (p.filename() == "tokenizer.json" || p.extension() == ".safetensors" ||
      p.filename() == "model.safetensors.index.json") {
    return load_from_folder(p.has_parent_path() ? p.parent_path() : fs::path("."), nullptr);
  }
  SHOAL_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  // A .gguf name or the GGUF magic: the GGUF parser's errors (truncated, bad magic) name the problem.
  if (p.extension() == ".gguf" ||
      (f.size() >= 4 && std::string_view(reinterpret_cast<const char*>(f.data()), 4) == "GGUF")) {
    SHOAL_ASSIGN_OR_RETURN(ModelFile mf, open_model_file(path));
    return load_tokenizer(mf);
  }
  SHOAL_ASSIGN_OR_RETURN(json tok_config, optional_json(p.parent_path() / "tokenizer_config.json"));
  Result<tok::Vocab> vocab = load_tokenizer_model(p, tok_config);
  if (!vocab.ok() && p.filename() != "tokenizer.model") {  // any other file: say what was tried
    return Status(vocab.status().code(),
                  fmt::format("'{}' is not a tokenizer Shoal reads (a GGUF file, tokenizer.json, a SentencePiece or "
                              "tiktoken tokenizer.model, or a folder holding one); as a tokenizer.model: {}",
                              path, vocab.status().message()));
  }
  return make(std::move(vocab));
}

}  // namespace shoal

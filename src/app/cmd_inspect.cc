// `shoal inspect MODEL [--json]`: what a model file holds -- format, metadata (arrays
// abbreviated), a tokenizer summary, and the tensor table with totals. Reads only headers.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common_options.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "format/json_doc.h"
#include "format/model_file.h"

namespace shoal::app {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kShownItems = 8;  // array items shown before "..."

// Metadata value as JSON; arrays abbreviated to their type, count and first items.
json meta_json(const MetaValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  if (const auto* s = v.as_string()) return *s;
  const auto& items = *v.as_array();
  json head = json::array();
  for (size_t i = 0; i < items.size() && i < kShownItems; ++i) head.push_back(meta_json(items[i]));
  return {{"type", "array"}, {"elem_type", meta_type_name(v.elem_type)}, {"count", items.size()},
          {"head", head}};
}

// The folder holding an HF model's side files (tokenizer.json, config.json...).
fs::path hf_folder(const ModelFile& m) {
  return fs::is_directory(m.path) ? fs::path(m.path) : fs::path(m.path).parent_path();
}

std::optional<json> read_json(const fs::path& p) {
  auto text = read_file(p.string());
  if (!text.ok()) return std::nullopt;
  auto j = parse_json_doc(*text, p.string());
  if (!j.ok()) return std::nullopt;
  return std::move(*j);
}

// Tokenizer facts from GGUF metadata or from tokenizer.json / tokenizer.model + config.json.
json tokenizer_summary(const ModelFile& m) {
  json t = json::object();
  if (m.format == ModelFormat::kGguf) {
    const Metadata& md = m.metadata;
    if (auto s = md.get_string("tokenizer.ggml.model")) t["model"] = *s;
    if (auto s = md.get_string("tokenizer.ggml.pre")) t["pre_tokenizer"] = *s;
    if (const MetaValue* tok = md.find("tokenizer.ggml.tokens"); tok && tok->as_array()) {
      t["vocab_size"] = tok->as_array()->size();
    }
    if (const MetaValue* mg = md.find("tokenizer.ggml.merges"); mg && mg->as_array()) {
      t["merges"] = mg->as_array()->size();
    }
    for (const char* k : {"bos", "eos", "unknown", "padding"}) {
      if (auto id = md.get_int(fmt::format("tokenizer.ggml.{}_token_id", k))) t[std::string(k) + "_id"] = *id;
    }
    t["chat_template"] = md.find("tokenizer.chat_template") != nullptr;
    return t;
  }
  const fs::path dir = hf_folder(m);
  if (auto tj = read_json(dir / "tokenizer.json"); tj && tj->is_object()) {
    t["source"] = "tokenizer.json";
    const json& model = (*tj)["model"];
    if (model.is_object()) {
      if (model.contains("type")) t["model"] = model["type"];
      if (model.contains("vocab") && (model["vocab"].is_object() || model["vocab"].is_array())) {
        t["vocab_size"] = model["vocab"].size();
      }
      if (model.contains("merges") && model["merges"].is_array()) t["merges"] = model["merges"].size();
    }
    if ((*tj)["added_tokens"].is_array()) t["added_tokens"] = (*tj)["added_tokens"].size();
    const json& pre = (*tj)["pre_tokenizer"];
    if (pre.is_object() && pre.contains("type")) t["pre_tokenizer"] = pre["type"];
  } else if (fs::exists(dir / "tokenizer.model")) {
    t["source"] = "tokenizer.model";
    t["model"] = "sentencepiece";
  }
  const json& cfg = m.hf_config.is_object() && m.hf_config.contains("text_config")
                        ? m.hf_config["text_config"] : m.hf_config;
  if (cfg.is_object()) {
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (cfg.contains(k) && !cfg[k].is_null()) t[std::string(k, std::strlen(k) - 9) + "_id"] = cfg[k];
    }
    if (cfg.contains("vocab_size")) t["config_vocab_size"] = cfg["vocab_size"];
  }
  if (auto tc = read_json(dir / "tokenizer_config.json"); tc && tc->is_object()) {
    t["chat_template"] = tc->contains("chat_template") || fs::exists(dir / "chat_template.jinja");
  }
  return t;
}

json tensor_json(const TensorInfo& t) {
  return {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
          {"source", t.source}, {"offset", t.offset}, {"nbytes", t.nbytes}};
}

json model_json(const ModelFile& m) {
  json j;
  j["path"] = m.path;
  j["format"] = m.format == ModelFormat::kGguf ? "gguf" : "huggingface";
  j["file_size"] = m.file_size;
  const auto identity = model_identity(m);
  j["identity_hash"] = fmt::format("{:016x}", identity.ok() ? *identity : 0);
  json sources = json::array();
  for (const auto& s : m.sources) sources.push_back({{"path", s->describe()}, {"size", s->size()}});
  j["sources"] = sources;
  if (m.format == ModelFormat::kGguf) {
    json md = json::object();
    for (const auto& [k, v] : m.metadata.entries()) md[k] = meta_json(v);
    j["metadata"] = md;
  } else {
    j["hf_config"] = m.hf_config;
  }
  j["tokenizer"] = tokenizer_summary(m);
  json ts = json::array();
  int64_t params = 0;
  for (const TensorInfo& t : m.index.tensors()) {
    ts.push_back(tensor_json(t));
    params += t.n_elements();
  }
  j["tensors"] = ts;
  j["totals"] = {{"tensors", m.index.size()}, {"bytes", m.index.total_bytes()}, {"parameters", params}};
  return j;
}

std::string human_bytes(uint64_t n) {
  if (n >= (1ull << 30)) return fmt::format("{:.2f} GiB", double(n) / double(1ull << 30));
  if (n >= (1ull << 20)) return fmt::format("{:.2f} MiB", double(n) / double(1ull << 20));
  if (n >= (1ull << 10)) return fmt::format("{:.2f} KiB", double(n) / double(1ull << 10));
  return fmt::format("{} B", n);
}

// `s`, or its first bytes and "..." within `max` bytes, cut before a character (never inside one's
// UTF-8 form).
std::string shortened(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max - 3;
  while (n > 0 && (uint8_t(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

// At most 120 bytes; C1 controls escaped (the JSON text escapes C0 ones).
std::string json_scalar(const json& v) {
  return shortened(escape_unprintable(v.dump(-1, ' ', false, json::error_handler_t::replace)), 120);
}

void print_text(const ModelFile& m) {
  const bool gguf = m.format == ModelFormat::kGguf;
  fmt::print("model:     {}\n", m.path);
  fmt::print("format:    {}\n", gguf ? "GGUF" : fmt::format("Hugging Face safetensors ({} file{})",
                                                             m.sources.size(), m.sources.size() == 1 ? "" : "s"));
  fmt::print("size:      {} bytes ({})\n", m.file_size, human_bytes(m.file_size));
  const auto identity = model_identity(m);  // what the pool compares between host and workers
  fmt::print("identity:  {:016x}\n", identity.ok() ? *identity : 0);
  if (gguf) {
    fmt::print("\nmetadata ({} keys):\n", m.metadata.size());
    for (const auto& [k, v] : m.metadata.entries()) {
      fmt::print("  {} = {}\n", escape_unprintable(k), shortened(v.to_string(kShownItems), 160));
    }
  } else if (m.hf_config.is_object()) {
    fmt::print("\nconfig.json ({} keys):\n", m.hf_config.size());
    for (const auto& [k, v] : m.hf_config.items()) fmt::print("  {} = {}\n", escape_unprintable(k), json_scalar(v));
  }
  fmt::print("\ntokenizer:\n");
  const json tok = tokenizer_summary(m);
  if (tok.empty()) fmt::print("  (none found)\n");
  for (const auto& [k, v] : tok.items()) fmt::print("  {}: {}\n", k, json_scalar(v));

  size_t w = 4;
  for (const TensorInfo& t : m.index.tensors()) w = std::max(w, escape_unprintable(t.name).size());
  fmt::print("\ntensors ({}):\n", m.index.size());
  fmt::print("  {:<{}}  {:<7} {:<22} {:>3} {:>12} {:>12}\n", "name", w, "type", "shape", "src", "offset",
             "bytes");
  int64_t params = 0;
  for (const TensorInfo& t : m.index.tensors()) {
    fmt::print("  {:<{}}  {:<7} {:<22} {:>3} {:>12} {:>12}\n", escape_unprintable(t.name), w, dtype_name(t.dtype),
               t.shape_string(), t.source, t.offset, t.nbytes);
    params += t.n_elements();
  }
  fmt::print("\ntotal: {} tensors, {} parameters, {} bytes ({})\n", m.index.size(), params,
             m.index.total_bytes(), human_bytes(m.index.total_bytes()));
}

}  // namespace

CommandFn add_inspect_command(CLI::App& app) {
  struct Opts {
    std::string model;
    bool json = false;
  };
  auto opts = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "Show a model file's format, metadata, tokenizer summary and tensor table");
  // The model as a positional or as -m (llama.cpp style), described once; one of them is required
  // (CLI11's error and exit status when neither).
  CLI::Option* positional = sub->add_option(
      "model", opts->model, "a .gguf file, a .safetensors file or a Hugging Face checkpoint folder");
  CLI::Option* flag = sub->add_option("-m,--model", opts->model, "the same, as a flag (one of the two)");
  sub->callback([opts, positional, flag] {
    if (positional->count() > 0 && flag->count() > 0) throw CLI::ExcludesError("model", "--model");
    if (opts->model.empty()) throw CLI::RequiredError("model");
  });
  sub->add_flag("--json", opts->json, "print one JSON object instead of text");
  return [opts]() -> int {
    auto m = open_model_file(opts->model);
    if (!m.ok()) return fail(m.status());
    if (opts->json) {
      fmt::print("{}\n", model_json(*m).dump(2, ' ', false, json::error_handler_t::replace));
    } else {
      print_text(*m);
    }
    return 0;
  };
}

}  // namespace shoal::app

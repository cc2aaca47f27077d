#include "runtime/local_model.h"

#include <algorithm>
#include <filesystem>

#include "core/log.h"

namespace shoal {

Result<LocalModel> open_model(const std::string& path, bool with_tokenizer) {
  LocalModel m;
  // One .safetensors file runs as a model with its config.json beside it, but not a file beside a
  // shard index (one shard of several: the others hold the rest of the layers).
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (p.extension() == ".safetensors" && fs::is_regular_file(p, ec)) {
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (p.filename() != "model.safetensors" && fs::exists(dir / "model.safetensors.index.json", ec)) {
      return make_error(Code::kInvalidArgument, "'{}' sits beside a model.safetensors.index.json, which names the "
                        "checkpoint's shards: give the folder, '{}'", path, dir.string());
    }
    if (!fs::exists(dir / "config.json", ec)) {
      return make_error(Code::kNotFound, "'{}' has no config.json beside it (a Hugging Face checkpoint's folder "
                        "holds its config.json, its weights and its tokenizer)", path);
    }
  }
  SHOAL_ASSIGN_OR_RETURN(ModelFile f, open_model_file(path));
  m.file = std::make_unique<ModelFile>(std::move(f));
  if (m.file->format == ModelFormat::kGguf && m.file->index.size() == 0) {
    return make_error(Code::kInvalidArgument, "'{}' holds no tensors: a vocab-only GGUF (its tokenizer alone, "
                      "which `shoal tokenize` reads), not a model", path);
  }
  SHOAL_ASSIGN_OR_RETURN(m.arch, find_architecture(*m.file));
  SHOAL_ASSIGN_OR_RETURN(m.config, load_model_config(*m.file));
  SHOAL_ASSIGN_OR_RETURN(m.weights, map_weights(*m.file, *m.arch));
  if (Status st = m.weights.layers_within(m.config.n_layers); !st.ok()) return st.with_context(path);
  // As transformers' "Some weights of the model checkpoint were not used": tensors of another
  // variant of the family (a bias, a norm this graph does not have) compute something else.
  std::vector<std::string> unused = m.weights.unmapped();
  for (const std::string& name : unused_tensors(m.config, m.weights)) {
    const TensorInfo* t = m.weights.find(name);  // (named as the file names it)
    unused.push_back(t ? t->name : name);
  }
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < std::min<size_t>(unused.size(), 3); ++i)
      names += fmt::format("{}'{}'", i ? ", " : "", escape_unprintable(unused[i]));
    spdlog::warn("{}: {} tensor{} of the model {} not read by Shoal's {} graph ({}{}); its output may differ from the "
                 "reference implementation's", path, unused.size(), unused.size() == 1 ? "" : "s",
                 unused.size() == 1 ? "is" : "are", m.config.arch, names, unused.size() > 3 ? ", ..." : "");
  }
  if (with_tokenizer) {
    auto tok = load_tokenizer(*m.file);
    if (!tok.ok()) return tok.status().with_context("loading the tokenizer of " + path);
    // A GGUF file's token list and its embedding's rows are one vocabulary (llama.cpp sizes
    // token_embd.weight by the list and refuses a tensor of another shape); ids past a shorter list
    // would print as nothing. (A Hugging Face config's vocab_size may exceed its tokenizer's:
    // padded embeddings are common.)
    const TensorInfo* embd = m.file->index.find("token_embd.weight");
    if (m.file->format == ModelFormat::kGguf && embd && !embd->shape.empty() &&
        int64_t((*tok)->vocab_size()) != embd->shape[0]) {
      return make_error(Code::kCorrupt, "{}: its tokenizer has {} tokens, but token_embd.weight has {} rows", path,
                        (*tok)->vocab_size(), embd->shape[0]);
    }
    if ((*tok)->vocab_size() > m.config.vocab_size) {  // (a tokenizer of another model, likely)
      spdlog::warn("{}: its tokenizer has {} tokens, more than the model's vocabulary of {}: a prompt with an id past "
                   "it will be refused", path, (*tok)->vocab_size(), m.config.vocab_size);
    }
    m.tokenizer = std::move(*tok);
  }
  return m;
}

Result<LocalModel> load_local_model(const std::string& path, const LocalModelOptions& opts) {
  SHOAL_ASSIGN_OR_RETURN(LocalModel m, open_model(path, opts.tokenizer));
  BackendOptions bo;
  bo.threads = opts.threads;
  bo.half_prefill = opts.half_prefill;
  SHOAL_ASSIGN_OR_RETURN(m.backend, create_backend(opts.device, bo));
  SliceSpec spec{0, m.config.n_layers, true, true};
  SliceOptions so;
  so.n_ctx = context_length(opts.n_ctx, m.config.n_ctx_train);
  so.kv_dtype = opts.kv_dtype;
  so.max_tokens = opts.max_tokens;
  so.warm_up = opts.warm_up;
  spdlog::info("model {} ({}): {} layers, d_model {}, vocab {}, context {}; device {}", m.config.name, m.config.arch,
               m.config.n_layers, m.config.d_model, m.config.vocab_size, so.n_ctx, m.backend->name());
  LoadProgress progress = opts.progress ? stderr_progress("loading") : LoadProgress{};
  auto slice = Slice::load(*m.file, m.config, m.weights, spec, so, *m.backend, progress);
  if (!slice.ok()) return slice.status().with_context("loading " + path);
  m.pipeline = std::make_unique<LocalPipeline>(std::move(*slice));
  return m;
}

int context_length(int requested, int n_ctx_train) {
  constexpr int kDefaultCap = 4096;
  if (requested <= 0) {
    if (n_ctx_train <= 0) return kDefaultCap;
    if (n_ctx_train > kDefaultCap) {
      spdlog::info("context {} tokens of the model's {} (-c {} for {})", kDefaultCap, n_ctx_train,
                   std::min(n_ctx_train, kMaxContext), n_ctx_train <= kMaxContext ? "all of them" : "the most -c takes");
    }
    return std::min(n_ctx_train, kDefaultCap);
  }
  if (n_ctx_train > 0 && requested > n_ctx_train) {
    spdlog::warn("context of {} tokens is longer than the {} the model was trained on: quality may drop past it",
                 requested, n_ctx_train);
  }
  return requested;
}

Result<DType> parse_kv_dtype(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "f32") return DType::kF32;
  if (s == "f16") return DType::kF16;
  if (s == "q8" || s == "q8_0") return DType::kQ8_0;
  return make_error(Code::kInvalidArgument, "KV cache type '{}' (expected f32, f16 or q8_0)", name);
}

}  // namespace shoal

#include "tokenizer/pre_tokenizer.h"

#include <array>

namespace shoal::tok {
namespace {

// Regexes as llama.cpp's llm_tokenizer_bpe uses them (source: llama.cpp src/llama-vocab.cpp).
// Case-insensitive contractions are spelled out as [sS] etc.
constexpr const char* kRxGpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr const char* kRxLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxQwen35 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxPoro = R"re( ?[^(\s|.,!?…。，、।۔،)]+)re";
constexpr const char* kRxTekken =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxGpt4o =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxBailing =
    R"re('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)re";
constexpr const char* kRxSeedCoder =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRxDeepseek3 =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// DeepSeek LLM's letter class: the cased-letter ranges of its tokenizer.json, as code points.
constexpr const char* kRxDeepseekLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";
constexpr const char* kRxDeepseekPunct =
    R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re";
constexpr const char* kRxCjkHangul = R"re([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

struct Entry {
  std::vector<std::string_view> names;
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  std::optional<bool> add_bos;
  bool no_bos = false;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> t = {
      {{"default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kRxGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kRxLlama3}, true, true},
      {{"dbrx", "smaug-bpe"}, {kRxLlama3}},
      {{"chatglm-bpe", "glm4"}, {kRxLlama3}, false, std::nullopt, true},
      {{"deepseek-llm"},
       {R"re([\r\n])re", kRxDeepseekLetters, kRxDeepseekPunct, R"re(\s+$)re", kRxCjkHangul,
        R"re(\p{N}+)re"}},
      {{"deepseek-coder"},
       {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kRxCjkHangul, R"re(\p{N})re"}},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm"},
       {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re",
        kRxDeepseek3}},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kRxGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {R"re(\p{N})re", kRxGpt2}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
        "trillion", "granite-docling", "exaone4"},
       {kRxGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
        "solar-open", "grok-2"},
       {kRxQwen2}},
      {{"qwen35"}, {kRxQwen35}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kRxPoro}},
      {{"viking"}, {kRxPoro, R"re(\p{N})re"}},
      {{"tekken"}, {kRxTekken}, true, true},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kRxGpt4o}},
      {{"bailingmoe", "bailingmoe2", "llada-moe"}, {kRxBailing}},
      {{"seed-coder"}, {kRxSeedCoder}},
  };
  return t;
}

}  // namespace

Result<PreTokenizerSpec> find_pre_tokenizer(std::string_view name) {
  const std::string_view key = name.empty() ? std::string_view("default") : name;
  for (const auto& e : table()) {
    for (auto n : e.names) {
      if (n == key) {
        return PreTokenizerSpec{std::string(e.names.front()), e.regexes, e.ignore_merges, e.add_bos,
                                e.no_bos};
      }
    }
  }
  return make_error(Code::kUnsupported, "unsupported pre-tokenizer '{}' (tokenizer.ggml.pre)", name);
}

std::vector<std::string> supported_pre_tokenizers() {
  std::vector<std::string> out;
  for (const auto& e : table()) {
    for (auto n : e.names) out.emplace_back(n);
  }
  return out;
}

}  // namespace shoal::tok

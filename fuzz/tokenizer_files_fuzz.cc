// libFuzzer target: the tokenizer file parsers. The first input byte picks the form (tokenizer.json,
// vocab.json + merges.txt split at the first NUL, tiktoken, SentencePiece protobuf); the rest is
// the file. A tokenizer that loads must also encode and decode without fault.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/loaders.h"
#include "tokenizer/vocab_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const nlohmann::json no_config;
  shoal::Result<shoal::tok::Vocab> v = shoal::make_error(shoal::Code::kInvalidArgument, "unset");
  switch (data[0] % 4) {
    case 0: v = shoal::tok::vocab_from_tokenizer_json(body, no_config, "fuzz"); break;
    case 1: {
      const size_t nul = std::min(body.find('\0'), body.size());
      v = shoal::tok::vocab_from_vocab_merges(body.substr(0, nul), body.substr(std::min(nul + 1, body.size())),
                                              no_config, "fuzz");
      break;
    }
    case 2: v = shoal::tok::vocab_from_tiktoken(body, "fuzz"); break;
    default: v = shoal::tok::vocab_from_sentencepiece(body, no_config, "fuzz"); break;
  }
  if (!v.ok()) return 0;
  auto t = shoal::tok::VocabTokenizer::create(std::move(v).value());
  if (!t.ok()) return 0;
  for (bool special : {false, true}) {
    const auto ids = (*t)->encode(body.substr(0, 256), special, special);
    (void)(*t)->decode(ids, special);
  }
  return 0;
}

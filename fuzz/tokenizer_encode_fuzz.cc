// libFuzzer target: encoding arbitrary bytes. A small byte-level BPE vocabulary (all 256 byte
// tokens, a few merges, one control token, the Qwen2 pre-tokenizer regex) must round-trip any input
// exactly after invalid UTF-8 is replaced by U+FFFD; streaming the ids must give the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizer.h"

namespace {

const shoal::tok::VocabTokenizer& tokenizer() {
  static const auto* t = [] {
    using namespace shoal::tok;
    Vocab v;
    v.type = VocabType::kBpe;
    v.model = "fuzz";
    for (int b = 0; b < 256; ++b) v.tokens.push_back({gpt2_byte_to_utf8(uint8_t(b)), 0.0f, kAttrNormal});
    for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0\xC4\xA0"}) v.tokens.push_back({t, 0.0f, kAttrNormal});
    v.tokens.push_back({"<|end|>", 0.0f, kAttrControl});
    v.regexes = find_pre_tokenizer("qwen2")->regexes;
    if (!finalize(v, "fuzz").ok()) std::abort();
    const char* merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "\xC4\xA0"}};
    int32_t rank = 0;
    for (auto& m : merges) {
      if (!add_merge(v, m[0], m[1], rank++, false).ok()) std::abort();
    }
    return VocabTokenizer::create(std::move(v))->release();
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto& t = tokenizer();
  const std::string expect = shoal::tok::sanitize_utf8(text);
  const auto ids = t.encode(text, false, false);
  if (t.decode(ids) != expect) std::abort();
  shoal::StreamDecoder s(t);
  std::string streamed;
  for (int32_t id : ids) streamed += s.push(id);
  streamed += s.flush();
  if (streamed != expect) std::abort();
  (void)t.encode(text, true, true);
  return 0;
}

// Malformed tokenizer files: one test per kind of damage, each must give a clear error (code and
// a message naming what is wrong), never a crash.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/loaders.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace shoal::tok {
namespace {

using test::expect_error;

using nlohmann::json;

const char* kGoodJson =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}})";

TEST(TokenizerMalformed, GoodTinyTokenizerJsonLoads) {
  auto v = vocab_from_tokenizer_json(kGoodJson, json(), "t.json");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->n_tokens(), 3);
}

TEST(TokenizerMalformed, TruncatedJson) {
  const std::string s(kGoodJson);
  expect_error(vocab_from_tokenizer_json(s.substr(0, s.size() / 2), json(), "t.json"), Code::kCorrupt,
               "invalid JSON at byte");
}

TEST(TokenizerMalformed, DeeplyNestedJson) {
  std::string s(kGoodJson);
  s.insert(s.rfind('}'), ", \"x\": " + std::string(100000, '[') + std::string(100000, ']'));
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "JSON nests deeper than 128 levels");
}

TEST(TokenizerMalformed, MergeNamingUnknownToken) {
  std::string s(kGoodJson);
  s.replace(s.find("\"a b\""), 5, "\"a zz\"");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "'zz'");
}

TEST(TokenizerMalformed, MergeWithoutSpace) {
  std::string s(kGoodJson);
  s.replace(s.find("\"a b\""), 5, "\"ab\"");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "separated by a space");
}

TEST(TokenizerMalformed, VocabValueNotAnInteger) {
  std::string s(kGoodJson);
  s.replace(s.find("\"b\": 1"), 6, "\"b\": \"1\"");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "not an integer");
}

TEST(TokenizerMalformed, VocabIdOutOfRangeOrShared) {
  std::string s(kGoodJson);
  s.replace(s.find("\"b\": 1"), 6, "\"b\": -4");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "has id -4");
  std::string d(kGoodJson);
  d.replace(d.find("\"b\": 1"), 6, "\"b\": 0");
  expect_error(vocab_from_tokenizer_json(d, json(), "t.json"), Code::kCorrupt, "given to both");
}

// Found by tokenizer_files_fuzz: 16 bytes of vocab.json claiming id 5141748 made a 5-million-entry vocab.
TEST(TokenizerMalformed, SparseIdsOfATinyVocabAreRefused) {
  expect_error(vocab_from_vocab_merges(R"({"aj": 5141748})", "", json(), "dir"), Code::kCorrupt,
               "vocab ids reach 5141748 for only 1 entries");
  std::string s(kGoodJson);
  s.insert(s.rfind('}'), R"(, "added_tokens": [{"id": 9000000, "content": "<x>", "special": true}])");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kCorrupt, "added token '<x>' has id 9000000");
}

TEST(TokenizerMalformed, UnsupportedModelAndPreTokenizer) {
  std::string s(kGoodJson);
  s.replace(s.find("\"BPE\""), 5, "\"WordPiece\"");
  expect_error(vocab_from_tokenizer_json(s, json(), "t.json"), Code::kUnsupported, "WordPiece");
  std::string p(kGoodJson);
  p.replace(p.find("\"ByteLevel\""), 11, "\"Whitespace\"");
  expect_error(vocab_from_tokenizer_json(p, json(), "t.json"), Code::kUnsupported, "Whitespace");
  std::string w(kGoodJson);
  w.replace(w.find("\"type\": \"BPE\""), 13, "\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\"");
  expect_error(vocab_from_tokenizer_json(w, json(), "t.json"), Code::kUnsupported, "continuing_subword_prefix");
  // A Unigram model (its vocab a list of [piece, score]) is named as unsupported, not as corrupt.
  expect_error(vocab_from_tokenizer_json(R"({"model": {"type": "Unigram", "unk_id": 0,
                                                       "vocab": [["<unk>", 0.0], ["a", -1.5]]}})",
                                         json(), "t.json"),
               Code::kUnsupported, "tokenizer model type 'Unigram' is not supported (BPE only)");
}

TEST(TokenizerMalformed, MergesTxtBadLineAndUnknownToken) {
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2})";
  expect_error(vocab_from_vocab_merges(vocab, "#version: 0.2\na b c\n", json(), "dir"), Code::kCorrupt,
               "line 2");
  expect_error(vocab_from_vocab_merges(vocab, "#version: 0.2\na q\n", json(), "dir"), Code::kCorrupt, "'q'");
  expect_error(vocab_from_vocab_merges("[1, 2]", "", json(), "dir"), Code::kCorrupt, "vocab.json");
  EXPECT_TRUE(vocab_from_vocab_merges(vocab, "#version: 0.2\r\na b\r\n", json(), "dir").ok());
}

TEST(TokenizerMalformed, TiktokenBadBase64BadRankWrongSize) {
  expect_error(vocab_from_tiktoken("IQ== 0\nI!== 1\n", "t.model"), Code::kCorrupt, "line 2: invalid base64");
  expect_error(vocab_from_tiktoken("IQ== x\n", "t.model"), Code::kCorrupt, "rank 'x'");
  expect_error(vocab_from_tiktoken("IQ==\n", "t.model"), Code::kCorrupt, "line 1");
  expect_error(vocab_from_tiktoken("IQ== 0\nIg== 1\n", "t.model"), Code::kUnsupported, "2 tokens");
}

TEST(TokenizerMalformed, TiktokenRepeatedRank) {
  std::string text;
  for (int i = 0; i < 128000; ++i) {
    // Distinct 3-byte tokens: base64 of (i >> 16, i >> 8, i) is 4 characters.
    const unsigned char b[3] = {uint8_t(i >> 16), uint8_t(i >> 8), uint8_t(i)};
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint32_t n = (uint32_t(b[0]) << 16) | (uint32_t(b[1]) << 8) | b[2];
    text += {k[n >> 18], k[(n >> 12) & 63], k[(n >> 6) & 63], k[n & 63]};
    text += " " + std::to_string(i == 5 ? 4 : i) + "\n";
  }
  expect_error(vocab_from_tiktoken(text, "t.model"), Code::kCorrupt, "rank 4");
}

TEST(TokenizerMalformed, SentencePieceTruncatedAndUnigram) {
  // One piece "<unk>" (score 0, type 2), trainer_spec model_type = 2 (BPE).
  const std::string piece = std::string("\x0a\x07\x0a\x05<unk>", 9);
  const std::string bpe = piece + std::string("\x12\x02\x18\x02", 4);
  EXPECT_TRUE(vocab_from_sentencepiece(bpe, json(), "sp.model").ok());
  expect_error(vocab_from_sentencepiece(bpe.substr(0, 6), json(), "sp.model"), Code::kCorrupt, "at byte");
  expect_error(vocab_from_sentencepiece(piece + std::string("\x12\x02\x18\x01", 4), json(), "sp.model"),
               Code::kUnsupported, "model type 1");
  expect_error(vocab_from_sentencepiece(std::string("\x12\x02\x18\x02", 4), json(), "sp.model"), Code::kCorrupt,
               "no pieces");
  // An empty file has no pieces (and the default model type, 1): said as "no pieces".
  expect_error(vocab_from_sentencepiece(std::string(), json(), "sp.model"), Code::kCorrupt, "no pieces");
  expect_error(vocab_from_sentencepiece(std::string("\x0b\x01", 2), json(), "sp.model"), Code::kCorrupt,
               "malformed field");  // wire type 3 (group) is not handled
}

Metadata gguf_meta(const std::string& model, std::vector<std::string> tokens) {
  Metadata md;
  md.set("tokenizer.ggml.model", MetaValue::str(model));
  std::vector<MetaValue> items;
  for (auto& t : tokens) items.push_back(MetaValue::str(t));
  md.set("tokenizer.ggml.tokens", MetaValue::array(MetaType::kString, std::move(items)));
  return md;
}

TEST(TokenizerMalformed, GgufMetadata) {
  expect_error(vocab_from_gguf(Metadata(), "m.gguf"), Code::kNotFound, "tokenizer.ggml.model");
  expect_error(vocab_from_gguf(gguf_meta("t5", {"a"}), "m.gguf"), Code::kUnsupported, "'t5'");
  Metadata wrong = gguf_meta("llama", {"a"});
  wrong.set("tokenizer.ggml.tokens", MetaValue::u32(3));
  expect_error(vocab_from_gguf(wrong, "m.gguf"), Code::kCorrupt, "tokenizer.ggml.tokens");
  Metadata short_scores = gguf_meta("llama", {"a", "b"});
  short_scores.set("tokenizer.ggml.scores", MetaValue::array(MetaType::kF32, {MetaValue::f32(0.5f)}));
  expect_error(vocab_from_gguf(short_scores, "m.gguf"), Code::kCorrupt, "1 entries for 2 tokens");
  expect_error(vocab_from_gguf(gguf_meta("llama", {"a", "a"}), "m.gguf"), Code::kCorrupt, "duplicate token 'a'");
  expect_error(vocab_from_gguf(gguf_meta("gpt2", {"a"}), "m.gguf"), Code::kNotFound, "tokenizer.ggml.merges");
  Metadata bad_pre = gguf_meta("gpt2", {"a"});
  bad_pre.set("tokenizer.ggml.pre", MetaValue::str("martian"));
  expect_error(vocab_from_gguf(bad_pre, "m.gguf"), Code::kUnsupported, "'martian'");
  EXPECT_TRUE(vocab_from_gguf(gguf_meta("llama", {"<unk>", "a"}), "m.gguf").ok());
}

TEST(TokenizerMalformed, MissingPaths) {
  expect_error(load_tokenizer_from_path("/nonexistent/tokenizer/path"), Code::kNotFound, "no such file");
  expect_error(load_tokenizer_from_path(test::fixture("quant")), Code::kNotFound, "no tokenizer");
}

}  // namespace
}  // namespace shoal::tok

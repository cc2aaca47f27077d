// Tokenizer file forms other than llama.cpp's vocab GGUFs: Hugging Face tokenizer.json (hf/*),
// SentencePiece tokenizer.model (hf/phi3, hf/gemma3_text) against llama.cpp's conversions of the
// same checkpoints (model-bf16.gguf), and hand-derived BPE examples.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_tokenizer.h"
#include "tokenizer_test_util.h"

namespace shoal {
namespace {

const tok::Vocab& vocab_of(const Tokenizer& t) { return dynamic_cast<const tok::VocabTokenizer&>(t).vocab(); }

// hf/llama/tokenizer.json (512 tokens, 255 merges; identical in every hf/* byte-level folder).
// By hand from its merges (rank: pair -> token id):
//   " self": Ġ s e l f; 4: s e -> se; 15: l f -> lf; 16: se lf -> self (273); 32: Ġ self -> Ġself (289)
//   " the":  Ġ t h e;   10: t h -> th; 28: Ġ th -> Ġth (285); 37: Ġth e -> Ġthe (294)
//   "the":   t h e;     10: t h -> th (267); "th e" is no merge (only "Ġth e"), e = 69
//   "."  = 14 (byte-level alphabet: '!' is 1, so ASCII c is c - 0x20)
TEST(TokenizerForms, HfTokenizerJsonHandDerivedMerges) {
  auto tok = test::load_tokenizer_fixture("hf/llama");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->encode(" self", false, false), (std::vector<int32_t>{289}));
  EXPECT_EQ(tok->encode("self", false, false), (std::vector<int32_t>{273}));
  EXPECT_EQ(tok->encode(" the", false, false), (std::vector<int32_t>{294}));
  EXPECT_EQ(tok->encode("the", false, false), (std::vector<int32_t>{267, 69}));
  // The ByteLevel regex splits " self.the" into " self" | "." | "the".
  EXPECT_EQ(tok->encode(" self.the", false, false), (std::vector<int32_t>{289, 14, 267, 69}));
  EXPECT_EQ(tok->decode({289, 14, 267, 69}), " self.the");
}

TEST(TokenizerForms, HfQwen3TokenizerJsonSpecialToken) {
  auto tok = test::load_tokenizer_fixture("hf/qwen3");
  ASSERT_NE(tok, nullptr);
  // <|endoftext|> is the only added token (special): id 0 with parse_special, text otherwise.
  EXPECT_EQ(tok->encode("<|endoftext|>", false, true), (std::vector<int32_t>{0}));
  auto plain = tok->encode("<|endoftext|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok->decode(plain), "<|endoftext|>");
  EXPECT_TRUE(tok->is_eog(0));
  EXPECT_EQ(tok->eos_id(), 0);  // tokenizer_config.json eos_token
  EXPECT_FALSE(tok->add_bos());
}

// tokenizer.json and llama.cpp's GGUF conversion of the same checkpoint must agree everywhere.
TEST(TokenizerForms, HfTokenizerJsonAgreesWithItsGgufConversion) {
  auto json_tok = test::load_tokenizer_fixture("hf/llama");
  auto gguf_tok = test::load_tokenizer_fixture("hf/llama/model-bf16.gguf");
  ASSERT_NE(json_tok, nullptr);
  ASSERT_NE(gguf_tok, nullptr);
  ASSERT_EQ(json_tok->vocab_size(), gguf_tok->vocab_size());
  EXPECT_EQ(vocab_of(*json_tok).merges.size(), 255u);
  EXPECT_EQ(vocab_of(*gguf_tok).merges.size(), 255u);
  for (int32_t id = 0; id < json_tok->vocab_size(); ++id) {
    ASSERT_EQ(json_tok->token_text(id), gguf_tok->token_text(id)) << id;
  }
  for (const auto& c : test::read_golden(test::fixture("vocab/ggml-vocab-gpt-2.gguf"))) {
    EXPECT_EQ(json_tok->encode(c.text, false, false), gguf_tok->encode(c.text, false, false)) << c.text;
  }
}

// SentencePiece protobuf vs llama.cpp's conversion: same pieces, scores and special ids, and
// (where the converter kept the model's add_dummy_prefix) the same encodings.
void expect_spm_matches_gguf(const std::string& arch, bool same_space_prefix) {
  auto sp = test::load_tokenizer_fixture("hf/" + arch);
  auto gg = test::load_tokenizer_fixture("hf/" + arch + "/model-bf16.gguf");
  ASSERT_NE(sp, nullptr);
  ASSERT_NE(gg, nullptr);
  EXPECT_EQ(sp->kind(), TokenizerKind::kSentencePiece);
  const tok::Vocab& a = vocab_of(*sp);
  const tok::Vocab& b = vocab_of(*gg);
  ASSERT_EQ(a.n_tokens(), b.n_tokens());
  for (int32_t id = 0; id < a.n_tokens(); ++id) {
    ASSERT_EQ(a.tokens[id].text, b.tokens[id].text) << id;
    ASSERT_EQ(a.tokens[id].score, b.tokens[id].score) << id;
  }
  EXPECT_EQ(sp->bos_id(), gg->bos_id());
  EXPECT_EQ(sp->eos_id(), gg->eos_id());
  EXPECT_EQ(a.add_space_prefix, same_space_prefix ? b.add_space_prefix : !b.add_space_prefix);
  if (!same_space_prefix) return;
  for (const auto& c : test::read_golden(test::fixture("vocab/ggml-vocab-llama-spm.gguf"))) {
    EXPECT_EQ(sp->encode(c.text, true, false), gg->encode(c.text, true, false)) << c.text;
  }
}

TEST(TokenizerForms, SentencePiecePhi3AgreesWithGguf) { expect_spm_matches_gguf("phi3", true); }
// llama.cpp's Gemma 3 converter writes add_space_prefix = false whatever the model says; this
// fixture's model keeps SentencePiece's default add_dummy_prefix = true, and so do we.
TEST(TokenizerForms, SentencePieceGemma3AgreesWithGguf) { expect_spm_matches_gguf("gemma3_text", false); }

TEST(TokenizerForms, StoriesGgufSpmBosRules) {
  auto tok = test::load_tokenizer_fixture("models/stories260K.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->describe(), "llama/spm");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("", true, false), (std::vector<int32_t>{1}));  // SentencePiece: [BOS] for ""
  EXPECT_TRUE(tok->encode("", false, false).empty());
  EXPECT_TRUE(tok->is_eog(2));
}

// llama.cpp's own tokenization and pieces for stories260K (expected/stories260K_greedy.json).
TEST(TokenizerForms, StoriesMatchesLlamaCppPromptIdsAndPieces) {
  auto tok = test::load_tokenizer_fixture("models/stories260K.gguf");
  ASSERT_NE(tok, nullptr);
  const auto ref = nlohmann::json::parse(test::slurp(test::fixture("expected/stories260K_greedy.json")));
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const auto& c : ref["cases"]) {
    const std::string prompt = c["prompt"];
    EXPECT_EQ(tok->encode(prompt, true, false), c["prompt_ids"].get<std::vector<int32_t>>()) << prompt;
    const auto prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
      EXPECT_EQ(tok->token_to_piece(prompt_ids[i], true), c["prompt_pieces"][i].get<std::string>());
    }
    const auto gen = c["generated_ids"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < c["generated_pieces"].size(); ++i) {
      EXPECT_EQ(tok->token_to_piece(gen[i]), c["generated_pieces"][i].get<std::string>()) << i;
    }
    EXPECT_EQ(tok->decode(gen), c["generated_text"].get<std::string>());
    StreamDecoder stream(*tok);
    std::string streamed;
    for (int32_t id : gen) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, c["generated_text"].get<std::string>());
  }
}

}  // namespace
}  // namespace shoal

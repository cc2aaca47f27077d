// GgufWriter: write -> parse gives back the same metadata and tensors; a fixture GGUF re-written
// reads back with the same index and bytes; invalid requests are refused; a synthetic model of a
// given shape opens as a model of that shape.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/mmap_file.h"
#include "format/gguf.h"
#include "format/model_file.h"
#include "format/synthetic_gguf.h"
#include "runtime/local_model.h"
#include "test_util.h"

namespace shoal {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("shoal_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

Metadata every_type() {
  Metadata m;
  m.set("t.u8", MetaValue::u8(200));
  m.set("t.i8", MetaValue::i8(-100));
  m.set("t.u16", MetaValue::u16(60000));
  m.set("t.i16", MetaValue::i16(-30000));
  m.set("t.u32", MetaValue::u32(4000000000u));
  m.set("t.i32", MetaValue::i32(-2000000000));
  m.set("t.u64", MetaValue::u64(~uint64_t(0)));
  m.set("t.i64", MetaValue::i64(-(int64_t(1) << 62)));
  m.set("t.f32", MetaValue::f32(0.1f));
  m.set("t.f64", MetaValue::f64(0.1));
  m.set("t.bool", MetaValue::boolean(true));
  m.set("t.str", MetaValue::str(std::string("h\xc3\xa9llo\0x", 8)));
  m.set("t.arr", MetaValue::array(MetaType::kI32, {MetaValue::i32(1), MetaValue::i32(-2)}));
  m.set("t.empty", MetaValue::array(MetaType::kString, {}));
  m.set("t.nested",
        MetaValue::array(MetaType::kArray,
                         {MetaValue::array(MetaType::kString, {MetaValue::str("a"), MetaValue::str("")}),
                          MetaValue::array(MetaType::kF64, {MetaValue::f64(2.5)})}));
  return m;
}

TEST(FormatGgufWriter, RoundTripEveryValueTypeAndTensors) {
  GgufWriter w;
  const Metadata meta = every_type();
  w.set_all(meta);
  const auto a = pattern(4 * 3 * 5, 1);
  const auto q = pattern(34 * 2 * 2, 2);  // Q8_0 [2, 64]
  const auto big = pattern(3 * 1398102 * 2, 3);  // BF16 [3, 1398102]: several filler chunks
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {3, 5}, a).ok());
  ASSERT_TRUE(w.add_tensor("q", DType::kQ8_0, {2, 64}, q).ok());
  ASSERT_TRUE(w.add_tensor("big", DType::kBF16, {3, 1398102},
                           [&](uint64_t off, uint8_t* dst, uint64_t n) {
                             std::memcpy(dst, big.data() + off, n);
                             return Status::Ok();
                           }).ok());
  auto bytes = w.write_to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto g = parse_gguf(bytes->data(), bytes->size(), "mem");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->version, 3u);
  ASSERT_EQ(g->metadata.entries().size(), meta.entries().size());
  for (size_t i = 0; i < meta.entries().size(); ++i) {
    EXPECT_EQ(g->metadata.entries()[i].first, meta.entries()[i].first);
    EXPECT_TRUE(g->metadata.entries()[i].second == meta.entries()[i].second) << meta.entries()[i].first;
  }
  ASSERT_EQ(g->tensors.size(), 3u);
  const std::vector<uint8_t>* want[] = {&a, &q, &big};
  const std::vector<int64_t> shapes[] = {{3, 5}, {2, 64}, {3, 1398102}};
  for (size_t i = 0; i < 3; ++i) {
    const TensorInfo& t = g->tensors[i];
    EXPECT_EQ(t.shape, shapes[i]);
    ASSERT_EQ(t.nbytes, want[i]->size());
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ(std::memcmp(bytes->data() + t.offset, want[i]->data(), t.nbytes), 0) << t.name;
  }
  // The file path gives the same bytes.
  const std::string path = temp_path("roundtrip.gguf");
  ASSERT_TRUE(w.write(path).ok());
  auto f = MappedFile::open(path);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(f->size(), bytes->size());
  EXPECT_EQ(std::memcmp(f->data(), bytes->data(), bytes->size()), 0);
  std::filesystem::remove(path);
}

TEST(FormatGgufWriter, AlignmentFromMetadata) {
  GgufWriter w;
  w.set("general.alignment", MetaValue::u32(256));
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {3}, pattern(12, 0)).ok());
  ASSERT_TRUE(w.add_tensor("b", DType::kF32, {3}, pattern(12, 1)).ok());
  auto bytes = w.write_to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto g = parse_gguf(bytes->data(), bytes->size(), "mem");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->alignment, 256u);
  EXPECT_EQ(g->tensors[0].offset % 256, 0u);
  EXPECT_EQ(g->tensors[1].offset, g->tensors[0].offset + 256);
}

// Re-writing each fixture GGUF (written by llama.cpp / gguf-py): the same metadata, index
// (identity hash) and tensor bytes -- and in fact the same file, byte for byte.
TEST(FormatGgufWriter, FixtureRoundTrip) {
  for (const char* rel : {"models/stories260K.gguf", "quant/q-Q4_K_M.gguf", "hf/qwen3_5_moe/model-bf16.gguf",
                          "vocab/ggml-vocab-bert-bge.gguf"}) {
    SCOPED_TRACE(rel);
    auto m = open_model_file(test::fixture(rel));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    GgufWriter w;
    w.set_all(m->metadata);
    for (const TensorInfo& t : m->index.tensors()) {
      WeightSource* src = m->sources[t.source].get();
      ASSERT_TRUE(w.add_tensor(t.name, t.dtype, t.shape,
                               [src, &t](uint64_t off, uint8_t* dst, uint64_t n) {
                                 return src->read(t.offset + off, dst, n);
                               }).ok());
    }
    const std::string path = temp_path("fixture.gguf");
    ASSERT_TRUE(w.write(path).ok());
    auto m2 = open_model_file(path);
    ASSERT_TRUE(m2.ok()) << m2.status().to_string();
    EXPECT_EQ(m2->index.identity_hash(), m->index.identity_hash());
    ASSERT_EQ(m2->metadata.size(), m->metadata.size());
    for (size_t i = 0; i < m->metadata.size(); ++i) {
      EXPECT_EQ(m2->metadata.entries()[i].first, m->metadata.entries()[i].first);
      EXPECT_TRUE(m2->metadata.entries()[i].second == m->metadata.entries()[i].second);
    }
    for (const TensorInfo& t : m->index.tensors()) {
      const TensorInfo* t2 = m2->index.find(t.name);
      ASSERT_NE(t2, nullptr);
      const uint8_t* x = m->sources[0]->view(t.offset, t.nbytes);
      const uint8_t* y = m2->sources[0]->view(t2->offset, t2->nbytes);
      ASSERT_TRUE(x && y);
      EXPECT_EQ(std::memcmp(x, y, t.nbytes), 0) << t.name;
    }
    // Same layout as ggml's writer: the whole file comes back byte for byte.
    auto a = MappedFile::open(test::fixture(rel));
    auto b = MappedFile::open(path);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size()), 0);
    std::filesystem::remove(path);
  }
}

TEST(FormatGgufWriter, TokenListShorterThanTheEmbeddingIsRefused) {
  // stories260K with its token list (and scores, types) cut to 100 of the embedding's 512 rows:
  // ids 100..511 would print as nothing, so the model is refused (llama.cpp: a tensor of the
  // wrong shape).
  auto m = open_model_file(test::fixture("models/stories260K.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  GgufWriter w;
  for (const auto& [key, value] : m->metadata.entries()) {
    MetaValue v = value;
    if (key.rfind("tokenizer.ggml.", 0) == 0 && v.type == MetaType::kArray) {
      auto& items = std::get<std::vector<MetaValue>>(v.v);
      if (items.size() == 512) items.resize(100);
    }
    w.set(key, std::move(v));
  }
  for (const TensorInfo& t : m->index.tensors()) {
    WeightSource* src = m->sources[t.source].get();
    ASSERT_TRUE(w.add_tensor(t.name, t.dtype, t.shape, [src, &t](uint64_t off, uint8_t* dst, uint64_t n) {
                   return src->read(t.offset + off, dst, n);
                 }).ok());
  }
  const std::string path = temp_path("few_tokens.gguf");
  ASSERT_TRUE(w.write(path).ok());
  test::expect_error(open_model(path, /*with_tokenizer=*/true), Code::kCorrupt,
                     "its tokenizer has 100 tokens, but token_embd.weight has 512 rows");
  EXPECT_TRUE(open_model(path, /*with_tokenizer=*/false).ok());  // a worker reads no tokenizer
  std::filesystem::remove(path);
}

TEST(FormatGgufWriter, RefusesInvalidTensors) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {2}, pattern(8, 0)).ok());
  EXPECT_EQ(w.add_tensor("a", DType::kF32, {2}, pattern(8, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("b", DType::kF32, {2}, pattern(9, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("c", DType::kF32, {0}, pattern(0, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("d", DType::kF32, {1, 1, 1, 1, 1}, pattern(4, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("e", DType::kQ4_0, {1, 48}, pattern(27, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor(std::string(65, 'n'), DType::kF32, {1}, pattern(4, 0)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("", DType::kF32, {1}, pattern(4, 0)).code(), Code::kInvalidArgument);
}

TEST(FormatGgufWriter, RefusesBadMetadata) {
  GgufWriter w;
  w.set("general.alignment", MetaValue::u32(48));
  EXPECT_EQ(w.write_to_bytes().status().code(), Code::kInvalidArgument);
  GgufWriter w2;
  w2.set("x", MetaValue{MetaType::kString, MetaType::kU8, uint64_t(1)});  // variant mismatch
  EXPECT_EQ(w2.write_to_bytes().status().code(), Code::kInvalidArgument);
  GgufWriter w3;
  w3.set("x", MetaValue::array(MetaType::kU32, {MetaValue::str("no")}));  // element type mismatch
  EXPECT_EQ(w3.write_to_bytes().status().code(), Code::kInvalidArgument);
}

TEST(FormatGgufWriter, FillerErrorIsReturned) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {2}, [](uint64_t, uint8_t*, uint64_t) {
    return make_error(Code::kIoError, "disk on fire");
  }).ok());
  auto r = w.write_to_bytes();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIoError);
}

// A 150k-entry vocabulary (the size of Qwen's) parses; the parse is linear in the strings.
TEST(FormatGgufWriter, LargeVocabularyParses) {
  std::vector<MetaValue> tokens;
  tokens.reserve(151936);
  for (int i = 0; i < 151936; ++i) tokens.push_back(MetaValue::str("tok" + std::to_string(i)));
  GgufWriter w;
  w.set("tokenizer.ggml.tokens", MetaValue::array(MetaType::kString, std::move(tokens)));
  auto bytes = w.write_to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto g = parse_gguf(bytes->data(), bytes->size(), "vocab");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto* arr = g->metadata.find("tokenizer.ggml.tokens")->as_array();
  ASSERT_EQ(arr->size(), 151936u);
  EXPECT_EQ(*(*arr)[151935].as_string(), "tok151935");
}

TEST(SyntheticGguf, OpensAsAModelOfItsShape) {
  // A small Qwen3-style shape (q / k norms, tied head) in Q8_0, and a Llama-style one in F16.
  const SyntheticShape qwen{"qwen3", 2, 64, 96, 4, 2, 32, 300, 1024, 1e6f, 1e-6f, true, true};
  const SyntheticShape llama{"llama", 3, 128, 256, 4, 1, 32, 200, 2048, 500000.0f, 1e-5f, false, false};
  for (const auto& [shape, dt] : {std::pair{qwen, DType::kQ8_0}, std::pair{llama, DType::kF16}}) {
    SCOPED_TRACE(shape.arch);
    const std::string path = temp_path("synthetic_" + shape.arch + ".gguf");
    ASSERT_TRUE(write_synthetic_gguf(shape, dt, path).ok());
    auto m = open_model(path, false);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, shape.arch);
    EXPECT_EQ(c.n_layers, shape.n_layers);
    EXPECT_EQ(c.d_model, shape.d_model);
    EXPECT_EQ(c.vocab_size, shape.vocab);
    EXPECT_EQ(c.n_ctx_train, shape.n_ctx);
    EXPECT_EQ(c.tied_embeddings, shape.tied);
    EXPECT_EQ(c.qk_norm, shape.qk_norm);
    ASSERT_EQ(c.layers.size(), size_t(shape.n_layers));
    EXPECT_EQ(c.layers[0].n_heads, shape.n_heads);
    EXPECT_EQ(c.layers[0].n_kv_heads, shape.n_kv_heads);
    EXPECT_EQ(c.layers[0].head_dim, shape.head_dim);
    EXPECT_EQ(c.layers[0].d_ff, shape.d_ff);
    // Per layer: 2 norms, q / k / v / o, gate / up / down, and q / k norms for Qwen3; then the
    // embedding, the final norm and an untied head.
    const size_t per_layer = 9 + (shape.qk_norm ? 2 : 0);
    EXPECT_EQ(m->weights.size(), per_layer * size_t(shape.n_layers) + 2 + (shape.tied ? 0 : 1));
    const TensorInfo* up = m->weights.find("blk.1.ffn_up.weight");
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(up->dtype, dt);
    EXPECT_EQ(up->shape, (std::vector<int64_t>{shape.d_ff, shape.d_model}));
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace shoal

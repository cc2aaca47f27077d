// GGUF reading on the fixture files; expected facts come from fixtures/README.md, SOURCES.md and
// quant/README.md (written independently of this reader), and from stories260K.bin.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "core/mmap_file.h"
#include "format/gguf.h"
#include "format/model_file.h"
#include "test_util.h"

namespace shoal {
namespace {

using test::fixture;

ModelFile open_ok(const std::string& path) {
  auto r = open_model_file(path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : ModelFile{};
}

TEST(FormatGguf, Stories260KFacts) {
  ModelFile m = open_ok(fixture("models/stories260K.gguf"));
  EXPECT_EQ(m.format, ModelFormat::kGguf);
  EXPECT_EQ(m.file_size, 1185376u);  // SOURCES.md
  EXPECT_EQ(m.metadata.get_string("general.architecture"), "llama");
  EXPECT_EQ(m.metadata.get_int("llama.block_count"), 5);
  EXPECT_EQ(m.metadata.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(m.metadata.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(m.metadata.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(m.metadata.get_int("llama.attention.head_count_kv"), 4);
  // 48 tensors (token_embd, output_norm, output + 5 x 9) and 19 keys: the header's counts,
  // read by hand with a byte probe.
  EXPECT_EQ(m.index.size(), 48u);
  EXPECT_EQ(m.metadata.size(), 19u);
  const MetaValue* tokens = m.metadata.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_NE(tokens->as_array(), nullptr);
  EXPECT_EQ(tokens->elem_type, MetaType::kString);
  EXPECT_EQ(tokens->as_array()->size(), 512u);

  const TensorInfo* emb = m.index.find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(emb->nbytes, 512u * 64 * 4);
  const TensorInfo* k = m.index.find("blk.4.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{32, 64}));  // 4 KV heads x head_dim 8
  const TensorInfo* gate = m.index.find("blk.0.ffn_gate.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(m.index.find("blk.5.attn_q.weight"), nullptr);
  for (const TensorInfo& t : m.index.tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
  EXPECT_EQ(m.bytes_read(), 0u);
}

// SOURCES.md: the token-embedding bytes of stories260K.bin (after its 7 x int32 header) equal
// token_embd.weight of the GGUF.
TEST(FormatGguf, Stories260KEmbeddingBytesMatchLlama2cCheckpoint) {
  ModelFile m = open_ok(fixture("models/stories260K.gguf"));
  const TensorInfo* emb = m.index.find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  auto bin = MappedFile::open(fixture("models/stories260K.bin"));
  ASSERT_TRUE(bin.ok()) << bin.status().to_string();
  ASSERT_GE(bin->size(), 28 + emb->nbytes);
  std::vector<uint8_t> got(emb->nbytes);
  ASSERT_TRUE(m.sources[emb->source]->read(emb->offset, got.data(), got.size()).ok());
  EXPECT_EQ(std::memcmp(got.data(), bin->data() + 28, emb->nbytes), 0);
  EXPECT_EQ(m.bytes_read(), emb->nbytes);
  const uint8_t* v = m.sources[0]->view(emb->offset, emb->nbytes);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(std::memcmp(v, bin->data() + 28, emb->nbytes), 0);
  EXPECT_EQ(m.bytes_read(), 2 * emb->nbytes);
}

TEST(FormatGguf, QuantFixturesHaveTheirTypes) {
  const std::pair<const char*, DType> files[] = {
      {"q-Q4_0", DType::kQ4_0}, {"q-Q4_1", DType::kQ4_1}, {"q-Q5_0", DType::kQ5_0},
      {"q-Q5_1", DType::kQ5_1}, {"q-Q8_0", DType::kQ8_0}, {"q-Q2_K", DType::kQ2_K},
      {"q-Q3_K_M", DType::kQ3_K}, {"q-Q4_K_M", DType::kQ4_K}, {"q-Q5_K_M", DType::kQ5_K},
      {"q-Q6_K", DType::kQ6_K}, {"base-f32", DType::kF32}};
  for (const auto& [name, dtype] : files) {
    SCOPED_TRACE(name);
    ModelFile m = open_ok(fixture(std::string("quant/") + name + ".gguf"));
    EXPECT_EQ(m.index.size(), 21u);  // quant/README.md
    EXPECT_EQ(m.metadata.get_int("llama.block_count"), 2);
    const TensorInfo* q = m.index.find("blk.1.ffn_down.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dtype, dtype);
    EXPECT_EQ(q->shape, (std::vector<int64_t>{256, 512}));
    EXPECT_EQ(q->nbytes, *dtype_bytes(dtype, 256 * 512));
    const TensorInfo* norm = m.index.find("output_norm.weight");
    ASSERT_NE(norm, nullptr);
    EXPECT_EQ(norm->dtype, DType::kF32);
    EXPECT_EQ(norm->shape, (std::vector<int64_t>{256}));
  }
}

TEST(FormatGguf, EveryFixtureGgufOpens) {
  int n = 0;
  for (const char* dir : {"models", "vocab", "quant", "hf"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(fixture(dir))) {
      if (e.path().extension() != ".gguf") continue;
      SCOPED_TRACE(e.path().string());
      ModelFile m = open_ok(e.path().string());
      EXPECT_GT(m.metadata.size(), 0u);
      EXPECT_TRUE(m.metadata.get_string("general.architecture").has_value());
      for (const TensorInfo& t : m.index.tensors()) {
        EXPECT_LE(t.offset + t.nbytes, m.file_size) << t.name;
      }
      ++n;
    }
  }
  EXPECT_GE(n, 1 + 12 + 11 + 10);
}

TEST(FormatGguf, HfConvertedGgufIsBf16) {
  ModelFile m = open_ok(fixture("hf/llama/model-bf16.gguf"));
  EXPECT_EQ(m.metadata.get_int("llama.embedding_length"), 64);  // hf/llama/config.json hidden_size
  EXPECT_EQ(m.metadata.get_int("llama.block_count"), 3);       // num_hidden_layers
  const TensorInfo* q = m.index.find("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kBF16);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{64, 64}));  // 4 heads x head_dim 16
}

TEST(FormatGguf, MissingFileIsNotFound) {
  auto r = open_model_file(fixture("models/no-such-model.gguf"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

// A named pipe as the model: refused at once as not a regular file (opening it blocked until a
// writer came).
TEST(FormatGguf, FifoIsRefusedWithoutWaiting) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("shoal-fifo-" + std::to_string(::getpid()) + ".gguf");
  std::filesystem::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  auto r = open_model_file(p.string());
  std::filesystem::remove(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace shoal

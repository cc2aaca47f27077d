// Hugging Face checkpoint folders: every fixture folder opens (facts from its config.json and
// fixtures/README.md); a missing lm_head and a tokenizer larger than the vocabulary are said at
// load; sharded checkpoints built here open, and disagreeing ones are refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "format/json_doc.h"
#include "format/model_file.h"
#include "format/safetensors.h"
#include "runtime/local_model.h"
#include "test_util.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

TEST(FormatHf, LlamaFolderFacts) {
  auto m = open_model_file(test::fixture("hf/llama"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->format, ModelFormat::kHuggingFace);
  EXPECT_EQ(m->hf_config["hidden_size"], 64);
  EXPECT_EQ(m->hf_config["num_hidden_layers"], 3);
  EXPECT_EQ(m->sources.size(), 1u);
  EXPECT_EQ(m->file_size, fs::file_size(test::fixture("hf/llama/model.safetensors")));
  EXPECT_EQ(m->metadata.size(), 0u);
  // config.json: vocab 512, hidden 64, 2 KV heads x head_dim 16, intermediate 160, tied embeddings.
  const TensorInfo* emb = m->index.find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
  const TensorInfo* k = m->index.find("model.layers.2.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{32, 64}));
  const TensorInfo* up = m->index.find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{160, 64}));
  EXPECT_EQ(m->index.find("lm_head.weight"), nullptr);
  EXPECT_EQ(m->index.find("model.layers.3.self_attn.k_proj.weight"), nullptr);
}

TEST(FormatHf, EveryFixtureFolderOpens) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(test::fixture("hf"))) {
    if (!e.is_directory()) continue;
    SCOPED_TRACE(e.path().string());
    auto m = open_model_file(e.path().string());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_TRUE(m->hf_config.is_object());
    EXPECT_FALSE(m->index.tensors().empty());
    // Every checkpoint stores an embedding of [vocab_size, hidden_size].
    const int64_t vocab = m->hf_config.contains("text_config")
                              ? m->hf_config["text_config"].value("vocab_size", 0)
                              : m->hf_config.value("vocab_size", 0);
    bool found = false;
    for (const TensorInfo& t : m->index.tensors()) {
      if (t.name.find("embed_tokens.weight") != std::string::npos || t.name == "transformer.wte.weight") {
        EXPECT_EQ(t.shape[0], vocab) << t.name;
        found = true;
      }
    }
    EXPECT_TRUE(found);
    ++n;
  }
  EXPECT_EQ(n, 10);
}

TEST(FormatHf, LoneSafetensorsFileOpens) {
  auto m = open_model_file(test::fixture("hf/qwen3/reference.safetensors"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->format, ModelFormat::kHuggingFace);
  EXPECT_EQ(m->index.size(), 4u);
  EXPECT_TRUE(m->hf_config.is_object());  // config.json beside it
}

// --- sharded checkpoints, built here ---------------------------------------------------------

TEST(FormatHf, AMissingLmHeadAgainstTheConfigIsSaid) {
  // hf/qwen3 says tie_word_embeddings false; without its lm_head.weight the embedding serves as the
  // head (as for a GGUF without output.weight), and the run says so instead of keeping quiet.
  const fs::path dir = fs::path(::testing::TempDir()) / "qwen3_no_head";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::fixture(std::string("hf/qwen3/") + f), dir / f);
  const std::string src = test::fixture("hf/qwen3/model.safetensors");
  std::ifstream in(src, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto st = parse_safetensors(file.data(), file.size(), src);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  std::vector<SafetensorsTensor> ts;
  for (const TensorInfo& t : st->tensors)
    if (t.name != "lm_head.weight")
      ts.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(file.begin() + t.offset,
                                                                   file.begin() + t.offset + t.nbytes)});
  ASSERT_EQ(ts.size() + 1, st->tensors.size());
  auto bytes = write_safetensors(ts, {});
  ASSERT_TRUE(bytes.ok());
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes->data()), std::streamsize(bytes->size()));
  const auto r = test::run_command(test::shoal_bin() + " run -m " + test::q(dir.string()) +
                                   " -p hi -n 1 -t 1 --temp 0 2>&1 >/dev/null");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("no lm_head.weight although tie_word_embeddings is false; the embedding serves"),
            std::string::npos) << r.out;
}

TEST(FormatHf, ATokenizerLargerThanTheModelsVocabularyIsSaidAtLoad) {
  // hf/llama's weights (vocab_size 512) with Qwen2's vocab.json + merges.txt (151643 tokens and more).
  const fs::path dir = fs::path(::testing::TempDir()) / "llama_qwen_tokenizer";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(test::fixture(std::string("hf/llama/") + f), dir / f);
  for (const char* f : {"vocab.json", "merges.txt"})
    fs::copy_file(test::fixture(std::string("tokenizers/qwen2/") + f), dir / f);
  const auto r = test::run_command(test::shoal_bin() + " run -m " + test::q(dir.string()) +
                                   " -p Hello -n 1 -t 1 --temp 0 2>&1 >/dev/null");
  EXPECT_EQ(r.status, 1) << r.out;  // "Hello" is id 9707
  EXPECT_NE(r.out.find("tokens, more than the model's vocabulary of 512"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("token id 9707 outside the vocabulary of 512"), std::string::npos) << r.out;
}

class ShardedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shoal_hf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    put("config.json", R"({"model_type": "llama", "hidden_size": 4})");
    shard("model-00001-of-00002.safetensors", {{"a", DType::kF32, {2}, bytes(8, 1)},
                                               {"b", DType::kBF16, {4}, bytes(8, 2)}});
    shard("model-00002-of-00002.safetensors", {{"c", DType::kF16, {1, 2}, bytes(4, 3)}});
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<uint8_t> bytes(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }
  void put(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  void shard(const std::string& name, const std::vector<SafetensorsTensor>& ts) {
    auto b = write_safetensors(ts, {});
    ASSERT_TRUE(b.ok());
    std::ofstream(dir_ / name, std::ios::binary).write(reinterpret_cast<const char*>(b->data()), b->size());
  }
  void index(const std::string& weight_map) {
    put("model.safetensors.index.json", R"({"metadata": {"total_size": 20}, "weight_map": )" + weight_map + "}");
  }
  Status open_status() {
    auto m = open_model_file(dir_.string());
    return m.ok() ? Status::Ok() : m.status();
  }
  void expect_error(Code code, const std::string& phrase) {
    Status s = open_status();
    ASSERT_FALSE(s.ok()) << phrase;
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(phrase), std::string::npos) << s.to_string();
  }
  static constexpr const char* kGoodMap =
      R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
          "c": "model-00002-of-00002.safetensors"})";
  fs::path dir_;
};

TEST_F(ShardedTest, OpensWithOneSourcePerShard) {
  index(kGoodMap);
  auto m = open_model_file(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->sources.size(), 2u);
  ASSERT_EQ(m->index.size(), 3u);
  EXPECT_EQ(m->index.find("a")->source, 0u);
  EXPECT_EQ(m->index.find("c")->source, 1u);
  EXPECT_EQ(m->hf_config["hidden_size"], 4);
  EXPECT_EQ(m->file_size, fs::file_size(dir_ / "model-00001-of-00002.safetensors") +
                              fs::file_size(dir_ / "model-00002-of-00002.safetensors"));
  const TensorInfo* c = m->index.find("c");
  uint8_t got[4] = {};
  ASSERT_TRUE(m->sources[c->source]->read(c->offset, got, 4).ok());
  EXPECT_EQ(got[0], 3);
  EXPECT_EQ(got[3], 3);
  const TensorInfo* a = m->index.find("a");
  ASSERT_NE(m->sources[a->source]->view(a->offset, a->nbytes), nullptr);
  EXPECT_EQ(m->bytes_read(), 4u + 8u);
  // Reads past a source's end are refused.
  EXPECT_EQ(m->sources[1]->read(c->offset, got, 1000).code(), Code::kOutOfRange);
  EXPECT_EQ(m->sources[1]->view(~uint64_t(0), 2), nullptr);
}

TEST_F(ShardedTest, MapNamesMissingTensor) {
  index(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"})");
  expect_error(Code::kCorrupt, "tensor 'd' is in the weight_map but not in shard");
}

TEST_F(ShardedTest, ShardHoldsTensorNotInMap) {
  index(R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
  expect_error(Code::kCorrupt, "tensor 'b' is in shard 'model-00001-of-00002.safetensors' but the weight_map says nothing");
}

TEST_F(ShardedTest, MapPointsToWrongShard) {
  index(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "c": "model-00001-of-00002.safetensors"})");
  expect_error(Code::kCorrupt, "tensor 'c' is in the weight_map but not in shard");
}

TEST_F(ShardedTest, ShardMissing) {
  index(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "c": "model-00003-of-00002.safetensors"})");
  expect_error(Code::kNotFound, "model-00003-of-00002.safetensors");
}

TEST_F(ShardedTest, ShardNameEscapesFolder) {
  index(R"({"a": "../model-00001-of-00002.safetensors"})");
  expect_error(Code::kCorrupt, "weight_map entry 'a' is not a plain file name");
}

TEST_F(ShardedTest, TensorInTwoShards) {
  shard("model-00002-of-00002.safetensors", {{"a", DType::kF32, {2}, bytes(8, 1)}});
  index(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
            "x": "model-00002-of-00002.safetensors"})");
  expect_error(Code::kCorrupt, "tensor 'a' is stored twice");
}

TEST_F(ShardedTest, BadIndexJson) {
  put("model.safetensors.index.json", "{\"weight_map\": ");
  expect_error(Code::kCorrupt, "invalid JSON");
  put("model.safetensors.index.json", R"({"weight_map": []})");
  expect_error(Code::kCorrupt, "weight_map is missing, empty or not an object");
  index(R"({"a": 5})");
  expect_error(Code::kCorrupt, "weight_map entry 'a' is not a plain file name");
}

TEST_F(ShardedTest, CorruptShardNamesTheShard) {
  index(kGoodMap);
  put("model-00002-of-00002.safetensors", "garbage!garbage!");
  expect_error(Code::kCorrupt, "model-00002-of-00002.safetensors");
}

TEST_F(ShardedTest, MissingConfig) {
  index(kGoodMap);
  fs::remove(dir_ / "config.json");
  expect_error(Code::kNotFound, "has no config.json");
}

TEST_F(ShardedTest, BadConfig) {
  index(kGoodMap);
  put("config.json", "[1, 2]");
  expect_error(Code::kCorrupt, "is not a JSON object");
  put("config.json", "{,}");
  expect_error(Code::kCorrupt, "invalid JSON");
}

// nlohmann copies a DOM recursively: a config nested 100k deep (600 KB) crashed the tokenizer's
// load with a stack overflow before the bound.
TEST_F(ShardedTest, DeeplyNestedConfigIsRefused) {
  index(kGoodMap);
  std::string deep = "{\"model_type\": \"llama\", \"x\": ";
  for (int i = 0; i < 100000; ++i) deep += "{\"a\": ";
  deep += "1" + std::string(100000, '}') + "}";
  put("config.json", deep);
  expect_error(Code::kCorrupt, "JSON nests deeper than 128 levels");
  put("config.json", "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error(Code::kCorrupt, "JSON nests deeper than 128 levels");
}

// The bound counts containers: 128 levels parse, 129 do not.
TEST(JsonDoc, NestingBoundIsExact) {
  auto nested = [](int levels) { return std::string(size_t(levels), '[') + std::string(size_t(levels), ']'); };
  EXPECT_TRUE(parse_json_doc(nested(kJsonMaxDepth), "t").ok());
  test::expect_error(parse_json_doc(nested(kJsonMaxDepth + 1), "t"), Code::kCorrupt, "t: JSON nests deeper than 128");
  test::expect_error(parse_json_doc("{\"a\": [1, 2,]}", "t"), Code::kCorrupt, "t: invalid JSON");
}

TEST_F(ShardedTest, NoWeights) {
  expect_error(Code::kNotFound, "neither model.safetensors nor model.safetensors.index.json");
}

// The index names the folder; one shard alone is not the model; a lone file needs its config.
TEST_F(ShardedTest, TheIndexFileOpensItsFolderAndOneShardIsNotAModel) {
  index(kGoodMap);
  auto m = open_model_file((dir_ / "model.safetensors.index.json").string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->index.size(), 3u);
  const std::string shard = (dir_ / "model-00001-of-00002.safetensors").string();
  auto one = open_model(shard, /*with_tokenizer=*/false);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(one.status().message(), "'" + shard + "' sits beside a model.safetensors.index.json, which names the "
                                    "checkpoint's shards: give the folder, '" + dir_.string() + "'");
  fs::remove(dir_ / "model.safetensors.index.json");
  fs::remove(dir_ / "config.json");
  auto alone = open_model(shard, /*with_tokenizer=*/false);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), Code::kNotFound);
  EXPECT_NE(alone.status().message().find("has no config.json beside it"), std::string::npos) << alone.status().to_string();
  EXPECT_TRUE(open_model_file(shard).ok());  // (inspect reads it as it is)
}

TEST_F(ShardedTest, NotAModel) {
  put("notes.txt", "hello");
  auto m = open_model_file((dir_ / "notes.txt").string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kUnsupported);
  put("bad.gguf", "GGUX");
  m = open_model_file((dir_ / "bad.gguf").string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace shoal

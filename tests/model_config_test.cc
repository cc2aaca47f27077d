// What a model file says about its graph, read strictly: config.json fields and GGUF keys of the
// wrong type are refused by name (not replaced by a default), RoPE parameters that give no finite
// angles are refused, a bias Shoal's graph has no place for is refused, tensors it does not read
// are warned of; an o_proj bias is the GGUF's attn_output.bias; sliding windows follow
// transformers' rules. Expected values: the fixtures' references (hf/llama and its llama.cpp
// conversion, model-bf16.gguf) and the configs written here by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "format/gguf.h"
#include "format/model_file.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "test_util.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

// hf/llama copied with `key`'s value in config.json (the fixture's text) replaced by `value`.
fs::path hf_llama_with(const std::string& name, const std::string& key, const std::string& value) {
  return test::hf_llama_copy_with(name, [&](std::string& config) {
    const std::regex field("\"" + key + "\": (\\{[^}]*\\}|[^,\\n]*)");
    ASSERT_TRUE(std::regex_search(config, field)) << key;
    config = std::regex_replace(config, field, "\"" + key + "\": " + value, std::regex_constants::format_first_only);
  });
}

// The model at `dir` opened (config only matters): its status.
Status open_status(const fs::path& dir) {
  auto m = open_model(dir.string(), /*with_tokenizer=*/false);
  return m.ok() ? Status::Ok() : m.status();
}

TEST(HfConfig, FieldsOfTheWrongTypeAreRefusedByName) {
  const struct {
    const char* key;
    const char* value;
    Code code;
    const char* says;
  } cases[] = {
      {"rms_norm_eps", "\"x\"", Code::kCorrupt, "config.json: 'rms_norm_eps' = \"x\" is not a number"},
      {"hidden_act", "3", Code::kCorrupt, "config.json: 'hidden_act' = 3 is not a string"},
      {"attention_bias", "\"yes\"", Code::kCorrupt, "config.json: 'attention_bias' = \"yes\" is not true or false"},
      {"tie_word_embeddings", "\"false\"", Code::kCorrupt,
       "config.json: 'tie_word_embeddings' = \"false\" is not true or false"},
      {"num_hidden_layers", "\"3\"", Code::kCorrupt, "config.json: 'num_hidden_layers' = \"3\" is not an integer"},
      {"num_hidden_layers", "null", Code::kCorrupt, "config.json: missing integer 'num_hidden_layers'"},
      {"rope_parameters", "\"default\"", Code::kCorrupt, "config.json: 'rope_parameters' = \"default\" is not an object"},
      {"rope_parameters", "{\"rope_theta\": \"1e4\"}", Code::kCorrupt,
       "config.json: 'rope_theta' = \"1e4\" is not a number"},
      {"rope_parameters", "{\"rope_type\": 3}", Code::kCorrupt, "config.json: 'rope_type' = 3 is not a string"},
      {"rope_parameters", "{\"rope_theta\": 0.0}", Code::kCorrupt,
       "RoPE base (rope_theta / rope.freq_base) 0 is not a finite number > 0"},
      {"rope_parameters", "{\"rope_theta\": -10000.0}", Code::kCorrupt,
       "RoPE base (rope_theta / rope.freq_base) -10000 is not a finite number > 0"},
      {"rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 0}", Code::kCorrupt,
       "RoPE scaling factor 0 is not a finite number > 0"},
      {"rope_parameters", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 4}",
       Code::kCorrupt, "llama3 RoPE scaling: low_freq_factor 4 and high_freq_factor 4 are not 0 < low < high"},
      {"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4}", Code::kUnsupported,
       "config.json: rope scaling type 'yarn' is not supported"},
      {"mlp_bias", "true", Code::kUnsupported, "config.json: mlp_bias (biases on the FFN) is not supported"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value);
    const fs::path dir = hf_llama_with("hf_llama_field", c.key, c.value);
    const Status st = open_status(dir);
    fs::remove_all(dir);
    EXPECT_EQ(st.code(), c.code) << st.to_string();
    EXPECT_EQ(st.message(), dir.string() + ": " + c.says);
  }
}

// hf/llama as model_type `type` with `extra` fields (JSON members, comma-first): each layer's window.
std::vector<int> windows_of(const std::string& type, const std::string& extra) {
  const fs::path dir = test::hf_llama_copy_with("hf_llama_window", [&](std::string& config) {
    config = std::regex_replace(config, std::regex("\"model_type\": \"llama\""), "\"model_type\": \"" + type + "\"" + extra);
  });
  auto m = open_model(dir.string(), /*with_tokenizer=*/false);
  fs::remove_all(dir);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  std::vector<int> w;
  if (m.ok())
    for (const LayerConfig& L : m->config.layers) w.push_back(L.sliding_window);
  return w;
}

// transformers: Mistral's every layer has `sliding_window`; Llama's none; Qwen2 / Qwen3 only with
// use_sliding_window, from max_window_layers on, or where layer_types says "sliding_attention".
TEST(HfConfig, SlidingWindowsFollowTransformersRules) {
  EXPECT_EQ(windows_of("mistral", ", \"sliding_window\": 8"), (std::vector<int>{8, 8, 8}));
  EXPECT_EQ(windows_of("mistral", ", \"sliding_window\": null"), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(windows_of("mistral", ""), (std::vector<int>{4096, 4096, 4096}));  // MistralConfig's default
  EXPECT_EQ(windows_of("qwen2", ", \"sliding_window\": 8, \"use_sliding_window\": true"),
            (std::vector<int>{0, 0, 0}));  // Qwen2Config's max_window_layers: 28
  EXPECT_EQ(windows_of("llama", ", \"sliding_window\": 8"), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(windows_of("qwen2", ", \"sliding_window\": 8, \"max_window_layers\": 1"), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(windows_of("qwen2", ", \"sliding_window\": 8, \"use_sliding_window\": true, \"max_window_layers\": 1"),
            (std::vector<int>{0, 8, 8}));
  EXPECT_EQ(windows_of("qwen2", ", \"sliding_window\": 8, \"use_sliding_window\": true, \"layer_types\": "
                                "[\"sliding_attention\", \"full_attention\", \"sliding_attention\"]"),
            (std::vector<int>{8, 0, 8}));
}

// hf/llama's model.safetensors rewritten into `dir` with `extra` tensors (f32, shape [n]) added.
struct ExtraTensor {
  std::string name;
  std::vector<float> values;
};
void write_safetensors_with(const fs::path& dir, const std::vector<ExtraTensor>& extra) {
  auto f = MappedFile::open(test::fixture("hf/llama/model.safetensors"));
  ASSERT_TRUE(f.ok());
  const uint8_t* p = f->data();
  uint64_t header_len = 0;
  std::memcpy(&header_len, p, 8);
  auto header = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(p + 8), header_len));
  const std::string data(reinterpret_cast<const char*>(p + 8 + header_len), f->size() - 8 - header_len);
  std::string more;
  for (const ExtraTensor& t : extra) {
    const size_t at = data.size() + more.size();
    header[t.name] = {{"dtype", "F32"}, {"shape", {t.values.size()}}, {"data_offsets", {at, at + 4 * t.values.size()}}};
    more.append(reinterpret_cast<const char*>(t.values.data()), 4 * t.values.size());
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << data << more;
}

// `shoal check` of the model at `dir` against hf/llama's reference: its max_abs_err and output.
double check_error(const fs::path& dir, std::string* out = nullptr) {
  const auto r = test::run_command(test::shoal_bin() + " check -m " + dir.string() + " --reference " +
                                   test::fixture("hf/llama/reference.safetensors") + " --device cpu-ref 2>&1");
  if (out) *out = r.out;
  std::smatch m;
  if (!std::regex_search(r.out, m, std::regex(R"(max_abs_err=(\S+))"))) return -1;
  return std::stod(m[1]);
}

// The GGUF fixture `rel` rewritten to TempDir()/name with `edit` applied to its metadata and
// `extra` f32 tensors added; the new file's path.
std::string gguf_copy_with(const std::string& rel, const std::string& name, const std::function<void(GgufWriter&)>& edit,
                           const std::vector<ExtraTensor>& extra = {}) {
  auto m = open_model_file(test::fixture(rel));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  GgufWriter w;
  w.set_all(m->metadata);
  edit(w);
  for (const TensorInfo& t : m->index.tensors()) {
    WeightSource* src = m->sources[t.source].get();
    EXPECT_TRUE(w.add_tensor(t.name, t.dtype, t.shape, [src, &t](uint64_t off, uint8_t* dst, uint64_t n) {
                   return src->read(t.offset + off, dst, n);
                 }).ok());
  }
  for (const ExtraTensor& t : extra) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(t.values.data());
    EXPECT_TRUE(w.add_tensor(t.name, DType::kF32, {int64_t(t.values.size())}, {bytes, 4 * t.values.size()}).ok());
  }
  const std::string path = (fs::path(::testing::TempDir()) / name).string();
  EXPECT_TRUE(w.write(path).ok());
  return path;
}

// Prefill logits of `ids` (every position) from the model at `path`, on the reference backend.
std::vector<float> prefill_logits(const std::string& path, const std::vector<int32_t>& ids) {
  LocalModelOptions o;
  o.device = "cpu-ref";
  o.threads = 1;
  o.n_ctx = 64;
  o.kv_dtype = DType::kF32;
  o.tokenizer = false;
  o.progress = false;
  auto m = load_local_model(path, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  StepOutput out;
  out.mode = HeadMode::kLogitsAll;
  const Status st = m->pipeline->forward(ids, 0, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out.logits;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// attention_bias: true gives q / k / v / o biases in transformers. The HF checkpoint's o_proj.bias
// is the one llama.cpp's GGUF names attn_output.bias: with the same random v and o biases added to
// both forms of hf/llama (q / k zero: a GGUF's q / k rows are permuted for its RoPE layout), their
// logits agree as closely as without biases, and move far from the bias-free reference. Zero
// biases leave the reference's logits; a tensor no rule names and one the graph does not read are
// warned of, by their names in the checkpoint.
TEST(HfWeights, AnOProjBiasIsTheGgufsAttnOutputBias) {
  const int d = 64, q = 4 * 16, kv = 2 * 16;  // hf/llama: d_model 64, 4 heads and 2 KV heads of 16
  std::mt19937 rng(20261207);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  auto random = [&](int n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  std::vector<ExtraTensor> hf_zero, hf_random, gguf_random;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const std::vector<float> v_bias = random(kv), o_bias = random(d);
    for (auto* list : {&hf_zero, &hf_random}) {
      const bool zero = list == &hf_zero;
      list->push_back({p + "q_proj.bias", std::vector<float>(size_t(q), 0.0f)});
      list->push_back({p + "k_proj.bias", std::vector<float>(size_t(kv), 0.0f)});
      list->push_back({p + "v_proj.bias", zero ? std::vector<float>(size_t(kv), 0.0f) : v_bias});
      list->push_back({p + "o_proj.bias", zero ? std::vector<float>(size_t(d), 0.0f) : o_bias});
    }
    const std::string g = "blk." + std::to_string(l) + ".";
    gguf_random.push_back({g + "attn_q.bias", std::vector<float>(size_t(q), 0.0f)});
    gguf_random.push_back({g + "attn_k.bias", std::vector<float>(size_t(kv), 0.0f)});
    gguf_random.push_back({g + "attn_v.bias", v_bias});
    gguf_random.push_back({g + "attn_output.bias", o_bias});
  }
  hf_zero.push_back({"model.layers.0.mlp.extra_norm.weight", std::vector<float>(size_t(d), 1.0f)});
  hf_zero.push_back({"model.layers.0.self_attn.q_norm.weight", std::vector<float>(16, 1.0f)});  // a rule's, unread

  const fs::path zero_dir = hf_llama_with("hf_llama_zero_bias", "attention_bias", "true");
  write_safetensors_with(zero_dir, hf_zero);
  std::string out;
  const double err = check_error(zero_dir, &out);
  fs::remove_all(zero_dir);
  EXPECT_GE(err, 0) << out;
  EXPECT_LT(err, 1e-4) << out;
  EXPECT_NE(out.find("2 tensors of the model are not read by Shoal's llama graph "
                     "('model.layers.0.mlp.extra_norm.weight', 'model.layers.0.self_attn.q_norm.weight')"),
            std::string::npos)
      << out;

  const std::vector<int32_t> ids = {1, 17, 42, 99, 250, 3, 7, 311, 64, 128};
  const fs::path hf_dir = hf_llama_with("hf_llama_random_bias", "attention_bias", "true");
  write_safetensors_with(hf_dir, hf_random);
  const std::string gguf = gguf_copy_with("hf/llama/model-bf16.gguf", "llama_random_bias.gguf", [](GgufWriter&) {},
                                          gguf_random);
  const auto hf = prefill_logits(hf_dir.string(), ids);
  const auto gg = prefill_logits(gguf, ids);
  const auto plain = prefill_logits(test::fixture("hf/llama"), ids);
  fs::remove_all(hf_dir);
  fs::remove(gguf);
  ASSERT_FALSE(hf.empty());
  EXPECT_LT(max_abs_diff(hf, gg), 1e-4);
  EXPECT_LT(max_abs_diff(plain, prefill_logits(test::fixture("hf/llama/model-bf16.gguf"), ids)), 1e-4);  // the same two
  EXPECT_GT(max_abs_diff(hf, plain), 0.1);
}

// stories260K rewritten with `edit` applied to its metadata and `extra` f32 tensors added.
std::string stories_with(const std::string& name, const std::function<void(GgufWriter&)>& edit,
                         const std::vector<ExtraTensor>& extra = {}) {
  return gguf_copy_with("models/stories260K.gguf", name, edit, extra);
}

TEST(GgufConfig, KeysOfTheWrongTypeAndUnsupportedScalingAreRefusedByName) {
  const struct {
    std::function<void(GgufWriter&)> edit;
    std::vector<ExtraTensor> extra;
    Code code;
    const char* says;
  } cases[] = {
      {[](GgufWriter& w) { w.set("llama.rope.freq_base", MetaValue::str("10000")); }, {}, Code::kCorrupt,
       "key 'llama.rope.freq_base' is string, not a number"},
      {[](GgufWriter& w) { w.set("llama.attention.layer_norm_rms_epsilon", MetaValue::str("1e-5")); }, {},
       Code::kCorrupt, "key 'llama.attention.layer_norm_rms_epsilon' is string, not a number"},
      {[](GgufWriter& w) { w.set("llama.rope.freq_base", MetaValue::f32(std::nanf(""))); }, {}, Code::kCorrupt,
       "RoPE base (rope_theta / rope.freq_base) nan is not a finite number > 0"},
      {[](GgufWriter& w) { w.set("llama.rope.scaling.type", MetaValue::str("yarn")); }, {}, Code::kUnsupported,
       "rope scaling type 'yarn' (llama.rope.scaling.type) is not supported (none, linear)"},
      {[](GgufWriter& w) { w.set("llama.rope.scaling.type", MetaValue::u32(1)); }, {}, Code::kCorrupt,
       "key 'llama.rope.scaling.type' is u32, not a string"},
      {[](GgufWriter& w) {
         w.set("llama.rope.scaling.type", MetaValue::str("linear"));
         w.set("llama.rope.scaling.factor", MetaValue::f32(0.0f));
       },
       {}, Code::kCorrupt, "RoPE scaling factor 0 is not a finite number > 0"},
      {[](GgufWriter&) {}, {{"blk.0.ffn_up.bias", std::vector<float>(172, 0.0f)}}, Code::kUnsupported,
       "tensor 'blk.0.ffn_up.bias': biases on the FFN's gate / up are not supported"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(cases[i].says);
    const std::string path = stories_with("stories_key.gguf", cases[i].edit, cases[i].extra);
    auto m = open_model(path, /*with_tokenizer=*/false);
    fs::remove(path);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), cases[i].code) << m.status().to_string();
    EXPECT_EQ(m.status().message(), path + ": " + cases[i].says);
  }
  // "none" is no scaling: the model opens.
  const std::string path = stories_with("stories_none.gguf", [](GgufWriter& w) {
    w.set("llama.rope.scaling.type", MetaValue::str("none"));
  });
  auto m = open_model(path, /*with_tokenizer=*/false);
  fs::remove(path);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
}

// A tensor the graph has no use for (a q/k norm in a llama GGUF: another architecture relabelled)
// is warned of; llama.cpp refuses such a file by its tensor count.
TEST(GgufWeights, ATensorTheGraphDoesNotReadIsWarnedOf) {
  const std::string path = stories_with("stories_qk_norm.gguf", [](GgufWriter&) {},
                                        {{"blk.0.attn_q_norm.weight", std::vector<float>(8, 1.0f)}});
  const auto r = test::run_command(test::shoal_bin() + " run -m " + path + " -p Once -n 2 --temp 0 2>&1 >/dev/null");
  fs::remove(path);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(path + ": 1 tensor of the model is not read by Shoal's llama graph "
                       "('blk.0.attn_q_norm.weight'); its output may differ"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace shoal

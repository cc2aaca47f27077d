// The load-time warm-up on CUDA (Slice::warm_up): after it, no step a session runs allocates
// scratch: prompt chunks of every size at both ends of the cache with every head output, chained
// greedy and sampled decoding; a slice loaded without it does allocate. The model is a random
// F16 Llama written here with head_dim 128 (the tensor-core attention, whose splits grow as the
// tokens shrink) and d_ff 16384, so gate and up take one GEMM for steps of up to 256 tokens and
// two above (the 300-token warm-up), with f16 and Q8_0 caches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "core/half.h"
#include "format/gguf.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "stepwise_pipeline.h"

namespace shoal {
namespace {

// The model's shape.
struct WarmUpLlama {
  static constexpr int kDModel = 256, kLayers = 2, kHeads = 2, kKvHeads = 1, kHeadDim = 128, kFf = 16384,
                       kVocab = 512;
};

/// Writes that model (F16 matrices uniform in +-sqrt(3 / fan-in), norms 1) to `path`.
Status write_f16_llama(const std::string& path) {
  using M = WarmUpLlama;
  GgufWriter w;
  w.set("general.architecture", MetaValue::str("llama"));
  w.set("llama.context_length", MetaValue::u32(4096));
  w.set("llama.embedding_length", MetaValue::u32(M::kDModel));
  w.set("llama.block_count", MetaValue::u32(M::kLayers));
  w.set("llama.feed_forward_length", MetaValue::u32(M::kFf));
  w.set("llama.attention.head_count", MetaValue::u32(M::kHeads));
  w.set("llama.attention.head_count_kv", MetaValue::u32(M::kKvHeads));
  w.set("llama.attention.key_length", MetaValue::u32(M::kHeadDim));
  w.set("llama.attention.value_length", MetaValue::u32(M::kHeadDim));
  w.set("llama.rope.freq_base", MetaValue::f32(500000.0f));
  w.set("llama.rope.dimension_count", MetaValue::u32(M::kHeadDim));
  w.set("llama.attention.layer_norm_rms_epsilon", MetaValue::f32(1e-5f));
  w.set("llama.vocab_size", MetaValue::u32(M::kVocab));
  uint32_t seed = 1;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / float(cols));
    const uint32_t s = seed++;
    return w.add_tensor(name, DType::kF16, {rows, cols}, [a, s](uint64_t offset, uint8_t* dst, uint64_t n) {
      for (uint64_t i = 0; i < n / 2; ++i) {  // (offsets and chunks of whole values)
        uint32_t h = uint32_t(offset / 2 + i) * 2654435761u ^ s * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const uint16_t v = f32_to_f16((float(h % 2001u) / 1000.0f - 1.0f) * a);
        std::memcpy(dst + 2 * i, &v, 2);
      }
      return Status::Ok();
    });
  };
  auto ones = [&](const std::string& name, int64_t n) {
    const std::vector<float> v(static_cast<size_t>(n), 1.0f);
    return w.add_tensor(name, DType::kF32, {n},
                        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4));
  };
  SHOAL_RETURN_IF_ERROR(matrix("token_embd.weight", M::kVocab, M::kDModel));
  for (int l = 0; l < M::kLayers; ++l) {
    auto n = [&](const char* x) { return fmt::format("blk.{}.{}", l, x); };
    SHOAL_RETURN_IF_ERROR(ones(n("attn_norm.weight"), M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_q.weight"), M::kHeads * M::kHeadDim, M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_k.weight"), M::kKvHeads * M::kHeadDim, M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_v.weight"), M::kKvHeads * M::kHeadDim, M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_output.weight"), M::kDModel, M::kHeads * M::kHeadDim));
    SHOAL_RETURN_IF_ERROR(ones(n("ffn_norm.weight"), M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_gate.weight"), M::kFf, M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_up.weight"), M::kFf, M::kDModel));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_down.weight"), M::kDModel, M::kFf));
  }
  SHOAL_RETURN_IF_ERROR(ones("output_norm.weight", M::kDModel));
  SHOAL_RETURN_IF_ERROR(matrix("output.weight", M::kVocab, M::kDModel));
  return w.write(path);
}

TEST(CudaWarmUp, AfterTheWarmUpNoStepAllocatesScratch) {
  if (!create_backend("cuda:0").ok()) GTEST_SKIP() << "no CUDA device";
  const std::string path = ::testing::TempDir() + fmt::format("warm_up_f16_llama_{}.gguf", getpid());
  ASSERT_TRUE(write_f16_llama(path).ok());
  auto m = open_model(path, false);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  constexpr int kCtx = 2048, kChunk = 300;
  std::vector<int32_t> ids(kChunk);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 1) % WarmUpLlama::kVocab);
  const HeadMode modes[] = {HeadMode::kArgmaxAll, HeadMode::kLogitsLast, HeadMode::kTopKLast,
                            HeadMode::kNone,      HeadMode::kLogitsAll,  HeadMode::kArgmaxLast};
  for (DType kv : {DType::kF16, DType::kQ8_0}) {
    for (bool warm : {true, false}) {
      SCOPED_TRACE(fmt::format("{} cache, {}", dtype_name(kv), warm ? "warm-up" : "no warm-up"));
      auto g = create_backend("cuda:0");
      ASSERT_TRUE(g.ok());
      SliceOptions so;
      so.n_ctx = kCtx;
      so.max_tokens = kChunk;
      so.kv_dtype = kv;
      so.warm_up = warm;
      auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, WarmUpLlama::kLayers, true, true}, so, **g);
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      Slice& sl = **s;
      const int64_t loaded = cuda_probe::scratch_allocations(**g);
      auto fill = [&] {  // the whole cache, for the steps at its end (rewind only goes back)
        StepOutput none;
        none.mode = HeadMode::kNone;
        sl.rewind(0);
        for (int p = 0; p < kCtx; p += kChunk)
          ASSERT_TRUE(sl.forward(StepInput{std::min(kChunk, kCtx - p), p, ids.data()}, none).ok());
      };
      size_t k = 0;
      for (bool at_end : {true, false}) {
        if (at_end) fill();
        for (int n : {1, 2, 5, 8, 9, 16, 100, 240, 256, 257, 300}) {
          const int pos0 = at_end ? kCtx - n : 0;
          sl.rewind(pos0);
          StepOutput out;
          out.mode = modes[k++ % std::size(modes)];
          out.top_k = out.mode == HeadMode::kTopKLast ? 40 : 0;
          const Status st = sl.forward(StepInput{n, pos0, ids.data()}, out);
          ASSERT_TRUE(st.ok()) << n << " tokens at " << pos0 << ": " << st.to_string();
        }
      }
      fill();
      for (bool greedy : {true, false}) {
        const int pos0 = kCtx - 64;
        sl.rewind(pos0);
        StepOutput am;
        am.mode = HeadMode::kArgmaxLast;
        ASSERT_TRUE(sl.forward(StepInput{1, pos0, ids.data()}, am).ok());
        const DecodeSampling how = greedy ? DecodeSampling{} : test::sampled(7, 0);
        auto r = sl.decode(am.ids[0], pos0 + 1, kCtx - pos0 - 1, how, [](int32_t) { return true; });
        ASSERT_TRUE(r.ok()) << r.status().to_string();
      }
      if (warm) {
        EXPECT_EQ(cuda_probe::scratch_allocations(**g), loaded);
      } else {
        EXPECT_GT(cuda_probe::scratch_allocations(**g), loaded);
      }
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace shoal

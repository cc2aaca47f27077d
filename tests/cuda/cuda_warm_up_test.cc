// The load-time warm-up on CUDA (Slice::warm_up): after it, no step a session runs allocates
// scratch: prompt chunks of every size at both ends of the cache with every head output, chained
// greedy and sampled decoding; a slice loaded without it does allocate. The model is a random
// F16 Llama (write_synthetic_gguf) with head_dim 128 (the tensor-core attention, whose splits
// grow as the tokens shrink) and d_ff 16384, so gate and up take one GEMM for steps of up to 256
// tokens and two above (the 300-token warm-up), with f16 and Q8_0 caches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "format/synthetic_gguf.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "stepwise_pipeline.h"

namespace shoal {
namespace {

// The model: Llama-style, 2 layers of d_model 256, 2 heads of 128 (one KV head), d_ff 16384.
const SyntheticShape kWarmUpLlama{"llama", 2, 256, 16384, 2, 1, 128, 512, 4096, 500000.0f, 1e-5f, false, false};

TEST(CudaWarmUp, AfterTheWarmUpNoStepAllocatesScratch) {
  if (!create_backend("cuda:0").ok()) GTEST_SKIP() << "no CUDA device";
  const std::string path = ::testing::TempDir() + fmt::format("warm_up_f16_llama_{}.gguf", getpid());
  ASSERT_TRUE(write_synthetic_gguf(kWarmUpLlama, DType::kF16, path).ok());
  auto m = open_model(path, false);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  constexpr int kCtx = 2048, kChunk = 300;
  std::vector<int32_t> ids(kChunk);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 1) % size_t(kWarmUpLlama.vocab));
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
      auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, kWarmUpLlama.n_layers, true, true}, so, **g);
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

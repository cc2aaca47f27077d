// Norms, elementwise ops, conversion, embedding and sampling on CUDA against the CPU reference
// backend on fresh random inputs (several shapes, odd sizes included), GPU outputs poisoned first.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <tuple>

#include "backend/sampling_math.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

using CudaOpsTest = CudaVsRef;

constexpr double kF32Tol = 1e-5;  // f32 on the GPU against double-accumulated reference values

TEST_F(CudaOpsTest, RmsNormRowsAndPerHeadGroups) {
  for (auto [rows, width, group] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 4096},
                                    {3, 1024, 128},
                                    {5, 37, 37},
                                    {2, 5120, 5120},
                                    {7, 96, 96}}) {
    SCOPED_TRACE(fmt::format("{}x{} groups of {}", rows, width, group));
    Dual x = make_f32({rows, width}, randn(rows * width, 3.0f));
    Dual w = make_f32({group}, randn(group));
    Dual y = output(DType::kF32, {rows, width});
    cpu_->rms_norm(x.c, w.c, 1e-6f, y.c);
    gpu_->rms_norm(x.g, w.g, 1e-6f, y.g);
    EXPECT_LT(nerr(y), kF32Tol);
    // In place (y aliases x).
    cpu_->rms_norm(x.c, w.c, 1e-5f, x.c);
    gpu_->rms_norm(x.g, w.g, 1e-5f, x.g);
    EXPECT_LT(nerr(x), kF32Tol);
  }
}

TEST_F(CudaOpsTest, AddRmsNormFused) {
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 4096}, {9, 896}, {4, 33}}) {
    Dual x = make_f32({rows, d}, randn(rows * d));
    Dual delta = make_f32({rows, d}, randn(rows * d));
    Dual w = make_f32({d}, randn(d));
    Dual y = output(DType::kF32, {rows, d});
    cpu_->add_rms_norm(x.c, delta.c, w.c, 1e-5f, y.c);
    gpu_->add_rms_norm(x.g, delta.g, w.g, 1e-5f, y.g);
    EXPECT_LT(nerr(x), kF32Tol);
    EXPECT_LT(nerr(y), kF32Tol);
  }
}

TEST_F(CudaOpsTest, LayerNormWithAndWithoutBias) {
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 2560}, {6, 100}, {3, 2049}})
    for (bool bias : {false, true}) {
      std::vector<float> xv = randn(rows * d);
      for (auto& v : xv) v += 5.0f;  // a mean far from zero
      Dual x = make_f32({rows, d}, xv);
      Dual w = make_f32({d}, randn(d)), b = make_f32({d}, randn(d));
      Dual y = output(DType::kF32, {rows, d});
      cpu_->layer_norm(x.c, w.c, bias ? &b.c : nullptr, 1e-5f, y.c);
      gpu_->layer_norm(x.g, w.g, bias ? &b.g : nullptr, 1e-5f, y.g);
      EXPECT_LT(nerr(y), kF32Tol);
    }
}

TEST_F(CudaOpsTest, AddScaleGluActivation) {
  for (int64_t n : {1, 255, 4097}) {
    std::vector<float> av = randn(n, 2.0f);
    if (n > 4) av[0] = -5.5f, av[1] = -4.5f, av[2] = -3.0f, av[3] = 7.5f;  // the tails of each activation
    Dual a = make_f32({n}, av), b = make_f32({n}, randn(n, 2.0f));
    Dual y = output(DType::kF32, {n});
    cpu_->add(a.c, b.c, y.c);
    gpu_->add(a.g, b.g, y.g);
    EXPECT_EQ(nerr(y), 0.0);
    cpu_->scale(y.c, 0.37f);
    gpu_->scale(y.g, 0.37f);
    EXPECT_EQ(nerr(y), 0.0);
    for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf}) {
      Dual o = output(DType::kF32, {n});
      cpu_->glu(a.c, b.c, act, o.c);
      gpu_->glu(a.g, b.g, act, o.g);
      EXPECT_LT(nerr(o), kF32Tol);
      Dual o2 = output(DType::kF32, {n});
      cpu_->activation(a.c, act, o2.c);
      gpu_->activation(a.g, act, o2.g);
      EXPECT_LT(nerr(o2), kF32Tol);
    }
  }
}

TEST_F(CudaOpsTest, ActivationsKeepRelativeAccuracyInTheTails) {
  // 1 + tanh(u) and 1 + erf(z) cancel in f32 for negative inputs; each element is checked alone.
  // (Below -6 the double-precision reference itself loses the digits to the same cancellation.)
  std::vector<float> v;
  for (float x = -5.75f; x <= 12.0f; x += 0.25f) v.push_back(x);
  const int64_t n = int64_t(v.size());
  Dual x = make_f32({n}, v);
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf}) {
    Dual o = output(DType::kF32, {n});
    cpu_->activation(x.c, act, o.c);
    gpu_->activation(x.g, act, o.g);
    const auto g = floats(*gpu_, o.g), c = floats(*cpu_, o.c);
    for (size_t i = 0; i < c.size(); ++i) {
      if (std::fabs(c[i]) > 1e-30f) {
        EXPECT_NEAR(g[i] / c[i], 1.0, 1e-5) << "act " << int(act) << " x " << v[i];
      }
    }
  }
}

TEST_F(CudaOpsTest, ConvertBetweenF32F16Bf16IsExact) {
  const int64_t n = 1001;
  std::vector<float> v = randn(n, 100.0f);
  v[0] = 70000.0f;  // overflows f16 to inf
  v[1] = 1e-6f;     // subnormal in f16
  for (DType from : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("{} -> {}", dtype_name(from), dtype_name(to)));
      const auto src_bytes = encode(from, v);
      Dual src = make(from, {n}, src_bytes.data());
      Dual dst = output(to, {n});
      cpu_->convert(src.c, dst.c);
      gpu_->convert(src.g, dst.g);
      EXPECT_EQ(bytes_of(*cpu_, dst.c), bytes_of(*gpu_, dst.g));
    }
}

TEST_F(CudaOpsTest, EmbedEveryDtypeIsExact) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    SCOPED_TRACE(dtype_name(t));
    Dual table = make_weight(t, {301, 96});
    Dual ids = make_i32({5, 299, 0, 5, 17, 128, 200});
    Dual out = output(DType::kF32, {7, 96});
    cpu_->embed(table.c, ids.c, out.c);
    gpu_->embed(table.g, ids.g, out.g);
    EXPECT_EQ(nerr(out), 0.0);
  }
}

TEST_F(CudaOpsTest, ArgmaxLowestIndexOnTies) {
  // (6146 values: rows 0 and 2 start 16-byte aligned, row 1 does not; three whole slices and a
  // partial one per row.)
  for (int64_t vocab : {1, 7, 6146, 8192, 32000, 151936}) {
    const int64_t rows = 3;
    std::vector<float> v = randn(rows * vocab);
    // Row 1: the maximum twice; row 2: everything equal.
    if (vocab > 5) v[size_t(vocab + vocab - 2)] = v[size_t(vocab + 3)] = 50.0f;
    for (int64_t j = 0; j < vocab; ++j) v[size_t(2 * vocab + j)] = -1.5f;
    Dual logits = make_f32({rows, vocab}, v);
    Dual out = output(DType::kI32, {rows});
    cpu_->argmax(logits.c, out.c);
    gpu_->argmax(logits.g, out.g);
    EXPECT_EQ(bytes_of(*cpu_, out.c), bytes_of(*gpu_, out.g)) << "vocab " << vocab;
  }
}

TEST_F(CudaOpsTest, TopKSortedWithTiesByIndex) {
  // (Slices of 2048, 4096 and 8192 logits: k 40 / 50, 128256 x 256, 151936 x 256 / 1024.)
  for (auto [vocab, k] : {std::pair<int64_t, int>{10, 10}, {1000, 1}, {32000, 40}, {128256, 50}, {128256, 256},
                          {151936, 256}, {151936, 1024}, {9000, 700}}) {
    SCOPED_TRACE(fmt::format("vocab {} k {}", vocab, k));
    std::vector<float> v = randn(vocab);
    // Ties across slices and inside the top k.
    for (int64_t j = 0; j < vocab; j += std::max<int64_t>(1, vocab / 13)) v[size_t(j)] = 4.25f;
    Dual logits = make_f32({1, vocab}, v);
    Dual ids = output(DType::kI32, {k}), vals = output(DType::kF32, {k});
    cpu_->top_k(logits.c, k, ids.c, vals.c);
    gpu_->top_k(logits.g, k, ids.g, vals.g);
    EXPECT_EQ(bytes_of(*cpu_, ids.c), bytes_of(*gpu_, ids.g));
    EXPECT_EQ(bytes_of(*cpu_, vals.c), bytes_of(*gpu_, vals.g));
  }
}

// Logits a radix select must not trip over: all equal (the k lowest ids), +0 and -0 (equal:
// by id) above negatives, -inf masks with fewer finite values than k, huge and tiny magnitudes.
TEST_F(CudaOpsTest, TopKOfTiesZerosAndMasks) {
  const int64_t vocab = 40000;
  const float inf = std::numeric_limits<float>::infinity();
  for (int kind = 0; kind < 4; ++kind) {
    SCOPED_TRACE(fmt::format("kind {}", kind));
    std::vector<float> v(size_t(vocab), 1.0f);
    if (kind == 1)
      for (int64_t j = 0; j < vocab; ++j) v[size_t(j)] = j % 3 == 0 ? (j % 2 ? -0.0f : 0.0f) : -1.0f - float(j % 7);
    if (kind == 2) {
      std::fill(v.begin(), v.end(), -inf);
      for (int64_t j = 5; j < vocab; j += 997) v[size_t(j)] = float(j % 5);
    }
    if (kind == 3) {
      v = randn(vocab);
      for (int64_t j = 0; j < vocab; j += 11) v[size_t(j)] = (j % 2 ? 1e30f : 1e-30f) * (j % 3 ? 1.0f : -1.0f);
    }
    for (int k : {1, 16, 20, 64, 1024}) {  // (20 lists of 2048: 16 and 20 take the bounded final stage)
      Dual logits = make_f32({1, vocab}, v);
      Dual ids = output(DType::kI32, {k}), vals = output(DType::kF32, {k});
      cpu_->top_k(logits.c, k, ids.c, vals.c);
      gpu_->top_k(logits.g, k, ids.g, vals.g);
      EXPECT_EQ(bytes_of(*cpu_, ids.c), bytes_of(*gpu_, ids.g)) << "k " << k;
      EXPECT_EQ(bytes_of(*cpu_, vals.c), bytes_of(*gpu_, vals.g)) << "k " << k;
    }
  }
}

// The device's draw from top-k candidates (double math as the host, splitmix64 draws) picks what
// the reference picks, over candidate counts up to kTopKMax, ties, and every cut.
TEST_F(CudaOpsTest, SampleDrawsWhatTheReferenceDraws) {
  int round = 0;
  for (int k : {1, 3, 40, 256, 1024}) {
    for (auto [temp, top_p, min_p] : {std::tuple<float, float, float>{0.8f, 0.95f, 0.05f}, {1.5f, 1.0f, 0.0f},
                                      {0.3f, 0.5f, 0.0f}, {1.0f, 1.0f, 0.2f}}) {
      SCOPED_TRACE(fmt::format("k {} temperature {} top-p {} min-p {}", k, temp, top_p, min_p));
      std::vector<float> l = randn(k, 2.0f);
      if (k > 3) l[1] = l[2];  // a tie
      std::sort(l.begin(), l.end(), std::greater<float>());
      std::vector<int32_t> id(static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) id[size_t(i)] = 1000 + 7 * i;
      DeviceSampling s{temp, top_p, min_p, 0, uint64_t(1234567 + round++), 5};
      std::vector<int32_t> words(8);
      std::memcpy(words.data(), &s, sizeof s);
      Dual ids = make_i32(id), vals = make_f32({k}, l), state = make_i32(words), out = output(DType::kI32, {1});
      for (int draw = 0; draw < 30; ++draw) {
        cpu_->sample(ids.c, vals.c, state.c, out.c);
        gpu_->sample(ids.g, vals.g, state.g, out.g);
        ASSERT_EQ(bytes_of(*cpu_, out.c), bytes_of(*gpu_, out.g)) << "draw " << draw;
      }
      EXPECT_EQ(bytes_of(*cpu_, state.c), bytes_of(*gpu_, state.g));
    }
  }
}

// The fused op (the draw in top-k's last kernel) gives what top_k then sample give on the CPU:
// the same candidates, drawn id and draw index. Random logits take the final stage's bounded
// path where k <= the first stage's lists (40 of 128256, 64 of 151936; the other k are past
// their lists: the radix select); all-equal logits overflow its survivors into the radix select
// (40 of 128256: 1561 survive); logits in steps of 0.5 put ties at its bound; at 100 values one
// list holds them all.
TEST_F(CudaOpsTest, TopKSampleIsTopKThenSample) {
  int round = 0;
  // (Settings per step: the CLI's defaults, none of the cuts, a tight top-p at a high temperature.)
  const std::tuple<float, float, float> settings[] = {{0.8f, 0.95f, 0.05f}, {1.0f, 1.0f, 0.0f}, {1.5f, 0.5f, 0.0f}};
  for (auto [vocab, k] : {std::pair<int64_t, int>{32000, 40}, {128256, 40}, {151936, 64}, {128256, 256},
                          {151936, 256}, {6146, 50}, {100, 100}, {128256, 1}}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(fmt::format("vocab {} k {} {}", vocab, k, kind == 0 ? "random" : kind == 1 ? "all equal" : "in steps"));
      Dual out = output(DType::kI32, {1});
      uint64_t draw = 3;
      for (int step = 0; step < 3; ++step) {
        const auto [temp, top_p, min_p] = settings[step];
        const DeviceSampling s{temp, top_p, min_p, 0, uint64_t(777 + round++), draw++};
        std::vector<int32_t> words(8);
        std::memcpy(words.data(), &s, sizeof s);
        Dual state = make_i32(words);
        std::vector<float> v = kind == 1 ? std::vector<float>(size_t(vocab), 0.5f) : randn(vocab, 3.0f);
        if (kind == 2)  // ties everywhere, at the final stage's bound too
          for (float& x : v) x = std::round(x * 2.0f) / 2.0f;
        Dual logits = make_f32({1, vocab}, v);
        Dual ids = output(DType::kI32, {k}), vals = output(DType::kF32, {k});
        cpu_->top_k_sample(logits.c, k, ids.c, vals.c, state.c, out.c);
        gpu_->top_k_sample(logits.g, k, ids.g, vals.g, state.g, out.g);
        ASSERT_EQ(bytes_of(*cpu_, ids.c), bytes_of(*gpu_, ids.g)) << "step " << step;
        ASSERT_EQ(bytes_of(*cpu_, vals.c), bytes_of(*gpu_, vals.g)) << "step " << step;
        ASSERT_EQ(bytes_of(*cpu_, out.c), bytes_of(*gpu_, out.g)) << "step " << step;
        ASSERT_EQ(bytes_of(*cpu_, state.c), bytes_of(*gpu_, state.g)) << "step " << step;
      }
    }
  }
}

// NaN logits (a model whose weights hold NaNs) have no order on the host; on the device they
// rank above +inf or below -inf by their sign, so the sorts give each candidate its own place:
// k distinct ids in range, each with its own logit, the same on a second run, and a drawn id
// among them.
TEST_F(CudaOpsTest, TopKOfNaNLogitsGivesDistinctIdsInRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // (129034 = 63 x 2048 + 10: -NaN only in the 10-value last slice, whose list ends with it: the
  // bounded final stage sees it only among the survivors.)
  for (auto [vocab, k] : {std::pair<int64_t, int>{128256, 40}, {128256, 256}, {6146, 50}, {129034, 40}}) {
    SCOPED_TRACE(fmt::format("vocab {} k {}", vocab, k));
    std::vector<float> v = randn(vocab);
    if (vocab == 129034)
      v[size_t(vocab - 4)] = -nan;
    else
      for (int64_t j = 3; j < vocab; j += 97) v[size_t(j)] = (j / 97) % 2 ? nan : -nan;
    Dual logits = make_f32({1, vocab}, v);
    const DeviceSampling s{0.8f, 0.95f, 0.05f, 0, 99, 0};
    std::vector<int32_t> words(8);
    std::memcpy(words.data(), &s, sizeof s);
    Dual state = make_i32(words), out = output(DType::kI32, {1});
    std::vector<uint8_t> first;
    for (int run = 0; run < 2; ++run) {
      Dual ids = output(DType::kI32, {k}), vals = output(DType::kF32, {k});
      gpu_->top_k_sample(logits.g, k, ids.g, vals.g, state.g, out.g);
      const auto ib = bytes_of(*gpu_, ids.g);
      const auto vb = floats(*gpu_, vals.g);
      std::vector<int32_t> id(static_cast<size_t>(k));
      std::memcpy(id.data(), ib.data(), ib.size());
      std::set<int32_t> seen;
      for (int r = 0; r < k; ++r) {
        ASSERT_GE(id[size_t(r)], 0);
        ASSERT_LT(id[size_t(r)], vocab);
        EXPECT_TRUE(seen.insert(id[size_t(r)]).second) << "id " << id[size_t(r)] << " twice";
        const float want = v[size_t(id[size_t(r)])];
        EXPECT_EQ(std::memcmp(&want, &vb[size_t(r)], 4), 0) << "rank " << r;
      }
      const auto ob = bytes_of(*gpu_, out.g);
      int32_t drawn = 0;
      std::memcpy(&drawn, ob.data(), 4);
      EXPECT_TRUE(seen.count(drawn)) << "drawn " << drawn;
      if (run == 0) first = ib;
      else EXPECT_EQ(first, ib);
    }
  }
}

TEST_F(CudaOpsTest, AdvanceDecodeCopiesIdsAndMovesPositionsOn) {
  for (const std::vector<int32_t>& next : {std::vector<int32_t>{7}, std::vector<int32_t>{5, 6, 9, 128000}}) {
    const int32_t n = int32_t(next.size());
    std::vector<int32_t> old_pos(next.size());
    for (int32_t i = 0; i < n; ++i) old_pos[size_t(i)] = 40 + i;
    Dual nx = make_i32(next), ids = make_i32(std::vector<int32_t>(next.size(), -1)), pos = make_i32(old_pos);
    cpu_->advance_decode(nx.c, ids.c, pos.c);
    gpu_->advance_decode(nx.g, ids.g, pos.g);
    EXPECT_EQ(bytes_of(*cpu_, ids.c), bytes_of(*gpu_, ids.g));
    EXPECT_EQ(bytes_of(*cpu_, pos.c), bytes_of(*gpu_, pos.g));
    std::vector<int32_t> got(next.size());
    std::memcpy(got.data(), bytes_of(*gpu_, pos.g).data(), got.size() * 4);
    for (int32_t i = 0; i < n; ++i) EXPECT_EQ(got[size_t(i)], 40 + i + n);
  }
}

// Decode attention reads pos before its PDL wait, so an attention right after advance_decode of
// its positions would race with that kernel: the backend refuses it (a bug, SHOAL_CHECK); after
// any other op in between it runs.
TEST_F(CudaOpsTest, AttentionRightAfterAdvanceDecodeOfItsPositionsIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const AttentionSpec spec{4, 2, 64, 0.125f, 0, 0.0f};
  Dual q = make_f32({1, 256}, randn(256)), out = output(DType::kF32, {1, 256});
  std::vector<uint16_t> kv[2];
  for (auto& c : kv)
    for (float f : randn(16 * 128)) c.push_back(f32_to_f16(f));
  Dual kc = make(DType::kF16, {16, 128}, kv[0].data()), vc = make(DType::kF16, {16, 128}, kv[1].data());
  Dual next = make_i32({3}), ids = make_i32({0}), pos = make_i32({4});
  EXPECT_DEATH(
      {
        gpu_->advance_decode(next.g, ids.g, pos.g);
        gpu_->attention(q.g, kc.g, vc.g, pos.g, spec, out.g);
      },
      "advance_decode");
  cpu_->advance_decode(next.c, ids.c, pos.c);
  cpu_->attention(q.c, kc.c, vc.c, pos.c, spec, out.c);
  gpu_->advance_decode(next.g, ids.g, pos.g);
  gpu_->scale(q.g, 1.0f);
  gpu_->attention(q.g, kc.g, vc.g, pos.g, spec, out.g);
  EXPECT_LT(nerr(out), 1e-5);
}

// advance_decode publishes its ids under the position it advanced from, after the ops queued
// before it (an argmax makes the second step's id on the device), as the CPU backend does; a
// later step at a position of the same slot replaces it. A wait for a step never queued ends
// with an error once the stream is idle, not a hang.
TEST_F(CudaOpsTest, AdvanceDecodePublishesTheIdsUnderTheirPosition) {
  ASSERT_TRUE(gpu_->clear_decoded().ok());
  Dual next = make_i32({5, 6, 9, 128000}), ids = make_i32({0, 0, 0, 0}), pos = make_i32({40, 41, 42, 43});
  Dual logits = make_f32({1, 6}, {0.5f, -1, 3, 2.5f, 3.25f, 0}), best = make_i32({-1}), id = make_i32({0}),
       at = make_i32({45}), at2 = make_i32({44});
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    SCOPED_TRACE(be->name());
    const bool g = be == gpu_.get();
    be->advance_decode(g ? next.g : next.c, g ? ids.g : ids.c, g ? pos.g : pos.c);
    be->argmax(g ? logits.g : logits.c, g ? best.g : best.c);
    be->advance_decode(g ? best.g : best.c, g ? id.g : id.c, g ? at.g : at.c);  // publishes 4 under 45
    int32_t got[4] = {}, second = -1;
    ASSERT_TRUE(be->wait_decoded(40, got, 4).ok());
    EXPECT_EQ(std::vector<int32_t>(got, got + 4), (std::vector<int32_t>{5, 6, 9, 128000}));
    ASSERT_TRUE(be->wait_decoded(45, &second, 1).ok());
    EXPECT_EQ(second, 4);
    EXPECT_EQ(be->wait_decoded(40, got, 2).code(), Code::kInvalidArgument);     // 4 ids were published
    EXPECT_EQ(be->wait_decoded(41, got, 1).code(), Code::kFailedPrecondition);  // not a step's position
    EXPECT_EQ(be->wait_decoded(45, got, 0).code(), Code::kInvalidArgument);
    EXPECT_EQ(be->wait_decoded(45, got, Backend::kDecodedMax + 1).code(), Code::kInvalidArgument);
    EXPECT_EQ(be->wait_decoded(-4, got, 1).code(), Code::kInvalidArgument);
    be->advance_decode(g ? best.g : best.c, g ? id.g : id.c, g ? at2.g : at2.c);  // from 44: the slot of 40
    ASSERT_TRUE(be->wait_decoded(44, got, 1).ok());  // (waited for first: until then 40 may still be read)
    EXPECT_EQ(got[0], 4);
    EXPECT_EQ(be->wait_decoded(40, got, 1).code(), Code::kFailedPrecondition);
    ASSERT_TRUE(be->clear_decoded().ok());
    EXPECT_EQ(be->wait_decoded(44, got, 1).code(), Code::kFailedPrecondition);  // forgotten
  }
}

TEST_F(CudaOpsTest, OutOfMemorySaysNeededAndFree) {
  auto r = gpu_->alloc(DType::kF32, {int64_t(1) << 40});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfMemory);
  EXPECT_NE(r.status().message().find("free"), std::string::npos) << r.status().message();
  // The failed allocation leaves the backend usable.
  Dual a = make_f32({4}, {1, 2, 3, 4});
  gpu_->scale(a.g, 2.0f);
  EXPECT_EQ(floats(*gpu_, a.g), (std::vector<float>{2, 4, 6, 8}));
}

}  // namespace
}  // namespace shoal::test

// The backend pieces of chained decoding on the CPU backends, against hand-computed values:
// advance_decode (the next step's ids and positions), sample (a draw from top-k candidates),
// and the default publication of advance_decode (wait_decoded: ids under their position, slots
// replaced, clear errors for bad counts and unpublished positions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "backend/sampling_math.h"

namespace shoal {
namespace {

class CpuDecodeOps : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto b = create_backend(GetParam());
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    be_ = std::move(*b);
  }
  Tensor i32(const std::vector<int32_t>& v) {
    auto t = be_->alloc(DType::kI32, {int64_t(v.size())});
    EXPECT_TRUE(t.ok());
    EXPECT_TRUE(be_->to_device(*t, v.data(), v.size() * 4).ok());
    tensors_.push_back(*t);
    return *t;
  }
  std::vector<int32_t> values(const Tensor& t) {
    std::vector<int32_t> v(size_t(t.n_elements()));
    EXPECT_TRUE(be_->to_host(v.data(), t, v.size() * 4).ok());
    return v;
  }
  void TearDown() override {
    for (Tensor& t : tensors_) be_->free(t);
  }
  std::unique_ptr<Backend> be_;
  std::vector<Tensor> tensors_;
};

TEST_P(CpuDecodeOps, AdvanceDecodeCopiesIdsAndMovesPositionsOn) {
  Tensor next = i32({7}), ids = i32({3}), pos = i32({41});
  be_->advance_decode(next, ids, pos);
  EXPECT_EQ(values(ids), std::vector<int32_t>{7});
  EXPECT_EQ(values(pos), std::vector<int32_t>{42});
  Tensor next3 = i32({5, 6, 9}), ids3 = i32({0, 0, 0}), pos3 = i32({10, 11, 12});
  be_->advance_decode(next3, ids3, pos3);
  EXPECT_EQ(values(ids3), (std::vector<int32_t>{5, 6, 9}));
  EXPECT_EQ(values(pos3), (std::vector<int32_t>{13, 14, 15}));
}

// Candidates 7, 3, 9 with logits log 3, log 2, 0 (weights 1, 2/3, 1/3 at temperature 1) and
// seed 42: splitmix64 gives the draws 0.7416 (x = 1.483: the second candidate) and 0.1599
// (x = 0.320: the first); the state's draw counts on.
TEST_P(CpuDecodeOps, SampleDrawsFromTheCandidatesAndCountsTheDraw) {
  Tensor ids = i32({7, 3, 9});
  auto vals = be_->alloc(DType::kF32, {3});
  ASSERT_TRUE(vals.ok());
  tensors_.push_back(*vals);
  const float l[3] = {std::log(3.0f), std::log(2.0f), 0.0f};
  ASSERT_TRUE(be_->to_device(*vals, l, sizeof l).ok());
  DeviceSampling s{1.0f, 1.0f, 0.0f, 0, 42, 0};
  std::vector<int32_t> words(8);
  std::memcpy(words.data(), &s, sizeof s);
  Tensor state = i32(words), out = i32({-1});
  be_->sample(ids, *vals, state, out);
  EXPECT_EQ(values(out), std::vector<int32_t>{3});
  be_->sample(ids, *vals, state, out);
  EXPECT_EQ(values(out), std::vector<int32_t>{7});
  std::vector<int32_t> after = values(state);
  std::memcpy(static_cast<void*>(&s), after.data(), sizeof s);
  EXPECT_EQ(s.draw, 2u);
  EXPECT_EQ(s.seed, 42u);
}

TEST_P(CpuDecodeOps, AdvanceDecodePublishesTheIdsUnderTheirPosition) {
  Tensor ids = i32({0, 0}), pos = i32({10, 11});
  be_->advance_decode(i32({5, 7}), ids, pos);
  be_->advance_decode(i32({8, 9}), ids, pos);  // from 12
  int32_t got[2] = {};
  ASSERT_TRUE(be_->wait_decoded(10, got, 2).ok());
  EXPECT_EQ(std::vector<int32_t>(got, got + 2), (std::vector<int32_t>{5, 7}));
  ASSERT_TRUE(be_->wait_decoded(12, got, 2).ok());
  EXPECT_EQ(std::vector<int32_t>(got, got + 2), (std::vector<int32_t>{8, 9}));
  ASSERT_TRUE(be_->wait_decoded(10, got, 2).ok());  // waiting does not consume
  EXPECT_EQ(got[0], 5);
  EXPECT_EQ(be_->wait_decoded(10, got, 1).code(), Code::kInvalidArgument);  // 2 ids were published
  EXPECT_EQ(be_->wait_decoded(11, got, 1).code(), Code::kFailedPrecondition);  // not a step's position
  be_->advance_decode(i32({4, 4}), ids, pos);                                  // from 14: slot of 10
  EXPECT_EQ(be_->wait_decoded(10, got, 2).code(), Code::kFailedPrecondition);
  ASSERT_TRUE(be_->wait_decoded(14, got, 2).ok());
  EXPECT_EQ(got[0], 4);
  ASSERT_TRUE(be_->clear_decoded().ok());
  EXPECT_EQ(be_->wait_decoded(14, got, 2).code(), Code::kFailedPrecondition);
}

TEST_P(CpuDecodeOps, WaitDecodedRejectsBadCountsAndPositions) {
  Tensor ids = i32({0}), pos = i32({3});
  be_->advance_decode(i32({1}), ids, pos);
  int32_t dst[Backend::kDecodedMax + 1] = {};
  EXPECT_EQ(be_->wait_decoded(3, dst, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->wait_decoded(3, dst, Backend::kDecodedMax + 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->wait_decoded(-1, dst, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->wait_decoded(int64_t(1) << 33, dst, 1).code(), Code::kInvalidArgument);
  ASSERT_TRUE(be_->wait_decoded(3, dst, 1).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, CpuDecodeOps, ::testing::Values("cpu", "cpu-ref"),
                         [](const auto& i) { return std::string(i.param) == "cpu" ? "cpu" : "cpu_ref"; });

}  // namespace
}  // namespace shoal

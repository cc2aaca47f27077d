// The backend pieces of chained decoding on the CPU backends, against hand-computed values:
// advance_decode (the next step's ids and positions), sample (a draw from top-k candidates),
// and the default read_async / read_wait (values as of the read, clear errors for bad slots and
// sizes).
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

TEST_P(CpuDecodeOps, ReadAsyncKeepsTheValueAsOfTheRead) {
  Tensor t = i32({1, 2, 3, 4});
  ASSERT_TRUE(be_->read_async(0, t, 16).ok());
  Tensor next = i32({9, 9, 9, 9});
  Tensor pos = i32({0, 0, 0, 0});
  be_->advance_decode(next, t, pos);  // t changes after the read
  ASSERT_TRUE(be_->read_async(1, t, 8).ok());
  int32_t a[4] = {}, b[2] = {};
  ASSERT_TRUE(be_->read_wait(0, a, 16).ok());
  ASSERT_TRUE(be_->read_wait(1, b, 8).ok());
  EXPECT_EQ(std::vector<int32_t>(a, a + 4), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(b, b + 2), (std::vector<int32_t>{9, 9}));
}

TEST_P(CpuDecodeOps, ReadAsyncRejectsBadSlotsAndSizes) {
  Tensor t = i32(std::vector<int32_t>(100, 1));
  int32_t dst[64] = {};
  EXPECT_EQ(be_->read_async(Backend::kReadSlots, t, 4).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->read_async(-1, t, 4).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->read_async(0, t, Backend::kReadSlotBytes + 4).code(), Code::kInvalidArgument);
  EXPECT_EQ(be_->read_async(0, i32({1}), 8).code(), Code::kInvalidArgument);  // more than the tensor holds
  EXPECT_EQ(be_->read_wait(2, dst, 4).code(), Code::kFailedPrecondition);  // never read
  ASSERT_TRUE(be_->read_async(3, t, 4).ok());
  EXPECT_EQ(be_->read_wait(3, dst, 8).code(), Code::kFailedPrecondition);  // more than was read
  EXPECT_EQ(be_->read_wait(Backend::kReadSlots, dst, 4).code(), Code::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, CpuDecodeOps, ::testing::Values("cpu", "cpu-ref"),
                         [](const auto& i) { return std::string(i.param) == "cpu" ? "cpu" : "cpu_ref"; });

}  // namespace
}  // namespace shoal

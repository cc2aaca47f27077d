// WeightLoader::add_matrices (a layer's q / k / v planned together): the same tensors as one add()
// each, a fallback to add() for shapes it cannot group, and an error for mismatched spans; a load
// stopped by its progress callback.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/local_model.h"
#include "runtime/weight_loader.h"
#include "test_util.h"

namespace shoal {
namespace {

// stories260K's layer-0 tensors by canonical name.
std::vector<const TensorInfo*> layer0(const LocalModel& m, std::initializer_list<const char*> names) {
  std::vector<const TensorInfo*> out;
  for (const char* n : names) {
    const TensorInfo* t = m.weights.find(n);
    EXPECT_NE(t, nullptr) << n;
    out.push_back(t);
  }
  return out;
}

// A tensor's bytes as stored in the file (stories260K's are F32, which the backend keeps as is).
std::vector<uint8_t> file_bytes(const LocalModel& m, const TensorInfo& t) {
  std::vector<uint8_t> v(t.nbytes);
  EXPECT_TRUE(m.file->sources[t.source]->read(t.offset, v.data(), v.size()).ok());
  return v;
}

std::vector<uint8_t> bytes(Backend& b, const Tensor& t) {
  std::vector<uint8_t> v(t.nbytes());
  EXPECT_TRUE(b.to_host(v.data(), t, v.size()).ok());
  return v;
}

// stories260K opened (no weights loaded) and a CPU backend.
class WeightLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = open_model(test::fixture("models/stories260K.gguf"), false);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
    auto b = create_backend("cpu");
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backend_ = std::move(*b);
  }
  LocalModel model_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(WeightLoaderTest, MatricesPlannedTogetherEqualOneAddEach) {
  LocalModel* m = &model_;
  Backend& b = *backend_;
  const auto qkv = layer0(*m, {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"});
  ASSERT_FALSE(::testing::Test::HasFailure());

  std::array<Tensor, 3> together{}, alone{};
  const std::array<Tensor*, 3> dsts{&together[0], &together[1], &together[2]};
  WeightLoader a(*m->file, b), c(*m->file, b);
  ASSERT_TRUE(a.add_matrices(qkv, dsts).ok());
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(c.add(*qkv[i], WeightRole::kMatrix, alone[i]).ok());
  EXPECT_EQ(a.backend_bytes(), c.backend_bytes());
  EXPECT_EQ(a.file_bytes(), c.file_bytes());
  ASSERT_TRUE(a.run().ok());
  ASSERT_TRUE(c.run().ok());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(together[i].dtype, alone[i].dtype);
    EXPECT_EQ(together[i].shape, alone[i].shape);
    EXPECT_EQ(bytes(b, together[i]), file_bytes(*m, *qkv[i])) << qkv[i]->name;
    EXPECT_EQ(bytes(b, alone[i]), file_bytes(*m, *qkv[i])) << qkv[i]->name;
  }
  for (size_t i = 0; i < 3; ++i) b.free(together[i]), b.free(alone[i]);
}

TEST_F(WeightLoaderTest, MatricesThatCannotShareABlockFallBackToOneAddEach) {
  // A vector among them (1-D): each is planned alone; the vector as a one-row matrix.
  LocalModel* m = &model_;
  Backend& b = *backend_;
  const auto infos = layer0(*m, {"blk.0.attn_q.weight", "blk.0.attn_norm.weight"});
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::array<Tensor, 2> t{};
  const std::array<Tensor*, 2> dsts{&t[0], &t[1]};
  WeightLoader a(*m->file, b);
  ASSERT_TRUE(a.add_matrices(infos, dsts).ok());
  ASSERT_TRUE(a.run().ok());
  EXPECT_EQ(t[0].rows(), infos[0]->shape[0]);
  EXPECT_EQ(t[1].n_elements(), infos[1]->n_elements());
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(bytes(b, t[i]), file_bytes(*m, *infos[i])) << infos[i]->name;
  for (Tensor& x : t) b.free(x);
}

TEST_F(WeightLoaderTest, AProgressThatSaysStopEndsTheLoadAfterThatTensor) {
  LocalModel* m = &model_;
  Backend& b = *backend_;
  const auto infos = layer0(*m, {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"});
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::array<Tensor, 3> t{};
  WeightLoader a(*m->file, b);
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(a.add(*infos[i], WeightRole::kMatrix, t[i]).ok());
  std::vector<uint64_t> seen;
  const Status st = a.run([&](uint64_t done, uint64_t total) {
    seen.push_back(done);
    EXPECT_EQ(total, infos[0]->nbytes + infos[1]->nbytes + infos[2]->nbytes);
    return seen.size() < 2;  // stop after the second tensor
  });
  test::expect_status(st, Code::kUnavailable, "the load was stopped after");
  EXPECT_EQ(seen.size(), 2u);  // no third tensor was read
  EXPECT_EQ(seen.back(), infos[0]->nbytes + infos[1]->nbytes);
  for (Tensor& x : t) b.free(x);
}

TEST_F(WeightLoaderTest, MatricesWithMoreTensorsThanDestinationsAreAnError) {
  LocalModel* m = &model_;
  const auto infos = layer0(*m, {"blk.0.attn_q.weight", "blk.0.attn_k.weight"});
  ASSERT_FALSE(::testing::Test::HasFailure());
  Tensor one;
  const std::array<Tensor*, 1> dsts{&one};
  WeightLoader a(*m->file, *backend_);
  const Status s = a.add_matrices(infos, dsts);
  EXPECT_EQ(s.code(), Code::kInternal) << s.to_string();
  EXPECT_EQ(one.data, nullptr);
  EXPECT_EQ(a.backend_bytes(), 0u);
}

}  // namespace
}  // namespace shoal

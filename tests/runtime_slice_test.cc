// Slices: a layer range reads only its own tensors; chained slices equal one whole slice.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "test_util.h"

namespace shoal {
namespace {

TEST(Slice, LoadsOnlyItsOwnTensors) {
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto backend = create_backend("cpu");
  ASSERT_TRUE(backend.ok());
  const uint64_t before = m->file->bytes_read();
  auto slice = Slice::load(*m->file, m->config, m->weights, SliceSpec{1, 3, false, false}, SliceOptions{}, **backend);
  ASSERT_TRUE(slice.ok()) << slice.status().to_string();
  uint64_t expected = 0;
  for (const auto& t : m->file->index.tensors())
    if (t.name.starts_with("blk.1.") || t.name.starts_with("blk.2.") || t.name == "rope_freqs.weight")
      expected += t.nbytes;
  EXPECT_EQ(m->file->bytes_read() - before, expected);
  EXPECT_EQ((*slice)->file_bytes(), expected);
}

TEST(Slice, ChainedSlicesEqualOneSlice) {
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok());
  auto backend = create_backend("cpu");
  ASSERT_TRUE(backend.ok());
  const int L = m->config.n_layers, d = m->config.d_model;
  auto whole = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, L, true, true}, {}, **backend);
  auto a = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, 2, true, false}, {}, **backend);
  auto b = Slice::load(*m->file, m->config, m->weights, SliceSpec{2, L, false, true}, {}, **backend);
  ASSERT_TRUE(whole.ok() && a.ok() && b.ok());
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  StepInput in;
  in.n = int(ids.size());
  in.ids = ids.data();
  StepOutput ref;
  ref.mode = HeadMode::kLogitsAll;
  ASSERT_TRUE((*whole)->forward(in, ref).ok());
  std::vector<float> hidden(ids.size() * size_t(d));
  StepOutput mid;
  mid.hidden = hidden.data();
  ASSERT_TRUE((*a)->forward(in, mid).ok());
  StepInput in2;
  in2.n = in.n;
  in2.hidden = hidden.data();
  StepOutput out;
  out.mode = HeadMode::kLogitsAll;
  ASSERT_TRUE((*b)->forward(in2, out).ok());
  ASSERT_EQ(out.logits.size(), ref.logits.size());
  EXPECT_EQ(std::memcmp(out.logits.data(), ref.logits.data(), ref.logits.size() * 4), 0);
}

TEST(Slice, RangeOutsideTheModelIsRejected) {
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok());
  auto backend = create_backend("cpu");
  auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{3, 9, false, false}, {}, **backend);
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
}

TEST(Slice, HeadOnlySliceTakesHiddenStates) {
  // A slice with no layers and only the head (the host's last stage in a pool).
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok());
  auto backend = create_backend("cpu");
  auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{5, 5, false, true}, {}, **backend);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::vector<float> hidden(size_t(m->config.d_model), 0.5f);
  StepInput in;
  in.n = 1;
  in.hidden = hidden.data();
  StepOutput out;
  out.mode = HeadMode::kArgmaxLast;
  ASSERT_TRUE((*s)->forward(in, out).ok());
  ASSERT_EQ(out.ids.size(), 1u);
  EXPECT_TRUE(out.ids[0] >= 0 && out.ids[0] < m->config.vocab_size);
}

}  // namespace
}  // namespace shoal

// Slices: a layer range reads only its own tensors; chained slices equal one whole slice; heads
// that read only the last row equal one that reads every row; slices sharing a backend never
// share a step recording, and a slice drops its recordings before it frees their buffers; a
// device backend refuses a slice larger than its free memory before allocating anything.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/half.h"
#include "kept_rows.h"
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

/// The CPU backend, logging what a graph backend (CUDA) would see: each run_graph's (owner, key),
/// each drop_graphs, and each free of a buffer.
class RecordingBackend : public CpuBackend {
 public:
  RecordingBackend() : CpuBackend(BackendOptions{1, false, false}) {}
  Status run_graph(uint64_t key, const std::function<void()>& record, uint64_t owner) override {
    steps.insert({owner, key});
    log.push_back("run " + std::to_string(owner));
    return CpuBackend::run_graph(key, record, owner);
  }
  void drop_graphs(uint64_t owner) override { log.push_back("drop " + std::to_string(owner)); }
  void free(Tensor& t) override {
    if (log.empty() || log.back() != "free") log.push_back("free");
    CpuBackend::free(t);
  }
  std::set<std::pair<uint64_t, uint64_t>> steps;
  std::vector<std::string> log;
};

TEST(Slice, SlicesOnOneBackendNeverShareAStepRecording) {
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok());
  RecordingBackend be;
  const int L = m->config.n_layers, d = m->config.d_model;
  // The whole model and its second half: same step sizes and head outputs, so the same step keys
  // (a CUDA backend keyed by the step alone replayed the whole model's graph for the half).
  auto whole = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, L, true, true}, {}, be);
  auto a = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, 2, true, false}, {}, be);
  auto b = Slice::load(*m->file, m->config, m->weights, SliceSpec{2, L, false, true}, {}, be);
  ASSERT_TRUE(whole.ok() && a.ok() && b.ok());
  const std::set<uint64_t> owners = {(*whole)->graph_owner(), (*a)->graph_owner(), (*b)->graph_owner()};
  EXPECT_EQ(owners.size(), 3u);
  EXPECT_EQ(owners.count(0), 0u);  // 0 is for callers without an owner
  const std::vector<int32_t> ids = {1, 403, 407};
  StepInput in;
  in.n = int(ids.size());
  in.ids = ids.data();
  StepOutput logits;
  logits.mode = HeadMode::kLogitsAll;
  ASSERT_TRUE((*whole)->forward(in, logits).ok());
  std::vector<float> hidden(ids.size() * size_t(d));
  StepOutput mid;
  mid.hidden = hidden.data();
  ASSERT_TRUE((*a)->forward(in, mid).ok());
  StepInput hop;
  hop.n = in.n;
  hop.hidden = hidden.data();
  ASSERT_TRUE((*b)->forward(hop, logits).ok());
  std::set<uint64_t> ran;
  for (const auto& [owner, key] : be.steps) ran.insert(owner);
  EXPECT_EQ(ran, owners);
  // A slice replaced (a worker's new plan): its recordings are dropped before its first free, and
  // its successor at the same layers records under a new owner.
  const uint64_t gone = (*b)->graph_owner();
  be.log.clear();
  b->reset();
  ASSERT_EQ(be.log.size(), 2u);
  EXPECT_EQ(be.log[0], "drop " + std::to_string(gone));
  EXPECT_EQ(be.log[1], "free");
  auto b2 = Slice::load(*m->file, m->config, m->weights, SliceSpec{2, L, false, true}, {}, be);
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(owners.count((*b2)->graph_owner()), 0u);
}

/// The CPU backend posing as a device (kind kCuda) with `free` bytes free; counts allocations.
class SmallDevice : public CpuBackend {
 public:
  explicit SmallDevice(uint64_t free) : CpuBackend(BackendOptions{1, false, false}), free_(free) {}
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "small:0"; }
  uint64_t free_memory() const override { return free_; }
  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) override {
    ++allocs;
    return CpuBackend::alloc(dtype, shape);
  }
  Result<Tensor> alloc_weight(DType dtype, std::initializer_list<int64_t> shape) override {
    ++allocs;
    return CpuBackend::alloc_weight(dtype, shape);
  }
  int allocs = 0;

 private:
  uint64_t free_;
};

TEST(Slice, ADeviceRefusesASliceLargerThanItsFreeMemoryBeforeAllocating) {
  auto m = open_model(test::fixture("models/stories260K.gguf"), false);
  ASSERT_TRUE(m.ok());
  SliceOptions so;
  so.n_ctx = 2048;
  so.kv_dtype = DType::kF16;
  SmallDevice small(1 << 20);
  auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, 5, true, true}, so, small);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kOutOfMemory);
  // 5 layers x (K + V) x 2048 positions x 4 KV heads x 8 dims x 2 bytes = 1.25 MiB.
  for (const char* part : {"this slice (layers 0-4, the embedding, the head) needs ", " on small:0 (",
                           "1.25 MiB of KV cache for 2048 positions in F16) but it has 1.00 MiB free"})
    EXPECT_NE(s.status().message().find(part), std::string::npos) << s.status().to_string();
  EXPECT_EQ(small.allocs, 0);
  SmallDevice roomy(uint64_t(1) << 30);
  auto ok = Slice::load(*m->file, m->config, m->weights, SliceSpec{0, 5, true, true}, so, roomy);
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
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

// stories260K on the CPU as one slice with every layer, the embedding and the head (s); load()
// gives other slices of it.
class WholeStories : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = open_model(test::fixture("models/stories260K.gguf"), false);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::make_unique<LocalModel>(std::move(*m));
    auto be = create_backend("cpu");
    ASSERT_TRUE(be.ok());
    backend_ = std::move(*be);
    const ModelConfig& cfg = model_->config;
    auto sl = Slice::load(*model_->file, cfg, model_->weights, SliceSpec{0, cfg.n_layers, true, true}, {}, *backend_);
    ASSERT_TRUE(sl.ok()) << sl.status().to_string();
    s = std::move(*sl);
  }
  /// Another slice of the same model on the same backend.
  std::unique_ptr<Slice> load(const SliceSpec& spec) const {
    auto sl = Slice::load(*model_->file, model_->config, model_->weights, spec, {}, *backend_);
    EXPECT_TRUE(sl.ok()) << sl.status().to_string();
    return sl.ok() ? std::move(*sl) : nullptr;
  }
  std::unique_ptr<LocalModel> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Slice> s;
};

// A slice that ends the model without the head (a pool's last worker) keeps only the rows the
// host's head reads: keep_rows 1 gives the last row of the all-rows step, keep_rows 0 only fills
// the cache; the head-only slice on the kept row gives the whole model's last logits.
TEST_F(WholeStories, LastSliceWithoutTheHeadKeepsTheRowsTheHeadReads) {
  const int L = model_->config.n_layers, d = model_->config.d_model;
  const size_t V = size_t(model_->config.vocab_size);
  auto a = load({0, 2, true, false}), b = load({2, L, false, false}), head = load({L, L, false, true});
  ASSERT_TRUE(a && b && head);
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 29, 411, 302, 66};
  const int n = int(ids.size());
  StepInput in;
  in.n = n;
  in.ids = ids.data();
  StepOutput ref;
  ref.mode = HeadMode::kLogitsAll;
  ASSERT_TRUE(s->forward(in, ref).ok());
  const test::ChainedRows c = test::run_chained(*a, *b, ids, d);
  ASSERT_TRUE(c.st.ok()) << c.st.to_string();
  const std::vector<float>& mid = c.mid;
  const std::vector<float>& all = c.all;
  StepInput hop;
  hop.n = n;
  hop.hidden = mid.data();
  // The first rows again with keep_rows 0 (only their K/V), then the rest with the last row kept.
  const test::KeptRows r = test::run_kept_rows(*b, mid, n, d, 5);
  ASSERT_TRUE(r.first.ok() && r.rest.ok()) << r.first.to_string() << r.rest.to_string();
  EXPECT_EQ(r.untouched, std::vector<float>(size_t(d), -7.0f));
  const std::vector<float>& kept = r.kept;
  for (int i = 0; i < d; ++i) {
    const float want = all[size_t(n - 1) * d + size_t(i)];
    ASSERT_NEAR(kept[size_t(i)], want, 1e-5f * (1.0f + std::fabs(want))) << i;
  }
  StepInput row;
  row.n = 1;
  row.pos0 = n - 1;  // the head-only slice caches nothing: any position continues it
  row.hidden = kept.data();
  StepOutput logits;
  logits.mode = HeadMode::kLogitsLast;
  ASSERT_TRUE(head->forward(row, logits).ok());
  ASSERT_EQ(logits.logits.size(), V);
  const float* want = ref.logits.data() + size_t(n - 1) * V;
  for (size_t i = 0; i < V; ++i) ASSERT_NEAR(logits.logits[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << i;
  // f16 hops: the kept row is the all-rows step's last row.
  std::vector<uint16_t> all16(size_t(n) * d), kept16(static_cast<size_t>(d));
  StepOutput every16, last16;
  every16.hidden = all16.data();
  every16.hidden_dtype = DType::kF16;
  last16.hidden = kept16.data();
  last16.hidden_dtype = DType::kF16;
  last16.keep_rows = 1;
  ASSERT_TRUE(b->forward(hop, every16).ok());
  ASSERT_TRUE(b->forward(hop, last16).ok());
  for (int i = 0; i < d; ++i) {
    const float want = f16_to_f32(all16[size_t(n - 1) * d + size_t(i)]);
    ASSERT_NEAR(f16_to_f32(kept16[size_t(i)]), want, 2e-3f * (1.0f + std::fabs(want))) << i;  // an f16 step
  }
}

TEST_F(WholeStories, KeepRowsOnlyWhereTheSliceEndsTheModelWithoutTheHead) {
  const int L = model_->config.n_layers, d = model_->config.d_model;
  std::vector<float> x(size_t(4) * d, 0.25f), y(size_t(4) * d);
  const std::vector<int32_t> ids = {1, 403, 407, 261};
  struct Case {
    SliceSpec spec;
    int keep;
    const char* error;
  };
  for (const Case& c : {Case{{0, 2, true, false}, 1, "only a slice without the head that ends the model keeps rows"},
                        Case{{0, L, true, true}, 1, "with the head"},
                        Case{{2, L, false, false}, 5, "5 rows kept of a 4-token step"},
                        Case{{2, L, false, false}, -2, "-2 rows kept"}}) {
    SCOPED_TRACE(c.error);
    auto sl = load(c.spec);
    ASSERT_TRUE(sl);
    StepInput in;
    in.n = 4;
    if (c.spec.embed) in.ids = ids.data();
    else in.hidden = x.data();
    StepOutput out;
    out.hidden = y.data();
    out.keep_rows = c.keep;
    const Status st = sl->forward(in, out);
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find(c.error), std::string::npos) << st.message();
    EXPECT_EQ(sl->n_past(), 0);
  }
}

// A head that reads only the last row skips the last layer's output projection and FFN for the
// other rows (forward_layers' keep), and a chunk with no head skips them for all rows: the
// logits of the last position must equal those of a step that computes every row.
TEST_F(WholeStories, LastRowHeadsEqualTheAllRowsHead) {
  const size_t V = size_t(model_->config.vocab_size);
  // More than 8 tokens: on a GPU backend the prompt takes the GEMM path and the kept row the GEMV.
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 29, 411, 302, 66, 290, 455};
  const int n = int(ids.size());
  StepInput in;
  in.n = n;
  in.ids = ids.data();
  StepOutput all;
  all.mode = HeadMode::kLogitsAll;
  ASSERT_TRUE(s->forward(in, all).ok());
  ASSERT_EQ(all.logits.size(), size_t(n) * V);
  const float* ref = all.logits.data() + size_t(n - 1) * V;
  size_t best = 0;
  for (size_t i = 1; i < V; ++i)
    if (ref[i] > ref[best]) best = i;
  auto expect_near_ref = [&](const std::vector<float>& got) {
    ASSERT_EQ(got.size(), V);
    for (size_t i = 0; i < V; ++i) ASSERT_NEAR(got[i], ref[i], 1e-4f * (1.0f + std::fabs(ref[i]))) << i;
  };
  StepOutput last;  // the whole prompt again from position 0
  last.mode = HeadMode::kLogitsLast;
  ASSERT_TRUE(s->forward(in, last).ok());
  expect_near_ref(last.logits);
  // Two chunks: the first without a head (keep 0: only its K/V), then the last row.
  for (int split : {1, 4, 10}) {
    StepInput a = in, b = in;
    a.n = split;
    b.n = n - split;
    b.pos0 = split;
    b.ids = ids.data() + split;
    StepOutput none, tail;
    none.mode = HeadMode::kNone;
    tail.mode = HeadMode::kLogitsLast;
    ASSERT_TRUE(s->forward(a, none).ok());
    ASSERT_TRUE(s->forward(b, tail).ok());
    SCOPED_TRACE(split);
    expect_near_ref(tail.logits);
  }
  StepOutput am;
  am.mode = HeadMode::kArgmaxLast;
  ASSERT_TRUE(s->forward(in, am).ok());
  ASSERT_EQ(am.ids.size(), 1u);
  EXPECT_EQ(am.ids[0], int32_t(best));
  StepOutput top;
  top.mode = HeadMode::kTopKLast;
  top.top_k = 3;
  ASSERT_TRUE(s->forward(in, top).ok());
  ASSERT_EQ(top.ids.size(), 3u);
  EXPECT_EQ(top.ids[0], int32_t(best));
  EXPECT_NEAR(top.logits[0], ref[best], 1e-4f * (1.0f + std::fabs(ref[best])));
  // A decode step after the trimmed prompt (its last layer's K/V written for every row) equals
  // one after the prompt computed in full.
  const int32_t next = 300;
  StepInput step;
  step.n = 1;
  step.pos0 = n;
  step.ids = &next;
  StepOutput after_trimmed;
  after_trimmed.mode = HeadMode::kLogitsLast;
  ASSERT_TRUE(s->forward(step, after_trimmed).ok());
  ASSERT_TRUE(s->forward(in, all).ok());
  StepOutput after_full;
  after_full.mode = HeadMode::kLogitsLast;
  ASSERT_TRUE(s->forward(step, after_full).ok());
  ASSERT_EQ(after_full.logits.size(), V);
  ASSERT_EQ(after_trimmed.logits.size(), V);
  for (size_t i = 0; i < V; ++i)
    ASSERT_NEAR(after_trimmed.logits[i], after_full.logits[i], 1e-4f * (1.0f + std::fabs(after_full.logits[i]))) << i;
  EXPECT_EQ(head_rows(HeadMode::kNone, n), 0);
  EXPECT_EQ(head_rows(HeadMode::kTopKLast, n), 1);
  EXPECT_EQ(head_rows(HeadMode::kArgmaxAll, n), n);
}

// The same trimmed paths against llama.cpp's greedy ids (../shared/fixtures/expected): each
// prompt, whole and in two chunks (the first without a head), gives the first generated id.
TEST_F(WholeStories, LastRowHeadsGiveLlamaCppsFirstToken) {
  std::ifstream f(test::fixture("expected/stories260K_greedy.json"));
  const nlohmann::json want = nlohmann::json::parse(f);
  for (const auto& c : want["cases"]) {
    const auto ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const int32_t first = c["generated_ids"][0].get<int32_t>();
    const int n = int(ids.size());
    for (int split : {0, n / 2}) {
      SCOPED_TRACE(fmt::format("{} split {}", c["prompt"].get<std::string>(), split));
      if (split > 0) {
        StepOutput none;
        none.mode = HeadMode::kNone;
        ASSERT_TRUE(s->forward(StepInput{split, 0, ids.data()}, none).ok());
      }
      StepOutput am;
      am.mode = HeadMode::kArgmaxLast;
      ASSERT_TRUE(s->forward(StepInput{n - split, split, ids.data() + split}, am).ok());
      ASSERT_EQ(am.ids.size(), 1u);
      EXPECT_EQ(am.ids[0], first);
    }
  }
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

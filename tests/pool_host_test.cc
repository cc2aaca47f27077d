// The pool's host and workers in one process, over real TCP loopback (each worker on its own
// thread and backend): plans applied, a worker reads only its own tensors, the pool gives the same
// tokens as one local slice, the last worker sends back only the rows the head reads (run_frame,
// one frame through a worker's slice), and bad peers (wrong secret, model, version, garbage) are
// refused while the pool keeps working. End-to-end runs with processes are in pool_cli_test.cc.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <thread>

#include "format/model_file.h"
#include "pool/address.h"
#include "pool/auth.h"
#include "pool/host.h"
#include "pool/transport_tcp.h"
#include "pool/worker.h"
#include "runtime/local_model.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

const std::string kRoomSecret = "test-room-secret";

std::string stories() { return test::fixture("models/stories260K.gguf"); }

HostOptions host_opts(const std::string& model) {
  HostOptions o;
  o.model = model;
  o.threads = 1;
  o.n_ctx = 256;
  o.kv_dtype = DType::kF32;
  o.progress = false;
  o.secret = kRoomSecret;
  o.hop_dtype = HopDType::kF32;
  o.probe_budget = Millis(20);
  return o;
}

WorkerOptions worker_opts(const std::string& host, const std::string& name) {
  WorkerOptions w;
  w.host = host;
  w.secret = kRoomSecret;
  w.threads = 1;
  w.name = name;
  w.probe_budget = Millis(20);
  return w;
}

/// A host and workers running Worker::run on threads; the host goes first (its bye ends them).
struct Pool {
  std::unique_ptr<Host> host;
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<Status> results;
  std::vector<std::thread> threads;

  void add_worker(WorkerOptions w) {
    workers.push_back(std::make_unique<Worker>(std::move(w), tcp_network()));
    results.emplace_back();
    threads.emplace_back([this, i = workers.size() - 1, wk = workers.back().get()] { results[i] = wk->run(); });
  }
  Status join_worker(size_t i) {
    threads[i].join();
    return results[i];
  }
  ~Pool() {
    host.reset();
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

std::unique_ptr<Pool> start_pool(const HostOptions& o, size_t n_workers) {
  auto p = std::make_unique<Pool>();
  p->results.reserve(16);
  auto h = Host::open(o, tcp_network());
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (!h.ok()) return nullptr;
  p->host = std::move(*h);
  for (size_t i = 0; i < n_workers; ++i) p->add_worker(worker_opts(p->host->address(), "w" + std::to_string(i + 1)));
  Status st = p->host->wait_for_workers(n_workers, Millis(20000));
  EXPECT_TRUE(st.ok()) << st.to_string();
  st = p->host->ensure_plan();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p;
}

/// Greedy ids from one local slice holding everything (the reference).
std::vector<int32_t> local_ids(const std::string& model, const std::vector<int32_t>& prompt, int n, SamplingParams sp) {
  LocalModelOptions o;
  o.threads = 1;
  o.n_ctx = 256;
  o.kv_dtype = DType::kF32;
  o.progress = false;
  o.tokenizer = false;
  auto m = load_local_model(model, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  Session s(*m->pipeline, {});
  GenerateOptions g;
  g.n_predict = n;
  g.sampling = sp;
  g.stop_at_eog = false;
  auto out = s.generate(prompt, g, {});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : std::vector<int32_t>{};
}

std::vector<int32_t> pool_ids(Host& h, const std::vector<int32_t>& prompt, int n, SamplingParams sp) {
  GenerateOptions g;
  g.n_predict = n;
  g.sampling = sp;
  g.stop_at_eog = false;
  auto out = h.generate(prompt, g, {});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : std::vector<int32_t>{};
}

SamplingParams greedy() {
  SamplingParams sp;
  sp.temperature = 0;
  return sp;
}

/// File bytes of layers [first, last] counted from the model's tensor index, not by the loader:
/// every tensor named blk.N.* (and the RoPE frequency table, which every layer slice uses).
uint64_t index_bytes(const std::string& model, uint32_t first, uint32_t last) {
  auto f = open_model_file(model);
  EXPECT_TRUE(f.ok());
  uint64_t total = 0;
  for (const TensorInfo& t : f->index.tensors()) {
    if (t.name == "rope_freqs.weight") total += t.nbytes;
    for (uint32_t l = first; l <= last; ++l)
      if (t.name.rfind("blk." + std::to_string(l) + ".", 0) == 0) total += t.nbytes;
  }
  return total;
}

TEST(PoolHost, WorkersReadOnlyTheirOwnTensors) {
  HostOptions o = host_opts(stories());
  o.split = {{0, 1}, {2, 3}, {4, 4}};
  auto p = start_pool(o, 2);
  ASSERT_TRUE(p);
  const auto st = p->host->stages();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].name, "host");
  EXPECT_EQ(st[0].n_layers, 2u);
  EXPECT_EQ(st[1].first, 2u);
  EXPECT_EQ(st[1].n_layers, 2u);
  EXPECT_EQ(st[2].first, 4u);
  EXPECT_EQ(st[2].n_layers, 1u);
  EXPECT_EQ(st[1].bytes_loaded, index_bytes(stories(), 2, 3));
  EXPECT_EQ(st[2].bytes_loaded, index_bytes(stories(), 4, 4));
  EXPECT_GT(st[2].bytes_loaded, 0u);
}

TEST(PoolHost, SameTokensAsOneSliceGreedyAndSeeded) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};  // "Once upon a time" in stories260K
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.seed = 1234;
  const auto want_greedy = local_ids(stories(), prompt, 40, greedy());
  const auto want_seeded = local_ids(stories(), prompt, 40, seeded);
  HostOptions o = host_opts(stories());
  o.spread = true;
  auto p = start_pool(o, 2);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->host->stages().size(), 3u);
  EXPECT_EQ(pool_ids(*p->host, prompt, 40, greedy()), want_greedy);
  EXPECT_EQ(pool_ids(*p->host, prompt, 40, seeded), want_seeded);
  // A longer prompt: several prefill frames in flight around the chain.
  std::vector<int32_t> long_prompt = prompt;
  for (int i = 0; i < 60; ++i) long_prompt.push_back(want_greedy[size_t(i % 40)]);
  EXPECT_EQ(pool_ids(*p->host, long_prompt, 12, greedy()), local_ids(stories(), long_prompt, 12, greedy()));
}

// The last worker keeps only the rows the host's head reads: prefill frames before the last come
// back with none, the last prefill frame and each decode step with one. When a worker does not
// announce kCapKeepRows (one from before it), the host asks for every row. Same ids either way.
TEST(PoolHost, TheLastWorkerSendsOnlyTheRowsTheHeadReads) {
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  for (int32_t i = 0; prompt.size() < 37; ++i) prompt.push_back(30 + (i * 37) % 400);  // frames of 16, 16, 5
  const auto want = local_ids(stories(), prompt, 6, greedy());
  for (bool old_first_worker : {false, true}) {
    SCOPED_TRACE(old_first_worker);
    HostOptions o = host_opts(stories());
    o.spread = true;  // chain order w1, w2
    o.split = {{0, 1}, {2, 3}, {4, 4}};
    auto p = std::make_unique<Pool>();
    p->results.reserve(16);
    auto h = Host::open(o, tcp_network());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    p->host = std::move(*h);
    WorkerOptions w1 = worker_opts(p->host->address(), "w1");
    w1.keep_rows = !old_first_worker;
    p->add_worker(w1);
    p->add_worker(worker_opts(p->host->address(), "w2"));
    ASSERT_TRUE(p->host->wait_for_workers(2, Millis(20000)).ok());
    ASSERT_TRUE(p->host->ensure_plan().ok());
    EXPECT_EQ(pool_ids(*p->host, prompt, 6, greedy()), want);
    const WorkerState first = p->workers[0]->state(), last = p->workers[1]->state();
    EXPECT_EQ(first.end, 4);
    EXPECT_EQ(last.end, 5);
    ASSERT_EQ(first.frames, last.frames);
    ASSERT_GE(first.frames, 4u);  // 3 prefill frames, then decode steps of one token
    const uint64_t decode_steps = first.frames - 3;
    EXPECT_EQ(first.rows_sent, 37 + decode_steps);
    EXPECT_EQ(last.rows_sent, old_first_worker ? 37 + decode_steps : 1 + decode_steps);
  }
}

// One frame through a worker's slice (run_frame, what a worker does with each frame): the stage
// that ends the model keeps the rows the host's head reads, others pass every row and the flags
// on, and a frame whose rows were already kept is refused.
TEST(PoolWorker, RunFrameKeepsTheRowsTheHeadReadsOnlyAtTheEndOfTheModel) {
  auto m = open_model(stories(), false);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto backend = create_backend("cpu");
  ASSERT_TRUE(backend.ok());
  const int L = m->config.n_layers, d = m->config.d_model;
  auto load = [&](int first, int end) {
    SliceOptions so;
    so.n_ctx = 64;
    so.max_tokens = kFrameTokens;
    auto s = Slice::load(*m->file, m->config, m->weights, SliceSpec{first, end, false, false}, so, **backend);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(*s) : nullptr;
  };
  auto last = load(2, L), reference = load(2, L), middle = load(1, 3);
  ASSERT_TRUE(last && reference && middle);
  Assign a;
  a.n_layers = uint32_t(L);
  a.first_layer = 2;
  a.last_layer = uint32_t(L - 1);
  a.d_model = uint32_t(d);
  a.context_length = 64;
  a.hop_dtype = HopDType::kF32;
  std::vector<float> x(size_t(9) * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * std::sin(0.37f * float(i));
  auto frame = [&](uint32_t pos, int n, uint8_t flags) {
    FrameHeader h;
    h.pos = pos;
    h.n_tokens = uint16_t(n);
    h.flags = flags;
    h.dtype = HopDType::kF32;
    const auto* bytes = reinterpret_cast<const uint8_t*>(x.data() + size_t(pos) * d);
    return encode_frame(h, std::span(bytes, size_t(n) * d * 4));
  };
  // Rows 0-4 whose head reads none, then rows 5-8 whose head reads the last one.
  int rows = -1;
  auto none = run_frame(*last, a, frame(0, 5, kFrameHeadReadsNone), rows);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(rows, 0);
  EXPECT_EQ(none->payload.size(), kFrameHeaderSize);
  EXPECT_EQ(none->payload[15], kFrameHeadReadsNone | kFrameRowsKept);
  auto one = run_frame(*last, a, frame(5, 4, kFrameHeadReadsLast), rows);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(rows, 1);
  EXPECT_EQ(one->payload[15], kFrameHeadReadsLast | kFrameRowsKept);
  ASSERT_EQ(one->payload.size(), kFrameHeaderSize + size_t(d) * 4);
  // The reference: the same rows with every row computed.
  std::vector<float> all(size_t(9) * d);
  auto every = run_frame(*reference, a, frame(0, 9, 0), rows);
  ASSERT_TRUE(every.ok()) << every.status().to_string();
  EXPECT_EQ(rows, 9);
  std::memcpy(all.data(), every->payload.data() + kFrameHeaderSize, all.size() * 4);
  std::vector<float> kept(static_cast<size_t>(d));
  std::memcpy(kept.data(), one->payload.data() + kFrameHeaderSize, kept.size() * 4);
  for (int i = 0; i < d; ++i) {
    const float want = all[size_t(8) * d + size_t(i)];
    ASSERT_NEAR(kept[size_t(i)], want, 1e-5f * (1.0f + std::fabs(want))) << i;
  }
  // A stage that does not end the model passes every row and the flags on.
  Assign mid = a;
  mid.first_layer = 1;
  mid.last_layer = 2;
  auto passed = run_frame(*middle, mid, frame(0, 4, kFrameHeadReadsLast), rows);
  ASSERT_TRUE(passed.ok()) << passed.status().to_string();
  EXPECT_EQ(rows, 4);
  EXPECT_EQ(passed->payload[15], kFrameHeadReadsLast);
  EXPECT_EQ(passed->payload.size(), kFrameHeaderSize + size_t(4) * d * 4);
  // Hostile frames: rows already kept (a 1-row body for 4 tokens), too many tokens.
  FrameHeader h;
  h.pos = 0;
  h.n_tokens = 4;
  h.flags = kFrameHeadReadsLast | kFrameRowsKept;
  h.dtype = HopDType::kF32;
  auto bytes_of = [](const std::vector<float>& v, size_t n) { return std::span(reinterpret_cast<const uint8_t*>(v.data()), n * 4); };
  auto kept_again = run_frame(*last, a, encode_frame(h, bytes_of(x, size_t(d))), rows);
  EXPECT_EQ(kept_again.status().code(), Code::kCorrupt);
  EXPECT_NE(kept_again.status().message().find("already kept"), std::string::npos) << kept_again.status().message();
  std::vector<float> big(size_t(kFrameTokens + 1) * d);
  FrameHeader hb;
  hb.n_tokens = uint16_t(kFrameTokens + 1);
  hb.dtype = HopDType::kF32;
  auto too_many = run_frame(*last, a, encode_frame(hb, bytes_of(big, big.size())), rows);
  EXPECT_EQ(too_many.status().code(), Code::kOutOfRange);
}

TEST(PoolHost, ANewPlanReplaysTheCachedPrefix) {
  const std::vector<int32_t> prompt = {1, 291, 376, 400, 428};  // "The little dog"
  HostOptions o = host_opts(stories());
  o.spread = true;
  auto p = start_pool(o, 1);
  ASSERT_TRUE(p);
  const auto first = pool_ids(*p->host, prompt, 8, greedy());
  EXPECT_EQ(first, local_ids(stories(), prompt, 8, greedy()));
  // A second worker joins: the next request runs on a new plan of 3 stages, whose caches are
  // filled from the session's cached tokens, so the follow-up prompt still reuses its prefix.
  p->add_worker(worker_opts(p->host->address(), "w2"));
  ASSERT_TRUE(p->host->wait_for_workers(2, Millis(20000)).ok());
  std::vector<int32_t> follow = prompt;
  follow.insert(follow.end(), first.begin(), first.end());
  GenerateOptions g;
  g.n_predict = 8;
  g.sampling = greedy();
  g.stop_at_eog = false;
  GenerateStats stats;
  auto out = p->host->generate(follow, g, {}, &stats);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(p->host->stages().size(), 3u);
  EXPECT_GT(stats.n_reused, 0);
  EXPECT_EQ(*out, local_ids(stories(), follow, 8, greedy()));
}

TEST(PoolHost, AWorkerThatLeftCostsOneNewPlanNotOnePerRequest) {
  const std::vector<int32_t> prompt = {1, 291, 376, 400, 428};
  HostOptions o = host_opts(stories());
  o.spread = true;
  auto p = start_pool(o, 2);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->host->stages().size(), 3u);
  p->workers[1]->stop();  // w2 says bye and leaves
  ASSERT_TRUE(p->join_worker(1).ok());
  for (int i = 0; i < 200 && p->host->stages().size() != 2; ++i) {
    ASSERT_TRUE(p->host->ensure_plan().ok());  // a plan without w2 once the host has heard its bye
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(p->host->stages().size(), 2u);
  const uint64_t epoch = p->host->plan_epoch();
  const auto want = local_ids(stories(), prompt, 4, greedy());
  EXPECT_EQ(pool_ids(*p->host, prompt, 4, greedy()), want);
  EXPECT_EQ(pool_ids(*p->host, prompt, 4, greedy()), want);
  EXPECT_EQ(p->host->plan_epoch(), epoch);  // the same plan served both requests
}

TEST(PoolHost, AWorkerWhoseRangeANewPlanKeepsReadsNothing) {
  // A forced split of two ranges: a second worker joining makes a new plan (it is a guest there)
  // in which w1 keeps layers 2-4, so its READY says 0 bytes read.
  HostOptions o = host_opts(stories());
  o.split = {{0, 1}, {2, 4}};
  auto p = start_pool(o, 1);
  ASSERT_TRUE(p);
  const uint64_t epoch = p->host->plan_epoch();
  ASSERT_EQ(p->host->stages().size(), 2u);
  EXPECT_EQ(p->host->stages()[1].bytes_loaded, index_bytes(stories(), 2, 4));
  p->add_worker(worker_opts(p->host->address(), "w2"));
  ASSERT_TRUE(p->host->wait_for_workers(2, Millis(20000)).ok());
  ASSERT_TRUE(p->host->ensure_plan().ok());
  EXPECT_EQ(p->host->plan_epoch(), epoch + 1);
  const auto stages = p->host->stages();
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[1].name, "w1");
  EXPECT_EQ(stages[1].bytes_loaded, 0u);
}

TEST(PoolHost, ForcedSplitAndLayersLocalAreApplied) {
  const std::vector<int32_t> prompt = {1, 403, 407};
  const auto want = local_ids(stories(), prompt, 16, greedy());
  {
    HostOptions o = host_opts(stories());
    o.split = {{0, 0}, {1, 4}};
    auto p = start_pool(o, 1);
    ASSERT_TRUE(p);
    const auto st = p->host->stages();
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0].n_layers, 1u);
    EXPECT_EQ(st[1].first, 1u);
    EXPECT_EQ(st[1].n_layers, 4u);
    EXPECT_EQ(pool_ids(*p->host, prompt, 16, greedy()), want);
  }
  {
    HostOptions o = host_opts(stories());
    o.layers_local = 0;
    o.split = {{0, 4}};  // with --layers-local 0 the ranges are the workers'
    auto p = start_pool(o, 1);
    ASSERT_TRUE(p);
    const auto st = p->host->stages();
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0].n_layers, 0u);
    EXPECT_EQ(st[1].n_layers, 5u);
    EXPECT_EQ(pool_ids(*p->host, prompt, 16, greedy()), want);
  }
  {
    HostOptions o = host_opts(stories());
    o.split = {{0, 1}, {3, 4}};  // a split the model refuses whatever joins: refused at open, before any wait
    auto h = Host::open(o, tcp_network());
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), Code::kInvalidArgument) << h.status().to_string();
    EXPECT_NE(h.status().message().find("--split leaves layers 2-2 to nobody"), std::string::npos)
        << h.status().to_string();
  }
  {
    HostOptions o = host_opts(stories());
    o.layers_local = 3;  // and no workers: layers 3-4 have nowhere to go
    auto h = Host::open(o, tcp_network());
    ASSERT_TRUE(h.ok());
    const Status st = (*h)->ensure_plan();
    EXPECT_EQ(st.code(), Code::kUnavailable) << st.to_string();
    EXPECT_NE(st.message().find("no worker is in the pool for layers 3-4"), std::string::npos) << st.to_string();
  }
}

/// A host that holds no layers and one worker started on its own `worker_model` (-m): the worker
/// is refused at its hello (protocol 2 carries its model's size and identity), before any plan.
void expect_wrong_model_refused(const std::string& worker_model) {
  HostOptions o = host_opts(stories());
  o.layers_local = 0;  // every layer must go to a worker
  auto h = Host::open(o, tcp_network());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  Pool p;
  p.results.reserve(4);
  p.host = std::move(*h);
  WorkerOptions w = worker_opts(p.host->address(), "wrong");
  w.model = worker_model;
  p.add_worker(w);
  const Status ws = p.join_worker(0);
  EXPECT_EQ(ws.code(), Code::kFailedPrecondition) << ws.to_string();
  EXPECT_NE(ws.message().find("wrong model file: the host has"), std::string::npos) << ws.to_string();
  EXPECT_NE(p.host->last_refusal().find("wrong model file"), std::string::npos) << p.host->last_refusal();
  EXPECT_EQ(p.host->n_workers(), 0u);
  const Status plan = p.host->ensure_plan();
  EXPECT_EQ(plan.code(), Code::kUnavailable) << plan.to_string();  // nobody to hold the layers
  EXPECT_NE(plan.message().find("no worker is in the pool"), std::string::npos) << plan.to_string();
}

TEST(PoolHost, WorkerWithTheWrongModelFileIsRefused) {
  expect_wrong_model_refused(test::fixture("hf/llama/model-bf16.gguf"));
}

// Same size, same tensor index, other weights (another fine-tune of the same model looks like this).
TEST(PoolHost, WorkerWithOtherWeightsOfTheSameShapesIsRefused) {
  const std::string path = ::testing::TempDir() + "stories-other-weights.gguf";
  {
    std::ifstream in(stories(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto f = open_model_file(stories());
    ASSERT_TRUE(f.ok());
    const TensorInfo* t = f->index.find("blk.3.ffn_down.weight");
    ASSERT_NE(t, nullptr);
    bytes[t->offset + t->nbytes / 2] ^= 0x40;  // one bit in the middle of one tensor
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  expect_wrong_model_refused(path);
  std::remove(path.c_str());
}

TEST(PoolHost, WrongSecretIsRefusedOnBothSides) {
  auto h = Host::open(host_opts(stories()), tcp_network());
  ASSERT_TRUE(h.ok());
  WorkerOptions w = worker_opts((*h)->address(), "intruder");
  w.secret = "not-the-secret";
  Worker worker(w, tcp_network());
  const Status st = worker.run();
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("wrong room secret"), std::string::npos) << st.to_string();
  for (int i = 0; i < 200 && (*h)->refused() == 0; ++i) std::this_thread::sleep_for(Millis(10));
  EXPECT_EQ((*h)->refused(), 1u);
  EXPECT_NE((*h)->last_refusal().find("permission denied"), std::string::npos) << (*h)->last_refusal();
  EXPECT_EQ((*h)->n_workers(), 0u);
}

TEST(PoolHost, HelloOfAnotherProtocolVersionIsRefused) {
  auto h = Host::open(host_opts(stories()), tcp_network());
  ASSERT_TRUE(h.ok());
  auto c = tcp_network().connect((*h)->address(), Millis(5000));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(auth_client(**c, kRoomSecret, PeerRole::kWorker).ok());
  Hello hello;
  hello.protocol_version = kProtocolVersion + 1;
  hello.name = "from-the-future";
  hello.data_port = 1;
  ASSERT_TRUE((*c)->send(encode(hello)).ok());
  auto m = (*c)->recv(Millis(5000));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto e = decode<ErrorMsg>(*m);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->code, Code::kUnsupported);
  EXPECT_NE(e->message.find("protocol version 3, this build speaks 2"), std::string::npos) << e->message;
  EXPECT_EQ((*h)->refused(), 1u);
  EXPECT_EQ((*h)->n_workers(), 0u);
}

/// Sends `bytes` on a fresh TCP connection to `address` and reads until the peer closes (2 s).
std::string poke(const std::string& address, const std::string& bytes) {
  auto a = parse_address(address);
  EXPECT_TRUE(a.ok());
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(a->port);
  inet_pton(AF_INET, a->host.c_str(), &sa.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!write(fd, bytes.data(), bytes.size());
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
  close(fd);
  return got;
}

TEST(PoolHost, GarbageOnThePortLeavesThePoolWorking) {
  const std::vector<int32_t> prompt = {1, 403, 407};
  const auto want = local_ids(stories(), prompt, 16, greedy());
  HostOptions o = host_opts(stories());
  o.spread = true;
  auto p = start_pool(o, 1);
  ASSERT_TRUE(p);
  EXPECT_EQ(pool_ids(*p->host, prompt, 16, greedy()), want);
  const std::string addr = p->host->address();
  const std::vector<uint8_t> future = encode_record(Message{MsgType::kAuth, std::vector<uint8_t>(65, 1)}, 2);
  EXPECT_NE(poke(addr, "\x01\x02garbage bytes \xff\xfe").size(), 0u);  // an ERROR record comes back
  EXPECT_NE(poke(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").size(), 0u);
  EXPECT_NE(poke(addr, std::string(future.begin(), future.end())).size(), 0u);
  for (int i = 0; i < 200 && p->host->refused() < 3; ++i) std::this_thread::sleep_for(Millis(10));
  EXPECT_EQ(p->host->refused(), 3u) << p->host->last_refusal();
  EXPECT_EQ(p->host->n_workers(), 1u);
  EXPECT_EQ(pool_ids(*p->host, prompt, 16, greedy()), want);
}

}  // namespace
}  // namespace shoal::pool

// How peers leave a pool, end to end with processes over TCP loopback: a host stopped by SIGTERM
// or SIGHUP and a worker stopped by SIGINT say bye (the others hear why at once, not after a
// silence), and a second signal ends a host whose leaving is stuck; a
// worker frozen past --dead-after is dropped and, when it wakes, reads why; a request that meets a worker
// frozen since the plan waits for another and runs again, and a worker whose next stage froze stays
// in the pool; a prompt stopped while it waits is answered null (--output-ids); a worker's name stays
// its own while it is alive, and a worker restarted under its name takes it back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <regex>

#include "pool_test_util.h"
#include "test_util.h"

namespace shoal {
namespace {

using test::Child;
using namespace std::chrono_literals;


std::string first_story() {
  std::ifstream in(test::fixture("expected/stories260K_greedy.json"));
  return nlohmann::json::parse(in)["cases"][0]["generated_text"].get<std::string>();
}

// A host over stories260K (--split 0-2,3-4, host `extra` flags) and workers w1, w2 that took plan
// 1 (w1 joins first: layers 0-2). On a failure the workers are null (the host says why).
struct SplitPool {
  std::unique_ptr<Child> host, w1, w2;
};
SplitPool split_pool(const std::string& secret, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--split", "0-2,3-4"});
  SplitPool p;
  p.host = test::stories_host(secret, 2, extra);
  const std::string addr = test::host_address(*p.host);
  if (addr.empty()) return p;
  auto w1 = test::join(addr, "w1", secret);
  if (!p.host->wait_err("worker 'w1' joined", 60s)) return p;
  auto w2 = test::join(addr, "w2", secret);
  if (!p.host->wait_err("worker 'w2' ready for plan 1", 60s)) return p;
  p.w1 = std::move(w1);
  p.w2 = std::move(w2);
  return p;
}

// A host over stories260K (`host_extra` flags) whose one worker w1 (`worker_extra` flags) took
// plan 1, and the room's address. On a failure w1 is null (the host says why).
struct OnePool {
  std::unique_ptr<Child> host, w1;
  std::string addr;
};
OnePool one_worker_pool(const std::string& secret, const std::vector<std::string>& host_extra = {},
                        const std::vector<std::string>& worker_extra = {}) {
  OnePool p;
  p.host = test::stories_host(secret, 1, host_extra);
  p.addr = test::host_address(*p.host);
  if (p.addr.empty()) return p;
  auto w1 = test::join(p.addr, "w1", secret, worker_extra);
  if (p.host->wait_err("worker 'w1' ready for plan 1", 60s)) p.w1 = std::move(w1);
  return p;
}

TEST(PoolLeave, StoppedPeersSayBye) {
  const std::string secret = "leave-test-secret";
  auto [host, w1, w2] = split_pool(secret);
  ASSERT_TRUE(w2) << (host ? host->err() : "");

  w2->kill(SIGINT);
  w2->kill(SIGINT);  // at once: the same request twice (as `timeout` or a process group sends it)
  EXPECT_EQ(w2->wait_exit(10s), 0) << w2->err();
  EXPECT_TRUE(host->wait_err("worker 'w2' said bye: the worker stops", 10s)) << host->err();

  host->kill(SIGTERM);
  EXPECT_EQ(host->wait_exit(10s), 128 + SIGTERM) << host->err();
  EXPECT_NE(host->err().find("SIGTERM: the host stops; saying bye to the pool"), std::string::npos) << host->err();
  EXPECT_EQ(w1->wait_exit(10s), 0) << w1->err();
  EXPECT_NE(w1->err().find("said bye: the host was stopped (SIGTERM)"), std::string::npos) << w1->err();
}

TEST(PoolLeave, AHostWhoseTerminalClosedSaysBye) {
  const std::string secret = "leave-hup-secret";
  auto [host, w1, addr] = one_worker_pool(secret);
  ASSERT_TRUE(w1) << (host ? host->err() : "");
  host->kill(SIGHUP);
  EXPECT_EQ(host->wait_exit(10s), 128 + SIGHUP) << host->err();
  EXPECT_NE(host->err().find("SIGHUP: the host stops; saying bye to the pool"), std::string::npos) << host->err();
  EXPECT_EQ(w1->wait_exit(10s), 0) << w1->err();
  EXPECT_NE(w1->err().find("said bye: the host was stopped (SIGHUP)"), std::string::npos) << w1->err();
}

// A host lost without a bye (killed, its machine gone) fails its workers (exit 1, "lost the
// host"), so that a supervisor that restarts a worker on failure starts it again.
TEST(PoolLeave, AWorkerWhoseHostIsKilledFails) {
  const std::string secret = "leave-kill-secret";
  auto [host, w1, addr] = one_worker_pool(secret);
  ASSERT_TRUE(w1) << (host ? host->err() : "");
  host->kill(SIGKILL);
  EXPECT_EQ(w1->wait_exit(10s), 1) << w1->err();
  EXPECT_NE(w1->err().find("lost the host: "), std::string::npos) << w1->err();
}

// join --stay serves one host after another: a host that answers its -p and says bye, then a host
// killed, then a third on the same address; a signal still ends the worker, in order (0).
TEST(PoolLeave, AStayingWorkerServesOneHostAfterAnother) {
  const std::string secret = "stay-secret";
  auto first = test::stories_host(secret, 1, {"-p", "Once upon a time", "--output-ids"});
  const std::string addr = test::host_address(*first);
  ASSERT_FALSE(addr.empty()) << first->err();
  auto w1 = test::join(addr, "w1", secret, {"--stay"});
  EXPECT_EQ(first->wait_exit(60s), 0) << first->err();
  const std::string ids = first->out();
  ASSERT_EQ(ids.rfind("[432, 383, 286, 261", 0), 0u) << ids;  // expected/stories260K_greedy.json
  ASSERT_TRUE(w1->wait_err("--stay: waiting for the host at", 30s)) << w1->err();
  auto second = test::stories_host(secret, 1, {}, addr);  // stdin prompts: it stays up
  ASSERT_TRUE(second->wait_err("worker 'w1' ready for plan 1", 60s)) << second->err() << w1->err();
  const size_t before_kill = w1->err().size();
  second->kill(SIGKILL);
  ASSERT_TRUE(w1->wait_err("lost the host", 30s, before_kill)) << w1->err();
  ASSERT_TRUE(w1->wait_err("--stay: waiting for the host at", 30s, before_kill)) << w1->err();
  const size_t before_third = w1->err().size();
  auto third = test::stories_host(secret, 1, {"-p", "Once upon a time", "--output-ids"}, addr);
  EXPECT_EQ(third->wait_exit(60s), 0) << third->err() << w1->err();
  EXPECT_EQ(third->out(), ids);
  ASSERT_TRUE(w1->wait_err("--stay: waiting for the host at", 30s, before_third)) << w1->err();
  EXPECT_EQ(w1->wait_exit(0ms), -1) << "a --stay worker left: " << w1->err();  // (-1: still running)
  w1->kill(SIGINT);
  EXPECT_EQ(w1->wait_exit(30s), 128 + SIGINT) << w1->err();  // (stopped while waiting: not in a pool)
}

TEST(PoolLeave, RunWithAPoolSaysByeWhenStopped) {
  auto run = Child::start({test::shoal_bin(), "run", "-m", test::fixture("models/stories260K.gguf"), "-p", "Once",
                           "-n", "1500", "-c", "2048", "--temp", "0", "-t", "1", "--pool", "3"});
  ASSERT_TRUE(run->wait_err("worker 'local-2' ready for plan 1", 60s)) << run->err();
  ASSERT_TRUE(run->wait_out(".{16}", 60s)) << run->err();  // generating
  run->kill(SIGINT);
  EXPECT_EQ(run->wait_exit(10s), 128 + SIGINT) << run->err();
  EXPECT_NE(run->err().find("SIGINT: the host stops; saying bye to the pool"), std::string::npos) << run->err();
}

TEST(PoolLeave, ASecondSignalEndsAHostStuckLeaving) {
  // The host's stdout goes to a pipe nobody reads: once it is full, the first SIGTERM's handling
  // (flush the text, then exit) is stuck; the second one must end the process anyway.
  const std::string cmd = "exec 3> >(exec sleep 120 >/dev/null 2>&1); echo sleeper $! >&2; echo pid $$ >&2; exec " +
                          test::shoal_bin() + " host -m " + test::fixture("models/stories260K.gguf") +
                          " --listen 127.0.0.1:0 --workers 0 -c 128 -n 48 --temp 0 -t 1 >&3 3>&-";
  auto host = Child::start({"/bin/bash", "-c", cmd}, {"SHOAL_SECRET=stuck"});
  ASSERT_TRUE(host->wait_err(R"(pid (\d+))", 10s)) << host->err();
  std::smatch m;
  const std::string err = host->err();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(pid (\d+))")));
  const pid_t pid = std::stoi(m[1]);
  ASSERT_EQ(pid, host->pid());  // exec kept the shell's pid
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(sleeper (\d+))")));
  struct Sleeper {  // the pipe's reader that never reads: gone with the test
    pid_t pid;
    ~Sleeper() { ::kill(pid, SIGKILL); }
  } sleeper{std::stoi(m[1])};
  ASSERT_TRUE(host->wait_err("reading prompts from stdin", 60s)) << host->err();
  // The smallest pipe (one page), so that a few stories fill it.
  const int fd = open(("/proc/" + std::to_string(pid) + "/fd/1").c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct Close {
    int fd;
    ~Close() { close(fd); }
  } close_fd{fd};
  const int size = fcntl(fd, F_SETPIPE_SZ, 4096);
  ASSERT_GT(size, 0);
  std::string prompts;  // ~200 bytes of story each: 10 pipes' worth
  for (int i = 0; i < std::max(200, size / 20); ++i) prompts += "Once upon a time\n";
  host->write(prompts);
  // Until the pipe is full: its unread bytes (FIONREAD, from either end) within a token's text of
  // its size and steady for a second, the host's next write blocked (a write that does not fit
  // the page's rest waits for an empty one). A fixed wait was too short on a loaded machine: the
  // stories were not yet written, and the first SIGTERM ended the host.
  int queued = 0, last = -1;
  auto since = std::chrono::steady_clock::now();
  for (auto t0 = since; std::chrono::steady_clock::now() - t0 < 120s;) {
    ASSERT_EQ(ioctl(fd, FIONREAD, &queued), 0);
    if (queued != last) last = queued, since = std::chrono::steady_clock::now();
    if (queued >= size - 256 && std::chrono::steady_clock::now() - since >= 1s) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(queued, size - 256) << "the host's stdout never filled: " << host->err();
  host->kill(SIGTERM);
  ASSERT_TRUE(host->wait_err("SIGTERM: the host stops", 10s)) << host->err();
  EXPECT_EQ(host->wait_exit(1s), -1) << "exited although its stdout is full";
  EXPECT_EQ(::kill(pid, 0), 0) << "still running, stuck";
  host->kill(SIGTERM);
  EXPECT_EQ(host->wait_exit(10s), -1);  // killed by the signal: no exit status
  EXPECT_NE(::kill(pid, 0), 0) << "the second SIGTERM did not end it";
}

TEST(PoolLeave, AFrozenWorkerIsDroppedAndReadsWhyWhenItWakes) {
  const std::string secret = "frozen-test-secret";
  auto [host, w1, addr] = one_worker_pool(secret, {"--dead-after", "500"}, {"--dead-after", "500"});
  ASSERT_TRUE(w1) << (host ? host->err() : "");
  w1->kill(SIGSTOP);
  EXPECT_TRUE(host->wait_err("worker 'w1' is not answering", 10s)) << host->err();
  w1->kill(SIGCONT);
  EXPECT_EQ(w1->wait_exit(10s), 0) << w1->err();
  EXPECT_NE(w1->err().find("said bye: nothing heard from this peer for"), std::string::npos) << w1->err();
  host->close_stdin();
  EXPECT_EQ(host->wait_exit(10s), 0) << host->err();
}

TEST(PoolLeave, ARequestThatMeetsAWorkerFrozenSinceThePlanWaitsForAnotherAndRunsAgain) {
  // w2 freezes after the plan: the prompt's frames reach it before the host can tell (its
  // --dead-after is 3 s), so the request breaks before its first token. The plan made again
  // without w2 fails (the --split needs two workers), so the host waits for two, and w3 answers
  // the prompt as if nothing had happened.
  const std::string secret = "frozen-request-secret";
  auto [host, w1, w2] = split_pool(secret, {"--dead-after", "3000"});
  ASSERT_TRUE(w2) << (host ? host->err() : "");
  w2->kill(SIGSTOP);
  host->write("Once upon a time\n");
  ASSERT_TRUE(host->wait_err("planning again and running the request again(.|\n)*waiting for 2 workers", 60s))
      << host->err();
  auto w3 = test::join(test::host_address(*host), "w3", secret);
  ASSERT_TRUE(host->wait_out_text(first_story(), 60s)) << host->out() << host->err();
  w2->kill(SIGCONT);
  host->close_stdin();
  EXPECT_EQ(host->wait_exit(30s), 0) << host->err();
  EXPECT_NE(host->err().find("worker 'w3' ready for plan"), std::string::npos) << host->err();
  EXPECT_EQ(host->out().find("\n\n"), std::string::npos) << host->out();  // one answer, nothing before it
}

TEST(PoolLeave, AWorkerThatCannotReachAFrozenNextStageStaysInThePool) {
  // w3 joining makes the next prompt plan again; w2 (layers 3-4) freezes first, unnoticed yet (the
  // host's --dead-after is 4 s). w1 keeps layers 0-2 and cannot open its hop to w2: that is w2's
  // fault (unavailable), so w1 stays, and the plan made after w2 is dropped runs on w1 and w3.
  const std::string secret = "frozen-next-secret";
  auto [host, w1, w2] = split_pool(secret, {"--dead-after", "4000"});
  ASSERT_TRUE(w2) << (host ? host->err() : "");
  auto w3 = test::join(test::host_address(*host), "w3", secret);
  ASSERT_TRUE(host->wait_err("worker 'w3' joined", 60s)) << host->err();
  w2->kill(SIGSTOP);
  host->write("Once upon a time\n");
  ASSERT_TRUE(host->wait_out_text(first_story(), 90s)) << host->out() << host->err();
  w2->kill(SIGCONT);
  host->close_stdin();
  EXPECT_EQ(host->wait_exit(30s), 0) << host->err();
  EXPECT_EQ(w1->wait_exit(30s), 0) << w1->err();  // it left when the host did, not before
  EXPECT_EQ(host->err().find("refused worker 'w1'"), std::string::npos) << host->err();
  EXPECT_NE(host->err().find("worker 'w3' ready for plan"), std::string::npos) << host->err();
  // The path under test: w1 could not open its hop to w2 and said so as unavailable.
  EXPECT_NE(host->err().find("worker 'w1' did not take its part of plan"), std::string::npos)
      << host->err();
  EXPECT_NE(w1->err().find("hop to stage 2"), std::string::npos) << w1->err();
}

TEST(PoolLeave, AStopWhileAPromptWaitsForWorkersAnswersItNull) {
  // --output-ids owes each prompt line one line out: a SIGTERM while the prompt waits for a worker
  // (its only one was killed) leaves null for it.
  const std::string secret = "pending-null-secret";
  auto [host, w1, addr] = one_worker_pool(secret, {"--output-ids"});
  ASSERT_TRUE(w1) << (host ? host->err() : "");
  w1->kill(SIGKILL);
  ASSERT_TRUE(host->wait_err("worker 'w1'.*closed the connection", 10s)) << host->err();
  host->write("Once upon a time\n");
  ASSERT_TRUE(host->wait_err("no plan with the pool as it is.*waiting for 1 worker on", 30s)) << host->err();
  host->kill(SIGTERM);
  EXPECT_EQ(host->wait_exit(10s), 128 + SIGTERM) << host->err();
  EXPECT_EQ(host->out(), "null\n") << host->err();
}

TEST(PoolLeave, ANameStaysWithItsLiveWorkerAndComesBackWithARestart) {
  const std::string secret = "names-test-secret";
  auto [host, first, addr] = one_worker_pool(secret);
  ASSERT_TRUE(first) << (host ? host->err() : "");

  auto twin = test::join(addr, "w1", secret);  // the name is taken while the first one lives
  EXPECT_EQ(twin->wait_exit(60s), 1) << twin->err();
  EXPECT_NE(twin->err().find("the name 'w1' is taken by a live worker of the pool"), std::string::npos)
      << twin->err();

  first->kill(SIGKILL);
  ASSERT_TRUE(host->wait_err("worker 'w1'.*closed the connection", 10s)) << host->err();
  auto again = test::join(addr, "w1", secret);  // restarted under its name: it takes the name back
  ASSERT_TRUE(host->wait_err("worker 'w1' joined(.|\n)*worker 'w1' joined", 60s)) << host->err();
  host->write("Once upon a time\n");
  ASSERT_TRUE(host->wait_out_text(first_story(), 60s)) << host->out() << host->err();
  host->close_stdin();
  EXPECT_EQ(host->wait_exit(60s), 0) << host->err();
  const std::string err = host->err();
  EXPECT_NE(err.find("worker 'w1' is out of the pool"), std::string::npos) << err;
  EXPECT_NE(err.find("worker 'w1' ready for plan 2"), std::string::npos) << err;
  EXPECT_EQ(err.find("w1#"), std::string::npos) << err;
}

}  // namespace
}  // namespace shoal

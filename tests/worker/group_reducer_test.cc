// GroupReducer implementations: LocalGroup (members as threads over inproc, ipc and tcp,
// and as real processes), and NcclGroup when it is built. NCCL work runs in forked
// children only, so this process never initializes CUDA (CUDA does not survive fork());
// without a GPU those tests are skipped and say why.
#include "worker/group_reducer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/curve.h"
#include "gtest/gtest.h"
#include "worker/gpu_config.h"
#include "worker/local_group.h"
#if ONLINEPS_HAVE_NCCL
#include "worker/nccl_group.h"
#endif

namespace onlineps::worker {
namespace {

using std::chrono::milliseconds;
using Groups = std::vector<std::unique_ptr<GroupReducer>>;

std::vector<float> FloatsOf(int rank, int round, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + round));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint64_t> U64sOf(int rank, int round, size_t n) {
  std::mt19937_64 rng(static_cast<uint64_t>(rank) * 7919 + static_cast<uint64_t>(round));
  std::vector<uint64_t> v(n);
  for (uint64_t& x : v) x = rng();
  return v;
}

// What every member must get: the members' floats summed in rank order.
std::vector<float> RankOrderSum(int size, int round, size_t n) {
  std::vector<float> sum = FloatsOf(0, round, n);
  for (int r = 1; r < size; ++r) {
    const std::vector<float> v = FloatsOf(r, round, n);
    for (size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

std::vector<uint64_t> Min(int size, int round, size_t n) {
  std::vector<uint64_t> min = U64sOf(0, round, n);
  for (int r = 1; r < size; ++r) {
    const std::vector<uint64_t> v = U64sOf(r, round, n);
    for (size_t i = 0; i < n; ++i) min[i] = std::min(min[i], v[i]);
  }
  return min;
}

size_t RoundSize(int round) { return round % 7 == 3 ? 0 : static_cast<size_t>(1 + round * 37); }

// One round of both collectives on generated data; "" or what went wrong.
std::string CheckRound(GroupReducer& g, int round) {
  const size_t n = RoundSize(round);
  std::vector<float> f = FloatsOf(g.rank(), round, n);
  Status s = g.SumFloats(f.data(), n);
  if (!s.ok()) return "SumFloats: " + s.ToString();
  if (std::memcmp(f.data(), RankOrderSum(g.size(), round, n).data(), n * sizeof(float)) != 0) {
    return "round " + std::to_string(round) + ": sum differs from the rank-order sum";
  }
  std::vector<uint64_t> u = U64sOf(g.rank(), round, n);
  s = g.MinU64(u.data(), n);
  if (!s.ok()) return "MinU64: " + s.ToString();
  if (u != Min(g.size(), round, n)) return "round " + std::to_string(round) + ": wrong min";
  return "";
}

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A fresh directory under /tmp, removed with everything in it (ipc sockets, id files).
class ScratchDir {
 public:
  ScratchDir() {
    char dir[] = "/tmp/onlineps-group-test-XXXXXX";
    if (mkdtemp(dir) != nullptr) path_ = dir;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string NewEndpoint(const std::string& transport, const ScratchDir& scratch) {
  static std::atomic<int> counter{0};
  const std::string name = "group-" + std::to_string(counter.fetch_add(1));
  if (transport == "inproc") return "inproc://onlineps-" + name;
  if (transport == "mem") return "mem://onlineps-" + name;
  if (transport == "ipc") return "ipc://" + scratch.File(name);
  return "tcp://127.0.0.1:" + std::to_string(FreeTcpPort());
}

// Runs body(rank) for every member on its own thread, and joins them.
void OnThreads(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

class LocalGroupTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Members 0..size-1 on one endpoint; timeouts[r] if given, else `timeout`.
  Groups MakeGroup(int size, milliseconds timeout, std::vector<milliseconds> timeouts = {}) {
    const std::string endpoint = NewEndpoint(GetParam(), scratch_);
    Groups groups;
    for (int r = 0; r < size; ++r) {
      LocalGroupOptions options{r, size, endpoint,
                                r < int(timeouts.size()) ? timeouts[r] : timeout};
      if (GetParam() == "curve") options.curve = SharedCert();
      StatusOr<std::unique_ptr<GroupReducer>> g = NewLocalGroup(options);
      EXPECT_TRUE(g.ok()) << endpoint << ": " << g.status().ToString();
      if (!g.ok()) return {};
      groups.push_back(std::move(g).value());
    }
    return groups;
  }

  // One certificate for every member (the default deployment: one secret per group).
  static CurveOptions SharedCert() {
    static const CurveOptions cert = [] {
      StatusOr<CurveKeyPair> k = NewCurveKeyPair();
      EXPECT_TRUE(k.ok()) << k.status().ToString();
      CurveOptions c;
      if (!k.ok()) return c;
      c.public_key = c.server_public_key = k->public_key;
      c.secret_key = k->secret_key;
      c.allowed_clients = {k->public_key};
      return c;
    }();
    return cert;
  }

  ScratchDir scratch_;
};

TEST_P(LocalGroupTest, SumAndMinAreExactOnEveryMember) {
  Groups groups = MakeGroup(3, milliseconds(10000));
  ASSERT_EQ(groups.size(), 3u);
  std::vector<std::vector<float>> sums(3);
  std::vector<std::vector<uint64_t>> mins(3);
  std::vector<Status> status(6);
  OnThreads(3, [&](int r) {
    sums[r] = {float(r + 1), float(10 * r), -3.0f, 0.5f};
    mins[r] = {uint64_t(r + 5), uint64_t(1) << 63 | uint64_t(r), 7, ~uint64_t{0} - uint64_t(r)};
    status[r] = groups[r]->SumFloats(sums[r].data(), 4);
    status[3 + r] = groups[r]->MinU64(mins[r].data(), 4);
  });
  for (const Status& s : status) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sums[r], (std::vector<float>{6.0f, 30.0f, -9.0f, 1.5f})) << "rank " << r;
    EXPECT_EQ(mins[r], (std::vector<uint64_t>{5, uint64_t(1) << 63, 7, ~uint64_t{0} - 2}));
  }
  EXPECT_TRUE(groups[0]->leader());
  EXPECT_FALSE(groups[2]->leader());
  EXPECT_EQ(groups[2]->size(), 3);
}

TEST_P(LocalGroupTest, SumFoldsInRankOrderOnEveryMember) {
  Groups groups = MakeGroup(3, milliseconds(10000));
  ASSERT_EQ(groups.size(), 3u);
  // Float addition is not associative: (1e8 + 1) - 1e8 is 0, 1e8 + (1 - 1e8) is 1 (or 8).
  const float kValues[3] = {1e8f, 1.0f, -1e8f};
  std::vector<float> out(3);
  std::vector<Status> status(3);
  OnThreads(3, [&](int r) {
    out[r] = kValues[r];
    status[r] = groups[r]->SumFloats(&out[r], 1);
  });
  for (const Status& s : status) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

TEST_P(LocalGroupTest, ManyRoundsStayInStep) {
  Groups groups = MakeGroup(3, milliseconds(10000));
  ASSERT_EQ(groups.size(), 3u);
  std::vector<std::string> errors(3);
  OnThreads(3, [&](int r) {
    for (int round = 0; round < 150 && errors[r].empty(); ++round) {
      errors[r] = CheckRound(*groups[r], round);
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_P(LocalGroupTest, MembersMayCallBeforeTheLeader) {
  Groups groups = MakeGroup(3, milliseconds(10000));
  ASSERT_EQ(groups.size(), 3u);
  std::vector<std::string> errors(3);
  OnThreads(3, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(milliseconds(200));
    errors[r] = CheckRound(*groups[r], 5);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_P(LocalGroupTest, MissingMemberTimesOutNamingIt) {
  // The leader gives up first, so rank 1 gets the leader's verdict, not its own timeout.
  Groups groups =
      MakeGroup(3, milliseconds(300), {milliseconds(300), milliseconds(10000), milliseconds(300)});
  ASSERT_EQ(groups.size(), 3u);
  std::vector<Status> status(2);
  const auto start = std::chrono::steady_clock::now();
  OnThreads(2, [&](int r) {  // rank 2 never calls
    float x = 1.0f;
    status[r] = groups[r]->SumFloats(&x, 1);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kDeadlineExceeded) << status[r].ToString();
    EXPECT_NE(status[r].message().find("no call from rank(s) 2 "), std::string::npos)
        << status[r].ToString();
  }
  // The leader's verdict: the call completed nowhere.
  EXPECT_FALSE(groups[1]->MayHaveCompleted());
}

TEST_P(LocalGroupTest, LateMemberGetsTheFailureOfItsCall) {
  Groups groups =
      MakeGroup(3, milliseconds(300), {milliseconds(300), milliseconds(10000), milliseconds(5000)});
  ASSERT_EQ(groups.size(), 3u);
  OnThreads(2, [&](int r) {
    float x = 1.0f;
    EXPECT_EQ(groups[r]->SumFloats(&x, 1).code(), StatusCode::kDeadlineExceeded);
  });
  // Rank 2 makes call #1 only now; the leader, at call #2, answers it with call #1's error
  // (and its own call #2 times out: rank 2 is out of step).
  std::vector<Status> status(3);
  OnThreads(3, [&](int r) {
    float x = 1.0f;
    status[r] = groups[r]->SumFloats(&x, 1);
  });
  EXPECT_EQ(status[2].code(), StatusCode::kDeadlineExceeded) << status[2].ToString();
  EXPECT_NE(status[2].message().find("group call #1 "), std::string::npos) << status[2].ToString();
  EXPECT_EQ(status[0].code(), StatusCode::kDeadlineExceeded) << status[0].ToString();
}

TEST_P(LocalGroupTest, MissingLeaderTimesOut) {
  Groups groups = MakeGroup(3, milliseconds(300));
  ASSERT_EQ(groups.size(), 3u);
  std::vector<Status> status(3);
  OnThreads(3, [&](int r) {
    if (r == 0) return;
    uint64_t x = 1;
    status[r] = groups[r]->MinU64(&x, 1);
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kDeadlineExceeded) << status[r].ToString();
    EXPECT_NE(status[r].message().find("no reply from the leader"), std::string::npos);
    // Without the leader's answer, the call may have completed there.
    EXPECT_TRUE(groups[r]->MayHaveCompleted());
  }
}

TEST_P(LocalGroupTest, MismatchedCallsFailOnEveryMemberThenRecover) {
  Groups groups = MakeGroup(3, milliseconds(10000));
  ASSERT_EQ(groups.size(), 3u);
  std::vector<Status> wrong_n(3);
  std::vector<Status> wrong_op(3);
  std::vector<std::string> after(3);
  OnThreads(3, [&](int r) {
    std::vector<float> f(4, 1.0f);
    wrong_n[r] = groups[r]->SumFloats(f.data(), r == 1 ? 3 : 4);
    std::vector<uint64_t> u(4, 1);
    wrong_op[r] = r == 2 ? groups[r]->MinU64(u.data(), 4) : groups[r]->SumFloats(f.data(), 4);
    after[r] = CheckRound(*groups[r], 1);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(wrong_n[r].code(), StatusCode::kFailedPrecondition) << wrong_n[r].ToString();
    EXPECT_NE(wrong_n[r].message().find("rank 1 called SumFloats(n=3)"), std::string::npos)
        << wrong_n[r].ToString();
    EXPECT_EQ(wrong_op[r].code(), StatusCode::kFailedPrecondition) << wrong_op[r].ToString();
    EXPECT_NE(wrong_op[r].message().find("rank 2 called MinU64(n=4)"), std::string::npos)
        << wrong_op[r].ToString();
    EXPECT_EQ(after[r], "") << "rank " << r;
  }
}

// A member whose key the leader does not admit never reaches it: its call times out, and
// the leader's names that rank as missing.
TEST(LocalGroupCurveTest, LeaderAdmitsOnlyTheListedKeys) {
  StatusOr<CurveKeyPair> leader_key = NewCurveKeyPair();
  StatusOr<CurveKeyPair> stranger = NewCurveKeyPair();
  ASSERT_TRUE(leader_key.ok() && stranger.ok()) << leader_key.status().ToString();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(FreeTcpPort());
  auto options = [&](int rank, const CurveKeyPair& own) {
    LocalGroupOptions o{rank, 2, endpoint, milliseconds(rank == 0 ? 600 : 400)};
    o.curve.public_key = own.public_key;
    o.curve.secret_key = own.secret_key;
    o.curve.server_public_key = leader_key->public_key;
    o.curve.allowed_clients = {leader_key->public_key};
    return o;
  };
  auto lead = NewLocalGroup(options(0, *leader_key));
  auto member = NewLocalGroup(options(1, *stranger));
  ASSERT_TRUE(lead.ok() && member.ok()) << lead.status().ToString() << member.status().ToString();
  std::vector<Status> status(2);
  OnThreads(2, [&](int r) {
    float x = 1;
    status[r] = (r == 0 ? *lead : *member)->SumFloats(&x, 1);
  });
  EXPECT_EQ(status[0].code(), StatusCode::kDeadlineExceeded) << status[0].ToString();
  EXPECT_NE(status[0].message().find("no call from rank(s) 1"), std::string::npos)
      << status[0].ToString();
  EXPECT_EQ(status[1].code(), StatusCode::kDeadlineExceeded) << status[1].ToString();
}

INSTANTIATE_TEST_SUITE_P(Transports, LocalGroupTest,
                         ::testing::Values("inproc", "mem", "ipc", "tcp", "curve"),
                         [](const auto& info) { return info.param; });

TEST(LocalGroupOptionsTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(NewLocalGroup({0, 0, "inproc://x"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewLocalGroup({3, 3, "inproc://x"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewLocalGroup({-1, 2, "inproc://x"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewLocalGroup({0, 2, ""}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewLocalGroup({0, 2, "bogus://x"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewLocalGroup({0, 2, "inproc://x", milliseconds(0)}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LocalGroupOptionsTest, GroupOfOneLeavesDataAlone) {
  StatusOr<std::unique_ptr<GroupReducer>> g = NewLocalGroup({0, 1, ""});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<float> f = {1.5f, -2.0f};
  ASSERT_TRUE((*g)->SumFloats(f.data(), 2).ok());
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ((*g)->SumFloats(nullptr, 1).code(), StatusCode::kInvalidArgument);
}

TEST(LocalGroupOptionsTest, OversizedCallIsInvalidArgument) {
  LocalGroupOptions options{0, 2, "inproc://onlineps-oversized"};
  options.max_message_bytes = 64;
  StatusOr<std::unique_ptr<GroupReducer>> g = NewLocalGroup(options);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<uint64_t> u(9);
  EXPECT_EQ((*g)->MinU64(u.data(), 9).code(), StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------------ forked children

// Runs each body in its own forked child, all at once; returns what each reported: ""
// (passed), "SKIP: why" or anything else (failed). A child that does not finish within
// `limit` is killed, so a hung collective fails the test instead of hanging it.
std::vector<std::string> InChildren(const std::vector<std::function<std::string()>>& bodies,
                                    milliseconds limit) {
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (const auto& body : bodies) {
    int p[2];
    if (pipe(p) != 0) return {"pipe failed"};
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      const std::string result = body();
      (void)!write(p[1], result.data(), result.size());
      _exit(0);
    }
    close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  std::vector<std::string> results(bodies.size());
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (size_t i = 0; i < pids.size(); ++i) {
    char buf[4096];
    pollfd pfd{fds[i], POLLIN, 0};
    while (true) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
        kill(pids[i], SIGKILL);
        results[i] = "child did not finish within " + std::to_string(limit.count()) + " ms";
        break;
      }
      const ssize_t n = read(fds[i], buf, sizeof(buf));
      if (n <= 0) break;
      results[i].append(buf, static_cast<size_t>(n));
    }
    close(fds[i]);
    int wstatus = 0;
    waitpid(pids[i], &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
      results[i] += " (child ended abnormally: status " + std::to_string(wstatus) + ")";
    }
  }
  return results;
}

// Skips the test if any child skipped; otherwise expects every child to have passed.
#define EXPECT_CHILDREN_PASSED(results)                                           \
  do {                                                                            \
    const std::vector<std::string> _r = (results);                                \
    for (const std::string& r : _r) {                                             \
      if (r.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << r.substr(6);                 \
    }                                                                             \
    for (size_t i = 0; i < _r.size(); ++i) EXPECT_EQ(_r[i], "") << "child " << i; \
  } while (0)

TEST(LocalGroupProcessTest, ThreeProcessesOverIpc) {
  const ScratchDir scratch;
  const std::string endpoint = NewEndpoint("ipc", scratch);
  auto member = [&](int rank) {
    return [endpoint, rank]() -> std::string {
      StatusOr<std::unique_ptr<GroupReducer>> g =
          NewLocalGroup({rank, 3, endpoint, milliseconds(10000)});
      if (!g.ok()) return g.status().ToString();
      for (int round = 0; round < 40; ++round) {
        std::string error = CheckRound(**g, round);
        if (!error.empty()) return error;
      }
      return "";
    };
  };
  EXPECT_CHILDREN_PASSED(InChildren({member(0), member(1), member(2)}, milliseconds(60000)));
}

#if ONLINEPS_HAVE_NCCL

NcclGroupOptions Nccl(int rank, int size, int device = 0, std::string id_file = "",
                      milliseconds timeout = milliseconds(60000)) {
  NcclGroupOptions options{rank, size, device, std::move(id_file)};
  options.timeout = timeout;
  return options;
}

// The bodies below run in forked children (see InChildren).

// "" if at least `devices` CUDA devices are visible, else "SKIP: why".
std::string NeedDevices(int devices) {
  StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return "SKIP: " + count.status().message();
  if (*count >= devices) return "";
  return "SKIP: needs " + std::to_string(devices) + " CUDA devices (one NCCL rank per device), " +
         "found " + std::to_string(*count);
}

std::string NcclRounds(const NcclGroupOptions& options, int rounds) {
  StatusOr<std::unique_ptr<GroupReducer>> g = NewNcclGroup(options);
  if (!g.ok()) return "NewNcclGroup: " + g.status().ToString();
  for (int round = 0; round < rounds; ++round) {
    std::string error = CheckRound(**g, round);
    if (!error.empty()) return error;
  }
  return "";
}

std::string NoDeviceIsUnavailable() {
  StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) return "SKIP: " + std::to_string(*count) + " CUDA device(s) present";
  StatusOr<std::unique_ptr<GroupReducer>> g = NewNcclGroup(Nccl(0, 1));
  if (g.status().code() != StatusCode::kUnavailable ||
      g.status().message().find("no CUDA device") == std::string::npos) {
    return "expected UNAVAILABLE 'no CUDA device', got " + g.status().ToString();
  }
  return "";
}

std::string GroupOfOne() {
  std::string need = NeedDevices(1);
  if (!need.empty()) return need;
  const int count = *CudaDeviceCount();
  StatusOr<std::unique_ptr<GroupReducer>> bad = NewNcclGroup(Nccl(0, 1, count));
  if (bad.status().code() != StatusCode::kInvalidArgument) {
    return "device " + std::to_string(count) + ": " + bad.status().ToString();
  }
  return NcclRounds(Nccl(0, 1, 0, "", milliseconds(30000)), 30);  // n grows, 0 on the way
}

// NewNcclGroup(options) must fail with kDeadlineExceeded, and leave no id file.
std::string TimesOut(const NcclGroupOptions& options) {
  std::string need = NeedDevices(1);
  if (!need.empty()) return need;
  StatusOr<std::unique_ptr<GroupReducer>> g = NewNcclGroup(options);
  if (g.status().code() != StatusCode::kDeadlineExceeded) return g.status().ToString();
  if (access(options.id_file.c_str(), F_OK) == 0) return "left " + options.id_file + " behind";
  return "";
}

TEST(NcclGroupTest, BadOptionsAreInvalidArgument) {  // checked before CUDA is touched
  EXPECT_EQ(NewNcclGroup(Nccl(0, 0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewNcclGroup(Nccl(2, 2)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewNcclGroup(Nccl(0, 1, -1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NewNcclGroup(Nccl(0, 2, 0, "")).status().code(), StatusCode::kInvalidArgument);
}

TEST(NcclGroupTest, NoDeviceIsUnavailable) {
  EXPECT_CHILDREN_PASSED(InChildren({NoDeviceIsUnavailable}, milliseconds(60000)));
}

TEST(NcclGroupTest, GroupOfOneGoesThroughTheDevice) {
  EXPECT_CHILDREN_PASSED(InChildren({GroupOfOne}, milliseconds(120000)));
}

TEST(NcclGroupTest, TwoProcessesOnTwoDevices) {
  const std::string need = InChildren({[] { return NeedDevices(2); }}, milliseconds(60000))[0];
  if (!need.empty()) GTEST_SKIP() << need.substr(need.rfind("SKIP: ", 0) == 0 ? 6 : 0);
  const ScratchDir scratch;
  const std::string id_file = scratch.File("nccl-id");
  auto member = [&](int rank) {
    return [=] { return NcclRounds(Nccl(rank, 2, rank, id_file, milliseconds(60000)), 30); };
  };
  EXPECT_CHILDREN_PASSED(InChildren({member(0), member(1)}, milliseconds(180000)));
  EXPECT_NE(access(id_file.c_str(), F_OK), 0) << "rank 0 left " << id_file << " behind";
}

TEST(NcclGroupTest, MemberWithoutIdFileTimesOut) {
  const ScratchDir scratch;
  const NcclGroupOptions options = Nccl(1, 2, 0, scratch.File("nccl-id"), milliseconds(300));
  EXPECT_CHILDREN_PASSED(InChildren({[=] { return TimesOut(options); }}, milliseconds(60000)));
}

TEST(NcclGroupTest, LeaderWithoutMembersTimesOut) {
  const ScratchDir scratch;
  const NcclGroupOptions options = Nccl(0, 2, 0, scratch.File("nccl-id"), milliseconds(2000));
  EXPECT_CHILDREN_PASSED(InChildren({[=] { return TimesOut(options); }}, milliseconds(60000)));
}

#endif  // ONLINEPS_HAVE_NCCL

}  // namespace
}  // namespace onlineps::worker

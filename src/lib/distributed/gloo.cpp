// The process group of asap/dist.h on c10d's ProcessGroupGloo and TCPStore
// (LibTorch's own; Debian's libtorch_cpu has Gloo built in). The only file
// that includes the c10d headers.
//
// Faults: every rank runs a watcher thread that beats a counter in the store
// twice a second and reads the others'. A rank that reports a failure, or
// whose counter stops for `stale` seconds, ends every other rank with one
// sentence naming it; a lost store means its host stopped.
#include <ATen/ATen.h>
// ProcessGroupGloo.hpp declares the class only when LibTorch was built with
// Gloo, which Debian's was (libtorch_cpu exports it); its headers come from
// libgloo-dev.
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include "asap/dist.h"
#include "asap/error.h"

namespace asap {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string string_of(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

std::atomic<Communicator*> g_active{nullptr};

[[noreturn]] void stop_process(const std::string& sentence) {
  std::cerr << "asapc: error: " << sentence << std::endl;
  std::fflush(nullptr);
  std::_Exit(kExitOtherRankFailed);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const DistEnv& env, double timeout_s) : env_(env), timeout_s_(timeout_s) {
    // Gloo sends with writev, without MSG_NOSIGNAL: once a peer has closed
    // its sockets (a rank that stopped), the next write raises SIGPIPE, whose
    // default action ends this process at once with no sentence. (Python,
    // where torch.distributed usually runs, ignores SIGPIPE.) Ignored, the
    // write fails with EPIPE, Gloo throws, and collective() waits for the
    // watcher to name the rank that stopped.
    std::signal(SIGPIPE, SIG_IGN);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.port);
    so.isServer = !env.agent_store && env.rank == 0;
    so.numWorkers = env.agent_store ? c10::nullopt : c10::optional<std::size_t>(env.world_size);
    // Rank 0 does not block in the store's constructor: the ranks check in
    // below, so that a rank that never arrives can be named.
    so.waitWorkers = false;
    so.timeout = timeout;
    const std::string where = str(env.host, ":", env.port);
    try {
      c10::intrusive_ptr<c10d::Store> base = c10::make_intrusive<c10d::TCPStore>(env.host, so);
      store_ = base;
      if (env.agent_store) store_ = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, base);
      check_in(timeout, where);
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      opts->devices.push_back(ifname && *ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                                : c10d::ProcessGroupGloo::createDefaultDevice());
      opts->threads = 2;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, env.rank, env.world_size, opts);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(str("rank ", env.rank, " of ", env.world_size, " could not join the process group at ", where,
                      " (from ", env.source, ") within ", timeout_s, " s: ", first_line(e.what())));
    }
    stale_s_ = std::max(3.0, std::min(15.0, timeout_s / 2));
    if (const char* v = std::getenv("ASAP_DIST_VERBOSE"); v && *v == '1')
      std::cerr << "asapc: rank " << env.rank << " of " << env.world_size << " joined the group at " << where << " ("
                << env.source << ")" << std::endl;
    watcher_ = std::thread([this] { watch(); });
    g_active = this;
  }

  ~GlooCommunicator() override {
    if (g_active == this) g_active = nullptr;
    stop_watcher();
  }

  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }

  void allreduce_sum(std::vector<double>& v) override {
    if (v.empty()) return;
    collective("sum", static_cast<int64_t>(v.size() * sizeof(double)), [&] {
      std::vector<at::Tensor> t{at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kDouble)};
      pg_->allreduce(t)->wait();
    });
  }

  void broadcast(std::vector<double>& v, int root) override {
    if (v.empty()) return;
    collective("broadcast", static_cast<int64_t>(v.size() * sizeof(double)), [&] {
      std::vector<at::Tensor> t{at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kDouble)};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      pg_->broadcast(t, o)->wait();
    });
  }

  std::vector<std::string> allgather(const std::string& s) override {
    const int W = env_.world_size;
    std::vector<double> len(static_cast<size_t>(W), 0.0);
    len[static_cast<size_t>(env_.rank)] = static_cast<double>(s.size());
    allreduce_sum(len);
    const size_t L = static_cast<size_t>(*std::max_element(len.begin(), len.end()));
    std::vector<double> buf(static_cast<size_t>(W) * L, 0.0);
    for (size_t i = 0; i < s.size(); ++i)
      buf[static_cast<size_t>(env_.rank) * L + i] = static_cast<unsigned char>(s[i]);
    allreduce_sum(buf);
    std::vector<std::string> out;
    for (int r = 0; r < W; ++r) {
      std::string x;
      for (size_t i = 0; i < static_cast<size_t>(len[static_cast<size_t>(r)]); ++i)
        x.push_back(static_cast<char>(static_cast<unsigned char>(buf[static_cast<size_t>(r) * L + i])));
      out.push_back(x);
    }
    return out;
  }

  void barrier() override {
    collective("barrier", 0, [&] { pg_->barrier()->wait(); });
  }

  int64_t add_counter(const std::string& key, int64_t delta) override {
    try {
      return store_->add("asapc/count/" + key, delta);
    } catch (const std::exception&) {
      stop_process(lost_store());
    }
  }

  void report_failure(const std::string& message) override {
    failing_ = true;  // this process reports its own error; its watcher stays quiet
    try {
      report_failure_text(str("rank ", env_.rank, " stopped: ", message));
    } catch (const std::exception&) {
      // The store is gone as well: the watchers of the others see that.
    }
  }

  Stats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

  // End of a successful run: no rank is declared lost while the others exit.
  void finish() {
    barrier();
    stop_watcher();
    store_->set(str("asapc/done/", env_.rank), bytes_of("1"));
    barrier();
  }

 private:
  static std::string first_line(const std::string& s) {
    auto p = s.find('\n');
    return p == std::string::npos ? s : s.substr(0, p);
  }

  template <class F>
  void collective(const char* what, int64_t bytes, F&& f) {
    const auto t0 = Clock::now();
    try {
      f();
    } catch (const std::exception& e) {
      probe_lost_ranks();
      // Give the watcher time to name the rank that stopped (it ends the process).
      std::unique_lock<std::mutex> lock(wait_mu_);
      wait_cv_.wait_for(lock, std::chrono::duration<double>(stale_s_ + 3), [&] { return stopped_.load(); });
      throw Error(str("rank ", env_.rank, ": a ", what, " across the ", env_.world_size, " ranks failed (within the ",
                      timeout_s_, " s of --dist-timeout, a rank did not take part): ", first_line(e.what())));
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.comm_seconds += since(t0);
    stats_.bytes_reduced += bytes;
    stats_.collectives += 1;
  }

  // After a failed collective: ranks whose heartbeat does not move for three
  // beats are gone; name them at once rather than after `stale` seconds.
  void probe_lost_ranks() {
    try {
      const int W = env_.world_size;
      std::vector<int64_t> before(static_cast<size_t>(W));
      for (int r = 0; r < W; ++r) before[static_cast<size_t>(r)] = store_->add(str("asapc/hb/", r), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1600));
      std::string lost;
      for (int r = 0; r < W; ++r)
        if (r != env_.rank && store_->add(str("asapc/hb/", r), 0) == before[static_cast<size_t>(r)] &&
            !store_->check({str("asapc/done/", r)}))
          lost += (lost.empty() ? "" : ", ") + std::to_string(r);
      if (lost.empty()) return;
      if (store_->add("asapc/failed", 0) > 0 && store_->check({"asapc/failure"}))
        stop_process(linger(string_of(store_->get("asapc/failure"))));
      const std::string msg = str(lost.find(',') == std::string::npos ? "rank " : "ranks ", lost,
                                  " stopped during a collective (no heartbeat): killed, crashed, or unreachable");
      report_failure_text(msg);
      stop_process(msg);
    } catch (const std::exception&) {
      // The store is gone too: the watcher reports its host.
    }
  }

  // Sets the failure for every watcher. The store's host then stays up for
  // a few beats, so that the others read the cause rather than a lost store.
  void report_failure_text(const std::string& msg) {
    store_->set("asapc/failure", bytes_of(msg));
    store_->add("asapc/failed", 1);
    if (!env_.agent_store && env_.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  }

  std::string lost_store() const {
    const std::string host = env_.agent_store ? str("torchrun's agent at ", env_.host, ":", env_.port)
                                              : str("rank 0 at ", env_.host, ":", env_.port);
    return str("rank ", env_.rank, " lost the rendezvous store hosted by ", host,
               ", so that process stopped (killed, crashed, or unreachable)");
  }

  // The store's host stays up for a few beats before stopping (as above).
  std::string linger(std::string msg) {
    if (!env_.agent_store && env_.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    return msg;
  }

  void stop_watcher() {
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      stopped_ = true;
    }
    wait_cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  void watch() {
    const int W = env_.world_size;
    std::vector<int64_t> last(static_cast<size_t>(W), 0);
    std::vector<Clock::time_point> changed(static_cast<size_t>(W), Clock::now());
    while (true) {
      {
        std::unique_lock<std::mutex> lock(wait_mu_);
        if (wait_cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stopped_.load(); })) return;
      }
      try {
        if (failing_) return;
        store_->add(str("asapc/hb/", env_.rank), 1);
        if (store_->add("asapc/failed", 0) > 0 && store_->check({"asapc/failure"}))
          stop_process(linger(string_of(store_->get("asapc/failure"))));
        for (int r = 0; r < W; ++r) {
          if (r == env_.rank) continue;
          const int64_t v = store_->add(str("asapc/hb/", r), 0);
          const auto now = Clock::now();
          if (v != last[static_cast<size_t>(r)]) {
            last[static_cast<size_t>(r)] = v;
            changed[static_cast<size_t>(r)] = now;
          } else if (v > 0 && std::chrono::duration<double>(now - changed[static_cast<size_t>(r)]).count() > stale_s_ &&
                     !store_->check({str("asapc/done/", r)})) {
            const std::string msg = str("rank ", r, " stopped responding (no heartbeat for ", stale_s_,
                                        " s): it was killed, crashed, or its machine is unreachable");
            report_failure_text(msg);
            stop_process(msg);
          }
        }
      } catch (const std::exception& e) {
        if (stopped_) return;
        stop_process(lost_store());
      }
    }
  }

  DistEnv env_;
  double timeout_s_ = 300, stale_s_ = 15;

  // Every rank sets its key and waits for all of them; on a timeout the
  // sentence names the ranks that never arrived.
  void check_in(std::chrono::milliseconds timeout, const std::string& where) {
    const int W = env_.world_size;
    std::vector<std::string> keys;
    for (int r = 0; r < W; ++r) keys.push_back(str("asap/joined/", r));
    store_->set(keys[static_cast<size_t>(env_.rank)], std::vector<uint8_t>{1});
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception&) {
      std::string missing;
      int count = 0;
      for (int r = 0; r < W; ++r) {
        bool there = false;
        try {
          there = store_->check({keys[static_cast<size_t>(r)]});
        } catch (const std::exception&) {
        }
        if (!there) missing += (count++ ? ", " : "") + std::to_string(r);
      }
      if (count == 0) throw;
      throw Error(str("rank ", env_.rank, " of ", W, ": ", count == 1 ? "rank " : "ranks ", missing,
                      " did not join the process group at ", where, " (from ", env_.source, ") within ", timeout_s_,
                      " s of --dist-timeout: not started, stopped before joining, or ", "unable to reach ", where));
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::thread watcher_;
  std::atomic<bool> stopped_{false}, failing_{false};
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  mutable std::mutex stats_mu_;
  Stats stats_;
};

}  // namespace

std::shared_ptr<Communicator> join_process_group(const DistEnv& env, double timeout_s) {
  if (!env.distributed()) return nullptr;
  ASAP_CHECK(timeout_s > 0 && timeout_s <= kMaxDistTimeoutS,
             "--dist-timeout must be a number of seconds > 0 and at most 604800 (one week), found ", timeout_s);
  return std::make_shared<GlooCommunicator>(env, timeout_s);
}

Communicator* active_communicator() { return g_active.load(); }

void finish_process_group(Communicator* comm) {
  if (auto* g = dynamic_cast<GlooCommunicator*>(comm)) g->finish();
}

}  // namespace asap

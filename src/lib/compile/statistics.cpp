// Compile phase "statistics": one pass over the calibration examples giving
// the per-head LS sufficient statistics on the train / held-out split.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "asap/error.h"
#include "asap/runtime.h"
#include "compile/phases.h"
#include "fast/fast.h"
#include "io/layer_stream.h"

namespace asap {
namespace compile_detail {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

namespace {

// Sums the statistics over ranks: one float64 vector per reduction.
void reduce_statistics(Communicator* comm, Statistics& st, int64_t H, int64_t P) {
  if (!comm) return;
  auto zero_if_empty = [&](LsStats& s) {
    if (!s.empty()) return;
    s.G = at::zeros({H, P, P}, at::kDouble);
    s.h = at::zeros({H, P}, at::kDouble);
    s.c = at::zeros({H}, at::kDouble);
    s.R = at::zeros({H}, at::kDouble);
  };
  std::vector<LsStats*> all{&st.train, &st.held};
  for (auto& m : st.matched) all.push_back(&m.train), all.push_back(&m.held);
  std::vector<at::Tensor> parts;
  for (LsStats* x : all) {
    zero_if_empty(*x);
    for (const at::Tensor& t : {x->G, x->h, x->c, x->R}) parts.push_back(t);
  }
  std::vector<double> v;
  for (const auto& t : parts) {
    auto c = t.contiguous();
    v.insert(v.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  for (LsStats* x : all) v.push_back(static_cast<double>(x->examples));
  v.push_back(static_cast<double>(st.n_held));
  comm->allreduce_sum(v);
  size_t o = 0;
  for (auto& t : parts) {
    auto src = at::from_blob(v.data() + o, t.sizes(), at::kDouble);
    t.copy_(src);
    o += static_cast<size_t>(t.numel());
  }
  for (LsStats* x : all) {
    x->examples = static_cast<int64_t>(v[o++]);
    if (x->examples == 0) *x = LsStats();
  }
  st.n_held = static_cast<int64_t>(v[o]);
}

}  // namespace

StatisticsOptions statistics_options(const CompileOptions& opt) {
  StatisticsOptions o;
  o.batch_size = opt.batch_size;
  o.heldout_fraction = opt.heldout_fraction;
  o.seed = opt.seed;
  o.skip_bad_examples = opt.skip_bad_examples;
  o.comm = opt.comm.get();
  o.progress = opt.progress;
  return o;
}

std::vector<int> matched_closures(const LayerSpec& s, int max_closures, Targets targets) {
  std::vector<int> ks;
  if (targets == Targets::kClosureReady) return ks;
  for (int k = 2; k <= max_closures && s.T - k >= 1; ++k)
    if ((s.T - k) % 2 == 1) ks.push_back(k);
  return ks;
}

Statistics gather_statistics(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
                             const FeatureFamily& widest, const StatisticsOptions& opt,
                             const std::vector<int>& matched_k, PhaseTimes& times) {
  Statistics st;
  for (int k : matched_k) st.matched.push_back({k, LsStats(), LsStats()});
  // Test hook: a pause per batch, so that a test can stop a rank mid-compile.
  const char* delay = std::getenv("ASAP_TEST_BATCH_DELAY_MS");
  const int delay_ms = delay ? std::atoi(delay) : 0;
  for (int64_t start = sh.begin; start < sh.end; start += opt.batch_size) {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    const int64_t count = std::min(opt.batch_size, sh.end - start);
    auto t = Clock::now();
    auto b = stream.read(start, count);
    times.read += since(t);
    t = Clock::now();
    auto teacher = run_teacher(b.q, b.k, at::Tensor(), b.mask, s.score_scale, s.T, convention_of(s), false);
    times.teacher += since(t);
    t = Clock::now();
    auto m = log_marginals(b.mask, count, b.q.size(2), s.mask == MaskConvention::kDropQueries, b.q.scalar_type(),
                           b.q.device());
    auto Psi = fast::build_features(b.q, b.k, b.mask, s.mask == MaskConvention::kDropQueries, theta, widest,
                                    s.score_scale, s.eps);
    times.features += since(t);
    t = Clock::now();
    // Examples whose scores overflow give non-finite duals or features on rows
    // that carry mass; one of them would spoil every statistic.
    auto finite =
        at::where(m.row_active, teacher.phi_bar_star, at::zeros({}, teacher.phi_bar_star.options()))
            .isfinite()
            .all(-1)
            .all(-1)
            .logical_and(
                at::where(m.row_active.unsqueeze(-1), Psi, at::zeros({}, Psi.options())).isfinite().flatten(1).all(-1));
    auto fin = finite.accessor<bool, 1>();
    std::vector<int64_t> tr, he;
    for (int64_t e = 0; e < count; ++e) {
      if (!fin[e]) {
        const double amax =
            (b.x.defined() ? b.x[e] : at::cat({b.q[e].flatten(), b.k[e].flatten()})).abs().max().item<double>();
        ASAP_CHECK(opt.skip_bad_examples, "calibration file '", stream.calib_path(), "': layer '", s.name, "' example ",
                   start + e, " has activations up to ", amax,
                   ", which make its attention scores overflow (the teacher's "
                   "dual or the features are not finite); drop or fix the example, or pass --skip-bad-examples to "
                   "exclude such examples with a warning");
        st.excluded.push_back(start + e);
        continue;
      }
      (in_heldout_split(opt.seed, opt.heldout_fraction, start + e) ? he : tr).push_back(e);
    }
    auto add = [&](LsStats& acc, const std::vector<int64_t>& idx, const at::Tensor& target) {
      if (idx.empty()) return;
      auto ix = at::tensor(idx, at::kLong);
      accumulate_ls(acc, Psi.index_select(0, ix), target.index_select(0, ix), m.row_active.index_select(0, ix));
    };
    add(st.train, tr, teacher.phi_bar_star);
    add(st.held, he, teacher.phi_bar_star);
    // k-matched targets: the closure-ready dual of the loop cut to T - k + 1 half-steps, i.e. f^(T-k).
    for (auto& mt : st.matched) {
      auto cut = run_teacher(b.q, b.k, at::Tensor(), b.mask, s.score_scale, s.T - mt.k + 1, convention_of(s), false);
      add(mt.train, tr, cut.phi_bar_star);
      add(mt.held, he, cut.phi_bar_star);
    }
    st.n_held += static_cast<int64_t>(he.size());
    times.statistics += since(t);
    if (opt.progress) opt.progress({s.name, "statistics", start + count - sh.begin, sh.total});
  }
  const auto t = Clock::now();
  reduce_statistics(opt.comm, st, s.heads, widest.num_columns());
  if (opt.comm) {  // every rank's excluded examples, in rank (= index) order
    std::string mine;
    for (int64_t e : st.excluded) mine += std::to_string(e) + " ";
    st.excluded.clear();
    for (const auto& part : opt.comm->allgather(mine)) {
      size_t pos = 0;
      while (pos < part.size()) {
        size_t next = part.find(' ', pos);
        st.excluded.push_back(std::stoll(part.substr(pos, next - pos)));
        pos = next + 1;
      }
    }
    std::sort(st.excluded.begin(), st.excluded.end());
  }
  times.communication += since(t);
  // The split depends on the example index and the seed alone.
  for (int64_t e = 0; e < sh.total; ++e)
    if (in_heldout_split(opt.seed, opt.heldout_fraction, e) && st.usable(e)) st.held_idx.push_back(e);
  return st;
}

}  // namespace compile_detail
}  // namespace asap

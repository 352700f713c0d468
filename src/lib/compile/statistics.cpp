// Compile phase "statistics": one pass over the calibration examples giving
// the per-head LS sufficient statistics on the train / held-out split.
#include <ATen/ATen.h>

#include <chrono>

#include "asap/error.h"
#include "asap/fast.h"
#include "asap/runtime.h"
#include "compile/phases.h"
#include "io/layer_stream.h"

namespace asap {
namespace compile_detail {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

nlohmann::json PhaseTimes::to_json() const {
  return {{"read", read},   {"teacher", teacher},     {"features", features}, {"statistics", statistics},
          {"solve", solve}, {"selection", selection}, {"latency", latency}};
}

Statistics gather_statistics(const LayerStream& stream, const LayerSpec& s, const at::Tensor& theta,
                             const FeatureFamily& widest, const CompileOptions& opt, PhaseTimes& times) {
  Statistics st;
  const int64_t N = stream.num_examples();
  for (int64_t start = 0; start < N; start += opt.batch_size) {
    const int64_t count = std::min(opt.batch_size, N - start);
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
    std::vector<int64_t> tr, he;
    for (int64_t e = 0; e < count; ++e)
      (in_heldout_split(opt.seed, opt.heldout_fraction, start + e) ? he : tr).push_back(e);
    auto add = [&](LsStats& acc, const std::vector<int64_t>& idx) {
      if (idx.empty()) return;
      auto ix = at::tensor(idx, at::kLong);
      accumulate_ls(acc, Psi.index_select(0, ix), teacher.phi_bar_star.index_select(0, ix),
                    m.row_active.index_select(0, ix));
    };
    add(st.train, tr);
    add(st.held, he);
    st.n_held += static_cast<int64_t>(he.size());
    for (int64_t e : he) st.held_idx.push_back(start + e);
    times.statistics += since(t);
    if (opt.progress) opt.progress({s.name, "statistics", start + count, N});
  }
  return st;
}

}  // namespace compile_detail
}  // namespace asap

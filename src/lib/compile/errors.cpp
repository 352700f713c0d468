// Compile phase "errors": held-out attention error of every candidate
// operator against the teacher, on the fused kernels.
#include <ATen/ATen.h>

#include "asap/error.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "compile/phases.h"
#include "fast/fast.h"
#include "io/layer_stream.h"

namespace asap {
namespace compile_detail {

namespace {

// Sum over (b, h) of ||A - A*||_F / ||A*||_F for plain softmax attention
// (Sinkhorn T' = 1), which no closure count expresses. Forms [b, H, n, n]
// tensors, one example at a time when a batch's would be large.
double softmax_error_sum(const HeadBatch& b, const LayerSpec& s, const Convention& conv) {
  const int64_t B = b.q.size(0), n = b.q.size(2);
  const int64_t step = B * s.heads * n * n > (int64_t(1) << 25) ? 1 : B;
  double sum = 0;
  for (int64_t e = 0; e < B; e += step) {
    const int64_t c = std::min(step, B - e);
    auto q = b.q.narrow(0, e, c), k = b.k.narrow(0, e, c);
    auto mask = b.mask.defined() ? b.mask.narrow(0, e, c) : at::Tensor();
    auto A = run_teacher(q, k, at::Tensor(), mask, s.score_scale, 1, conv, true).A.to(at::kDouble);
    auto As = run_teacher(q, k, at::Tensor(), mask, s.score_scale, s.T, conv, true).A.to(at::kDouble);
    auto rel = (A - As).pow(2).sum(at::IntArrayRef{-2, -1}).sqrt() / As.pow(2).sum(at::IntArrayRef{-2, -1}).sqrt();
    sum += rel.sum().item<double>();
  }
  return sum;
}

}  // namespace

ErrorOptions error_options(const CompileOptions& opt) {
  ErrorOptions o;
  o.batch_size = opt.batch_size;
  o.selection_examples = opt.selection_examples;
  o.comm = opt.comm.get();
  o.progress = opt.progress;
  return o;
}

HeldoutErrors heldout_errors(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
                             const FeatureFamily& widest, const std::vector<int64_t>& held_idx, std::vector<Fit>& fits,
                             const std::vector<int>& k_eval, const ErrorOptions& opt) {
  ASAP_CHECK(k_eval.size() == fits.size(), "heldout_errors: one k per fit expected");
  HeldoutErrors out;
  const Convention conv = convention_of(s);
  std::vector<int64_t> sel = held_idx;
  if (opt.selection_examples > 0 && static_cast<int64_t>(sel.size()) > opt.selection_examples)
    sel.resize(static_cast<size_t>(opt.selection_examples));
  const std::vector<int64_t> mine = sh.mine(sel);
  // Sinkhorn T' >= 2 is the teacher's loop from f1 = row(0): the closures
  // from the (centered) softmax dual, k = T' - 1.
  const int k_sink = s.T - 2;
  std::vector<int> kc = k_eval;
  if (k_sink >= 1) kc.push_back(k_sink);
  const int kmax = kc.empty() ? 0 : *std::max_element(kc.begin(), kc.end());
  std::vector<std::vector<double>> sums(kc.size(), std::vector<double>(static_cast<size_t>(kmax), 0.0));
  double softmax_sum = 0;
  int64_t terms = 0, done = 0;
  FeatureFamily softmax_only;
  softmax_only.softmax_dual = true;
  for (size_t i = 0; i < mine.size(); i += static_cast<size_t>(opt.batch_size)) {
    std::vector<int64_t> idx(
        mine.begin() + static_cast<std::ptrdiff_t>(i),
        mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), i + static_cast<size_t>(opt.batch_size))));
    auto b = stream.read_indices(idx);
    const int64_t B = b.q.size(0);
    if (kmax > 0) {
      auto Psi = fast::build_features(b.q, b.k, b.mask, conv.drop_padded_queries, theta, widest, s.score_scale, s.eps);
      std::vector<at::Tensor> phis;
      for (const auto& f : fits)
        phis.push_back(predict_phi(Psi.index_select(3, at::tensor(f.cols, at::kLong)), f.coef));
      if (k_sink >= 1)
        phis.push_back(
            fast::build_features(b.q, b.k, b.mask, conv.drop_padded_queries, theta, softmax_only, s.score_scale, s.eps)
                .select(3, 0));
      // ||A - A*||_F / ||A*||_F per (candidate, k, example, head), no [B, H, n, n] tensor.
      auto err = fast::closure_errors(b.q, b.k, b.mask, s.score_scale, s.T, conv, at::stack(phis), kc)
                     .sum(at::IntArrayRef{2, 3});
      auto acc = err.accessor<double, 2>();
      for (size_t c = 0; c < kc.size(); ++c)
        for (int k = 0; k < kc[c]; ++k) sums[c][static_cast<size_t>(k)] += acc[static_cast<int64_t>(c)][k];
    }
    softmax_sum += softmax_error_sum(b, s, conv);
    terms += B * s.heads;
    done += B;
    if (opt.progress) opt.progress({s.name, "selection", done, static_cast<int64_t>(sel.size())});
  }
  if (opt.comm) {  // one reduction: every (candidate, k) sum, the softmax sum, the terms
    std::vector<double> v;
    for (const auto& row : sums) v.insert(v.end(), row.begin(), row.end());
    v.push_back(softmax_sum);
    v.push_back(static_cast<double>(terms));
    opt.comm->allreduce_sum(v);
    size_t o = 0;
    for (auto& row : sums)
      for (auto& x : row) x = v[o++];
    softmax_sum = v[o];
    terms = static_cast<int64_t>(v[o + 1]);
  }
  const double t = static_cast<double>(std::max<int64_t>(terms, 1));
  for (size_t c = 0; c < fits.size(); ++c) {
    fits[c].error_by_k.clear();
    for (int k = 0; k < kc[c]; ++k) fits[c].error_by_k.push_back(sums[c][static_cast<size_t>(k)] / t);
  }
  out.sinkhorn.push_back(softmax_sum / t);
  if (k_sink >= 1)
    for (int k = 0; k < k_sink; ++k) out.sinkhorn.push_back(sums.back()[static_cast<size_t>(k)] / t);
  out.examples = static_cast<int64_t>(sel.size());
  return out;
}

}  // namespace compile_detail
}  // namespace asap

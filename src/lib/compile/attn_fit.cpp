#include "compile/attn_fit.h"

#include <ATen/ATen.h>

#include <cmath>
#include <deque>
#include <limits>

#include "asap/dist.h"
#include "asap/error.h"
#include "asap/features.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "compile/cached_split.h"
#include "io/layer_stream.h"

namespace asap {

using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The two closures in score coordinates (units of eps): a row closure
// u = log a - LSE_j(S' + v) (rows without mass stay -inf) and a column
// closure v = log b - LSE_i(S' + u). L receives the log-sum-exp itself.
at::Tensor row_closure_lse(const AttnBatch& b, const at::Tensor& v, at::Tensor* L) {
  auto l = at::logsumexp(b.S + v.unsqueeze(-2), {-1});
  if (L) *L = l;
  return at::where(b.row_active, b.log_a - l, at::full({}, -kInf, l.options()));
}
at::Tensor col_closure_lse(const AttnBatch& b, const at::Tensor& u, at::Tensor* L) {
  auto l = at::logsumexp(b.S + u.unsqueeze(-1), {-2});
  if (L) *L = l;
  return b.log_b - l;
}

}  // namespace

int64_t AttnBatch::bytes() const {
  return static_cast<int64_t>(
      (Psi.numel() + alpha.numel() + S.numel() + log_a.numel() + log_b.numel() + Pstar.numel() + D.numel()) * 8 +
      row_active.numel());
}

AttnBatch make_attn_batch(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& mask, const at::Tensor& Psi,
                          double scale, double eps, int T, bool drop_padded_queries) {
  auto q = q_in.to(at::kDouble), k = k_in.to(at::kDouble);
  const int64_t B = q.size(0), n = q.size(2);
  auto m = log_marginals(mask, B, n, drop_padded_queries, at::kDouble, q.device());
  AttnBatch b;
  b.row_active = m.row_active;
  b.log_a = m.log_a;
  b.log_b = m.log_b;
  const auto rows = m.row_active.unsqueeze(-1);  // [B, 1, n, 1]
  b.S = (scores(q, k, scale) / eps).masked_fill(rows.logical_not(), -kInf);
  b.alpha = (cost_alpha(q, scale) / eps).masked_fill(m.row_active.logical_not(), 0.0);
  b.Psi = Psi.to(at::kDouble).masked_fill(rows.logical_not(), 0.0).contiguous();
  // The teacher's loop from g' = 0 on the active keys, T half-steps, row first.
  auto v = at::zeros_like(b.alpha).masked_fill(m.key_active.logical_not(), -kInf);
  at::Tensor u;
  for (int t = 1; t <= T; ++t) {
    if (t % 2 == 1)
      u = row_closure_lse(b, v, nullptr);
    else
      v = col_closure_lse(b, u, nullptr);
  }
  b.Pstar = at::exp(b.S + u.unsqueeze(-1) + v.unsqueeze(-2));
  b.D = b.Pstar.pow(2).sum(at::IntArrayRef{-2, -1});
  return b;
}

double attn_loss(const AttnBatch& b, const at::Tensor& coef, double eps, int k, at::Tensor* grad) {
  ASAP_CHECK(k >= 1, "attention refit: number of closures must be at least 1, found ", k);
  const int64_t H = b.Psi.size(1), P = b.Psi.size(3);
  ASAP_CHECK(coef.dim() == 2 && coef.size(1) == P && (coef.size(0) == 1 || coef.size(0) == H),
             "attention refit: coefficients ", coef.sizes(), " do not fit ", P, " columns and ", H, " heads");
  const auto c = coef.to(at::kDouble).view({1, coef.size(0), 1, P});
  auto phi = (b.Psi * c).sum(-1);  // [B, H, n]
  std::vector<at::Tensor> us(static_cast<size_t>(k) + 1), vs(static_cast<size_t>(k) + 1),
      Ls(static_cast<size_t>(k) + 1);
  us[0] = at::where(b.row_active, phi / eps - b.alpha, at::full({}, -kInf, phi.options()));
  for (int t = 1; t <= k; ++t) {
    if (t % 2 == 1)
      vs[t] = col_closure_lse(b, us[t - 1], &Ls[t]);
    else
      us[t] = row_closure_lse(b, vs[t - 1], &Ls[t]);
  }
  const int iu = k % 2 == 1 ? k - 1 : k, iv = k % 2 == 1 ? k : k - 1;
  auto Pm = at::exp(b.S + us[iu].unsqueeze(-1) + vs[iv].unsqueeze(-2));
  auto diff = Pm - b.Pstar;
  auto Dn = b.D.clamp_min(1e-300);
  const double loss = ((diff.pow(2).sum(at::IntArrayRef{-2, -1})) / Dn).sum().item<double>();
  if (!grad) return loss;
  // Backward through the plan and the closures (docs/fitting.md).
  auto G = 2.0 * diff * Pm / Dn.unsqueeze(-1).unsqueeze(-1);
  std::vector<at::Tensor> ub(static_cast<size_t>(k) + 1), vb(static_cast<size_t>(k) + 1);
  ub[iu] = G.sum(-1);
  vb[iv] = G.sum(-2);
  for (int t = k; t >= 1; --t) {
    if (t % 2 == 1) {  // v_t = log b - LSE_i(S' + u_{t-1}): dv_j/du_i = -softmax_i
      if (!vb[t].defined()) continue;
      auto Q = at::exp(b.S + us[t - 1].unsqueeze(-1) - Ls[t].unsqueeze(-2));
      auto add = -(Q * vb[t].unsqueeze(-2)).sum(-1);
      ub[t - 1] = ub[t - 1].defined() ? ub[t - 1] + add : add;
    } else {  // u_t = log a - LSE_j(S' + v_{t-1}) on rows with mass
      if (!ub[t].defined()) continue;
      auto L = at::where(b.row_active, Ls[t], at::zeros_like(Ls[t]));
      auto Q = at::exp(b.S + vs[t - 1].unsqueeze(-2) - L.unsqueeze(-1));
      auto add = -(Q * ub[t].masked_fill(b.row_active.logical_not(), 0.0).unsqueeze(-1)).sum(-2);
      vb[t - 1] = vb[t - 1].defined() ? vb[t - 1] + add : add;
    }
  }
  auto u0b = ub[0].masked_fill(b.row_active.logical_not(), 0.0);
  auto g = (b.Psi * u0b.unsqueeze(-1)).sum(-2) / eps;  // [B, H, P]
  auto gr = coef.size(0) == 1 ? g.sum(at::IntArrayRef{0, 1}).unsqueeze(0) : g.sum(0);
  *grad = grad->defined() ? *grad + gr : gr;
  return loss;
}

double attn_evaluate(const AttnSource& src, const at::Tensor& coef, double eps, int k, at::Tensor* grad,
                     Communicator* comm) {
  double loss = 0, terms = 0;
  at::Tensor g;
  src([&](const AttnBatch& b) {
    loss += attn_loss(b, coef, eps, k, grad ? &g : nullptr);
    terms += static_cast<double>(b.D.numel());
  });
  if (grad && !g.defined()) g = at::zeros({coef.size(0), coef.size(1)}, at::kDouble);
  std::vector<double> v{loss, terms};
  if (grad) {
    auto gc = g.contiguous();
    v.insert(v.end(), gc.data_ptr<double>(), gc.data_ptr<double>() + gc.numel());
  }
  sum_over_ranks(comm, v);
  ASAP_CHECK(v[1] > 0, "attention refit: no (example, head) pairs to fit");
  if (grad) {
    auto out = at::empty({coef.size(0), coef.size(1)}, at::kDouble);
    std::copy(v.begin() + 2, v.end(), out.data_ptr<double>());
    *grad = out / v[1];
  }
  return v[0] / v[1];
}

AttnFit refine_attention(const AttnSource& train, const AttnSource* held, const at::Tensor& coef0, double eps, int k,
                         const AttnFitOptions& opt, const std::string& layer) {
  Communicator* comm = opt.comm;
  at::Tensor x = coef0.to(at::kDouble).clone(), g;
  double f = attn_evaluate(train, x, eps, k, &g, comm);
  ASAP_CHECK(std::isfinite(f), "layer '", layer, "': the attention refit's objective is not finite at its LS start");
  const double f0 = f;
  double best_held = held ? attn_evaluate(*held, x, eps, k, nullptr, comm) : f;
  const double held0 = best_held;
  at::Tensor best = x.clone();
  int best_iter = 0, it = 0, stale = 0;
  std::string stopped = str("the iteration cap (--attention-iters ", opt.max_iters, ")");
  std::deque<std::pair<at::Tensor, at::Tensor>> mem;  // (s, y), newest last
  constexpr size_t kMemory = 8;
  std::vector<AttnStepRecord> history;
  history.push_back({0, f, std::nullopt, held ? held0 : -1.0});
  auto dot = [](const at::Tensor& a, const at::Tensor& b) { return (a * b).sum().item<double>(); };
  for (it = 1; it <= opt.max_iters; ++it) {
    // Two-loop recursion.
    at::Tensor q = g.clone();
    std::vector<double> al(mem.size()), rho(mem.size());
    for (size_t i = mem.size(); i-- > 0;) {
      rho[i] = 1.0 / dot(mem[i].second, mem[i].first);
      al[i] = rho[i] * dot(mem[i].first, q);
      q = q - al[i] * mem[i].second;
    }
    const double gn = std::sqrt(dot(g, g));
    if (!(gn > 1e-12)) {
      stopped = "a zero gradient";
      break;
    }
    double gamma = mem.empty() ? 0.1 * std::max(1.0, std::sqrt(dot(x, x))) / gn
                               : dot(mem.back().first, mem.back().second) / dot(mem.back().second, mem.back().second);
    at::Tensor r = gamma * q;
    for (size_t i = 0; i < mem.size(); ++i) {
      const double be = rho[i] * dot(mem[i].second, r);
      r = r + (al[i] - be) * mem[i].first;
    }
    at::Tensor d = -r;
    double slope = dot(g, d);
    if (!(slope < 0)) {  // not a descent direction: restart from the gradient
      mem.clear();
      d = -g * (0.1 * std::max(1.0, std::sqrt(dot(x, x))) / gn);
      slope = dot(g, d);
    }
    // Armijo backtracking.
    double t = 1, fn = 0;
    at::Tensor xn, gnew;
    bool ok = false;
    for (int ls = 0; ls < 30; ++ls, t *= 0.5) {
      xn = x + t * d;
      gnew = at::Tensor();
      fn = attn_evaluate(train, xn, eps, k, &gnew, comm);
      if (std::isfinite(fn) && fn <= f + 1e-4 * t * slope) {
        ok = true;
        break;
      }
    }
    if (!ok) {
      stopped = "a line search without decrease";
      break;
    }
    auto s = xn - x, y = gnew - g;
    if (dot(s, y) > 1e-16) {
      mem.emplace_back(s, y);
      if (mem.size() > kMemory) mem.pop_front();
    }
    x = xn, g = gnew, f = fn;
    AttnStepRecord h{it, f, t, std::nullopt};
    if (held && (it % opt.check_every == 0 || it == opt.max_iters)) {
      const double hv = attn_evaluate(*held, x, eps, k, nullptr, comm);
      h.heldout = hv;
      if (hv < best_held)
        best_held = hv, best = x.clone(), best_iter = it, stale = 0;
      else
        ++stale;
    }
    history.push_back(h);
    if (opt.progress) opt.progress({layer, "attention", it, opt.max_iters});
    if (opt.patience > 0 && stale >= opt.patience) {
      stopped = str("no better held-out objective in ", stale, " checks (", stale * opt.check_every, " iterations)");
      break;
    }
  }
  if (!held) best = x.clone(), best_iter = it - 1;
  AttnRefitRecord diag;
  diag.closures = k;
  diag.iterations = static_cast<int>(history.size()) - 1;  // the iterations that ran (history[0] is the start)
  diag.best_iteration = best_iter;
  diag.stopped = stopped;
  diag.train_objective_ls = f0;
  diag.train_objective = f;
  diag.heldout_objective_ls = held ? held0 : -1.0;
  diag.heldout_objective = held ? best_held : -1.0;
  diag.history = std::move(history);
  return {best, diag};
}

AttnFit fit_attention(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
                      const FeatureFamily& family, const at::Tensor& coef_ls, int closures,
                      const std::function<bool(int64_t)>& is_heldout, const AttnFitOptions& opt) {
  std::vector<int64_t> tr, he;
  for (int64_t e = 0; e < sh.total; ++e)
    if (!opt.usable || opt.usable(e)) (is_heldout(e) ? he : tr).push_back(e);
  const bool can_select = static_cast<int64_t>(he.size()) >= opt.min_heldout;
  auto build = [&s, &theta, &family](const HeadBatch& hb) {
    auto Psi = split_features(hb, s, theta, family);
    return make_attn_batch(hb.q, hb.k, hb.mask, Psi, s.score_scale, s.eps, s.T, convention_of(s).drop_padded_queries);
  };
  CachedSplit<AttnBatch> train(stream, sh.mine(tr), opt.batch_size, opt.cache_mb, build);
  CachedSplit<AttnBatch> held(stream, sh.mine(he), opt.batch_size, opt.cache_mb, build);
  AttnSource train_src = [&](const std::function<void(const AttnBatch&)>& fn) { train(fn); };
  AttnSource held_src = [&](const std::function<void(const AttnBatch&)>& fn) { held(fn); };
  AttnFit r = refine_attention(train_src, can_select ? &held_src : nullptr, coef_ls, s.eps, closures, opt, s.name);
  r.diagnostics.cached_mb = static_cast<double>(train.cached_bytes() + held.cached_bytes()) / 1048576.0;
  return r;
}

}  // namespace asap

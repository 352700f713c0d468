#include "compile/kl_fit.h"

#include <ATen/ATen.h>
#include <Eigen/Dense>

#include <cmath>
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

int64_t KlBatch::bytes() const {
  return static_cast<int64_t>((Psi.numel() + M.numel() + b.numel() + rstar.numel() + kl_const.numel()) * 8);
}

KlBatch make_kl_batch(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& mask, const at::Tensor& f_star,
                      const at::Tensor& Psi, double scale, double eps, bool drop_padded_queries) {
  auto q = q_in.to(at::kDouble), k = k_in.to(at::kDouble);
  const int64_t B = q.size(0), n = q.size(2);
  auto m = log_marginals(mask, B, n, drop_padded_queries, at::kDouble, q.device());
  auto S = scores(q, k, scale);
  auto alpha = cost_alpha(q, scale), beta = cost_alpha(k, scale);
  auto C = alpha.unsqueeze(-1) + beta.unsqueeze(-2) - S;  // quadratic cost
  KlBatch kb;
  kb.Psi = Psi.to(at::kDouble).contiguous();
  kb.M = (-C / eps).masked_fill(m.row_active.unsqueeze(-1).logical_not(), -std::numeric_limits<double>::infinity());
  kb.b = m.log_b.exp();
  // Reference plan pi* = plan(f*, col(f*)) (coupling units).
  auto fs = f_star.to(at::kDouble);
  auto g = col_closure(S, fs, m, eps);
  auto pi = at::exp((S + fs.unsqueeze(-1) + g.unsqueeze(-2)) / eps);
  kb.rstar = pi.sum(-1);
  // KL_e = F_e + sum pi* log pi* + (1/eps) sum pi* C - sum_j b_j log b_j.
  auto pilog = at::where(pi > 0, pi * pi.log(), at::zeros_like(pi)).sum(at::IntArrayRef{-2, -1});
  auto blogb = at::where(kb.b > 0, kb.b * m.log_b, at::zeros_like(kb.b)).sum(-1);  // [B, 1]
  kb.kl_const = pilog + (pi * C).sum(at::IntArrayRef{-2, -1}) / eps - blogb;
  return kb;
}

void kl_accumulate(const KlBatch& kb, const at::Tensor& coef, double eps, bool derivs, KlSums& sums) {
  const int64_t B = kb.Psi.size(0), H = kb.Psi.size(1), P = kb.Psi.size(3);
  ASAP_CHECK(coef.dim() == 2 && coef.size(1) == P && (coef.size(0) == 1 || coef.size(0) == H), "KL fit: coefficients ",
             coef.sizes(), " do not fit ", P, " columns and ", H, " heads");
  const bool per_head = coef.size(0) == H && H > 1;
  auto phi = (kb.Psi * coef.unsqueeze(1)).sum(-1);  // [B, H, n]
  auto Z = kb.M + phi.unsqueeze(-1) / eps;          // [B, H, n(i), n(j)]
  auto L = at::logsumexp(Z, {-2});                  // [B, H, n(j)]
  auto bj = kb.b.expand({B, H, kb.b.size(-1)});
  // Padded columns have b_j = 0: their LSE is finite (rows exist), so 0 * L = 0.
  auto Fe = (bj * L).sum(-1) - (kb.rstar * phi).sum(-1) / eps;  // [B, H]
  sums.F += Fe.sum().item<double>();
  sums.kl += (Fe + kb.kl_const).sum().item<double>();
  sums.terms += B * H;
  if (!derivs) return;
  auto Pm = at::exp(Z - L.unsqueeze(-2));    // column conditionals p_ij
  auto r = (Pm * bj.unsqueeze(-2)).sum(-1);  // [B, H, n]
  auto grad = at::matmul(kb.Psi.transpose(-1, -2), ((r - kb.rstar) / eps).unsqueeze(-1)).squeeze(-1);  // [B,H,P]
  auto W = at::matmul(kb.Psi.transpose(-1, -2), Pm);                                                   // [B,H,P,n]
  auto hess = at::matmul(kb.Psi.transpose(-1, -2) * r.unsqueeze(-2), kb.Psi) -
              at::matmul(W * bj.unsqueeze(-2), W.transpose(-1, -2));  // [B,H,P,P]
  hess = hess / (eps * eps);
  auto g = per_head ? grad.sum(0) : grad.sum(at::IntArrayRef{0, 1}).unsqueeze(0);
  auto h = per_head ? hess.sum(0) : hess.sum(at::IntArrayRef{0, 1}).unsqueeze(0);
  if (!sums.grad.defined()) {
    sums.grad = g.clone();
    sums.hess = h.clone();
  } else {
    sums.grad.add_(g);
    sums.hess.add_(h);
  }
}

KlValue kl_evaluate(const KlSource& source, const at::Tensor& coef, double eps, double lambda, bool derivs,
                    Communicator* comm) {
  KlSums s;
  source([&](const KlBatch& b) { kl_accumulate(b, coef, eps, derivs, s); });
  if (comm) {  // one reduction: F, KL, terms, then the gradient and Hessian
    const int64_t G = coef.size(0), P = coef.size(1);
    if (derivs && !s.grad.defined()) {
      s.grad = at::zeros({G, P}, at::kDouble);
      s.hess = at::zeros({G, P, P}, at::kDouble);
    }
    std::vector<double> v{s.F, s.kl, static_cast<double>(s.terms)};
    if (derivs) {
      auto g = s.grad.contiguous(), h = s.hess.contiguous();
      v.insert(v.end(), g.data_ptr<double>(), g.data_ptr<double>() + g.numel());
      v.insert(v.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
    }
    comm->allreduce_sum(v);
    s.F = v[0];
    s.kl = v[1];
    s.terms = static_cast<int64_t>(v[2]);
    if (derivs) {
      s.grad = at::from_blob(v.data() + 3, {G, P}, at::kDouble).clone();
      s.hess = at::from_blob(v.data() + 3 + G * P, {G, P, P}, at::kDouble).clone();
    }
  }
  ASAP_CHECK(s.terms > 0, "KL fit: no calibration examples");
  const double E = static_cast<double>(s.terms);
  KlValue v;
  v.F = s.F / E + 0.5 * lambda * coef.pow(2).sum().item<double>();
  v.kl = s.kl / E;
  if (derivs) {
    v.grad = s.grad / E + lambda * coef;
    v.hess = s.hess / E + lambda * at::eye(coef.size(1), at::kDouble).unsqueeze(0);
  }
  return v;
}

KlNewtonResult kl_newton(const KlSource& source, const at::Tensor& coef0, double eps, double lambda, int max_iters,
                         double tol, const std::function<void(int)>& on_iter, Communicator* comm) {
  KlNewtonResult r;
  at::Tensor beta = coef0.to(at::kDouble).clone();
  KlValue v = kl_evaluate(source, beta, eps, lambda, true, comm);
  ASAP_CHECK(std::isfinite(v.F), "KL fit: the objective is not finite at the LS warm start");
  r.history.push_back({0, v.F, v.grad.norm().item<double>(), 0, 0});
  for (int it = 1; it <= max_iters; ++it) {
    // Newton direction per coefficient row (the Hessian is block diagonal over heads).
    const int64_t G = beta.size(0), P = beta.size(1);
    auto dir = at::zeros_like(beta);
    double dec2 = 0;
    for (int64_t g = 0; g < G; ++g) {
      Eigen::MatrixXd Hm(P, P);
      Eigen::VectorXd gv(P);
      auto hg = v.hess[g].contiguous(), gg = v.grad[g].contiguous();
      for (int64_t a = 0; a < P; ++a) {
        gv(a) = gg[a].item<double>();
        for (int64_t b = 0; b < P; ++b) Hm(a, b) = hg[a][b].item<double>();
      }
      Eigen::VectorXd d = -Hm.ldlt().solve(gv);
      if (!d.allFinite()) d = -Hm.completeOrthogonalDecomposition().solve(gv);
      dec2 += -gv.dot(d);
      for (int64_t a = 0; a < P; ++a) dir[g][a] = d(a);
    }
    if (dec2 / 2 < tol) {
      r.converged = true;
      r.history.back().newton_decrement = std::sqrt(std::max(0.0, dec2));
      break;
    }
    // Armijo backtracking: F(beta + t d) <= F(beta) - 0.25 t dec^2.
    double t = 1;
    KlValue nv;
    for (int ls = 0; ls < 40; ++ls) {
      nv = kl_evaluate(source, beta + t * dir, eps, lambda, false, comm);
      if (std::isfinite(nv.F) && nv.F <= v.F - 0.25 * t * dec2) break;
      t *= 0.5;
    }
    ASAP_CHECK(std::isfinite(nv.F), "KL fit: the objective became non-finite during the line search (iteration ", it,
               "); try a larger --kl-ridge or --fit ls");
    if (!(nv.F < v.F)) {  // no decrease possible at machine precision
      r.converged = true;
      break;
    }
    beta = beta + t * dir;
    v = kl_evaluate(source, beta, eps, lambda, true, comm);
    r.history.push_back({it, v.F, v.grad.norm().item<double>(), std::sqrt(std::max(0.0, dec2)), t});
    if (on_iter) on_iter(it);
  }
  r.coef = beta;
  return r;
}

KlFit fit_kl(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
             const FeatureFamily& family, bool per_head, const at::Tensor& coef_ls,
             const std::function<bool(int64_t)>& is_heldout, const KlOptions& opt) {
  std::vector<int64_t> tr, he;
  for (int64_t e = 0; e < sh.total; ++e)
    if (!opt.usable || opt.usable(e)) (is_heldout(e) ? he : tr).push_back(e);
  const bool can_select = static_cast<int64_t>(he.size()) >= opt.min_heldout;
  auto build = [&s, &theta, &family](const HeadBatch& hb) {
    const auto c = convention_of(s);
    auto t = run_teacher(hb.q, hb.k, at::Tensor(), hb.mask, s.score_scale, s.T, c, false);
    auto Psi = split_features(hb, s, theta, family);
    return make_kl_batch(hb.q, hb.k, hb.mask, t.f_star, Psi, s.score_scale, s.eps, c.drop_padded_queries);
  };
  CachedSplit<KlBatch> train(stream, sh.mine(tr), opt.batch_size, opt.cache_mb, build);
  CachedSplit<KlBatch> held(stream, sh.mine(he), opt.batch_size, opt.cache_mb, build);
  KlSource train_src = [&](const std::function<void(const KlBatch&)>& fn) { train(fn); };
  KlSource held_src = [&](const std::function<void(const KlBatch&)>& fn) { held(fn); };
  Communicator* comm = opt.comm;
  std::vector<double> grid =
      opt.ridge_grid.empty() ? std::vector<double>{1e-6, 1e-5, 1e-4, 1e-3, 1e-2} : opt.ridge_grid;
  if (opt.ridge >= 0)
    grid = {opt.ridge};
  else if (!can_select)
    grid = {1e-4};

  KlRefitRecord diag;
  diag.ridge_grid = grid;
  diag.ridge_fixed = opt.ridge >= 0;
  const double ls_train_kl = kl_evaluate(train_src, coef_ls, s.eps, 0, false, comm).kl;
  const double ls_held_kl = can_select ? kl_evaluate(held_src, coef_ls, s.eps, 0, false, comm).kl : -1;
  diag.train_kl_ls = ls_train_kl;
  diag.heldout_kl_ls = ls_held_kl;
  KlNewtonResult best;
  double best_held = std::numeric_limits<double>::infinity(), best_lambda = grid[0];
  int passes = 0;
  for (double lam : grid) {
    auto res = kl_newton(
        train_src, coef_ls, s.eps, lam, opt.max_iters, opt.tol,
        [&](int it) {
          ++passes;
          if (opt.progress) opt.progress({s.name, "kl", it, opt.max_iters});
        },
        comm);
    const double hk = can_select ? kl_evaluate(held_src, res.coef, s.eps, 0, false, comm).kl : -1;
    KlRidgeRecord run;
    run.ridge = lam;
    run.heldout_kl = hk;
    run.iterations = static_cast<int64_t>(res.history.size()) - 1;
    run.converged = res.converged;
    for (const auto& h : res.history)
      run.history.push_back({h.iter, h.objective, h.grad_norm, h.newton_decrement, h.step});
    diag.per_ridge.push_back(std::move(run));
    const double score = can_select ? hk : 0;
    if (score < best_held || !best.coef.defined()) {
      best_held = score;
      best_lambda = lam;
      best = res;
    }
  }
  diag.ridge = best_lambda;
  diag.iterations = static_cast<int64_t>(best.history.size()) - 1;
  diag.converged = best.converged;
  diag.objective = best.history.back().objective;
  diag.grad_norm = best.history.back().grad_norm;
  diag.newton_decrement = best.history.back().newton_decrement;
  diag.train_kl = kl_evaluate(train_src, best.coef, s.eps, 0, false, comm).kl;
  diag.heldout_kl = can_select ? best_held : -1.0;
  diag.cached_mb = static_cast<double>(train.cached_bytes() + held.cached_bytes()) / 1048576.0;
  diag.cached = train.cached();
  (void)per_head;
  return {best.coef, diag};
}

}  // namespace asap

// ASAP-KL (asap-math.md section 6, KL part): the convex forward-KL fit of
// the same online layer, by damped Newton over streamed calibration data.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/compile_record.h"

namespace asap {

class Communicator;
class LayerStream;
struct Shards;

// What the KL objective needs of a batch of examples, in float64.
struct KlBatch {
  at::Tensor Psi;       // [B, H, n, P] features (columns of the fitted family)
  at::Tensor M;         // [B, H, n, n] -C_ij/eps, -inf on query rows without mass
  at::Tensor b;         // [B, 1, n] key marginals (1/n on active keys, 0 on padded)
  at::Tensor rstar;     // [B, H, n] row masses of the reference plan plan(f*, col(f*))
  at::Tensor kl_const;  // [B, H] constant making F_e + const_e = KL(pi* || plan(f_hat, col(f_hat)))
  int64_t bytes() const;
};

// Builds a KlBatch from per-head q, k, the mask, the teacher's closure-ready
// dual f* [B, H, n] and features Psi [B, H, n, P].
KlBatch make_kl_batch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, const at::Tensor& f_star,
                      const at::Tensor& Psi, double scale, double eps, bool drop_padded_queries);

// Sums over batches, before the 1/E average and the ridge.
struct KlSums {
  double F = 0;       // sum_e F_e
  double kl = 0;      // sum_e KL_e (F_e + const_e)
  at::Tensor grad;    // [G, P]
  at::Tensor hess;    // [G, P, P]
  int64_t terms = 0;  // E: (example, head) pairs
};
// coef [1, P] (pooled) or [H, P] (per head).
void kl_accumulate(const KlBatch& batch, const at::Tensor& coef, double eps, bool derivatives, KlSums& sums);

// The objective with its 1/E average and ridge (lambda/2)||beta||^2 (summed over coefficient rows).
struct KlValue {
  double F = 0, kl = 0;
  at::Tensor grad, hess;  // of F (with ridge), when requested
};
using KlSource = std::function<void(const std::function<void(const KlBatch&)>&)>;
// With comm, each rank's source holds its share and the sums are reduced.
KlValue kl_evaluate(const KlSource& source, const at::Tensor& coef, double eps, double lambda, bool derivatives,
                    Communicator* comm = nullptr);

struct KlIteration {
  int iter = 0;
  double objective = 0, grad_norm = 0, newton_decrement = 0, step = 0;
};
struct KlNewtonResult {
  at::Tensor coef;
  std::vector<KlIteration> history;  // objective after each accepted step (history[0]: start)
  bool converged = false;
};
// Damped Newton with Armijo backtracking from coef0. Stops when the Newton
// decrement^2/2 < tol or after max_iters; throws asap::Error if the objective
// becomes non-finite.
KlNewtonResult kl_newton(const KlSource& source, const at::Tensor& coef0, double eps, double lambda, int max_iters,
                         double tol, const std::function<void(int)>& on_iter = {}, Communicator* comm = nullptr);

// Compile's KL stage for one layer: caches batches within a memory budget,
// chooses the KL ridge on held-out KL unless fixed, reports diagnostics.
struct KlOptions {
  double ridge = -1;
  std::vector<double> ridge_grid;  // empty: {1e-6, 1e-5, 1e-4, 1e-3, 1e-2}
  int max_iters = 20;
  double tol = 1e-10;
  double cache_mb = 512;
  int64_t batch_size = 16;
  int64_t min_heldout = 8;
  std::function<void(const ProgressEvent&)> progress;
  Communicator* comm = nullptr;         // distributed: this rank's share, sums reduced
  std::function<bool(int64_t)> usable;  // examples to use (default: all)
};
struct KlFit {
  at::Tensor coef;
  KlRefitRecord diagnostics;  // per ridge, the chosen one, cache use
};
KlFit fit_kl(const LayerStream& stream, const Shards& sh, const LayerSpec& spec, const at::Tensor& theta,
             const FeatureFamily& family, bool per_head, const at::Tensor& coef_ls,
             const std::function<bool(int64_t)>& is_heldout, const KlOptions& opt);

}  // namespace asap

// The attention refit (--fit attention): the chosen map's
// coefficients, started from their LS solution, refined by L-BFGS on the
// squared relative error of the plan after the operator's own k closures
// against the teacher's plan, over the training split. Kept only when the
// held-out attention error improves (compile checks it on the fast path).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "asap/compile.h"
#include "asap/compile_record.h"

namespace asap {

class Communicator;
class LayerStream;
struct Shards;

// What the objective needs of a batch, float64, score coordinates (S' = S / eps).
struct AttnBatch {
  at::Tensor Psi;         // [B, H, n, P] features of the fitted family
  at::Tensor alpha;       // [B, H, n] query cost offsets alpha_i / eps
  at::Tensor S;           // [B, H, n, n] S' with -inf on query rows without mass
  at::Tensor log_a;       // [B, 1, n] (-inf on rows without mass)
  at::Tensor log_b;       // [B, 1, n] (-inf on padded keys)
  at::Tensor row_active;  // [B, 1, n] bool
  at::Tensor Pstar;       // [B, H, n, n] the teacher's plan after T half-steps
  at::Tensor D;           // [B, H] sum of Pstar^2
  int64_t bytes() const;
};

// From per-head q, k, the key mask and the features Psi [B, H, n, P].
AttnBatch make_attn_batch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, const at::Tensor& Psi,
                          double scale, double eps, int T, bool drop_padded_queries);

// Sum over the batch's (example, head) pairs of ||P - P*||^2 / ||P*||^2,
// P the plan after k closures (col, row, ...) from f' = (Psi beta)/eps -
// alpha; with grad, adds d/dcoef of that sum ([G, P], G = coef rows).
double attn_loss(const AttnBatch& b, const at::Tensor& coef, double eps, int k, at::Tensor* grad);

using AttnSource = std::function<void(const std::function<void(const AttnBatch&)>&)>;

struct AttnFitOptions {
  int max_iters = 60;   // L-BFGS iterations
  int check_every = 5;  // held-out objective every this many iterations; the best is kept
  int patience = 3;     // > 0: stop after this many checks in a row without a better held-out objective
  double cache_mb = 512;
  int64_t batch_size = 16;
  int64_t min_heldout = 8;
  std::function<void(const ProgressEvent&)> progress;
  Communicator* comm = nullptr;
  std::function<bool(int64_t)> usable;
};
struct AttnFit {
  at::Tensor coef;
  AttnRefitRecord diagnostics;  // iterations, objectives, history (cached_mb: fit_attention)
};

// Mean objective and gradient over a source (reduced over ranks with comm).
double attn_evaluate(const AttnSource& src, const at::Tensor& coef, double eps, int k, at::Tensor* grad,
                     Communicator* comm = nullptr);

// L-BFGS from coef0 on the training source; every check_every iterations
// the held-out objective, keeping the best coefficients (coef0 included),
// and stopping once `patience` checks in a row have not improved on it.
AttnFit refine_attention(const AttnSource& train, const AttnSource* held, const at::Tensor& coef0, double eps, int k,
                         const AttnFitOptions& opt, const std::string& layer = "");

// Compile's stage for one layer: batches of the training and held-out
// splits (this rank's share), then refine_attention.
AttnFit fit_attention(const LayerStream& stream, const Shards& sh, const LayerSpec& spec, const at::Tensor& theta,
                      const FeatureFamily& family, const at::Tensor& coef_ls, int closures,
                      const std::function<bool(int64_t)>& is_heldout, const AttnFitOptions& opt);

}  // namespace asap

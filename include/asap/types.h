// asap/types.h -- the core types every layer of asapc shares
// (docs/architecture.md): a teacher's conventions and its loop's result, a
// compiled layer (what it runs and with which coefficients), what one call
// of a layer takes and returns, and a compile/verify progress event.
//
// Below everything but the teacher spec (asap/spec.h, asap/layer.h): the
// fused kernels, the ATen reference, the artifact reader and writer, the
// runtime, compile and verify all include it, and it includes none of them.
// Implemented in src/lib/model/types.cpp.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "asap/layer.h"
#include "asap/spec.h"

namespace asap {

// ---- the teacher -----------------------------------------------------------

struct Convention {
  double eps = 1.0;                  // entropy
  bool drop_padded_queries = false;  // a_i = 0 for padded query rows
  bool multiply_by_n = true;         // attention = n * plan
};

// What the finite Sinkhorn loop returns (run_teacher, run_teacher_reference).
struct TeacherResult {
  at::Tensor A;             // [B, H, n, n] attention (when requested)
  at::Tensor O;             // [B, H, n, dv] head outputs (when v given)
  at::Tensor f, g;          // final duals
  at::Tensor f_star;        // closure-ready source dual (T >= 2)
  at::Tensor phi_bar_star;  // centered cost-coordinate target (T >= 2)
};

// ---- a compiled layer ------------------------------------------------------

// Which columns the feature matrix Psi holds, in this fixed order:
//   [ slice potentials 0..slices-1 | alpha | softmax_dual | sinkhorn_dual3 |
//     score_stats (row max, row mean, row standard deviation) |
//     centered_stats (row max and row variance of S_ij - c_j, c_j the column mean) ].
// Every column is centered over the mass-carrying query rows.
struct FeatureFamily {
  int64_t slices = 0;           // sliced Kantorovich potentials (asap-math.md section 4)
  bool alpha = false;           // centered query cost offset (s/2)||q_i||^2 (section 6b)
  bool softmax_dual = false;    // centered softmax dual f1 = row(0) + alpha (section 6b): 1 pass
  bool sinkhorn_dual3 = false;  // centered teacher dual after 3 steps, f3 = row(col(row(0))) + alpha:
                                // 3 passes (f1 comes free on the way); format version 2
  bool score_stats = false;     // three columns: the max, mean and standard deviation of each query row's
                                // scores S_ij = scale q_i.k_j over the active keys (docs/asap-math.md
                                // section 6c): one sweep of the score tile, no exponential; format version 5
  bool centered_stats = false;  // two more columns (only with score_stats): the max and the variance of
                                // each query row's scores less their column means over the mass-carrying
                                // rows, S_ij - c_j (docs/asap-math.md section 6d): a second sweep, no
                                // exponential; format version 6
  int64_t num_columns() const {
    return slices + (alpha ? 1 : 0) + (softmax_dual ? 1 : 0) + (sinkhorn_dual3 ? 1 : 0) + (score_stats ? 3 : 0) +
           (centered_stats ? 2 : 0);
  }
  // Columns of the score statistics (score_stats and centered_stats), the last ones of Psi.
  int64_t stats_columns() const { return (score_stats ? 3 : 0) + (centered_stats ? 2 : 0); }
  // Log-sum-exp passes the features cost before any closure.
  int feature_passes() const { return sinkhorn_dual3 ? 3 : softmax_dual ? 1 : 0; }
  std::string name() const;  // e.g. "L64+alpha+softmax+sinkhorn3", "alpha+stats", "alpha+cstats"
  bool operator==(const FeatureFamily& o) const {
    return slices == o.slices && alpha == o.alpha && softmax_dual == o.softmax_dual &&
           sinkhorn_dual3 == o.sinkhorn_dual3 && score_stats == o.score_stats && centered_stats == o.centered_stats;
  }
};

// What a compiled layer runs at inference (format version 3). The
// zero-parameter kinds are what compile stores when, on this machine and
// shape, no ASAP map is both faster than the teacher and closer to it than
// Sinkhorn of equal latency (docs/decisions.md).
enum class OperatorKind {
  kAsap,      // predicted dual + default_closures closures (asap-math.md section 5)
  kSinkhorn,  // the teacher's own loop cut to sinkhorn_steps = T' < T half-steps
  kTeacher,   // the exact teacher: T half-steps
};
const char* operator_kind_name(OperatorKind k);  // "asap", "sinkhorn", "teacher"

// Log-sum-exp passes of an ASAP map: its features' passes plus k closures.
int lse_passes(const FeatureFamily& f, int closures);

struct CompiledLayer {
  OperatorKind kind = OperatorKind::kAsap;
  int sinkhorn_steps = 0;    // T' for kSinkhorn (1 <= T' < T); 0 otherwise
  LayerSpec spec;            // teacher conventions: name, heads, dims, scale, eps, T, mask, n-multiplier
  at::Tensor theta;          // [head_dim, slices_stored] float64, unit-norm columns
  FeatureFamily family;      // family.slices <= theta.size(1): a prefix of the bank is used
  bool per_head = false;     // one coefficient row per head, else one per layer
  at::Tensor coef;           // [per_head ? heads : 1, family.num_columns()] float64
  int default_closures = 0;  // k used when the caller does not ask
  LayerWeights weights;      // projections (may be undefined when compiled from q/k/v)
  std::string fit_json;      // fit options, diagnostics and selection, as JSON text
  // Log-sum-exp half-steps the layer runs: T' (sinkhorn), T (teacher), or
  // the features' passes plus the default closures (asap).
  int lse_passes() const;
  // "asap L16+alpha+softmax/head k=1", "sinkhorn T'=4", "teacher T=6".
  std::string describe() const;
};

// ---- one call of a layer ---------------------------------------------------

struct RunOptions {
  int closures = 0;               // k >= 1 closures; 0 = the layer's compiled default
  bool return_attention = false;  // also return the [B, H, n, n] attention matrix
  bool return_phi = false;        // also return phi_hat (ASAP maps; the reference path always does)
  bool return_features = false;   // also return the feature matrix Psi (ASAP maps)
};

struct LayerOutput {
  at::Tensor out;        // head outputs [B, H, n, dv]
  at::Tensor attention;  // [B, H, n, n] when requested
  at::Tensor phi_hat;    // predicted centered cost-coordinate dual [B, H, n] when requested
  at::Tensor features;   // the centered feature columns Psi [B, H, n, P] when requested
};

// ---- progress --------------------------------------------------------------

struct ProgressEvent {
  std::string layer;  // layer being compiled
  std::string phase;  // "statistics", "selection", "kl"
  int64_t done = 0;   // examples (or passes) done in this phase, by this process
  int64_t total = 0;  // in all: with several processes, the sum over ranks of done reaches it
};

}  // namespace asap

// fast/fast.h -- fused CPU kernels for the teacher, the compiled operator and
// the features (docs/performance.md).
//
// Same inputs and outputs as the ATen reference paths (asap/teacher.h,
// asap/operator.h, asap/features.h), which remain the specification: the
// tests check fast == reference to 1e-5 relative in float32 and 1e-10 in
// float64. The kernels take what handles() accepts (CPU, float32/float64, at
// least one head and one token) and refuse anything else with asap::Error;
// asap::run_teacher and asap::run_layer (asap/runtime.h) take every input
// and choose between these kernels and the reference. This header and
// src/lib/fast/ know neither the runtime nor the reference path
// (docs/performance.md, "Layering").
//
// How it works (docs/performance.md): parallel over (batch, head) with
// per-thread workspaces, or over rows/columns of one head when there are
// fewer heads than threads and n >= 256; per head the score tile S = (scale/eps) Q K^T is
// computed once by a small packed GEMM and kept while it fits the workspace
// budget (otherwise recomputed tile by tile); every closure is one pass with
// a vectorised exponential, the last closure is fused with plan * V, and no
// [B, H, n, n] tensor exists unless the attention matrix is requested.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "asap/layer_call.h"
#include "asap/types.h"

namespace asap {
namespace fast {

enum class Strategy {
  kAuto,          // heads in parallel for n < 256 or enough heads, else rows/columns
  kHeadParallel,  // one (b, h) per thread at a time, per-thread workspace
  kWithinHead,    // heads one after another, each pass parallel over rows/columns
};

// Knobs for tests and benchmarks; the defaults are what callers should use.
struct Tuning {
  std::string isa;  // "" = best the CPU supports (env ASAP_FAST_ISA overrides); else "generic", "avx2", "avx512"
  Strategy strategy = Strategy::kAuto;
  int64_t workspace_bytes =
      0;                   // budget for stored score tiles over all threads; 0 = env ASAP_FAST_WORKSPACE_MB or 256 MiB
  int store_scores = -1;   // -1 = within the budget, 0 = recompute tiles in every pass, 1 = always store
  int64_t chunk_rows = 0;  // rows per tile in row passes (0 = automatic)
  // Row passes before the last over a stored tile run as column passes on its
  // transpose (docs/performance.md, "Row passes on the transposed tile"):
  // -1 = when the head has at least kTransposedMinRows rows and at most 100
  // keys, 0 = never, 1 = whenever the tile is stored.
  int transposed_rows = -1;
};

// The fewest rows for which row passes run on the transposed tile by default:
// its column kernels take 3 or more rows past a full vector as one masked
// vector, and from 5 rows that beats the row kernel's horizontal reductions
// (asap_bench through run_layer, docs/performance.md: 0.90x the time at
// n = 5, 0.53-0.86x at n = 6-14; n = 4 even, n = 3 1.1x slower).
constexpr int64_t kTransposedMinRows = 5;

// Below this many scores per head (n * n, n = 256) heads run over threads
// whatever their count; from it, fewer heads than threads (or a count that
// does not divide among them) split each head's passes over the threads.
constexpr int64_t kWithinHeadMinScores = 65536;

// Instruction sets compiled in and supported by this CPU, best last.
std::vector<std::string> available_isas();
// The one used for `tuning` (validated; throws asap::Error when unavailable).
std::string isa_for(const Tuning& tuning = {});
// Whether the kernels take these inputs: every defined tensor on the CPU and
// dense, q float32 or float64, and (for [B, H, n, d] inputs) B * H >= 1 and
// n >= 1. Other inputs make the functions below throw asap::Error.
bool handles(const at::Tensor& q, const at::Tensor& k = {}, const at::Tensor& v = {}, const at::Tensor& key_mask = {});
// Whether every value of t is finite: vectorised for CPU float32/float64
// contiguous tensors, ATen otherwise (the runtime's NaN-propagation check).
bool all_finite(const at::Tensor& t);
// Whether at::parallel_for runs in parallel in this build: false when
// LibTorch uses OpenMP and the library was compiled without it (the fast
// path then still works, on one thread).
bool parallel_build();

// This machine's measured peak for the two kinds of work the fused operators
// are made of, on the threads of at::get_num_threads() all busy at once:
// vector multiply-adds (independent chains in registers; every GEMM flop is
// one half of one) and the kernels' own vectorised exponential over an
// L1-resident buffer. A lower bound on an operator's time is then
// flops / flops_per_s + exps / exps_per_s (tools/bench/bench.cpp, docs/performance.md).
struct MachinePeak {
  double flops_per_s = 0;  // all threads
  double exps_per_s = 0;   // all threads
  int threads = 0;
  std::string isa;
};
// Best of `rounds` measurements of a few milliseconds each; float64
// measures the double-precision kernels. Call it outside parallel regions
// (inside one, at::parallel_for runs serially and the rates are too high).
MachinePeak measure_peak(bool float64 = false, int rounds = 5, const Tuning& tuning = {});

// Same as asap::run_teacher_reference (all fields of TeacherResult; with
// want_duals = false only O and A).
// nonfinite_heads (may be null) receives one flag per (b, h), b-major: 1
// where that head's q, k or v holds a NaN or an infinity, found on the
// head's own thread as it is loaded (run_layer's "NaN in, NaN out" without a
// serial sweep over the inputs, 4% of a call at n = 17 on 2 threads). The
// outputs of such heads are left as the kernels computed them.
TeacherResult teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask,
                      double scale, int T, const Convention& c, bool want_attention = true, const Tuning& tuning = {},
                      bool want_duals = true, std::vector<uint8_t>* nonfinite_heads = nullptr);

// A reduced-budget Sinkhorn normalizer as deployed: the teacher's loop with
// budget T', O (and A) only.
inline TeacherResult sinkhorn_normalizer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& key_mask, double scale, int T_prime, const Convention& c,
                                         bool want_attention = false, const Tuning& tuning = {}) {
  return teacher(q, k, v, key_mask, scale, T_prime, c, want_attention, tuning, /*want_duals=*/false);
}

// Same as asap::run_layer_reference(layer, q, k, v, key_mask, opt) for a
// layer of kind kAsap (opt.closures = 0 uses the layer's default), as one
// fused call per head (docs/performance.md, "The fused ASAP call"): the
// features come from the passes the Sinkhorn loop runs anyway, the map is a
// dot product per row, then the closures; phi_hat, the features and the
// attention matrix are returned only when opt asks for them.
LayerOutput asap_layer(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& key_mask, const RunOptions& opt = {}, const Tuning& tuning = {},
                       std::vector<uint8_t>* nonfinite_heads = nullptr);

// Same as asap::build_features(q, k, log_marginals(key_mask, ...), theta,
// family, scale, eps): the feature matrix Psi [B, H, n, P].
at::Tensor build_features(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_mask,
                          bool drop_padded_queries, const at::Tensor& theta, const FeatureFamily& family, double scale,
                          double eps, const Tuning& tuning = {});

// Selection helper for compile: for each (b, h), the teacher's plan A* with
// budget T, and for every candidate c the plans after k = 1..k_max[c]
// closures from the candidate's predicted dual; returns the relative
// distance ||A - A*||_F / ||A*||_F as float64 [C, max k_max, B, H] (what
// MetricsAccumulator::add_attention averages; 0 beyond a candidate's
// k_max). phi_hat [C, B, H, n] holds centered cost-coordinate duals
// (asap::predict_phi); entries on rows without mass are ignored. No
// [B, H, n, n] tensor is formed.
at::Tensor closure_errors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& key_mask, double scale, int T,
                          const Convention& c, const at::Tensor& phi_hat, const std::vector<int>& k_max,
                          const Tuning& tuning = {});

// ESP hard-sort attention (asap-math.md section 8), the benchmark's
// comparison operator: per slice theta_l the sorted matching sigma_l,
// weights softmax_l(-tau D_l), output O_i = sum_l w_l v_{sigma_l(i)} without
// forming A. theta [d, L]; no key-padding mask. Returns [B, H, n, dv].
at::Tensor esp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& theta,
                         double scale, double tau, const Tuning& tuning = {});

}  // namespace fast
}  // namespace asap

// asap/teacher.h -- the finite Sinkhorn teacher in score coordinates.
//
// asap-math.md sections 1-3. Tensors are [B, H, n, d] (queries, keys) and
// [B, H, n, dv] (values); duals are [B, H, n]; a key-padding mask is [B, n]
// bool (true = token) or undefined. Works in the inputs' dtype (float32 or
// float64) on whatever device they live on.
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/types.h"

namespace asap {

// Log marginals in coupling units, broadcastable against [B, H, n]:
// log_a [B, 1, n] (-inf on dropped query rows), log_b [B, 1, n] (-inf on
// padded keys). Without a mask both are log(1/n) everywhere.
struct LogMarginals {
  at::Tensor log_a, log_b;
  at::Tensor row_active;  // [B, 1, n] bool: rows that carry mass (a_i > 0)
  at::Tensor key_active;  // [B, 1, n] bool: keys in J
};
LogMarginals log_marginals(const at::Tensor& key_mask, int64_t B, int64_t n, bool drop_padded_queries,
                           at::ScalarType dtype, at::Device device);

// S_ij = scale * <q_i, k_j>: [B, H, n, n].
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, double scale);

// col(f)_j = eps log b_j - eps LSE_i((S_ij + f_i)/eps)   (-inf for padded keys)
at::Tensor col_closure(const at::Tensor& S, const at::Tensor& f, const LogMarginals& m, double eps);
// row(g)_i = eps log a_i - eps LSE_j((S_ij + g_j)/eps)   (-inf for dropped rows)
at::Tensor row_closure(const at::Tensor& S, const at::Tensor& g, const LogMarginals& m, double eps);
// Attention n*plan(f, g) (or plan when !multiply_by_n): [B, H, n, n].
at::Tensor plan_attention(const at::Tensor& S, const at::Tensor& f, const at::Tensor& g, const Convention& c);

// alpha_i = (scale/2)||q_i||^2: the query half of the quadratic cost.
at::Tensor cost_alpha(const at::Tensor& q, double scale);
// x [.., n] centered over the rows that carry mass; `fill` on the others
// (0 for feature columns, -inf for duals, as in the golden cases).
at::Tensor center_rows(const at::Tensor& x, const LogMarginals& m, double fill = 0.0);

// The finite loop with budget T >= 1 (odd T ends on a row closure) in plain
// ATen, materialising [B, H, n, n] scores: the specification the fast path
// is tested against (tests/test_fast.cpp). asap::run_teacher (asap/runtime.h)
// chooses between this and the fused kernels.
TeacherResult run_teacher_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& key_mask, double scale, int T, const Convention& c,
                                    bool want_attention = true);

}  // namespace asap

// The one place that chooses between the fused CPU kernels (fast/fast.h)
// and the ATen reference (asap/teacher.h, asap/operator.h) for the public
// entry points run_teacher and run_layer (docs/performance.md, "Layering").
// Neither path knows the other or this file.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "asap/error.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "fast/fast.h"
#include "model/layer_checks.h"

namespace asap {

namespace {

bool half_precision(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

at::Tensor widened(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }

bool all_finite(const at::Tensor& t) { return fast::all_finite(t); }

// NaN in, NaN out (docs/decisions.md): a head whose q, k or
// v holds a NaN or an infinity returns NaN for its whole output, attention
// and predicted dual, as Sinkhorn attention written in PyTorch does (one
// non-finite score spreads through the column normalisations). bad: [B, H].
void fill_nonfinite(LayerOutput& r, const at::Tensor& bad) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (r.out.defined()) r.out = r.out.masked_fill(bad.unsqueeze(-1).unsqueeze(-1), nan);
  if (r.attention.defined()) r.attention = r.attention.masked_fill(bad.unsqueeze(-1).unsqueeze(-1), nan);
  if (r.phi_hat.defined()) r.phi_hat = r.phi_hat.masked_fill(bad.unsqueeze(-1), nan);
  if (r.features.defined()) r.features = r.features.masked_fill(bad.unsqueeze(-1).unsqueeze(-1), nan);
}

// The reference path: checked in one pass over the inputs; heads are
// located only when something is wrong.
void propagate_nonfinite(LayerOutput& r, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (all_finite(q) && all_finite(k) && all_finite(v)) return;
  auto finite = [](const at::Tensor& t) { return t.isfinite().all(-1).all(-1); };  // [B, H]
  fill_nonfinite(r, finite(q).logical_and(finite(k)).logical_and(finite(v)).logical_not());
}

// The fused path: the kernels flag the heads as they load them (fast.h).
void propagate_flagged(LayerOutput& r, const std::vector<uint8_t>& flags, int64_t B, int64_t H) {
  if (std::none_of(flags.begin(), flags.end(), [](uint8_t f) { return f != 0; })) return;
  auto bad = at::empty({B, H}, at::kBool);
  bool* b = bad.data_ptr<bool>();
  for (size_t i = 0; i < flags.size(); ++i) b[i] = flags[i] != 0;
  fill_nonfinite(r, bad);
}

// The fused path for one layer: the teacher's loop as deployed (outputs
// only) for the zero-parameter kinds, the compiled operator otherwise.
LayerOutput run_layer_fast(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& key_mask, const RunOptions& opt) {
  // The thread's flags, their storage kept from call to call (an allocation
  // and a release per call were about 2% of a call of one head at n = 17).
  thread_local std::vector<uint8_t> flags;
  LayerOutput r;
  if (L.kind == OperatorKind::kAsap) {
    r = fast::asap_layer(L, q, k, v, key_mask, opt, {}, &flags);
  } else {
    detail::check_layer_inputs(L, q, k, v);
    const int steps = detail::loop_kind_steps(L, opt);
    auto t = fast::teacher(q, k, v, key_mask, L.spec.score_scale, steps, convention_of(L.spec), opt.return_attention,
                           {}, /*want_duals=*/false, &flags);
    r.out = t.O;
    r.attention = t.A;
  }
  propagate_flagged(r, flags, q.size(0), q.size(1));
  return r;
}

}  // namespace

TeacherResult run_teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask,
                          double scale, int T, const Convention& c, bool want_attention, bool want_duals) {
  if (half_precision(q)) {
    // Half precision in, half precision out: computed in float32: the
    // kernels have no half-precision arithmetic, and float32 keeps the teacher's accuracy.
    auto r = run_teacher(widened(q), widened(k), widened(v), key_mask, scale, T, c, want_attention, want_duals);
    for (at::Tensor* t : {&r.A, &r.O, &r.f, &r.g, &r.f_star, &r.phi_bar_star})
      if (t->defined()) *t = t->to(q.scalar_type());
    return r;
  }
  if (fast::handles(q, k, v, key_mask))
    return fast::teacher(q, k, v, key_mask, scale, T, c, want_attention, {}, want_duals);
  return run_teacher_reference(q, k, v, key_mask, scale, T, c, want_attention);
}

LayerOutput run_layer(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& key_mask, const RunOptions& opt) {
  if (half_precision(q)) {
    // Half precision in, half precision out: computed in float32: the
    // kernels have no half-precision arithmetic, and float32 keeps the teacher's accuracy.
    auto r = run_layer(L, widened(q), widened(k), widened(v), key_mask, opt);
    for (at::Tensor* t : {&r.out, &r.attention, &r.phi_hat, &r.features})
      if (t->defined()) *t = t->to(q.scalar_type());
    return r;
  }
  if (fast::handles(q, k, v, key_mask)) return run_layer_fast(L, q, k, v, key_mask, opt);
  LayerOutput r = run_layer_reference(L, q, k, v, key_mask, opt);
  propagate_nonfinite(r, q, k, v);
  return r;
}

std::string kernel_isa() { return fast::isa_for(); }
std::vector<std::string> kernel_isas() { return fast::available_isas(); }
bool kernels_parallel() { return fast::parallel_build(); }

}  // namespace asap

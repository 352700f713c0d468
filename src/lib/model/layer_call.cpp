// What one call of a compiled layer takes (asap/layer_call.h): below both
// the reference path and the fused kernels.
#include "asap/layer_call.h"

#include "asap/error.h"
#include "model/layer_checks.h"

namespace asap {

Convention convention_of(const LayerSpec& s) {
  Convention c;
  c.eps = s.eps;
  c.drop_padded_queries = s.mask == MaskConvention::kDropQueries;
  c.multiply_by_n = s.multiply_by_n;
  return c;
}

namespace detail {

void check_layer_inputs(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const LayerSpec& s = L.spec;
  ASAP_CHECK(q.dim() == 4 && q.size(1) == s.heads && q.size(3) == s.head_dim, "layer '", s.name, "': q must be [B, ",
             s.heads, ", n, ", s.head_dim, "], found ", q.sizes());
  ASAP_CHECK(k.sizes() == q.sizes(), "layer '", s.name, "': k must have q's shape ", q.sizes(), ", found ", k.sizes());
  ASAP_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == s.heads && v.size(2) == q.size(2), "layer '",
             s.name, "': v must be [", q.size(0), ", ", s.heads, ", ", q.size(2), ", dv], found ", v.sizes());
}

int loop_kind_steps(const CompiledLayer& L, const RunOptions& opt) {
  ASAP_CHECK(opt.closures == 0, "layer '", L.spec.name, "' runs ", L.describe(),
             ", which has no closures to set: pass closures = 0");
  return L.kind == OperatorKind::kSinkhorn ? L.sinkhorn_steps : L.spec.T;
}

}  // namespace detail
}  // namespace asap

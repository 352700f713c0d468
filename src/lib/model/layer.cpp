// Attention-layer projections taken from a checkpoint, normalised to
// separate q/k/v weights in "(h d)" row order.
#include "asap/layer.h"

#include <ATen/ATen.h>

#include "asap/checkpoint.h"
#include "asap/error.h"

namespace asap {

namespace {

// Rows of a [H*dh, ...] weight or [H*dh] bias from "(d h)" to "(h d)" order.
at::Tensor to_head_major(const at::Tensor& t, const LayerSpec& s, int64_t per_head) {
  if (!t.defined() || s.head_layout == "(h d)") return t;
  auto rest = t.sizes().slice(1).vec();
  std::vector<int64_t> shape{per_head, s.heads};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return t.reshape(shape).transpose(0, 1).reshape(t.sizes()).contiguous();
}

at::Tensor get_opt(const Checkpoint& ck, const std::string& name) { return name.empty() ? at::Tensor() : ck.get(name); }

}  // namespace

LayerWeights load_layer_weights(const LayerSpec& s, const Checkpoint& ck) {
  LayerWeights w;
  const int64_t hq = s.heads * s.head_dim;
  if (s.layout == ProjLayout::kFused) {
    auto W = ck.get(s.qkv.weight);
    auto b = get_opt(ck, s.qkv.bias);
    for (int i = 0; i < 3; ++i) {
      const char which = s.qkv_order[i];
      auto Wi = W.slice(0, i * hq, (i + 1) * hq);
      auto bi = b.defined() ? b.slice(0, i * hq, (i + 1) * hq) : at::Tensor();
      at::Tensor& dw = which == 'q' ? w.wq : which == 'k' ? w.wk : w.wv;
      at::Tensor& db = which == 'q' ? w.bq : which == 'k' ? w.bk : w.bv;
      dw = Wi;
      db = bi;
    }
  } else if (s.layout == ProjLayout::kSeparate) {
    w.wq = ck.get(s.q.weight);
    w.bq = get_opt(ck, s.q.bias);
    w.wk = ck.get(s.k.weight);
    w.bk = get_opt(ck, s.k.bias);
    w.wv = ck.get(s.v.weight);
    w.bv = get_opt(ck, s.v.bias);
  } else {
    return w;  // projections unknown: calibration data holds q, k, v
  }
  w.wq = to_head_major(w.wq, s, s.head_dim).contiguous();
  w.wk = to_head_major(w.wk, s, s.head_dim).contiguous();
  w.wv = to_head_major(w.wv, s, s.value_dim).contiguous();
  if (w.bq.defined()) w.bq = to_head_major(w.bq, s, s.head_dim).contiguous();
  if (w.bk.defined()) w.bk = to_head_major(w.bk, s, s.head_dim).contiguous();
  if (w.bv.defined()) w.bv = to_head_major(w.bv, s, s.value_dim).contiguous();
  if (!s.out.weight.empty()) {
    // The output projection consumes merged heads; in "(d h)" its input columns follow that order.
    auto wo = ck.get(s.out.weight);
    if (s.head_layout == "(d h)")
      wo = wo.reshape({wo.size(0), s.value_dim, s.heads}).transpose(1, 2).reshape({wo.size(0), -1}).contiguous();
    w.wo = wo;
    w.bo = get_opt(ck, s.out.bias);
  }
  return w;
}

QKV project_qkv(const LayerSpec& s, const LayerWeights& w, const at::Tensor& x) {
  ASAP_CHECK(w.defined(), "layer '", s.name, "' has no projection weights: give per-head q, k, v instead of x");
  ASAP_CHECK(x.dim() == 3 && x.size(2) == s.d_model, "layer '", s.name, "': activations must be [B, n, ", s.d_model,
             "], found ", x.sizes());
  auto split = [&](const at::Tensor& W, const at::Tensor& b, int64_t per_head) {
    auto y = at::linear(x, W.to(x.scalar_type()), b.defined() ? b.to(x.scalar_type()) : at::Tensor());
    return y.view({x.size(0), x.size(1), s.heads, per_head}).transpose(1, 2).contiguous();
  };
  return {split(w.wq, w.bq, s.head_dim), split(w.wk, w.bk, s.head_dim), split(w.wv, w.bv, s.value_dim)};
}

at::Tensor merge_heads(const LayerSpec& s, const LayerWeights& w, const at::Tensor& o) {
  ASAP_CHECK(o.dim() == 4 && o.size(1) == s.heads, "layer '", s.name, "': head outputs must be [B, ", s.heads,
             ", n, dv], found ", o.sizes());
  auto merged = o.transpose(1, 2).reshape({o.size(0), o.size(2), o.size(1) * o.size(3)});
  if (!w.wo.defined()) return merged;
  return at::linear(merged, w.wo.to(o.scalar_type()), w.bo.defined() ? w.bo.to(o.scalar_type()) : at::Tensor());
}

}  // namespace asap

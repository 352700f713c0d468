// asap/layer.h -- an attention layer's projections, taken from a checkpoint.
//
// Weights are normalised to separate q/k/v matrices [H*dh, d_model] whose
// rows are in "(h d)" order, whatever the checkpoint's layout.
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/spec.h"

namespace asap {

struct LayerWeights {
  at::Tensor wq, bq, wk, bk, wv, bv;  // bias tensors may be undefined
  at::Tensor wo, bo;                  // output projection; undefined = none
  bool defined() const { return wq.defined(); }
};

// Loads and normalises the weights the spec names (validate_spec first).
LayerWeights load_layer_weights(const LayerSpec& spec, const Checkpoint& ckpt);

struct QKV {
  at::Tensor q, k, v;  // [B, H, n, d]
};

// x [B, n, d_model] -> per-head q, k, v [B, H, n, d] in x's dtype.
QKV project_qkv(const LayerSpec& spec, const LayerWeights& w, const at::Tensor& x);

// Head outputs [B, H, n, dv] -> layer output [B, n, H*dv] merged in "(h d)"
// order, then the output projection when the layer has one.
at::Tensor merge_heads(const LayerSpec& spec, const LayerWeights& w, const at::Tensor& heads_out);

}  // namespace asap

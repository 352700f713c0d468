// asap/runtime.h -- running compiled layers in inference code.
//
//   auto model = asap::CompiledModel::load("model.asap.h5");
//   auto out = model->attend("transformer.layers.0.0.fn", q, k, v, key_mask);
//
// q, k [B, H, n, d], v [B, H, n, dv], key_mask [B, n] bool (true = token)
// or undefined; float32 or float64 on any device LibTorch supports (float16
// and bfloat16 are computed in float32 and returned in their dtype). A loaded
// model is immutable and every method is const: calls are thread-safe.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/teacher.h"

namespace asap {

struct RunOptions {
  int closures = 0;               // k >= 1 closures; 0 = the layer's compiled default
  bool return_attention = false;  // also return the [B, H, n, n] attention matrix
};

struct LayerOutput {
  at::Tensor out;        // head outputs [B, H, n, dv]
  at::Tensor attention;  // [B, H, n, n] when requested
  at::Tensor phi_hat;    // predicted centered cost-coordinate dual [B, H, n]
};

// Runs one compiled layer on per-head tensors: CPU float32/float64 inputs on
// the fused kernels of asap/fast.h, others on the reference below.
LayerOutput run_layer(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& key_mask, const RunOptions& opt = {});

// The same operator in plain ATen (asap-math.md section 5 step by step): the
// specification the fast path is tested against.
LayerOutput run_layer_reference(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& key_mask, const RunOptions& opt = {});

// The teacher conventions of a compiled layer.
Convention convention_of(const LayerSpec& spec);

class CompiledModel {
 public:
  static std::shared_ptr<const CompiledModel> load(const std::string& path);
  explicit CompiledModel(Artifact artifact, std::string path = "");

  const Artifact& artifact() const { return art_; }
  const std::string& path() const { return path_; }
  std::vector<std::string> layer_names() const;
  // The layer called `name`; throws asap::Error naming the artifact.
  const CompiledLayer& layer(const std::string& name) const;

  // Head-level attention: q, k, v per head -> head outputs.
  LayerOutput attend(const std::string& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& key_mask = at::Tensor(), const RunOptions& opt = {}) const;
  // Whole attention layer: x [B, n, d_model] -> projections -> attend ->
  // merged heads and the output projection [B, n, d_out]. Needs the
  // projection weights in the artifact.
  at::Tensor forward(const std::string& layer, const at::Tensor& x, const at::Tensor& key_mask = at::Tensor(),
                     const RunOptions& opt = {}) const;

 private:
  Artifact art_;
  std::string path_;
};

}  // namespace asap

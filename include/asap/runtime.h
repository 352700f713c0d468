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
#include "asap/layer_call.h"
#include "asap/operator.h"
#include "asap/teacher.h"

namespace asap {

// The teacher's finite loop with budget T >= 1 (odd T ends on a row
// closure), asap/teacher.h's conventions and results. CPU float32/float64
// inputs run on the fused kernels (asap::fast::teacher); other devices and
// empty batches on the reference (asap::run_teacher_reference); float16 and
// bfloat16 are computed in float32 and returned in their dtype.
// want_attention = false skips materialising A. want_duals = false is the
// teacher as deployed: only O (and A) are returned, without the duals compile
// needs (f, g, f_star and phi_bar_star stay undefined), which is what
// latencies are measured on.
TeacherResult run_teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask,
                          double scale, int T, const Convention& c, bool want_attention = true, bool want_duals = true);

// Runs one compiled layer on per-head tensors: CPU float32/float64 inputs on
// the fused kernels (asap::fast::asap_layer), others on the reference
// (asap::run_layer_reference in asap/operator.h). A head whose q, k or v
// holds NaN or +-inf returns NaN for its whole output, whichever path runs.
LayerOutput run_layer(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& key_mask, const RunOptions& opt = {});

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

// What the fused CPU kernels run on here: the instruction set in use (the
// best this CPU supports, or ASAP_FAST_ISA), every one compiled in and
// supported, best last, and whether at::parallel_for runs in parallel in
// this build (false: LibTorch uses OpenMP and asapc was built without it).
std::string kernel_isa();
std::vector<std::string> kernel_isas();
bool kernels_parallel();

}  // namespace asap

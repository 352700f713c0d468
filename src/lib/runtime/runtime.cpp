// Compiled models for inference code: loading an artifact and naming its
// layers. Which path runs a call is decided in dispatch.cpp.
#include "asap/runtime.h"

#include "asap/error.h"
#include "asap/layer.h"

namespace asap {

std::shared_ptr<const CompiledModel> CompiledModel::load(const std::string& path) {
  return std::make_shared<const CompiledModel>(read_artifact(path), path);
}

CompiledModel::CompiledModel(Artifact artifact, std::string path) : art_(std::move(artifact)), path_(std::move(path)) {}

std::vector<std::string> CompiledModel::layer_names() const {
  std::vector<std::string> names;
  for (const auto& l : art_.layers) names.push_back(l.spec.name);
  return names;
}

const CompiledLayer& CompiledModel::layer(const std::string& name) const {
  const CompiledLayer* l = art_.find(name);
  if (!l) {
    std::string have;
    for (const auto& x : art_.layers) have += (have.empty() ? "'" : ", '") + x.spec.name + "'";
    throw Error(str("artifact '", path_, "' has no layer '", name, "' (it has ", have, ")"));
  }
  return *l;
}

LayerOutput CompiledModel::attend(const std::string& name, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& key_mask, const RunOptions& opt) const {
  return run_layer(layer(name), q, k, v, key_mask, opt);
}

at::Tensor CompiledModel::forward(const std::string& name, const at::Tensor& x, const at::Tensor& key_mask,
                                  const RunOptions& opt) const {
  const CompiledLayer& L = layer(name);
  ASAP_CHECK(L.weights.defined(), "artifact '", path_, "' layer '", name,
             "' carries no projection weights (it was compiled from per-head q, k, v): call attend() instead");
  auto qkv = project_qkv(L.spec, L.weights, x);
  auto r = run_layer(L, qkv.q, qkv.k, qkv.v, key_mask, opt);
  return merge_heads(L.spec, L.weights, r.out);
}

}  // namespace asap

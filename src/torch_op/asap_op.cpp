// libasap_torch_op: asapc's compiled layers as TorchScript custom operators.
//
//   torch.ops.load_library("build/src/torch_op/libasap_torch_op.so")
//   h = torch.ops.asap.load("model.asap.h5")
//   out = torch.ops.asap.attend(h, "transformer.layers.0.0.fn", q, k, v, None, 0)
//
// Ops (namespace `asap`, callable from Python and from TorchScript):
//   load(str path) -> int                         handle of a cached, validated artifact
//   layers(int handle) -> str[]                   compiled layer names, in file order
//   layer_info(int handle, str layer) -> str      JSON: spec, family, coefficients' shape, defaults, fit
//   attend(int handle, str layer, Tensor q, Tensor k, Tensor v, Tensor? key_mask, int closures) -> Tensor
//   attend_with_attention(...same...) -> (Tensor out, Tensor attention)
//   attend_full(...same...) -> (Tensor out, Tensor attention, Tensor phi_hat)
//   forward(int handle, str layer, Tensor x, Tensor? key_mask, int closures) -> Tensor
//   path(int handle) -> str
//   teacher(Tensor q, Tensor k, Tensor v, Tensor? key_mask, float scale, int T, float eps=1,
//           bool drop_padded_queries=False, bool multiply_by_n=True, bool return_attention=False)
//       -> (Tensor out, Tensor attention)      the exact finite Sinkhorn loop, no artifact
//   machine() -> str                              JSON: the kernels' instruction set, the ones
//       available, the thread count and whether at::parallel_for runs in parallel
//
// q, k [B, H, n, d], v [B, H, n, dv], key_mask [B, n] (true / nonzero = token);
// closures = 0 takes the layer's compiled default. A layer whose operator
// kind is "sinkhorn" or "teacher" (format_version 3) runs the teacher's loop
// with T' or T half-steps: it has no closures (pass 0) and attend_full
// returns an empty phi_hat. teacher() returns an empty attention unless
// return_attention is true. Inference only: the
// kernels run under NoGradGuard and their outputs carry no gradient (a
// one-time warning says so when an input requires one). Bad input (unknown
// layer, wrong shape, unreadable artifact) raises ValueError in Python.
//
// The cache is keyed by the canonical path; a file whose size or
// modification time changed is loaded again under a new handle (old handles
// stay valid). Loaded models are immutable, so calls from several threads
// are safe.
//
// This is the one translation unit of asapc that includes the Torch
// frontend headers (torch/library.h); the library proper uses ATen only.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "asap/error.h"
#include "asap/runtime.h"
#include "asap/spec.h"
#include "asap/teacher.h"

namespace {

namespace fs = std::filesystem;

struct FileStamp {
  std::uintmax_t size = 0;
  fs::file_time_type mtime{};
  bool operator==(const FileStamp& o) const { return size == o.size && mtime == o.mtime; }
};

struct Entry {
  std::string path;  // canonical
  FileStamp stamp;
  std::shared_ptr<const asap::CompiledModel> model;
};

class Registry {
 public:
  static Registry& get() {
    static Registry r;
    return r;
  }

  int64_t load(const std::string& path) {
    std::error_code ec;
    TORCH_CHECK_VALUE(!path.empty(), "asap::load: empty artifact path");
    TORCH_CHECK_VALUE(fs::exists(path, ec), "asap::load: artifact '", path, "' does not exist");
    const std::string canon = fs::canonical(path, ec).string();
    TORCH_CHECK_VALUE(!ec, "asap::load: cannot resolve '", path, "': ", ec.message());
    FileStamp stamp{fs::file_size(canon, ec), fs::last_write_time(canon, ec)};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = by_path_.find(canon);
      if (it != by_path_.end() && entries_[it->second].stamp == stamp) return it->second;
    }
    // Read outside the lock: a large artifact does not block other callers.
    std::shared_ptr<const asap::CompiledModel> model;
    try {
      model = asap::CompiledModel::load(canon);
    } catch (const asap::Error& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_path_.find(canon);  // another thread may have won the race
    if (it != by_path_.end() && entries_[it->second].stamp == stamp) return it->second;
    entries_.push_back(Entry{canon, stamp, std::move(model)});
    const int64_t h = static_cast<int64_t>(entries_.size()) - 1;
    by_path_[canon] = h;
    return h;
  }

  std::shared_ptr<const asap::CompiledModel> model(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK_VALUE(handle >= 0 && handle < static_cast<int64_t>(entries_.size()), "asap: unknown artifact handle ",
                      handle, " (", entries_.size(), " loaded; get one from torch.ops.asap.load(path))");
    return entries_[handle].model;
  }

 private:
  std::mutex mu_;
  std::vector<Entry> entries_;  // append-only: a handle is an index and stays valid
  std::map<std::string, int64_t> by_path_;
};

// Runs f, turning asap::Error (bad user input) into a Python ValueError.
template <typename F>
auto guarded(const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const asap::Error& e) {
    TORCH_CHECK_VALUE(false, "asap::", op, ": ", e.what());
    throw;  // not reached
  }
}

// The kernels are inference-only: they run without autograd, and their
// outputs carry no gradient. Say so once when a caller expects one.
void warn_if_grad(const char* op, std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) {
      TORCH_WARN_ONCE("asap::", op, " is inference-only: no gradient flows through it to q, k, v or x");
      return;
    }
}

at::Tensor mask_of(const c10::optional<at::Tensor>& key_mask) {
  if (!key_mask.has_value() || !key_mask->defined()) return at::Tensor();
  const at::Tensor& m = *key_mask;
  TORCH_CHECK_VALUE(!m.is_floating_point() && !m.is_complex(),
                    "asap: key_mask must be bool or integer [B, n] (true / nonzero = token), found ", m.scalar_type());
  return m.to(at::kBool);
}

asap::LayerOutput run(const char* op, int64_t handle, const std::string& layer, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& key_mask,
                      int64_t closures, bool want_attention, bool want_phi = false) {
  TORCH_CHECK_VALUE(closures >= 0, "asap::", op, ": closures must be >= 0 (0 = the layer's default), found ", closures);
  auto model = Registry::get().model(handle);
  warn_if_grad(op, {&q, &k, &v});
  at::NoGradGuard no_grad;
  asap::RunOptions opt;
  opt.closures = static_cast<int>(closures);
  opt.return_attention = want_attention;
  opt.return_phi = want_phi;
  return guarded(op, [&] { return model->attend(layer, q, k, v, mask_of(key_mask), opt); });
}

int64_t op_load(const std::string& path) { return Registry::get().load(path); }

std::string op_path(int64_t handle) { return Registry::get().model(handle)->path(); }

std::vector<std::string> op_layers(int64_t handle) { return Registry::get().model(handle)->layer_names(); }

std::string op_layer_info(int64_t handle, const std::string& layer) {
  auto model = Registry::get().model(handle);
  return guarded("layer_info", [&] {
    const asap::CompiledLayer& L = model->layer(layer);
    asap::TeacherSpec one;
    one.layers.push_back(L.spec);
    nlohmann::json spec;
    asap::to_json(spec, one);
    nlohmann::json j;
    j["artifact"] = model->path();
    j["format_version"] = model->artifact().format_version;
    j["asapc_version"] = model->artifact().asapc_version;
    j["teacher_sha256"] = model->artifact().teacher_sha256;
    j["teacher_file"] = model->artifact().teacher_file;
    j["spec"] = spec["layers"][0];
    j["operator"] = asap::operator_kind_name(L.kind);
    j["sinkhorn_steps"] = L.sinkhorn_steps;
    j["lse_passes"] = L.lse_passes();
    j["describe"] = L.describe();
    const asap::FeatureFamily& f = L.family;
    j["family"] = {{"name", f.name()},
                   {"slices", f.slices},
                   {"alpha", f.alpha},
                   {"softmax_dual", f.softmax_dual},
                   {"sinkhorn_dual3", f.sinkhorn_dual3},
                   {"score_stats", f.score_stats},
                   {"centered_stats", f.centered_stats},
                   {"columns", f.num_columns()},
                   {"feature_passes", f.feature_passes()}};
    j["per_head"] = L.per_head;
    j["coef_shape"] = {L.coef.size(0), L.coef.size(1)};
    j["theta_shape"] = {L.theta.size(0), L.theta.size(1)};
    j["default_closures"] = L.default_closures;
    j["has_weights"] = L.weights.defined();
    j["has_output_projection"] = L.weights.defined() && L.weights.wo.defined();
    nlohmann::json fit = nlohmann::json::parse(L.fit_json, nullptr, /*allow_exceptions=*/false);
    j["fit"] = fit.is_discarded() ? nlohmann::json(L.fit_json) : fit;
    return j.dump();
  });
}

at::Tensor op_attend(int64_t handle, const std::string& layer, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const c10::optional<at::Tensor>& key_mask, int64_t closures) {
  return run("attend", handle, layer, q, k, v, key_mask, closures, false).out;
}

std::tuple<at::Tensor, at::Tensor> op_attend_with_attention(int64_t handle, const std::string& layer,
                                                            const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v,
                                                            const c10::optional<at::Tensor>& key_mask,
                                                            int64_t closures) {
  auto r = run("attend_with_attention", handle, layer, q, k, v, key_mask, closures, true);
  return {r.out, r.attention};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_attend_full(int64_t handle, const std::string& layer,
                                                              const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v,
                                                              const c10::optional<at::Tensor>& key_mask,
                                                              int64_t closures) {
  auto r = run("attend_full", handle, layer, q, k, v, key_mask, closures, true, true);
  // The zero-parameter kinds (sinkhorn, teacher) predict no dual: an empty tensor.
  return {r.out, r.attention, r.phi_hat.defined() ? r.phi_hat : q.new_empty({0})};
}

at::Tensor op_forward(int64_t handle, const std::string& layer, const at::Tensor& x,
                      const c10::optional<at::Tensor>& key_mask, int64_t closures) {
  TORCH_CHECK_VALUE(closures >= 0, "asap::forward: closures must be >= 0 (0 = the layer's default), found ", closures);
  auto model = Registry::get().model(handle);
  warn_if_grad("forward", {&x});
  at::NoGradGuard no_grad;
  asap::RunOptions opt;
  opt.closures = static_cast<int>(closures);
  return guarded("forward", [&] { return model->forward(layer, x, mask_of(key_mask), opt); });
}

// The exact finite Sinkhorn loop (asap::run_teacher, fused kernels on CPU
// float32/float64) for callers with no artifact: patch_model(exact=True).
std::tuple<at::Tensor, at::Tensor> op_teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const c10::optional<at::Tensor>& key_mask, double scale, int64_t T,
                                              double eps, bool drop_padded_queries, bool multiply_by_n,
                                              bool return_attention) {
  TORCH_CHECK_VALUE(T >= 1 && T <= 1000000000, "asap::teacher: T (Sinkhorn half-steps) must be >= 1, found ", T);
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "asap::teacher: eps must be a finite number > 0, found ", eps);
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, "asap::teacher: scale must be a finite number > 0, found ",
                    scale);
  TORCH_CHECK_VALUE(q.dim() == 4, "asap::teacher: q must be [B, H, n, d], found ", q.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                    "asap::teacher: q must be float32 or float64, found ", q.scalar_type());
  TORCH_CHECK_VALUE(k.sizes() == q.sizes(), "asap::teacher: k must have q's shape ", q.sizes(), ", found ", k.sizes());
  TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
                    "asap::teacher: v must be [", q.size(0), ", ", q.size(1), ", ", q.size(2), ", dv], found ",
                    v.sizes());
  TORCH_CHECK_VALUE(k.is_floating_point() && v.is_floating_point(),
                    "asap::teacher: k and v must be floating point, found ", k.scalar_type(), " and ", v.scalar_type());
  warn_if_grad("teacher", {&q, &k, &v});
  at::NoGradGuard no_grad;
  asap::Convention c;
  c.eps = eps;
  c.drop_padded_queries = drop_padded_queries;
  c.multiply_by_n = multiply_by_n;
  const at::Tensor mask = mask_of(key_mask);
  auto r = guarded("teacher", [&] {
    return asap::run_teacher(q, k.to(q.scalar_type()), v.to(q.scalar_type()), mask, scale, static_cast<int>(T), c,
                             return_attention, /*want_duals=*/false);
  });
  return {r.O, return_attention ? r.A : q.new_empty({0})};
}

std::string op_machine() {
  return guarded("machine", []() -> std::string {
    nlohmann::json j;
    j["isa"] = asap::kernel_isa();
    j["available_isas"] = asap::kernel_isas();
    j["threads"] = static_cast<int64_t>(at::get_num_threads());
    j["parallel_build"] = asap::kernels_parallel();
    return j.dump();
  });
}

}  // namespace

TORCH_LIBRARY(asap, m) {
  m.def("load(str path) -> int", op_load);
  m.def("path(int handle) -> str", op_path);
  m.def("layers(int handle) -> str[]", op_layers);
  m.def("layer_info(int handle, str layer) -> str", op_layer_info);
  m.def("attend(int handle, str layer, Tensor q, Tensor k, Tensor v, Tensor? key_mask=None, int closures=0) -> Tensor",
        op_attend);
  m.def(
      "attend_with_attention(int handle, str layer, Tensor q, Tensor k, Tensor v, Tensor? key_mask=None, "
      "int closures=0) -> (Tensor, Tensor)",
      op_attend_with_attention);
  m.def(
      "attend_full(int handle, str layer, Tensor q, Tensor k, Tensor v, Tensor? key_mask=None, "
      "int closures=0) -> (Tensor, Tensor, Tensor)",
      op_attend_full);
  m.def("forward(int handle, str layer, Tensor x, Tensor? key_mask=None, int closures=0) -> Tensor", op_forward);
  m.def(
      "teacher(Tensor q, Tensor k, Tensor v, Tensor? key_mask, float scale, int T, float eps=1.0, "
      "bool drop_padded_queries=False, bool multiply_by_n=True, bool return_attention=False) -> (Tensor, Tensor)",
      op_teacher);
  m.def("machine() -> str", op_machine);
}

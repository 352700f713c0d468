// Layout detection for `asapc inspect`: recognises the attention layers of
// common code bases by their parameter names.
#include <ATen/core/Tensor.h>

#include <cmath>
#include <map>
#include <set>

#include "asap/checkpoint.h"
#include "asap/error.h"
#include "asap/spec.h"

namespace asap {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string opt_name(const Checkpoint& ck, const std::string& name) { return ck.has(name) ? name : ""; }

struct Pattern {
  const char* layout_name;
  const char* anchor;  // suffix of the tensor that marks a layer (after the module path)
};

// Fills the geometry of a layer from its query weight rows and the options.
void fill_geometry(LayerSpec& l, int64_t q_rows, int64_t d_model, const DetectOptions& opt, DetectedLayers& out,
                   bool head_count_unknowable) {
  l.d_model = d_model;
  if (opt.heads > 0) {
    ASAP_CHECK(q_rows % opt.heads == 0, "--heads ", opt.heads, " does not divide the query width ", q_rows,
               " of layer '", l.name, "'");
    l.heads = opt.heads;
  } else {
    l.heads = 0;
  }
  l.head_dim = l.heads > 0 ? q_rows / l.heads : 0;
  l.value_dim = l.head_dim;
  (void)head_count_unknowable;
  (void)out;
}

}  // namespace

DetectedLayers detect_layers(const Checkpoint& ck, const DetectOptions& opt) {
  DetectedLayers out;
  std::map<std::string, std::vector<LayerSpec>> by_layout;  // layout name -> layers in file order
  for (const auto& name : ck.names) {
    const auto& w = ck.tensors.at(name);
    LayerSpec l;
    std::string layout;
    if (ends_with(name, ".to_qkv.weight") && w.dim() == 2 && w.size(0) % 3 == 0) {
      // Sinkformer / vit-pytorch: fused, chunk(3) as q, k, v, heads '(h d)'.
      l.name = name.substr(0, name.size() - std::string(".to_qkv.weight").size());
      l.layout = ProjLayout::kFused;
      l.qkv = {name, opt_name(ck, l.name + ".to_qkv.bias")};
      l.out = {opt_name(ck, l.name + ".to_out.0.weight"), opt_name(ck, l.name + ".to_out.0.bias")};
      fill_geometry(l, w.size(0) / 3, w.size(1), opt, out, true);
      layout = "sinkformer-vit";
    } else if (ends_with(name, ".WQ.weight") && w.dim() == 2) {
      // Sinkformer text model: WQ/WK/WV with bias, output 'linear'.
      l.name = name.substr(0, name.size() - std::string(".WQ.weight").size());
      l.layout = ProjLayout::kSeparate;
      l.q = {name, opt_name(ck, l.name + ".WQ.bias")};
      l.k = {l.name + ".WK.weight", opt_name(ck, l.name + ".WK.bias")};
      l.v = {l.name + ".WV.weight", opt_name(ck, l.name + ".WV.bias")};
      l.out = {opt_name(ck, l.name + ".linear.weight"), opt_name(ck, l.name + ".linear.bias")};
      fill_geometry(l, w.size(0), w.size(1), opt, out, true);
      layout = "sinkformer-text";
    } else if (ends_with(name, ".fc_q.weight") && w.dim() == 2) {
      l.name = name.substr(0, name.size() - std::string(".fc_q.weight").size());
      l.layout = ProjLayout::kSeparate;
      l.q = {name, opt_name(ck, l.name + ".fc_q.bias")};
      l.k = {l.name + ".fc_k.weight", opt_name(ck, l.name + ".fc_k.bias")};
      l.v = {l.name + ".fc_v.weight", opt_name(ck, l.name + ".fc_v.bias")};
      fill_geometry(l, w.size(0), w.size(1), opt, out, true);
      layout = "set-transformer";
    } else if (ends_with(name, ".in_proj_weight") && w.dim() == 2 && w.size(0) % 3 == 0) {
      l.name = name.substr(0, name.size() - std::string(".in_proj_weight").size());
      l.layout = ProjLayout::kFused;
      l.qkv = {name, opt_name(ck, l.name + ".in_proj_bias")};
      l.out = {opt_name(ck, l.name + ".out_proj.weight"), opt_name(ck, l.name + ".out_proj.bias")};
      fill_geometry(l, w.size(0) / 3, w.size(1), opt, out, true);
      layout = "nn.MultiheadAttention";
    } else if (ends_with(name, ".q_proj.weight") && w.dim() == 2) {
      l.name = name.substr(0, name.size() - std::string(".q_proj.weight").size());
      l.layout = ProjLayout::kSeparate;
      l.q = {name, opt_name(ck, l.name + ".q_proj.bias")};
      l.k = {l.name + ".k_proj.weight", opt_name(ck, l.name + ".k_proj.bias")};
      l.v = {l.name + ".v_proj.weight", opt_name(ck, l.name + ".v_proj.bias")};
      const std::string o = ck.has(l.name + ".o_proj.weight") ? ".o_proj" : ".out_proj";
      l.out = {opt_name(ck, l.name + o + ".weight"), opt_name(ck, l.name + o + ".bias")};
      fill_geometry(l, w.size(0), w.size(1), opt, out, true);
      layout = "hf-qkv";
    } else {
      continue;
    }
    // Separate layouts need all three weights.
    if (l.layout == ProjLayout::kSeparate && (!ck.has(l.k.weight) || !ck.has(l.v.weight))) {
      out.notes.push_back(str("'", name, "' looks like a query projection but '", l.k.weight, "' or '", l.v.weight,
                              "' is missing; skipped"));
      continue;
    }
    if (l.layout == ProjLayout::kSeparate && l.heads > 0) l.value_dim = ck.tensors.at(l.v.weight).size(0) / l.heads;
    l.T = opt.T;
    l.eps = opt.eps;
    l.mask = opt.mask;
    if (opt.score_scale > 0)
      l.score_scale = opt.score_scale;
    else if (layout == "set-transformer")
      l.score_scale = 1.0 / std::sqrt(static_cast<double>(l.heads * l.head_dim));  // 1/sqrt(dim_V)
    else if (l.head_dim > 0)
      l.score_scale = 1.0 / std::sqrt(static_cast<double>(l.head_dim));
    by_layout[layout].push_back(l);
  }
  if (by_layout.empty()) return out;
  // The layout with the most layers wins; others are reported.
  auto best = by_layout.begin();
  for (auto it = by_layout.begin(); it != by_layout.end(); ++it)
    if (it->second.size() > best->second.size()) best = it;
  out.layout_name = best->first;
  out.spec.layers = best->second;
  for (const auto& kv : by_layout)
    if (kv.first != best->first)
      out.notes.push_back(str(kv.second.size(), " layer(s) of layout ", kv.first, " also found and left out"));
  if (out.layout_name == "set-transformer")
    out.notes.push_back(
        "set-transformer MAB blocks add a residual Q + A.V and apply fc_o inside a ReLU residual: asapc compiles "
        "the attention (head outputs A.V) only; 'out' is left null");
  if (out.layout_name == "sinkformer-text")
    out.notes.push_back("Sinkformer text layers mask padded keys (-1e9) and keep every query row: mask = keep_queries");
  std::set<std::string> missing;
  if (opt.heads <= 0) missing.insert("heads (number of attention heads; pass --heads)");
  if (opt.T <= 0) missing.insert("T (Sinkhorn budget, Sinkformer's max_iter; pass --T)");
  out.missing.assign(missing.begin(), missing.end());
  return out;
}

}  // namespace asap

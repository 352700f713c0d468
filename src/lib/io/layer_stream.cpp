#include "io/layer_stream.h"
#include "io/batches.h"

#include <ATen/ATen.h>

#include "asap/checkpoint.h"
#include "asap/error.h"

namespace asap {

LayerStream::LayerStream(const CalibFile& calib, const LayerSpec& spec, const Checkpoint& ck, bool float64,
                         int64_t max_examples)
    : LayerStream(calib, spec, load_layer_weights(spec, ck), float64, max_examples) {
  // A ViT-style learned position embedding [1, n, d_model] fixes the sequence length.
  for (const char* name : {"pos_embedding", "pos_embed", "module.pos_embedding"}) {
    if (!ck.has(name)) continue;
    const auto& pe = ck.tensors.at(name);
    if (pe.dim() == 3 && pe.size(0) == 1 && pe.size(2) == spec.d_model)
      ASAP_CHECK(pe.size(1) == n_, "calibration file '", calib.path(), "': layer '", spec.name,
                 "' has sequences of n = ", n_, " tokens but checkpoint '", ck.path, "' tensor '", name, "' is ",
                 pe.sizes(), " (n = ", pe.size(1), ")");
  }
}

LayerStream::LayerStream(const CalibFile& calib, const LayerSpec& spec, LayerWeights weights, bool float64,
                         int64_t max_examples)
    : calib_(calib), spec_(spec), w_(std::move(weights)), float64_(float64) {
  ASAP_CHECK(
      calib.has_layer(spec.name), "calibration file '", calib.path(), "' has no layer '", spec.name,
      "' (teacher spec layers must be recorded; the file has: ",
      [&] {
        std::string s;
        for (const auto& n : calib.layer_names()) s += (s.empty() ? "'" : ", '") + n + "'";
        return s.empty() ? std::string("none") : s;
      }(),
      ")");
  info_ = calib.info(spec.name);
  N_ = info_.N;
  if (max_examples > 0) N_ = std::min(N_, max_examples);
  n_ = info_.n;
  check_info();
}

void LayerStream::check_info() {
  const std::string where = str("calibration file '", calib_.path(), "': layer '", spec_.name, "'");
  ASAP_CHECK(N_ >= 1, where, " holds no examples (N = 0): an empty calibration set cannot be compiled");
  if (info_.projected) {
    ASAP_CHECK(info_.heads == spec_.heads && info_.head_dim == spec_.head_dim, where, " has q/k of ", info_.heads,
               " heads x ", info_.head_dim, " dims but the teacher spec says ", spec_.heads, " x ", spec_.head_dim);
    ASAP_CHECK(info_.has_v, where, " has projected q and k but no v: values are needed for head outputs");
  } else {
    ASAP_CHECK(w_.defined(), where,
               " holds activations x, but the teacher spec layer has layout 'none' "
               "(no projection weights): record per-head q, k, v instead");
    ASAP_CHECK(info_.d_model == spec_.d_model, where, " has activations of width d_model = ", info_.d_model,
               " but the checkpoint's projections expect ", spec_.d_model);
  }
}

HeadBatch LayerStream::to_heads(CalibBatch b) const {
  HeadBatch h;
  h.mask = b.mask;
  const auto dtype = float64_ ? at::kDouble : at::kFloat;
  if (b.x.defined()) {
    h.x = b.x.to(dtype);
    auto qkv = project_qkv(spec_, w_, h.x);
    h.q = qkv.q;
    h.k = qkv.k;
    h.v = qkv.v;
  } else {
    h.q = b.q.to(dtype);
    h.k = b.k.to(dtype);
    h.v = b.v.to(dtype);
  }
  return h;
}

const std::string& LayerStream::calib_path() const { return calib_.path(); }

HeadBatch LayerStream::read(int64_t start, int64_t count) const {
  CalibBatch b = calib_.read(spec_.name, start - first_, count);
  for (const at::Tensor* t : {&b.x, &b.q, &b.k, &b.v, &b.mask})
    if (t->defined()) bytes_read_ += static_cast<int64_t>(t->nbytes());
  return to_heads(std::move(b));
}

HeadBatch LayerStream::read_indices(const std::vector<int64_t>& idx) const {
  std::vector<HeadBatch> parts;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i + 1;
    while (j < idx.size() && idx[j] == idx[j - 1] + 1) ++j;
    parts.push_back(read(idx[i], static_cast<int64_t>(j - i)));
    i = j;
  }
  ASAP_ASSERT(!parts.empty());
  if (parts.size() == 1) return parts[0];
  auto cat = [&](at::Tensor HeadBatch::*f) { return detail::cat_field(parts, f); };
  HeadBatch h;
  h.q = cat(&HeadBatch::q);
  h.k = cat(&HeadBatch::k);
  h.v = cat(&HeadBatch::v);
  h.x = cat(&HeadBatch::x);
  h.mask = cat(&HeadBatch::mask);
  return h;
}

}  // namespace asap

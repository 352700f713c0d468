// The teacher spec (docs/teacher-spec.md): JSON round trip and validation
// against a checkpoint.
#include "asap/spec.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "asap/checkpoint.h"
#include "asap/error.h"
#include "util/atomic_file.h"

namespace asap {

using nlohmann::json;

const LayerSpec* TeacherSpec::find(const std::string& name) const {
  for (const auto& l : layers)
    if (l.name == name) return &l;
  return nullptr;
}

namespace {

const char* layout_str(ProjLayout l) {
  switch (l) {
    case ProjLayout::kFused:
      return "fused";
    case ProjLayout::kSeparate:
      return "separate";
    case ProjLayout::kNone:
      return "none";
  }
  return "?";
}

json linear_json(const LinearNames& l) {
  if (l.weight.empty()) return nullptr;
  return json{{"weight", l.weight}, {"bias", l.bias.empty() ? json(nullptr) : json(l.bias)}};
}

// Field readers that name the source, the layer and the field in errors.
struct Reader {
  const std::string& source;
  std::string where;  // "layer 2 ('blocks.2.attn')"

  const json& need(const json& o, const char* key) const {
    ASAP_CHECK(o.contains(key), "teacher spec '", source, "': ", where, " is missing field '", key, "'");
    return o.at(key);
  }
  std::string string(const json& o, const char* key) const {
    const json& v = need(o, key);
    ASAP_CHECK(v.is_string(), "teacher spec '", source, "': ", where, " field '", key, "' must be a string, found ",
               v.dump());
    return v.get<std::string>();
  }
  int64_t integer(const json& o, const char* key, int64_t min) const {
    const json& v = need(o, key);
    ASAP_CHECK(v.is_number_integer() && v.get<int64_t>() >= min, "teacher spec '", source, "': ", where, " field '",
               key, "' must be an integer >= ", min, ", found ", v.dump());
    return v.get<int64_t>();
  }
  double number(const json& o, const char* key, bool positive) const {
    const json& v = need(o, key);
    ASAP_CHECK(v.is_number() && std::isfinite(v.get<double>()) && (!positive || v.get<double>() > 0), "teacher spec '",
               source, "': ", where, " field '", key, "' must be a ", positive ? "positive " : "",
               "finite number, found ", v.dump());
    return v.get<double>();
  }
  LinearNames linear(const json& o, const char* key, bool optional) const {
    LinearNames l;
    if (optional && (!o.contains(key) || o.at(key).is_null())) return l;
    const json& v = need(o, key);
    ASAP_CHECK(v.is_object(), "teacher spec '", source, "': ", where, " field '", key,
               "' must be an object {\"weight\": name, \"bias\": name or null}, found ", v.dump());
    l.weight = string(v, "weight");
    if (v.contains("bias") && !v.at("bias").is_null()) {
      ASAP_CHECK(v.at("bias").is_string(), "teacher spec '", source, "': ", where, " field '", key,
                 ".bias' must be a string or null, found ", v.at("bias").dump());
      l.bias = v.at("bias").get<std::string>();
    }
    return l;
  }
};

}  // namespace

void to_json(json& j, const TeacherSpec& spec) {
  j = json{{"format", kSpecFormat}, {"version", kSpecVersion}, {"model", spec.model}, {"layers", json::array()}};
  for (const auto& l : spec.layers) {
    json e{{"name", l.name}, {"layout", layout_str(l.layout)}};
    if (l.layout == ProjLayout::kFused) {
      e["qkv"] = linear_json(l.qkv);
      e["qkv_order"] = l.qkv_order;
    } else if (l.layout == ProjLayout::kSeparate) {
      e["q"] = linear_json(l.q);
      e["k"] = linear_json(l.k);
      e["v"] = linear_json(l.v);
    }
    e["out"] = linear_json(l.out);
    e["head_layout"] = l.head_layout;
    e["d_model"] = l.d_model;
    e["heads"] = l.heads;
    e["head_dim"] = l.head_dim;
    e["value_dim"] = l.value_dim;
    e["score_scale"] = l.score_scale;
    e["eps"] = l.eps;
    e["T"] = l.T;
    e["mask"] = l.mask == MaskConvention::kKeepQueries ? "keep_queries" : "drop_queries";
    e["multiply_by_n"] = l.multiply_by_n;
    j["layers"].push_back(e);
  }
}

TeacherSpec spec_from_json(const json& j, const std::string& source) {
  Reader top{source, "the top level"};
  ASAP_CHECK(j.is_object(), "teacher spec '", source, "': expected a JSON object, found ", j.type_name());
  const std::string fmt = top.string(j, "format");
  ASAP_CHECK(fmt == kSpecFormat, "teacher spec '", source, "': field 'format' must be \"", kSpecFormat, "\", found \"",
             fmt, "\"");
  const int64_t ver = top.integer(j, "version", 0);
  ASAP_CHECK(ver >= 1 && ver <= kSpecVersion, "teacher spec '", source, "' has version ", ver,
             " but this asapc reads versions 1 to ", kSpecVersion);
  TeacherSpec spec;
  if (j.contains("model") && j.at("model").is_string()) spec.model = j.at("model").get<std::string>();
  const json& layers = top.need(j, "layers");
  ASAP_CHECK(layers.is_array() && !layers.empty(), "teacher spec '", source,
             "': field 'layers' must be a non-empty list, found ", layers.dump().substr(0, 60));
  for (size_t i = 0; i < layers.size(); ++i) {
    const json& o = layers[i];
    Reader r{source, str("layer ", i)};
    ASAP_CHECK(o.is_object(), "teacher spec '", source, "': layer ", i, " must be an object");
    LayerSpec l;
    l.name = r.string(o, "name");
    r.where = str("layer ", i, " ('", l.name, "')");
    ASAP_CHECK(!l.name.empty() && l.name.find('/') == std::string::npos, "teacher spec '", source, "': ", r.where,
               " field 'name' must be a non-empty module path without '/'");
    ASAP_CHECK(spec.find(l.name) == nullptr, "teacher spec '", source, "': layer name '", l.name, "' appears twice");
    const std::string layout = r.string(o, "layout");
    if (layout == "fused") {
      l.layout = ProjLayout::kFused;
      l.qkv = r.linear(o, "qkv", false);
      l.qkv_order = o.contains("qkv_order") ? r.string(o, "qkv_order") : "qkv";
      std::string sorted = l.qkv_order;
      std::sort(sorted.begin(), sorted.end());
      ASAP_CHECK(sorted == "kqv", "teacher spec '", source, "': ", r.where,
                 " field 'qkv_order' must be a permutation of \"qkv\", found \"", l.qkv_order, "\"");
    } else if (layout == "separate") {
      l.layout = ProjLayout::kSeparate;
      l.q = r.linear(o, "q", false);
      l.k = r.linear(o, "k", false);
      l.v = r.linear(o, "v", false);
    } else if (layout == "none") {
      l.layout = ProjLayout::kNone;
    } else {
      throw Error(str("teacher spec '", source, "': ", r.where,
                      " field 'layout' must be \"fused\", \"separate\" or \"none\", found \"", layout, "\""));
    }
    l.out = r.linear(o, "out", true);
    l.head_layout = o.contains("head_layout") ? r.string(o, "head_layout") : "(h d)";
    ASAP_CHECK(l.head_layout == "(h d)" || l.head_layout == "(d h)", "teacher spec '", source, "': ", r.where,
               " field 'head_layout' must be \"(h d)\" or \"(d h)\", found \"", l.head_layout, "\"");
    l.d_model = l.layout == ProjLayout::kNone && !o.contains("d_model") ? 0 : r.integer(o, "d_model", 1);
    l.heads = r.integer(o, "heads", 1);
    l.head_dim = r.integer(o, "head_dim", 1);
    l.value_dim = o.contains("value_dim") ? r.integer(o, "value_dim", 1) : l.head_dim;
    l.score_scale = r.number(o, "score_scale", true);
    l.eps = r.number(o, "eps", true);
    const int64_t T = r.integer(o, "T", 1);
    // A finite Sinkhorn budget of more than 10000 half-steps is no trained
    // Sinkformer (the official code uses 1-10); compile would run for days.
    ASAP_CHECK(T <= kMaxSinkhornSteps, "teacher spec '", source, "': ", r.where, " field 'T' must be at most ",
               kMaxSinkhornSteps, " Sinkhorn half-steps, found ", T);
    l.T = static_cast<int>(T);
    const std::string mask = o.contains("mask") ? r.string(o, "mask") : "keep_queries";
    ASAP_CHECK(mask == "keep_queries" || mask == "drop_queries", "teacher spec '", source, "': ", r.where,
               " field 'mask' must be \"keep_queries\" or \"drop_queries\", found \"", mask, "\"");
    l.mask = mask == "keep_queries" ? MaskConvention::kKeepQueries : MaskConvention::kDropQueries;
    if (o.contains("multiply_by_n")) {
      ASAP_CHECK(o.at("multiply_by_n").is_boolean(), "teacher spec '", source, "': ", r.where,
                 " field 'multiply_by_n' must be true or false, found ", o.at("multiply_by_n").dump());
      l.multiply_by_n = o.at("multiply_by_n").get<bool>();
    }
    spec.layers.push_back(l);
  }
  return spec;
}

TeacherSpec read_spec(const std::string& path) {
  std::ifstream in(path);
  ASAP_CHECK(in.good(), "teacher spec '", path, "' cannot be opened (missing or unreadable)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e666
    throw Error(str("teacher spec '", path, "' is not valid JSON: ", e.what()));
  }
  return spec_from_json(j, path);
}

void write_spec(const std::string& path, const TeacherSpec& spec) {
  json j;
  to_json(j, spec);
  write_file_atomically(path, j.dump(2) + "\n");
}

namespace {

void check_tensor(const Checkpoint& ck, const std::string& spec_path, const LayerSpec& l, const char* field,
                  const std::string& name, std::vector<int64_t> shape) {
  ASAP_CHECK(ck.has(name), "teacher spec '", spec_path, "': layer '", l.name, "' field '", field, "' names tensor '",
             name, "', which checkpoint '", ck.path, "' does not contain");
  const auto& t = ck.tensors.at(name);
  ASAP_CHECK(t.sizes().vec() == shape, "teacher spec '", spec_path, "': layer '", l.name, "' field '", field,
             "': tensor '", name, "' has shape ", t.sizes(), " but the spec implies ", at::IntArrayRef(shape));
  ASAP_CHECK(t.is_floating_point(), "teacher spec '", spec_path, "': layer '", l.name, "' field '", field,
             "': tensor '", name, "' has non-floating dtype ", t.scalar_type());
}

}  // namespace

void validate_spec(const TeacherSpec& spec, const Checkpoint& ck, const std::string& spec_path) {
  for (const auto& l : spec.layers) {
    const int64_t hq = l.heads * l.head_dim, hv = l.heads * l.value_dim;
    if (l.layout == ProjLayout::kFused) {
      ASAP_CHECK(ck.has(l.qkv.weight), "teacher spec '", spec_path, "': layer '", l.name,
                 "' field 'qkv.weight' names tensor '", l.qkv.weight, "', which checkpoint '", ck.path,
                 "' does not contain");
      const auto& w = ck.tensors.at(l.qkv.weight);
      ASAP_CHECK(w.dim() == 2 && w.size(0) % 3 == 0, "teacher spec '", spec_path, "': layer '", l.name,
                 "': fused qkv weight '", l.qkv.weight,
                 "' must be [3*heads*head_dim, d_model] with rows divisible by 3, found ", w.sizes());
      ASAP_CHECK(hq == hv, "teacher spec '", spec_path, "': layer '", l.name,
                 "': a fused qkv layout needs value_dim == head_dim, found ", l.value_dim, " and ", l.head_dim);
      check_tensor(ck, spec_path, l, "qkv.weight", l.qkv.weight, {3 * hq, l.d_model});
      if (!l.qkv.bias.empty()) check_tensor(ck, spec_path, l, "qkv.bias", l.qkv.bias, {3 * hq});
    } else if (l.layout == ProjLayout::kSeparate) {
      check_tensor(ck, spec_path, l, "q.weight", l.q.weight, {hq, l.d_model});
      check_tensor(ck, spec_path, l, "k.weight", l.k.weight, {hq, l.d_model});
      check_tensor(ck, spec_path, l, "v.weight", l.v.weight, {hv, l.d_model});
      if (!l.q.bias.empty()) check_tensor(ck, spec_path, l, "q.bias", l.q.bias, {hq});
      if (!l.k.bias.empty()) check_tensor(ck, spec_path, l, "k.bias", l.k.bias, {hq});
      if (!l.v.bias.empty()) check_tensor(ck, spec_path, l, "v.bias", l.v.bias, {hv});
    }
    if (!l.out.weight.empty()) {
      ASAP_CHECK(ck.has(l.out.weight), "teacher spec '", spec_path, "': layer '", l.name,
                 "' field 'out.weight' names tensor '", l.out.weight, "', which checkpoint '", ck.path,
                 "' does not contain");
      const auto& w = ck.tensors.at(l.out.weight);
      ASAP_CHECK(w.dim() == 2 && w.size(1) == hv, "teacher spec '", spec_path, "': layer '", l.name,
                 "' field 'out.weight': tensor '", l.out.weight, "' has shape ", w.sizes(),
                 " but the spec implies [d_out, ", hv, "]");
      if (!l.out.bias.empty()) check_tensor(ck, spec_path, l, "out.bias", l.out.bias, {w.size(0)});
    }
  }
}

}  // namespace asap

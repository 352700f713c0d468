// asap/spec.h -- the teacher spec: what a state_dict does not say.
//
// A state_dict holds no Sinkhorn budget T, entropy eps, score scale or mask
// convention, and projection layouts differ between code bases. The teacher
// spec (JSON, documented in docs/teacher-spec.md) describes each attention
// layer. `asapc inspect CHECKPOINT` detects common layouts and prints one.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace asap {

struct Checkpoint;

// How padded keys are handled. Padded key columns always carry zero mass.
enum class MaskConvention {
  kKeepQueries,  // every query row keeps a_i = 1/n (released Sinkformer text code)
  kDropQueries,  // padded query rows carry no mass (a_i = 0)
};

enum class ProjLayout {
  kFused,     // one weight [3*H*dh, d_model] (ViT to_qkv, nn.MultiheadAttention in_proj)
  kSeparate,  // three weights [H*dh, d_model] (WQ/WK/WV, q_proj/k_proj/v_proj, fc_q/...)
  kNone,      // no projections known: calibration data holds q, k, v per head
};

struct LinearNames {
  std::string weight;  // tensor name in the checkpoint; empty = absent
  std::string bias;    // empty = no bias
};

struct LayerSpec {
  std::string name;  // module path of the attention layer, e.g. "transformer.layers.0.0.fn"
  ProjLayout layout = ProjLayout::kFused;
  LinearNames qkv;                // kFused
  std::string qkv_order = "qkv";  // kFused: order of the three chunks along dim 0
  LinearNames q, k, v;            // kSeparate
  LinearNames out;                // output projection; weight empty = none
  // "(h d)": feature index = head*head_dim + i (einops 'b n (h d)', view(B,n,H,dh)).
  // "(d h)": feature index = i*heads + head.
  std::string head_layout = "(h d)";
  int64_t d_model = 0;  // input width of the projections
  int64_t heads = 0;
  int64_t head_dim = 0;    // query/key dim per head
  int64_t value_dim = 0;   // value dim per head (usually head_dim)
  double score_scale = 0;  // S = score_scale * <q, k>
  double eps = 1.0;        // entropy
  int T = 0;               // Sinkhorn budget (half-steps, Sinkformer's max_iter)
  MaskConvention mask = MaskConvention::kKeepQueries;
  bool multiply_by_n = true;  // attention = n * plan (Sinkformer) or plan itself
};

struct TeacherSpec {
  std::string model;  // free text: what the checkpoint is
  std::vector<LayerSpec> layers;
  const LayerSpec* find(const std::string& name) const;
};

constexpr const char* kSpecFormat = "asapc-teacher-spec";
constexpr int kSpecVersion = 1;
// Largest Sinkhorn budget T a teacher spec may declare: far above any real
// Sinkformer (T <= 20), low enough that a damaged spec cannot ask for a loop
// that never ends.
constexpr int64_t kMaxSinkhornSteps = 10000;

// JSON round trip; from_json validates every field and names it in errors.
void to_json(nlohmann::json& j, const TeacherSpec& spec);
TeacherSpec spec_from_json(const nlohmann::json& j, const std::string& source);
TeacherSpec read_spec(const std::string& path);
void write_spec(const std::string& path, const TeacherSpec& spec);

// Checks every tensor the spec names exists in the checkpoint with the shape
// the spec implies; throws asap::Error naming spec file, layer, field.
void validate_spec(const TeacherSpec& spec, const Checkpoint& ckpt, const std::string& spec_path);

// Layout detection for `asapc inspect`.
struct DetectedLayers {
  std::string layout_name;           // "sinkformer-vit", "sinkformer-text", "set-transformer",
                                     // "nn.MultiheadAttention", "hf-qkv", or "" when nothing matched
  TeacherSpec spec;                  // T, eps are filled from the options below (0 = unknown)
  std::vector<std::string> notes;    // what was assumed, e.g. head count source
  std::vector<std::string> missing;  // fields that could not be known, e.g. "T"
};
struct DetectOptions {
  int T = 0;  // 0: unknown
  double eps = 1.0;
  int64_t heads = 0;       // 0: infer when the layout allows, else reported missing
  double score_scale = 0;  // 0: 1/sqrt(head_dim)
  MaskConvention mask = MaskConvention::kKeepQueries;
};
DetectedLayers detect_layers(const Checkpoint& ckpt, const DetectOptions& opt);

}  // namespace asap

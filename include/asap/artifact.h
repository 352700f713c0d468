// asap/artifact.h -- the compiled artifact (HDF5; docs/artifact-format.md).
//
// Self-describing: format name and integer version, the asapc version, the
// teacher checkpoint's SHA-256, and per layer the teacher's conventions, the
// slice bank, the feature family, the coefficients, the default number of
// closures, the projection weights, and the fit options and diagnostics.
// Writers go to a temporary file and rename; readers validate everything
// before use and name the file and field in every error.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "asap/layer.h"
#include "asap/spec.h"

namespace asap {

constexpr const char* kArtifactFormat = "asapc-artifact";
// Format history:
//   1 -- first version.
//   2 -- feature group "sinkhorn_dual3" (the teacher's dual after 3 steps).
//        Files without it are written as version 1, so older readers still
//        read them; version-1 files read unchanged.
//   3 -- operator kinds (layer attribute "operator"): a layer may store a
//        reduced-budget Sinkhorn normalizer ("sinkhorn", with
//        "sinkhorn_steps" = T' < T) or the exact teacher ("teacher")
//        instead of an ASAP map; such layers have no feature columns.
//        Files whose layers are all ASAP maps keep the oldest version that
//        can express them.
//   4 -- every string (attributes, "fit_json") is a fixed-length HDF5 string,
//        never variable-length, so no reader follows pointers into HDF5's
//        global heap (issue 28). Every file is written as version 4. Files
//        of versions 1-3 hold variable-length strings and are refused with
//        how to convert them (tools/h5_fixed_strings.py) or compile again;
//        see docs/decisions.md.
constexpr int kArtifactVersion = 4;
constexpr int kArtifactFixedStringsSince = 4;
constexpr int kArtifactOldestReadable = 1;

// Which columns the feature matrix Psi holds, in this fixed order:
//   [ slice potentials 0..slices-1 | alpha | softmax_dual | sinkhorn_dual3 ].
// Every column is centered over the mass-carrying query rows.
struct FeatureFamily {
  int64_t slices = 0;          // sliced Kantorovich potentials (asap-math.md section 4)
  bool alpha = false;          // centered query cost offset (s/2)||q_i||^2 (section 6b)
  bool softmax_dual = false;   // centered softmax dual f1 = row(0) + alpha (section 6b): 1 pass
  bool sinkhorn_dual3 = false; // centered teacher dual after 3 steps, f3 = row(col(row(0))) + alpha:
                               // 3 passes (f1 comes free on the way); format version 2
  int64_t num_columns() const {
    return slices + (alpha ? 1 : 0) + (softmax_dual ? 1 : 0) + (sinkhorn_dual3 ? 1 : 0);
  }
  // Log-sum-exp passes the features cost before any closure.
  int feature_passes() const { return sinkhorn_dual3 ? 3 : softmax_dual ? 1 : 0; }
  std::string name() const;    // e.g. "L64+alpha+softmax+sinkhorn3"
  bool operator==(const FeatureFamily& o) const {
    return slices == o.slices && alpha == o.alpha && softmax_dual == o.softmax_dual &&
           sinkhorn_dual3 == o.sinkhorn_dual3;
  }
};

// What a compiled layer runs at inference (format version 3). The
// zero-parameter kinds are what compile stores when, on this machine and
// shape, no ASAP map is both faster than the teacher and closer to it than
// Sinkhorn of equal latency (docs/decisions.md).
enum class OperatorKind {
  kAsap,      // predicted dual + default_closures closures (asap-math.md section 5)
  kSinkhorn,  // the teacher's own loop cut to sinkhorn_steps = T' < T half-steps
  kTeacher,   // the exact teacher: T half-steps
};
const char* operator_kind_name(OperatorKind k);  // "asap", "sinkhorn", "teacher"

struct CompiledLayer {
  OperatorKind kind = OperatorKind::kAsap;
  int sinkhorn_steps = 0;  // T' for kSinkhorn (1 <= T' < T); 0 otherwise
  LayerSpec spec;          // teacher conventions: name, heads, dims, scale, eps, T, mask, n-multiplier
  at::Tensor theta;        // [head_dim, slices_stored] float64, unit-norm columns
  FeatureFamily family;    // family.slices <= theta.size(1): a prefix of the bank is used
  bool per_head = false;   // one coefficient row per head, else one per layer
  at::Tensor coef;         // [per_head ? heads : 1, family.num_columns()] float64
  int default_closures = 0;  // k used when the caller does not ask
  LayerWeights weights;      // projections (may be undefined when compiled from q/k/v)
  std::string fit_json;      // fit options, diagnostics and selection, as JSON text
  // Log-sum-exp half-steps the layer runs: T' (sinkhorn), T (teacher), or
  // the features' passes plus the default closures (asap).
  int lse_passes() const;
  // "asap L16+alpha+softmax/head k=1", "sinkhorn T'=4", "teacher T=6".
  std::string describe() const;
};

struct Artifact {
  int format_version = kArtifactVersion;
  std::string asapc_version;
  std::string teacher_sha256;  // of the checkpoint compiled from
  std::string teacher_file;    // its file name, for messages
  std::string created_utc;     // ISO-8601
  std::vector<CompiledLayer> layers;
  const CompiledLayer* find(const std::string& name) const;
};

// Writes to PATH.tmp-XXXX in the same directory, then renames.
void write_artifact(const std::string& path, const Artifact& art);
// Validates format, version, shapes against metadata and finiteness.
Artifact read_artifact(const std::string& path);

}  // namespace asap

namespace asap {
// The root 'format' attribute of an HDF5 file ("asapc-artifact",
// "asapc-calib", ...); "" when the file does not start with the HDF5
// signature or has no such attribute. Throws asap::Error (one sentence) for
// a damaged HDF5 file or an unreadable 'format'. A variable-length 'format'
// is not read: the file is taken for an artifact when it has 'format_version'
// and for a calibration file when it has 'version', whose readers refuse it.
std::string hdf5_format_of(const std::string& path);
}  // namespace asap

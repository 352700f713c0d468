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

#include "asap/types.h"

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
//        global heap, which HDF5 1.10 does not check (a damaged heap crashes, hangs
//        or allocates gigabytes: docs/reliability.md). Every file is written as version 4. Files
//        of versions 1-3 hold variable-length strings and are refused with
//        how to convert them (tools/h5_fixed_strings.py) or compile again;
//        see docs/decisions.md.
//   5 -- feature group "score_stats" (three columns: the max, mean and
//        standard deviation of each query row's scores). Files without it
//        are written as version 4, so readers of version 4 still read them.
//   6 -- feature group "centered_stats" (two columns after score_stats: the
//        max and the variance of each query row's scores less the keys'
//        column means). Only files with it are written as version 6.
constexpr int kArtifactVersion = 6;
constexpr int kArtifactScoreStatsSince = 5;
constexpr int kArtifactCenteredStatsSince = 6;
constexpr int kArtifactFixedStringsSince = 4;
constexpr int kArtifactOldestReadable = 1;

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

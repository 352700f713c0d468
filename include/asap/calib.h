// asap/calib.h -- the HDF5 calibration stream (docs/calibration-format.md).
//
// For each attention layer (named as in the teacher spec), either the layer's
// input activations x [N, n, d_model] or already-projected per-head q, k (and
// v) [N, H, n, d]; an optional key-padding mask [N, n] (1 = token, 0 = pad),
// per layer or shared at the root. Read in bounded batches.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace asap {

constexpr const char* kCalibFormat = "asapc-calib";
// Version history: 1 -- first version (h5py's variable-length strings);
// 2 -- the root attribute "format" (and every other string) is a fixed-length
// string, so no reader follows a pointer into HDF5's unchecked global heap.
// Version-1 files are refused with how to convert them
// (tools/h5_fixed_strings.py); docs/decisions.md.
constexpr int kCalibVersion = 2;
constexpr int kCalibFixedStringsSince = 2;

struct CalibBatch {
  int64_t start = 0;   // index of the first example in the file
  at::Tensor x;        // [b, n, d_model] float32/float64, or undefined
  at::Tensor q, k, v;  // [b, H, n, d], or undefined (v may be undefined)
  at::Tensor mask;     // [b, n] bool (true = token), or undefined (no padding)
};

class CalibLayer;

class CalibFile {
 public:
  explicit CalibFile(const std::string& path);  // validates format/version
  // A set of files read as one: examples are numbered through the files in
  // the given order. Every file must record the same layers with the same
  // shapes apart from N (the error names the file and the field).
  explicit CalibFile(const std::vector<std::string>& paths);
  ~CalibFile();
  CalibFile(const CalibFile&) = delete;
  CalibFile& operator=(const CalibFile&) = delete;

  // The file, or "first ... last (k files)" for a set (for messages).
  const std::string& path() const { return path_; }
  const std::vector<std::string>& paths() const { return paths_; }
  std::vector<std::string> layer_names() const;
  bool has_layer(const std::string& name) const;

  // Metadata of one layer; throws asap::Error naming the file and layer.
  struct LayerInfo {
    std::string name;
    bool projected = false;  // q/k(/v) instead of x
    bool has_v = false;
    bool has_mask = false;
    int64_t N = 0, n = 0;
    int64_t d_model = 0;                             // when !projected
    int64_t heads = 0, head_dim = 0, value_dim = 0;  // when projected
  };
  LayerInfo info(const std::string& layer) const;

  // Reads examples [start, start+count) of a layer. Values are checked for
  // NaN/Inf; the error names the layer and the example index.
  CalibBatch read(const std::string& layer, int64_t start, int64_t count) const;
  // N of a layer in each file of the set.
  std::vector<int64_t> examples_per_file(const std::string& layer) const;

 private:
  std::string path_;
  std::vector<std::string> paths_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writer used by tests and tools (the Python recorder writes the same format).
struct CalibLayerData {
  std::string name;
  at::Tensor x;        // [N, n, d_model] or undefined
  at::Tensor q, k, v;  // [N, H, n, d] or undefined
  at::Tensor mask;     // [N, n] or undefined
};
void write_calib(const std::string& path, const std::vector<CalibLayerData>& layers,
                 const at::Tensor& shared_mask = at::Tensor());

}  // namespace asap

// Streams one layer's calibration examples as per-head q, k, v in bounded
// batches, projecting input activations with the checkpoint's weights.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "asap/calib.h"
#include "asap/layer.h"
#include "asap/spec.h"

namespace asap {

struct Checkpoint;

struct HeadBatch {
  at::Tensor q, k, v;  // [B, H, n, d]
  at::Tensor x;        // [B, n, d_model] input activations (undefined for projected data)
  at::Tensor mask;     // [B, n] bool or undefined
};

class LayerStream {
 public:
  // Validates the layer against the calibration file and the checkpoint:
  // presence, d_model, heads/head dims, and n against a ViT-style position
  // embedding when the checkpoint has one. max_examples > 0 caps N.
  LayerStream(const CalibFile& calib, const LayerSpec& spec, const Checkpoint& ckpt, bool float64,
              int64_t max_examples = 0);
  // Without a checkpoint (projected data, or weights given directly).
  LayerStream(const CalibFile& calib, const LayerSpec& spec, LayerWeights weights, bool float64,
              int64_t max_examples = 0);

  // Examples in this process's calibration files.
  int64_t num_examples() const { return N_; }
  const std::string& calib_path() const;
  // The global index of this process's first example (asap/dist.h, Shards):
  // read() and read_indices() take global indices. 0 in a single process.
  void set_first_example(int64_t first) { first_ = first; }
  // Bytes of calibration data read so far.
  int64_t bytes_read() const { return bytes_read_; }
  int64_t seq_len() const { return n_; }
  const LayerWeights& weights() const { return w_; }
  HeadBatch read(int64_t start, int64_t count) const;
  // Examples at the given (sorted) indices, read in contiguous runs.
  HeadBatch read_indices(const std::vector<int64_t>& idx) const;

 private:
  void check_info();
  HeadBatch to_heads(CalibBatch b) const;
  const CalibFile& calib_;
  const LayerSpec& spec_;
  LayerWeights w_;
  bool float64_;
  CalibFile::LayerInfo info_;
  int64_t N_ = 0, n_ = 0, first_ = 0;
  mutable int64_t bytes_read_ = 0;
};

}  // namespace asap

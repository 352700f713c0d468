// asap/checkpoint.h -- reading PyTorch checkpoints without Python.
//
// Reads what torch.save writes (zip format, PyTorch >= 1.6) with a restricted
// unpickler that never executes code, and .safetensors files:
//   * a plain state_dict (OrderedDict of tensors),
//   * checkpoint dicts that nest one ('model_state_dict', 'state_dict',
//     'net', 'model', ...), with DataParallel 'module.' prefixes stripped,
//   * whole pickled nn.Module files (torch.save(model)): parameters and
//     buffers are found by walking the object tree's _parameters/_buffers,
//   * .safetensors files.
// Anything else (legacy non-zip files, unsupported opcodes, truncated
// archives) is refused with asap::Error naming the file and what was found.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace asap {

struct Checkpoint {
  std::string path;                                     // the file as given
  std::string kind;                                     // e.g. "state_dict", "checkpoint dict['model_state_dict']",
                                                        // "pickled module", "safetensors"
  std::string sha256;                                   // lowercase hex digest of the whole file
  std::string stripped_prefix;                          // e.g. "module." when a DataParallel prefix was removed
  std::vector<std::string> names;                       // tensor names in file order
  std::unordered_map<std::string, at::Tensor> tensors;  // contiguous CPU tensors

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  // The tensor called `name`; throws asap::Error naming the file when absent.
  const at::Tensor& get(const std::string& name) const;
};

// Loads a checkpoint; the format is detected from the file's bytes.
Checkpoint load_checkpoint(const std::string& path);

// SHA-256 of a file's bytes / of a buffer, as lowercase hex.
std::string sha256_file(const std::string& path);
std::string sha256_hex(const void* data, std::size_t size);

}  // namespace asap

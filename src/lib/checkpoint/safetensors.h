// checkpoint/safetensors.h -- parsing the .safetensors layout.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data section after the header), then the raw data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"

namespace asap::detail {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute byte offsets into the file
};

// True when the bytes look like a safetensors file (a plausible header
// length followed by '{').
bool looks_like_safetensors(const uint8_t* data, std::size_t size);

// Parses and validates the header: dtypes, shapes, offsets within the file and
// consistent with shape * element size. Entries come in data-offset order.
// `context` prefixes errors, e.g. "checkpoint 'model.safetensors'".
std::vector<SafetensorsEntry> parse_safetensors(const uint8_t* data, std::size_t size, const std::string& context);

}  // namespace asap::detail

// .safetensors header parsing; see safetensors.h.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "asap/error.h"

namespace asap::detail {
namespace {

uint64_t header_length(const uint8_t* data) {
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = n << 8 | data[k];
  return n;
}

bool parse_dtype(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::Float32}, {"F64", DType::Float64}, {"F16", DType::Float16}, {"BF16", DType::BFloat16},
      {"I64", DType::Int64},   {"I32", DType::Int32},   {"I16", DType::Int16},   {"I8", DType::Int8},
      {"U8", DType::UInt8},    {"BOOL", DType::Bool}};
  for (const auto& [n, t] : table)
    if (s == n) {
      out = t;
      return true;
    }
  return false;
}

}  // namespace

bool looks_like_safetensors(const uint8_t* data, std::size_t size) {
  if (size < 9) return false;
  uint64_t n = header_length(data);
  // The header is JSON text starting with '{'; a corrupt length is still
  // recognised (and reported) as long as the '{' is there.
  return data[8] == '{' && n >= 2;
}

std::vector<SafetensorsEntry> parse_safetensors(const uint8_t* data, std::size_t size, const std::string& ctx) {
  auto fail = [&](const std::string& what) { throw Error(ctx + ": " + what); };
  if (size < 8) fail(str("safetensors file has only ", size, " bytes, too few for its 8-byte header length"));
  uint64_t n = header_length(data);
  if (n > size - 8)
    fail(str("safetensors header length ", n, " runs past the end of the ", size,
             "-byte file; the file is truncated or corrupt"));
  const char* text = reinterpret_cast<const char*>(data + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    fail(str("safetensors header is not valid JSON (", e.what(), ")"));
  }
  if (!header.is_object()) fail("safetensors header is not a JSON object");

  const uint64_t data_start = 8 + n, data_size = size - data_start;
  std::vector<SafetensorsEntry> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;  // free-form string map
    const std::string where = "safetensors tensor '" + name + "'";
    if (!info.is_object()) fail(where + " is not a JSON object");
    SafetensorsEntry e;
    e.name = name;
    const auto dt = info.find("dtype");
    if (dt == info.end() || !dt->is_string()) fail(where + " has no \"dtype\" string");
    if (!parse_dtype(dt->get<std::string>(), e.dtype))
      fail(str(where, " has unsupported dtype ", dt->dump(),
               " (supported: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL)"));
    const auto shape = info.find("shape");
    if (shape == info.end() || !shape->is_array()) fail(where + " has no \"shape\" array");
    // numel * element size must fit in the file, so check each step for overflow.
    uint64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned())
        fail(str(where, " has a shape entry ", d.dump(), " that is not a non-negative integer"));
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) fail(str(where, " has an absurd shape entry ", v));
      e.shape.push_back(static_cast<int64_t>(v));
      if (v != 0 && numel > data_size / v)
        numel = data_size + 1;  // certainly too big; reported below
      else
        numel *= v;
    }
    const auto offs = info.find("data_offsets");
    if (offs == info.end() || !offs->is_array() || offs->size() != 2 || !(*offs)[0].is_number_unsigned() ||
        !(*offs)[1].is_number_unsigned())
      fail(where + " has no \"data_offsets\" pair of non-negative integers");
    uint64_t begin = (*offs)[0].get<uint64_t>(), end = (*offs)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(str(where, " has data_offsets [", begin, ", ", end, "] outside the ", data_size,
               "-byte data section; the file is truncated or corrupt"));
    const uint64_t elem = element_size(e.dtype);
    if (numel > data_size || end - begin != numel * elem)
      fail(str(where, " has ", end - begin, " bytes of data but its shape and dtype need ",
               numel > data_size ? std::string("more than the file holds") : std::to_string(numel * elem)));
    e.begin = data_start + begin;
    e.end = data_start + end;
    out.push_back(std::move(e));
  }
  // nlohmann sorts keys; the file's data order is the natural tensor order.
  std::stable_sort(out.begin(), out.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  return out;
}

}  // namespace asap::detail

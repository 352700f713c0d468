// checkpoint/dtype.h -- the element types the checkpoint readers accept.
//
// Kept free of ATen so the pickle and safetensors parsers stay light;
// checkpoint.cpp maps these to at::ScalarType.
#pragma once
#include <cstddef>
#include <string>

namespace asap::detail {

enum class DType { Float32, Float64, Float16, BFloat16, Int64, Int32, Int16, Int8, UInt8, Bool };

inline std::size_t element_size(DType t) {
  switch (t) {
    case DType::Float64:
    case DType::Int64:
      return 8;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16:
      return 2;
    default:
      return 1;
  }
}

// The torch spelling, e.g. "float32", used in messages.
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int64:
      return "int64";
    case DType::Int32:
      return "int32";
    case DType::Int16:
      return "int16";
    case DType::Int8:
      return "int8";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

}  // namespace asap::detail

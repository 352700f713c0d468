// checkpoint/unpickler.h -- a restricted pickle VM for torch.save's data.pkl.
//
// Nothing is ever imported or executed. GLOBALs name either a reducer we
// know (torch._utils._rebuild_tensor_v2, collections.OrderedDict, builtins.set,
// ...) or anything else, which becomes an inert Object remembering its class
// name, constructor arguments and BUILD state. So torch.save(model) files load
// as a tree of Objects whose state dicts hold _parameters/_buffers/_modules.
//
// Values live in an arena owned by the Pickle result and point at each other
// with raw pointers: pickles may contain cycles and very deep nesting, which
// must neither leak nor overflow the stack on destruction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint/dtype.h"

namespace asap::detail {

struct Value;

// A tensor as rebuilt by torch._utils._rebuild_tensor_v2: a strided view of a
// storage record. Its bounds are checked when it is materialized.
struct TensorRef {
  const Value* storage = nullptr;  // a Value of kind Storage
  DType dtype = DType::Float32;
  int64_t offset = 0;  // in elements
  std::vector<int64_t> sizes, strides;
  bool is_parameter = false;
};

struct Value {
  enum class Kind {
    None,
    Bool,
    Int,
    BigInt,
    Float,
    Str,
    Bytes,
    Tuple,
    List,
    Dict,
    Set,
    Global,
    Object,
    Storage,
    Tensor
  };
  Kind kind = Kind::None;
  bool b = false;              // Bool; for Dict: it is an OrderedDict; for Set: frozen
  int64_t i = 0;               // Int; Storage: element count
  double f = 0;                // Float
  std::string s;               // Str/Bytes; BigInt: its decimal or hex text; Global/Object: "module.name";
                               // Storage: record key
  DType dtype = DType::UInt8;  // Storage
  std::string location;        // Storage: e.g. "cpu", "cuda:0"
  std::vector<Value*> items;   // Tuple/List/Set; Object: constructor args
  std::vector<std::pair<Value*, Value*>> entries;      // Dict, in insertion order
  std::unordered_map<std::string, std::size_t> index;  // Dict: hashable key -> entries position
  Value* state = nullptr;                              // Object/Dict: the BUILD state
  std::unique_ptr<TensorRef> tensor;                   // Tensor

  // The value stored under string key `key` of a Dict, or nullptr.
  const Value* get(std::string_view key) const;
  bool is_str() const { return kind == Kind::Str; }
};

// Short description for messages: "dict", "OrderedDict with 3 entries", "object __main__.Net", ...
std::string describe(const Value& v);

struct Pickle {
  std::vector<std::unique_ptr<Value>> arena;
  Value* root = nullptr;
  int protocol = 0;
};

// Runs `bytes` through the restricted VM. `context` prefixes every error,
// e.g. "checkpoint 'model.pt': data.pkl"; errors end with "at byte N".
Pickle unpickle(std::string_view bytes, const std::string& context);

}  // namespace asap::detail

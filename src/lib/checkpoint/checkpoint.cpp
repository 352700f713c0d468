// load_checkpoint: format detection, state-dict discovery, tensor materialization.
#include "asap/checkpoint.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_set>

#include "asap/error.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/unpickler.h"
#include "checkpoint/zip_reader.h"

namespace asap {
namespace {

using detail::DType;
using detail::Value;
using Kind = Value::Kind;

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::Float32:
      return at::kFloat;
    case DType::Float64:
      return at::kDouble;
    case DType::Float16:
      return at::kHalf;
    case DType::BFloat16:
      return at::kBFloat16;
    case DType::Int64:
      return at::kLong;
    case DType::Int32:
      return at::kInt;
    case DType::Int16:
      return at::kShort;
    case DType::Int8:
      return at::kChar;
    case DType::UInt8:
      return at::kByte;
    case DType::Bool:
      return at::kBool;
  }
  ASAP_ASSERT(false);
}

// A fresh tensor holding a copy of `bytes`. Bool bytes other than 0/1 would be
// undefined behaviour in ATen, so they are normalised to 1.
at::Tensor copy_bytes(const uint8_t* bytes, std::vector<int64_t> shape, DType dtype) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(scalar_type(dtype)));
  const std::size_t n = static_cast<std::size_t>(t.numel()) * detail::element_size(dtype);
  if (n) std::memcpy(t.data_ptr(), bytes, n);
  if (dtype == DType::Bool) {
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (std::size_t k = 0; k < n; ++k) p[k] = p[k] != 0;
  }
  return t;
}

std::string join_shape(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (std::size_t k = 0; k < v.size(); ++k) out += (k ? ", " : "") + std::to_string(v[k]);
  return out + "]";
}

// --- finding the state dict in an unpickled object tree ---

struct Found {
  std::vector<std::pair<std::string, const Value*>> tensors;  // name -> Tensor value, in order
  std::string kind;
};

bool is_tensor_dict(const Value* v) {
  if (v->kind != Kind::Dict || v->entries.empty()) return false;
  for (const auto& [k, x] : v->entries)
    if (k->kind != Kind::Str || x->kind != Kind::Tensor) return false;
  return true;
}

// An object's attribute dict: BUILD state is the dict itself or (dict, slots).
const Value* attributes(const Value* o) {
  if (o->kind != Kind::Object || !o->state) return nullptr;
  const Value* s = o->state;
  if (s->kind == Kind::Tuple && s->items.size() == 2) s = s->items[0];
  return s->kind == Kind::Dict ? s : nullptr;
}

bool is_module(const Value* v) {
  const Value* a = attributes(v);
  return a && (a->get("_parameters") || a->get("_modules"));
}

// Collects what module.state_dict() would return: own parameters, then
// persistent buffers, then each child's with "child." prepended.
void collect_module(const Value* m, const std::string& prefix, int depth, const std::string& ctx, Found& out,
                    std::size_t& visits) {
  ASAP_CHECK(depth < 256, ctx, ": pickled module tree is nested more than 256 levels deep at '", prefix, "'");
  // Submodules may be shared (memo), so a small pickle can describe an
  // exponentially large tree; real models stay far below this.
  ASAP_CHECK(++visits <= 1000000, ctx, ": pickled module tree has more than a million submodules");
  const Value* a = attributes(m);
  std::unordered_set<std::string> non_persistent;
  if (const Value* np = a->get("_non_persistent_buffers_set"); np && np->kind == Kind::Set)
    for (const Value* x : np->items)
      if (x->kind == Kind::Str) non_persistent.insert(x->s);
  for (const char* field : {"_parameters", "_buffers"}) {
    const Value* d = a->get(field);
    if (!d) continue;
    ASAP_CHECK(d->kind == Kind::Dict, ctx, ": pickled module '", prefix.empty() ? m->s : prefix, "' has ", field,
               " that is ", detail::describe(*d), ", not a dict");
    for (const auto& [k, v] : d->entries) {
      if (v->kind == Kind::None) continue;  // e.g. Linear(bias=False) registers bias = None
      ASAP_CHECK(k->kind == Kind::Str, ctx, ": pickled module '", m->s, "' has a non-string key in ", field);
      if (field[1] == 'b' && non_persistent.count(k->s)) continue;
      ASAP_CHECK(v->kind == Kind::Tensor, ctx, ": pickled module entry '", prefix + k->s, "' in ", field, " is ",
                 detail::describe(*v), ", not a tensor");
      out.tensors.emplace_back(prefix + k->s, v);
    }
  }
  if (const Value* children = a->get("_modules"); children && children->kind == Kind::Dict) {
    for (const auto& [k, child] : children->entries) {
      if (child->kind == Kind::None || k->kind != Kind::Str) continue;
      ASAP_CHECK(is_module(child), ctx, ": pickled submodule '", prefix + k->s, "' is ", detail::describe(*child),
                 ", not an nn.Module");
      collect_module(child, prefix + k->s + ".", depth + 1, ctx, out, visits);
    }
  }
}

bool take(const Value* v, const std::string& where, const std::string& ctx, Found& out) {
  if (is_tensor_dict(v)) {
    for (const auto& [k, x] : v->entries) out.tensors.emplace_back(k->s, x);
    out.kind = where.empty() ? "state_dict" : where;
    return true;
  }
  if (is_module(v)) {
    std::size_t visits = 0;
    collect_module(v, "", 0, ctx, out, visits);
    std::string mod = "pickled module (" + v->s + ")";
    out.kind = where.empty() ? mod : where + ", " + mod;
    return true;
  }
  return false;
}

Found find_state_dict(const Value* root, const std::string& ctx, const std::string& path) {
  Found out;
  if (take(root, "", ctx, out)) return out;
  if (root->kind == Kind::Dict) {
    // Training scripts nest the weights under one of a few habitual keys.
    static const char* keys[] = {"state_dict", "model_state_dict", "model_state",   "model",
                                 "net",        "network",          "module",        "weights",
                                 "params",     "parameters",       "model_weights", "ema"};
    for (const char* key : keys)
      if (const Value* v = root->get(key); v && take(v, str("checkpoint dict['", key, "']"), ctx, out)) return out;
    std::vector<std::string> candidates;
    const Value* only = nullptr;
    for (const auto& [k, v] : root->entries)
      if (k->kind == Kind::Str && (is_tensor_dict(v) || is_module(v))) {
        candidates.push_back("'" + k->s + "'");
        only = v;
      }
    if (candidates.size() == 1) {
      take(only, "checkpoint dict[" + candidates[0] + "]", ctx, out);
      return out;
    }
    if (candidates.size() > 1) {
      std::string list;
      for (const auto& c : candidates) list += (list.empty() ? "" : ", ") + c;
      throw Error(str(ctx, " holds several state dicts (under ", list,
                      ") and none under a usual key such as 'state_dict'; save the one you want on its own, "
                      "e.g. python3 -c \"import torch; c = torch.load('",
                      path, "', map_location='cpu'); torch.save(c[", candidates[0], "], '", path, ".new')\""));
    }
  }
  throw Error(str("no tensors found in ", ctx, ": top-level object is ", detail::describe(*root)));
}

// --- zip (torch.save) checkpoints ---

std::string hex_bytes(const uint8_t* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t k = 0; k < n; ++k) {
    if (k) out += ' ';
    out += digits[p[k] >> 4];
    out += digits[p[k] & 15];
  }
  return out;
}

class TorchZipLoader {
 public:
  TorchZipLoader(const detail::MappedFile& file, const std::string& ctx, const std::string& path)
      : zip_(file.data(), file.size(), ctx), ctx_(ctx), path_(path) {}

  void load(Checkpoint& ck) {
    const detail::ZipEntry* pkl = nullptr;
    for (const auto& e : zip_.entries()) {
      std::size_t slash = e.name.find('/');
      if (slash != std::string::npos && e.name.compare(slash + 1, std::string::npos, "data.pkl") == 0) {
        pkl = &e;
        prefix_ = e.name.substr(0, slash + 1);
        break;
      }
    }
    if (!pkl) {
      std::string first = zip_.entries().empty() ? "none" : "'" + zip_.entries()[0].name + "'";
      throw Error(str(ctx_,
                      ": zip archive has no <folder>/data.pkl record, so it was not written by torch.save "
                      "(first entry: ",
                      first, ")"));
    }
    if (zip_.find(prefix_ + "constants.pkl") || zip_.find(prefix_ + "code/"))
      throw Error(str(ctx_,
                      " is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; save its "
                      "weights with torch.save(torch.jit.load('",
                      path_, "').state_dict(), '", path_, ".pt')"));
    for (const auto& e : zip_.entries())
      if (e.name.rfind(prefix_ + "code/", 0) == 0)
        throw Error(str(ctx_, " is a TorchScript archive (torch.jit.save), not a torch.save checkpoint"));
    if (const detail::ZipEntry* bo = zip_.find(prefix_ + "byteorder")) {
      std::string_view order = zip_.read(*bo);
      ASAP_CHECK(order == "little", ctx_, ": tensors are stored in '", order,
                 "' byte order but only little-endian checkpoints are supported");
    }
    detail::Pickle pickle = detail::unpickle(zip_.read(*pkl), ctx_ + ": data.pkl");
    Found found = find_state_dict(pickle.root, ctx_, path_);
    ck.kind = found.kind;
    for (const auto& [name, v] : found.tensors) {
      ASAP_CHECK(!ck.tensors.count(name), ctx_, ": tensor name '", name, "' occurs twice");
      ck.names.push_back(name);
      ck.tensors.emplace(name, materialize(name, *v->tensor));
    }
  }

 private:
  // The storage's bytes as a flat tensor of `dtype`, loaded once per record.
  const at::Tensor& storage(const std::string& tensor, const Value& st, DType dtype) {
    const std::string key = st.s + "/" + detail::dtype_name(dtype);
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    const std::string record = prefix_ + "data/" + st.s;
    const detail::ZipEntry* e = zip_.find(record);
    ASAP_CHECK(e, ctx_, ": tensor '", tensor, "' refers to storage record '", record, "', which is missing");
    std::string_view bytes = zip_.read(*e);
    const std::size_t st_elem = detail::element_size(st.dtype);
    ASAP_CHECK(static_cast<uint64_t>(st.i) <= bytes.size() / st_elem, ctx_, ": storage record '", record, "' holds ",
               bytes.size(), " bytes but tensor '", tensor, "' says it has ", st.i, " ", detail::dtype_name(st.dtype),
               " elements (", st.i, " x ", st_elem, " bytes); the file is corrupt");
    const int64_t numel = static_cast<int64_t>(static_cast<uint64_t>(st.i) * st_elem / detail::element_size(dtype));
    return storages_.emplace(key, copy_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), {numel}, dtype))
        .first->second;
  }

  at::Tensor materialize(const std::string& name, const detail::TensorRef& r) {
    // Bounds: the furthest element offset + sum((size - 1) * stride) must lie
    // inside the storage. Each step is checked against the storage size, so
    // nothing overflows.
    const at::Tensor& st = storage(name, *r.storage, r.dtype);
    const uint64_t avail = static_cast<uint64_t>(st.numel());
    bool empty = false;
    for (int64_t s : r.sizes) empty = empty || s == 0;
    uint64_t last = static_cast<uint64_t>(r.offset);
    bool inside = last <= avail;
    if (!empty) {
      for (std::size_t d = 0; d < r.sizes.size() && inside; ++d) {
        uint64_t span = static_cast<uint64_t>(r.sizes[d] - 1), stride = static_cast<uint64_t>(r.strides[d]);
        if (stride != 0 && span > (avail - last) / stride)
          inside = false;
        else
          last += span * stride;
      }
      inside = inside && last < avail;
    }
    ASAP_CHECK(inside, ctx_, ": tensor '", name, "' (shape ", join_shape(r.sizes), ", stride ", join_shape(r.strides),
               ", offset ", r.offset, ") reaches past the end of its storage '", prefix_, "data/", r.storage->s,
               "', which holds only ", avail, " ", detail::dtype_name(r.dtype), " elements; the file is corrupt");
    at::Tensor t = st.as_strided(r.sizes, r.strides, r.offset).contiguous();
    // A slice of a larger shared storage gets its own compact copy, so it
    // does not pin the whole storage in memory.
    if (t.storage().nbytes() != t.nbytes()) t = t.clone();
    return t;
  }

  detail::ZipReader zip_;
  std::string ctx_, path_, prefix_;
  std::map<std::string, at::Tensor> storages_;
};

void load_safetensors(const detail::MappedFile& file, const std::string& ctx, Checkpoint& ck) {
  auto entries = detail::parse_safetensors(file.data(), file.size(), ctx);
  ASAP_CHECK(!entries.empty(), "no tensors found in ", ctx, ": the safetensors header lists none");
  ck.kind = "safetensors";
  for (const auto& e : entries) {
    ck.names.push_back(e.name);
    ck.tensors.emplace(e.name, copy_bytes(file.data() + e.begin, e.shape, e.dtype));
  }
}

// The pickle of torch.save's legacy magic number 0x1950a86a20f9469cfc6c as
// LONG1 (after PROTO n); legacy files start with it.
bool is_legacy_torch(const uint8_t* p, std::size_t n) {
  static const uint8_t tail[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  return n >= 14 && p[0] == 0x80 && std::memcmp(p + 2, tail, sizeof tail) == 0;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

const at::Tensor& Checkpoint::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::string msg = str("checkpoint '", path, "' has no tensor '", name, "'");
  // Close names: same name under another prefix, or a few edits away.
  std::vector<std::pair<std::size_t, std::string>> close;
  if (names.size() <= 20000) {
    for (const auto& n : names) {
      std::size_t d = (ends_with(n, "." + name) || ends_with(name, "." + n)) ? 0 : edit_distance(n, name);
      if (d <= std::max<std::size_t>(2, name.size() / 5)) close.emplace_back(d, n);
    }
    std::stable_sort(close.begin(), close.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  if (!close.empty()) {
    msg += "; did you mean ";
    for (std::size_t k = 0; k < close.size() && k < 3; ++k) msg += (k ? ", '" : "'") + close[k].second + "'";
    msg += "?";
  } else if (names.empty()) {
    msg += " (it holds no tensors)";
  } else {
    msg += str(" (it holds ", names.size(), " tensors, e.g. '", names[0], "')");
  }
  throw Error(msg);
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::string ctx = "checkpoint '" + path + "'";
  detail::MappedFile file(path);
  const uint8_t* p = file.data();
  const std::size_t n = file.size();
  ASAP_CHECK(n > 0, ctx, " is empty");

  Checkpoint ck;
  ck.path = path;
  if (n >= 4 && p[0] == 'P' && p[1] == 'K' && ((p[2] == 3 && p[3] == 4) || (p[2] == 5 && p[3] == 6))) {
    TorchZipLoader(file, ctx, path).load(ck);
  } else if (is_legacy_torch(p, n)) {
    throw Error(str(ctx,
                    " uses the legacy (pre-1.6) torch.save format, which is not supported; convert it with: "
                    "python3 -c \"import torch; torch.save(torch.load('",
                    path, "', map_location='cpu'), '", path, ".new')\""));
  } else if (detail::looks_like_safetensors(p, n)) {
    load_safetensors(file, ctx, ck);
  } else {
    static const char lfs[] = "version https://git-lfs";
    if (n >= sizeof lfs - 1 && std::memcmp(p, lfs, sizeof lfs - 1) == 0)
      throw Error(str(ctx, " is a Git LFS pointer file, not the checkpoint itself; fetch it with 'git lfs pull'"));
    throw Error(str(ctx, " is not a PyTorch zip checkpoint or safetensors file (starts with bytes ",
                    hex_bytes(p, std::min<std::size_t>(n, 8)), ")"));
  }

  // DataParallel / DistributedDataParallel wrap the model as "module".
  static const std::string kWrap = "module.";
  while (!ck.names.empty() && std::all_of(ck.names.begin(), ck.names.end(), [](const std::string& s) {
    return s.rfind(kWrap, 0) == 0 && s.size() > kWrap.size();
  })) {
    std::unordered_map<std::string, at::Tensor> renamed;
    for (auto& name : ck.names) {
      std::string short_name = name.substr(kWrap.size());
      renamed.emplace(short_name, std::move(ck.tensors.at(name)));
      name = std::move(short_name);
    }
    ck.tensors = std::move(renamed);
    ck.stripped_prefix += kWrap;
  }
  ck.sha256 = sha256_hex(p, n);
  return ck;
}

}  // namespace asap

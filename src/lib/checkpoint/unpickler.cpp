// Restricted pickle VM; see unpickler.h. Opcode values follow CPython's
// Lib/pickle.py (protocols 0-5).
#include "checkpoint/unpickler.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "asap/error.h"

namespace asap::detail {

const Value* Value::get(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k->kind == Kind::Str && k->s == key) return v;
  return nullptr;
}

std::string describe(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::None:
      return "None";
    case K::Bool:
      return "a bool";
    case K::Int:
    case K::BigInt:
      return "an int";
    case K::Float:
      return "a float";
    case K::Str:
      return "a str";
    case K::Bytes:
      return "bytes";
    case K::Tuple:
      return str("a tuple of ", v.items.size());
    case K::List:
      return str("a list of ", v.items.size());
    case K::Set:
      return str("a set of ", v.items.size());
    case K::Global:
      return "the global " + v.s;
    case K::Storage:
      return "a storage";
    case K::Tensor:
      return "a tensor";
    case K::Object:
      return "an object of class " + v.s;
    case K::Dict: {
      std::string out = str(v.b ? "an OrderedDict" : "a dict", " with ", v.entries.size(), " entries");
      if (v.entries.empty()) return out;
      out += " (keys ";
      std::size_t shown = 0;
      for (const auto& [k, val] : v.entries) {
        if (shown == 5) {
          out += ", ...";
          break;
        }
        if (shown++) out += ", ";
        out += k->kind == K::Str ? "'" + k->s + "'" : k->kind == K::Int ? std::to_string(k->i) : describe(*k);
      }
      return out + ")";
    }
  }
  return "a value";
}

namespace {

using Kind = Value::Kind;

// Opcode names for messages; the index is the opcode byte.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 'P':
      return "PERSID";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

// Storage classes torch.save names in persistent ids. Older files saved from
// GPU name torch.cuda.*Storage; the data is the same.
bool storage_dtype(std::string name, DType& out) {
  if (name.rfind("torch.cuda.", 0) == 0) name = "torch." + name.substr(11);
  static const std::pair<const char*, DType> table[] = {{"torch.FloatStorage", DType::Float32},
                                                        {"torch.DoubleStorage", DType::Float64},
                                                        {"torch.HalfStorage", DType::Float16},
                                                        {"torch.BFloat16Storage", DType::BFloat16},
                                                        {"torch.LongStorage", DType::Int64},
                                                        {"torch.IntStorage", DType::Int32},
                                                        {"torch.ShortStorage", DType::Int16},
                                                        {"torch.CharStorage", DType::Int8},
                                                        {"torch.ByteStorage", DType::UInt8},
                                                        {"torch.BoolStorage", DType::Bool},
                                                        {"torch.UntypedStorage", DType::UInt8},
                                                        {"torch.storage.UntypedStorage", DType::UInt8},
                                                        {"torch.storage._UntypedStorage", DType::UInt8}};
  for (const auto& [n, t] : table)
    if (name == n) {
      out = t;
      return true;
    }
  return false;
}

bool dtype_global(const std::string& name, DType& out) {
  static const std::pair<const char*, DType> table[] = {
      {"torch.float32", DType::Float32},   {"torch.float", DType::Float32},   {"torch.float64", DType::Float64},
      {"torch.double", DType::Float64},    {"torch.float16", DType::Float16}, {"torch.half", DType::Float16},
      {"torch.bfloat16", DType::BFloat16}, {"torch.int64", DType::Int64},     {"torch.long", DType::Int64},
      {"torch.int32", DType::Int32},       {"torch.int", DType::Int32},       {"torch.int16", DType::Int16},
      {"torch.short", DType::Int16},       {"torch.int8", DType::Int8},       {"torch.uint8", DType::UInt8},
      {"torch.bool", DType::Bool}};
  for (const auto& [n, t] : table)
    if (name == n) {
      out = t;
      return true;
    }
  return false;
}

// Python 2 names that protocol <= 2 pickles use for Python 3 modules.
std::string normalize_module(const std::string& m) {
  if (m == "__builtin__") return "builtins";
  if (m == "copy_reg") return "copyreg";
  return m;
}

// Appends a code point as UTF-8.
void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Machine {
 public:
  Machine(std::string_view in, const std::string& ctx, Pickle& out) : in_(in), ctx_(ctx), out_(out) {}

  void run();

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error(str(ctx_, ": ", what, " at byte ", op_pos_)); }

  Value* make(Kind k) {
    out_.arena.push_back(std::make_unique<Value>());
    out_.arena.back()->kind = k;
    return out_.arena.back().get();
  }
  Value* make_int(int64_t v) {
    Value* x = make(Kind::Int);
    x->i = v;
    return x;
  }
  Value* make_str(Kind k, std::string s) {
    Value* x = make(k);
    x->s = std::move(s);
    return x;
  }

  // --- input ---
  void need(uint64_t n) const {
    if (n > in_.size() - pos_)
      fail(str("pickle data ends early (needs ", n, " more bytes, ", in_.size() - pos_,
               " left; the file is truncated or corrupt)"));
  }
  const uint8_t* take(uint64_t n) {
    need(n);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(in_.data()) + pos_;
    pos_ += static_cast<std::size_t>(n);
    return p;
  }
  uint64_t read_le(int n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = v << 8 | p[k];
    return v;
  }
  std::string read_bytes(uint64_t n) {
    const uint8_t* p = take(n);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
  }
  std::string read_line() {
    std::size_t nl = in_.find('\n', pos_);
    if (nl == std::string_view::npos) fail("pickle text argument has no terminating newline");
    std::string s(in_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
  }
  int64_t parse_index(const std::string& s) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || v < 0) fail("malformed memo index '" + s + "'");
    return v;
  }

  // --- stack ---
  void push(Value* v) { stack_.push_back(v); }
  Value* pop() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    return stack_.back();
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("pickle opcode needs a MARK but there is none");
    std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }

  // --- containers ---
  // A string that equal hashable Python keys share; unhashable or large keys
  // fall back to identity, which is what matters for torch's string keys.
  // The node budget stops memo-shared tuples ((t, t), (t, t)) ... from
  // costing exponential time.
  static std::string key_of(const Value* k) {
    int budget = 64;
    return key_of(k, budget);
  }
  static std::string key_of(const Value* k, int& budget) {
    if (--budget < 0) return str("p", static_cast<const void*>(k));
    switch (k->kind) {
      case Kind::None:
        return "N";
      case Kind::Bool:
        return "i" + std::to_string(k->b ? 1 : 0);
      case Kind::Int:
        return "i" + std::to_string(k->i);
      case Kind::Float:
        if (std::floor(k->f) == k->f && std::fabs(k->f) < 9e18) return "i" + std::to_string(int64_t(k->f));
        return str("f", k->f);
      case Kind::BigInt:
        return "I" + k->s;
      case Kind::Str:
        return str("s", k->s.size(), ":", k->s);
      case Kind::Bytes:
        return str("y", k->s.size(), ":", k->s);
      case Kind::Global:
        return "g" + k->s;
      case Kind::Tuple: {
        std::string out = "t(";
        for (const Value* x : k->items) {
          if (budget <= 0) return str("p", static_cast<const void*>(k));
          out += key_of(x, budget) + ",";
        }
        if (budget >= 0) return out + ")";
        break;
      }
      default:
        break;
    }
    return str("p", static_cast<const void*>(k));
  }
  void set_item(Value* d, Value* k, Value* v) {
    auto [it, fresh] = d->index.emplace(key_of(k), d->entries.size());
    if (fresh)
      d->entries.emplace_back(k, v);
    else
      d->entries[it->second].second = v;
  }
  void add_to_set(Value* s, Value* x) {
    if (s->index.emplace(key_of(x), s->items.size()).second) s->items.push_back(x);
  }
  Value* dict_target(const char* op) {
    Value* d = top();
    if (d->kind != Kind::Dict && d->kind != Kind::Object)
      fail(str(op, " needs a dict on the stack but found ", describe(*d)));
    return d;
  }

  // --- calls ---
  std::string global_name(const Value* callable, const char* op) {
    if (callable->kind != Kind::Global) fail(str(op, " calls ", describe(*callable), ", not a global"));
    return callable->s;
  }
  Value* make_object(const std::string& cls, std::vector<Value*> args) {
    Value* o = make_str(Kind::Object, cls);
    o->items = std::move(args);
    return o;
  }
  int64_t int_arg(const Value* v, const char* what, const std::string& fn) {
    if (v->kind != Kind::Int || v->i < 0)
      fail(str(fn, ": ", what, " must be a non-negative int but is ", describe(*v)));
    return v->i;
  }
  std::vector<int64_t> int_tuple_arg(const Value* v, const char* what, const std::string& fn) {
    if (v->kind != Kind::Tuple && v->kind != Kind::List)
      fail(str(fn, ": ", what, " must be a tuple of ints but is ", describe(*v)));
    std::vector<int64_t> out;
    for (const Value* x : v->items) out.push_back(int_arg(x, what, fn));
    return out;
  }
  Value* rebuild_tensor(const std::string& fn, const std::vector<Value*>& a, bool v3);
  Value* as_parameter(const std::string& fn, const std::vector<Value*>& a);
  Value* call(const std::string& fn, std::vector<Value*> args, int depth = 0);
  Value* persistent_load(Value* pid);
  void build(Value* target, Value* state);

  std::string_view in_;
  const std::string& ctx_;
  Pickle& out_;
  std::size_t pos_ = 0, op_pos_ = 0;
  std::vector<Value*> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
  std::unordered_map<std::string, Value*> storages_;
};

Value* Machine::rebuild_tensor(const std::string& fn, const std::vector<Value*>& a, bool v3) {
  if (a.size() < 4) fail(str(fn, " expects at least 4 arguments but got ", a.size()));
  if (a[0]->kind != Kind::Storage) fail(str(fn, ": the first argument must be a storage but is ", describe(*a[0])));
  Value* t = make(Kind::Tensor);
  t->tensor = std::make_unique<TensorRef>();
  TensorRef& r = *t->tensor;
  r.storage = a[0];
  r.dtype = a[0]->dtype;
  r.offset = int_arg(a[1], "the storage offset", fn);
  r.sizes = int_tuple_arg(a[2], "the size", fn);
  r.strides = int_tuple_arg(a[3], "the stride", fn);
  if (r.sizes.size() != r.strides.size())
    fail(str(fn, ": size has ", r.sizes.size(), " dimensions but stride has ", r.strides.size()));
  if (v3) {
    // _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, ...)
    if (a.size() < 7 || a[6]->kind != Kind::Global || !dtype_global(a[6]->s, r.dtype))
      fail(str(fn, ": unsupported or missing dtype argument ", a.size() >= 7 ? describe(*a[6]) : "(none)"));
  }
  return t;
}

Value* Machine::as_parameter(const std::string& fn, const std::vector<Value*>& a) {
  if (a.empty() || a[0]->kind != Kind::Tensor)
    fail(str(fn, ": the first argument must be a tensor but is ", a.empty() ? "missing" : describe(*a[0])));
  Value* t = make(Kind::Tensor);
  t->tensor = std::make_unique<TensorRef>(*a[0]->tensor);
  t->tensor->is_parameter = true;
  return t;
}

// REDUCE / NEWOBJ: known reducers are interpreted, everything else becomes an
// inert Object; nothing is ever called.
Value* Machine::call(const std::string& fn, std::vector<Value*> args, int depth) {
  if (fn == "torch._utils._rebuild_tensor_v2" || fn == "torch._utils._rebuild_tensor")
    return rebuild_tensor(fn, args, false);
  if (fn == "torch._utils._rebuild_tensor_v3") return rebuild_tensor(fn, args, true);
  if (fn == "torch._utils._rebuild_parameter" || fn == "torch._utils._rebuild_parameter_with_state")
    return as_parameter(fn, args);
  if (fn == "torch._tensor._rebuild_from_type_v2" || fn == "torch._tensor._rebuild_from_type" ||
      fn == "torch._utils._rebuild_from_type_v2") {
    // (func, new_type, args, state): a tensor subclass; keep the plain tensor.
    if (args.size() < 3 || args[0]->kind != Kind::Global || args[2]->kind != Kind::Tuple || depth > 4)
      fail(str(fn, " has malformed arguments"));
    return call(args[0]->s, args[2]->items, depth + 1);
  }
  if (fn == "collections.OrderedDict" || fn == "builtins.dict") {
    Value* d = make(Kind::Dict);
    d->b = fn == "collections.OrderedDict";
    if (!args.empty() && (args[0]->kind == Kind::List || args[0]->kind == Kind::Tuple)) {
      for (Value* pair : args[0]->items) {
        if (pair->kind != Kind::Tuple && pair->kind != Kind::List) fail(str(fn, " expects (key, value) pairs"));
        if (pair->items.size() != 2) fail(str(fn, " expects (key, value) pairs"));
        set_item(d, pair->items[0], pair->items[1]);
      }
    } else if (!args.empty() && args[0]->kind == Kind::Dict) {
      for (auto& [k, v] : args[0]->entries) set_item(d, k, v);
    }
    return d;
  }
  if (fn == "builtins.set" || fn == "builtins.frozenset") {
    Value* s = make(Kind::Set);
    s->b = fn == "builtins.frozenset";
    if (!args.empty() && (args[0]->kind == Kind::List || args[0]->kind == Kind::Tuple || args[0]->kind == Kind::Set))
      for (Value* x : args[0]->items) add_to_set(s, x);
    return s;
  }
  if (fn == "torch.Size") {
    Value* t = make(Kind::Tuple);
    if (!args.empty() && (args[0]->kind == Kind::Tuple || args[0]->kind == Kind::List)) t->items = args[0]->items;
    return t;
  }
  if (fn == "copyreg._reconstructor") {
    // Protocol 0/1 spelling of cls.__new__(cls): (cls, base, state).
    if (args.empty() || args[0]->kind != Kind::Global) fail(str(fn, " expects a class as first argument"));
    return make_object(args[0]->s, {});
  }
  if (fn == "_codecs.encode" && args.size() == 2 && args[0]->kind == Kind::Str && args[1]->kind == Kind::Str &&
      (args[1]->s == "latin1" || args[1]->s == "latin-1")) {
    // Protocol 2 pickles bytes as _codecs.encode(text, 'latin1'): decode the
    // UTF-8 text back to its code points (all < 256).
    std::string bytes;
    const std::string& s = args[0]->s;
    for (std::size_t k = 0; k < s.size(); ++k) {
      uint8_t c = static_cast<uint8_t>(s[k]);
      if (c < 0x80) {
        bytes += static_cast<char>(c);
      } else if ((c & 0xE0) == 0xC0 && k + 1 < s.size()) {
        bytes += static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(s[++k]) & 0x3F));
      } else {
        fail("_codecs.encode argument is not latin-1 text");
      }
    }
    return make_str(Kind::Bytes, std::move(bytes));
  }
  if (fn == "torch.storage._load_from_bytes")
    fail("torch.storage._load_from_bytes (a storage pickled in the legacy format inside this file) is not supported");
  if (fn.rfind("torch._utils._rebuild_", 0) == 0)
    fail(str("unsupported tensor kind ", fn,
             " (only dense CPU-loadable tensors are supported, not quantized, sparse, meta or nested ones)"));
  return make_object(fn, std::move(args));
}

Value* Machine::persistent_load(Value* pid) {
  // torch.save: ('storage', storage_type, key, location, numel)
  if (pid->kind != Kind::Tuple || pid->items.size() < 5 || !pid->items[0]->is_str() || pid->items[0]->s != "storage")
    fail(str("unsupported persistent id ", describe(*pid), " (expected ('storage', type, key, location, numel))"));
  const auto& it = pid->items;
  if (it[1]->kind != Kind::Global) fail(str("persistent id storage type is ", describe(*it[1])));
  DType dtype;
  if (!storage_dtype(it[1]->s, dtype))
    fail(str("unsupported storage type ", it[1]->s,
             " (supported: float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool)"));
  std::string key;
  if (it[2]->is_str())
    key = it[2]->s;
  else if (it[2]->kind == Kind::Int)
    key = std::to_string(it[2]->i);
  else
    fail(str("persistent id storage key is ", describe(*it[2])));
  if (key.empty() || key.find('/') != std::string::npos || key.find("..") != std::string::npos)
    fail(str("persistent id storage key '", key, "' is not a plain record name"));
  if (it[4]->kind != Kind::Int || it[4]->i < 0) fail(str("persistent id storage size is ", describe(*it[4])));
  auto found = storages_.find(key);
  if (found != storages_.end()) {
    if (found->second->dtype != dtype) fail(str("storage '", key, "' is used with two different dtypes"));
    return found->second;
  }
  Value* s = make_str(Kind::Storage, key);
  s->dtype = dtype;
  s->i = it[4]->i;
  s->location = it[3]->is_str() ? it[3]->s : "";
  storages_.emplace(key, s);
  return s;
}

void Machine::build(Value* target, Value* state) {
  // BUILD sets attributes; inert objects just remember them. For dicts
  // (OrderedDict._metadata of state dicts) the state is not an item.
  if (target->kind == Kind::Object && target->state && target->state->kind == Kind::Dict && state->kind == Kind::Dict) {
    for (auto& [k, v] : state->entries) set_item(target->state, k, v);
    return;
  }
  target->state = state;
}

void Machine::run() {
  const uint8_t* base = reinterpret_cast<const uint8_t*>(in_.data());
  while (true) {
    op_pos_ = pos_;
    if (pos_ >= in_.size()) fail("pickle data ends without a STOP opcode (the file is truncated or corrupt)");
    uint8_t op = base[pos_++];
    switch (op) {
      case 0x80: {  // PROTO
        int proto = static_cast<int>(read_le(1));
        if (proto > 5) fail(str("pickle protocol ", proto, " is newer than 5"));
        out_.protocol = proto;
        break;
      }
      case 0x95:  // FRAME: an 8-byte length prefix; frames need no special handling here.
        if (read_le(8) > in_.size() - pos_) fail("pickle FRAME is longer than the remaining data");
        break;
      case '.': {  // STOP
        out_.root = pop();
        return;
      }
      // --- numbers and constants ---
      case 'N':
        push(make(Kind::None));
        break;
      case 0x88:
      case 0x89: {  // NEWTRUE / NEWFALSE
        Value* v = make(Kind::Bool);
        v->b = op == 0x88;
        push(v);
        break;
      }
      case 'K':
        push(make_int(static_cast<int64_t>(read_le(1))));
        break;  // BININT1
      case 'M':
        push(make_int(static_cast<int64_t>(read_le(2))));
        break;  // BININT2
      case 'J':
        push(make_int(static_cast<int32_t>(read_le(4))));
        break;      // BININT
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        uint64_t n = read_le(op == 0x8a ? 1 : 4);
        if (op == 0x8b && n > 0x7fffffff) fail("LONG4 has a negative length");
        const uint8_t* p = take(n);
        // Little-endian two's complement; fits int64 when the high bytes only repeat the sign.
        bool neg = n > 0 && (p[n - 1] & 0x80);
        bool fits = true;
        for (uint64_t k = 8; k < n; ++k) fits = fits && p[k] == (neg ? 0xff : 0x00);
        if (n > 8) fits = fits && bool(p[7] & 0x80) == neg;
        if (fits) {
          uint64_t v = neg ? ~uint64_t(0) : 0;
          for (uint64_t k = std::min<uint64_t>(n, 8); k-- > 0;) v = (v << 8) | p[k];
          if (n < 8 && n > 0) {
            uint64_t mask = (uint64_t(1) << (8 * n)) - 1;
            v = neg ? (v | ~mask) : (v & mask);
          }
          push(make_int(static_cast<int64_t>(v)));
        } else {
          static const char* hex = "0123456789abcdef";
          std::string text = "0x";
          for (uint64_t k = n; k-- > 0;) text += std::string{hex[p[k] >> 4], hex[p[k] & 15]};
          push(make_str(Kind::BigInt, text + " (two's complement)"));
        }
        break;
      }
      case 'I':    // INT (text); "00"/"01" are protocol 0's False/True
      case 'L': {  // LONG (text, trailing 'L')
        std::string s = read_line();
        if (op == 'I' && (s == "00" || s == "01")) {
          Value* v = make(Kind::Bool);
          v->b = s == "01";
          push(v);
          break;
        }
        if (op == 'L' && !s.empty() && s.back() == 'L') s.pop_back();
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end) fail("malformed text integer '" + s + "'");
        push(errno == ERANGE ? make_str(Kind::BigInt, s) : make_int(v));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian IEEE double
        const uint8_t* p = take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = bits << 8 | p[k];
        Value* v = make(Kind::Float);
        std::memcpy(&v->f, &bits, 8);
        push(v);
        break;
      }
      case 'F': {  // FLOAT (text)
        std::string s = read_line();
        char* end = nullptr;
        double d = std::strtod(s.c_str(), &end);
        if (s.empty() || *end) fail("malformed text float '" + s + "'");
        Value* v = make(Kind::Float);
        v->f = d;
        push(v);
        break;
      }
      // --- strings ---
      case 'X':
        push(make_str(Kind::Str, read_bytes(read_le(4))));
        break;  // BINUNICODE
      case 0x8c:
        push(make_str(Kind::Str, read_bytes(read_le(1))));
        break;  // SHORT_BINUNICODE
      case 0x8d:
        push(make_str(Kind::Str, read_bytes(read_le(8))));
        break;  // BINUNICODE8
      case 'T':
        push(make_str(Kind::Str, read_bytes(read_le(4))));
        break;  // BINSTRING
      case 'U':
        push(make_str(Kind::Str, read_bytes(read_le(1))));
        break;  // SHORT_BINSTRING
      case 'B':
        push(make_str(Kind::Bytes, read_bytes(read_le(4))));
        break;  // BINBYTES
      case 'C':
        push(make_str(Kind::Bytes, read_bytes(read_le(1))));
        break;    // SHORT_BINBYTES
      case 0x8e:  // BINBYTES8
      case 0x96:
        push(make_str(Kind::Bytes, read_bytes(read_le(8))));
        break;     // BYTEARRAY8
      case 'S': {  // STRING: a quoted Python 2 str repr
        std::string s = read_line();
        if (s.size() < 2 || (s[0] != '\'' && s[0] != '"') || s.back() != s[0]) fail("malformed STRING argument");
        std::string out;
        for (std::size_t k = 1; k + 1 < s.size(); ++k) {
          char c = s[k];
          if (c != '\\') {
            out += c;
            continue;
          }
          if (++k + 1 >= s.size()) fail("malformed escape in STRING argument");
          switch (s[k]) {
            case 'n':
              out += '\n';
              break;
            case 't':
              out += '\t';
              break;
            case 'r':
              out += '\r';
              break;
            case '\\':
              out += '\\';
              break;
            case '\'':
              out += '\'';
              break;
            case '"':
              out += '"';
              break;
            case 'x': {
              if (k + 3 >= s.size()) fail("malformed escape in STRING argument");
              out += static_cast<char>(std::strtol(s.substr(k + 1, 2).c_str(), nullptr, 16));
              k += 2;
              break;
            }
            default:
              fail("unsupported escape in STRING argument");
          }
        }
        push(make_str(Kind::Str, out));
        break;
      }
      case 'V': {  // UNICODE: raw-unicode-escape text
        std::string s = read_line(), out;
        for (std::size_t k = 0; k < s.size(); ++k) {
          std::size_t digits = 0;
          if (s[k] == '\\' && k + 1 < s.size()) digits = s[k + 1] == 'u' ? 4 : s[k + 1] == 'U' ? 8 : 0;
          if (digits && k + 1 + digits < s.size()) {
            put_utf8(out, static_cast<uint32_t>(std::strtoul(s.substr(k + 2, digits).c_str(), nullptr, 16)));
            k += 1 + digits;
          } else {
            put_utf8(out, static_cast<uint8_t>(s[k]));
          }
        }
        push(make_str(Kind::Str, out));
        break;
      }
      // --- containers ---
      case '(':
        marks_.push_back(stack_.size());
        break;   // MARK
      case '0':  // POP (a bare MARK is popped too)
        if (!marks_.empty() && stack_.size() == marks_.back())
          marks_.pop_back();
        else
          pop();
        break;
      case '1':
        pop_mark();
        break;  // POP_MARK
      case '2':
        push(top());
        break;  // DUP
      case ')':
        push(make(Kind::Tuple));
        break;  // EMPTY_TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::size_t n = op - 0x84u;
        Value* t = make(Kind::Tuple);
        t->items.resize(n);
        for (std::size_t k = n; k-- > 0;) t->items[k] = pop();
        push(t);
        break;
      }
      case 't': {  // TUPLE
        Value* t = make(Kind::Tuple);
        t->items = pop_mark();
        push(t);
        break;
      }
      case ']':
        push(make(Kind::List));
        break;     // EMPTY_LIST
      case 'l': {  // LIST
        Value* l = make(Kind::List);
        l->items = pop_mark();
        push(l);
        break;
      }
      case 'a':    // APPEND
      case 'e': {  // APPENDS
        std::vector<Value*> items;
        if (op == 'a')
          items.push_back(pop());
        else
          items = pop_mark();
        Value* l = top();
        if (l->kind != Kind::List && l->kind != Kind::Object)
          fail(str(op == 'a' ? "APPEND" : "APPENDS", " needs a list on the stack but found ", describe(*l)));
        l->items.insert(l->items.end(), items.begin(), items.end());
        break;
      }
      case '}': {  // EMPTY_DICT
        push(make(Kind::Dict));
        break;
      }
      case 'd': {  // DICT
        std::vector<Value*> kv = pop_mark();
        if (kv.size() % 2) fail("DICT has an odd number of items");
        Value* d = make(Kind::Dict);
        for (std::size_t k = 0; k < kv.size(); k += 2) set_item(d, kv[k], kv[k + 1]);
        push(d);
        break;
      }
      case 's': {  // SETITEM
        Value* v = pop();
        Value* k = pop();
        set_item(dict_target("SETITEM"), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<Value*> kv = pop_mark();
        if (kv.size() % 2) fail("SETITEMS has an odd number of items");
        Value* d = dict_target("SETITEMS");
        for (std::size_t k = 0; k < kv.size(); k += 2) set_item(d, kv[k], kv[k + 1]);
        break;
      }
      case 0x8f:
        push(make(Kind::Set));
        break;      // EMPTY_SET
      case 0x90: {  // ADDITEMS
        std::vector<Value*> items = pop_mark();
        Value* s = top();
        if (s->kind != Kind::Set && s->kind != Kind::Object)
          fail(str("ADDITEMS needs a set on the stack but found ", describe(*s)));
        for (Value* x : items) add_to_set(s, x);
        break;
      }
      case 0x91: {  // FROZENSET
        Value* s = make(Kind::Set);
        s->b = true;
        for (Value* x : pop_mark()) add_to_set(s, x);
        push(s);
        break;
      }
      // --- memo ---
      case 'q':
        memo_[read_le(1)] = top();
        break;  // BINPUT
      case 'r':
        memo_[read_le(4)] = top();
        break;  // LONG_BINPUT
      case 'p':
        memo_[parse_index(read_line())] = top();
        break;      // PUT
      case 0x94: {  // MEMOIZE
        Value* v = top();
        memo_[memo_.size()] = v;
        break;
      }
      case 'h':    // BINGET
      case 'j':    // LONG_BINGET
      case 'g': {  // GET
        uint64_t idx = op == 'h' ? read_le(1) : op == 'j' ? read_le(4) : parse_index(read_line());
        auto it = memo_.find(idx);
        if (it == memo_.end()) fail(str("pickle memo has no entry ", idx));
        push(it->second);
        break;
      }
      // --- globals, objects, calls ---
      case 'c': {  // GLOBAL
        std::string module = read_line();
        std::string name = read_line();
        push(make_str(Kind::Global, normalize_module(module) + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        Value* name = pop();
        Value* module = pop();
        if (!module->is_str() || !name->is_str()) fail("STACK_GLOBAL needs two strings");
        push(make_str(Kind::Global, normalize_module(module->s) + "." + name->s));
        break;
      }
      case 'R': {  // REDUCE
        Value* args = pop();
        Value* fn = pop();
        if (args->kind != Kind::Tuple) fail(str("REDUCE arguments are ", describe(*args), ", not a tuple"));
        push(call(global_name(fn, "REDUCE"), args->items));
        break;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        Value* args = pop();
        Value* cls = pop();
        if (args->kind != Kind::Tuple) fail(str("NEWOBJ arguments are ", describe(*args), ", not a tuple"));
        std::string name = global_name(cls, "NEWOBJ");
        bool container = name == "collections.OrderedDict" || name == "builtins.dict" || name == "builtins.set" ||
                         name == "builtins.frozenset";
        push(container ? call(name, {}) : make_object(name, args->items));
        break;
      }
      case 'o': {  // OBJ: MARK cls args...
        std::vector<Value*> items = pop_mark();
        if (items.empty()) fail("OBJ has no class");
        std::string name = global_name(items[0], "OBJ");
        push(make_object(name, std::vector<Value*>(items.begin() + 1, items.end())));
        break;
      }
      case 'i': {  // INST: module/name lines, then MARK args...
        std::string module = read_line();
        std::string name = read_line();
        push(make_object(normalize_module(module) + "." + name, pop_mark()));
        break;
      }
      case 'b': {  // BUILD
        Value* state = pop();
        build(top(), state);
        break;
      }
      case 'Q': {  // BINPERSID
        push(persistent_load(pop()));
        break;
      }
      default: {
        const char* name = opcode_name(op);
        static const char* hex = "0123456789abcdef";
        fail(str("unsupported pickle opcode 0x", hex[op >> 4], hex[op & 15], name ? str(" (", name, ")") : ""));
      }
    }
  }
}

}  // namespace

Pickle unpickle(std::string_view bytes, const std::string& context) {
  Pickle out;
  Machine m(bytes, context, out);
  m.run();
  return out;
}

}  // namespace asap::detail

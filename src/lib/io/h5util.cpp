// io/h5util.cpp -- HDF5 C++ API helpers; see h5util.h.
#include "io/h5util.h"
#include "util/atomic_file.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include <fcntl.h>
#include <unistd.h>

namespace asap::detail::h5 {

namespace {

// The innermost message of the last failed HDF5 call on this thread. HDF5
// clears its error stack on the next API call (C++ destructors run during
// unwinding make such calls), so the detail is captured when the error is
// raised, by the automatic-error callback that would otherwise print it.
// Per thread: HDF5 (thread-safe build) keeps its error stacks and automatic
// error callbacks per thread, and loads on different threads must not race
// on one string (ThreadSanitizer found that race when it was one
// function-level static).
std::string& last_message() {
  thread_local std::string msg;
  return msg;
}

herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  // Downward walk: the last entry visited is where the error was detected.
  if (err && err->desc && *err->desc) *static_cast<std::string*>(data) = err->desc;
  return 0;
}

// HDF5 1.10 keeps internal objects after some failures on damaged files (a
// damaged root group in H5Fopen, docs/reliability.md H1; a damaged object
// header, H5). When it closes the library at exit it then prints "HDF5:
// infinite loop closing library" and a line of internal codes to stderr,
// after asapc's own one-sentence error. HDF5's close is an atexit handler
// registered when the library started; this one, registered by the error
// callback the first time HDF5 reports an error, runs before it (atexit is
// last in, first out) and points stderr at /dev/null, when everything the
// program had to say has been said. Runs without an HDF5 error never
// register it. Not in sanitizer
// builds: LeakSanitizer reports at exit after this handler, on stderr.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ASAP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ASAP_SANITIZED 1
#endif
#endif
void silence_hdf5_at_exit() {
#ifdef ASAP_SANITIZED
  return;
#endif
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      std::fflush(stderr);
      const int fd = ::open("/dev/null", O_WRONLY);
      if (fd >= 0) {
        ::dup2(fd, 2);
        ::close(fd);
      }
    });
  });
}

// Forgets the last HDF5 error: our copy of its message and HDF5's own error
// stack of this thread. HDF5 keeps the stack's strings until the next call
// clears it, so a thread that ended on a failed call leaked them at exit
// (LeakSanitizer in the 8-thread load test).
void clear_errors() {
  last_message().clear();
  H5Eclear2(H5E_DEFAULT);
}

herr_t capture_cb(hid_t stack, void*) {
  silence_hdf5_at_exit();
  std::string msg;
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, walk_cb, &msg);
  last_message() = msg;
  return 0;
}

std::string class_name(H5T_class_t cls, size_t size, bool is_signed = true) {
  switch (cls) {
    case H5T_INTEGER:
      return asap::str(is_signed ? "int" : "uint", size * 8);
    case H5T_FLOAT:
      return asap::str("float", size * 8);
    case H5T_STRING:
      return "string";
    case H5T_ENUM:
      return "enum (e.g. bool)";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length sequence";
    default:
      return "unsupported type";
  }
}

std::string attr_name(const std::string& name, const Where& w) {
  return asap::str("attribute '", name, "' of '", w.obj, "'");
}

H5::Attribute open_attr(const H5::H5Object& o, const std::string& name, const Where& w) {
  bool present = guarded(w, asap::str("looking for attribute '", name, "'"), [&] { return o.attrExists(name); });
  ASAP_CHECK(present, w.file, ": ", attr_name(name, w), " is missing");
  return guarded(w, asap::str("opening attribute '", name, "'"), [&] { return o.openAttribute(name); });
}

std::string attr_type_name(const H5::Attribute& a) {
  H5T_class_t cls = a.getTypeClass();
  bool is_signed = true;
  if (cls == H5T_INTEGER) is_signed = a.getIntType().getSign() != H5T_SGN_NONE;
  return class_name(cls, a.getDataType().getSize(), is_signed);
}

// Numbers must be scalars (or one-element arrays, which some writers produce).
void check_single(const H5::Attribute& a, const std::string& name, const Where& w) {
  hssize_t n = a.getSpace().getSimpleExtentNpoints();
  ASAP_CHECK(n == 1, w.file, ": ", attr_name(name, w), " should hold one value, found ", n);
}

// Fixed-length strings are NUL- or space-padded; strip the padding.
std::string trim_fixed(const char* p, size_t size, H5T_str_t pad) {
  size_t len = strnlen(p, size);
  std::string s(p, len);
  if (pad == H5T_STR_SPACEPAD) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
  }
  return s;
}

// One sentence refusing a variable-length string. Reading one makes HDF5
// follow a pointer into the file's global heap, and HDF5 1.10 crashes, hangs
// or allocates gigabytes when that heap is damaged (docs/reliability.md,
// H2-H4), so asapc never reads them: the check is on the type alone, before
// any data is read.
[[noreturn]] void refuse_vlen(const std::string& what, const Where& w) {
  throw Error(asap::str(w.file, ": ", what,
                        " is a variable-length string, which asapc does not read (it writes fixed-length strings; "
                        "docs/decisions.md, \"Strings without the global heap\")"));
}

std::vector<std::string> read_strings(const H5::Attribute& a, size_t n, const std::string& name, const Where& w) {
  H5::StrType st = a.getStrType();
  std::vector<std::string> out;
  if (st.isVariableStr()) {
    refuse_vlen(attr_name(name, w), w);
  } else {
    size_t size = st.getSize();
    size_t total = 0;
    if (__builtin_mul_overflow(n, size, &total) || total > (size_t{1} << 40)) {
      clear_errors();  // the detail is this one, not an earlier HDF5 error's
      throw H5::AttributeIException("read_strings", asap::str(n, " strings of ", size, " bytes overflow 64-bit sizes"));
    }
    std::vector<char> buf(total + 1, '\0');
    a.read(st, buf.data());
    H5T_str_t pad = st.getStrpad();
    for (size_t i = 0; i < n; ++i) out.push_back(trim_fixed(buf.data() + i * size, size, pad));
  }
  return out;
}

// Fixed-length UTF-8, NUL-padded, of `size` bytes (HDF5 needs at least 1).
H5::StrType fixed_string_type(size_t size) {
  H5::StrType t(H5::PredType::C_S1, std::max<size_t>(size, 1));
  t.setCset(H5T_CSET_UTF8);
  t.setStrpad(H5T_STR_NULLPAD);
  return t;
}

void remove_attr_if_present(const H5::H5Object& o, const std::string& name) {
  if (o.attrExists(name)) o.removeAttr(name);
}

// Memory type for reading into / writing from a tensor of `dtype`.
const H5::PredType& mem_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return H5::PredType::NATIVE_FLOAT;
    case at::kDouble:
      return H5::PredType::NATIVE_DOUBLE;
    case at::kByte:
      return H5::PredType::NATIVE_UINT8;
    case at::kChar:
      return H5::PredType::NATIVE_INT8;
    case at::kShort:
      return H5::PredType::NATIVE_INT16;
    case at::kInt:
      return H5::PredType::NATIVE_INT32;
    case at::kLong:
      return H5::PredType::NATIVE_INT64;
    default:
      throw std::logic_error(asap::str("internal error (a bug in asapc): no HDF5 type for ", dtype));
  }
}

const H5::PredType& file_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return H5::PredType::IEEE_F32LE;
    case at::kDouble:
      return H5::PredType::IEEE_F64LE;
    case at::kByte:
      return H5::PredType::STD_U8LE;
    case at::kChar:
      return H5::PredType::STD_I8LE;
    case at::kShort:
      return H5::PredType::STD_I16LE;
    case at::kInt:
      return H5::PredType::STD_I32LE;
    case at::kLong:
      return H5::PredType::STD_I64LE;
    default:
      throw std::logic_error(asap::str("internal error (a bug in asapc): no HDF5 type for ", dtype));
  }
}

at::ScalarType int_dtype_of_size(size_t size) {
  switch (size) {
    case 1:
      return at::kChar;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

}  // namespace

Where Where::child(const std::string& name) const {
  return Where{file, (obj.empty() || obj == "/") ? "/" + name : obj + "/" + name};
}

void quiet() {
  // Once per thread: the thread-safe HDF5 of Debian keeps the automatic error
  // callback per thread, so a callback installed on the first thread only
  // leaves every other thread printing HDF5-DIAG and losing the detail.
  thread_local bool installed = false;
  if (installed) return;
  installed = true;
  H5::Exception::dontPrint();
  // Print nothing, but keep the innermost message for our asap::Error.
  H5Eset_auto2(H5E_DEFAULT, capture_cb, nullptr);
}

void rethrow(const H5::Exception& e, const Where& w, const std::string& what) {
  std::string detail = last_message();
  if (detail.empty()) detail = e.getDetailMsg();
  clear_errors();
  throw Error(asap::str(w.file, ": HDF5 error at '", w.obj, "' while ", what, ": ", detail));
}

H5::H5File open_file(const std::string& path, const Where& w, bool rdwr) {
  quiet();
  std::error_code ec;
  ASAP_CHECK(std::filesystem::exists(path, ec), w.file, ": no such file");
  ASAP_CHECK(!std::filesystem::is_directory(path, ec), w.file, ": is a directory, expected an HDF5 file");
  {
    std::ifstream probe(path, std::ios::binary);
    ASAP_CHECK(probe.good(), w.file, ": cannot be read (permission denied?)");
  }
  clear_errors();
  bool hdf5 = false;
  try {
    hdf5 = H5::H5File::isHdf5(path);
  } catch (const H5::Exception&) {
    hdf5 = false;
  }
  ASAP_CHECK(hdf5, w.file, ": not an HDF5 file (no HDF5 signature found)");
  clear_errors();
  try {
    return H5::H5File(path, rdwr ? H5F_ACC_RDWR : H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    std::string detail = last_message().empty() ? e.getDetailMsg() : last_message();
    clear_errors();
    silence_hdf5_at_exit();
    throw Error(asap::str(w.file, " is a damaged or truncated HDF5 file: HDF5 cannot open it (", detail, ")"));
  }
}

H5::H5File create_file(const std::string& path, const Where& w) {
  quiet();
  clear_errors();
  return guarded(w, "creating the file", [&] { return H5::H5File(path, H5F_ACC_TRUNC); });
}

void write_atomically(const std::string& path, const Where& w, const std::function<void(H5::H5File&)>& fill) {
  quiet();
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.parent_path();
  std::error_code ec;
  ASAP_CHECK(dir.empty() || fs::is_directory(dir, ec), w.file, ": cannot write: directory '", dir.string(),
             "' does not exist");
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(rd()));
  const std::string tmp = path + ".tmp-" + suffix;
  try {
    {
      clear_errors();
      H5::H5File f = guarded(w, asap::str("creating the temporary file '", tmp, "'"),
                             [&] { return H5::H5File(tmp, H5F_ACC_EXCL); });
      fill(f);
      guarded(w, "closing the file", [&] { f.close(); });
    }
    test_kill_before_rename();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(asap::str(w.file, ": cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno)));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

bool has_link(const H5::Group& g, const std::string& name) {
  // H5Lexists fails (rather than returning false) for paths through missing
  // groups; names here are single components.
  htri_t r = H5Lexists(g.getId(), name.c_str(), H5P_DEFAULT);
  return r > 0;
}

bool has_attr(const H5::H5Object& o, const std::string& name) { return H5Aexists(o.getId(), name.c_str()) > 0; }

bool is_vlen_string_attr(const H5::H5Object& o, const std::string& name) {
  if (!has_attr(o, name)) return false;
  hid_t a = H5Aopen(o.getId(), name.c_str(), H5P_DEFAULT);
  if (a < 0) return false;
  hid_t t = H5Aget_type(a);  // the type comes from the object header: no heap is read
  const bool vlen = t >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0;
  if (t >= 0) H5Tclose(t);
  H5Aclose(a);
  clear_errors();
  return vlen;
}

bool is_group(const H5::Group& g, const std::string& name) {
  if (!has_link(g, name)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(g.getId(), name.c_str(), &info, H5P_DEFAULT) < 0) return false;
  return info.type == H5O_TYPE_GROUP;
}

bool is_dataset(const H5::Group& g, const std::string& name) {
  if (!has_link(g, name)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(g.getId(), name.c_str(), &info, H5P_DEFAULT) < 0) return false;
  return info.type == H5O_TYPE_DATASET;
}

namespace {
herr_t collect_cb(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_children(const H5::Group& g, bool groups_only, const Where& w) {
  H5_index_t index = H5_INDEX_NAME;
  hid_t gcpl = H5Gget_create_plist(g.getId());
  if (gcpl >= 0) {
    unsigned flags = 0;
    if (H5Pget_link_creation_order(gcpl, &flags) >= 0 && (flags & H5P_CRT_ORDER_INDEXED)) index = H5_INDEX_CRT_ORDER;
    H5Pclose(gcpl);
  }
  std::vector<std::string> names;
  clear_errors();
  if (H5Literate(g.getId(), index, H5_ITER_INC, nullptr, collect_cb, &names) < 0) {
    std::string detail = last_message();
    clear_errors();
    throw Error(asap::str(w.file, ": HDF5 error at '", w.obj, "' while listing its members: ", detail));
  }
  if (groups_only) {
    names.erase(std::remove_if(names.begin(), names.end(), [&](const std::string& n) { return !is_group(g, n); }),
                names.end());
  }
  return names;
}

H5::Group create_group(const H5::Group& parent, const std::string& name, const Where& w) {
  clear_errors();
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  hid_t id = H5Gcreate2(parent.getId(), name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
  H5Pclose(gcpl);
  if (id < 0) {
    std::string detail = last_message();
    clear_errors();
    throw Error(asap::str(w.file, ": HDF5 error while creating group '", w.child(name).obj, "': ", detail));
  }
  H5Gclose(id);
  return guarded(w, asap::str("opening group '", name, "'"), [&] { return parent.openGroup(name); });
}

void refuse_vlen_root(const H5::H5Object& root, const Where& w, const std::string& version_attr, int64_t fixed_since,
                      const std::string& path, const std::string& rebuild) {
  if (!is_vlen_string_attr(root, "format")) return;
  int64_t version = -1;
  try {
    if (has_attr(root, version_attr)) version = read_int_attr(root, version_attr, w);
  } catch (const Error&) {
    version = -1;  // not an integer: the generic refusal below
  }
  clear_errors();
  if (version >= 1 && version < fixed_since)
    throw Error(asap::str(w.file, " has ", version_attr, " ", version,
                          " and variable-length strings, which this asapc no longer reads (HDF5 1.10 can crash or "
                          "hang on them when a file is damaged): convert it with `python3 tools/h5_fixed_strings.py ",
                          path, "` or ", rebuild));
  throw Error(asap::str(w.file, ": root attribute 'format' is a variable-length string, but asapc files",
                        version >= fixed_since ? asap::str(" of ", version_attr, " ", version) : std::string(),
                        " hold fixed-length strings only, so the file is damaged or was not written by asapc"));
}

// ---- attributes ----------------------------------------------------------------

std::string read_string_attr(const H5::H5Object& o, const std::string& name, const Where& w) {
  H5::Attribute a = open_attr(o, name, w);
  return guarded(w, asap::str("reading attribute '", name, "'"), [&] {
    ASAP_CHECK(a.getTypeClass() == H5T_STRING, w.file, ": ", attr_name(name, w), " should be a string, found ",
               attr_type_name(a));
    check_single(a, name, w);
    return read_strings(a, 1, name, w).at(0);
  });
}

std::vector<std::string> read_string_list_attr(const H5::H5Object& o, const std::string& name, const Where& w) {
  H5::Attribute a = open_attr(o, name, w);
  return guarded(w, asap::str("reading attribute '", name, "'"), [&] {
    ASAP_CHECK(a.getTypeClass() == H5T_STRING, w.file, ": ", attr_name(name, w), " should be a list of strings, found ",
               attr_type_name(a));
    hssize_t n = a.getSpace().getSimpleExtentNpoints();
    if (n <= 0) return std::vector<std::string>{};  // an empty list (e.g. a Sinkhorn layer's features)
    return read_strings(a, static_cast<size_t>(n), name, w);
  });
}

int64_t read_int_attr(const H5::H5Object& o, const std::string& name, const Where& w) {
  H5::Attribute a = open_attr(o, name, w);
  return guarded(w, asap::str("reading attribute '", name, "'"), [&] {
    H5T_class_t cls = a.getTypeClass();
    check_single(a, name, w);
    if (cls == H5T_ENUM) {
      // h5py stores Python bools as an int8 enum {FALSE, TRUE}.
      H5::EnumType et = a.getEnumType();
      ASAP_CHECK(et.getSize() == 1, w.file, ": ", attr_name(name, w), " should be an integer, found ",
                 attr_type_name(a));
      int8_t v = 0;
      a.read(et, &v);
      return static_cast<int64_t>(v);
    }
    ASAP_CHECK(cls == H5T_INTEGER, w.file, ": ", attr_name(name, w), " should be an integer, found ",
               attr_type_name(a));
    int64_t v = 0;
    a.read(H5::PredType::NATIVE_INT64, &v);
    return v;
  });
}

double read_double_attr(const H5::H5Object& o, const std::string& name, const Where& w) {
  H5::Attribute a = open_attr(o, name, w);
  return guarded(w, asap::str("reading attribute '", name, "'"), [&] {
    H5T_class_t cls = a.getTypeClass();
    ASAP_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, w.file, ": ", attr_name(name, w), " should be a number, found ",
               attr_type_name(a));
    check_single(a, name, w);
    double v = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  });
}

void write_string_attr(const H5::H5Object& o, const std::string& name, const std::string& value, const Where& w) {
  guarded(w, asap::str("writing attribute '", name, "'"), [&] {
    remove_attr_if_present(o, name);
    H5::StrType t = fixed_string_type(value.size());
    H5::Attribute a = o.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
    std::vector<char> buf(t.getSize(), '\0');
    std::copy(value.begin(), value.end(), buf.begin());
    a.write(t, buf.data());
  });
}

void write_string_list_attr(const H5::H5Object& o, const std::string& name, const std::vector<std::string>& values,
                            const Where& w) {
  guarded(w, asap::str("writing attribute '", name, "'"), [&] {
    remove_attr_if_present(o, name);
    size_t width = 1;
    for (const auto& s : values) width = std::max(width, s.size());
    H5::StrType t = fixed_string_type(width);
    hsize_t dims[1] = {values.size()};
    H5::Attribute a = o.createAttribute(name, t, H5::DataSpace(1, dims));
    std::vector<char> buf(values.size() * width, '\0');
    for (size_t i = 0; i < values.size(); ++i) std::copy(values[i].begin(), values[i].end(), buf.begin() + i * width);
    if (!values.empty()) a.write(t, buf.data());
  });
}

void write_int_attr(const H5::H5Object& o, const std::string& name, int64_t value, const Where& w) {
  guarded(w, asap::str("writing attribute '", name, "'"), [&] {
    remove_attr_if_present(o, name);
    H5::Attribute a = o.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_INT64, &value);
  });
}

void write_double_attr(const H5::H5Object& o, const std::string& name, double value, const Where& w) {
  guarded(w, asap::str("writing attribute '", name, "'"), [&] {
    remove_attr_if_present(o, name);
    H5::Attribute a = o.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_DOUBLE, &value);
  });
}

// ---- datasets --------------------------------------------------------------------

std::string DatasetInfo::type_name() const { return class_name(cls, size, is_signed); }

bool mul_ok(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool add_ok(int64_t a, int64_t b, int64_t* out) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

bool numel_ok(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (!mul_ok(n, d, &n)) return false;
  *out = n;
  return true;
}

H5::DataSet open_dataset(const H5::Group& g, const std::string& name, const Where& w) {
  Where cw = w.child(name);
  ASAP_CHECK(has_link(g, name), w.file, ": dataset '", cw.obj, "' is missing");
  ASAP_CHECK(is_dataset(g, name), w.file, ": '", cw.obj, "' should be a dataset, found a group or other object");
  return guarded(cw, "opening the dataset", [&] { return g.openDataSet(name); });
}

namespace {

// Shape and type from metadata only (no storage check).
DatasetInfo declared_info(const H5::DataSet& ds, const Where& w) {
  return guarded(w, "reading the dataset's shape and type", [&] {
    DatasetInfo info;
    H5::DataSpace sp = ds.getSpace();
    ASAP_CHECK(sp.isSimple(), w.file, ": dataset '", w.obj, "' has a null dataspace, expected an array");
    int rank = sp.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank > 0) sp.getSimpleExtentDims(dims.data());
    for (hsize_t d : dims) {
      ASAP_CHECK(d <= static_cast<hsize_t>(INT64_MAX), w.file, ": dataset '", w.obj, "' declares a dimension of ", d,
                 ", which does not fit in 64-bit signed sizes");
      info.shape.push_back(static_cast<int64_t>(d));
    }
    ASAP_CHECK(numel_ok(info.shape, &info.numel), w.file, ": dataset '", w.obj, "' declares shape ",
               shape_str(info.shape), ", whose element count overflows 64-bit sizes");
    info.cls = ds.getTypeClass();
    info.size = ds.getDataType().getSize();
    if (info.cls == H5T_INTEGER) info.is_signed = ds.getIntType().getSign() != H5T_SGN_NONE;
    return info;
  });
}

struct PlistCloser {
  hid_t id;
  ~PlistCloser() {
    if (id >= 0) H5Pclose(id);
  }
};

std::string hdf5_detail() {
  std::string d = last_message();
  clear_errors();
  return d.empty() ? "unknown HDF5 error" : d;
}

// Chunks checked one by one (check_chunk_sizes) up to this many in a
// dataset: H5Dget_chunk_info_by_coord walks the whole chunk index on every
// call in HDF5 1.10.8, so checking n chunks costs about 7-12 ns x n^2 (121 s
// for 100000 chunks, 0.1 s for 4096: tools/experiments/chunk_check_cost.py).
// H5Dget_chunk_storage_size is fast but returns an unfiltered chunk's full
// size, not what the index records.
constexpr int64_t kMaxCheckedChunks = 4096;

// Every chunk that no filter touches (no filters, or all of them skipped for
// this chunk) is recorded with exactly the chunk's bytes. HDF5 1.10.8 trusts
// the index's sizes: a chunk recorded short is copied from a buffer of the
// recorded size as if it were whole, a heap overflow inside H5Dread
// (fuzz_calib found a 0-byte chunk of a [2, 5] bool mask and a 9216-byte
// chunk of [6, 94, 32] float32: fuzz/regressions/calib/). A filtered chunk's
// stored size is its compressed size, which says nothing of its contents.
void check_chunk_sizes(const H5::DataSet& ds, hid_t dcpl, const DatasetInfo& info, const std::vector<int64_t>& cshape,
                       int64_t chunks, const Where& w) {
  if (cshape.empty() || chunks > kMaxCheckedChunks) return;
  const int nf = H5Pget_nfilters(dcpl);
  const unsigned all = nf <= 0 ? 0u : nf >= 32 ? ~0u : ((1u << nf) - 1u);
  int64_t chunk_bytes = static_cast<int64_t>(info.size);
  for (int64_t c : cshape)
    if (!mul_ok(chunk_bytes, c, &chunk_bytes)) return;  // HDF5 itself refuses such chunks on reading
  const size_t rank = cshape.size();
  std::vector<hsize_t> at(rank, 0);
  for (;;) {
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;  // not checked: a missing chunk has size 0
    hsize_t size = 0;
    clear_errors();
    if (H5Dget_chunk_info_by_coord(ds.getId(), at.data(), &mask, &addr, &size) < 0)
      throw Error(asap::str(w.file, ": HDF5 error at '", w.obj, "' while reading its chunk index: ", hdf5_detail()));
    // A chunk missing from the index reads as 0 bytes here: an unfiltered one
    // is refused below, a filtered one is left to the chunk count.
    const std::string pos = shape_str(std::vector<int64_t>(at.begin(), at.end()));
    ASAP_CHECK((nf > 0 && (mask & all) != all) || size == static_cast<hsize_t>(chunk_bytes), w.file, ": dataset '",
               w.obj, "' records its chunk at ", pos, " as ", size, " bytes, but an unfiltered chunk of ",
               shape_str(cshape), " of ", info.type_name(), " holds ", chunk_bytes,
               " bytes: its chunk index is damaged, so it is refused");
    // The next chunk of the grid, last dimension fastest.
    size_t i = rank;
    for (;;) {
      --i;
      at[i] += static_cast<hsize_t>(cshape[i]);
      if (at[i] < static_cast<hsize_t>(info.shape[i])) break;
      at[i] = 0;
      if (i == 0) return;
    }
  }
}

}  // namespace

void check_stored(const H5::DataSet& ds, const DatasetInfo& info, const Where& w) {
  if (info.numel == 0) return;  // nothing declared, nothing to back it
  clear_errors();
  PlistCloser dcpl{H5Dget_create_plist(ds.getId())};
  if (dcpl.id < 0)
    throw Error(asap::str(w.file, ": HDF5 error at '", w.obj, "' while reading its storage layout: ", hdf5_detail()));
  const H5D_layout_t layout = H5Pget_layout(dcpl.id);
  const int external = H5Pget_external_count(dcpl.id);
  ASAP_CHECK(layout != H5D_VIRTUAL && external <= 0, w.file, ": dataset '", w.obj,
             "' keeps its data outside the file (", layout == H5D_VIRTUAL ? "virtual" : "external",
             " storage), which asapc does not read");
  // Stored bytes never exceed the file that holds them (external and virtual
  // storage are refused above). A damaged chunk index can claim gigabytes in
  // a small file, and HDF5 1.10.8 allocates a buffer of the claimed size
  // before it finds the chunk past the end of the file (4 GiB for a 40 KB
  // calibration file, found by fuzz_calib: fuzz/regressions/calib/).
  hsize_t file_bytes = 0;
  clear_errors();
  if (const hid_t fid = H5Iget_file_id(ds.getId()); fid >= 0) {
    if (H5Fget_filesize(fid, &file_bytes) < 0) file_bytes = 0;
    H5Fclose(fid);
  }
  clear_errors();
  const hsize_t on_disk = H5Dget_storage_size(ds.getId());
  ASAP_CHECK(file_bytes == 0 || on_disk <= file_bytes, w.file, ": dataset '", w.obj, "' records ", on_disk,
             " bytes of stored data, more than the whole file (", file_bytes,
             " bytes): its storage index is damaged, so it is refused");
  int64_t bytes = 0;
  const bool fits = mul_ok(info.numel, static_cast<int64_t>(info.size), &bytes);
  const std::string declared = asap::str("declares shape ", shape_str(info.shape), " of ", info.type_name());
  const char* why = "; its data was never written (or the file was cut short or edited), so it is refused";
  if (layout == H5D_CHUNKED) {
    const int rank = static_cast<int>(info.shape.size());
    std::vector<hsize_t> chunk(static_cast<size_t>(std::max(rank, 1)), 0);
    clear_errors();
    ASAP_CHECK(H5Pget_chunk(dcpl.id, rank, chunk.data()) == rank, w.file, ": dataset '", w.obj,
               "' is chunked but its chunk shape cannot be read: ", hdf5_detail());
    // Chunks the extent needs: prod ceil(dim / chunk), saturating at INT64_MAX.
    int64_t needed = 1;
    std::vector<int64_t> cshape;
    for (int i = 0; i < rank; ++i) {
      const hsize_t c = chunk[static_cast<size_t>(i)];
      ASAP_CHECK(c >= 1, w.file, ": dataset '", w.obj, "' declares a chunk dimension of 0");
      cshape.push_back(static_cast<int64_t>(std::min<hsize_t>(c, INT64_MAX)));
      const hsize_t d = static_cast<hsize_t>(info.shape[static_cast<size_t>(i)]);
      const int64_t per = static_cast<int64_t>(d / c + (d % c != 0));
      if (!mul_ok(needed, per, &needed)) needed = INT64_MAX;
    }
    hsize_t stored = 0;
    clear_errors();
    H5::DataSpace fspace = guarded(w, "reading the dataset's shape", [&] { return ds.getSpace(); });
    if (H5Dget_num_chunks(ds.getId(), fspace.getId(), &stored) < 0)
      throw Error(asap::str(w.file, ": HDF5 error at '", w.obj, "' while counting its stored chunks: ", hdf5_detail()));
    ASAP_CHECK(fits && stored >= static_cast<hsize_t>(needed), w.file, ": dataset '", w.obj, "' ", declared, " in ",
               needed, needed == 1 ? " chunk" : " chunks", " of ", shape_str(cshape), ", but only ", stored,
               stored == 1 ? " chunk is" : " chunks are", " stored in the file", why);
    check_chunk_sizes(ds, dcpl.id, info, cshape, needed, w);
  } else {
    // Contiguous or compact: the bytes themselves must be there.
    const hsize_t stored = H5Dget_storage_size(ds.getId());
    ASAP_CHECK(fits && stored >= static_cast<hsize_t>(bytes), w.file, ": dataset '", w.obj, "' ", declared, " (",
               fits ? asap::str(bytes) : std::string("more than 2^63"), " bytes), but only ", stored,
               " bytes are stored in the file", why);
  }
}

DatasetInfo dataset_info(const H5::DataSet& ds, const Where& w) {
  DatasetInfo info = declared_info(ds, w);
  check_stored(ds, info, w);
  return info;
}

at::Tensor read_slab(const H5::DataSet& ds, int64_t start, int64_t count, at::ScalarType dtype, const Where& w) {
  return guarded(w, "reading the dataset", [&] {
    H5::DataSpace fspace = ds.getSpace();
    int rank = fspace.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank > 0) fspace.getSimpleExtentDims(dims.data());

    std::vector<int64_t> shape;
    for (hsize_t d : dims) {
      ASAP_CHECK(d <= static_cast<hsize_t>(INT64_MAX), w.file, ": dataset '", w.obj, "' declares a dimension of ", d,
                 ", which does not fit in 64-bit signed sizes");
      shape.push_back(static_cast<int64_t>(d));
    }
    if (rank > 0 && count >= 0) {
      int64_t end = 0;
      ASAP_ASSERT(start >= 0 && add_ok(start, count, &end) && end <= shape[0]);
      shape[0] = count;
    } else {
      start = 0;
    }
    int64_t numel = 0;
    ASAP_CHECK(numel_ok(shape, &numel), w.file, ": dataset '", w.obj, "' declares shape ", shape_str(shape),
               ", whose element count overflows 64-bit sizes");

    // Enums (h5py bools) do not convert to plain numbers in HDF5: read them
    // with their native enum type into an integer of the same size.
    H5T_class_t cls = ds.getTypeClass();
    hid_t enum_native = -1;
    at::ScalarType read_dtype = dtype;
    if (cls == H5T_ENUM) {
      enum_native = H5Tget_native_type(ds.getDataType().getId(), H5T_DIR_ASCEND);
      if (enum_native < 0) throw H5::DataTypeIException("H5Tget_native_type", "enum without native type");
      read_dtype = int_dtype_of_size(H5Tget_size(enum_native));
    }
    struct CloseType {
      hid_t id;
      ~CloseType() {
        if (id >= 0) H5Tclose(id);
      }
    } close_enum{enum_native};

    int64_t bytes = 0;
    ASAP_CHECK(mul_ok(numel, static_cast<int64_t>(c10::elementSize(read_dtype)), &bytes), w.file, ": dataset '", w.obj,
               "' declares shape ", shape_str(shape), ", whose size in bytes overflows 64-bit sizes");
    at::Tensor out;
    try {
      out = at::empty(shape, at::TensorOptions().dtype(read_dtype));
    } catch (const c10::Error&) {
      throw Error(asap::str(w.file, ": dataset '", w.obj, "' of shape ", shape_str(shape), " needs ", bytes,
                            " bytes of memory, which cannot be allocated"));
    }
    if (numel > 0) {
      H5::DataSpace mspace = H5::DataSpace(H5S_SCALAR);
      if (rank > 0) {
        std::vector<hsize_t> off(static_cast<size_t>(rank), 0), cnt(dims);
        off[0] = static_cast<hsize_t>(start);
        cnt[0] = static_cast<hsize_t>(shape[0]);
        fspace.selectHyperslab(H5S_SELECT_SET, cnt.data(), off.data());
        mspace = H5::DataSpace(rank, cnt.data());
      }
      if (enum_native >= 0) {
        if (H5Dread(ds.getId(), enum_native, mspace.getId(), fspace.getId(), H5P_DEFAULT, out.data_ptr()) < 0)
          throw H5::DataSetIException("H5Dread", "reading enum data failed");
      } else {
        ds.read(out.data_ptr(), mem_type(dtype), mspace, fspace);
      }
    }
    return read_dtype == dtype ? out : out.to(dtype);
  });
}

void write_tensor(const H5::Group& g, const std::string& name, const at::Tensor& t, int64_t chunk_rows,
                  const Where& w) {
  ASAP_ASSERT(t.defined());
  at::Tensor c = t.cpu();
  if (c.scalar_type() == at::kBool) c = c.to(at::kByte);
  c = c.contiguous();
  Where cw = w.child(name);
  guarded(cw, "writing the dataset", [&] {
    int rank = static_cast<int>(c.dim());
    std::vector<hsize_t> dims;
    for (int64_t s : c.sizes()) dims.push_back(static_cast<hsize_t>(s));
    H5::DataSpace space = rank == 0 ? H5::DataSpace(H5S_SCALAR) : H5::DataSpace(rank, dims.data());
    H5::DSetCreatPropList plist;
    if (chunk_rows > 0 && rank >= 1 && c.numel() > 0) {
      // Keep a chunk well under HDF5's 4 GiB limit.
      int64_t row_bytes = (c.numel() / c.size(0)) * static_cast<int64_t>(c.element_size());
      int64_t rows = std::min<int64_t>(chunk_rows, c.size(0));
      rows = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{1} << 30) / std::max<int64_t>(row_bytes, 1)));
      std::vector<hsize_t> chunk(dims);
      chunk[0] = static_cast<hsize_t>(rows);
      plist.setChunk(rank, chunk.data());
    }
    H5::DataSet ds = g.createDataSet(name, file_type(c.scalar_type()), space, plist);
    if (c.numel() > 0) ds.write(c.data_ptr(), mem_type(c.scalar_type()));
  });
}

void write_string_dataset(const H5::Group& g, const std::string& name, const std::string& value, const Where& w) {
  guarded(w.child(name), "writing the dataset", [&] {
    H5::StrType t = fixed_string_type(value.size());
    H5::DataSet ds = g.createDataSet(name, t, H5::DataSpace(H5S_SCALAR));
    std::vector<char> buf(t.getSize(), '\0');
    std::copy(value.begin(), value.end(), buf.begin());
    ds.write(buf.data(), t);
  });
}

std::string read_string_dataset(const H5::Group& g, const std::string& name, const Where& w) {
  H5::DataSet ds = open_dataset(g, name, w);
  Where cw = w.child(name);
  return guarded(cw, "reading the dataset", [&] {
    ASAP_CHECK(ds.getTypeClass() == H5T_STRING, w.file, ": dataset '", cw.obj, "' should hold a string, found ",
               class_name(ds.getTypeClass(), ds.getDataType().getSize()));
    hssize_t n = ds.getSpace().getSimpleExtentNpoints();
    ASAP_CHECK(n == 1, w.file, ": dataset '", cw.obj, "' should hold one string, found ", n);
    H5::StrType st = ds.getStrType();
    if (st.isVariableStr()) refuse_vlen(asap::str("dataset '", cw.obj, "'"), w);
    check_stored(ds, declared_info(ds, cw), cw);  // a fixed-length type may declare up to 4 GiB
    size_t size = st.getSize();
    std::vector<char> buf(size + 1, '\0');
    ds.read(buf.data(), st);
    return trim_fixed(buf.data(), size, st.getStrpad());
  });
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string shape_str(at::IntArrayRef shape) { return shape_str(std::vector<int64_t>(shape.begin(), shape.end())); }

}  // namespace asap::detail::h5

// io/h5util.h -- small helpers over the HDF5 C++ API shared by the
// calibration reader and the artifact reader/writer. Internal: never include
// from a public header (it pulls in H5Cpp.h).
//
// Every helper turns H5::Exception into asap::Error naming the file and the
// HDF5 object, so callers never see HDF5 exception types.
#pragma once
#include <ATen/core/Tensor.h>
#include <H5Cpp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "asap/error.h"

namespace asap::detail::h5 {

// Where an object lives, for messages: file = "artifact 'a.h5'",
// obj = "/layers/0000" (may carry a note, e.g. "/layers/0000 (layer 'b.0')").
struct Where {
  std::string file;
  std::string obj;
  Where child(const std::string& name) const;  // obj + "/" + name
};

// Silences HDF5's automatic error-stack printing and captures its innermost
// message instead, for the calling thread (HDF5 keeps this setting per
// thread); cheap after the first call on a thread. open_file, create_file,
// write_atomically and guarded() call it. The captured message is per thread.
void quiet();

// Throws asap::Error "<file>: HDF5 error at '<obj>' (<what>): <innermost HDF5 message>".
[[noreturn]] void rethrow(const H5::Exception& e, const Where& w, const std::string& what);

// Runs f(), converting H5::Exception into asap::Error.
template <typename F>
auto guarded(const Where& w, const std::string& what, F&& f) -> decltype(f()) {
  quiet();
  try {
    return std::forward<F>(f)();
  } catch (const H5::Exception& e) {
    rethrow(e, w, what);
  }
}

// Opens an existing HDF5 file read-only (or read-write). Missing files,
// non-HDF5 files and truncated files give an asap::Error naming `w.file`.
H5::H5File open_file(const std::string& path, const Where& w, bool rdwr = false);
// Creates (truncates) an HDF5 file.
H5::H5File create_file(const std::string& path, const Where& w);

// Runs fill(file) on a new HDF5 file PATH.tmp-XXXXXXXX in PATH's directory,
// closes it and renames it to PATH, so readers never see a half-written file.
// On any exception the temporary file is removed and the exception propagates.
// `fill` must not keep HDF5 objects alive past its return.
void write_atomically(const std::string& path, const Where& w, const std::function<void(H5::H5File&)>& fill);

// ---- structure -------------------------------------------------------------
bool has_link(const H5::Group& g, const std::string& name);
bool has_attr(const H5::H5Object& o, const std::string& name);
// True when attribute `name` exists and is a variable-length string. Looks at
// the type only (object header), never at the data in the global heap.
bool is_vlen_string_attr(const H5::H5Object& o, const std::string& name);
bool is_group(const H5::Group& g, const std::string& name);    // link exists and is a group
bool is_dataset(const H5::Group& g, const std::string& name);  // link exists and is a dataset
// Names of the direct children of g, in creation order when g tracks it,
// else in name order; `groups_only` filters to groups.
std::vector<std::string> list_children(const H5::Group& g, bool groups_only, const Where& w);
inline std::vector<std::string> list_groups(const H5::Group& g, const Where& w) { return list_children(g, true, w); }
// Creates a group that tracks link creation order (so listings keep the
// writer's order).
H5::Group create_group(const H5::Group& parent, const std::string& name, const Where& w);

// Called by each reader right after opening, before any string is read:
// when the root attribute 'format' is a variable-length string, refuses the
// file with one sentence. A file whose integer attribute `version_attr` is
// below `fixed_since` (written before asapc stored fixed-length strings) is
// told how to convert it (tools/h5_fixed_strings.py) or rebuild it (`rebuild`);
// a newer one is called damaged or foreign.
void refuse_vlen_root(const H5::H5Object& root, const Where& w, const std::string& version_attr, int64_t fixed_since,
                      const std::string& path, const std::string& rebuild);

// ---- attributes (scalar, or a one-element array for numbers) -----------------
// String readers check the type first and refuse a variable-length string
// with one sentence, without reading it: HDF5 1.10 follows its pointer into
// the global heap and crashes, hangs or allocates gigabytes when that heap is
// damaged (docs/reliability.md, H2-H4; docs/decisions.md).
std::string read_string_attr(const H5::H5Object& o, const std::string& name, const Where& w);
std::vector<std::string> read_string_list_attr(const H5::H5Object& o, const std::string& name, const Where& w);
int64_t read_int_attr(const H5::H5Object& o, const std::string& name, const Where& w);
double read_double_attr(const H5::H5Object& o, const std::string& name, const Where& w);

// Writers replace an existing attribute of the same name. Strings are
// fixed-length UTF-8, NUL-padded, as wide as the string (at least 1 byte; a
// list is as wide as its longest entry): h5py reads them as bytes, and
// `attrs[k] = np.bytes_(s.encode())` writes the same form.
void write_string_attr(const H5::H5Object& o, const std::string& name, const std::string& value, const Where& w);
void write_string_list_attr(const H5::H5Object& o, const std::string& name, const std::vector<std::string>& values,
                            const Where& w);
void write_int_attr(const H5::H5Object& o, const std::string& name, int64_t value, const Where& w);
void write_double_attr(const H5::H5Object& o, const std::string& name, double value, const Where& w);

// ---- datasets ------------------------------------------------------------------
struct DatasetInfo {
  std::vector<int64_t> shape;
  H5T_class_t cls = H5T_NO_CLASS;
  size_t size = 0;                // bytes per element in the file
  bool is_signed = true;          // integers only
  int64_t numel = 0;              // product of shape (checked: never overflows)
  std::string type_name() const;  // "float32", "int64", "uint8", "string", ...
};
H5::DataSet open_dataset(const H5::Group& g, const std::string& name, const Where& w);
// Shape and type from metadata, then check_stored(): a dataset whose declared
// extent is not backed by data in the file is refused here, before anyone
// allocates or streams it: a damaged file must not make a reader allocate
// what its metadata claims, nor stream fill values as if they were data.
DatasetInfo dataset_info(const H5::DataSet& ds, const Where& w);

// ---- overflow-safe sizes ---------------------------------------------------------
// a * b and a + b for non-negative sizes; false (and *out untouched) on overflow.
bool mul_ok(int64_t a, int64_t b, int64_t* out);
bool add_ok(int64_t a, int64_t b, int64_t* out);
// Product of `shape` (every entry >= 0); false on overflow.
bool numel_ok(const std::vector<int64_t>& shape, int64_t* out);

// Refuses (asap::Error naming w.file and w.obj, one sentence) a dataset whose
// declared extent is not backed by stored data: contiguous storage smaller
// than shape * element size, chunked storage with fewer allocated chunks than
// the extent needs (compressed chunks are fine: chunks are counted, not bytes),
// or data kept outside the file (external or virtual storage). Called by
// dataset_info(); `info` is its result.
void check_stored(const H5::DataSet& ds, const DatasetInfo& info, const Where& w);

// Reads rows [start, start+count) along dim 0 (the whole dataset when
// count < 0), converted by HDF5 to `dtype` (float32, float64, uint8, int64,
// ...). Integer and enum (h5py bool) data convert to any numeric dtype.
at::Tensor read_slab(const H5::DataSet& ds, int64_t start, int64_t count, at::ScalarType dtype, const Where& w);
inline at::Tensor read_all(const H5::DataSet& ds, at::ScalarType dtype, const Where& w) {
  return read_slab(ds, 0, -1, dtype, w);
}

// Writes a CPU tensor (float32/float64/uint8/bool/int64; bool is stored as
// uint8) as dataset `name`. chunk_rows > 0 chunks along dim 0 in blocks of
// that many rows, which is what streaming readers want.
void write_tensor(const H5::Group& g, const std::string& name, const at::Tensor& t, int64_t chunk_rows, const Where& w);

// Scalar fixed-length string dataset (for text too large for an attribute);
// the reader refuses a variable-length one, like the attribute readers.
void write_string_dataset(const H5::Group& g, const std::string& name, const std::string& value, const Where& w);
std::string read_string_dataset(const H5::Group& g, const std::string& name, const Where& w);

// "[2, 3, 4]"
std::string shape_str(const std::vector<int64_t>& shape);
std::string shape_str(at::IntArrayRef shape);

}  // namespace asap::detail::h5

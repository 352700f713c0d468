// io/calib.cpp -- the HDF5 calibration stream (docs/calibration-format.md).
//
// The constructor validates the structure of every layer (names, ranks,
// shapes, dtypes) from metadata only; values (finiteness, mask 0/1, at least
// one token per example) are checked as batches are read, so a file is never
// loaded whole.
#include "asap/calib.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "asap/error.h"
#include "io/batches.h"
#include "io/h5util.h"

namespace asap {

namespace h5 = detail::h5;

namespace {

constexpr int64_t kChunkRows = 64;

struct LayerMeta {
  CalibFile::LayerInfo info;
  // Dataset paths relative to the file root; empty = absent.
  std::string x, q, k, v, mask;
  at::ScalarType x_dtype = at::kFloat, q_dtype = at::kFloat, k_dtype = at::kFloat, v_dtype = at::kFloat;
};

std::string file_desc(const std::string& path) { return asap::str("calibration file '", path, "'"); }

// float32/float64 datasets keep their precision; anything else is refused.
at::ScalarType float_dtype(const h5::DatasetInfo& di, const std::string& file, const std::string& layer,
                           const std::string& ds) {
  ASAP_CHECK(di.cls == H5T_FLOAT && (di.size == 4 || di.size == 8), file, ": layer '", layer, "' dataset '", ds,
             "' should be float32 or float64, found ", di.type_name());
  return di.size == 4 ? at::kFloat : at::kDouble;
}

void check_mask_type(const h5::DatasetInfo& di, const std::string& file, const std::string& obj) {
  ASAP_CHECK(di.cls == H5T_INTEGER || di.cls == H5T_ENUM || di.cls == H5T_FLOAT, file, ": mask '", obj,
             "' should hold 0/1 integers (uint8), found ", di.type_name());
  ASAP_CHECK(di.shape.size() == 2, file, ": mask '", obj, "' should be [N, n], found shape ", h5::shape_str(di.shape));
}

// Index (within the batch) of the first example holding a NaN/Inf, or -1.
template <typename T>
int64_t first_nonfinite(const at::Tensor& t) {
  const int64_t b = t.size(0);
  if (b == 0) return -1;
  const int64_t per = t.numel() / b;
  const T* p = t.data_ptr<T>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < per; ++j)
      if (!std::isfinite(p[i * per + j])) return i;
  return -1;
}

int64_t first_nonfinite_example(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? first_nonfinite<float>(t) : first_nonfinite<double>(t);
}

}  // namespace

namespace {

// One HDF5 file of a calibration set.
struct Part {
  explicit Part(const std::string& p, const H5::H5File& f) : path(p), file(f) {}
  std::string path;
  H5::H5File file;                 // kept open for the reader's lifetime
  std::vector<std::string> names;  // in file order
  std::map<std::string, LayerMeta> layers;
};

// Opens and validates one file (metadata only).
std::unique_ptr<Part> open_part(const std::string& path) {
  const std::string fd = file_desc(path);
  h5::Where root{fd, "/"};
  auto part = std::make_unique<Part>(path, h5::open_file(path, root));
  H5::H5File& f = part->file;

  ASAP_CHECK(h5::has_attr(f, "format"), fd,
             " is not an asapc calibration file: root attribute 'format' is missing (expected '", kCalibFormat, "')");
  h5::refuse_vlen_root(f, root, "version", kCalibFixedStringsSince, path, "record it again with tools/record_calib.py");
  std::string format = h5::read_string_attr(f, "format", root);
  ASAP_CHECK(format == kCalibFormat, fd, " is not an asapc calibration file: root attribute 'format' is '", format,
             "', expected '", kCalibFormat, "'");
  int64_t version = h5::read_int_attr(f, "version", root);
  ASAP_CHECK(version >= 1, fd, " has invalid version ", version, " (versions start at 1)");
  ASAP_CHECK(version <= kCalibVersion, fd, " has version ", version, " but this asapc reads versions 1 to ",
             kCalibVersion, "; upgrade asapc");

  // Shared root mask.
  bool root_mask = h5::has_link(f, "mask");
  h5::DatasetInfo root_mask_info;
  if (root_mask) {
    H5::DataSet ds = h5::open_dataset(f, "mask", root);
    root_mask_info = h5::dataset_info(ds, root.child("mask"));
    check_mask_type(root_mask_info, fd, "/mask");
  }

  ASAP_CHECK(h5::is_group(f, "layers"), fd, ": group '/layers' is missing");
  H5::Group lg = h5::guarded(root, "opening '/layers'", [&] { return f.openGroup("layers"); });
  h5::Where lw{fd, "/layers"};
  std::vector<std::string> children = h5::list_children(lg, false, lw);
  ASAP_CHECK(!children.empty(), fd, ": group '/layers' holds no layers");

  for (const std::string& name : children) {
    ASAP_CHECK(h5::is_group(lg, name), fd, ": '/layers/", name,
               "' should be a group (one per attention layer), found a dataset or other object");
    H5::Group g = h5::guarded(lw, asap::str("opening group '", name, "'"), [&] { return lg.openGroup(name); });
    h5::Where gw = lw.child(name);
    const std::string base = gw.obj + "/";
    LayerMeta m;
    m.info.name = name;
    auto has = [&](const char* ds) { return h5::has_link(g, ds); };
    auto info_of = [&](const char* ds) {
      H5::DataSet d = h5::open_dataset(g, ds, gw);
      return h5::dataset_info(d, gw.child(ds));
    };
    const bool hx = has("x"), hq = has("q"), hk = has("k"), hv = has("v");
    ASAP_CHECK(!(hx && (hq || hk || hv)), fd, ": layer '", name,
               "' holds both 'x' and projected 'q'/'k'/'v'; expected either x or q+k");
    ASAP_CHECK(hx || hq || hk, fd, ": layer '", name, "' holds neither 'x' nor 'q'+'k'");
    ASAP_CHECK(hx || (hq && hk), fd, ": layer '", name, "' has '", hq ? "q" : "k", "' but no '", hq ? "k" : "q",
               "'; projected layers need both");

    if (hx) {
      h5::DatasetInfo di = info_of("x");
      m.x = base + "x";
      m.x_dtype = float_dtype(di, fd, name, "x");
      ASAP_CHECK(di.shape.size() == 3, fd, ": layer '", name, "' dataset 'x' should be [N, n, d_model], found shape ",
                 h5::shape_str(di.shape));
      m.info.N = di.shape[0];
      m.info.n = di.shape[1];
      m.info.d_model = di.shape[2];
      ASAP_CHECK(m.info.n >= 1 && m.info.d_model >= 1, fd, ": layer '", name,
                 "' dataset 'x' has an empty dimension: shape ", h5::shape_str(di.shape));
    } else {
      m.info.projected = true;
      h5::DatasetInfo qi = info_of("q"), ki = info_of("k");
      m.q = base + "q";
      m.k = base + "k";
      m.q_dtype = float_dtype(qi, fd, name, "q");
      m.k_dtype = float_dtype(ki, fd, name, "k");
      ASAP_CHECK(qi.shape.size() == 4, fd, ": layer '", name, "' dataset 'q' should be [N, H, n, d], found shape ",
                 h5::shape_str(qi.shape));
      ASAP_CHECK(ki.shape == qi.shape, fd, ": layer '", name, "' dataset 'k' has shape ", h5::shape_str(ki.shape),
                 " but 'q' has ", h5::shape_str(qi.shape), "; they must agree");
      m.info.N = qi.shape[0];
      m.info.heads = qi.shape[1];
      m.info.n = qi.shape[2];
      m.info.head_dim = qi.shape[3];
      ASAP_CHECK(m.info.heads >= 1 && m.info.n >= 1 && m.info.head_dim >= 1, fd, ": layer '", name,
                 "' dataset 'q' has an empty dimension: shape ", h5::shape_str(qi.shape));
      if (hv) {
        h5::DatasetInfo vi = info_of("v");
        m.v = base + "v";
        m.v_dtype = float_dtype(vi, fd, name, "v");
        ASAP_CHECK(vi.shape.size() == 4 && vi.shape[0] == qi.shape[0] && vi.shape[1] == qi.shape[1] &&
                       vi.shape[2] == qi.shape[2] && vi.shape[3] >= 1,
                   fd, ": layer '", name, "' dataset 'v' should be [N, H, n, dv] = [", qi.shape[0], ", ", qi.shape[1],
                   ", ", qi.shape[2], ", dv], found shape ", h5::shape_str(vi.shape));
        m.info.has_v = true;
        m.info.value_dim = vi.shape[3];
      }
    }
    ASAP_CHECK(m.info.N >= 1, fd, ": layer '", name, "' has N = 0 examples; at least one is needed");

    if (has("mask")) {
      h5::DatasetInfo mi = info_of("mask");
      m.mask = base + "mask";
      check_mask_type(mi, fd, m.mask);
      ASAP_CHECK(mi.shape == (std::vector<int64_t>{m.info.N, m.info.n}), fd, ": mask '", m.mask, "' has shape ",
                 h5::shape_str(mi.shape), " but layer '", name, "' needs [N, n] = [", m.info.N, ", ", m.info.n, "]");
    } else if (root_mask) {
      m.mask = "/mask";
      ASAP_CHECK(root_mask_info.shape == (std::vector<int64_t>{m.info.N, m.info.n}), fd,
                 ": shared mask '/mask' has shape ", h5::shape_str(root_mask_info.shape), " but layer '", name,
                 "' (which has no mask of its own) needs [N, n] = [", m.info.N, ", ", m.info.n, "]");
    }
    m.info.has_mask = !m.mask.empty();
    part->names.push_back(name);
    part->layers.emplace(name, std::move(m));
  }
  return part;
}

const LayerMeta& find_layer(const std::map<std::string, LayerMeta>& layers, const std::vector<std::string>& names,
                            const std::string& path, const std::string& layer) {
  auto it = layers.find(layer);
  if (it != layers.end()) return it->second;
  std::string have;
  for (size_t i = 0; i < names.size() && i < 12; ++i) have += (i ? ", " : "") + names[i];
  if (names.size() > 12) have += asap::str(", ... (", names.size(), " in all)");
  throw Error(asap::str(file_desc(path), " has no layer '", layer, "'; it has: ", have));
}

// Examples [start, start + count) of one file's layer.
CalibBatch read_part(const Part& part, const std::string& layer, int64_t start, int64_t count) {
  const LayerMeta& m = find_layer(part.layers, part.names, part.path, layer);
  const std::string fd = file_desc(part.path);
  ASAP_CHECK(start >= 0 && count >= 0 && start + count <= m.info.N, fd, ": layer '", layer, "': cannot read examples [",
             start, ", ", start + count, "); the layer has ", m.info.N);
  H5::H5File f = part.file;
  auto load = [&](const std::string& obj, at::ScalarType dtype, const char* field) {
    h5::Where w{fd, obj};
    H5::DataSet ds = h5::guarded(w, "opening the dataset", [&] { return f.openDataSet(obj); });
    at::Tensor t = h5::read_slab(ds, start, count, dtype, w);
    int64_t bad = first_nonfinite_example(t);
    ASAP_CHECK(bad < 0, fd, ": layer '", layer, "' example ", start + bad, " contains NaN/Inf in '", field, "'");
    return t;
  };

  CalibBatch b;
  b.start = start;
  if (!m.x.empty()) {
    b.x = load(m.x, m.x_dtype, "x");
  } else {
    b.q = load(m.q, m.q_dtype, "q");
    b.k = load(m.k, m.k_dtype, "k");
    if (!m.v.empty()) b.v = load(m.v, m.v_dtype, "v");
  }
  if (!m.mask.empty()) {
    h5::Where w{fd, m.mask};
    H5::DataSet ds = h5::guarded(w, "opening the dataset", [&] { return f.openDataSet(m.mask); });
    at::Tensor raw = h5::read_slab(ds, start, count, at::kDouble, w);
    const double* p = raw.data_ptr<double>();
    const int64_t n = m.info.n;
    for (int64_t i = 0; i < count; ++i) {
      int64_t tokens = 0;
      for (int64_t j = 0; j < n; ++j) {
        double v = p[i * n + j];
        ASAP_CHECK(v == 0.0 || v == 1.0, fd, ": layer '", layer, "' example ", start + i, ": mask '", m.mask,
                   "' holds ", v, " at position ", j, "; expected 0 (padding) or 1 (token)");
        tokens += v == 1.0;
      }
      ASAP_CHECK(tokens >= 1, fd, ": layer '", layer, "' example ", start + i, ": mask '", m.mask,
                 "' has no tokens (all zero); every example needs at least one");
    }
    b.mask = raw.to(at::kBool);
  }
  return b;
}

}  // namespace

struct CalibFile::Impl {
  std::vector<std::unique_ptr<Part>> parts;
  std::map<std::string, CalibFile::LayerInfo> merged;  // N summed over the files
};

CalibFile::CalibFile(const std::string& path) : CalibFile(std::vector<std::string>{path}) {}

CalibFile::CalibFile(const std::vector<std::string>& paths) : paths_(paths) {
  ASAP_CHECK(!paths.empty(), "no calibration file given");
  path_ = paths.size() == 1 ? paths[0] : str(paths[0], " ... ", paths.back(), " (", paths.size(), " files)");
  impl_ = std::make_unique<Impl>();
  for (const auto& p : paths) impl_->parts.push_back(open_part(p));
  const Part& first = *impl_->parts[0];
  for (const auto& name : first.names) impl_->merged[name] = first.layers.at(name).info;
  for (size_t i = 1; i < impl_->parts.size(); ++i) {
    const Part& p = *impl_->parts[i];
    ASAP_CHECK(p.names.size() == first.names.size() &&
                   std::is_permutation(p.names.begin(), p.names.end(), first.names.begin()),
               file_desc(p.path), " holds other layers than ", file_desc(first.path),
               "; every file of a calibration set must record the same layers");
    for (const auto& name : first.names) {
      const auto& a = first.layers.at(name).info;
      const auto& b = p.layers.at(name).info;
      auto same = [&](const char* field, int64_t x, int64_t y) {
        ASAP_CHECK(x == y, file_desc(p.path), ": layer '", name, "' has ", field, " = ", y, " but ",
                   file_desc(first.path), " has ", x, "; every file of a calibration set must agree");
      };
      same("projected", a.projected, b.projected);
      same("n", a.n, b.n);
      same("d_model", a.d_model, b.d_model);
      same("heads", a.heads, b.heads);
      same("head_dim", a.head_dim, b.head_dim);
      same("has_v", a.has_v, b.has_v);
      same("value_dim", a.value_dim, b.value_dim);
      same("has_mask", a.has_mask, b.has_mask);
      impl_->merged[name].N += b.N;
    }
  }
}

CalibFile::~CalibFile() = default;

std::vector<std::string> CalibFile::layer_names() const { return impl_->parts[0]->names; }

bool CalibFile::has_layer(const std::string& name) const { return impl_->merged.count(name) != 0; }

CalibFile::LayerInfo CalibFile::info(const std::string& layer) const {
  const Part& first = *impl_->parts[0];
  find_layer(first.layers, first.names, path_, layer);  // the error when absent
  return impl_->merged.at(layer);
}

std::vector<int64_t> CalibFile::examples_per_file(const std::string& layer) const {
  std::vector<int64_t> out;
  for (const auto& p : impl_->parts) out.push_back(find_layer(p->layers, p->names, p->path, layer).info.N);
  return out;
}

CalibBatch CalibFile::read(const std::string& layer, int64_t start, int64_t count) const {
  const LayerInfo li = info(layer);
  ASAP_CHECK(start >= 0 && count >= 0 && start + count <= li.N, file_desc(path_), ": layer '", layer,
             "': cannot read examples [", start, ", ", start + count, "); the layer has ", li.N);
  if (impl_->parts.size() == 1) return read_part(*impl_->parts[0], layer, start, count);
  std::vector<CalibBatch> got;
  int64_t offset = 0;
  for (const auto& p : impl_->parts) {
    const int64_t N = p->layers.at(layer).info.N;
    const int64_t a = std::max(start, offset), e = std::min(start + count, offset + N);
    if (a < e) got.push_back(read_part(*p, layer, a - offset, e - a));
    offset += N;
  }
  if (got.size() == 1) {
    got[0].start = start;
    return got[0];
  }
  auto cat = [&](at::Tensor CalibBatch::*f) { return detail::cat_field(got, f); };
  CalibBatch b;
  b.start = start;
  b.x = cat(&CalibBatch::x);
  b.q = cat(&CalibBatch::q);
  b.k = cat(&CalibBatch::k);
  b.v = cat(&CalibBatch::v);
  b.mask = cat(&CalibBatch::mask);
  return b;
}

// ---- writer --------------------------------------------------------------------

namespace {

// float32/float64 are stored as is; other floating types (half, bfloat16)
// widen to float32 losslessly.
at::Tensor storable_float(const at::Tensor& t, const std::string& fd, const std::string& layer, const char* field) {
  ASAP_CHECK(at::isFloatingType(t.scalar_type()), fd, ": layer '", layer, "' tensor '", field,
             "' should be floating point, found ", t.scalar_type());
  if (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) return t;
  return t.to(at::kFloat);
}

at::Tensor storable_mask(const at::Tensor& m) { return m.scalar_type() == at::kByte ? m : m.to(at::kByte); }

}  // namespace

void write_calib(const std::string& path, const std::vector<CalibLayerData>& layers, const at::Tensor& shared_mask) {
  const std::string fd = file_desc(path);
  ASAP_CHECK(!layers.empty(), fd, ": nothing to write (no layers)");
  // Structure is checked here so the file is readable; values (NaN, mask
  // contents) are the reader's job, which keeps the writer O(metadata).
  std::set<std::string> seen;
  for (const auto& L : layers) {
    ASAP_CHECK(!L.name.empty() && L.name.find('/') == std::string::npos && L.name != "." && L.name != "..", fd,
               ": layer name '", L.name, "' is not usable as an HDF5 group name (empty, '.', '..' or contains '/')");
    ASAP_CHECK(seen.insert(L.name).second, fd, ": layer '", L.name, "' is given twice");
    const bool hx = L.x.defined(), hqk = L.q.defined() || L.k.defined() || L.v.defined();
    ASAP_CHECK(hx != hqk, fd, ": layer '", L.name, "' must have either x or q+k (", hx ? "both" : "neither", " given)");
    int64_t N = 0, n = 0;
    if (hx) {
      ASAP_CHECK(L.x.dim() == 3, fd, ": layer '", L.name, "' x should be [N, n, d_model], found ",
                 h5::shape_str(L.x.sizes()));
      N = L.x.size(0);
      n = L.x.size(1);
    } else {
      ASAP_CHECK(L.q.defined() && L.k.defined(), fd, ": layer '", L.name, "' needs both q and k");
      ASAP_CHECK(L.q.dim() == 4 && L.k.sizes() == L.q.sizes(), fd, ": layer '", L.name,
                 "' q and k should both be [N, H, n, d], found ", h5::shape_str(L.q.sizes()), " and ",
                 h5::shape_str(L.k.sizes()));
      N = L.q.size(0);
      n = L.q.size(2);
      if (L.v.defined())
        ASAP_CHECK(L.v.dim() == 4 && L.v.size(0) == N && L.v.size(1) == L.q.size(1) && L.v.size(2) == n, fd,
                   ": layer '", L.name, "' v should be [N, H, n, dv] matching q ", h5::shape_str(L.q.sizes()),
                   ", found ", h5::shape_str(L.v.sizes()));
    }
    const at::Tensor& mask = L.mask.defined() ? L.mask : shared_mask;
    if (mask.defined())
      ASAP_CHECK(mask.dim() == 2 && mask.size(0) == N && mask.size(1) == n, fd, ": ",
                 L.mask.defined() ? "mask of layer '" : "shared mask (used by layer '", L.name,
                 L.mask.defined() ? "'" : "')", " should be [N, n] = [", N, ", ", n, "], found ",
                 h5::shape_str(mask.sizes()));
  }

  h5::Where root{fd, "/"};
  h5::write_atomically(path, root, [&](H5::H5File& f) {
    h5::write_string_attr(f, "format", kCalibFormat, root);
    h5::write_int_attr(f, "version", kCalibVersion, root);
    if (shared_mask.defined()) h5::write_tensor(f, "mask", storable_mask(shared_mask), kChunkRows, root);
    H5::Group lg = h5::create_group(f, "layers", root);
    h5::Where lw{fd, "/layers"};
    for (const auto& L : layers) {
      H5::Group g = h5::create_group(lg, L.name, lw);
      h5::Where gw = lw.child(L.name);
      if (L.x.defined()) h5::write_tensor(g, "x", storable_float(L.x, fd, L.name, "x"), kChunkRows, gw);
      if (L.q.defined()) h5::write_tensor(g, "q", storable_float(L.q, fd, L.name, "q"), kChunkRows, gw);
      if (L.k.defined()) h5::write_tensor(g, "k", storable_float(L.k, fd, L.name, "k"), kChunkRows, gw);
      if (L.v.defined()) h5::write_tensor(g, "v", storable_float(L.v, fd, L.name, "v"), kChunkRows, gw);
      if (L.mask.defined()) h5::write_tensor(g, "mask", storable_mask(L.mask), kChunkRows, gw);
    }
  });
}

}  // namespace asap

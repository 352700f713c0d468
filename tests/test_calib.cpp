// The calibration stream (docs/calibration-format.md): round trips through
// temporary files, streaming reads, masks, and the bad-input suite. Bad files
// are made by writing a valid one and editing it with the HDF5 C++ API.
#include <ATen/ATen.h>
#include <H5Cpp.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "asap/calib.h"
#include "asap/error.h"
#include "io/h5util.h"
#include "test_util.h"

namespace fs = std::filesystem;

using asap_test::error_of;
using asap_test::TempDir;

namespace {

// A fresh directory per test case, removed afterwards.

// The asap::Error message `f` throws (fails the test if it throws nothing).

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A padding mask [N, n] with example i holding n - (i % 3) tokens (>= 1).
at::Tensor make_mask(int64_t N, int64_t n) {
  auto m = at::ones({N, n}, at::kByte);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = n - i % 3; j < n; ++j) m[i][j] = 0;
  return m;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

// Three layers covering x/float32 with its own mask, x/float64 on the shared
// mask, and projected q/k/v.
struct Sample {
  std::vector<asap::CalibLayerData> layers;
  at::Tensor shared;
};

Sample make_sample(int64_t N = 150, int64_t n = 7) {
  at::manual_seed(3);
  Sample s;
  asap::CalibLayerData a;
  a.name = "blocks.0.attn";
  a.x = at::randn({N, n, 5}, at::kFloat);
  a.mask = make_mask(N, n);
  asap::CalibLayerData b;
  b.name = "blocks.1.attn";
  b.x = at::randn({N, n, 5}, at::kDouble);
  asap::CalibLayerData c;
  c.name = "adapter.attn";
  c.q = at::randn({N, 2, n, 3}, at::kFloat);
  c.k = at::randn({N, 2, n, 3}, at::kFloat);
  c.v = at::randn({N, 2, n, 4}, at::kFloat);
  s.layers = {a, b, c};
  s.shared = at::ones({N, n}, at::kByte);
  s.shared.select(1, n - 1).fill_(0);  // last token padded everywhere
  return s;
}

// Reopens `path` read-write and applies `edit`.
void edit_file(const std::string& path, const std::function<void(H5::H5File&)>& edit) {
  H5::H5File f(path, H5F_ACC_RDWR);
  edit(f);
}

asap::detail::h5::Where where_of(const std::string& path) { return {"test '" + path + "'", "/"}; }

}  // namespace

TEST_CASE("calib: round trip keeps every layer, dtype and mask") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample();
  asap::write_calib(path, s.layers, s.shared);
  CHECK(tmp.entries() == std::vector<std::string>{"c.h5"});  // no temporary left behind

  asap::CalibFile cf(path);
  CHECK(cf.path() == path);
  // Writer's order, not alphabetical ("adapter.attn" would sort first).
  CHECK(cf.layer_names() == std::vector<std::string>{"blocks.0.attn", "blocks.1.attn", "adapter.attn"});
  CHECK(cf.has_layer("blocks.1.attn"));
  CHECK_FALSE(cf.has_layer("blocks.2.attn"));

  auto a = cf.info("blocks.0.attn");
  CHECK(a.name == "blocks.0.attn");
  CHECK_FALSE(a.projected);
  CHECK_FALSE(a.has_v);
  CHECK(a.has_mask);
  CHECK(a.N == 150);
  CHECK(a.n == 7);
  CHECK(a.d_model == 5);

  auto c = cf.info("adapter.attn");
  CHECK(c.projected);
  CHECK(c.has_v);
  CHECK(c.has_mask);  // from the shared root mask
  CHECK(c.heads == 2);
  CHECK(c.head_dim == 3);
  CHECK(c.value_dim == 4);
  CHECK(c.N == 150);
  CHECK(c.n == 7);

  auto ba = cf.read("blocks.0.attn", 0, 150);
  CHECK(ba.start == 0);
  CHECK(same(ba.x, s.layers[0].x));
  CHECK_FALSE(ba.q.defined());
  CHECK(same(ba.mask, s.layers[0].mask.to(at::kBool)));

  auto bb = cf.read("blocks.1.attn", 0, 150);
  CHECK((bb.x.scalar_type() == at::kDouble));  // float64 stays float64
  CHECK(same(bb.x, s.layers[1].x));
  CHECK(same(bb.mask, s.shared.to(at::kBool)));

  auto bc = cf.read("adapter.attn", 0, 150);
  CHECK_FALSE(bc.x.defined());
  CHECK(same(bc.q, s.layers[2].q));
  CHECK(same(bc.k, s.layers[2].k));
  CHECK(same(bc.v, s.layers[2].v));
  CHECK(same(bc.mask, s.shared.to(at::kBool)));
}

TEST_CASE("calib: streaming slabs equal the whole read") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(200, 6);
  asap::write_calib(path, s.layers, s.shared);
  asap::CalibFile cf(path);
  for (const std::string layer : {"blocks.0.attn", "adapter.attn"}) {
    auto whole = cf.read(layer, 0, 200);
    for (int64_t batch : {64, 37, 1, 200}) {
      CAPTURE(batch);
      std::vector<at::Tensor> xs, qs, ks, vs, ms;
      for (int64_t start = 0; start < 200; start += batch) {
        auto b = cf.read(layer, start, std::min<int64_t>(batch, 200 - start));
        CHECK(b.start == start);
        if (b.x.defined()) xs.push_back(b.x);
        if (b.q.defined()) qs.push_back(b.q), ks.push_back(b.k), vs.push_back(b.v);
        ms.push_back(b.mask);
      }
      if (whole.x.defined()) CHECK(same(at::cat(xs), whole.x));
      if (whole.q.defined()) {
        CHECK(same(at::cat(qs), whole.q));
        CHECK(same(at::cat(ks), whole.k));
        CHECK(same(at::cat(vs), whole.v));
      }
      CHECK(same(at::cat(ms), whole.mask));
    }
  }
  // A slab in the middle holds exactly those examples.
  auto mid = cf.read("blocks.0.attn", 70, 9);
  CHECK(same(mid.x, s.layers[0].x.slice(0, 70, 79)));
  // An empty read is allowed; reading past the end is not.
  CHECK(cf.read("blocks.0.attn", 200, 0).x.size(0) == 0);
  std::string msg = error_of([&] { cf.read("blocks.0.attn", 190, 20); });
  CHECK(contains(msg, "calibration file '" + path + "': layer 'blocks.0.attn': cannot read examples [190, 210)"));
  CHECK(contains(msg, "has 200"));
}

TEST_CASE("calib: per-layer mask wins over the shared root mask; no mask at all means no padding") {
  TempDir tmp;
  Sample s = make_sample(20, 5);
  {
    const std::string path = tmp.file("shared.h5");
    asap::write_calib(path, s.layers, s.shared);
    asap::CalibFile cf(path);
    CHECK(same(cf.read("blocks.0.attn", 0, 20).mask, s.layers[0].mask.to(at::kBool)));  // own mask
    CHECK(same(cf.read("blocks.1.attn", 0, 20).mask, s.shared.to(at::kBool)));          // root mask
    CHECK_FALSE(same(s.layers[0].mask, s.shared));
  }
  {
    const std::string path = tmp.file("none.h5");
    asap::write_calib(path, s.layers);  // no shared mask
    asap::CalibFile cf(path);
    CHECK(cf.info("blocks.0.attn").has_mask);
    CHECK_FALSE(cf.info("blocks.1.attn").has_mask);
    CHECK_FALSE(cf.read("blocks.1.attn", 0, 20).mask.defined());
  }
}

TEST_CASE("calib: files written the way h5py writes them are read (fixed-length strings, bool masks)") {
  TempDir tmp;
  const std::string path = tmp.file("py.h5");
  const int64_t N = 4, n = 3, d = 2;
  {
    H5::H5File f(path, H5F_ACC_TRUNC);
    // np.string_("asapc-calib"): fixed-length, NUL-padded.
    H5::StrType fixed(H5::PredType::C_S1, 11);
    H5::Attribute fa = f.createAttribute("format", fixed, H5::DataSpace(H5S_SCALAR));
    fa.write(fixed, std::string("asapc-calib"));
    int64_t one = 1;
    f.createAttribute("version", H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR))
        .write(H5::PredType::NATIVE_INT64, &one);
    H5::Group layers = f.createGroup("layers");
    H5::Group g = layers.createGroup("enc.attn");
    auto x = at::arange(N * n * d, at::kFloat).reshape({N, n, d});
    hsize_t xd[3] = {N, n, d};
    g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, xd))
        .write(x.data_ptr(), H5::PredType::NATIVE_FLOAT);
    // numpy bool -> HDF5 enum {FALSE = 0, TRUE = 1} over int8.
    H5::EnumType bt(H5::PredType::NATIVE_INT8);
    int8_t f0 = 0, t1 = 1;
    bt.insert("FALSE", &f0);
    bt.insert("TRUE", &t1);
    int8_t mask[N * n] = {1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0};
    hsize_t md[2] = {N, n};
    g.createDataSet("mask", bt, H5::DataSpace(2, md)).write(mask, bt);
  }
  asap::CalibFile cf(path);
  CHECK(cf.layer_names() == std::vector<std::string>{"enc.attn"});
  auto b = cf.read("enc.attn", 1, 3);
  CHECK(same(b.x, at::arange(N * n * d, at::kFloat).reshape({N, n, d}).slice(0, 1, 4)));
  auto expect = at::tensor({1, 1, 0, 1, 0, 0, 1, 1, 0}, at::kByte).reshape({3, 3}).to(at::kBool);
  CHECK(same(b.mask, expect));
}

TEST_CASE("calib: wrong or missing format attribute is refused") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers, s.shared);
  edit_file(path,
            [&](H5::H5File& f) { asap::detail::h5::write_string_attr(f, "format", "asapc-artifact", where_of(path)); });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path +
            "' is not an asapc calibration file: root attribute 'format' is 'asapc-artifact', expected 'asapc-calib'");
  edit_file(path, [&](H5::H5File& f) { f.removeAttr("format"); });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }), "root attribute 'format' is missing"));
  // Not HDF5 at all, and no file.
  const std::string txt = tmp.file("notes.txt");
  { std::ofstream(txt) << "hello"; }
  CHECK(error_of([&] { asap::CalibFile cf(txt); }) ==
        "calibration file '" + txt + "': not an HDF5 file (no HDF5 signature found)");
  CHECK(error_of([&] { asap::CalibFile cf(tmp.file("missing.h5")); }) ==
        "calibration file '" + tmp.file("missing.h5") + "': no such file");
}

TEST_CASE("calib: future version is refused naming both versions") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers);
  edit_file(path, [&](H5::H5File& f) { asap::detail::h5::write_int_attr(f, "version", 3, where_of(path)); });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path + "' has version 3 but this asapc reads versions 1 to 2; upgrade asapc");
  edit_file(path, [&](H5::H5File& f) { asap::detail::h5::write_int_attr(f, "version", 0, where_of(path)); });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }), "has invalid version 0"));
  edit_file(path, [&](H5::H5File& f) { asap::detail::h5::write_string_attr(f, "version", "1", where_of(path)); });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }),
                 "attribute 'version' of '/' should be an integer, found string"));
}

TEST_CASE("calib: a layer holding both x and q is refused") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers);
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/blocks.0.attn");
    asap::detail::h5::write_tensor(g, "q", at::zeros({8, 2, 4, 3}), 0, where_of(path));
  });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path +
            "': layer 'blocks.0.attn' holds both 'x' and projected 'q'/'k'/'v'; expected either x or q+k");
  // The writer refuses the same thing up front.
  asap::CalibLayerData both = s.layers[0];
  both.q = at::zeros({8, 2, 4, 3});
  both.k = both.q;
  CHECK(contains(error_of([&] { asap::write_calib(tmp.file("w.h5"), {both}); }),
                 "must have either x or q+k (both given)"));
  CHECK_FALSE(fs::exists(tmp.file("w.h5")));
}

TEST_CASE("calib: projected layers need q and k of one shape") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers);
  edit_file(path, [&](H5::H5File& f) { f.openGroup("/layers/adapter.attn").unlink("k"); });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }), "layer 'adapter.attn' has 'q' but no 'k'"));
  edit_file(path, [&](H5::H5File& f) {
    asap::detail::h5::write_tensor(f.openGroup("/layers/adapter.attn"), "k", at::zeros({8, 2, 4, 5}), 0,
                                   where_of(path));
  });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }),
                 "layer 'adapter.attn' dataset 'k' has shape [8, 2, 4, 5] but 'q' has [8, 2, 4, 3]"));
}

TEST_CASE("calib: mask shape mismatch is refused, per layer and shared") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers, s.shared);
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/blocks.0.attn");
    g.unlink("mask");
    asap::detail::h5::write_tensor(g, "mask", at::ones({8, 5}, at::kByte), 0, where_of(path));
  });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path +
            "': mask '/layers/blocks.0.attn/mask' has shape [8, 5] but layer 'blocks.0.attn' needs [N, n] = [8, 4]");

  const std::string p2 = tmp.file("c2.h5");
  asap::write_calib(p2, s.layers, s.shared);
  edit_file(p2, [&](H5::H5File& f) {
    f.unlink("mask");
    asap::detail::h5::write_tensor(f, "mask", at::ones({7, 4}, at::kByte), 0, where_of(p2));
  });
  CHECK(contains(error_of([&] { asap::CalibFile cf(p2); }),
                 "shared mask '/mask' has shape [7, 4] but layer 'blocks.1.attn' (which has no mask of its own) needs "
                 "[N, n] = [8, 4]"));
  // The writer checks mask shapes too.
  CHECK(contains(error_of([&] {
                   asap::write_calib(tmp.file("w.h5"), s.layers, at::ones({8, 3}));
                 }),
                 "shared mask (used by layer 'blocks.1.attn') should be [N, n] = [8, 4], found [8, 3]"));
}

TEST_CASE("calib: NaN/Inf at example k is reported with the layer and k") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(40, 4);
  s.layers[0].x[17][2][1] = std::numeric_limits<float>::quiet_NaN();
  s.layers[2].k[33][1][0][0] = std::numeric_limits<float>::infinity();
  asap::write_calib(path, s.layers);  // values are the reader's job
  asap::CalibFile cf(path);
  CHECK(error_of([&] { cf.read("blocks.0.attn", 0, 40); }) ==
        "calibration file '" + path + "': layer 'blocks.0.attn' example 17 contains NaN/Inf in 'x'");
  // Streaming: the example index is absolute, and clean slabs read fine.
  CHECK(error_of([&] { cf.read("blocks.0.attn", 10, 10); }) ==
        "calibration file '" + path + "': layer 'blocks.0.attn' example 17 contains NaN/Inf in 'x'");
  CHECK_NOTHROW(cf.read("blocks.0.attn", 0, 17));
  CHECK_NOTHROW(cf.read("blocks.0.attn", 18, 22));
  CHECK(error_of([&] { cf.read("adapter.attn", 32, 8); }) ==
        "calibration file '" + path + "': layer 'adapter.attn' example 33 contains NaN/Inf in 'k'");
}

TEST_CASE("calib: masks must be 0/1 with at least one token per example") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(10, 4);
  s.layers[0].mask[3].fill_(0);
  s.layers[1].mask = at::ones({10, 4}, at::kByte);
  s.layers[1].mask[6][2] = 2;
  asap::write_calib(path, s.layers);
  asap::CalibFile cf(path);
  CHECK(error_of([&] { cf.read("blocks.0.attn", 0, 10); }) ==
        "calibration file '" + path +
            "': layer 'blocks.0.attn' example 3: mask '/layers/blocks.0.attn/mask' has no tokens (all zero); every "
            "example needs at least one");
  CHECK_NOTHROW(cf.read("blocks.0.attn", 4, 6));
  CHECK(contains(error_of([&] { cf.read("blocks.1.attn", 0, 10); }),
                 "layer 'blocks.1.attn' example 6: mask '/layers/blocks.1.attn/mask' holds 2 at position 2; expected 0 "
                 "(padding) or 1 (token)"));
}

TEST_CASE("calib: empty layers (N = 0) and empty files are refused") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  asap::CalibLayerData l;
  l.name = "blocks.0.attn";
  l.x = at::zeros({0, 4, 3});
  asap::write_calib(path, {l});
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path + "': layer 'blocks.0.attn' has N = 0 examples; at least one is needed");
  edit_file(path, [&](H5::H5File& f) { f.unlink("layers/blocks.0.attn"); });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path + "': group '/layers' holds no layers");
  CHECK(contains(error_of([&] { asap::write_calib(tmp.file("none.h5"), {}); }), "nothing to write"));
}

TEST_CASE("calib: wrong dtypes and ranks name the dataset") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers);
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/blocks.1.attn");
    g.unlink("x");
    asap::detail::h5::write_tensor(g, "x", at::zeros({8, 4, 5}, at::kLong), 0, where_of(path));
  });
  CHECK(error_of([&] { asap::CalibFile cf(path); }) ==
        "calibration file '" + path + "': layer 'blocks.1.attn' dataset 'x' should be float32 or float64, found int64");
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/blocks.1.attn");
    g.unlink("x");
    asap::detail::h5::write_tensor(g, "x", at::zeros({8, 20}), 0, where_of(path));
  });
  CHECK(contains(error_of([&] { asap::CalibFile cf(path); }),
                 "layer 'blocks.1.attn' dataset 'x' should be [N, n, d_model], found shape [8, 20]"));
}

TEST_CASE("calib: unknown layer names list what the file has") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, s.layers);
  asap::CalibFile cf(path);
  const std::string expect = "calibration file '" + path +
                             "' has no layer 'blocks.9.attn'; it has: blocks.0.attn, blocks.1.attn, adapter.attn";
  CHECK(error_of([&] { cf.info("blocks.9.attn"); }) == expect);
  CHECK(error_of([&] { cf.read("blocks.9.attn", 0, 1); }) == expect);
}

TEST_CASE("calib: write_calib replaces an existing file and cleans up after a failure") {
  TempDir tmp;
  const std::string path = tmp.file("c.h5");
  Sample s = make_sample(8, 4);
  asap::write_calib(path, {s.layers[0]});
  asap::write_calib(path, s.layers);  // overwrite
  CHECK(asap::CalibFile(path).layer_names().size() == 3);
  // A half-precision tensor is widened, not refused; an integer one is refused mid-write.
  asap::CalibLayerData half = s.layers[1];
  half.name = "half";
  half.x = s.layers[1].x.to(at::kHalf);
  asap::CalibLayerData ints = s.layers[1];
  ints.name = "ints";
  ints.x = at::zeros({8, 4, 5}, at::kInt);
  CHECK(contains(error_of([&] {
                   asap::write_calib(path, {s.layers[0], half, ints});
                 }),
                 "layer 'ints' tensor 'x' should be floating point, found Int"));
  CHECK(tmp.entries() == std::vector<std::string>{"c.h5"});
  CHECK(asap::CalibFile(path).layer_names().size() == 3);  // the old file is untouched
  asap::write_calib(path, {half});
  CHECK((asap::CalibFile(path).read("half", 0, 8).x.scalar_type() == at::kFloat));
}

TEST_CASE("calib: a set of files reads as one, numbered through in order") {
  TempDir tmp;
  Sample s = make_sample(200, 6);
  asap::write_calib(tmp.file("whole.h5"), s.layers, s.shared);
  // The same examples as three files of 70, 1 and 129.
  const std::vector<std::pair<int64_t, int64_t>> parts{{0, 70}, {70, 71}, {71, 200}};
  std::vector<std::string> paths;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::vector<asap::CalibLayerData> ls = s.layers;
    for (auto& l : ls)
      for (at::Tensor* t : {&l.x, &l.q, &l.k, &l.v, &l.mask})
        if (t->defined()) *t = t->slice(0, parts[i].first, parts[i].second);
    paths.push_back(tmp.file("part" + std::to_string(i) + ".h5"));
    asap::write_calib(paths.back(), ls, s.shared.slice(0, parts[i].first, parts[i].second));
  }
  asap::CalibFile whole(tmp.file("whole.h5")), set(paths);
  CHECK(set.paths() == paths);
  CHECK(set.examples_per_file("adapter.attn") == std::vector<int64_t>{70, 1, 129});
  for (const std::string layer : {"blocks.0.attn", "blocks.1.attn", "adapter.attn"}) {
    CHECK(set.info(layer).N == 200);
    for (auto [start, count] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 200}, {65, 10}, {70, 1}, {69, 3}, {150, 50}}) {
      CAPTURE(start);
      auto a = whole.read(layer, start, count), b = set.read(layer, start, count);
      CHECK(b.start == start);
      for (auto f : {&asap::CalibBatch::x, &asap::CalibBatch::q, &asap::CalibBatch::v, &asap::CalibBatch::mask}) {
        REQUIRE((a.*f).defined() == (b.*f).defined());
        if ((a.*f).defined()) CHECK(same(a.*f, b.*f));
      }
    }
  }
  CHECK(contains(error_of([&] { set.read("adapter.attn", 190, 20); }), "cannot read examples [190, 210)"));

  // Files that disagree on anything but N are refused, naming the file and field.
  Sample other = make_sample(20, 5);
  asap::write_calib(tmp.file("other.h5"), other.layers, other.shared);
  std::string msg = error_of([&] { asap::CalibFile bad({paths[0], tmp.file("other.h5")}); });
  CHECK(contains(msg, "calibration file '" + tmp.file("other.h5") + "': layer '"));
  CHECK(contains(msg, "has n = 5 but calibration file '" + paths[0] + "' has 6"));
  std::vector<asap::CalibLayerData> fewer{s.layers[0]};
  asap::write_calib(tmp.file("fewer.h5"), fewer);
  CHECK(contains(error_of([&] { asap::CalibFile bad({paths[0], tmp.file("fewer.h5")}); }), "holds other layers than"));
}

// ---- issue 16, item 9: declared data that was never written ----------------------

namespace {

// A calibration file whose layer 'l0' has dataset x [N, n, d] float32 made by
// `make` (which creates it under the given group, possibly without data).
std::string calib_with_x(const TempDir& tmp, const std::string& name, const std::function<void(H5::Group&)>& make) {
  const std::string path = tmp.file(name);
  H5::H5File f(path, H5F_ACC_TRUNC);
  asap::detail::h5::Where w = where_of(path);
  asap::detail::h5::write_string_attr(f, "format", asap::kCalibFormat, w);
  asap::detail::h5::write_int_attr(f, "version", asap::kCalibVersion, w);
  H5::Group g = f.createGroup("layers").createGroup("l0");
  make(g);
  return path;
}

}  // namespace

TEST_CASE("calib: 2^40 examples declared in chunks that were never written are refused, naming file and dataset") {
  TempDir tmp;
  const std::string path = calib_with_x(tmp, "unwritten.h5", [](H5::Group& g) {
    hsize_t dims[3] = {hsize_t{1} << 40, 17, 32}, maxd[3] = {H5S_UNLIMITED, 17, 32}, chunk[3] = {64, 17, 32};
    H5::DSetCreatPropList pl;
    pl.setChunk(3, chunk);
    pl.setDeflate(4);
    g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims, maxd), pl);
  });
  CHECK(std::filesystem::file_size(path) < 100000);
  const std::string msg = error_of([&] { asap::CalibFile cf(path); });
  CHECK(msg == "calibration file '" + path +
                   "': dataset '/layers/l0/x' declares shape [1099511627776, 17, 32] of float32 in 17179869184 chunks "
                   "of [64, 17, 32], but only 0 chunks are stored in the file; its data was never written (or the "
                   "file was cut short or edited), so it is refused");
}

TEST_CASE("calib: a partly written chunked dataset and an unwritten contiguous one are refused") {
  TempDir tmp;
  // 256 examples declared in chunks of 64; only the first chunk written.
  const std::string part = calib_with_x(tmp, "part.h5", [](H5::Group& g) {
    hsize_t dims[3] = {256, 3, 2}, chunk[3] = {64, 3, 2};
    H5::DSetCreatPropList pl;
    pl.setChunk(3, chunk);
    H5::DataSet ds = g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims), pl);
    std::vector<float> first(64 * 3 * 2, 1.0f);
    hsize_t cnt[3] = {64, 3, 2}, off[3] = {0, 0, 0};
    H5::DataSpace fspace = ds.getSpace();
    fspace.selectHyperslab(H5S_SELECT_SET, cnt, off);
    ds.write(first.data(), H5::PredType::NATIVE_FLOAT, H5::DataSpace(3, cnt), fspace);
  });
  CHECK(contains(error_of([&] { asap::CalibFile cf(part); }),
                 "dataset '/layers/l0/x' declares shape [256, 3, 2] of float32 in 4 chunks of [64, 3, 2], but only 1 "
                 "chunk is stored in the file"));

  // Contiguous, space allocated late and never written: reads would be fill-value zeros.
  const std::string contig = calib_with_x(tmp, "contig.h5", [](H5::Group& g) {
    hsize_t dims[3] = {4096, 8, 8};
    H5::DSetCreatPropList pl;
    pl.setLayout(H5D_CONTIGUOUS);
    H5Pset_alloc_time(pl.getId(), H5D_ALLOC_TIME_LATE);
    g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims), pl);
  });
  CHECK(contains(error_of([&] { asap::CalibFile cf(contig); }),
                 "': dataset '/layers/l0/x' declares shape [4096, 8, 8] of float32 (1048576 bytes), but only 0 bytes "
                 "are stored in the file"));
}

TEST_CASE("calib: compressed datasets whose every chunk is stored are read (compression is allowed for)") {
  TempDir tmp;
  const std::string path = calib_with_x(tmp, "gzip.h5", [](H5::Group& g) {
    hsize_t dims[3] = {300, 4, 8}, chunk[3] = {64, 4, 8};
    H5::DSetCreatPropList pl;
    pl.setChunk(3, chunk);
    pl.setDeflate(9);
    std::vector<float> zeros(300 * 4 * 8, 0.0f);  // compresses far below its declared size
    g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims), pl)
        .write(zeros.data(), H5::PredType::NATIVE_FLOAT);
  });
  asap::CalibFile cf(path);
  CHECK(cf.info("l0").N == 300);
  CHECK(cf.read("l0", 256, 44).x.size(0) == 44);
}

TEST_CASE("calib: a chunk index that claims more bytes than the file holds is refused before any read") {
  // fuzz_calib's input: the one chunk of layers.0.mha/x recorded as
  // 4294910720 bytes in a 39912-byte file; HDF5 allocated 4 GiB to read it.
  const std::string path = std::string(ASAP_SOURCE_DIR) + "/fuzz/regressions/calib/chunk_claims_4GiB_in_40KB_file.h5";
  CHECK(contains(error_of([&] {
                   asap::CalibFile cf(path);
                   for (const std::string& name : cf.layer_names()) (void)cf.read(name, 0, 1);
                 }),
                 "dataset '/layers/layers.0.mha/x' records 4294910720 bytes of stored data, more than the whole file "
                 "(39912 bytes): its storage index is damaged, so it is refused"));
}

namespace {

// Layer 'l0' with x [4, 3, 2] float32 in chunks of [2, 3, 2] (24 floats, 96
// bytes), written by H5Dwrite_chunk: the first chunk as `first_bytes` bytes,
// the second whole. `filters_skipped` (with deflate on the dataset) marks the
// first chunk's filter as skipped, so it counts as unfiltered.
std::string calib_with_chunk_record(const TempDir& tmp, const std::string& name, size_t first_bytes, bool deflate,
                                    uint32_t first_mask) {
  return calib_with_x(tmp, name, [&](H5::Group& g) {
    hsize_t dims[3] = {4, 3, 2}, chunk[3] = {2, 3, 2};
    H5::DSetCreatPropList pl;
    pl.setChunk(3, chunk);
    if (deflate) pl.setDeflate(4);
    H5::DataSet ds = g.createDataSet("x", H5::PredType::IEEE_F32LE, H5::DataSpace(3, dims), pl);
    std::vector<float> whole(12, 0.5f);
    hsize_t off0[3] = {0, 0, 0}, off1[3] = {2, 0, 0};
    REQUIRE(H5Dwrite_chunk(ds.getId(), H5P_DEFAULT, first_mask, off0, first_bytes, whole.data()) >= 0);
    REQUIRE(H5Dwrite_chunk(ds.getId(), H5P_DEFAULT, deflate ? 1u : 0u, off1, whole.size() * sizeof(float),
                           whole.data()) >= 0);
  });
}

}  // namespace

TEST_CASE("calib: an unfiltered chunk recorded shorter than a chunk is refused before any read") {
  TempDir tmp;
  // Whole chunks: read back as written.
  asap::CalibFile ok(calib_with_chunk_record(tmp, "whole.h5", 48, false, 0));
  CHECK(ok.read("l0", 0, 4).x.sum().item<double>() == doctest::Approx(24 * 0.5));
  // The first chunk recorded as 40 of its 48 bytes: H5Dread would copy 48 bytes out of a 40-byte buffer.
  const std::string short_path = calib_with_chunk_record(tmp, "short.h5", 40, false, 0);
  CHECK(
      error_of([&] { asap::CalibFile cf(short_path); }) ==
      "calibration file '" + short_path +
          "': dataset '/layers/l0/x' records its chunk at [0, 0, 0] as 40 bytes, but an unfiltered chunk of [2, 3, 2] "
          "of float32 holds 48 bytes: its chunk index is damaged, so it is refused");
  // Deflate on the dataset but skipped for this chunk (filter mask bit 0): as unfiltered.
  const std::string skipped = calib_with_chunk_record(tmp, "skipped.h5", 40, true, 1u);
  CHECK(contains(error_of([&] { asap::CalibFile cf(skipped); }),
                 "records its chunk at [0, 0, 0] as 40 bytes, but an unfiltered chunk of [2, 3, 2] of float32 holds "
                 "48 bytes"));
}

TEST_CASE("calib: fuzz_calib's short chunk records are refused, naming file, dataset and chunk") {
  // Found by the sanitizer stage (2026-12-04): HDF5 1.10.8 read past its own
  // chunk buffer in H5VM_memcpyvv, inside H5Dread.
  const std::string dir = std::string(ASAP_SOURCE_DIR) + "/fuzz/regressions/calib/";
  const auto refusal = [](const std::string& path) {
    return error_of([&] {
      asap::CalibFile cf(path);
      for (const std::string& name : cf.layer_names()) (void)cf.read(name, 0, 1);
    });
  };
  CHECK(contains(refusal(dir + "mask_chunk_recorded_as_0_bytes.h5"),
                 "dataset '/layers/enc.attn/mask' records its chunk at [0, 0] as 0 bytes, but an unfiltered chunk of "
                 "[2, 5] of enum (e.g. bool) holds 10 bytes: its chunk index is damaged, so it is refused"));
  CHECK(contains(refusal(dir + "chunk_recorded_as_9216_of_72192_bytes.h5"),
                 "dataset '/layers/layers.0.mha/x' records its chunk at [0, 0, 0] as 9216 bytes, but an unfiltered "
                 "chunk of [6, 94, 32] of float32 holds 72192 bytes"));
}

// The compiled artifact (docs/artifact-format.md): round trip of every field,
// the on-disk layout, and the corrupt-artifact suite. Corrupt files are made
// by writing a valid artifact and editing it with the HDF5 C++ API.
#include <ATen/ATen.h>
#include <H5Cpp.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/error.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "io/h5util.h"
#include "test_util.h"

namespace fs = std::filesystem;
namespace h5 = asap::detail::h5;

using asap_test::error_of;
using asap_test::TempDir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

at::Tensor unit_columns(int64_t rows, int64_t cols) {
  auto t = at::randn({rows, cols}, at::kDouble);
  return t / t.norm(2, {0}, true);
}

// A fused-layout layer with projections (float32 and one float64 tensor, to
// check dtypes survive), per-head coefficients and the full feature family.
asap::CompiledLayer fused_layer() {
  asap::CompiledLayer L;
  asap::LayerSpec& s = L.spec;
  s.name = "blocks.0.attn";
  s.layout = asap::ProjLayout::kFused;
  s.qkv = {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias"};
  s.qkv_order = "kqv";
  s.out = {"blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias"};
  s.head_layout = "(d h)";
  s.d_model = 12;
  s.heads = 3;
  s.head_dim = 4;
  s.value_dim = 5;
  s.score_scale = 0.5;
  s.eps = 0.7;
  s.T = 5;
  s.mask = asap::MaskConvention::kDropQueries;
  s.multiply_by_n = false;
  L.family = {5, true, true};
  L.theta = unit_columns(4, 8);  // a bank larger than the family uses
  L.per_head = true;
  L.coef = at::randn({3, 7}, at::kDouble);
  L.default_closures = 3;
  L.weights.wq = at::randn({12, 12});
  L.weights.bq = at::randn({12});
  L.weights.wk = at::randn({12, 12});
  L.weights.bk = at::randn({12});
  L.weights.wv = at::randn({15, 12}, at::kDouble);
  L.weights.bv = at::randn({15});
  L.weights.wo = at::randn({12, 15});
  L.weights.bo = at::randn({12});
  L.fit_json = R"({"lambda": 0.01, "selected": {"k": 3}, "note": "unicode \u00e9 ok"})";
  return L;
}

// A layer compiled from q/k/v: no weights, one coefficient row, no slices.
asap::CompiledLayer qkv_layer() {
  asap::CompiledLayer L;
  asap::LayerSpec& s = L.spec;
  s.name = "adapter.attn";
  s.layout = asap::ProjLayout::kNone;
  s.heads = 2;
  s.head_dim = 3;
  s.value_dim = 3;
  s.score_scale = 1.0 / std::sqrt(3.0);
  s.eps = 1.0;
  s.T = 4;
  L.family = {0, true, false};
  L.theta = unit_columns(3, 2);
  L.per_head = false;
  L.coef = at::randn({1, 1}, at::kDouble);
  L.default_closures = 1;
  return L;
}

asap::Artifact sample_artifact() {
  at::manual_seed(5);
  asap::Artifact a;
  a.asapc_version = "0.1.0-test";
  a.teacher_sha256 = std::string(64, 'a');
  a.teacher_file = "teacher.pt";
  a.created_utc = "2024-05-01T12:00:00Z";
  a.layers = {fused_layer(), qkv_layer()};
  return a;
}

void check_same_layer(const asap::CompiledLayer& a, const asap::CompiledLayer& b) {
  const asap::LayerSpec &x = a.spec, &y = b.spec;
  CHECK(x.name == y.name);
  CHECK(x.layout == y.layout);
  CHECK(x.qkv.weight == y.qkv.weight);
  CHECK(x.qkv.bias == y.qkv.bias);
  CHECK(x.qkv_order == y.qkv_order);
  CHECK(x.q.weight == y.q.weight);
  CHECK(x.q.bias == y.q.bias);
  CHECK(x.k.weight == y.k.weight);
  CHECK(x.k.bias == y.k.bias);
  CHECK(x.v.weight == y.v.weight);
  CHECK(x.v.bias == y.v.bias);
  CHECK(x.out.weight == y.out.weight);
  CHECK(x.out.bias == y.out.bias);
  CHECK(x.head_layout == y.head_layout);
  CHECK(x.d_model == y.d_model);
  CHECK(x.heads == y.heads);
  CHECK(x.head_dim == y.head_dim);
  CHECK(x.value_dim == y.value_dim);
  CHECK(x.score_scale == y.score_scale);
  CHECK(x.eps == y.eps);
  CHECK(x.T == y.T);
  CHECK(x.mask == y.mask);
  CHECK(x.multiply_by_n == y.multiply_by_n);
  CHECK(a.family == b.family);
  CHECK(a.per_head == b.per_head);
  CHECK(a.default_closures == b.default_closures);
  CHECK(a.fit_json == b.fit_json);
  CHECK(same(a.theta, b.theta));
  CHECK(same(a.coef, b.coef));
  CHECK(a.weights.defined() == b.weights.defined());
  CHECK(same(a.weights.wq, b.weights.wq));
  CHECK(same(a.weights.bq, b.weights.bq));
  CHECK(same(a.weights.wk, b.weights.wk));
  CHECK(same(a.weights.bk, b.weights.bk));
  CHECK(same(a.weights.wv, b.weights.wv));
  CHECK(same(a.weights.bv, b.weights.bv));
  CHECK(same(a.weights.wo, b.weights.wo));
  CHECK(same(a.weights.bo, b.weights.bo));
}

void edit_file(const std::string& path, const std::function<void(H5::H5File&)>& edit) {
  H5::H5File f(path, H5F_ACC_RDWR);
  edit(f);
}

h5::Where where_of(const std::string& path) { return {"test '" + path + "'", "/"}; }

// Writes the sample artifact to `path` and returns `path`.
std::string valid(const std::string& path) {
  asap::write_artifact(path, sample_artifact());
  return path;
}

std::string read_error(const std::string& path) {
  return error_of([&] { asap::read_artifact(path); });
}

}  // namespace

TEST_CASE("artifact: round trip preserves every field and tensor") {
  TempDir tmp;
  const std::string path = tmp.file("a.h5");
  asap::Artifact art = sample_artifact();
  asap::write_artifact(path, art);
  CHECK(tmp.entries() == std::vector<std::string>{"a.h5"});

  asap::Artifact back = asap::read_artifact(path);
  CHECK(back.format_version == 4);  // every file is written as version 4 (fixed-length strings)
  CHECK(back.asapc_version == art.asapc_version);
  CHECK(back.teacher_sha256 == art.teacher_sha256);
  CHECK(back.teacher_file == art.teacher_file);
  CHECK(back.created_utc == art.created_utc);
  REQUIRE(back.layers.size() == 2);
  check_same_layer(back.layers[0], art.layers[0]);
  check_same_layer(back.layers[1], art.layers[1]);
  CHECK((back.layers[0].weights.wq.scalar_type() == at::kFloat));
  CHECK((back.layers[0].weights.wv.scalar_type() == at::kDouble));
  CHECK_FALSE(back.layers[1].weights.defined());

  REQUIRE(back.find("adapter.attn") != nullptr);
  CHECK(back.find("adapter.attn")->spec.heads == 2);
  CHECK(back.find("blocks.0.attn") == &back.layers[0]);
  CHECK(back.find("blocks.7.attn") == nullptr);
}

TEST_CASE("artifact: empty version fields are filled in by the writer") {
  TempDir tmp;
  asap::Artifact art = sample_artifact();
  art.asapc_version.clear();
  art.created_utc.clear();
  art.layers[0].theta = art.layers[0].theta.to(at::kFloat).to(at::kDouble);  // float32 round-off is tolerated
  asap::write_artifact(tmp.file("a.h5"), art);
  asap::Artifact back = asap::read_artifact(tmp.file("a.h5"));
  CHECK_FALSE(back.asapc_version.empty());
  REQUIRE(back.created_utc.size() == 20);  // 2024-05-01T12:00:00Z
  CHECK(back.created_utc[10] == 'T');
  CHECK(back.created_utc.back() == 'Z');
}

TEST_CASE("artifact: on-disk layout matches docs/artifact-format.md") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  H5::H5File f(path, H5F_ACC_RDONLY);
  h5::Where w = where_of(path);
  CHECK(h5::read_string_attr(f, "format", w) == "asapc-artifact");
  CHECK(h5::read_int_attr(f, "format_version", w) == 4);
  CHECK(h5::read_int_attr(f, "num_layers", w) == 2);
  CHECK(h5::read_string_attr(f, "teacher_file", w) == "teacher.pt");
  H5::Group layers = f.openGroup("layers");
  CHECK(h5::list_groups(layers, w) == std::vector<std::string>{"0000", "0001"});
  H5::Group g = f.openGroup("/layers/0000");
  CHECK(h5::read_string_attr(g, "name", w) == "blocks.0.attn");
  CHECK(h5::read_string_attr(g, "layout", w) == "fused");
  CHECK(h5::read_string_attr(g, "mask", w) == "drop_queries");
  CHECK(h5::read_string_attr(g, "ending", w) == "row");  // T = 5
  CHECK(h5::read_string_list_attr(g, "features", w) ==
        std::vector<std::string>{"sliced_potential", "alpha", "softmax_dual"});
  CHECK(h5::read_int_attr(g, "slices", w) == 5);
  CHECK(h5::read_int_attr(g, "per_head", w) == 1);
  CHECK(h5::read_double_attr(g, "score_scale", w) == 0.5);
  auto theta = h5::dataset_info(g.openDataSet("theta"), w);
  CHECK(theta.shape == std::vector<int64_t>{4, 8});
  CHECK(theta.type_name() == "float64");
  CHECK(h5::dataset_info(g.openDataSet("coef"), w).shape == std::vector<int64_t>{3, 7});
  CHECK(h5::dataset_info(g.openDataSet("weights/wq"), w).type_name() == "float32");
  CHECK(contains(h5::read_string_dataset(g, "fit_json", w), "\"lambda\""));
  H5::Group g1 = f.openGroup("/layers/0001");
  CHECK(h5::read_string_attr(g1, "ending", w) == "column");  // T = 4
  CHECK(h5::read_string_list_attr(g1, "features", w) == std::vector<std::string>{"alpha"});
  CHECK_FALSE(h5::has_link(g1, "weights"));
}

TEST_CASE("artifact: feature family names and column counts") {
  CHECK(asap::FeatureFamily{64, true, true}.name() == "L64+alpha+softmax");
  CHECK(asap::FeatureFamily{64, true, true}.num_columns() == 66);
  CHECK(asap::FeatureFamily{8, false, false}.name() == "L8");
  CHECK(asap::FeatureFamily{0, true, false}.name() == "alpha");
  CHECK(asap::FeatureFamily{16, false, true}.name() == "L16+softmax");
  CHECK(asap::FeatureFamily{0, false, false}.num_columns() == 0);
}

TEST_CASE("artifact: corrupt - wrong format name") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { h5::write_string_attr(f, "format", "asapc-calib", where_of(path)); });
  CHECK(read_error(path) ==
        "artifact '" + path +
            "' is not an asapc artifact: root attribute 'format' is 'asapc-calib', expected 'asapc-artifact'");
}

TEST_CASE("artifact: corrupt - version 0 or missing") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "format_version", 0, where_of(path)); });
  CHECK(read_error(path) ==
        "artifact '" + path + "' has format_version 0, which is not a valid version (versions start at 1)");
  edit_file(path, [&](H5::H5File& f) { f.removeAttr("format_version"); });
  CHECK(read_error(path) == "artifact '" + path + "': root attribute 'format_version' is missing");
}

TEST_CASE("artifact: corrupt - future version") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "format_version", 7, where_of(path)); });
  CHECK(read_error(path) == "artifact '" + path + "' has format_version 7 but this asapc reads versions 1 to 6");
}

TEST_CASE("artifact: corrupt - missing coef dataset") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { f.unlink("/layers/0000/coef"); });
  CHECK(read_error(path) ==
        "artifact '" + path + "': layer 'blocks.0.attn' (/layers/0000): required dataset 'coef' is missing");
}

TEST_CASE("artifact: corrupt - coef columns disagree with the feature family") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    g.unlink("coef");
    h5::write_tensor(g, "coef", at::zeros({3, 6}, at::kDouble), 0, where_of(path));
  });
  CHECK(read_error(path) ==
        "artifact '" + path +
            "': layer 'blocks.0.attn' (/layers/0000): coef has shape [3, 6] but per_head = true and "
            "the feature family L5+alpha+softmax has 7 columns, so expected [3, 7]");
  // Rows are checked against per_head too.
  edit_file(path,
            [&](H5::H5File& f) { h5::write_int_attr(f.openGroup("/layers/0000"), "per_head", 0, where_of(path)); });
  CHECK(contains(read_error(path), "coef has shape [3, 6] but per_head = false"));
}

TEST_CASE("artifact: corrupt - NaN coefficient") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0001");
    g.unlink("coef");
    h5::write_tensor(g, "coef", at::full({1, 1}, std::nan(""), at::kDouble), 0, where_of(path));
  });
  CHECK(read_error(path) == "artifact '" + path + "': layer 'adapter.attn' (/layers/0001): coef contains NaN/Inf");
}

TEST_CASE("artifact: corrupt - truncated file") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  const std::string cut = tmp.file("cut.h5");
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() > 1000);
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  std::string msg = read_error(cut);
  CHECK(contains(msg, "artifact '" + cut + "' is a damaged or truncated HDF5 file: HDF5 cannot open it ("));
  CHECK(contains(msg, "truncated"));
}

TEST_CASE("artifact: a write that throws midway leaves no file") {
  TempDir tmp;
  const std::string path = tmp.file("a.h5");
  asap::Artifact art = sample_artifact();
  art.layers[1].theta = at::Tensor();  // layer 0 is written before this is noticed
  CHECK(error_of([&] { asap::write_artifact(path, art); }) ==
        "artifact '" + path + "': layer 'adapter.attn' (/layers/0001): theta is undefined");
  CHECK(tmp.entries().empty());  // neither the target nor a .tmp- file

  // Over an existing artifact, a failed write leaves the old one intact.
  valid(path);
  art.layers[1] = qkv_layer();
  art.layers[1].coef = at::zeros({2, 1}, at::kDouble);  // per_head is false: needs one row
  CHECK(contains(
      error_of([&] { asap::write_artifact(path, art); }),
      "coef has shape [2, 1] but per_head = false and the feature family alpha has 1 column, so expected [1, 1]"));
  CHECK(tmp.entries() == std::vector<std::string>{"a.h5"});
  CHECK(asap::read_artifact(path).layers.size() == 2);
}

TEST_CASE("artifact: corrupt - missing or mistyped attributes name the layer and field") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { f.openGroup("/layers/0001").removeAttr("heads"); });
  CHECK(read_error(path) ==
        "artifact '" + path + "': attribute 'heads' of '/layers/0001 (layer 'adapter.attn')' is missing");
  edit_file(path,
            [&](H5::H5File& f) { h5::write_string_attr(f.openGroup("/layers/0001"), "heads", "two", where_of(path)); });
  CHECK(contains(read_error(path),
                 "attribute 'heads' of '/layers/0001 (layer 'adapter.attn')' should be an integer, found string"));
  const std::string p2 = valid(tmp.file("b.h5"));
  edit_file(p2, [&](H5::H5File& f) { f.removeAttr("teacher_sha256"); });
  CHECK(read_error(p2) == "artifact '" + p2 + "': attribute 'teacher_sha256' of '/' is missing");
}

TEST_CASE("artifact: corrupt - invalid metadata values") {
  TempDir tmp;
  struct Case {
    const char* attr;
    int64_t value;
    const char* expect;
  };
  const Case cases[] = {
      {"T", 1, "attribute 'T' (Sinkhorn budget) must be >= 2, found 1"},
      {"default_closures", 0, "attribute 'default_closures' must be >= 1, found 0"},
      {"heads", 0, "heads must be >= 1, found 0"},
      {"slices", 9, "theta has 8 columns but the feature family L9+alpha+softmax uses 9 slices"},
      {"head_dim", 5, "theta has shape [4, 8] but should be [head_dim, slices] with head_dim = 5"},
      {"d_model", 13, "weights/wq has shape [12, 12], expected [12, 13]"},
      {"per_head", 2, "attribute 'per_head' must be 0 or 1, found 2"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.attr);
    const std::string path = valid(tmp.file(std::string(c.attr) + ".h5"));
    edit_file(path,
              [&](H5::H5File& f) { h5::write_int_attr(f.openGroup("/layers/0000"), c.attr, c.value, where_of(path)); });
    CHECK(read_error(path) == "artifact '" + path + "': layer 'blocks.0.attn' (/layers/0000): " + c.expect);
  }
  const std::string path = valid(tmp.file("ending.h5"));
  edit_file(path, [&](H5::H5File& f) {
    h5::write_string_attr(f.openGroup("/layers/0000"), "ending", "column", where_of(path));
  });
  CHECK(contains(read_error(path), "attribute 'ending' is 'column' but T = 5 implies 'row'"));
}

TEST_CASE("artifact: corrupt - unknown feature group is refused") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    h5::write_string_list_attr(f.openGroup("/layers/0000"), "features", {"sliced_potential", "cosine"}, where_of(path));
  });
  CHECK(read_error(path) ==
        "artifact '" + path +
            "': layer 'blocks.0.attn' (/layers/0000): attribute 'features' names unknown feature "
            "group 'cosine' (known: sliced_potential, alpha, softmax_dual, sinkhorn_dual3, score_stats, "
            "centered_stats)");
}

TEST_CASE("artifact: corrupt - non-finite theta and wrong weight shapes") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    g.unlink("theta");
    auto t = unit_columns(4, 8);
    t[1][2] = std::numeric_limits<double>::infinity();
    h5::write_tensor(g, "theta", t, 0, where_of(path));
  });
  CHECK(read_error(path) == "artifact '" + path + "': layer 'blocks.0.attn' (/layers/0000): theta contains NaN/Inf");

  const std::string p2 = valid(tmp.file("b.h5"));
  edit_file(p2, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000/weights");
    g.unlink("bv");
    h5::write_tensor(g, "bv", at::zeros({12}), 0, where_of(p2));
  });
  CHECK(read_error(p2) ==
        "artifact '" + p2 + "': layer 'blocks.0.attn' (/layers/0000): weights/bv has shape [12], expected [15]");

  const std::string p3 = valid(tmp.file("c.h5"));
  edit_file(p3, [&](H5::H5File& f) { f.unlink("/layers/0000/weights/wk"); });
  CHECK(contains(read_error(p3), "weights/wq is given but weights/wk is missing"));

  const std::string p4 = valid(tmp.file("d.h5"));
  edit_file(p4, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0001");
    g.unlink("theta");
    h5::write_tensor(g, "theta", at::ones({3, 2}, at::kDouble), 0, where_of(p4));
  });
  CHECK(contains(read_error(p4), "theta column 0 has norm 1.73205"));
}

TEST_CASE("artifact: corrupt - layer groups disagree with num_layers") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "num_layers", 3, where_of(path)); });
  CHECK(read_error(path) == "artifact '" + path + "': layer group 2 is missing under '/layers' (num_layers = 3)");
  edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "num_layers", 1, where_of(path)); });
  CHECK(read_error(path) == "artifact '" + path + "' has layer group '/layers/0001' but num_layers is 1");
  edit_file(path, [&](H5::H5File& f) {
    h5::write_int_attr(f, "num_layers", 2, where_of(path));
    f.createGroup("/layers/extra");
  });
  CHECK(contains(read_error(path), "'/layers/extra' is not a layer group"));
}

TEST_CASE("artifact: unknown extra attributes are ignored; fit_json may be an attribute") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    h5::write_string_attr(f, "future_field", "whatever", where_of(path));
    H5::Group g = f.openGroup("/layers/0001");
    h5::write_double_attr(g, "future_number", 3.5, where_of(path));
    h5::write_tensor(g, "future_dataset", at::zeros({2}), 0, where_of(path));
    g.unlink("fit_json");
    h5::write_string_attr(g, "fit_json", "{\"small\": true}", where_of(path));
    g.removeAttr("ending");  // derived, optional
  });
  asap::Artifact back = asap::read_artifact(path);
  REQUIRE(back.layers.size() == 2);
  CHECK(back.layers[1].fit_json == "{\"small\": true}");
  check_same_layer(back.layers[0], sample_artifact().layers[0]);
}

TEST_CASE("artifact: writer refuses what the reader would refuse") {
  TempDir tmp;
  const std::string path = tmp.file("a.h5");
  asap::Artifact art = sample_artifact();
  art.layers[1].spec.name = "blocks.0.attn";
  CHECK(error_of([&] { asap::write_artifact(path, art); }) ==
        "artifact '" + path + "': layer 'blocks.0.attn' appears twice");
  art = sample_artifact();
  art.layers.clear();
  CHECK(contains(error_of([&] { asap::write_artifact(path, art); }), "no layers"));
  art = sample_artifact();
  art.layers[0].coef[1][3] = std::nan("");
  CHECK(contains(error_of([&] { asap::write_artifact(path, art); }), "coef contains NaN/Inf"));
  art = sample_artifact();
  art.layers[0].weights.wk = at::Tensor();
  CHECK(contains(error_of([&] { asap::write_artifact(path, art); }), "weights/wq is given but weights/wk is missing"));
  CHECK(error_of([&] { asap::write_artifact(tmp.file("no/such/dir/a.h5"), sample_artifact()); }) ==
        "artifact '" + tmp.file("no/such/dir/a.h5") + "': cannot write: directory '" + tmp.file("no/such/dir") +
            "' does not exist");
  CHECK(tmp.entries().empty());
}

TEST_CASE("artifact: missing and non-HDF5 files") {
  TempDir tmp;
  CHECK(read_error(tmp.file("none.h5")) == "artifact '" + tmp.file("none.h5") + "': no such file");
  { std::ofstream(tmp.file("x.h5")) << "{\"not\": \"hdf5\"}"; }
  CHECK(read_error(tmp.file("x.h5")) ==
        "artifact '" + tmp.file("x.h5") + "': not an HDF5 file (no HDF5 signature found)");
}

namespace {
// A feature group that needs a newer format version: the sample's first
// layer with the group added (by `add`) is written as `written`, reads back
// with the same family, and is refused once its file says `older`.
void check_group_version(const std::function<void(asap::FeatureFamily&)>& add, const std::string& group, int written,
                         int older) {
  TempDir tmp;
  const std::string path = tmp.file("a.h5");
  asap::Artifact art = sample_artifact();
  auto& L = art.layers[0];
  add(L.family);
  L.coef = at::randn({L.coef.size(0), L.family.num_columns()}, at::kDouble);
  asap::write_artifact(path, art);
  {
    H5::H5File f(path, H5F_ACC_RDONLY);
    CHECK(h5::read_string_list_attr(f.openGroup("/layers/0000"), "features", where_of(path)).back() == group);
  }
  auto back = asap::read_artifact(path);
  CHECK(back.format_version == written);
  CHECK(back.layers[0].family == L.family);
  edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "format_version", older, where_of(path)); });
  CHECK(read_error(path).find("feature group '" + group + "' needs format_version " + std::to_string(older + 1) +
                              ", but the file says " + std::to_string(older)) != std::string::npos);
}
}  // namespace

TEST_CASE("artifact: the sinkhorn_dual3 group round trips (as version 4) and is refused in version 1") {
  check_group_version([](asap::FeatureFamily& f) { f.softmax_dual = f.sinkhorn_dual3 = true; }, "sinkhorn_dual3", 4, 1);
  CHECK(asap::FeatureFamily{5, true, true, true}.name() == "L5+alpha+softmax+sinkhorn3");
}

TEST_CASE("artifact: the score_stats group round trips as format version 5 and is refused in version 4") {
  check_group_version([](asap::FeatureFamily& f) { f.score_stats = true; }, "score_stats", 5, 4);
  CHECK(asap::FeatureFamily{5, true, true, false, true}.name() == "L5+alpha+softmax+stats");
}

TEST_CASE("artifact: the centered_stats group round trips as format version 6, is refused in version 5 and alone") {
  check_group_version([](asap::FeatureFamily& f) { f.score_stats = f.centered_stats = true; }, "centered_stats", 6, 5);
  CHECK(asap::FeatureFamily{5, true, true, false, true, true}.name() == "L5+alpha+softmax+cstats");
  // centered_stats without score_stats names no family.
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    h5::write_int_attr(f, "format_version", 6, where_of(path));
    h5::write_string_list_attr(f.openGroup("/layers/0000"), "features", {"sliced_potential", "alpha", "centered_stats"},
                               where_of(path));
  });
  CHECK(read_error(path).find("feature group 'centered_stats' needs 'score_stats' before it, which attribute "
                              "'features' omits") != std::string::npos);
}

TEST_CASE("artifact: every feature family, pooled and per head, round trips and computes the same operator") {
  TempDir tmp;
  for (int fam = 0; fam < 6; ++fam)
    for (bool per_head : {false, true}) {
      CAPTURE(fam);
      CAPTURE(per_head);
      asap::Artifact art = sample_artifact();
      auto& L = art.layers[1];  // the q/k/v layer without weights
      L.family = asap::FeatureFamily{2, fam >= 1, fam >= 2, fam >= 3, fam >= 4, fam >= 5};  // the bank holds 2 slices
      L.per_head = per_head;
      L.coef = at::randn({per_head ? L.spec.heads : 1, L.family.num_columns()}, at::kDouble);
      const std::string path = tmp.file("f" + std::to_string(fam) + (per_head ? "h" : "p") + ".h5");
      asap::write_artifact(path, art);
      auto back = asap::read_artifact(path);
      const auto& B = back.layers[1];
      CHECK(B.family == L.family);
      CHECK(B.per_head == per_head);
      CHECK(back.format_version == (fam >= 5 ? 6 : fam >= 4 ? 5 : 4));
      at::manual_seed(5);
      auto q = at::randn({2, L.spec.heads, 9, L.spec.head_dim}), k = at::randn({2, L.spec.heads, 9, L.spec.head_dim});
      auto v = at::randn({2, L.spec.heads, 9, L.spec.value_dim});
      CHECK_CLOSE_T(asap::run_layer(B, q, k, v, at::Tensor()).out, asap::run_layer(L, q, k, v, at::Tensor()).out, 0.0);
    }
}

TEST_CASE("artifact: Sinkhorn and teacher operators round trip as format version 3 and run the teacher loop") {
  TempDir tmp;
  for (auto kind : {asap::OperatorKind::kSinkhorn, asap::OperatorKind::kTeacher}) {
    CAPTURE(asap::operator_kind_name(kind));
    asap::Artifact art = sample_artifact();
    auto& L = art.layers[1];  // the q/k/v layer without weights
    L.kind = kind;
    L.sinkhorn_steps = kind == asap::OperatorKind::kSinkhorn ? L.spec.T - 1 : 0;
    L.family = asap::FeatureFamily{};
    L.theta = at::zeros({L.spec.head_dim, 0}, at::kDouble);
    L.coef = at::zeros({1, 0}, at::kDouble);
    L.per_head = false;
    const std::string path = tmp.file(std::string(asap::operator_kind_name(kind)) + ".h5");
    asap::write_artifact(path, art);
    auto back = asap::read_artifact(path);
    CHECK(back.format_version == 4);
    const auto& B = back.layers[1];
    CHECK(B.kind == kind);
    CHECK(B.sinkhorn_steps == L.sinkhorn_steps);
    CHECK(B.lse_passes() == (kind == asap::OperatorKind::kSinkhorn ? L.spec.T - 1 : L.spec.T));
    CHECK(back.layers[0].kind == asap::OperatorKind::kAsap);  // the other layer is untouched
    at::manual_seed(6);
    auto q = at::randn({2, L.spec.heads, 9, L.spec.head_dim}), k = at::randn({2, L.spec.heads, 9, L.spec.head_dim});
    auto v = at::randn({2, L.spec.heads, 9, L.spec.value_dim});
    auto ref = asap::run_teacher_reference(q, k, v, at::Tensor(), L.spec.score_scale, B.lse_passes(),
                                           asap::convention_of(L.spec), false);
    CHECK_CLOSE_T(asap::run_layer(B, q, k, v, at::Tensor()).out, ref.O, 1e-5);
    CHECK_CLOSE_T(asap::run_layer_reference(B, q, k, v, at::Tensor()).out, ref.O, 1e-10);
    // Version 2 readers' files cannot hold the kind; a Sinkhorn budget must be below T.
    edit_file(path, [&](H5::H5File& f) { h5::write_int_attr(f, "format_version", 2, where_of(path)); });
    CHECK(read_error(path).find("needs format_version 3, but the file says 2") != std::string::npos);
  }
  asap::Artifact art = sample_artifact();
  auto& L = art.layers[1];
  L.kind = asap::OperatorKind::kSinkhorn;
  L.sinkhorn_steps = L.spec.T;
  L.family = asap::FeatureFamily{};
  L.theta = at::zeros({L.spec.head_dim, 0}, at::kDouble);
  L.coef = at::zeros({1, 0}, at::kDouble);
  CHECK_THROWS_WITH_AS(asap::write_artifact(tmp.file("bad.h5"), art),
                       doctest::Contains("sinkhorn_steps (T') must be in 1..T-1"), asap::Error);
  L.sinkhorn_steps = 1;
  L.family.alpha = true;
  CHECK_THROWS_WITH_AS(asap::write_artifact(tmp.file("bad.h5"), art),
                       doctest::Contains("operator has no feature columns"), asap::Error);
  CHECK(!std::filesystem::exists(tmp.file("bad.h5")));
}

// ---- issue 16, item 8: sizes from the file are not trusted -------------------------

TEST_CASE("artifact: a theta declaring 2^40 x 64 that was never written is refused before anything is allocated") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    g.unlink("theta");
    hsize_t dims[2] = {hsize_t{1} << 40, 64}, chunk[2] = {1, 64};
    H5::DSetCreatPropList pl;
    pl.setChunk(2, chunk);
    g.createDataSet("theta", H5::PredType::IEEE_F64LE, H5::DataSpace(2, dims), pl);
  });
  CHECK(fs::file_size(path) < 300000);
  CHECK(read_error(path) == "artifact '" + path +
                                "': dataset '/layers/0000/theta' declares shape [1099511627776, 64] of float64 in "
                                "1099511627776 chunks of [1, 64], but only 0 chunks are stored in the file; its data "
                                "was never written (or the file was cut short or edited), so it is refused");
}

TEST_CASE("artifact: a theta of 2^40 x 2^40 is refused: its element count overflows") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0001");
    g.unlink("theta");
    hsize_t dims[2] = {hsize_t{1} << 40, hsize_t{1} << 40}, chunk[2] = {1, 1};
    H5::DSetCreatPropList pl;
    pl.setChunk(2, chunk);
    g.createDataSet("theta", H5::PredType::IEEE_F64LE, H5::DataSpace(2, dims), pl);
  });
  CHECK(read_error(path) == "artifact '" + path +
                                "': dataset '/layers/0001/theta' declares shape [1099511627776, 1099511627776], "
                                "whose element count overflows 64-bit sizes");
}

TEST_CASE("artifact: dataset shapes are checked against the layer's attributes before any value is read") {
  TempDir tmp;
  // theta holds NaN and coef has the wrong shape: the shape is refused first,
  // because it is checked from metadata before the data is read.
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    g.unlink("theta");
    auto t = unit_columns(4, 8);
    t[0][0] = std::nan("");
    h5::write_tensor(g, "theta", t, 0, where_of(path));
    g.unlink("coef");
    h5::write_tensor(g, "coef", at::zeros({3, 6}, at::kDouble), 0, where_of(path));
  });
  CHECK(contains(read_error(path), "(/layers/0000): coef has shape [3, 6] but per_head = true"));

  // heads * head_dim overflowing int64 is refused in words (it was undefined behaviour).
  const std::string p2 = valid(tmp.file("b.h5"));
  edit_file(p2, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    h5::write_int_attr(g, "heads", int64_t{1} << 62, where_of(p2));
    h5::write_int_attr(g, "per_head", 0, where_of(p2));
    g.unlink("coef");
    h5::write_tensor(g, "coef", at::zeros({1, 7}, at::kDouble), 0, where_of(p2));
  });
  CHECK(read_error(p2) == "artifact '" + p2 +
                              "': layer 'blocks.0.attn' (/layers/0000): heads * head_dim or heads * value_dim "
                              "overflows 64-bit sizes (heads = 4611686018427387904, head_dim = 4, value_dim = 5)");

  // A huge 'slices' attribute is refused before slices + 3 columns could overflow.
  const std::string p3 = valid(tmp.file("c.h5"));
  edit_file(p3,
            [&](H5::H5File& f) { h5::write_int_attr(f.openGroup("/layers/0000"), "slices", INT64_MAX, where_of(p3)); });
  CHECK(contains(read_error(p3),
                 "(/layers/0000): attribute 'slices' must be in 0..2147483648, found "
                 "9223372036854775807"));
}

TEST_CASE("artifact: an unwritten fixed-length fit_json string is refused instead of allocating its declared size") {
  TempDir tmp;
  const std::string path = valid(tmp.file("a.h5"));
  edit_file(path, [&](H5::H5File& f) {
    H5::Group g = f.openGroup("/layers/0000");
    g.unlink("fit_json");
    H5::StrType st(H5::PredType::C_S1, size_t{1} << 31);  // 2 GiB, declared only
    H5::DSetCreatPropList pl;
    pl.setLayout(H5D_CONTIGUOUS);
    H5Pset_alloc_time(pl.getId(), H5D_ALLOC_TIME_LATE);
    g.createDataSet("fit_json", st, H5::DataSpace(H5S_SCALAR), pl);
  });
  CHECK(contains(read_error(path),
                 "': dataset '/layers/0000/fit_json' declares shape [] of "
                 "string (2147483648 bytes), but only 0 bytes are stored in the file"));
}

// Reading Sinkformer-layout checkpoints in every form torch.save writes and
// reproducing the attention the (Python) Sinkformer code path recorded,
// within 1e-5 in float32 (tools/make_fixtures.py made the fixtures).
#include <ATen/ATen.h>

#include "asap/checkpoint.h"
#include "asap/layer.h"
#include "asap/runtime.h"
#include "asap/spec.h"
#include "asap/teacher.h"
#include "io/h5util.h"
#include "test_util.h"

namespace h5 = asap::detail::h5;

namespace {

at::Tensor read_fixture(const std::string& dataset, at::ScalarType dtype = at::kFloat) {
  const std::string path = asap_test::data_path("fixtures/fixtures.h5");
  h5::Where w{"fixtures", dataset};
  auto f = h5::open_file(path, w);
  auto ds = h5::open_dataset(f, dataset, w);
  return h5::read_all(ds, dtype, w);
}

void check_model(const std::string& model, const std::string& file_key) {
  auto manifest = asap_test::load_json("fixtures/fixtures.json")["models"][model];
  const std::string file = manifest["files"][file_key];
  CAPTURE(file);
  auto ck = asap::load_checkpoint(asap_test::data_path("fixtures/" + file));
  asap::DetectOptions o;
  o.T = manifest["T"];
  o.eps = manifest["eps"];
  o.heads = manifest["heads"];
  auto det = asap::detect_layers(ck, o);
  CHECK(det.layout_name == (model == "vit" ? "sinkformer-vit" : "sinkformer-text"));
  CHECK(det.missing.empty());
  REQUIRE(det.spec.layers.size() == manifest["layers"].size());
  asap::validate_spec(det.spec, ck, "detected");
  for (size_t i = 0; i < det.spec.layers.size(); ++i) {
    const auto& l = det.spec.layers[i];
    const auto& ml = manifest["layers"][i];
    CHECK(l.name == ml["name"].get<std::string>());
    CHECK(l.score_scale == doctest::Approx(manifest["score_scale"].get<double>()));
    const std::string g = ml["h5_group"];
    auto x = read_fixture(g + "/x");
    at::Tensor mask;
    if (manifest.value("masked", false)) mask = read_fixture(g + "/mask").gt(0.5);
    auto w = asap::load_layer_weights(l, ck);
    auto qkv = asap::project_qkv(l, w, x);
    auto t = asap::run_teacher(qkv.q, qkv.k, qkv.v, mask, l.score_scale, l.T, asap::convention_of(l));
    CHECK((t.A.scalar_type() == at::kFloat));
    CHECK_CLOSE_T(t.A, read_fixture(g + "/attn"), 1e-5);
    CHECK_CLOSE_T(t.O, read_fixture(g + "/head_out"), 1e-5);
    CHECK_CLOSE_T(asap::merge_heads(l, w, t.O), read_fixture(g + "/out"), 1e-5);
  }
}

}  // namespace

TEST_CASE("sinkformer repro: ViT as plain state_dict") { check_model("vit", "state_dict"); }
TEST_CASE("sinkformer repro: ViT as checkpoint dict") { check_model("vit", "checkpoint"); }
TEST_CASE("sinkformer repro: ViT as DataParallel state_dict") { check_model("vit", "dataparallel"); }
TEST_CASE("sinkformer repro: ViT as whole-model pickle") { check_model("vit", "pickle"); }
TEST_CASE("sinkformer repro: text model (padding) as plain state_dict") { check_model("text", "state_dict"); }
TEST_CASE("sinkformer repro: text model as whole-model pickle") { check_model("text", "pickle"); }
TEST_CASE("sinkformer repro: text model as DataParallel whole-model pickle") {
  check_model("text", "pickle_dataparallel");
}
TEST_CASE("sinkformer repro: text model as safetensors") { check_model("text", "safetensors"); }

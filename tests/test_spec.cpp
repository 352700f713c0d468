// The teacher spec: detection of every supported layout, validation errors
// against a checkpoint, and JSON errors -- each asserting the error text.
#include <ATen/ATen.h>

#include <fstream>

#include "asap/checkpoint.h"
#include "asap/error.h"
#include "asap/layer.h"
#include "asap/spec.h"
#include "compile_fixture.h"

using namespace asap_test;

namespace {
asap::DetectedLayers detect(const std::string& file, int64_t heads) {
  asap::DetectOptions o;
  o.T = 6;
  o.heads = heads;
  return asap::detect_layers(asap::load_checkpoint(data_path(file)), o);
}
std::string spec_error(const std::string& text) {
  try {
    asap::spec_from_json(nlohmann::json::parse(text), "s.json");
  } catch (const asap::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("spec: detects set-transformer, nn.MultiheadAttention and HF q_proj layouts") {
  auto st = detect("layouts/set_transformer.pt", 2);
  CHECK(st.layout_name == "set-transformer");
  REQUIRE(st.spec.layers.size() == 2);
  CHECK(st.spec.layers[0].name == "enc.0");
  CHECK(st.spec.layers[0].score_scale == doctest::Approx(1 / std::sqrt(8.0)));  // 1/sqrt(dim_V)
  CHECK(st.spec.layers[0].out.weight.empty());

  auto mha = detect("layouts/torch_mha.pt", 3);
  CHECK(mha.layout_name == "nn.MultiheadAttention");
  REQUIRE(mha.spec.layers.size() == 2);
  CHECK(mha.spec.layers[1].name == "layers.1.self_attn");
  CHECK(mha.spec.layers[1].out.weight == "layers.1.self_attn.out_proj.weight");
  CHECK(mha.spec.layers[0].head_dim == 4);

  auto hf = detect("layouts/hf_qkv.pt", 3);
  CHECK(hf.layout_name == "hf-qkv");
  REQUIRE(hf.spec.layers.size() == 3);
  CHECK(hf.spec.layers[2].out.weight == "layers.2.self_attn.o_proj.weight");
  CHECK(hf.spec.layers[2].q.bias.empty());

  // Without --heads the head count is reported missing.
  auto no_heads = detect("layouts/hf_qkv.pt", 0);
  REQUIRE_FALSE(no_heads.missing.empty());
  CHECK(no_heads.missing[0].find("heads") == 0);
}

TEST_CASE("spec: nn.MultiheadAttention projections match PyTorch's per-head q, k, v") {
  auto ck = asap::load_checkpoint(data_path("layouts/torch_mha.pt"));
  auto det = detect("layouts/torch_mha.pt", 3);
  const auto& l = det.spec.layers[0];
  auto j = load_json("layouts/torch_mha_proj.json");
  auto to_t = [](const nlohmann::json& a) {
    std::vector<float> flat;
    std::function<void(const nlohmann::json&)> rec = [&](const nlohmann::json& v) {
      if (v.is_array())
        for (const auto& e : v) rec(e);
      else
        flat.push_back(v.get<float>());
    };
    rec(a);
    return at::tensor(flat);
  };
  auto x = to_t(j["x"]).reshape({2, 5, 12});
  auto p = asap::project_qkv(l, asap::load_layer_weights(l, ck), x);
  CHECK_CLOSE_T(p.q, to_t(j["q"]).reshape({2, 3, 5, 4}), 1e-5);
  CHECK_CLOSE_T(p.k, to_t(j["k"]).reshape({2, 3, 5, 4}), 1e-5);
  CHECK_CLOSE_T(p.v, to_t(j["v"]).reshape({2, 3, 5, 4}), 1e-5);
}

TEST_CASE("spec: '(d h)' head layout reorders rows and output columns consistently") {
  // A (d h) layer equals the (h d) layer whose rows/columns were permuted accordingly.
  at::manual_seed(3);
  asap::LayerSpec s;
  s.name = "l";
  s.layout = asap::ProjLayout::kSeparate;
  s.heads = 2;
  s.head_dim = s.value_dim = 3;
  s.d_model = 5;
  auto wq = at::randn({6, 5}), wk = at::randn({6, 5}), wv = at::randn({6, 5}), wo = at::randn({4, 6});
  asap::LayerWeights hd{wq, {}, wk, {}, wv, {}, wo, {}};
  // "(d h)": feature i*heads + h holds what "(h d)" keeps at h*head_dim + i.
  auto perm = at::tensor(std::vector<int64_t>{0, 3, 1, 4, 2, 5});
  auto x = at::randn({1, 4, 5});
  auto ref = asap::project_qkv(s, hd, x);
  auto s2 = s;
  s2.head_layout = "(d h)";
  // Build a (d h) checkpoint and load it through load_layer_weights.
  asap::Checkpoint ck;
  ck.path = "mem";
  for (auto& kv : std::vector<std::pair<std::string, at::Tensor>>{{"q", wq.index_select(0, perm)},
                                                                  {"k", wk.index_select(0, perm)},
                                                                  {"v", wv.index_select(0, perm)},
                                                                  {"o", wo.index_select(1, perm)}}) {
    ck.names.push_back(kv.first);
    ck.tensors[kv.first] = kv.second;
  }
  s2.q.weight = "q";
  s2.k.weight = "k";
  s2.v.weight = "v";
  s2.out.weight = "o";
  auto w2 = asap::load_layer_weights(s2, ck);
  auto got = asap::project_qkv(s2, w2, x);
  CHECK_CLOSE_T(got.q, ref.q, 1e-6);
  CHECK_CLOSE_T(asap::merge_heads(s2, w2, got.v), asap::merge_heads(s, hd, ref.v), 1e-5);
}

TEST_CASE("spec: validation names the spec, layer, field, expected and found") {
  auto ck = asap::load_checkpoint(vit_checkpoint());
  auto spec = vit_spec(6);
  SUBCASE("missing tensor named in the spec") {
    spec.layers[0].out.weight = "transformer.layers.0.0.fn.to_out.9.weight";
    const std::string expect =
        "teacher spec 't.json': layer 'transformer.layers.0.0.fn' field 'out.weight' names tensor "
        "'transformer.layers.0.0.fn.to_out.9.weight', which checkpoint '" +
        vit_checkpoint() + "' does not contain";
    CHECK_THROWS_WITH_AS(asap::validate_spec(spec, ck, "t.json"), expect.c_str(), asap::Error);
  }
  SUBCASE("shape mismatch") {
    spec.layers[1].heads = 4;  // 4 x 16 = 64 rows per projection, the checkpoint has 32
    CHECK_THROWS_WITH_AS(
        asap::validate_spec(spec, ck, "t.json"),
        doctest::Contains("tensor 'transformer.layers.1.0.fn.to_qkv.weight' has shape [96, 32] but the "
                          "spec implies [192, 32]"),
        asap::Error);
  }
  SUBCASE("fused qkv rows not divisible by 3") {
    ck.tensors["transformer.layers.0.0.fn.to_qkv.weight"] = at::zeros({95, 32});
    CHECK_THROWS_WITH_AS(asap::validate_spec(spec, ck, "t.json"),
                         doctest::Contains("fused qkv weight 'transformer.layers.0.0.fn.to_qkv.weight' must be "
                                           "[3*heads*head_dim, d_model] with rows divisible by 3, found [95, 32]"),
                         asap::Error);
  }
}

TEST_CASE("spec: JSON errors name the field, and round trip preserves everything") {
  CHECK(spec_error("{\"format\": \"asapc-teacher-spec\", \"version\": 1, \"layers\": [{\"name\": \"a\", \"layout\": "
                   "\"mystery\"}]}") ==
        "teacher spec 's.json': layer 0 ('a') field 'layout' must be \"fused\", \"separate\" or \"none\", found "
        "\"mystery\"");
  CHECK(spec_error("{\"format\": \"asapc-teacher-spec\", \"version\": 9, \"layers\": []}") ==
        "teacher spec 's.json' has version 9 but this asapc reads versions 1 to 1");
  CHECK(spec_error("{\"format\": \"other\", \"version\": 1}") ==
        "teacher spec 's.json': field 'format' must be \"asapc-teacher-spec\", found \"other\"");
  auto base = nlohmann::json::parse(std::ifstream(data_path("fixtures/vit.spec.json")));
  base["layers"][0]["T"] = "six";
  CHECK(spec_error(base.dump()) ==
        "teacher spec 's.json': layer 0 ('transformer.layers.0.0.fn') field 'T' must be an "
        "integer >= 1, found \"six\"");
  base["layers"][0]["T"] = 2147483647;  // issue 16, item 3: compile would run with no end
  CHECK(spec_error(base.dump()) ==
        "teacher spec 's.json': layer 0 ('transformer.layers.0.0.fn') field 'T' must be at "
        "most 10000 Sinkhorn half-steps, found 2147483647");
  base["layers"][0].erase("T");
  CHECK(spec_error(base.dump()) == "teacher spec 's.json': layer 0 ('transformer.layers.0.0.fn') is missing field 'T'");
  // Round trip.
  TempDir dir;
  auto spec = vit_spec(7);
  spec.layers[0].mask = asap::MaskConvention::kDropQueries;
  spec.layers[0].multiply_by_n = false;
  asap::write_spec(dir / "s.json", spec);
  auto back = asap::read_spec(dir / "s.json");
  CHECK(back.layers[0].mask == asap::MaskConvention::kDropQueries);
  CHECK_FALSE(back.layers[0].multiply_by_n);
  CHECK(back.layers[1].T == 7);
  CHECK(back.layers[1].qkv.weight == spec.layers[1].qkv.weight);
}

TEST_CASE("spec: asapc inspect refuses a checkpoint with no known attention layout") {
  std::string out;
  CHECK(run_cmd(std::string(ASAPC_EXE) + " inspect " + data_path("layouts/no_attention.pt"), &out) == 2);
  CHECK(out.find("no attention layer of a known layout found") != std::string::npos);
  CHECK(run_cmd(std::string(ASAPC_EXE) + " inspect " + data_path("layouts/hf_qkv.pt") + " -o /tmp/never.json", &out) ==
        2);
  CHECK(out.find("the checkpoint does not say T (Sinkhorn budget") != std::string::npos);
  CHECK(out.find("heads (number of attention heads; pass --heads)") != std::string::npos);
}

TEST_CASE("spec: a number beyond double's range is refused as invalid JSON, not an internal error (fuzz finding)") {
  asap_test::TempDir dir;
  const std::string path = dir / "s.json";
  std::ofstream(path) << "{\"format\": \"asapc-teacher-spec\", \"version\": 1, \"layers\": [{\"T\": 1e666}]}";
  const std::string msg = asap_test::error_of([&] { asap::read_spec(path); });
  CHECK(msg.find("not valid JSON") != std::string::npos);
}

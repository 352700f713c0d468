// The compile pipeline end to end, its choices, and its refusals.
#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "asap/runtime.h"
#include "compile_fixture.h"

using namespace asap_test;

TEST_CASE("compile: fixture ViT end to end; choices respect the budget and are the held-out best") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 16;
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  REQUIRE(r.artifact.layers.size() == 2);
  CHECK(r.artifact.teacher_sha256 == asap::load_checkpoint(vit_checkpoint()).sha256);
  for (size_t i = 0; i < 2; ++i) {
    const auto& L = r.artifact.layers[i];
    const auto& s = r.summary["layers"][i];
    CHECK(L.coef.size(1) == L.family.num_columns());
    CHECK(L.coef.size(0) == (L.per_head ? 2 : 1));
    CHECK(L.theta.sizes() == std::vector<int64_t>{16, 16});
    CHECK(s["data_driven_selection"].get<bool>());
    CHECK(s["train_examples"].get<int64_t>() + s["heldout_examples"].get<int64_t>() == 60);
    const int budget = s["pass_budget"];
    CHECK(budget == 4);
    CHECK(asap::lse_passes(L.family, L.default_closures) <= budget);
    // The chosen operator is the lowest held-out attention error within the budget.
    const double chosen = s["chosen"]["heldout_attention_error"];
    for (const auto& c : s["candidates"]) {
      const auto& errs = c["heldout_attention_error_by_k"];
      const auto& passes = c["lse_passes_by_k"];
      for (size_t k = 0; k < errs.size(); ++k)
        if (passes[k].get<int>() <= budget) CHECK(chosen <= errs[k].get<double>() + 1e-15);
    }
    // Artifact round trip: the reloaded layer computes the same outputs.
    asap::write_artifact(dir / "a.h5", r.artifact);
  }
  auto back = asap::CompiledModel::load(dir / "a.h5");
  at::manual_seed(3);
  auto x = at::randn({2, 17, 32});
  asap::CompiledModel mem(r.artifact);
  for (const auto& name : back->layer_names())
    CHECK_CLOSE_T(back->forward(name, x), mem.forward(name, x), 0.0);
}

TEST_CASE("compile: --slice-cost counts slices against the pass budget") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 1);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 16;
  o.layers = {"transformer.layers.0.0.fn"};
  o.slice_cost = 0.5;  // each slice costs half a pass: 4 passes of budget leave few slices
  o.selection_examples = 5;
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const auto& L = r.artifact.layers[0];
  const auto& s = r.summary["layers"][0];
  CHECK(s["slice_cost_passes"].get<double>() == 0.5);
  CHECK(s["selection_examples"].get<int64_t>() == 5);  // of more held-out examples
  CHECK(s["heldout_examples"].get<int64_t>() > 5);
  for (const char* phase : {"read", "teacher", "features", "statistics", "solve", "selection"})
    CHECK(s["phase_times_s"][phase].get<double>() >= 0.0);
  const int budget = s["pass_budget"];
  auto cost = [](const asap::FeatureFamily& f, int k) { return asap::lse_passes(f, k) + 0.5 * f.slices; };
  CHECK(cost(L.family, L.default_closures) <= budget);
  CHECK(s["chosen"]["cost_passes"].get<double>() == cost(L.family, L.default_closures));
  // Every candidate but the paper's reference map kept to slices that fit with one closure,
  // and the chosen operator is the lowest error among those within the budget by cost.
  const double chosen = s["chosen"]["heldout_attention_error"];
  for (const auto& c : s["candidates"]) {
    const int64_t Lc = c["slices"];
    const auto& errs = c["heldout_attention_error_by_k"];
    const auto& passes = c["lse_passes_by_k"];
    const std::string name = c["candidate"];
    const int feature_passes = name.find("sinkhorn3") != std::string::npos ? 3
                               : name.find("softmax") != std::string::npos ? 1
                                                                           : 0;
    if (name != "slices/pooled" && Lc > 1) CHECK(1 + feature_passes + 0.5 * Lc <= budget);
    for (size_t k = 0; k < errs.size(); ++k)
      if (passes[k].get<int>() + 0.5 * Lc <= budget) CHECK(chosen <= errs[k].get<double>() + 1e-15);
  }
  // With slices free (the default) the same data may use the whole bank.
  o.slice_cost = 0;
  auto free = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  CHECK(free.summary["layers"][0]["slice_cost_passes"].get<double>() == 0.0);
  CHECK(asap::default_slice_cost(1024) == doctest::Approx(8.0 * 10 / 1024));
}

TEST_CASE("compile: a fixed family, ridge, slices and closures are honoured") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 30, 2);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.fixed_slices = 8;
  o.ridge = 0.5;
  o.closures = 1;
  o.candidates = {{"slices", false}};
  o.layers = {"transformer.layers.1.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  REQUIRE(r.artifact.layers.size() == 1);
  const auto& L = r.artifact.layers[0];
  CHECK(L.spec.name == "transformer.layers.1.0.fn");
  CHECK(L.family == asap::FeatureFamily{8, false, false});
  CHECK(!L.per_head);
  CHECK(L.default_closures == 1);
  CHECK(r.summary["layers"][0]["chosen"]["ridge"].get<double>() == 0.5);
}

TEST_CASE("compile: --fit kl reports convergence and keeps the LS family") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 40, 4);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.fit = "kl";
  o.kl_ridge = 1e-4;
  o.layers = {"transformer.layers.0.0.fn"};
  auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  const auto& kl = r.summary["layers"][0]["kl"];
  CHECK(kl["iterations"].get<int>() >= 1);
  CHECK(kl["converged"].get<bool>());
  // The KL fit lowers the training-set teacher-plan KL of the LS warm start.
  CHECK(kl["train_kl"].get<double>() <= kl["train_kl_ls"].get<double>() + 1e-12);
  const auto& hist = kl["per_ridge"][0]["history"];
  for (size_t i = 1; i < hist.size(); ++i)
    CHECK(hist[i]["objective"].get<double>() < hist[i - 1]["objective"].get<double>());
}

TEST_CASE("compile: refuses T = 1, a layer missing from the calibration file, a width mismatch, NaN") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 12, 5);
  asap::CompileOptions o;
  asap::write_spec(dir / "t1.json", vit_spec(1));
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "t1.json", dir / "calib.h5", o),
                       doctest::Contains("has T = 1 (plain softmax): there is no Sinkhorn loop to amortize"),
                       asap::Error);
  auto spec = vit_spec(6);
  spec.layers[1].name = "blocks.9.attn";
  asap::write_spec(dir / "renamed.json", spec);
  // validate_spec passes (same tensors), the calibration file lacks the layer.
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "renamed.json", dir / "calib.h5", o),
                       doctest::Contains("has no layer 'blocks.9.attn'"), asap::Error);
  // Activations of the wrong width.
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CalibLayerData d;
  d.name = "transformer.layers.0.0.fn";
  d.x = at::randn({12, 17, 24});
  asap::write_calib(dir / "narrow.h5", {d});
  o.layers = {"transformer.layers.0.0.fn"};
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "narrow.h5", o),
                       doctest::Contains("has activations of width d_model = 24 but the checkpoint's projections expect 32"),
                       asap::Error);
  // Sequence length against the ViT position embedding [1, 17, 32].
  d.x = at::randn({12, 9, 32});
  asap::write_calib(dir / "short.h5", {d});
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "short.h5", o),
                       doctest::Contains("has sequences of n = 9 tokens but checkpoint"), asap::Error);
  write_vit_calib(dir / "nan.h5", 12, 6, true);
  CHECK_THROWS_WITH_AS(asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "nan.h5", o),
                       doctest::Contains("example 5"), asap::Error);
}

TEST_CASE("compile: the CLI refuses bad input with exit code 2 and one sentence") {
  TempDir dir;
  std::string out;
  CHECK(run_cmd(std::string(ASAPC_EXE) + " compile " + dir / "missing.pt" + " --spec x --calib y -o " + dir / "a.h5",
                &out) == 2);
  CHECK(out.find("asapc: error: cannot open checkpoint") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "a.h5"));
  // Options of issue 9: a malformed --slice-cost, a negative --selection-examples.
  asap::write_spec(dir / "spec.json", vit_spec(6));
  write_vit_calib(dir / "calib.h5", 12, 3);
  const std::string base = std::string(ASAPC_EXE) + " compile " + vit_checkpoint() + " --spec " + dir / "spec.json" +
                           " --calib " + dir / "calib.h5" + " -q -o " + dir / "a.h5";
  CHECK(run_cmd(base + " --slice-cost fast", &out) == 2);
  CHECK(out.find("--slice-cost: expected 'auto' or a number >= 0, found 'fast'") != std::string::npos);
  CHECK(run_cmd(base + " --selection-examples -1", &out) == 2);
  CHECK(out.find("--selection-examples must be at least 0 (0 = all), found -1") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "a.h5"));
}

TEST_CASE("compile: a compile killed mid-way leaves no output file") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 3000, 7);  // many seconds of work, even on a fast path
  asap::write_spec(dir / "spec.json", vit_spec(6));
  const std::string cmd = std::string(ASAPC_EXE) + " compile " + vit_checkpoint() + " --spec " + dir / "spec.json" +
                          " --calib " + dir / "calib.h5" + " -o " + dir / "out.h5" + " -q --batch-size 4 > /dev/null 2>&1 & echo $!";
  FILE* p = popen(cmd.c_str(), "r");
  long pid = 0;
  REQUIRE(fscanf(p, "%ld", &pid) == 1);
  pclose(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    const std::string f = e.path().filename();
    CHECK(f != "out.h5");
    if (f.rfind("out.h5", 0) == 0) ++files;  // no temporary either
  }
  CHECK(files == 0);
}

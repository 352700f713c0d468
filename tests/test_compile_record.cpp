// The compile records (asap/compile_record.h): one serializer and one parser
// per struct, a parser that names the field it misses, and the record compile
// returns being the one the artifact stores and `asapc compile --json` prints.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/compile_record.h"
#include "asap/error.h"
#include "asap/verify.h"
#include "compile_fixture.h"

using namespace asap_test;
using nlohmann::json;

namespace {

// A record with a non-default value in every field, so that a field a
// parser drops (left at its default) or a serializer renames shows.
asap::LayerRecord full_record(const std::string& fit) {
  asap::LayerRecord r;
  r.layer = "blocks.3.attn";
  r.T = 7;
  r.ending = "row";
  r.examples = 123;
  r.examples_per_rank = {60, 63};
  r.excluded_examples = {4, 9};
  r.train_examples = 98;
  r.heldout_examples = 23;
  r.selection_examples = 21;
  r.rows_used = 1617;
  r.data_driven_selection = true;
  r.candidates_with_nan_error = {"slices/pooled@L2 k=1"};
  r.objective = {"max-error", std::nullopt, 0.05, std::nullopt};
  r.pass_budget = 5;
  r.decision = "slices+alpha/per-head@L16 k=2: held-out attention error 0.01";
  r.target_met = true;
  r.chosen.op = "asap";
  r.chosen.description = "asap L16+alpha/head k=2";
  r.chosen.lse_passes = 2;
  r.chosen.heldout_attention_error = 0.0125;
  r.chosen.candidate = "slices+alpha/per-head@L16";
  r.chosen.target = "closure-ready";
  r.chosen.family = "L16+alpha";
  r.chosen.per_head = true;
  r.chosen.slices = 16;
  r.chosen.ridge = 1e-4;
  r.chosen.closures = 2;
  r.chosen.heldout_dual_rmse = 0.3;
  r.chosen.latency_s = 2.5e-4;
  r.chosen.speedup = 1.75;
  asap::FitCandidateRecord c;
  c.candidate = "slices+alpha/per-head@L16";
  c.features = "slices+alpha";
  c.target = "k-matched";
  c.target_closures = 2;
  c.family = "L16+alpha";
  c.per_head = true;
  c.slices = 16;
  c.ridge = 1e-4;
  c.heldout_dual_rmse = 0.3;
  c.heldout_attention_error_by_k = {0.2, std::numeric_limits<double>::quiet_NaN(), 0.0125};
  c.lse_passes_by_k = {1, 2, 3};
  r.candidates = {c};
  r.sinkhorn_heldout_attention_error = {0.5, 0.25, 0.125};
  asap::SlicePrefixRecord p1{4, 1e-3, 0.09, true, std::vector<double>{0, 1e-3}, std::vector<double>{0.1, 0.09}};
  asap::SlicePrefixRecord p2{8, 1e-2, 0.0895, false, std::nullopt, std::nullopt};
  r.slice_selection = {{"slices+alpha/per-head->k2", {p1, p2}}};
  r.latency.source = json{{"source", "table"}, {"file", "lat.json"}};
  asap::LatencyChoiceRecord ch;
  ch.decision = r.decision;
  ch.target_met = true;
  ch.teacher_latency_s = 4.375e-4;
  ch.latency_calls = 3;
  ch.operators = {{"teacher T=7", "teacher", "teacher", 7, 0.0, true, 4.375e-4, 1.0},
                  {"sinkhorn T'=1", "sinkhorn-1", "sinkhorn", 1, 0.5, false, std::nullopt, std::nullopt}};
  r.latency.choice = ch;
  r.fit = fit;
  r.fit_time_s = 12.5;
  r.teacher_time_s = 0.75;
  r.phase_times_s = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
  r.options = {32, {0, 4, 8, 16, 32}, {0, 1e-4}, 0.5, 0.25, 77, 8, 4, 3, true};
  asap::ModelBudgetRecord m;
  m.scope = "model";
  m.error = "max";
  m.layers = {"blocks.0.attn", "blocks.1.attn"};
  m.weights = {1.0, 2.0};
  m.error_scales = {0.5, 0.25};
  m.teacher_latency_s = {4.375e-4, 4.5e-4};
  m.latency_s = {3.5e-4, 3.25e-4};
  m.teacher_total_s = 8.875e-4;
  m.total_s = 6.75e-4;
  m.speedup = 8.875 / 6.75;
  m.min_speedup = 1.25;
  m.model_error = 0.125;
  m.worst_layer = "blocks.1.attn";
  m.noise_margin = 0.05;
  m.noise_measured = 0.0125;
  m.within_noise = true;
  m.target_met = true;
  m.zero_parameter = "fallback";
  m.maps_first = "maps";
  r.model = m;
  if (fit == "kl") {
    asap::KlRefitRecord kl;
    kl.ridge_grid = {1e-6, 1e-5};
    kl.ridge_fixed = true;
    kl.train_kl_ls = 0.5;
    kl.heldout_kl_ls = 0.6;
    kl.per_ridge = {{1e-6, 0.55, 2, true, {{0, 1.5, 0.25, 0.125, 1.0}, {1, 1.25, 0.5, 0.0625, 0.5}}}};
    kl.ridge = 1e-6;
    kl.iterations = 2;
    kl.converged = true;
    kl.objective = -0.7;
    kl.grad_norm = 2e-7;
    kl.newton_decrement = 1e-9;
    kl.train_kl = 0.45;
    kl.heldout_kl = 0.55;
    kl.cached_mb = 3.5;
    kl.cached = true;
    r.refit = asap::RefitRecord{"kl", "", kl, std::nullopt, 0.19, 0.18, true};
  } else if (fit == "attention") {
    asap::AttnRefitRecord a;
    a.closures = 2;
    a.iterations = 5;
    a.best_iteration = 4;
    a.stopped = "no better held-out objective in 3 checks (15 iterations)";
    a.train_objective_ls = 0.06;
    a.train_objective = 0.05;
    a.heldout_objective_ls = 0.07;
    a.heldout_objective = 0.065;
    a.history = {{0, 0.06, std::nullopt, 0.07}, {1, 0.055, 0.5, std::nullopt}, {2, 0.05, 1.0, 0.065}};
    a.cached_mb = 1.25;
    r.refit = asap::RefitRecord{"attention", "", std::nullopt, a, 0.19, 0.185, false};
  }
  return r;
}

// The parse of `j` with `key` removed from the object `path` leads to.
std::string error_without(json j, const std::vector<std::string>& path, const std::string& key) {
  json* at = &j;
  for (const auto& p : path) at = p == "0" ? &(*at)[0] : &(*at)[p];
  REQUIRE_MESSAGE(at->contains(key), "the record has no " << key << " to remove");
  at->erase(key);
  try {
    (void)j.get<asap::LayerRecord>();
  } catch (const asap::Error& e) {
    return e.what();
  }
  return "";
}

// tests/data/bundled_vit_choice.json (described where it is first used, below).
json bundled_vit_choice() {
  std::ifstream in(std::string(ASAP_SOURCE_DIR) + "/tests/data/bundled_vit_choice.json");
  REQUIRE(in.good());
  return json::parse(in);
}

// The bundled ViT compiled with the file's latency table under budget `b`,
// with the options `adjust` sets.
asap::CompileResult compile_bundled_vit(const json& recorded, asap::BudgetScope b,
                                        const std::function<void(asap::CompileOptions&)>& adjust = {}) {
  const std::string root = ASAP_SOURCE_DIR;
  TempDir dir;
  std::ofstream(dir.file("lat.json")) << recorded.at("latency_table").dump();
  asap::CompileOptions o;
  o.latency = asap::latency_table_from_file(dir / "lat.json");
  o.budget = b;
  // The families of the recording (the score_stats families came later and
  // have no latency in its table).
  for (const char* f : {"slices", "slices+alpha", "slices+alpha+softmax", "slices+alpha+softmax+sinkhorn3"})
    for (bool ph : {false, true}) o.candidates.push_back({f, ph});
  if (adjust) adjust(o);
  return asap::compile_teacher(root + "/calib_data/vit_mnist_t6.pt", root + "/calib_data/vit_mnist_t6.spec.json",
                               root + "/calib_data/vit_mnist_t6.calib.h5", o);
}

}  // namespace

TEST_CASE("compile record: every field survives to_json and from_json") {
  for (const char* fit : {"ls", "kl", "attention"}) {
    CAPTURE(fit);
    const asap::LayerRecord r = full_record(fit);
    const json j = r;
    const auto back = j.get<asap::LayerRecord>();
    CHECK(json(back).dump() == j.dump());
    CHECK(asap::parse_fit_record(j.dump()).options.seed == 77);
    // Spot checks on the struct itself (not only its JSON).
    CHECK(back.chosen.family.value() == "L16+alpha");
    CHECK(back.chosen.closures.value() == 2);
    CHECK(back.examples_per_rank == std::vector<int64_t>{60, 63});
    CHECK(std::isnan(back.candidates.at(0).heldout_attention_error_by_k.at(1)));
    CHECK(back.slice_selection.at(0).prefixes.at(0).ridge_grid_mse.value().at(1) == 0.09);
    CHECK(!back.latency.choice->operators.at(1).latency_s.has_value());
    CHECK(back.phase_times_s.communication == 0.8);
    CHECK(back.refit.has_value() == (std::string(fit) != "ls"));
    CHECK(back.model->worst_layer == "blocks.1.attn");
    CHECK(back.model->noise_measured.value() == 0.0125);
    CHECK(!back.model->max_error.has_value());
  }
  // The refit's stop reason round-trips; a record from before it was kept reads as empty.
  CHECK(json(full_record("attention")).get<asap::LayerRecord>().refit->attention->stopped ==
        "no better held-out objective in 3 checks (15 iterations)");
  json no_stop = full_record("attention");
  no_stop["attention_fit"].erase("stopped");
  CHECK(no_stop.get<asap::LayerRecord>().refit->attention->stopped.empty());
  // A fit record of an asapc before the model budget has none: still read.
  json old = full_record("ls");
  old.erase("model_budget");
  CHECK(!old.get<asap::LayerRecord>().model.has_value());
  // The JSON keys of the refit depend on the fit: "kl" / "heldout_attention_error_kl",
  // "attention_fit" / "heldout_attention_error_refit".
  CHECK(json(full_record("kl"))["kl"].contains("heldout_attention_error_kl"));
  CHECK(json(full_record("attention"))["attention_fit"].contains("heldout_attention_error_refit"));
  // Without a data-driven choice the latency choice is null, and a skipped refit records only why.
  asap::LayerRecord none = full_record("kl");
  none.latency.choice.reset();
  none.refit = asap::RefitRecord{"kl", "k-matched maps keep LS", std::nullopt, std::nullopt, {}, {}, {}};
  const json jn = none;
  CHECK(jn["latency"]["choice"].is_null());
  CHECK(jn["kl"] == json{{"skipped", "k-matched maps keep LS"}});
  CHECK(json(jn.get<asap::LayerRecord>()).dump() == jn.dump());
}

TEST_CASE("compile record: the summary and its distributed record round-trip, numbers keep their JSON type") {
  asap::CompileSummary s;
  s.checkpoint = "m.pt";
  s.spec = "spec.json";
  s.calibration = "calib.h5";
  s.layers = {full_record("ls"), full_record("attention")};
  s.distributed.calibration_bytes_read = 4096;
  s.total_time_s = 3.5;
  s.artifact = "a.asap.h5";
  s.report = asap::CompileSummary::ReportPaths{"a.report.html", "a.report.json"};
  s.model_budget = full_record("ls").model;
  json j = s;
  CHECK(j["model_budget"]["speedup"].get<double>() == doctest::Approx(8.875 / 6.75));
  CHECK(j["model_budget"]["maps_first"] == "maps");
  CHECK(j["model_budget"]["zero_parameter"] == "fallback");
  CHECK(json(j.get<asap::CompileSummary>()).dump() == j.dump());
  CHECK(j["distributed"].dump() == R"({"calibration_bytes_read":4096,"world_size":1})");  // an integer in one process
  s.distributed.world_size = 2;
  s.distributed.group = asap::DistributedRecord::Group{0.25, 0.5, 1024, 7};
  j = s;
  CHECK(j["distributed"]["calibration_bytes_read"].dump() == "4096.0");  // summed over ranks as a double
  CHECK(json(j.get<asap::CompileSummary>()).dump() == j.dump());
}

TEST_CASE("compile record: a field the reports show that goes missing is named") {
  const json j = full_record("kl");
  // What the compile summary, verify's table, inspect and the compile report read.
  for (const char* key : {"layer", "rows_used", "heldout_examples", "train_examples", "examples", "examples_per_rank",
                          "excluded_examples", "decision", "fit", "fit_time_s", "chosen", "candidates", "options"}) {
    CAPTURE(key);
    CHECK(error_without(j, {}, key).find(std::string("no field '") + key + "'") != std::string::npos);
  }
  for (const char* key : {"operator", "description", "family", "per_head", "closures", "ridge", "heldout_dual_rmse",
                          "heldout_attention_error"}) {
    CAPTURE(key);
    CHECK(error_without(j, {"chosen"}, key) == std::string("compile record: 'chosen' has no field '") + key + "'");
  }
  for (const char* key : {"candidate", "heldout_attention_error_by_k"}) {
    CAPTURE(key);
    CHECK(error_without(j, {"candidates", "0"}, key).find(std::string("no field '") + key + "'") != std::string::npos);
  }
  for (const char* key : {"seed", "heldout_fraction"}) {
    CAPTURE(key);
    CHECK(error_without(j, {"options"}, key) == std::string("compile record: 'options' has no field '") + key + "'");
  }
  for (const char* key :
       {"ridge", "iterations", "converged", "objective", "grad_norm", "heldout_kl", "heldout_kl_ls"}) {
    CAPTURE(key);
    CHECK(error_without(j, {"kl"}, key) == std::string("compile record: 'kl' has no field '") + key + "'");
  }
  const json a = full_record("attention");
  for (const char* key : {"iterations", "best_iteration", "train_objective_ls", "train_objective"}) {
    CAPTURE(key);
    CHECK(error_without(a, {"attention_fit"}, key) ==
          std::string("compile record: 'attention_fit' has no field '") + key + "'");
  }
  // A wrong type is named too, and text that is not JSON is refused.
  json bad = j;
  bad["chosen"]["closures"] = "two";
  CHECK_THROWS_WITH_AS(bad.get<asap::LayerRecord>(), doctest::Contains("'chosen' field 'closures' has the wrong type"),
                       asap::Error);
  CHECK_THROWS_WITH_AS(asap::parse_fit_record("{not json"), doctest::Contains("not valid JSON"), asap::Error);
}

TEST_CASE("compile record: with an injected latency table, the artifact stores the record compile returns") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 60, 5);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  {  // Latencies by rule: the teacher 6 s, Sinkhorn T' T' s, an ASAP map its passes + 0.25 s.
    std::ostringstream t;
    t << R"({"*": {"teacher": 6)";
    for (int Tp = 1; Tp < 6; ++Tp) t << ", \"sinkhorn-" << Tp << "\": " << Tp;
    for (const char* f : {"alpha", "alpha+softmax"})
      for (int k = 1; k <= 5; ++k)
        t << ", \"asap-" << f << "-k" << k << "\": " << (k + (std::string(f) == "alpha" ? 0 : 1) + 0.25);
    t << "}}";
    std::ofstream(dir.file("lat.json")) << t.str();
  }
  asap::CompileOptions o;
  o.candidates = {{"alpha", false}, {"alpha", true}, {"alpha+softmax", true}};
  o.selection_examples = 8;
  o.latency = asap::latency_table_from_file(dir / "lat.json");
  const auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  asap::write_artifact(dir / "a.h5", r.artifact);
  const asap::Artifact back = asap::read_artifact(dir / "a.h5");
  REQUIRE(r.summary.layers.size() == 2);
  REQUIRE(back.layers.size() == 2);
  std::ifstream lat(dir.file("lat.json"));
  const json table = json::parse(lat)["*"];
  for (size_t i = 0; i < 2; ++i) {
    const asap::LayerRecord& rec = r.summary.layers[i];
    const asap::CompiledLayer& L = back.layers[i];
    CAPTURE(rec.layer);
    // The fit record read back from the file is the record compile returned.
    CHECK(json(asap::parse_fit_record(L.fit_json)).dump() == json(rec).dump());
    // The record's choice is the operator the artifact runs.
    CHECK(rec.chosen.op == asap::operator_kind_name(L.kind));
    CHECK(rec.chosen.description == L.describe());
    CHECK(rec.chosen.lse_passes == L.lse_passes());
    if (rec.chosen.is_asap()) {
      CHECK(*rec.chosen.closures == L.default_closures);
      CHECK(*rec.chosen.family == L.family.name());
      CHECK(*rec.chosen.per_head == L.per_head);
    }
    // Its latency is the injected table's, and it is a row of the record's latency table.
    REQUIRE(rec.latency.choice.has_value());
    REQUIRE(rec.chosen.latency_s.has_value());
    bool found = false;
    for (const auto& row : rec.latency.choice->operators)
      if (row.latency_s && row.heldout_attention_error == rec.chosen.heldout_attention_error &&
          *row.latency_s == *rec.chosen.latency_s) {
        CHECK(table.at(row.key).get<double>() == *row.latency_s);
        found = true;
      }
    CHECK(found);
    CHECK(rec.latency.source["source"] == "table");
  }
}

TEST_CASE("compile record: asapc compile --json prints the records the artifact stores") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 80, 9);  // enough held-out examples for a data-driven choice
  asap::write_spec(dir / "spec.json", vit_spec(6));
  std::ofstream(dir.file("lat.json")) << R"({"*": {"teacher": 6, "sinkhorn-1": 1, "sinkhorn-2": 2, "sinkhorn-3": 3,
      "sinkhorn-4": 4, "sinkhorn-5": 5, "asap-alpha-k1": 1.5, "asap-alpha-k2": 2.5, "asap-alpha-k3": 3.5,
      "asap-alpha-k4": 4.5, "asap-alpha-k5": 5.5}})";
  std::string out;
  const std::string cmd = std::string(ASAPC_EXE) + " compile " + vit_checkpoint() + " --spec " + dir.file("spec.json") +
                          " --calib " + dir.file("calib.h5") + " -o " + dir.file("a.h5") +
                          " --features alpha --heads-mode pooled --latency-table " + dir.file("lat.json") +
                          " --no-report --json -q --threads 1";
  REQUIRE_MESSAGE(run_cmd(cmd, &out) == 0, out);
  const auto summary = json::parse(out).get<asap::CompileSummary>();  // every field present
  CHECK(summary.artifact.value() == dir.file("a.h5"));
  const asap::Artifact art = asap::read_artifact(dir / "a.h5");
  REQUIRE(summary.layers.size() == art.layers.size());
  for (size_t i = 0; i < art.layers.size(); ++i)
    CHECK(json(summary.layers[i]).dump() == json(asap::parse_fit_record(art.layers[i].fit_json)).dump());
  // The text summary's last line: the model's speed-up from the table's
  // seconds of the stored operators (6 s per teacher), and its budget.
  const std::string text_cmd = cmd.substr(0, cmd.find(" --json")) + " -q --threads 1";
  REQUIRE_MESSAGE(run_cmd(text_cmd, &out) == 0, out);
  const json lat = json::parse(std::ifstream(dir.file("lat.json")))["*"];
  double total = 0;
  for (const auto& L : summary.layers) {
    const std::string key = L.chosen.op == "asap"       ? "asap-alpha-k" + std::to_string(*L.chosen.closures)
                            : L.chosen.op == "sinkhorn" ? "sinkhorn-" + std::to_string(*L.chosen.sinkhorn_steps)
                                                        : "teacher";
    total += lat[key].get<double>();
  }
  char want[128];
  std::snprintf(want, sizeof want, "model: %.2fx the teachers' speed", 12.0 / total);
  CHECK_MESSAGE(out.find(want) != std::string::npos, out);
  CHECK(out.find("budget 1.25x for the model") != std::string::npos);
}

TEST_CASE("compile record: the model budget needs a data-driven choice on every layer, and says so") {
  TempDir dir;
  write_vit_calib(dir / "calib.h5", 40, 9);
  asap::write_spec(dir / "spec.json", vit_spec(6));
  asap::CompileOptions o;
  o.slice_bank = 8;
  o.min_heldout = 1000;  // no layer has that many: documented defaults, no timing
  std::vector<std::string> warnings;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  const auto r = asap::compile_teacher(vit_checkpoint(), dir / "spec.json", dir / "calib.h5", o);
  CHECK(!r.summary.model_budget);
  bool said = false;
  for (const auto& w : warnings)
    said = said || w.find("the model budget (--budget model) does not apply") != std::string::npos;
  CHECK(said);
}

// The HTML report renders verify's JSON (with the fit record inside) and,
// by design, still renders older files with fields missing. So that a field
// renamed on the writing side does not vanish from the page silently, every
// key the page reads must be one that verify and compile write today.
TEST_CASE("compile record: every key the HTML report reads is written by verify and compile") {
  std::ifstream in(std::string(ASAP_SOURCE_DIR) + "/src/lib/report/html_report.cpp");
  std::stringstream src;
  src << in.rdbuf();
  // verify's JSON of one layer with an ASAP operator and compile's record.
  asap::VerifyResult v;
  v.artifact = "a.h5";
  asap::LayerVerification lv;
  lv.name = "l";
  lv.operators.push_back(asap::OperatorResult{"asap", 1, 1, true, true, {}, 1e-3});
  lv.fit = full_record("ls");
  v.layers.push_back(lv);
  json vj = v.to_json();
  vj["fit"] = "ls";  // set by asapc verify and compile's report
  const json& layer = vj["layers"][0];
  const json& op = layer["operators"][0];
  const json& rec = layer["fit"];
  const std::map<std::string, std::vector<const json*>> objects = {
      {"f", {&rec}},  // the fit record (read_fit)
      {"chosen", {&rec["chosen"]}},
      {"c", {&rec["candidates"][0], &vj}},  // a candidate fit, or a compared artifact
      {"l", {&layer}},
      {"o", {&op}},
      {"m", {&op["metrics"]}},
  };
  const std::regex read(
      R"re(\b(?:str|num|flag|at|arr|nums|maybe_num|maybe_flag)\((f|chosen|c|l|o|m), "([a-z_0-9]+)")re");
  int checked = 0;
  const std::string text = src.str();
  for (auto it = std::sregex_iterator(text.begin(), text.end(), read); it != std::sregex_iterator(); ++it) {
    const std::string var = (*it)[1], key = (*it)[2];
    bool present = false;
    for (const json* j : objects.at(var)) present = present || j->contains(key);
    CHECK_MESSAGE(present, "html_report.cpp reads " << var << "." << key << ", which nothing writes");
    ++checked;
  }
  CHECK(checked >= 40);
}

TEST_CASE(
    "compile record: --budget layer on the bundled ViT with a recorded latency table makes the decisions recorded "
    "before") {
  // tests/data/bundled_vit_choice.json: the latency table of one compile of
  // the bundled teacher, and what compile stored with that table at the
  // commit before the typed records (its provenance field): per layer the
  // operator, its held-out attention error and its coefficients. With the
  // same table, compile must store the same operators with the same
  // coefficients (to 1e-6: builds differ in their rounding, e.g. the
  // sanitizer build's ridge-free solve moved one by 1.3e-8 relative): a change
  // to the phases, the choice or the records that alters a decision shows
  // here. (An intended change of the math updates the file, with a note in
  // the commit.)
  const json expect = bundled_vit_choice();
  // The rule of the recording: each layer on its own, no guard, LS coefficients.
  const auto r = compile_bundled_vit(expect, asap::BudgetScope::kLayer, [](asap::CompileOptions& o) {
    o.guard = 0;
    o.fit = asap::FitKind::kLs;
  });
  const auto& want = expect.at("layers");
  REQUIRE(r.artifact.layers.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const asap::CompiledLayer& L = r.artifact.layers[i];
    CAPTURE(L.spec.name);
    CHECK(L.spec.name == want[i].at("layer").get<std::string>());
    CHECK(L.describe() == want[i].at("description").get<std::string>());
    CHECK(r.summary.layers[i].chosen.heldout_attention_error ==
          doctest::Approx(want[i].at("heldout_attention_error").get<double>()).epsilon(1e-6));
    const auto coef = want[i].at("coef");
    REQUIRE(L.coef.dim() == 2);
    REQUIRE(L.coef.size(0) == static_cast<int64_t>(coef.size()));
    for (size_t h = 0; h < coef.size(); ++h) {
      REQUIRE(L.coef.size(1) == static_cast<int64_t>(coef[h].size()));
      for (size_t p = 0; p < coef[h].size(); ++p)
        CHECK(L.coef[h][p].item<double>() == doctest::Approx(coef[h][p].get<double>()).epsilon(1e-6));
    }
  }
}

TEST_CASE(
    "compile record: on the bundled ViT with a recorded latency table, the model budget is at least as accurate") {
  // The same table as above: each layer on its own (--budget layer) and one
  // budget for the model (the default). The model's choice must be at least
  // as accurate by the model's error at the same budget, and its summed
  // latency within the budget plus the noise margin it records.
  const json expect = bundled_vit_choice();
  auto unguarded = [](asap::CompileOptions& o) { o.guard = 0; };  // the budgets alone
  const auto layer = compile_bundled_vit(expect, asap::BudgetScope::kLayer, unguarded);
  const auto model = compile_bundled_vit(expect, asap::BudgetScope::kModel, unguarded);
  REQUIRE(layer.summary.model_budget);
  REQUIRE(model.summary.model_budget);
  const auto& ml = *layer.summary.model_budget;
  const auto& mm = *model.summary.model_budget;
  CHECK(ml.scope == "layer");
  CHECK(mm.scope == "model");
  CHECK(mm.model_error <= ml.model_error * (1 + 1e-9));
  CHECK(mm.total_s <= mm.teacher_total_s / 1.25 * (1 + mm.noise_margin) * (1 + 1e-9));
  CHECK(mm.within_noise == (mm.total_s > mm.teacher_total_s / 1.25 * (1 + 1e-9)));
  CHECK((!mm.noise_measured || *mm.noise_measured == 0.0));  // a table's repeated timings do not spread
  double total = 0;
  for (size_t i = 0; i < model.summary.layers.size(); ++i) {
    const auto& L = model.summary.layers[i];
    REQUIRE(L.chosen.latency_s);
    total += *L.chosen.latency_s;
    CHECK(L.model->speedup == mm.speedup);  // every fit record carries the model's record
    CHECK(L.decision.find("for the model") != std::string::npos);
  }
  CHECK(total == doctest::Approx(mm.total_s));
  CHECK(mm.speedup == doctest::Approx(mm.teacher_total_s / mm.total_s));
  // The model's error from the layers' own records (the default under a
  // speed budget): the sum of each held-out error over the layer's Sinkhorn
  // T' = 1 error.
  CHECK(mm.error == "sum");
  CHECK(ml.error == "sum");
  double sum = 0;
  for (const auto& L : model.summary.layers)
    sum += L.chosen.heldout_attention_error / L.sinkhorn_heldout_attention_error.at(0);
  CHECK(mm.model_error == doctest::Approx(sum));
}

TEST_CASE("compile record: --layer-weights, --model-error sum and --latency-noise reach the model's choice") {
  const std::vector<double> weights = {3.0, 0.5};
  const auto r = compile_bundled_vit(bundled_vit_choice(), asap::BudgetScope::kModel, [&](asap::CompileOptions& o) {
    o.layer_weights = weights;
    o.model_error = asap::ModelErrorKind::kSum;
    o.latency_noise = 0.0;
    o.guard = 0;  // the budget alone (the weighted sum is over the default guard; its own test is below)
  });
  REQUIRE(r.summary.model_budget);
  const auto& m = *r.summary.model_budget;
  CHECK(m.error == "sum");
  CHECK(m.weights == weights);
  CHECK(m.noise_margin == 0.0);
  CHECK(!m.noise_measured);
  CHECK(m.total_s <= m.teacher_total_s / 1.25 * (1 + 1e-9));  // a strict budget
  // The model's error: the weighted sum over the layers, from their records.
  double sum = 0;
  for (size_t i = 0; i < r.summary.layers.size(); ++i) {
    const auto& L = r.summary.layers[i];
    sum += weights[i] * L.chosen.heldout_attention_error / L.sinkhorn_heldout_attention_error.at(0);
  }
  CHECK(m.model_error == doctest::Approx(sum));
}

TEST_CASE("compile record: --guard replaces a budget choice far from the teachers, says so, and round-trips") {
  // The bundled ViT's recorded latencies at 1.8x: only operators about as far
  // from the teacher as plain softmax fit. The guard (0.25 of softmax's
  // error, the default) stores the fastest choice within it instead.
  std::vector<std::string> warnings;
  double guard = -1;
  auto at_1_8x = [&](asap::CompileOptions& o) {
    o.latency_noise = 0.0;
    o.min_speedup = 1.8;
    if (guard < 0) guard = o.guard;  // the default
    o.guard = guard;
    o.warn = [&](const std::string& w) { warnings.push_back(w); };
  };
  const json recorded = bundled_vit_choice();
  const auto r = compile_bundled_vit(recorded, asap::BudgetScope::kModel, at_1_8x);
  REQUIRE(guard == doctest::Approx(0.25));
  REQUIRE(r.summary.model_budget);
  const auto& m = *r.summary.model_budget;
  REQUIRE(m.unguarded_error);
  CHECK(*m.unguarded_error > 0.25);
  CHECK(*m.unguarded_speedup >= 1.8);
  // The guard bounds each layer's error over its plain-softmax error.
  const auto largest = [](const asap::CompileResult& c) {
    double e = 0;
    for (const auto& L : c.summary.layers)
      e = std::max(e, L.chosen.heldout_attention_error / L.sinkhorn_heldout_attention_error.at(0));
    return e;
  };
  CHECK(largest(r) <= 0.25);
  CHECK(m.speedup < 1.8);
  CHECK_FALSE(m.target_met);
  CHECK(*m.guard == doctest::Approx(0.25));
  const auto said = std::count_if(warnings.begin(), warnings.end(), [](const std::string& w) {
    return w.find("over --guard 0.25") != std::string::npos;
  });
  CHECK(said == 1);
  for (const auto& L : r.summary.layers) CHECK(L.decision.find("within the guard") != std::string::npos);
  // The record as the artifact stores it.
  const asap::ModelBudgetRecord back = json(m).get<asap::ModelBudgetRecord>();
  CHECK(*back.unguarded_error == doctest::Approx(*m.unguarded_error));
  CHECK(*back.unguarded_speedup == doctest::Approx(*m.unguarded_speedup));
  CHECK(*back.guard == doctest::Approx(0.25));

  // --guard 0: the budget's own choice, far from the teachers, and no warning.
  guard = 0;
  warnings.clear();
  const auto off = compile_bundled_vit(recorded, asap::BudgetScope::kModel, at_1_8x);
  const auto& mo = *off.summary.model_budget;
  CHECK(mo.target_met);
  CHECK(mo.speedup >= 1.8);
  CHECK(largest(off) == doctest::Approx(*m.unguarded_error));
  CHECK_FALSE(mo.unguarded_error);
  CHECK_FALSE(mo.guard);
  for (const auto& w : warnings) CHECK(w.find("--guard") == std::string::npos);

  // The command line, with a guard other than the default (so the flag's
  // value is seen to reach compile; --guard 0 is the in-process run above,
  // which the CLI's flag sets alike): the warning on stderr and the model
  // line, exit 0. One run: under the sanitizers a CLI compile takes about a
  // minute.
  const std::string root = ASAP_SOURCE_DIR;
  TempDir dir;
  std::ofstream(dir.file("lat.json")) << recorded.at("latency_table").dump();
  const std::string cmd = std::string(ASAPC_EXE) + " compile " + root + "/calib_data/vit_mnist_t6.pt --spec " + root +
                          "/calib_data/vit_mnist_t6.spec.json --calib " + root +
                          "/calib_data/vit_mnist_t6.calib.h5 --no-report --latency-noise 0 --min-speedup 1.8" +
                          " --features slices,slices+alpha,slices+alpha+softmax,slices+alpha+softmax+sinkhorn3" +
                          " --latency-table " + dir / "lat.json" + " --guard 0.3 -o " + dir / "a.h5";
  std::string out;
  CHECK(run_cmd(cmd, &out) == 0);
  CHECK(out.find("asapc: warning: the 1.80x budget's best choice") != std::string::npos);
  CHECK(out.find("over --guard 0.3, so compile stores the fastest choice within the guard") != std::string::npos);
  CHECK(out.find("budget 1.80x for the model (not met: its best choice, ") != std::string::npos);
  CHECK(out.find("leaves a layer at ") != std::string::npos);           // the guard's error is a layer's
  CHECK(out.find("; normalized errors summed ") != std::string::npos);  // the default model error
}

TEST_CASE("compile record: under --budget layer the guard replaces a layer's choice far from its teacher") {
  // The recorded table under --budget layer: layer 0's own 1.25x choice
  // (Sinkhorn T' = 3, ending on the other marginal) keeps more than a
  // quarter of plain softmax's error. With the default guard that layer
  // stores the fastest operator within 0.25 of softmax's error instead,
  // from its own latency table; a layer whose choice is within the guard
  // keeps it; --guard 0 gives the recording's choices (test above).
  std::vector<std::string> warnings;
  const json recorded = bundled_vit_choice();
  const auto r = compile_bundled_vit(recorded, asap::BudgetScope::kLayer, [&](asap::CompileOptions& o) {
    o.warn = [&](const std::string& w) { warnings.push_back(w); };
  });
  const auto& want = recorded.at("layers");
  REQUIRE(r.summary.layers.size() == want.size());
  int guarded = 0;
  double budget_worst = 0;  // the budget's choices' model error, from the recording
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& L = r.summary.layers[i];
    CAPTURE(L.layer);
    const double scale = L.sinkhorn_heldout_attention_error.at(0);
    const double budget_error = want[i].at("heldout_attention_error").get<double>();
    budget_worst = std::max(budget_worst, budget_error / scale);
    REQUIRE(L.latency.choice);
    const auto& ops = L.latency.choice->operators;
    if (budget_error / scale <= 0.25) {  // within the guard: the budget's choice
      CHECK(L.chosen.heldout_attention_error == doctest::Approx(budget_error).epsilon(1e-6));
      CHECK(L.decision.find("--guard") == std::string::npos);
      continue;
    }
    ++guarded;
    // The fastest timed operator within the guard, from the layer's own table.
    double fastest = std::numeric_limits<double>::infinity();
    for (const auto& row : ops)
      if (row.selectable && row.latency_s && row.heldout_attention_error <= 0.25 * scale * (1 + 1e-9))
        fastest = std::min(fastest, *row.latency_s);
    REQUIRE(L.chosen.latency_s);
    CHECK(*L.chosen.latency_s == doctest::Approx(fastest));
    CHECK(L.chosen.heldout_attention_error <= 0.25 * scale * (1 + 1e-9));
    CHECK(L.chosen.heldout_attention_error < budget_error);
    CHECK_FALSE(L.latency.choice->target_met);
    CHECK(L.decision.find("over --guard 0.25, so this is the fastest operator within the guard") != std::string::npos);
    // One warning, naming the layer, the budget's choice and the guard.
    const std::string head =
        "layer '" + L.layer + "': the 1.25x budget's best choice (" + want[i].at("description").get<std::string>();
    const auto said = std::count_if(warnings.begin(), warnings.end(), [&](const std::string& w) {
      return w.find(head) != std::string::npos && w.find("over --guard 0.25") != std::string::npos;
    });
    CHECK(said == 1);
  }
  CHECK(guarded >= 1);  // the recording's layer 0
  REQUIRE(r.summary.model_budget);
  const auto& m = *r.summary.model_budget;
  CHECK(m.scope == "layer");
  CHECK_FALSE(m.target_met);
  CHECK(*m.guard == doctest::Approx(0.25));
  REQUIRE(m.unguarded_error);
  CHECK(*m.unguarded_error == doctest::Approx(budget_worst).epsilon(1e-6));
  // Each layer is within the guard (above); the model's error is their sum (the default).
  CHECK(m.error == "sum");
  double sum = 0;
  for (const auto& L : r.summary.layers)
    sum += L.chosen.heldout_attention_error / L.sinkhorn_heldout_attention_error.at(0);
  CHECK(m.model_error == doctest::Approx(sum));
  CHECK(*m.unguarded_speedup > m.speedup);
}

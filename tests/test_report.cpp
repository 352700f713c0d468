// The HTML fidelity report: renders real verify JSON and partial JSON,
// stays self-contained, escapes what it prints.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "asap/report.h"
#include "report/svg.h"

namespace {

nlohmann::json load_report_json(const std::string& name) {
  std::ifstream in(std::string(ASAP_TEST_DATA) + "/report/" + name);
  REQUIRE_MESSAGE(in.good(), "missing test data report/" << name);
  return nlohmann::json::parse(in);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Every <svg ...> element except the xmlns attribute value must be free of
// network references; the page has no scripts or external resources at all.
void check_self_contained(const std::string& html) {
  std::string stripped = html;
  const std::string ns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t p = stripped.find(ns); p != std::string::npos; p = stripped.find(ns, p)) stripped.erase(p, ns.size());
  CHECK(stripped.find("http://") == std::string::npos);
  CHECK(stripped.find("https://") == std::string::npos);
  CHECK(stripped.find("<script") == std::string::npos);
  CHECK(stripped.find("<link") == std::string::npos);
  CHECK(stripped.find("@import") == std::string::npos);
  CHECK(stripped.find("url(http") == std::string::npos);
}

void check_sample(const std::string& file) {
  const auto j = load_report_json(file);
  std::string html;
  REQUIRE_NOTHROW(html = asap::render_html_report(j, "asapc verify: " + file, "Held-out data: demo"));
  CHECK(html.rfind("<!doctype html>", 0) == 0);
  CHECK(html.find("</html>") != std::string::npos);
  const size_t L = j["layers"].size();
  REQUIRE(L > 0);
  // Four plots per layer: Pareto, dual scatter, closures, per-head bars.
  CHECK(count(html, "<svg") == 4 * L);
  CHECK(count(html, "</svg>") == 4 * L);
  for (const auto& l : j["layers"]) CHECK(html.find(asap::svg::esc(l["name"].get<std::string>())) != std::string::npos);
  // The default operator row is highlighted, once per layer.
  CHECK(count(html, "<tr class=\"asap default") == L);
  CHECK(html.find("latency per batch (ms, log scale)") != std::string::npos);
  CHECK(html.find("Summary") != std::string::npos);
  check_self_contained(html);
}

}  // namespace

TEST_CASE("report: renders the ViT verify sample") { check_sample("vit_verify.json"); }

TEST_CASE("report: renders the text verify sample") { check_sample("text_verify.json"); }

TEST_CASE("report: ViT sample summary answers the equal-latency question") {
  const auto html = asap::render_html_report(load_report_json("vit_verify.json"), "t", "");
  // Default ASAP k=3 (0.0289) against the best Sinkhorn no slower (T'=4, 0.0511).
  CHECK(html.find("verdict yes") != std::string::npos);
  CHECK(html.find("0.0289") != std::string::npos);
  CHECK(html.find("0.0511") != std::string::npos);
  // The compile choice and its candidates.
  CHECK(html.find("slices+alpha+softmax/pooled") != std::string::npos);
  CHECK(html.find("class=\"chosen\"") != std::string::npos);
  CHECK(html.find("pays off after") != std::string::npos);
}

TEST_CASE("report: text sample, where the teacher itself is no slower than ASAP") {
  const auto html = asap::render_html_report(load_report_json("text_verify.json"), "t", "");
  // ASAP k=2 takes 26.0 ms, the teacher 720 µs: at equal latency the exact answer wins.
  CHECK(html.find("the teacher itself (T=5, exact) runs no slower") != std::string::npos);
  CHECK(count(html, "<span class=\"verdict no\">") == 2 * 2);  // summary table and layer section, per layer
  CHECK(html.find("verdict yes") == std::string::npos);
  CHECK(html.find("slower</td>") != std::string::npos);  // speedups below 1 read as "N× slower"
  // Equal passes still favour ASAP: 0.0769 against T'=3's 0.171.
  CHECK(html.find("2.22\xC3\x97 closer") != std::string::npos);
}

TEST_CASE("report: svg log axes get readable ticks") {
  using asap::svg::Axis;
  using asap::svg::Plot;
  {
    Plot p(400, 300, Axis{25, 220, true, false, "ms"}, Axis{0.01, 1, true, false, "err"});
    const auto s = p.build("t");
    for (const char* t : {">30<", ">50<", ">100<", ">200<", ">0.01<", ">0.1<", ">1<"})
      CHECK(s.find(t) != std::string::npos);
  }
  {
    Plot p(400, 300, Axis{0.2, 300, true, false, "ms"}, Axis{1, 7, false, true, "passes"});
    const auto s = p.build("t");
    for (const char* t : {">1<", ">10<", ">100<", ">2<", ">7<"}) CHECK(s.find(t) != std::string::npos);
    CHECK(s.find(">1.5<") == std::string::npos);  // integer axis
  }
}

TEST_CASE("report: compare artifact points are plotted with their fit name") {
  auto j = load_report_json("vit_verify.json");
  auto c = j;
  c["artifact"] = "/tmp/vit_kl.asap.h5";
  c["fit"] = "kl";
  for (auto& o : c["layers"][0]["operators"])
    if (o["kind"] == "asap")
      o["metrics"]["attention_rel_error"] = o["metrics"]["attention_rel_error"].get<double>() * 0.8;
  j["compare"] = nlohmann::json::array({c});
  const auto html = asap::render_html_report(j, "t", "");
  CHECK(html.find("ASAP \xC2\xB7 fit kl") != std::string::npos);
  CHECK(html.find("Compared artifacts") != std::string::npos);
  check_self_contained(html);
}

TEST_CASE("report: JSON with missing optional fields still renders on the passes axis") {
  nlohmann::json j = load_report_json("text_verify.json");
  j.erase("timed_batch");
  j.erase("fit");
  j.erase("compare");
  for (auto& l : j["layers"]) {
    l.erase("fit");
    l.erase("fit_time_s");
    l.erase("break_even_calls");
    l["dual_scatter"] = {{"predicted", nlohmann::json::array()}, {"teacher", nlohmann::json::array()}};
    for (auto& o : l["operators"]) o["latency_s"] = -1.0;
  }
  // Drop optional metric fields from one operator and the per-head errors of one layer.
  j["layers"][0]["operators"][1]["metrics"].erase("layer_output_rmse");
  j["layers"][0]["operators"][1]["metrics"].erase("dual_rmse");
  j["layers"][1].erase("per_head_attention_error");
  std::string html;
  REQUIRE_NOTHROW(html = asap::render_html_report(j, "partial", ""));
  CHECK(html.find("latency not timed") != std::string::npos);
  CHECK(html.find("latency per batch") == std::string::npos);
  CHECK(html.find("No compile record") != std::string::npos);
  CHECK(count(html, "<svg") == 4 * j["layers"].size());
  CHECK(count(html, "<tr class=\"asap default") == j["layers"].size());
  check_self_contained(html);

  // Bare minimum: layers without operators, and no layers at all.
  REQUIRE_NOTHROW(html = asap::render_html_report({{"layers", {{{"name", "x"}}}}}, "bare", ""));
  CHECK(html.find(">x<") != std::string::npos);
  REQUIRE_NOTHROW(asap::render_html_report(nlohmann::json::object(), "empty", ""));
  REQUIRE_NOTHROW(asap::render_html_report(nlohmann::json::array(), "not an object", ""));
  // Wrong types where numbers or objects are expected.
  REQUIRE_NOTHROW(asap::render_html_report(
      {{"layers",
        {{{"name", 3}, {"T", "six"}, {"operators", {{{"kind", "asap"}, {"metrics", "none"}}}}, {"fit", "ls"}}}}},
      "odd", ""));
}

TEST_CASE("report: hostile layer names and titles are escaped") {
  nlohmann::json j = load_report_json("vit_verify.json");
  const std::string hostile = "a<b&\"c";
  j["layers"][0]["name"] = hostile;
  j["layers"][0]["fit"]["chosen"]["candidate"] = "<script>alert(1)</script>";
  j["artifact"] = "/tmp/<x>.h5";
  const auto html = asap::render_html_report(j, "<title>&", "note <b>");
  CHECK(html.find(hostile) == std::string::npos);
  CHECK(html.find("a&lt;b&amp;&quot;c") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("&lt;title&gt;&amp;") != std::string::npos);
  CHECK(html.find("note &lt;b&gt;") != std::string::npos);
  CHECK(html.find("/tmp/&lt;x&gt;.h5") != std::string::npos);
}

TEST_CASE("report: number formatting") {
  using asap::svg::fmt;
  using asap::svg::fmt_seconds;
  CHECK(fmt(0.028879514760864762) == "0.0289");
  CHECK(fmt(0.14687308651923653) == "0.147");
  CHECK(fmt(183.22867485610664) == "183");
  CHECK(fmt(0.09996) == "0.100");
  CHECK(fmt(9.216173123190419e-08) == "9.22e-8");
  CHECK(fmt(0) == "0");
  CHECK(fmt(-2.5) == "-2.50");
  CHECK(fmt_seconds(0.025276964) == "25.3 ms");
  CHECK(fmt_seconds(0.000361857) == "362 \xC2\xB5s");
  CHECK(fmt_seconds(7.103016791) == "7.10 s");
}

TEST_CASE("report: the summary leads with the model's speed-up and the layer furthest from its teacher") {
  // The ViT sample's layer and a copy ("second") that is slower and further
  // from its teacher relative to softmax: the sum of the latencies and the
  // worst layer, computed here from the JSON.
  auto j = load_report_json("vit_verify.json");
  auto second = j["layers"][0];
  second["name"] = "second";
  double t = 0, d = 0, softmax = 0;
  for (const auto& o : second["operators"]) {
    if (o["kind"] == "teacher") t = o["latency_s"].get<double>();
    if (o["kind"] == "sinkhorn" && o["steps"] == 1) softmax = o["metrics"]["attention_rel_error"].get<double>();
  }
  REQUIRE(softmax > 0);
  for (auto& o : second["operators"]) {
    if (o["default"].get<bool>()) {
      o["latency_s"] = 2 * o["latency_s"].get<double>();
      o["metrics"]["attention_rel_error"] = 0.9 * softmax;
      d = o["latency_s"].get<double>();
    }
  }
  j["layers"].push_back(second);
  const auto html = asap::render_html_report(j, "t", "");
  const size_t summary = html.find("<h2>Summary</h2>");
  REQUIRE(summary != std::string::npos);
  const size_t model = html.find("<p class=\"model\">", summary);
  REQUIRE(model != std::string::npos);
  CHECK(model < html.find("<p>", summary + 1));  // first in the summary
  // Two teachers of t against d / 2 + d: 2 t / (1.5 d).
  char want[64];
  std::snprintf(want, sizeof want, "runs at %.3g", 2 * t / (1.5 * d));
  CHECK_MESSAGE(html.find(want, model) != std::string::npos, html.substr(model, 300));
  CHECK_MESSAGE(html.find("layer <b>second</b>", model) != std::string::npos, html.substr(model, 400));
  CHECK_MESSAGE(html.find("0.900 of plain softmax", model) != std::string::npos, html.substr(model, 400));
}

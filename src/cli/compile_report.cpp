#include "compile_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/dist.h"
#include "asap/error.h"
#include "asap/report.h"
#include "asap/verify.h"

namespace asapc {

CompileReport write_compile_report(const asap::Artifact& art, const asap::CompileSummary& summary,
                                   const std::string& artifact_path, const std::string& checkpoint,
                                   const std::vector<std::string>& calib_paths, const asap::CompileOptions& opt,
                                   const std::string& html_path, const std::string& json_path, std::ostream& os,
                                   const std::function<void(const asap::ProgressEvent&)>& progress) {
  asap::CalibFile calib(calib_paths);
  const std::string calib_path = calib.path();
  const std::string note = "Held-out split of " + calib_path + ": the calibration examples not used for the fit.";
  asap::Communicator* comm = opt.comm.get();
  // How many held-out examples the split has (the smallest over layers).
  int64_t held = -1;
  for (const auto& l : art.layers) {
    const int64_t cap = asap::make_shards(comm, calib, calib.info(l.spec.name).N, opt.max_examples).total;
    int64_t h = 0;
    for (int64_t e = 0; e < cap; ++e) h += asap::in_heldout_split(opt.seed, opt.heldout_fraction, e);
    held = held < 0 ? h : std::min(held, h);
  }
  CompileReport rep;
  nlohmann::json j;
  if (held < opt.min_heldout) {
    rep.message = asap::str("The held-out split has only ", held, " example(s) (fewer than ", opt.min_heldout,
                            "), too few to measure fidelity; verify on a separate held-out file instead.");
    j = {{"artifact", artifact_path},         {"checkpoint", checkpoint}, {"data", calib_path},
         {"layers", nlohmann::json::array()}, {"too_small", true},        {"message", rep.message}};
  } else {
    auto ck = asap::load_checkpoint(checkpoint);
    asap::VerifyOptions vo;
    vo.batch_size = opt.batch_size;
    vo.float64 = opt.float64;
    vo.max_examples = 0;
    // Examples compile excluded (--skip-bad-examples) stay out of the report too.
    std::vector<int64_t> excluded;
    for (const asap::LayerRecord& l : summary.layers)
      excluded.insert(excluded.end(), l.excluded_examples.begin(), l.excluded_examples.end());
    std::sort(excluded.begin(), excluded.end());
    vo.example_filter = [&opt, excluded](int64_t e) {
      return (opt.max_examples <= 0 || e < opt.max_examples) &&
             asap::in_heldout_split(opt.seed, opt.heldout_fraction, e) &&
             !std::binary_search(excluded.begin(), excluded.end(), e);
    };
    vo.progress = progress;
    vo.comm = opt.comm;
    rep.verify = asap::verify(art, artifact_path, ck, calib, vo);
    j = rep.verify->to_json();
  }
  j["source"] = "compile";
  j["fit"] = asap::fit_name(opt.fit);
  if (!comm || comm->rank() == 0)
    asap::write_report(j, html_path, json_path, "asapc compile report: " + artifact_path, note);
  return rep;
}

void print_report_lines(const CompileReport& r, std::ostream& os) {
  if (!r.verify) {
    os << "report: " << r.message << "\n";
    return;
  }
  using Op = asap::OperatorResult;
  for (const asap::LayerVerification& l : r.verify->layers) {
    const Op *def = nullptr, *asap0 = nullptr, *teacher = nullptr, *near = nullptr;
    for (const Op& o : l.operators) {
      if (o.is_default) def = &o;
      if (o.kind == "asap" && o.steps == 1) asap0 = &o;
      if (o.kind == "teacher") teacher = &o;
    }
    if (!def || !teacher) continue;
    const double t_def = def->latency_s;
    for (const Op& o : l.operators)
      if (o.kind == "sinkhorn" && &o != def &&
          (!near || std::abs(o.latency_s - t_def) < std::abs(near->latency_s - t_def)))
        near = &o;
    char line[512];
    auto err = [](const Op* o) { return o->metrics.attention_rel_error; };
    const std::string& kind = def->kind;
    const std::string label = kind == "asap" ? "ASAP k=" : kind == "sinkhorn" ? "Sinkhorn T'=" : "teacher T=";
    std::snprintf(line, sizeof line, "  %s: %s%d attn err %.4f", l.name.c_str(), label.c_str(), def->steps, err(def));
    os << line;
    if (asap0) {
      std::snprintf(line, sizeof line, " | ASAP-0 %.4f", err(asap0));
      os << line;
    }
    if (near) {
      std::snprintf(line, sizeof line, " | Sinkhorn T'=%d (nearest latency) %.4f", near->steps, err(near));
      os << line;
    }
    const double t_teacher = teacher->latency_s;
    if (t_def > 0 && t_teacher > 0) {
      std::snprintf(line, sizeof line, " | %.2fx the teacher's speed", t_teacher / t_def);
      os << line;
    }
    os << "\n";
  }
}

}  // namespace asapc

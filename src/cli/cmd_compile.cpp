// asapc compile: checkpoint + teacher spec + calibration file -> artifact.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "commands.h"
#include "compile_report.h"
#include "common.h"

namespace asapc {

namespace {

struct CompileArgs {
  std::string checkpoint, spec, calib, out;
  asap::CompileOptions opt;
  std::vector<std::string> features;
  std::string heads = "auto";
  std::string report, report_json;
  int threads = 0;
  bool quiet = false, json = false, no_report = false;
};

std::vector<asap::Candidate> candidates_of(const std::vector<std::string>& features, const std::string& heads) {
  ASAP_CHECK(heads == "auto" || heads == "pooled" || heads == "per-head",
             "--heads-mode must be auto, pooled or per-head, found '", heads, "'");
  std::vector<std::string> fs = features;
  if (fs.empty()) fs = {"slices", "slices+alpha", "slices+alpha+softmax", "slices+alpha+softmax+sinkhorn3"};
  std::vector<asap::Candidate> out;
  for (auto f : fs) {
    if (f == "paper") f = "slices";
    if (f == "all") f = "slices+alpha+softmax+sinkhorn3";
    ASAP_CHECK(f == "slices" || f == "slices+alpha" || f == "slices+alpha+softmax" || f == "slices+alpha+softmax+sinkhorn3",
               "--features takes slices (alias paper), slices+alpha, slices+alpha+softmax, "
               "slices+alpha+softmax+sinkhorn3 (alias all); found '", f, "'");
    if (heads != "per-head") out.push_back({f, false});
    if (heads != "pooled") out.push_back({f, true});
  }
  return out;
}

void print_summary(const nlohmann::json& sum, const std::string& out) {
  std::cout << "compiled " << sum["layers"].size() << " layer(s) in " << human_seconds(sum["total_time_s"].get<double>())
            << " -> " << out << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-30s %6s %7s %-34s %3s %8s %10s %10s %8s\n", "layer", "rows", "heldout",
                "operator", "k", "ridge", "dual RMSE", "attn err", "fit");
  std::cout << line;
  for (const auto& l : sum["layers"]) {
    const auto& c = l["chosen"];
    std::string op = c["family"].get<std::string>() + (c["per_head"].get<bool>() ? "/head" : "/pool");
    std::string name = l["layer"].get<std::string>();
    if (name.size() > 30) name = "..." + name.substr(name.size() - 27);
    const double rmse = c["heldout_dual_rmse"].get<double>(), err = c["heldout_attention_error"].get<double>();
    std::snprintf(line, sizeof line, "%-30s %6lld %7lld %-34s %3d %8.0e %10s %10s %8s\n", name.c_str(),
                  static_cast<long long>(l["rows_used"].get<int64_t>()),
                  static_cast<long long>(l["heldout_examples"].get<int64_t>()), op.c_str(), c["closures"].get<int>(),
                  c["ridge"].get<double>(), rmse >= 0 ? std::to_string(rmse).substr(0, 7).c_str() : "-",
                  err >= 0 ? std::to_string(err).substr(0, 7).c_str() : "-",
                  human_seconds(l["fit_time_s"].get<double>()).c_str());
    std::cout << line;
    if (l.contains("kl")) {
      const auto& k = l["kl"];
      std::cout << "    KL fit: ridge " << k["ridge"].get<double>() << ", " << k["iterations"] << " Newton iterations"
                << (k["converged"].get<bool>() ? " (converged)" : " (iteration cap)") << ", objective "
                << k["objective"].get<double>() << ", |grad| " << k["grad_norm"].get<double>()
                << ", held-out KL " << k["heldout_kl"].get<double>() << " (LS " << k["heldout_kl_ls"].get<double>()
                << ")\n";
    }
  }
}

}  // namespace

void add_compile(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<CompileArgs>();
  auto* c = app.add_subcommand("compile", "Compile a Sinkhorn teacher into an ASAP artifact");
  c->add_option("checkpoint", a->checkpoint, "teacher checkpoint (torch.save zip or .safetensors)")->required();
  c->add_option("--spec", a->spec, "teacher spec JSON (asapc inspect writes one)")->required();
  c->add_option("--calib", a->calib, "calibration HDF5 (docs/calibration-format.md)")->required();
  c->add_option("-o,--output", a->out, "artifact to write (HDF5)")->required();
  auto& o = a->opt;
  c->add_option("--layers", o.layers, "compile only these layers (default: all in the spec)");
  c->add_option("--fit", o.fit, "coefficient fit: ls (ridge least squares) or kl (convex forward KL)")
      ->capture_default_str();
  c->add_option("--slices", o.slice_bank, "slice bank size per layer")->capture_default_str();
  c->add_option("--slice-counts", o.slice_counts, "nested slice prefixes tried (default 0,1,2,4,8,... up to --slices)");
  c->add_option("--fixed-slices", o.fixed_slices, "use exactly this many slices (no selection)");
  c->add_option("--features", a->features,
                "candidate feature sets: slices (paper), slices+alpha, slices+alpha+softmax (default: all three)");
  c->add_option("--heads-mode", a->heads, "coefficients pooled, per-head, or auto (both candidates)")
      ->capture_default_str();
  c->add_option("--ridge", o.ridge, "fixed LS ridge (default: chosen on held-out data)");
  c->add_option("--ridge-grid", o.ridge_grid, "LS ridge candidates (default 0, 1e-8 ... 1)");
  c->add_option("--kl-ridge", o.kl_ridge, "fixed KL ridge (default: chosen on held-out KL)");
  c->add_option("--kl-iters", o.kl_max_iters, "maximum Newton iterations of the KL fit")->capture_default_str();
  c->add_option("--kl-cache-mb", o.kl_cache_mb, "memory budget for caching KL features (MB)")->capture_default_str();
  c->add_option("--closures", o.closures, "fixed default number of closures k (default: chosen on held-out data)");
  c->add_option("--max-passes", o.max_passes,
                "budget of log-sum-exp passes for the default operator (default: T - 2, at least 1)");
  c->add_option("--max-closures", o.max_closures, "closures evaluated on held-out data")->capture_default_str();
  c->add_option_function<std::string>(
       "--slice-cost",
       [&o](const std::string& v) {
         if (v == "auto") {
           o.slice_cost = -1;
           return;
         }
         size_t used = 0;
         double x = -1;
         try {
           x = std::stod(v, &used);
         } catch (const std::exception&) {
           used = 0;
         }
         if (used != v.size() || !(x >= 0))
           throw CLI::ValidationError("--slice-cost", "expected 'auto' or a number >= 0, found '" + v + "'");
         o.slice_cost = x;
       },
       "pass-equivalents each slice counts against --max-passes: 0 = slices are free (default, fidelity "
       "first), auto = 8 log2(n)/n (latency-aware), or a number")
      ->type_name("auto|X");
  c->add_option("--selection-examples", o.selection_examples,
                "held-out examples that run the closures when choosing features and k (0 = all)")
      ->capture_default_str();
  c->add_option("--batch-size", o.batch_size, "examples per streamed batch")->capture_default_str();
  c->add_option("--heldout-fraction", o.heldout_fraction, "share of examples held out of the fit")
      ->capture_default_str();
  c->add_option("--seed", o.seed, "seed of the slice bank and the split")->capture_default_str();
  c->add_option("--max-examples", o.max_examples, "use only the first N calibration examples");
  c->add_flag("--float64", o.float64, "run teacher and features in float64 (default: float32)");
  c->add_option("--report", a->report, "HTML fidelity report on the held-out split (default: OUTPUT stem + .report.html)");
  c->add_option("--report-json", a->report_json, "its JSON (default: OUTPUT stem + .report.json)");
  c->add_flag("--no-report", a->no_report, "skip the fidelity report");
  c->add_option("--threads", a->threads, "threads (default: all cores)");
  c->add_flag("-q,--quiet", a->quiet, "no progress bar, no warnings");
  c->add_flag("--json", a->json, "print the compile summary as JSON on stdout");
  c->callback([a, &run] {
    run = [a] {
      set_threads(a->threads);
      a->opt.candidates = candidates_of(a->features, a->heads);
      Progress bar(a->quiet);
      a->opt.progress = [&bar](const asap::ProgressEvent& e) {
        bar.update(e.layer + " " + e.phase, e.done, e.total);
      };
      if (!a->quiet)
        a->opt.warn = [&bar](const std::string& w) {
          bar.finish();
          std::cerr << "asapc: warning: " << w << "\n";
        };
      auto res = asap::compile_teacher(a->checkpoint, a->spec, a->calib, a->opt);
      bar.finish();
      asap::write_artifact(a->out, res.artifact);
      res.summary["artifact"] = a->out;
      nlohmann::json report;
      std::string html, js;
      if (!a->no_report) {
        std::string stem = a->out;
        for (const char* ext : {".asap.h5", ".h5"})
          if (stem.size() > std::strlen(ext) && stem.compare(stem.size() - std::strlen(ext), std::string::npos, ext) == 0) {
            stem.resize(stem.size() - std::strlen(ext));
            break;
          }
        html = a->report.empty() ? stem + ".report.html" : a->report;
        js = a->report_json.empty() ? stem + ".report.json" : a->report_json;
        report = write_compile_report(res.artifact, a->out, a->checkpoint, a->calib, a->opt, html, js, std::cerr,
                                      a->opt.progress);
        bar.finish();
        res.summary["report"] = {{"html", html}, {"json", js}};
      }
      if (a->json) {
        std::cout << res.summary.dump(2) << "\n";
      } else {
        print_summary(res.summary, a->out);
        if (!a->no_report) {
          std::cout << "report: " << html << " (held-out split of the calibration file)\n";
          print_report_lines(report, std::cout);
        }
      }
      return 0;
    };
  });
}

}  // namespace asapc

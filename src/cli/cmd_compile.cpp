// asapc compile: checkpoint + teacher spec + calibration file -> artifact.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "commands.h"
#include "common.h"
#include "compile_report.h"

namespace asapc {

namespace {

struct CompileArgs {
  std::string checkpoint, spec, out;
  std::vector<std::string> calib;  // files or glob patterns, numbered through in order
  asap::DistOptions dist;
  asap::CompileOptions opt;
  std::vector<std::string> features;
  std::string heads = "auto";
  std::string report, report_json;
  std::string objective = "min-speedup", latency_table;
  std::string fit = "attention", targets = "both";     // parsed into opt.fit / opt.targets
  std::string budget = "model", model_error = "auto";  // parsed into opt.budget / opt.model_error
  std::string zero_parameter = "fallback";             // parsed into opt.zero_parameter
  double min_speedup = 1.25, max_error = -1;
  bool min_speedup_given = false, max_error_given = false;
  int threads = 0;
  int deploy_threads = -1;  // -1: not given
  bool quiet = false, json = false, no_report = false;
};

std::vector<asap::Candidate> candidates_of(const std::vector<std::string>& features, const std::string& heads) {
  ASAP_CHECK(heads == "auto" || heads == "pooled" || heads == "per-head",
             "--heads-mode must be auto, pooled or per-head, found '", heads, "'");
  std::vector<std::string> fs = features;
  if (fs.empty()) fs.assign(std::begin(asap::kDefaultFeatureFamilies), std::end(asap::kDefaultFeatureFamilies));
  std::vector<asap::Candidate> out;
  for (auto f : fs) {
    if (f == "paper") f = "slices";
    if (f == "all") f = "slices+alpha+softmax+sinkhorn3+cstats";
    ASAP_CHECK(asap::is_feature_family(f),
               "--features takes slices (alias paper), slices+alpha, slices+alpha+softmax, "
               "slices+alpha+softmax+sinkhorn3, alpha, alpha+softmax or alpha+softmax+sinkhorn3, each family with "
               "alpha optionally followed by +stats or +cstats (all = slices+alpha+softmax+sinkhorn3+cstats); found '",
               f, "'");
    if (heads != "per-head") out.push_back({f, false});
    if (heads != "pooled") out.push_back({f, true});
  }
  return out;
}

// --objective with --min-speedup / --max-error, checked together.
void apply_objective(CompileArgs& a) {
  auto& o = a.opt;
  if (a.objective == "min-speedup") {
    ASAP_CHECK(!a.max_error_given, "--max-error needs --objective max-error");
    o.objective = asap::Objective::kMinSpeedup;
    o.min_speedup = a.min_speedup;
  } else if (a.objective == "max-error") {
    ASAP_CHECK(!a.min_speedup_given, "--min-speedup does not apply to --objective max-error");
    ASAP_CHECK(a.max_error_given, "--objective max-error needs --max-error E");
    o.objective = asap::Objective::kMaxError;
    o.max_error = a.max_error;
  } else if (a.objective == "fidelity") {
    ASAP_CHECK(!a.min_speedup_given && !a.max_error_given,
               "--objective fidelity takes neither --min-speedup nor --max-error");
    o.objective = asap::Objective::kFidelity;
  } else {
    throw asap::Error(asap::str("--objective must be min-speedup, max-error or fidelity, found '", a.objective, "'"));
  }
  if (!a.latency_table.empty()) o.latency = asap::latency_table_from_file(a.latency_table);
}

// The refit's line under its layer (--fit kl / attention).
void print_refit(const asap::RefitRecord& r) {
  if (!r.skipped.empty()) {
    std::cout << "    " << (r.fit == "kl" ? "KL fit: " : "attention refit: ") << r.skipped << "\n";
  } else if (r.kl) {
    const auto& k = *r.kl;
    std::cout << "    KL fit: ridge " << k.ridge << ", " << k.iterations << " Newton iterations"
              << (k.converged ? " (converged)" : " (iteration cap)") << ", objective " << k.objective << ", |grad| "
              << k.grad_norm << ", held-out KL " << k.heldout_kl << " (LS " << k.heldout_kl_ls << ")\n";
  } else if (r.attention) {
    const auto& k = *r.attention;
    std::cout << "    attention refit: " << k.iterations << " L-BFGS iterations (best at " << k.best_iteration
              << (k.stopped.empty() ? "" : ", stopped by " + k.stopped) << "), training objective "
              << k.train_objective_ls << " -> " << k.train_objective;
    if (r.heldout_attention_error_refit)
      std::cout << ", held-out attention error " << r.heldout_attention_error_ls.value_or(-1.0) << " -> "
                << *r.heldout_attention_error_refit << (r.fell_back_to_ls.value_or(false) ? " (worse: LS kept)" : "");
    std::cout << "\n";
  }
}

// The model's line: its speed-up against the budget, and its worst layer.
void print_model_line(const asap::ModelBudgetRecord& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "model: %.2fx the teachers' speed (%.1f us against %.1f us per call of %zu layer(s))",
                m.speedup, 1e6 * m.total_s, 1e6 * m.teacher_total_s, m.layers.size());
  std::cout << buf;
  if (m.min_speedup) {
    std::snprintf(buf, sizeof buf, ", budget %.2fx %s", *m.min_speedup,
                  m.scope == "model" ? "for the model" : "per layer (--budget layer)");
    std::cout << buf;
    if (m.within_noise) {
      std::snprintf(buf, sizeof buf, " (met within the timing noise of %.1f%%)", 100 * m.noise_margin);
      std::cout << buf;
    } else if (m.unguarded_error) {
      std::snprintf(buf, sizeof buf, " (not met: its best choice, %.2fx, leaves a layer at %.3g, over --guard %.3g)",
                    m.unguarded_speedup.value_or(0), *m.unguarded_error, m.guard.value_or(0));
      std::cout << buf;
    } else if (!m.target_met) {
      std::cout << " (not met)";
    }
  }
  if (m.error == "sum")
    std::snprintf(buf, sizeof buf, "; normalized errors summed %.3g (largest on layer '%s')\n", m.model_error,
                  m.worst_layer.c_str());
  else
    std::snprintf(buf, sizeof buf, "; largest normalized error %.3g (layer '%s')\n", m.model_error,
                  m.worst_layer.c_str());
  std::cout << buf;
}

void print_summary(const asap::CompileSummary& sum, const std::string& out) {
  std::cout << "compiled " << sum.layers.size() << " layer(s) in " << human_seconds(sum.total_time_s) << " -> " << out
            << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-30s %6s %7s %-34s %3s %8s %10s %10s %8s\n", "layer", "rows", "heldout",
                "operator", "k", "ridge", "dual RMSE", "attn err", "fit");
  std::cout << line;
  for (const asap::LayerRecord& l : sum.layers) {
    const asap::ChosenRecord& c = l.chosen;
    const bool asap_op = c.is_asap();
    std::string op = asap_op ? *c.family + (*c.per_head ? "/head" : "/pool") : c.description;
    std::string name = l.layer;
    if (name.size() > 30) name = "..." + name.substr(name.size() - 27);
    const double rmse = c.heldout_dual_rmse.value_or(-1.0), err = c.heldout_attention_error;
    std::snprintf(line, sizeof line, "%-30s %6lld %7lld %-34s %3d %8.0e %10s %10s %8s\n", name.c_str(),
                  static_cast<long long>(l.rows_used), static_cast<long long>(l.heldout_examples), op.c_str(),
                  asap_op ? *c.closures : 0, asap_op ? *c.ridge : 0.0,
                  rmse >= 0 ? std::to_string(rmse).substr(0, 7).c_str() : "-",
                  err >= 0 ? std::to_string(err).substr(0, 7).c_str() : "-", human_seconds(l.fit_time_s).c_str());
    std::cout << line;
    const auto& per_rank = l.examples_per_rank;
    if (per_rank.size() > 1) {  // a process group: what each rank read
      std::string parts;
      for (size_t r = 0; r < per_rank.size(); ++r) parts += (r ? ", " : "") + std::to_string(per_rank[r]);
      std::cout << "    calibration examples: " << l.examples << " in total, per rank " << parts << "\n";
    }
    if (!l.decision.empty()) std::cout << "    " << l.decision << "\n";
    if (l.refit) print_refit(*l.refit);
  }
  if (sum.model_budget) print_model_line(*sum.model_budget);
}

}  // namespace

void add_compile(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<CompileArgs>();
  auto* c = app.add_subcommand("compile", "Compile a Sinkhorn teacher into an ASAP artifact");
  c->add_option("checkpoint", a->checkpoint, "teacher checkpoint (torch.save zip or .safetensors)")->required();
  c->add_option("--spec", a->spec, "teacher spec JSON (asapc inspect writes one)")->required();
  c->add_option("--calib", a->calib,
                "calibration HDF5 (docs/calibration-format.md); several files or a quoted glob are read as one set")
      ->required();
  c->add_option("-o,--output", a->out, "artifact to write (HDF5)")->required();
  auto& o = a->opt;
  c->add_option("--layers", o.layers, "compile only these layers (default: all in the spec)")->delimiter(',');
  c->add_option("--fit", a->fit,
                "coefficient fit: attention (LS, then refined by L-BFGS on the attention error after the "
                "operator's closures, kept if the held-out error improves), ls (ridge least squares alone: a "
                "compile several times faster), or kl (convex forward KL)")
      ->capture_default_str();
  c->add_option("--slices", o.slice_bank, "slice bank size per layer")->capture_default_str();
  c->add_option("--slice-counts", o.slice_counts,
                "nested slice prefixes tried, a,b,... or a b ... (default 0,1,2,4,8,... up to --slices)")
      ->delimiter(',');
  c->add_option("--fixed-slices", o.fixed_slices, "use exactly this many slices (no selection)");
  c->add_option("--features", a->features,
                "candidate feature families: slices (paper), slices+alpha, slices+alpha+softmax, "
                "slices+alpha+softmax+sinkhorn3, alpha, alpha+softmax, alpha+softmax+sinkhorn3, any family with "
                "alpha followed by +stats (the row score statistics) or +cstats (those and the column-centered ones), "
                "all = slices+alpha+softmax+sinkhorn3+cstats (default: slices, slices+alpha, slices+alpha+softmax, "
                "slices+alpha+softmax+sinkhorn3, and slices+alpha and slices+alpha+softmax+sinkhorn3 each with "
                "+stats and with +cstats, slice prefixes from 0)")
      ->delimiter(',');
  c->add_option("--heads-mode", a->heads, "coefficients pooled, per-head, or auto (both candidates)")
      ->capture_default_str();
  c->add_option("--ridge", o.ridge, "fixed LS ridge (default: chosen on held-out data)");
  c->add_option("--ridge-grid", o.ridge_grid, "LS ridge candidates (default 0, 1e-8 ... 1)")->delimiter(',');
  c->add_option("--targets", a->targets,
                "dual the map predicts: closure-ready (run with any k), k-matched (the teacher's dual after T - k "
                "half-steps, run with exactly k closures), or both as candidates")
      ->capture_default_str();
  c->add_option("--kl-ridge", o.kl_ridge, "fixed KL ridge (default: chosen on held-out KL)");
  c->add_option("--kl-iters", o.kl_max_iters, "maximum Newton iterations of the KL fit")->capture_default_str();
  c->add_option("--attention-iters", o.attention_iters, "L-BFGS iterations of --fit attention")->capture_default_str();
  c->add_option("--attention-patience", o.attention_patience,
                "stop --fit attention after this many held-out checks (one every 5 iterations) without a better "
                "held-out error; 0 runs every iteration")
      ->capture_default_str();
  c->add_option("--kl-cache-mb", o.kl_cache_mb, "memory budget for caching KL features (MB)")->capture_default_str();
  c->add_option("--closures", o.closures, "fixed default number of closures k (default: chosen on held-out data)");
  c->add_option("--max-passes", o.max_passes,
                "budget of log-sum-exp passes for the default operator (default: T - 2, at least 1)");
  c->add_option("--max-closures", o.max_closures, "closures evaluated on held-out data")->capture_default_str();
  c->add_option("--objective", a->objective,
                "what to optimise: min-speedup (the most accurate operator at least --min-speedup times faster than "
                "the teacher), max-error (the fastest within --max-error), fidelity (the most accurate ASAP map "
                "within --max-passes, no timing)")
      ->capture_default_str();
  c->add_option_function<double>(
      "--min-speedup", [a](double x) { a->min_speedup = x, a->min_speedup_given = true; },
      "required speed-up over the fused teacher, measured at the deployment shape (default 1.25)");
  c->add_option_function<double>(
      "--max-error", [a](double x) { a->max_error = x, a->max_error_given = true; },
      "held-out attention error bound for --objective max-error");
  c->add_option("--budget", a->budget,
                "what the objective applies to: model (the compiled layers' summed latency against the teachers', "
                "the error spent where it costs least) or layer (every layer on its own)")
      ->capture_default_str();
  c->add_option("--model-error", a->model_error,
                "the model's error under --budget model: max or sum over the layers of each one's held-out error "
                "normalized by its Sinkhorn T' = 1 error; auto = sum under a speed budget, max under --objective "
                "max-error")
      ->capture_default_str();
  c->add_option("--layer-weights", o.layer_weights,
                "weight of each compiled layer's error in the model's, one per layer in spec order (default 1)")
      ->delimiter(',');
  c->add_option("--latency-noise", o.latency_noise,
                "relative margin by which the model may exceed its latency budget (default: the spread of repeated "
                "timings, at least 2% and at most 10%; 0: a strict budget)");
  c->add_option("--guard", o.guard,
                "under the speed budget, the largest error (a layer's held-out attention error over its "
                "plain-softmax error) the budget's choice may leave on any layer, whatever --model-error; over it, "
                "compile stores the fastest choice within it and warns (0: off)")
      ->capture_default_str();
  c->add_option("--deploy-batch", o.deploy_batch, "examples per call at which latency is measured")
      ->capture_default_str();
  c->add_option("--latency-table", a->latency_table,
                "take latencies from this JSON file ({layer or \"*\": {operator key: seconds}}) instead of measuring");
  CLI::Option* zero =
      c->add_option("--zero-parameter", a->zero_parameter,
                    "plain Sinkhorn (T' < T) and the teacher under a speed budget: fallback (only when no ASAP maps "
                    "meet it, or when they bring the model at least twice as close to the teachers), compete (as "
                    "equals of the maps) or never")
          ->capture_default_str();
  c->add_flag(
       "--no-zero-parameter", [a](int64_t) { a->zero_parameter = "never"; },
       "never store plain Sinkhorn or the teacher: ASAP maps only (--zero-parameter never)")
      ->excludes(zero);
  c->add_option("--selection-examples", o.selection_examples,
                "held-out examples that run the closures when choosing features and k (0 = all)")
      ->capture_default_str();
  c->add_option("--batch-size", o.batch_size, "examples per streamed batch")->capture_default_str();
  c->add_option("--heldout-fraction", o.heldout_fraction, "share of examples held out of the fit")
      ->capture_default_str();
  c->add_option("--seed", o.seed, "seed of the slice bank and the split")->capture_default_str();
  c->add_option("--max-examples", o.max_examples, "use only the first N calibration examples");
  c->add_flag("--float64", o.float64, "run teacher and features in float64 (default: float32)");
  c->add_flag("--skip-bad-examples", o.skip_bad_examples,
              "exclude calibration examples whose attention scores overflow, with a warning (default: refuse them)");
  c->add_option("--report", a->report,
                "HTML fidelity report on the held-out split (default: OUTPUT stem + .report.html)");
  c->add_option("--report-json", a->report_json, "its JSON (default: OUTPUT stem + .report.json)");
  c->add_flag("--no-report", a->no_report, "skip the fidelity report");
  c->add_option("--threads", a->threads, "threads (default: all cores)");
  c->add_option("--deploy-threads", a->deploy_threads,
                "threads at which latency is measured, 0 = all cores (default: --threads in one process, every "
                "core in a distributed compile)");
  c->add_flag("-q,--quiet", a->quiet, "no progress bar, no warnings");
  c->add_flag("--json", a->json, "print the compile summary as JSON on stdout");
  add_dist_options(c, a->dist);
  c->callback([a, c, &run] {
    run = [a, c] {
      require_values(c, {{"--slices", Takes::kPositiveInt},
                         {"--slice-counts", Takes::kNonNegativeInt},
                         {"--fixed-slices", Takes::kNonNegativeInt},
                         {"--ridge", Takes::kNonNegative},
                         {"--ridge-grid", Takes::kNonNegative},
                         {"--kl-ridge", Takes::kNonNegative},
                         {"--kl-iters", Takes::kNonNegativeInt},
                         {"--kl-cache-mb", Takes::kNonNegative},
                         {"--closures", Takes::kNonNegativeInt},
                         {"--max-passes", Takes::kNonNegativeInt},
                         {"--max-closures", Takes::kPositiveInt},
                         {"--min-speedup", Takes::kPositive},
                         {"--max-error", Takes::kPositive},
                         {"--deploy-batch", Takes::kPositiveInt},
                         {"--layer-weights", Takes::kPositive},
                         {"--latency-noise", Takes::kNonNegative},
                         {"--guard", Takes::kNonNegative},
                         {"--selection-examples", Takes::kNonNegativeInt},
                         {"--batch-size", Takes::kPositiveInt},
                         {"--heldout-fraction", Takes::kNonNegative},
                         {"--seed", Takes::kNonNegativeInt},
                         {"--max-examples", Takes::kNonNegativeInt},
                         {"--threads", Takes::kThreads},
                         {"--deploy-threads", Takes::kThreads},
                         {"--dist-timeout", Takes::kDistTimeout},
                         {"--rank", Takes::kNonNegativeInt},
                         {"--world-size", Takes::kPositiveInt}});
      apply_objective(*a);
      a->opt.fit = asap::parse_fit(a->fit);
      a->opt.targets = asap::parse_targets(a->targets);
      a->opt.budget = asap::parse_budget(a->budget);
      a->opt.model_error = asap::parse_model_error(a->model_error);
      a->opt.zero_parameter = asap::parse_zero_parameter(a->zero_parameter);
      a->opt.candidates = candidates_of(a->features, a->heads);
      const std::vector<std::string> calib = expand_files(a->calib, "--calib");
      // One process, or one rank of a group (docs/distributed.md): every
      // rank computes, rank 0 writes and prints.
      a->opt.comm = join_group(a->dist);
      asap::Communicator* comm = a->opt.comm.get();
      set_rank_threads(a->threads, comm);
      // The operators are timed at the deployment's threads: --deploy-threads,
      // else --threads in one process, else every core (a rank's --threads
      // is its share of the machine, not the deployment's).
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      a->opt.latency_threads = a->deploy_threads > 0    ? a->deploy_threads
                               : a->deploy_threads == 0 ? cores
                               : comm                   ? cores
                               : a->threads > 0         ? a->threads
                                                        : cores;
      const bool lead = !comm || comm->rank() == 0;
      Progress bar(a->quiet || !lead);
      GroupProgress progress(bar, comm);
      progress.set_stage("compile");
      a->opt.progress = [&progress](const asap::ProgressEvent& e) { progress(e); };
      if (!a->quiet && lead)
        a->opt.warn = [&bar](const std::string& w) {
          bar.finish();
          std::cerr << "asapc: warning: " << w << "\n";
        };
      auto res = asap::compile_teacher(a->checkpoint, a->spec, calib, a->opt);
      bar.finish();
      if (lead) asap::write_artifact(a->out, res.artifact);
      res.summary.artifact = a->out;
      CompileReport report;
      std::string html, js;
      if (!a->no_report) {
        std::string stem = a->out;
        for (const char* ext : {".asap.h5", ".h5"})
          if (stem.size() > std::strlen(ext) &&
              stem.compare(stem.size() - std::strlen(ext), std::string::npos, ext) == 0) {
            stem.resize(stem.size() - std::strlen(ext));
            break;
          }
        html = a->report.empty() ? stem + ".report.html" : a->report;
        js = a->report_json.empty() ? stem + ".report.json" : a->report_json;
        progress.set_stage("report");
        report = write_compile_report(res.artifact, res.summary, a->out, a->checkpoint, calib, a->opt, html, js,
                                      std::cerr, a->opt.progress);
        bar.finish();
        res.summary.report = asap::CompileSummary::ReportPaths{html, js};
      }
      if (!lead) {
      } else if (a->json) {
        std::cout << nlohmann::json(res.summary).dump(2) << "\n";  // the file edge
      } else {
        print_summary(res.summary, a->out);
        if (!a->no_report) {
          std::cout << "report: " << html << " (held-out split of the calibration file)\n";
          print_report_lines(report, std::cout);
        }
      }
      asap::finish_process_group(comm);
      return 0;
    };
  });
}

}  // namespace asapc

// asapc verify: compare a compiled artifact against its teacher on held-out
// data; a terminal table, JSON, an HTML report, and thresholds for gating.
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "asap/artifact.h"
#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/compile.h"
#include "asap/error.h"
#include "asap/report.h"
#include "asap/verify.h"
#include "commands.h"
#include "common.h"
#include "report_table.h"

namespace asapc {

namespace {

struct VerifyArgs {
  std::string checkpoint, artifact, report, json_out;
  std::vector<std::string> data;  // files or glob patterns, numbered through in order
  asap::DistOptions dist;
  std::vector<std::string> compare;
  asap::VerifyOptions opt;
  std::string split = "all";
  bool force = false, quiet = false, json = false, no_timing = false;
  int threads = 0;
  double max_attention_error = -1, max_output_rmse = -1, max_col_marginal_error = -1, max_kl = -1;
};

// The examples of compile's split, from the seed and fraction the artifact records.
std::function<bool(int64_t)> split_filter(const asap::Artifact& art, const std::string& path,
                                          const std::string& split) {
  ASAP_CHECK(split == "all" || split == "heldout" || split == "train", "--split must be all, heldout or train, found '",
             split, "'");
  if (split == "all") return {};
  ASAP_CHECK(!art.layers.empty() && !art.layers[0].fit_json.empty(), "artifact '", path,
             "' records no compile options, so its ", split, " split is unknown; use --split all");
  const asap::RecordOptions opts = asap::parse_fit_record(art.layers[0].fit_json).options;
  const uint64_t seed = opts.seed;
  const double frac = opts.heldout_fraction;
  const bool want = split == "heldout";
  return [seed, frac, want](int64_t e) { return asap::in_heldout_split(seed, frac, e) == want; };
}

// The fit its compile used, from the first layer's record ("ls" when the
// artifact holds no compile record).
std::string fit_of(const asap::Artifact& art) {
  if (art.layers.empty() || art.layers[0].fit_json.empty()) return "ls";
  try {
    return asap::parse_fit_record(art.layers[0].fit_json).fit;
  } catch (const asap::Error&) {  // another writer's record
    return "ls";
  }
}

// Every rank must verify the same artifacts against the same checkpoint with
// the same options: compared at start-up, naming the first field that differs.
void check_same_start(asap::Communicator& comm, const VerifyArgs& a, const std::string& ckpt_sha) {
  nlohmann::json arts = nlohmann::json::array();
  arts.push_back(asap::sha256_file(a.artifact));
  for (const auto& p : a.compare) arts.push_back(asap::sha256_file(p));
  const auto& o = a.opt;
  const nlohmann::json mine{{"checkpoint (SHA-256)", ckpt_sha},
                            {"artifacts (SHA-256)", arts},
                            {"verify options",
                             {{"max_closures", o.max_closures},
                              {"batch_size", o.batch_size},
                              {"max_examples", o.max_examples},
                              {"float64", o.float64},
                              {"layers", o.layers},
                              {"split", a.split},
                              {"timing", o.time},
                              {"force", a.force}}}};
  asap::require_same_start(comm, mine.dump(), {{"verify options", "verify option"}},
                           "every rank must verify the same artifacts against the same checkpoint with the same "
                           "options");
}

}  // namespace

void add_verify(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<VerifyArgs>();
  auto* c = app.add_subcommand("verify", "Compare a compiled artifact against its teacher on held-out data");
  c->add_option("checkpoint", a->checkpoint, "teacher checkpoint the artifact was compiled from")->required();
  c->add_option("--artifact", a->artifact, "compiled artifact")->required();
  c->add_option("--data", a->data,
                "held-out data (calibration format); several files or a quoted glob are read as one set")
      ->required();
  c->add_option("--compare", a->compare, "further artifacts of the same teacher to show side by side (e.g. --fit kl)");
  c->add_option("--report", a->report, "write the HTML report here (default: ARTIFACT.verify.html)");
  c->add_option("--json-out", a->json_out, "write the JSON here (default: ARTIFACT.verify.json)");
  c->add_option("--split", a->split,
                "which examples of --data: all, or heldout / train = the split compile used on this file")
      ->capture_default_str();
  c->add_option("--layers", a->opt.layers, "verify only these layers")->delimiter(',');
  c->add_option("--max-closures", a->opt.max_closures, "ASAP evaluated with k = 1..N closures")->capture_default_str();
  c->add_option("--batch-size", a->opt.batch_size, "examples per batch (also the timed batch)")->capture_default_str();
  c->add_option("--max-examples", a->opt.max_examples, "use only the first N examples");
  c->add_option("--repeats", a->opt.repeats, "timing repeats (median)")->capture_default_str();
  c->add_flag("--no-timing", a->no_timing, "skip latency measurements");
  c->add_flag("--float64", a->opt.float64, "compute in float64");
  c->add_option("--max-attention-error", a->max_attention_error,
                "exit 1 when the default operator's attention relative error exceeds this on any layer");
  c->add_option("--max-output-rmse", a->max_output_rmse,
                "exit 1 when the default operator's head output RMSE exceeds this");
  c->add_option("--max-col-marginal-error", a->max_col_marginal_error,
                "exit 1 when the default operator's column marginal error exceeds this");
  c->add_option("--max-kl", a->max_kl, "exit 1 when the default operator's teacher-plan KL exceeds this");
  c->add_flag("--force", a->force, "compare even if the checkpoint digest differs (names and shapes must still match)");
  c->add_option("--threads", a->threads, "threads (default: all cores)");
  c->add_flag("-q,--quiet", a->quiet, "no progress bar");
  c->add_flag("--json", a->json, "print the JSON on stdout instead of the table");
  add_dist_options(c, a->dist);
  c->callback([a, c, &run] {
    run = [a, c] {
      require_values(c, {{"--max-closures", Takes::kPositiveInt},
                         {"--batch-size", Takes::kPositiveInt},
                         {"--max-examples", Takes::kNonNegativeInt},
                         {"--repeats", Takes::kNonNegativeInt},
                         {"--threads", Takes::kThreads},
                         {"--max-attention-error", Takes::kThreshold},
                         {"--max-output-rmse", Takes::kThreshold},
                         {"--max-col-marginal-error", Takes::kThreshold},
                         {"--max-kl", Takes::kThreshold},
                         {"--dist-timeout", Takes::kDistTimeout},
                         {"--rank", Takes::kNonNegativeInt},
                         {"--world-size", Takes::kPositiveInt}});
      a->opt.time = !a->no_timing;
      const std::vector<std::string> files = expand_files(a->data, "--data");
      // One process, or one rank of a group: each rank verifies its share,
      // metrics are summed, rank 0 times, writes and prints.
      a->opt.comm = join_group(a->dist);
      asap::Communicator* comm = a->opt.comm.get();
      set_rank_threads(a->threads, comm);
      const bool lead = !comm || comm->rank() == 0;
      auto ck = asap::load_checkpoint(a->checkpoint);
      if (comm) check_same_start(*comm, *a, ck.sha256);
      asap::CalibFile data(files);
      Progress bar(a->quiet || !lead);
      GroupProgress progress(bar, comm);
      a->opt.progress = [&progress](const asap::ProgressEvent& e) { progress(e); };
      std::vector<std::string> paths{a->artifact};
      paths.insert(paths.end(), a->compare.begin(), a->compare.end());
      std::vector<VerifiedArtifact> all;
      for (const auto& p : paths) {
        progress.set_stage(p);
        auto art = asap::read_artifact(p);
        asap::check_artifact_matches(art, p, ck, a->force);
        a->opt.example_filter = split_filter(art, p, a->split);
        VerifiedArtifact v{asap::verify(art, p, ck, data, a->opt), fit_of(art)};
        all.push_back(std::move(v));
      }
      bar.finish();
      // The file edge: verify's JSON, with the fit and the compared artifacts.
      auto as_json = [](const VerifiedArtifact& v) {
        nlohmann::json j = v.result.to_json();
        j["fit"] = v.fit;
        return j;
      };
      nlohmann::json out = as_json(all[0]);
      if (all.size() > 1) {
        out["compare"] = nlohmann::json::array();
        for (size_t i = 1; i < all.size(); ++i) out["compare"].push_back(as_json(all[i]));
      }
      const std::string html = a->report.empty() ? a->artifact + ".verify.html" : a->report;
      const std::string js = a->json_out.empty() ? a->artifact + ".verify.json" : a->json_out;
      if (lead) {
        asap::write_report(out, html, js, "asapc verify: " + a->artifact, "Held-out data: " + data.path());
        if (a->json)
          std::cout << out.dump(2) << "\n";
        else
          print_verify_table(all, std::cout);
        if (!a->json) std::cout << "report: " << html << "\njson:   " << js << "\n";
      }
      // Thresholds on the default operator of every layer.
      int code = 0;
      for (const asap::LayerVerification& l : all[0].result.layers)
        for (const asap::OperatorResult& o : l.operators) {
          if (!o.is_default) continue;
          const asap::FidelityMetrics& m = o.metrics;
          auto gate = [&](double limit, double v, const char* key, const char* flag) {
            if (limit < 0) return;
            if (v > limit) {
              if (lead)
                std::cerr << "asapc: verify: layer '" << l.name << "' " << key << " " << v << " exceeds " << flag << " "
                          << limit << "\n";
              code = kExitThreshold;
            }
          };
          gate(a->max_attention_error, m.attention_rel_error, "attention_rel_error", "--max-attention-error");
          gate(a->max_output_rmse, m.head_output_rmse, "head_output_rmse", "--max-output-rmse");
          gate(a->max_col_marginal_error, m.col_marginal_error, "col_marginal_error", "--max-col-marginal-error");
          gate(a->max_kl, m.teacher_plan_kl, "teacher_plan_kl", "--max-kl");
        }
      asap::finish_process_group(comm);
      return code;
    };
  });
}

}  // namespace asapc

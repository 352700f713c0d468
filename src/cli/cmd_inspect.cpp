// asapc inspect: checkpoints (tensors, detected layout, a teacher spec),
// artifacts and calibration files.
#include <ATen/core/Tensor.h>

#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "asap/artifact.h"
#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/compile_record.h"
#include "asap/error.h"
#include "asap/spec.h"
#include "commands.h"
#include "common.h"

namespace asapc {

namespace {

struct InspectArgs {
  std::string file;
  int T = 0;
  double eps = 1.0;
  int64_t heads = 0;
  double score_scale = 0;
  std::string mask = "keep_queries";
  std::string out;
  bool json = false;
  bool tensors = false;
};

int inspect_artifact(const InspectArgs& a) {
  auto art = asap::read_artifact(a.file);
  if (a.json) {
    nlohmann::json j{{"format", asap::kArtifactFormat},    {"format_version", art.format_version},
                     {"asapc_version", art.asapc_version}, {"teacher_sha256", art.teacher_sha256},
                     {"teacher_file", art.teacher_file},   {"created_utc", art.created_utc},
                     {"layers", nlohmann::json::array()}};
    for (const auto& l : art.layers)
      j["layers"].push_back({{"name", l.spec.name},
                             {"family", l.family.name()},
                             {"per_head", l.per_head},
                             {"default_closures", l.default_closures},
                             {"T", l.spec.T},
                             {"fit", nlohmann::json::parse(l.fit_json.empty() ? "null" : l.fit_json)}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "asapc artifact '" << a.file << "' (format version " << art.format_version << ", written by asapc "
            << art.asapc_version << " on " << art.created_utc << ")\n"
            << "teacher: " << art.teacher_file << " sha256 " << art.teacher_sha256 << "\n";
  for (const auto& l : art.layers) {
    const auto& s = l.spec;
    std::cout << "\nlayer '" << s.name << "'\n"
              << "  teacher   T=" << s.T << " (" << (s.T % 2 == 0 ? "column" : "row") << "-ending), eps=" << s.eps
              << ", score scale=" << s.score_scale << ", heads=" << s.heads << " x " << s.head_dim
              << ", mask=" << (s.mask == asap::MaskConvention::kKeepQueries ? "keep_queries" : "drop_queries")
              << (s.multiply_by_n ? ", attention = n*plan" : "") << "\n"
              << "  operator  features " << l.family.name() << (l.per_head ? ", per-head" : ", pooled")
              << " coefficients [" << l.coef.size(0) << " x " << l.coef.size(1) << "], " << l.default_closures
              << " closure(s) by default, slice bank " << l.theta.size(1) << "\n"
              << "  weights   " << (l.weights.defined() ? "projections included" : "none (compiled from q/k/v)")
              << (l.weights.wo.defined() ? ", output projection" : "") << "\n";
    std::optional<asap::LayerRecord> f;
    if (!l.fit_json.empty()) try {
        f = asap::parse_fit_record(l.fit_json);
      } catch (const asap::Error&) {  // not compile's record: nothing to summarize
      }
    if (f)
      std::cout << "  fit       " << f->fit << ", ridge " << f->chosen.ridge.value_or(0.0) << ", " << f->train_examples
                << " train / " << f->heldout_examples << " held-out examples, held-out attention error "
                << f->chosen.heldout_attention_error << ", fit time " << human_seconds(f->fit_time_s) << "\n";
  }
  return 0;
}

int inspect_calib(const InspectArgs& a) {
  asap::CalibFile c(a.file);
  std::cout << "calibration file '" << a.file << "'\n";
  for (const auto& name : c.layer_names()) {
    auto i = c.info(name);
    std::cout << "  layer '" << name << "': " << i.N << " examples of n=" << i.n;
    if (i.projected)
      std::cout << ", projected q/k" << (i.has_v ? "/v" : "") << " " << i.heads << " heads x " << i.head_dim;
    else
      std::cout << ", activations d_model=" << i.d_model;
    std::cout << (i.has_mask ? ", key-padding mask" : ", no padding") << "\n";
  }
  return 0;
}

int inspect_checkpoint(const InspectArgs& a) {
  auto ck = asap::load_checkpoint(a.file);
  asap::DetectOptions o;
  o.T = a.T;
  o.eps = a.eps;
  o.heads = a.heads;
  o.score_scale = a.score_scale;
  ASAP_CHECK(a.mask == "keep_queries" || a.mask == "drop_queries",
             "--mask must be keep_queries or drop_queries, found '", a.mask, "'");
  o.mask = a.mask == "keep_queries" ? asap::MaskConvention::kKeepQueries : asap::MaskConvention::kDropQueries;
  auto det = asap::detect_layers(ck, o);
  det.spec.model = ck.path.substr(ck.path.find_last_of('/') + 1);
  nlohmann::json spec;
  asap::to_json(spec, det.spec);
  std::ostream& info = std::cerr;  // stdout carries only the spec, so it can be redirected to a file
  info << "checkpoint '" << a.file << "': " << ck.kind << ", " << ck.names.size() << " tensors"
       << (ck.stripped_prefix.empty() ? "" : ", prefix '" + ck.stripped_prefix + "' stripped") << "\n"
       << "sha256 " << ck.sha256 << "\n";
  if (a.tensors)
    for (const auto& n : ck.names) {
      const auto& t = ck.tensors.at(n);
      info << "  " << std::left << std::setw(48) << n << " " << t.scalar_type() << " " << t.sizes() << "\n";
    }
  if (det.layout_name.empty()) {
    throw asap::Error(
        asap::str("checkpoint '", a.file,
                  "': no attention layer of a known layout found (looked for to_qkv, WQ/WK/WV, fc_q/fc_k/fc_v, "
                  "in_proj_weight, q_proj/k_proj/v_proj); write a teacher spec by hand (docs/teacher-spec.md)"));
  }
  info << "layout: " << det.layout_name << ", " << det.spec.layers.size() << " attention layer(s)\n";
  for (const auto& n : det.notes) info << "note: " << n << "\n";
  if (!det.missing.empty()) {
    std::string m;
    for (const auto& x : det.missing) m += (m.empty() ? "" : "; ") + x;
    if (!a.out.empty())
      throw asap::Error(asap::str("cannot write teacher spec '", a.out, "': the checkpoint does not say ", m));
    info << "missing: the checkpoint does not say " << m << "; the spec below has 0 there\n";
  }
  if (!a.out.empty()) {
    asap::write_spec(a.out, det.spec);
    info << "wrote teacher spec '" << a.out << "'\n";
  } else {
    std::cout << spec.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<InspectArgs>();
  auto* c = app.add_subcommand("inspect",
                               "Describe a checkpoint (and print a teacher spec), an artifact or a calibration file");
  c->add_option("file", a->file, "checkpoint (.pt/.pth/.safetensors), artifact or calibration file")->required();
  c->add_option("--T", a->T, "Sinkhorn budget of the teacher (half-steps, Sinkformer's max_iter)");
  c->add_option("--eps", a->eps, "Sinkhorn entropy")->capture_default_str();
  c->add_option("--heads", a->heads, "number of attention heads");
  c->add_option("--score-scale", a->score_scale, "score scale s (default 1/sqrt(head_dim))");
  c->add_option("--mask", a->mask, "padding convention: keep_queries or drop_queries")->capture_default_str();
  c->add_option("-o,--output", a->out, "write the detected teacher spec to this file");
  c->add_flag("--tensors", a->tensors, "list every tensor of a checkpoint");
  c->add_flag("--json", a->json, "machine-readable output (artifacts)");
  c->callback([a, c, &run] {
    run = [a, c] {
      require_values(c, {{"--T", Takes::kPositiveInt},
                         {"--heads", Takes::kPositiveInt},
                         {"--eps", Takes::kPositive},
                         {"--score-scale", Takes::kPositive}});
      const std::string fmt = asap::hdf5_format_of(a->file);
      if (fmt == asap::kArtifactFormat) return inspect_artifact(*a);
      if (fmt == asap::kCalibFormat) return inspect_calib(*a);
      return inspect_checkpoint(*a);
    };
  });
}

}  // namespace asapc

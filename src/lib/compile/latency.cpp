// Compile phase "latency": the fused operators timed on this machine at the
// deployment shape, or a table from a file.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <fstream>
#include <map>

#include "asap/error.h"
#include "asap/runtime.h"
#include "compile/phases.h"
#include "fast/fast.h"
#include "io/layer_stream.h"
#include "util/timing.h"

namespace asap {

using nlohmann::json;

std::string OperatorConfig::key() const {
  switch (kind) {
    case OperatorKind::kTeacher:
      return "teacher";
    case OperatorKind::kSinkhorn:
      return "sinkhorn-" + std::to_string(steps);
    case OperatorKind::kAsap:
      break;
  }
  return "asap-" + family.name() + "-k" + std::to_string(closures);
}

int OperatorConfig::lse_passes() const {
  switch (kind) {
    case OperatorKind::kTeacher:
    case OperatorKind::kSinkhorn:
      return steps;
    case OperatorKind::kAsap:
      break;
  }
  return family.feature_passes() + closures;
}

namespace {

class TableLatency : public LatencyModel {
 public:
  TableLatency(std::string path, json table) : path_(std::move(path)), table_(std::move(table)) {}
  std::vector<double> measure(const LayerSpec& s, const std::vector<OperatorConfig>& ops) override {
    const json* t = table_.contains(s.name) ? &table_[s.name] : table_.contains("*") ? &table_["*"] : nullptr;
    ASAP_CHECK(t && t->is_object(), "latency table '", path_, "' has no entry for layer '", s.name,
               "' (expected an object under \"", s.name, "\" or \"*\")");
    std::vector<double> out;
    for (const auto& op : ops) {
      const std::string key = op.key();
      ASAP_CHECK(t->contains(key), "latency table '", path_, "' has no latency for operator '", key, "' of layer '",
                 s.name, "'");
      const json& v = (*t)[key];
      ASAP_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0, "latency table '", path_,
                 "': operator '", key, "' of layer '", s.name, "' should be a positive number of seconds, found ",
                 v.dump());
      out.push_back(v.get<double>());
    }
    return out;
  }
  json describe() const override { return {{"source", "table"}, {"file", path_}}; }

 private:
  std::string path_;
  json table_;
};

// Coefficients for timing a family: those of a plausible fitted map (weight
// 1 on its last dual column -- f3, else f1, else alpha; never a score_stats
// column -- or 1/L on every slice when it has none). The time does depend on the values: a dual far
// from any plan (all weights 0.01, as before) gives plans whose tiny entries
// turn subnormal in the output GEMM on real activations, which timed the
// maps on the bundled ViT about 10% slower than the loop of their passes
// while the same maps with fitted coefficients run within 5% of it.
at::Tensor timing_coefficients(const FeatureFamily& fam) {
  at::Tensor c = at::zeros({1, fam.num_columns()}, at::kDouble);
  if (fam.alpha || fam.softmax_dual || fam.sinkhorn_dual3)
    c[0][fam.num_columns() - 1 - fam.stats_columns()] = 1.0;
  else if (fam.slices > 0)
    c.fill_(1.0 / static_cast<double>(fam.slices));
  return c;
}

class MeasuredLatency : public LatencyModel {
 public:
  MeasuredLatency(HeadBatch b, at::Tensor theta) : b_(std::move(b)), theta_(std::move(theta)) {}
  std::vector<double> measure(const LayerSpec& s, const std::vector<OperatorConfig>& ops) override {
    std::vector<CompiledLayer> layers(ops.size());
    std::vector<std::function<void()>> fns;
    for (size_t i = 0; i < ops.size(); ++i) {
      const OperatorConfig& op = ops[i];
      // Every kind through run_layer, as a deployed CompiledModel runs it
      // (the same input checks and NaN-propagation pass for all): timing
      // the loops with run_teacher alone left that pass to the maps only.
      CompiledLayer& L = layers[i];
      L.spec = s;
      if (op.kind != OperatorKind::kAsap) {
        L.kind = op.kind;
        L.sinkhorn_steps = op.kind == OperatorKind::kSinkhorn ? op.steps : 0;
        L.coef = at::zeros({1, 0}, at::kDouble);
        fns.push_back([this, &L] { run_layer(L, b_.q, b_.k, b_.v, b_.mask); });
        continue;
      }
      L.theta = theta_;
      L.family = op.family;
      L.coef = timing_coefficients(op.family);
      L.default_closures = op.closures;
      fns.push_back([this, &L] { run_layer(L, b_.q, b_.k, b_.v, b_.mask); });
    }
    // About 8 ms of timing per operator, 5 to 41 rounds, after one warm-up round.
    const auto t = std::chrono::steady_clock::now();
    for (auto& f : fns) f();
    const double round = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    const int reps = detail::repeats_for(round / static_cast<double>(fns.size()), 0.008, 5, 41);
    return detail::time_round_robin(fns, 1, reps);
  }
  json describe() const override {
    json m = compile_detail::machine_description();
    m["source"] = "measured";
    m["deploy_batch"] = b_.q.size(0);
    m["seq_len"] = b_.q.size(2);
    m["dtype"] = std::string(c10::toString(b_.q.scalar_type()));
    return m;
  }

 private:
  HeadBatch b_;
  at::Tensor theta_;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(line.find_first_not_of(' ', p + 1));
    }
  return "unknown";
}

}  // namespace

std::shared_ptr<LatencyModel> latency_table_from_file(const std::string& path) {
  std::ifstream in(path);
  ASAP_CHECK(in.good(), "latency table '", path, "' cannot be opened");
  json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error(str("latency table '", path, "' is not valid JSON: ", e.what()));
  }
  ASAP_CHECK(j.is_object(), "latency table '", path,
             "' should be a JSON object {layer or \"*\": {operator: seconds}}, found ", j.type_name());
  return std::make_shared<TableLatency>(path, std::move(j));
}

namespace compile_detail {

json machine_description() {
  return {{"cpu", cpu_model()}, {"isa", fast::isa_for()}, {"threads", at::get_num_threads()}};
}

std::shared_ptr<LatencyModel> measured_latency(const LayerStream& stream, const LayerSpec& s, const at::Tensor& theta,
                                               const std::vector<int64_t>& examples, int64_t deploy_batch) {
  ASAP_CHECK(deploy_batch >= 1, "--deploy-batch must be at least 1, found ", deploy_batch);
  ASAP_CHECK(!examples.empty(), "layer '", s.name, "': no examples to time the operators on");
  // deploy_batch examples, repeating the available ones when there are fewer.
  std::vector<int64_t> idx(
      examples.begin(), examples.begin() + static_cast<std::ptrdiff_t>(
                                               std::min<size_t>(examples.size(), static_cast<size_t>(deploy_batch))));
  auto b = stream.read_indices(idx);
  if (b.q.size(0) < deploy_batch) {
    std::vector<int64_t> rep;
    for (int64_t i = 0; i < deploy_batch; ++i) rep.push_back(i % b.q.size(0));
    auto ix = at::tensor(rep, at::kLong);
    b.q = b.q.index_select(0, ix);
    b.k = b.k.index_select(0, ix);
    b.v = b.v.index_select(0, ix);
    if (b.mask.defined()) b.mask = b.mask.index_select(0, ix);
  }
  b.q = b.q.contiguous();
  b.k = b.k.contiguous();
  b.v = b.v.contiguous();
  return std::make_shared<MeasuredLatency>(std::move(b), theta);
}

}  // namespace compile_detail
}  // namespace asap

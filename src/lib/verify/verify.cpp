// The compiled operator against its teacher: metrics of section 7 and
// latencies, for ASAP with k closures and reduced-budget Sinkhorn.
#include "asap/verify.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/dist.h"
#include "asap/error.h"
#include "asap/features.h"
#include "asap/layer.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "io/layer_stream.h"
#include "util/select.h"
#include "util/timing.h"

namespace asap {

using nlohmann::json;

namespace {

bool is_asap_layer(const CompiledLayer& L) { return L.kind == OperatorKind::kAsap; }

json metrics_json(const FidelityMetrics& m) {
  return json{{"attention_rel_error", m.attention_rel_error},
              {"head_output_rmse", m.head_output_rmse},
              {"layer_output_rmse", m.layer_output_rmse},
              {"row_marginal_error", m.row_marginal_error},
              {"col_marginal_error", m.col_marginal_error},
              {"teacher_plan_kl", m.teacher_plan_kl},
              {"teacher_plan_kl_floored", m.teacher_plan_kl_floored},
              {"plan_zero_share", m.plan_zero_share},
              {"dual_rmse", m.dual_rmse},
              {"terms", m.terms}};
}

// One layer's operators, timed once every layer is verified: its first batch,
// its teacher and reduced-budget loops as stored layers, and one call per
// operator in the order of LayerVerification::operators.
struct LayerTiming {
  size_t layer = 0;  // index into VerifyResult::layers
  HeadBatch batch;
  std::vector<CompiledLayer> loops;
  std::vector<std::function<void()>> fns;
};

int64_t batch_bytes(const HeadBatch& b) {
  int64_t n = 0;
  for (const at::Tensor* t : {&b.q, &b.k, &b.v, &b.mask})
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  return n;
}
constexpr int64_t kMaxKeptTimingBytes = int64_t{256} << 20;

// Every layer's operators in one round-robin, so that a stretch in which
// the machine runs slower (another process, a busy neighbour of a virtual
// machine) hits every layer alike: timed layer by layer, two identical
// layers of the bundled ViT came out at 1.23x and 1.30x in one run. Then
// the break-even call counts, which need the latencies.
// Empties `timings`.
void time_layers(std::vector<std::unique_ptr<LayerTiming>>& timings, const VerifyOptions& opt, VerifyResult& res) {
  if (timings.empty()) return;
  std::vector<std::vector<std::function<void()>>> groups;
  size_t count = 0;
  for (const auto& t : timings) groups.push_back(t->fns), count += t->fns.size();
  const std::function<double()> now = opt.clock ? opt.clock : detail::steady_seconds;
  int repeats = opt.repeats;
  if (repeats <= 0) {  // about 50 ms of timing per operator, 5 to 41 rounds
    const double t0 = now();
    for (const auto& g : groups)
      for (const auto& f : g) f();
    const double round = now() - t0;
    repeats = detail::repeats_for(round / static_cast<double>(count), 0.05, 5, 41);
  }
  const auto lat = detail::time_groups_round_robin(groups, opt.warmup, repeats, now);
  for (size_t g = 0; g < timings.size(); ++g) {
    LayerVerification& lv = res.layers[timings[g]->layer];
    for (size_t i = 0; i < lv.operators.size(); ++i) lv.operators[i].latency_s = lat[g][i];
    const OperatorResult& teacher = lv.operators[0];
    const OperatorResult* def = &teacher;
    for (const auto& o : lv.operators)
      if (o.is_default) def = &o;
    if (lv.fit_time_s > 0 && teacher.latency_s > def->latency_s)
      lv.break_even_calls = lv.fit_time_s / (teacher.latency_s - def->latency_s);
  }
  timings.clear();
}

}  // namespace

ModelVerification VerifyResult::model() const {
  ModelVerification m;
  double t = 0, d = 0;
  bool timed = !layers.empty();
  for (const auto& l : layers) {
    double lt = -1, ld = -1, err = -1, softmax = -1;
    for (const auto& o : l.operators) {
      if (o.kind == "teacher") lt = o.latency_s;
      if (o.is_default) ld = o.latency_s, err = o.metrics.attention_rel_error;
      if (o.kind == "sinkhorn" && o.steps == 1) softmax = o.metrics.attention_rel_error;
    }
    timed = timed && lt > 0 && ld > 0;
    t += lt;
    d += ld;
    const double norm = softmax > 0 ? err / softmax : err;
    if (err >= 0 && norm > m.worst_normalized) m.worst_normalized = norm, m.worst_error = err, m.worst_layer = l.name;
  }
  if (timed) m.teacher_latency_s = t, m.latency_s = d, m.speedup = t / d;
  return m;
}

json VerifyResult::to_json() const {
  json j{{"artifact", artifact},
         {"checkpoint", checkpoint},
         {"data", data},
         {"timed_batch", timed_batch},
         {"layers", json::array()}};
  for (const auto& l : layers) {
    json ops = json::array();
    for (const auto& o : l.operators)
      ops.push_back({{"kind", o.kind},
                     {"steps", o.steps},
                     {"lse_passes", o.lse_passes},
                     {"default", o.is_default},
                     {"teacher_ending", o.teacher_ending},
                     {"latency_s", o.latency_s},
                     {"metrics", metrics_json(o.metrics)}});
    j["layers"].push_back({{"name", l.name},
                           {"T", l.T},
                           {"ending", l.T % 2 == 0 ? "column" : "row"},
                           {"default_closures", l.default_closures},
                           {"default_operator", l.default_operator},
                           {"examples", l.examples},
                           {"operators", ops},
                           {"per_head_attention_error", l.per_head_attention_error},
                           {"dual_scatter", {{"predicted", l.dual_pred}, {"teacher", l.dual_teacher}}},
                           {"fit_time_s", l.fit_time_s},
                           {"break_even_calls", l.break_even_calls},
                           {"fit", l.fit}});
  }
  const ModelVerification m = model();
  j["model"] = {{"teacher_latency_s", m.teacher_latency_s},
                {"latency_s", m.latency_s},
                {"speedup", m.speedup},
                {"worst_layer", m.worst_layer},
                {"worst_error", m.worst_error},
                {"worst_normalized", m.worst_normalized}};
  return j;
}

void check_artifact_matches(const Artifact& art, const std::string& path, const Checkpoint& ck, bool force) {
  if (art.teacher_sha256 != ck.sha256 && !force)
    throw Error(str("artifact '", path, "' was compiled from a checkpoint with SHA-256 ",
                    art.teacher_sha256.substr(0, 16), "... ('", art.teacher_file, "') but '", ck.path, "' has ",
                    ck.sha256.substr(0, 16), "...: pass the matching checkpoint, or --force to compare anyway"));
  for (const auto& l : art.layers) {
    const auto& s = l.spec;
    TeacherSpec one;
    one.layers.push_back(s);
    // Same tensors, same shapes: validate_spec names the field that differs.
    validate_spec(one, ck, str("artifact '", path, "'"));
  }
}

VerifyResult verify(const Artifact& art, const std::string& artifact_path, const Checkpoint& ck, const CalibFile& data,
                    const VerifyOptions& opt) {
  VerifyResult res;
  res.artifact = artifact_path;
  res.checkpoint = ck.path;
  res.data = data.path();
  const std::vector<const CompiledLayer*> layers = detail::select_by_name(
      art.layers, opt.layers, [](const CompiledLayer& l) { return l.spec.name; },
      [&](const std::string& n) { return str("artifact '", artifact_path, "' has no layer '", n, "'"); });
  std::vector<std::unique_ptr<LayerTiming>> timings;
  int64_t pending_bytes = 0;
  for (const CompiledLayer* L : layers) {
    const LayerSpec& s = L->spec;
    const Convention conv = convention_of(s);
    LayerWeights w = s.layout == ProjLayout::kNone ? LayerWeights() : load_layer_weights(s, ck);
    LayerStream stream(data, s, w, opt.float64, 0);
    Communicator* comm = opt.comm.get();
    const Shards sh = make_shards(comm, data, stream.num_examples(), 0);
    stream.set_first_example(sh.readable_begin);
    std::vector<int64_t> all;
    for (int64_t e = 0; e < sh.total; ++e)
      if (!opt.example_filter || opt.example_filter(e)) {
        all.push_back(e);
        if (opt.max_examples > 0 && static_cast<int64_t>(all.size()) >= opt.max_examples) break;
      }
    ASAP_CHECK(!all.empty(), "data file '", data.path(), "': layer '", s.name, "' has no examples to verify on");
    const std::vector<int64_t> idx = sh.mine(all);  // this rank's share (all of them in one process)

    LayerVerification lv;
    lv.name = s.name;
    lv.T = s.T;
    lv.default_closures = is_asap_layer(*L) ? L->default_closures : 0;
    lv.default_operator = L->describe();
    lv.examples = static_cast<int64_t>(all.size());
    if (!L->fit_json.empty()) {
      lv.fit = json::parse(L->fit_json);
      try {
        lv.record = parse_fit_record(L->fit_json);
        lv.fit_time_s = lv.record->fit_time_s;
      } catch (const Error&) {  // not compile's record: shown as stored, no compile section
      }
    }
    const bool is_asap = L->kind == OperatorKind::kAsap;
    const int K = is_asap ? std::max(opt.max_closures, L->default_closures) : 0;
    const int Tmax = opt.reduced_budgets ? s.T - 1 : L->kind == OperatorKind::kSinkhorn ? L->sinkhorn_steps : 0;
    MetricsAccumulator teacher_acc;
    std::vector<MetricsAccumulator> asap_acc(K), sink_acc(std::max(0, Tmax));
    std::vector<double> head_num(s.heads, 0.0);
    double head_terms = 0;
    const bool has_out = w.defined();
    HeadBatch timed;
    for (size_t i = 0; i < idx.size(); i += static_cast<size_t>(opt.batch_size)) {
      std::vector<int64_t> part(idx.begin() + i,
                                idx.begin() + std::min(idx.size(), i + static_cast<size_t>(opt.batch_size)));
      auto b = stream.read_indices(part);
      if (!timed.q.defined()) timed = b;
      const int64_t B = b.q.size(0), n = b.q.size(2);
      auto m = log_marginals(b.mask, B, n, conv.drop_padded_queries, b.q.scalar_type(), b.q.device());
      auto t = run_teacher(b.q, b.k, b.v, b.mask, s.score_scale, s.T, conv, true);
      at::Tensor Y = has_out ? merge_heads(s, w, t.O) : at::Tensor();
      auto add = [&](MetricsAccumulator& acc, const at::Tensor& A, const at::Tensor& O) {
        acc.add_attention(A, t.A, m, conv.multiply_by_n);
        acc.add_head_outputs(O, t.O);
        if (has_out) acc.add_layer_outputs(merge_heads(s, w, O), Y);
      };
      add(teacher_acc, t.A, t.O);
      // The default operator's per-head attention error (the teacher's is 0).
      auto add_heads = [&](const at::Tensor& A) {
        auto A64 = A.to(at::kDouble), T64 = t.A.to(at::kDouble);
        auto rel =
            ((A64 - T64).pow(2).sum(at::IntArrayRef{-2, -1}).sqrt() / T64.pow(2).sum(at::IntArrayRef{-2, -1}).sqrt())
                .sum(0);  // [H]
        for (int64_t h = 0; h < s.heads; ++h) head_num[h] += rel[h].item<double>();
        head_terms += static_cast<double>(B);
      };
      if (L->kind == OperatorKind::kTeacher) add_heads(t.A);
      // Sinkhorn with reduced budgets T' = 1..T-1 on the same projections.
      for (int Tp = 1; Tp <= Tmax; ++Tp) {
        auto r = run_teacher(b.q, b.k, b.v, b.mask, s.score_scale, Tp, conv, true);
        add(sink_acc[Tp - 1], r.A, r.O);
        if (L->kind == OperatorKind::kSinkhorn && Tp == L->sinkhorn_steps) add_heads(r.A);
      }
      if (opt.progress)
        opt.progress({s.name, "verify", static_cast<int64_t>(i + part.size()), static_cast<int64_t>(all.size())});
      if (!is_asap) continue;
      // ASAP with k = 1..K closures from the predicted dual.
      auto S = scores(b.q, b.k, s.score_scale);
      auto Psi = build_features(b.q, b.k, m, L->theta, L->family, s.score_scale, s.eps, S);
      auto phi = predict_phi(Psi, L->coef);
      auto f_hat = dual_from_phi(phi, cost_alpha(b.q, s.score_scale), m);
      for_each_closure(S, f_hat, m, s.eps, K, [&](int k, const at::Tensor& f, const at::Tensor& g) {
        auto A = plan_attention(S, f, g, conv);
        add(asap_acc[k - 1], A, at::matmul(A, b.v));
        asap_acc[k - 1].add_dual(phi, t.phi_bar_star, m);
        if (k == L->default_closures) add_heads(A);
      });
      // Scatter sample of predicted vs teacher duals.
      if (static_cast<int64_t>(lv.dual_pred.size()) < opt.scatter_points) {
        auto rows = m.row_active.expand_as(phi).reshape(-1);
        auto p = phi.reshape(-1).index({rows}).to(at::kDouble).contiguous();
        auto q = t.phi_bar_star.reshape(-1).index({rows}).to(at::kDouble).contiguous();
        for (int64_t r = 0; r < p.numel() && static_cast<int64_t>(lv.dual_pred.size()) < opt.scatter_points; ++r) {
          lv.dual_pred.push_back(p.data_ptr<double>()[r]);
          lv.dual_teacher.push_back(q.data_ptr<double>()[r]);
        }
      }
    }
    if (comm) {  // one reduction of every accumulator and the per-head sums
      std::vector<double> v;
      teacher_acc.append_sums(v);
      for (const auto& a : asap_acc) a.append_sums(v);
      for (const auto& a : sink_acc) a.append_sums(v);
      v.insert(v.end(), head_num.begin(), head_num.end());
      v.push_back(head_terms);
      comm->allreduce_sum(v);
      size_t o = 0;
      teacher_acc.load_sums(v, o);
      for (auto& a : asap_acc) a.load_sums(v, o);
      for (auto& a : sink_acc) a.load_sums(v, o);
      for (auto& h : head_num) h = v[o++];
      head_terms = v[o];
    }
    // Latencies on the first batch, from per-head q, k, v to head outputs
    // (rank 0's, in a distributed verify), timed after the last layer.
    // The teacher and the loops run through run_layer as a deployed model
    // runs a layer that stores them (with its input checks and NaN pass),
    // as compile times them: run_teacher alone left that pass to the maps,
    // which made them look 2-3% slower at n = 17 than compile measured.
    res.timed_batch = timed.q.defined() ? timed.q.size(0) : 0;
    auto tm = std::make_unique<LayerTiming>();
    tm->layer = res.layers.size();
    tm->batch = timed;
    tm->loops.resize(static_cast<size_t>(Tmax) + 1);
    for (int t = 0; t <= Tmax; ++t) {
      CompiledLayer& c = tm->loops[static_cast<size_t>(t)];
      c.spec = L->spec;
      c.kind = t == 0 ? OperatorKind::kTeacher : OperatorKind::kSinkhorn;
      c.sinkhorn_steps = t;
      c.coef = at::zeros({1, 0}, at::kDouble);
    }
    const LayerTiming* tp = tm.get();
    auto run_loop = [tp](int t) {
      const HeadBatch& b = tp->batch;
      run_layer(tp->loops[static_cast<size_t>(t)], b.q, b.k, b.v, b.mask);
    };
    lv.operators.push_back({"teacher", s.T, s.T, L->kind == OperatorKind::kTeacher, true, teacher_acc.result(), -1});
    tm->fns.push_back([run_loop] { run_loop(0); });
    for (int k = 1; k <= K; ++k) {
      lv.operators.push_back({"asap", k, lse_passes(L->family, k), k == L->default_closures,
                              (k % 2 == 1) == (s.T % 2 == 0), asap_acc[k - 1].result(), -1});
      tm->fns.push_back([tp, L, k] {
        RunOptions ro;
        ro.closures = k;
        const HeadBatch& b = tp->batch;
        run_layer(*L, b.q, b.k, b.v, b.mask, ro);
      });
    }
    for (int Tp = 1; Tp <= Tmax; ++Tp) {
      lv.operators.push_back({"sinkhorn", Tp, Tp, L->kind == OperatorKind::kSinkhorn && Tp == L->sinkhorn_steps,
                              (Tp % 2) == (s.T % 2), sink_acc[Tp - 1].result(), -1});
      tm->fns.push_back([run_loop, Tp] { run_loop(Tp); });
    }
    if (opt.time && timed.q.defined() && (!comm || comm->rank() == 0)) {
      pending_bytes += batch_bytes(timed);
      timings.push_back(std::move(tm));
    }
    for (int64_t h = 0; h < s.heads; ++h)
      lv.per_head_attention_error.push_back(head_terms > 0 ? head_num[h] / head_terms : 0);
    res.layers.push_back(std::move(lv));
    // Large models: the kept batches stay within kMaxKeptTimingBytes, the
    // layers timed in groups.
    if (pending_bytes > kMaxKeptTimingBytes) time_layers(timings, opt, res), pending_bytes = 0;
  }
  time_layers(timings, opt, res);
  return res;
}

}  // namespace asap

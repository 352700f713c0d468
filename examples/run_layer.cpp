// Loading a compiled artifact and running its layers from C++ inference code.
//
//   asap_example model.asap.h5
//
// For every layer: a whole attention layer on activations x [B, n, d_model]
// (projections, the compiled operator, the output projection), then the
// head-level call on per-head q, k, v with a key-padding mask and an
// explicit number of closures.
#include <ATen/ATen.h>
#include <asap/runtime.h>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: asap_example ARTIFACT\n";
    return 2;
  }
  try {
    auto model = asap::CompiledModel::load(argv[1]);  // validated, immutable, thread-safe
    for (const auto& name : model->layer_names()) {
      const auto& L = model->layer(name);
      const auto& s = L.spec;
      const int64_t B = 2, n = 10;
      at::manual_seed(0);
      if (L.weights.defined()) {
        auto x = at::randn({B, n, s.d_model});
        auto y = model->forward(name, x);  // default closures
        std::cout << name << ": forward " << x.sizes() << " -> " << y.sizes() << "\n";
      }
      auto q = at::randn({B, s.heads, n, s.head_dim}), k = at::randn({B, s.heads, n, s.head_dim});
      auto v = at::randn({B, s.heads, n, s.value_dim});
      auto mask = at::ones({B, n}, at::kBool);
      mask[1].slice(0, 7).fill_(false);  // the second sequence has 7 tokens
      asap::RunOptions opt;
      opt.closures = 1;  // ASAP-0
      opt.return_attention = true;
      auto r = model->attend(name, q, k, v, mask, opt);
      auto cols = r.attention.sum(-2);  // after one column closure every active column sums to 1
      std::cout << name << ": attend k=1 " << r.out.sizes() << ", max |column sum - 1| on active keys "
                << (cols[0] - 1).abs().max().item<float>() << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "asap_example: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

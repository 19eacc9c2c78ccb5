// mla_model_bench: decoding speed of the decoder-only model with each cached attention (docs/ATTENTION.md, "In the
// models: MLA and linear attention"). float32, 1 thread, batch 1:
//   mla_model_bench [tokens reps D H layers]   (defaults 256 5 256 4 4)
// builds CausalLM models of `layers` blocks, width D, H heads, d_ff 4 D, vocab 64, max_len 512, all from the same
// seed, in eval mode, and greedily decodes `tokens` tokens after an 8-token prompt through begin_decode /
// decode_step with the cache (the prefill included) for
//   mha           MultiheadAttention with its key/value cache,
//   mla-absorbed  MultiHeadLatentAttention's latent cache, absorbed path (the model's default),
//   mla-plain     the same cache, plain path (set_mla_absorbed_decode(false)),
//   linear        linear attention's running sums.
// MLA with the model's defaults: kv_rank D / 4, rope_dim = head size / 2. Sides rotate within each repetition;
// prints per side the median time per generated token over `reps` runs and kv_cache_bytes_per_token() (per block),
// one JSON line each.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "autograd/parallel.h"
#include "nn/models.h"

using namespace attograd;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Greedy decoding of `tokens` tokens; returns the last token (a checksum against dead-code elimination).
int64_t decode(nn::CausalLM& m, int64_t tokens) {
  NoGradGuard no_grad;
  nn::DecodeState st = m.begin_decode({{5, 6, 7, 8, 9, 10, 11, 12}});  // prompt of 8 with SEP: 9 positions
  for (int64_t t = 0; t < tokens; ++t) {
    const Tensor logits = m.decode_step(st);  // (1, V)
    const float* l = logits.data<float>();
    st.decoded[0].push_back(static_cast<int64_t>(std::max_element(l, l + logits.size(1)) - l));
  }
  return st.decoded[0].back();
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int64_t tokens = arg(1, 256), reps = arg(2, 5), D = arg(3, 256), H = arg(4, 4), layers = arg(5, 4);
  set_num_threads(1);
  auto make = [&](const nn::AttentionSpec& a) {
    Generator gen(1);
    auto m = std::make_shared<nn::CausalLM>(nn::CausalLMOptions{.vocab = 64,
                                                                .d_model = D,
                                                                .n_head = H,
                                                                .d_ff = 4 * D,
                                                                .n_layers = layers,
                                                                .dropout = 0.0,
                                                                .max_len = 512,
                                                                .attention = a},
                                            gen);
    m->eval();
    return m;
  };
  auto mha = make({}), mla = make({.kind = "mla"}), mla_plain = make({.kind = "mla"}),
       linear = make({.kind = "linear"});
  mla_plain->set_mla_absorbed_decode(false);
  struct Side {
    std::string name;
    std::shared_ptr<nn::CausalLM> model;
  };
  const std::vector<Side> sides = {{"mha", mha}, {"mla-absorbed", mla}, {"mla-plain", mla_plain}, {"linear", linear}};
  int64_t sink = 0;
  for (const Side& s : sides) sink += decode(*s.model, tokens);  // warm-up
  std::vector<std::vector<double>> times(sides.size());
  for (int64_t r = 0; r < reps; ++r)
    for (size_t i = 0; i < sides.size(); ++i) {
      const size_t k = (i + static_cast<size_t>(r)) % sides.size();  // rotate the order every repetition
      const double t0 = now();
      sink += decode(*sides[k].model, tokens);
      times[k].push_back((now() - t0) / static_cast<double>(tokens));
    }
  for (size_t i = 0; i < sides.size(); ++i)
    std::printf(
        "{\"side\": \"%s\", \"tokens\": %lld, \"D\": %lld, \"H\": %lld, \"layers\": %lld, \"us_per_token\": %.1f, "
        "\"cache_bytes_per_token_per_block\": %lld%s}\n",
        sides[i].name.c_str(), static_cast<long long>(tokens), static_cast<long long>(D), static_cast<long long>(H),
        static_cast<long long>(layers), 1e6 * median(times[i]),
        static_cast<long long>(sides[i].model->kv_cache_bytes_per_token()),
        sides[i].name == "linear" ? ", \"note\": \"linear: bytes per row, whatever the length\"" : "");
  std::fprintf(stderr, "(checksum %lld)\n", static_cast<long long>(sink));
  return 0;
}

// mla_bench: the decoding measurements of docs/ATTENTION.md (MLA). One attention layer, B rows, float32, 1 thread:
//   mla_bench [L B reps D H]   (defaults 512 1 7 256 4)
// decodes L tokens one at a time (positions 0 .. L-1, each step attending to every earlier position) through
//   mha       nn::MultiheadAttention with the key/value cache of nn/attention.h (decode_linear of in_proj,
//             write_kv_cache, cached_attention, decode_linear of out_proj: CausalLMBlock::forward_cached's
//             attention part),
//   absorbed  nn::MultiHeadLatentAttention::decode(absorbed = true),
//   plain     nn::MultiHeadLatentAttention::decode(absorbed = false),
// MLA with qk_nope_head_dim = v_head_dim = D / H, qk_rope_head_dim = D / (2 H), kv_lora_rank = D / 4, no query
// compression. Sides alternate within each repetition; prints per side the median time per token over `reps`
// runs and the cache bytes per token, one JSON line each.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autograd/parallel.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/mla.h"

using namespace attograd;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int64_t L = arg(1, 512), B = arg(2, 1), reps = arg(3, 7), D = arg(4, 256), H = arg(5, 4);
  set_num_threads(1);
  Generator gen(1);
  nn::MultiheadAttention mha({.embed_dim = D, .num_heads = H}, gen);
  mha.eval();
  nn::MultiHeadLatentAttention mla({.d_model = D,
                                    .n_heads = H,
                                    .qk_nope_head_dim = D / H,
                                    .qk_rope_head_dim = D / (2 * H),
                                    .v_head_dim = D / H,
                                    .kv_lora_rank = D / 4},
                                   gen);
  mla.eval();
  Tensor x = rand({B, L, D}, gen);
  std::vector<Tensor> tokens;
  for (int64_t t = 0; t < L; ++t) tokens.push_back(narrow(x, 1, t, 1));  // (B, 1, D) each, made once
  NoGradGuard no_grad;
  const int64_t hd = D / H;
  double sink = 0;

  auto run_mha = [&] {
    auto [key, value] = nn::make_kv_cache(B, H, L, hd, hd, kFloat32);
    nn::CachedAttentionRows rows{std::vector<int64_t>(B), std::vector<int64_t>(B, 0), std::vector<int64_t>(B, 1)};
    for (int64_t b = 0; b < B; ++b) rows.cache_row[b] = b;
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t b = 0; b < B; ++b) rows.start[b] = t;
      Tensor qkv = nn::decode_linear(tokens[t], mha.in_proj_weight, mha.in_proj_bias);  // (B, 1, 3D)
      nn::write_kv_cache(key, value, qkv, D, qkv, 2 * D, rows);
      Tensor heads = nn::cached_attention(qkv, 0, key, value, rows, 1.0 / std::sqrt(static_cast<double>(hd)), true);
      Tensor y = nn::decode_linear(heads, mha.out_proj->weight, mha.out_proj->bias);
      sink += y.data<float>()[0];
    }
  };
  auto run_mla = [&](bool absorbed) {
    nn::MlaCache cache = mla.make_latent_cache(B, L);
    for (int64_t t = 0; t < L; ++t) sink += mla.decode(tokens[t], cache, t, absorbed).data<float>()[0];
  };
  const std::vector<std::pair<std::string, std::function<void()>>> sides = {
      {"mha", run_mha}, {"absorbed", [&] { run_mla(true); }}, {"plain", [&] { run_mla(false); }}};
  std::vector<std::vector<double>> times(sides.size());
  for (auto& [name, f] : sides) f();  // warm-up
  for (int64_t r = 0; r < reps; ++r)
    for (size_t i = 0; i < sides.size(); ++i) {
      const size_t k = (i + static_cast<size_t>(r)) % sides.size();  // rotate the order every repetition
      const double t0 = now();
      sides[k].second();
      times[k].push_back((now() - t0) / static_cast<double>(L));
    }
  const int64_t mha_bytes = 2 * D * 4, mla_bytes = mla.cache_bytes_per_token();
  for (size_t i = 0; i < sides.size(); ++i)
    std::printf(
        "{\"side\": \"%s\", \"L\": %lld, \"B\": %lld, \"D\": %lld, \"H\": %lld, \"kv_lora_rank\": %lld, "
        "\"rope_dim\": %lld, \"us_per_token\": %.2f, \"cache_bytes_per_token\": %lld}\n",
        sides[i].first.c_str(), static_cast<long long>(L), static_cast<long long>(B), static_cast<long long>(D),
        static_cast<long long>(H), static_cast<long long>(D / 4), static_cast<long long>(D / (2 * H)),
        1e6 * median(times[i]), static_cast<long long>(i == 0 ? mha_bytes : mla_bytes));
  std::fprintf(stderr, "(checksum %g)\n", sink);
  return 0;
}

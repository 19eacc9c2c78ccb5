// An attention variant of one's own through the attention-layer interface (nn/attention_layer.h): RelPosAttention,
// multi-head softmax attention with a LEARNED per-head linear relative-position bias (ALiBi's form, Press et al.
// 2022, with its geometric slopes as the initial values, trained with the rest):
//
//   scores_h[i, j] = q_h[i] . k_h[j] / sqrt(d) - slope_h * (i - j)      (j <= i; causal)
//   out = out_proj(concat_h softmax(scores_h) v_h)
//
// written entirely outside the library as a class, with its own decoding cache (keys and values per row), and
// registered as the kind "relpos" with nn::register_attention. Nothing in the library knows it: the decoder-only
// model builds it by AttentionSpec::kind, train::Trainer trains it on the built-in reverse task, greedy decoding
// runs from its cache, and the gradcheck registry checks the whole model with it in float64.
//
// Usage: custom_attention [steps]   (exit status 1 unless it reaches 99% exact accuracy, decoding from its cache
//                                    gives the recomputed tokens, and the float64 gradcheck passes)

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "autograd/activation.h"
#include "autograd/elementwise.h"
#include "autograd/matmul.h"
#include "autograd/shape.h"
#include "nn/attention_layer.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "train/decode.h"
#include "train/tools/gradcheck_suite.h"
#include "train/trainer.h"

using namespace attograd;

// Its decoding state: the keys and values of every cached position, per row.
struct RelPosCache : nn::AttentionCache {
  Tensor key, value;  // (B, H, C, d)
  int64_t capacity() const override { return key.size(2); }
  int64_t bytes() const override { return 2 * key.numel() * static_cast<int64_t>(dtype_size(key.dtype())); }
};

class RelPosAttention : public nn::AttentionLayer {
 public:
  RelPosAttention(int64_t D, int64_t H, Generator& gen) : D_(D), H_(H), d_(D / H) {
    // Parameters as torch.nn.MultiheadAttention's (out_proj drawn first), plus the slopes.
    out_proj = register_module("out_proj", std::make_shared<nn::Linear>(D, D, true, gen));
    in_proj_weight = register_parameter("in_proj_weight", zeros({3 * D, D}));
    in_proj_bias = register_parameter("in_proj_bias", zeros({3 * D}));
    std::vector<float> s;
    for (int64_t h = 0; h < H; ++h) s.push_back(std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / static_cast<float>(H)));
    slopes = register_parameter("slopes", from_vector(s, {H}));
    NoGradGuard no_grad;
    nn::init::xavier_uniform_(in_proj_weight, 1.0, gen);
    nn::init::zeros_(out_proj->bias);
  }
  std::string type_name() const override { return "RelPosAttention"; }

  // x (B, L, D) -> (B, L, D)
  nn::AttentionOutput forward(const Tensor& x, const nn::AttentionCall& call) override {
    ATTO_CHECK(!call.key_padding_mask.defined() && !call.need_entropy, "RelPosAttention",
               "takes no key padding mask and reports no entropies");
    const int64_t B = x.size(0), L = x.size(1);
    const std::vector<Tensor> qkv = split(linear(x, in_proj_weight, in_proj_bias), D_, 2);  // 3 x (B, L, D)
    auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, L, H_, d_}), 1, 2); };  // (B, H, L, d)
    const Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    // The bias's distances (L, L): -(i - j) where j <= i (0 above the diagonal), and the causal mask apart, so that
    // the slopes' gradient never meets an infinity.
    std::vector<double> dist(static_cast<size_t>(L * L), 0.0), mask(static_cast<size_t>(L * L), 0.0);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) {
        if (j <= i) dist[static_cast<size_t>(i * L + j)] = -static_cast<double>(i - j);
        if (j > i && call.is_causal) mask[static_cast<size_t>(i * L + j)] = -INFINITY;
      }
    const Tensor distances = from_vector(dist, {L, L}, {.dtype = x.dtype()});
    const Tensor causal = from_vector(mask, {L, L}, {.dtype = x.dtype()});
    const Tensor bias = mul(reshape(slopes, {H_, 1, 1}), distances);  // (H, L, L)
    const Tensor scores = matmul(q, transpose(k, 2, 3)) * (1.0 / std::sqrt(static_cast<double>(d_))) + bias + causal;
    const Tensor p = softmax(scores, -1);  // (B, H, L, L)
    const Tensor out = reshape(transpose(matmul(p, v), 1, 2), {B, L, D_});
    return {.output = out_proj->forward(out), .weights = call.need_weights ? p.detach() : Tensor()};
  }
  using nn::AttentionLayer::forward;

  std::shared_ptr<nn::AttentionCache> make_cache(int64_t B, int64_t C) const override {
    auto c = std::make_shared<RelPosCache>();
    c->key = zeros({B, H_, C, d_}, {.dtype = in_proj_weight.dtype()});
    c->value = zeros({B, H_, C, d_}, {.dtype = in_proj_weight.dtype()});
    return c;
  }

  // x (A, N, D): row a's first rows.count[a] positions are rows.start[a] + i of cache row rows.cache_row[a].
  Tensor forward_cached(const Tensor& x, nn::AttentionCache& cache_in, const nn::CachedAttentionRows& rows) override {
    auto& cache = dynamic_cast<RelPosCache&>(cache_in);
    const int64_t A = x.size(0), N = x.size(1), C = cache.capacity();
    const Tensor qkv = linear(x, in_proj_weight, in_proj_bias);  // (A, N, 3D)
    Tensor heads = zeros({A, N, D_}, {.dtype = x.dtype()});       // padding positions stay 0
    auto run = [&]<typename T>() {
      const T* in = qkv.data<T>();
      const T* slope = slopes.data<T>();
      T* K = cache.key.data<T>();
      T* V = cache.value.data<T>();
      T* o = heads.data<T>();
      std::vector<double> w(static_cast<size_t>(C));
      for (int64_t a = 0; a < A; ++a) {
        const int64_t row = rows.cache_row[static_cast<size_t>(a)], start = rows.start[static_cast<size_t>(a)];
        for (int64_t i = 0; i < rows.count[static_cast<size_t>(a)]; ++i) {
          const int64_t pos = start + i;
          ATTO_CHECK(pos < C, "RelPosAttention", "position ", pos, " beyond the cache's ", C);
          const T* t = in + (a * N + i) * 3 * D_;
          for (int64_t h = 0; h < H_; ++h)
            for (int64_t e = 0; e < d_; ++e) {  // this position's key and value into the cache
              K[((row * H_ + h) * C + pos) * d_ + e] = t[D_ + h * d_ + e];
              V[((row * H_ + h) * C + pos) * d_ + e] = t[2 * D_ + h * d_ + e];
            }
          for (int64_t h = 0; h < H_; ++h) {  // softmax over the cached positions 0 .. pos
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= pos; ++j) {
              double s = 0;
              for (int64_t e = 0; e < d_; ++e)
                s += static_cast<double>(t[h * d_ + e]) * static_cast<double>(K[((row * H_ + h) * C + j) * d_ + e]);
              w[static_cast<size_t>(j)] = s / std::sqrt(static_cast<double>(d_)) -
                                          static_cast<double>(slope[h]) * static_cast<double>(pos - j);
              m = std::max(m, w[static_cast<size_t>(j)]);
            }
            for (int64_t j = 0; j <= pos; ++j) sum += (w[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - m));
            for (int64_t e = 0; e < d_; ++e) {
              double acc = 0;
              for (int64_t j = 0; j <= pos; ++j)
                acc += w[static_cast<size_t>(j)] * static_cast<double>(V[((row * H_ + h) * C + j) * d_ + e]);
              o[(a * N + i) * D_ + h * d_ + e] = static_cast<T>(acc / sum);
            }
          }
        }
      }
    };
    if (x.dtype() == kFloat64) run.template operator()<double>();
    else run.template operator()<float>();
    return out_proj->forward(heads);  // (A, N, D)
  }

  Tensor in_proj_weight, in_proj_bias, slopes;
  std::shared_ptr<nn::Linear> out_proj;

 private:
  int64_t D_, H_, d_;
};

int main(int argc, char** argv) {
  nn::register_attention(
      "relpos",
      [](const nn::AttentionSpec&, const nn::AttentionConfig& c, Generator& gen) {
        return std::make_shared<RelPosAttention>(c.d_model, c.heads, gen);
      },
      "softmax attention with a learned per-head relative-position bias (examples/custom_attention.cpp)");

  // 1. Train the decoder-only model with it on the built-in reverse task (Trainer's defaults otherwise).
  train::TrainConfig cfg;
  cfg.model = "lm";
  cfg.attention = "relpos";
  cfg.steps = argc > 1 ? std::atoll(argv[1]) : cfg.steps;
  cfg.eval_every = 0;
  cfg.eval_size = 500;
  train::Trainer trainer(cfg);
  std::printf("training %s with attention %s (%lld parameters) on %s for %lld steps\n",
              trainer.model().type_name().c_str(), cfg.attention.c_str(),
              static_cast<long long>(trainer.model().num_parameters()), trainer.dataset().name().c_str(),
              static_cast<long long>(cfg.steps));
  trainer.train([&](const train::StepMetrics& m) {
    if (m.step % 500 == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(m.step), m.loss);
  });
  const train::EvalResult r = trainer.evaluate();
  std::printf("held-out: token accuracy %.4f, exact (sequence) accuracy %.4f\n", r.token_accuracy,
              r.sequence_accuracy);

  // 2. Greedy decoding from its own cache gives the tokens of recomputing every step.
  nn::SequenceModel& model = trainer.model();
  model.eval();
  Generator pick(7);
  nn::TokenRows sources;
  for (int64_t b = 0; b < 32; ++b) {
    sources.emplace_back();
    const int64_t n = 1 + static_cast<int64_t>(pick.randint(static_cast<uint64_t>(cfg.max_len)));
    for (int64_t i = 0; i < n; ++i)
      sources.back().push_back(4 + static_cast<int64_t>(pick.randint(static_cast<uint64_t>(model.vocab_size() - 4))));
  }
  const int64_t max_new = model.max_decode_len();
  const nn::TokenRows cached = train::greedy_decode(model, sources, max_new, {.use_cache = true});
  const nn::TokenRows full = train::greedy_decode(model, sources, max_new, {.use_cache = false});
  const bool same = cached == full;
  std::printf("decoding %zu rows from the cache: %s tokens as recomputing\n", sources.size(),
              same ? "the same" : "DIFFERENT");

  // 3. The float64 gradcheck of the whole model with it (every parameter, the slopes included).
  const checks::CheckResult g = checks::find_check("relpos").run(
      checks::CheckConfig{.dtype = kFloat64, .mask = "causal"}, checks::tolerances(kFloat64));
  std::printf("gradcheck %s (%s): %s, max abs error %.3g\n", g.name.c_str(), g.configuration.c_str(),
              g.result.passed ? "passed" : "FAILED", g.max_abs_error);

  const bool ok = r.sequence_accuracy >= 0.99 && same && g.result.passed && g.max_abs_derivative > 0;
  std::printf("%s\n", ok ? "custom attention learned" : "FAILED");
  return ok ? 0 : 1;
}

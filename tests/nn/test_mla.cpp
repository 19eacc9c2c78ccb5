// nn::MultiHeadLatentAttention (DeepSeek-V2 MLA): names, shapes and init; the PyTorch reference (DeepSeek-V3's
// MLA, float64 golden); gradcheck in float64; the plain and absorbed decoding paths equal to each other and to the
// full forward (one position at a time and several at once); cache size; errors. Also nn::RMSNorm.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/elementwise.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/mla.h"
#include "nn_golden.h"
#include "testing.h"

namespace attograd::nn {
namespace {

MlaOptions small_options(int64_t q_lora_rank, Dtype dtype) {
  return {.d_model = 12,
          .n_heads = 3,
          .qk_nope_head_dim = 4,
          .qk_rope_head_dim = 4,
          .v_head_dim = 3,
          .kv_lora_rank = 5,
          .q_lora_rank = q_lora_rank,
          .rope_base = 100.0,
          .dtype = dtype};
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

TEST(RMSNorm, NormalisesTheLastDimension) {
  RMSNorm norm(4, 1e-6, kFloat64);
  EXPECT_EQ(testing::names_of(norm), (std::vector<std::string>{"weight"}));
  copy_(norm.weight, from_vector<double>({1.0, 2.0, 0.5, -1.0}));
  Tensor x = from_vector<double>({1.0, -2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0}, {2, 4});
  const double r = 1.0 / std::sqrt((1.0 + 4.0 + 9.0 + 16.0) / 4.0 + 1e-6);
  Tensor expected = from_vector<double>({r, -4.0 * r, 1.5 * r, -4.0 * r, 0.0, 0.0, 0.0, 0.0}, {2, 4});
  EXPECT_TRUE(testing::all_close(norm.forward(x), expected, 1e-15));
  Generator gen(1);
  Tensor y = testing::rand_leaf({3, 4}, gen);
  EXPECT_TRUE(testing::gradcheck_ok([&] { return norm.forward(y); }, {y, norm.weight}));
  EXPECT_THROW(RMSNorm(0), Error);
  EXPECT_THROW(norm.forward(zeros({2, 3}, {.dtype = kFloat64})), Error);
}

TEST(MultiHeadLatentAttention, NamesShapesAndXavierInit) {
  Generator gen(1);
  MultiHeadLatentAttention m({.d_model = 64,
                              .n_heads = 4,
                              .qk_nope_head_dim = 16,
                              .qk_rope_head_dim = 8,
                              .v_head_dim = 12,
                              .kv_lora_rank = 32,
                              .q_lora_rank = 24},
                             gen);
  EXPECT_EQ(testing::names_of(m),
            (std::vector<std::string>{"wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv_a.weight", "kv_norm.weight",
                                      "wkv_b.weight", "wo.weight"}));
  EXPECT_EQ(m.wq_a->weight.shape(), (Shape{24, 64}));
  EXPECT_EQ(m.wq_b->weight.shape(), (Shape{4 * 24, 24}));
  EXPECT_EQ(m.wkv_a->weight.shape(), (Shape{32 + 8, 64}));
  EXPECT_EQ(m.wkv_b->weight.shape(), (Shape{4 * (16 + 12), 32}));
  EXPECT_EQ(m.wo->weight.shape(), (Shape{64, 4 * 12}));
  EXPECT_FALSE(m.wq);
  for (const auto& l : {m.wq_a, m.wq_b, m.wkv_a, m.wkv_b, m.wo}) EXPECT_FALSE(l->bias.defined());
  // xavier_uniform_: U(-b, b), b = sqrt(6 / (fan_in + fan_out)), reached closely by a few thousand draws.
  for (const auto& l : {m.wq_a, m.wq_b, m.wkv_a, m.wkv_b}) {
    const double b = std::sqrt(6.0 / static_cast<double>(l->weight.size(0) + l->weight.size(1)));
    EXPECT_LE(max_abs(l->weight), b);
    EXPECT_GT(max_abs(l->weight), 0.95 * b);
  }
  // wo: Linear's default, U(-1/sqrt(in), 1/sqrt(in)) (as MultiheadAttention's out_proj).
  EXPECT_LE(max_abs(m.wo->weight), 1.0 / std::sqrt(48.0));
  EXPECT_GT(max_abs(m.wo->weight), 0.95 / std::sqrt(48.0));
  EXPECT_EQ(sum(m.q_norm->weight).item(), 24.0);
  EXPECT_EQ(sum(m.kv_norm->weight).item(), 32.0);
  // Without query compression: one wq.
  MultiHeadLatentAttention plain(small_options(0, kFloat32), gen);
  EXPECT_EQ(testing::names_of(plain),
            (std::vector<std::string>{"wq.weight", "wkv_a.weight", "kv_norm.weight", "wkv_b.weight", "wo.weight"}));
  EXPECT_EQ(plain.wq->weight.shape(), (Shape{3 * 8, 12}));
  EXPECT_FALSE(plain.wq_a);
  EXPECT_NE(plain.to_string().find("kv_lora_rank=5, q_lora_rank=0"), std::string::npos) << plain.to_string();
}

// DeepSeek-V3's MLA in PyTorch (tests/nn/golden_mla.py), float64: output and every gradient.
void check_golden(const std::string& file, int64_t q_lora_rank) {
  const testing::Golden g = testing::load_golden(file);
  Generator gen(2);
  MultiHeadLatentAttention m(small_options(q_lora_rank, kFloat64), gen);
  const auto gp = testing::golden_params(g);
  testing::expect_names_and_load(m, gp);
  Tensor x = testing::leaf(g.at("input"));
  Tensor out = m.forward(x);
  EXPECT_TRUE(testing::all_close(out, g.at("output"), 1e-12, 1e-12)) << file;
  out.backward(g.at("grad_output"));
  EXPECT_TRUE(testing::all_close(x.grad(), g.at("grad_input"), 1e-12, 1e-12)) << file;
  for (const auto& p : gp)
    EXPECT_TRUE(testing::all_close(m.parameter(p.name).grad(), g.at("grad." + std::to_string(p.index) + "." + p.name),
                                   1e-12, 1e-12))
        << file << " " << p.name;
}

TEST(MultiHeadLatentAttention, GoldenPyTorchDeepSeekV3) {
  check_golden("nn/mla.golden", 6);
  check_golden("nn/mla_noq.golden", 0);
}

TEST(MultiHeadLatentAttention, GradcheckFloat64) {
  for (int64_t q_lora_rank : {0, 3}) {
    Generator gen(3);
    MultiHeadLatentAttention m({.d_model = 6,
                                .n_heads = 2,
                                .qk_nope_head_dim = 2,
                                .qk_rope_head_dim = 2,
                                .v_head_dim = 3,
                                .kv_lora_rank = 3,
                                .q_lora_rank = q_lora_rank,
                                .dtype = kFloat64},
                               gen);
    Tensor x = testing::rand_leaf({2, 4, 6}, gen);
    EXPECT_TRUE(testing::gradcheck_ok([&] { return m.forward(x); }, testing::params_as_inputs(m, gen, {x})))
        << q_lora_rank;
  }
}

// Decoding through the cache, position groups `chunks` (summing to L), against the full forward.
Tensor decode_in_chunks(const MultiHeadLatentAttention& m, const Tensor& x, const std::vector<int64_t>& chunks,
                        bool absorbed, int64_t capacity) {
  MlaCache cache = m.make_latent_cache(x.size(0), capacity);
  std::vector<Tensor> outs;
  int64_t t = 0;
  for (int64_t n : chunks) {
    outs.push_back(m.decode(narrow(x, 1, t, n), cache, t, absorbed));
    t += n;
  }
  EXPECT_EQ(t, x.size(1));
  return cat(outs, 1);
}

TEST(MultiHeadLatentAttention, PlainAndAbsorbedDecodingEqualTheForward) {
  for (Dtype dt : {kFloat64, kFloat32}) {
    for (int64_t q_lora_rank : {0, 6}) {
      Generator gen(4);
      MultiHeadLatentAttention m(small_options(q_lora_rank, dt), gen);
      {
        NoGradGuard no_grad;
        for (auto& [n, p] : m.named_parameters())
          if (n.find("norm") != std::string::npos) init::uniform_(p, 0.5, 1.5, gen);
      }
      Tensor x = rand({2, 9, 12}, gen, {.dtype = dt});
      Tensor full;
      {
        NoGradGuard no_grad;
        full = m.forward(x);
      }
      const double tol = dt == kFloat64 ? 1e-10 : 2e-5;
      const std::vector<int64_t> one_by_one(9, 1), groups{3, 1, 4, 1};
      for (bool absorbed : {false, true}) {
        const std::string what = str_cat(dt == kFloat64 ? "float64" : "float32", " q_lora_rank=", q_lora_rank,
                                         absorbed ? " absorbed" : " plain");
        Tensor step = decode_in_chunks(m, x, one_by_one, absorbed, 12);
        EXPECT_TRUE(testing::all_close(step, full, tol, tol)) << what << " one at a time";
        Tensor grouped = decode_in_chunks(m, x, groups, absorbed, 9);
        EXPECT_TRUE(testing::all_close(grouped, full, tol, tol)) << what << " in groups";
        EXPECT_TRUE(testing::all_close(grouped, step, tol, tol)) << what << " groups vs one at a time";
        Tensor whole = decode_in_chunks(m, x, {9}, absorbed, 9);  // the whole prompt in one step
        EXPECT_TRUE(testing::all_close(whole, full, tol, tol)) << what << " whole";
      }
      EXPECT_TRUE(testing::all_close(decode_in_chunks(m, x, groups, true, 9), decode_in_chunks(m, x, groups, false, 9),
                                     tol, tol));
    }
  }
}

TEST(MultiHeadLatentAttention, CacheHoldsOnlyTheLatentAndTheRopeKey) {
  Generator gen(5);
  MultiHeadLatentAttention m(small_options(0, kFloat64), gen);
  MlaCache cache = m.make_latent_cache(2, 6);
  EXPECT_EQ(cache.latent.shape(), (Shape{2, 6, 5 + 4}));
  EXPECT_EQ(cache.latent.dtype(), kFloat64);
  EXPECT_EQ(m.cache_bytes_per_token(), (5 + 4) * 8);
  // A decode step writes exactly its positions: [kv_norm(c) | RoPE(k_R)] of wkv_a(x).
  Tensor x = rand({2, 2, 12}, gen, {.dtype = kFloat64});
  m.decode(x, cache, 3, true);
  Tensor written = narrow(cache.latent, 1, 3, 2);
  Tensor kv = linear(x, m.wkv_a->weight);
  Tensor c = m.kv_norm->forward(narrow(kv, -1, 0, 5));
  EXPECT_TRUE(testing::all_close(narrow(written, -1, 0, 5), c, 1e-14));
  EXPECT_FALSE(testing::all_close(narrow(written, -1, 5, 4), narrow(kv, -1, 5, 4), 1e-3));  // rotated at 3, 4
  EXPECT_EQ(max_abs(narrow(cache.latent, 1, 0, 3)), 0.0);
  EXPECT_EQ(max_abs(narrow(cache.latent, 1, 5, 1)), 0.0);
  // The measured configuration of docs/ATTENTION.md (MLA): D = 256, 4 heads, float32.
  MultiHeadLatentAttention big({.d_model = 256,
                                .n_heads = 4,
                                .qk_nope_head_dim = 64,
                                .qk_rope_head_dim = 32,
                                .v_head_dim = 64,
                                .kv_lora_rank = 64},
                               gen);
  EXPECT_EQ(big.cache_bytes_per_token(), (64 + 32) * 4);
  EXPECT_LE(big.cache_bytes_per_token() * 4, 2 * 256 * 4);  // at most 1/4 of MultiheadAttention's K and V
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MultiHeadLatentAttention, Errors) {
  Generator gen(6);
  auto with = [](auto edit) {
    MlaOptions o = small_options(0, kFloat64);
    edit(o);
    return o;
  };
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.n_heads = 0; }), gen); }, "n_heads=0");
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.qk_rope_head_dim = 3; }), gen); },
               "qk_rope_head_dim must be positive and even");
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.kv_lora_rank = 0; }), gen); },
               "kv_lora_rank must be positive, got 0");
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.q_lora_rank = -1; }), gen); },
               "q_lora_rank must be >= 0");
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.v_head_dim = 0; }), gen); },
               "v_head_dim must be positive");
  expect_error([&] { MultiHeadLatentAttention(with([](MlaOptions& o) { o.qk_nope_head_dim = -2; }), gen); },
               "qk_nope_head_dim must be positive, got -2");
  MultiHeadLatentAttention m(small_options(0, kFloat64), gen);
  expect_error([&] { m.forward(zeros({2, 3, 10}, {.dtype = kFloat64})); }, "d_model=12");
  MlaCache cache = m.make_latent_cache(2, 4);
  Tensor x = zeros({2, 3, 12}, {.dtype = kFloat64});
  expect_error([&] { m.decode(x, cache, 2); }, "positions [2, 5) fall outside the cache's 4 positions");
  expect_error([&] { m.decode(zeros({1, 3, 12}, {.dtype = kFloat64}), cache, 0); }, "cache must be (B=1");
  expect_error([&] { m.decode(zeros({2, 1, 12}), cache, 0); }, "of the input's dtype");
  expect_error([&] { m.make_latent_cache(0, 4); }, "B=0");
}

// forward_with_weights: the same output as forward and the probabilities whose entropies forward_with_entropy gives.
TEST(MultiHeadLatentAttention, WeightsAreThePlainPathProbabilities) {
  Generator gen(5);
  MultiHeadLatentAttention m(small_options(6, kFloat64), gen);
  Tensor x = rand({2, 7, 12}, gen, {.dtype = kFloat64});
  NoGradGuard no_grad;
  auto [out, w] = m.forward_with_weights(x);
  auto [out2, ent] = m.forward_with_entropy(x);
  ASSERT_EQ(w.shape(), (Shape{2, 3, 7, 7}));
  EXPECT_LT(max_abs(sub(out, m.forward(x))), 1e-14);
  const std::vector<double> p = w.to_vector<double>(), e = ent.to_vector<double>();
  for (int64_t r = 0; r < 2 * 3 * 7; ++r) {
    const int64_t i = r % 7;
    double sum = 0, h = 0;
    for (int64_t j = 0; j < 7; ++j) {
      const double v = p[static_cast<size_t>(r * 7 + j)];
      if (j > i) {
        EXPECT_EQ(v, 0);
      }
      sum += v;
      if (v > 0) h -= v * std::log(v);
    }
    EXPECT_NEAR(sum, 1, 1e-12);
    EXPECT_NEAR(h, e[static_cast<size_t>(r)], 1e-10);
  }
}

}  // namespace
}  // namespace attograd::nn

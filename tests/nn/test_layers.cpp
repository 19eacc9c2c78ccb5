// The basic layers: Linear, Embedding, LayerNorm, Dropout, the activation modules, Sequential, ModuleList.
// Parameter names/counts as PyTorch's, default init, train/eval, float64 gradchecks over parameters
// and inputs, errors, printing, and golden files from PyTorch 1.13 (tests/nn/golden_layers.py).

#include <cmath>

#include "autograd/activation.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "autograd/reduce.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

std::vector<std::string> param_names(const Module& m) {
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  return names;
}

/// Copies golden "param.<name>" into every parameter (the names must be PyTorch's), runs forward on
/// "input", back-propagates "grad_output" and compares output and every gradient.
void check_golden(Module& m, const std::string& file, bool float_input = true) {
  auto g = load_golden(file);
  size_t golden_params = 0;
  for (auto& [k, _] : g) golden_params += k.rfind("param.", 0) == 0;
  auto params = m.named_parameters();
  ASSERT_EQ(params.size(), golden_params) << file << ": parameter count differs from PyTorch's";
  for (auto& [name, p] : params) {
    ASSERT_TRUE(g.count("param." + name)) << file << ": PyTorch has no parameter named " << name;
    copy_(p, g.at("param." + name));
  }
  Tensor x = g.at("input");
  if (float_input) x.requires_grad_(true);
  Tensor out = m.forward(x);
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5)) << file << ": output";
  out.backward(g.at("grad_output"));
  if (float_input) {
    EXPECT_TRUE(all_close(x.grad(), g.at("grad_input"), 1e-5, 1e-4)) << file << ": grad_input";
  }
  for (auto& [name, p] : params)
    EXPECT_TRUE(all_close(p.grad(), g.at("grad." + name), 1e-5, 1e-4)) << file << ": grad of " << name;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Linear

TEST(Linear, NamesShapesAndCountsMatchPyTorch) {
  auto lin = std::make_shared<Linear>(4, 3);
  EXPECT_EQ(param_names(*lin), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(lin->weight.shape(), (Shape{3, 4}));
  EXPECT_EQ(lin->bias.shape(), (Shape{3}));
  EXPECT_EQ(lin->num_parameters(), 15);  // sum(p.numel() for p in nn.Linear(4, 3).parameters())
  EXPECT_TRUE(lin->weight.requires_grad());
  auto nobias = std::make_shared<Linear>(5, 2, false);
  EXPECT_EQ(param_names(*nobias), (std::vector<std::string>{"weight"}));
  EXPECT_FALSE(nobias->bias.defined());
  EXPECT_EQ(nobias->num_parameters(), 10);
}

TEST(Linear, ZeroInFeaturesIsRefusedZeroOutFeaturesIsEmpty) {
  // PyTorch builds nn.Linear(0, 3) (warning that initialising the empty weight is a no-op) and returns its bias for
  // any input: a size bug upstream, refused here. nn.Linear(3, 0) gives an empty (N, 0) output, as here.
  EXPECT_ATTO_ERROR(Linear(0, 3), "in_features must be >= 1");
  EXPECT_ATTO_ERROR(Linear(-1, 3), "got in_features=-1");
  EXPECT_ATTO_ERROR(Linear(3, -2), "out_features=-2");
  Linear empty_out(3, 0);
  EXPECT_EQ(empty_out.weight.shape(), (Shape{0, 3}));
  EXPECT_EQ(empty_out.forward(ones({2, 3})).shape(), (Shape{2, 0}));
}

TEST(Linear, DefaultInitIsKaimingUniformBoundOneOverSqrtIn) {
  Generator gen(3);
  Linear lin(64, 200, true, gen);
  const double bound = 1.0 / 8.0;
  EXPECT_LE(max_abs(lin.weight), bound);
  EXPECT_GT(max_abs(lin.weight), 0.99 * bound);
  EXPECT_LE(max_abs(lin.bias), bound);
  EXPECT_GT(max_abs(lin.bias), 0.9 * bound);
  double s2 = 0;  // U(-b, b) has variance b^2 / 3
  for (double v : lin.weight.to_vector<double>()) s2 += v * v;
  EXPECT_NEAR(s2 / static_cast<double>(lin.weight.numel()), bound * bound / 3, 0.03 * bound * bound / 3);
}

TEST(Linear, SeededConstructionIsReproducible) {
  Generator a(11), b(11), c(12);
  Linear x(6, 5, true, a), y(6, 5, true, b), z(6, 5, true, c);
  EXPECT_EQ(x.weight.to_vector<float>(), y.weight.to_vector<float>());
  EXPECT_EQ(x.bias.to_vector<float>(), y.bias.to_vector<float>());
  EXPECT_NE(x.weight.to_vector<float>(), z.weight.to_vector<float>());
}

TEST(Linear, ForwardValues) {
  Linear lin(2, 2);
  copy_(lin.weight, from_vector<float>({1, 2, 3, 4}, {2, 2}));
  copy_(lin.bias, from_vector<float>({0.5f, -1}, {2}));
  Tensor y = lin(from_vector<float>({1, -1, 2, 0.5f}, {2, 2}));
  // [1, -1] -> [1 - 2 + 0.5, 3 - 4 - 1]; [2, 0.5] -> [2 + 1 + 0.5, 6 + 2 - 1]
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-0.5f, -2, 3.5f, 7}));
  EXPECT_EQ(lin(zeros({0, 2})).shape(), (Shape{0, 2}));
}

TEST(Linear, GradcheckOverInputAndParameters) {
  Generator gen(1);
  auto lin = std::make_shared<Linear>(4, 3, true, gen);
  lin->to(kFloat64);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  EXPECT_GRADCHECK([&] { return lin->forward(x); }, {x, lin->weight, lin->bias});
  auto nobias = std::make_shared<Linear>(3, 2, false, gen);
  nobias->to(kFloat64);
  Tensor v = rand_leaf({3}, gen);  // a 1-D input
  EXPECT_GRADCHECK([&] { return nobias->forward(v); }, {v, nobias->weight});
}

TEST(Linear, ErrorsNameTheModuleAndShapes) {
  Linear lin(4, 3);
  EXPECT_ATTO_ERROR(lin(zeros({2, 3})), "Linear: expected input of shape (..., in_features=4), got shape [2, 3]");
  EXPECT_ATTO_ERROR(lin(zeros({2, 4}, {.dtype = kFloat64})), "float64");
  EXPECT_ATTO_ERROR(Linear(-1, 3), "Linear: in_features must be >= 1 and out_features >= 0");
}

TEST(Linear, Printing) {
  EXPECT_EQ(Linear(4, 3).to_string(), "Linear(in_features=4, out_features=3, bias=True)");
  EXPECT_EQ(Linear(4, 3, false).to_string(), "Linear(in_features=4, out_features=3, bias=False)");
}

TEST(Linear, GoldenPyTorch) {
  Linear lin(4, 3);
  check_golden(lin, "nn/linear.golden");
  Linear nobias(5, 2, false);
  check_golden(nobias, "nn/linear_nobias.golden");
}

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(Embedding, NamesInitAndPaddingRow) {
  Generator gen(5);
  Embedding emb(10, 3, 0, gen);
  EXPECT_EQ(param_names(emb), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(emb.weight.shape(), (Shape{10, 3}));
  EXPECT_EQ(emb.num_parameters(), 30);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(emb.weight.at({0, j}), 0.0);
  EXPECT_NE(emb.weight.at({1, 0}), 0.0);
  Embedding big(1000, 100, -1, gen);  // N(0, 1)
  double s = 0, s2 = 0;
  for (double v : big.weight.to_vector<double>()) s += v, s2 += v * v;
  const double n = 1e5;
  EXPECT_NEAR(s / n, 0.0, 0.015);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(Embedding, ForwardPicksRowsAndPaddingGetsNoGradient) {
  Embedding emb(5, 2, 1);
  copy_(emb.weight, from_vector<float>({0, 1, 0, 0, 4, 5, 6, 7, 8, 9}, {5, 2}));
  Tensor idx = from_vector<int64_t>({2, 1, 2, 4}, {2, 2});
  Tensor y = emb(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4, 5, 0, 0, 4, 5, 8, 9}));
  y.backward(ones({2, 2, 2}));
  EXPECT_EQ(emb.weight.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 2, 2, 0, 0, 1, 1}));
}

TEST(Embedding, GradcheckOverWeight) {
  Generator gen(2);
  auto emb = std::make_shared<Embedding>(6, 3, -1, gen);
  emb->to(kFloat64);
  Tensor idx = from_vector<int64_t>({0, 5, 2, 2, 5, 1}, {3, 2});  // repeats accumulate
  EXPECT_GRADCHECK([&] { return emb->forward(idx); }, {emb->weight});
  // With a padding row the gradient of the rows that are used is still exact (the padding row is not used).
  auto padded = std::make_shared<Embedding>(6, 3, 4, gen);
  padded->to(kFloat64);
  EXPECT_GRADCHECK([&] { return padded->forward(idx); }, {padded->weight});
}

TEST(Embedding, Errors) {
  Embedding emb(10, 3);
  EXPECT_ATTO_ERROR(emb(zeros({2})), "Embedding: expected int64 indices, got float32 of shape [2]");
  EXPECT_ATTO_ERROR(emb(from_vector<int64_t>({1, 10}, {2})), "index 10");
  EXPECT_ATTO_ERROR(Embedding(4, 2, 4), "Embedding: padding_idx 4 must be within num_embeddings 4");
}

TEST(Embedding, PrintingAndGolden) {
  EXPECT_EQ(Embedding(10, 3).to_string(), "Embedding(10, 3)");
  Embedding emb(10, 3, 0);
  EXPECT_EQ(emb.to_string(), "Embedding(10, 3, padding_idx=0)");
  check_golden(emb, "nn/embedding.golden", /*float_input=*/false);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST(LayerNorm, NamesInitAndShapes) {
  LayerNorm ln(5);
  EXPECT_EQ(param_names(ln), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(ln.weight.to_vector<float>(), std::vector<float>(5, 1.f));
  EXPECT_EQ(ln.bias.to_vector<float>(), std::vector<float>(5, 0.f));
  EXPECT_EQ(ln.normalized_shape, (Shape{5}));
  LayerNorm ln2(Shape{3, 4}, 1e-6);
  EXPECT_EQ(ln2.weight.shape(), (Shape{3, 4}));
  EXPECT_EQ(ln2.num_parameters(), 24);
  EXPECT_DOUBLE_EQ(ln2.eps, 1e-6);
  LayerNorm plain(4, 1e-5, false);
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_FALSE(plain.weight.defined());
}

TEST(LayerNorm, ForwardNormalisesRows) {
  LayerNorm ln(4);
  Tensor y = ln(from_vector<float>({1, 2, 3, 4, 2, 2, 2, 2}, {2, 4}));
  // mean 2.5, biased var 1.25 -> (x - 2.5) / sqrt(1.25 + 1e-5); a constant row gives the bias (0).
  const float s = static_cast<float>(1.0 / std::sqrt(1.25 + 1e-5));
  EXPECT_TRUE(all_close(y, from_vector<float>({-1.5f * s, -0.5f * s, 0.5f * s, 1.5f * s, 0, 0, 0, 0}, {2, 4}), 1e-6));
}

TEST(LayerNorm, GradcheckOverInputAndParameters) {
  Generator gen(4);
  auto ln = std::make_shared<LayerNorm>(5);
  ln->to(kFloat64);
  init::uniform_(ln->weight, 0.5, 1.5, gen);
  init::uniform_(ln->bias, -0.5, 0.5, gen);
  Tensor x = rand_leaf({3, 5}, gen);
  EXPECT_GRADCHECK([&] { return ln->forward(x); }, {x, ln->weight, ln->bias});
  auto ln2 = std::make_shared<LayerNorm>(Shape{2, 3});
  ln2->to(kFloat64);
  init::uniform_(ln2->weight, 0.5, 1.5, gen);
  init::uniform_(ln2->bias, -0.5, 0.5, gen);
  Tensor x2 = rand_leaf({2, 2, 2, 3}, gen);
  EXPECT_GRADCHECK([&] { return ln2->forward(x2); }, {x2, ln2->weight, ln2->bias});
  auto plain = std::make_shared<LayerNorm>(4, 1e-5, false);
  plain->to(kFloat64);
  Tensor x3 = rand_leaf({2, 4}, gen);
  EXPECT_GRADCHECK([&] { return plain->forward(x3); }, {x3});
}

TEST(LayerNorm, ErrorsNameTheModuleAndShapes) {
  LayerNorm ln(4);
  EXPECT_ATTO_ERROR(ln(zeros({2, 3})),
                    "LayerNorm: expected input whose trailing dimensions are normalized_shape [4], got shape [2, 3]");
  LayerNorm ln2(Shape{2, 3});
  EXPECT_ATTO_ERROR(ln2(zeros({3})), "normalized_shape [2, 3], got shape [3]");
  EXPECT_ATTO_ERROR(LayerNorm(Shape{}), "LayerNorm: normalized_shape must have at least one dimension");
}

TEST(LayerNorm, PrintingLikePyTorch) {
  EXPECT_EQ(LayerNorm(4).to_string(), "LayerNorm((4,), eps=1e-05, elementwise_affine=True)");
  EXPECT_EQ(LayerNorm(Shape{2, 3}, 1e-6, false).to_string(), "LayerNorm((2, 3), eps=1e-06, elementwise_affine=False)");
  EXPECT_EQ(LayerNorm(8, 0.0001).to_string(), "LayerNorm((8,), eps=0.0001, elementwise_affine=True)");
}

TEST(LayerNorm, GoldenPyTorch) {
  LayerNorm ln(5);
  check_golden(ln, "nn/layer_norm_1d.golden");
  LayerNorm ln2(Shape{3, 4});
  check_golden(ln2, "nn/layer_norm_2d.golden");
}

// ---------------------------------------------------------------------------------------------
// Dropout, ReLU, GELU

TEST(Dropout, IdentityInEvalInvertedInTraining) {
  Generator gen(7);
  Dropout drop(0.25, gen);
  EXPECT_TRUE(drop.named_parameters().empty());
  Tensor x = ones({100, 100});
  drop.eval();
  EXPECT_EQ(drop(x).to_vector<float>(), x.to_vector<float>());
  drop.train();
  Tensor y = drop(x);
  int64_t dropped = 0;
  for (float v : y.to_vector<float>()) {
    if (v == 0.f)
      ++dropped;
    else
      EXPECT_FLOAT_EQ(v, 1.f / 0.75f);
  }
  EXPECT_NEAR(static_cast<double>(dropped) / 1e4, 0.25, 0.02);
}

TEST(Dropout, ReplayableThroughItsGenerator) {
  Generator gen(8);
  Dropout drop(0.5, gen);
  Tensor x = rand({4, 6}, gen);
  gen.manual_seed(42);
  Tensor a = drop(x);
  Tensor b = drop(x);
  gen.manual_seed(42);
  Tensor c = drop(x);
  EXPECT_EQ(a.to_vector<float>(), c.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), b.to_vector<float>());
  Generator other(42);
  drop.set_generator(other);
  EXPECT_EQ(&drop.generator(), &other);
  EXPECT_EQ(drop(x).to_vector<float>(), a.to_vector<float>());
}

TEST(Dropout, EdgeProbabilitiesAndErrors) {
  Dropout none(0.0);
  Tensor x = rand({3, 3});
  EXPECT_EQ(none(x).to_vector<float>(), x.to_vector<float>());
  Dropout all(1.0);
  EXPECT_EQ(all(x).to_vector<float>(), std::vector<float>(9, 0.f));
  EXPECT_ATTO_ERROR(Dropout(1.5), "Dropout: dropout probability has to be between 0 and 1, but got 1.5");
  EXPECT_ATTO_ERROR(Dropout(-0.1), "but got -0.1");
}

TEST(Dropout, GradcheckWithDropoutOn) {
  Generator gen(9), mask_gen(0);
  auto drop = std::make_shared<Dropout>(0.4, mask_gen);
  drop->to(kFloat64);
  Tensor x = rand_leaf({4, 5}, gen);
  EXPECT_GRADCHECK(
      [&] {
        mask_gen.manual_seed(123);
        return drop->forward(x);
      },
      {x});
}

TEST(Activations, ReluAndGeluModules) {
  Tensor x = from_vector<float>({-2, -0.5f, 0.5f, 3}, {4});
  ReLU relu_m;
  EXPECT_EQ(relu_m(x).to_vector<float>(), (std::vector<float>{0, 0, 0.5f, 3}));
  GELU g;
  EXPECT_EQ(g(x).to_vector<float>(), gelu(x).to_vector<float>());
  GELU gt("tanh");
  EXPECT_EQ(gt(x).to_vector<float>(), gelu(x, "tanh").to_vector<float>());
  EXPECT_NEAR(g(x).at({3}), 3 * 0.5 * (1 + std::erf(3 / std::sqrt(2.0))), 1e-6);
  EXPECT_ATTO_ERROR(GELU("fast"), "GELU: approximate must be 'none' or 'tanh', got 'fast'");
  EXPECT_EQ(relu_m.to_string(), "ReLU()");
  EXPECT_EQ(g.to_string(), "GELU(approximate='none')");
  EXPECT_EQ(gt.to_string(), "GELU(approximate='tanh')");
  EXPECT_EQ(Dropout(0.1).to_string(), "Dropout(p=0.1, inplace=False)");
}

TEST(Activations, Gradcheck) {
  Generator gen(10);
  Tensor x = from_vector<double>({-1.3, -0.4, 0.2, 0.7, 1.9, -2.2}, {2, 3}, {.dtype = kFloat64, .requires_grad = true});
  auto r = std::make_shared<ReLU>();
  auto g = std::make_shared<GELU>();
  auto gt = std::make_shared<GELU>("tanh");
  EXPECT_GRADCHECK([&] { return r->forward(x); }, {x});
  EXPECT_GRADCHECK([&] { return g->forward(x); }, {x});
  EXPECT_GRADCHECK([&] { return gt->forward(x); }, {x});
}

TEST(Activations, ModulesMatchTheFunctionalOps) {
  Tensor x = from_vector<double>({-3.1, -0.6, 0.25, 0.8, 2.4, -1.7}, {2, 3}, {.dtype = kFloat64});
  EXPECT_TRUE(bitwise_equal(Tanh()(x), tanh(x)));
  EXPECT_TRUE(bitwise_equal(Sigmoid()(x), sigmoid(x)));
  EXPECT_TRUE(bitwise_equal(SiLU()(x), x * sigmoid(x)));
  EXPECT_NEAR(SiLU()(x).at({1, 1}), 2.4 / (1 + std::exp(-2.4)), 1e-15);
  EXPECT_NEAR(Tanh()(x).at({0, 0}), std::tanh(-3.1), 1e-15);
  EXPECT_NEAR(Sigmoid()(x).at({0, 2}), 1 / (1 + std::exp(-0.25)), 1e-15);
  EXPECT_TRUE(bitwise_equal(Softmax(1)(x), softmax(x, 1)));
  EXPECT_TRUE(bitwise_equal(Softmax(-2)(x), softmax(x, 0)));
  EXPECT_TRUE(bitwise_equal(LogSoftmax(-1)(x), log_softmax(x, 1)));
  EXPECT_TRUE(bitwise_equal(LogSoftmax(0)(x), log_softmax(x, 0)));
  const double row0 = std::exp(-3.1) + std::exp(-0.6) + std::exp(0.25);
  EXPECT_NEAR(Softmax(-1)(x).at({0, 1}), std::exp(-0.6) / row0, 1e-15);
  EXPECT_NEAR(LogSoftmax(-1)(x).at({0, 1}), -0.6 - std::log(row0), 1e-14);
  Identity id;
  EXPECT_TRUE(id(x).is_same(x));
  EXPECT_EQ(Tanh().to_string(), "Tanh()");
  EXPECT_EQ(Sigmoid().to_string(), "Sigmoid()");
  EXPECT_EQ(SiLU().to_string(), "SiLU()");
  EXPECT_EQ(Softmax(-1).to_string(), "Softmax(dim=-1)");
  EXPECT_EQ(LogSoftmax(1).to_string(), "LogSoftmax(dim=1)");
  EXPECT_EQ(id.to_string(), "Identity()");
  EXPECT_TRUE(Softmax(1).named_parameters().empty());
  EXPECT_ATTO_ERROR(Softmax(2)(x), "softmax");
}

TEST(Activations, ModulesGradcheck) {
  Tensor x = from_vector<double>({-1.3, -0.4, 0.2, 0.7, 1.9, -2.2}, {2, 3}, {.dtype = kFloat64, .requires_grad = true});
  std::vector<std::shared_ptr<Module>> mods = {std::make_shared<Tanh>(),        std::make_shared<Sigmoid>(),
                                               std::make_shared<SiLU>(),        std::make_shared<Softmax>(-1),
                                               std::make_shared<Softmax>(0),    std::make_shared<LogSoftmax>(-1),
                                               std::make_shared<LogSoftmax>(0), std::make_shared<Identity>()};
  for (auto& m : mods) EXPECT_GRADCHECK([&] { return m->forward(x); }, {x}) << m->to_string();
  // In a Sequential, like any single-tensor module.
  Generator gen(11);
  auto seq = std::make_shared<Sequential>(std::make_shared<Linear>(3, 4, true, gen), std::make_shared<SiLU>(),
                                          std::make_shared<Identity>(), std::make_shared<LogSoftmax>(-1));
  seq->to(kFloat64);
  std::vector<Tensor> inputs = {x};
  for (auto& p : seq->parameters()) inputs.push_back(p);
  EXPECT_GRADCHECK([&] { return seq->forward(x); }, inputs);
}

TEST(PyFloat, MatchesPythonRepr) {
  EXPECT_EQ(nn::detail::py_float(0.5), "0.5");
  EXPECT_EQ(nn::detail::py_float(1e-5), "1e-05");
  EXPECT_EQ(nn::detail::py_float(1e-4), "0.0001");
  EXPECT_EQ(nn::detail::py_float(1.0), "1.0");
  EXPECT_EQ(nn::detail::py_float(0.0), "0.0");
  EXPECT_EQ(nn::detail::py_float(123.25), "123.25");
  EXPECT_EQ(nn::detail::py_float(1e15), "1000000000000000.0");
  EXPECT_EQ(nn::detail::py_float(1e16), "1e+16");
  EXPECT_EQ(nn::detail::py_float(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(nn::detail::py_float(0.1), "0.1");
}

// ---------------------------------------------------------------------------------------------
// Sequential and ModuleList

TEST(Sequential, NamesChainAndPrinting) {
  Generator gen(12);
  auto seq = std::make_shared<Sequential>(std::make_shared<Linear>(4, 8, true, gen), std::make_shared<ReLU>(),
                                          std::make_shared<Linear>(8, 2, true, gen));
  // nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).named_parameters()
  EXPECT_EQ(param_names(*seq), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq->num_parameters(), 4 * 8 + 8 + 8 * 2 + 2);
  EXPECT_EQ(seq->size(), 3u);
  Tensor x = rand({3, 4}, gen);
  auto l0 = seq->at<Linear>(0);
  auto l2 = seq->at<Linear>(-1);
  Tensor manual = l2->forward(relu(l0->forward(x)));
  EXPECT_EQ((*seq)(x).to_vector<float>(), manual.to_vector<float>());
  EXPECT_EQ(seq->to_string(),
            "Sequential(\n"
            "  (0): Linear(in_features=4, out_features=8, bias=True)\n"
            "  (1): ReLU()\n"
            "  (2): Linear(in_features=8, out_features=2, bias=True)\n"
            ")");
  int count = 0;
  for (auto& m : *seq) count += m != nullptr;
  EXPECT_EQ(count, 3);
}

TEST(Sequential, PushBackEmptyAndErrors) {
  Sequential seq;
  Tensor x = rand({2, 3});
  EXPECT_TRUE(seq(x).is_same(x));  // empty: identity
  seq.push_back(std::make_shared<Linear>(3, 3));
  seq.push_back(std::make_shared<GELU>());
  EXPECT_EQ(seq(x).shape(), (Shape{2, 3}));
  EXPECT_EQ(seq[1]->type_name(), "GELU");
  EXPECT_ATTO_ERROR(seq.at<Linear>(1), "Sequential: module 1 is a GELU, not the requested type");
  EXPECT_ATTO_ERROR(seq[2], "Sequential: index 2 is out of range for 2 modules");
  EXPECT_ATTO_ERROR(seq.push_back(nullptr), "cannot append a null module");
  EXPECT_ATTO_ERROR(seq(rand({2, 4})), "Linear: expected input of shape (..., in_features=3), got shape [2, 4]");
}

TEST(Sequential, GradcheckOverInputAndAllParameters) {
  Generator gen(13);
  auto seq = std::make_shared<Sequential>(std::make_shared<Linear>(3, 5, true, gen), std::make_shared<GELU>(),
                                          std::make_shared<LayerNorm>(5), std::make_shared<Linear>(5, 2, true, gen));
  seq->to(kFloat64);
  Tensor x = rand_leaf({2, 3}, gen);
  std::vector<Tensor> inputs{x};
  for (auto& p : seq->parameters()) inputs.push_back(p);
  EXPECT_GRADCHECK([&] { return seq->forward(x); }, inputs);
}

TEST(ModuleList, RegistersIndexesAndIterates) {
  Generator gen(14);
  ModuleList list;
  for (int i = 0; i < 3; ++i) list.push_back(std::make_shared<Linear>(2, 2, i != 1, gen));
  list.push_back(std::make_shared<Dropout>(0.2));
  EXPECT_EQ(list.size(), 4u);
  EXPECT_FALSE(list.empty());
  EXPECT_EQ(param_names(list), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "2.weight", "2.bias"}));
  EXPECT_EQ(list.at<Linear>(2)->in_features, 2);
  EXPECT_EQ(list[-1]->type_name(), "Dropout");
  EXPECT_ATTO_ERROR(list.at<Linear>(3), "ModuleList: module 3 is a Dropout, not the requested type");
  EXPECT_ATTO_ERROR(list[4], "ModuleList: index 4 is out of range for 4 modules");
  EXPECT_ATTO_ERROR(list.forward(zeros({2})), "ModuleList: this module does not take a single tensor");
  std::vector<std::string> types;
  for (const auto& m : list) types.push_back(m->type_name());
  EXPECT_EQ(types, (std::vector<std::string>{"Linear", "Linear", "Linear", "Dropout"}));
  list.eval();
  for (const auto& m : list) EXPECT_FALSE(m->is_training());
  ModuleList variadic(std::make_shared<ReLU>(), std::make_shared<GELU>());
  EXPECT_EQ(variadic.size(), 2u);
  EXPECT_EQ(variadic.to_string(), "ModuleList(\n  (0): ReLU()\n  (1): GELU(approximate='none')\n)");
}

// Hostile sizes (issue 14): a layer whose parameters cannot exist is an Error, never a crash or an abort (nothing
// that runs while the exception unwinds allocates).
TEST(Layers, HugeSizesAreErrors) {
  const int64_t half = int64_t{1} << 31;
  EXPECT_ATTO_ERROR(nn::Linear(half, half), "largest tensor size");
  EXPECT_ATTO_ERROR(nn::Embedding(half, half), "largest tensor size");
  // 2^50 floats: a valid size, more than any machine: the allocator says how much was asked for.
  EXPECT_ATTO_ERROR(nn::Linear(int64_t{1} << 25, int64_t{1} << 25), "out of memory allocating");
}

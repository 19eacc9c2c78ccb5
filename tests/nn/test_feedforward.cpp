// PositionwiseFeedForward in both formulations: PyTorch TransformerEncoderLayer's block
// (linear1 -> activation -> dropout -> linear2) and the seed's (w_1 -> relu -> w_2 -> dropout ->
// + residual -> layer_norm). Names, init, train/eval, gradchecks, errors, and golden files from
// PyTorch 1.13 (tests/nn/golden_layers.py).

#include <cmath>

#include "autograd/activation.h"
#include "autograd/norm.h"
#include "nn/feedforward.h"
#include "nn/init.h"
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
void check_golden(Module& m, const std::string& file) {
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
  x.requires_grad_(true);
  Tensor out = m.forward(x);
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5)) << file << ": output";
  out.backward(g.at("grad_output"));
  EXPECT_TRUE(all_close(x.grad(), g.at("grad_input"), 1e-5, 1e-4)) << file << ": grad_input";
  for (auto& [name, p] : params)
    EXPECT_TRUE(all_close(p.grad(), g.at("grad." + name), 1e-5, 1e-4)) << file << ": grad of " << name;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(FeedForward, NamesAndCountsMatchTransformerEncoderLayer) {
  auto ff = std::make_shared<PositionwiseFeedForward>(4, 8);
  // TransformerEncoderLayer: linear1, dropout, linear2 (the block's own parameters)
  EXPECT_EQ(param_names(*ff),
            (std::vector<std::string>{"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}));
  EXPECT_EQ(ff->num_parameters(), 4 * 8 + 8 + 8 * 4 + 4);
  EXPECT_EQ(ff->linear1->weight.shape(), (Shape{8, 4}));
  EXPECT_EQ(ff->linear2->weight.shape(), (Shape{4, 8}));
  EXPECT_EQ(ff->layer_norm, nullptr);
  EXPECT_DOUBLE_EQ(ff->dropout->p(), 0.1);
  std::vector<std::string> children;
  for (auto& [n, _] : ff->named_children()) children.push_back(n);
  EXPECT_EQ(children, (std::vector<std::string>{"linear1", "dropout", "linear2"}));
}

TEST(FeedForward, SeedFormulationNames) {
  auto ff = std::make_shared<PositionwiseFeedForward>(4, 8, FeedForwardOptions{.residual_norm = true});
  // the seed's PositionwiseFeedForward(d_in=4, d_hid=8).named_parameters()
  EXPECT_EQ(param_names(*ff), (std::vector<std::string>{"w_1.weight", "w_1.bias", "w_2.weight", "w_2.bias",
                                                        "layer_norm.weight", "layer_norm.bias"}));
  EXPECT_EQ(ff->num_parameters(), 76 + 8);
  ASSERT_NE(ff->layer_norm, nullptr);
  EXPECT_DOUBLE_EQ(ff->layer_norm->eps, 1e-6);
}

TEST(FeedForward, DefaultInitAndSeededReproducibility) {
  Generator a(1), b(1);
  PositionwiseFeedForward x(16, 64, {}, a), y(16, 64, {}, b);
  EXPECT_LE(max_abs(x.linear1->weight), 1.0 / 4.0);  // 1/sqrt(d_model)
  EXPECT_GT(max_abs(x.linear1->weight), 0.95 / 4.0);
  EXPECT_LE(max_abs(x.linear2->weight), 1.0 / 8.0);  // 1/sqrt(d_ff)
  EXPECT_GT(max_abs(x.linear2->weight), 0.95 / 8.0);
  for (auto& [n, p] : x.named_parameters()) EXPECT_EQ(p.to_vector<float>(), y.parameter(n).to_vector<float>()) << n;
}

TEST(FeedForward, ForwardMatchesComposition) {
  Generator gen(2);
  Tensor x = rand({2, 3, 4}, gen);
  PositionwiseFeedForward ff(4, 6, {}, gen);
  ff.eval();
  Tensor expect = ff.linear2->forward(relu(ff.linear1->forward(x)));
  EXPECT_EQ(ff(x).to_vector<float>(), expect.to_vector<float>());

  PositionwiseFeedForward g(4, 6, {.activation = "gelu"}, gen);
  g.eval();
  Tensor expect_g = g.linear2->forward(gelu(g.linear1->forward(x)));
  EXPECT_EQ(g(x).to_vector<float>(), expect_g.to_vector<float>());

  PositionwiseFeedForward seed(4, 6, {.residual_norm = true}, gen);
  seed.eval();
  Tensor expect_s = layer_norm(seed.linear2->forward(relu(seed.linear1->forward(x))) + x, {4}, seed.layer_norm->weight,
                               seed.layer_norm->bias, 1e-6);
  EXPECT_EQ(seed(x).to_vector<float>(), expect_s.to_vector<float>());
}

TEST(FeedForward, TrainEvalAndReplayableDropout) {
  Generator gen(3), masks(0);
  PositionwiseFeedForward ff(4, 16, {.dropout = 0.5}, gen);
  ff.set_generator(masks);
  Tensor x = rand({2, 5, 4}, gen);
  ff.eval();
  Tensor e1 = ff(x), e2 = ff(x);
  EXPECT_EQ(e1.to_vector<float>(), e2.to_vector<float>());
  ff.train();
  EXPECT_TRUE(ff.dropout->is_training());
  masks.manual_seed(77);
  Tensor t1 = ff(x);
  masks.manual_seed(77);
  Tensor t2 = ff(x);
  EXPECT_EQ(t1.to_vector<float>(), t2.to_vector<float>());
  EXPECT_NE(t1.to_vector<float>(), e1.to_vector<float>());
}

TEST(FeedForward, GradcheckBothFormulationsWithDropoutOn) {
  Generator gen(4), masks(0);
  for (FeedForwardOptions opts :
       {FeedForwardOptions{.dropout = 0.3}, FeedForwardOptions{.dropout = 0.3, .activation = "gelu"},
        FeedForwardOptions{.dropout = 0.3, .residual_norm = true}}) {
    auto ff = std::make_shared<PositionwiseFeedForward>(3, 5, opts, gen);
    ff->set_generator(masks);
    ff->to(kFloat64);
    if (ff->layer_norm) {
      init::uniform_(ff->layer_norm->weight, 0.5, 1.5, gen);
      init::uniform_(ff->layer_norm->bias, -0.5, 0.5, gen);
    }
    Tensor x = rand_leaf({2, 2, 3}, gen);
    std::vector<Tensor> inputs{x};
    for (auto& p : ff->parameters()) inputs.push_back(p);
    EXPECT_GRADCHECK(
        [&] {
          masks.manual_seed(9);
          return ff->forward(x);
        },
        inputs)
        << ff->to_string();
  }
}

TEST(FeedForward, Errors) {
  PositionwiseFeedForward ff(4, 8);
  EXPECT_ATTO_ERROR(ff(zeros({2, 5})),
                    "PositionwiseFeedForward: expected input of shape (..., d_model=4), got shape [2, 5]");
  EXPECT_ATTO_ERROR(PositionwiseFeedForward(4, 8, {.activation = "tanh"}),
                    "PositionwiseFeedForward: activation must be 'relu', 'gelu', 'gelu-tanh' or 'swiglu', got 'tanh'");
  EXPECT_ATTO_ERROR(PositionwiseFeedForward(0, 8), "d_model and d_ff must be positive, got d_model=0, d_ff=8");
  EXPECT_ATTO_ERROR(PositionwiseFeedForward(4, 8, {.dropout = 2}), "between 0 and 1, but got 2");
}

TEST(FeedForward, Printing) {
  EXPECT_EQ(PositionwiseFeedForward(4, 8).to_string(),
            "PositionwiseFeedForward(\n"
            "  activation=relu\n"
            "  (linear1): Linear(in_features=4, out_features=8, bias=True)\n"
            "  (dropout): Dropout(p=0.1, inplace=False)\n"
            "  (linear2): Linear(in_features=8, out_features=4, bias=True)\n"
            ")");
  EXPECT_EQ(PositionwiseFeedForward(4, 8, {.residual_norm = true}).to_string(),
            "PositionwiseFeedForward(\n"
            "  activation=relu, residual_norm=True\n"
            "  (w_1): Linear(in_features=4, out_features=8, bias=True)\n"
            "  (w_2): Linear(in_features=8, out_features=4, bias=True)\n"
            "  (layer_norm): LayerNorm((4,), eps=1e-06, elementwise_affine=True)\n"
            "  (dropout): Dropout(p=0.1, inplace=False)\n"
            ")");
}

TEST(FeedForward, GoldenPyTorchEvalMode) {
  PositionwiseFeedForward ff(4, 8);
  ff.eval();
  check_golden(ff, "nn/feedforward.golden");
  PositionwiseFeedForward g(4, 6, {.activation = "gelu"});
  g.eval();
  check_golden(g, "nn/feedforward_gelu.golden");
  PositionwiseFeedForward seed(4, 8, {.residual_norm = true});
  seed.eval();
  check_golden(seed, "nn/feedforward_seed.golden");
}

// Module registration, names, modes, counting, dtype conversion, tree traversal (apply, set_generator, to, train),
// state_dict / load_state_dict, the dtype option of the layers, and the init functions.

#include "autograd/dropout.h"
#include "nn/attention.h"
#include "nn/feedforward.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/positional.h"
#include "nn/seed/attention.h"
#include "nn/transformer.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {
struct Leaf : Module {
  Tensor w, b, buf;
  Leaf() {
    w = register_parameter("weight", zeros({3, 2}));
    b = register_parameter("bias", zeros({3}));
    buf = register_buffer("table", ones({4}));
  }
  std::string type_name() const override { return "Leaf"; }
};
struct Tree : Module {
  std::shared_ptr<Leaf> a, c;
  Tree() {
    a = register_module("a", std::make_shared<Leaf>());
    register_parameter("scale", ones({1}));
    c = register_module("c", std::make_shared<Leaf>());
  }
  std::string type_name() const override { return "Tree"; }
};
}  // namespace

TEST(Module, NamedParametersInRegistrationOrder) {
  Tree t;
  std::vector<std::string> names;
  for (auto& [n, p] : t.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"scale", "a.weight", "a.bias", "c.weight", "c.bias"}));
  std::vector<std::string> bufs;
  for (auto& [n, p] : t.named_buffers()) bufs.push_back(n);
  EXPECT_EQ(bufs, (std::vector<std::string>{"a.table", "c.table"}));
  EXPECT_EQ(t.num_parameters(), 1 + 2 * (6 + 3));
  EXPECT_EQ(t.parameters().size(), 5u);
  EXPECT_EQ(t.named_parameters(false).size(), 1u);
  EXPECT_TRUE(t.parameter("c.bias").is_same(t.c->b));
  EXPECT_ATTO_ERROR(t.parameter("c.nope"), "no parameter named 'c.nope'");
  std::vector<std::string> mods;
  for (auto& [n, m] : t.named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"", "a", "c"}));
}

TEST(Module, ParametersRequireGradAndTiedOnesCountOnce) {
  Tree t;
  for (auto& p : t.parameters()) EXPECT_TRUE(p.requires_grad());
  Module m;
  Tensor shared = zeros({5});
  m.register_parameter("x", shared);
  auto child = m.register_module("child", std::make_shared<Module>());
  child->register_parameter("tied", shared);
  EXPECT_EQ(m.named_parameters().size(), 1u);
  EXPECT_EQ(m.num_parameters(), 5);
}

TEST(Module, TrainEvalPropagates) {
  Tree t;
  EXPECT_TRUE(t.is_training());
  t.eval();
  EXPECT_FALSE(t.is_training());
  EXPECT_FALSE(t.a->is_training());
  EXPECT_FALSE(t.c->is_training());
  t.train();
  EXPECT_TRUE(t.c->is_training());
}

TEST(Module, ZeroGrad) {
  Leaf l;
  (l.w * 2.0).backward(ones({3, 2}));
  EXPECT_EQ(l.w.grad().to_vector<float>(), std::vector<float>(6, 2.f));
  l.zero_grad();
  EXPECT_EQ(l.w.grad().to_vector<float>(), std::vector<float>(6, 0.f));
  l.zero_grad(true);
  EXPECT_FALSE(l.w.grad().defined());
}

TEST(Module, ToDoubleConvertsInPlaceForEveryHandle) {
  Tree t;
  Tensor held = t.a->w;
  held.set({0, 0}, 1.5);
  t.to(kFloat64);
  EXPECT_EQ(held.dtype(), kFloat64);
  EXPECT_EQ(t.a->buf.dtype(), kFloat64);
  EXPECT_DOUBLE_EQ(held.at({0, 0}), 1.5);
  EXPECT_TRUE(held.requires_grad());
}

TEST(Module, ApplyVisitsChildrenFirstThenSelf) {
  Tree t;
  auto nested = std::make_shared<Tree>();
  t.a->register_module("inner", nested);
  std::vector<const Module*> order;
  Module& ret = t.apply([&order](Module& m) { order.push_back(&m); });
  EXPECT_EQ(&ret, &t);
  // a's subtree (inner's children a, c, then inner), then a, then c, then the root
  EXPECT_EQ(order,
            (std::vector<const Module*>{nested->a.get(), nested->c.get(), nested.get(), t.a.get(), t.c.get(), &t}));
}

namespace {
// A tree with a dropout at several depths and both attention modules (their attention dropout holds a generator).
struct DropoutTree : Module {
  std::shared_ptr<Dropout> top;
  std::shared_ptr<Sequential> seq;
  std::shared_ptr<Dropout> deep;
  std::shared_ptr<MultiheadAttention> mha;
  std::shared_ptr<seed::AttentionSublayer> seed_mha;
  std::shared_ptr<TransformerEncoderLayer> layer;
  std::shared_ptr<PositionalEncoding> pe;
  DropoutTree() {
    Generator init(1);
    top = register_module("top", std::make_shared<Dropout>(0.5));
    deep = std::make_shared<Dropout>(0.3);
    seq = register_module("seq", std::make_shared<Sequential>(std::make_shared<Linear>(4, 4, true, init),
                                                              std::make_shared<Sequential>(deep)));
    mha = register_module("mha", std::make_shared<MultiheadAttention>(
                                     MultiheadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dropout = 0.5}, init));
    seed_mha = register_module("seed_mha", std::make_shared<seed::AttentionSublayer>(2, 4, 2, 2, 0.5, init));
    layer =
        register_module("layer", std::make_shared<TransformerEncoderLayer>(
                                     TransformerLayerOptions{.d_model = 4, .nhead = 2, .dim_feedforward = 8}, init));
    pe = register_module("pe", std::make_shared<PositionalEncoding>(4, 16, 0.2));
  }
};
}  // namespace

TEST(Module, SetGeneratorOnTheRootReachesEveryDropout) {
  DropoutTree t;
  Generator gen(3);
  t.set_generator(gen);
  int dropouts = 0;
  for (auto& [name, m] : t.named_modules())
    if (auto* d = dynamic_cast<Dropout*>(m)) {
      EXPECT_EQ(&d->generator(), &gen) << name;
      ++dropouts;
    }
  EXPECT_EQ(dropouts, 1 + 1 + 1 + 3 + 1);  // top, deep, seed_mha.dropout, layer's three, pe.dropout

  // A dropout's mask is drawn from `gen`: the functional op with an equally seeded generator gives the same values.
  Tensor x = ones({5, 6});
  gen.manual_seed(77);
  Generator same(77);
  EXPECT_TRUE(bitwise_equal(t.deep->forward(x), dropout(x, 0.3, true, same)));

  // Attention dropout (both attention modules): re-seeding `gen` replays the output whatever the default
  // generator does, and another seed changes it.
  Generator init(2);
  Tensor q = randn({2, 3, 4}, init);
  auto run_mha = [&] { return t.mha->forward(q, q, q).output; };
  auto run_seed = [&] { return t.seed_mha->forward(q, q, q).output; };
  auto run_layer = [&] { return t.layer->forward(q); };
  for (auto run : std::vector<std::function<Tensor()>>{run_mha, run_seed, run_layer}) {
    gen.manual_seed(5);
    Tensor a = run();
    gen.manual_seed(5);
    default_generator().manual_seed(999);
    Tensor b = run();
    gen.manual_seed(6);
    Tensor c = run();
    EXPECT_TRUE(bitwise_equal(a, b));
    EXPECT_FALSE(all_close(a, c, 1e-6));
  }
}

TEST(Module, ToConvertsEveryParameterAndBufferOfTheTree) {
  DropoutTree t;
  Tensor before = t.layer->linear1->weight.detach().clone();
  t.to(kFloat64);
  EXPECT_GT(t.named_parameters().size(), 10u);
  for (auto& [n, p] : t.named_parameters()) EXPECT_EQ(p.dtype(), kFloat64) << n;
  for (auto& [n, b] : t.named_buffers()) EXPECT_EQ(b.dtype(), kFloat64) << n;
  EXPECT_EQ(t.pe->pe.dtype(), kFloat64);
  EXPECT_TRUE(all_close(t.layer->linear1->weight, before.to(kFloat64), 0, 0));
  Tensor q = randn({1, 3, 4}, default_generator(), {.dtype = kFloat64});
  t.eval();
  EXPECT_EQ(t.layer->forward(q).dtype(), kFloat64);
  EXPECT_ATTO_ERROR(t.to(kInt64), "Module: to: expected a float dtype");
}

TEST(Module, TrainAndEvalReachEveryModuleAndChain) {
  DropoutTree t;
  Module& r = t.eval();
  EXPECT_EQ(&r, &t);
  for (auto& [n, m] : t.named_modules()) EXPECT_FALSE(m->is_training()) << n;
  t.train();
  for (auto& [n, m] : t.named_modules()) EXPECT_TRUE(m->is_training()) << n;
  t.seq->eval();  // a subtree only
  EXPECT_TRUE(t.is_training());
  EXPECT_FALSE(t.deep->is_training());
  EXPECT_TRUE(t.layer->dropout1->is_training());
}

// ---------------------------------------------------------------------------------------------
// state_dict / load_state_dict

TEST(StateDict, ParametersThenBuffersWithDottedNames) {
  Tree t;
  std::vector<std::string> names;
  for (auto& [n, v] : t.state_dict()) names.push_back(n);
  EXPECT_EQ(names,
            (std::vector<std::string>{"scale", "a.weight", "a.bias", "c.weight", "c.bias", "a.table", "c.table"}));
  EXPECT_TRUE(t.state_dict()[1].second.is_same(t.a->w));  // shares data
}

TEST(StateDict, LoadCopiesValuesIn) {
  Tree src, dst;
  src.a->w.set({1, 1}, 2.5);
  src.c->buf.set({3}, -4.0);
  Tensor held = dst.a->w;
  LoadStateDictResult r = dst.load_state_dict(src.state_dict());
  EXPECT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(held.at({1, 1}), 2.5);  // in place: every handle sees it
  EXPECT_DOUBLE_EQ(dst.c->buf.at({3}), -4.0);
  EXPECT_FALSE(held.is_same(src.a->w));
  src.a->w.set({1, 1}, 9.0);  // copied, not shared
  EXPECT_DOUBLE_EQ(held.at({1, 1}), 2.5);
  EXPECT_TRUE(held.requires_grad());
  EXPECT_TRUE(held.is_leaf());
}

TEST(StateDict, StrictLoadNamesMissingUnexpectedAndMismatchedKeys) {
  Tree dst;
  StateDict state = Tree().state_dict();
  state.erase(state.begin() + 1);             // a.weight missing
  state.emplace_back("a.extra", zeros({1}));  // unexpected
  state[0].second = zeros({2});               // scale: shape [2] for [1]
  EXPECT_ATTO_ERROR(dst.load_state_dict(state),
                    "load_state_dict: state dict: strict load failed: 1 missing (in the model, not in the state): "
                    "a.weight; 1 unexpected (in the state, not in the model): a.extra; 1 mismatched: scale (state [2] "
                    "float32, model [1] float32); nothing was loaded");
  dst.c->b.set({0}, 3.0);
  state[3].second = full({3}, 7.0);  // c.bias: would load, but the strict load loads nothing
  EXPECT_ANY_THROW(dst.load_state_dict(state));
  EXPECT_DOUBLE_EQ(dst.c->b.at({0}), 3.0);
  LoadStateDictResult r = dst.load_state_dict(state, {.strict = false});
  EXPECT_EQ(r.missing, (std::vector<std::string>{"a.weight"}));
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"a.extra"}));
  EXPECT_EQ(r.mismatched, (std::vector<std::string>{"scale"}));
  EXPECT_DOUBLE_EQ(dst.c->b.at({0}), 7.0);  // what matched was loaded
}

TEST(StateDict, DtypeMismatchIsAnErrorUnlessTheCastIsAllowed) {
  Tree f32;
  Tree f64;
  f64.to(kFloat64);
  f64.a->w.set({0, 1}, 0.1);  // not representable in float32
  EXPECT_ATTO_ERROR(f32.load_state_dict(f64.state_dict()),
                    "scale (state [1] float64, model [1] float32; pass allow_dtype_cast = true to convert)");
  LoadStateDictResult r = f32.load_state_dict(f64.state_dict(), {.strict = false});
  EXPECT_EQ(r.mismatched.size(), 7u);
  EXPECT_EQ(f32.a->w.at({0, 1}), 0.0);  // nothing converted
  EXPECT_TRUE(f32.load_state_dict(f64.state_dict(), {.allow_dtype_cast = true}).ok());
  EXPECT_EQ(f32.a->w.dtype(), kFloat32);
  EXPECT_EQ(f32.a->w.at({0, 1}), static_cast<double>(0.1f));  // rounded to float32
  // Non-float dtypes never convert, even with the cast allowed.
  Module ints;
  ints.register_buffer("ids", zeros({2}, {.dtype = kInt64}));
  EXPECT_ATTO_ERROR(ints.load_state_dict({{"ids", zeros({2})}}, {.allow_dtype_cast = true}),
                    "ids (state [2] float32, model [2] int64)");
}

// ---------------------------------------------------------------------------------------------
// The dtype option of the layers: the same values as building in float32 and calling to(dtype)

namespace {
void expect_equal_state(const Module& built, Module& converted, const char* what) {
  converted.to(kFloat64);
  auto a = built.state_dict();
  auto b = converted.state_dict();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first) << what;
    EXPECT_EQ(a[i].second.dtype(), kFloat64) << what << " " << a[i].first;
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << what << " " << a[i].first;
    EXPECT_EQ(a[i].second.requires_grad(), b[i].second.requires_grad()) << what << " " << a[i].first;
  }
}
}  // namespace

TEST(LayerDtype, EveryLayerBuildsInTheRequestedDtype) {
  {
    Generator g1(5), g2(5);
    Linear a(4, 2, {.dtype = kFloat64}, g1);
    Linear b(4, 2, true, g2);
    expect_equal_state(a, b, "Linear");
    Tensor x = randn({3, 4}, g1, {.dtype = kFloat64});
    EXPECT_EQ(a(x).dtype(), kFloat64);
    Linear no_bias(4, 2, {.bias = false, .dtype = kFloat64});
    EXPECT_FALSE(no_bias.bias.defined());
    EXPECT_EQ(no_bias.weight.dtype(), kFloat64);
  }
  {
    Generator g1(6), g2(6);
    Embedding a(7, 3, {.padding_idx = 1, .dtype = kFloat64}, g1);
    Embedding b(7, 3, 1, g2);
    expect_equal_state(a, b, "Embedding");
    EXPECT_EQ(a.weight.at({1, 2}), 0.0);
  }
  {
    LayerNorm a(5, {.eps = 1e-6, .dtype = kFloat64});
    LayerNorm b(5, 1e-6);
    expect_equal_state(a, b, "LayerNorm");
    EXPECT_EQ(a.eps, 1e-6);
  }
  {
    Generator g1(7), g2(7);
    MultiheadAttention a({.embed_dim = 4, .num_heads = 2, .add_bias_kv = true, .dtype = kFloat64}, g1);
    MultiheadAttention b({.embed_dim = 4, .num_heads = 2, .add_bias_kv = true}, g2);
    expect_equal_state(a, b, "MultiheadAttention");
  }
  {
    Generator g1(8), g2(8);
    seed::AttentionSublayer a(2, 6, 3, 3, 0.1, g1, kFloat64);
    seed::AttentionSublayer b(2, 6, 3, 3, 0.1, g2);
    expect_equal_state(a, b, "AttentionSublayer");
  }
  {
    Generator g1(9), g2(9);
    PositionwiseFeedForward a(4, 8, {.residual_norm = true, .dtype = kFloat64}, g1);
    PositionwiseFeedForward b(4, 8, {.residual_norm = true}, g2);
    expect_equal_state(a, b, "PositionwiseFeedForward");
  }
  {
    PositionalEncoding a(6, 10, 0.0, default_generator(), kFloat64);
    PositionalEncoding b(6, 10);
    expect_equal_state(a, b, "PositionalEncoding");
  }
  {
    Generator g1(10), g2(10);
    TransformerLayerOptions o{.d_model = 4, .nhead = 2, .dim_feedforward = 8};
    TransformerLayerOptions o64 = o;
    o64.dtype = kFloat64;
    TransformerEncoderLayer a(o64, g1);
    TransformerEncoderLayer b(o, g2);
    expect_equal_state(a, b, "TransformerEncoderLayer");
    TransformerDecoderLayer c(o64, g1);
    TransformerDecoderLayer d(o, g2);
    expect_equal_state(c, d, "TransformerDecoderLayer");
    TransformerEncoder e(o64, 2, true, g1);
    TransformerEncoder f(o, 2, true, g2);
    expect_equal_state(e, f, "TransformerEncoder");
    TransformerDecoder h(o64, 1, true, g1);
    TransformerDecoder i(o, 1, true, g2);
    expect_equal_state(h, i, "TransformerDecoder");
  }
  EXPECT_ATTO_ERROR(Linear(2, 2, {.dtype = kInt64}),
                    "Linear: to: expected a float dtype (float32 or float64), got int64");
  // Empty braces are the default options, never a positional false / 0.
  Generator g(12);
  EXPECT_TRUE(Linear(4, 2, {}, g).bias.defined());
  EXPECT_EQ(Embedding(5, 2, {}, g).padding_idx, -1);
  EXPECT_EQ(LayerNorm(4, {}).eps, 1e-5);
  EXPECT_EQ(LayerNorm(Shape{2, 3}, {}).eps, 1e-5);
  EXPECT_FALSE(Linear(4, 2, false, g).bias.defined());
  EXPECT_EQ(Embedding(5, 2, 3, g).padding_idx, 3);
  EXPECT_FALSE(LayerNorm(4, 1e-3, false).elementwise_affine);
}

TEST(Module, RegistrationErrors) {
  Leaf l;
  EXPECT_ATTO_ERROR(l.register_parameter("weight", zeros({1})), "name 'weight' is already a parameter");
  EXPECT_ATTO_ERROR(l.register_buffer("a.b", zeros({1})), "invalid name 'a.b'");
  EXPECT_ATTO_ERROR(l.forward(zeros({1})), "Leaf: this module does not take a single tensor");
}

TEST(Module, ToStringNestsChildren) {
  Tree t;
  EXPECT_EQ(t.to_string(), "Tree(\n  (a): Leaf()\n  (c): Leaf()\n)");
}

TEST(Init, XavierUniformBoundsAndSpread) {
  Generator g(1);
  Tensor w = zeros({200, 300}, {.dtype = kFloat64});
  init::xavier_uniform_(w, 1.0, g);
  double a = std::sqrt(6.0 / 500.0), mx = 0, s2 = 0;
  for (double v : w.to_vector<double>()) {
    mx = std::max(mx, std::fabs(v));
    s2 += v * v;
  }
  EXPECT_LE(mx, a);
  EXPECT_GT(mx, 0.99 * a);
  EXPECT_NEAR(s2 / w.numel(), a * a / 3.0, 0.02 * a * a / 3.0);
}

TEST(Init, XavierNormalKaimingAndConstants) {
  Generator g(2);
  Tensor w = zeros({400, 100}, {.dtype = kFloat64});
  init::xavier_normal_(w, 2.0, g);
  double s2 = 0;
  for (double v : w.to_vector<double>()) s2 += v * v;
  double std = 2.0 * std::sqrt(2.0 / 500.0);
  EXPECT_NEAR(std::sqrt(s2 / w.numel()), std, 0.02 * std);
  Tensor k = zeros({50, 64}, {.dtype = kFloat64});
  init::kaiming_uniform_(k, std::sqrt(5.0), "fan_in", g);  // nn.Linear's default: bound 1/sqrt(in)
  for (double v : k.to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 8.0 + 1e-12);
  init::ones_(k);
  EXPECT_DOUBLE_EQ(k.at({3, 3}), 1.0);
  init::zeros_(k);
  EXPECT_DOUBLE_EQ(k.at({3, 3}), 0.0);
  EXPECT_ATTO_ERROR(init::xavier_uniform_(zeros({3})), "at least 2 dimensions, got shape [3]");
  EXPECT_ATTO_ERROR(init::kaiming_uniform_(zeros({3, 3}), 0, "fan_xx"), "mode must be fan_in or fan_out");
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
}

TEST(Init, SameSeedSameWeights) {
  Generator a(9), b(9);
  Tensor x = zeros({4, 4}), y = zeros({4, 4});
  init::xavier_uniform_(x, 1.0, a);
  init::xavier_uniform_(y, 1.0, b);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
}

// The attention-layer interface and its registry (nn/attention_layer.h): the built-in kinds as implementations, a
// user's kind registered and used by the decoder-only model (training forward, decoding from its own cache), a
// kind's own options through the spec's JSON, the registry's errors, and a scan of the sources: no code outside an
// implementation (nn/attention/*.cpp) compares attention kind names.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "nn/attention_layer.h"
#include "nn/linear_attention.h"
#include "nn/mla.h"
#include "nn/models.h"
#include "nn/decode_testing.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

namespace {

const AttentionConfig kConfig = {.d_model = 16, .heads = 4, .dropout = 0.0, .max_len = 12};

// A user's kind: MultiheadAttention whose output is scaled by the option "gain" (default 1): everything else,
// the decoding cache included, is MultiheadAttention's.
class GainAttention : public MultiheadAttention {
 public:
  GainAttention(const MultiheadAttentionOptions& o, double gain, Generator& gen)
      : MultiheadAttention(o, gen), gain_(gain) {}
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override {
    AttentionOutput r = MultiheadAttention::forward(x, call);
    r.output = r.output * gain_;
    return r;
  }
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override {
    return MultiheadAttention::forward_cached(x, cache, rows) * gain_;
  }
  using MultiheadAttention::forward;

 private:
  double gain_;
};

void register_gain() {
  register_attention(
      "test-gain",
      [](const AttentionSpec& s, const AttentionConfig& c, Generator& gen) {
        return std::make_shared<GainAttention>(
            MultiheadAttentionOptions{.embed_dim = c.d_model, .num_heads = c.heads, .dropout = c.dropout},
            attention_option(s, "gain", 1.0), gen);
      },
      AttentionKindInfo{.description = "test: scaled multi-head attention",
                        .validate = [](const AttentionSpec& s, int64_t) {
                          ATTO_CHECK(attention_option(s, "gain", 1.0) > 0, "test-gain", "gain must be positive");
                        }});
}

// A user's kind with no cache of its own (AttentionLayer's default make_cache): the model decodes by recomputing.
class NoCacheAttention : public AttentionLayer {
 public:
  NoCacheAttention(int64_t D, int64_t H, Generator& gen) {
    mha_ = register_module("inner", std::make_shared<MultiheadAttention>(
                                        MultiheadAttentionOptions{.embed_dim = D, .num_heads = H}, gen));
  }
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override { return mha_->forward(x, call); }
  using AttentionLayer::forward;

 private:
  std::shared_ptr<MultiheadAttention> mha_;
};

std::shared_ptr<CausalLM> lm(const AttentionSpec& a, uint64_t seed = 3) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(
      CausalLMOptions{.vocab = 13, .d_model = 16, .n_head = 4, .d_ff = 32, .n_layers = 2, .dropout = 0.0,
                      .max_len = 20, .pad_idx = 0, .dtype = kFloat64, .attention = a},
      gen);
  m->eval();
  return m;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(AttentionLayer, BuiltInKindsAreImplementationsOfTheInterface) {
  const std::vector<std::pair<std::string, std::string>> kinds = registered_attentions();
  ASSERT_GE(kinds.size(), 6u);
  const std::vector<std::string> first = {"mha", "gqa", "mla", "local", "block-sparse", "linear"};
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(kinds[i].first, first[i]);
  const std::vector<std::pair<AttentionSpec, std::string>> cases = {
      {{.kind = "mha"}, "MultiheadAttention"},
      {{.kind = "gqa", .kv_heads = 2}, "MultiheadAttention"},
      {{.kind = "mla"}, "MultiHeadLatentAttention"},
      {{.kind = "local", .window = 3}, "MultiheadAttention"},
      {{.kind = "block-sparse", .block = 2}, "MultiheadAttention"},
      {{.kind = "linear"}, "LinearAttention"}};
  for (const auto& [spec, type] : cases) {
    SCOPED_TRACE(spec.kind);
    Generator gen(1);
    std::shared_ptr<AttentionLayer> a = make_attention(spec, kConfig, gen);
    EXPECT_EQ(a->type_name(), type);
    EXPECT_EQ(a->kind(), spec.kind);
    EXPECT_EQ(a->options_json(), spec.to_json());
    Tensor x = randn({2, 5, 16}, gen);  // float32, as the parameters
    AttentionOutput r = a->forward(x, {});
    EXPECT_EQ(r.output.shape(), (Shape{2, 5, 16}));
    std::shared_ptr<AttentionCache> c = a->make_cache(2, 7);
    ASSERT_TRUE(c != nullptr);
    EXPECT_EQ(c->capacity(), 7);
    EXPECT_GT(c->bytes(), 0);
  }
}

TEST(AttentionLayer, FactsOfTheBuiltInKinds) {
  // D = 16, H = 4, d = 4, L = 12.
  const AttentionFacts mha = attention_facts({}, kConfig);
  EXPECT_EQ(mha.weights, 4 * 16 * 16);
  EXPECT_EQ(mha.cache_per_token, 2 * 16);
  EXPECT_EQ(mha.kept_per_row, 12);
  EXPECT_EQ(mha.flops, 4 * 16 * (12 * 13 / 2));
  EXPECT_FALSE(mha.own_positions);
  EXPECT_TRUE(attention_facts({.rope = true}, kConfig).own_positions);
  EXPECT_EQ(attention_facts({.kind = "gqa", .kv_heads = 2}, kConfig).cache_per_token, 2 * 2 * 4);
  EXPECT_EQ(attention_facts({.kind = "gqa", .kv_heads = 2}, kConfig).weights, 2 * 16 * 16 + 2 * 16 * 2 * 4);
  const AttentionFacts mla = attention_facts({.kind = "mla"}, kConfig);
  EXPECT_EQ(mla.cache_per_token, 16 / 4 + 4 / 2);  // kv_rank D / 4, rope_dim d / 2
  EXPECT_FALSE(mla.own_positions);  // the model's table since issue 23; rope: DeepSeek's form, RoPE only
  EXPECT_TRUE(attention_facts({.kind = "mla", .rope = true}, kConfig).own_positions);
  EXPECT_TRUE(attention_facts({.kind = "alibi"}, kConfig).own_positions);  // the distance penalty is the position
  EXPECT_FALSE(attention_facts({.kind = "softcap"}, kConfig).own_positions);
  EXPECT_EQ(attention_facts({.kind = "local", .window = 3}, kConfig).kept_per_row, 3);
  // Rows 0..2 see 1, 2, 3 keys, the 9 others 3.
  EXPECT_EQ(attention_facts({.kind = "local", .window = 3}, kConfig).flops, 4 * 16 * (6 + 9 * 3));
  // Blocks of 4 (3 blocks, local 1, global 1), causal: block 0 its triangle 10; block 1: 16 + 10; block 2: block 0
  // 16, block 1 16, its triangle 10.
  EXPECT_EQ(attention_facts({.kind = "block-sparse", .block = 4}, kConfig).flops, 4 * 16 * (10 + 26 + 42));
  const AttentionFacts lin = attention_facts({.kind = "linear"}, kConfig);
  EXPECT_EQ(lin.cache_per_token, 0);
  EXPECT_EQ(lin.state_per_row, 4 * 4 * 5);
  EXPECT_FALSE(lin.softmax);
  EXPECT_FALSE(lin.key_padding);
}

TEST(AttentionLayer, RegistryErrorsNameTheKindsAndFields) {
  EXPECT_ATTO_ERROR(AttentionSpec{.kind = "flash"}.validate(4),
                    "unknown attention \"flash\" (registered: mha, gqa, mla, local, block-sparse, linear");
  EXPECT_ATTO_ERROR(make_attention({.kind = "flash"}, kConfig), "registered: mha, gqa");
  EXPECT_ATTO_ERROR(register_attention("", [](const AttentionSpec&, const AttentionConfig&, Generator&) {
                      return std::shared_ptr<AttentionLayer>();
                    }),
                    "must not be empty");
  EXPECT_ATTO_ERROR(register_attention("x", AttentionFactory()), "no factory");
  EXPECT_ATTO_ERROR(register_attention("x", [](const AttentionSpec&, const AttentionConfig&, Generator& g) {
                      return std::static_pointer_cast<AttentionLayer>(std::make_shared<NoCacheAttention>(16, 4, g));
                    }, AttentionKindInfo{.fields = {"slopes"}}),
                    "unknown AttentionSpec field \"slopes\"");
  register_attention("test-null", [](const AttentionSpec&, const AttentionConfig&, Generator&) {
    return std::shared_ptr<AttentionLayer>();
  });
  EXPECT_ATTO_ERROR(make_attention({.kind = "test-null"}, kConfig), "returned no layer");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "mha", .options = "[1]"}.validate(4)), "options must be a JSON object");
  EXPECT_ATTO_ERROR(attention_option({.options = "{\"gain\": \"x\"}"}, "gain", 1), "must be a number");
}

TEST(AttentionLayer, UserKindTrainsDecodesAndRoundTripsItsOptions) {
  register_gain();
  EXPECT_TRUE(has_attention("test-gain"));
  // A field the kind does not read is refused, naming the kinds that read it.
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "test-gain", .window = 2}.validate(4)),
                    "window applies to attention local, not test-gain");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "test-gain", .rope = true}.validate(4)),
                    "rope applies to softmax attention with a query/key per head (mha, gqa, mla, local, block-sparse, "
                    "softcap, prefix-lm, document), not test-gain");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "test-gain", .options = R"({"gain": -1})"}.validate(4)),
                    "gain must be positive");
  // Its options survive ModelSpec's JSON; a built-in spec's JSON has no "options".
  const AttentionSpec spec{.kind = "test-gain", .options = R"({"gain":0.5})"};
  const ModelSpec ms{.vocab = 13, .max_source_len = 4, .max_target_len = 4, .attention = spec};
  const std::string j = ms.to_json();
  EXPECT_NE(j.find(R"("attention":{"kind":"test-gain","kv_heads":0,"kv_rank":0,"q_rank":0,"rope_dim":0,"window":0,)"
                   R"("block":0,"rope":false,"checkpoint":false,"options":{"gain":0.5}})"),
            std::string::npos)
      << j;
  EXPECT_EQ(ModelSpec::from_json(j), ms);
  EXPECT_EQ(attention_option(ModelSpec::from_json(j).attention, "gain", 1.0), 0.5);
  EXPECT_EQ((AttentionSpec{.kind = "gqa", .kv_heads = 2}.to_json()),
            R"({"kind":"gqa","kv_heads":2,"kv_rank":0,"q_rank":0,"rope_dim":0,"window":0,"block":0,"rope":false,)"
            R"("checkpoint":false})");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"attention": {"kind": "mha", "options": 3}})"),
                    "attention.options\" must be an object");

  // The model built with it: the same parameters and names as mha (it is a MultiheadAttention), the output scaled.
  auto user = lm(spec), plain = lm({});
  ASSERT_EQ(user->named_parameters().size(), plain->named_parameters().size());
  for (size_t i = 0; i < plain->named_parameters().size(); ++i) {
    EXPECT_EQ(user->named_parameters()[i].first, plain->named_parameters()[i].first);
    EXPECT_TRUE(bitwise_equal(user->named_parameters()[i].second, plain->named_parameters()[i].second));
  }
  EXPECT_EQ(user->block(0)->self_attn->kind(), "test-gain");
  Tensor tokens = from_vector(std::vector<int64_t>{4, 5, 6, 3, 7, 8}, {1, 6});
  {
    NoGradGuard no_grad;
    const Tensor a = user->forward(tokens), b = plain->forward(tokens);  // (1, 6, 13)
    double diff = 0;
    for (int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, std::abs(a.flat(i) - b.flat(i)));
    EXPECT_GT(diff, 1e-3);
  }
  // Decoding from its own (inherited) cache gives the recomputed tokens.
  expect_same_decode(run_greedy(*user, kDecodeSources, 6, true), run_greedy(*user, kDecodeSources, 6, false),
                     kFloat64);
  EXPECT_EQ(run_greedy(*user, kDecodeSources, 1, true).cache_blocks, 2u);
  EXPECT_EQ(user->kv_cache_bytes_per_token(), 2 * 16 * 8);  // the default facts: multi-head softmax attention
}

TEST(AttentionLayer, KindWithoutCacheDecodesByRecomputing) {
  register_attention("test-nocache", [](const AttentionSpec&, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<NoCacheAttention>(c.d_model, c.heads, gen);
  });
  auto m = lm({.kind = "test-nocache"});
  EXPECT_NO_THROW(m->parameter("blocks.0.self_attn.inner.in_proj_weight"));
  const DecodeTrace cached = run_greedy(*m, kDecodeSources, 5, true);
  EXPECT_EQ(cached.cache_blocks, 0u);  // no cache: every step recomputes
  expect_same_decode(cached, run_greedy(*m, kDecodeSources, 5, false), kFloat64);
  Generator gen(1);
  NoCacheAttention a(16, 4, gen);
  CachedAttentionRows rows{.cache_row = {0}, .start = {0}, .count = {1}};
  KeyValueCache kv;
  EXPECT_ATTO_ERROR(a.forward_cached(zeros({1, 1, 16}), kv, rows), "has no decoding cache");
}

TEST(AttentionLayer, EncoderAndSeq2SeqAcceptTheMultiheadKindsOnly) {
  register_gain();
  MultiheadAttentionOptions o;
  std::string supported;
  EXPECT_TRUE(attention_as_multihead({.kind = "gqa", .kv_heads = 2}, kConfig, &o, &supported));
  EXPECT_EQ(o.num_kv_heads, 2);
  EXPECT_EQ(supported, "mha, gqa, local, block-sparse, alibi, softcap");
  EXPECT_FALSE(attention_as_multihead({.kind = "test-gain"}, kConfig, &o, &supported));
  EXPECT_ATTO_ERROR(make_model("encoder", {.vocab = 9, .max_source_len = 4, .max_target_len = 4, .aligned = true,
                                           .attention = {.kind = "test-gain"}}),
                    "\"encoder\" does not support attention test-gain (supported: mha, gqa, local, block-sparse");
  // A kind made of a score_mod is a MultiheadAttention, but the encoder's and the seed's layers take only its
  // key/value heads, window and block: refused rather than silently dropped.
  for (const char* kind : {"alibi", "softcap"}) {
    SCOPED_TRACE(kind);
    EXPECT_ATTO_ERROR(make_model("encoder", {.vocab = 9, .max_source_len = 4, .max_target_len = 4, .aligned = true,
                                             .attention = {.kind = kind}}),
                      str_cat("\"encoder\" does not support attention ", kind, " (a score_mod / mask_mod kind"));
    EXPECT_ATTO_ERROR(make_model("seq2seq", {.vocab = 9, .max_source_len = 4, .max_target_len = 4,
                                             .attention = {.kind = kind}}),
                      str_cat("\"seq2seq\" does not support attention ", kind, " (a score_mod / mask_mod kind"));
  }
}

TEST(AttentionLayer, NoCodeOutsideAnImplementationComparesKindNames) {
  // A comparison with a built-in kind's name ("kind == \"gqa\"", "attention != \"mla\""), or a list of them (an
  // IsMember / one_of of kind names), anywhere in the library, the tools and the examples but the implementations.
  const std::filesystem::path root = std::filesystem::path(ATTOGRAD_TEST_DATA) / ".." / "..";
  const std::string names = "(mha|gqa|mla|local|block-sparse|linear|seed-mha)";
  const std::regex compare("(kind|attention)[A-Za-z_.()]*\\s*[!=]=\\s*\"" + names + "\"|\"" + names +
                           "\"\\s*[!=]=\\s*[A-Za-z_.]*(kind|attention)|\\{\\s*\"mha\",\\s*\"gqa\"");
  int scanned = 0;
  std::set<std::string> seen;
  for (const char* dir : {"nn", "train", "examples", "autograd"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
      const std::string rel = std::filesystem::relative(e.path(), root).generic_string();
      if (rel.rfind("nn/attention/", 0) == 0) continue;  // the implementations
      ++scanned;
      seen.insert(rel);
      std::istringstream lines(slurp(e.path()));
      std::string line;
      for (int n = 1; std::getline(lines, line); ++n)
        EXPECT_FALSE(std::regex_search(line, compare)) << rel << ":" << n << ": " << line;
    }
  }
  EXPECT_GT(scanned, 50);
  // Among them the models' files: the decoder-only, encoder-only and seq2seq models and the layers they build on.
  for (const char* f : {"nn/models.cpp", "nn/sequence_model.cpp", "nn/encoder_tagger.cpp", "nn/encoder_tagger.h",
                        "nn/transformer.cpp", "nn/transformer.h", "nn/seed/transformer.cpp", "nn/seed/transformer.h",
                        "nn/seed/attention.cpp", "nn/seed/attention.h",
                        "train/tools/bench.cpp", "train/tools/gradcheck_suite.cpp",
                        "examples/cli/cli_bench.cpp"})
    EXPECT_TRUE(seen.count(f) == 1) << f << " was not scanned";
  // The scan finds what it looks for.
  EXPECT_TRUE(std::regex_search(std::string("if (at.kind == \"mla\") {"), compare));
  EXPECT_TRUE(std::regex_search(std::string("c.attention != \"linear\""), compare));
  EXPECT_TRUE(std::regex_search(std::string("layer.kind() == \"seed-mha\""), compare));
  EXPECT_TRUE(std::regex_search(std::string("CLI::IsMember({\"mha\", \"gqa\", \"mla\"})"), compare));
  EXPECT_FALSE(std::regex_search(std::string("if (nl == \"linear\")"), compare));
}

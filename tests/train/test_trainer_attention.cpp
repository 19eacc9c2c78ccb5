// The Trainer with the attention variants of issue 16: the TrainConfig fields (JSON only when not default,
// validation, model_sizes, the memory lower bound), and the attention-entropy regulariser (its gradient against one
// written out by hand in double, bitwise nothing when off, the metrics.csv columns, the refusal for linear attention).

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "testing.h"
#include "autograd/loss.h"
#include "nn/models.h"
#include "train/trainer.h"

namespace attograd::train {
namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path(::testing::TempDir() + "attograd_trainer_attention_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path.c_str()); }
};

// A small config of the decoder-only model on reverse (lengths 1..5).
TrainConfig tiny() {
  TrainConfig c;
  c.task = "reverse";
  c.layers = 2;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.max_len = 5;
  c.batch = 8;
  c.steps = 4;
  c.warmup = 1;
  c.eval_every = 0;
  c.eval_size = 20;
  c.seed = 3;
  return c;
}

::testing::AssertionResult same_weights(nn::Module& a, nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return ::testing::AssertionFailure() << pa.size() << " vs " << pb.size() << " params";
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor &x = pa[i].second, &y = pb[i].second;
    if (pa[i].first != pb[i].first || x.nbytes() != y.nbytes() ||
        std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0)
      return ::testing::AssertionFailure() << "parameter " << pa[i].first << " differs";
  }
  return ::testing::AssertionSuccess();
}

TEST(TrainConfigAttention, JsonHasTheFieldsOnlyWhenNotDefault) {
  const std::string plain = TrainConfig{}.to_json();
  for (const char* key : {"attention", "kv_heads", "kv_rank", "q_rank", "window", "block", "attention_options", "rope",
                          "checkpoint_activations", "entropy_reg", "log_entropy"})
    EXPECT_EQ(plain.find(std::string("\"") + key + "\""), std::string::npos) << key;
  // The default's JSON is the one of the configuration before these fields (grad_accum's last field: threads).
  EXPECT_TRUE(plain.ends_with("\"threads\": 1\n}")) << plain;

  TrainConfig c;
  c.attention = "mla";
  c.kv_rank = 8;
  c.q_rank = 12;
  c.rope = false;
  c.checkpoint_activations = true;
  c.entropy_reg = 0.25;
  c.log_entropy = true;
  const std::string j = c.to_json();
  EXPECT_NE(j.find("\"attention\": \"mla\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"checkpoint_activations\": true"), std::string::npos) << j;
  EXPECT_EQ(j.find("\"window\""), std::string::npos) << j;  // still the default
  EXPECT_EQ(TrainConfig::from_json(j), c);
  TrainConfig d;
  d.attention = "local";
  d.window = 5;
  d.rope = true;
  EXPECT_EQ(TrainConfig::from_json(d.to_json(-1)), d);
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"rope": 1})"), "field \"rope\" must be true or false");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"attention": 3})"), "field \"attention\" must be a string");
}

TEST(TrainConfigAttention, ValidateNamesTheField) {
  TrainConfig c = tiny();
  c.validate();
  c.window = 4;  // with mha
  EXPECT_ATTO_ERROR(c.validate(), "window applies to attention local, not mha");
  c = tiny();
  c.attention = "gqa";
  c.kv_heads = 4;  // heads = 2
  EXPECT_ATTO_ERROR(c.validate(), "kv_heads");
  c = tiny();
  c.attention = "local";
  EXPECT_ATTO_ERROR(c.validate(), "window (--window) > 0");
  c = tiny();
  c.attention = "flash";
  EXPECT_ATTO_ERROR(c.validate(), "unknown attention \"flash\"");
  c = tiny();
  c.attention = "linear";
  c.rope = true;
  EXPECT_ATTO_ERROR(c.validate(), "rope applies to softmax attention");
  c = tiny();
  c.entropy_reg = std::nan("");
  EXPECT_ATTO_ERROR(c.validate(), "entropy_reg must be finite");
}

TEST(TrainConfigAttention, ModelSizesCarryTheSpec) {
  TrainConfig c = tiny();
  c.attention = "block-sparse";
  c.block = 3;
  c.rope = true;
  c.checkpoint_activations = true;
  const nn::AttentionSpec a = c.model_sizes().attention;
  EXPECT_EQ(a, (nn::AttentionSpec{.kind = "block-sparse", .block = 3, .rope = true, .checkpoint = true}));
  EXPECT_EQ(tiny().model_sizes().attention, nn::AttentionSpec{});
}

TEST(TrainConfigAttention, MemoryEstimateIsALowerBoundForEveryKind) {
  struct Case {
    const char* kind;
    int64_t kv_heads, kv_rank, q_rank, window, block;
  };
  const Case cases[] = {{"mha", 0, 0, 0, 0, 0},   {"gqa", 1, 0, 0, 0, 0},   {"mla", 0, 0, 0, 0, 0},
                        {"mla", 0, 6, 10, 0, 0},  {"local", 0, 0, 0, 3, 0}, {"block-sparse", 0, 0, 0, 0, 2},
                        {"linear", 0, 0, 0, 0, 0}};
  double mha = 0;
  for (const Case& k : cases) {
    TrainConfig c = tiny();
    c.d_model = 32;
    c.heads = 4;
    c.attention = k.kind;
    c.kv_heads = k.kv_heads, c.kv_rank = k.kv_rank, c.q_rank = k.q_rank, c.window = k.window, c.block = k.block;
    Trainer t(c);
    const double estimate = c.estimate_memory().parameters;
    const double actual = static_cast<double>(t.model().num_parameters());
    EXPECT_LE(estimate, actual) << k.kind;
    EXPECT_GE(estimate, 0.9 * actual) << k.kind;  // biases and norms are all it leaves out
    if (std::string(k.kind) == "mha") mha = estimate;
    if (std::string(k.kind) == "gqa") {
      EXPECT_LT(estimate, mha);
    }
  }
}

// The step's gradient is that of CE + sum over layers of -(lambda / layers) * (mean entropy over the real rows and
// heads), written out here without attention_entropy_loss, in double.
TEST(TrainerEntropy, GradientIsCrossEntropyPlusTheRegulariser) {
  TrainConfig c = tiny();
  c.dropout = 0;
  c.clip = 0;  // the gradients as computed
  c.entropy_reg = 0.5;
  auto data = task_dataset(c);
  Generator g1(11), g2(11);
  const nn::ModelSpec spec = data->model_spec(c.model_sizes());
  auto model = nn::CausalLM::build(spec, g1);
  auto twin = nn::CausalLM::build(spec, g2);
  model->to(kFloat64);
  twin->to(kFloat64);
  Trainer t(c, data, model);
  // The batch the trainer draws: a dataset seeded as the Trainer seeds its own.
  auto same_data = task_dataset(c);
  same_data->seed(derive_seed(c.seed, Stream::Data));
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < c.batch; ++i) ex.push_back(same_data->next());
  const StepMetrics m = t.step();

  twin->train();
  twin->track_attention_entropy(true);
  const nn::SequenceBatch b = twin->make_batch(ex);
  const Tensor logits = twin->forward_batch(b);
  const Tensor ce = cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(b.target, {-1}),
                                  {.ignore_index = twin->special_tokens().ignore_index});
  const std::vector<nn::AttentionEntropy> es = twin->attention_entropies();
  ASSERT_EQ(es.size(), 2u);
  Tensor loss = ce;
  double mean_entropy = 0;
  for (const nn::AttentionEntropy& e : es) {
    const int64_t B = e.entropy.size(0), H = e.entropy.size(1), L = e.entropy.size(2);
    ASSERT_EQ(e.entropy.dtype(), kFloat64);
    const Tensor w = reshape(e.rows.to(kFloat64), {B, 1, L});  // (B, 1, L)
    const double rows = sum(w).item<double>() * static_cast<double>(H);
    const Tensor mean_e = sum(mul(e.entropy, w)) / rows;
    mean_entropy += mean_e.item<double>() / static_cast<double>(es.size());
    loss = loss + mean_e * (-c.entropy_reg / static_cast<double>(es.size()));
  }
  loss.backward();
  EXPECT_DOUBLE_EQ(m.loss, ce.item<double>());  // the logged loss is the cross-entropy alone
  EXPECT_NEAR(m.entropy, mean_entropy, 1e-12);
  EXPECT_GT(m.entropy, 0.1);
  ASSERT_EQ(m.entropies.size(), 4u);  // 2 layers x 2 heads
  const auto pa = model->named_parameters(), pb = twin->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  double biggest_reg_effect = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor ga = pa[i].second.grad(), gb = pb[i].second.grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << pa[i].first;
    const double* x = ga.data<double>();
    const double* y = gb.data<double>();
    for (int64_t j = 0; j < ga.numel(); ++j) EXPECT_NEAR(x[j], y[j], 1e-12 + 1e-10 * std::fabs(y[j])) << pa[i].first;
  }
  // The regulariser changes the gradient (so the comparison above can fail): CE alone differs.
  for (auto& [name, p] : twin->named_parameters()) p.set_grad(Tensor());
  twin->forward_batch(b);
  cross_entropy(reshape(twin->forward_batch(b), {-1, logits.size(-1)}), reshape(b.target, {-1}),
                {.ignore_index = twin->special_tokens().ignore_index})
      .backward();
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor ga = pa[i].second.grad(), gc = twin->named_parameters()[i].second.grad();
    if (!gc.defined()) continue;
    for (int64_t j = 0; j < ga.numel(); ++j)
      biggest_reg_effect = std::max(biggest_reg_effect, std::fabs(ga.data<double>()[j] - gc.data<double>()[j]));
  }
  EXPECT_GT(biggest_reg_effect, 1e-6);
}

TEST(TrainerEntropy, OffOrOnlyLoggedIsBitwiseThePlainRun) {
  TrainConfig c = tiny();
  c.dropout = 0.1;
  Trainer plain(c);
  TrainConfig z = c;
  z.entropy_reg = 0;  // the default: nothing tracked
  z.log_entropy = true;
  Trainer logged(z);
  for (int i = 0; i < 3; ++i) {
    const StepMetrics a = plain.step(), b = logged.step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_TRUE(a.entropies.empty());
    EXPECT_EQ(b.entropies.size(), 4u);
  }
  EXPECT_TRUE(same_weights(plain.model(), logged.model()));
  EXPECT_EQ(plain.evaluate(20).sequence_accuracy, logged.evaluate(20).sequence_accuracy);
}

TEST(TrainerEntropy, MetricsColumnsPresentOnlyWhenTracked) {
  TrainConfig c = tiny();
  Trainer plain(c);
  plain.step();
  const std::string base = plain.metrics_csv();
  EXPECT_EQ(base.substr(0, base.find('\n')),
            "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,"
            "val_loss,val_bpc,train_loss");
  EXPECT_TRUE(plain.entropy_columns().empty());

  c.entropy_reg = 0.01;
  Trainer t(c);
  t.step();
  t.step();
  const std::string csv = t.metrics_csv();
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,"
            "val_loss,val_bpc,train_loss,entropy,entropy.layer0.h0,entropy.layer0.h1,entropy.layer1.h0,entropy.layer1.h1");
  std::vector<std::string> columns;
  const std::vector<StepMetrics> back = parse_metrics_csv(csv, &columns);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(columns, t.entropy_columns());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back[i].entropy, t.history()[i].entropy);
    EXPECT_EQ(back[i].entropies, t.history()[i].entropies);
    double mean = 0;
    for (double e : back[i].entropies) {
      EXPECT_GT(e, 0);
      EXPECT_LE(e, std::log(2.0 * c.max_len + 2));  // at most log(keys)
      mean += e / 4;
    }
    EXPECT_NEAR(back[i].entropy, mean, 1e-12);
  }
  // Old files still parse; a checkpoint keeps the columns and the values.
  EXPECT_EQ(parse_metrics_csv(base).size(), 1u);
  TempFile ck("entropy.ckpt");
  t.save_checkpoint(ck.path);
  const auto resumed = Trainer::from_checkpoint(ck.path);
  EXPECT_EQ(resumed->metrics_csv(), csv);
  const StepMetrics r = resumed->step(), s = t.step();
  EXPECT_EQ(r.loss, s.loss);
  EXPECT_EQ(r.entropies, s.entropies);
}

TEST(TrainerEntropy, GradAccumAddsTheRegulariserPerMicroBatch) {
  TrainConfig c = tiny();
  c.entropy_reg = 0.1;
  c.grad_accum = 2;
  Trainer t(c);
  const StepMetrics m = t.step();
  EXPECT_TRUE(std::isfinite(m.loss));
  ASSERT_EQ(m.entropies.size(), 4u);
  EXPECT_GT(m.entropy, 0);
  // With lambda 0 and grad_accum 2, logging changes nothing either.
  TrainConfig a = c, b = c;
  a.entropy_reg = 0;
  b.entropy_reg = 0;
  b.log_entropy = true;
  Trainer ta(a), tb(b);
  EXPECT_EQ(ta.step().loss, tb.step().loss);
  EXPECT_TRUE(same_weights(ta.model(), tb.model()));
}

TEST(TrainerEntropy, ModelsWithoutEntropiesRefuseInOneLine) {
  TrainConfig c = tiny();
  c.attention = "linear";
  c.entropy_reg = 0.01;
  try {
    Trainer t(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model \"lm\" with attention \"linear\""), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  c.entropy_reg = 0;
  c.log_entropy = true;
  EXPECT_ATTO_ERROR(Trainer{c}, "log_entropy (--log-entropy)");
}

TEST(TrainerAttention, EveryKindTrainsAndResumes) {
  struct Case {
    const char* kind;
    int64_t kv_heads, window, block;
    bool rope, checkpoint;
  };
  const Case cases[] = {{"gqa", 1, 0, 0, false, false},         {"mla", 0, 0, 0, false, false},
                        {"local", 0, 3, 0, false, false},       {"block-sparse", 0, 0, 2, false, false},
                        {"linear", 0, 0, 0, false, false},      {"mha", 0, 0, 0, true, false},
                        {"mha", 0, 0, 0, false, true}};
  for (const Case& k : cases) {
    TrainConfig c = tiny();
    c.attention = k.kind;
    c.kv_heads = k.kv_heads, c.window = k.window, c.block = k.block, c.rope = k.rope;
    c.checkpoint_activations = k.checkpoint;
    Trainer t(c);
    EXPECT_EQ(t.model().spec().attention, c.attention_spec()) << k.kind;
    const double first = t.step().loss;
    for (int i = 0; i < 3; ++i) t.step();
    EXPECT_TRUE(std::isfinite(first)) << k.kind;
    TempFile ck(std::string("kind_") + k.kind + ".ckpt");
    t.save_checkpoint(ck.path);
    const auto resumed = Trainer::from_checkpoint(ck.path);
    EXPECT_EQ(resumed->config(), c) << k.kind;
    EXPECT_TRUE(same_weights(resumed->model(), t.model())) << k.kind;
    // A checkpoint of one variant does not load into another.
    TrainConfig other = c;
    other.attention = "mha";
    other.kv_heads = other.window = other.block = 0;
    other.rope = !c.rope;
    Trainer wrong(other);
    EXPECT_ATTO_ERROR(wrong.load_checkpoint(ck.path), "was saved with");
  }
}

TEST(TrainerAttention, UserKindWithItsOptionsTrainsAndResumes) {
  // A user's kind: MultiheadAttention whose output is scaled by its option "gain" (read through the spec).
  nn::register_attention(
      "test-trainer-gain",
      [](const nn::AttentionSpec& s, const nn::AttentionConfig& c, Generator& gen) {
        struct Gain : nn::MultiheadAttention {
          double g;
          Gain(const nn::MultiheadAttentionOptions& o, double gain, Generator& gen) : MultiheadAttention(o, gen), g(gain) {}
          nn::AttentionOutput forward(const Tensor& x, const nn::AttentionCall& call) override {
            nn::AttentionOutput r = MultiheadAttention::forward(x, call);
            r.output = r.output * g;
            return r;
          }
          using MultiheadAttention::forward;
        };
        return std::make_shared<Gain>(
            nn::MultiheadAttentionOptions{.embed_dim = c.d_model, .num_heads = c.heads, .dropout = c.dropout},
            nn::attention_option(s, "gain", 1.0), gen);
      },
      "test: scaled attention");
  TrainConfig c = tiny();
  c.attention = "test-trainer-gain";
  c.attention_options = R"({"gain":0.5})";
  // The options survive the configuration's JSON and reach the model's spec.
  const std::string j = c.to_json();
  EXPECT_NE(j.find(R"("attention_options": "{\"gain\":0.5}")"), std::string::npos) << j;
  EXPECT_EQ(TrainConfig::from_json(j), c);
  Trainer t(c);
  EXPECT_EQ(t.model().spec().attention.options, c.attention_options);
  EXPECT_EQ(nn::attention_option(t.model().spec().attention, "gain", 1.0), 0.5);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isfinite(t.step().loss));
  TempFile ck("user_kind.ckpt");
  t.save_checkpoint(ck.path);
  const auto resumed = Trainer::from_checkpoint(ck.path);
  EXPECT_EQ(resumed->config(), c);
  EXPECT_TRUE(same_weights(resumed->model(), t.model()));
  // Options that are not a JSON object are refused by name.
  c.attention_options = "[1]";
  EXPECT_ATTO_ERROR(c.validate(), "options must be a JSON object");
}

}  // namespace
}  // namespace attograd::train

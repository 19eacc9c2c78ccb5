// The training loop: config JSON and validation, bit-identical determinism, bit-identical resume from a
// checkpoint, metrics log, and short training runs that must actually learn (every built-in model).

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "testing.h"
#include "nn/encoder_tagger.h"
#include "train/trainer.h"

namespace attograd::train {
namespace {

// A temporary file removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path(::testing::TempDir() + "attograd_trainer_" + std::to_string(::getpid()) + "_" + name) {}
  ~TempFile() { std::remove(path.c_str()); }
};

// A small, fast config (copy, lengths 1..4). Dropout on, so the dropout generator matters for determinism.
TrainConfig tiny(const std::string& model, double dropout = 0.1) {
  TrainConfig c;
  c.task = "copy";
  c.model = model;
  c.layers = 1;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.dropout = dropout;
  c.min_len = 1;
  c.max_len = 4;
  c.batch = 16;
  c.steps = 12;
  c.lr = 3e-3;
  c.warmup = 4;
  c.eval_every = 0;
  c.eval_size = 50;
  c.seed = 7;
  return c;
}

// True when both modules hold bitwise the same parameters and buffers.
::testing::AssertionResult same_weights(nn::Module& a, nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return ::testing::AssertionFailure() << pa.size() << " vs " << pb.size() << " params";
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor &x = pa[i].second, &y = pb[i].second;
    if (pa[i].first != pb[i].first || x.shape() != y.shape() || x.nbytes() != y.nbytes() ||
        std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0)
      return ::testing::AssertionFailure() << "parameter " << pa[i].first << " differs";
  }
  return ::testing::AssertionSuccess();
}

// True when both optimizers hold bitwise the same state.
::testing::AssertionResult same_optimizer_state(const optim::Optimizer& a, const optim::Optimizer& b) {
  if (a.step_count() != b.step_count())
    return ::testing::AssertionFailure() << "step_count " << a.step_count() << " vs " << b.step_count();
  auto sa = a.state_tensors(), sb = b.state_tensors();
  if (sa.size() != sb.size()) return ::testing::AssertionFailure() << sa.size() << " vs " << sb.size() << " states";
  for (size_t i = 0; i < sa.size(); ++i) {
    const Tensor &x = sa[i].second, &y = sb[i].second;
    if (sa[i].first != sb[i].first || x.nbytes() != y.nbytes() ||
        std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0)
      return ::testing::AssertionFailure() << "optimizer state " << sa[i].first << " differs";
  }
  return ::testing::AssertionSuccess();
}

// The deterministic columns of two histories agree exactly (everything but the wall time).
::testing::AssertionResult same_history(const std::vector<StepMetrics>& a, const std::vector<StepMetrics>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " records";
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].step != b[i].step || a[i].loss != b[i].loss || a[i].lr != b[i].lr || a[i].grad_norm != b[i].grad_norm ||
        a[i].tokens != b[i].tokens || a[i].evaluated != b[i].evaluated)
      return ::testing::AssertionFailure() << "record " << i << " differs: loss " << a[i].loss << " vs " << b[i].loss;
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Config

TEST(TrainConfig, JsonRoundTripKeepsEveryField) {
  TrainConfig c = tiny("seq2seq", 0.25);
  c.optimizer = "sgd";
  c.schedule = "step";
  c.lr = 0.1 + 1e-17;  // not exactly representable in short decimal: needs full precision
  c.weight_decay = 1.0 / 3.0;
  c.momentum = 0.5;
  c.label_smoothing = 0.1;
  c.seed = 18446744073709551615ull;  // uint64 max survives
  c.threads = 2;
  const std::string text = c.to_json();
  EXPECT_NE(text.find("\"model\": \"seq2seq\""), std::string::npos) << text;
  EXPECT_EQ(TrainConfig::from_json(text), c);
  EXPECT_EQ(TrainConfig::from_json(c.to_json(-1)), c);
  EXPECT_EQ(TrainConfig::from_json(TrainConfig{}.to_json()), TrainConfig{});
}

TEST(TrainConfig, MissingFieldsKeepDefaults) {
  const TrainConfig c = TrainConfig::from_json(R"({"task": "sort", "steps": 5})");
  TrainConfig want;
  want.task = "sort";
  want.steps = 5;
  EXPECT_EQ(c, want);
  EXPECT_EQ(TrainConfig::from_json("{}"), TrainConfig{});
}

TEST(TrainConfig, JsonErrorsNameTheField) {
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"stpes": 5})"), "unknown field \"stpes\"");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"steps": "5"})"), "field \"steps\" must be an integer, got \"5\"");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"steps": 2.5})"), "field \"steps\" must be an integer");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"lr": "fast"})"), "field \"lr\" must be a number");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"task": 3})"), "field \"task\" must be a string, got 3");
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"seed": -1})"), "field \"seed\" must be a non-negative integer");
  EXPECT_ATTO_ERROR(TrainConfig::from_json("{\"steps\": "), "invalid JSON");
  EXPECT_ATTO_ERROR(TrainConfig::from_json("[1, 2]"), "JSON must be an object");
}

TEST(TrainConfig, ValidateNamesFieldAndValue) {
  auto with = [](auto edit) {
    TrainConfig c;
    edit(c);
    return c;
  };
  EXPECT_NO_THROW(TrainConfig{}.validate());
  // The task names a built-in dataset only when the Trainer builds one (a user's dataset may carry any label).
  EXPECT_NO_THROW(with([](TrainConfig& c) { c.task = "rot13"; }).validate());
  EXPECT_ATTO_ERROR(Trainer bad(with([](TrainConfig& c) { c.task = "rot13"; })),
                    "task must be copy, reverse, sort or add, got \"rot13\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.model = "rnn"; }).validate(),
                    "model must be a registered kind (lm, seq2seq, encoder), got \"rnn\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.optimizer = "lion"; }).validate(),
                    "optimizer must be adam, adamw or sgd, got \"lion\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.schedule = "linear"; }).validate(),
                    "schedule must be noam, cosine, constant or step, got \"linear\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.d_model = 0; }).validate(), "d_model must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.layers = -2; }).validate(), "layers must be positive, got -2");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.heads = 0; }).validate(), "heads must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.d_ff = 0; }).validate(), "d_ff must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.batch = 0; }).validate(), "batch must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.steps = 0; }).validate(), "steps must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.min_len = 0; }).validate(), "min_len must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.eval_size = -1; }).validate(), "eval_size must be positive, got -1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.threads = 0; }).validate(), "threads must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.heads = 3; }).validate(), "heads (3) must divide d_model (64)");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.max_len = 0; }).validate(), "max_len must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.min_len = 5, c.max_len = 3; }).validate(),
                    "max_len (3) must be >= min_len (5)");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.num_symbols = 1; }).validate(), "num_symbols must be >= 2, got 1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.dropout = 1.0; }).validate(), "dropout must be in [0, 1), got 1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.lr = 0; }).validate(), "lr must be positive, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.weight_decay = -1; }).validate(), "weight_decay must be >= 0, got -1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.momentum = 1; }).validate(), "momentum must be in [0, 1), got 1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.warmup = -1; }).validate(), "warmup must be >= 0, got -1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.schedule = "noam", c.warmup = 0; }).validate(),
                    "warmup must be >= 1 for the noam schedule, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.steps = 10, c.warmup = 20; }).validate(),
                    "warmup (20) must not exceed steps (10)");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.clip = -1; }).validate(), "clip must be >= 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.label_smoothing = 1; }).validate(),
                    "label_smoothing must be in [0, 1), got 1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.eval_every = -5; }).validate(), "eval_every must be >= 0");
  // The Trainer validates before building anything.
  EXPECT_ATTO_ERROR(Trainer bad(with([](TrainConfig& c) { c.model = "gpt"; })), "model must be a registered kind");
  // The encoder-only model needs targets as long as their sources.
  EXPECT_ATTO_ERROR(Trainer bad(with([](TrainConfig& c) { c.task = "add", c.model = "encoder"; })),
                    "needs targets aligned with their sources");
}

TEST(TrainConfig, DerivedSeedsDifferPerStreamAndSeed) {
  EXPECT_NE(derive_seed(1, Stream::Data), derive_seed(1, Stream::Heldout));
  EXPECT_NE(derive_seed(1, Stream::Init), derive_seed(1, Stream::Dropout));
  EXPECT_NE(derive_seed(1, Stream::Data), derive_seed(2, Stream::Data));
  EXPECT_EQ(derive_seed(1, Stream::Data), derive_seed(1, Stream::Data));
}

// ---------------------------------------------------------------------------------------------
// Determinism and resume

class TrainerModels : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerModels, SameSeedGivesBitIdenticalRuns) {
  const TrainConfig c = tiny(GetParam());
  Trainer a(c), b(c);
  ASSERT_TRUE(same_weights(a.model(), b.model()));
  for (int i = 0; i < 8; ++i) {
    const StepMetrics ma = a.step(), mb = b.step();
    EXPECT_EQ(ma.loss, mb.loss) << "step " << i + 1;
    EXPECT_EQ(ma.grad_norm, mb.grad_norm) << "step " << i + 1;
  }
  EXPECT_TRUE(same_weights(a.model(), b.model()));
  EXPECT_TRUE(same_optimizer_state(a.optimizer(), b.optimizer()));
  EXPECT_TRUE(same_history(a.history(), b.history()));
  // Evaluating does not disturb training.
  a.evaluate(20);
  EXPECT_EQ(a.step().loss, b.step().loss);
  EXPECT_TRUE(same_weights(a.model(), b.model()));

  TrainConfig other = c;
  other.seed = c.seed + 1;
  Trainer d(other);
  EXPECT_FALSE(same_weights(a.model(), d.model()));
}

TEST_P(TrainerModels, ResumeFromCheckpointIsBitIdentical) {
  const TrainConfig c = tiny(GetParam());
  const int64_t N = c.steps;
  Trainer straight(c);
  for (int64_t i = 0; i < N; ++i) straight.step();

  for (int64_t k : {int64_t{1}, N / 2, N - 1}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    TempFile file("resume_" + GetParam() + "_" + std::to_string(k) + ".ckpt");
    {
      Trainer first(c);
      for (int64_t i = 0; i < k; ++i) first.step();
      first.save_checkpoint(file.path);
    }
    Trainer resumed(c);  // fresh weights, optimizer, generators: everything must come from the file
    resumed.load_checkpoint(file.path);
    EXPECT_EQ(resumed.step_count(), k);
    EXPECT_EQ(resumed.scheduler().step_count(), k);
    for (int64_t i = k; i < N; ++i) resumed.step();
    EXPECT_TRUE(same_weights(straight.model(), resumed.model()));
    EXPECT_TRUE(same_optimizer_state(straight.optimizer(), resumed.optimizer()));
    EXPECT_TRUE(same_history(straight.history(), resumed.history()));
    EXPECT_EQ(straight.optimizer().lr(), resumed.optimizer().lr());
    EXPECT_EQ(straight.dropout_generator().get_state(), resumed.dropout_generator().get_state());
    EXPECT_EQ(straight.dataset().position(), resumed.dataset().position());
  }
}

TEST_P(TrainerModels, FromCheckpointRebuildsTheRun) {
  TrainConfig c = tiny(GetParam());
  c.schedule = "noam";
  c.optimizer = "adam";
  TempFile file("from_" + GetParam() + ".ckpt");
  Trainer straight(c);
  for (int i = 0; i < 6; ++i) straight.step();
  {
    Trainer first(c);
    for (int i = 0; i < 3; ++i) first.step();
    first.save_checkpoint(file.path);
  }
  std::unique_ptr<Trainer> resumed = Trainer::from_checkpoint(file.path);
  EXPECT_EQ(resumed->config(), c);
  for (int i = 0; i < 3; ++i) resumed->step();
  EXPECT_TRUE(same_weights(straight.model(), resumed->model()));
  EXPECT_TRUE(same_history(straight.history(), resumed->history()));
}

// Mixed precision (--precision bf16): the run is as reproducible as float32 (the same bits twice, bit-identical
// resume, the precision read back from the checkpoint's config), its steps really take bf16 operands (other bits
// than float32's, the same loss to bf16 rounding), and evaluation follows set_precision.
TEST_P(TrainerModels, Bf16RunIsReproducibleAndResumesBitIdentically) {
  TrainConfig c = tiny(GetParam());
  c.precision = "bf16";
  c.steps = 6;
  Trainer a(c), b(c);
  EXPECT_EQ(a.precision(), Precision::bfloat16);
  TrainConfig f = c;
  f.precision = "fp32";
  Trainer fp32(f);
  StepMetrics ma, mf;
  for (int i = 0; i < 3; ++i) {
    ma = a.step();
    EXPECT_EQ(ma.loss, b.step().loss) << "step " << i + 1;
    mf = fp32.step();
  }
  EXPECT_TRUE(same_weights(a.model(), b.model()));
  EXPECT_FALSE(same_weights(a.model(), fp32.model()));  // bf16 operands: other bits
  EXPECT_NEAR(ma.loss, mf.loss, 0.02 * mf.loss);        // the same training to bf16 rounding
  EXPECT_EQ(autocast_precision(), Precision::float32);  // the step's Autocast ended with it
  TempFile file("bf16_" + GetParam() + ".ckpt");
  a.save_checkpoint(file.path);
  for (int i = 3; i < 6; ++i) a.step();
  std::unique_ptr<Trainer> resumed = Trainer::from_checkpoint(file.path);
  EXPECT_EQ(resumed->config().precision, "bf16");
  for (int i = 3; i < 6; ++i) resumed->step();
  EXPECT_TRUE(same_weights(a.model(), resumed->model()));
  EXPECT_TRUE(same_optimizer_state(a.optimizer(), resumed->optimizer()));
  // Evaluation follows set_precision: float32 evaluation of the bf16 run's weights is the fp32 Trainer's on them.
  const double bf16_loss = a.estimate_train_loss(20);
  a.set_precision(Precision::float32);
  const double fp32_loss = a.estimate_train_loss(20);
  EXPECT_NE(bf16_loss, fp32_loss);
  EXPECT_NEAR(bf16_loss, fp32_loss, 0.02 * fp32_loss);
}

TEST(TrainerPrecision, ConfigRoundTripAndErrors) {
  TrainConfig c = tiny("lm");
  EXPECT_EQ(c.to_json().find("precision"), std::string::npos);  // the default is not written: files as before
  c.precision = "bf16";
  EXPECT_NE(c.to_json().find("\"precision\": \"bf16\""), std::string::npos);
  EXPECT_EQ(TrainConfig::from_json(c.to_json()).precision, "bf16");
  c.precision = "fp16";
  EXPECT_ATTO_ERROR(c.validate(), "precision (--precision) must be fp32 or bf16, got \"fp16\"");
}

INSTANTIATE_TEST_SUITE_P(Models, TrainerModels, ::testing::Values("lm", "seq2seq", "encoder"));

// ---------------------------------------------------------------------------------------------
// A user's data and a user's model, defined here, outside the library

// Doubles every symbol (3 1 -> 3 3 1 1): none of the built-in tasks, not aligned.
class Stutter : public data::GeneratedDataset {
 public:
  std::string name() const override { return "stutter"; }
  int64_t vocab_size() const override { return 5 + 6; }
  int64_t max_source_len() const override { return 3; }
  int64_t max_target_len() const override { return 6; }
  data::Example generate(Generator& gen) const override {
    data::Example e;
    const int64_t n = 1 + static_cast<int64_t>(gen.randint(3));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = 5 + static_cast<int64_t>(gen.randint(6));
      e.src.push_back(t);
      e.tgt.insert(e.tgt.end(), {t, t});
    }
    return e;
  }
};

// A user's kind: the decoder-only model under another name, with a counter of how often the registry built it.
int g_user_builds = 0;
void register_user_kind() {
  nn::register_model("user_lm", [](const nn::ModelSpec& s, Generator& g) {
    ++g_user_builds;
    return nn::make_model("lm", s, g);
  });
}

TEST(Trainer, TrainsAUsersDatasetAndKindAndResumesBitIdentically) {
  register_user_kind();
  TrainConfig c = tiny("user_lm");
  c.task = "stutter";
  const int before = g_user_builds;
  Trainer straight(c, std::make_shared<Stutter>());
  EXPECT_EQ(g_user_builds, before + 1);
  EXPECT_EQ(straight.model().vocab_size(), 11);
  EXPECT_EQ(straight.model().spec().max_target_len, 6);
  for (int i = 0; i < 8; ++i) straight.step();
  // The stream was re-seeded from the config: a second dataset object gives the same run.
  TempFile file("user.ckpt");
  {
    Trainer first(c, std::make_shared<Stutter>());
    for (int i = 0; i < 4; ++i) first.step();
    first.save_checkpoint(file.path);
  }
  Trainer resumed(c, std::make_shared<Stutter>());
  resumed.load_checkpoint(file.path);
  EXPECT_EQ(resumed.dataset().position().offset, 4 * c.batch);
  for (int i = 0; i < 4; ++i) resumed.step();
  EXPECT_TRUE(same_weights(straight.model(), resumed.model()));
  EXPECT_TRUE(same_history(straight.history(), resumed.history()));
  EXPECT_EQ(straight.dataset().position(), resumed.dataset().position());
  // Held-out evaluation and prediction go through the same interfaces.
  const EvalResult r = straight.evaluate(40), again = resumed.evaluate(40);
  EXPECT_EQ(r.n, 40);
  EXPECT_EQ(r.loss, again.loss);
  EXPECT_EQ(r.token_accuracy, again.token_accuracy);
  EXPECT_LE(straight.predict({5, 6}).size(), 6u);
  EXPECT_ATTO_ERROR(straight.predict({5, 6, 7, 8}), "source length must be in [1, 3], got 4");
}

TEST(Trainer, TrainsAModelBuiltByHand) {
  // Any SequenceModel instance, not registered: the Trainer points it at its dropout generator and trains it.
  TrainConfig c = tiny("lm");
  auto data = std::make_shared<Stutter>();
  Generator gen(3);
  auto model = std::make_shared<nn::EncoderTagger>(nn::EncoderTaggerOptions{.vocab = 11, .d_model = 16, .n_head = 2,
                                                                           .d_ff = 32, .n_layers = 1, .max_len = 8},
                                                 gen);
  // Stutter's targets are twice as long as their sources: the encoder-only model's framing refuses them.
  Trainer t(c, data, model);
  EXPECT_EQ(&t.model(), model.get());
  EXPECT_ATTO_ERROR(t.step(), "the encoder-only model needs a target as long as its source");
  // The vocabulary must cover the data's.
  auto small = std::make_shared<nn::EncoderTagger>(nn::EncoderTaggerOptions{.vocab = 8, .max_len = 8});
  EXPECT_ATTO_ERROR(Trainer(c, data, small), "the model's vocabulary (8) is smaller than the dataset's (11)");
  EXPECT_ATTO_ERROR(Trainer(c, nullptr), "no dataset given");
}

TEST(Trainer, LoadCheckpointRejectsADifferentModel) {
  TempFile file("mismatch.ckpt");
  Trainer a(tiny("lm"));
  a.step();
  a.save_checkpoint(file.path);
  TrainConfig wider = tiny("lm");
  wider.d_model = 64;
  Trainer b(wider);
  EXPECT_ATTO_ERROR(b.load_checkpoint(file.path), "saved with d_model = 32, this trainer has d_model = 64");
  Trainer s(tiny("seq2seq"));
  EXPECT_ATTO_ERROR(s.load_checkpoint(file.path), "saved with model = lm, this trainer has model = seq2seq");
  EXPECT_ATTO_ERROR(s.load_checkpoint(file.path + ".missing"), "load_checkpoint");
}

// ---------------------------------------------------------------------------------------------
// Metrics

TEST(Trainer, StepMetricsAndCsvRoundTrip) {
  TrainConfig c = tiny("lm");
  c.steps = 5;
  c.eval_every = 2;
  Trainer t(c);
  std::vector<StepMetrics> seen;
  t.train([&](const StepMetrics& m) { seen.push_back(m); });
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(t.step_count(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(seen[i].step, i + 1);
    EXPECT_GT(seen[i].loss, 0);
    EXPECT_GT(seen[i].tokens, 0);
    EXPECT_GT(seen[i].grad_norm, 0);
    EXPECT_GE(seen[i].seconds, 0);
    // Evaluated after steps 2 and 4 (eval_every) and 5 (the last).
    EXPECT_EQ(seen[i].evaluated, i == 1 || i == 3 || i == 4) << i;
  }
  EXPECT_EQ(seen[4].eval.n, c.eval_size);
  // The lr of the t-th step is the schedule's lr_at(t - 1): 0 at the start of the linear warm-up.
  EXPECT_EQ(seen[0].lr, 0.0);
  EXPECT_DOUBLE_EQ(seen[1].lr, c.lr * 1 / c.warmup);
  EXPECT_TRUE(same_history(t.history(), seen));

  // The log: the evaluation before the first update (step 0), then every step.
  std::vector<StepMetrics> parsed = parse_metrics_csv(t.metrics_csv());
  ASSERT_EQ(parsed.size(), 6u);
  EXPECT_EQ(parsed[0].step, 0);
  EXPECT_TRUE(parsed[0].evaluated);
  parsed.erase(parsed.begin());
  EXPECT_TRUE(same_history(parsed, seen));
  for (size_t i = 0; i < parsed.size(); ++i) {
    EXPECT_EQ(parsed[i].seconds, seen[i].seconds);
    EXPECT_EQ(parsed[i].eval.sequence_accuracy, seen[i].eval.sequence_accuracy);
    EXPECT_EQ(parsed[i].eval.token_accuracy, seen[i].eval.token_accuracy);
    EXPECT_EQ(parsed[i].eval.loss, seen[i].eval.loss);
    EXPECT_EQ(parsed[i].eval.n, seen[i].eval.n);
    if (seen[i].evaluated) {
      EXPECT_EQ(parsed[i].train_loss, seen[i].train_loss);
    }
  }
  EXPECT_ATTO_ERROR(parse_metrics_csv("step,loss\n1,2\n"), "line 1 must be the header");
  std::string bad = t.metrics_csv();
  bad.insert(bad.find('\n') + 3, "x");
  EXPECT_ATTO_ERROR(parse_metrics_csv(bad), "line 2");

  // train() is done at steps; calling it again does nothing.
  t.train([&](const StepMetrics&) { ADD_FAILURE() << "no step expected"; });
  EXPECT_EQ(t.step_count(), 5);
}

TEST(Trainer, EvaluationsEstimateTheTrainingLossAndStartAtStepZero) {
  TrainConfig c = tiny("lm", 0.0);  // no dropout, no label smoothing: step 1's loss is a teacher-forced loss
  c.steps = 4;
  c.eval_every = 2;
  c.eval_size = c.batch;  // the estimate's subset: the first batch the run trains on
  TrainConfig quiet = c;
  quiet.eval_every = 0;  // evaluates only after the last step
  Trainer t(c), u(quiet);
  t.train();
  u.train();
  // The estimates and the step-0 evaluation draw from no stream the training uses: the same weights and data.
  EXPECT_TRUE(same_weights(t.model(), u.model()));
  EXPECT_EQ(t.dataset().position(), u.dataset().position());
  ASSERT_EQ(t.history().size(), u.history().size());
  for (size_t i = 0; i < t.history().size(); ++i) {
    EXPECT_EQ(t.history()[i].loss, u.history()[i].loss) << i;
    EXPECT_EQ(t.history()[i].grad_norm, u.history()[i].grad_norm) << i;
  }
  EXPECT_FALSE(u.initial_evaluation().has_value());
  ASSERT_TRUE(t.initial_evaluation().has_value());
  const StepMetrics& z = *t.initial_evaluation();
  EXPECT_EQ(z.step, 0);
  EXPECT_TRUE(z.evaluated);
  EXPECT_EQ(z.loss, z.train_loss);
  EXPECT_EQ(z.lr, 0.0);
  EXPECT_EQ(z.tokens, 0);
  // Before the first update the estimate is the loss of the first training batch, which step 1 reported.
  EXPECT_NEAR(z.train_loss, t.history()[0].loss, 1e-5 * t.history()[0].loss);
  EXPECT_GT(z.train_loss, 0.5 * std::log(static_cast<double>(t.dataset().vocab_size())));
  // The held-out part of step 0 is evaluate() of the initial weights.
  Trainer fresh(c);
  const EvalResult e0 = fresh.evaluate();
  EXPECT_EQ(z.eval.loss, e0.loss);
  EXPECT_EQ(z.eval.token_accuracy, e0.token_accuracy);
  // Later evaluations: the same subset with the weights of then; the last one is the trained weights'.
  ASSERT_TRUE(t.history()[1].evaluated && t.history()[3].evaluated);
  EXPECT_FALSE(t.history()[0].evaluated);
  EXPECT_EQ(t.history()[3].train_loss, t.estimate_train_loss());
  EXPECT_EQ(u.history()[3].train_loss, t.history()[3].train_loss);
  EXPECT_NE(t.history()[1].train_loss, z.train_loss);
  // Estimating again does not disturb the stream either.
  const StepMetrics next_u = u.step();
  t.estimate_train_loss(7);
  EXPECT_EQ(t.step().loss, next_u.loss);
  // The log's train_loss column round-trips; a log from before the column reads as NaN.
  const std::vector<StepMetrics> parsed = parse_metrics_csv(t.metrics_csv());
  ASSERT_EQ(parsed.size(), 6u);
  EXPECT_EQ(parsed[0].train_loss, z.train_loss);
  EXPECT_EQ(parsed[4].train_loss, t.history()[3].train_loss);
  const std::vector<StepMetrics> old = parse_metrics_csv(
      "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,val_loss,"
      "val_bpc\n1,2.5,0.1,1,10,0.5,20,0.5,0.25,2.25,,\n");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].eval.loss, 2.25);
  EXPECT_TRUE(std::isnan(old[0].train_loss));
  // A resumed run keeps its step-0 evaluation.
  TempFile file("initial_eval.ckpt");
  t.save_checkpoint(file.path);
  Trainer r(c);
  r.load_checkpoint(file.path);
  ASSERT_TRUE(r.initial_evaluation().has_value());
  EXPECT_EQ(r.initial_evaluation()->train_loss, z.train_loss);
  EXPECT_EQ(r.history().size(), t.history().size());
  EXPECT_EQ(r.metrics_csv(), t.metrics_csv());
}

TEST(Trainer, EvaluatesInBatchesOfAtMostATrainingMicroBatch) {
  TrainConfig c = tiny("lm");
  EXPECT_EQ(Trainer(c).eval_batch(), 16);
  c.grad_accum = 4;
  EXPECT_EQ(Trainer(c).eval_batch(), 4);
  c.grad_accum = 1;
  c.batch = 1000;
  EXPECT_EQ(Trainer(c).eval_batch(), 250);
  // The batch changes no result: the same decoded tokens, the same loss up to the order of the sums.
  c = tiny("lm");
  Trainer t(c);
  for (int i = 0; i < 6; ++i) t.step();
  const EvalResult small = t.evaluate();  // in batches of 16
  const EvalResult again = evaluate(t.model(), t.heldout_examples(c.eval_size), 250);
  EXPECT_EQ(small.token_accuracy, again.token_accuracy);
  EXPECT_EQ(small.sequence_accuracy, again.sequence_accuracy);
  EXPECT_NEAR(small.loss, again.loss, 1e-6 * again.loss);
  EXPECT_EQ(small.n, again.n);
}

TEST(Trainer, HeldOutSetIsFixedAndDiffersFromTraining) {
  Trainer t(tiny("lm"));
  const auto a = t.heldout_examples(30), b = t.heldout_examples(30);
  ASSERT_EQ(a.size(), 30u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].src, b[i].src);
  const data::TaskDataset& task = dynamic_cast<const data::TaskDataset&>(t.dataset());
  data::TaskDataset train_copy(task.options(), derive_seed(7, Stream::Data));
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += train_copy.next().src == a[i].src;
  EXPECT_LT(same, 10);  // different streams (a few short sequences coincide by chance)
}

// ---------------------------------------------------------------------------------------------
// Learning

// Copy with lengths 1..4 for 300 steps: the loss must fall and greedy decoding must be (nearly) always right.
// Measured (Release, this seed): lm first loss 4.84, last-20 mean 0.0317, token accuracy 0.986, sequence accuracy
// 0.980; seq2seq first loss 3.39, last-20 mean 0.0003, token and sequence accuracy 1.000; encoder first loss 2.63,
// last-20 mean 0.0004, token and sequence accuracy 1.000. In bf16: lm 4.84, 0.0308, 0.989, 0.980; seq2seq 3.39,
// 0.0003, 1.000; encoder 2.63, 0.0004, 1.000.
void expect_tiny_copy_learns(const std::string& model, const std::string& precision) {
  TrainConfig c = tiny(model, 0.0);
  c.precision = precision;
  c.layers = 2;
  c.lr = 1e-2;
  c.steps = 300;
  c.batch = 32;
  c.warmup = 25;
  c.eval_size = 200;
  Trainer t(c);
  t.train();
  double tail = 0;
  for (int64_t i = c.steps - 20; i < c.steps; ++i) tail += t.history()[static_cast<size_t>(i)].loss;
  tail /= 20;
  ASSERT_TRUE(t.history().back().evaluated);
  const EvalResult r = t.history().back().eval;
  std::printf("%s %s: first loss %.4f, last-20 mean loss %.4f, token acc %.4f, sequence acc %.4f, eval loss %.4f\n",
              model.c_str(), precision.c_str(), t.history().front().loss, tail, r.token_accuracy, r.sequence_accuracy,
              r.loss);
  EXPECT_EQ(r.n, 200);
  EXPECT_GT(t.history().front().loss, 2.0) << "an untrained model is not already right";
  const bool lm = model == "lm";
  EXPECT_LT(tail, lm ? 0.08 : 0.01) << "mean loss over the last 20 steps";
  EXPECT_GE(r.sequence_accuracy, lm ? 0.95 : 0.99);
  EXPECT_GE(r.token_accuracy, lm ? 0.97 : 0.995);
}

TEST_P(TrainerModels, TinyCopyRunLearns) { expect_tiny_copy_learns(GetParam(), "fp32"); }

// The same run in mixed precision learns as well (the same thresholds).
TEST_P(TrainerModels, TinyCopyRunLearnsInBf16) { expect_tiny_copy_learns(GetParam(), "bf16"); }

// ---------------------------------------------------------------------------------------------
// Hostile configurations (issue 14): bounded nesting, bounded messages, limits, memory estimated up front.

TEST(TrainConfig, DeeplyNestedJsonIsRejectedWithoutRecursion) {
  const std::string deep = std::string(80000, '[') + std::string(80000, ']');
  EXPECT_ATTO_ERROR(TrainConfig::from_json(deep), "JSON nested 80000 levels deep, more than the maximum of 64");
  std::string deep_object;
  for (int i = 0; i < 80000; ++i) deep_object += "{\"a\":";
  deep_object += "1" + std::string(80000, '}');
  EXPECT_ATTO_ERROR(TrainConfig::from_json(deep_object), "more than the maximum of 64");
  // Brackets inside strings do not count; 64 levels are fine up to the type check.
  const std::string brackets = std::string(67, '[') + "\\\"[";  // inside a string, with an escaped quote
  EXPECT_EQ(TrainConfig::from_json("{\"task\": \"" + brackets + "\"}").task, std::string(67, '[') + "\"[");
  EXPECT_ATTO_ERROR(TrainConfig::from_json("{\"steps\": " + std::string(63, '[') + std::string(63, ']') + "}"),
                    "field \"steps\" must be an integer");
}

TEST(TrainConfig, MessagesCutHugeValues) {
  const std::string huge(100000, 'x');
  for (const std::string& text : {"{\"steps\": \"" + huge + "\"}", "{\"" + huge + "\": 1}", "[\"" + huge + "\"]"}) {
    try {
      TrainConfig::from_json(text);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
    }
  }
  TrainConfig c;
  c.model = huge;
  try {
    c.validate();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

TEST(TrainConfig, LimitsAndMemoryEstimate) {
  auto with = [](auto set) {
    TrainConfig c;
    set(c);
    return c;
  };
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.d_ff = int64_t{1} << 62; }).validate(), "d_ff must be at most");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.threads = 100000; }).validate(), "threads must be at most 1024");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.max_len = 100000; }).validate(), "max_len must be at most 256");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.steps = int64_t{1} << 40; }).validate(), "steps must be at most");
  // Within every limit, yet far beyond any machine: the Trainer says how much memory, before building anything.
  const TrainConfig huge = with([](TrainConfig& c) {
    c.d_model = 1000000;
    c.heads = 1;
    c.d_ff = 1000000;
    c.layers = 1000;
  });
  huge.validate();
  EXPECT_GT(huge.estimate_memory().parameters, 1e15);
  EXPECT_ATTO_ERROR(Trainer{huge}, "the run needs at least");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.batch = 1000000; c.max_len = 256; }).check_fits_in_memory(),
                    "for a batch of 1000000 sequences");
  // The defaults fit, and the estimate is a lower bound of the real model.
  for (const char* kind : {"lm", "seq2seq", "encoder"}) {
    TrainConfig small;
    small.model = kind;
    small.check_fits_in_memory();
    Trainer t(small);
    EXPECT_LE(small.estimate_memory().parameters, static_cast<double>(t.model().num_parameters())) << kind;
  }
}

// ---------------------------------------------------------------------------------------------
// The optimizer's recipe: betas, eps, weight decay on matrices (two parameter groups), the cosine's floor and end,
// nanoGPT's warm-up

// tiny() with nanoGPT's optimizer settings: AdamW (0.9, 0.95), decay 0.1 on matrices, warm-up 4 in its style, the
// cosine reaching min_lr at step 9 of 12.
TrainConfig tiny_nanogpt(const std::string& model) {
  TrainConfig c = tiny(model);
  c.beta2 = 0.95;
  c.adam_eps = 1e-8;
  c.weight_decay = 0.1;
  c.decay = "matrices";
  c.min_lr = 3e-4;
  c.decay_steps = 9;
  c.warmup_style = "nanogpt";
  return c;
}

TEST(TrainConfig, OptimizerRecipeFieldsAreWrittenOnlyWhenSet) {
  const std::string plain = TrainConfig{}.to_json();
  for (const char* name : {"beta1", "beta2", "adam_eps", "\"decay\"", "min_lr", "decay_steps", "warmup_style"})
    EXPECT_EQ(plain.find(name), std::string::npos) << name;
  TrainConfig c = tiny_nanogpt("lm");
  c.beta1 = 0.8;
  const std::string text = c.to_json();
  EXPECT_NE(text.find("\"beta2\": 0.95"), std::string::npos) << text;
  EXPECT_NE(text.find("\"decay\": \"matrices\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"warmup_style\": \"nanogpt\""), std::string::npos) << text;
  EXPECT_EQ(TrainConfig::from_json(text), c);
  EXPECT_EQ(c.decay_end(), 9);
  EXPECT_EQ(TrainConfig{}.decay_end(), TrainConfig{}.steps);
  EXPECT_ATTO_ERROR(TrainConfig::from_json(R"({"beta2": "high"})"), "field \"beta2\" must be a number");
}

TEST(TrainConfig, OptimizerRecipeErrorsNameTheFlag) {
  auto with = [](auto edit) {
    TrainConfig c;
    edit(c);
    return c;
  };
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.beta1 = 1.0; }).validate(), "beta1 (--beta1) must be in [0, 1), got 1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.beta2 = -0.1; }).validate(),
                    "beta2 (--beta2) must be in [0, 1), got -0.1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.adam_eps = 0; }).validate(),
                    "adam_eps (--adam-eps) must be > 0, got 0");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.adam_eps = std::nan(""); }).validate(), "adam_eps (--adam-eps)");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.min_lr = 0.01; }).validate(),
                    "min_lr (--min-lr) must be in [0, lr] = [0, 0.005], got 0.01");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.min_lr = -1e-4; }).validate(), "min_lr (--min-lr) must be in [0, lr]");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.decay_steps = 2000; }).validate(),
                    "decay_steps (--decay-steps) must not exceed steps (1500), got 2000");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.decay_steps = 50; }).validate(),
                    "decay_steps (--decay-steps) must be >= warmup (100), got 50");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.decay_steps = -1; }).validate(),
                    "decay_steps (--decay-steps) must be >= 0 (0: steps), got -1");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.decay = "biases"; }).validate(),
                    "decay (--decay) must be all or matrices, got \"biases\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.warmup_style = "linear"; }).validate(),
                    "warmup_style (--warmup-style) must be from-zero or nanogpt, got \"linear\"");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.optimizer = "sgd", c.beta2 = 0.95; }).validate(),
                    "beta2 (--beta2) applies to the adam and adamw optimizers, not sgd");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.schedule = "step", c.min_lr = 1e-4; }).validate(),
                    "min_lr (--min-lr) applies to the cosine schedule, not step");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.schedule = "noam", c.warmup_style = "nanogpt"; }).validate(),
                    "warmup_style (--warmup-style) applies to the cosine schedule, not noam");
  EXPECT_ATTO_ERROR(with([](TrainConfig& c) { c.schedule = "constant", c.decay_steps = 10; }).validate(),
                    "decay_steps (--decay-steps) applies to the cosine schedule");
  // Valid edges: min_lr = lr, decay_steps = warmup, decay_steps = steps, decay on matrices with SGD.
  EXPECT_NO_THROW(with([](TrainConfig& c) { c.min_lr = c.lr; }).validate());
  EXPECT_NO_THROW(with([](TrainConfig& c) { c.decay_steps = c.warmup; }).validate());
  EXPECT_NO_THROW(with([](TrainConfig& c) { c.decay_steps = c.steps; }).validate());
  EXPECT_NO_THROW(with([](TrainConfig& c) { c.optimizer = "sgd", c.decay = "matrices"; }).validate());
}

TEST(Trainer, DecayOnMatricesBuildsNanoGPTsTwoGroups) {
  for (const char* opt : {"adamw", "adam", "sgd"}) {
    SCOPED_TRACE(opt);
    TrainConfig c = tiny_nanogpt("lm");
    c.optimizer = opt;
    if (c.optimizer == "sgd") c.beta2 = 0.98, c.adam_eps = 1e-9;
    Trainer t(c);
    optim::Optimizer& o = t.optimizer();
    ASSERT_EQ(o.num_groups(), 2u);
    size_t matrices = 0, others = 0;
    for (const auto& [name, p] : t.model().named_parameters()) (p.dim() >= 2 ? matrices : others)++;
    ASSERT_EQ(o.group_params(0).size(), matrices);
    ASSERT_EQ(o.group_params(1).size(), others);
    EXPECT_GT(others, 0u);
    for (const auto& [name, p] : o.group_params(0)) EXPECT_GE(p.dim(), 2) << name;
    for (const auto& [name, p] : o.group_params(1)) EXPECT_LT(p.dim(), 2) << name;
    if (c.optimizer == "sgd") {
      auto& sgd = dynamic_cast<optim::SGD&>(o);
      EXPECT_EQ(sgd.group_options(0).weight_decay, 0.1);
      EXPECT_EQ(sgd.group_options(1).weight_decay, 0.0);
    } else {
      auto& adam = dynamic_cast<optim::Adam&>(o);
      EXPECT_EQ(adam.group_options(0).weight_decay, 0.1);
      EXPECT_EQ(adam.group_options(1).weight_decay, 0.0);
      EXPECT_EQ(adam.group_options(1).betas, (std::pair<double, double>{0.9, 0.95}));
      EXPECT_EQ(adam.group_options(0).eps, 1e-8);
    }
  }
  // The default: one group, the seed's betas and eps.
  Trainer d(tiny("lm"));
  ASSERT_EQ(d.optimizer().num_groups(), 1u);
  const auto& adamw = dynamic_cast<optim::AdamW&>(d.optimizer());
  EXPECT_EQ(adamw.group_options(0).betas, (std::pair<double, double>{0.9, 0.98}));
  EXPECT_EQ(adamw.group_options(0).eps, 1e-9);
}

TEST(Trainer, GroupsWithoutDecayChangeNoBit) {
  // decay "matrices" with weight_decay 0 trains exactly as decay "all": the groups alone change nothing.
  TrainConfig a = tiny("lm");
  TrainConfig b = a;
  b.decay = "matrices";
  Trainer ta(a), tb(b);
  for (int i = 0; i < 6; ++i) {
    const StepMetrics ma = ta.step(), mb = tb.step();
    EXPECT_EQ(ma.loss, mb.loss);
    EXPECT_EQ(ma.grad_norm, mb.grad_norm);
  }
  EXPECT_TRUE(same_weights(ta.model(), tb.model()));
  // With decay the two differ (the first step, with lr 0 in today's warm-up, decays nothing).
  b.weight_decay = 0.5;
  TrainConfig all = a;
  all.weight_decay = 0.5;
  Trainer decayed(b), everywhere(all);
  decayed.step();
  everywhere.step();
  EXPECT_TRUE(same_weights(decayed.model(), everywhere.model()));
  decayed.step();
  everywhere.step();
  EXPECT_FALSE(same_weights(decayed.model(), everywhere.model()));
}

TEST(Trainer, NanoGPTScheduleIsGetLrStepByStep) {
  // Every step's lr is nanoGPT's get_lr(step - 1) as golden_optim.py computes it (lr 1e-3, warm-up 10, the cosine
  // reaching min_lr 1e-4 at step 40 of 50), bit for bit.
  const std::map<std::string, Tensor> g = testing::load_golden("train/schedule.golden");
  const Tensor& expected = g.at("nanogpt_short");
  TrainConfig c = tiny("lm", 0.0);
  c.lr = 1e-3, c.warmup = 10, c.decay_steps = 40, c.steps = 50, c.min_lr = 1e-4, c.warmup_style = "nanogpt";
  c.decay = "matrices", c.weight_decay = 0.1;
  Trainer t(c);
  ASSERT_EQ(expected.numel(), c.steps);
  for (int64_t k = 0; k < c.steps; ++k) {
    const StepMetrics m = t.step();
    ASSERT_EQ(m.lr, expected.flat(k)) << "step " << m.step;
    EXPECT_EQ(t.optimizer().lr(1), t.optimizer().lr(0));  // both groups follow the same schedule
  }
  EXPECT_EQ(t.optimizer().lr(), 1e-4);
  // Today's style: lr 0 at the first step, lr * s / warmup at step s + 1, the same cosine after the warm-up.
  c.warmup_style = "from-zero";
  Trainer z(c);
  for (int64_t k = 0; k < c.steps; ++k) {
    const StepMetrics m = z.step();
    EXPECT_EQ(m.lr, optim::warmup_cosine_lr(k, 1e-3, 10, 40, 1e-4)) << "step " << m.step;
  }
  EXPECT_EQ(z.history().front().lr, 0.0);
  EXPECT_EQ(z.history()[3].lr, 1e-3 * 3 / 10);
}

TEST(Trainer, ResumeWithParameterGroupsIsBitIdentical) {
  for (const char* model : {"lm", "encoder"}) {
    SCOPED_TRACE(model);
    const TrainConfig c = tiny_nanogpt(model);
    Trainer straight(c);
    for (int64_t i = 0; i < c.steps; ++i) straight.step();
    for (int64_t k : {int64_t{3}, int64_t{10}}) {  // in the warm-up; after the cosine's end
      SCOPED_TRACE("k = " + std::to_string(k));
      TempFile file(std::string("groups_") + model + "_" + std::to_string(k) + ".ckpt");
      {
        Trainer first(c);
        for (int64_t i = 0; i < k; ++i) first.step();
        first.save_checkpoint(file.path);
      }
      std::unique_ptr<Trainer> resumed = Trainer::from_checkpoint(file.path);
      EXPECT_EQ(resumed->config(), c);
      ASSERT_EQ(resumed->optimizer().num_groups(), 2u);
      EXPECT_EQ(resumed->optimizer().lr(1), straight.history()[static_cast<size_t>(k)].lr);
      for (int64_t i = k; i < c.steps; ++i) resumed->step();
      EXPECT_TRUE(same_weights(straight.model(), resumed->model()));
      EXPECT_TRUE(same_optimizer_state(straight.optimizer(), resumed->optimizer()));
      EXPECT_TRUE(same_history(straight.history(), resumed->history()));
    }
  }
}

}  // namespace
}  // namespace attograd::train

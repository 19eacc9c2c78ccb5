// Trainer on data files: a text file (stream framing, teacher-forced evaluation with val_loss / val_bpc in the
// metrics) and a pairs file; the run's metadata (config + data settings) rebuilds the dataset and the model, a
// checkpoint resumes bit-identically, and a built-in task's metadata is the config's JSON exactly as before.

#include <cmath>

#include "testing.h"
#include "train/data/pairs.h"
#include "train/data/text.h"
#include "train/io/serialize.h"
#include "train/trainer.h"

using namespace attograd;
using namespace attograd::train;
using namespace attograd::testing;

namespace {

TrainConfig small(const std::string& task) {
  TrainConfig c;
  c.task = task;
  c.layers = 1;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.batch = 8;
  c.steps = 6;
  c.warmup = 2;
  c.eval_every = 3;
  return c;
}

std::string scratch(const std::string& name) { return ::testing::TempDir() + "/attograd_td_" + name; }

}  // namespace

TEST(TrainerData, TextRunEvaluatesTeacherForcedAndResumes) {
  const data::DataSpec spec{.path = data_path("train/poems.txt"), .context = 16};
  Trainer t(small("text"), data::open_data(spec));
  EXPECT_TRUE(t.model().spec().stream);
  EXPECT_EQ(t.model().spec().max_source_len, 16);
  t.train();
  const StepMetrics& last = t.history().back();
  ASSERT_TRUE(last.evaluated);
  // The held-out windows cover the last 10% of the file: ceil((val - 1) / 16) windows, each 16 predictions but the
  // last.
  const auto& text = static_cast<const data::TextDataset&>(t.dataset());
  EXPECT_EQ(last.eval.n, (text.val_size() - 1 + 15) / 16);
  EXPECT_GT(last.eval.loss, 0);
  EXPECT_LT(last.eval.loss, std::log(static_cast<double>(t.model().vocab_size())) + 1);
  // metrics.csv: val_loss = eval_loss and val_bpc = eval_loss / ln 2 on evaluated rows.
  const std::string csv = t.metrics_csv();
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,"
            "val_loss,val_bpc");
  const std::string last_line = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
  char bpc[64];
  std::snprintf(bpc, sizeof bpc, "%.17g", last.eval.loss / std::log(2.0));
  EXPECT_NE(last_line.find(std::string(",") + bpc + "\n"), std::string::npos) << last_line;
  EXPECT_EQ(parse_metrics_csv(csv).size(), 6u);
  // 6 windows of 17 characters per step: loss at every one of the 16 positions.
  EXPECT_EQ(t.history().front().tokens, 8 * 16);

  // The metadata holds the config and the data settings; they rebuild the same dataset and model.
  const RunMetadata run = parse_run_metadata(t.metadata(), "t");
  EXPECT_EQ(run.config, t.config());
  const data::DataSpec saved = data::DataSpec::from_json(run.data);
  EXPECT_EQ(saved.vocabulary, text.vocabulary().tokens());
  EXPECT_NE(saved.file_hash, 0u);
  const auto vocab_only = run_dataset(run, false);
  EXPECT_EQ(vocab_only->model_spec(t.config().model_sizes()), t.model().spec());

  // A checkpoint continues bit-identically, the data position included.
  TrainConfig longer = t.config();
  longer.steps = 10;
  Trainer straight(longer, data::open_data(spec));
  straight.train();
  Trainer first(longer, data::open_data(spec));
  for (int i = 0; i < 6; ++i) first.step();
  const std::string ck = scratch("text.ckpt");
  first.save_checkpoint(ck);
  std::unique_ptr<Trainer> resumed = Trainer::from_checkpoint(ck);  // rebuilt from the metadata alone
  EXPECT_EQ(resumed->step_count(), 6);
  EXPECT_EQ(resumed->dataset().position(), first.dataset().position());
  resumed->train();
  ASSERT_EQ(resumed->history().size(), straight.history().size());
  for (size_t i = 0; i < straight.history().size(); ++i)
    EXPECT_EQ(resumed->history()[i].loss, straight.history()[i].loss) << "step " << i + 1;
  // A checkpoint of a built-in task does not load into a text run, nor the reverse.
  Trainer builtin(small("reverse"));
  EXPECT_ATTO_ERROR(builtin.load_checkpoint(ck), "was saved for a data file");
}

TEST(TrainerData, PairsRunAndBuiltInMetadata) {
  const data::DataSpec spec{.format = "pairs", .path = data_path("train/numbers.tsv"), .tokenize = "word"};
  TrainConfig c = small("pairs");
  c.model = "seq2seq";
  Trainer t(c, data::open_data(spec));
  t.train();
  EXPECT_FALSE(t.model().spec().stream);
  EXPECT_EQ(t.history().back().eval.n, 40);  // 10% of 400 lines
  const std::string csv = t.metrics_csv();
  EXPECT_EQ(csv.substr(csv.size() - 3), ",,\n");  // no val_loss / val_bpc for a sequence task

  // A built-in task's metadata stays the config's JSON (weights files written before data files read the same).
  Trainer builtin(small("reverse"));
  EXPECT_EQ(builtin.metadata(), builtin.config().to_json());
  EXPECT_TRUE(parse_run_metadata(builtin.metadata(), "b").data.empty());
  EXPECT_ATTO_ERROR(parse_run_metadata("{\"x\": 1}", "'f'"), "'f' has no training configuration");
}

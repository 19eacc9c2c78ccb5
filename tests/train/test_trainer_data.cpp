// Trainer on data files: a text file (stream framing, teacher-forced evaluation with val_loss / val_bpc in the
// metrics) and a pairs file; the run's metadata (config + data settings) rebuilds the dataset and the model, a
// checkpoint resumes bit-identically, and a built-in task's metadata is the config's JSON exactly as before.

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "scratch.h"
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

std::string scratch(const std::string& name) { return (test_scratch::dir("td") / name).string(); }

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
            "val_loss,val_bpc,train_loss,val_bpb");
  const std::string last_line = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
  char bpc[64];
  std::snprintf(bpc, sizeof bpc, "%.17g", last.eval.loss / std::log(2.0));
  EXPECT_NE(last_line.find(std::string(",") + bpc + ","), std::string::npos) << last_line;
  EXPECT_EQ(parse_metrics_csv(csv).size(), 7u);  // step 0 (the evaluation before the first update), then 6 steps
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

TEST(TrainerData, BitsPerByteOfAsciiCharsIsBitsPerCharacter) {
  // One byte per character: bits per byte = nats / ln 2 / targets = val loss / ln 2.
  std::string text;
  for (int i = 0; i < 60; ++i) text += "the quick brown fox " + std::to_string(i * 7919 % 1000) + "\n";
  const std::string path = scratch("ascii.txt");
  std::ofstream(path, std::ios::binary) << text;
  Trainer t(small("text"), data::open_data(data::DataSpec{.path = path, .context = 16}));
  t.train();
  const EvalResult r = t.evaluate();
  ASSERT_GT(r.bits_per_byte, 0);
  EXPECT_DOUBLE_EQ(r.bits_per_byte, r.loss / std::log(2.0));
  EXPECT_EQ(r.bits_per_byte, t.history().back().eval.bits_per_byte);
  // metrics.csv's val_bpb column, read back exactly.
  const std::vector<StepMetrics> rows = parse_metrics_csv(t.metrics_csv());
  EXPECT_EQ(rows.back().eval.bits_per_byte, r.bits_per_byte);
  EXPECT_EQ(rows[1].eval.bits_per_byte, 0);  // not evaluated at step 1
  // With the entropy columns after it.
  TrainConfig logged = small("text");
  logged.log_entropy = true;
  Trainer e(logged, data::open_data(data::DataSpec{.path = path, .context = 16}));
  e.train();
  const std::string csv = e.metrics_csv();
  EXPECT_EQ(csv.substr(0, csv.find(",entropy,")),
            "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,"
            "val_loss,val_bpc,train_loss,val_bpb");
  std::vector<std::string> columns;
  const std::vector<StepMetrics> back = parse_metrics_csv(csv, &columns);
  EXPECT_EQ(columns.size(), 2u);  // 1 layer, 2 heads
  EXPECT_EQ(back.back().eval.bits_per_byte, e.history().back().eval.bits_per_byte);
  EXPECT_EQ(back.back().entropies.size(), 2u);
  // A built-in task's tokens have no bytes: no val_bpb column, no bits per byte.
  Trainer task(small("reverse"));
  task.train();
  EXPECT_EQ(task.history().back().eval.bits_per_byte, 0);
  EXPECT_EQ(task.metrics_csv().find("val_bpb"), std::string::npos);
}

TEST(TrainerData, BitsPerByteOfABpeRunCountsEachTokensBytes) {
  const data::DataSpec spec{.path = data_path("train/poems.txt"), .context = 8, .tokenizer = "bpe", .vocab_size = 500};
  TrainConfig c = small("text");
  c.eval_size = 1000;  // every held-out window
  Trainer t(c, data::open_data(spec));
  t.train();
  const EvalResult r = t.evaluate();
  const auto& d = static_cast<const data::TextDataset&>(t.dataset());
  ASSERT_LT(r.n, 1000);
  // The targets are every held-out token but the first; their bytes are the held-out text's but the first token's.
  const std::string text = attograd::testing::data_path("train/poems.txt");
  std::ifstream in(text, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  size_t split = all.size() - static_cast<size_t>(static_cast<double>(all.size()) * 0.1);
  while ((static_cast<unsigned char>(all[split]) & 0xC0) == 0x80) --split;
  const std::vector<data::Example> held = d.heldout(1000, 0);
  const int64_t bytes = static_cast<int64_t>(all.size() - split) - d.token_bytes(held[0].src[0]);
  const int64_t targets = d.val_size() - 1;
  EXPECT_DOUBLE_EQ(r.nats, r.loss * static_cast<double>(targets));
  EXPECT_EQ(r.bits_per_byte, r.nats / std::log(2.0) / static_cast<double>(bytes));
  // Fewer bits per byte than per token: a token holds more than a byte on average.
  EXPECT_LT(r.bits_per_byte, r.loss / std::log(2.0));
}

TEST(TrainerData, BpeTextRunResumesBitIdenticallyWithItsSavedTokenizer) {
  const data::DataSpec spec{.path = data_path("train/poems.txt"), .context = 8, .tokenizer = "bpe", .vocab_size = 500};
  TrainConfig c = small("text");
  c.steps = 10;
  Trainer straight(c, data::open_data(spec));
  straight.train();
  EXPECT_EQ(straight.model().vocab_size(), 504);
  Trainer first(c, data::open_data(spec));
  for (int i = 0; i < 6; ++i) first.step();
  const std::string ck = scratch("bpe.ckpt");
  first.save_checkpoint(ck);
  std::unique_ptr<Trainer> resumed = Trainer::from_checkpoint(ck);  // the tokenizer from the checkpoint alone
  const data::DataSpec saved = data::DataSpec::from_json(resumed->dataset().describe());
  EXPECT_EQ(saved.tokenizer, "bpe");
  EXPECT_EQ(saved.tokenizer_hash, data::DataSpec::from_json(first.dataset().describe()).tokenizer_hash);
  EXPECT_EQ(resumed->dataset().position(), first.dataset().position());
  resumed->train();
  ASSERT_EQ(resumed->history().size(), straight.history().size());
  for (size_t i = 0; i < straight.history().size(); ++i)
    EXPECT_EQ(resumed->history()[i].loss, straight.history()[i].loss) << "step " << i + 1;
  EXPECT_EQ(resumed->history().back().eval.loss, straight.history().back().eval.loss);
  // A char run's checkpoint does not load into this bpe run (another token space).
  Trainer chars(small("text"), data::open_data(data::DataSpec{.path = data_path("train/poems.txt"), .context = 8}));
  EXPECT_ATTO_ERROR(chars.load_checkpoint(ck), "was saved for another data file");
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
  // No val_loss / val_bpc for a sequence task: empty before the last column, train_loss.
  const std::string last_row = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
  char train_loss[64];
  std::snprintf(train_loss, sizeof train_loss, ",,,%.17g\n", t.history().back().train_loss);
  EXPECT_EQ(last_row.substr(last_row.size() - std::strlen(train_loss)), train_loss) << last_row;

  // A built-in task's metadata stays the config's JSON (weights files written before data files read the same).
  Trainer builtin(small("reverse"));
  EXPECT_EQ(builtin.metadata(), builtin.config().to_json());
  EXPECT_TRUE(parse_run_metadata(builtin.metadata(), "b").data.empty());
  EXPECT_ATTO_ERROR(parse_run_metadata("{\"x\": 1}", "'f'"), "'f' has no training configuration");
}

namespace {

// A UTF-8 text of `distinct` different characters (CJK ideographs from U+4E00), each once, then "ab" repeated.
std::string many_characters(int64_t distinct, int64_t tail) {
  std::string s;
  for (int64_t i = 0; i < distinct; ++i) {
    const auto cp = static_cast<uint32_t>(0x4E00 + i);
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  for (int64_t i = 0; i < tail; ++i) s += "ab";
  return s;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

}  // namespace

TEST(TrainerData, MemoryEstimateCountsTheFilesVocabularyNotSymbols) {
  // 20,000 distinct characters: --symbols (10) says nothing of them. The logits of a batch of 100,000 windows of
  // 256 characters over that vocabulary need terabytes: refused before the model is built, naming the vocabulary.
  const std::string path = scratch("vocab.txt");
  write_file(path, many_characters(20000, 2000));
  const data::DataSpec spec{.path = path, .context = 256};
  auto data = data::open_data(spec);
  ASSERT_GT(data->vocab_size(), 20000);
  TrainConfig c = small("text");
  c.batch = 100000;
  c.check_fits_in_memory();  // the config alone (10 symbols, max_len 12) fits
  const MemoryEstimate real = c.estimate_memory(data->vocab_size(), 257);
  EXPECT_GT(real.batch_bytes, static_cast<double>(c.batch) * 257 * 2 * 20000 * 4);
  EXPECT_EQ(c.estimate_memory().batch_bytes, c.estimate_memory(5 + c.num_symbols, 2 * c.max_len + 1).batch_bytes);
  EXPECT_ATTO_ERROR(Trainer(c, data), str_cat("over a vocabulary of ", data->vocab_size()));
  // The same data with a batch that fits trains.
  c.batch = 2;
  c.steps = 1;
  c.warmup = 0;
  c.eval_every = 0;
  Trainer ok(c, data);
  EXPECT_EQ(ok.model().vocab_size(), data->vocab_size());
}

TEST(TrainerData, EvalSizeBeyondTheHeldOutTextEvaluatesWhatThereIs) {
  // eval_size 100,000,000 windows of 256 characters would need ~400 GB; the held-out part has a handful: the run
  // is checked against those, trains, and evaluates every held-out window.
  const std::string path = scratch("heldout.txt");
  write_file(path, many_characters(0, 3000));  // 6000 characters, 600 held out: 3 windows of 256
  auto data = data::open_data(data::DataSpec{.path = path, .context = 256});
  EXPECT_EQ(data->heldout_size(), 3);
  EXPECT_EQ(data->heldout(100, 0).size(), 3u);
  TrainConfig c = small("text");
  c.eval_size = 100000000;
  c.steps = 1;
  c.warmup = 0;
  c.eval_every = 0;
  Trainer t(c, data);
  t.train();
  ASSERT_TRUE(t.history().back().evaluated);
  EXPECT_EQ(t.history().back().eval.n, 3);
  EXPECT_EQ(t.evaluate().n, 3);
  // The training-loss estimate takes as many training windows as the evaluation has (3, not 100,000,000).
  EXPECT_EQ(t.history().back().train_loss, t.estimate_train_loss(3));
  EXPECT_GT(t.history().back().train_loss, 0);
}

TEST(TrainerData, HeldOutThatCannotFitIsRefusedBeforeTheFirstStep) {
  // A generated task has as many held-out examples as asked: 100,000,000 of 256 + 256 tokens cannot fit in half
  // of any test machine's memory, and the Trainer says so when it is built, not at the first evaluation.
  TrainConfig c = small("copy");
  c.max_len = 256;
  c.eval_size = 100000000;
  EXPECT_ATTO_ERROR(Trainer{c}, "100000000 held-out examples need about");
}

// Train on your own text: a character-level language model of a UTF-8 file (any language), then sample from it.
//   train_text FILE [STEPS]        (ctest runs it on tests/data/train/poems.txt: English sonnets and Chinese poems)
// Reads the file into a TextDataset (vocabulary = the file's characters, the last 10% held out), trains the
// decoder-only model on random windows of 32 characters, saves the weights with the run's metadata (config, data
// settings, vocabulary), rebuilds the model from the weights file alone and continues a prompt by sampling.
// Exits 1 unless the validation loss fell below 1.6 nats per character (2.3 bits; about 4.8 at the start) and the
// reloaded model samples the same text.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "attograd.h"

using namespace attograd;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: train_text FILE [STEPS]\n");
    return 2;
  }
  try {
    auto text = std::make_shared<data::TextDataset>(data::DataSpec{.path = argv[1], .context = 32});
    train::TrainConfig cfg;
    cfg.task = "text";  // a label: the data comes from the file
    cfg.model = "lm";   // the stream framing (ModelSpec::stream) comes from the dataset
    cfg.batch = 32;
    cfg.steps = argc > 2 ? std::atoll(argv[2]) : 400;
    cfg.warmup = cfg.steps / 10;
    cfg.eval_every = 100;
    train::Trainer trainer(cfg, text);
    std::printf("%s: %lld characters (%lld held out), vocabulary %lld; %lld parameters, %lld steps\n",
                text->name().c_str(), static_cast<long long>(text->train_size() + text->val_size()),
                static_cast<long long>(text->val_size()), static_cast<long long>(text->vocab_size()),
                static_cast<long long>(trainer.model().num_parameters()), static_cast<long long>(cfg.steps));
    trainer.train([](const train::StepMetrics& m) {
      if (m.evaluated)
        std::printf("step %4lld  loss %.4f  val loss %.4f  val bpc %.3f  next-char accuracy %.1f%%\n",
                    static_cast<long long>(m.step), m.loss, m.eval.loss, m.eval.loss / std::log(2.0),
                    100 * m.eval.token_accuracy);
    });
    const double val_loss = trainer.history().back().eval.loss;

    // Save, then rebuild from the weights file alone (config and data settings in its metadata).
    const std::string path = (std::filesystem::temp_directory_path() / "attograd_train_text.attograd").string();
    io::save(trainer.model(), path, trainer.metadata());
    const train::RunMetadata run = train::parse_run_metadata(io::inspect(path).metadata, path);
    train::Trainer reloaded(run.config, train::run_dataset(run, /*read_file=*/false));
    io::load(reloaded.model(), path);
    std::filesystem::remove(path);

    // Sample 120 characters after a prompt, streaming them; the same seed gives the same text.
    const std::vector<int64_t> prompt = text->parse_source("Shall I ");
    std::printf("\n%s", text->to_text(prompt).c_str());
    Generator gen(7), same(7);
    const train::TokenRows out = train::sample(trainer.model(), {prompt}, 120, {.temperature = 0.8, .top_k = 20}, gen,
                                               [&](int64_t, int64_t token) {
                                                 std::printf("%s", text->to_text({token}).c_str());
                                                 std::fflush(stdout);
                                               });
    const train::TokenRows again =
        train::sample(reloaded.model(), {prompt}, 120, {.temperature = 0.8, .top_k = 20}, same);
    std::printf("\n\n");
    const bool ok = val_loss < 1.6 && out == again;
    std::printf("val loss %.4f (%.3f bits per character); %s\n", val_loss, val_loss / std::log(2.0),
                ok ? "text model learned" : "FAILED");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_text: %s\n", e.what());
    return 2;
  }
}

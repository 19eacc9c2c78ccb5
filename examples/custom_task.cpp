// A task of one's own through the data interface: "rotate" (the source rotated left by one: 3 1 4 1 5 -> 1 4 1 5 3),
// which is none of the built-in four. The whole program is the dataset (twenty lines: how to draw one example and
// the token space) and a main that trains the encoder-only model on it with train::Trainer, saves
// the weights, loads them into a fresh model and evaluates both on the same held-out examples.
//
// Usage: custom_task [steps]      (exit status 1 if the model did not learn the task or the reload differs)

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "train/io/serialize.h"
#include "train/trainer.h"

using namespace attograd;

// Sources of 1..8 digits; token 5 + d is digit d (tokens 0..4 are the built-in specials: pad, bos, eos, sep, +).
class Rotate : public data::GeneratedDataset {
 public:
  static constexpr int64_t kDigit0 = 5, kMaxLen = 8;
  std::string name() const override { return "rotate"; }
  int64_t vocab_size() const override { return kDigit0 + 10; }
  int64_t max_source_len() const override { return kMaxLen; }
  int64_t max_target_len() const override { return kMaxLen; }
  bool aligned() const override { return true; }  // as many output digits as input digits
  std::string token_text(int64_t t) const override { return t >= kDigit0 ? std::to_string(t - kDigit0) : "<s>"; }

  data::Example generate(Generator& gen) const override {
    data::Example e;
    const int64_t n = 1 + static_cast<int64_t>(gen.randint(kMaxLen));
    for (int64_t i = 0; i < n; ++i) e.src.push_back(kDigit0 + static_cast<int64_t>(gen.randint(10)));
    e.tgt.assign(e.src.begin() + 1, e.src.end());
    e.tgt.push_back(e.src.front());
    return e;
  }
};

int main(int argc, char** argv) {
  train::TrainConfig cfg;
  cfg.task = "rotate";  // a label: the data comes from the dataset below
  cfg.model = "encoder";     // any registered kind: "lm", "seq2seq", "encoder", or your own
  cfg.steps = argc > 1 ? std::atoll(argv[1]) : 300;
  cfg.warmup = cfg.steps / 10;
  cfg.eval_every = 0;
  cfg.eval_size = 500;

  train::Trainer trainer(cfg, std::make_shared<Rotate>());
  std::printf("training a %s model (%lld parameters) on %s for %lld steps\n", cfg.model.c_str(),
              static_cast<long long>(trainer.model().num_parameters()), trainer.dataset().name().c_str(),
              static_cast<long long>(cfg.steps));
  trainer.train([&](const train::StepMetrics& m) {
    if (m.step % 100 == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(m.step), m.loss);
  });
  const train::EvalResult r = trainer.evaluate();
  std::printf("held-out: token accuracy %.4f, sequence accuracy %.4f, loss %.4f\n", r.token_accuracy,
              r.sequence_accuracy, r.loss);

  // Save the weights with the config, then rebuild the same kind for the same data and load them.
  const std::string path = (std::filesystem::temp_directory_path() / "attograd_rotate.attograd").string();
  io::save(trainer.model(), path, cfg.to_json());
  train::Trainer reloaded(train::TrainConfig::from_json(io::inspect(path).metadata), std::make_shared<Rotate>());
  io::load(reloaded.model(), path);
  std::filesystem::remove(path);
  const train::EvalResult again = reloaded.evaluate();
  const data::Example e = trainer.heldout_examples(1)[0];
  std::printf("%s -> %s (expected %s)\n", trainer.dataset().to_text(e.src).c_str(),
              trainer.dataset().to_text(reloaded.predict(e.src)).c_str(), trainer.dataset().to_text(e.tgt).c_str());
  std::printf("reloaded: token accuracy %.4f, sequence accuracy %.4f\n", again.token_accuracy, again.sequence_accuracy);
  const bool ok = r.sequence_accuracy >= 0.9 && again.token_accuracy == r.token_accuracy &&
                  again.sequence_accuracy == r.sequence_accuracy && again.loss == r.loss;
  std::printf("%s\n", ok ? "custom task learned" : "FAILED");
  return ok ? 0 : 1;
}

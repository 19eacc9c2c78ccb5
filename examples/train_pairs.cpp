// Train on your own sequence task: a file of source<TAB>target lines.
//   train_pairs FILE.tsv [STEPS]   (ctest runs it on tests/data/train/numbers.tsv: English number words -> Spanish)
// Reads the file into a PairsDataset (word tokens, a fixed 10% of the lines held out), trains the seed's
// encoder-decoder on it, reports greedy-decoding accuracy on the held-out lines, and translates raw text.
// Exits 1 unless at least 95% of the held-out lines are decoded exactly (100% after 400 steps on numbers.tsv).

#include <cstdio>
#include <cstdlib>

#include "attograd.h"

using namespace attograd;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: train_pairs FILE.tsv [STEPS]\n");
    return 2;
  }
  try {
    auto pairs =
        std::make_shared<data::PairsDataset>(data::DataSpec{.format = "pairs", .path = argv[1], .tokenize = "word"});
    train::TrainConfig cfg;
    cfg.task = "pairs";
    cfg.model = "seq2seq";  // or "lm"; "encoder" when every target has its source's length
    cfg.batch = 32;
    cfg.steps = argc > 2 ? std::atoll(argv[2]) : 400;
    cfg.warmup = cfg.steps / 10;
    cfg.eval_every = 0;
    train::Trainer trainer(cfg, pairs);
    std::printf("%s: %lld training lines, %lld held out, vocabulary %lld; %lld parameters, %lld steps\n",
                pairs->name().c_str(), static_cast<long long>(pairs->train_size()),
                static_cast<long long>(pairs->val_size()), static_cast<long long>(pairs->vocab_size()),
                static_cast<long long>(trainer.model().num_parameters()), static_cast<long long>(cfg.steps));
    trainer.train([](const train::StepMetrics& m) {
      if (m.step % 100 == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(m.step), m.loss);
    });
    const train::EvalResult r = trainer.evaluate();
    std::printf("held-out: token accuracy %.4f, sequence accuracy %.4f (%lld lines)\n", r.token_accuracy,
                r.sequence_accuracy, static_cast<long long>(r.n));
    for (const char* input : {"seven three", "one two three four five"}) {
      const std::vector<int64_t> out = trainer.predict(pairs->parse_source(input));
      std::printf("%s -> %s\n", input, pairs->to_text(out).c_str());
    }
    const bool ok = r.sequence_accuracy >= 0.95;
    std::printf("%s\n", ok ? "pairs task learned" : "FAILED");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_pairs: %s\n", e.what());
    return 2;
  }
}

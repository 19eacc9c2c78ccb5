// Trains a small decoder-only transformer to reverse sequences of digits (lengths 1..12), with the whole
// training loop visible in main(): data, model, optimizer, schedule, the step loop with its loss, periodic
// evaluation on 1,000 held-out sequences, and a few predictions at the end.
//
// It builds exactly what train::Trainer builds for the default TrainConfig (same generators, model, optimizer
// and schedule), so it prints the same losses as `train_task` with no arguments.
//
// Usage: train_reverse [steps]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/models.h"
#include "train/decode.h"
#include "train/optim/optimizers.h"
#include "train/optim/schedule.h"
#include "train/data/tasks.h"
#include "train/trainer.h"

using namespace attograd;

int main(int argc, char** argv) {
  const train::TrainConfig cfg;  // the defaults: see train/trainer.h and docs/TRAINING.md
  if (cfg.task != "reverse" || cfg.model != "lm" || cfg.optimizer != "adamw" || cfg.schedule != "cosine" ||
      cfg.clip <= 0) {
    std::fprintf(stderr, "this example spells out the default TrainConfig, which has changed: update it\n");
    return 1;
  }
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : cfg.steps;
  if (steps < 1) {
    std::fprintf(stderr, "usage: %s [steps >= 1]\n", argv[0]);
    return 2;
  }

  // Data: an endless stream of training examples, and a fixed held-out set drawn from a different seed.
  const data::TaskOptions task{.task = data::Task::Reverse, .min_len = cfg.min_len, .max_len = cfg.max_len};
  data::TaskDataset train_data(task, train::derive_seed(cfg.seed, train::Stream::Data));
  const std::vector<data::Example> val =
      train_data.heldout(cfg.eval_size, train::derive_seed(cfg.seed, train::Stream::Heldout));

  // Model: a pre-LN decoder-only transformer reading "src SEP tgt", its embedding tied to the output.
  Generator init_gen(train::derive_seed(cfg.seed, train::Stream::Init));
  Generator dropout_gen(train::derive_seed(cfg.seed, train::Stream::Dropout));
  const int64_t vocab = data::vocab_size(task);
  nn::CausalLM model({.vocab = vocab,
                      .d_model = cfg.d_model,
                      .n_head = cfg.heads,
                      .d_ff = cfg.d_ff,
                      .n_layers = cfg.layers,
                      .dropout = cfg.dropout,
                      .max_len = data::max_src_len(task) + data::max_tgt_len(task) + 1,
                      .pad_idx = data::kPad},
                     init_gen);
  model.set_generator(dropout_gen);
  std::printf("model: %lld parameters, %lld layers, d_model %lld, %lld heads\n",
              static_cast<long long>(model.num_parameters()), static_cast<long long>(cfg.layers),
              static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.heads));

  // Optimizer and schedule: AdamW, linear warm-up then cosine decay to zero.
  optim::AdamW optimizer(model.named_parameters(),
                         {.lr = cfg.lr, .betas = {0.9, 0.98}, .eps = 1e-9, .weight_decay = cfg.weight_decay});
  optim::WarmupCosine schedule(optimizer, cfg.warmup, steps);

  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    model.train();
    optimizer.zero_grad();
    std::vector<data::Example> examples;
    for (int64_t i = 0; i < cfg.batch; ++i) examples.push_back(train_data.next());
    const nn::SequenceBatch batch = model.make_batch(examples);  // inputs {src SEP tgt}, target (B, L)
    const Tensor logits = model.forward(batch.inputs[0]);         // (B, L, V)
    const Tensor loss = cross_entropy(reshape(logits, {-1, vocab}), reshape(batch.target, {-1}),
                                      {.ignore_index = data::kIgnore, .label_smoothing = cfg.label_smoothing});
    const double lr = optimizer.lr();
    loss.backward();
    const double norm = optim::clip_grad_norm_(optimizer.params(), cfg.clip);
    optimizer.step();
    schedule.step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    if (step == 1 || step % 100 == 0)
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.1f ms\n", static_cast<long long>(step),
                  static_cast<long long>(steps), loss.item(), lr, norm, ms);
    if (step % cfg.eval_every == 0 || step == steps) {
      const train::EvalResult r = train::evaluate(model, val);
      std::printf("  eval @ %lld: token acc %.4f | sequence acc %.4f | loss %.4f (%lld held-out sequences)\n",
                  static_cast<long long>(step), r.token_accuracy, r.sequence_accuracy, r.loss,
                  static_cast<long long>(r.n));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trained %lld steps in %.1f s (%.1f steps/s)\n", static_cast<long long>(steps), seconds,
              static_cast<double>(steps) / seconds);

  // A few held-out predictions.
  for (size_t i = 0; i < 4 && i < val.size(); ++i) {
    const std::vector<int64_t> out =
        train::strip_eos(train::greedy_decode(model, {val[i].src}, data::max_tgt_len(task) + 1)[0]);
    std::printf("  %-26s -> %-26s %s\n", data::tokens_to_string(val[i].src).c_str(),
                data::tokens_to_string(out).c_str(), out == val[i].tgt ? "ok" : "WRONG");
  }
  return 0;
}

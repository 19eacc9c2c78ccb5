// A model of one's own through the sequence-model interface: FlatMLP, a multilayer perceptron that reads the whole
// (padded) source at once and writes every output position at once, trained on the built-in reverse task by
// train::Trainer, saved, rebuilt by kind from the saved config, loaded and evaluated. Nothing in the library knows
// this model: registering its kind is what lets the Trainer (and a checkpoint) build it.
//
//   logits = out(relu(hidden(flatten(embed(src)))))  reshaped to (B, max_target_len + 1, vocab)
//
// Usage: custom_model [steps]      (exit status 1 if the model did not learn the task or the reload differs)

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "autograd/activation.h"
#include "autograd/shape.h"
#include "nn/layers.h"
#include "train/io/serialize.h"
#include "train/trainer.h"

using namespace attograd;

class FlatMLP : public nn::SequenceModel {
 public:
  FlatMLP(const nn::ModelSpec& spec, Generator& gen)
      : spec_(spec), S_(spec.max_source_len), T_(spec.max_target_len + 1) {
    embed = register_module("embed", std::make_shared<nn::Embedding>(spec.vocab, spec.d_model, -1, gen));
    hidden = register_module("hidden", std::make_shared<nn::Linear>(S_ * spec.d_model, spec.d_ff, true, gen));
    out = register_module("out", std::make_shared<nn::Linear>(spec.d_ff, T_ * spec.vocab, true, gen));
  }
  std::string type_name() const override { return "FlatMLP"; }
  std::string kind() const override { return "flat_mlp"; }
  const nn::ModelSpec& spec() const override { return spec_; }

  // src (B, S) -> logits (B, T, V)
  Tensor forward(const Tensor& src) override {
    const int64_t B = src.size(0);
    const Tensor x = reshape(embed->forward(src), {B, S_ * spec_.d_model});  // (B, S * D)
    return reshape(out->forward(relu(hidden->forward(x))), {B, T_, spec_.vocab});
  }
  // Sources padded to the fixed width S; the target is tgt EOS at positions 0..|tgt|, no loss after it.
  nn::SequenceBatch make_batch(const std::vector<nn::Example>& examples) const override {
    check_examples(examples, "FlatMLP");
    nn::TokenRows src, tgt;
    for (const nn::Example& e : examples) {
      src.push_back(e.src);
      tgt.push_back(e.tgt);
      tgt.back().push_back(spec_.specials.eos);
    }
    return {.inputs = {nn::pack_rows(src, S_, spec_.specials.pad)},
            .target = nn::pack_rows(tgt, T_, spec_.specials.ignore_index),
            .examples = examples};
  }
  Tensor forward_batch(const nn::SequenceBatch& b) override { return forward(b.inputs[0]); }
  // One forward gives every position: decoding reads position |decoded| of each row.
  nn::DecodeState begin_decode(const nn::TokenRows& sources) override {
    nn::DecodeState st = nn::DecodeState::start(sources);
    st.memory = {forward(nn::pack_rows(sources, S_, spec_.specials.pad))};  // (B, T, V)
    return st;
  }
  Tensor decode_step(nn::DecodeState& st) override {
    std::vector<std::pair<int64_t, int64_t>> at;
    for (int64_t b : st.active) at.emplace_back(b, static_cast<int64_t>(st.decoded[static_cast<size_t>(b)].size()));
    return nn::gather_positions(st.memory[0], at);  // (A, V)
  }

  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> hidden, out;

 private:
  nn::ModelSpec spec_;
  int64_t S_, T_;
};

int main(int argc, char** argv) {
  nn::register_model("flat_mlp", [](const nn::ModelSpec& spec, Generator& gen) {
    return std::make_shared<FlatMLP>(spec, gen);
  });

  train::TrainConfig cfg;  // the built-in reverse task, lengths 1..6
  cfg.model = "flat_mlp";
  cfg.max_len = 6;
  cfg.d_model = 16;
  cfg.d_ff = 512;
  cfg.steps = argc > 1 ? std::atoll(argv[1]) : 600;
  cfg.warmup = cfg.steps / 10;
  cfg.eval_every = 0;
  cfg.eval_size = 500;

  train::Trainer trainer(cfg);
  std::printf("training %s (%lld parameters) on %s for %lld steps\n", trainer.model().type_name().c_str(),
              static_cast<long long>(trainer.model().num_parameters()), trainer.dataset().name().c_str(),
              static_cast<long long>(cfg.steps));
  trainer.train([&](const train::StepMetrics& m) {
    if (m.step % 250 == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(m.step), m.loss);
  });
  const train::EvalResult r = trainer.evaluate();
  std::printf("held-out: token accuracy %.4f, sequence accuracy %.4f, loss %.4f\n", r.token_accuracy,
              r.sequence_accuracy, r.loss);

  // Save, rebuild by kind from the saved config (the registered factory), load, evaluate again.
  const std::string path = (std::filesystem::temp_directory_path() / "attograd_flat_mlp.attograd").string();
  io::save(trainer.model(), path, cfg.to_json());
  train::Trainer reloaded(train::TrainConfig::from_json(io::inspect(path).metadata));
  io::load(reloaded.model(), path);
  std::filesystem::remove(path);
  const train::EvalResult again = reloaded.evaluate();
  std::printf("reloaded %s: token accuracy %.4f, sequence accuracy %.4f\n", reloaded.model().kind().c_str(),
              again.token_accuracy, again.sequence_accuracy);
  const bool ok = r.sequence_accuracy >= 0.9 && again.token_accuracy == r.token_accuracy &&
                  again.sequence_accuracy == r.sequence_accuracy && again.loss == r.loss;
  std::printf("%s\n", ok ? "custom model learned" : "FAILED");
  return ok ? 0 : 1;
}

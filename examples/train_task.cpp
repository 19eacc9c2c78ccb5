// Trains a toy task with train::Trainer, configured by key=value arguments over the TrainConfig defaults, e.g.
//     train_task task=sort model=seq2seq steps=3000
// Prints the configuration, progress every 100 steps, each evaluation, and one final machine-readable line:
//     RESULT task=.. model=.. steps=.. seconds=.. steps_per_s=.. token_acc=.. seq_acc=.. eval_loss=..
// Extra arguments: save=PATH (checkpoint at the end), resume=PATH (continue from a checkpoint), csv=PATH.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/trainer.h"

using namespace attograd;

int main(int argc, char** argv) {
  try {
    // key=value arguments become a JSON object read by TrainConfig::from_json (which checks names and types).
    nlohmann::ordered_json overrides = nlohmann::ordered_json::object();
    std::string save_path, resume_path, csv_path;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const size_t eq = arg.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "usage: %s [field=value ...] [save=PATH] [resume=PATH] [csv=PATH]\n", argv[0]);
        return 2;
      }
      const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
      if (key == "save") save_path = value;
      else if (key == "resume") resume_path = value;
      else if (key == "csv") csv_path = value;
      else overrides[key] = nlohmann::ordered_json::accept(value) ? nlohmann::ordered_json::parse(value)
                                                                  : nlohmann::ordered_json(value);
    }
    std::unique_ptr<train::Trainer> trainer;
    if (resume_path.empty()) {
      trainer = std::make_unique<train::Trainer>(train::TrainConfig::from_json(overrides.dump()));
    } else {
      trainer = train::Trainer::from_checkpoint(resume_path);
      std::printf("resumed from %s at step %lld\n", resume_path.c_str(),
                  static_cast<long long>(trainer->step_count()));
    }
    const train::TrainConfig& cfg = trainer->config();
    std::printf("config: %s\n", cfg.to_json(-1).c_str());
    std::printf("model: %lld parameters\n", static_cast<long long>(trainer->model().num_parameters()));

    const auto start = std::chrono::steady_clock::now();
    const int64_t first = trainer->step_count();
    trainer->train([&](const train::StepMetrics& m) {
      if (m.step == 1 || m.step % 100 == 0)
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.1f ms\n",
                    static_cast<long long>(m.step), static_cast<long long>(cfg.steps), m.loss, m.lr, m.grad_norm,
                    1e3 * m.seconds);
      if (m.evaluated)
        std::printf("  eval @ %lld: token acc %.4f | sequence acc %.4f | loss %.4f\n", static_cast<long long>(m.step),
                    m.eval.token_accuracy, m.eval.sequence_accuracy, m.eval.loss);
      std::fflush(stdout);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!save_path.empty()) trainer->save_checkpoint(save_path);
    if (!csv_path.empty()) trainer->write_metrics_csv(csv_path);

    const auto& history = trainer->history();
    const train::EvalResult r =
        !history.empty() && history.back().evaluated ? history.back().eval : trainer->evaluate();
    const int64_t ran = trainer->step_count() - first;
    std::printf("RESULT task=%s model=%s steps=%lld seconds=%.1f steps_per_s=%.2f token_acc=%.4f seq_acc=%.4f "
                "eval_loss=%.4f n=%lld\n",
                cfg.task.c_str(), cfg.model.c_str(), static_cast<long long>(trainer->step_count()), seconds,
                ran > 0 ? static_cast<double>(ran) / seconds : 0.0, r.token_accuracy, r.sequence_accuracy, r.loss,
                static_cast<long long>(r.n));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

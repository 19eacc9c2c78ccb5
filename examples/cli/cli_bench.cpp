// `attograd bench [--preset small|medium|large|long] [-V -D -H -F -N -L -B] [--steps] [--warmup] [--threads]
// [--seed]`: times training steps of the causal LM benchmark (train/tools/bench.h) and prints the JSON result last.

#include "cli_bench.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "nn/attention_layer.h"
#include "nn/sequence_model.h"
#include "train/tools/bench.h"

namespace attograd::cli {

// Defined here, not in cli_common.cpp, because attograd_bench (examples/attograd_bench.cpp) compiles this file
// without the rest of the tool.
CLI::Validator attention_kind() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (nn::has_attention(value)) return "";
        return "unknown kind '" + value + "' (registered: " + nn::attention_kinds_list() + ")";
      },
      "KIND");
}


namespace {

struct BenchArgs {
  std::string preset = "small";
  std::optional<int64_t> V, D, H, F, N, L, B;
  int steps = 20;
  int warmup = 3;
  int threads = 1;
  uint64_t seed = 0;
  bool generate = false;
  int64_t prompt = 16, tokens = 256;
  int rounds = 3;
  bool no_uncached = false;
  std::string precision = "fp32";
  nn::AttentionSpec attention;  // --attention, --kv-heads, ... (the same flags as `attograd train`)
};

// " attention gqa (kv_heads 2), rope" for the header line, empty for the default.
std::string attention_words(const nn::AttentionSpec& a) {
  if (a == nn::AttentionSpec{}) return "";
  std::string s = ", attention " + a.kind + nn::attention_fields_words(a);
  if (a.rope) s += ", rope";
  if (a.checkpoint) s += ", checkpointed";
  return s;
}

std::string group_digits(int64_t n);

// The cache line of a summary: key/value bytes per token (from the spec), or linear attention's fixed state.
void print_cache(const nn::AttentionSpec& a, int64_t D, int64_t H, int64_t N) {
  if (bench::kv_cache_bytes_per_token(a, D, H, N) == 0 && bench::linear_state_bytes(a, D, H, N) > 0)
    std::printf("  kv cache    none: a fixed state of %s bytes per sequence (%s attention)\n",
                group_digits(static_cast<int64_t>(bench::linear_state_bytes(a, D, H, N))).c_str(), a.kind.c_str());
  else
    std::printf("  kv cache    %s bytes per token (float32, all %lld layers)\n",
                group_digits(static_cast<int64_t>(bench::kv_cache_bytes_per_token(a, D, H, N))).c_str(),
                static_cast<long long>(N));
}

std::string group_digits(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return n < 0 ? "-" + s : s;
}

// `attograd bench --generate`: the generation benchmark (train/tools/bench.h GenerateConfig); the sizes default to
// D=256, 4 layers, 4 heads, d_ff 1024, V=256 (explicit -V -D -H -F -N -B override them; the presets do not apply).
int run_generate_command(const BenchArgs& a) {
  bench::GenerateConfig c;
  const std::pair<const std::optional<int64_t>*, int64_t*> sizes[] = {{&a.V, &c.V}, {&a.D, &c.D}, {&a.H, &c.H},
                                                                      {&a.F, &c.F}, {&a.N, &c.N}, {&a.B, &c.B}};
  for (const auto& [given, field] : sizes)
    if (*given) *field = **given;
  c.prompt = a.prompt;
  c.tokens = a.tokens;
  c.rounds = a.rounds;
  c.uncached = !a.no_uncached;
  c.threads = a.threads;
  c.seed = a.seed;
  c.precision = parse_precision(a.precision);
  c.attention = a.attention;
  bench::validate(c);
  std::printf(
      "attograd bench --generate: V=%lld D=%lld H=%lld F=%lld N=%lld, B=%lld, prompt %lld + %lld tokens, "
      "%d thread%s, %d rounds%s%s\n",
      static_cast<long long>(c.V), static_cast<long long>(c.D), static_cast<long long>(c.H),
      static_cast<long long>(c.F), static_cast<long long>(c.N), static_cast<long long>(c.B),
      static_cast<long long>(c.prompt), static_cast<long long>(c.tokens), c.threads, c.threads == 1 ? "" : "s",
      c.rounds, attention_words(c.attention).c_str(), c.precision == Precision::bfloat16 ? ", bf16" : "");
  std::fflush(stdout);
  const bench::GenerateResult r = bench::run_generate_bench(c);
  std::printf("  parameters  %s\n", group_digits(r.params).c_str());
  if (c.attention != nn::AttentionSpec{}) print_cache(c.attention, c.D, c.H, c.N);
  std::printf("  cached      %s tokens/s (%s per CPU second; %.1f allocations per token)\n",
              group_digits(static_cast<int64_t>(r.cached_tokens_per_s + 0.5)).c_str(),
              group_digits(static_cast<int64_t>(r.cached_cpu_tokens_per_s + 0.5)).c_str(), r.cached_allocs_per_token);
  if (c.uncached) {
    std::printf("  uncached    %s tokens/s (%s per CPU second)\n",
                group_digits(static_cast<int64_t>(r.uncached_tokens_per_s + 0.5)).c_str(),
                group_digits(static_cast<int64_t>(r.uncached_cpu_tokens_per_s + 0.5)).c_str());
    std::printf("  speedup     %.1fx (%s tokens)\n", r.speedup, r.same_tokens ? "the same" : "DIFFERENT");
  }
  std::printf("%s\n", bench::to_json(r).c_str());
  std::fflush(stdout);
  return r.same_tokens ? kExitOk : kExitError;
}

int run_bench_command(const BenchArgs& a) {
  if (a.generate) return run_generate_command(a);
  bench::BenchConfig c = bench::preset(a.preset);
  // Explicit sizes override the preset's; any that differs makes the configuration "custom".
  const std::pair<const std::optional<int64_t>*, int64_t*> sizes[] = {
      {&a.V, &c.V}, {&a.D, &c.D}, {&a.H, &c.H}, {&a.F, &c.F}, {&a.N, &c.N}, {&a.L, &c.L}, {&a.B, &c.B}};
  for (const auto& [given, field] : sizes) {
    if (*given && **given != *field) {
      *field = **given;
      c.name = "custom";
    }
  }
  c.steps = a.steps;
  c.warmup = a.warmup;
  c.threads = a.threads;
  c.seed = a.seed;
  c.precision = parse_precision(a.precision);
  c.attention = a.attention;
  bench::validate(c);
  bench::check_bench_fits_in_memory(c);

  std::printf(
      "attograd bench: %s (V=%lld D=%lld H=%lld F=%lld N=%lld L=%lld B=%lld%s), %d thread%s, %d steps after %d "
      "warm-up%s\n",
      c.name.c_str(), static_cast<long long>(c.V), static_cast<long long>(c.D), static_cast<long long>(c.H),
      static_cast<long long>(c.F), static_cast<long long>(c.N), static_cast<long long>(c.L),
      static_cast<long long>(c.B), attention_words(c.attention).c_str(), c.threads, c.threads == 1 ? "" : "s", c.steps,
      c.warmup, c.precision == Precision::bfloat16 ? ", bf16" : "");
  std::fflush(stdout);
  const bench::BenchResult r = bench::run_bench(c);
  std::printf("  parameters  %s\n", group_digits(r.params).c_str());
  std::printf("  step        %.3f ms median (min %.3f ms)\n", r.median_step_ms, r.min_step_ms);
  std::printf("  throughput  %s tokens/s, %.2f model GFLOP/s (%.3f GFLOP per step)\n",
              group_digits(static_cast<int64_t>(r.tokens_per_s + 0.5)).c_str(), r.gflops, r.flops_per_step / 1e9);
  std::printf("  peak RSS    %.1f MB (tensors %.1f MB at peak, allocator held %.1f MB)\n", r.peak_rss_mb,
              r.peak_tensor_mb, r.peak_reserved_mb);
  if (c.attention != nn::AttentionSpec{}) {
    std::printf("  memory      %.1f MB parameters with gradients and Adam state, %.1f MB of activations at the peak\n",
                r.state_mb, r.peak_tensor_mb - r.state_mb);
    print_cache(c.attention, c.D, c.H, c.N);
  }
  std::printf("  allocation  %llu tensors per timed run, %llu of them new blocks from the system\n",
              static_cast<unsigned long long>(r.timed_allocs), static_cast<unsigned long long>(r.timed_system_allocs));
  std::printf("  loss        %.4f (first step) -> %.4f (last step)\n", r.first_loss, r.final_loss);
  std::printf("%s\n", bench::to_json(r).c_str());
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Time training steps of a causal LM (prints a JSON line last)");
  std::string presets;
  for (const std::string& p : bench::preset_names()) presets += (presets.empty() ? "" : "|") + p;
  sub->add_option("--preset", args->preset, "Configuration: " + presets + " (explicit sizes override it)")
      ->capture_default_str();
  sub->add_option("-V,--vocab", args->V, "Vocabulary size (5 specials + payload symbols)");
  sub->add_option("-D,--d-model", args->D, "Model width");
  sub->add_option("-H,--heads", args->H, "Attention heads (must divide D)");
  sub->add_option("-F,--d-ff", args->F, "Feed-forward hidden size");
  sub->add_option("-N,--layers", args->N, "Blocks");
  sub->add_option("-L,--seq-len", args->L, "Sequence length (even)");
  sub->add_option("-B,--batch", args->B, "Batch size");
  sub->add_option("--steps", args->steps, "Timed steps")->capture_default_str();
  sub->add_option("--warmup", args->warmup, "Untimed steps first")->capture_default_str();
  sub->add_option("--threads", args->threads, "Engine threads")->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed of the weights, dropout masks and data")->capture_default_str();
  sub->add_option("--precision", args->precision,
                  "fp32, or bf16: time mixed precision (bfloat16 matmul operands, float32 accumulation; docs/CPU.md)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  sub->add_flag("--generate", args->generate,
                "Instead: time greedy generation from the key/value cache and recomputing every step (defaults "
                "V=256 D=256 H=4 F=1024 N=4 B=1)");
  sub->add_option("--prompt", args->prompt, "With --generate: prompt tokens")->capture_default_str();
  sub->add_option("--tokens", args->tokens, "With --generate: tokens generated")->capture_default_str();
  sub->add_option("--rounds", args->rounds, "With --generate: timed rounds of each path")->capture_default_str();
  sub->add_flag("--no-uncached", args->no_uncached, "With --generate: time only the cached path");
  nn::AttentionSpec& at = args->attention;
  sub->add_option("--attention", at.kind, "Attention variant: any registered kind (" + nn::attention_kinds_list() + ")")
      ->check(attention_kind())
      ->capture_default_str();
  sub->add_option("--attention-options", at.options, "A registered kind's own options, a JSON object");
  sub->add_option("--kv-heads", at.kv_heads, "--attention gqa: key/value heads")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  sub->add_option("--kv-rank", at.kv_rank, "--attention mla: kv_lora_rank (0: D/4)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}));
  sub->add_option("--q-rank", at.q_rank, "--attention mla: q_lora_rank (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}));
  sub->add_option("--window", at.window, "--attention local: keys per query")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  sub->add_option("--block", at.block, "--attention block-sparse: block size")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  sub->add_flag("--rope", at.rope, "Rotary position embeddings instead of the sinusoidal table");
  sub->add_flag("--checkpoint-activations", at.checkpoint, "Gradient checkpointing of every block but the last");
  sub->footer(
      "Prints a summary, then one JSON object on the last line: median_step_ms, tokens_per_s, peak_rss_mb,\n"
      "peak_tensor_mb, ... (with a variant also attention, kv_cache_bytes_per_token and state_mb),\n"
      "first_loss, final_loss, flops_per_step, gflops, ... bench/torch_reference.py prints the same for PyTorch.\n\n"
      "Examples:\n"
      "  attograd bench --preset medium --threads 2\n"
      "  attograd bench --preset long -L 2048 --steps 5\n"
      "  attograd bench --preset long -L 8192 --attention local --window 128 --steps 3\n"
      "  attograd bench --preset large -L 512 --checkpoint-activations\n"
      "  attograd bench --generate --attention gqa --kv-heads 1\n"
      "  attograd bench --generate --tokens 256 --threads 1");
  return {sub, [args] { return run_bench_command(*args); }};
}

void add_bench_command(CLI::App& app) {
  Command c = add_bench(app);
  c.app->callback([run = c.run] {
    int status = kExitError;
    try {
      status = run();
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "attograd bench: error: %s\n", e.what());
    }
    std::fflush(stdout);
    std::exit(status);
  });
}

}  // namespace attograd::cli

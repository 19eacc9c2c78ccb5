#pragma once
// The training-step benchmark of issue 7 (and, at the end, the generation benchmark of issue 15): a decoder-only causal
// LM (nn::CausalLM) trained with Adam on the "src SEP reversed-src" task, one configuration at a time.
// bench/torch_reference.py does exactly the same work in PyTorch and prints the same JSON, so that bench/compare can
// set the two side by side.
//
// A step is zero_grad + forward + cross_entropy + backward + Adam step + reading loss.item(). Batches are
// generated before timing; `warmup` untimed steps run first, then `steps` timed ones.

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "nn/sequence_model.h"

namespace attograd::bench {

/// One benchmark configuration: vocabulary V, width D, heads H, feed-forward size F, blocks N, sequence length L,
/// batch B, plus how to run it.
struct BenchConfig {
  int64_t V = 0;                ///< vocabulary size (5 specials + V - 5 payload symbols)
  int64_t D = 0;                ///< model width
  int64_t H = 0;                ///< attention heads (must divide D)
  int64_t F = 0;                ///< feed-forward hidden size
  int64_t N = 0;                ///< blocks
  int64_t L = 0;                ///< sequence length (even: L/2 source tokens, SEP, L/2 target tokens, shifted)
  int64_t B = 0;                ///< batch size
  int steps = 20;               ///< timed steps
  int warmup = 3;               ///< untimed steps before them
  int threads = 1;              ///< threads of the engine's pool (set_num_threads), when the engine has one
  uint64_t seed = 0;            ///< seeds the weights, the dropout masks and the data
  Precision precision = Precision::float32;  ///< the steps run under Autocast(precision) (bf16: mixed precision)
  std::string name = "custom";  ///< preset name, or "custom" for explicit sizes
  nn::AttentionSpec attention = {};  ///< the attention variant of the model (default: textbook mha)
};

/// The preset "small" (16, 64, 4, 256, 2, 32, 32), "medium" (64, 128, 4, 512, 2, 64, 32),
/// "large" (256, 256, 8, 1024, 4, 128, 16) or "long" (64, 128, 4, 512, 2, 1024, 4) as (V, D, H, F, N, L, B);
/// an Error naming the unknown preset and the valid ones otherwise.
BenchConfig preset(const std::string& name);
/// The preset names, in size order.
std::vector<std::string> preset_names();
/// Checks every field (Error naming the field and its value): sizes positive, D % H == 0, L even, V > 6,
/// steps >= 1, warmup >= 0, threads >= 1, the attention spec (nn::AttentionSpec::validate).
void validate(const BenchConfig& config);

/// A lower bound of the bytes a run needs: weights, gradients and Adam's two moments (4 copies of the parameters,
/// counted for the textbook attention, a lower bound for every variant but gqa and mla, whose own weights are counted)
/// and, per token, the logits with their gradient and each block's feed-forward hidden layer and a few D-wide values.
/// No L x L term: the fused attention keeps O(L) per row.
double estimate_bench_bytes(const BenchConfig& config);
/// Error saying how much memory the configuration needs when estimate_bench_bytes exceeds this machine's physical
/// memory (or the address-space limit); run_bench checks it before building anything.
void check_bench_fits_in_memory(const BenchConfig& config);

/// The key/value cache bytes per generated token of a decoder-only model with this attention (float32), from the
/// kind's facts (nn::AttentionFacts::cache_per_token): 2 N D for mha, local and block-sparse (the whole sequence is
/// cached), 2 N kv_heads (D / H) for gqa, N (kv_rank + rope_dim) for mla (the latent and the shared RoPE key), 0
/// for linear attention (its state has a fixed size: linear_state_bytes).
double kv_cache_bytes_per_token(const nn::AttentionSpec& attention, int64_t D, int64_t H, int64_t N);
/// A kind's fixed decoding state in bytes (AttentionFacts::state_per_row: linear attention's N H (d^2 + d) floats,
/// d = D / H); 0 for the other built-in kinds.
double linear_state_bytes(const nn::AttentionSpec& attention, int64_t D, int64_t H, int64_t N);

/// Model FLOPs of one training step: 2*M*N*K for every matrix product of the forward (q, k, v and output
/// projections, both FFN layers, Q K^T and P V over the L(L+1)/2 causal query-key pairs, the tied output
/// projection), times 3 (the backward does twice the forward's products). Elementwise work is not counted.
/// Variants: gqa's and mla's own projections; local and block-sparse count only the query-key pairs their pattern
/// computes; linear attention the running-sum products (2 x 2 B L D d).
double model_flops_per_step(const BenchConfig& config);

/// What run_bench measured.
struct BenchResult {
  BenchConfig config;           ///< the configuration it ran
  int64_t params = 0;           ///< model parameters (the tied embedding counted once)
  std::vector<double> step_ms;  ///< every timed step, in order (ms)
  double median_step_ms = 0;    ///< median of step_ms
  double min_step_ms = 0;       ///< fastest timed step
  double tokens_per_s = 0;      ///< B * L / median step seconds
  double peak_rss_mb = 0;       ///< getrusage ru_maxrss of the process at the end, MB
  double first_loss = 0;        ///< loss of the very first (warm-up) step
  double final_loss = 0;        ///< loss of the last timed step
  double flops_per_step = 0;    ///< model_flops_per_step(config)
  double gflops = 0;            ///< flops_per_step / median step seconds / 1e9
  bool thread_pool = false;     ///< whether the engine had a pool to give `threads` to
  double peak_tensor_mb = 0;    ///< allocator: peak bytes in live tensors over the run, MB
  double state_mb = 0;          ///< the parameters' weights, gradients and Adam moments (4 x 4 bytes each), MB
  double peak_reserved_mb = 0;  ///< allocator: peak bytes held (live + cached for reuse), MB
  uint64_t timed_system_allocs = 0;  ///< allocator: blocks requested from the system during the timed steps
  uint64_t timed_allocs = 0;    ///< allocator: tensor storages allocated during the timed steps (all reused when
                                ///< timed_system_allocs is 0)
};

/// Builds nn::CausalLM with the configuration's sizes and attention (dropout 0.1, max_len L), Adam(lr 1e-3), generates
/// warmup + steps batches, runs the warm-up steps, then times the others.
BenchResult run_bench(const BenchConfig& config);

/// The result as one line of JSON (no newline): impl, preset, sizes, steps, warmup, threads, seed, params,
/// median_step_ms, min_step_ms, tokens_per_s, peak_rss_mb, first_loss, final_loss, flops_per_step, gflops,
/// thread_pool, peak_tensor_mb, peak_reserved_mb, timed_allocs, timed_system_allocs; then, only when the attention is
/// not the default, "attention" (the spec as in ModelSpec's JSON), kv_cache_bytes_per_token and state_mb (the
/// parameters with their gradients and Adam state, MB: peak_tensor_mb minus it is the activations' share).
std::string to_json(const BenchResult& result);

/// Peak resident set size of this process so far (getrusage ru_maxrss), MB.
double peak_rss_mb();

// ---------------------------------------------------------------------------------------------
// The generation benchmark of issue 15 (`attograd bench --generate`): greedy continuation of a random prompt by
// an untrained nn::CausalLM in eval mode, through the model's begin_decode / decode_step (every row generates
// exactly `tokens` tokens; EOS does not stop it), once from the key/value cache and once recomputing the whole
// sequence every step. bench/torch_reference.py --generate does the same in PyTorch with keys and values cached by
// hand.

/// One generation benchmark configuration.
struct GenerateConfig {
  int64_t V = 256;       ///< vocabulary size
  int64_t D = 256;       ///< model width
  int64_t H = 4;         ///< attention heads
  int64_t F = 1024;      ///< feed-forward hidden size
  int64_t N = 4;         ///< blocks
  int64_t prompt = 16;   ///< prompt tokens per row (the model appends its SEP)
  int64_t tokens = 256;  ///< tokens generated per row
  int64_t B = 1;         ///< rows decoded together
  int rounds = 3;        ///< timed rounds of each path (the two paths alternate), after one untimed cached round
  bool uncached = true;  ///< also time the recomputing path
  int threads = 1;       ///< threads of the engine's pool
  uint64_t seed = 0;     ///< seeds the weights and the prompts
  Precision precision = Precision::float32;  ///< generation runs under Autocast(precision) (bf16: bf16 weights)
  nn::AttentionSpec attention = {};  ///< the attention variant (caches exist only where the model has them; the
                                     ///< others decode by recomputing on both paths)
};

/// Checks every field (Error naming the field and its value).
void validate(const GenerateConfig& config);

/// What run_generate_bench measured.
struct GenerateResult {
  GenerateConfig config;                 ///< the configuration it ran
  int64_t params = 0;                    ///< model parameters
  std::vector<double> cached_ms;         ///< per round: the whole continuation from the cache (ms)
  std::vector<double> uncached_ms;       ///< per round: the same recomputing every step (ms); empty without uncached
  std::vector<double> cached_cpu_ms;     ///< per cached round: the process's CPU time (ms; on a shared host, the
                                         ///< time the scheduler actually gave it)
  std::vector<double> uncached_cpu_ms;   ///< per uncached round: the process's CPU time (ms)
  double cached_tokens_per_s = 0;        ///< B * tokens / median cached seconds
  double uncached_tokens_per_s = 0;      ///< B * tokens / median uncached seconds (0 without uncached)
  double speedup = 0;                    ///< cached_tokens_per_s / uncached_tokens_per_s (0 without uncached)
  double cached_cpu_tokens_per_s = 0;    ///< B * tokens / median cached CPU seconds
  double uncached_cpu_tokens_per_s = 0;  ///< B * tokens / median uncached CPU seconds (0 without uncached)
  bool same_tokens = true;               ///< both paths generated the same tokens
  double cached_allocs_per_token = 0;    ///< tensor storages allocated per generated token in a cached round
};

/// Builds the model (max_len = prompt + 1 + tokens), draws B prompts, runs one untimed cached round, then
/// `rounds` rounds of each path alternately.
GenerateResult run_generate_bench(const GenerateConfig& config);

/// The result as one line of JSON (no newline): impl, mode "generate", sizes, prompt, tokens, B, rounds, threads,
/// seed, params, cached_ms, uncached_ms (medians), cached_tokens_per_s, uncached_tokens_per_s, speedup,
/// cached_cpu_tokens_per_s, uncached_cpu_tokens_per_s, same_tokens, cached_allocs_per_token; with a non-default
/// attention also "attention" and kv_cache_bytes_per_token.
std::string to_json(const GenerateResult& result);

}  // namespace attograd::bench

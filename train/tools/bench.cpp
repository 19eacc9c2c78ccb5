#include "train/tools/bench.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "autograd/attention.h"
#include "autograd/autograd.h"
#include "autograd/memory.h"
#include "autograd/parallel.h"
#include "nn/models.h"
#include "train/data/tasks.h"
#include "train/optim/optimizers.h"

namespace attograd::bench {

namespace {

constexpr const char* kMe = "bench";

struct Preset {
  const char* name;
  int64_t V, D, H, F, N, L, B;
};

constexpr Preset kPresets[] = {
    {"small", 16, 64, 4, 256, 2, 32, 32},
    {"medium", 64, 128, 4, 512, 2, 64, 32},
    {"large", 256, 256, 8, 1024, 4, 128, 16},
    {"long", 64, 128, 4, 512, 2, 1024, 4},
};

// One batch: input (B, L) and target (B, L) Int64. The sequence is src(L/2) SEP tgt(L/2), tgt = reversed src,
// payload tokens uniform over [kFirstSymbol, V); input = its first L tokens, target = the next tokens where they
// are tgt tokens (positions L/2 .. L-1), kIgnore elsewhere.
struct Batch {
  Tensor input;
  Tensor target;
};

Batch make_batch(const BenchConfig& c, Generator& gen) {
  const int64_t half = c.L / 2;
  const uint64_t payload = static_cast<uint64_t>(c.V - data::kFirstSymbol);
  Batch batch{empty({c.B, c.L}, {.dtype = kInt64}), empty({c.B, c.L}, {.dtype = kInt64})};
  int64_t* in = batch.input.data<int64_t>();
  int64_t* tg = batch.target.data<int64_t>();
  std::vector<int64_t> seq(static_cast<size_t>(c.L + 1));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < half; ++i)
      seq[static_cast<size_t>(i)] = data::kFirstSymbol + static_cast<int64_t>(gen.randint(payload));
    seq[static_cast<size_t>(half)] = data::kSep;
    for (int64_t i = 0; i < half; ++i) seq[static_cast<size_t>(half + 1 + i)] = seq[static_cast<size_t>(half - 1 - i)];
    for (int64_t l = 0; l < c.L; ++l) {
      in[b * c.L + l] = seq[static_cast<size_t>(l)];
      tg[b * c.L + l] = l >= half ? seq[static_cast<size_t>(l + 1)] : data::kIgnore;
    }
  }
  return batch;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A finite double for JSON (NaN and infinities are not JSON numbers).
std::string json_num(double x, const char* fmt = "%.6g") {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, x);
  return buf;
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    out += ch;
  }
  return out + "\"";
}

// `, "attention": {...}, "kv_cache_bytes_per_token": n, "linear_state_bytes": n` for a non-default variant.
std::string attention_json(const nn::AttentionSpec& a, int64_t D, int64_t H, int64_t N) {
  const std::string spec = nn::ModelSpec{.attention = a}.to_json();
  const size_t at = spec.find("\"attention\":");
  std::string s = ", " + spec.substr(at, spec.size() - 1 - at);  // the nested object, without the outer brace
  s += ", \"kv_cache_bytes_per_token\": " + json_num(kv_cache_bytes_per_token(a, D, H, N), "%.0f");
  s += ", \"linear_state_bytes\": " + json_num(linear_state_bytes(a, D, H, N), "%.0f");
  return s;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

BenchConfig preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) {
      BenchConfig c;
      c.V = p.V, c.D = p.D, c.H = p.H, c.F = p.F, c.N = p.N, c.L = p.L, c.B = p.B;
      c.name = p.name;
      return c;
    }
  std::string valid;
  for (const Preset& p : kPresets) valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  throw Error(kMe, str_cat("unknown preset '", name, "' (valid: ", valid, ")"));
}

void validate(const BenchConfig& c) {
  ATTO_CHECK(c.V > data::kFirstSymbol + 1, kMe, "V must be at least ", data::kFirstSymbol + 2, " (", data::kFirstSymbol,
             " special tokens and at least 2 payload symbols), got V=", c.V);
  ATTO_CHECK(c.D > 0, kMe, "D must be positive, got D=", c.D);
  ATTO_CHECK(c.H > 0, kMe, "H must be positive, got H=", c.H);
  ATTO_CHECK(c.D % c.H == 0, kMe, "D must be divisible by H, got D=", c.D, ", H=", c.H);
  ATTO_CHECK(c.F > 0, kMe, "F must be positive, got F=", c.F);
  ATTO_CHECK(c.N >= 1, kMe, "N must be at least 1, got N=", c.N, " (a model without blocks times only its embedding)");
  ATTO_CHECK(c.L >= 2 && c.L % 2 == 0, kMe,
             "L must be even and at least 2 (L/2 source, L/2 target tokens), got L=", c.L);
  ATTO_CHECK(c.B > 0, kMe, "B must be positive, got B=", c.B);
  ATTO_CHECK(c.steps >= 1, kMe, "steps must be at least 1, got steps=", c.steps);
  ATTO_CHECK(c.warmup >= 0, kMe, "warmup must be non-negative, got warmup=", c.warmup);
  ATTO_CHECK(c.threads >= 1, kMe, "threads must be at least 1, got threads=", c.threads);
  c.attention.validate(c.H);
}

namespace {

// The attention kind's facts (nn::AttentionFacts) for one sequence of L positions.
nn::AttentionFacts facts_of(const nn::AttentionSpec& a, int64_t D, int64_t H, int64_t L) {
  return nn::attention_facts(a, {.d_model = D, .heads = H, .max_len = L});
}

}  // namespace

double kv_cache_bytes_per_token(const nn::AttentionSpec& a, int64_t D, int64_t H, int64_t N) {
  return 4 * static_cast<double>(N) * facts_of(a, D, H, 1).cache_per_token;
}

double linear_state_bytes(const nn::AttentionSpec& a, int64_t D, int64_t H, int64_t N) {
  return 4 * static_cast<double>(N) * facts_of(a, D, H, 1).state_per_row;
}

double estimate_bench_bytes(const BenchConfig& c) {
  const double D = static_cast<double>(c.D), F = static_cast<double>(c.F), V = static_cast<double>(c.V);
  const double N = static_cast<double>(c.N), T = static_cast<double>(c.B) * static_cast<double>(c.L);
  const double params = N * (facts_of(c.attention, c.D, c.H, c.L).weights + 2 * D * F) + V * D;
  const double per_token = (c.attention.checkpoint && c.N > 1 ? (F + 4 * D) + (N - 1) * D : N * (F + 4 * D)) + 2 * V;
  return 4 * (4 * params + T * per_token);
}

void check_bench_fits_in_memory(const BenchConfig& c) {
  double have = 0;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) have = static_cast<double>(pages) * static_cast<double>(page);
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    have = have > 0 ? std::min(have, static_cast<double>(lim.rlim_cur)) : static_cast<double>(lim.rlim_cur);
  const double need = estimate_bench_bytes(c);
  if (have <= 0 || need <= have) return;
  throw Error(kMe, str_cat("L=", c.L, ", B=", c.B, " needs at least ", std::round(need / 1e8) / 10,
                           " GB (weights, gradients, Adam state and the activations of ", c.B * c.L,
                           " tokens), more than the ", std::round(have / 1e8) / 10,
                           " GB available; lower -L or -B"));
}

double model_flops_per_step(const BenchConfig& c) {
  const double B = static_cast<double>(c.B), L = static_cast<double>(c.L), D = static_cast<double>(c.D);
  const double F = static_cast<double>(c.F), V = static_cast<double>(c.V), N = static_cast<double>(c.N);
  const double T = B * L;                                      // tokens per step
  const nn::AttentionFacts f = facts_of(c.attention, c.D, c.H, c.L);
  const double projections = 2 * T * f.weights;                 // q, k, v, o (mha: 4 (D, D))
  const double ffn = 2 * T * D * F * 2;                        // (T, D) x (D, F) and (T, F) x (F, D)
  const double attention = B * f.flops;                        // the kind's: Q K^T and P V over its causal pairs
  const double output = 2 * T * D * V;                         // tied projection (T, D) x (D, V)
  const double forward = N * (projections + ffn + attention) + output;
  return 3 * forward;
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KB
}

BenchResult run_bench(const BenchConfig& config) {
  validate(config);
  check_bench_fits_in_memory(config);
  BenchResult r;
  r.config = config;
  set_num_threads(config.threads);
  r.thread_pool = true;

  Generator init_gen(config.seed), dropout_gen(config.seed + 1), data_gen(config.seed + 2);
  auto model = std::make_shared<nn::CausalLM>(nn::CausalLMOptions{.vocab = config.V,
                                                                  .d_model = config.D,
                                                                  .n_head = config.H,
                                                                  .d_ff = config.F,
                                                                  .n_layers = config.N,
                                                                  .dropout = 0.1,
                                                                  .max_len = config.L,
                                                                  .pad_idx = data::kPad,
                                                                  .attention = config.attention},
                                              init_gen);
  model->set_generator(dropout_gen);
  model->train();
  r.params = model->num_parameters();
  optim::Adam adam(model->named_parameters(), {.lr = 1e-3});

  const int total = config.warmup + config.steps;
  std::vector<Batch> batches;
  batches.reserve(static_cast<size_t>(total));
  for (int i = 0; i < total; ++i) batches.push_back(make_batch(config, data_gen));

  const CrossEntropyOptions ce{.ignore_index = data::kIgnore};
  auto step = [&](const Batch& b) {
    const Autocast autocast(config.precision);
    adam.zero_grad(/*set_to_none=*/true);
    // The logits are not kept past the loss (it keeps what its backward needs); bench/torch_reference.py does the same.
    Tensor loss = cross_entropy(reshape(model->forward(b.input), {config.B * config.L, config.V}),  // (B*L, V)
                                reshape(b.target, {config.B * config.L}), ce);
    loss.backward();
    adam.step();
    return loss.item();
  };

  using Clock = std::chrono::steady_clock;
  r.step_ms.reserve(static_cast<size_t>(config.steps));
  AllocatorStats timed_start;
  for (int i = 0; i < total; ++i) {
    if (i == config.warmup) timed_start = allocator_stats();
    const auto t0 = Clock::now();
    const double loss = step(batches[static_cast<size_t>(i)]);
    const auto t1 = Clock::now();
    if (i == 0) r.first_loss = loss;
    if (i >= config.warmup) r.step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    r.final_loss = loss;
  }

  r.median_step_ms = median(r.step_ms);
  r.min_step_ms = *std::min_element(r.step_ms.begin(), r.step_ms.end());
  const double seconds = r.median_step_ms / 1e3;
  r.tokens_per_s = seconds > 0 ? static_cast<double>(config.B * config.L) / seconds : 0.0;
  r.flops_per_step = model_flops_per_step(config);
  r.gflops = seconds > 0 ? r.flops_per_step / seconds / 1e9 : 0.0;
  r.peak_rss_mb = peak_rss_mb();
  const AllocatorStats end = allocator_stats();
  r.peak_tensor_mb = static_cast<double>(end.peak_allocated_bytes) / (1024.0 * 1024.0);
  r.peak_reserved_mb = static_cast<double>(end.peak_reserved_bytes) / (1024.0 * 1024.0);
  r.state_mb = 4.0 * 4.0 * static_cast<double>(r.params) / (1024.0 * 1024.0);
  r.timed_allocs = end.num_allocs - timed_start.num_allocs;
  r.timed_system_allocs = end.cache_misses - timed_start.cache_misses;
  return r;
}

std::string to_json(const BenchResult& r) {
  const BenchConfig& c = r.config;
  std::string s = "{\"impl\": \"attograd\", \"preset\": " + json_str(c.name);
  s += str_cat(", \"V\": ", c.V, ", \"D\": ", c.D, ", \"H\": ", c.H, ", \"F\": ", c.F, ", \"N\": ", c.N, ", \"L\": ", c.L,
           ", \"B\": ", c.B, ", \"steps\": ", c.steps, ", \"warmup\": ", c.warmup, ", \"threads\": ", c.threads,
           ", \"seed\": ", c.seed, ", \"params\": ", r.params);
  if (c.precision != Precision::float32) s += ", \"precision\": " + json_str(precision_name(c.precision));
  s += ", \"median_step_ms\": " + json_num(r.median_step_ms, "%.4f");
  s += ", \"min_step_ms\": " + json_num(r.min_step_ms, "%.4f");
  s += ", \"tokens_per_s\": " + json_num(r.tokens_per_s, "%.1f");
  s += ", \"peak_rss_mb\": " + json_num(r.peak_rss_mb, "%.1f");
  s += ", \"first_loss\": " + json_num(r.first_loss);
  s += ", \"final_loss\": " + json_num(r.final_loss);
  s += ", \"flops_per_step\": " + json_num(r.flops_per_step, "%.0f");
  s += ", \"gflops\": " + json_num(r.gflops, "%.3f");
  s += std::string(", \"thread_pool\": ") + (r.thread_pool ? "true" : "false");
  s += ", \"peak_tensor_mb\": " + json_num(r.peak_tensor_mb, "%.1f");
  s += ", \"peak_reserved_mb\": " + json_num(r.peak_reserved_mb, "%.1f");
  s += str_cat(", \"timed_allocs\": ", r.timed_allocs, ", \"timed_system_allocs\": ", r.timed_system_allocs);
  if (c.attention != nn::AttentionSpec{}) s += attention_json(c.attention, c.D, c.H, c.N);
  if (c.attention != nn::AttentionSpec{}) s += ", \"state_mb\": " + json_num(r.state_mb, "%.1f");
  return s + "}";
}

// ---------------------------------------------------------------------------------------------
// Generation

void validate(const GenerateConfig& c) {
  const std::pair<const char*, int64_t> sizes[] = {{"V", c.V},           {"D", c.D},           {"H", c.H}, {"F", c.F},
                                                   {"prompt", c.prompt}, {"tokens", c.tokens}, {"B", c.B}};
  for (const auto& [name, v] : sizes) ATTO_CHECK(v > 0, kMe, name, " must be positive, got ", v);
  ATTO_CHECK(c.N >= 1, kMe, "N must be at least 1, got ", c.N, " (a model without blocks times only its embedding)");
  ATTO_CHECK(c.D % c.H == 0, kMe, "H must divide D, got D=", c.D, ", H=", c.H);
  ATTO_CHECK(c.V > data::kFirstSymbol + 1, kMe, "V must be at least ", data::kFirstSymbol + 2, ", got ", c.V);
  ATTO_CHECK(c.rounds >= 1, kMe, "rounds must be >= 1, got ", c.rounds);
  ATTO_CHECK(c.threads >= 1, kMe, "threads must be >= 1, got ", c.threads);
  c.attention.validate(c.H);
}

namespace {

// Continues every prompt by exactly `tokens` greedy tokens; returns the generated rows.
nn::TokenRows generate(nn::CausalLM& model, const nn::TokenRows& prompts, int64_t tokens, bool use_cache) {
  NoGradGuard no_grad;
  const nn::DecodeWeightCache bf16_weights;  // under Autocast: each weight read as bf16, converted once
  nn::DecodeState st = model.begin_decode(prompts);
  st.use_cache = use_cache;
  for (int64_t t = 0; t < tokens; ++t) {
    const Tensor logits = model.decode_step(st);  // (B, V)
    const int64_t V = logits.size(1);
    const float* p = logits.data<float>();
    for (size_t b = 0; b < st.decoded.size(); ++b) {
      const float* row = p + static_cast<int64_t>(b) * V;
      st.decoded[b].push_back(std::max_element(row, row + V) - row);
    }
  }
  return std::move(st.decoded);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

GenerateResult run_generate_bench(const GenerateConfig& config) {
  validate(config);
  GenerateResult r;
  r.config = config;
  set_num_threads(config.threads);
  Generator init_gen(config.seed), data_gen(config.seed + 2);
  nn::CausalLM model(nn::CausalLMOptions{.vocab = config.V,
                                         .d_model = config.D,
                                         .n_head = config.H,
                                         .d_ff = config.F,
                                         .n_layers = config.N,
                                         .dropout = 0.1,
                                         .max_len = config.prompt + 1 + config.tokens,
                                         .pad_idx = data::kPad,
                                         .attention = config.attention},
                     init_gen);
  model.eval();
  r.params = model.num_parameters();
  const auto payload = static_cast<uint64_t>(config.V - data::kFirstSymbol);
  nn::TokenRows prompts(static_cast<size_t>(config.B));
  for (auto& p : prompts)
    for (int64_t i = 0; i < config.prompt; ++i)
      p.push_back(data::kFirstSymbol + static_cast<int64_t>(data_gen.randint(payload)));

  using Clock = std::chrono::steady_clock;
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  double cpu = 0;  // CPU ms of the last timed() call
  auto timed = [&](bool use_cache, nn::TokenRows* out) {
    const Autocast autocast(config.precision);
    const double c0 = cpu_ms();
    const auto t0 = Clock::now();
    *out = generate(model, prompts, config.tokens, use_cache);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    cpu = cpu_ms() - c0;
    return ms;
  };
  nn::TokenRows cached, full;
  timed(true, &cached);  // warm-up
  for (int i = 0; i < config.rounds; ++i) {
    // Alternate which path goes first, so that a slow spell of the machine hits both.
    for (int side = 0; side < 2; ++side) {
      const bool cache_side = (side == 0) == (i % 2 == 0);
      if (cache_side) {
        const AllocatorStats before = allocator_stats();
        r.cached_ms.push_back(timed(true, &cached));
        r.cached_cpu_ms.push_back(cpu);
        r.cached_allocs_per_token =
            static_cast<double>(allocator_stats().num_allocs - before.num_allocs) / static_cast<double>(config.tokens);
      } else if (config.uncached) {
        r.uncached_ms.push_back(timed(false, &full));
        r.uncached_cpu_ms.push_back(cpu);
        r.same_tokens = r.same_tokens && full == cached;
      }
    }
  }
  const double n = static_cast<double>(config.B * config.tokens);
  r.cached_tokens_per_s = n / (median_of(r.cached_ms) / 1e3);
  r.cached_cpu_tokens_per_s = n / (median_of(r.cached_cpu_ms) / 1e3);
  if (config.uncached) {
    r.uncached_tokens_per_s = n / (median_of(r.uncached_ms) / 1e3);
    r.uncached_cpu_tokens_per_s = n / (median_of(r.uncached_cpu_ms) / 1e3);
    r.speedup = r.cached_tokens_per_s / r.uncached_tokens_per_s;
  }
  return r;
}

std::string to_json(const GenerateResult& r) {
  const GenerateConfig& c = r.config;
  std::string s = str_cat("{\"impl\": \"attograd\", \"mode\": \"generate\", \"V\": ", c.V, ", \"D\": ", c.D,
                          ", \"H\": ", c.H, ", \"F\": ", c.F, ", \"N\": ", c.N, ", \"prompt\": ", c.prompt,
                          ", \"tokens\": ", c.tokens, ", \"B\": ", c.B, ", \"rounds\": ", c.rounds,
                          ", \"threads\": ", c.threads, ", \"seed\": ", c.seed, ", \"params\": ", r.params);
  if (c.precision != Precision::float32) s += ", \"precision\": " + json_str(precision_name(c.precision));
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4f", v);
    return std::string(buf);
  };
  s += str_cat(", \"cached_ms\": ", num(median_of(r.cached_ms)),
               ", \"uncached_ms\": ", r.uncached_ms.empty() ? std::string("null") : num(median_of(r.uncached_ms)),
               ", \"cached_tokens_per_s\": ", num(r.cached_tokens_per_s),
               ", \"uncached_tokens_per_s\": ", num(r.uncached_tokens_per_s), ", \"speedup\": ", num(r.speedup),
               ", \"cached_cpu_tokens_per_s\": ", num(r.cached_cpu_tokens_per_s),
               ", \"uncached_cpu_tokens_per_s\": ", num(r.uncached_cpu_tokens_per_s),
               ", \"same_tokens\": ", r.same_tokens ? "true" : "false",
               ", \"cached_allocs_per_token\": ", num(r.cached_allocs_per_token));
  if (c.attention != nn::AttentionSpec{}) s += attention_json(c.attention, c.D, c.H, c.N);
  return s + "}";
}

}  // namespace attograd::bench

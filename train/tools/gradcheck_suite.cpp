// The registry of named gradient checks behind `attograd gradcheck` (see train/tools/gradcheck_suite.h).

#include "train/tools/gradcheck_suite.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/checkpoint.h"
#include "autograd/dropout.h"
#include "autograd/elementwise.h"
#include "autograd/indexing.h"
#include "autograd/linear_attention.h"
#include "autograd/loss.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "autograd/reduce.h"
#include "autograd/rope.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/checkpointed.h"
#include "nn/encoder_tagger.h"
#include "nn/feedforward.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear_attention.h"
#include "nn/masks.h"
#include "nn/mla.h"
#include "nn/models.h"
#include "nn/positional.h"
#include "nn/transformer.h"

namespace attograd::checks {

namespace {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;

// A leaf with values uniform in [lo, hi), in the config's dtype, requiring grad.
Tensor leaf(const Shape& shape, Generator& gen, Dtype dtype, double lo = -1, double hi = 1) {
  Tensor t = rand(shape, gen, {.dtype = kFloat64});
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  Tensor out = t.to(dtype);
  out.requires_grad_(true);
  return out;
}

// A leaf with |values| in [lo, hi) and random signs (away from 0: kinks, division).
Tensor away_from_zero(const Shape& shape, Generator& gen, Dtype dtype, double lo = 0.2, double hi = 1) {
  Tensor t = rand(shape, gen, {.dtype = kFloat64});
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double sign = gen.uniform() < 0.5 ? -1.0 : 1.0;
    p[i] = sign * (lo + (hi - lo) * p[i]);
  }
  Tensor out = t.to(dtype);
  out.requires_grad_(true);
  return out;
}

// A leaf whose values are a shuffled ladder 0.1 apart plus small noise: no ties within the largest eps.
Tensor distinct(const Shape& shape, Generator& gen, Dtype dtype) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.1 * static_cast<double>(i) - 0.05 * n;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(gen.randint(static_cast<uint64_t>(i + 1)))]);
  for (double& x : v) x += 0.02 * gen.uniform();
  Tensor out = from_vector(v, shape).to(dtype);
  out.requires_grad_(true);
  return out;
}

Tensor tokens(const std::vector<int64_t>& v, int64_t b, int64_t l) { return from_vector(v, {b, l}); }

// Random tokens in [lo, hi) of shape (b, l).
std::vector<int64_t> random_tokens(int64_t b, int64_t l, int64_t lo, int64_t hi, Generator& gen) {
  std::vector<int64_t> v(static_cast<size_t>(b * l));
  for (auto& t : v) t = lo + static_cast<int64_t>(gen.randint(static_cast<uint64_t>(hi - lo)));
  return v;
}

std::string sh(const Shape& s) { return shape_str(s); }

std::string double_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The errors a check reports (CheckResult's fields of the same names).
struct ErrorSummary {
  double max_abs_error = 0, max_rel_error = 0, max_abs_derivative = 0;
};

// Max |analytic - numeric| over every Jacobian entry, max |analytic - numeric| / |numeric| over the entries with
// |numeric| >= atol (a relative error means nothing where the derivative is ~0), and max |numeric|. Same central
// differences as gradcheck(); the analytic Jacobian from one backward per output element.
ErrorSummary error_summary(const std::function<Tensor()>& f, const Inputs& inputs, const GradcheckOptions& o) {
  std::vector<std::vector<double>> analytic;  // [output][flat input element]
  {
    Tensor y = f();
    for (int64_t k = 0; k < y.numel(); ++k) {
      Tensor seed = zeros(y.shape(), {.dtype = y.dtype()});
      dispatch_float(seed.dtype(), "gradcheck", [&]<typename T>() { seed.data<T>()[k] = T(1); });
      for (const Tensor& x : inputs) const_cast<Tensor&>(x).zero_grad(true);
      y.backward(seed, true);
      std::vector<double> row;
      for (const Tensor& x : inputs) {
        const Tensor g = x.grad();
        const std::vector<double> v = g.defined() ? g.to_vector<double>() : std::vector<double>(x.numel(), 0.0);
        row.insert(row.end(), v.begin(), v.end());
      }
      analytic.push_back(std::move(row));
    }
    for (const Tensor& x : inputs) const_cast<Tensor&>(x).zero_grad(true);
  }
  ErrorSummary e;
  size_t col = 0;
  NoGradGuard no_grad;
  for (const Tensor& in : inputs) {
    Tensor x = in;
    for (int64_t i = 0; i < x.numel(); ++i, ++col) {
      const double orig = x.flat(i);
      auto set = [&](double v) {
        dispatch_float(x.dtype(), "gradcheck", [&]<typename T>() { x.data<T>()[i] = static_cast<T>(v); });
      };
      set(orig + o.eps);
      const std::vector<double> plus = f().to_vector<double>();
      set(orig - o.eps);
      const std::vector<double> minus = f().to_vector<double>();
      set(orig);
      for (size_t k = 0; k < analytic.size() && k < plus.size(); ++k) {
        const double n = (plus[k] - minus[k]) / (2 * o.eps), err = std::fabs(analytic[k][col] - n);
        e.max_abs_error = std::max(e.max_abs_error, err);
        e.max_abs_derivative = std::max(e.max_abs_derivative, std::fabs(n));
        if (std::fabs(n) >= o.atol) e.max_rel_error = std::max(e.max_rel_error, err / std::fabs(n));
      }
    }
  }
  return e;
}

// Runs gradcheck() (pass/fail) and error_summary() (the reported errors) on f and its inputs.
CheckResult run_check(const std::string& name, const std::string& kind, const std::string& configuration,
                      const std::function<Tensor()>& f, const Inputs& inputs, const GradcheckOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  CheckResult r;
  r.name = name;
  r.kind = kind;
  r.configuration = configuration;
  r.result = gradcheck(f, inputs, o);
  const ErrorSummary e = error_summary(f, inputs, o);
  r.max_abs_error = e.max_abs_error;
  r.max_rel_error = e.max_rel_error;
  r.max_abs_derivative = e.max_abs_derivative;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// An op check: f over inputs made by `make`, full Jacobian.
Check op(const std::string& name, std::function<std::pair<std::string, Inputs>(const CheckConfig&, Generator&)> make,
         Fn f) {
  return {name, "op", [name, make, f](const CheckConfig& c, const GradcheckOptions& o) {
            Generator gen(c.seed * 1000003 + 17);
            const std::pair<std::string, Inputs> made = make(c, gen);  // (no structured binding: clang 14 cannot
            const Inputs& inputs = made.second;                        // capture one in the lambda below)
            return run_check(name, "op", made.first, [&] { return f(inputs); }, inputs, o);
          }};
}

// A probability for the dropout op and the Dropout module: the configured one, or 0.2.
double drop_p(const CheckConfig& c) { return c.dropout > 0 ? c.dropout : 0.2; }

// Moves a module's parameters off values that would hide mistakes, converts it, and returns them as inputs.
Inputs prepare_module(nn::Module& m, const CheckConfig& c, Generator& gen) {
  m.to(c.dtype);
  m.train(c.dropout > 0);
  NoGradGuard no_grad;
  Inputs params;
  auto ends_with = [](const std::string& n, const char* suffix) {
    const size_t k = std::char_traits<char>::length(suffix);
    return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
  };
  for (auto& [n, p] : m.named_parameters()) {
    if (ends_with(n, "linear1.bias") || ends_with(n, "w_1.bias")) {
      // Keep the feed-forward ReLU inputs away from the kink: |bias| in [0.5, 1) and a small weight (below), so
      // no hidden pre-activation comes within eps of 0 (at eps 1e-3, float32's step, one usually would).
      copy_(p, away_from_zero(p.shape(), gen, p.dtype(), 0.5, 1.0).detach());
    } else if (ends_with(n, "linear1.weight") || ends_with(n, "w_1.weight")) {
      mul_(p, 0.25);
    } else if (ends_with(n, "bias")) {
      nn::init::uniform_(p, -0.5, 0.5, gen);
    } else if (n.find("norm") != std::string::npos) {
      nn::init::uniform_(p, 0.7, 1.3, gen);
    }
    params.push_back(p);
  }
  return params;
}

// A module check: the scalar sum(forward() * W) for a fixed random W, against `inputs` + the parameters.
CheckResult module_run(const std::string& name, const std::string& configuration, nn::Module& m, Inputs inputs,
                       const std::function<Tensor()>& forward, const CheckConfig& c, const GradcheckOptions& o,
                       Generator& gen, Generator* drop) {
  Inputs params = prepare_module(m, c, gen);
  inputs.insert(inputs.end(), params.begin(), params.end());
  const uint64_t drop_seed = c.seed + 4242;
  auto run_forward = [&] {
    if (drop) drop->manual_seed(drop_seed);
    return forward();
  };
  Tensor w;
  {
    NoGradGuard no_grad;
    const Shape out_shape = run_forward().shape();
    w = leaf(out_shape, gen, c.dtype).detach();
  }
  return run_check(name, "module", configuration, [&] { return sum(mul(run_forward(), w)); }, inputs, o);
}

std::string module_conf(const CheckConfig& c, bool with_mask = true, bool with_dropout = true) {
  std::string s = str_cat("B=", c.batch, " L=", c.len, " E=", c.d_model, " H=", c.heads);
  if (with_mask) s += " mask=" + c.mask;
  if (with_dropout) s += " dropout=" + double_str(c.dropout);
  return s;
}

// Bool (B, L): true for the padded keys, the last min(2, L - 1) positions of the last sequence.
Tensor key_padding(const CheckConfig& c) {
  std::vector<bool> v(static_cast<size_t>(c.batch * c.len), false);
  const int64_t pad = std::min<int64_t>(2, c.len - 1);
  for (int64_t j = c.len - pad; j < c.len; ++j) v[static_cast<size_t>((c.batch - 1) * c.len + j)] = true;
  return from_vector(v, {c.batch, c.len});
}

// A registry entry checking CausalLM built with one attention variant (every parameter; padding and causal as the
// plain CausalLM entry). RoPE needs an even head size: the width is heads * (d_model / heads rounded down to even,
// at least 2). `adapt` (optional) fits the spec to the configuration (e.g. ranks from its d_model).
// The recipe options that differ from the defaults, as " positions=learned norm=rmsnorm"; empty when none.
std::string recipe_words(const nn::ArchitectureSpec& arch) {
  std::string s;
  for (const std::string& d : arch.differences()) s += " " + d;
  return s;
}

// `arch` (optional) is the recipe (ArchitectureSpec): positions, activation, norm, bias, scale, init, head.
Check causal_lm_variant_check(const std::string& name, uint64_t salt, nn::AttentionSpec spec,
                              std::function<nn::AttentionSpec(const CheckConfig&)> adapt = {},
                              nn::ArchitectureSpec arch = {},
                              std::vector<std::pair<int64_t, int64_t>> place = {}) {
  return {name, "module", [name, salt, spec, adapt, arch, place](const CheckConfig& c, const GradcheckOptions& o) {
            Generator gen(c.seed * 1000003 + salt), drop(0);
            const bool rope = spec.rope || arch.positions == "rope";
            const int64_t D = rope ? std::max<int64_t>(2, c.d_model / c.heads / 2 * 2) * c.heads : c.d_model;
            nn::AttentionSpec a = adapt ? adapt(c) : spec;
            if (a.kv_heads >= c.heads) a = {.rope = a.rope};  // no grouping below 2 heads
            const int64_t layers = a.checkpoint ? std::max<int64_t>(2, c.layers) : c.layers;
            nn::CausalLM m({.vocab = 7,
                            .d_model = D,
                            .n_head = c.heads,
                            .d_ff = 2 * D,
                            .n_layers = layers,
                            .dropout = c.dropout,
                            .max_len = c.len,
                            .pad_idx = 0,
                            .attention = a,
                            .architecture = arch},
                           gen);
            m.set_generator(drop);
            std::vector<int64_t> v = random_tokens(c.batch, c.len, 1, 7, gen);
            // `place`: token t at (flat, clamped) position i, e.g. a SEP or EOS where a mask needs one.
            for (const auto& [i, tok] : place) v[static_cast<size_t>(std::min(i, c.batch * c.len - 1))] = tok;
            // A kind without key padding masks (linear attention's running sums have no per-key weights to block).
            const bool padding =
                c.mask == "padding" && nn::attention_facts(a, {.d_model = D, .heads = c.heads, .max_len = c.len})
                                           .key_padding;
            if (padding) {
              const Tensor kpm = key_padding(c);
              for (int64_t i = 0; i < c.batch * c.len; ++i)
                if (kpm.flat(i) != 0) v[static_cast<size_t>(i)] = 0;
            }
            Tensor t = tokens(v, c.batch, c.len);
            auto size = [](const char* field, int64_t n) { return n > 0 ? str_cat(" ", field, "=", n) : std::string(); };
            std::string placed;  // " token 3 at 2, ...": the tokens `place` put (flat positions)
            for (const auto& [i, tok] : place)
              placed += str_cat(placed.empty() ? " token " : ", ", tok, " at ", std::min(i, c.batch * c.len - 1));
            return module_run(name,
                              str_cat(module_conf(c, false), " D=", D, " layers=", layers, " causal",
                                      padding ? "+padding" : "", " attention=", a.kind, size("kv_heads", a.kv_heads),
                                      size("window", a.window), size("block", a.block), size("kv_rank", a.kv_rank),
                                      size("q_rank", a.q_rank), size("rope_dim", a.rope_dim),
                                      a.options.empty() ? "" : " options=" + a.options, a.rope ? " rope" : "",
                                      a.checkpoint ? " checkpoint" : "", placed,
                                      recipe_words(arch)),
                              m, {}, [&] { return m.forward(t, padding); }, c, o, gen, &drop);
          }};
}

}  // namespace

Check causal_lm_attention_check(const std::string& name, const nn::AttentionSpec& spec) {
  return causal_lm_variant_check(name, 51, spec);
}

namespace {

void causal_lm_variant(std::vector<Check>& r, const char* name, uint64_t salt, nn::AttentionSpec spec,
                       std::function<nn::AttentionSpec(const CheckConfig&)> adapt = {}) {
  r.push_back(causal_lm_variant_check(name, salt, std::move(spec), std::move(adapt)));
}

// CausalLM built with the recipe `arch` (ArchitectureSpec, docs/TRAINING.md "The recipe") and the default attention:
// every parameter, the learned position table and the untied head included.
void causal_lm_recipe(std::vector<Check>& r, const char* name, uint64_t salt, nn::ArchitectureSpec arch) {
  r.push_back(causal_lm_variant_check(name, salt, {}, {}, std::move(arch)));
}

std::vector<Check> build_registry() {
  std::vector<Check> r;
  // Binary elementwise ops with broadcasting: (3, 4) op (4).
  auto binary = [&](const std::string& name, Tensor (*f)(const Tensor&, const Tensor&), bool divide) {
    r.push_back(op(
        name,
        [divide](const CheckConfig& c, Generator& g) {
          Tensor a = leaf({3, 4}, g, c.dtype);
          Tensor b = divide ? away_from_zero({4}, g, c.dtype, 0.5, 1.5) : leaf({4}, g, c.dtype);
          return std::pair{std::string("(3, 4) with (4), broadcast"), Inputs{a, b}};
        },
        [f](const Inputs& x) { return f(x[0], x[1]); }));
  };
  binary("add", add, false);
  binary("sub", sub, false);
  binary("mul", mul, false);
  binary("div", div, true);
  r.push_back(op(
      "broadcast_to",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 1) -> (2, 3, 4)"), Inputs{leaf({3, 1}, g, c.dtype)}};
      },
      [](const Inputs& x) { return broadcast_to(x[0], {2, 3, 4}); }));
  r.push_back(op(
      "sum_to",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) -> (3, 1)"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return sum_to(x[0], {3, 1}); }));

  // Unary ops on (3, 4) over a domain where they are smooth.
  auto unary = [&](const std::string& name, std::function<Tensor(const Tensor&)> f, double lo, double hi,
                   bool avoid_zero) {
    r.push_back(op(
        name,
        [lo, hi, avoid_zero](const CheckConfig& c, Generator& g) {
          Tensor x = avoid_zero ? away_from_zero({3, 4}, g, c.dtype, lo, hi) : leaf({3, 4}, g, c.dtype, lo, hi);
          return std::pair{str_cat("(3, 4), values ", avoid_zero ? "+-" : "", "[", double_str(lo), ", ", double_str(hi),
                               ")"),
                           Inputs{x}};
        },
        [f](const Inputs& x) { return f(x[0]); }));
  };
  unary("exp", [](const Tensor& x) { return exp(x); }, -1, 1, false);
  unary("log", [](const Tensor& x) { return log(x); }, 0.5, 2, false);
  unary("sqrt", [](const Tensor& x) { return sqrt(x); }, 0.5, 2, false);
  unary("pow", [](const Tensor& x) { return pow(x, 2.5); }, 0.5, 1.5, false);
  unary("tanh", [](const Tensor& x) { return tanh(x); }, -2, 2, false);
  unary("sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3, 3, false);
  unary("relu", [](const Tensor& x) { return relu(x); }, 0.1, 1, true);
  unary("gelu", [](const Tensor& x) { return gelu(x); }, -2, 2, false);
  unary("abs", [](const Tensor& x) { return abs(x); }, 0.1, 1, true);
  unary("neg", [](const Tensor& x) { return neg(x); }, -1, 1, false);
  unary("rdiv", [](const Tensor& x) { return rdiv(2.0, x); }, 0.5, 1.5, true);

  r.push_back(op(
      "matmul",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) @ (4, 5), batch broadcast"),
                         Inputs{leaf({2, 3, 4}, g, c.dtype), leaf({4, 5}, g, c.dtype)}};
      },
      [](const Inputs& x) { return matmul(x[0], x[1]); }));
  r.push_back(op(
      "linear",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("x (2, 3, 4), weight (5, 4), bias (5)"),
                         Inputs{leaf({2, 3, 4}, g, c.dtype), leaf({5, 4}, g, c.dtype), leaf({5}, g, c.dtype)}};
      },
      [](const Inputs& x) { return linear(x[0], x[1], x[2]); }));
  r.push_back(op(
      "transpose",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4), dims 0 and 2"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return transpose(x[0], 0, 2); }));
  r.push_back(op(
      "reshape",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 6) -> (3, 4), times (3, 4)"),
                         Inputs{leaf({2, 6}, g, c.dtype), leaf({3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mul(reshape(x[0], {3, 4}), x[1]); }));
  r.push_back(op(
      "view",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 6) -> (4, 3), times (4, 3)"),
                         Inputs{leaf({2, 6}, g, c.dtype), leaf({4, 3}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mul(view(x[0], {4, 3}), x[1]); }));
  r.push_back(op(
      "flatten",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4), dims 1..2"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return flatten(x[0], 1, 2); }));
  r.push_back(op(
      "unsqueeze",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4) at dim 1, times (3, 2, 4) broadcast"),
                         Inputs{leaf({3, 4}, g, c.dtype), leaf({3, 2, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mul(unsqueeze(x[0], 1), x[1]); }));
  r.push_back(op(
      "squeeze",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 1, 4) at dim 1, then every size-1 dim of (1, 3, 1)"),
                         Inputs{leaf({3, 1, 4}, g, c.dtype), leaf({1, 3, 1}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mul(squeeze(x[0], 1), unsqueeze(squeeze(x[1]), 1)); }));
  r.push_back(op(
      "permute",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) -> dims (2, 0, 1)"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return permute(x[0], {2, 0, 1}); }));
  r.push_back(op(
      "slice",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(4, 6), dim 1, 1:6:2"), Inputs{leaf({4, 6}, g, c.dtype)}};
      },
      [](const Inputs& x) { return slice(x[0], 1, 1, 6, 2); }));
  r.push_back(op(
      "narrow",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(4, 6), dim 1, start 1, length 3"), Inputs{leaf({4, 6}, g, c.dtype)}};
      },
      [](const Inputs& x) { return narrow(x[0], 1, 1, 3); }));
  r.push_back(op(
      "select",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4, 2), dim 1, index 2"), Inputs{leaf({3, 4, 2}, g, c.dtype)}};
      },
      [](const Inputs& x) { return select(x[0], 1, 2); }));
  r.push_back(op(
      "cat",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3) and (1, 3), dim 0"),
                         Inputs{leaf({2, 3}, g, c.dtype), leaf({1, 3}, g, c.dtype)}};
      },
      [](const Inputs& x) { return cat({x[0], x[1]}, 0); }));
  r.push_back(op(
      "stack",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3) and (2, 3), dim 1"),
                         Inputs{leaf({2, 3}, g, c.dtype), leaf({2, 3}, g, c.dtype)}};
      },
      [](const Inputs& x) { return stack({x[0], x[1]}, 1); }));
  r.push_back(op(
      "split",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4) split 2 + 2 on dim 1, pieces multiplied"),
                         Inputs{leaf({3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) {
        const std::vector<Tensor> parts = split(x[0], 2, 1);
        return mul(parts[0], parts[1]);
      }));
  r.push_back(op(
      "chunk",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(5, 3) in 3 chunks (2, 2, 1) on dim 0, first two multiplied, third appended"),
                         Inputs{leaf({5, 3}, g, c.dtype)}};
      },
      [](const Inputs& x) {
        const std::vector<Tensor> parts = chunk(x[0], 3, 0);
        return cat({mul(parts[0], parts[1]), parts[2]}, 0);
      }));
  r.push_back(op(
      "sum",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) over dim 1, keepdim"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return sum(x[0], {1}, true); }));
  r.push_back(op(
      "mean",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) over dims 0 and 2"), Inputs{leaf({2, 3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mean(x[0], {0, 2}); }));
  r.push_back(op(
      "max",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4) over dim 1, distinct values"), Inputs{distinct({3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return max(x[0], 1).values; }));
  r.push_back(op(
      "softmax",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 5) over dim -1"), Inputs{leaf({3, 5}, g, c.dtype, -2, 2)}};
      },
      [](const Inputs& x) { return softmax(x[0], -1); }));
  r.push_back(op(
      "log_softmax",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 5) over dim 0"), Inputs{leaf({3, 5}, g, c.dtype, -2, 2)}};
      },
      [](const Inputs& x) { return log_softmax(x[0], 0); }));
  r.push_back(op(
      "masked_fill",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4), mask (4) broadcast, value -2"), Inputs{leaf({3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) {
        return masked_fill(x[0], from_vector(std::vector<bool>{true, false, false, true}, {4}), -2.0);
      }));
  r.push_back(op(
      "where",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("cond (3, 4), a (3, 4), b (4) broadcast"),
                         Inputs{leaf({3, 4}, g, c.dtype), leaf({4}, g, c.dtype)}};
      },
      [](const Inputs& x) {
        const std::vector<bool> cond{true, false, true, true, false, false, true, false, true, true, false, true};
        return where(from_vector(cond, {3, 4}), x[0], x[1]);
      }));
  r.push_back({"dropout", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const double p = drop_p(c);
                 Inputs in{leaf({3, 5}, gen, c.dtype)};
                 return run_check(
                     "dropout", "op", str_cat("(3, 5), p=", double_str(p), ", mask replayed"),
                     [&] {
                       drop.manual_seed(c.seed + 99);
                       return dropout(in[0], p, true, drop);
                     },
                     in, o);
               }});
  r.push_back({"relu_dropout", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const double p = drop_p(c);
                 Inputs in{away_from_zero({3, 5}, gen, c.dtype, 0.1, 1)};
                 return run_check(
                     "relu_dropout", "op", str_cat("(3, 5), values +-[0.1, 1), p=", double_str(p), ", mask replayed"),
                     [&] {
                       drop.manual_seed(c.seed + 99);
                       return relu_dropout(in[0], p, true, drop);
                     },
                     in, o);
               }});
  r.push_back({"dropout_add", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const double p = drop_p(c);
                 Inputs in{leaf({3, 5}, gen, c.dtype), leaf({3, 5}, gen, c.dtype)};
                 return run_check(
                     "dropout_add", "op", str_cat("x (3, 5) + dropout of y (3, 5), p=", double_str(p), ", mask replayed"),
                     [&] {
                       drop.manual_seed(c.seed + 99);
                       return dropout_add(in[0], in[1], p, true, drop);
                     },
                     in, o);
               }});
  r.push_back(op(
      "embedding",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("weight (7, 4), indices (2, 3) with repeats"), Inputs{leaf({7, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return embedding(x[0], tokens({1, 3, 3, 6, 0, 2}, 2, 3)); }));
  r.push_back(op(
      "layer_norm",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(2, 3, 4) over (4), weight and bias"),
                         Inputs{leaf({2, 3, 4}, g, c.dtype), leaf({4}, g, c.dtype, 0.7, 1.3), leaf({4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return layer_norm(x[0], {4}, x[1], x[2]); }));
  r.push_back(op(
      "cross_entropy",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(4, 5), one target ignored, label_smoothing 0.1"),
                         Inputs{leaf({4, 5}, g, c.dtype, -2, 2)}};
      },
      [](const Inputs& x) {
        return cross_entropy(x[0], from_vector(std::vector<int64_t>{1, 0, -100, 4}, {4}), {.label_smoothing = 0.1});
      }));
  r.push_back(op(
      "mse_loss",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{std::string("(3, 4) and (3, 4), mean"),
                         Inputs{leaf({3, 4}, g, c.dtype), leaf({3, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return mse_loss(x[0], x[1]); }));
  r.push_back({"scaled_dot_product_attention", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape s{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(s, gen, c.dtype), leaf(s, gen, c.dtype), leaf(s, gen, c.dtype)};
                 AttentionOptions opts{.is_causal = c.mask == "causal", .dropout_p = c.dropout, .generator = &drop};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention", "op",
                     str_cat("q, k, v ", sh(s), " mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return scaled_dot_product_attention(in[0], in[1], in[2], opts).output;
                     },
                     in, o);
               }});
  r.push_back({"multi_head_attention", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const Shape s{c.batch, c.len, c.d_model};
                 Inputs in{leaf(s, gen, c.dtype), leaf(s, gen, c.dtype), leaf(s, gen, c.dtype)};
                 AttentionOptions opts{.is_causal = c.mask == "causal", .dropout_p = c.dropout, .generator = &drop};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "multi_head_attention", "op",
                     str_cat("q, k, v ", sh(s), " H=", c.heads, " mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return multi_head_attention(in[0], in[1], in[2], c.heads, opts).output;
                     },
                     in, o);
               }});
  r.push_back({"packed_self_attention", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 17), drop(0);
                 const Shape s{c.batch, c.len, 3 * c.d_model};
                 Inputs in{leaf(s, gen, c.dtype)};
                 AttentionOptions opts{.is_causal = c.mask == "causal", .dropout_p = c.dropout, .generator = &drop};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "packed_self_attention", "op",
                     str_cat("qkv ", sh(s), " H=", c.heads, " mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return packed_self_attention(in[0], c.heads, opts).output;
                     },
                     in, o);
               }});
  // The attention variants (docs/ATTENTION.md): the op's name, then the option checked.
  r.push_back({"scaled_dot_product_attention.gqa", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 19), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape sq{c.batch, 2 * c.heads, c.len, dk}, skv{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(sq, gen, c.dtype), leaf(skv, gen, c.dtype), leaf(skv, gen, c.dtype)};
                 AttentionOptions opts{.is_causal = c.mask == "causal", .dropout_p = c.dropout, .generator = &drop};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention.gqa", "op",
                     str_cat("q ", sh(sq), ", k, v ", sh(skv), " (H_kv = H / 2) mask=", c.mask,
                             " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return scaled_dot_product_attention(in[0], in[1], in[2], opts).output;
                     },
                     in, o);
               }});
  r.push_back({"scaled_dot_product_attention.window", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 23), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape s{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(s, gen, c.dtype), leaf(s, gen, c.dtype), leaf(s, gen, c.dtype)};
                 const int64_t w = std::max<int64_t>(1, c.len / 3);
                 AttentionOptions opts{
                     .is_causal = c.mask == "causal", .dropout_p = c.dropout, .generator = &drop, .window = w};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention.window", "op",
                     str_cat("q, k, v ", sh(s), " window=", w, " mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return scaled_dot_product_attention(in[0], in[1], in[2], opts).output;
                     },
                     in, o);
               }});
  r.push_back({"scaled_dot_product_attention.block_sparse", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 29), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape s{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(s, gen, c.dtype), leaf(s, gen, c.dtype), leaf(s, gen, c.dtype)};
                 const int64_t b = 2, nb = (c.len + b - 1) / b;  // ragged last block when len is odd
                 AttentionOptions opts{.is_causal = c.mask == "causal",
                                       .dropout_p = c.dropout,
                                       .generator = &drop,
                                       .block_size = b,
                                       .block_layout = bigbird_block_layout({.q_blocks = nb,
                                                                             .k_blocks = nb,
                                                                             .local_blocks = 0,
                                                                             .global_blocks = 1,
                                                                             .random_blocks = 1,
                                                                             .seed = c.seed})};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention.block_sparse", "op",
                     str_cat("q, k, v ", sh(s), " block_size=", b, " BigBird layout ", nb, "x", nb,
                             " (local 0, global 1, random 1) mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       return scaled_dot_product_attention(in[0], in[1], in[2], opts).output;
                     },
                     in, o);
               }});
  // FlexAttention-style mods (autograd/flex.h): ALiBi with learned (captured) slopes composed with soft-capping, under a
  // prefix-LM mask_mod: the gradients of q, k, v and of the captured slopes.
  r.push_back({"scaled_dot_product_attention.flex", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 41), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape s{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(s, gen, c.dtype), leaf(s, gen, c.dtype), leaf(s, gen, c.dtype),
                           leaf({c.heads}, gen, c.dtype, 0.1, 0.5)};
                 const int64_t prefix = std::max<int64_t>(1, c.len / 3);
                 AttentionOptions opts{.is_causal = c.mask == "causal",
                                       .dropout_p = c.dropout,
                                       .generator = &drop,
                                       .mask_mod = prefix_lm_mask(prefix)};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention.flex", "op",
                     str_cat("q, k, v ", sh(s), ", slopes (", c.heads, ") alibi+softcap(2) prefix_lm(", prefix,
                             ") mask=", c.mask, " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       AttentionOptions o2 = opts;
                       o2.score_mod = compose_score_mods(alibi(in[3]), softcap(2.0));
                       return scaled_dot_product_attention(in[0], in[1], in[2], o2).output;
                     },
                     in, o);
               }});
  // The attention entropy (need_entropy) through the fused backward, together with the output (grouped-query heads,
  // so that a shared key head sums the entropy gradients of its query heads): the Jacobian of [output | entropy].
  r.push_back({"scaled_dot_product_attention.entropy", "op", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 37), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 const Shape sq{c.batch, 2 * c.heads, c.len, dk}, skv{c.batch, c.heads, c.len, dk};
                 Inputs in{leaf(sq, gen, c.dtype), leaf(skv, gen, c.dtype), leaf(skv, gen, c.dtype)};
                 AttentionOptions opts{.is_causal = c.mask == "causal",
                                       .dropout_p = c.dropout,
                                       .generator = &drop,
                                       .need_entropy = true};
                 if (c.mask == "padding") opts.attn_mask = reshape(key_padding(c), {c.batch, 1, 1, c.len});
                 return run_check(
                     "scaled_dot_product_attention.entropy", "op",
                     str_cat("q ", sh(sq), ", k, v ", sh(skv), " [output | entropy] mask=", c.mask,
                             " dropout=", double_str(c.dropout)),
                     [&] {
                       drop.manual_seed(c.seed + 7);
                       AttentionResult r2 = scaled_dot_product_attention(in[0], in[1], in[2], opts);
                       return cat({flatten(r2.output), flatten(r2.entropy)}, 0);
                     },
                     in, o);
               }});

  // Attention toolbox (issue 16): rotary embeddings, linear attention, gradient checkpointing.
  r.push_back(op(
      "apply_rotary_emb",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{str_cat("x (", c.batch, ", ", c.heads, ", ", c.len, ", 4), interleaved pairs, offset 3"),
                         Inputs{leaf({c.batch, c.heads, c.len, 4}, g, c.dtype)}};
      },
      [](const Inputs& x) { return apply_rotary_emb(x[0], 3); }));
  r.push_back(op(
      "linear_attention",
      [](const CheckConfig& c, Generator& g) {
        const Shape s{c.batch, c.heads, c.len, 3};
        return std::pair{str_cat("q, k, v ", sh(s), ", elu+1, causal (running sums)"),
                         Inputs{leaf(s, g, c.dtype), leaf(s, g, c.dtype), leaf(s, g, c.dtype)}};
      },
      [](const Inputs& x) { return linear_attention(x[0], x[1], x[2], true); }));
  r.push_back(op(
      "checkpoint",
      [](const CheckConfig& c, Generator& g) {
        return std::pair{str_cat("tanh(dropout(x (", c.len, ", 4) @ w (4, 3), p=0.2)) recomputed, replayed mask"),
                         Inputs{leaf({c.len, 4}, g, c.dtype), leaf({4, 3}, g, c.dtype)}};
      },
      [](const Inputs& x) {
        static thread_local Generator drop;
        drop.manual_seed(4242);
        const Tensor w = x[1];
        return checkpoint(
            [w](const Inputs& in) { return tanh(dropout(matmul(in[0], w), 0.2, true, drop)); }, {x[0]},
            {.generators = {&drop}});
      }));
  // ---- modules ----
  r.push_back({"Linear", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 31);
                 nn::Linear m(c.d_model, c.d_model / 2 + 1, true, gen);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("Linear", str_cat("x ", sh(x.shape()), ", ", c.d_model, " -> ", c.d_model / 2 + 1), m,
                                   {x}, [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  r.push_back({"Embedding", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 32);
                 nn::Embedding m(7, c.d_model, -1, gen);
                 Tensor idx = tokens(random_tokens(c.batch, c.len, 0, 7, gen), c.batch, c.len);
                 return module_run("Embedding", str_cat("7 x ", c.d_model, ", indices ", sh(idx.shape())), m, {},
                                   [&] { return m.forward(idx); }, c, o, gen, nullptr);
               }});
  r.push_back({"LayerNorm", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 33);
                 nn::LayerNorm m(c.d_model);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("LayerNorm", str_cat("x ", sh(x.shape()), ", eps 1e-5"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  // The recipe's norms (ArchitectureSpec::norm and bias): LayerNorm without bias (nanoGPT's), RMSNorm (LLaMA's).
  r.push_back({"LayerNorm.no_bias", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 52);
                 nn::LayerNorm m(c.d_model, {.eps = 1e-5, .bias = false});
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("LayerNorm.no_bias", str_cat("x ", sh(x.shape()), ", eps 1e-5, no bias"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  r.push_back({"RMSNorm", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 53);
                 nn::RMSNorm m(c.d_model, 1e-6);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("RMSNorm", str_cat("x ", sh(x.shape()), ", eps 1e-6"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  r.push_back({"Dropout", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 34), drop(0);
                 const double p = drop_p(c);
                 nn::Dropout m(p, drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 CheckConfig train_mode = c;
                 train_mode.dropout = p;  // training mode
                 return module_run("Dropout", str_cat("x ", sh(x.shape()), ", p=", double_str(p), ", mask replayed"), m,
                                   {x}, [&] { return m.forward(x); }, train_mode, o, gen, &drop);
               }});
  r.push_back({"PositionwiseFeedForward", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 35), drop(0);
                 nn::PositionwiseFeedForward m(c.d_model, 2 * c.d_model, {.dropout = c.dropout}, gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("PositionwiseFeedForward",
                                   str_cat(module_conf(c, false), " d_ff=", 2 * c.d_model, " relu"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, &drop);
               }});
  // The recipe's feed-forward activations (ArchitectureSpec::activation): GPT-2's tanh GELU; LLaMA's SwiGLU
  // (linear2(silu(linear1 x) * linear3 x), linear3's weight and bias included), here without biases as in LLaMA.
  r.push_back({"PositionwiseFeedForward.gelu_tanh", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 54), drop(0);
                 nn::PositionwiseFeedForward m(c.d_model, 2 * c.d_model,
                                               {.dropout = c.dropout, .activation = "gelu-tanh"}, gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("PositionwiseFeedForward.gelu_tanh",
                                   str_cat(module_conf(c, false), " d_ff=", 2 * c.d_model, " gelu-tanh"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, &drop);
               }});
  r.push_back({"PositionwiseFeedForward.swiglu", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 55), drop(0);
                 nn::PositionwiseFeedForward m(c.d_model, 2 * c.d_model,
                                               {.dropout = c.dropout, .activation = "swiglu", .bias = false}, gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("PositionwiseFeedForward.swiglu",
                                   str_cat(module_conf(c, false), " d_ff=", 2 * c.d_model, " swiglu no-bias"), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, &drop);
               }});
  r.push_back({"MultiheadAttention", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 36), drop(0);
                 nn::MultiheadAttention m({.embed_dim = c.d_model, .num_heads = c.heads, .dropout = c.dropout}, gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 nn::MhaForwardOptions fo{.need_weights = false, .is_causal = c.mask == "causal"};
                 if (c.mask == "padding") fo.key_padding_mask = key_padding(c);
                 return module_run("MultiheadAttention", module_conf(c), m, {x},
                                   [&] { return m.forward(x, x, x, fo).output; }, c, o, gen, &drop);
               }});
  // MultiheadAttention with the attention variants (docs/ATTENTION.md): grouped-query heads, a window and a BigBird
  // block layout at once.
  r.push_back({"MultiheadAttention.variants", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 43), drop(0);
                 const int64_t kv = c.heads % 2 == 0 ? c.heads / 2 : 1, w = std::max<int64_t>(1, c.len / 3);
                 nn::MultiheadAttention m({.embed_dim = c.d_model,
                                           .num_heads = c.heads,
                                           .dropout = c.dropout,
                                           .num_kv_heads = kv,
                                           .window = w,
                                           .block_size = 2,
                                           .block_local = 1,
                                           .block_global = 1,
                                           .block_random = 1,
                                           .block_seed = c.seed},
                                          gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 nn::MhaForwardOptions fo{.need_weights = false, .is_causal = c.mask == "causal"};
                 if (c.mask == "padding") fo.key_padding_mask = key_padding(c);
                 return module_run("MultiheadAttention.variants",
                                   str_cat(module_conf(c), " num_kv_heads=", kv, " window=", w,
                                           " block_size=2 BigBird (local 1, global 1, random 1)"),
                                   m, {x}, [&] { return m.forward(x, x, x, fo).output; }, c, o, gen, &drop);
               }});
  // MultiheadAttention with RoPE on grouped-query heads (head size rounded down to even, at least 2; RoPE at
  // positions 3 .. 3 + L - 1).
  r.push_back({"MultiheadAttention.rope", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 46), drop(0);
                 const int64_t hd = std::max<int64_t>(2, c.d_model / c.heads / 2 * 2), E = hd * c.heads;
                 const int64_t kv = c.heads % 2 == 0 ? c.heads / 2 : 1;
                 nn::MultiheadAttention m({.embed_dim = E,
                                           .num_heads = c.heads,
                                           .dropout = c.dropout,
                                           .num_kv_heads = kv,
                                           .rope = true,
                                           .rope_max_len = c.len + 3},
                                          gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, E}, gen, c.dtype);
                 nn::MhaForwardOptions fo{.need_weights = false, .is_causal = c.mask == "causal", .rope_offset = 3};
                 if (c.mask == "padding") fo.key_padding_mask = key_padding(c);
                 return module_run("MultiheadAttention.rope",
                                   str_cat(module_conf(c), " E=", E, " num_kv_heads=", kv, " rope offset 3"), m, {x},
                                   [&] { return m.forward(x, x, x, fo).output; }, c, o, gen, &drop);
               }});
  r.push_back({"seed::AttentionSublayer", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 37), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 nn::seed::AttentionSublayer m(c.heads, c.d_model, dk, dk, c.dropout, gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 Tensor mask;
                 if (c.mask == "causal") mask = nn::causal_mask(c.len);
                 if (c.mask == "padding") mask = reshape(key_padding(c), {c.batch, 1, c.len});
                 return module_run("seed::AttentionSublayer", module_conf(c) + " post-LN", m, {x},
                                   [&] { return m.forward(x, x, x, mask, false).output; }, c, o, gen, &drop);
               }});
  r.push_back({"TransformerEncoderLayer", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 38), drop(0);
                 nn::TransformerEncoderLayer m(
                     {.d_model = c.d_model, .nhead = c.heads, .dim_feedforward = 2 * c.d_model, .dropout = c.dropout},
                     gen);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 const Tensor kpm = c.mask == "padding" ? key_padding(c) : Tensor();
                 const bool causal = c.mask == "causal";
                 Tensor causal_m = causal ? nn::causal_mask(c.len) : Tensor();
                 const nn::EncoderForwardOptions masks{
                     .src_mask = causal_m, .src_key_padding_mask = kpm, .is_causal = causal};
                 return module_run("TransformerEncoderLayer", module_conf(c) + " post-LN", m, {x},
                                   [&] { return m.forward(x, masks); }, c, o, gen, &drop);
               }});
  r.push_back({"TransformerDecoderLayer", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 39), drop(0);
                 nn::TransformerDecoderLayer m(
                     {.d_model = c.d_model, .nhead = c.heads, .dim_feedforward = 2 * c.d_model, .dropout = c.dropout},
                     gen);
                 m.set_generator(drop);
                 Tensor tgt = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 Tensor memory = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 const Tensor mkpm = c.mask == "padding" ? key_padding(c) : Tensor();
                 Tensor causal_m = c.mask == "causal" ? nn::causal_mask(c.len) : Tensor();
                 const nn::DecoderForwardOptions masks{.tgt_mask = causal_m, .memory_key_padding_mask = mkpm};
                 return module_run("TransformerDecoderLayer",
                                   module_conf(c) + (c.mask == "padding" ? " (memory padding)" : "") + " post-LN", m,
                                   {tgt, memory}, [&] { return m.forward(tgt, memory, masks); },
                                   c, o, gen, &drop);
               }});
  r.push_back({"CausalLM", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 40), drop(0);
                 nn::CausalLM m({.vocab = 7,
                                 .d_model = c.d_model,
                                 .n_head = c.heads,
                                 .d_ff = 2 * c.d_model,
                                 .n_layers = c.layers,
                                 .dropout = c.dropout,
                                 .max_len = c.len,
                                 .pad_idx = 0},
                                gen);
                 m.set_generator(drop);
                 std::vector<int64_t> v = random_tokens(c.batch, c.len, 1, 7, gen);
                 const bool padding = c.mask == "padding";
                 if (padding) {
                   const Tensor kpm = key_padding(c);
                   for (int64_t i = 0; i < c.batch * c.len; ++i)
                     if (kpm.flat(i) != 0) v[static_cast<size_t>(i)] = 0;
                 }
                 Tensor t = tokens(v, c.batch, c.len);
                 return module_run("CausalLM",
                                   str_cat(module_conf(c, false), " layers=", c.layers, " causal", padding ? "+padding" : ""),
                                   m, {}, [&] { return m.forward(t, padding); }, c, o, gen, &drop);
               }});
  // CausalLM with the MultiheadAttention variants of ModelSpec::attention (docs/ATTENTION.md): every parameter. (mla
  // and linear attention: after their modules, below.)
  causal_lm_variant(r, "CausalLM.gqa_rope", 47, {.kind = "gqa", .kv_heads = 1, .rope = true});
  causal_lm_variant(r, "CausalLM.local", 48, {.kind = "local", .window = 2});
  causal_lm_variant(r, "CausalLM.block_sparse", 49, {.kind = "block-sparse", .block = 2});
  causal_lm_variant(r, "CausalLM.checkpoint", 50, {.checkpoint = true});
  // CausalLM with each recipe option (ArchitectureSpec): every parameter, pos_embed.weight (the learned table's
  // gradient from embed_with_positions) and head.weight / head.bias included. Options without biases use GELU, whose
  // inputs need no keeping away from a kink.
  causal_lm_recipe(r, "CausalLM.learned_positions", 56, {.positions = "learned"});
  causal_lm_recipe(r, "CausalLM.rope_positions", 57, {.positions = "rope"});
  causal_lm_recipe(r, "CausalLM.no_positions", 58, {.positions = "none"});
  causal_lm_recipe(r, "CausalLM.gelu_tanh", 59, {.activation = "gelu-tanh"});
  causal_lm_recipe(r, "CausalLM.swiglu", 60, {.activation = "swiglu"});
  causal_lm_recipe(r, "CausalLM.rmsnorm", 61, {.norm = "rmsnorm"});
  causal_lm_recipe(r, "CausalLM.no_bias", 62, {.activation = "gelu", .bias = false});
  causal_lm_recipe(r, "CausalLM.embed_scale_none", 63, {.embed_scale = "none"});
  causal_lm_recipe(r, "CausalLM.untied_head", 64, {.head = "untied"});
  causal_lm_recipe(r, "CausalLM.nanogpt", 65,
                   {.positions = "learned", .activation = "gelu", .norm_eps = 1e-5, .bias = false,
                    .embed_scale = "none", .init = "gpt2", .head = "tied", .recipe = "nanogpt"});
  causal_lm_recipe(r, "CausalLM.llama", 66,
                   {.positions = "rope", .activation = "swiglu", .norm = "rmsnorm", .bias = false,
                    .embed_scale = "none"});
  r.push_back({"EncoderTagger", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 42), drop(0);
                 nn::EncoderTagger m({.vocab = 7,
                                      .d_model = c.d_model,
                                      .n_head = c.heads,
                                      .d_ff = 2 * c.d_model,
                                      .n_layers = c.layers,
                                      .dropout = c.dropout,
                                      .max_len = c.len,
                                      .pad_idx = 0},
                                     gen);
                 m.set_generator(drop);
                 std::vector<int64_t> v = random_tokens(c.batch, c.len, 1, 7, gen);
                 // Right padding on the last row (a blocked key for every query of that row).
                 v[static_cast<size_t>(c.batch * c.len - 1)] = 0;
                 Tensor t = tokens(v, c.batch, c.len);
                 return module_run("EncoderTagger", str_cat(module_conf(c, false), " layers=", c.layers, " +padding"), m,
                                   {}, [&] { return m.forward(t); }, c, o, gen, &drop);
               }});
  r.push_back({"seed::Transformer", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 41), drop(0);
                 const int64_t dk = c.d_model / c.heads;
                 nn::seed::Transformer m({.src_vocab = 7,
                                          .tgt_vocab = 7,
                                          .d_model = c.d_model,
                                          .n_head = c.heads,
                                          .d_k = dk,
                                          .d_v = dk,
                                          .d_inner = 2 * c.d_model,
                                          .n_layers = c.layers,
                                          .dropout = c.dropout,
                                          .pad_idx = 0,
                                          .n_position = c.len},
                                         gen);
                 m.set_generator(drop);
                 std::vector<int64_t> s = random_tokens(c.batch, c.len, 1, 7, gen);
                 const std::vector<int64_t> t = random_tokens(c.batch, c.len, 1, 7, gen);
                 const bool padding = c.mask == "padding";
                 if (padding) {
                   const Tensor kpm = key_padding(c);
                   for (int64_t i = 0; i < c.batch * c.len; ++i)
                     if (kpm.flat(i) != 0) s[static_cast<size_t>(i)] = 0;
                 }
                 Tensor src = tokens(s, c.batch, c.len), tgt = tokens(t, c.batch, c.len);
                 return module_run("seed::Transformer",
                                   str_cat(module_conf(c, false), " layers=", c.layers, padding ? " src padding" : ""),
                                   m, {}, [&] { return m.forward(src, tgt); }, c, o, gen, &drop);
               }});
  // The seed's Transformer with grouped-query heads in every attention, a window on the encoder's self-attention
  // and checkpointed layers (at least 2 layers, so that one is checkpointed).
  r.push_back({"seed::Transformer.variants", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 51), drop(0);
                 const int64_t dk = c.d_model / c.heads, kv = c.heads % 2 == 0 ? c.heads / 2 : 1;
                 const int64_t layers = std::max<int64_t>(2, c.layers), w = std::max<int64_t>(1, c.len / 3);
                 nn::seed::Transformer m({.src_vocab = 7,
                                          .tgt_vocab = 7,
                                          .d_model = c.d_model,
                                          .n_head = c.heads,
                                          .d_k = dk,
                                          .d_v = dk,
                                          .d_inner = 2 * c.d_model,
                                          .n_layers = layers,
                                          .dropout = c.dropout,
                                          .pad_idx = 0,
                                          .n_position = c.len,
                                          .n_kv_head = kv,
                                          .enc_window = w,
                                          .checkpoint = true},
                                         gen);
                 m.set_generator(drop);
                 const std::vector<int64_t> s = random_tokens(c.batch, c.len, 1, 7, gen);
                 const std::vector<int64_t> t = random_tokens(c.batch, c.len, 1, 7, gen);
                 Tensor src = tokens(s, c.batch, c.len), tgt = tokens(t, c.batch, c.len);
                 return module_run("seed::Transformer.variants",
                                   str_cat(module_conf(c, false), " layers=", layers, " n_kv_head=", kv,
                                           " enc_window=", w, " checkpoint"),
                                   m, {}, [&] { return m.forward(src, tgt); }, c, o, gen, &drop);
               }});
  // Attention toolbox modules (issue 16).
  r.push_back({"RotaryEmbedding", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 43);
                 nn::RotaryEmbedding m(c.d_model / c.heads + (c.d_model / c.heads) % 2, c.len + 2);
                 Tensor x = leaf({c.batch, c.heads, c.len, m.head_dim}, gen, c.dtype);
                 return module_run("RotaryEmbedding", str_cat(module_conf(c, false, false), " offset 2"), m, {x},
                                   [&] { return m.forward(x, 2); }, c, o, gen, nullptr);
               }});
  r.push_back({"LinearAttention", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 44);
                 nn::LinearAttention m({.embed_dim = c.d_model, .num_heads = c.heads, .causal = c.mask == "causal"},
                                       gen);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("LinearAttention",
                                   str_cat(module_conf(c, false, false), c.mask == "causal" ? " causal" : ""), m, {x},
                                   [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  r.push_back({"Checkpointed", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 45), drop(0);
                 auto layer = std::make_shared<nn::TransformerEncoderLayer>(
                     nn::TransformerLayerOptions{
                         .d_model = c.d_model, .nhead = c.heads, .dim_feedforward = 2 * c.d_model, .dropout = c.dropout},
                     gen);
                 nn::Checkpointed<nn::TransformerEncoderLayer> m(layer);
                 m.set_generator(drop);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 const bool causal = c.mask == "causal";
                 const nn::EncoderForwardOptions masks{
                     .src_mask = causal ? nn::causal_mask(c.len) : Tensor(),
                     .src_key_padding_mask = c.mask == "padding" ? key_padding(c) : Tensor(),
                     .is_causal = causal};
                 return module_run("Checkpointed", module_conf(c) + " TransformerEncoderLayer post-LN", m, {x},
                                   [&] { return m.forward_with(x, masks); }, c, o, gen, &drop);
               }});
  r.push_back({"MultiHeadLatentAttention", "module", [](const CheckConfig& c, const GradcheckOptions& o) {
                 Generator gen(c.seed * 1000003 + 46);
                 // Always causal self-attention; small head dims, query compression on (q_lora_rank = E / 2).
                 const int64_t rank = std::max<int64_t>(2, c.d_model / 2);
                 nn::MultiHeadLatentAttention m({.d_model = c.d_model, .n_heads = c.heads, .qk_nope_head_dim = 2,
                                                 .qk_rope_head_dim = 2, .v_head_dim = 3, .kv_lora_rank = rank,
                                                 .q_lora_rank = rank},
                                                gen);
                 Tensor x = leaf({c.batch, c.len, c.d_model}, gen, c.dtype);
                 return module_run("MultiHeadLatentAttention",
                                   str_cat(module_conf(c, false, false), " causal kv_lora_rank=", rank,
                                           " q_lora_rank=", rank),
                                   m, {x}, [&] { return m.forward(x); }, c, o, gen, nullptr);
               }});
  // CausalLM with multi-head latent attention (query compression on, attention dropout replayed, pad keys blocked
  // with --mask padding) and with linear attention (causal only: it takes no key mask): every parameter of the model.
  // mla: query compression on, a latent of a quarter of the width, 2 RoPE features.
  causal_lm_variant(r, "CausalLM.mla", 47, {.kind = "mla"}, [](const CheckConfig& c) {
    const int64_t rank = std::max<int64_t>(2, c.d_model / 4);
    return nn::AttentionSpec{.kind = "mla", .kv_rank = rank, .q_rank = rank, .rope_dim = 2};
  });
  // mla with positions only from its decoupled RoPE (DeepSeek's form, --rope: no sinusoidal table).
  causal_lm_variant(r, "CausalLM.mla_rope", 49, {.kind = "mla", .rope = true}, [](const CheckConfig& c) {
    const int64_t rank = std::max<int64_t>(2, c.d_model / 4);
    return nn::AttentionSpec{.kind = "mla", .kv_rank = rank, .q_rank = rank, .rope_dim = 2, .rope = true};
  });
  causal_lm_variant(r, "CausalLM.linear", 48, {.kind = "linear"});
  // The kinds made only of a score_mod (autograd/flex.h): ALiBi's distance penalty; soft-capping at a cap small
  // enough to bend the scores (cap 0.5 against scores of about 1).
  causal_lm_variant(r, "CausalLM.alibi", 50, {.kind = "alibi"});
  causal_lm_variant(r, "CausalLM.softcap", 51, {.kind = "softcap", .options = R"({"cap":0.5})"});
  // The kinds made only of a mask_mod over what the model passes: prefix-lm's prompt is up to the first SEP (3) of
  // each row (row 0's is placed at position 2: a prompt of 3; row 1's random tokens 1..6 may hold one too);
  // document's documents end at <eos> (2), placed at positions 1 and 3 of row 0.
  r.push_back(causal_lm_variant_check("CausalLM.prefix_lm", 52, {.kind = "prefix-lm"}, {}, {}, {{2, 3}}));
  r.push_back(causal_lm_variant_check("CausalLM.document", 53, {.kind = "document"}, {}, {}, {{1, 2}, {3, 2}}));
  return r;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

const std::vector<Check>& registry() {
  static const std::vector<Check> r = build_registry();
  return r;
}

const std::vector<UncheckedOp>& unchecked_ops() {
  static const std::vector<UncheckedOp> r = [] {
    std::vector<UncheckedOp> v;
    for (const char* n : {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "arange",
                          "from_vector", "scalar_tensor", "rand", "randn", "randint", "dropout_mask"})
      v.push_back({n, "creates a tensor from sizes or values: no tensor input to differentiate"});
    for (const char* n : {"eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "argmax"})
      v.push_back({n, "boolean or index result: no gradient"});
    v.push_back({"record", "the engine's primitive that records an op's node, not an op"});
    v.push_back({"round_to_bf16",
                 "rounds float32 values to bfloat16 (autocast); float64, gradcheck's type, passes "
                 "through unchanged, and its gradient is the identity (tests/autograd/test_autocast.cpp)"});
    v.push_back({"bigbird_block_layout", "builds a Bool block layout from block counts: no tensor input"});
    v.push_back({"alibi_slopes", "ALiBi's fixed slopes from a head count: no tensor input (alibi(slopes) is checked "
                                 "as scaled_dot_product_attention.flex)"});
    v.push_back({"attention_entropy_loss",
                 "-lambda * a (masked) mean, composed of mul, sum and mean (each checked); the entropy it reads is "
                 "checked as scaled_dot_product_attention.entropy"});
    for (const char* n : {"reuse_or_empty_like", "reuse_temporary_or_empty"})
      v.push_back({n, "the engine's buffer reuse for backward functions, not an op"});
    for (const char* n : {"map_float", "zip_float"}) v.push_back({n, "a kernel helper that records no node"});
    return v;
  }();
  return r;
}

GradcheckOptions tolerances(Dtype dtype) {
  if (dtype == kFloat64) return GradcheckOptions{.eps = 1e-6, .atol = 1e-5, .rtol = 1e-3};
  ATTO_CHECK(dtype == kFloat32, "gradcheck", "precision must be float64 or float32, got ", dtype_name(dtype));
  return GradcheckOptions{.eps = 1e-3, .atol = 1e-2, .rtol = 1e-2};
}

const Check& find_check(const std::string& name) {
  const std::vector<Check>& all = registry();
  for (const Check& c : all)
    if (c.name == name) return c;
  static const std::map<std::string, std::string> aliases = {
      {"mha", "MultiheadAttention"},
      {"mla", "MultiHeadLatentAttention"},
      {"multihead_attention", "MultiheadAttention"},
      {"seed_mha", "seed::AttentionSublayer"},
      {"seed-mha", "seed::AttentionSublayer"},
      {"attention_sublayer", "seed::AttentionSublayer"},
      {"ffn", "PositionwiseFeedForward"},
      {"feedforward", "PositionwiseFeedForward"},
      {"feed_forward", "PositionwiseFeedForward"},
      {"encoder_layer", "TransformerEncoderLayer"},
      {"decoder_layer", "TransformerDecoderLayer"},
      {"causal_lm", "CausalLM"},
      {"lm", "CausalLM"},
      {"encoder", "EncoderTagger"},
      {"encoder_tagger", "EncoderTagger"},
      {"transformer", "seed::Transformer"},
      {"seq2seq", "seed::Transformer"},
      {"sdpa", "scaled_dot_product_attention"},
      {"attention", "scaled_dot_product_attention"},
      {"layernorm", "LayerNorm"},
  };
  const std::string key = lower(name);
  if (auto it = aliases.find(key); it != aliases.end()) return find_check(it->second);
  const Check* match = nullptr;
  int matches = 0;
  for (const Check& c : all)
    if (lower(c.name) == key) match = &c, ++matches;
  if (matches == 1) return *match;
  // Any registered attention kind, a user's included: "CausalLM.<kind>" or the kind's name checks CausalLM built
  // with that kind at its defaults (the attention spec {.kind = kind}).
  const std::string prefix = "CausalLM.";
  const std::string kind = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  if (matches == 0 && nn::has_attention(kind)) {
    static std::mutex mutex;
    static std::deque<Check> made;  // stable addresses
    std::lock_guard<std::mutex> lock(mutex);
    for (const Check& c : made)
      if (c.name == prefix + kind) return c;
    made.push_back(causal_lm_attention_check(prefix + kind, {.kind = kind}));
    return made.back();
  }
  std::string names;
  for (const Check& c : all) names += (names.empty() ? "" : ", ") + c.name;
  ATTO_CHECK(matches == 0, "gradcheck", "'", name, "' is ambiguous: write the op in snake_case or the module in ",
             "PascalCase (", names, ")");
  throw Error("gradcheck", str_cat("no check named '", name, "'; known: ", names,
                               "; aliases: mha, seed_mha, ffn, encoder_layer, decoder_layer, causal_lm, transformer, sdpa; or ",
                               "CausalLM.<attention kind> for a registered kind (", nn::attention_kinds_list(), ")"));
}

void validate(const CheckConfig& c) {
  const char* me = "gradcheck";
  ATTO_CHECK(is_floating(c.dtype), me, "precision must be float64 or float32, got ", dtype_name(c.dtype));
  ATTO_CHECK(c.batch >= 1, me, "batch must be >= 1, got ", c.batch);
  ATTO_CHECK(c.len >= 1, me, "len must be >= 1, got ", c.len);
  ATTO_CHECK(c.d_model >= 1, me, "d_model must be >= 1, got ", c.d_model);
  ATTO_CHECK(c.heads >= 1 && c.d_model % c.heads == 0, me, "heads (", c.heads, ") must divide d_model (", c.d_model,
             ")");
  ATTO_CHECK(c.layers >= 1, me, "layers must be >= 1, got ", c.layers);
  ATTO_CHECK(c.batch <= kMaxCheckBatch, me, "batch must be at most ", kMaxCheckBatch, ", got ", c.batch);
  ATTO_CHECK(c.len <= kMaxCheckLen, me, "len must be at most ", kMaxCheckLen, ", got ", c.len);
  ATTO_CHECK(c.d_model <= kMaxCheckDModel, me, "d_model must be at most ", kMaxCheckDModel, ", got ", c.d_model);
  ATTO_CHECK(c.layers <= kMaxCheckLayers, me, "layers must be at most ", kMaxCheckLayers, ", got ", c.layers);
  ATTO_CHECK(c.mask == "none" || c.mask == "causal" || c.mask == "padding", me,
             "mask must be none, causal or padding, got '", c.mask, "'");
  ATTO_CHECK(c.mask != "padding" || c.len >= 2, me, "a padding mask needs len >= 2 (one key stays visible), got ",
             c.len);
  ATTO_CHECK(c.dropout >= 0 && c.dropout < 1, me, "dropout must be in [0, 1), got ", c.dropout);
}

std::vector<CheckResult> run_checks(const std::string& name, const CheckConfig& config) {
  validate(config);
  return run_checks(name, config, tolerances(config.dtype));
}

std::vector<CheckResult> run_checks(const std::string& name, const CheckConfig& config,
                                    const GradcheckOptions& options) {
  validate(config);
  std::vector<CheckResult> out;
  if (!name.empty()) {
    out.push_back(find_check(name).run(config, options));
    return out;
  }
  for (const Check& c : registry()) out.push_back(c.run(config, options));
  return out;
}

}  // namespace attograd::checks

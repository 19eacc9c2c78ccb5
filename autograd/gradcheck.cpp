#include "autograd/gradcheck.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "autograd/elementwise.h"

namespace attograd {

namespace {

double get(const Tensor& t, int64_t i) { return t.flat(i); }

void put(Tensor& t, int64_t i, double v) {
  dispatch_float(t.dtype(), "gradcheck", [&]<typename T>() { t.data<T>()[i] = static_cast<T>(v); });
}

// Output values as doubles, computed without recording.
std::vector<double> eval_values(const std::function<Tensor()>& f) {
  NoGradGuard ng;
  return f().to_vector<double>();
}

// Gradients of every input after one backward of `y` with `seed`, flattened into one vector.
std::vector<double> backward_grads(const Tensor& y, const Tensor& seed, const std::vector<Tensor>& inputs) {
  for (const Tensor& x : inputs) const_cast<Tensor&>(x).zero_grad(/*set_to_none=*/true);
  y.backward(seed, /*retain_graph=*/true);
  std::vector<double> out;
  for (const Tensor& x : inputs) {
    Tensor g = x.grad();
    if (g.defined()) {
      auto v = g.to_vector<double>();
      out.insert(out.end(), v.begin(), v.end());
    } else {
      out.insert(out.end(), static_cast<size_t>(x.numel()), 0.0);
    }
  }
  return out;
}

// J^T rows for every output element (full mode), as [out][flat input element].
std::vector<std::vector<double>> analytic_jacobian(const std::function<Tensor()>& f, const std::vector<Tensor>& inputs,
                                                   const std::vector<double>* projection) {
  Tensor y = f();
  ATTO_CHECK(y.requires_grad(), "gradcheck", "the function's output (shape ", y.shape(),
             ") does not depend on any input that requires grad");
  std::vector<std::vector<double>> rows;
  if (projection) {
    Tensor seed = from_vector(*projection, y.shape(), {.dtype = y.dtype()});
    rows.push_back(backward_grads(y, seed, inputs));
  } else {
    const int64_t n = y.numel();
    for (int64_t j = 0; j < n; ++j) {
      Tensor seed = zeros(y.shape(), {.dtype = y.dtype()});
      put(seed, j, 1.0);
      rows.push_back(backward_grads(y, seed, inputs));
    }
  }
  for (const Tensor& x : inputs) const_cast<Tensor&>(x).zero_grad(true);
  return rows;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor()>& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  ATTO_CHECK(!inputs.empty(), "gradcheck", "no inputs to check");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ATTO_CHECK(inputs[i].defined() && inputs[i].requires_grad() && inputs[i].is_leaf(), "gradcheck", "input ", i,
               " must be a leaf tensor with requires_grad");
    ATTO_CHECK(is_floating(inputs[i].dtype()), "gradcheck", "input ", i, " has dtype ",
               dtype_name(inputs[i].dtype()));
  }
  std::vector<Tensor> xs = inputs;
  std::vector<double> y0 = eval_values(f);
  const int64_t n_out = static_cast<int64_t>(y0.size());
  bool fast = opt.fast_mode || n_out > opt.max_full_outputs;

  // Random projections for fast mode: v over outputs (u over inputs is implicit: we compare
  // every input element of J^T v, which is stronger than v^T J u and still one backward).
  std::vector<double> v;
  if (fast) {
    Generator gen(opt.seed);
    v.resize(static_cast<size_t>(n_out));
    for (auto& e : v) e = gen.uniform(-1.0, 1.0);
  }

  auto rows = analytic_jacobian(f, xs, fast ? &v : nullptr);
  GradcheckResult r;
  if (opt.check_reentrant) {
    auto again = analytic_jacobian(f, xs, fast ? &v : nullptr);
    for (size_t j = 0; j < rows.size() && r.reentrant; ++j)
      if (!rows[j].empty() &&
          std::memcmp(rows[j].data(), again[j].data(), rows[j].size() * sizeof(double)) != 0)
        r.reentrant = false;
  }

  double worst_ratio = -1;
  int64_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor& x = xs[i];
    const int64_t n = x.numel();
    for (int64_t k = 0; k < n; ++k) {
      double orig = get(x, k);
      put(x, k, orig + opt.eps);
      std::vector<double> yp = eval_values(f);
      put(x, k, orig - opt.eps);
      std::vector<double> ym = eval_values(f);
      put(x, k, orig);
      auto compare = [&](int64_t out_index, double a, double num) {
        double err = std::fabs(a - num);
        double allowed = opt.atol + opt.rtol * std::fabs(num);
        if (!(err <= allowed)) r.passed = false;
        r.max_abs_error = std::max(r.max_abs_error, std::isnan(err) ? INFINITY : err);
        // A relative error means nothing where the derivative is ~0: only entries with |numeric| >= atol count
        // (as in the built-in suite), so a passing check never reports 1e+293.
        if (std::isnan(err)) r.max_rel_error = INFINITY;
        else if (err > 0 && std::fabs(num) >= opt.atol)
          r.max_rel_error = std::max(r.max_rel_error, err / std::fabs(num));
        double ratio = std::isnan(err) ? INFINITY : err / allowed;
        if (ratio > worst_ratio) {
          worst_ratio = ratio;
          r.worst_input = i;
          r.worst_index = fast ? -1 : k;
          r.worst_output = out_index;
          r.analytic = a;
          r.numeric = num;
          if (fast) r.worst_index = k;
        }
        ++r.checked;
      };
      if (fast) {
        double num = 0;
        for (int64_t j = 0; j < n_out; ++j) num += v[j] * (yp[j] - ym[j]) / (2 * opt.eps);
        compare(-1, rows[0][offset + k], num);
      } else {
        for (int64_t j = 0; j < n_out; ++j) compare(j, rows[j][offset + k], (yp[j] - ym[j]) / (2 * opt.eps));
      }
    }
    offset += n;
  }
  if (!r.reentrant) r.passed = false;

  std::ostringstream os;
  os << (r.passed ? "gradcheck passed" : "gradcheck FAILED") << " (" << r.checked << " entries, "
     << (fast ? "fast mode" : "full Jacobian") << "): max abs error " << r.max_abs_error << ", max rel error "
     << r.max_rel_error;
  if (r.checked > 0)
    os << "; worst: input " << r.worst_input << " " << shape_str(xs[r.worst_input].shape()) << " element "
       << r.worst_index << (fast ? "" : ", output element " + std::to_string(r.worst_output)) << ": analytic "
       << r.analytic << " vs numeric " << r.numeric;
  if (!r.reentrant) os << "; NOT reentrant: two backward passes gave different gradients";
  r.message = os.str();
  return r;
}

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  return gradcheck([&]() { return f(inputs); }, inputs, options);
}

}  // namespace attograd

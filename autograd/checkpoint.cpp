// Gradient checkpointing (see checkpoint.h): a no-grad forward, and a backward that recomputes the function's graph
// with the generators replayed and back-propagates through it.

#include "autograd/checkpoint.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "autograd/autocast.h"

namespace attograd {

namespace {

// Grad mode on for its lifetime (torch.enable_grad()), restored on exceptions too.
struct EnableGradGuard {
  bool prev = is_grad_enabled();
  EnableGradGuard() { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;
};

// The generators to replay, each once, default_generator() first when preserved.
std::vector<Generator*> replayed_generators(const CheckpointOptions& options) {
  std::vector<Generator*> gens;
  if (options.preserve_default_generator) gens.push_back(&default_generator());
  for (size_t i = 0; i < options.generators.size(); ++i) {
    Generator* g = options.generators[i];
    ATTO_CHECK(g != nullptr, "checkpoint", "options.generators[", i, "] is null");
    if (std::find(gens.begin(), gens.end(), g) == gens.end()) gens.push_back(g);
  }
  return gens;
}

// Sets generators to saved states and puts back the states they had when it was made (also on exceptions).
class ReplayGenerators {
 public:
  ReplayGenerators(const std::vector<Generator*>& gens, const std::vector<GeneratorState>& replay) : gens_(gens) {
    now_.reserve(gens.size());
    for (Generator* g : gens_) now_.push_back(g->get_state());
    for (size_t i = 0; i < gens_.size(); ++i) gens_[i]->set_state(replay[i]);
  }
  ~ReplayGenerators() {
    for (size_t i = 0; i < gens_.size(); ++i) gens_[i]->set_state(now_[i]);
  }
  ReplayGenerators(const ReplayGenerators&) = delete;
  ReplayGenerators& operator=(const ReplayGenerators&) = delete;

 private:
  const std::vector<Generator*>& gens_;
  std::vector<GeneratorState> now_;
};

}  // namespace

Tensor checkpoint(const CheckpointFn& function, const std::vector<Tensor>& inputs, const CheckpointOptions& options) {
  const char* me = "checkpoint";
  ATTO_CHECK(static_cast<bool>(function), me, "function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    ATTO_CHECK(inputs[i].defined(), me, "input ", i, " of ", inputs.size(), " is undefined");
  const std::vector<Generator*> gens = replayed_generators(options);
  if (!is_grad_enabled()) {  // nothing to recompute: no graph is recorded anyway
    Tensor out = function(inputs);
    ATTO_CHECK(out.defined(), me, "the function returned an undefined tensor");
    return out;
  }
  bool any = false;
  for (const Tensor& t : inputs) any = any || t.requires_grad();
  if (!any) {
    std::string shapes;
    for (const Tensor& t : inputs) shapes += (shapes.empty() ? "" : ", ") + shape_str(t.shape());
    throw Error(me, str_cat("none of the ", inputs.size(), " inputs (shapes [", shapes,
                            "]) requires grad: the recomputation would never run, and the parameters inside the "
                            "function would get no gradient; pass a tensor that requires grad, or call the function "
                            "directly (or under NoGradGuard)"));
  }

  std::vector<GeneratorState> states;
  states.reserve(gens.size());
  for (Generator* g : gens) states.push_back(g->get_state());
  Tensor out;
  {
    NoGradGuard no_grad;
    out = function(inputs);
  }
  ATTO_CHECK(out.defined(), me, "the function returned an undefined tensor");
  ATTO_CHECK(is_floating(out.dtype()), me, "the function returned a ", dtype_name(out.dtype()), " tensor of shape ",
             out.shape(), ": only a float result can carry a gradient");
  out = out.detach();  // a fresh impl to record on (the function may return one of its inputs)

  struct Saved {
    CheckpointFn function;
    std::vector<Tensor> inputs;  // detached (they share the data, not the history)
    std::vector<bool> needs_grad;
    std::vector<Generator*> gens;
    std::vector<GeneratorState> states;
    Shape out_shape;
    Precision precision;  // autocast's at the forward: the recomputation runs in it (as torch.utils.checkpoint does)
  };
  auto saved = std::make_shared<Saved>();
  saved->function = function;
  saved->gens = gens;
  saved->states = std::move(states);
  saved->out_shape = out.shape();
  saved->precision = autocast_precision();
  for (const Tensor& t : inputs) {
    saved->inputs.push_back(t.detach());
    saved->needs_grad.push_back(t.requires_grad());
  }
  return record("checkpoint", out, inputs, [saved](const Tensor& g, GradInputs& grads) {
    const Saved& s = *saved;
    std::vector<Tensor> detached;
    detached.reserve(s.inputs.size());
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      Tensor d = s.inputs[i].detach();
      if (s.needs_grad[i]) d.requires_grad_(true);
      detached.push_back(std::move(d));
    }
    Tensor recomputed;
    {
      ReplayGenerators replay(s.gens, s.states);
      EnableGradGuard grad_on;
      const Autocast autocast(s.precision);
      recomputed = s.function(detached);
      ATTO_CHECK(recomputed.defined() && recomputed.shape() == s.out_shape, "checkpoint", "the recomputation returned ",
                 recomputed.defined() ? shape_str(recomputed.shape()) : "nothing", " where the forward returned ",
                 s.out_shape, ": the function is not deterministic");
      ATTO_CHECK(recomputed.requires_grad(), "checkpoint", "the result (shape ", s.out_shape,
                 ") does not depend on any input that requires grad, nor on a parameter");
      // Its graph goes with this backward; the recomputed activations are freed as it runs (as in any backward).
      recomputed.backward(g);
    }
    for (size_t i = 0; i < detached.size(); ++i)
      if (grads.needs(i)) grads[i] = detached[i].grad();  // undefined: the result does not depend on input i
  });
}

}  // namespace attograd

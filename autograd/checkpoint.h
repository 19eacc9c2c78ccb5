#pragma once
// Gradient (activation) checkpointing, torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False):
// the forward runs `function` without recording (none of its intermediate results is kept), and records one node
// whose backward re-runs `function` with grad mode on, on detached copies of the inputs, with every generator it
// draws from set back to the state the forward started from (the same dropout masks), back-propagates the incoming
// gradient through that recomputed graph (the parameters reached inside accumulate their .grad as without
// checkpointing) and hands the inputs' gradients on. The generators are put back afterwards, so draws after the
// backward do not change. Gradients are bitwise those of the run without checkpointing.

#include <functional>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"

namespace attograd {

/// The generators a checkpointed function draws from (PyTorch's preserve_rng_state, with the generators named).
struct CheckpointOptions {
  /// Generators besides default_generator() the function draws from (e.g. the one given to Module::set_generator);
  /// each must outlive the backward. Duplicates are harmless.
  std::vector<Generator*> generators = {};
  /// Save and restore default_generator() too (true unless the function is known not to draw from it).
  bool preserve_default_generator = true;
};

/// A function checkpoint() runs: the inputs (as given, or detached copies in the recomputation) -> one tensor.
using CheckpointFn = std::function<Tensor(const std::vector<Tensor>& inputs)>;

/// function(inputs), keeping none of its intermediate activations: the backward recomputes them (see the file
/// comment). With grad mode off it is function(inputs). With grad mode on, some input must require grad (else the
/// parameters inside would get no gradient: an Error), and the result must depend on it. The function must be
/// deterministic given the generator states (every generator it draws from listed in `options`), must not change
/// its parameters or inputs in place, and gives gradients only to the tensors in `inputs` and the leaves it reaches
/// itself (a tensor with history captured by the function, not passed in `inputs`, gets none). Nesting is allowed.
Tensor checkpoint(const CheckpointFn& function, const std::vector<Tensor>& inputs,
                  const CheckpointOptions& options = {});

}  // namespace attograd

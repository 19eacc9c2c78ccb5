#pragma once
// Checkpointed(block): a block whose forward runs under gradient checkpointing (autograd/checkpoint.h), so that a
// stack of them keeps only each block's input for the backward, not its activations. The wrapper has the block's
// own parameters, buffers and children under the block's own names (its state_dict keys are the block's), so
// replacing blocks.3 by a Checkpointed of it changes no file, optimizer or name.
//
// Random draws are replayed: the recomputation restores default_generator() and every generator the wrapper knows
// of: the ones passed to the constructor and the one last given to set_generator() (on the wrapper or an ancestor,
// which also points the block at it). A block drawing from any other generator must name it in the constructor.

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/checkpoint.h"
#include "nn/module.h"

namespace attograd::nn {

/// A block whose forward recomputes its activations in the backward instead of keeping them (see the file comment).
template <class Block>
class Checkpointed : public Module {
 public:
  /// Wraps `block` (registering its parameters, buffers and children under their own names); `generators` are the
  /// generators it draws from besides default_generator() (each must outlive the backward passes).
  explicit Checkpointed(std::shared_ptr<Block> block, std::vector<Generator*> generators = {})
      : block(std::move(block)), generators_(std::move(generators)) {
    ATTO_CHECK(this->block != nullptr, "Checkpointed", "block is null");
    for (auto& [n, p] : this->block->named_parameters(false)) register_parameter(n, p, p.requires_grad());
    for (auto& [n, b] : this->block->named_buffers(false)) register_buffer(n, b);
    for (auto& [n, c] : this->block->named_children()) register_module(n, c);
    train(this->block->is_training());
  }
  /// "Checkpointed".
  std::string type_name() const override { return "Checkpointed"; }
  /// block->forward(x), checkpointed when x requires grad (else a plain forward): x and the parameters get the
  /// gradients they would get without it.
  Tensor forward(const Tensor& x) override { return forward_with(x); }
  /// block->forward(x, args...), checkpointed; only x and the parameters get gradients: the other arguments
  /// (masks, options) are kept by value until the backward and must not require grad.
  template <class... Args>
  Tensor forward_with(const Tensor& x, const Args&... args) {
    block->train(is_training());  // the block itself is not in this module's tree
    // Nothing to recompute for (grad mode off), or only parameters need gradients: a plain forward (checkpoint()
    // needs an input that requires grad).
    if (!is_grad_enabled() || !x.requires_grad()) return block->forward(x, args...);
    (check_no_grad(args), ...);
    std::shared_ptr<Block> b = block;
    CheckpointOptions options{.generators = generators_};
    if (gen_ != nullptr) options.generators.push_back(gen_);
    return checkpoint([b, args...](const std::vector<Tensor>& in) { return b->forward(in[0], args...); }, {x}, options);
  }

  std::shared_ptr<Block> block;  ///< the wrapped block (not a child: its children are this module's)

 protected:
  /// Replays `gen` too, and points the block itself at it.
  void set_own_generator(Generator& gen) override {
    gen_ = &gen;
    block->set_generator(gen);
  }

 private:
  // A tensor argument besides x would get no gradient through the checkpoint: refuse one that needs it.
  template <class A>
  static void check_no_grad(const A& a) {
    if constexpr (std::is_same_v<A, Tensor>)
      ATTO_CHECK(!a.defined() || !a.requires_grad(), "Checkpointed",
                 "an argument besides x (shape ", a.shape(), ") requires grad: it would get no gradient; "
                 "checkpoint() the function with it among the inputs instead");
  }

  std::vector<Generator*> generators_;
  Generator* gen_ = nullptr;
};

}  // namespace attograd::nn

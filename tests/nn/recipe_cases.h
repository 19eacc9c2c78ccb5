#pragma once
// Shared by the golden tests of CausalLM's recipes (test_recipe_golden.cpp, float64; test_autocast_golden.cpp,
// float32 under autocast): the architecture of each case of tests/nn/golden_recipe.py, and the model a golden's
// config describes.

#include <cstdint>
#include <memory>
#include <vector>

#include "nn/models.h"
#include "testing.h"

namespace attograd::testing {

/// nanoGPT's model.py: learned positions, GELU, no bias, LayerNorm eps 1e-5, no embedding scale, GPT-2 init, tied
/// head (golden_recipe.py's "nanogpt" case).
inline nn::ArchitectureSpec golden_nanogpt_spec() {
  return {.positions = "learned",
          .activation = "gelu",
          .norm = "layernorm",
          .norm_eps = 1e-5,
          .bias = false,
          .embed_scale = "none",
          .init = "gpt2",
          .head = "tied",
          .recipe = "nanogpt"};
}

/// LLaMA's pieces: RoPE, SwiGLU, RMSNorm eps 1e-6, no bias, no embedding scale (golden_recipe.py's "llama" case).
inline nn::ArchitectureSpec golden_llama_spec() {
  return {.positions = "rope",
          .activation = "swiglu",
          .norm = "rmsnorm",
          .norm_eps = 1e-6,
          .bias = false,
          .embed_scale = "none"};
}

/// The CausalLM of a golden's config [V, D, H, F, layers, max_len] with `arch`, dropout 0, in `dtype` (weights drawn
/// from seed 5; the test loads the golden's).
inline std::unique_ptr<nn::CausalLM> golden_lm(const Golden& g, const nn::ArchitectureSpec& arch, Dtype dtype) {
  const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();
  Generator gen(5);
  return std::make_unique<nn::CausalLM>(nn::CausalLMOptions{.vocab = c[0],
                                                            .d_model = c[1],
                                                            .n_head = c[2],
                                                            .d_ff = c[3],
                                                            .n_layers = c[4],
                                                            .dropout = 0.0,
                                                            .max_len = c[5],
                                                            .dtype = dtype,
                                                            .architecture = arch},
                                        gen);
}

}  // namespace attograd::testing

// Cached decoding of CausalLM under the recipe options (ArchitectureSpec, issue 22): learned positions (the cache
// reads each row's own position rows), no positions, RoPE through positions, SwiGLU and GELU-tanh, RMSNorm, no
// biases, no embedding scale, GPT-2's init and an untied head decode from the cache with the same tokens and logits
// as recomputing, in float32 and float64; and the window crop beyond max_len with learned positions.

#include <memory>
#include <string>
#include <vector>

#include "nn/models.h"
#include "decode_testing.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

std::shared_ptr<CausalLM> make(const ArchitectureSpec& a, Dtype dt, int64_t max_len = 24) {
  Generator gen(11);
  auto m = std::make_shared<CausalLM>(
      CausalLMOptions{.vocab = 13, .d_model = 16, .n_head = 4, .d_ff = 24, .n_layers = 2, .dropout = 0.1,
                      .max_len = max_len, .dtype = dt, .architecture = a},
      gen);
  m->eval();
  return m;
}

const std::vector<ArchitectureSpec> kArchitectures = {
    {.positions = "learned"},
    {.positions = "none"},
    {.positions = "rope", .activation = "swiglu", .norm = "rmsnorm", .bias = false},
    {.activation = "gelu-tanh", .embed_scale = "none", .head = "untied"},
    {.positions = "learned", .activation = "gelu", .norm_eps = 1e-5, .bias = false, .embed_scale = "none",
     .init = "gpt2", .head = "tied", .recipe = "nanogpt"},
};

}  // namespace

TEST(CausalLMRecipeDecode, CachedEqualsRecomputed) {
  for (const ArchitectureSpec& a : kArchitectures)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(a.to_json() + " " + dtype_name(dt));
      auto m = make(a, dt);
      const DecodeTrace cached = run_greedy(*m, kDecodeSources, 12, true);
      EXPECT_GT(cached.cached_steps, 0);
      expect_same_decode(cached, run_greedy(*m, kDecodeSources, 12, false), dt);
    }
}

TEST(CausalLMRecipeDecode, LearnedPositionsCropBeyondMaxLen) {
  // max_len 8: rows run past the table, so the window slides (positions restart at 0 for it), as nanoGPT crops.
  auto m = make({.positions = "learned", .head = "untied"}, kFloat64, 8);
  const DecodeTrace cached = run_greedy(*m, kDecodeSources, 10, true);
  expect_same_decode(cached, run_greedy(*m, kDecodeSources, 10, false), kFloat64);
}

// multi_head_attention and packed_self_attention: the head-interleaved entry points of the fused attention must
// agree bit for bit with splitting the heads and calling scaled_dot_product_attention (dropout masks included), and
// pass gradchecks of their own.

#include <vector>

#include "autograd/attention.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// x (B, L, H * d) -> (B, H, L, d).
Tensor split_heads(const Tensor& x, int64_t H) {
  const int64_t B = x.size(0), L = x.size(1), d = x.size(2) / H;
  return transpose(reshape(x, {B, L, H, d}), 1, 2);
}

// a (B, H, L, d) -> (B, L, H * d).
Tensor merge_heads(const Tensor& a) {
  return reshape(transpose(a, 1, 2), {a.size(0), a.size(2), a.size(1) * a.size(3)});
}

// The reference: split heads, scaled_dot_product_attention, merge heads.
AttentionResult by_heads(const Tensor& q, const Tensor& k, const Tensor& v, int64_t H, AttentionOptions o) {
  AttentionResult r = scaled_dot_product_attention(split_heads(q, H), split_heads(k, H), split_heads(v, H), o);
  return {merge_heads(r.output), r.weights};
}

Tensor bool_tensor(const std::vector<int>& values, const Shape& shape) {
  Tensor t = empty(shape, {.dtype = kBool});
  for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i] != 0;
  return t;
}

}  // namespace

TEST(MultiHeadAttentionOp, MatchesSplitHeadsBitwise) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE("variant " + std::to_string(variant) + " " + dtype_name(dt));
      Generator gen(5 + variant);
      const int64_t B = 2, H = 3, Lq = 37, Lk = variant == 1 ? 37 : 29, dk = 8, dv = variant == 2 ? 5 : 8;
      Tensor q = randn({B, Lq, H * dk}, gen, {.dtype = dt}).requires_grad_();
      Tensor k = randn({B, Lk, H * dk}, gen, {.dtype = dt}).requires_grad_();
      Tensor v = randn({B, Lk, H * dv}, gen, {.dtype = dt}).requires_grad_();
      AttentionOptions o;
      o.need_weights = true;
      if (variant == 1) o.is_causal = true;
      if (variant >= 2) o.dropout_p = 0.25;
      if (variant == 3) {
        std::vector<int> m(B * Lk, 0);
        m[3] = m[Lk + 7] = m[Lk + 8] = 1;
        o.attn_mask = reshape(bool_tensor(m, {B, Lk}), {B, 1, 1, Lk});
      }
      Generator g1(99), g2(99);
      o.generator = &g1;
      AttentionResult a = multi_head_attention(q, k, v, H, o);
      o.generator = &g2;
      Tensor q2 = q.detach().clone().requires_grad_(), k2 = k.detach().clone().requires_grad_(),
             v2 = v.detach().clone().requires_grad_();
      AttentionResult r = by_heads(q2, k2, v2, H, o);
      EXPECT_EQ(a.output.shape(), (Shape{B, Lq, H * dv}));
      EXPECT_TRUE(all_close(a.output, r.output, 0));
      EXPECT_TRUE(all_close(a.weights, r.weights, 0));
      Tensor g = randn(a.output.shape(), gen, {.dtype = dt});
      a.output.backward(g);
      r.output.backward(g);
      EXPECT_TRUE(all_close(q.grad(), q2.grad(), 0));
      EXPECT_TRUE(all_close(k.grad(), k2.grad(), 0));
      EXPECT_TRUE(all_close(v.grad(), v2.grad(), 0));
    }
  }
}

TEST(PackedSelfAttention, MatchesMultiHeadAttentionOpOnTheSlicesBitwise) {
  for (bool dropout : {false, true}) {
    Generator gen(21);
    const int64_t B = 3, L = 40, H = 4, d = 16, E = H * d;
    Tensor qkv = randn({B, L, 3 * E}, gen).requires_grad_();
    AttentionOptions o{.is_causal = true, .dropout_p = dropout ? 0.1 : 0.0};
    Generator g1(5), g2(5);
    o.generator = &g1;
    Tensor out = packed_self_attention(qkv, H, o).output;
    Tensor x = qkv.detach().clone().requires_grad_();
    std::vector<Tensor> parts = split(x, E, 2);
    o.generator = &g2;
    Tensor ref = multi_head_attention(parts[0], parts[1], parts[2], H, o).output;
    EXPECT_EQ(out.shape(), (Shape{B, L, E}));
    EXPECT_TRUE(all_close(out, ref, 0));
    Tensor g = randn(out.shape(), gen);
    out.backward(g);
    ref.backward(g);
    EXPECT_TRUE(all_close(qkv.grad(), x.grad(), 0));
  }
}

TEST(MultiHeadAttentionOp, Gradcheck) {
  Generator gen(31);
  Tensor q = rand_leaf({2, 5, 6}, gen), k = rand_leaf({2, 4, 6}, gen), v = rand_leaf({2, 4, 4}, gen);
  auto f = [&]() { return multi_head_attention(q, k, v, 2).output; };
  EXPECT_GRADCHECK(f, {q, k, v});
  Tensor mask = randn({2, 1, 5, 4}, gen, {.dtype = kFloat64});  // additive
  auto fm = [&]() {
    Generator g(7);
    return multi_head_attention(q, k, v, 2, {.attn_mask = mask, .dropout_p = 0.3, .generator = &g}).output;
  };
  EXPECT_GRADCHECK(fm, {q, k, v});
  auto same = [&]() { return multi_head_attention(q, q, q, 3, {.is_causal = true}).output; };  // one input thrice
  EXPECT_GRADCHECK(same, {q});
}

TEST(PackedSelfAttention, Gradcheck) {
  Generator gen(32);
  Tensor qkv = rand_leaf({2, 6, 12}, gen);  // E = 4, two heads of 2
  auto f = [&]() {
    Generator g(3);
    return packed_self_attention(qkv, 2, {.is_causal = true, .dropout_p = 0.2, .generator = &g}).output;
  };
  EXPECT_GRADCHECK(f, {qkv});
  auto plain = [&]() { return packed_self_attention(qkv, 1).output; };
  EXPECT_GRADCHECK(plain, {qkv});
  Tensor empty_seq = rand_leaf({2, 0, 12}, gen);  // zero-length sequences
  EXPECT_EQ(packed_self_attention(empty_seq, 2).output.shape(), (Shape{2, 0, 4}));
}

TEST(MultiHeadAttentionOp, LongCausalSequencesAcrossManyBlocks) {
  // More query rows than one block and more keys than one packed panel: blocks, panels and edges all line up.
  Generator gen(41);
  const int64_t B = 1, L = 300, H = 2, d = 24;
  Tensor q = randn({B, L, H * d}, gen, {.dtype = kFloat64}), k = randn({B, L, H * d}, gen, {.dtype = kFloat64}),
         v = randn({B, L, H * d}, gen, {.dtype = kFloat64});
  AttentionOptions o{.is_causal = true};
  Tensor a = multi_head_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), H, o).output;
  Tensor r = by_heads(q, k, v, H, o).output;  // float64 reference
  EXPECT_TRUE(all_close(a, r, 1e-5, 1e-4));
}

TEST(MultiHeadAttentionOp, Errors) {
  Tensor q = zeros({2, 3, 8}), k = zeros({2, 4, 8}), v = zeros({2, 4, 8});
  EXPECT_ATTO_ERROR(multi_head_attention(q, k, v, 3), "num_heads = 3 must divide the features");
  EXPECT_ATTO_ERROR(multi_head_attention(q, k, v, 0), "num_heads must be positive, got 0");
  EXPECT_ATTO_ERROR(multi_head_attention(zeros({2, 3, 4, 8}), k, v, 2), "must be 3-D (B, L, H * d)");
  EXPECT_ATTO_ERROR(multi_head_attention(q, zeros({3, 4, 8}), v, 2), "batch sizes differ");
  EXPECT_ATTO_ERROR(multi_head_attention(q, zeros({2, 4, 6}), v, 2), "d_k mismatch");
  EXPECT_ATTO_ERROR(multi_head_attention(q, k, zeros({2, 5, 8}), 2), "Lk mismatch");
  EXPECT_ATTO_ERROR(multi_head_attention(q, k, v, 2, {.attn_mask = zeros({5, 4})}), "does not broadcast to the scores");
  EXPECT_ATTO_ERROR(packed_self_attention(zeros({2, 3, 10}), 2), "(B, L, 3 * E)");
  EXPECT_ATTO_ERROR(packed_self_attention(zeros({2, 3, 12}), 3), "must be positive and divide E = 4");
  EXPECT_ATTO_ERROR(packed_self_attention(zeros({2, 3, 12}, {.dtype = kInt64}), 2), "float32 or float64");
}

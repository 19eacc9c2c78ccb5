#pragma once
// Transformer encoder and decoder layers and their stacks, as PyTorch 1.13's nn.TransformerEncoderLayer,
// nn.TransformerDecoderLayer, nn.TransformerEncoder and nn.TransformerDecoder with batch_first=True:
// the same submodule names and registration order (so named_parameters() is PyTorch's list, in order), the
// same post-LN (norm_first = false) and pre-LN (norm_first = true) residual structure:
//
//   post-LN: x = norm1(x + dropout1(self_attn(x)))            pre-LN: x = x + dropout1(self_attn(norm1(x)))
//            [x = norm2(x + dropout2(multihead_attn(x, mem)))]        [x = x + dropout2(multihead_attn(norm2(x), mem))]
//            x = normN(x + dropoutN(ff(x)))                           x = x + dropoutN(ff(normN(x)))
//   ff(x) = linear2(dropout(activation(linear1(x))))
//
// Masks: Bool TRUE = BLOCKED (PyTorch's nn.Transformer* convention) or float additive; attn masks (Lq, Lk) or
// (B * nhead, Lq, Lk), key padding masks (B, Lk). `is_causal` additionally blocks key j > query i (PyTorch 1.13
// has no such argument: pass the causal mask there). A query whose keys are all blocked attends to nothing (see
// nn/attention.h: zeros where PyTorch 1.13 gives NaN).
//
// Attention weights for visualisation: after set_store_attention(true) a layer keeps the per-head probabilities
// (B, H, Lq, Lk) of its last forward (after attention dropout in training mode, no history); off by default, at
// no cost. Dropout masks come from default_generator() until Module::set_generator() is called; re-seeding that
// generator replays every mask of the layer (dropout modules and attention dropout).
//
// Masks are passed by keyword, with PyTorch's names: layer.forward(src, {.src_key_padding_mask = p}),
// decoder.forward(tgt, memory, {.tgt_mask = m, .memory_key_padding_mask = p}).
//
// Self-attention: the child "self_attn" of both layers is the AttentionLayer (nn/attention_layer.h) that the registry
// builds for options.attention, as CausalLM's blocks build theirs: by default ("mha") PyTorch's MultiheadAttention,
// so the parameter names, their order and the initial draws are PyTorch's; "gqa", "local", "block-sparse" or a
// user's kind through the same interface. The layers call AttentionLayer::forward(x, {key padding mask, is_causal,
// need_weights}); an attn mask (src_mask / tgt_mask), which that interface does not take, goes to a MultiheadAttention
// kind's own forward (Error naming the kind for any other). A kind that cannot give what a call asks for (e.g. a
// causal-only kind without is_causal) is an Error from that kind. The decoder's cross-attention "multihead_attn" stays
// a MultiheadAttention: its queries (tgt) and keys/values (memory) differ, which AttentionLayer (self-attention of one
// x) does not express.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace attograd::nn {

/// Constructor options of the encoder and decoder layers (PyTorch's keyword arguments; batch_first is always on):
/// TransformerEncoderLayer({.d_model = 64, .nhead = 4, .dim_feedforward = 256, .norm_first = true}, gen).
struct TransformerLayerOptions {
  int64_t d_model = 0;              ///< model width E
  int64_t nhead = 0;                ///< attention heads; must divide d_model
  int64_t dim_feedforward = 2048;   ///< hidden size of the feed-forward block
  double dropout = 0.1;             ///< every dropout of the layer, attention probabilities included
  /// "relu", "gelu" (exact) or, beyond PyTorch's, "gelu-tanh" (the tanh approximation) and "swiglu" (LLaMA's gate:
  /// linear2(dropout(silu(linear1 x) * linear3 x)), a third Linear "linear3" (d_model -> dim_feedforward))
  std::string activation = "relu";
  double layer_norm_eps = 1e-5;     ///< eps of every LayerNorm
  bool bias = true;                 ///< biases in every Linear, MultiheadAttention and LayerNorm (PyTorch 2.1's bias)
  std::string norm = "layernorm";   ///< every norm: "layernorm" or, beyond PyTorch's, "rmsnorm" (eps layer_norm_eps)
  bool norm_first = false;          ///< pre-LN (true) or post-LN (false, PyTorch's default)
  Dtype dtype = kFloat32;           ///< parameter dtype (initialised in float32, then converted: see nn/layers.h)
  /// The self-attention's kind and fields (not PyTorch's; default "mha": PyTorch's MultiheadAttention), built by
  /// make_attention with d_model, nhead, dropout, max_len and bias: e.g. {.kind = "gqa", .kv_heads = 2},
  /// {.kind = "local", .window = 4} (without is_causal: keys |i - j| <= window), {.kind = "block-sparse",
  /// .block = 8}. (It replaces the fields num_kv_heads, window and block_size of earlier versions.)
  AttentionSpec attention = {};
  int64_t max_len = 2048;           ///< the longest sequence self_attn sees (RoPE tables with attention.rope)
};
/// Options of TransformerEncoderLayer.
using TransformerEncoderLayerOptions = TransformerLayerOptions;
/// Options of TransformerDecoderLayer.
using TransformerDecoderLayerOptions = TransformerLayerOptions;

/// The masks of TransformerEncoderLayer::forward and TransformerEncoder::forward (PyTorch's keyword arguments;
/// TransformerEncoder calls src_mask `mask`). Bool TRUE = BLOCKED, or float additive; any may be undefined.
struct EncoderForwardOptions {
  Tensor src_mask = {};              ///< (L, L) or (B * nhead, L, L)
  Tensor src_key_padding_mask = {};  ///< (B, L)
  bool is_causal = false;            ///< also block key j > query i
};

/// The masks of TransformerDecoderLayer::forward and TransformerDecoder::forward (PyTorch's keyword arguments).
/// Bool TRUE = BLOCKED, or float additive; any may be undefined.
struct DecoderForwardOptions {
  Tensor tgt_mask = {};                 ///< self-attention, (T, T) or (B * nhead, T, T)
  Tensor memory_mask = {};              ///< cross-attention, (T, S) or (B * nhead, T, S)
  Tensor tgt_key_padding_mask = {};     ///< (B, T)
  Tensor memory_key_padding_mask = {};  ///< (B, S)
  bool tgt_is_causal = false;           ///< also block key j > query i in the self-attention
};

/// torch.nn.TransformerEncoderLayer (batch_first=True). Children, in PyTorch's order: self_attn, linear1,
/// dropout, linear2, norm1, norm2, dropout1, dropout2. Initialisation as PyTorch's modules (drawn from `gen`).
class TransformerEncoderLayer : public Module {
 public:
  /// Builds the layer, drawing initial weights from `gen` (self_attn, linear1, linear2 in that order).
  explicit TransformerEncoderLayer(const TransformerEncoderLayerOptions& options, Generator& gen = default_generator());
  /// "TransformerEncoderLayer".
  std::string type_name() const override { return "TransformerEncoderLayer"; }
  /// src (B, L, d_model) -> (B, L, d_model), no masks.
  Tensor forward(const Tensor& src) override;
  /// src (B, L, d_model) -> (B, L, d_model) with the masks of `masks`.
  Tensor forward(const Tensor& src, const EncoderForwardOptions& masks);
  /// Keeps (true) or stops keeping and drops (false) the attention weights of the last forward.
  void set_store_attention(bool on);
  /// Whether attention weights are kept.
  bool store_attention() const { return store_attention_; }
  /// Self-attention probabilities (B, nhead, L, L) of the last forward; undefined unless stored.
  const Tensor& last_attention() const { return last_attention_; }

  /// The self-attention as its implementation's type (null when it is another): attention<MultiheadAttention>().
  template <class A>
  std::shared_ptr<A> attention() const {
    return std::dynamic_pointer_cast<A>(self_attn);
  }

  const TransformerEncoderLayerOptions options;   ///< the options it was built with
  std::shared_ptr<AttentionLayer> self_attn;      ///< "self_attn": options.attention's kind (default mha)
  std::shared_ptr<Linear> linear1;                ///< d_model -> dim_feedforward
  std::shared_ptr<Dropout> dropout;               ///< inside the feed-forward block
  std::shared_ptr<Linear> linear2;                ///< dim_feedforward -> d_model
  std::shared_ptr<Linear> linear3;                ///< d_model -> dim_feedforward, swiglu's gated half; else null
  std::shared_ptr<Module> norm1;                  ///< around the self-attention block (LayerNorm, or RMSNorm)
  std::shared_ptr<Module> norm2;                  ///< around the feed-forward block (LayerNorm, or RMSNorm)
  std::shared_ptr<Dropout> dropout1;              ///< on the self-attention output
  std::shared_ptr<Dropout> dropout2;              ///< on the feed-forward output

 protected:
  /// "norm_first=False, activation=relu".
  std::string extra_repr() const override;

 private:
  Tensor sa_block(const Tensor& x, const EncoderForwardOptions& masks);
  Tensor ff_block(const Tensor& x);
  bool store_attention_ = false;
  Tensor last_attention_;
};

/// torch.nn.TransformerDecoderLayer (batch_first=True). Children, in PyTorch's order: self_attn, multihead_attn,
/// linear1, dropout, linear2, norm1, norm2, norm3, dropout1, dropout2, dropout3.
class TransformerDecoderLayer : public Module {
 public:
  /// Builds the layer, drawing initial weights from `gen` (self_attn, multihead_attn, linear1, linear2).
  explicit TransformerDecoderLayer(const TransformerDecoderLayerOptions& options, Generator& gen = default_generator());
  /// "TransformerDecoderLayer".
  std::string type_name() const override { return "TransformerDecoderLayer"; }
  /// tgt (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model) with the masks of `masks`.
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderForwardOptions& masks = {});
  using Module::forward;
  /// Keeps (true) or stops keeping and drops (false) the attention weights of the last forward.
  void set_store_attention(bool on);
  /// Whether attention weights are kept.
  bool store_attention() const { return store_attention_; }
  /// Self-attention probabilities (B, nhead, T, T) of the last forward; undefined unless stored.
  const Tensor& last_self_attention() const { return last_self_attention_; }
  /// Cross-attention probabilities (B, nhead, T, S) of the last forward; undefined unless stored.
  const Tensor& last_cross_attention() const { return last_cross_attention_; }

  /// The self-attention as its implementation's type (null when it is another): attention<MultiheadAttention>().
  template <class A>
  std::shared_ptr<A> attention() const {
    return std::dynamic_pointer_cast<A>(self_attn);
  }

  const TransformerDecoderLayerOptions options;        ///< the options it was built with
  std::shared_ptr<AttentionLayer> self_attn;           ///< "self_attn": options.attention's kind (default mha)
  /// "multihead_attn": always a MultiheadAttention (queries tgt, keys/values memory: not a self-attention)
  std::shared_ptr<MultiheadAttention> multihead_attn;
  std::shared_ptr<Linear> linear1;                     ///< d_model -> dim_feedforward
  std::shared_ptr<Dropout> dropout;                    ///< inside the feed-forward block
  std::shared_ptr<Linear> linear2;                     ///< dim_feedforward -> d_model
  std::shared_ptr<Linear> linear3;                     ///< d_model -> dim_feedforward, swiglu's gated half; else null
  std::shared_ptr<Module> norm1;                       ///< around the self-attention block (LayerNorm, or RMSNorm)
  std::shared_ptr<Module> norm2;                       ///< around the cross-attention block (LayerNorm, or RMSNorm)
  std::shared_ptr<Module> norm3;                       ///< around the feed-forward block (LayerNorm, or RMSNorm)
  std::shared_ptr<Dropout> dropout1;                   ///< on the self-attention output
  std::shared_ptr<Dropout> dropout2;                   ///< on the cross-attention output
  std::shared_ptr<Dropout> dropout3;                   ///< on the feed-forward output

 protected:
  /// "norm_first=False, activation=relu".
  std::string extra_repr() const override;

 private:
  Tensor ff_block(const Tensor& x);
  bool store_attention_ = false;
  Tensor last_self_attention_;
  Tensor last_cross_attention_;
};

/// torch.nn.TransformerEncoder: num_layers encoder layers ("layers.0", "layers.1", ... in the ModuleList
/// "layers") and an optional final LayerNorm "norm". Unlike PyTorch (which deep-copies one layer, so that all
/// start equal), each layer draws its own initial weights from `gen`.
class TransformerEncoder : public Module {
 public:
  /// num_layers layers built from `layer`; final_norm adds LayerNorm(d_model, layer.layer_norm_eps) as "norm".
  TransformerEncoder(const TransformerEncoderLayerOptions& layer, int64_t num_layers, bool final_norm = false,
                     Generator& gen = default_generator());
  /// "TransformerEncoder".
  std::string type_name() const override { return "TransformerEncoder"; }
  /// src (B, L, d_model) -> (B, L, d_model), no masks.
  Tensor forward(const Tensor& src) override;
  /// Every layer with the same masks (as TransformerEncoderLayer::forward), then the final norm if any.
  Tensor forward(const Tensor& src, const EncoderForwardOptions& masks);
  /// Number of layers.
  int64_t num_layers() const { return static_cast<int64_t>(layers->size()); }
  /// Layer i (negative counts from the end).
  std::shared_ptr<TransformerEncoderLayer> layer(int64_t i) const { return layers->at<TransformerEncoderLayer>(i); }
  /// set_store_attention(on) on every layer.
  void set_store_attention(bool on);
  /// Each layer's last self-attention probabilities (B, nhead, L, L) (undefined unless stored).
  std::vector<Tensor> attention_weights() const;

  std::shared_ptr<ModuleList> layers;  ///< "layers"
  std::shared_ptr<Module> norm;        ///< "norm" (the layers' norm kind), or null
};

/// torch.nn.TransformerDecoder: num_layers decoder layers ("layers.0", ...) and an optional final LayerNorm
/// "norm". Each layer draws its own initial weights from `gen`.
class TransformerDecoder : public Module {
 public:
  /// num_layers layers built from `layer`; final_norm adds LayerNorm(d_model, layer.layer_norm_eps) as "norm".
  TransformerDecoder(const TransformerDecoderLayerOptions& layer, int64_t num_layers, bool final_norm = false,
                     Generator& gen = default_generator());
  /// "TransformerDecoder".
  std::string type_name() const override { return "TransformerDecoder"; }
  /// Every layer with the same memory and masks (as TransformerDecoderLayer::forward), then the final norm.
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderForwardOptions& masks = {});
  using Module::forward;
  /// Number of layers.
  int64_t num_layers() const { return static_cast<int64_t>(layers->size()); }
  /// Layer i (negative counts from the end).
  std::shared_ptr<TransformerDecoderLayer> layer(int64_t i) const { return layers->at<TransformerDecoderLayer>(i); }
  /// set_store_attention(on) on every layer.
  void set_store_attention(bool on);
  /// Each layer's last self-attention probabilities (B, nhead, T, T) (undefined unless stored).
  std::vector<Tensor> self_attention_weights() const;
  /// Each layer's last cross-attention probabilities (B, nhead, T, S) (undefined unless stored).
  std::vector<Tensor> cross_attention_weights() const;

  std::shared_ptr<ModuleList> layers;  ///< "layers"
  std::shared_ptr<Module> norm;        ///< "norm" (the layers' norm kind), or null
};

}  // namespace attograd::nn

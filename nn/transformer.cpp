#include "nn/transformer.h"

#include "autograd/activation.h"
#include "nn/mla.h"

namespace attograd::nn {

namespace {

void check_options(const TransformerLayerOptions& o, const char* me) {
  ATTO_CHECK(o.d_model > 0 && o.nhead > 0 && o.dim_feedforward > 0, me,
             "d_model, nhead and dim_feedforward must be positive, got d_model=", o.d_model, ", nhead=", o.nhead,
             ", dim_feedforward=", o.dim_feedforward);
  ATTO_CHECK(o.d_model % o.nhead == 0, me, "d_model must be divisible by nhead, got d_model=", o.d_model,
             ", nhead=", o.nhead);
  ATTO_CHECK(o.activation == "relu" || o.activation == "gelu" || o.activation == "gelu-tanh" || o.activation == "swiglu",
             me, "activation must be 'relu', 'gelu', 'gelu-tanh' or 'swiglu', got '", o.activation, "'");
  ATTO_CHECK(o.norm == "layernorm" || o.norm == "rmsnorm", me, "norm must be 'layernorm' or 'rmsnorm', got '", o.norm,
             "'");
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  ATTO_CHECK(o.layer_norm_eps > 0.0, me, "layer_norm_eps must be positive, got ", o.layer_norm_eps);
}

// x must be (B, L, d_model).
void check_input(const Tensor& x, int64_t d_model, const char* me, const char* what) {
  ATTO_CHECK(x.defined(), me, what, " is undefined");
  ATTO_CHECK(x.dim() == 3 && x.size(2) == d_model, me, "expected batch-first ", what,
             " of shape (B, L, d_model=", d_model, "), got shape ", x.shape());
}

// The feed-forward block's hidden activation of x (B, L, D) -> (B, L, F): act(linear1 x), or silu(linear1 x) *
// linear3 x for swiglu.
Tensor hidden(const Tensor& x, Linear& linear1, Linear* linear3, const std::string& activation) {
  Tensor h = linear1.forward(x);
  if (activation == "swiglu") return h * sigmoid(h) * linear3->forward(x);
  if (activation == "relu") return relu(h);
  return gelu(h, activation == "gelu-tanh" ? "tanh" : "none");
}

// A layer's norm over d features: LayerNorm (with a bias when o.bias) or RMSNorm, eps layer_norm_eps.
std::shared_ptr<Module> layer_norm_module(const TransformerLayerOptions& o, int64_t d) {
  if (o.norm == "rmsnorm") return std::make_shared<RMSNorm>(d, o.layer_norm_eps);
  return std::make_shared<LayerNorm>(d, LayerNormOptions{.eps = o.layer_norm_eps, .bias = o.bias});
}

// linear3 of swiglu, drawn after linear1 (null otherwise).
std::shared_ptr<Linear> gate_linear(const TransformerLayerOptions& o, Generator& gen) {
  return o.activation == "swiglu" ? std::make_shared<Linear>(o.d_model, o.dim_feedforward, o.bias, gen) : nullptr;
}

std::string layer_repr(const TransformerLayerOptions& o) {
  return str_cat("d_model=", o.d_model, ", nhead=", o.nhead, ", dim_feedforward=", o.dim_feedforward,
             ", norm_first=", o.norm_first ? "True" : "False", ", activation=", o.activation,
             o.bias ? "" : ", bias=False", o.norm == "layernorm" ? "" : ", norm=" + o.norm,
             o.attention == AttentionSpec{} ? std::string()
                                            : ", attention=" + o.attention.kind + attention_fields_words(o.attention));
}

// The layer's self-attention: options.attention's kind from the registry, drawn from `gen` (PyTorch's
// MultiheadAttention for the default "mha").
std::shared_ptr<AttentionLayer> self_attention(const TransformerLayerOptions& o, Generator& gen) {
  return make_attention(o.attention,
                        {.d_model = o.d_model, .heads = o.nhead, .dropout = o.dropout, .max_len = o.max_len,
                         .bias = o.bias},
                        gen);
}

// Self-attention of x (B, L, D) through the AttentionLayer interface; an attn mask (which the interface does not take)
// through a MultiheadAttention kind's own forward, with the same options otherwise.
AttentionOutput attend(AttentionLayer& a, const Tensor& x, const Tensor& attn_mask, const Tensor& key_padding_mask,
                       bool is_causal, bool need_weights, const char* me, const char* mask_name) {
  if (!attn_mask.defined())
    return a.forward(x, {.key_padding_mask = key_padding_mask, .is_causal = is_causal, .need_weights = need_weights});
  auto* mha = dynamic_cast<MultiheadAttention*>(&a);
  ATTO_CHECK(mha != nullptr, me, "attention ", a.kind(), " takes no attn mask (", mask_name,
             "): only a kind that is a MultiheadAttention (mha, gqa, local, block-sparse, ...) does; use the key "
             "padding mask and is_causal");
  MhaResult r = mha->forward(x, x, x,
                             {.key_padding_mask = key_padding_mask,
                              .attn_mask = attn_mask,
                              .need_weights = need_weights,
                              .average_attn_weights = false,
                              .is_causal = is_causal});
  return {.output = std::move(r.output), .weights = std::move(r.weights)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TransformerEncoderLayer

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerEncoderLayerOptions& opts, Generator& gen)
    : options(opts) {
  check_options(options, "TransformerEncoderLayer");
  const int64_t D = options.d_model, F = options.dim_feedforward;
  const double p = options.dropout;
  self_attn = register_module("self_attn", self_attention(options, gen));
  linear1 = register_module("linear1", std::make_shared<Linear>(D, F, options.bias, gen));
  if (auto l3 = gate_linear(options, gen)) linear3 = register_module("linear3", l3);
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  linear2 = register_module("linear2", std::make_shared<Linear>(F, D, options.bias, gen));
  norm1 = register_module("norm1", layer_norm_module(options, D));
  norm2 = register_module("norm2", layer_norm_module(options, D));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return forward(src, EncoderForwardOptions{}); }

// The self-attention block without its residual: dropout1(self_attn(x, x, x)).
Tensor TransformerEncoderLayer::sa_block(const Tensor& x, const EncoderForwardOptions& masks) {
  AttentionOutput r = attend(*self_attn, x, masks.src_mask, masks.src_key_padding_mask, masks.is_causal,
                             store_attention_, "TransformerEncoderLayer", "src_mask");
  if (store_attention_) last_attention_ = r.weights;  // (B, H, L, L); undefined for a kind without weights
  return dropout1->forward(r.output);
}

// The feed-forward block without its residual: dropout2(linear2(dropout(activation(linear1(x))))).
Tensor TransformerEncoderLayer::ff_block(const Tensor& x) {
  Tensor h = hidden(x, *linear1, linear3.get(), options.activation);  // (B, L, F)
  return dropout2->forward(linear2->forward(dropout->forward(h)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const EncoderForwardOptions& masks) {
  check_input(src, options.d_model, "TransformerEncoderLayer", "src");
  Tensor x = src;  // (B, L, D)
  if (options.norm_first) {
    x = x + sa_block(norm1->forward(x), masks);
    x = x + ff_block(norm2->forward(x));
  } else {
    x = norm1->forward(x + sa_block(x, masks));
    x = norm2->forward(x + ff_block(x));
  }
  return x;
}

void TransformerEncoderLayer::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) last_attention_ = Tensor();
}

std::string TransformerEncoderLayer::extra_repr() const { return layer_repr(options); }

// ---------------------------------------------------------------------------------------------
// TransformerDecoderLayer

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerDecoderLayerOptions& opts, Generator& gen)
    : options(opts) {
  check_options(options, "TransformerDecoderLayer");
  const int64_t D = options.d_model, F = options.dim_feedforward;
  const double p = options.dropout;
  const MultiheadAttentionOptions mha{.embed_dim = D, .num_heads = options.nhead, .dropout = p, .bias = options.bias};
  self_attn = register_module("self_attn", self_attention(options, gen));
  multihead_attn = register_module("multihead_attn", std::make_shared<MultiheadAttention>(mha, gen));
  linear1 = register_module("linear1", std::make_shared<Linear>(D, F, options.bias, gen));
  if (auto l3 = gate_linear(options, gen)) linear3 = register_module("linear3", l3);
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
  linear2 = register_module("linear2", std::make_shared<Linear>(F, D, options.bias, gen));
  norm1 = register_module("norm1", layer_norm_module(options, D));
  norm2 = register_module("norm2", layer_norm_module(options, D));
  norm3 = register_module("norm3", layer_norm_module(options, D));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(p));
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

// The feed-forward block without its residual: dropout3(linear2(dropout(activation(linear1(x))))).
Tensor TransformerDecoderLayer::ff_block(const Tensor& x) {
  Tensor h = hidden(x, *linear1, linear3.get(), options.activation);  // (B, T, F)
  return dropout3->forward(linear2->forward(dropout->forward(h)));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory, const DecoderForwardOptions& masks) {
  const char* me = "TransformerDecoderLayer";
  check_input(tgt, options.d_model, me, "tgt");
  check_input(memory, options.d_model, me, "memory");
  ATTO_CHECK(tgt.size(0) == memory.size(0), me, "batch sizes differ: tgt ", tgt.shape(), ", memory ", memory.shape());
  const bool store = store_attention_;
  // Self-attention block: dropout1(self_attn(x, x, x)).
  auto sa_block = [&](const Tensor& x) {
    AttentionOutput r = attend(*self_attn, x, masks.tgt_mask, masks.tgt_key_padding_mask, masks.tgt_is_causal, store,
                               me, "tgt_mask");
    if (store) last_self_attention_ = r.weights;  // (B, H, T, T); undefined for a kind without weights
    return dropout1->forward(r.output);
  };
  // Cross-attention block: dropout2(multihead_attn(x, memory, memory)).
  auto mha_block = [&](const Tensor& x) {
    MhaResult r = multihead_attn->forward(x, memory, memory,
                                          {.key_padding_mask = masks.memory_key_padding_mask,
                                           .attn_mask = masks.memory_mask,
                                           .need_weights = store,
                                           .average_attn_weights = false});
    if (store) last_cross_attention_ = r.weights;  // (B, H, T, S)
    return dropout2->forward(r.output);
  };
  Tensor x = tgt;  // (B, T, D)
  if (options.norm_first) {
    x = x + sa_block(norm1->forward(x));
    x = x + mha_block(norm2->forward(x));
    x = x + ff_block(norm3->forward(x));
  } else {
    x = norm1->forward(x + sa_block(x));
    x = norm2->forward(x + mha_block(x));
    x = norm3->forward(x + ff_block(x));
  }
  return x;
}

void TransformerDecoderLayer::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) {
    last_self_attention_ = Tensor();
    last_cross_attention_ = Tensor();
  }
}

std::string TransformerDecoderLayer::extra_repr() const { return layer_repr(options); }

// ---------------------------------------------------------------------------------------------
// TransformerEncoder / TransformerDecoder

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayerOptions& layer_options, int64_t n, bool final_norm,
                                       Generator& gen) {
  ATTO_CHECK(n >= 0, "TransformerEncoder", "num_layers must be non-negative, got ", n);
  check_options(layer_options, "TransformerEncoder");
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n; ++i) layers->push_back(std::make_shared<TransformerEncoderLayer>(layer_options, gen));
  if (final_norm)
    norm = register_module("norm", layer_norm_module(layer_options, layer_options.d_model));
  to(layer_options.dtype);  // the final norm (the layers are already in it)
}

Tensor TransformerEncoder::forward(const Tensor& src) { return forward(src, EncoderForwardOptions{}); }

Tensor TransformerEncoder::forward(const Tensor& src, const EncoderForwardOptions& masks) {
  ATTO_CHECK(src.defined(), type_name(), "src is undefined");
  Tensor x = src;  // (B, L, D)
  for (const auto& m : *layers) x = static_cast<TransformerEncoderLayer&>(*m).forward(x, masks);
  return norm ? norm->forward(x) : x;
}

void TransformerEncoder::set_store_attention(bool on) {
  for (const auto& m : *layers) static_cast<TransformerEncoderLayer&>(*m).set_store_attention(on);
}

std::vector<Tensor> TransformerEncoder::attention_weights() const {
  std::vector<Tensor> out;
  for (const auto& m : *layers) out.push_back(static_cast<TransformerEncoderLayer&>(*m).last_attention());
  return out;
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayerOptions& layer_options, int64_t n, bool final_norm,
                                       Generator& gen) {
  ATTO_CHECK(n >= 0, "TransformerDecoder", "num_layers must be non-negative, got ", n);
  check_options(layer_options, "TransformerDecoder");
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < n; ++i) layers->push_back(std::make_shared<TransformerDecoderLayer>(layer_options, gen));
  if (final_norm)
    norm = register_module("norm", layer_norm_module(layer_options, layer_options.d_model));
  to(layer_options.dtype);  // the final norm (the layers are already in it)
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory, const DecoderForwardOptions& masks) {
  ATTO_CHECK(tgt.defined() && memory.defined(), type_name(), "tgt and memory must be defined");
  Tensor x = tgt;  // (B, T, D)
  for (const auto& m : *layers) x = static_cast<TransformerDecoderLayer&>(*m).forward(x, memory, masks);
  return norm ? norm->forward(x) : x;
}

void TransformerDecoder::set_store_attention(bool on) {
  for (const auto& m : *layers) static_cast<TransformerDecoderLayer&>(*m).set_store_attention(on);
}

std::vector<Tensor> TransformerDecoder::self_attention_weights() const {
  std::vector<Tensor> out;
  for (const auto& m : *layers) out.push_back(static_cast<TransformerDecoderLayer&>(*m).last_self_attention());
  return out;
}

std::vector<Tensor> TransformerDecoder::cross_attention_weights() const {
  std::vector<Tensor> out;
  for (const auto& m : *layers) out.push_back(static_cast<TransformerDecoderLayer&>(*m).last_cross_attention());
  return out;
}

}  // namespace attograd::nn

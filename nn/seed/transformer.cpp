// The seed's encoder-decoder Transformer (jadore801120/attention-is-all-you-need-pytorch, transformer/Layers.py and
// transformer/Models.py): see nn/seed/transformer.h.
#include "nn/seed/transformer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/matmul.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/model_helpers.h"

namespace attograd::nn::seed {

using detail::AttentionScope;
using detail::check_tokens;
using detail::py_bool;
using detail::row_tensor;

// ---------------------------------------------------------------------------------------------
// The seed's layers

namespace {

// A layer's self-attention: the seed's sublayer as the AttentionLayer of the kind "seed-mha"
// (nn/attention/seed_mha.cpp), from the registry, drawn from `gen` exactly as the sublayer's constructor draws.
std::shared_ptr<AttentionLayer> self_attention(int64_t d_model, int64_t n_head, int64_t d_k, int64_t d_v, double p,
                                               Generator& gen, const AttentionSublayerVariants& v, int64_t pad) {
  const nlohmann::json options{{"d_k", d_k}, {"d_v", d_v}, {"pad", pad}};
  const AttentionSpec spec{
      .kind = "seed-mha", .kv_heads = v.n_kv_head, .window = v.window, .block = v.block_size, .options = options.dump()};
  return make_attention(spec, {.d_model = d_model, .heads = n_head, .dropout = p, .bias = false}, gen);
}

// The seed's sublayer behind an AttentionLayer, for what the interface does not take (a general mask, raw caches).
AttentionSublayer& sublayer(AttentionLayer& a, const char* me) {
  auto* s = dynamic_cast<AttentionSublayer*>(&a);
  ATTO_CHECK(s != nullptr, me, "a self-attention mask or a raw key/value cache needs slf_attn to be the seed's ",
             "AttentionSublayer, got ", a.type_name(), " (pass an AttentionCall, or a cache from make_cache)");
  return *s;
}

}  // namespace

EncoderLayer::EncoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double p,
                           Generator& gen, const AttentionSublayerVariants& variants) {
  slf_attn = register_module("slf_attn", self_attention(d_model, n_head, d_k, d_v, p, gen, variants, -1));
  pos_ffn =
      register_module("pos_ffn", std::make_shared<PositionwiseFeedForward>(
                                     d_model, d_inner, FeedForwardOptions{.dropout = p, .residual_norm = true}, gen));
}

Tensor EncoderLayer::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& slf_attn_mask) {
  if (!slf_attn_mask.defined()) return forward(x, AttentionCall{.is_causal = false});
  AttentionSublayerResult a = sublayer(*slf_attn, "EncoderLayer")
                                  .forward(x, x, x, slf_attn_mask, store_attention_, track_entropy_);
  return finish({.output = std::move(a.output), .weights = std::move(a.attn), .entropy = std::move(a.entropy)});
}

Tensor EncoderLayer::forward(const Tensor& x, const AttentionCall& call) {
  AttentionCall c = call;
  c.need_weights = store_attention_;
  c.need_entropy = track_entropy_;
  return finish(slf_attn->forward(x, c));
}

Tensor EncoderLayer::finish(AttentionOutput a) {
  if (store_attention_) last_attention_ = a.weights;  // (B, H, S, S)
  if (track_entropy_) last_entropy_ = a.entropy;      // (B, H, S)
  return pos_ffn->forward(a.output);                  // (B, S, D)
}

void EncoderLayer::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) last_attention_ = Tensor();
}

void EncoderLayer::set_track_entropy(bool on) {
  track_entropy_ = on;
  if (!on) last_entropy_ = Tensor();
}

DecoderLayer::DecoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double p,
                           Generator& gen, const AttentionSublayerVariants& variants, int64_t pad_idx) {
  slf_attn = register_module("slf_attn", self_attention(d_model, n_head, d_k, d_v, p, gen, variants, pad_idx));
  enc_attn = register_module(
      "enc_attn", std::make_shared<AttentionSublayer>(n_head, d_model, d_k, d_v, p, gen, kFloat32, variants));
  pos_ffn =
      register_module("pos_ffn", std::make_shared<PositionwiseFeedForward>(
                                     d_model, d_inner, FeedForwardOptions{.dropout = p, .residual_norm = true}, gen));
}

Tensor DecoderLayer::forward(const Tensor& dec_input, const Tensor& enc_output, const Tensor& slf_attn_mask,
                             const Tensor& dec_enc_attn_mask) {
  return forward_memory(dec_input, enc_output, enc_output, slf_attn_mask, dec_enc_attn_mask);
}

Tensor DecoderLayer::forward(const Tensor& dec_input, const Tensor& enc_output, const AttentionCall& self_call,
                             const Tensor& dec_enc_attn_mask) {
  return forward_memory(dec_input, enc_output, enc_output, self_call, dec_enc_attn_mask);
}

Tensor DecoderLayer::forward_memory(const Tensor& dec_input, const Tensor& memory_k, const Tensor& memory_v,
                                    const Tensor& slf_attn_mask, const Tensor& dec_enc_attn_mask) {
  if (!slf_attn_mask.defined())
    return forward_memory(dec_input, memory_k, memory_v, AttentionCall{.is_causal = false}, dec_enc_attn_mask);
  AttentionSublayerResult a = sublayer(*slf_attn, "DecoderLayer")
                                  .forward(dec_input, dec_input, dec_input, slf_attn_mask, store_attention_,
                                           track_entropy_);  // (B, T, D)
  return finish({.output = std::move(a.output), .weights = std::move(a.attn), .entropy = std::move(a.entropy)},
                memory_k, memory_v, dec_enc_attn_mask);
}

Tensor DecoderLayer::forward_memory(const Tensor& dec_input, const Tensor& memory_k, const Tensor& memory_v,
                                    const AttentionCall& self_call, const Tensor& dec_enc_attn_mask) {
  AttentionCall call = self_call;
  call.need_weights = store_attention_;
  call.need_entropy = track_entropy_;
  return finish(slf_attn->forward(dec_input, call), memory_k, memory_v, dec_enc_attn_mask);  // (B, T, D)
}

Tensor DecoderLayer::finish(AttentionOutput a, const Tensor& memory_k, const Tensor& memory_v,
                            const Tensor& dec_enc_attn_mask) {
  const bool store = store_attention_, ent = track_entropy_;
  AttentionSublayerResult c = enc_attn->forward(a.output, memory_k, memory_v, dec_enc_attn_mask, store, ent);
  if (store) {
    last_self_attention_ = a.weights;  // (B, H, T, T)
    last_cross_attention_ = c.attn;    // (B, H, T, S)
  }
  if (ent) {
    last_self_entropy_ = a.entropy;   // (B, H, T)
    last_cross_entropy_ = c.entropy;  // (B, H, T)
  }
  return pos_ffn->forward(c.output);
}

void DecoderLayer::set_track_entropy(bool on) {
  track_entropy_ = on;
  if (!on) {
    last_self_entropy_ = Tensor();
    last_cross_entropy_ = Tensor();
  }
}

Tensor DecoderLayer::forward_cached(const Tensor& x, KVCache& self_cache, KVCache& cross_cache,
                                    const CachedAttentionRows& rows,
                                    const std::vector<std::vector<int64_t>>& target_tokens,
                                    const std::vector<std::vector<int64_t>>& sources, int64_t pad) {
  Tensor a = self_cache.layer != nullptr
                 ? slf_attn->forward_cached(x, *self_cache.layer, rows)
                 : sublayer(*slf_attn, "DecoderLayer::forward_cached")
                       .forward_cached(x, x, self_cache.key, self_cache.value, rows, true, &target_tokens, pad);
  Tensor c = enc_attn->forward_cached(a, Tensor(), cross_cache.key, cross_cache.value, rows, false, &sources, pad);
  return decode_feed_forward(*pos_ffn, c);  // (A, N, D)
}

void DecoderLayer::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) {
    last_self_attention_ = Tensor();
    last_cross_attention_ = Tensor();
  }
}

// ---------------------------------------------------------------------------------------------
// The seed's Encoder, Decoder and Transformer

Encoder::Encoder(const TransformerOptions& o, Generator& gen, std::shared_ptr<Embedding> word_emb)
    : scale_(o.tie_output && o.scale_embedding ? std::sqrt(static_cast<double>(o.d_model)) : 1.0),
      checkpoint_(o.checkpoint) {
  src_word_emb = register_module(
      "src_word_emb", word_emb ? word_emb : std::make_shared<Embedding>(o.src_vocab, o.d_model, o.pad_idx, gen));
  position_enc =
      register_module("position_enc", std::make_shared<PositionalEncoding>(o.d_model, o.n_position, o.dropout));
  layer_stack = register_module("layer_stack", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i)
    layer_stack->push_back(
        std::make_shared<EncoderLayer>(o.d_model, o.d_inner, o.n_head, o.d_k, o.d_v, o.dropout, gen,
                                       AttentionSublayerVariants{
                                           .n_kv_head = o.n_kv_head, .window = o.enc_window, .block_size = o.enc_block}));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(o.d_model, 1e-6));
}

Tensor Encoder::forward(const Tensor& src_seq, const Tensor& src_mask) {
  return run(src_seq, [src_mask](EncoderLayer& l, const Tensor& x) { return l.forward(x, src_mask); });
}

Tensor Encoder::forward(const Tensor& src_seq, const AttentionCall& call) {
  return run(src_seq, [call](EncoderLayer& l, const Tensor& x) { return l.forward(x, call); });
}

Tensor Encoder::run(const Tensor& src_seq, const std::function<Tensor(EncoderLayer&, const Tensor&)>& forward_layer) {
  Tensor x = src_word_emb->forward(src_seq);  // (B, S, D)
  if (scale_ != 1.0) x = x * scale_;
  x = layer_norm->forward(position_enc->forward(x));
  const auto n = static_cast<int64_t>(layer_stack->size());
  for (int64_t i = 0; i < n; ++i) {
    std::shared_ptr<EncoderLayer> layer = layer_stack->at<EncoderLayer>(i);
    // Checkpointing: every layer but the last recomputes its activations in the backward (dropout replayed from
    // default_generator() and the generator given to set_generator()).
    if (checkpoint_ && i + 1 < n && is_grad_enabled() && x.requires_grad()) {
      CheckpointOptions co;
      if (generator_ != nullptr) co.generators.push_back(generator_);
      if (!layer->track_entropy_) {
        x = checkpoint([layer, forward_layer](const std::vector<Tensor>& in) { return forward_layer(*layer, in[0]); },
                       {x}, co);
        continue;
      }
      // Entropy tracking: [output | entropies] flattened into one result, so that the entropies keep their history.
      const int64_t B = x.size(0), S = x.size(1), D = x.size(2), H = layer->slf_attn->config().heads;
      Tensor packed = checkpoint(
          [layer, forward_layer](const std::vector<Tensor>& in) {
            Tensor y = forward_layer(*layer, in[0]);  // (B, S, D)
            return cat({reshape(y, {-1}), reshape(layer->last_entropy(), {-1})}, 0);
          },
          {x}, co);
      std::vector<Tensor> parts = split(packed, {B * S * D, B * H * S}, 0);
      layer->last_entropy_ = reshape(parts[1], {B, H, S});  // (B, H, S)
      x = reshape(parts[0], {B, S, D});
    } else {
      x = forward_layer(*layer, x);
    }
  }
  return x;
}

Decoder::Decoder(const TransformerOptions& o, Generator& gen, std::shared_ptr<Embedding> word_emb)
    : scale_(o.tie_output && o.scale_embedding ? std::sqrt(static_cast<double>(o.d_model)) : 1.0),
      checkpoint_(o.checkpoint) {
  trg_word_emb = register_module(
      "trg_word_emb", word_emb ? word_emb : std::make_shared<Embedding>(o.tgt_vocab, o.d_model, o.pad_idx, gen));
  position_enc =
      register_module("position_enc", std::make_shared<PositionalEncoding>(o.d_model, o.n_position, o.dropout));
  layer_stack = register_module("layer_stack", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i)
    layer_stack->push_back(
        std::make_shared<DecoderLayer>(o.d_model, o.d_inner, o.n_head, o.d_k, o.d_v, o.dropout, gen,
                                       AttentionSublayerVariants{.n_kv_head = o.n_kv_head}, o.pad_idx));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(o.d_model, 1e-6));
}

Tensor Decoder::forward(const Tensor& trg_seq, const Tensor& trg_mask, const Tensor& enc_output,
                        const Tensor& src_mask) {
  return run(trg_seq, enc_output,
             [trg_mask, src_mask](DecoderLayer& l, const Tensor& x, const Tensor& mk, const Tensor& mv) {
               return l.forward_memory(x, mk, mv, trg_mask, src_mask);
             });
}

Tensor Decoder::forward(const Tensor& trg_seq, const AttentionCall& self_call, const Tensor& enc_output,
                        const Tensor& src_mask) {
  return run(trg_seq, enc_output,
             [self_call, src_mask](DecoderLayer& l, const Tensor& x, const Tensor& mk, const Tensor& mv) {
               return l.forward_memory(x, mk, mv, self_call, src_mask);
             });
}

Tensor Decoder::run(const Tensor& trg_seq, const Tensor& enc_output, const LayerForward& forward_layer) {
  Tensor x = trg_word_emb->forward(trg_seq);  // (B, T, D)
  if (scale_ != 1.0) x = x * scale_;
  x = layer_norm->forward(position_enc->forward(x));
  const auto n = static_cast<int64_t>(layer_stack->size());
  for (int64_t i = 0; i < n; ++i) {
    std::shared_ptr<DecoderLayer> layer = layer_stack->at<DecoderLayer>(i);
    // Checkpointing as the encoder's. The encoder output is an input too, given twice (the cross-attention's
    // values, then its keys: the order in which the plain backward adds their terms), so that its gradient gets
    // each layer's two terms one by one as without checkpointing, not pre-summed per layer (another rounding).
    if (checkpoint_ && i + 1 < n && is_grad_enabled() && (x.requires_grad() || enc_output.requires_grad())) {
      CheckpointOptions co;
      if (generator_ != nullptr) co.generators.push_back(generator_);
      if (!layer->track_entropy_) {
        x = checkpoint(
            [layer, forward_layer](const std::vector<Tensor>& in) {
              return forward_layer(*layer, in[0], in[2], in[1]);
            },
            {x, enc_output, enc_output}, co);
        continue;
      }
      // Entropy tracking: [output | self entropies | cross entropies] flattened into one result (their history).
      const int64_t B = x.size(0), T = x.size(1), D = x.size(2), H = layer->slf_attn->config().heads;
      Tensor packed = checkpoint(
          [layer, forward_layer](const std::vector<Tensor>& in) {
            Tensor y = forward_layer(*layer, in[0], in[2], in[1]);  // (B, T, D)
            return cat({reshape(y, {-1}), reshape(layer->last_self_entropy(), {-1}),
                        reshape(layer->last_cross_entropy(), {-1})},
                       0);
          },
          {x, enc_output, enc_output}, co);
      std::vector<Tensor> parts = split(packed, {B * T * D, B * H * T, B * H * T}, 0);
      layer->last_self_entropy_ = reshape(parts[1], {B, H, T});   // (B, H, T)
      layer->last_cross_entropy_ = reshape(parts[2], {B, H, T});  // (B, H, T)
      x = reshape(parts[0], {B, T, D});
    } else {
      x = forward_layer(*layer, x, enc_output, enc_output);
    }
  }
  return x;
}

Transformer::Transformer(const TransformerOptions& o, Generator& gen) : options(o) {
  spec_ = {.vocab = std::max(o.src_vocab, o.tgt_vocab),
           .layers = o.n_layers,
           .d_model = o.d_model,
           .heads = o.n_head,
           .d_ff = o.d_inner,
           .dropout = o.dropout,
           .max_source_len = o.n_position,
           .max_target_len = o.n_position - 1,
           .specials = {.pad = o.pad_idx}};
  const char* me = "Transformer";
  ATTO_CHECK(o.src_vocab > 0 && o.tgt_vocab > 0, me,
             "src_vocab and tgt_vocab must be positive, got src_vocab=", o.src_vocab, ", tgt_vocab=", o.tgt_vocab);
  ATTO_CHECK(o.d_model > 0 && o.n_head > 0 && o.d_k > 0 && o.d_v > 0 && o.d_inner > 0, me,
             "d_model, n_head, d_k, d_v and d_inner must be positive, got d_model=", o.d_model, ", n_head=", o.n_head,
             ", d_k=", o.d_k, ", d_v=", o.d_v, ", d_inner=", o.d_inner);
  ATTO_CHECK(o.n_layers >= 0 && o.n_position > 0, me,
             "n_layers must be non-negative and n_position positive, got n_layers=", o.n_layers,
             ", n_position=", o.n_position);
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  ATTO_CHECK(o.pad_idx < o.src_vocab && o.pad_idx < o.tgt_vocab, me, "pad_idx ", o.pad_idx,
             " must be below src_vocab=", o.src_vocab, " and tgt_vocab=", o.tgt_vocab);
  ATTO_CHECK(!o.share_embeddings || o.src_vocab == o.tgt_vocab, me,
             "share_embeddings needs src_vocab == tgt_vocab, got src_vocab=", o.src_vocab, ", tgt_vocab=", o.tgt_vocab);
  ATTO_CHECK(!(o.scale_embedding && o.scale_projection), me,
             "scale_embedding and scale_projection are exclusive (the seed's scale_emb_or_prj)");
  std::shared_ptr<Embedding> shared;
  if (o.share_embeddings) shared = std::make_shared<Embedding>(o.tgt_vocab, o.d_model, o.pad_idx, gen);
  encoder = register_module("encoder", std::make_shared<Encoder>(o, gen, shared));
  decoder = register_module("decoder", std::make_shared<Decoder>(o, gen, shared));
  if (!o.tie_output)
    trg_word_prj = register_module("trg_word_prj", std::make_shared<Linear>(o.d_model, o.tgt_vocab, false, gen));
  // The seed: xavier_uniform_ on every parameter with more than one dimension (a shared tensor once).
  NoGradGuard no_grad;
  for (auto& [_, p] : named_parameters())
    if (p.dim() > 1) init::xavier_uniform_(p, 1.0, gen);
  if (o.dtype != kFloat32) to(o.dtype);
  AttentionSpec& at = spec_.attention;  // the variant, as a spec records it
  if (o.n_kv_head > 0 && o.n_kv_head != o.n_head) at = {.kind = "gqa", .kv_heads = o.n_kv_head};
  if (o.enc_window > 0) at = {.kind = "local", .window = o.enc_window};
  if (o.enc_block > 0) at = {.kind = "block-sparse", .block = o.enc_block};
  at.checkpoint = o.checkpoint;
}

Tensor Transformer::output_weight() const {
  return trg_word_prj ? trg_word_prj->weight : decoder->trg_word_emb->weight;
}

Tensor Transformer::encode(const Tensor& src) {
  check_tokens(src, options.src_vocab, options.n_position, "Transformer", "src", "n_position");
  if (track_entropy_) enc_rows_ = ne(src, static_cast<double>(options.pad_idx));  // (B, S) real source tokens
  // The self-attention through the AttentionLayer interface: the source's padding keys blocked, not causal.
  AttentionCall call{.is_causal = false};
  if (options.pad_idx >= 0) call.key_padding_mask = reshape(padding_mask(src, options.pad_idx), src.shape());  // (B, S)
  return encoder->forward(src, call);  // (B, S, D)
}

Tensor Transformer::decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src) {
  const char* me = "Transformer";
  check_tokens(tgt_in, options.tgt_vocab, options.n_position, me, "tgt_in", "n_position");
  ATTO_CHECK(src.defined() && src.dtype() == kInt64 && src.dim() == 2, me,
             "decode needs the source tokens (B, S) int64 for their padding mask");
  ATTO_CHECK(memory.defined() && memory.dim() == 3 && memory.size(0) == src.size(0) && memory.size(1) == src.size(1) &&
                 memory.size(2) == options.d_model,
             me,
             "memory must be the encoder output (B, S, d_model) = ", Shape({src.size(0), src.size(1), options.d_model}),
             " for src ", src.shape(), ", got ", memory.defined() ? memory.shape() : Shape{});
  ATTO_CHECK(tgt_in.size(0) == src.size(0), me, "batch sizes differ: tgt_in ", tgt_in.shape(), ", src ", src.shape());
  if (track_entropy_) dec_rows_ = ne(tgt_in, static_cast<double>(options.pad_idx));  // (B, T) real target inputs
  // The self-attention through the AttentionLayer interface: causal, the target's padding keys blocked.
  Tensor src_mask;
  AttentionCall self_call{.is_causal = true};
  if (options.pad_idx >= 0) {
    src_mask = padding_mask(src, options.pad_idx);                                                // (B, 1, 1, S)
    self_call.key_padding_mask = reshape(padding_mask(tgt_in, options.pad_idx), tgt_in.shape());  // (B, T)
  }
  Tensor h = decoder->forward(tgt_in, self_call, memory, src_mask);  // (B, T, D)
  Tensor logits = linear(h, output_weight());                       // (B, T, V)
  if (options.tie_output && options.scale_projection)
    logits = logits * (1.0 / std::sqrt(static_cast<double>(options.d_model)));
  return logits;
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt_in) { return decode(tgt_in, encode(src), src); }

void Transformer::store_attention(bool on) {
  for (const auto& m : *encoder->layer_stack) static_cast<EncoderLayer&>(*m).set_store_attention(on);
  for (const auto& m : *decoder->layer_stack) static_cast<DecoderLayer&>(*m).set_store_attention(on);
}

std::vector<Tensor> Transformer::encoder_attention() const {
  std::vector<Tensor> out;
  for (const auto& m : *encoder->layer_stack) out.push_back(static_cast<EncoderLayer&>(*m).last_attention());
  return out;
}

std::vector<Tensor> Transformer::decoder_self_attention() const {
  std::vector<Tensor> out;
  for (const auto& m : *decoder->layer_stack) out.push_back(static_cast<DecoderLayer&>(*m).last_self_attention());
  return out;
}

std::vector<Tensor> Transformer::decoder_cross_attention() const {
  std::vector<Tensor> out;
  for (const auto& m : *decoder->layer_stack) out.push_back(static_cast<DecoderLayer&>(*m).last_cross_attention());
  return out;
}

void Transformer::track_attention_entropy(bool on) {
  for (const auto& m : *encoder->layer_stack) static_cast<EncoderLayer&>(*m).set_track_entropy(on);
  for (const auto& m : *decoder->layer_stack) static_cast<DecoderLayer&>(*m).set_track_entropy(on);
  track_entropy_ = on;
  if (!on) enc_rows_ = dec_rows_ = Tensor();
}

std::vector<AttentionEntropy> Transformer::attention_entropies() const {
  std::vector<AttentionEntropy> out;
  if (!track_entropy_) return out;
  const bool pad = options.pad_idx >= 0;
  for (size_t i = 0; i < encoder->layer_stack->size(); ++i)
    out.push_back({str_cat("enc", i), encoder->layer_stack->at<EncoderLayer>(static_cast<int64_t>(i))->last_entropy(),
                   pad ? enc_rows_ : Tensor()});
  for (size_t i = 0; i < decoder->layer_stack->size(); ++i) {
    const auto layer = decoder->layer_stack->at<DecoderLayer>(static_cast<int64_t>(i));
    out.push_back({str_cat("dec", i, ".self"), layer->last_self_entropy(), pad ? dec_rows_ : Tensor()});
    out.push_back({str_cat("dec", i, ".cross"), layer->last_cross_entropy(), pad ? dec_rows_ : Tensor()});
  }
  return out;
}

std::string Transformer::extra_repr() const {
  const TransformerOptions& o = options;
  return str_cat("src_vocab=", o.src_vocab, ", tgt_vocab=", o.tgt_vocab, ", d_model=", o.d_model, ", n_head=", o.n_head,
             ", d_k=", o.d_k, ", d_v=", o.d_v, ", d_inner=", o.d_inner, ", n_layers=", o.n_layers,
             ", dropout=", detail::py_float(o.dropout), ", pad_idx=", o.pad_idx, ", n_position=", o.n_position,
             ", share_embeddings=", py_bool(o.share_embeddings), ", tie_output=", py_bool(o.tie_output),
             ", scale_embedding=", py_bool(o.scale_embedding), ", scale_projection=", py_bool(o.scale_projection),
             o.n_kv_head > 0 ? str_cat(", n_kv_head=", o.n_kv_head) : std::string(),
             o.enc_window > 0 ? str_cat(", enc_window=", o.enc_window) : std::string(),
             o.enc_block > 0 ? str_cat(", enc_block=", o.enc_block) : std::string(),
             o.checkpoint ? ", checkpoint=True" : "");
}

// ---------------------------------------------------------------------------------------------
// The sequence-model interface

std::shared_ptr<SequenceModel> Transformer::build(const ModelSpec& s, Generator& gen) {
  ATTO_CHECK(s.heads > 0 && s.d_model % s.heads == 0, "Transformer", "heads (", s.heads, ") must divide d_model (",
             s.d_model, ")");
  detail::refuse_architecture(s.architecture, "seq2seq", "the paper's recipe (the seed's Transformer)");
  const AttentionSpec& at = s.attention;
  at.validate(s.heads);
  // The seed's attention sublayers are its own (parameters w_qs, w_ks, w_vs, fc, layer_norm; the residual and norm
  // inside: the internal kind "seed-mha", whose weights files key on these names): it takes a MultiheadAttention
  // kind's key/value heads, window and block. A kind made of a score or mask function (alibi, softcap, a user's)
  // would be silently dropped, so it is refused.
  const MultiheadAttentionOptions mo = detail::plain_multihead_attention(
      at, {.d_model = s.d_model, .heads = s.heads, .dropout = s.dropout}, "Transformer", "seq2seq",
      "its sublayers take only key/value heads, window and block");
  ATTO_CHECK(!at.rope, "Transformer", "model kind \"seq2seq\" does not support attention.rope (--rope): the seed's ",
             "model keeps its sinusoidal position tables");
  auto m =
      std::make_shared<Transformer>(TransformerOptions{.src_vocab = s.vocab,
                                                       .tgt_vocab = s.vocab,
                                                       .d_model = s.d_model,
                                                       .n_head = s.heads,
                                                       .d_k = s.d_model / s.heads,
                                                       .d_v = s.d_model / s.heads,
                                                       .d_inner = s.d_ff,
                                                       .n_layers = s.layers,
                                                       .dropout = s.dropout,
                                                       .pad_idx = s.specials.pad,
                                                       .n_position = std::max(s.max_source_len, s.max_target_len + 1),
                                                       .n_kv_head = mo.num_kv_heads,
                                                       .enc_window = mo.window,
                                                       .enc_block = mo.block_size,
                                                       .checkpoint = at.checkpoint},
                                    gen);
  m->spec_ = s;
  return m;
}

SequenceBatch Transformer::make_batch(const std::vector<Example>& ex) const {
  check_examples(ex, "Transformer::make_batch");
  const SpecialTokens& sp = spec_.specials;
  size_t S = 0, T = 0;
  for (const Example& e : ex) {
    S = std::max(S, e.src.size());
    T = std::max(T, e.tgt.size() + 1);
  }
  const auto B = static_cast<int64_t>(ex.size());
  Tensor src = full({B, static_cast<int64_t>(S)}, static_cast<double>(sp.pad), {.dtype = kInt64});     // (B, S)
  Tensor tgt_in = full({B, static_cast<int64_t>(T)}, static_cast<double>(sp.pad), {.dtype = kInt64});  // (B, T)
  Tensor tgt_out = full({B, static_cast<int64_t>(T)}, static_cast<double>(sp.ignore_index), {.dtype = kInt64});
  int64_t* ps = src.data<int64_t>();
  int64_t* pi = tgt_in.data<int64_t>();
  int64_t* po = tgt_out.data<int64_t>();
  for (size_t i = 0; i < ex.size(); ++i) {
    std::copy(ex[i].src.begin(), ex[i].src.end(), ps + i * S);
    pi[i * T] = sp.bos;
    std::copy(ex[i].tgt.begin(), ex[i].tgt.end(), pi + i * T + 1);
    std::copy(ex[i].tgt.begin(), ex[i].tgt.end(), po + i * T);
    po[i * T + ex[i].tgt.size()] = sp.eos;
  }
  return {.inputs = {src, tgt_in}, .target = tgt_out, .examples = ex};
}

Tensor Transformer::forward_batch(const SequenceBatch& b) {
  ATTO_CHECK(b.inputs.size() == 2, "Transformer", "a batch needs inputs {src, tgt_in}, got ", b.inputs.size(),
             " tensors");
  return forward(b.inputs[0], b.inputs[1]);  // (B, T, V)
}

DecodeState Transformer::begin_decode(const TokenRows& sources) {
  DecodeState st = DecodeState::start(*this, sources);
  if (sources.empty()) return st;
  size_t S = 0;
  for (const auto& r : sources) S = std::max(S, r.size());
  const Tensor src = pack_rows(sources, static_cast<int64_t>(S), spec_.specials.pad);  // (B, S)
  const Tensor memory = encode(src);                                                   // (B, S, D)
  st.memory = {src, memory};
  // Caches: per decoder layer its self-attention's own state (every position the decoder can read) ...
  const auto B = static_cast<int64_t>(sources.size());
  const Dtype dt = memory.dtype();
  const int64_t kv_heads = options.n_kv_head > 0 ? options.n_kv_head : options.n_head;  // H_kv per cache
  for (const auto& m : *decoder->layer_stack) {
    std::shared_ptr<AttentionCache> c = static_cast<DecoderLayer&>(*m).slf_attn->make_cache(B, options.n_position);
    if (c == nullptr) {  // a layer that cannot cache: decode by recomputing
      st.cache.clear();
      return st;
    }
    c->rows = B;
    st.cache.push_back({.layer = std::move(c)});
  }
  // ... then its cross-attention keys and values of the encoder output, computed once here.
  CachedAttentionRows all{.cache_row = {},
                          .start = std::vector<int64_t>(static_cast<size_t>(B), 0),
                          .count = std::vector<int64_t>(static_cast<size_t>(B), static_cast<int64_t>(S))};
  for (int64_t b = 0; b < B; ++b) all.cache_row.push_back(b);
  for (const auto& m : *decoder->layer_stack) {
    const AttentionSublayer& a = *static_cast<DecoderLayer&>(*m).enc_attn;
    auto [k, v] = make_kv_cache(B, kv_heads, static_cast<int64_t>(S), options.d_k, options.d_v, dt);
    write_kv_cache(k, v, a.w_ks->forward(memory), 0, a.w_vs->forward(memory), 0, all);
    st.cache.push_back({k, v});
  }
  return st;
}

Tensor Transformer::cached_logits(DecodeState& st) {
  const char* me = "Transformer::decode_step";
  const SpecialTokens& sp = spec_.specials;
  const auto A = static_cast<int64_t>(st.active.size());
  CachedAttentionRows rows;
  TokenRows targets(st.decoded.size()), fresh;  // BOS + decoded per cache row; each active row's new tokens
  int64_t N = 0;
  for (int64_t b : st.active) {
    const auto ub = static_cast<size_t>(b);
    std::vector<int64_t>& t = targets[ub];
    t.reserve(st.decoded[ub].size() + 1);
    t.push_back(sp.bos);
    t.insert(t.end(), st.decoded[ub].begin(), st.decoded[ub].end());
    const int64_t start = st.cached[ub];
    ATTO_CHECK(start < static_cast<int64_t>(t.size()), me, "row ", b, " has no new token: its ", t.size(),
               " tokens are all cached (append a token to decoded before the next step)");
    ATTO_CHECK(static_cast<int64_t>(t.size()) <= options.n_position, me, "row ", b, " has BOS + ", t.size() - 1,
               " tokens, more than n_position ", options.n_position);
    fresh.emplace_back(t.begin() + start, t.end());
    rows.cache_row.push_back(b);
    rows.start.push_back(start);
    rows.count.push_back(static_cast<int64_t>(fresh.back().size()));
    N = std::max(N, rows.count.back());
  }
  const Tensor tokens = pack_rows(fresh, N, sp.pad);  // (A, N)
  check_tokens(tokens, options.tgt_vocab, options.n_position, me, "tgt_in", "n_position");
  rows.tokens = tokens;  // the self-attention's cache blocks the pad token's keys
  // Embedding at each row's own positions, then the decoder's input LayerNorm (dropout is off in eval mode).
  const int64_t D = options.d_model;
  const double emb_scale = options.tie_output && options.scale_embedding ? std::sqrt(static_cast<double>(D)) : 1.0;
  Tensor x = empty({A, N, D}, {.dtype = decoder->trg_word_emb->weight.dtype()});  // (A, N, D)
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    const T* w = decoder->trg_word_emb->weight.data<T>();
    const T* table = decoder->position_enc->pe.data<T>();  // (1, n_position, D)
    const int64_t* t = tokens.data<int64_t>();
    T* o = x.data<T>();
    for (int64_t a = 0; a < A; ++a)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t pos = std::min(rows.start[static_cast<size_t>(a)] + i, options.n_position - 1);  // padding
        const T* row = w + t[a * N + i] * D;
        const T* p = table + pos * D;
        T* q = o + (a * N + i) * D;
        if (emb_scale == 1.0) {
          for (int64_t k = 0; k < D; ++k) q[k] = row[k] + p[k];
        } else {
          const T s = static_cast<T>(emb_scale);
          for (int64_t k = 0; k < D; ++k) q[k] = row[k] * s + p[k];
        }
      }
  });
  x = decoder->layer_norm->forward(x);
  const size_t L = decoder->layer_stack->size();
  for (size_t l = 0; l < L; ++l)
    x = decoder->layer_stack->at<DecoderLayer>(static_cast<int64_t>(l))
            ->forward_cached(x, st.cache[l], st.cache[L + l], rows, targets, st.sources, sp.pad);
  std::vector<std::pair<int64_t, int64_t>> last;
  for (int64_t a = 0; a < A; ++a) last.emplace_back(a, rows.count[static_cast<size_t>(a)] - 1);
  for (size_t a = 0; a < rows.cache_row.size(); ++a) st.cached[static_cast<size_t>(rows.cache_row[a])] += rows.count[a];
  Tensor logits = decode_linear(gather_positions(x, last), output_weight());  // (A, V)
  if (options.tie_output && options.scale_projection)
    logits = logits * (1.0 / std::sqrt(static_cast<double>(options.d_model)));
  return logits;
}

void Transformer::check_decode_state(const DecodeState& st) const {
  const char* me = "Transformer::decode_step";
  st.validate(*this, me);
  if (st.rows == 0) return;
  // What begin_decode computed: the packed sources (B, S) and the encoder output (B, S, D) of every row, S the
  // longest source.
  size_t S = 0;
  for (const auto& r : st.sources) S = std::max(S, r.size());
  ATTO_CHECK(st.memory.size() == 2 && st.memory[0].defined() && st.memory[1].defined() && st.memory[0].dim() == 2 &&
                 st.memory[0].size(0) == st.rows && st.memory[0].size(1) == static_cast<int64_t>(S) &&
                 st.memory[0].dtype() == kInt64 && st.memory[1].dim() == 3 && st.memory[1].size(0) == st.rows &&
                 st.memory[1].size(1) == st.memory[0].size(1) && st.memory[1].size(2) == options.d_model &&
                 st.memory[1].dtype() == output_weight().dtype(),
             me, "the decode state's memory is not what begin_decode computed for its ", st.rows,
             " rows (the source tokens (B, ", S, ") and the encoder output (B, ", S, ", ", options.d_model, "))");
  const size_t L = decoder->layer_stack->size();
  if (st.use_cache && st.cache.size() == 2 * L)
    for (size_t i = 0; i < st.cache.size(); ++i) {
      const KVCache& c = st.cache[i];
      if (i < L) {  // the self-attention's own state
        ATTO_CHECK(c.layer != nullptr && c.layer->rows == st.rows && c.layer->capacity() == options.n_position, me,
                   "the decode state's cache ", i, " is not what begin_decode made for its ", st.rows, " rows");
        continue;
      }
      const auto C = static_cast<int64_t>(S);  // the cross-attention's keys and values of the encoder output
      ATTO_CHECK(c.key.defined() && c.value.defined() && c.key.dim() == 4 && c.value.dim() == 4 &&
                     c.key.size(0) == st.rows && c.value.size(0) == st.rows && c.key.size(3) == C &&
                     c.value.size(2) == C && c.key.size(1) == c.value.size(1),
                 me, "the decode state's cache ", i, " is not what begin_decode made for its ", st.rows, " rows");
    }
  for (int64_t b : st.active) {
    const auto n = static_cast<int64_t>(st.decoded[static_cast<size_t>(b)].size());
    ATTO_CHECK(n + 1 <= options.n_position, me, "row ", b, " has BOS + ", n, " decoded tokens, more than n_position ",
               options.n_position, " (the longest target this model decodes)");
  }
}

Tensor Transformer::decode_step(DecodeState& st) {
  check_decode_state(st);
  if (st.active.empty()) return empty({0, options.tgt_vocab}, {.dtype = output_weight().dtype()});
  if (st.use_cache && st.cache.size() == 2 * decoder->layer_stack->size()) return cached_logits(st);
  // Every row is fed (BOS + its tokens; a finished row padded after its EOS), as the rows of one batch.
  const int64_t t = [&] {
    size_t n = 0;
    for (int64_t b : st.active) n = std::max(n, st.decoded[static_cast<size_t>(b)].size());
    return static_cast<int64_t>(n);
  }();
  TokenRows tgt(st.decoded.size());
  for (size_t b = 0; b < tgt.size(); ++b) {
    tgt[b].push_back(spec_.specials.bos);
    tgt[b].insert(tgt[b].end(), st.decoded[b].begin(), st.decoded[b].end());
  }
  const Tensor logits = decode(pack_rows(tgt, t + 1, spec_.specials.pad), st.memory[1], st.memory[0]);  // (B, t+1, V)
  std::vector<std::pair<int64_t, int64_t>> at;
  for (int64_t b : st.active) at.emplace_back(b, static_cast<int64_t>(st.decoded[static_cast<size_t>(b)].size()));
  return gather_positions(logits, at);  // (A, V)
}

std::vector<AttentionMap> Transformer::attention_maps(const std::vector<int64_t>& src,
                                                      const std::vector<int64_t>& output) {
  std::vector<int64_t> tgt_in{spec_.specials.bos};
  tgt_in.insert(tgt_in.end(), output.begin(), output.end());
  std::vector<Tensor> enc, dec_self, dec_cross;
  {
    NoGradGuard no_grad;
    AttentionScope scope(*this);
    forward(row_tensor(src), row_tensor(tgt_in));
    enc = encoder_attention();
    dec_self = decoder_self_attention();
    dec_cross = decoder_cross_attention();
  }
  std::vector<AttentionMap> maps;
  for (size_t i = 0; i < enc.size(); ++i) maps.push_back({str_cat("encoder ", i, " self"), enc[i], src, src});
  for (size_t i = 0; i < dec_self.size(); ++i) {
    maps.push_back({str_cat("decoder ", i, " self"), dec_self[i], tgt_in, tgt_in});
    maps.push_back({str_cat("decoder ", i, " cross"), dec_cross[i], tgt_in, src});
  }
  return maps;
}

}  // namespace attograd::nn::seed

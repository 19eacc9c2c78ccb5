#include "nn/models.h"

#include <algorithm>
#include <cmath>

#include "autograd/dropout.h"
#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "nn/init.h"
#include "nn/masks.h"

namespace attograd::nn {

namespace {

// tokens must be (B, L) Int64 with L <= max_len and every id in [0, vocab); errors name the model, the tensor,
// its shape and the offending value.
void check_tokens(const Tensor& tokens, int64_t vocab, int64_t max_len, const char* me, const char* what,
                  const char* max_name) {
  ATTO_CHECK(tokens.defined(), me, what, " is undefined");
  ATTO_CHECK(tokens.dtype() == kInt64, me, what, " must be int64 token ids, got ", dtype_name(tokens.dtype()),
             " of shape ", tokens.shape());
  ATTO_CHECK(tokens.dim() == 2, me, "expected ", what, " of shape (B, L), got ", tokens.shape());
  const int64_t L = tokens.size(1);
  ATTO_CHECK(L <= max_len, me, what, " length L=", L, " (shape ", tokens.shape(), ") exceeds ", max_name, "=", max_len);
  const int64_t* t = tokens.data<int64_t>();
  const int64_t n = tokens.numel();
  for (int64_t i = 0; i < n; ++i)
    ATTO_CHECK(t[i] >= 0 && t[i] < vocab, me, "token id ", t[i], " at ", Shape({i / L, i % L}), " of ", what, " ",
               tokens.shape(), " is out of range for vocab size ", vocab);
}

// The causal LM's input in one op: out[b, l, :] = weight[tokens[b, l], :] * scale + table[l, :].
// weight (V, D), tokens (B, L) Int64 (validated by the caller), table (>= L, D) -> (B, L, D).
// d weight[r] = scale * (sum of g[b, l] over the (b, l) with tokens[b, l] == r); the table gets no gradient.
Tensor embed_with_positions(const Tensor& weight, const Tensor& tokens, const Tensor& table, double scale) {
  const int64_t B = tokens.size(0), L = tokens.size(1), V = weight.size(0), D = weight.size(1);
  Tensor out = empty({B, L, D}, {.dtype = weight.dtype()});
  const int64_t* t = tokens.data<int64_t>();
  dispatch_float(weight.dtype(), "embed_with_positions", [&]<typename T>() {
    const T* w = weight.data<T>();
    const T* pe = table.data<T>();
    T* o = out.data<T>();
    const T s = static_cast<T>(scale);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        const T* row = w + t[b * L + l] * D;
        const T* p = pe + l * D;
        T* q = o + (b * L + l) * D;
        for (int64_t k = 0; k < D; ++k) q[k] = row[k] * s + p[k];
      }
  });
  if (!any_requires_grad({weight})) return out;
  Tensor saved = tokens.detach();
  return record("embed_with_positions", out, {weight}, [saved, V, D, scale](const Tensor& g, GradInputs& gi) {
    Tensor gw = zeros({V, D}, {.dtype = g.dtype()});
    const int64_t* ix = saved.data<int64_t>();
    const int64_t m = saved.numel();
    dispatch_float(g.dtype(), "embed_with_positions_backward", [&]<typename T>() {
      const T* pg = g.data<T>();
      T* q = gw.data<T>();
      const T s = static_cast<T>(scale);
      for (int64_t i = 0; i < m; ++i) {
        T* row = q + ix[i] * D;
        const T* src = pg + i * D;
        for (int64_t k = 0; k < D; ++k) row[k] += s * src[k];
      }
    });
    gi[0] = gw;
  });
}

// ff(x) for a PyTorch-style feed-forward block, with its ReLU and dropout fused into one op (the same values and
// mask draws as ff.forward(x)); other configurations run ff.forward.
Tensor feed_forward(PositionwiseFeedForward& ff, const Tensor& x) {
  if (ff.options.activation != "relu" || ff.options.residual_norm) return ff.forward(x);
  ATTO_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == ff.d_model, ff.type_name(),
             "expected input of shape (..., d_model=", ff.d_model, "), got shape ", x.defined() ? x.shape() : Shape{});
  const Dropout& d = *ff.dropout;
  return ff.linear2->forward(relu_dropout(ff.linear1->forward(x), d.p(), d.is_training(), d.generator()));
}

// (B, L) Bool, true where tokens == pad_idx: a key padding mask for MultiheadAttention.
Tensor key_padding_mask(const Tensor& tokens, int64_t pad_idx) {
  Tensor mask = empty(tokens.shape(), {.dtype = kBool});
  const int64_t* t = tokens.data<int64_t>();
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < tokens.numel(); ++i) m[i] = t[i] == pad_idx;
  return mask;
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// The seed's layers

EncoderLayer::EncoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double p,
                           Generator& gen) {
  slf_attn = register_module("slf_attn", std::make_shared<MultiHeadAttention>(n_head, d_model, d_k, d_v, p, gen));
  pos_ffn =
      register_module("pos_ffn", std::make_shared<PositionwiseFeedForward>(
                                     d_model, d_inner, FeedForwardOptions{.dropout = p, .residual_norm = true}, gen));
}

Tensor EncoderLayer::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& slf_attn_mask) {
  SeedAttentionResult a = slf_attn->forward(x, x, x, slf_attn_mask, store_attention_);  // (B, S, D)
  if (store_attention_) last_attention_ = a.attn;                                       // (B, H, S, S)
  return pos_ffn->forward(a.output);
}


void EncoderLayer::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) last_attention_ = Tensor();
}

DecoderLayer::DecoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double p,
                           Generator& gen) {
  slf_attn = register_module("slf_attn", std::make_shared<MultiHeadAttention>(n_head, d_model, d_k, d_v, p, gen));
  enc_attn = register_module("enc_attn", std::make_shared<MultiHeadAttention>(n_head, d_model, d_k, d_v, p, gen));
  pos_ffn =
      register_module("pos_ffn", std::make_shared<PositionwiseFeedForward>(
                                     d_model, d_inner, FeedForwardOptions{.dropout = p, .residual_norm = true}, gen));
}

Tensor DecoderLayer::forward(const Tensor& dec_input, const Tensor& enc_output, const Tensor& slf_attn_mask,
                             const Tensor& dec_enc_attn_mask) {
  const bool store = store_attention_;
  SeedAttentionResult a = slf_attn->forward(dec_input, dec_input, dec_input, slf_attn_mask, store);  // (B, T, D)
  SeedAttentionResult c = enc_attn->forward(a.output, enc_output, enc_output, dec_enc_attn_mask, store);
  if (store) {
    last_self_attention_ = a.attn;   // (B, H, T, T)
    last_cross_attention_ = c.attn;  // (B, H, T, S)
  }
  return pos_ffn->forward(c.output);
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
    : scale_(o.tie_output && o.scale_embedding ? std::sqrt(static_cast<double>(o.d_model)) : 1.0) {
  src_word_emb = register_module(
      "src_word_emb", word_emb ? word_emb : std::make_shared<Embedding>(o.src_vocab, o.d_model, o.pad_idx, gen));
  position_enc =
      register_module("position_enc", std::make_shared<PositionalEncoding>(o.d_model, o.n_position, o.dropout));
  layer_stack = register_module("layer_stack", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i)
    layer_stack->push_back(
        std::make_shared<EncoderLayer>(o.d_model, o.d_inner, o.n_head, o.d_k, o.d_v, o.dropout, gen));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(o.d_model, 1e-6));
}

Tensor Encoder::forward(const Tensor& src_seq, const Tensor& src_mask) {
  Tensor x = src_word_emb->forward(src_seq);  // (B, S, D)
  if (scale_ != 1.0) x = x * scale_;
  x = layer_norm->forward(position_enc->forward(x));
  for (const auto& m : *layer_stack) x = static_cast<EncoderLayer&>(*m).forward(x, src_mask);
  return x;
}

Decoder::Decoder(const TransformerOptions& o, Generator& gen, std::shared_ptr<Embedding> word_emb)
    : scale_(o.tie_output && o.scale_embedding ? std::sqrt(static_cast<double>(o.d_model)) : 1.0) {
  trg_word_emb = register_module(
      "trg_word_emb", word_emb ? word_emb : std::make_shared<Embedding>(o.tgt_vocab, o.d_model, o.pad_idx, gen));
  position_enc =
      register_module("position_enc", std::make_shared<PositionalEncoding>(o.d_model, o.n_position, o.dropout));
  layer_stack = register_module("layer_stack", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i)
    layer_stack->push_back(
        std::make_shared<DecoderLayer>(o.d_model, o.d_inner, o.n_head, o.d_k, o.d_v, o.dropout, gen));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(o.d_model, 1e-6));
}

Tensor Decoder::forward(const Tensor& trg_seq, const Tensor& trg_mask, const Tensor& enc_output,
                        const Tensor& src_mask) {
  Tensor x = trg_word_emb->forward(trg_seq);  // (B, T, D)
  if (scale_ != 1.0) x = x * scale_;
  x = layer_norm->forward(position_enc->forward(x));
  for (const auto& m : *layer_stack) x = static_cast<DecoderLayer&>(*m).forward(x, enc_output, trg_mask, src_mask);
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
}

Tensor Transformer::output_weight() const {
  return trg_word_prj ? trg_word_prj->weight : decoder->trg_word_emb->weight;
}

Tensor Transformer::encode(const Tensor& src) {
  check_tokens(src, options.src_vocab, options.n_position, "Transformer", "src", "n_position");
  const Tensor src_mask = options.pad_idx >= 0 ? padding_mask(src, options.pad_idx) : Tensor();  // (B, 1, 1, S)
  return encoder->forward(src, src_mask);                                                        // (B, S, D)
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
  const int64_t T = tgt_in.size(1);
  Tensor src_mask, tgt_mask = causal_mask(T);  // (T, T)
  if (options.pad_idx >= 0) {
    src_mask = padding_mask(src, options.pad_idx);                           // (B, 1, 1, S)
    tgt_mask = logical_or(padding_mask(tgt_in, options.pad_idx), tgt_mask);  // (B, 1, T, T)
  }
  Tensor h = decoder->forward(tgt_in, tgt_mask, memory, src_mask);  // (B, T, D)
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


std::string Transformer::extra_repr() const {
  const TransformerOptions& o = options;
  return str_cat("src_vocab=", o.src_vocab, ", tgt_vocab=", o.tgt_vocab, ", d_model=", o.d_model, ", n_head=", o.n_head,
             ", d_k=", o.d_k, ", d_v=", o.d_v, ", d_inner=", o.d_inner, ", n_layers=", o.n_layers,
             ", dropout=", detail::py_float(o.dropout), ", pad_idx=", o.pad_idx, ", n_position=", o.n_position,
             ", share_embeddings=", py_bool(o.share_embeddings), ", tie_output=", py_bool(o.tie_output),
             ", scale_embedding=", py_bool(o.scale_embedding), ", scale_projection=", py_bool(o.scale_projection));
}

// ---------------------------------------------------------------------------------------------
// CausalLM

CausalLMBlock::CausalLMBlock(const CausalLMOptions& o, Generator& gen) {
  const double p = o.dropout;
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(o.d_model, 1e-6));
  self_attn = register_module(
      "self_attn", std::make_shared<MultiheadAttention>(
                       MultiheadAttentionOptions{.embed_dim = o.d_model, .num_heads = o.n_head, .dropout = p}, gen));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(o.d_model, 1e-6));
  ff = register_module(
      "ff", std::make_shared<PositionwiseFeedForward>(o.d_model, o.d_ff, FeedForwardOptions{.dropout = p}, gen));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
}

Tensor CausalLMBlock::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor CausalLMBlock::forward(const Tensor& x, const Tensor& key_padding_mask) {
  Tensor h = norm1->forward(x);  // (B, L, D)
  MhaResult r = self_attn->forward(h, h, h,
                                   {.key_padding_mask = key_padding_mask,
                                    .need_weights = store_attention_,
                                    .average_attn_weights = false,
                                    .is_causal = true});
  if (store_attention_) last_attention_ = r.weights;  // (B, H, L, L)
  // x + dropout(branch) as one fused op each (the same values and mask draws as the modules').
  Tensor y = dropout_add(x, std::move(r.output), dropout1->p(), dropout1->is_training(), dropout1->generator());
  return dropout_add(y, feed_forward(*ff, norm2->forward(y)), dropout2->p(), dropout2->is_training(),
                     dropout2->generator());
}


void CausalLMBlock::set_store_attention(bool on) {
  store_attention_ = on;
  if (!on) last_attention_ = Tensor();
}

CausalLM::CausalLM(const CausalLMOptions& o, Generator& gen) : options(o) {
  spec_ = {.vocab = o.vocab,
           .layers = o.n_layers,
           .d_model = o.d_model,
           .heads = o.n_head,
           .d_ff = o.d_ff,
           .dropout = o.dropout,
           .max_source_len = o.max_len - 1,
           .max_target_len = o.max_len - 1,
           .specials = {.pad = o.pad_idx}};
  const char* me = "CausalLM";
  ATTO_CHECK(o.vocab > 0 && o.d_model > 0 && o.n_head > 0 && o.d_ff > 0 && o.max_len > 0, me,
             "vocab, d_model, n_head, d_ff and max_len must be positive, got vocab=", o.vocab, ", d_model=", o.d_model,
             ", n_head=", o.n_head, ", d_ff=", o.d_ff, ", max_len=", o.max_len);
  ATTO_CHECK(o.d_model % o.n_head == 0, me, "d_model must be divisible by n_head, got d_model=", o.d_model,
             ", n_head=", o.n_head);
  ATTO_CHECK(o.n_layers >= 0, me, "n_layers must be non-negative, got ", o.n_layers);
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  ATTO_CHECK(o.pad_idx < o.vocab, me, "pad_idx ", o.pad_idx, " must be below vocab=", o.vocab);
  embed = register_module("embed", std::make_shared<Embedding>(o.vocab, o.d_model, -1, gen));
  {
    NoGradGuard no_grad;
    init::normal_(embed->weight, 0.0, 1.0 / std::sqrt(static_cast<double>(o.d_model)), gen);
  }
  pe = register_buffer("pe", sinusoidal_table(o.max_len, o.d_model));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i) blocks->push_back(std::make_shared<CausalLMBlock>(o, gen));
  norm = register_module("norm", std::make_shared<LayerNorm>(o.d_model, 1e-6));
}

Tensor CausalLM::forward(const Tensor& tokens) { return forward(tokens, false); }

Tensor CausalLM::forward(const Tensor& tokens, bool mask_padding) {
  const char* me = "CausalLM";
  check_tokens(tokens, options.vocab, options.max_len, me, "tokens", "max_len");
  const Tensor& w = embed->weight;  // (V, D), also the output projection
  ATTO_CHECK(pe.dtype() == w.dtype(), me, "position table dtype ", dtype_name(pe.dtype()),
             " does not match the embedding's ", dtype_name(w.dtype()), " (convert the model with to())");
  const double scale = std::sqrt(static_cast<double>(options.d_model));
  Tensor x = dropout->forward(embed_with_positions(w, tokens, pe, scale));  // (B, L, D)
  const Tensor kpm = mask_padding && options.pad_idx >= 0 ? key_padding_mask(tokens, options.pad_idx) : Tensor();
  for (const auto& m : *blocks) x = static_cast<CausalLMBlock&>(*m).forward(x, kpm);
  return linear(norm->forward(x), w);  // (B, L, V)
}

void CausalLM::store_attention(bool on) {
  for (const auto& m : *blocks) static_cast<CausalLMBlock&>(*m).set_store_attention(on);
}

std::vector<Tensor> CausalLM::attention_weights() const {
  std::vector<Tensor> out;
  for (const auto& m : *blocks) out.push_back(static_cast<CausalLMBlock&>(*m).last_attention());
  return out;
}


std::string CausalLM::extra_repr() const {
  const CausalLMOptions& o = options;
  return str_cat("vocab=", o.vocab, ", d_model=", o.d_model, ", n_head=", o.n_head, ", d_ff=", o.d_ff,
             ", n_layers=", o.n_layers, ", dropout=", detail::py_float(o.dropout), ", max_len=", o.max_len,
             ", pad_idx=", o.pad_idx);
}

// ---------------------------------------------------------------------------------------------
// The sequence-model interface of both models

namespace {

// Puts a module in eval mode for the scope and restores its training flag and attention storing afterwards.
template <class M>
class AttentionScope {
 public:
  explicit AttentionScope(M& m) : m_(m), was_training_(m.is_training()) {
    m_.eval();
    m_.store_attention(true);
  }
  ~AttentionScope() {
    m_.store_attention(false);
    m_.train(was_training_);
  }
  AttentionScope(const AttentionScope&) = delete;
  AttentionScope& operator=(const AttentionScope&) = delete;

 private:
  M& m_;
  bool was_training_;
};

Tensor row_tensor(const std::vector<int64_t>& tokens) {
  return from_vector(tokens, {1, static_cast<int64_t>(tokens.size())});  // (1, L)
}

}  // namespace

std::shared_ptr<SequenceModel> Transformer::build(const ModelSpec& s, Generator& gen) {
  ATTO_CHECK(s.heads > 0 && s.d_model % s.heads == 0, "Transformer", "heads (", s.heads, ") must divide d_model (",
             s.d_model, ")");
  auto m = std::make_shared<Transformer>(
      TransformerOptions{.src_vocab = s.vocab,
                         .tgt_vocab = s.vocab,
                         .d_model = s.d_model,
                         .n_head = s.heads,
                         .d_k = s.d_model / s.heads,
                         .d_v = s.d_model / s.heads,
                         .d_inner = s.d_ff,
                         .n_layers = s.layers,
                         .dropout = s.dropout,
                         .pad_idx = s.specials.pad,
                         .n_position = std::max(s.max_source_len, s.max_target_len + 1)},
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
  Tensor src = full({B, static_cast<int64_t>(S)}, static_cast<double>(sp.pad), {.dtype = kInt64});  // (B, S)
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
  DecodeState st = DecodeState::start(sources);
  if (sources.empty()) return st;
  size_t S = 0;
  for (const auto& r : sources) S = std::max(S, r.size());
  const Tensor src = pack_rows(sources, static_cast<int64_t>(S), spec_.specials.pad);  // (B, S)
  st.memory = {src, encode(src)};                                                     // (B, S), (B, S, D)
  return st;
}

Tensor Transformer::decode_step(DecodeState& st) {
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

std::shared_ptr<SequenceModel> CausalLM::build(const ModelSpec& s, Generator& gen) {
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = s.vocab,
                                                      .d_model = s.d_model,
                                                      .n_head = s.heads,
                                                      .d_ff = s.d_ff,
                                                      .n_layers = s.layers,
                                                      .dropout = s.dropout,
                                                      .max_len = s.max_source_len + s.max_target_len + 1,
                                                      .pad_idx = s.specials.pad},
                                      gen);
  m->spec_ = s;
  return m;
}

SequenceBatch CausalLM::make_batch(const std::vector<Example>& ex) const {
  check_examples(ex, "CausalLM::make_batch");
  const SpecialTokens& sp = spec_.specials;
  // sequence = src SEP tgt EOS; input = sequence[:-1], target = sequence[1:] where it is tgt or EOS.
  size_t L = 0;
  for (const Example& e : ex) L = std::max(L, e.src.size() + 1 + e.tgt.size());
  ATTO_CHECK(static_cast<int64_t>(L) <= options.max_len, "CausalLM::make_batch", "source + SEP + target of ", L,
             " tokens exceeds max_len ", options.max_len);
  const auto B = static_cast<int64_t>(ex.size());
  Tensor input = full({B, static_cast<int64_t>(L)}, static_cast<double>(sp.pad), {.dtype = kInt64});  // (B, L)
  Tensor target = full({B, static_cast<int64_t>(L)}, static_cast<double>(sp.ignore_index), {.dtype = kInt64});
  int64_t* in = input.data<int64_t>();
  int64_t* tg = target.data<int64_t>();
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<int64_t> seq = ex[i].src;
    seq.push_back(sp.sep);
    seq.insert(seq.end(), ex[i].tgt.begin(), ex[i].tgt.end());
    seq.push_back(sp.eos);
    const size_t first_target = ex[i].src.size() + 1;  // index in seq of the first tgt token
    for (size_t p = 0; p + 1 < seq.size(); ++p) {
      in[i * L + p] = seq[p];
      if (p + 1 >= first_target) tg[i * L + p] = seq[p + 1];
    }
  }
  return {.inputs = {input}, .target = target, .examples = ex};
}

Tensor CausalLM::forward_batch(const SequenceBatch& b) {
  ATTO_CHECK(b.inputs.size() == 1, "CausalLM", "a batch needs inputs {tokens}, got ", b.inputs.size(), " tensors");
  return forward(b.inputs[0]);  // (B, L, V)
}

DecodeState CausalLM::begin_decode(const TokenRows& sources) { return DecodeState::start(sources); }

Tensor CausalLM::decode_step(DecodeState& st) {
  // Only running rows are fed, each right-padded to the longest: with the causal mask the padding after a row's
  // last token cannot change that token's logits.
  TokenRows rows;
  int64_t width = 0;
  for (int64_t b : st.active) {
    const auto ub = static_cast<size_t>(b);
    std::vector<int64_t> r = st.sources[ub];
    r.push_back(spec_.specials.sep);
    r.insert(r.end(), st.decoded[ub].begin(), st.decoded[ub].end());
    width = std::max<int64_t>(width, static_cast<int64_t>(r.size()));
    rows.push_back(std::move(r));
  }
  const Tensor logits = forward(pack_rows(rows, width, spec_.specials.pad));  // (A, width, V)
  std::vector<std::pair<int64_t, int64_t>> at;
  for (size_t i = 0; i < rows.size(); ++i)
    at.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(rows[i].size()) - 1);
  return gather_positions(logits, at);  // (A, V)
}

std::vector<AttentionMap> CausalLM::attention_maps(const std::vector<int64_t>& src,
                                                   const std::vector<int64_t>& output) {
  std::vector<int64_t> tokens = src;
  tokens.push_back(spec_.specials.sep);
  tokens.insert(tokens.end(), output.begin(), output.end());
  std::vector<Tensor> weights;
  {
    NoGradGuard no_grad;
    AttentionScope scope(*this);
    forward(row_tensor(tokens));
    weights = attention_weights();
  }
  std::vector<AttentionMap> maps;
  for (size_t i = 0; i < weights.size(); ++i) maps.push_back({str_cat("layer ", i), weights[i], tokens, tokens});
  return maps;
}

}  // namespace attograd::nn

#include "nn/models.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "autograd/attention.h"
#include "autograd/checkpoint.h"
#include "autograd/dropout.h"
#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/model_helpers.h"

namespace attograd::nn {

using detail::AttentionScope;
using detail::check_tokens;
using detail::key_padding_mask;
using detail::row_tensor;

namespace {

// The causal LM's input in one op: out[b, l, :] = weight[tokens[b, l], :] * scale + table[l, :].
// weight (V, D), tokens (B, L) Int64 (validated by the caller), table (>= L, D) -> (B, L, D).
// d weight[r] = scale * (sum of g[b, l] over the (b, l) with tokens[b, l] == r); d table[l] = sum over b of g[b, l]
// when the table requires grad (learned positions; the sinusoidal buffer does not). An undefined table adds
// nothing (positions come from RoPE, or none).
Tensor embed_with_positions(const Tensor& weight, const Tensor& tokens, const Tensor& table, double scale) {
  const int64_t B = tokens.size(0), L = tokens.size(1), V = weight.size(0), D = weight.size(1);
  Tensor out = empty({B, L, D}, {.dtype = weight.dtype()});
  const int64_t* t = tokens.data<int64_t>();
  dispatch_float(weight.dtype(), "embed_with_positions", [&]<typename T>() {
    const T* w = weight.data<T>();
    const T* pe = table.defined() ? table.data<T>() : nullptr;
    T* o = out.data<T>();
    const T s = static_cast<T>(scale);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) {
        const T* row = w + t[b * L + l] * D;
        T* q = o + (b * L + l) * D;
        if (pe == nullptr) {
          for (int64_t k = 0; k < D; ++k) q[k] = row[k] * s;
          continue;
        }
        const T* p = pe + l * D;
        for (int64_t k = 0; k < D; ++k) q[k] = row[k] * s + p[k];
      }
  });
  const bool learned = table.defined() && table.requires_grad();
  if (!any_requires_grad({weight}) && !learned) return out;
  Tensor saved = tokens.detach();
  const int64_t P = learned ? table.size(0) : 0;
  std::vector<Tensor> inputs = {weight};
  if (learned) inputs.push_back(table);
  return record("embed_with_positions", out, inputs, [saved, V, D, P, scale](const Tensor& g, GradInputs& gi) {
    if (P > 0) {  // d table[l] = sum_b g[b, l]; rows at or beyond L get zero
      const int64_t Bn = saved.size(0), Ln = saved.size(1);
      Tensor gt = zeros({P, D}, {.dtype = g.dtype()});
      dispatch_float(g.dtype(), "embed_with_positions_backward", [&]<typename T>() {
        const T* pg = g.data<T>();
        T* q = gt.data<T>();
        for (int64_t b = 0; b < Bn; ++b)
          for (int64_t l = 0; l < Ln; ++l)
            for (int64_t k = 0; k < D; ++k) q[l * D + k] += pg[(b * Ln + l) * D + k];
      });
      gi[1] = gt;
    }
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// CausalLM

namespace {

constexpr double kLmNormEps = 1e-6;  // the default recipe's (the seed's) LayerNorm eps

// The attention spec a CausalLM's blocks are built with: positions "rope" turns on the attention's RoPE.
AttentionSpec lm_attention(const CausalLMOptions& o) {
  AttentionSpec a = o.attention;
  if (o.architecture.positions == "rope") a.rope = true;
  return a;
}

}  // namespace

CausalLMBlock::CausalLMBlock(const CausalLMOptions& o, Generator& gen) {
  const double p = o.dropout;
  const ArchitectureSpec& arch = o.architecture;
  norm1 = register_module("norm1", detail::make_norm(arch, o.d_model, kLmNormEps));
  self_attn = register_module(
      "self_attn", make_attention(lm_attention(o),
                                  {.d_model = o.d_model, .heads = o.n_head, .dropout = p, .max_len = o.max_len,
                                   .bias = arch.bias},
                                  gen));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(p));
  norm2 = register_module("norm2", detail::make_norm(arch, o.d_model, kLmNormEps));
  ff = register_module("ff", std::make_shared<PositionwiseFeedForward>(
                                 o.d_model, o.d_ff,
                                 FeedForwardOptions{.dropout = p, .activation = arch.activation, .bias = arch.bias},
                                 gen));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(p));
}

Tensor CausalLMBlock::forward(const Tensor& x) { return forward(x, Tensor()); }

Tensor CausalLMBlock::forward(const Tensor& x, const Tensor& key_padding_mask) {
  return forward(x, AttentionCall{.key_padding_mask = key_padding_mask, .is_causal = true});
}

Tensor CausalLMBlock::forward(const Tensor& x, AttentionCall call) {
  Tensor h = norm1->forward(x);  // (B, L, D)
  call.need_weights = store_attention_;
  call.need_entropy = track_entropy_;
  AttentionOutput r = self_attn->forward(h, call);
  if (store_attention_) last_attention_ = r.weights;  // (B, H, L, L); undefined for a kind without weights
  if (track_entropy_) last_entropy_ = r.entropy;      // (B, H, L)
  // x + dropout(branch) as one fused op each (the same values and mask draws as the modules').
  Tensor y = dropout_add(x, std::move(r.output), dropout1->p(), dropout1->is_training(), dropout1->generator());
  return dropout_add(y, feed_forward(*ff, norm2->forward(y)), dropout2->p(), dropout2->is_training(),
                     dropout2->generator());
}

Tensor CausalLMBlock::forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) {
  Tensor y = x + self_attn->forward_cached(norm1->forward(x), cache, rows);  // (A, N, D)
  return y + decode_feed_forward(*ff, norm2->forward(y));  // (A, N, D); dropout is off in eval mode
}

void CausalLMBlock::set_track_entropy(bool on) {
  ATTO_CHECK(!on || self_attn->facts().softmax, "CausalLMBlock", self_attn->kind(),
             " attention has no softmax rows, so no attention entropy to track or regularise");
  track_entropy_ = on;
  if (!on) last_entropy_ = Tensor();
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
           .specials = {.pad = o.pad_idx},
           .attention = o.attention,
           .architecture = o.architecture};
  const char* me = "CausalLM";
  ATTO_CHECK(o.vocab > 0 && o.d_model > 0 && o.n_head > 0 && o.d_ff > 0 && o.max_len > 0, me,
             "vocab, d_model, n_head, d_ff and max_len must be positive, got vocab=", o.vocab, ", d_model=", o.d_model,
             ", n_head=", o.n_head, ", d_ff=", o.d_ff, ", max_len=", o.max_len);
  ATTO_CHECK(o.d_model % o.n_head == 0, me, "d_model must be divisible by n_head, got d_model=", o.d_model,
             ", n_head=", o.n_head);
  ATTO_CHECK(o.n_layers >= 0, me, "n_layers must be non-negative, got ", o.n_layers);
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  ATTO_CHECK(o.pad_idx < o.vocab, me, "pad_idx ", o.pad_idx, " must be below vocab=", o.vocab);
  const ArchitectureSpec& arch = o.architecture;
  arch.validate();
  ATTO_CHECK(!o.attention.rope || arch.positions == "sinusoidal" || arch.positions == "rope", me,
             "attention.rope puts rotary positions in the attention; it cannot be combined with positions '",
             arch.positions, "'");
  lm_attention(o).validate(o.n_head);
  ATTO_CHECK(arch.positions != "rope" || attention_facts(lm_attention(o), attention_config()).own_positions, me,
             "positions 'rope' need an attention kind that applies RoPE; ", o.attention.kind, " does not");
  embed = register_module("embed", std::make_shared<Embedding>(o.vocab, o.d_model, -1, gen));
  const double embed_std = 1.0 / std::sqrt(static_cast<double>(o.d_model));
  {
    NoGradGuard no_grad;
    init::normal_(embed->weight, 0.0, embed_std, gen);
  }
  if (uses_position_table()) pe = register_buffer("pe", sinusoidal_table(o.max_len, o.d_model));
  if (arch.positions == "learned") {
    pos_embed = register_module("pos_embed", std::make_shared<Embedding>(o.max_len, o.d_model, -1, gen));
    NoGradGuard no_grad;
    init::normal_(pos_embed->weight, 0.0, embed_std, gen);
  }
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i) blocks->push_back(std::make_shared<CausalLMBlock>(o, gen));
  norm = register_module("norm", detail::make_norm(arch, o.d_model, kLmNormEps));
  if (arch.head == "untied")  // nanoGPT's lm_head (no bias there); with a bias when the recipe keeps biases
    head = register_module("head", std::make_shared<Linear>(o.d_model, o.vocab, arch.bias, gen));
  if (arch.init == "gpt2") {
    std::vector<Tensor> residual;
    for (const auto& m : *blocks) {
      const auto& b = static_cast<CausalLMBlock&>(*m);
      if (Tensor w = b.self_attn->output_projection(); w.defined()) residual.push_back(w);
      residual.push_back(b.ff->linear2->weight);
    }
    detail::gpt2_init(*this, residual, o.n_layers, gen);
  }
  if (o.dtype != kFloat32) to(o.dtype);
  slides_ = !position_table().defined() && attention_facts(block_attention(), attention_config()).slides;
}

Tensor CausalLM::forward(const Tensor& tokens) { return forward(tokens, false); }

Tensor CausalLM::forward(const Tensor& tokens, bool mask_padding) {
  const char* me = "CausalLM";
  check_tokens(tokens, options.vocab, options.max_len, me, "tokens", "max_len");
  const Tensor& w = embed->weight;  // (V, D), also the output projection unless the head is untied
  const Tensor table = position_table();
  ATTO_CHECK(!table.defined() || table.dtype() == w.dtype(), me, "position table dtype ", dtype_name(table.dtype()),
             " does not match the embedding's ", dtype_name(w.dtype()), " (convert the model with to())");
  Tensor x = dropout->forward(embed_with_positions(w, tokens, table, embedding_scale()));  // (B, L, D)
  const Tensor kpm = mask_padding && options.pad_idx >= 0 ? key_padding_mask(tokens, options.pad_idx) : Tensor();
  if (track_entropy_) entropy_rows_ = ne(tokens, static_cast<double>(options.pad_idx));  // (B, L) real query rows
  const AttentionCall call = rows_call(tokens, kpm);
  const auto n = static_cast<int64_t>(blocks->size());
  for (int64_t i = 0; i < n; ++i) x = forward_block(i, x, call);
  return output_logits(norm->forward(x), false);  // (B, L, V)
}

int64_t CausalLM::prompt_length(const int64_t* row, int64_t n) const {
  if (spec_.stream) return 0;
  for (int64_t l = 0; l < n; ++l)
    if (row[l] == spec_.specials.sep) return l + 1;
  return 0;
}

AttentionCall CausalLM::rows_call(const Tensor& tokens, const Tensor& kpm) const {
  AttentionCall call{.key_padding_mask = kpm, .tokens = tokens};
  if (spec_.stream) return call;
  const int64_t B = tokens.size(0), L = tokens.size(1);
  for (int64_t b = 0; b < B; ++b) call.prompt_lengths.push_back(prompt_length(tokens.data<int64_t>() + b * L, L));
  return call;
}

Tensor CausalLM::forward_block(int64_t i, const Tensor& x, const AttentionCall& call) {
  std::shared_ptr<CausalLMBlock> b = block(i);
  // Gradient checkpointing: every block but the last (whose activations the backward needs first anyway), when
  // there is a backward to recompute for. The recomputation replays the dropout masks: checkpoint() restores
  // default_generator() and the generator given to set_generator(), the only ones the block draws from.
  const bool ckpt = options.attention.checkpoint && i + 1 < static_cast<int64_t>(blocks->size()) &&
                    is_grad_enabled() && x.requires_grad();
  if (!ckpt) return b->forward(x, call);
  CheckpointOptions co;
  if (generator_ != nullptr) co.generators.push_back(generator_);
  if (!track_entropy_)
    return checkpoint([b, call](const std::vector<Tensor>& in) { return b->forward(in[0], call); }, {x}, co);
  // Entropy tracking: the checkpointed function returns [output | entropies] flattened into one tensor, so that
  // the entropies keep their history through the recomputation (a loss on them reaches the block's parameters).
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2), H = options.n_head;
  Tensor packed = checkpoint(
      [b, call](const std::vector<Tensor>& in) {
        Tensor y = b->forward(in[0], call);  // (B, L, D)
        return cat({reshape(y, {-1}), reshape(b->last_entropy(), {-1})}, 0);
      },
      {x}, co);
  std::vector<Tensor> parts = split(packed, {B * L * D, B * H * L}, 0);
  b->last_entropy_ = reshape(parts[1], {B, H, L});  // (B, H, L), with history
  return reshape(parts[0], {B, L, D});
}

void CausalLM::store_attention(bool on) {
  for (const auto& m : *blocks) static_cast<CausalLMBlock&>(*m).set_store_attention(on);
}

void CausalLM::track_attention_entropy(bool on) {
  for (const auto& m : *blocks) static_cast<CausalLMBlock&>(*m).set_track_entropy(on);
  track_entropy_ = on;
  if (!on) entropy_rows_ = Tensor();
}

std::vector<AttentionEntropy> CausalLM::attention_entropies() const {
  std::vector<AttentionEntropy> out;
  if (!track_entropy_) return out;
  for (size_t i = 0; i < blocks->size(); ++i)
    out.push_back({str_cat("layer", i), blocks->at<CausalLMBlock>(static_cast<int64_t>(i))->last_entropy(),
                   options.pad_idx >= 0 ? entropy_rows_ : Tensor()});
  return out;
}

std::vector<Tensor> CausalLM::attention_weights() const {
  std::vector<Tensor> out;
  for (const auto& m : *blocks) out.push_back(static_cast<CausalLMBlock&>(*m).last_attention());
  return out;
}


bool CausalLM::uses_position_table() const {
  return options.architecture.positions == "sinusoidal" &&
         !attention_facts(block_attention(), attention_config()).own_positions;
}

Tensor CausalLM::position_table() const { return pos_embed ? pos_embed->weight : pe; }

bool CausalLM::slides() const { return slides_; }

int64_t CausalLM::sliding_history() const {
  // The last position's logits read max_len keys per layer, each computed from its own max_len keys one layer
  // down: n_layers (max_len - 1) + 1 tokens in all.
  return std::max<int64_t>(options.n_layers * (options.max_len - 1), 0) + 1;
}

Tensor CausalLM::sliding_forward(const Tensor& tokens, int64_t first) {
  const int64_t L = tokens.size(1);
  if (first == 0 && L <= options.max_len) return forward(tokens);  // no query reaches past max_len keys
  const char* me = "CausalLM::decode_step";
  check_tokens(tokens, options.vocab, std::numeric_limits<int64_t>::max(), me, "tokens", "max_len");
  ATTO_CHECK(slides(), me, "internal error: a sequence longer than max_len ", options.max_len,
             " is recomputed with a sliding window only without an absolute position table");
  Tensor x = dropout->forward(embed_with_positions(embed->weight, tokens, Tensor(), embedding_scale()));  // (B, L, D)
  const AttentionCall call{
      .is_causal = true, .rope_offset = first, .window = L > options.max_len ? options.max_len : 0};
  for (const auto& m : *blocks) x = static_cast<CausalLMBlock&>(*m).forward(x, call);
  return output_logits(norm->forward(x), false);  // (B, L, V)
}

AttentionSpec CausalLM::block_attention() const { return lm_attention(options); }

double CausalLM::embedding_scale() const {
  return options.architecture.embed_scale == "none" ? 1.0 : std::sqrt(static_cast<double>(options.d_model));
}

Tensor CausalLM::output_logits(const Tensor& h, bool decode) const {
  if (head) return decode ? decode_linear(h, head->weight, head->bias) : head->forward(h);  // (..., V)
  return decode ? decode_linear(h, embed->weight) : linear(h, embed->weight);            // (..., V)
}

AttentionConfig CausalLM::attention_config() const {
  return {.d_model = options.d_model,
          .heads = options.n_head,
          .dropout = options.dropout,
          .max_len = options.max_len,
          .bias = options.architecture.bias};
}

std::string CausalLM::extra_repr() const {
  const CausalLMOptions& o = options;
  return str_cat("vocab=", o.vocab, ", d_model=", o.d_model, ", n_head=", o.n_head, ", d_ff=", o.d_ff,
             ", n_layers=", o.n_layers, ", dropout=", detail::py_float(o.dropout), ", max_len=", o.max_len,
             ", pad_idx=", o.pad_idx,
             o.attention == AttentionSpec{} ? std::string() : ", attention=" + o.attention.kind,
             o.attention.rope ? ", rope=True" : "", o.attention.checkpoint ? ", checkpoint=True" : "",
             o.architecture == ArchitectureSpec{} ? "" : ", " + detail::architecture_words(o.architecture));
}

// ---------------------------------------------------------------------------------------------
// The sequence-model interface

std::shared_ptr<SequenceModel> CausalLM::build(const ModelSpec& s, Generator& gen) {
  // A stream reads (src tgt)[:-1]; otherwise src SEP tgt.
  const int64_t total = s.max_source_len + s.max_target_len;
  const int64_t max_len = s.stream ? std::max<int64_t>(1, total - 1) : total + 1;
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = s.vocab,
                                                      .d_model = s.d_model,
                                                      .n_head = s.heads,
                                                      .d_ff = s.d_ff,
                                                      .n_layers = s.layers,
                                                      .dropout = s.dropout,
                                                      .max_len = max_len,
                                                      .pad_idx = s.specials.pad,
                                                      .attention = s.attention,
                                                      .architecture = s.architecture},
                                      gen);
  m->spec_ = s;
  return m;
}

SequenceBatch CausalLM::shifted_batch(const TokenRows& seqs, const std::vector<size_t>& first_target, size_t L,
                                     const std::vector<Example>& ex) const {
  // input = seq[:-1] right-padded to L; target = seq[1:] from position first_target - 1 on, ignore_index elsewhere.
  const SpecialTokens& sp = spec_.specials;
  const auto B = static_cast<int64_t>(seqs.size());
  Tensor input = full({B, static_cast<int64_t>(L)}, static_cast<double>(sp.pad), {.dtype = kInt64});  // (B, L)
  Tensor target = full({B, static_cast<int64_t>(L)}, static_cast<double>(sp.ignore_index), {.dtype = kInt64});
  int64_t* in = input.data<int64_t>();
  int64_t* tg = target.data<int64_t>();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<int64_t>& seq = seqs[i];
    for (size_t p = 0; p + 1 < seq.size(); ++p) {
      in[i * L + p] = seq[p];
      if (p + 1 >= first_target[i]) tg[i * L + p] = seq[p + 1];
    }
  }
  return {.inputs = {input}, .target = target, .examples = ex};
}

SequenceBatch CausalLM::make_batch(const std::vector<Example>& ex) const {
  check_examples(ex, "CausalLM::make_batch");
  if (spec_.stream) return make_stream_batch(ex);
  const SpecialTokens& sp = spec_.specials;
  // sequence = src SEP tgt EOS; input = sequence[:-1], target = sequence[1:] where it is tgt or EOS.
  size_t L = 0;
  for (const Example& e : ex) L = std::max(L, e.src.size() + 1 + e.tgt.size());
  ATTO_CHECK(static_cast<int64_t>(L) <= options.max_len, "CausalLM::make_batch", "source + SEP + target of ", L,
             " tokens exceeds max_len ", options.max_len);
  TokenRows seqs;
  std::vector<size_t> first_target;  // per row, the index in its sequence of the first tgt token
  for (const Example& e : ex) {
    std::vector<int64_t> seq = e.src;
    seq.push_back(sp.sep);
    seq.insert(seq.end(), e.tgt.begin(), e.tgt.end());
    seq.push_back(sp.eos);
    seqs.push_back(std::move(seq));
    first_target.push_back(e.src.size() + 1);
  }
  return shifted_batch(seqs, first_target, L, ex);
}

SequenceBatch CausalLM::make_stream_batch(const std::vector<Example>& ex) const {
  // sequence = src tgt; input = sequence[:-1], target = sequence[1:] at every position (no SEP, no EOS).
  size_t L = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    const size_t n = ex[i].src.size() + ex[i].tgt.size();
    ATTO_CHECK(n >= 2, "CausalLM::make_batch", "example ", i, " has ", n,
               " tokens; a stream example needs at least 2 (an input and its next token)");
    L = std::max(L, n - 1);
  }
  ATTO_CHECK(static_cast<int64_t>(L) <= options.max_len, "CausalLM::make_batch", "an input of ", L,
             " tokens exceeds max_len ", options.max_len);
  TokenRows seqs;
  for (const Example& e : ex) {
    seqs.push_back(e.src);
    seqs.back().insert(seqs.back().end(), e.tgt.begin(), e.tgt.end());
  }
  return shifted_batch(seqs, std::vector<size_t>(ex.size(), 1), L, ex);
}

Tensor CausalLM::forward_batch(const SequenceBatch& b) {
  ATTO_CHECK(b.inputs.size() == 1, "CausalLM", "a batch needs inputs {tokens}, got ", b.inputs.size(), " tensors");
  return forward(b.inputs[0]);  // (B, L, V)
}

std::vector<int64_t> CausalLM::prompt_tokens(const std::vector<int64_t>& src) const {
  std::vector<int64_t> p = src;
  if (!spec_.stream) p.push_back(spec_.specials.sep);
  return p;
}

int64_t CausalLM::max_decode_len() const {
  return spec_.stream ? std::numeric_limits<int64_t>::max() : SequenceModel::max_decode_len();
}

std::vector<int64_t> CausalLM::sequence(const DecodeState& st, int64_t b) const {
  const auto ub = static_cast<size_t>(b);
  std::vector<int64_t> r = prompt_tokens(st.sources[ub]);
  r.insert(r.end(), st.decoded[ub].begin(), st.decoded[ub].end());
  return r;
}

int64_t CausalLM::window_start(int64_t length) const {
  if (slides() && length > options.max_len) return std::max<int64_t>(0, length - sliding_history());
  return std::max<int64_t>(0, length - options.max_len);
}

DecodeState CausalLM::begin_decode(const TokenRows& sources) {
  for (size_t b = 0; b < sources.size(); ++b)
    ATTO_CHECK(!prompt_tokens(sources[b]).empty(), "CausalLM::begin_decode", "prompt ", b,
               " is empty (a stream model needs at least one token to continue)");
  DecodeState st = DecodeState::start(*this, sources);
  if (sources.empty()) return st;
  const int64_t capacity = decode_capacity(sources);
  const auto B = static_cast<int64_t>(sources.size());
  const bool ring = slides();
  // Every block's attention makes its own state; a kind without one (or a layer that cannot cache, e.g. random
  // BigBird blocks, whose layout depends on the length) makes the whole model decode by recomputing. A model that
  // slides asks for rings of max_len keys instead: rows then run past max_len from the cache.
  for (const auto& m : *blocks) {
    const AttentionLayer& at = *static_cast<CausalLMBlock&>(*m).self_attn;
    std::shared_ptr<AttentionCache> c = ring ? at.make_ring_cache(B, options.max_len) : at.make_cache(B, capacity);
    if (c == nullptr) {
      st.cache.clear();
      return st;
    }
    c->rows = B;
    st.cache.push_back({.layer = std::move(c)});
  }
  return st;
}

int64_t CausalLM::decode_capacity(const TokenRows& sources) const {
  int64_t longest = 0;
  for (const auto& s : sources) longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt_tokens(s).size()));
  // The longest sequence a greedy decode reaches, and never more than the position table (beyond it the window
  // slides and decode_step recomputes).
  return std::min(options.max_len, longest + std::min(max_decode_len(), options.max_len));
}

int64_t CausalLM::cache_capacity(const DecodeState& st) const {
  if (blocks->empty()) return options.max_len;
  return st.cache[0].layer->capacity();
}

int64_t CausalLM::kv_cache_bytes_per_token() const {
  const AttentionFacts f = attention_facts(block_attention(), attention_config());
  const auto es = static_cast<double>(dtype_size(embed->weight.dtype()));
  return static_cast<int64_t>((f.cache_per_token > 0 ? f.cache_per_token : f.state_per_row) * es);
}

void CausalLM::set_mla_absorbed_decode(bool absorbed) {
  for (const auto& m : *blocks)
    if (auto mla = static_cast<CausalLMBlock&>(*m).attention<MultiHeadLatentAttention>()) mla->absorbed_decode = absorbed;
}

Tensor CausalLM::recompute_logits(const DecodeState& st, const std::vector<int64_t>& rows_in) {
  // Each row is right-padded to the longest: with the causal mask the padding after a row's last token cannot
  // change that token's logits. One batched pass, except that a sliding model's rows past max_len run at their own
  // absolute positions (RoPE), one pass per first position.
  std::vector<int64_t> firsts;  // per row, the position of its first token recomputed
  TokenRows rows;
  for (int64_t b : rows_in) {
    std::vector<int64_t> r = sequence(st, b);
    const int64_t first = window_start(static_cast<int64_t>(r.size()));
    r.erase(r.begin(), r.begin() + first);
    firsts.push_back(slides() ? first : 0);  // a crop restarts its window's positions at 0
    rows.push_back(std::move(r));
  }
  const auto A = static_cast<int64_t>(rows.size());
  Tensor out;  // (A, V)
  std::vector<bool> done(rows.size(), false);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (done[i]) continue;
    std::vector<size_t> group;  // the rows recomputed from the same first position
    int64_t width = 0;
    for (size_t j = i; j < rows.size(); ++j)
      if (!done[j] && firsts[j] == firsts[i]) {
        group.push_back(j);
        done[j] = true;
        width = std::max<int64_t>(width, static_cast<int64_t>(rows[j].size()));
      }
    TokenRows packed;
    std::vector<std::pair<int64_t, int64_t>> at;
    for (size_t j : group) {
      at.emplace_back(static_cast<int64_t>(packed.size()), static_cast<int64_t>(rows[j].size()) - 1);
      packed.push_back(rows[j]);
    }
    const Tensor logits = slides() ? sliding_forward(pack_rows(packed, width, spec_.specials.pad), firsts[i])
                                   : forward(pack_rows(packed, width, spec_.specials.pad));  // (G, width, V)
    const Tensor last = gather_positions(logits, at);                                        // (G, V)
    if (group.size() == rows.size()) return last;
    if (!out.defined()) out = empty({A, last.size(1)}, {.dtype = last.dtype()});
    const size_t bytes = static_cast<size_t>(last.size(1)) * dtype_size(last.dtype());
    for (size_t g = 0; g < group.size(); ++g)
      std::memcpy(static_cast<uint8_t*>(out.raw_data()) + group[g] * bytes,
                  static_cast<const uint8_t*>(last.const_raw_data()) + g * bytes, bytes);
  }
  return out;
}

Tensor CausalLM::cached_logits(DecodeState& st, const std::vector<int64_t>& rows_in) {
  const char* me = "CausalLM::decode_step";
  const auto A = static_cast<int64_t>(rows_in.size());
  CachedAttentionRows rows;
  TokenRows fresh;  // per row, its positions not yet cached
  int64_t N = 0;
  for (int64_t b : rows_in) {
    const auto ub = static_cast<size_t>(b);
    std::vector<int64_t> seq = sequence(st, b);
    const int64_t start = st.cached[ub];
    ATTO_CHECK(start < static_cast<int64_t>(seq.size()), me, "row ", b, " has no new token: its ", seq.size(),
               " tokens are all cached (append a token to decoded before the next step)");
    fresh.emplace_back(seq.begin() + start, seq.end());
    if (!spec_.stream) rows.prompt_lengths.push_back(prompt_length(seq.data(), static_cast<int64_t>(seq.size())));
    rows.cache_row.push_back(b);
    rows.start.push_back(start);
    rows.count.push_back(static_cast<int64_t>(fresh.back().size()));
    N = std::max(N, rows.count.back());
  }
  const Tensor tokens = pack_rows(fresh, N, spec_.specials.pad);  // (A, N)
  // A ring takes any number of new positions (a prompt longer than max_len among them).
  const bool ring = !st.cache.empty() && st.cache[0].layer->ring;
  check_tokens(tokens, options.vocab, ring ? std::numeric_limits<int64_t>::max() : options.max_len, me, "tokens",
               "max_len");
  rows.tokens = tokens;
  // The embedding at each row's own positions: x[a, i] = embed[tokens[a, i]] * scale + table[start[a] + i].
  const int64_t D = options.d_model;
  Tensor x = empty({A, N, D}, {.dtype = embed->weight.dtype()});  // (A, N, D)
  const Tensor positions = position_table();
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    const T* w = embed->weight.data<T>();
    const T* table = positions.defined() ? positions.data<T>() : nullptr;
    const int64_t* t = tokens.data<int64_t>();
    T* o = x.data<T>();
    const T scale = static_cast<T>(embedding_scale());
    for (int64_t a = 0; a < A; ++a)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t pos = std::min(rows.start[static_cast<size_t>(a)] + i, options.max_len - 1);  // padding
        const T* row = w + t[a * N + i] * D;
        T* q = o + (a * N + i) * D;
        for (int64_t k = 0; k < D; ++k) q[k] = row[k] * scale + (table != nullptr ? table[pos * D + k] : T(0));
      }
  });
  for (size_t l = 0; l < blocks->size(); ++l)
    x = blocks->at<CausalLMBlock>(static_cast<int64_t>(l))->forward_cached(x, *st.cache[l].layer, rows);
  std::vector<std::pair<int64_t, int64_t>> last;
  for (int64_t a = 0; a < A; ++a) last.emplace_back(a, rows.count[static_cast<size_t>(a)] - 1);
  for (size_t a = 0; a < rows.cache_row.size(); ++a) st.cached[static_cast<size_t>(rows.cache_row[a])] += rows.count[a];
  return output_logits(norm->forward(gather_positions(x, last)), true);  // (A, V)
}

void CausalLM::check_decode_state(const DecodeState& st) const {
  const char* me = "CausalLM::decode_step";
  st.validate(*this, me);
  if (!st.use_cache || st.cache.size() != blocks->size() || st.rows == 0) return;
  // The caches begin_decode made, one per block, for every row.
  const int64_t capacity = decode_capacity(st.sources);
  for (size_t i = 0; i < st.cache.size(); ++i) {
    const KVCache& c = st.cache[i];
    const bool ok = c.layer != nullptr && c.layer->rows == st.rows && c.layer->ring == slides() &&
                    (c.layer->ring || c.layer->capacity() == capacity);
    ATTO_CHECK(ok, me, "the decode state's cache ", i, " is not what begin_decode made for its ", st.rows, " rows");
  }
}

Tensor CausalLM::decode_step(DecodeState& st) {
  check_decode_state(st);
  if (st.active.empty()) return empty({0, options.vocab}, {.dtype = embed->weight.dtype()});
  if (!st.use_cache || st.cache.size() != blocks->size()) return recompute_logits(st, st.active);
  if (!st.cache.empty() && st.cache[0].layer->ring) return cached_logits(st, st.active);  // rings: any length
  // Rows whose sequence fits the cache decode from it; longer ones (cropped to max_len) recompute their window.
  const int64_t capacity = cache_capacity(st);
  std::vector<int64_t> from_cache, recompute;
  for (int64_t b : st.active) {
    const auto ub = static_cast<size_t>(b);
    const auto length = static_cast<int64_t>(prompt_tokens(st.sources[ub]).size() + st.decoded[ub].size());
    (window_start(length) == 0 && length <= capacity ? from_cache : recompute).push_back(b);
  }
  if (recompute.empty()) return cached_logits(st, from_cache);
  if (from_cache.empty()) return recompute_logits(st, recompute);
  const Tensor c = cached_logits(st, from_cache), r = recompute_logits(st, recompute);  // (Ac, V), (Ar, V)
  const int64_t V = options.vocab;
  Tensor out = empty({static_cast<int64_t>(st.active.size()), V}, {.dtype = c.dtype()});  // (A, V)
  const size_t bytes = static_cast<size_t>(V) * dtype_size(c.dtype());
  size_t ic = 0, ir = 0;
  for (size_t i = 0; i < st.active.size(); ++i) {
    const bool cached = ic < from_cache.size() && from_cache[ic] == st.active[i];
    const auto* src = static_cast<const uint8_t*>(cached ? c.const_raw_data() : r.const_raw_data());
    std::memcpy(static_cast<uint8_t*>(out.raw_data()) + i * bytes, src + (cached ? ic++ : ir++) * bytes, bytes);
  }
  return out;
}

std::vector<AttentionMap> CausalLM::attention_maps(const std::vector<int64_t>& src,
                                                   const std::vector<int64_t>& output) {
  std::vector<int64_t> tokens = prompt_tokens(src);
  tokens.insert(tokens.end(), output.begin(), output.end());
  if (static_cast<int64_t>(tokens.size()) > options.max_len)
    tokens.erase(tokens.begin(), tokens.end() - options.max_len);
  std::vector<Tensor> weights;
  {
    NoGradGuard no_grad;
    AttentionScope scope(*this);
    forward(row_tensor(tokens));
    weights = attention_weights();
  }
  std::vector<AttentionMap> maps;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!weights[i].defined()) continue;
    AttentionMap m{str_cat("layer ", i), weights[i], tokens, tokens};
    const CausalLMBlock& b = *block(static_cast<int64_t>(i));
    m.note = b.self_attn->weights_note();
    maps.push_back(std::move(m));
  }
  return maps;
}

}  // namespace attograd::nn

// The encoder-only tagging model (kind "encoder").

#include "nn/encoder_tagger.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/checkpoint.h"
#include "autograd/matmul.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/model_helpers.h"
#include "nn/init.h"

namespace attograd::nn {

namespace {

constexpr double kEncoderNormEps = 1e-5;  // the default recipe's: PyTorch's LayerNorm and TransformerEncoderLayer

}  // namespace

EncoderTagger::EncoderTagger(const EncoderTaggerOptions& o, Generator& gen) : options(o) {
  const char* me = "EncoderTagger";
  ATTO_CHECK(o.vocab > 0 && o.d_model > 0 && o.n_head > 0 && o.d_ff > 0 && o.max_len > 1 && o.n_layers >= 0, me,
             "vocab, d_model, n_head, d_ff must be positive, max_len > 1 and n_layers >= 0, got vocab=", o.vocab,
             ", d_model=", o.d_model, ", n_head=", o.n_head, ", d_ff=", o.d_ff, ", max_len=", o.max_len,
             ", n_layers=", o.n_layers);
  ATTO_CHECK(o.d_model % o.n_head == 0, me, "d_model must be divisible by n_head, got d_model=", o.d_model,
             ", n_head=", o.n_head);
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  ATTO_CHECK(o.pad_idx < o.vocab && o.sep_idx >= 0 && o.sep_idx < o.vocab, me, "pad_idx ", o.pad_idx,
             " and sep_idx ", o.sep_idx, " must be token ids below vocab=", o.vocab);
  const AttentionSpec& at = o.attention;
  at.validate(o.n_head);
  // Every layer's self-attention is the AttentionLayer make_attention builds for `at` (TransformerEncoderLayer's
  // options.attention), called bidirectionally (is_causal false) with a key padding mask. The kinds that are a
  // MultiheadAttention (the registry says which, AttentionKindInfo::multihead) can be; mla (causal only) and linear
  // (no key padding mask) cannot, and are refused here, when the model is built, not at its first forward. A kind made
  // of a score or mask function (alibi, softcap, a user's) is not taken yet: the model adds its own position table
  // whatever the kind's facts say, and no mod has been checked bidirectionally here.
  detail::plain_multihead_attention(at, {.d_model = o.d_model, .heads = o.n_head, .dropout = o.dropout,
                                         .max_len = o.max_len}, me, "encoder",
                                    "the encoder-only model keeps its own positions and has not been checked "
                                    "with mods");
  const ArchitectureSpec& arch = o.architecture;
  arch.validate();
  ATTO_CHECK(!at.rope && arch.positions != "rope", me, "model kind \"encoder\" does not support attention.rope "
             "(--rope) or positions 'rope': its positions are sinusoidal, learned or none");
  spec_ = {.vocab = o.vocab,
           .layers = o.n_layers,
           .d_model = o.d_model,
           .heads = o.n_head,
           .d_ff = o.d_ff,
           .dropout = o.dropout,
           .max_source_len = o.max_len - 1,
           .max_target_len = o.max_len - 1,
           .aligned = true,
           .specials = {.pad = o.pad_idx, .sep = o.sep_idx},
           .attention = o.attention,
           .architecture = o.architecture};
  embed = register_module("embed", std::make_shared<Embedding>(o.vocab, o.d_model, -1, gen));
  const double embed_std = 1.0 / std::sqrt(static_cast<double>(o.d_model));
  {
    NoGradGuard no_grad;
    init::normal_(embed->weight, 0.0, embed_std, gen);
  }
  if (arch.positions == "sinusoidal") {
    pos = register_module("pos", std::make_shared<PositionalEncoding>(o.d_model, o.max_len, o.dropout, gen));
  } else {
    if (arch.positions == "learned") {
      pos_embed = register_module("pos_embed", std::make_shared<Embedding>(o.max_len, o.d_model, -1, gen));
      NoGradGuard no_grad;
      init::normal_(pos_embed->weight, 0.0, embed_std, gen);
    }
    dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  }
  layers = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i)
    layers->push_back(std::make_shared<TransformerEncoderLayer>(
        TransformerEncoderLayerOptions{.d_model = o.d_model,
                                       .nhead = o.n_head,
                                       .dim_feedforward = o.d_ff,
                                       .dropout = o.dropout,
                                       .activation = arch.activation,
                                       .layer_norm_eps = arch.eps_or(kEncoderNormEps),
                                       .bias = arch.bias,
                                       .norm = arch.norm,
                                       .norm_first = true,
                                       .attention = at,
                                       .max_len = o.max_len},
        gen));
  norm = register_module("norm", detail::make_norm(arch, o.d_model, kEncoderNormEps));
  if (arch.head != "tied") head = register_module("head", std::make_shared<Linear>(o.d_model, o.vocab, arch.bias, gen));
  if (arch.init == "gpt2") {
    std::vector<Tensor> residual;
    for (const auto& m : *layers) {
      const auto& layer = static_cast<TransformerEncoderLayer&>(*m);
      residual.push_back(layer.self_attn->output_projection());
      residual.push_back(layer.linear2->weight);
    }
    detail::gpt2_init(*this, residual, o.n_layers, gen);
  }
  if (o.dtype != kFloat32) to(o.dtype);
}

std::shared_ptr<SequenceModel> EncoderTagger::build(const ModelSpec& s, Generator& gen) {
  ATTO_CHECK(s.aligned, "EncoderTagger",
             "the encoder-only model needs targets aligned with their sources (the same length); this data's "
             "targets are not: use the lm or seq2seq model");
  auto m = std::make_shared<EncoderTagger>(EncoderTaggerOptions{.vocab = s.vocab,
                                                                .d_model = s.d_model,
                                                                .n_head = s.heads,
                                                                .d_ff = s.d_ff,
                                                                .n_layers = s.layers,
                                                                .dropout = s.dropout,
                                                                .max_len = s.max_source_len + 1,
                                                                .pad_idx = s.specials.pad,
                                                                .sep_idx = s.specials.sep,
                                                                .attention = s.attention,
                                                                .architecture = s.architecture},
                                           gen);
  m->spec_ = s;
  return m;
}

Tensor EncoderTagger::forward(const Tensor& tokens) {
  const char* me = "EncoderTagger";
  detail::check_tokens(tokens, options.vocab, options.max_len, me, "tokens", "max_len");
  const Tensor kpm = options.pad_idx >= 0 ? detail::key_padding_mask(tokens, options.pad_idx) : Tensor();  // (B, L)
  Tensor x = embed->forward(tokens);  // (B, L, D)
  if (options.architecture.embed_scale == "sqrt") x = x * std::sqrt(static_cast<double>(options.d_model));
  if (pos) {
    x = pos->forward(x);  // + the sinusoidal table, dropout
  } else {
    if (pos_embed) x = x + narrow(pos_embed->weight, 0, 0, tokens.size(1));  // + (L, D)
    x = dropout->forward(x);
  }
  const auto n = static_cast<int64_t>(layers->size());
  for (int64_t i = 0; i < n; ++i) {
    std::shared_ptr<TransformerEncoderLayer> layer = layers->at<TransformerEncoderLayer>(i);
    // Checkpointing: every layer but the last recomputes its activations in the backward (dropout replayed from
    // default_generator() and the generator given to set_generator()).
    if (options.attention.checkpoint && i + 1 < n && is_grad_enabled() && x.requires_grad()) {
      CheckpointOptions co;
      if (generator_ != nullptr) co.generators.push_back(generator_);
      x = checkpoint(
          [layer, kpm](const std::vector<Tensor>& in) { return layer->forward(in[0], {.src_key_padding_mask = kpm}); },
          {x}, co);
    } else {
      x = layer->forward(x, {.src_key_padding_mask = kpm});
    }
  }
  return head ? head->forward(norm->forward(x)) : linear(norm->forward(x), embed->weight);  // (B, L, V)
}

void EncoderTagger::store_attention(bool on) {
  for (const auto& m : *layers) static_cast<TransformerEncoderLayer&>(*m).set_store_attention(on);
}

Tensor EncoderTagger::input_tokens(const TokenRows& sources) const {
  TokenRows rows = sources;
  size_t L = 0;
  for (auto& r : rows) {
    r.push_back(spec_.specials.sep);
    L = std::max(L, r.size());
  }
  return pack_rows(rows, static_cast<int64_t>(L), spec_.specials.pad);  // (B, L)
}

SequenceBatch EncoderTagger::make_batch(const std::vector<Example>& ex) const {
  const char* me = "EncoderTagger::make_batch";
  check_examples(ex, me);
  TokenRows sources;
  for (size_t i = 0; i < ex.size(); ++i) {
    ATTO_CHECK(ex[i].src.size() == ex[i].tgt.size(), me, "example ", i, " has a source of ", ex[i].src.size(),
               " tokens and a target of ", ex[i].tgt.size(),
               ": the encoder-only model needs a target as long as its source");
    sources.push_back(ex[i].src);
  }
  Tensor input = input_tokens(sources);  // (B, L)
  const int64_t B = input.size(0), L = input.size(1);
  Tensor target = full({B, L}, static_cast<double>(spec_.specials.ignore_index), {.dtype = kInt64});  // (B, L)
  int64_t* tg = target.data<int64_t>();
  for (size_t i = 0; i < ex.size(); ++i) {
    std::copy(ex[i].tgt.begin(), ex[i].tgt.end(), tg + static_cast<int64_t>(i) * L);
    tg[static_cast<int64_t>(i) * L + static_cast<int64_t>(ex[i].tgt.size())] = spec_.specials.eos;
  }
  return {.inputs = {input}, .target = target, .examples = ex};
}

Tensor EncoderTagger::forward_batch(const SequenceBatch& b) {
  ATTO_CHECK(b.inputs.size() == 1, "EncoderTagger", "a batch needs inputs {tokens}, got ", b.inputs.size(),
             " tensors");
  return forward(b.inputs[0]);  // (B, L, V)
}

DecodeState EncoderTagger::begin_decode(const TokenRows& sources) {
  DecodeState st = DecodeState::start(*this, sources);
  if (!sources.empty()) st.memory = {forward(input_tokens(sources))};  // (B, L, V)
  return st;
}

Tensor EncoderTagger::decode_step(DecodeState& st) {
  const char* me = "EncoderTagger::decode_step";
  st.validate(*this, me);
  if (st.active.empty()) return empty({0, options.vocab}, {.dtype = parameters().front().dtype()});
  // What begin_decode computed: the logits (B, L, V) of every row's source and SEP (L = the longest + 1).
  size_t longest = 0;
  for (const auto& r : st.sources) longest = std::max(longest, r.size());
  ATTO_CHECK(st.memory.size() == 1 && st.memory[0].defined() && st.memory[0].dim() == 3 &&
                 st.memory[0].size(0) == st.rows && st.memory[0].size(1) == static_cast<int64_t>(longest) + 1 &&
                 st.memory[0].size(2) == options.vocab && st.memory[0].dtype() == parameters().front().dtype(),
             me, "the decode state's memory is not the (", st.rows, ", ", longest + 1, ", ", options.vocab,
             ") logits begin_decode computed");
  // A row tags each source position, then gives EOS at SEP's; one more step (after another token there) can only
  // be EOS, and nothing follows that.
  for (int64_t b : st.active) {
    const size_t ub = static_cast<size_t>(b);
    ATTO_CHECK(st.decoded[ub].size() <= st.sources[ub].size() + 1, me, "row ", b, " has ", st.decoded[ub].size(),
               " decoded tokens, past the end of its source of ", st.sources[ub].size(),
               " tokens (at most one per source position, then EOS)");
  }
  const Tensor& logits = st.memory[0];  // (B, L, V)
  const int64_t L = logits.size(1), V = logits.size(2);
  std::vector<std::pair<int64_t, int64_t>> at;
  std::vector<size_t> past_end;  // rows whose next position lies after their SEP
  for (size_t i = 0; i < st.active.size(); ++i) {
    const auto b = static_cast<size_t>(st.active[i]);
    const auto t = static_cast<int64_t>(st.decoded[b].size());
    if (t > static_cast<int64_t>(st.sources[b].size())) past_end.push_back(i);
    at.emplace_back(static_cast<int64_t>(b), std::min(t, L - 1));
  }
  Tensor out = gather_positions(logits, at);  // (A, V)
  for (size_t i : past_end) {
    // Nothing is left to tag: EOS is the only choice.
    dispatch_float(out.dtype(), "EncoderTagger::decode_step", [&]<typename T>() {
      T* row = out.data<T>() + static_cast<int64_t>(i) * V;
      std::fill(row, row + V, -std::numeric_limits<T>::infinity());
      row[spec_.specials.eos] = 0;
    });
  }
  return out;
}

std::vector<AttentionMap> EncoderTagger::attention_maps(const std::vector<int64_t>& src,
                                                        const std::vector<int64_t>&) {
  std::vector<int64_t> tokens = src;
  tokens.push_back(spec_.specials.sep);
  std::vector<Tensor> weights;
  {
    NoGradGuard no_grad;
    detail::AttentionScope scope(*this);
    forward(detail::row_tensor(tokens));
    for (const auto& m : *layers) weights.push_back(static_cast<TransformerEncoderLayer&>(*m).last_attention());
  }
  std::vector<AttentionMap> maps;
  for (size_t i = 0; i < weights.size(); ++i) maps.push_back({str_cat("layer ", i), weights[i], tokens, tokens});
  return maps;
}

std::string EncoderTagger::extra_repr() const {
  const EncoderTaggerOptions& o = options;
  return str_cat("vocab=", o.vocab, ", d_model=", o.d_model, ", n_head=", o.n_head, ", d_ff=", o.d_ff,
             ", n_layers=", o.n_layers, ", dropout=", o.dropout, ", max_len=", o.max_len, ", pad_idx=", o.pad_idx,
             ", sep_idx=", o.sep_idx, o.attention == AttentionSpec{} ? std::string() : ", attention=" + o.attention.kind,
             o.attention.checkpoint ? ", checkpoint=True" : "",
             o.architecture == ArchitectureSpec{} ? "" : ", " + detail::architecture_words(o.architecture));
}

}  // namespace attograd::nn

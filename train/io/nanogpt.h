#pragma once
// nanoGPT's state-dict names (karpathy/nanoGPT model.py): a decoder-only model of the nanoGPT recipe written so that
// nanoGPT's `GPT(GPTConfig(**config)).load_state_dict(sd)` loads it strictly, and such a state dict read back.
//
//   attograd (CausalLM)                  nanoGPT (GPT)                              shape
//   embed.weight                         transformer.wte.weight, lm_head.weight     (vocab_size, n_embd)
//   pos_embed.weight                     transformer.wpe.weight                     (block_size, n_embd)
//   blocks.{i}.norm1.weight / .bias      transformer.h.{i}.ln_1.weight / .bias      (n_embd)
//   blocks.{i}.self_attn.in_proj_weight  transformer.h.{i}.attn.c_attn.weight       (3 n_embd, n_embd)  [q; k; v]
//   blocks.{i}.self_attn.in_proj_bias    transformer.h.{i}.attn.c_attn.bias         (3 n_embd)
//   blocks.{i}.self_attn.out_proj.*      transformer.h.{i}.attn.c_proj.*            (n_embd, n_embd), (n_embd)
//   blocks.{i}.norm2.weight / .bias      transformer.h.{i}.ln_2.weight / .bias      (n_embd)
//   blocks.{i}.ff.linear1.*              transformer.h.{i}.mlp.c_fc.*               (4 n_embd, n_embd), (4 n_embd)
//   blocks.{i}.ff.linear2.*              transformer.h.{i}.mlp.c_proj.*             (n_embd, 4 n_embd), (n_embd)
//   norm.weight / .bias                  transformer.ln_f.weight / .bias            (n_embd)
//   (none: the causal mask is built in)  transformer.h.{i}.attn.bias (buffer)       (1, 1, block_size, block_size)
//
// The .bias tensors exist only when GPTConfig.bias. nanoGPT ties lm_head to wte (the same Parameter); safetensors
// cannot share storage and nanoGPT's strict load needs both keys, so the file holds two equal copies, and a file
// whose copies differ is refused (an untied head is not nanoGPT's). Under PyTorch < 2.0 (no
// scaled_dot_product_attention) nanoGPT registers the causal mask as a persistent buffer "attn.bias" =
// tril(ones(block_size, block_size)).view(1, 1, block_size, block_size), so its state dict and its strict load have
// it; under PyTorch >= 2.0 it has none. The writer includes it by default (NanoGPTWriteOptions::mask_buffer), the
// reader accepts a file with it in every block or in none, and checks its values.
//
// The GPTConfig (block_size, vocab_size, n_layer, n_head, n_embd, dropout, bias) is written into the safetensors
// metadata as the JSON string "nanogpt_config"; a file without it (a state dict saved from nanoGPT) has its config
// inferred from the shapes, except n_head, which no shape holds (NanoGPTFile::has_n_head).

#include <cstdint>
#include <map>
#include <string>

#include "nn/sequence_model.h"
#include "train/io/serialize.h"

namespace attograd::io {

/// nanoGPT's GPTConfig.
struct NanoGPTConfig {
  int64_t block_size = 0;  ///< context length: rows of wpe
  int64_t vocab_size = 0;  ///< tokens: rows of wte
  int64_t n_layer = 0;     ///< blocks
  int64_t n_head = 0;      ///< attention heads (0: unknown, a config inferred from shapes alone)
  int64_t n_embd = 0;      ///< width
  double dropout = 0.0;    ///< every dropout probability
  bool bias = true;        ///< biases in the Linears and LayerNorms
  /// {"block_size": ..., "vocab_size": ..., "n_layer": ..., "n_head": ..., "n_embd": ..., "dropout": ..., "bias": ...}.
  std::string to_json() const;
  /// Parses to_json()'s output (Error naming `origin` and the field on a missing field, an unknown one or a wrong
  /// type).
  static NanoGPTConfig from_json(const std::string& text, const std::string& origin);
  /// Field-wise equality.
  bool operator==(const NanoGPTConfig&) const = default;
};

/// The metadata key of the GPTConfig JSON.
inline constexpr const char* kNanoGPTConfigKey = "nanogpt_config";

/// Error naming the option (kind, attention, rope, positions, activation, norm, norm_eps, embed_scale, head, d_ff)
/// and its value unless a model of this kind and spec is one nanoGPT's GPT expresses: kind "lm", plain "mha"
/// attention without RoPE, learned positions, GELU (erf), LayerNorm with eps 1e-5, no embedding scale, the head
/// tied to the embedding and d_ff = 4 d_model. Biases on or off are both expressible (GPTConfig.bias).
void check_nanogpt(const std::string& kind, const nn::ModelSpec& spec);
/// The GPTConfig of such a model (check_nanogpt first; block_size is the model's longest input).
NanoGPTConfig nanogpt_config(const nn::SequenceModel& model);
/// The attograd spec of a nanoGPT model: a stream ("lm" language model of a token stream) with the nanogpt recipe
/// (learned positions, gelu, layernorm eps 1e-5, no embedding scale, gpt2 init, tied head, bias = config.bias),
/// max_source_len = block_size and max_target_len = 1 (so that the model's longest input is block_size), d_ff =
/// 4 n_embd. Error naming the field when a size is not positive or n_head does not divide n_embd.
nn::ModelSpec nanogpt_model_spec(const NanoGPTConfig& config);

/// How nanoGPT names are written.
struct NanoGPTWriteOptions {
  /// Write every block's causal-mask buffer "transformer.h.{i}.attn.bias" (nanoGPT under PyTorch < 2.0 has it in
  /// its state dict; under PyTorch >= 2.0 it has none, and a strict load refuses it).
  bool mask_buffer = true;
};

/// The model's tensors under nanoGPT's names (check_nanogpt first): lm_head.weight a copy of wte, the mask buffers
/// when options.mask_buffer; in nanoGPT's state_dict order.
NamedTensors nanogpt_state_dict(const nn::SequenceModel& model, const NanoGPTWriteOptions& options = {});
/// Writes nanogpt_state_dict() as safetensors with `metadata` plus "nanogpt_config" (and "format": "pt").
void export_nanogpt(const nn::SequenceModel& model, const std::string& path,
                    const std::map<std::string, std::string>& metadata = {}, const NanoGPTWriteOptions& options = {});

/// A nanoGPT state dict read and checked.
struct NanoGPTFile {
  NanoGPTConfig config;                         ///< from the metadata, else inferred from the shapes (n_head 0)
  bool has_n_head = false;                      ///< whether config.n_head is known (the metadata has a GPTConfig)
  NamedTensors tensors;                         ///< under attograd's names (CausalLM's), without lm_head and masks
  std::map<std::string, std::string> metadata;  ///< the file's metadata
};

/// Reads a safetensors file of nanoGPT names. Error naming the file and: every unknown and every missing name
/// (one line), a shape that does not match the config, lm_head.weight not equal to transformer.wte.weight, mask
/// buffers in some blocks but not others or not tril(ones), a metadata config that contradicts the shapes, a
/// dtype that is not F32 or F64, or NaN / +-inf in a tensor (unless options.allow_nonfinite).
NanoGPTFile read_nanogpt(const std::string& path, const ReadOptions& options = {});
/// Loads file.tensors into `model` strictly (io::load_into), after checking that the model's GPTConfig equals the
/// file's (n_head only when the file knows it; dropout not compared). Error naming the field that differs.
LoadReport load_nanogpt(nn::SequenceModel& model, const NanoGPTFile& file, const std::string& origin);

}  // namespace attograd::io

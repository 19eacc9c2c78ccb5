#pragma once
// The built-in attention kinds, each defined in its own file of nn/attention/ (internal: the registry in
// nn/attention_layer.cpp lists them first, in this order).

#include <string>

#include "nn/attention.h"
#include "nn/attention_layer.h"

namespace attograd::nn::detail {

/// One registry entry: a kind's name, factory and facts.
struct AttentionKindEntry {
  std::string kind;
  AttentionFactory factory;
  AttentionKindInfo info;
};

AttentionKindEntry mha_attention_kind();           ///< nn/attention/mha.cpp
AttentionKindEntry gqa_attention_kind();           ///< nn/attention/gqa.cpp
AttentionKindEntry mla_attention_kind();           ///< nn/attention/mla.cpp
AttentionKindEntry local_attention_kind();         ///< nn/attention/local.cpp
AttentionKindEntry block_sparse_attention_kind();  ///< nn/attention/block_sparse.cpp
AttentionKindEntry linear_attention_kind();        ///< nn/attention/linear.cpp
AttentionKindEntry alibi_attention_kind();         ///< nn/attention/alibi.cpp
AttentionKindEntry softcap_attention_kind();       ///< nn/attention/softcap.cpp
AttentionKindEntry prefix_lm_attention_kind();     ///< nn/attention/prefix_lm.cpp
AttentionKindEntry document_attention_kind();      ///< nn/attention/document.cpp
AttentionKindEntry seed_attention_kind();          ///< nn/attention/seed_mha.cpp (internal: the seq2seq model's)

}  // namespace attograd::nn::detail

namespace attograd::nn::detail {

/// A kind that is a MultiheadAttention with the options `multihead` gives (mha, gqa, local, block-sparse): the
/// entry with its factory (nn/attention/mha.cpp).
AttentionKindEntry multihead_attention_kind(const std::string& kind, AttentionKindInfo info);
/// The MultiheadAttention options every such kind starts from: the model's width, heads and dropout, RoPE from
/// spec.rope over config.max_len positions (nn/attention/mha.cpp).
MultiheadAttentionOptions base_multihead_options(const AttentionSpec& spec, const AttentionConfig& config);

}  // namespace attograd::nn::detail

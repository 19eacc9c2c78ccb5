#pragma once
// What the key/value-cache tests share (tests/nn/test_kv_cache.cpp, test_causal_lm_variants.cpp,
// test_mla_linear_cache.cpp): greedy decoding through a model's begin_decode / decode_step, traced step by step, and
// the comparisons of a cached decode against the full recomputation.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "nn/attention.h"  // nn::KeyValueCache
#include "nn/sequence_model.h"
#include "testing.h"

namespace attograd::testing {

/// Mixed prompt lengths (a row of one token among them).
inline const nn::TokenRows kDecodeSources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 12}, {5, 4}};

/// Cached vs recomputed logits: equal within this (absolute and relative) per dtype. The cached path multiplies
/// matrices of other shapes than the full one, so its logits are not bitwise the recomputation's.
inline double decode_tolerance(Dtype dt) { return dt == kFloat64 ? 1e-11 : 2e-5; }

/// The argmax of row i of logits (A, V).
inline int64_t row_argmax(const Tensor& logits, int64_t i) {
  const std::vector<double> v = logits.to_vector<double>();
  const int64_t V = logits.size(1);
  return static_cast<int64_t>(std::max_element(v.begin() + i * V, v.begin() + (i + 1) * V) - (v.begin() + i * V));
}

/// A greedy decode, step by step.
struct DecodeTrace {
  std::vector<Tensor> logits = {};  ///< per step (A, V)
  nn::TokenRows decoded = {};       ///< per row, its tokens
  size_t cache_blocks = 0;          ///< st.cache.size() after begin_decode
  int64_t cache_heads = 0;          ///< heads of the first cache's keys (0 without keys)
  int64_t cached_steps = 0;         ///< steps after which some row had positions in the cache
};

/// `steps` greedy steps (argmax; EOS not special) through begin_decode / decode_step, from the cache or recomputing;
/// row b stops after stop_after[b] steps (rows finishing early: state.active shrinks).
inline DecodeTrace run_greedy(nn::SequenceModel& m, const nn::TokenRows& sources, int64_t steps, bool use_cache,
                              const std::vector<int64_t>& stop_after = {}) {
  NoGradGuard no_grad;
  nn::DecodeState st = m.begin_decode(sources);
  st.use_cache = use_cache;
  DecodeTrace t;
  t.cache_blocks = st.cache.size();
  // Heads of the first layer's keys: the seq2seq decoder's plain cache, or a MultiheadAttention's KeyValueCache.
  const auto* kv = st.cache.empty() ? nullptr : dynamic_cast<const nn::KeyValueCache*>(st.cache[0].layer.get());
  t.cache_heads = kv != nullptr                                  ? kv->key.size(1)
                  : st.cache.empty() || !st.cache[0].key.defined() ? 0
                                                                   : st.cache[0].key.size(1);
  for (int64_t s = 0; s < steps && !st.active.empty(); ++s) {
    Tensor l = m.decode_step(st);
    EXPECT_EQ(l.size(0), static_cast<int64_t>(st.active.size()));
    t.logits.push_back(l);
    if (std::any_of(st.cached.begin(), st.cached.end(), [](int64_t c) { return c > 0; })) ++t.cached_steps;
    std::vector<int64_t> still;
    for (size_t i = 0; i < st.active.size(); ++i) {
      const auto b = static_cast<size_t>(st.active[i]);
      st.decoded[b].push_back(row_argmax(l, static_cast<int64_t>(i)));
      if (stop_after.empty() || static_cast<int64_t>(st.decoded[b].size()) < stop_after[b])
        still.push_back(st.active[i]);
    }
    st.active = std::move(still);
  }
  t.decoded = st.decoded;
  return t;
}

/// The same tokens, and every step's logits within decode_tolerance(dt).
inline void expect_same_decode(const DecodeTrace& cached, const DecodeTrace& full, Dtype dt) {
  EXPECT_EQ(cached.decoded, full.decoded);
  ASSERT_EQ(cached.logits.size(), full.logits.size());
  for (size_t s = 0; s < full.logits.size(); ++s)
    EXPECT_TRUE(all_close(cached.logits[s], full.logits[s], decode_tolerance(dt), decode_tolerance(dt)))
        << "step " << s;
}

/// HF's test: the rows `next` (4 tokens each) appended at once, 3 then 1 resumed from the cache, and a prefill then
/// the 4 as new positions give the full recomputation's logits (within decode_tolerance(dt)); the resumed state
/// caches as many positions as the one fed at once. Returns the per-row cached counts of the one fed at once.
inline std::vector<int64_t> expect_new_positions_at_once(nn::SequenceModel& m, const nn::TokenRows& sources,
                                                         const nn::TokenRows& next, Dtype dt) {
  NoGradGuard no_grad;
  // (a) all appended before one step (the prefill feeds prompt + next).
  nn::DecodeState at_once = m.begin_decode(sources);
  at_once.decoded = next;
  const Tensor la = m.decode_step(at_once);
  // (b) all but the last, then the last resumed from the cache.
  nn::DecodeState resumed = m.begin_decode(sources);
  for (size_t b = 0; b < next.size(); ++b) resumed.decoded[b].assign(next[b].begin(), next[b].end() - 1);
  m.decode_step(resumed);
  for (size_t b = 0; b < next.size(); ++b) resumed.decoded[b].push_back(next[b].back());
  const Tensor lb = m.decode_step(resumed);
  // (c) a prefill of the prompt, then every token of next fed together as new positions.
  nn::DecodeState after_prefill = m.begin_decode(sources);
  m.decode_step(after_prefill);
  after_prefill.decoded = next;
  const Tensor lc = m.decode_step(after_prefill);
  // (d) the full recomputation.
  nn::DecodeState full = m.begin_decode(sources);
  full.use_cache = false;
  full.decoded = next;
  const Tensor ld = m.decode_step(full);
  const double tol = decode_tolerance(dt);
  EXPECT_TRUE(all_close(la, ld, tol, tol));
  EXPECT_TRUE(all_close(lb, ld, tol, tol));
  EXPECT_TRUE(all_close(lc, ld, tol, tol));
  EXPECT_EQ(resumed.cached, at_once.cached);
  return at_once.cached;
}

}  // namespace attograd::testing

#include "autograd/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/cpu/kernels.h"
#include "autograd/elementwise.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"

namespace attograd {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

using Plan = cpu::AttentionPlan;
using cpu::HeadView;
using cpu::MaskKind;

// Where the heads of a (B, H, L, d) operand live in a tensor's data: feature x of row l of head (b, h) is at
// data + off + b * sb + h * sh + l * sl + x. Contiguous (B, H, L, d) tensors and head-interleaved (B, L, H * d)
// ones (a linear projection's output, or one third of a packed q|k|v projection) are both such views.
struct Layout {
  int64_t off = 0, sb = 0, sh = 0, sl = 0;
};

template <class T>
HeadView<T> view_of(T* data, const Layout& l) {
  return {data + l.off, l.sb, l.sh, l.sl};
}

// (B, H, L, d) contiguous.
Layout bhld(int64_t H, int64_t L, int64_t d) { return {0, H * L * d, L * d, d}; }
// (B, L, H * d) with head h in features [h d, (h + 1) d), starting at feature `first` of rows of `row` features.
Layout blhd(int64_t L, int64_t d, int64_t row, int64_t first) { return {first, L * row, d, row}; }

// Validates the options and the mask against the scores `target` ((B, H, Lq, Lk) or (N, Lq, Lk): what the error
// messages show), and resolves the scale, the mask strides and the dropout seed into p (whose sizes are set).
void finish_plan(Plan& p, const Tensor& q, const Tensor& k, const Shape& target, const AttentionOptions& opts) {
  ATTO_CHECK(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0, kOp, "dropout_p must be in [0, 1), got ", opts.dropout_p);
  ATTO_CHECK(std::isfinite(opts.scale), kOp, "scale must be finite (0 = 1/sqrt(d_k)), got ", opts.scale);
  p.scale = opts.scale != 0.0 ? opts.scale : (p.dk > 0 ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : 1.0);
  p.causal = opts.is_causal;
  p.one_pass_rows = detail::attention_one_pass_rows();
  ATTO_CHECK(opts.window >= 0, kOp, "window must be >= 0 (0 = off), got ", opts.window);
  p.window = opts.window;
  ATTO_CHECK(opts.block_size >= 0, kOp, "block_size must be >= 0 (0 = off), got ", opts.block_size);
  ATTO_CHECK((opts.block_size > 0) == opts.block_layout.defined(), kOp, "block_size (", opts.block_size,
             ") and block_layout (", opts.block_layout.defined() ? "given" : "undefined", ") go together");
  if (opts.block_size > 0) {
    const Tensor& lay = opts.block_layout;
    const int64_t b = opts.block_size, nbq = (p.Lq + b - 1) / b, nbk = (p.Lk + b - 1) / b;
    ATTO_CHECK(lay.dtype() == kBool && lay.shape() == Shape({nbq, nbk}), kOp,
               "block_layout must be bool (ceil(Lq / block_size), ceil(Lk / block_size)) = ", Shape{nbq, nbk},
               " for Lq = ", p.Lq, ", Lk = ", p.Lk, ", block_size = ", b, ", got ", dtype_name(lay.dtype()), " ",
               lay.shape());
    p.block = b, p.nbq = nbq, p.nbk = nbk;
    p.layout = static_cast<const bool*>(lay.const_raw_data());
  }

  const Tensor& mask = opts.attn_mask;
  if (mask.defined()) {
    ATTO_CHECK(mask.dtype() == kBool || mask.dtype() == q.dtype(), kOp, "attn_mask must be bool or ",
               dtype_name(q.dtype()), " (q's dtype), got ", dtype_name(mask.dtype()), " attn_mask ", mask.shape());
    const Shape& ms = mask.shape();
    bool ok = ms.size() <= target.size();
    for (size_t k2 = 0; ok && k2 < ms.size(); ++k2) {
      int64_t md = ms[ms.size() - 1 - k2], td = target[target.size() - 1 - k2];
      ok = md == td || md == 1;
    }
    ATTO_CHECK(ok, kOp, "attn_mask of shape ", ms, " does not broadcast to the scores ", target,
               target.size() == 4 ? " (B, H, Lq, Lk)" : " (N, Lq, Lk)", " of q ", q.shape(), " and k ", k.shape());
    // Right-aligned strides of the mask over the target; 0 where the mask dimension is broadcast.
    std::vector<int64_t> st(target.size(), 0);
    int64_t s = 1;
    for (size_t k2 = 0; k2 < ms.size(); ++k2) {
      size_t mdim = ms.size() - 1 - k2, tdim = target.size() - 1 - k2;
      st[tdim] = ms[mdim] == 1 ? 0 : s;
      s *= ms[mdim];
    }
    if (target.size() == 4) {
      p.mb = st[0], p.mh = st[1], p.mi = st[2], p.mj = st[3];
    } else {
      p.mb = st[0], p.mh = 0, p.mi = st[1], p.mj = st[2];
    }
    p.mask_kind = mask.dtype() == kBool ? MaskKind::Bool : MaskKind::Float;
  }

  if (opts.dropout_p > 0.0) {
    p.dropout = true;
    Generator& gen = opts.generator ? *opts.generator : default_generator();
    p.seed = gen.next_u64();
    p.drop_below = static_cast<uint64_t>(std::ceil(opts.dropout_p * 0x1.0p32));
    p.keep_scale = 1.0 / (1.0 - opts.dropout_p);
  }
}

void check_float_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  ATTO_CHECK(is_floating(q.dtype()), kOp, "q must be float32 or float64, got ", dtype_name(q.dtype()), " q ",
             q.shape());
  ATTO_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, "dtype mismatch: q ", dtype_name(q.dtype()), " ",
             q.shape(), ", k ", dtype_name(k.dtype()), " ", k.shape(), ", v ", dtype_name(v.dtype()), " ", v.shape(),
             " (convert with .to())");
}

// Validates scaled_dot_product_attention's inputs (every user error names the op and the shapes).
Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined tensors");
  const int64_t rank = q.dim();
  ATTO_CHECK((rank == 3 || rank == 4) && k.dim() == rank && v.dim() == rank, kOp,
             "q, k and v must all be 4-D (B, H, L, d) or all 3-D (N, L, d), got q ", q.shape(), ", k ", k.shape(),
             ", v ", v.shape());
  check_float_inputs(q, k, v);
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  for (int64_t d = 0; d < rank - 2; ++d) {
    // Dimension 1 of 4-D inputs: k and v may have H_kv heads dividing q's H (grouped-query attention).
    const bool heads = rank == 4 && d == 1;
    ATTO_CHECK(ks[d] == vs[d] && (qs[d] == ks[d] || (heads && ks[d] > 0 && qs[d] % ks[d] == 0)), kOp,
               "batch/head dimensions differ: q ", qs, ", k ", ks, ", v ", vs, " (dimension ", d, ": ", qs[d], ", ",
               ks[d], ", ", vs[d], ")", heads ? "; k and v may have H_kv heads dividing q's H" : "");
  }
  ATTO_CHECK(qs[rank - 1] == ks[rank - 1], kOp, "d_k mismatch: q ", qs, " has d_k = ", qs[rank - 1], " but k ", ks,
             " has d_k = ", ks[rank - 1]);
  ATTO_CHECK(ks[rank - 2] == vs[rank - 2], kOp, "Lk mismatch: k ", ks, " has ", ks[rank - 2], " keys but v ", vs,
             " has ", vs[rank - 2], " values");
  Plan p;
  p.B = qs[0];
  p.H = rank == 4 ? qs[1] : 1;
  p.Hkv = rank == 4 ? ks[1] : 1;
  ATTO_CHECK(opts.num_kv_heads == 0 || opts.num_kv_heads == p.Hkv, kOp, "num_kv_heads = ", opts.num_kv_heads,
             " differs from the heads of k ", ks, " (scaled_dot_product_attention reads H_kv from k)");
  p.Lq = qs[rank - 2];
  p.Lk = ks[rank - 2];
  p.dk = qs[rank - 1];
  p.dv = vs[rank - 1];
  finish_plan(p, q, k, rank == 4 ? Shape{p.B, p.H, p.Lq, p.Lk} : Shape{p.B, p.Lq, p.Lk}, opts);
  return p;
}

// The mods of one call, alive as long as its backward: the kernels' FlexArgs point into it.
struct FlexState {
  cpu::FlexArgs args;
  BlockMask block_mask;
  MaskFn mask;
  ScoreFn score;
  std::vector<Tensor> captures;  // detached
  Captures views;
  std::vector<int64_t> cap_offset;  // flat start of each capture in a group's gradient slice
};

// Validates the mods of opts for the plan's shapes and builds (or takes from the mask_mod's cache) the block mask;
// null without mods.
std::shared_ptr<FlexState> make_flex(const Plan& p, const AttentionOptions& opts) {
  const bool has_mask = static_cast<bool>(opts.mask_mod) || static_cast<bool>(opts.block_mask);
  if (!has_mask && !opts.score_mod) {
    ATTO_CHECK(opts.score_mod.captures.empty(), kOp, "score_mod has ", opts.score_mod.captures.size(),
               " captures but no function");
    return nullptr;
  }
  ATTO_CHECK(opts.mod_q_offset >= 0, kOp, "mod_q_offset must be >= 0, got ", opts.mod_q_offset);
  ATTO_CHECK(!(opts.mask_mod && opts.block_mask), kOp,
             "give mask_mod or block_mask (which holds its mask_mod), not both");
  auto st = std::make_shared<FlexState>();
  if (has_mask) {
    st->block_mask = opts.block_mask ? opts.block_mask
                                     : opts.mask_mod.block_mask(p.B, p.H, p.Lq, p.Lk, opts.mod_q_offset);
    const BlockMask& bm = st->block_mask;
    ATTO_CHECK(bm.q_len() == p.Lq && bm.kv_len() == p.Lk && (bm.batch() == 1 || bm.batch() == p.B) &&
                   (bm.heads() == 1 || bm.heads() == p.H) && bm.q_offset() == opts.mod_q_offset,
               kOp, "block_mask built for (B, H, Lq, Lk) = (", bm.batch(), ", ", bm.heads(), ", ", bm.q_len(), ", ",
               bm.kv_len(), ") at q_offset ", bm.q_offset(), " does not fit the scores (", p.B, ", ", p.H, ", ", p.Lq,
               ", ", p.Lk, ") at mod_q_offset ", opts.mod_q_offset);
    st->mask = bm.mask_fn();
    st->args.kinds = bm.q_len() > 0 && bm.kv_len() > 0 ? bm.row(0, 0, 0) : nullptr;
    st->args.bits_at = st->args.kinds ? bm.partial_row(0, 0, 0) : nullptr;
    st->args.bits = bm.partial_bits();
    st->args.mB = bm.batch(), st->args.mH = bm.heads(), st->args.nbq = bm.q_blocks(), st->args.nbk = bm.kv_blocks();
    st->args.bs = bm.block_size();
    st->args.mask = &st->mask;
    if (!st->args.kinds) {  // no query or no key: nothing to skip; a dummy all-empty mask keeps the path uniform
      st->args.mB = st->args.mH = 1, st->args.nbq = st->args.nbk = 0;
    }
  }
  if (opts.score_mod) {
    st->score = opts.score_mod.fn;
    for (const Tensor& t : opts.score_mod.captures) {
      ATTO_CHECK(t.defined(), kOp, "score_mod capture ", st->captures.size(), " is undefined");
      st->captures.push_back(t.detach());
    }
    st->views = Captures(st->captures);
    int64_t off = 0;
    for (const Tensor& t : st->captures) {
      st->cap_offset.push_back(off);
      off += t.numel();
    }
    st->args.score = &st->score;
    st->args.captures = &st->views;
    st->args.cap_numel = off;
    st->args.cap_offset = st->cap_offset.data();
  }
  st->args.q_offset = opts.mod_q_offset;
  // The dense path: a mask alone (no window or layout) whose rows of blocks are prefixes, every partial block kept,
  // the dense rows of queries (32, or Lq when shorter) inside one row of blocks.
  if (st->args.kinds && !opts.score_mod && opts.window == 0 && opts.block_size == 0 &&
      (st->args.bs % 32 == 0 || p.Lq <= st->args.bs)) {
    const cpu::FlexArgs& a = st->args;
    bool dense = true;
    const int64_t rows = a.mB * a.mH * a.nbq;
    for (int64_t r = 0; dense && r < rows; ++r) {
      const uint8_t* k = a.kinds + r * a.nbk;
      const int64_t* at = a.bits_at + r * a.nbk;
      bool ended = false;
      for (int64_t c = 0; dense && c < a.nbk; ++c) {
        if (k[c] == 0) ended = true;
        else dense = !ended && (k[c] != 1 || at[c] >= 0);
      }
    }
    st->args.dense = dense;
  }
  return st;
}

// Runs the attention of inputs[qi], inputs[ki], inputs[vi] (seen through the layouts lq, lk, lv), writes the output
// (out_shape, layout lo) and records the op on `inputs` (each gets its own gradient; q, k, v may be regions of
// one input).
AttentionResult run_attention(const Plan& plan_in, const std::vector<Tensor>& inputs_in, size_t qi, size_t ki,
                              size_t vi, Layout lq, Layout lk, Layout lv, const Shape& out_shape, Layout lo,
                              const Shape& w_shape, const AttentionOptions& opts) {
  // The mods (null without any: then plan and inputs are exactly as given). A score_mod's captures join the inputs.
  const std::shared_ptr<FlexState> fx = make_flex(plan_in, opts);
  Plan plan = plan_in;
  std::vector<Tensor> inputs = inputs_in;
  const size_t n_main = inputs.size();
  // Under autocast (float32 only) q, k and v enter as bfloat16 values: the products Q K^T are then those of bf16
  // operands accumulated in float32. The scores, the softmax and P V stay float32 (docs/CPU.md).
  if (autocast_precision() == Precision::bfloat16 && inputs[0].dtype() == kFloat32)
    for (size_t i = 0; i < n_main; ++i) inputs[i] = round_to_bf16(inputs[i]);
  if (fx) {
    plan.flex = &fx->args;
    for (const Tensor& t : opts.score_mod.captures) inputs.push_back(t);
  }
  const Tensor& mask = opts.attn_mask;
  const void* mask_data = mask.defined() ? mask.raw_data() : nullptr;
  Tensor layout = opts.block_layout.defined() ? opts.block_layout.detach() : Tensor();  // kept alive for the backward
  const Dtype dt = inputs[0].dtype();
  Tensor out = empty(out_shape, {.dtype = dt});
  bool save = false;
  if (is_grad_enabled())
    for (const Tensor& t : inputs) save = save || t.requires_grad();
  Tensor stats = save ? empty({plan.B, plan.H, plan.Lq, 2}, {.dtype = dt}) : Tensor();
  // Short sequences keep their probabilities: the backward then skips recomputing Q K^T, the masks and the
  // exponentials, about a fifth of its work at L = 32 ... 64, for 16 KB per head at most.
  Tensor probs = save && plan.Lq * plan.Lk <= detail::attention_saved_probs_limit() && !(fx && fx->args.score)
                     ? empty({plan.B, plan.H, plan.Lq, plan.Lk}, {.dtype = dt})
                     : Tensor();
  AttentionResult result;
  if (opts.need_weights) result.weights = empty(w_shape, {.dtype = dt});
  // With need_entropy the op's one recorded output is a flat buffer [output | entropy (B, H, Lq)], so that both
  // parts' gradients reach one backward; output and entropy are then copied out of its two parts (narrow).
  const bool ent = opts.need_entropy;
  const int64_t n_out = shape_numel(out_shape), n_ent = plan.B * plan.H * plan.Lq;
  if (ent) out = empty({n_out + n_ent}, {.dtype = dt});

  dispatch_float(dt, kOp, [&]<typename T>() {
    const auto forward = ATTO_CPU(attention_forward<T>);
    // Read through a const view: a non-const data<T>() is a write access (it bumps the version of a leaf in no-grad).
    const std::vector<Tensor>& in = inputs;
    forward(plan, view_of<const T>(in[qi].data<T>(), lq), view_of<const T>(in[ki].data<T>(), lk),
            view_of<const T>(in[vi].data<T>(), lv), mask_data, view_of<T>(out.data<T>(), lo),
            save ? stats.data<T>() : nullptr, opts.need_weights ? result.weights.data<T>() : nullptr,
            probs.defined() ? probs.data<T>() : nullptr, ent ? out.data<T>() + n_out : nullptr);
  });
  // (B, H, Lq), or (N, Lq) for 3-D inputs (w_shape without its last dimension).
  const Shape ent_shape(w_shape.begin(), w_shape.end() - 1);
  auto split_result = [&](const Tensor& packed) {
    if (!ent) {
      result.output = packed;
      return result;
    }
    result.output = reshape(narrow(packed, 0, 0, n_out), out_shape);
    result.entropy = reshape(narrow(packed, 0, n_out, n_ent), ent_shape);
    return result;
  };

  if (!save) return split_result(out);
  std::vector<Tensor> saved;
  saved.reserve(inputs.size());
  for (const Tensor& t : inputs) saved.push_back(t.detach());
  Tensor md = mask.defined() ? mask.detach() : Tensor();
  Tensor od = out.detach();
  Tensor recorded = record(
      kOp, out, inputs,
      [plan, saved, md, layout, od, stats, probs, qi, ki, vi, lq, lk, lv, lo, ent, n_out, fx, n_main](
          const Tensor& g, GradInputs& gi) {
        ATTO_CHECK(g.dtype() == od.dtype(), kOp, "gradient dtype ", dtype_name(g.dtype()),
                   " differs from the output's ", dtype_name(od.dtype()));
        std::vector<Tensor> grads(saved.size());
        for (size_t i = 0; i < n_main; ++i)
          if (gi.needs(i)) grads[i] = zeros(saved[i].shape(), {.dtype = saved[i].dtype()});
        // The captures' gradients: one slice per key/value-head group (each written by one thread), summed in order.
        Plan bplan = plan;
        cpu::FlexArgs bargs;
        std::vector<double> cap_grad;
        bool want_caps = false;
        for (size_t i = n_main; i < saved.size(); ++i) want_caps = want_caps || gi.needs(i);
        if (fx) {
          bargs = fx->args;
          if (want_caps) {
            cap_grad.assign(static_cast<size_t>(plan.B * (plan.H / plan.group()) * bargs.cap_numel), 0.0);
            bargs.cap_grad = cap_grad.data();
          }
          bplan.flex = &bargs;
        }
        dispatch_float(od.dtype(), kOp, [&]<typename T>() {
          auto grad_view = [&](size_t i, const Layout& l) {
            return grads[i].defined() ? view_of<T>(grads[i].data<T>(), l) : HeadView<T>{};
          };
          const auto backward = ATTO_CPU(attention_backward<T>);
          backward(bplan, view_of<const T>(saved[qi].data<T>(), lq), view_of<const T>(saved[ki].data<T>(), lk),
                   view_of<const T>(saved[vi].data<T>(), lv), md.defined() ? md.raw_data() : nullptr,
                   view_of<const T>(od.data<T>(), lo), stats.data<T>(), probs.defined() ? probs.data<T>() : nullptr,
                   view_of<const T>(g.data<T>(), lo), grad_view(qi, lq), grad_view(ki, lk), grad_view(vi, lv),
                   ent ? od.data<T>() + n_out : nullptr, ent ? g.data<T>() + n_out : nullptr);
        });
        if (want_caps) {
          const int64_t groups = plan.B * (plan.H / plan.group()), n = bargs.cap_numel;
          for (int64_t gidx = 1; gidx < groups; ++gidx)
            for (int64_t e = 0; e < n; ++e) cap_grad[e] += cap_grad[gidx * n + e];
          for (size_t i = n_main; i < saved.size(); ++i) {
            if (!gi.needs(i)) continue;
            const int64_t off = fx->cap_offset[i - n_main];
            const Tensor g64 = from_vector(std::vector<double>(cap_grad.begin() + off,
                                                               cap_grad.begin() + off + saved[i].numel()),
                                           saved[i].shape());
            grads[i] = saved[i].dtype() == kFloat64 ? g64 : g64.to(saved[i].dtype());
          }
        }
        for (size_t i = 0; i < saved.size(); ++i)
          if (gi.needs(i)) gi[i] = grads[i];
      });
  return split_result(recorded);
}

}  // namespace

Tensor bigbird_block_layout(const BigBirdLayoutOptions& o) {
  ATTO_CHECK(o.q_blocks >= 0 && o.k_blocks >= 0 && o.local_blocks >= 0 && o.global_blocks >= 0 && o.random_blocks >= 0,
             "bigbird_block_layout", "block counts must be >= 0, got q_blocks = ", o.q_blocks, ", k_blocks = ",
             o.k_blocks, ", local_blocks = ", o.local_blocks, ", global_blocks = ", o.global_blocks,
             ", random_blocks = ", o.random_blocks);
  Tensor layout = zeros({o.q_blocks, o.k_blocks}, {.dtype = kBool});
  bool* m = layout.data<bool>();
  Generator gen(o.seed);
  std::vector<int64_t> rest;
  for (int64_t r = 0; r < o.q_blocks; ++r) {
    bool* row = m + r * o.k_blocks;
    for (int64_t c = 0; c < o.k_blocks; ++c)
      row[c] = r < o.global_blocks || c < o.global_blocks || (c >= r - o.local_blocks && c <= r + o.local_blocks);
    rest.clear();  // random blocks: a partial Fisher-Yates shuffle of the blocks not yet seen, in column order
    for (int64_t c = 0; c < o.k_blocks; ++c)
      if (!row[c]) rest.push_back(c);
    const int64_t take = std::min<int64_t>(o.random_blocks, static_cast<int64_t>(rest.size()));
    for (int64_t t = 0; t < take; ++t) {
      const int64_t u = t + static_cast<int64_t>(gen.randint(static_cast<uint64_t>(rest.size()) - t));
      std::swap(rest[t], rest[u]);
      row[rest[t]] = true;
    }
  }
  return layout;
}

Tensor attention_entropy_loss(const Tensor& entropies, double lambda, const Tensor& has_keys) {
  constexpr const char* op = "attention_entropy_loss";
  ATTO_CHECK(entropies.defined() && is_floating(entropies.dtype()), op,
             "entropies must be a defined float32 or float64 tensor (AttentionResult::entropy with need_entropy)");
  ATTO_CHECK(std::isfinite(lambda), op, "lambda must be finite, got ", lambda, " for entropies ", entropies.shape());
  if (!has_keys.defined()) return mul(mean(entropies), -lambda);
  ATTO_CHECK(has_keys.dtype() == kBool, op, "has_keys must be bool, got ", dtype_name(has_keys.dtype()), " ",
             has_keys.shape(), " for entropies ", entropies.shape());
  Tensor w = broadcast_to(has_keys.to(entropies.dtype()), entropies.shape());
  const double rows = sum(w).item<double>();
  if (rows == 0) return mul(sum(mul(entropies, w)), 0.0);
  return mul(sum(mul(entropies, w)), -lambda / rows);
}

bool& detail::attention_one_pass_rows() {
  static bool on = true;
  return on;
}

int64_t& detail::attention_saved_probs_limit() {
  static int64_t limit = 64 * 64;
  return limit;
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opts) {
  const Plan p = make_plan(q, k, v, opts);
  const bool three_d = q.dim() == 3;
  const int64_t H = three_d ? 1 : p.H;
  Shape out_shape = three_d ? Shape{p.B, p.Lq, p.dv} : Shape{p.B, p.H, p.Lq, p.dv};
  Shape w_shape = three_d ? Shape{p.B, p.Lq, p.Lk} : Shape{p.B, p.H, p.Lq, p.Lk};
  const int64_t Hkv = three_d ? 1 : p.Hkv;
  return run_attention(p, {q, k, v}, 0, 1, 2, bhld(H, p.Lq, p.dk), bhld(Hkv, p.Lk, p.dk), bhld(Hkv, p.Lk, p.dv),
                       out_shape, bhld(H, p.Lq, p.dv), w_shape, opts);
}

AttentionResult multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                     const AttentionOptions& opts) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined tensors");
  ATTO_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, kOp,
             "q, k and v must be 3-D (B, L, H * d) with the heads side by side in the last dimension, got q ",
             q.shape(), ", k ", k.shape(), ", v ", v.shape());
  check_float_inputs(q, k, v);
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  ATTO_CHECK(num_heads > 0, kOp, "num_heads must be positive, got ", num_heads);
  const int64_t Hkv = opts.num_kv_heads == 0 ? num_heads : opts.num_kv_heads;
  ATTO_CHECK(Hkv > 0 && num_heads % Hkv == 0, kOp, "num_kv_heads = ", opts.num_kv_heads,
             " must be positive and divide num_heads = ", num_heads);
  ATTO_CHECK(qs[2] % num_heads == 0 && vs[2] % Hkv == 0, kOp, "num_heads = ", num_heads,
             Hkv == num_heads ? "" : str_cat(" (num_kv_heads = ", Hkv, ")"), " must divide the features of q ", qs,
             " and v ", vs);
  ATTO_CHECK(qs[0] == ks[0] && qs[0] == vs[0], kOp, "batch sizes differ: q ", qs, ", k ", ks, ", v ", vs);
  ATTO_CHECK(qs[2] / num_heads * Hkv == ks[2], kOp, "d_k mismatch: q ", qs, " and k ", ks,
             Hkv == num_heads ? " must have the same features"
                              : str_cat(" must have d_k = ", qs[2] / num_heads, " features per head (k has ", Hkv,
                                        " heads)"));
  ATTO_CHECK(ks[1] == vs[1], kOp, "Lk mismatch: k ", ks, " has ", ks[1], " keys but v ", vs, " has ", vs[1], " values");
  Plan p;
  p.B = qs[0];
  p.H = num_heads;
  p.Hkv = Hkv;
  p.Lq = qs[1];
  p.Lk = ks[1];
  p.dk = qs[2] / num_heads;
  p.dv = vs[2] / Hkv;
  finish_plan(p, q, k, {p.B, p.H, p.Lq, p.Lk}, opts);
  return run_attention(p, {q, k, v}, 0, 1, 2, blhd(p.Lq, p.dk, qs[2], 0), blhd(p.Lk, p.dk, ks[2], 0),
                       blhd(p.Lk, p.dv, vs[2], 0), {p.B, p.Lq, p.H * p.dv}, blhd(p.Lq, p.dv, p.H * p.dv, 0),
                       {p.B, p.H, p.Lq, p.Lk}, opts);
}

AttentionResult packed_self_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& opts) {
  ATTO_CHECK(qkv.defined(), kOp, "qkv must be a defined tensor");
  const int64_t Hkv = opts.num_kv_heads == 0 ? num_heads : opts.num_kv_heads;
  if (Hkv == num_heads) {  // plain multi-head attention: qkv is (B, L, 3 E)
    ATTO_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, kOp,
               "qkv must be 3-D (B, L, 3 * E) holding [q | k | v] in its last dimension, got ", qkv.shape());
    ATTO_CHECK(is_floating(qkv.dtype()), kOp, "qkv must be float32 or float64, got ", dtype_name(qkv.dtype()),
               " qkv ", qkv.shape());
    const int64_t E = qkv.shape()[2] / 3;
    ATTO_CHECK(num_heads > 0 && E % num_heads == 0, kOp, "num_heads = ", num_heads,
               " must be positive and divide E = ", E, " of qkv ", qkv.shape());
  } else {  // grouped-query: qkv is (B, L, (H + 2 H_kv) d)
    ATTO_CHECK(num_heads > 0 && Hkv > 0 && num_heads % Hkv == 0, kOp, "num_kv_heads = ", opts.num_kv_heads,
               " must be positive and divide num_heads = ", num_heads);
    ATTO_CHECK(qkv.dim() == 3 && qkv.shape()[2] % (num_heads + 2 * Hkv) == 0, kOp,
               "qkv must be 3-D (B, L, (H + 2 H_kv) d) holding [q | k | v] in its last dimension, got ", qkv.shape(),
               " for H = ", num_heads, ", H_kv = ", Hkv);
    ATTO_CHECK(is_floating(qkv.dtype()), kOp, "qkv must be float32 or float64, got ", dtype_name(qkv.dtype()),
               " qkv ", qkv.shape());
  }
  const int64_t d = qkv.shape()[2] / (num_heads + 2 * Hkv), E = num_heads * d, Ekv = Hkv * d;
  Plan p;
  p.B = qkv.shape()[0];
  p.H = num_heads;
  p.Hkv = Hkv;
  p.Lq = p.Lk = qkv.shape()[1];
  p.dk = p.dv = d;
  finish_plan(p, qkv, qkv, {p.B, p.H, p.Lq, p.Lk}, opts);
  const int64_t row = E + 2 * Ekv;
  return run_attention(p, {qkv}, 0, 0, 0, blhd(p.Lq, p.dk, row, 0), blhd(p.Lk, p.dk, row, E),
                       blhd(p.Lk, p.dv, row, E + Ekv), {p.B, p.Lq, E}, blhd(p.Lq, p.dv, E, 0), {p.B, p.H, p.Lq, p.Lk},
                       opts);
}

}  // namespace attograd

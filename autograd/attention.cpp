#include "autograd/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace attograd {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";
// Query rows per block: the scratch of a block is kBlockRows x Lk, never Lq x Lk.
constexpr int64_t kBlockRows = 64;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatMap = Eigen::Map<Mat<T>>;
template <class T>
using CMatMap = Eigen::Map<const Mat<T>>;
template <class T>
using RowMap = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;

template <class T>
using RowVecMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

enum class MaskKind { None, Bool, Float };

// Everything the forward and the backward need to recompute a block of scores and its dropout mask.
struct Plan {
  int64_t B = 0, H = 0, Lq = 0, Lk = 0, dk = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;
  MaskKind mask_kind = MaskKind::None;
  int64_t mb = 0, mh = 0, mi = 0, mj = 0;  // mask strides (elements) over (b, h, i, j); 0 where broadcast
  bool dropout = false;
  uint64_t seed = 0;        // drawn once per call from the generator
  uint64_t drop_below = 0;  // an element is dropped when its 53-bit hash is below this (= ceil(p * 2^53))
  double keep_scale = 1.0;  // 1 / (1 - p)
};

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Keep/drop flags (1 = keep) of rows [i0, i0 + n), keys [0, lk) of head (b, h): element (b, h, i, j) is
// the SplitMix64 output number flat(b, h, i, j) of the stream `seed`, a pure function of both, so the
// backward replays the forward's mask without storing it.
void dropout_flags(const Plan& p, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t lk, uint8_t* flags) {
  constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t base = static_cast<uint64_t>(((b * p.H + h) * p.Lq + i0 + r) * p.Lk);
    uint8_t* f = flags + r * lk;
    for (int64_t j = 0; j < lk; ++j) {
      const uint64_t z = mix64(p.seed + (base + static_cast<uint64_t>(j) + 1) * kGamma);
      f[j] = (z >> 11) >= p.drop_below;
    }
  }
}

// s (n x lk) = scale * Q[i0:i0+n] K[0:lk]^T + mask, with -inf at blocked entries (bool mask, causal).
// The forward and the backward both call this, so they see bitwise the same scores.
template <class T>
void block_scores(const Plan& p, const T* q_bh, const T* k_bh, const void* mask, int64_t b, int64_t h, int64_t i0,
                  int64_t n, int64_t lk, T* s_data) {
  MatMap<T> s(s_data, n, lk);
  CMatMap<T> qb(q_bh + i0 * p.dk, n, p.dk);
  CMatMap<T> kb(k_bh, lk, p.dk);
  s.noalias() = (static_cast<T>(p.scale) * qb) * kb.transpose();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    T* row = s_data + r * lk;
    const int64_t moff = b * p.mb + h * p.mh + i * p.mi;
    if (p.mask_kind == MaskKind::Bool) {
      const bool* m = static_cast<const bool*>(mask) + moff;
      if (p.mj == 1) {
        for (int64_t j = 0; j < lk; ++j) row[j] = m[j] ? kNegInf : row[j];
      } else if (m[0]) {  // the mask is broadcast along keys: the whole row is blocked or open
        for (int64_t j = 0; j < lk; ++j) row[j] = kNegInf;
      }
    } else if (p.mask_kind == MaskKind::Float) {
      const T* m = static_cast<const T*>(mask) + moff;
      if (p.mj == 1) {
        for (int64_t j = 0; j < lk; ++j) row[j] += m[j];
      } else {
        for (int64_t j = 0; j < lk; ++j) row[j] += m[0];
      }
    }
    if (p.causal)
      for (int64_t j = i + 1; j < lk; ++j) row[j] = kNegInf;
  }
}

// In place row <- exp(row - m) with results below the smallest normal number flushed to exactly zero: the
// vectorised exp maps -inf (a blocked key) to a denormal rather than 0, and a blocked key must get
// probability 0 (and no denormals should slow the products that follow).
template <class T>
void exp_shifted(T* row, int64_t lk, T m) {
  RowMap<T> a(row, lk);
  a = (a - m).exp();
  constexpr T tiny = std::numeric_limits<T>::min();
  for (int64_t j = 0; j < lk; ++j) row[j] = row[j] < tiny ? T(0) : row[j];
}

// Number of keys a block of query rows [i0, i0 + n) can see: causal blocks skip the keys past their last row.
inline int64_t visible_keys(const Plan& p, int64_t i0, int64_t n) { return p.causal ? std::min(p.Lk, i0 + n) : p.Lk; }

// Forward over all heads. stats (B, H, Lq, 2) receives per row {max score m, 1 / sum exp(s - m)}, i.e. the
// logsumexp m + log(sum) kept in two parts so that huge scores lose no precision in float32, and so that the
// backward's exp(s - m) * inv_sum reproduces the forward's probabilities bitwise; m = -inf marks a fully
// blocked row. stats and weights may be null.
template <class T>
void attention_forward(const Plan& p, const T* q, const T* k, const T* v, const void* mask, T* out, T* stats,
                       T* weights) {
  const int64_t nb = std::min(kBlockRows, p.Lq);
  Mat<T> scratch(nb, p.Lk);  // Eigen-aligned, like the backward's, so exp vectorises identically
  std::vector<uint8_t> flags(p.dropout ? static_cast<size_t>(nb * p.Lk) : 0);
  const T keep_scale = static_cast<T>(p.keep_scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    const T* q_bh = q + bh * p.Lq * p.dk;  // (Lq, d_k)
    const T* k_bh = k + bh * p.Lk * p.dk;  // (Lk, d_k)
    const T* v_bh = v + bh * p.Lk * p.dv;  // (Lk, d_v)
    T* out_bh = out + bh * p.Lq * p.dv;    // (Lq, d_v)
    for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
      const int64_t n = std::min(nb, p.Lq - i0);
      const int64_t lk = visible_keys(p, i0, n);
      MatMap<T> ob(out_bh + i0 * p.dv, n, p.dv);
      T* w_blk = weights ? weights + (bh * p.Lq + i0) * p.Lk : nullptr;  // (n, Lk)
      if (lk == 0) {                                                     // no keys at all: every row is blocked
        ob.setZero();
        if (stats)
          for (int64_t r = 0; r < n; ++r) {
            stats[2 * (bh * p.Lq + i0 + r)] = kNegInf;
            stats[2 * (bh * p.Lq + i0 + r) + 1] = 0;
          }
        if (w_blk) std::fill(w_blk, w_blk + n * p.Lk, T(0));
        continue;
      }
      T* s = scratch.data();  // (n, lk)
      block_scores(p, q_bh, k_bh, mask, b, h, i0, n, lk, s);
      // P = softmax(S) row by row, with the max shifted out.
      for (int64_t r = 0; r < n; ++r) {
        T* row = s + r * lk;
        T m = RowMap<T>(row, lk).maxCoeff();
        T inv_sum = 0;
        if (m == kNegInf) {
          std::fill(row, row + lk, T(0));  // all keys blocked: zero probabilities, zero output
        } else {
          exp_shifted(row, lk, m);
          inv_sum = T(1) / RowMap<T>(row, lk).sum();
          RowMap<T>(row, lk) *= inv_sum;
        }
        if (stats) {
          stats[2 * (bh * p.Lq + i0 + r)] = m;
          stats[2 * (bh * p.Lq + i0 + r) + 1] = inv_sum;
        }
      }
      // Dropout: P <- P * keep / (1 - p).
      if (p.dropout) {
        dropout_flags(p, b, h, i0, n, lk, flags.data());
        for (int64_t e = 0; e < n * lk; ++e) s[e] = flags[e] ? s[e] * keep_scale : T(0);
      }
      // O = P V.
      ob.noalias() = CMatMap<T>(s, n, lk) * CMatMap<T>(v_bh, lk, p.dv);
      if (w_blk)
        for (int64_t r = 0; r < n; ++r) {
          std::copy(s + r * lk, s + (r + 1) * lk, w_blk + r * p.Lk);
          std::fill(w_blk + r * p.Lk + lk, w_blk + (r + 1) * p.Lk, T(0));
        }
    }
  }
}

// Backward over all heads, recomputing P block by block from the saved stats. dq, dk, dv may be null (not
// wanted); dk and dv must be zero-filled (they accumulate over query blocks); every dq row is assigned.
template <class T>
void attention_backward(const Plan& p, const T* q, const T* k, const T* v, const void* mask, const T* out,
                        const T* stats, const T* dout, T* dq, T* dk, T* dv) {
  const int64_t nb = std::min(kBlockRows, p.Lq);
  const bool need_ds = dq || dk;
  // Per-block scratch, kBlockRows x Lk each (Eigen-aligned like the forward's, so exp vectorises identically).
  Mat<T> prob(nb, p.Lk);                                                // P
  Mat<T> ds_buf(need_ds ? nb : 0, need_ds ? p.Lk : 0);                  // dP, then dS * scale
  Mat<T> pd_buf(p.dropout && dv ? nb : 0, p.dropout && dv ? p.Lk : 0);  // dropped-out P
  std::vector<uint8_t> flags(p.dropout ? static_cast<size_t>(nb * p.Lk) : 0);
  const T keep_scale = static_cast<T>(p.keep_scale);
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    const T* q_bh = q + bh * p.Lq * p.dk;      // (Lq, d_k)
    const T* k_bh = k + bh * p.Lk * p.dk;      // (Lk, d_k)
    const T* v_bh = v + bh * p.Lk * p.dv;      // (Lk, d_v)
    const T* o_bh = out + bh * p.Lq * p.dv;    // (Lq, d_v)
    const T* do_bh = dout + bh * p.Lq * p.dv;  // (Lq, d_v)
    for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
      const int64_t n = std::min(nb, p.Lq - i0);
      const int64_t lk = visible_keys(p, i0, n);
      if (lk == 0) {
        if (dq) MatMap<T>(dq + (bh * p.Lq + i0) * p.dk, n, p.dk).setZero();
        continue;
      }
      CMatMap<T> dob(do_bh + i0 * p.dv, n, p.dv);  // dO block (n, d_v)
      CMatMap<T> vb(v_bh, lk, p.dv);               // visible V (lk, d_v)
      // P = exp(S - m) / sum, recomputed exactly as in the forward; blocked rows are zero.
      T* pr = prob.data();  // (n, lk)
      block_scores(p, q_bh, k_bh, mask, b, h, i0, n, lk, pr);
      for (int64_t r = 0; r < n; ++r) {
        T* row = pr + r * lk;
        const T m = stats[2 * (bh * p.Lq + i0 + r)];
        const T inv_sum = stats[2 * (bh * p.Lq + i0 + r) + 1];
        if (m == kNegInf) {
          std::fill(row, row + lk, T(0));
        } else {
          exp_shifted(row, lk, m);
          RowMap<T>(row, lk) *= inv_sum;
        }
      }
      if (p.dropout) dropout_flags(p, b, h, i0, n, lk, flags.data());
      CMatMap<T> pm(pr, n, lk);
      // dV += Pd^T dO  (O = Pd V, with Pd = P * keep / (1 - p) the dropped-out probabilities).
      if (dv) {
        MatMap<T> dvb(dv + bh * p.Lk * p.dv, lk, p.dv);
        if (p.dropout) {
          T* pd = pd_buf.data();
          for (int64_t e = 0; e < n * lk; ++e) pd[e] = flags[e] ? pr[e] * keep_scale : T(0);
          dvb.noalias() += CMatMap<T>(pd, n, lk).transpose() * dob;
        } else {
          dvb.noalias() += pm.transpose() * dob;
        }
      }
      if (!need_ds) continue;
      // dPd = dO V^T  (gradient of the dropped-out probabilities); dP = dPd * keep / (1 - p).
      T* ds = ds_buf.data();  // (n, lk)
      MatMap<T> dsm(ds, n, lk);
      dsm.noalias() = dob * vb.transpose();
      for (int64_t r = 0; r < n; ++r) {
        // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij (since O_i = sum_j P_ij keep_ij/(1-p) V_j).
        const T* o_row = o_bh + (i0 + r) * p.dv;
        const T* do_row = do_bh + (i0 + r) * p.dv;
        const T d = RowVecMap<T>(do_row, p.dv).dot(RowVecMap<T>(o_row, p.dv));
        // dS = P * (dP - D_i)  (softmax backward), times scale for the S = scale * Q K^T below.
        const T* prow = pr + r * lk;
        T* drow = ds + r * lk;
        if (p.dropout) {
          const uint8_t* f = flags.data() + r * lk;
          for (int64_t j = 0; j < lk; ++j) drow[j] = prow[j] * ((f[j] ? drow[j] * keep_scale : T(0)) - d) * scale;
        } else {
          for (int64_t j = 0; j < lk; ++j) drow[j] = prow[j] * (drow[j] - d) * scale;
        }
      }
      // dQ = dS K * scale  (scale already in ds).
      if (dq) MatMap<T>(dq + (bh * p.Lq + i0) * p.dk, n, p.dk).noalias() = dsm * CMatMap<T>(k_bh, lk, p.dk);
      // dK += dS^T Q * scale.
      if (dk)
        MatMap<T>(dk + bh * p.Lk * p.dk, lk, p.dk).noalias() += dsm.transpose() * CMatMap<T>(q_bh + i0 * p.dk, n, p.dk);
    }
  }
}

// Validates the inputs and options (every user error names the op and the shapes) and resolves shapes,
// mask strides and the dropout seed into a Plan.
Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined tensors");
  const int64_t rank = q.dim();
  ATTO_CHECK((rank == 3 || rank == 4) && k.dim() == rank && v.dim() == rank, kOp,
             "q, k and v must all be 4-D (B, H, L, d) or all 3-D (N, L, d), got q ", q.shape(), ", k ", k.shape(),
             ", v ", v.shape());
  ATTO_CHECK(is_floating(q.dtype()), kOp, "q must be float32 or float64, got ", dtype_name(q.dtype()), " q ",
             q.shape());
  ATTO_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, "dtype mismatch: q ", dtype_name(q.dtype()), " ",
             q.shape(), ", k ", dtype_name(k.dtype()), " ", k.shape(), ", v ", dtype_name(v.dtype()), " ", v.shape(),
             " (convert with .to())");
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  for (int64_t d = 0; d < rank - 2; ++d)
    ATTO_CHECK(qs[d] == ks[d] && qs[d] == vs[d], kOp, "batch/head dimensions differ: q ", qs, ", k ", ks, ", v ", vs,
               " (dimension ", d, ": ", qs[d], ", ", ks[d], ", ", vs[d], ")");
  ATTO_CHECK(qs[rank - 1] == ks[rank - 1], kOp, "d_k mismatch: q ", qs, " has d_k = ", qs[rank - 1], " but k ", ks,
             " has d_k = ", ks[rank - 1]);
  ATTO_CHECK(ks[rank - 2] == vs[rank - 2], kOp, "Lk mismatch: k ", ks, " has ", ks[rank - 2], " keys but v ", vs,
             " has ", vs[rank - 2], " values");
  ATTO_CHECK(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0, kOp, "dropout_p must be in [0, 1), got ", opts.dropout_p);
  ATTO_CHECK(std::isfinite(opts.scale), kOp, "scale must be finite (0 = 1/sqrt(d_k)), got ", opts.scale);

  Plan p;
  p.B = qs[0];
  p.H = rank == 4 ? qs[1] : 1;
  p.Lq = qs[rank - 2];
  p.Lk = ks[rank - 2];
  p.dk = qs[rank - 1];
  p.dv = vs[rank - 1];
  p.scale = opts.scale != 0.0 ? opts.scale : (p.dk > 0 ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : 1.0);
  p.causal = opts.is_causal;

  const Tensor& mask = opts.attn_mask;
  if (mask.defined()) {
    ATTO_CHECK(mask.dtype() == kBool || mask.dtype() == q.dtype(), kOp, "attn_mask must be bool or ",
               dtype_name(q.dtype()), " (q's dtype), got ", dtype_name(mask.dtype()), " attn_mask ", mask.shape());
    // Scores shape as the user sees it: (B, H, Lq, Lk) or (N, Lq, Lk).
    Shape target = rank == 4 ? Shape{p.B, p.H, p.Lq, p.Lk} : Shape{p.B, p.Lq, p.Lk};
    const Shape& ms = mask.shape();
    bool ok = ms.size() <= target.size();
    for (size_t k2 = 0; ok && k2 < ms.size(); ++k2) {
      int64_t md = ms[ms.size() - 1 - k2], td = target[target.size() - 1 - k2];
      ok = md == td || md == 1;
    }
    ATTO_CHECK(ok, kOp, "attn_mask of shape ", ms, " does not broadcast to the scores ", target,
               rank == 4 ? " (B, H, Lq, Lk)" : " (N, Lq, Lk)", " of q ", qs, " and k ", ks);
    // Right-aligned strides of the mask over the target; 0 where the mask dimension is broadcast.
    std::vector<int64_t> st(target.size(), 0);
    int64_t s = 1;
    for (size_t k2 = 0; k2 < ms.size(); ++k2) {
      size_t mdim = ms.size() - 1 - k2, tdim = target.size() - 1 - k2;
      st[tdim] = ms[mdim] == 1 ? 0 : s;
      s *= ms[mdim];
    }
    if (rank == 4) {
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
    p.drop_below = static_cast<uint64_t>(std::ceil(opts.dropout_p * 0x1.0p53));
    p.keep_scale = 1.0 / (1.0 - opts.dropout_p);
  }
  return p;
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opts) {
  const Plan plan = make_plan(q, k, v, opts);
  const bool three_d = q.dim() == 3;
  const Tensor& mask = opts.attn_mask;
  const void* mask_data = mask.defined() ? mask.raw_data() : nullptr;

  Shape out_shape = three_d ? Shape{plan.B, plan.Lq, plan.dv} : Shape{plan.B, plan.H, plan.Lq, plan.dv};
  Tensor out = empty(out_shape, {.dtype = q.dtype()});
  const bool save = any_requires_grad({q, k, v});
  Tensor stats = save ? empty({plan.B, plan.H, plan.Lq, 2}, {.dtype = q.dtype()}) : Tensor();
  AttentionResult result;
  if (opts.need_weights) {
    Shape w_shape = three_d ? Shape{plan.B, plan.Lq, plan.Lk} : Shape{plan.B, plan.H, plan.Lq, plan.Lk};
    result.weights = empty(w_shape, {.dtype = q.dtype()});
  }

  dispatch_float(q.dtype(), kOp, [&]<typename T>() {
    attention_forward<T>(plan, q.data<T>(), k.data<T>(), v.data<T>(), mask_data, out.data<T>(),
                         save ? stats.data<T>() : nullptr, opts.need_weights ? result.weights.data<T>() : nullptr);
  });

  if (!save) {
    result.output = out;
    return result;
  }
  Tensor qd = q.detach(), kd = k.detach(), vd = v.detach(), od = out.detach();
  Tensor md = mask.defined() ? mask.detach() : Tensor();
  result.output = record(kOp, out, {q, k, v}, [plan, qd, kd, vd, md, od, stats](const Tensor& g, GradInputs& gi) {
    Tensor gq = gi.needs(0) ? empty(qd.shape(), {.dtype = qd.dtype()}) : Tensor();  // every row assigned
    Tensor gk = gi.needs(1) ? zeros(kd.shape(), {.dtype = kd.dtype()}) : Tensor();
    Tensor gv = gi.needs(2) ? zeros(vd.shape(), {.dtype = vd.dtype()}) : Tensor();
    ATTO_CHECK(g.dtype() == qd.dtype(), kOp, "gradient dtype ", dtype_name(g.dtype()), " differs from the output's ",
               dtype_name(qd.dtype()));
    dispatch_float(qd.dtype(), kOp, [&]<typename T>() {
      attention_backward<T>(plan, qd.data<T>(), kd.data<T>(), vd.data<T>(), md.defined() ? md.raw_data() : nullptr,
                            od.data<T>(), stats.data<T>(), g.data<T>(), gq.defined() ? gq.data<T>() : nullptr,
                            gk.defined() ? gk.data<T>() : nullptr, gv.defined() ? gv.data<T>() : nullptr);
    });
    if (gi.needs(0)) gi[0] = gq;
    if (gi.needs(1)) gi[1] = gk;
    if (gi.needs(2)) gi[2] = gv;
  });
  return result;
}

}  // namespace attograd

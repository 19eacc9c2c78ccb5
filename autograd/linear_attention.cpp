// Linear attention (see linear_attention.h): fused forward and a hand-written backward, one (batch, head) slice
// per task.

#include "autograd/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/parallel.h"

namespace attograd {

namespace {

template <typename T>
T phi(T x) {
  return x > T(0) ? x + T(1) : std::exp(x);
}
// phi'(x): 1 for x > 0, exp(x) = phi(x) otherwise.
template <typename T>
T phi_grad(T x, T phi_x) {
  return x > T(0) ? T(1) : phi_x;
}

struct Sizes {
  int64_t slices, lq, lk, dk, dv;
  bool causal;
  double eps;
};

// phi of n values.
template <typename T>
void phi_rows(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = phi(x[i]);
}

// Forward of one slice. S (dk, dv) and z (dk) receive the total sums (the non-causal backward keeps them).
template <typename T>
void forward_slice(const T* q, const T* k, const T* v, T* out, T* S, T* z, const Sizes& n) {
  const int64_t dk = n.dk, dv = n.dv;
  std::vector<T> pq(static_cast<size_t>(dk)), pk(static_cast<size_t>(dk));
  std::fill(S, S + dk * dv, T(0));
  std::fill(z, z + dk, T(0));
  auto add_key = [&](int64_t j) {  // S += phi(k_j) v_j^T, z += phi(k_j)
    phi_rows(k + j * dk, pk.data(), dk);
    const T* vj = v + j * dv;
    for (int64_t a = 0; a < dk; ++a) {
      const T p = pk[static_cast<size_t>(a)];
      T* Sa = S + a * dv;
      for (int64_t c = 0; c < dv; ++c) Sa[c] += p * vj[c];
      z[a] += p;
    }
  };
  auto read = [&](int64_t i) {  // out_i = phi(q_i)^T S / (phi(q_i)^T z + eps)
    phi_rows(q + i * dk, pq.data(), dk);
    T* o = out + i * dv;
    std::fill(o, o + dv, T(0));
    T den = T(0);
    for (int64_t a = 0; a < dk; ++a) {
      const T p = pq[static_cast<size_t>(a)];
      const T* Sa = S + a * dv;
      for (int64_t c = 0; c < dv; ++c) o[c] += p * Sa[c];
      den += p * z[a];
    }
    const T inv = T(1) / (den + static_cast<T>(n.eps));
    for (int64_t c = 0; c < dv; ++c) o[c] *= inv;
  };
  if (n.causal) {
    for (int64_t i = 0; i < n.lq; ++i) {
      add_key(i);
      read(i);
    }
  } else {
    for (int64_t j = 0; j < n.lk; ++j) add_key(j);
    for (int64_t i = 0; i < n.lq; ++i) read(i);
  }
}

// Backward of one slice. With num_i = phi(q_i)^T S_i, den_i = phi(q_i)^T z_i + eps, out_i = num_i / den_i:
//   dnum_i = g_i / den_i,  dden_i = -(g_i . out_i) / den_i
//   dphi(q_i) = S_i dnum_i + z_i dden_i
//   dphi(k_j) = R_j v_j + r_j,  dv_j = R_j^T phi(k_j),  R_j = sum_{i >= j (causal) or all i} phi(q_i) dnum_i^T,
//                                                       r_j = the same sum of phi(q_i) dden_i
//   dq = dphi(q) phi'(q),  dk = dphi(k) phi'(k)
// `scratch` holds Lq * (d_v + 1) values: dnum_i and dden_i of every query row, kept for the reverse sweep.
template <typename T>
void backward_slice(const T* q, const T* k, const T* v, const T* g, const T* S_total, const T* z_total, T* dq,
                    T* dk_out, T* dv_out, T* scratch, const Sizes& n) {
  const int64_t dk = n.dk, dv = n.dv;
  std::vector<T> S(static_cast<size_t>(dk * dv)), z(static_cast<size_t>(dk)), R(static_cast<size_t>(dk * dv), T(0)),
      r(static_cast<size_t>(dk), T(0)), pq(static_cast<size_t>(dk)), pk(static_cast<size_t>(dk)),
      dnum(static_cast<size_t>(dv)), out(static_cast<size_t>(dv));
  T* dnums = scratch;              // (Lq, dv)
  T* ddens = scratch + n.lq * dv;  // (Lq)
  if (!n.causal) {
    std::copy(S_total, S_total + dk * dv, S.begin());
    std::copy(z_total, z_total + dk, z.begin());
  }
  // Forward sweep: S_i, z_i (causal: rebuilt), the row's output, dnum_i, dden_i and dq_i.
  for (int64_t i = 0; i < n.lq; ++i) {
    if (n.causal) {
      phi_rows(k + i * dk, pk.data(), dk);
      const T* vi = v + i * dv;
      for (int64_t a = 0; a < dk; ++a) {
        for (int64_t c = 0; c < dv; ++c) S[static_cast<size_t>(a * dv + c)] += pk[static_cast<size_t>(a)] * vi[c];
        z[static_cast<size_t>(a)] += pk[static_cast<size_t>(a)];
      }
    }
    const T* qi = q + i * dk;
    phi_rows(qi, pq.data(), dk);
    std::fill(out.begin(), out.end(), T(0));
    T den = T(0);
    for (int64_t a = 0; a < dk; ++a) {
      const T p = pq[static_cast<size_t>(a)];
      for (int64_t c = 0; c < dv; ++c) out[static_cast<size_t>(c)] += p * S[static_cast<size_t>(a * dv + c)];
      den += p * z[static_cast<size_t>(a)];
    }
    den += static_cast<T>(n.eps);
    const T inv = T(1) / den;
    const T* gi = g + i * dv;
    T go = T(0);
    for (int64_t c = 0; c < dv; ++c) go += gi[c] * out[static_cast<size_t>(c)];
    const T dden = -go * inv * inv;  // -(g . num) / den^2 = -(g . out_i) / den
    T* dn = dnums + i * dv;
    for (int64_t c = 0; c < dv; ++c) dn[c] = gi[c] * inv;
    ddens[i] = dden;
    T* dqi = dq + i * dk;
    for (int64_t a = 0; a < dk; ++a) {
      T acc = T(0);
      const T* Sa = S.data() + a * dv;
      for (int64_t c = 0; c < dv; ++c) acc += Sa[c] * dn[c];
      acc += z[static_cast<size_t>(a)] * dden;
      dqi[a] = acc * phi_grad(qi[a], pq[static_cast<size_t>(a)]);
    }
  }
  // Reverse sweep over keys: R_j, r_j are the sums over the queries that see key j.
  auto add_query = [&](int64_t i) {
    phi_rows(q + i * dk, pq.data(), dk);
    const T* dn = dnums + i * dv;
    const T dd = ddens[i];
    for (int64_t a = 0; a < dk; ++a) {
      const T p = pq[static_cast<size_t>(a)];
      T* Ra = R.data() + a * dv;
      for (int64_t c = 0; c < dv; ++c) Ra[c] += p * dn[c];
      r[static_cast<size_t>(a)] += p * dd;
    }
  };
  if (!n.causal)
    for (int64_t i = 0; i < n.lq; ++i) add_query(i);
  for (int64_t j = n.lk - 1; j >= 0; --j) {
    if (n.causal) add_query(j);
    const T* kj = k + j * dk;
    const T* vj = v + j * dv;
    phi_rows(kj, pk.data(), dk);
    T* dvj = dv_out + j * dv;
    std::fill(dvj, dvj + dv, T(0));
    T* dkj = dk_out + j * dk;
    for (int64_t a = 0; a < dk; ++a) {
      const T* Ra = R.data() + a * dv;
      const T p = pk[static_cast<size_t>(a)];
      T acc = T(0);
      for (int64_t c = 0; c < dv; ++c) {
        acc += Ra[c] * vj[c];
        dvj[c] += Ra[c] * p;
      }
      acc += r[static_cast<size_t>(a)];
      dkj[a] = acc * phi_grad(kj[a], p);
    }
  }
}

}  // namespace

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double eps) {
  const char* me = "linear_attention";
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), me, "q, k and v must be defined");
  ATTO_CHECK(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(), me,
             "q, k and v must be (..., L, d) with the same number of dims, got q ", q.shape(), ", k ", k.shape(),
             ", v ", v.shape());
  ATTO_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), me,
             "q, k and v must share one float dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ",
             dtype_name(v.dtype()));
  const int64_t nd = q.dim();
  for (int64_t d = 0; d < nd - 2; ++d)
    ATTO_CHECK(q.size(d) == k.size(d) && q.size(d) == v.size(d), me, "leading dims differ: q ", q.shape(), ", k ",
               k.shape(), ", v ", v.shape());
  ATTO_CHECK(q.size(-1) == k.size(-1), me, "q ", q.shape(), " and k ", k.shape(), " must share d_k");
  ATTO_CHECK(k.size(-2) == v.size(-2), me, "k ", k.shape(), " and v ", v.shape(), " must share Lk");
  ATTO_CHECK(!causal || q.size(-2) == k.size(-2), me, "causal linear attention needs Lq == Lk, got q ", q.shape(),
             ", k ", k.shape());
  ATTO_CHECK(eps > 0 && std::isfinite(eps), me, "eps must be positive and finite, got ", eps);
  const int64_t lq = q.size(-2), lk = k.size(-2), dk = q.size(-1), dv = v.size(-1);
  Shape out_shape = q.shape();
  out_shape.back() = dv;
  const int64_t slices = shape_numel(Shape(q.shape().begin(), q.shape().end() - 2));
  const Sizes n{slices, lq, lk, dk, dv, causal, eps};
  Tensor out = empty(out_shape, {.dtype = q.dtype()});
  const bool grad = any_requires_grad({q, k, v});
  // S (slices, dk, dv) and z (slices, dk): the totals, kept by the non-causal backward.
  Tensor S = empty({slices, dk, dv}, {.dtype = q.dtype()}), z = empty({slices, dk}, {.dtype = q.dtype()});
  dispatch_float(q.dtype(), me, [&]<typename T>() {
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T *po = out.data<T>(), *pS = S.data<T>(), *pz = z.data<T>();
    parallel_for(0, slices, 1, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s)
        forward_slice<T>(pq + s * lq * dk, pk + s * lk * dk, pv + s * lk * dv, po + s * lq * dv, pS + s * dk * dv,
                         pz + s * dk, n);
    });
  });
  if (!grad) return out;
  const Tensor qs = q.detach(), ks = k.detach(), vs = v.detach();
  const Tensor Ss = causal ? Tensor() : S, zs = causal ? Tensor() : z;
  return record(me, out, {q, k, v}, [qs, ks, vs, Ss, zs, n](const Tensor& g, GradInputs& grads) {
    Tensor dq = empty(qs.shape(), {.dtype = qs.dtype()}), dk = empty(ks.shape(), {.dtype = ks.dtype()}),
           dv = empty(vs.shape(), {.dtype = vs.dtype()});
    Tensor scratch = empty({n.slices, n.lq * (n.dv + 1)}, {.dtype = g.dtype()});  // O(L d), from the allocator
    dispatch_float(g.dtype(), "linear_attention backward", [&]<typename T>() {
      const T *pq = qs.data<T>(), *pk = ks.data<T>(), *pv = vs.data<T>(), *pg = g.data<T>();
      const T* pS = n.causal ? nullptr : Ss.data<T>();
      const T* pz = n.causal ? nullptr : zs.data<T>();
      T *pdq = dq.data<T>(), *pdk = dk.data<T>(), *pdv = dv.data<T>(), *pscr = scratch.data<T>();
      parallel_for(0, n.slices, 1, [&](int64_t b, int64_t e) {
        for (int64_t s = b; s < e; ++s)
          backward_slice<T>(pq + s * n.lq * n.dk, pk + s * n.lk * n.dk, pv + s * n.lk * n.dv, pg + s * n.lq * n.dv,
                            pS ? pS + s * n.dk * n.dv : nullptr, pz ? pz + s * n.dk : nullptr, pdq + s * n.lq * n.dk,
                            pdk + s * n.lk * n.dk, pdv + s * n.lk * n.dv, pscr + s * n.lq * (n.dv + 1), n);
      });
    });
    if (grads.needs(0)) grads[0] = dq;
    if (grads.needs(1)) grads[1] = dk;
    if (grads.needs(2)) grads[2] = dv;
  });
}

}  // namespace attograd

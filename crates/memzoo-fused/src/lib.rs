//! Fused CPU kernels for memzoo's hot paths, as Burn backend extensions with hand-written
//! backward passes.
//!
//! - [`lsh_attention_fused`]: Reformer LSH attention from bucket ids to the mixed output
//!   (sort, gather, chunk look-around with wrap, masks, round de-duplication, log-partitions,
//!   unsort, mixture of rounds) as one multi-threaded op. The maths is in [`lsh`].
//! - [`relative_attention_fused`]: relative multi-head attention from per-head queries, keys,
//!   values and a position term (Transformer-XL's shifted `(q + v) W_R R`, or T5's bucketed bias) to the
//!   output: scores, relative shift, mask, softmax and `P V` as one multi-threaded op. The maths
//!   is in [`relative`].
//!
//! - [`knn_attention_fused`]: attention over the top-k pairs retrieved from a kNN memory (scores,
//!   empty-slot mask, softmax and the read, optionally with the log-partition) as one
//!   multi-threaded op. The maths is in [`knn`].
//!
//! - [`dropout::mask_values`]: seeded inverted-dropout masks, drawn on the host (replayable).
//!
//! - [`softmax::softmax`]: Burn's softmax with a backward that keeps only its output, on `flex`
//!   and (feature `cube`) CubeCL's backend: the attention's tensor-op paths (GPUs) hold one
//!   score-sized tensor per layer fewer until the backward.
//!
//! - [`gelu()`]: the exact GELU, forward and backward vectorised and multi-threaded (Burn's
//!   `flex` GELU is one scalar `erff` at a time on one thread). The maths is in [`mod@gelu`].
//!
//! - [`linear()`] and [`matmul_2d()`]: Burn's linear layer and 2-D product, to the bit, without
//!   the zeroing and copying of every output that Burn's `flex` matmul does first (see
//!   [`mod@matmul`]).
//!
//! - [`row::dots_into`]: one vector's dots against many rows, eight at a time (the single-query
//!   products of the relative and kNN attention and of a kNN store's search; see [`row`]).
//!
//! The kernels run on the `flex` backend (with or without autodiff); [`supports`] says whether a
//! device can run them. Callers keep their tensor-op path for every other backend and as the
//! reference the kernels are tested against (`memzoo-reformer`'s `attention` tests).
//!
//! Where things live: the public entry points (`*_fused`, which check shapes and the device) and
//! the [`FusedBackend`] extension are here; the plain `flex` backend's side (the inputs read on
//! the host, the kernels called) in `flex.rs`; the autodiff side (what each op saves, the
//! gradients it registers) in `autodiff.rs`; the maths of each kernel, forward and backward, in
//! [`lsh`], [`relative`], [`knn`], [`mod@gelu`], [`mod@matmul`] and [`row`]; the dropout masks
//! in [`dropout`].
//!
//! This crate is compiled at `opt-level = 3` in the dev profile (the workspace's own crates are
//! at 1): its loops are the hot path.
//!
//! ```
//! use burn::tensor::{Device, Distribution, Tensor};
//! use memzoo_fused::{knn_attention_fused, supports};
//!
//! let device = Device::flex();
//! assert!(supports(&device));
//! // 2 rows x 3 queries, 2 heads of width 8, each query with its own 4 retrieved pairs.
//! let q = Tensor::<4>::random([2, 3, 2, 8], Distribution::Default, &device);
//! let tau = Tensor::<1>::ones([2], &device);
//! let keys = Tensor::<5>::random([2, 3, 2, 4, 8], Distribution::Default, &device);
//! let values = Tensor::<5>::random([2, 3, 2, 4, 8], Distribution::Default, &device);
//! // `true` marks an empty slot: here every slot holds a pair.
//! let empty = Tensor::<4>::zeros([2, 3, 2, 4], &device).greater_elem(0.5);
//! let read = knn_attention_fused(q, tau, keys, values, empty, false).unwrap();
//! assert_eq!(read.dims(), [2, 3, 2, 8]);
//! ```

#![warn(missing_docs)]

pub mod dropout;
pub mod gelu;
pub mod knn;
pub mod lsh;
pub mod matmul;
pub mod relative;
pub mod row;
pub mod softmax;

mod autodiff;
mod flex;

use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{Bool, DType, Device, Int, Tensor};

pub use lsh::{LshDims, LshKernelParams};

/// Errors of the fused kernels: a bad shape, parameter or device; the message names it.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FusedError {
    /// An input does not fit the kernel.
    #[error("fused kernel: {0}")]
    Input(String),
}

/// Whether the fused kernels run on `device` (the `flex` CPU backend, autodiff or not).
pub fn supports(device: &Device) -> bool {
    // Device equality is hardware identity, autodiff ignored.
    *device == Device::flex()
}

/// The fused ops, one method per kernel.
#[backend_extension(Flex, Autodiff)]
pub trait FusedBackend: Backend {
    /// See [`lsh_attention_fused`]. `pad` is `[n, len]` (`[n, 0]`: no padding).
    fn lsh_attention(
        qk: FloatTensor<Self>,
        v: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        pad: BoolTensor<Self>,
        params: LshKernelParams,
    ) -> FloatTensor<Self>;

    /// See [`lsh_hash_fused`]. Not differentiable (bucket ids).
    fn lsh_hash(x: FloatTensor<Self>, rotations: FloatTensor<Self>) -> IntTensor<Self>;

    /// See [`relative_attention_fused`] with [`RelativePosition::Shifted`]. `mask` is
    /// `[rows, qlen, klen]`, `rows = 0`: nothing hidden.
    fn relative_attention_shifted(
        qc: FloatTensor<Self>,
        qp: FloatTensor<Self>,
        k: FloatTensor<Self>,
        r: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self>;

    /// See [`relative_attention_fused`] with [`RelativePosition::Buckets`]. `mask` as in
    /// [`relative_attention_shifted`](FusedBackend::relative_attention_shifted).
    fn relative_attention_bucketed(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        table: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self>;

    /// See [`relative_attention_fused`] with [`RelativePosition::None`]. `mask` as in
    /// [`relative_attention_shifted`](FusedBackend::relative_attention_shifted).
    fn relative_attention_content(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self>;

    /// See [`knn_attention_fused`]. `mask` is `[batch, qlen, heads, k]`.
    fn knn_attention(
        q: FloatTensor<Self>,
        tau: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: KnnParams,
    ) -> FloatTensor<Self>;

    /// See [`gelu()`].
    fn gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// See [`matmul_2d()`].
    fn matmul_2d(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Settings of the kNN attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnnParams {
    /// Append each unit's log-partition to its read (see [`knn`]).
    pub with_lse: bool,
}

/// Settings of the relative attention kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelParams {
    /// The score of a hidden key (`-inf` or a large negative number).
    pub mask_value: f32,
    /// In training, keep no probabilities `P` (`[batch, heads, qlen, klen]`, f32) for the
    /// backward pass and compute them again there, as FlashAttention's backward does: the same
    /// gradients, to the bit, in `4 · batch · heads · qlen · klen` bytes less per call kept
    /// for the backward, for a second computation of the scores and their softmax. (Without
    /// gradients no call keeps them.)
    pub recompute_probabilities: bool,
}

impl RelParams {
    /// Hidden keys score `mask_value`; the probabilities are kept for the backward pass.
    pub fn new(mask_value: f32) -> Self {
        Self {
            mask_value,
            recompute_probabilities: false,
        }
    }

    /// With [`recompute_probabilities`](Self::recompute_probabilities) set to `recompute`.
    pub fn with_recompute_probabilities(self, recompute: bool) -> Self {
        Self {
            recompute_probabilities: recompute,
            ..self
        }
    }
}

/// LSH bucket ids `h(x) = argmax([xR; -xR])` for every round as one op that never holds `xR`
/// (the tensor-op version materialises `[n, len, rounds, n_buckets]` scores).
///
/// Errors name the bad shape, or a device other than `flex` (see [`supports`]).
///
/// # Shapes
/// - `x`: `[n, len, d_head]`
/// - `rotations`: `[d_head, rounds, n_buckets / 2]`
/// - output: `[n, rounds, len]`, ids in `0..n_buckets` (no round offsets)
pub fn lsh_hash_fused(x: Tensor<3>, rotations: Tensor<3>) -> Result<Tensor<3, Int>, FusedError> {
    let bad = |m: String| Err(FusedError::Input(m));
    let device = x.device();
    if !supports(&device) {
        return bad(format!(
            "the LSH hash kernel runs on the flex CPU backend, not on {device:?}"
        ));
    }
    let [_, _, dh] = x.dims();
    let [rd, r, half] = rotations.dims();
    if rd != dh || r == 0 || half == 0 {
        return bad(format!(
            "rotations have shape {:?}, expected [{dh}, rounds >= 1, n_buckets / 2 >= 1]",
            rotations.dims()
        ));
    }
    for (name, dtype) in [("x", x.dtype()), ("rotations", rotations.dtype())] {
        if dtype != DType::F32 {
            return bad(format!("{name} must be f32, got {dtype:?}"));
        }
    }
    let ids: Tensor<3, Int> = Tensor::from_dispatch(<Dispatch as FusedBackend>::lsh_hash(
        x.into_dispatch(),
        rotations.into_dispatch(),
    ));
    // The kernel writes i32; other integer tensors on the device have its default int type.
    let int = Tensor::<1, Int>::empty([0], &device).dtype();
    Ok(if ids.dtype() == int {
        ids
    } else {
        ids.cast(int)
    })
}

/// LSH attention over `rounds` hash rounds as one fused op (see [`lsh`] for the maths): for
/// every row (batch x head), sort the positions by (round, bucket, position), attend inside
/// chunks of `params.chunk_len` that also see their neighbours (wrapping), and mix the rounds by
/// their log-partitions. Differentiable in `qk` and `v` on an autodiff device.
///
/// Errors name the bad shape or parameter, or a device other than `flex` (see [`supports`]).
///
/// # Shapes
/// - `qk`, `v`: `[n, len, d_head]`, `len` a multiple of `params.chunk_len`
/// - `buckets`: `[n, rounds, len]`, ids in `0..params.n_buckets` (no round offsets)
/// - `pad`: `[n, len]`, `true` = a hidden key
/// - output: `[n, len, d_head]`
pub fn lsh_attention_fused(
    qk: Tensor<3>,
    v: Tensor<3>,
    buckets: Tensor<3, Int>,
    pad: Option<Tensor<2, Bool>>,
    params: LshKernelParams,
) -> Result<Tensor<3>, FusedError> {
    let bad = |m: String| Err(FusedError::Input(m));
    let device = qk.device();
    if !supports(&device) {
        return bad(format!(
            "the LSH attention kernel runs on the flex CPU backend, not on {device:?}"
        ));
    }
    let [n, len, dh] = qk.dims();
    let [nb, r, lb] = buckets.dims();
    if v.dims() != [n, len, dh] {
        return bad(format!("v has shape {:?}, qk {:?}", v.dims(), qk.dims()));
    }
    if (nb, lb) != (n, len) || r == 0 {
        return bad(format!(
            "buckets have shape {:?}, expected [{n}, rounds >= 1, {len}]",
            buckets.dims()
        ));
    }
    if params.chunk_len == 0 || len % params.chunk_len != 0 || len == 0 {
        return bad(format!(
            "length {len} must be a positive multiple of chunk_len {}",
            params.chunk_len
        ));
    }
    if params.n_buckets == 0 {
        return bad("n_buckets must be positive, got 0".into());
    }
    for (name, dtype) in [("qk", qk.dtype()), ("v", v.dtype())] {
        if dtype != DType::F32 {
            return bad(format!("{name} must be f32, got {dtype:?}"));
        }
    }
    let pad = match pad {
        Some(p) if p.dims() != [n, len] => {
            return bad(format!(
                "pad has shape {:?}, expected [{n}, {len}]",
                p.dims()
            ));
        }
        Some(p) => p,
        None => Tensor::<2, Bool>::empty([n, 0], &device),
    };
    Ok(Tensor::from_dispatch(
        <Dispatch as FusedBackend>::lsh_attention(
            qk.into_dispatch(),
            v.into_dispatch(),
            buckets.into_dispatch(),
            pad.into_dispatch(),
            params,
        ),
    ))
}

/// The position term of [`relative_attention_fused`].
#[derive(Clone, Debug)]
pub enum RelativePosition {
    /// Transformer-XL's terms (b) + (d): `qp R_cᵀ` per distance column `c`, relatively
    /// shifted (`memzoo-relative`'s `relative_shift`). `qp`: `[batch, heads, qlen, d_head]`
    /// (`s (q + v)`), `r`: `[S, heads, d_head]` (`W_R R`, column `c` = distance `klen - 1 - c`),
    /// `S >= klen + 1`.
    Shifted {
        /// `s (q + v)`.
        qp: Tensor<4>,
        /// `W_R R`.
        r: Tensor<3>,
    },
    /// T5's bias `β[bucket_ij, h]`, shared by the batch rows: `table` `[buckets, heads]`
    /// (differentiable), `bucket` `[qlen * klen]` the bucket of pair `(i, j)` at `i * klen + j`.
    Buckets {
        /// `β`.
        table: Tensor<2>,
        /// The bucket of every pair.
        bucket: Tensor<1, Int>,
    },
    /// No position term, `B = 0`: the scores are the content term alone (absolute or rotary
    /// positions, already in `qc` and `k`). Runs as [`Buckets`](Self::Buckets) with one
    /// constant zero bias.
    None,
}

/// Relative multi-head attention as one fused op (the maths is in [`relative`]):
/// `o_i = Σ_j softmax_j(mask(qc_i · k_j + B_ij)) v_j`, `B` the [`RelativePosition`] term;
/// hidden keys score `params.mask_value` (their scores get no gradient, as with `mask_fill`);
/// `params.recompute_probabilities` trades the probabilities kept for training for a second
/// computation in the backward pass ([`RelParams`]).
/// Differentiable in every float input on an autodiff device.
///
/// Errors name the bad shape or dtype, or a device other than `flex` (see [`supports`]).
///
/// # Shapes
/// - `qc`: `[batch, heads, qlen, d_head]`; `k`, `v`: `[batch, heads, klen, d_head]`
/// - `mask`: `[1 or batch, qlen, klen]`, `true` = hidden
/// - output: `[batch, heads, qlen, d_head]` (stored as `[batch, qlen, heads, d_head]`:
///   `swap_dims(1, 2)` and a reshape to `[batch, qlen, heads * d_head]` copy nothing)
pub fn relative_attention_fused(
    qc: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    position: RelativePosition,
    mask: Option<Tensor<3, Bool>>,
    params: RelParams,
) -> Result<Tensor<4>, FusedError> {
    let bad = |m: String| Err(FusedError::Input(m));
    let device = qc.device();
    if !supports(&device) {
        return bad(format!(
            "the relative attention kernel runs on the flex CPU backend, not on {device:?}"
        ));
    }
    let [b, h, q, dh] = qc.dims();
    let [kb, kh, kl, kd] = k.dims();
    if (kb, kh, kd) != (b, h, dh) || kl == 0 || q == 0 || dh == 0 {
        return bad(format!("k has shape {:?}, qc {:?}", k.dims(), qc.dims()));
    }
    if v.dims() != k.dims() {
        return bad(format!("v has shape {:?}, k {:?}", v.dims(), k.dims()));
    }
    let mut dtypes = vec![("qc", qc.dtype()), ("k", k.dtype()), ("v", v.dtype())];
    match &position {
        RelativePosition::None => {}
        RelativePosition::Shifted { qp, r } => {
            if qp.dims() != qc.dims() {
                return bad(format!("qp has shape {:?}, qc {:?}", qp.dims(), qc.dims()));
            }
            let [s, rh, rd] = r.dims();
            if (rh, rd) != (h, dh) || s < kl + 1 {
                return bad(format!(
                    "r has shape {:?}, expected [S >= {}, {h}, {dh}]",
                    r.dims(),
                    kl + 1
                ));
            }
            dtypes.extend([("qp", qp.dtype()), ("r", r.dtype())]);
        }
        RelativePosition::Buckets { table, bucket } => {
            let [n_buckets, th] = table.dims();
            if th != h || n_buckets == 0 {
                return bad(format!(
                    "the bias table has shape {:?}, expected [buckets >= 1, {h}]",
                    table.dims()
                ));
            }
            if bucket.dims() != [q * kl] {
                return bad(format!(
                    "bucket has shape {:?}, expected [{}] (qlen {q} x klen {kl})",
                    bucket.dims(),
                    q * kl
                ));
            }
            // An id outside the table would read out of bounds: checked here, once.
            let (lo, hi) = (
                bucket.clone().min().into_scalar::<i64>(),
                bucket.clone().max().into_scalar::<i64>(),
            );
            if lo < 0 || hi >= n_buckets as i64 {
                return bad(format!(
                    "bucket ids span {lo}..={hi}, the table has {n_buckets} buckets"
                ));
            }
            dtypes.push(("table", table.dtype()));
        }
    }
    for (name, dtype) in dtypes {
        if dtype != DType::F32 {
            return bad(format!("{name} must be f32, got {dtype:?}"));
        }
    }
    let mask = match mask {
        Some(m) if m.dims()[1..] != [q, kl] || !(m.dims()[0] == 1 || m.dims()[0] == b) => {
            return bad(format!(
                "mask has shape {:?}, expected [1 or {b}, {q}, {kl}]",
                m.dims()
            ));
        }
        Some(m) => m,
        None => Tensor::<3, Bool>::empty([0, q, kl], &device),
    };
    let out = match position {
        RelativePosition::Shifted { qp, r } => {
            <Dispatch as FusedBackend>::relative_attention_shifted(
                qc.into_dispatch(),
                qp.into_dispatch(),
                k.into_dispatch(),
                r.into_dispatch(),
                v.into_dispatch(),
                mask.into_dispatch(),
                params,
            )
        }
        RelativePosition::Buckets { table, bucket } => {
            <Dispatch as FusedBackend>::relative_attention_bucketed(
                qc.into_dispatch(),
                k.into_dispatch(),
                table.into_dispatch(),
                bucket.into_dispatch(),
                v.into_dispatch(),
                mask.into_dispatch(),
                params,
            )
        }
        RelativePosition::None => <Dispatch as FusedBackend>::relative_attention_content(
            qc.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            mask.into_dispatch(),
            params,
        ),
    };
    Ok(Tensor::from_dispatch(out))
}

/// Attention of each query over its own retrieved (key, value) pairs as one fused op (the
/// maths is in [`knn`]): `o = Σ_m softmax_m(τ_h q̂ · k̂_m) v_m` over the filled slots (0 when
/// every slot is empty), and with `with_lse` the log-partition of the scores after the read
/// ([`knn::EMPTY_LSE`] when every slot is empty). Differentiable in `q` and `tau` on an
/// autodiff device; `keys`, `values` and `mask` are constants.
///
/// Errors name the bad shape or dtype, or a device other than `flex` (see [`supports`]).
///
/// # Shapes
/// - `q`: `[batch, qlen, heads, d_head]`, `tau`: `[heads]`
/// - `keys`, `values`: `[batch, qlen, heads, k, d_head]`
/// - `mask`: `[batch, qlen, heads, k]`, `true` = an empty slot
/// - output: `[batch, qlen, heads, d_head]`, or `[batch, qlen, heads, d_head + 1]` with
///   `with_lse` (the log-partition last)
pub fn knn_attention_fused(
    q: Tensor<4>,
    tau: Tensor<1>,
    keys: Tensor<5>,
    values: Tensor<5>,
    mask: Tensor<4, Bool>,
    with_lse: bool,
) -> Result<Tensor<4>, FusedError> {
    let bad = |m: String| Err(FusedError::Input(m));
    let device = q.device();
    if !supports(&device) {
        return bad(format!(
            "the kNN attention kernel runs on the flex CPU backend, not on {device:?}"
        ));
    }
    let [b, ql, h, dh] = q.dims();
    let [kb, kq, kh, k, kd] = keys.dims();
    if (kb, kq, kh, kd) != (b, ql, h, dh) || dh == 0 {
        return bad(format!(
            "keys have shape {:?}, q {:?}",
            keys.dims(),
            q.dims()
        ));
    }
    if values.dims() != keys.dims() {
        return bad(format!(
            "values have shape {:?}, keys {:?}",
            values.dims(),
            keys.dims()
        ));
    }
    if tau.dims() != [h] {
        return bad(format!("tau has shape {:?}, expected [{h}]", tau.dims()));
    }
    if mask.dims() != [b, ql, h, k] {
        return bad(format!(
            "mask has shape {:?}, expected [{b}, {ql}, {h}, {k}]",
            mask.dims()
        ));
    }
    for (name, dtype) in [
        ("q", q.dtype()),
        ("tau", tau.dtype()),
        ("keys", keys.dtype()),
        ("values", values.dtype()),
    ] {
        if dtype != DType::F32 {
            return bad(format!("{name} must be f32, got {dtype:?}"));
        }
    }
    Ok(Tensor::from_dispatch(
        <Dispatch as FusedBackend>::knn_attention(
            q.into_dispatch(),
            tau.into_dispatch(),
            keys.into_dispatch(),
            values.into_dispatch(),
            mask.into_dispatch(),
            KnnParams { with_lse },
        ),
    ))
}

/// The exact GELU, `x Φ(x)` with `Φ` the standard normal's CDF (the maths is in
/// [`mod@gelu`]): on the `flex` backend (autodiff or not) one vectorised, multi-threaded op
/// with a hand-written backward; on every other device, or for a dtype other than f32,
/// Burn's own [`activation::gelu`](burn::tensor::activation::gelu). The two agree within
/// about 1e-7 of `|x|`.
///
/// # Shapes
/// - `x`: any → the same
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if supports(&x.device()) && x.dtype() == DType::F32 {
        Tensor::from_dispatch(<Dispatch as FusedBackend>::gelu(x.into_dispatch()))
    } else {
        burn::tensor::activation::gelu(x)
    }
}

/// `lhs · rhs` for 2-D tensors: on the `flex` backend (autodiff or not) Burn's own product
/// (the same `gemm` call, so the same bits) written straight into its output, without the
/// zeroed buffer and the copy Burn's `flex` matmul makes first (see [`mod@matmul`]), with the
/// backward `dA = G Bᵀ`, `dB = Aᵀ G`; on every other device, or for a dtype other than f32,
/// Burn's [`Tensor::matmul`].
///
/// # Panics
/// When the inner dimensions differ (as [`Tensor::matmul`]).
///
/// # Shapes
/// - `lhs`: `[m, k]`, `rhs`: `[k, n]` → `[m, n]`
pub fn matmul_2d(lhs: Tensor<2>, rhs: Tensor<2>) -> Tensor<2> {
    let fused = supports(&lhs.device())
        && supports(&rhs.device())
        && lhs.dtype() == DType::F32
        && rhs.dtype() == DType::F32;
    if !fused {
        return lhs.matmul(rhs);
    }
    let ([m, k], [kr, n]) = (lhs.dims(), rhs.dims());
    assert_eq!(k, kr, "matmul_2d: [{m}, {k}] x [{kr}, {n}]");
    Tensor::from_dispatch(<Dispatch as FusedBackend>::matmul_2d(
        lhs.into_dispatch(),
        rhs.into_dispatch(),
    ))
}

/// A linear layer on rows, `y = x W + b`, as Burn's [`linear`](burn::tensor::module::linear)
/// computes it on `flex` (`x W` then the bias added, each to the bit), with the product by
/// [`matmul_2d()`]. On other devices, Burn's `linear` itself.
///
/// # Shapes
/// - `x`: `[rows, d_in]`, `weight`: `[d_in, d_out]`, `bias`: `[d_out]` → `[rows, d_out]`
pub fn linear(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    if !(supports(&x.device()) && x.dtype() == DType::F32 && weight.dtype() == DType::F32) {
        return burn::tensor::module::linear(x, weight, bias);
    }
    let y = matmul_2d(x, weight);
    match bias {
        Some(b) => {
            let d_out = b.dims()[0];
            y + b.reshape([1, d_out])
        }
        None => y,
    }
}

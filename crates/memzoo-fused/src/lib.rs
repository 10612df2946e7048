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
//! The kernels run on the `flex` backend (with or without autodiff); [`supports`] says whether a
//! device can run them. Callers keep their tensor-op path for every other backend and as the
//! reference the kernels are tested against (`memzoo-reformer`'s `attention` tests).
//!
//! This crate is compiled at `opt-level = 3` in the dev profile (the workspace's own crates are
//! at 1): its loops are the hot path.

#![warn(missing_docs)]

pub mod dropout;
pub mod knn;
pub mod lsh;
pub mod relative;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};

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

    /// See [`knn_attention_fused`]. `mask` is `[batch, qlen, heads, k]`.
    fn knn_attention(
        q: FloatTensor<Self>,
        tau: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: KnnParams,
    ) -> FloatTensor<Self>;
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
}

/// Host copies of the kernel's inputs.
struct LshHost {
    dims: LshDims,
    qk: Vec<f32>,
    v: Vec<f32>,
    buckets: Vec<i64>,
    pad: Vec<bool>,
}

fn f32_vec(data: TensorData) -> Vec<f32> {
    data.convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after conversion")
}

impl LshHost {
    fn new(
        qk: FloatTensor<Flex>,
        v: FloatTensor<Flex>,
        buckets: IntTensor<Flex>,
        pad: BoolTensor<Flex>,
    ) -> Self {
        let qk = qk.into_data();
        let [n, len, d_head] = [qk.shape()[0], qk.shape()[1], qk.shape()[2]];
        let buckets = buckets.into_data();
        let rounds = buckets.shape()[1];
        let pad = pad.into_data();
        let pad: Vec<bool> = if pad.num_elements() == 0 {
            Vec::new()
        } else {
            pad.iter::<bool>().collect()
        };
        // No padded key at all: the kernel skips the look-ups.
        let pad = if pad.iter().any(|&p| p) {
            pad
        } else {
            Vec::new()
        };
        Self {
            dims: LshDims {
                n,
                len,
                rounds,
                d_head,
            },
            qk: f32_vec(qk),
            v: f32_vec(v.into_data()),
            buckets: buckets
                .convert::<i64>()
                .try_into_vec::<i64>()
                .expect("i64 data after conversion"),
            pad,
        }
    }
}

fn flex_tensor(values: Vec<f32>, shape: [usize; 3]) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(values, shape), &Default::default())
}

impl FusedBackend for Flex {
    fn lsh_attention(
        qk: FloatTensor<Self>,
        v: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        pad: BoolTensor<Self>,
        params: LshKernelParams,
    ) -> FloatTensor<Self> {
        let host = LshHost::new(qk, v, buckets, pad);
        let d = host.dims;
        let (y, _) = lsh::forward(d, &params, &host.qk, &host.v, &host.buckets, &host.pad);
        flex_tensor(y, [d.n, d.len, d.d_head])
    }

    fn lsh_hash(x: FloatTensor<Self>, rotations: FloatTensor<Self>) -> IntTensor<Self> {
        let x = x.into_data();
        let [n, len, dh] = [x.shape()[0], x.shape()[1], x.shape()[2]];
        let rot = rotations.into_data();
        let (rounds, half) = (rot.shape()[1], rot.shape()[2]);
        let ids = lsh::hash(&f32_vec(x), (n, len, dh), &f32_vec(rot), rounds);
        debug_assert_eq!(ids.len(), n * rounds * len, "{half} buckets / 2");
        let ids: Vec<i32> = ids.into_iter().map(|i| i as i32).collect();
        Flex::int_from_data(TensorData::new(ids, [n, rounds, len]), &Default::default())
    }

    fn relative_attention_shifted(
        qc: FloatTensor<Self>,
        qp: FloatTensor<Self>,
        k: FloatTensor<Self>,
        r: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        let inputs = RelInputs::new(qc, k, v, RelPosTensors::Shifted { qp, r }, mask, params);
        inputs.forward().0
    }

    fn relative_attention_bucketed(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        table: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        let pos = RelPosTensors::buckets(table, buckets);
        let inputs = RelInputs::new(qc, k, v, pos, mask, params);
        inputs.forward().0
    }

    fn knn_attention(
        q: FloatTensor<Self>,
        tau: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: KnnParams,
    ) -> FloatTensor<Self> {
        KnnHost::new(q, tau, keys, values, mask, params).forward()
    }
}

/// A strided view of a flex `f32` tensor's storage.
fn view(t: &FloatTensor<Flex>) -> relative::View<'_> {
    let layout = t.layout();
    let mut strides = [0isize; 4];
    for (s, &x) in strides.iter_mut().zip(layout.strides()) {
        *s = x;
    }
    relative::View {
        data: t.storage::<f32>(),
        offset: layout.start_offset(),
        strides,
    }
}

fn flex_from(values: Vec<f32>, shape: &[usize]) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(values, shape.to_vec()), &Default::default())
}

/// The position term's tensors of the relative attention kernel.
#[derive(Clone, Debug)]
enum RelPosTensors {
    /// `qp` `[batch, heads, qlen, d_head]` and `R` `[S, heads, d_head]`.
    Shifted {
        qp: FloatTensor<Flex>,
        r: FloatTensor<Flex>,
    },
    /// `β` `[buckets, heads]` and the bucket of every pair, `[qlen * klen]`.
    Buckets {
        table: FloatTensor<Flex>,
        bucket: Vec<u32>,
    },
}

impl RelPosTensors {
    fn buckets(table: FloatTensor<Flex>, buckets: IntTensor<Flex>) -> Self {
        let bucket = buckets
            .into_data()
            .convert::<i64>()
            .try_into_vec::<i64>()
            .expect("i64 data after conversion")
            .into_iter()
            .map(|u| u as u32)
            .collect();
        RelPosTensors::Buckets { table, bucket }
    }
}

/// The relative attention kernel's inputs (shared, not copied) with the mask on the host.
#[derive(Clone, Debug)]
struct RelInputs {
    qc: FloatTensor<Flex>,
    k: FloatTensor<Flex>,
    v: FloatTensor<Flex>,
    pos: RelPosTensors,
    /// `[rows, qlen, klen]` flags (empty: nothing hidden) and `rows`.
    hidden: (Vec<bool>, usize),
    params: RelParams,
}

impl RelInputs {
    fn new(
        qc: FloatTensor<Flex>,
        k: FloatTensor<Flex>,
        v: FloatTensor<Flex>,
        pos: RelPosTensors,
        mask: BoolTensor<Flex>,
        params: RelParams,
    ) -> Self {
        let rows = mask.layout().shape()[0];
        let hidden = if rows == 0 {
            Vec::new()
        } else {
            bool_flags(mask)
        };
        Self {
            qc,
            k,
            v,
            pos,
            hidden: (hidden, rows),
            params,
        }
    }

    fn dims(&self) -> relative::RelDims {
        let s = self.qc.layout().shape();
        let columns = match &self.pos {
            RelPosTensors::Shifted { r, .. } => r.layout().shape()[0],
            RelPosTensors::Buckets { .. } => 0,
        };
        relative::RelDims {
            batch: s[0],
            heads: s[1],
            qlen: s[2],
            klen: self.k.layout().shape()[2],
            d_head: s[3],
            columns,
        }
    }

    fn position(&self) -> relative::Position<'_> {
        match &self.pos {
            RelPosTensors::Shifted { qp, r } => relative::Position::Shifted {
                qp: view(qp),
                r: view(r),
            },
            RelPosTensors::Buckets { table, bucket } => relative::Position::Buckets {
                table: view(table),
                n_buckets: table.layout().shape()[0],
                bucket,
            },
        }
    }

    fn mask(&self) -> relative::Mask<'_> {
        relative::Mask {
            hidden: &self.hidden.0,
            rows: self.hidden.1,
            value: self.params.mask_value,
        }
    }

    /// The output `[batch, heads, qlen, d_head]` (stored as `[batch, qlen, heads, d_head]`,
    /// so that the heads' concatenation is a free reshape) and the probabilities.
    fn forward(&self) -> (FloatTensor<Flex>, Vec<f32>) {
        let d = self.dims();
        let (out, probs) = relative::forward(
            d,
            view(&self.qc),
            view(&self.k),
            view(&self.v),
            self.position(),
            self.mask(),
        );
        let out = flex_from(out, &[d.batch, d.qlen, d.heads, d.d_head]);
        (Flex::float_permute(out, &[0, 2, 1, 3]), probs)
    }

    /// The gradients from `dL/d output` (`[batch, heads, qlen, d_head]`).
    fn backward(&self, probs: &[f32], grad: FloatTensor<Flex>) -> relative::RelGrads {
        let g = Flex::float_permute(grad, &[0, 2, 1, 3]);
        relative::backward(
            self.dims(),
            view(&self.qc),
            view(&self.k),
            view(&self.v),
            self.position(),
            self.mask(),
            probs,
            view(&g),
        )
    }
}

/// State of the relative attention's backward: the inputs and the probabilities.
#[derive(Clone, Debug)]
struct RelState {
    inputs: RelInputs,
    probs: Vec<f32>,
}

#[derive(Debug)]
struct RelShiftedBackward;

impl Backward<Flex, 5> for RelShiftedBackward {
    type State = RelState;

    fn backward(self, ops: Ops<RelState, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let RelState { inputs, probs } = ops.state;
        let d = inputs.dims();
        let g = inputs.backward(&probs, grad);
        let qshape = [d.batch, d.heads, d.qlen, d.d_head];
        let kshape = [d.batch, d.heads, d.klen, d.d_head];
        let rshape = [d.columns, d.heads, d.d_head];
        let [qc, qp, k, r, v] = ops.parents;
        for (parent, values, shape) in [
            (qc, g.qc, &qshape[..]),
            (qp, g.qp, &qshape[..]),
            (k, g.k, &kshape[..]),
            (r, g.table, &rshape[..]),
            (v, g.v, &kshape[..]),
        ] {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, flex_from(values, shape));
            }
        }
    }
}

#[derive(Debug)]
struct RelBucketedBackward;

impl Backward<Flex, 4> for RelBucketedBackward {
    type State = RelState;

    fn backward(self, ops: Ops<RelState, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let RelState { inputs, probs } = ops.state;
        let d = inputs.dims();
        let g = inputs.backward(&probs, grad);
        let qshape = [d.batch, d.heads, d.qlen, d.d_head];
        let kshape = [d.batch, d.heads, d.klen, d.d_head];
        let bshape = match &inputs.pos {
            RelPosTensors::Buckets { table, .. } => [table.layout().shape()[0], d.heads],
            RelPosTensors::Shifted { .. } => unreachable!("a bucketed op holds buckets"),
        };
        let [qc, k, table, v] = ops.parents;
        for (parent, values, shape) in [
            (qc, g.qc, &qshape[..]),
            (k, g.k, &kshape[..]),
            (table, g.table, &bshape[..]),
            (v, g.v, &kshape[..]),
        ] {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, flex_from(values, shape));
            }
        }
    }
}

/// State of the LSH attention's backward: the inputs (shared, not copied) and the sorted
/// outputs and log-partitions.
#[derive(Clone, Debug)]
struct LshState {
    qk: FloatTensor<Flex>,
    v: FloatTensor<Flex>,
    buckets: IntTensor<Flex>,
    pad: BoolTensor<Flex>,
    params: LshKernelParams,
    saved: lsh::LshSaved,
}

#[derive(Debug)]
struct LshBackward;

impl Backward<Flex, 2> for LshBackward {
    type State = LshState;

    fn backward(self, ops: Ops<LshState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [qk_parent, v_parent] = ops.parents;
        let dy = f32_vec(grads.consume::<Flex>(&ops.node).into_data());
        let LshState {
            qk,
            v,
            buckets,
            pad,
            params,
            saved,
        } = ops.state;
        let host = LshHost::new(qk, v, buckets, pad);
        let d = host.dims;
        let (dqk, dv) = lsh::backward(
            d,
            &params,
            &host.qk,
            &host.v,
            &host.buckets,
            &host.pad,
            &saved,
            &dy,
        );
        let shape = [d.n, d.len, d.d_head];
        if let Some(node) = qk_parent {
            grads.register::<Flex>(node.id, flex_tensor(dqk, shape));
        }
        if let Some(node) = v_parent {
            grads.register::<Flex>(node.id, flex_tensor(dv, shape));
        }
    }
}

impl<C: CheckpointStrategy> FusedBackend for Autodiff<Flex, C> {
    fn lsh_attention(
        qk: FloatTensor<Self>,
        v: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        pad: BoolTensor<Self>,
        params: LshKernelParams,
    ) -> FloatTensor<Self> {
        let nodes = [qk.node(), v.node()];
        let (qk, v) = (qk.into_primitive(), v.into_primitive());
        match LshBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let host = LshHost::new(qk.clone(), v.clone(), buckets.clone(), pad.clone());
                let d = host.dims;
                let (y, saved) =
                    lsh::forward(d, &params, &host.qk, &host.v, &host.buckets, &host.pad);
                drop(host);
                let state = LshState {
                    qk,
                    v,
                    buckets,
                    pad,
                    params,
                    saved,
                };
                prep.finish(state, flex_tensor(y, [d.n, d.len, d.d_head]))
            }
            OpsKind::UnTracked(prep) => prep.finish(<Flex as FusedBackend>::lsh_attention(
                qk, v, buckets, pad, params,
            )),
        }
    }

    fn lsh_hash(x: FloatTensor<Self>, rotations: FloatTensor<Self>) -> IntTensor<Self> {
        // Bucket ids carry no gradient: the kernel runs on the primitives.
        <Flex as FusedBackend>::lsh_hash(x.into_primitive(), rotations.into_primitive())
    }

    fn relative_attention_shifted(
        qc: FloatTensor<Self>,
        qp: FloatTensor<Self>,
        k: FloatTensor<Self>,
        r: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        let nodes = [qc.node(), qp.node(), k.node(), r.node(), v.node()];
        let pos = RelPosTensors::Shifted {
            qp: qp.into_primitive(),
            r: r.into_primitive(),
        };
        let inputs = RelInputs::new(
            qc.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            pos,
            mask,
            params,
        );
        match RelShiftedBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, probs) = inputs.forward();
                prep.finish(RelState { inputs, probs }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(inputs.forward().0),
        }
    }

    fn relative_attention_bucketed(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        table: FloatTensor<Self>,
        buckets: IntTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        let nodes = [qc.node(), k.node(), table.node(), v.node()];
        let inputs = RelInputs::new(
            qc.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            RelPosTensors::buckets(table.into_primitive(), buckets),
            mask,
            params,
        );
        match RelBucketedBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, probs) = inputs.forward();
                prep.finish(RelState { inputs, probs }, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(inputs.forward().0),
        }
    }

    fn knn_attention(
        q: FloatTensor<Self>,
        tau: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: KnnParams,
    ) -> FloatTensor<Self> {
        let nodes = [q.node(), tau.node()];
        // The retrieved pairs are constants: their nodes (if any) are dropped.
        let host = KnnHost::new(
            q.into_primitive(),
            tau.into_primitive(),
            keys.into_primitive(),
            values.into_primitive(),
            mask,
            params,
        );
        match KnnBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = host.forward();
                prep.finish(host, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(host.forward()),
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
}

/// Relative multi-head attention as one fused op (the maths is in [`relative`]):
/// `o_i = Σ_j softmax_j(mask(qc_i · k_j + B_ij)) v_j`, `B` the [`RelativePosition`] term;
/// hidden keys score `mask_value` (their scores get no gradient, as with `mask_fill`).
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
    mask_value: f32,
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
    let params = RelParams { mask_value };
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
    };
    Ok(Tensor::from_dispatch(out))
}

/// The kNN attention kernel's inputs: the tensors (shared, not copied; made contiguous) and
/// the mask on the host.
#[derive(Clone, Debug)]
struct KnnHost {
    dims: knn::KnnDims,
    /// `[batch, qlen]`: the output's leading dims.
    lead: [usize; 2],
    q: FloatTensor<Flex>,
    tau: FloatTensor<Flex>,
    keys: FloatTensor<Flex>,
    values: FloatTensor<Flex>,
    hidden: Vec<bool>,
}

/// `t` with a row-major layout (a copy only when it has none).
fn contiguous(t: FloatTensor<Flex>) -> FloatTensor<Flex> {
    if t.is_contiguous() {
        t
    } else {
        t.to_contiguous()
    }
}

/// The flags of a flex bool tensor, in row-major order (read from its byte storage; a
/// strided view is copied to a row-major one first).
fn bool_flags(t: BoolTensor<Flex>) -> Vec<bool> {
    let t = if t.is_contiguous() {
        t
    } else {
        t.to_contiguous()
    };
    let start = t.layout().start_offset();
    t.storage::<u8>()[start..start + t.layout().num_elements()]
        .iter()
        .map(|&b| b != 0)
        .collect()
}

/// The elements of a contiguous flex `f32` tensor, in order.
fn elements(t: &FloatTensor<Flex>) -> &[f32] {
    let start = t.layout().start_offset();
    &t.storage::<f32>()[start..start + t.layout().num_elements()]
}

impl KnnHost {
    fn new(
        q: FloatTensor<Flex>,
        tau: FloatTensor<Flex>,
        keys: FloatTensor<Flex>,
        values: FloatTensor<Flex>,
        mask: BoolTensor<Flex>,
        params: KnnParams,
    ) -> Self {
        let shape = keys.layout().shape().clone();
        let dims = knn::KnnDims {
            rows: shape[0] * shape[1],
            heads: shape[2],
            k: shape[3],
            d_head: shape[4],
            with_lse: params.with_lse,
        };
        Self {
            dims,
            lead: [shape[0], shape[1]],
            q: contiguous(q),
            tau: contiguous(tau),
            keys: contiguous(keys),
            values: contiguous(values),
            hidden: bool_flags(mask),
        }
    }

    fn inputs(&self) -> knn::KnnInputs<'_> {
        knn::KnnInputs {
            q: elements(&self.q),
            tau: elements(&self.tau),
            keys: elements(&self.keys),
            values: elements(&self.values),
            hidden: &self.hidden,
        }
    }

    fn forward(&self) -> FloatTensor<Flex> {
        let d = self.dims;
        let out = knn::forward(d, &self.inputs());
        flex_from(out, &[self.lead[0], self.lead[1], d.heads, d.width()])
    }
}

#[derive(Debug)]
struct KnnBackward;

impl Backward<Flex, 2> for KnnBackward {
    type State = KnnHost;

    fn backward(self, ops: Ops<KnnHost, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = contiguous(grads.consume::<Flex>(&ops.node));
        let host = ops.state;
        let d = host.dims;
        let (dq, dtau) = knn::backward(d, &host.inputs(), elements(&g));
        let [q_parent, tau_parent] = ops.parents;
        if let Some(node) = q_parent {
            let shape = [host.lead[0], host.lead[1], d.heads, d.d_head];
            grads.register::<Flex>(node.id, flex_from(dq, &shape));
        }
        if let Some(node) = tau_parent {
            grads.register::<Flex>(node.id, flex_from(dtau, &[d.heads]));
        }
    }
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

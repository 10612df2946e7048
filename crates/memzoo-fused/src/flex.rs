//! The kernels on the plain `flex` backend: the inputs as host slices (or strided views of the
//! tensors' storage), the kernels of [`crate::lsh`], [`crate::relative`] and [`crate::knn`]
//! called on them, the results back as tensors. The autodiff backend ([`crate::autodiff`])
//! shares these inputs and adds the backward passes.

use burn::backend::Flex;
use burn::backend::ops::{FloatTensorOps, IntTensorOps};
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::TensorData;

use crate::{
    FusedBackend, KnnParams, LshDims, LshKernelParams, RelParams, gelu, knn, lsh, matmul, relative,
};

/// Host copies of the kernel's inputs.
pub(crate) struct LshHost {
    pub(crate) dims: LshDims,
    pub(crate) qk: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) buckets: Vec<i64>,
    pub(crate) pad: Vec<bool>,
}

pub(crate) fn f32_vec(data: TensorData) -> Vec<f32> {
    data.convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after conversion")
}

impl LshHost {
    pub(crate) fn new(
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

pub(crate) fn flex_tensor(values: Vec<f32>, shape: [usize; 3]) -> FloatTensor<Flex> {
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
        assert_eq!(ids.len(), n * rounds * len, "{half} buckets / 2");
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
        inputs.forward(false).0
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
        inputs.forward(false).0
    }

    fn relative_attention_content(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        RelInputs::new(qc, k, v, RelPosTensors::None, mask, params)
            .forward(false)
            .0
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

    fn gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let x = gelu_input(x);
        let mut y = vec![0.0; x.layout().num_elements()];
        gelu::forward(rows(&x).expect("gelu_input's result has rows"), &mut y);
        flex_from(y, x.layout().shape())
    }

    fn matmul_2d(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let (a, b) = (matrix(&lhs), matrix(&rhs));
        let shape = [a.shape[0], b.shape[1]];
        flex_from(matmul::matmul(a, b), &shape)
    }
}

/// `t` as the GELU kernel reads it: itself when its elements are evenly strided runs (see
/// [`rows`]; GEGLU's gate, half of each row of a product, is read in place), else a
/// contiguous copy.
pub(crate) fn gelu_input(t: FloatTensor<Flex>) -> FloatTensor<Flex> {
    match rows(&t).is_some() {
        true => t,
        false => t.to_contiguous(),
    }
}

/// A flex `f32` tensor's elements in row-major order as evenly strided runs of its last dim,
/// when its layout has them: the last dim contiguous and the others stepping as one.
pub(crate) fn rows(t: &FloatTensor<Flex>) -> Option<gelu::Rows<'_>> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    let (data, offset, n) = (
        t.storage::<f32>(),
        layout.start_offset(),
        layout.num_elements(),
    );
    if t.is_contiguous() || n == 0 {
        return Some(gelu::Rows::contiguous(&data[offset..offset + n]));
    }
    let k = shape.num_dims();
    let len = shape[k - 1];
    if strides[k - 1] != 1 && len > 1 {
        return None;
    }
    let (mut rows, mut stride, mut outer) = (1, len as isize, None::<isize>);
    for i in (0..k - 1).rev().filter(|&i| shape[i] > 1) {
        match outer {
            None if strides[i] >= len as isize => stride = strides[i],
            Some(s) if strides[i] == s => {}
            _ => return None,
        }
        outer = Some(strides[i] * shape[i] as isize);
        rows *= shape[i];
    }
    Some(gelu::Rows {
        data,
        offset,
        rows,
        len,
        stride: stride as usize,
    })
}

/// A 2-D flex `f32` tensor as a strided view of its storage.
pub(crate) fn matrix(t: &FloatTensor<Flex>) -> matmul::Matrix<'_> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    matmul::Matrix {
        data: t.storage::<f32>(),
        offset: layout.start_offset(),
        shape: [shape[0], shape[1]],
        strides: [strides[0], strides[1]],
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

pub(crate) fn flex_from(values: Vec<f32>, shape: &[usize]) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(values, shape.to_vec()), &Default::default())
}

/// The position term's tensors of the relative attention kernel.
#[derive(Clone, Debug)]
pub(crate) enum RelPosTensors {
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
    /// No position term: the content scores alone.
    None,
}

impl RelPosTensors {
    pub(crate) fn buckets(table: FloatTensor<Flex>, buckets: IntTensor<Flex>) -> Self {
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
pub(crate) struct RelInputs {
    qc: FloatTensor<Flex>,
    k: FloatTensor<Flex>,
    v: FloatTensor<Flex>,
    pub(crate) pos: RelPosTensors,
    /// `[rows, qlen, klen]` flags (empty: nothing hidden) and `rows`.
    hidden: (Vec<bool>, usize),
    params: RelParams,
}

impl RelInputs {
    pub(crate) fn new(
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

    /// The kernel's settings.
    pub(crate) fn params(&self) -> RelParams {
        self.params
    }

    pub(crate) fn dims(&self) -> relative::RelDims {
        let s = self.qc.layout().shape();
        let columns = match &self.pos {
            RelPosTensors::Shifted { r, .. } => r.layout().shape()[0],
            RelPosTensors::Buckets { .. } | RelPosTensors::None => 0,
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
            RelPosTensors::None => relative::Position::None,
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
    /// so that the heads' concatenation is a free reshape) and, with `keep`, the
    /// probabilities (else `None`).
    pub(crate) fn forward(&self, keep: bool) -> (FloatTensor<Flex>, Option<Vec<f32>>) {
        let d = self.dims();
        let (out, probs) = relative::forward(
            d,
            view(&self.qc),
            view(&self.k),
            view(&self.v),
            self.position(),
            self.mask(),
            keep,
        );
        let probs = keep.then_some(probs);
        let out = flex_from(out, &[d.batch, d.qlen, d.heads, d.d_head]);
        (Flex::float_permute(out, &[0, 2, 1, 3]), probs)
    }

    /// The gradients from `dL/d output` (`[batch, heads, qlen, d_head]`), with the
    /// probabilities [`forward`](Self::forward) kept (`None`: computed again).
    pub(crate) fn backward(
        &self,
        probs: Option<&[f32]>,
        grad: FloatTensor<Flex>,
    ) -> relative::RelGrads {
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

/// The kNN attention kernel's inputs: the tensors (shared, not copied; made contiguous) and
/// the mask on the host.
#[derive(Clone, Debug)]
pub(crate) struct KnnHost {
    pub(crate) dims: knn::KnnDims,
    /// `[batch, qlen]`: the output's leading dims.
    pub(crate) lead: [usize; 2],
    q: FloatTensor<Flex>,
    tau: FloatTensor<Flex>,
    keys: FloatTensor<Flex>,
    values: FloatTensor<Flex>,
    hidden: Vec<bool>,
}

/// `t` with a row-major layout (a copy only when it has none).
pub(crate) fn contiguous(t: FloatTensor<Flex>) -> FloatTensor<Flex> {
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
pub(crate) fn elements(t: &FloatTensor<Flex>) -> &[f32] {
    let start = t.layout().start_offset();
    &t.storage::<f32>()[start..start + t.layout().num_elements()]
}

impl KnnHost {
    pub(crate) fn new(
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

    pub(crate) fn inputs(&self) -> knn::KnnInputs<'_> {
        knn::KnnInputs {
            q: elements(&self.q),
            tau: elements(&self.tau),
            keys: elements(&self.keys),
            values: elements(&self.values),
            hidden: &self.hidden,
        }
    }

    pub(crate) fn forward(&self) -> FloatTensor<Flex> {
        let d = self.dims;
        let out = knn::forward(d, &self.inputs());
        flex_from(out, &[self.lead[0], self.lead[1], d.heads, d.width()])
    }
}

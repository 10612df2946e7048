//! The kernels on the autodiff `flex` backend: each op records what its backward needs (the
//! inputs, shared not copied, and the forward's probabilities or log-partitions) and registers
//! the hand-written gradients of [`crate::lsh`], [`crate::relative`] and [`crate::knn`] for
//! its tracked parents.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::{Autodiff, Flex};

use crate::flex::{
    KnnHost, LshHost, RelInputs, RelPosTensors, contiguous, elements, f32_vec, flex_from,
    flex_tensor, gelu_input, matrix, rows,
};
use crate::{
    FusedBackend, KnnParams, LshKernelParams, RelParams, gelu, knn, lsh, matmul, relative,
};

/// State of the relative attention's backward: the inputs and the probabilities (`None`:
/// [`RelParams::recompute_probabilities`], the backward computes them again).
#[derive(Clone, Debug)]
struct RelState {
    inputs: RelInputs,
    probs: Option<Vec<f32>>,
}

/// Runs the relative attention's forward on `inputs`, and records `op` (the backward of the
/// position form the inputs hold) with their probabilities, unless the inputs' parameters ask
/// for them to be computed again, when a parent is tracked.
fn relative_op<C: CheckpointStrategy, const N: usize>(
    op: impl Backward<Flex, N, State = RelState>,
    nodes: [NodeGuard; N],
    inputs: RelInputs,
) -> FloatTensor<Autodiff<Flex, C>> {
    match op.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, probs) = inputs.forward(!inputs.params().recompute_probabilities);
            prep.finish(RelState { inputs, probs }, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(inputs.forward(false).0),
    }
}

/// The relative attention's backward: the kernel's gradients from the saved state, each
/// registered for its parent when tracked. `pick` orders them as the op's parents, with their
/// shapes.
fn rel_backward<const N: usize>(
    ops: Ops<RelState, N>,
    grads: &mut Gradients,
    pick: impl FnOnce(
        relative::RelGrads,
        relative::RelDims,
        &RelPosTensors,
    ) -> [(Vec<f32>, Vec<usize>); N],
) {
    let grad = grads.consume::<Flex>(&ops.node);
    let RelState { inputs, probs } = ops.state;
    let d = inputs.dims();
    let g = inputs.backward(probs.as_deref(), grad);
    for (parent, (values, shape)) in ops.parents.into_iter().zip(pick(g, d, &inputs.pos)) {
        if let Some(node) = parent {
            grads.register::<Flex>(node.id, flex_from(values, &shape));
        }
    }
}

/// Shapes of the queries' and of the keys' (and values') gradients.
fn qk_shapes(d: relative::RelDims) -> (Vec<usize>, Vec<usize>) {
    (
        vec![d.batch, d.heads, d.qlen, d.d_head],
        vec![d.batch, d.heads, d.klen, d.d_head],
    )
}

#[derive(Debug)]
struct RelShiftedBackward;

impl Backward<Flex, 5> for RelShiftedBackward {
    type State = RelState;

    fn backward(self, ops: Ops<RelState, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        rel_backward(ops, grads, |g, d, _| {
            let (q, k) = qk_shapes(d);
            let r = vec![d.columns, d.heads, d.d_head];
            [
                (g.qc, q.clone()),
                (g.qp, q),
                (g.k, k.clone()),
                (g.table, r),
                (g.v, k),
            ]
        });
    }
}

#[derive(Debug)]
struct RelBucketedBackward;

impl Backward<Flex, 4> for RelBucketedBackward {
    type State = RelState;

    fn backward(self, ops: Ops<RelState, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        rel_backward(ops, grads, |g, d, pos| {
            let (q, k) = qk_shapes(d);
            let buckets = match pos {
                RelPosTensors::Buckets { table, .. } => table.layout().shape()[0],
                RelPosTensors::Shifted { .. } | RelPosTensors::None => {
                    unreachable!("a bucketed op holds buckets")
                }
            };
            [
                (g.qc, q),
                (g.k, k.clone()),
                (g.table, vec![buckets, d.heads]),
                (g.v, k),
            ]
        });
    }
}

#[derive(Debug)]
struct RelContentBackward;

impl Backward<Flex, 3> for RelContentBackward {
    type State = RelState;

    fn backward(self, ops: Ops<RelState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        rel_backward(ops, grads, |g, d, _| {
            let (q, k) = qk_shapes(d);
            [(g.qc, q), (g.k, k.clone()), (g.v, k)]
        });
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
        relative_op::<C, 5>(RelShiftedBackward, nodes, inputs)
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
        relative_op::<C, 4>(RelBucketedBackward, nodes, inputs)
    }

    fn relative_attention_content(
        qc: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        params: RelParams,
    ) -> FloatTensor<Self> {
        let nodes = [qc.node(), k.node(), v.node()];
        let inputs = RelInputs::new(
            qc.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            RelPosTensors::None,
            mask,
            params,
        );
        relative_op::<C, 3>(RelContentBackward, nodes, inputs)
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

    fn gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [x.node()];
        let x = gelu_input(x.into_primitive());
        match GeluBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = <Flex as FusedBackend>::gelu(x.clone());
                prep.finish(x, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(<Flex as FusedBackend>::gelu(x)),
        }
    }

    fn matmul_2d(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
        let nodes = [lhs.node(), rhs.node()];
        let (a, b) = (lhs.into_primitive(), rhs.into_primitive());
        match MatmulBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = <Flex as FusedBackend>::matmul_2d(a.clone(), b.clone());
                // dA needs B, dB needs A: keep (shared, not copied) only what a gradient reads.
                prep.finish((rhs_tracked.then_some(a), lhs_tracked.then_some(b)), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(<Flex as FusedBackend>::matmul_2d(a, b)),
        }
    }
}

/// The 2-D product's backward: `dA = G Bᵀ`, `dB = Aᵀ G`, from the operands it keeps.
#[derive(Debug)]
struct MatmulBackward;

impl Backward<Flex, 2> for MatmulBackward {
    type State = (Option<FloatTensor<Flex>>, Option<FloatTensor<Flex>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Flex>(&ops.node);
        let (a, b) = ops.state;
        let [a_parent, b_parent] = ops.parents;
        if let (Some(node), Some(b)) = (a_parent, b) {
            let (gm, bm) = (matrix(&g), matrix(&b));
            let shape = [gm.shape[0], bm.shape[0]];
            grads.register::<Flex>(node.id, flex_from(matmul::matmul(gm, bm.t()), &shape));
        }
        if let (Some(node), Some(a)) = (b_parent, a) {
            let (am, gm) = (matrix(&a), matrix(&g));
            let shape = [am.shape[1], gm.shape[1]];
            grads.register::<Flex>(node.id, flex_from(matmul::matmul(am.t(), gm), &shape));
        }
    }
}

/// The GELU's backward: `dx = dy gelu'(x)`, from the input it keeps (shared, not copied).
#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = FloatTensor<Flex>;

    fn backward(self, ops: Ops<FloatTensor<Flex>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = contiguous(grads.consume::<Flex>(&ops.node));
        let [parent] = ops.parents;
        if let Some(node) = parent {
            let x = ops.state;
            let mut dx = vec![0.0; x.layout().num_elements()];
            let rows = rows(&x).expect("gelu_input's result has rows");
            gelu::backward(rows, elements(&dy), &mut dx);
            grads.register::<Flex>(node.id, flex_from(dx, x.layout().shape()));
        }
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

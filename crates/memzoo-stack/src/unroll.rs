//! Backpropagation through several segments: one training step over `k` consecutive segments
//! whose carried state stays in the graph ([`TransformerXl::train_unroll`]; the `bptt_segments`
//! of the Recurrent Memory Transformer, see [`crate::rmt`], and of the Block-Recurrent
//! Transformer, see [`crate::block_recurrent`]).

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Int, Tensor};
use memzoo_reformer::ForwardOptions;

use crate::error::XlError;
use crate::memory::XlState;
use crate::stack::{Residual, TransformerXl, mean_nll};

/// One segment of an unrolled training step: what [`crate::RecurrentModel::train_step`] takes.
///
/// # Shapes
/// - `inputs`, `targets`, `weights`: `[batch, len]`; `reset`: `batch` flags
#[derive(Debug, Clone)]
pub struct UnrollSegment {
    /// Input tokens.
    pub inputs: Tensor<2, Int>,
    /// Target tokens.
    pub targets: Tensor<2, Int>,
    /// Row `r` starts a new document here.
    pub reset: Vec<bool>,
    /// 1 where a target counts (`None`: every target).
    pub weights: Option<Tensor<2>>,
}

/// Seed tag of the `i`-th segment of an unroll (`i > 0`; the first draws what a one-segment
/// step draws).
const TAG_UNROLL: u64 = 2_000_000;

impl TransformerXl {
    /// Whether the stack carries a memory that stays in the graph across an unroll (an RMT's
    /// memory tokens, a Block-Recurrent stack's state; sequential residuals).
    pub(crate) fn unrolls(&self) -> bool {
        (self.rmt.is_some() || self.block_recurrent.is_some())
            && self.residual == Residual::Sequential
    }

    /// Segments one training step unrolls: the `bptt_segments` of an RMT or a Block-Recurrent
    /// stack, 1 for every other stack.
    pub(crate) fn unrolled_segments(&self) -> usize {
        match (self.rmt_config(), self.block_recurrent_config()) {
            (Some(r), _) => r.bptt_segments,
            (None, Some(b)) => b.bptt_segments,
            (None, None) => 1,
        }
    }

    /// Training step over `k = segments.len()` consecutive segments with the carried memory in
    /// the graph: `L = (1/k) Σ_τ L_τ` (each `L_τ` the segment's [`mean_nll`]), one backward
    /// through all `k` segments, and the memory carried on detached. For a stack that carries
    /// no graph-bearing memory (every family but the RMT and the Block-Recurrent Transformer)
    /// only `k = 1` is accepted, which is
    /// [`TransformerXl::train_step`].
    ///
    /// # Shapes
    /// - per segment: `inputs`, `targets`, `weights` `[batch, len]`; loss `[1]`
    pub fn train_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut XlState,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let k = segments.len();
        if k == 0 {
            return Err(XlError::Input(
                "an unrolled step needs at least one segment".into(),
            ));
        }
        if !self.unrolls() {
            let mut segments = segments;
            let Some(s) = segments.pop().filter(|_| k == 1) else {
                return Err(XlError::Input(format!(
                    "the `{}` stack trains one segment per step (its memory is detached every \
                     segment), got {k}",
                    self.stack_family()
                )));
            };
            let step = crate::Step::reset(&s.reset).with_weights(s.weights);
            return self.train_step(s.inputs, s.targets, state, &step);
        }
        if !self.device().is_autodiff() {
            return Err(XlError::Input(
                "train_unroll needs the model on an autodiff device (device.autodiff())".into(),
            ));
        }
        self.carried_unroll(segments, state, self.train_options())
    }

    /// Whether the unroll replays its segments for the backward (`memory_replay` of the RMT or
    /// Block-Recurrent settings).
    fn replays_memory(&self) -> bool {
        match (self.rmt_config(), self.block_recurrent_config()) {
            (Some(r), _) => r.memory_replay,
            (None, Some(b)) => b.memory_replay,
            (None, None) => false,
        }
    }

    /// [`train_unroll`](Self::train_unroll) of an RMT or Block-Recurrent stack, drawing from
    /// `opts` (the `i`-th segment from its child `TAG_UNROLL + i`): one graph through all `k`
    /// segments, or with `memory_replay` one segment's graph at a time
    /// ([`replayed_unroll`](Self::replayed_unroll)).
    pub(crate) fn carried_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut XlState,
        opts: Option<ForwardOptions>,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let k = segments.len();
        if k > 1 && self.replays_memory() {
            return self.replayed_unroll(segments, state, opts);
        }
        let mut total: Option<Tensor<1>> = None;
        for (i, s) in segments.into_iter().enumerate() {
            let loss = self.unrolled_loss(s, i, state, opts.as_ref())?;
            total = Some(match total {
                Some(t) => t + loss,
                None => loss,
            });
        }
        let loss = total
            .ok_or_else(|| XlError::Input("no segment".into()))?
            .div_scalar(k as f64);
        let grads = GradientsParams::from_grads(loss.backward(), self);
        state.rmt.detach();
        state.block_recurrent.detach();
        state.xl.detach();
        Ok((loss.inner(), grads))
    }

    /// The mean loss `L_τ` of the `i`-th segment of an unroll, read on top of `state` (its
    /// carried memory left in the graph).
    fn unrolled_loss(
        &self,
        s: UnrollSegment,
        i: usize,
        state: &mut XlState,
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<1>, XlError> {
        crate::stack::check_targets(&s.inputs, &s.targets)?;
        if let Some(w) = &s.weights
            && w.dims() != s.targets.dims()
        {
            return Err(XlError::Input(format!(
                "weights {:?} do not match targets {:?}",
                w.dims(),
                s.targets.dims()
            )));
        }
        let o = match i {
            0 => opts.cloned(),
            _ => opts.map(|o| o.child(TAG_UNROLL + i as u64)),
        };
        let hidden = match self.block_recurrent {
            Some(_) => {
                self.forward_block_recurrent(s.inputs, state, &s.reset, o.as_ref(), true, None)?
            }
            None => self.forward_rmt(s.inputs, state, &s.reset, o.as_ref(), true, None)?,
        };
        Ok(mean_nll(
            self.score(hidden, s.targets, false)?.nll,
            s.weights,
        ))
    }

    /// Memory-replay backpropagation through `k` segments: exactly the gradients of
    /// [`carried_unroll`](Self::carried_unroll)'s one graph, holding one segment's graph at a
    /// time.
    ///
    /// 1. Forward, no graph kept: each segment reads on top of the last (its carried memory
    ///    detached after it); what each segment starts from (`S_τ`: XL memory, document
    ///    positions, carried memory `M_τ`) is kept.
    /// 2. Backward, `τ = k .. 1`: the segment is read again from `S_τ`, with `M_τ` a leaf, and
    ///    `L_τ / k + Σ(M_{τ+1} ⊙ G_{τ+1})` is backpropagated, `G_{τ+1} = ∂L/∂M_{τ+1}` the
    ///    leaf gradient the later segment left (none for the last). Its parameter gradients
    ///    are summed, and `G_τ = ∂L/∂M_τ` goes to the segment before.
    ///
    /// The replayed read must draw what the first did, so every segment's dropout is seeded:
    /// by `opts`, or (a device stack without a dropout seed) by one seed drawn from the
    /// device's generator for this step.
    fn replayed_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut XlState,
        opts: Option<ForwardOptions>,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        if !state.knn.is_empty() || !state.compressed.layers.is_empty() {
            return Err(XlError::Input(
                "memory replay restores the XL and carried memories only; this state also \
                 holds kNN or compressed memories"
                    .into(),
            ));
        }
        let k = segments.len();
        let opts = match opts {
            Some(o) => o,
            None => {
                let draw = Tensor::<1>::random(
                    [2],
                    burn::tensor::Distribution::Uniform(0.0, 65_536.0),
                    &self.device(),
                );
                let v: Vec<f32> = draw.into_data().try_to_vec::<f32>().map_err(|e| {
                    XlError::Input(format!("a seed drawn on the device is not f32: {e:?}"))
                })?;
                ForwardOptions::train(((v[0] as u64) << 16) ^ v[1] as u64)
            }
        };
        // 1. Forward with the parameters as constants (no graph is recorded), keeping each
        //    segment's start.
        self.visit(&mut Initialize);
        let constant = self.clone().no_grad();
        let (mut ahead, _) = SegmentStart::of(state).into_state(|t| t);
        let mut starts = Vec::with_capacity(k);
        let mut total = 0.0;
        for (i, s) in segments.iter().enumerate() {
            starts.push(SegmentStart::of(&ahead));
            let loss = constant.unrolled_loss(s.clone(), i, &mut ahead, Some(&opts))?;
            total += loss.into_scalar::<f64>();
        }
        *state = ahead;
        // 2. Backward, last segment first, each segment read again with its graph.
        let mut acc = GradientsAccumulator::<TransformerXl>::new();
        let mut later: Option<Tensor<3>> = None;
        for (i, s) in segments.into_iter().enumerate().rev() {
            let start = starts
                .pop()
                .ok_or_else(|| XlError::Input("no start".into()))?;
            let (mut replay, leaf) = start.into_state(Tensor::require_grad);
            let loss = self
                .unrolled_loss(s, i, &mut replay, Some(&opts))?
                .div_scalar(k as f64);
            let carried = replay
                .rmt
                .value
                .take()
                .or_else(|| replay.block_recurrent.value.take());
            let objective = match (later.take(), carried) {
                (Some(g), Some(m)) => loss + (m * g).sum(),
                _ => loss,
            };
            let mut grads = objective.backward();
            later = leaf.and_then(|m| m.grad(&grads)).map(Tensor::autodiff);
            acc.accumulate(self, GradientsParams::from_module(&mut grads, self));
        }
        let loss = Tensor::<1>::from_floats([total / k as f64], &self.device());
        Ok((loss.inner(), acc.grads()))
    }
}

/// Initialises every parameter not yet initialised (in place: a parameter initialises
/// lazily, on first read). Before `Module::no_grad` on a clone: a lazy parameter shares its
/// gradient setting with its clones, so the original would otherwise initialise without
/// gradients.
struct Initialize;

impl ModuleVisitor for Initialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// What a segment of a replayed unroll starts from (detached): the XL memory, its rows'
/// document positions and the carried memory (an RMT's memory tokens or a Block-Recurrent
/// state).
struct SegmentStart {
    xl: crate::memory::XlMemory,
    xl_valid: Vec<usize>,
    rmt: Option<Tensor<3>>,
    recurrent: Option<Tensor<3>>,
}

impl SegmentStart {
    fn of(state: &XlState) -> Self {
        let detached = |t: &Option<Tensor<3>>| t.clone().map(Tensor::detach);
        Self {
            xl: state.xl.clone(),
            xl_valid: state.xl_valid.clone(),
            rmt: detached(&state.rmt.value),
            recurrent: detached(&state.block_recurrent.value),
        }
    }

    /// A state to read the segment from, its carried memory passed through `carried` (e.g.
    /// made a leaf that keeps its gradient) and returned beside it (`None`: no memory carried
    /// yet).
    fn into_state(self, carried: impl Fn(Tensor<3>) -> Tensor<3>) -> (XlState, Option<Tensor<3>>) {
        let rmt = self.rmt.map(&carried);
        let recurrent = self.recurrent.map(&carried);
        let leaf = rmt.clone().or_else(|| recurrent.clone());
        let mut state = XlState::new();
        state.xl = self.xl;
        state.xl_valid = self.xl_valid;
        state.rmt.value = rmt;
        state.block_recurrent.value = recurrent;
        (state, leaf)
    }
}

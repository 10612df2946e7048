//! Backpropagation through several segments: one training step over `k` consecutive segments
//! whose carried state stays in the graph ([`TransformerXl::train_unroll`]; the `bptt_segments`
//! of the Recurrent Memory Transformer, see [`crate::rmt`], and of the Block-Recurrent
//! Transformer, see [`crate::block_recurrent`]).

use burn::optim::GradientsParams;
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

    /// [`train_unroll`](Self::train_unroll) of an RMT or Block-Recurrent stack, drawing from
    /// `opts` (the `i`-th segment from its child `TAG_UNROLL + i`).
    pub(crate) fn carried_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut XlState,
        opts: Option<ForwardOptions>,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let k = segments.len();
        let mut total: Option<Tensor<1>> = None;
        for (i, s) in segments.into_iter().enumerate() {
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
                0 => opts.clone(),
                _ => opts.as_ref().map(|o| o.child(TAG_UNROLL + i as u64)),
            };
            let hidden = match self.block_recurrent {
                Some(_) => {
                    self.forward_block_recurrent(s.inputs, state, &s.reset, o.as_ref(), true, None)?
                }
                None => self.forward_rmt(s.inputs, state, &s.reset, o.as_ref(), true, None)?,
            };
            let loss = mean_nll(self.score(hidden, s.targets, false)?.nll, s.weights);
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
        Ok((loss.inner(), grads))
    }
}

//! The training step of the stack (with the reversible driver), and the masks of documents
//! and targets.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_reformer::ForwardOptions;
use memzoo_relative::AttentionMask;

use super::*;
use crate::error::XlError;
use crate::memory::{XlMemory, XlState};

impl TransformerXl {
    /// The memory length a training step reads, drawn from
    /// [`train_memory_lengths`](XlConfig::train_memory_lengths) with the step's seed (`opts`;
    /// a device stack without one: the model's step counter); `None` when the list is empty.
    fn memory_read(&self, opts: Option<&ForwardOptions>) -> Option<usize> {
        let n = self.train_memory_lengths.len() as u64;
        if n == 0 {
            return None;
        }
        let seed = match opts {
            Some(o) => o.child(TAG_MEMORY_READ).seed,
            None => memzoo_reformer::rng::mix(self.train_seed ^ TAG_MEMORY_READ, self.steps.next()),
        };
        Some(self.train_memory_lengths[(seed % n) as usize])
    }

    /// [`forward_state_with`](Self::forward_state_with) for a training step, which with
    /// [`train_memory_lengths`](XlConfig::train_memory_lengths) reads only the most recent `m`
    /// positions of the XL memory ([`memory_read`](Self::memory_read)): the segment then sees
    /// keys up to `m + qlen` back, and its positions are added to the whole memory, which
    /// keeps `mem_len`.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]` → `[batch, qlen, d_model]`
    fn forward_training(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        let read = self.memory_read(opts).filter(|&m| m < state.xl.len());
        let Some(read) = read else {
            return self.forward_state_with(tokens, state, reset, opts);
        };
        let [batch, qlen] = tokens.dims();
        let full = std::mem::replace(&mut state.xl, XlMemory::empty());
        let full_valid = std::mem::take(&mut state.xl_valid);
        state.xl = full.recent(read);
        state.xl_valid = full_valid.iter().map(|&v| v.min(read)).collect();
        let hidden = self.forward_state_with(tokens, state, reset, opts)?;
        // The segment's own positions, last in the memory the pass left: onto the whole one.
        let appended: Vec<Tensor<3>> = (state.xl.layers().iter())
            .map(|m| {
                let n = m.dims()[1];
                m.clone().narrow(1, n - qlen.min(n), qlen.min(n))
            })
            .collect();
        state.xl = full.update(&appended, self.mem_len);
        if self.document_resets {
            let len = state.xl.len();
            let before = match full_valid.len() == batch {
                true => full_valid,
                false => vec![full.len(); batch],
            };
            state.xl_valid = (before.iter().zip(reset))
                .map(|(&v, &r)| (if r { 0 } else { v } + qlen).min(len))
                .collect();
        }
        Ok(hidden)
    }

    /// Training step: the mean loss of one segment ([`mean_nll`] of
    /// [`eval_step`](Self::eval_step)'s losses, weighted by `step.weights`) and the parameter
    /// gradients, updating `state` as [`forward_state`](Self::forward_state) does. The pass
    /// draws its randomness from `step.options`, or else the model's next
    /// ([`train_options`](Self::train_options)); the loss is returned detached. An adaptive
    /// output computes only the clusters the targets fall in.
    ///
    /// A reversible stack runs its layers forward on a `valid()` copy (no graph), keeping only
    /// the top activations and what each layer drew (LSH buckets, retrieved kNN pairs), then
    /// walks back layer by layer ([`XlLayer::reverse`]), rebuilding each layer's inputs from
    /// its outputs: activation memory does not grow with depth (the replayed bucket ids do, by
    /// `batch x heads x rounds x len` integers per LSH layer). A sequential stack uses one
    /// `backward()`. The model must live on an autodiff device.
    ///
    /// # Shapes
    /// - `tokens`, `targets`, `step.weights`: `[batch, qlen]`; loss: `[1]`
    pub fn train_step(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        step: &Step,
    ) -> Result<(Tensor<1>, GradientsParams), XlError> {
        let reset = step.resets(tokens.dims()[0]);
        let reset = reset.as_slice();
        let weights = step.weights.clone();
        let opts = step.options.clone().or_else(|| self.train_options());
        if !self.device().is_autodiff() {
            return Err(XlError::Input(
                "train_step needs the model on an autodiff device (device.autodiff())".into(),
            ));
        }
        check_targets(&tokens, &targets)?;
        if let Some(w) = &weights
            && w.dims() != targets.dims()
        {
            return Err(XlError::Input(format!(
                "weights {:?} do not match targets {:?}",
                w.dims(),
                targets.dims()
            )));
        }
        // A Recurrent Memory or Block-Recurrent Transformer: a one-segment unroll (its memory
        // detached after it).
        if self.unrolls() {
            let s = crate::UnrollSegment {
                inputs: tokens,
                targets,
                reset: reset.to_vec(),
                weights,
            };
            return self.carried_unroll(vec![s], state, opts);
        }
        if self.residual == Residual::Sequential {
            // A compressive stack adds its attention-reconstruction loss (the LM loss is
            // the one returned).
            let (hidden, aux) = match self.compressive {
                Some(_) => {
                    self.forward_compressive(tokens, state, reset, opts.as_ref(), true, None)?
                }
                None => (
                    self.forward_training(tokens, state, reset, opts.as_ref())?,
                    None,
                ),
            };
            let loss = mean_nll(self.score(hidden, targets, false)?.nll, weights);
            let objective = aux.map_or_else(|| loss.clone(), |a| loss.clone() + a);
            let grads = GradientsParams::from_grads(objective.backward(), self);
            return Ok((loss.inner(), grads));
        }
        let Some(opts) = opts.as_ref() else {
            return Err(XlError::Input(
                "a reversible stack trains with seeded randomness (randomness = \"seeded\")".into(),
            ));
        };
        let [batch, qlen] = tokens.dims();
        let mask = self.prepare(&tokens, state, reset)?;
        self.check_memory(batch, &state.xl)?;
        let mlen = state.xl.len();
        let device = tokens.device();
        let mut acc = GradientsAccumulator::<TransformerXl>::new();
        let mut collect = |g: &mut burn::tensor::Gradients| {
            acc.accumulate(self, GradientsParams::from_module(g, self));
        };
        // 1. Embeddings with a (small) graph.
        let e = self.embed(tokens, Some(opts))?;
        // 2. The layers without a graph; only the top activations are kept, with each layer's
        //    memory material and what its attention drew.
        let valid = self.valid();
        let contexts = valid.contexts(batch, qlen, mlen, &mask, &device.clone().inner())?;
        let memory = |l: usize| state.xl.layer(l).cloned();
        let (mut y1, mut y2) = (e.clone().inner(), e.clone().inner());
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut replays = Vec::with_capacity(self.layers.len());
        let memories: Vec<Option<Tensor<3>>> = (0..self.layers.len())
            .map(|l| memory(l).map(|m| m.inner()))
            .collect();
        {
            let mut stores = state.knn.iter_mut();
            for (l, layer) in valid.layers.iter().enumerate() {
                inputs.push(y2.clone());
                let store = match layer.attention {
                    LayerAttention::Knn(_) => Some(
                        stores
                            .next()
                            .ok_or_else(|| {
                                XlError::Input("fewer kNN memories than kNN layers".into())
                            })?
                            .as_mut(),
                    ),
                    _ => None,
                };
                let cx = valid.layer_context(l, &contexts, store, Some(opts));
                let (a, b, replay) = layer.forward_reversible(y1, y2, memories[l].clone(), cx)?;
                (y1, y2) = (a.inner(), b.inner());
                replays.push(replay);
            }
        }
        drop(contexts);
        drop(valid);
        // 3. Head and loss on fresh leaves.
        let y1t = y1.clone().autodiff().require_grad();
        let y2t = y2.clone().autodiff().require_grad();
        let h = self.finish(self.merge_streams(y1t.clone(), y2t.clone()), Some(opts));
        let loss = mean_nll(self.score(h, targets, false)?.nll, weights);
        let mut g = loss.clone().backward();
        let mut dy1 = y1t.grad(&g).expect("leaf requires grad").inner();
        let mut dy2 = y2t.grad(&g).expect("leaf requires grad").inner();
        collect(&mut g);
        // 4. Walk back through the layers, rebuilding inputs from outputs.
        let contexts = self.contexts(batch, qlen, mlen, &mask, &device)?;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let replay = replays.pop().unwrap_or_default();
            let cx = self.layer_context(l, &contexts, None, Some(opts));
            (y1, y2, dy1, dy2) = layer.reverse(
                y1,
                y2,
                dy1,
                dy2,
                memories[l].clone(),
                cx,
                replay,
                &mut collect,
            )?;
        }
        // 5. Into the embeddings.
        let mut g = (e * (dy1 + dy2)).sum().backward();
        collect(&mut g);
        self.advance(state, &inputs, qlen);
        Ok((loss.inner(), acc.grads()))
    }
}

pub(crate) fn check_targets(
    tokens: &Tensor<2, Int>,
    targets: &Tensor<2, Int>,
) -> Result<(), XlError> {
    if tokens.dims() != targets.dims() {
        return Err(XlError::Input(format!(
            "tokens {:?} and targets {:?} differ in shape",
            tokens.dims(),
            targets.dims()
        )));
    }
    Ok(())
}

/// The causal mask over `mlen + qlen` keys that also hides, per row, the XL memory positions
/// older than the row's document (`valid[b]` most recent ones are kept), and with a `window`
/// (`same_length`) every key but the `window` most recent of each query (`j > mlen + i - w`).
pub(crate) fn document_mask(
    valid: &[usize],
    qlen: usize,
    mlen: usize,
    window: Option<usize>,
    device: &Device,
) -> AttentionMask {
    if valid.iter().all(|&v| v >= mlen) {
        return AttentionMask::Causal { window };
    }
    let klen = qlen + mlen;
    let mut hidden = Vec::with_capacity(valid.len() * qlen * klen);
    for &v in valid {
        let first = mlen - v.min(mlen);
        for i in 0..qlen {
            hidden.extend(
                (0..klen).map(|j| {
                    j > mlen + i || j < first || window.is_some_and(|w| j + w <= mlen + i)
                }),
            );
        }
    }
    AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
        TensorData::new(hidden, [valid.len(), qlen, klen]),
        device,
    ))
}

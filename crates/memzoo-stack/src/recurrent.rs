//! The recurrent-model contract ([`RecurrentModel`]): how the trainer, the evaluation, RECL and
//! generation read a model segment by segment, with its state carried by the caller; and the
//! layer stack's implementation of it.
//!
//! Every loss comes from [`RecurrentModel::segment_nll`] (for the layer stack:
//! [`TransformerXl::eval_step`], the one loss path of [`crate::stack`]); logits are read only
//! where a distribution is the point (generation: [`RecurrentModel::segment_logits`]).

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use memzoo_memory::{IndexKind, KnnIndex, KnnMemoryConfig, MemoryError, Retrieved, RowState};
use memzoo_reformer::rng::mix;

use crate::error::XlError;
use crate::memory::XlState;
use crate::stack::{Randomness, Step, TargetScores, TransformerXl, mean_nll};
use crate::unroll::UnrollSegment;

/// A language model read segment by segment, carrying state (memories) between segments: the
/// contract the trainer (`memzoo_train::SegmentModel` adds checkpoints to it), the evaluation,
/// RECL and generation read a model through.
///
/// The caller owns the state and never looks inside it: it hands it back on the next call for
/// the same rows (the trainer also saves it in checkpoints and restores it on `--resume`).
pub trait RecurrentModel: Module + Clone + core::fmt::Debug + Send + 'static {
    /// State carried from one segment to the next (e.g. [`crate::XlState`]); `Default` = no memory.
    type State: Default + Send;

    /// Short name of the model family, stored in checkpoints.
    fn family(&self) -> &'static str;

    /// Whether a checkpoint labelled `found` holds a model of this family. Default: the label
    /// is [`Self::family`]; families whose label changed override it to accept their older one.
    fn accepts_family(&self, found: &str) -> bool {
        found == self.family()
    }

    /// Vocabulary size (targets must be below it).
    fn vocab_size(&self) -> usize;

    /// Generation step: reads one segment and returns its logits `[batch, len, vocab]` (the
    /// whole distribution; losses come from [`Self::segment_nll`]), updating `state`
    /// (detached from the graph). `reset[r]`: row `r` starts a new document here.
    ///
    /// # Shapes
    /// - `inputs`: `[batch, len]` → `[batch, len, vocab]`
    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut Self::State,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError>;

    /// Evaluation step: reads one segment as [`Self::segment_logits`] does and scores its
    /// targets, `-log p(y)` per target (with the graph on an autodiff device), and, when `hits`
    /// asks, which targets are the most likely token. The default scores the segment's logits
    /// ([`TargetScores::from_logits`]); the layer stack overrides it with its own loss path (an
    /// adaptive softmax computes only the clusters its targets fall in).
    ///
    /// # Shapes
    /// - `inputs`, `targets`: `[batch, len]` → nll (and hits) `[batch, len]`
    fn segment_nll(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut Self::State,
        reset: &[bool],
        hits: bool,
    ) -> Result<TargetScores, XlError> {
        check_shapes(&inputs, &targets, None)?;
        let logits = self.segment_logits(inputs, state, reset)?;
        Ok(TargetScores::from_logits(logits, targets, hits))
    }

    /// Training step: the loss and gradients of one segment, the mean of
    /// [`Self::segment_nll`] over the targets whose `weights` are 1 (`None`: every target),
    /// [`mean_nll`]. The default is plain autodiff; models with their own backward
    /// (reversible layers) or randomness override it.
    ///
    /// # Shapes
    /// - `inputs`, `targets`, `weights`: `[batch, len]`
    fn train_step(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut Self::State,
        reset: &[bool],
        weights: Option<Tensor<2>>,
    ) -> Result<(f64, GradientsParams), XlError> {
        check_shapes(&inputs, &targets, weights.as_ref())?;
        let nll = self.segment_nll(inputs, targets, state, reset, false)?.nll;
        let loss = mean_nll(nll, weights);
        let value = loss.clone().into_scalar::<f64>();
        let grads = GradientsParams::from_grads(loss.backward(), self);
        Ok((value, grads))
    }

    /// Segments one training step reads with the carried state in the graph
    /// (backpropagation through `k` segments, [`Self::train_unroll`]); the trainer then reads
    /// `k` segments per optimizer step. Default: 1 (the state is detached every segment).
    fn bptt_segments(&self) -> usize {
        1
    }

    /// Training step over `k` consecutive segments of the same rows ([`Self::bptt_segments`]):
    /// the mean of their mean losses and its gradients through all `k` (the state in the
    /// graph between them, detached after the last). The default takes one segment, as
    /// [`Self::train_step`], and refuses more.
    ///
    /// # Shapes
    /// - per segment: `inputs`, `targets`, `weights` `[batch, len]`
    fn train_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut Self::State,
    ) -> Result<(f64, GradientsParams), XlError> {
        let k = segments.len();
        let mut segments = segments;
        match segments.pop().filter(|_| k == 1) {
            Some(s) => self.train_step(s.inputs, s.targets, state, &s.reset, s.weights),
            None => Err(XlError::Input(format!(
                "the `{}` model trains one segment per step, got {k}",
                self.family()
            ))),
        }
    }

    /// Whether the model carries state from one segment to the next. Generation
    /// (`memzoo_train::generate`) reads a model that does in segments, the state carried across
    /// them, and one that does not through a sliding window. Default: true.
    fn carries_state(&self) -> bool {
        true
    }

    /// Reads a segment on top of `state` as [`Self::segment_logits`] does, and leaves `state` as
    /// it was: generation reads the current, unfinished segment with it for every new token
    /// where the model keeps nothing of it ([`Self::peek_continue`]; see
    /// `memzoo_train::generate`). The default refuses, naming the family (a model that only
    /// trains need not have it).
    ///
    /// # Shapes
    /// - `inputs`: `[batch, len]` → `[batch, len, vocab]`
    fn peek_logits(
        &self,
        _inputs: Tensor<2, Int>,
        _state: &mut Self::State,
        _reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
        Err(XlError::Input(format!(
            "the `{}` model cannot read a segment without moving its state on \
             (RecurrentModel::peek_logits), so it cannot generate",
            self.family()
        )))
    }

    /// Reads `inputs`, the tokens of the current, unfinished segment that follow those `peek`
    /// already holds, as [`Self::peek_logits`] would read the whole unfinished segment, and
    /// keeps them in `peek`: generation then reads each new token once instead of reading the
    /// unfinished segment again for every token. `peek` is `None` at a segment's start (the
    /// caller empties it when the segment is complete and read with
    /// [`Self::segment_logits`]); `state` is the committed state, left as it was; `reset`
    /// applies where the segment starts (the first call). After an error `peek` is `None`.
    /// Returns the inputs' logits, or `None` where the model keeps no such state (the caller
    /// then reads the unfinished segment with [`Self::peek_logits`]). Default: `None`.
    ///
    /// # Shapes
    /// - `inputs`: `[batch, len]` → `[batch, len, vocab]`
    fn peek_continue(
        &self,
        _inputs: Tensor<2, Int>,
        _state: &mut Self::State,
        _peek: &mut Option<Self::State>,
        _reset: &[bool],
    ) -> Result<Option<Tensor<3>>, XlError> {
        Ok(None)
    }

    /// Tokens from a document's start up to which the model reads any split of them into
    /// segments alike: one segment of them gives the same logits and the same state as
    /// several (the layer stack: an XL memory that still holds every token read, and nothing
    /// else carried). Generation reads a prompt's complete segments in one pass up to it.
    /// Default: 0 (no such tokens).
    fn split_free_tokens(&self) -> usize {
        0
    }

    /// The model for evaluation with another memory length (where it has one).
    fn with_eval_mem_len(self, _mem_len: usize) -> Self {
        self
    }

    /// A copy of the model for generation in segments of at most `segment_len` tokens that
    /// computes the same logits from the same inputs at less cost per segment, with a state
    /// of its own (e.g. the layer stack's memory caching keys and values instead of layer
    /// inputs); `None`: generate with `self`. A state the copy wrote is read by the copy
    /// alone. Default: `None`.
    fn for_generation(&self, _segment_len: usize) -> Option<Self> {
        None
    }

    /// The model whose next [`Self::train_step`] draws its own randomness (replayable dropout
    /// masks, LSH rotations) from `stream` (and `seed`, `train.seed`), whatever steps it took
    /// before: the trainer passes one stream per (step, micro-step, replica), so that a step
    /// draws the same whether the run went straight to it or resumed from a checkpoint before
    /// it, and whichever replica's thread ran first. Randomness from the backend's generator is
    /// the trainer's to seed (`memzoo_train::parallel::seed_devices`); it is one per process on
    /// `flex`, so replicas on threads draw from it in any order. The default ignores it (a
    /// model with no generator of its own).
    fn with_train_stream(self, _seed: u64, _stream: u64) -> Self {
        self
    }
}

/// Inputs, targets and weights must have one shape.
fn check_shapes(
    inputs: &Tensor<2, Int>,
    targets: &Tensor<2, Int>,
    weights: Option<&Tensor<2>>,
) -> Result<(), XlError> {
    let shape = targets.dims();
    if inputs.dims() != shape || weights.is_some_and(|w| w.dims() != shape) {
        return Err(XlError::Input(format!(
            "inputs {:?}, targets {:?} and weights {:?} differ",
            inputs.dims(),
            shape,
            weights.map(|w| w.dims())
        )));
    }
    Ok(())
}

/// The layer stack (Transformer-XL; with kNN layers the Memorizing Transformer; with LSH or
/// local layers the Reformer, [`TransformerXl::stack_family`]) carries its XL memory and its kNN
/// memories (host side). Without `document_resets` (Transformer-XL, as the paper) it reads
/// documents as one stream; with them (the Memorizing preset) rows are cleared where the data
/// marks a new document. A stack with neither memory (the Reformer) reads each segment on its
/// own. Training and evaluation go through the stack's own steps ([`TransformerXl::train_step`]:
/// fresh rotations and masks every step, the reversible backward where the residuals are
/// reversible; [`TransformerXl::eval_step`]: the one loss path).
impl RecurrentModel for TransformerXl {
    type State = XlState;

    fn family(&self) -> &'static str {
        self.stack_family()
    }

    /// The current label, or the one checkpoints written before it carried.
    fn accepts_family(&self, found: &str) -> bool {
        found == self.stack_family() || found == self.legacy_family()
    }

    fn carries_state(&self) -> bool {
        self.mem_len > 0
            || self.n_knn_layers() > 0
            || self.rmt.is_some()
            || self.block_recurrent.is_some()
    }

    /// `mem_len` for a stack whose only carried state is the XL memory read in full (no
    /// `same_length`, no kNN, LSH or local layers, no compressed memory, memory tokens or
    /// recurrent state, no zero first memory): while the memory holds every token read, a
    /// query sees all earlier tokens whatever the segments. 0 for every other stack.
    fn split_free_tokens(&self) -> usize {
        let plain = !self.same_length
            && !self.zero_first_memory
            && self.compressive.is_none()
            && self.rmt.is_none()
            && self.block_recurrent.is_none()
            && self
                .layers
                .iter()
                .all(|l| matches!(l.attention, crate::stack::LayerAttention::Relative(_)));
        if plain { self.mem_len } else { 0 }
    }

    /// The stack caching its memory's keys and values and its layers' projected positions
    /// ([`TransformerXl::for_generation`]), where it can.
    fn for_generation(&self, segment_len: usize) -> Option<Self> {
        TransformerXl::for_generation(self, segment_len)
    }

    fn train_step(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        weights: Option<Tensor<2>>,
    ) -> Result<(f64, GradientsParams), XlError> {
        check_shapes(&inputs, &targets, weights.as_ref())?;
        let step = Step::reset(reset).with_weights(weights);
        let (loss, grads) = TransformerXl::train_step(self, inputs, targets, state, &step)?;
        Ok((loss.into_scalar::<f64>(), grads))
    }

    /// An RMT's or a Block-Recurrent stack's `bptt_segments`; 1 for every other stack.
    fn bptt_segments(&self) -> usize {
        self.unrolled_segments()
    }

    fn train_unroll(
        &self,
        segments: Vec<UnrollSegment>,
        state: &mut XlState,
    ) -> Result<(f64, GradientsParams), XlError> {
        for s in &segments {
            check_shapes(&s.inputs, &s.targets, s.weights.as_ref())?;
        }
        let (loss, grads) = TransformerXl::train_unroll(self, segments, state)?;
        Ok((loss.into_scalar::<f64>(), grads))
    }

    fn segment_nll(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        hits: bool,
    ) -> Result<TargetScores, XlError> {
        check_shapes(&inputs, &targets, None)?;
        let step = Step::reset(reset).with_hits(hits);
        self.eval_step(inputs, targets, state, &step)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
        let hidden = self.forward_state(inputs, state, reset)?;
        Ok(self.logits(hidden))
    }

    /// The segment is read with the committed XL memory and read-only views of the kNN
    /// memories: it retrieves from them as [`Self::segment_logits`] does (a kNN layer searches
    /// before it adds), and adds nothing.
    fn peek_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
        let mut view = XlState {
            xl: state.xl.clone(),
            xl_valid: state.xl_valid.clone(),
            compressed: state.compressed.clone(),
            rmt: state.rmt.clone(),
            block_recurrent: state.block_recurrent.clone(),
            ..XlState::new()
        };
        with_read_only_knn(state, &mut view, |view| {
            self.segment_logits(inputs, view, reset)
        })
    }

    /// A stack of relative and kNN layers and nothing else carried: `peek` is the committed
    /// XL memory followed by the unfinished segment's tokens read so far, none of which
    /// leaves it before the segment completes (in a segment pass every query sees the whole
    /// memory), with read-only views of the kNN memories (searched as the segment pass
    /// searches them, written by it alone). A new token then reads the memory and the
    /// segment's earlier tokens as that pass does: the same keys at the same distances. A
    /// compressive or Block-Recurrent stack keeps them the same way after its XL memory, its
    /// compressed memory or recurrent state as committed; an RMT stack after its read tokens.
    fn peek_continue(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlState,
        peek: &mut Option<XlState>,
        reset: &[bool],
    ) -> Result<Option<Tensor<3>>, XlError> {
        if self.compressive.is_some() || self.block_recurrent.is_some() || self.rmt.is_some() {
            return self.peek_continue_kept(inputs, state, peek, reset);
        }
        let plain = !self.same_length
            && self.compressive.is_none()
            && self.rmt.is_none()
            && self.block_recurrent.is_none()
            && self.relative_and_knn_only();
        if !plain {
            return Ok(None);
        }
        let (mut view, reset) = match peek.take() {
            Some(view) => (view, vec![false; reset.len()]),
            None => {
                let view = XlState {
                    xl: state.xl.clone(),
                    xl_valid: state.xl_valid.clone(),
                    ..XlState::new()
                };
                (view, reset.to_vec())
            }
        };
        let logits = with_read_only_knn(state, &mut view, |view| {
            let qlen = inputs.dims()[1];
            let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
            let mask = self.prepare(&inputs, view, &reset)?;
            // Every position stays: the memory grows by the inputs.
            let len = view.xl.len() + qlen;
            let (hidden, entries) =
                self.run(inputs, &mut view.xl, &mask, &mut view.knn, opts.as_ref())?;
            view.xl = self.next_memory(std::mem::take(&mut view.xl), &entries, len, true);
            if self.document_resets {
                for v in view.xl_valid.iter_mut() {
                    *v = (*v + qlen).min(len);
                }
            }
            Ok(self.logits(hidden))
        });
        // The kNN memories a first segment's read creates belong to no committed state.
        view.knn.clear();
        // A failed read may have moved part of the view on: none is kept (the caller reads
        // the segment from its start again).
        *peek = logits.is_ok().then_some(view);
        logits.map(Some)
    }

    /// A seeded stack's step counter at `stream`; a device stack's dropout masks from
    /// `mix(seed, stream)` ([`TransformerXl::with_dropout_seed`]).
    fn with_train_stream(self, seed: u64, stream: u64) -> Self {
        match self.randomness {
            Randomness::Seeded => self.with_step_count(stream),
            Randomness::Device => self.with_dropout_seed(Some(mix(seed, stream))),
        }
    }

    fn with_eval_mem_len(self, mem_len: usize) -> Self {
        self.with_mem_len(mem_len)
    }
}

/// Runs `read` on `view` holding read-only views of `state`'s kNN memories (searched, not
/// written), then hands the memories back to `state`. A `view` without kNN memories before
/// (a stack whose state has none yet) keeps what `read` created in it.
fn with_read_only_knn<T>(
    state: &mut XlState,
    view: &mut XlState,
    read: impl FnOnce(&mut XlState) -> Result<T, XlError>,
) -> Result<T, XlError> {
    use std::sync::Arc;
    let stores: Vec<Arc<Box<dyn KnnIndex>>> = std::mem::take(&mut state.knn)
        .into_iter()
        .map(Arc::new)
        .collect();
    if !stores.is_empty() {
        view.knn = stores
            .iter()
            .map(|s| Box::new(ReadOnlyIndex(Arc::clone(s))) as Box<dyn KnnIndex>)
            .collect();
    }
    let out = read(view);
    if !stores.is_empty() {
        view.knn.clear();
    }
    for store in stores {
        let store = Arc::try_unwrap(store).map_err(|_| {
            XlError::Input("a read-only view of the kNN memory outlived its read".into())
        })?;
        state.knn.push(store);
    }
    out
}

/// A kNN memory that is searched but not written: [`KnnIndex::add`] stores nothing. Generation
/// reads the unfinished segment through it (see `peek_logits` of the Memorizing Transformer).
#[derive(Debug)]
struct ReadOnlyIndex(std::sync::Arc<Box<dyn KnnIndex>>);

impl KnnIndex for ReadOnlyIndex {
    fn kind(&self) -> IndexKind {
        self.0.kind()
    }

    fn config(&self) -> &KnnMemoryConfig {
        self.0.config()
    }

    fn batch(&self) -> usize {
        self.0.batch()
    }

    fn add(&mut self, _keys: Tensor<4>, _values: Tensor<4>) -> Result<(), MemoryError> {
        Ok(())
    }

    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError> {
        self.0.search(queries, k)
    }

    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError> {
        if rows.is_empty() {
            return Ok(());
        }
        Err(MemoryError::Input(format!(
            "rows {rows:?} cannot be cleared through a read-only view of the kNN memory"
        )))
    }

    fn rows(&self) -> &[RowState] {
        self.0.rows()
    }

    fn snapshot(&self) -> Result<memzoo_memory::persist::Snapshot, MemoryError> {
        self.0.snapshot()
    }

    fn save_extra(&self, dir: &std::path::Path) -> Result<Vec<u32>, MemoryError> {
        self.0.save_extra(dir)
    }
}

impl TransformerXl {
    /// [`RecurrentModel::peek_continue`] of a compressive, RMT or Block-Recurrent stack
    /// without kNN layers: a compressive or Block-Recurrent one with an XL memory (and a
    /// compression that needs no attention statistics), an RMT one with sequential residuals;
    /// with document resets, where the rows read the whole of their committed state; `None`
    /// otherwise (the generator then reads the
    /// unfinished segment again for every token). `peek` holds what the unfinished segment's
    /// tokens read so far left: for a compressive stack a cache of every layer's keys and
    /// values of the committed memories and of those tokens
    /// ([`TransformerXl::peek_compressive`]); for an RMT one every layer's inputs of its XL
    /// memory, its read tokens and those tokens ([`TransformerXl::peek_rmt`]); for a
    /// Block-Recurrent one the committed state with the tokens after its XL memory
    /// ([`TransformerXl::peek_block_recurrent`]).
    fn peek_continue_kept(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlState,
        peek: &mut Option<XlState>,
        reset: &[bool],
    ) -> Result<Option<Tensor<3>>, XlError> {
        let plain = !self.same_length && self.n_knn_layers() == 0;
        let kept = match (self.compressive_config(), &self.block_recurrent, &self.rmt) {
            (Some(c), None, None) => {
                c.function != crate::compressive::CompressionKind::MostUsed && self.mem_len > 0
            }
            (None, Some(_), None) => self.mem_len > 0,
            (None, None, Some(_)) => self.rmt_peeks(),
            _ => false,
        };
        if !(plain && kept) {
            return Ok(None);
        }
        // The segment's resets apply where it starts (the first read).
        let first = peek.is_none();
        let reset: Vec<bool> = match first {
            true => reset.to_vec(),
            false => vec![false; reset.len()],
        };
        // With document resets, a kept read computes what a pass over the segment does where
        // every row reads the whole of its committed memories (one document) or a row that
        // starts a document has nothing committed (a generator's first segment); otherwise
        // the segment is read again.
        if self.document_resets {
            let committed = !state.xl.is_empty()
                || !state.compressed.layers.is_empty()
                || state.rmt.value.is_some()
                || state.block_recurrent.value.is_some();
            let whole = state.xl_valid.iter().all(|&v| v >= state.xl.len())
                && (state.compressed.valid.iter()).all(|&v| v >= state.compressed.layers.len());
            if (reset.contains(&true) && committed) || !whole {
                return Ok(None);
            }
        }
        let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
        let (view, hidden) = match (&self.compressive, &self.rmt) {
            // The view's XL memory is the cache of keys and values (empty: filled from the
            // committed memories).
            (Some(_), _) => {
                let mut view = peek.take().unwrap_or_default();
                let hidden = self.peek_compressive(inputs, &mut view.xl, state, opts.as_ref());
                (view, hidden)
            }
            // The view's XL memory holds the layer inputs (empty: filled with the XL memory's
            // and the read tokens').
            (None, Some(_)) => {
                let mut view = peek.take().unwrap_or_default();
                let hidden = self.peek_rmt(inputs, &mut view.xl, state, &reset, opts.as_ref());
                (view, hidden)
            }
            (None, None) => {
                let mut view = peek.take().unwrap_or_else(|| XlState {
                    xl: state.xl.clone(),
                    xl_valid: state.xl_valid.clone(),
                    block_recurrent: state.block_recurrent.clone(),
                    ..XlState::new()
                });
                let hidden = self.peek_block_recurrent(inputs, &mut view, &reset, opts.as_ref());
                (view, hidden)
            }
        };
        // A failed read may have moved part of the view on: none is kept (the caller reads
        // the segment from its start again).
        let logits = hidden.map(|h| self.logits(h));
        *peek = logits.is_ok().then_some(view);
        logits.map(Some)
    }
}

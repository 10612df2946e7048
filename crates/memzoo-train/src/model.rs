//! What the trainer needs from a model: a loss per segment, with state carried across segments.
//!
//! Every loss the trainer, the evaluation, RECL and the study compute comes from
//! [`SegmentModel::segment_nll`] (for the layer stack: [`TransformerXl::eval_step`], the one loss
//! path of `memzoo_xl::stack::loss`); logits are read only where a distribution is the point
//! (generation: [`SegmentModel::segment_logits`]).

use std::path::Path;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_memory::{IndexKind, KnnIndex, KnnMemoryConfig, MemoryError, Retrieved, RowState};
use memzoo_xl::{Randomness, Step, TargetScores, TransformerXl, XlMemory, XlState, mean_nll};

use crate::error::TrainError;

/// A language model trained segment by segment, carrying state (memories) between segments.
///
/// The trainer never looks inside the state: it hands it back on the next call for the same
/// rows, saves it in checkpoints and restores it on `--resume`.
pub trait SegmentModel: Module + Clone + core::fmt::Debug + Send + 'static {
    /// State carried from one segment to the next (e.g. [`XlMemory`]); `Default` = no memory.
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
    ) -> Result<Tensor<3>, TrainError>;

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
    ) -> Result<TargetScores, TrainError> {
        check_shapes(&inputs, &targets, None)?;
        let logits = self.segment_logits(inputs, state, reset)?;
        Ok(TargetScores::from_logits(logits, targets, hits))
    }

    /// Training step: the loss and gradients of one segment, the mean of
    /// [`Self::segment_nll`] over the targets whose `weights` are 1 (`None`: every target),
    /// [`memzoo_xl::mean_nll`]. The default is plain autodiff; models with their own backward
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
    ) -> Result<(f64, GradientsParams), TrainError> {
        check_shapes(&inputs, &targets, weights.as_ref())?;
        let nll = self.segment_nll(inputs, targets, state, reset, false)?.nll;
        let loss = mean_nll(nll, weights);
        let value = loss.clone().into_scalar::<f64>();
        let grads = GradientsParams::from_grads(loss.backward(), self);
        Ok((value, grads))
    }

    /// Whether the model carries state from one segment to the next. Generation
    /// ([`crate::generate`]) reads a model that does in segments, the state carried across
    /// them, and one that does not through a sliding window. Default: true.
    fn carries_state(&self) -> bool {
        true
    }

    /// Reads a segment on top of `state` as [`Self::segment_logits`] does, and leaves `state` as
    /// it was: generation reads the current, unfinished segment again for every new token (see
    /// [`crate::generate`]). The default refuses, naming the family (a model that only trains
    /// need not have it).
    ///
    /// # Shapes
    /// - `inputs`: `[batch, len]` → `[batch, len, vocab]`
    fn peek_logits(
        &self,
        _inputs: Tensor<2, Int>,
        _state: &mut Self::State,
        _reset: &[bool],
    ) -> Result<Tensor<3>, TrainError> {
        Err(TrainError::Model(format!(
            "the `{}` model cannot read a segment without moving its state on \
             (SegmentModel::peek_logits), so it cannot generate",
            self.family()
        )))
    }

    /// The model for evaluation with another memory length (where it has one).
    fn with_eval_mem_len(self, _mem_len: usize) -> Self {
        self
    }

    /// The model whose next [`Self::train_step`] draws its own randomness (replayable dropout
    /// masks, LSH rotations) from `stream` (and `seed`, `train.seed`), whatever steps it took
    /// before: the trainer passes one stream per (step, micro-step, replica), so that a step
    /// draws the same whether the run went straight to it or resumed from a checkpoint before
    /// it, and whichever replica's thread ran first. Randomness from the backend's generator is
    /// the trainer's to seed ([`crate::parallel::seed_devices`]); it is one per process on
    /// `flex`, so replicas on threads draw from it in any order. The default ignores it (a
    /// model with no generator of its own).
    fn with_train_stream(self, _seed: u64, _stream: u64) -> Self {
        self
    }

    /// Loads the parameters of a checkpoint's model file into `self` (which fixes the
    /// architecture). Families whose parameter layout changed override this to read their
    /// older layouts too.
    fn load_params(self, path: &Path) -> Result<Self, TrainError> {
        self.try_load_file(path).map_err(|e| {
            TrainError::Checkpoint(format!(
                "{} does not fit this model (another architecture, or a damaged file): {e:?}",
                path.display()
            ))
        })
    }

    /// Saves the carried state under `dir`.
    fn save_state(state: &Self::State, dir: &Path) -> Result<(), TrainError>;

    /// Loads the carried state saved by [`Self::save_state`] (the model fixes its shapes).
    fn load_state(&self, dir: &Path, device: &Device) -> Result<Self::State, TrainError>;
}

/// Inputs, targets and weights must have one shape.
fn check_shapes(
    inputs: &Tensor<2, Int>,
    targets: &Tensor<2, Int>,
    weights: Option<&Tensor<2>>,
) -> Result<(), TrainError> {
    let shape = targets.dims();
    if inputs.dims() != shape || weights.is_some_and(|w| w.dims() != shape) {
        return Err(TrainError::Shape(format!(
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
impl SegmentModel for TransformerXl {
    type State = XlState;

    fn family(&self) -> &'static str {
        self.stack_family()
    }

    /// The current label, or the one checkpoints written before it carried.
    fn accepts_family(&self, found: &str) -> bool {
        found == self.stack_family() || found == self.legacy_family()
    }

    fn carries_state(&self) -> bool {
        self.mem_len > 0 || self.n_knn_layers() > 0
    }

    fn train_step(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        weights: Option<Tensor<2>>,
    ) -> Result<(f64, GradientsParams), TrainError> {
        check_shapes(&inputs, &targets, weights.as_ref())?;
        let step = Step::reset(reset).with_weights(weights);
        let (loss, grads) = TransformerXl::train_step(self, inputs, targets, state, &step)?;
        Ok((loss.into_scalar::<f64>(), grads))
    }

    fn segment_nll(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        hits: bool,
    ) -> Result<TargetScores, TrainError> {
        check_shapes(&inputs, &targets, None)?;
        let step = Step::reset(reset).with_hits(hits);
        Ok(self.eval_step(inputs, targets, state, &step)?)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, TrainError> {
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
    ) -> Result<Tensor<3>, TrainError> {
        use std::sync::Arc;
        let stores: Vec<Arc<Box<dyn KnnIndex>>> = std::mem::take(&mut state.knn)
            .into_iter()
            .map(Arc::new)
            .collect();
        let mut view = XlState {
            xl: state.xl.clone(),
            knn: stores
                .iter()
                .map(|s| Box::new(ReadOnlyIndex(Arc::clone(s))) as Box<dyn KnnIndex>)
                .collect(),
            xl_valid: state.xl_valid.clone(),
        };
        let logits = self.segment_logits(inputs, &mut view, reset);
        drop(view);
        for store in stores {
            let store = Arc::try_unwrap(store).map_err(|_| {
                TrainError::Model("a read-only view of the kNN memory outlived its read".into())
            })?;
            state.knn.push(store);
        }
        logits
    }

    /// A seeded stack's step counter at `stream`; a device stack's dropout masks from
    /// `mix(seed, stream)` ([`TransformerXl::with_dropout_seed`]).
    fn with_train_stream(self, seed: u64, stream: u64) -> Self {
        match self.randomness {
            Randomness::Seeded => self.with_step_count(stream),
            Randomness::Device => {
                self.with_dropout_seed(Some(memzoo_reformer::rng::mix(seed, stream)))
            }
        }
    }

    fn with_eval_mem_len(self, mem_len: usize) -> Self {
        self.with_mem_len(mem_len)
    }

    /// Also reads checkpoints written before the layer stack (converted on load, with a
    /// warning on stderr).
    fn load_params(self, path: &Path) -> Result<Self, TrainError> {
        let (model, converted) = memzoo_xl::legacy::load_any(self, path)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        if converted {
            eprintln!(
                "warning: {} was written before the layer stack; its parameters were renamed \
                 on load (the next checkpoint is written in the current layout)",
                path.display()
            );
        }
        Ok(model)
    }

    fn save_state(state: &XlState, dir: &Path) -> Result<(), TrainError> {
        state
            .save_knn(dir)
            .map_err(|e| TrainError::Checkpoint(format!("saving kNN memories: {e}")))?;
        save_tensors(&dir.join("memory.safetensors"), state.xl.layers())?;
        if !state.xl_valid.is_empty() {
            let valid = serde_json::to_string(&state.xl_valid).expect("plain vector");
            std::fs::write(dir.join("xl_valid.json"), valid)
                .map_err(|e| TrainError::io(format!("cannot write {}", dir.display()), e))?;
        }
        Ok(())
    }

    fn load_state(&self, dir: &Path, device: &Device) -> Result<XlState, TrainError> {
        let n_knn = self.n_knn_layers();
        let mut state = if n_knn > 0 && dir.join("knn-0").exists() {
            XlState::open_knn(dir, n_knn, &self.knn_memory, device)
                .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?
        } else {
            // No kNN layers, or saved before the first forward: no kNN memories yet.
            XlState::default()
        };
        let memory = dir.join("memory.safetensors");
        // A stack without XL memory (the Reformer) may have saved none (its checkpoints
        // from before the stack hold no state).
        if memory.exists() || (n_knn == 0 && self.mem_len > 0) {
            let layers = load_tensors(&memory, device)?;
            state.xl = XlMemory::from_layers(layers).map_err(TrainError::Checkpoint)?;
        }
        let valid = dir.join("xl_valid.json");
        if valid.exists() {
            let text = std::fs::read_to_string(&valid)
                .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", valid.display())))?;
            state.xl_valid = serde_json::from_str(&text)
                .map_err(|e| TrainError::Checkpoint(format!("xl_valid.json is damaged: {e}")))?;
        }
        Ok(state)
    }
}

/// Writes rank-3 f32 tensors to a safetensors file (`layer.0`, `layer.1`, ...).
pub fn save_tensors(path: &Path, tensors: &[Tensor<3>]) -> Result<(), TrainError> {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let shape = t.dims().to_vec();
            let values = t
                .clone()
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .map_err(|e| TrainError::Checkpoint(format!("reading memory tensor: {e:?}")))?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            Ok((format!("layer.{i}"), shape, bytes))
        })
        .collect::<Result<_, TrainError>>()?;
    let views = data
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| TrainError::Checkpoint(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| TrainError::Checkpoint(format!("writing {}: {e}", path.display())))
}

/// Reads the tensors written by [`save_tensors`], in order.
pub fn load_tensors(path: &Path, device: &Device) -> Result<Vec<Tensor<3>>, TrainError> {
    let bytes = std::fs::read(path)
        .map_err(|e| TrainError::Checkpoint(format!("reading {}: {e}", path.display())))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| TrainError::Checkpoint(format!("{} is damaged: {e}", path.display())))?;
    let mut out = Vec::new();
    for i in 0..st.len() {
        let name = format!("layer.{i}");
        let view = st.tensor(&name).map_err(|e| {
            TrainError::Checkpoint(format!("{}: missing {name}: {e}", path.display()))
        })?;
        let shape: [usize; 3] = view.shape().try_into().map_err(|_| {
            TrainError::Checkpoint(format!("{}: {name} is not rank 3", path.display()))
        })?;
        let values: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push(Tensor::from_data(TensorData::new(values, shape), device));
    }
    Ok(out)
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

    fn save_extra(&self, dir: &Path) -> Result<Vec<u32>, MemoryError> {
        self.0.save_extra(dir)
    }
}

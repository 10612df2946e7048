//! What the trainer needs from a model: a loss per segment, with state carried across segments.

use std::path::Path;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_xl::{TransformerXl, XlMemory};

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

    /// Vocabulary size (targets must be below it).
    fn vocab_size(&self) -> usize;

    /// Reads one segment: returns logits `[batch, len, vocab]` and updates `state`
    /// (detached from the graph). `reset[r]`: row `r` starts a new document here.
    ///
    /// # Shapes
    /// - `inputs`: `[batch, len]`
    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut Self::State,
        reset: &[bool],
    ) -> Result<Tensor<3>, TrainError>;

    /// One training step's loss and gradients: the mean cross-entropy over the targets whose
    /// `weights` are 1 (`None`: every target). The default is plain autodiff of
    /// [`segment_loss`]; models with their own backward (reversible layers) override it.
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
        let loss = segment_loss(self, inputs, targets, state, reset, weights)?;
        let value = loss.clone().into_scalar::<f64>();
        let grads = GradientsParams::from_grads(loss.backward(), self);
        Ok((value, grads))
    }

    /// The model for evaluation with another memory length (where it has one).
    fn with_eval_mem_len(self, _mem_len: usize) -> Self {
        self
    }

    /// Saves the carried state under `dir`.
    fn save_state(state: &Self::State, dir: &Path) -> Result<(), TrainError>;

    /// Loads the carried state saved by [`Self::save_state`] (the model fixes its shapes).
    fn load_state(&self, dir: &Path, device: &Device) -> Result<Self::State, TrainError>;
}

/// Mean cross-entropy (nats) of one segment over the targets `weights` selects:
/// `Σ_i w_i (-log p(y_i)) / Σ_i w_i` (every target when `weights` is `None`).
///
/// # Shapes
/// - `inputs`, `targets`, `weights`: `[batch, len]`
pub fn segment_loss<M: SegmentModel>(
    model: &M,
    inputs: Tensor<2, Int>,
    targets: Tensor<2, Int>,
    state: &mut M::State,
    reset: &[bool],
    weights: Option<Tensor<2>>,
) -> Result<Tensor<1>, TrainError> {
    let [b, l] = targets.dims();
    if inputs.dims() != [b, l] || weights.as_ref().is_some_and(|w| w.dims() != [b, l]) {
        return Err(TrainError::Shape(format!(
            "inputs {:?}, targets {:?} and weights {:?} differ",
            inputs.dims(),
            targets.dims(),
            weights.as_ref().map(|w| w.dims())
        )));
    }
    let logits = model.segment_logits(inputs, state, reset)?;
    let nll = log_softmax(logits, 2)
        .gather(2, targets.reshape([b, l, 1]))
        .reshape([b, l])
        .neg();
    Ok(match weights {
        None => nll.mean(),
        Some(w) => (nll * w.clone()).sum() / w.sum().clamp_min(1e-9),
    })
}

impl SegmentModel for TransformerXl {
    type State = XlMemory;

    fn family(&self) -> &'static str {
        "xl"
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut XlMemory,
        _reset: &[bool],
    ) -> Result<Tensor<3>, TrainError> {
        // Transformer-XL reads documents as one stream (as the paper): it keeps its memory.
        let out = self
            .forward(inputs, state)
            .map_err(|e| TrainError::Model(e.to_string()))?;
        *state = out.memory;
        Ok(self.logits(out.hidden))
    }

    fn with_eval_mem_len(self, mem_len: usize) -> Self {
        self.with_mem_len(mem_len)
    }

    fn save_state(state: &XlMemory, dir: &Path) -> Result<(), TrainError> {
        save_tensors(&dir.join("memory.safetensors"), state.layers())
    }

    fn load_state(&self, dir: &Path, device: &Device) -> Result<XlMemory, TrainError> {
        let layers = load_tensors(&dir.join("memory.safetensors"), device)?;
        XlMemory::from_layers(layers).map_err(TrainError::Checkpoint)
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

/// The Reformer reads each segment on its own (no state across segments: its long context is
/// the segment itself) and trains with its reversible backward.
impl SegmentModel for memzoo_reformer::ReformerLm {
    type State = ();

    fn family(&self) -> &'static str {
        "reformer"
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        _state: &mut (),
        _reset: &[bool],
    ) -> Result<Tensor<3>, TrainError> {
        self.forward(inputs)
            .map_err(|e| TrainError::Model(e.to_string()))
    }

    fn train_step(
        &self,
        inputs: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        _state: &mut (),
        _reset: &[bool],
        weights: Option<Tensor<2>>,
    ) -> Result<(f64, GradientsParams), TrainError> {
        let opts = self.next_train_options();
        let (loss, grads) = self
            .train_step_with(inputs, targets, weights, &opts)
            .map_err(|e| TrainError::Model(e.to_string()))?;
        Ok((loss.into_scalar::<f64>(), grads))
    }

    fn save_state(_state: &(), _dir: &Path) -> Result<(), TrainError> {
        Ok(())
    }

    fn load_state(&self, _dir: &Path, _device: &Device) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The Memorizing Transformer carries its XL memory and its kNN memories (host side); rows are
/// cleared where the data marks a new document.
impl SegmentModel for memzoo_knn::MemorizingTransformer {
    type State = memzoo_knn::MemorizingState;

    fn family(&self) -> &'static str {
        "memorizing"
    }

    fn vocab_size(&self) -> usize {
        self.xl.vocab_size
    }

    fn segment_logits(
        &self,
        inputs: Tensor<2, Int>,
        state: &mut Self::State,
        reset: &[bool],
    ) -> Result<Tensor<3>, TrainError> {
        let hidden = self
            .forward(inputs, state, reset)
            .map_err(|e| TrainError::Model(e.to_string()))?;
        Ok(self.logits(hidden))
    }

    fn save_state(state: &Self::State, dir: &Path) -> Result<(), TrainError> {
        state
            .save_knn(dir)
            .map_err(|e| TrainError::Checkpoint(format!("saving kNN memories: {e}")))?;
        save_tensors(&dir.join("memory.safetensors"), state.xl.layers())?;
        let valid = serde_json::to_string(&state.xl_valid).expect("plain vector");
        std::fs::write(dir.join("xl_valid.json"), valid)
            .map_err(|e| TrainError::io(format!("cannot write {}", dir.display()), e))
    }

    fn load_state(&self, dir: &Path, device: &Device) -> Result<Self::State, TrainError> {
        if !dir.join("knn-0").exists() {
            // Saved before the first forward: no memories yet.
            return Ok(Self::State::default());
        }
        let mut state = memzoo_knn::MemorizingState::open_knn(dir, self, device)
            .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?;
        let layers = load_tensors(&dir.join("memory.safetensors"), device)?;
        state.xl = XlMemory::from_layers(layers).map_err(TrainError::Checkpoint)?;
        let valid = std::fs::read_to_string(dir.join("xl_valid.json"))
            .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?;
        state.xl_valid = serde_json::from_str(&valid)
            .map_err(|e| TrainError::Checkpoint(format!("xl_valid.json is damaged: {e}")))?;
        Ok(state)
    }
}

//! What the trainer needs from a model: the recurrent-model contract
//! ([`memzoo_stack::RecurrentModel`]: a loss per segment, with state carried across segments) and
//! checkpoints of the model and its state ([`SegmentModel`]).

use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
pub use memzoo_stack::RecurrentModel;
use memzoo_stack::{TransformerXl, XlMemory, XlState};

use crate::error::TrainError;

/// A [`RecurrentModel`] the trainer can checkpoint: its parameters and its carried state
/// written to and read from a run directory. Everything else of the contract (reading a
/// segment, its losses and steps) is [`RecurrentModel`], next to the model in `memzoo_stack`.
pub trait SegmentModel: RecurrentModel {
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

/// The layer stack's checkpoints: its parameters (older layouts converted), its XL memory (and a
/// compressive stack's compressed memory, an RMT's memory tokens, a Block-Recurrent stack's
/// state) as safetensors, its kNN memories, and each row's document position.
impl SegmentModel for TransformerXl {
    /// Also reads checkpoints written before the layer stack (converted on load, with a
    /// warning on stderr).
    fn load_params(self, path: &Path) -> Result<Self, TrainError> {
        let (model, converted) = memzoo_stack::legacy::load_any(self, path)
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
        // A compressive stack's compressed memories, and their rows' document positions.
        if !state.compressed.layers.is_empty() {
            save_tensors(
                &dir.join("compressed.safetensors"),
                state.compressed.layers.layers(),
            )?;
        }
        if !state.compressed.valid.is_empty() {
            write_counts(dir, "compressed_valid.json", &state.compressed.valid)?;
        }
        // Most-used compression: the XL memory's usage and how often each position was read.
        if !state.compressed.usage.is_empty() {
            save_tensors(
                &dir.join("compressed_usage.safetensors"),
                state.compressed.usage.layers(),
            )?;
            write_counts(
                dir,
                "compressed_usage_reads.json",
                &state.compressed.usage_reads,
            )?;
        }
        // A Recurrent Memory Transformer's carried memory tokens.
        if let Some(tokens) = &state.rmt.value {
            save_tensors(
                &dir.join("rmt_memory.safetensors"),
                std::slice::from_ref(tokens),
            )?;
        }
        // A Block-Recurrent Transformer's carried state.
        if let Some(c) = &state.block_recurrent.value {
            save_tensors(
                &dir.join("block_recurrent_state.safetensors"),
                std::slice::from_ref(c),
            )?;
        }
        if !state.xl_valid.is_empty() {
            write_counts(dir, "xl_valid.json", &state.xl_valid)?;
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
        let compressed = dir.join("compressed.safetensors");
        if compressed.exists() {
            let layers = load_tensors(&compressed, device)?;
            state.compressed.layers =
                XlMemory::from_layers(layers).map_err(TrainError::Checkpoint)?;
        }
        if let Some(valid) = read_counts(dir, "compressed_valid.json")? {
            state.compressed.valid = valid;
        }
        let usage = dir.join("compressed_usage.safetensors");
        if usage.exists() {
            let layers = load_tensors(&usage, device)?;
            state.compressed.usage =
                XlMemory::from_layers(layers).map_err(TrainError::Checkpoint)?;
            state.compressed.usage_reads = read_counts(dir, "compressed_usage_reads.json")?
                .ok_or_else(|| {
                    TrainError::Checkpoint(format!(
                        "{} has the usage of most-used compression but no \
                         compressed_usage_reads.json",
                        dir.display()
                    ))
                })?;
        }
        let rmt = dir.join("rmt_memory.safetensors");
        if rmt.exists() {
            let mut tokens = load_tensors(&rmt, device)?;
            if tokens.len() != 1 {
                return Err(TrainError::Checkpoint(format!(
                    "{} holds {} tensors, an RMT memory is one",
                    rmt.display(),
                    tokens.len()
                )));
            }
            state.rmt.value = tokens.pop();
        }
        let recurrent = dir.join("block_recurrent_state.safetensors");
        if recurrent.exists() {
            let mut states = load_tensors(&recurrent, device)?;
            if states.len() != 1 {
                return Err(TrainError::Checkpoint(format!(
                    "{} holds {} tensors, a block-recurrent state is one",
                    recurrent.display(),
                    states.len()
                )));
            }
            state.block_recurrent.value = states.pop();
        }
        if let Some(valid) = read_counts(dir, "xl_valid.json")? {
            state.xl_valid = valid;
        }
        Ok(state)
    }
}

/// Writes per-row or per-position counts of a carried state as `dir/name` (JSON).
fn write_counts(dir: &Path, name: &str, counts: &[usize]) -> Result<(), TrainError> {
    let text = serde_json::to_string(counts).expect("plain vector");
    std::fs::write(dir.join(name), text)
        .map_err(|e| TrainError::io(format!("cannot write {}", dir.display()), e))
}

/// Reads counts written by [`write_counts`]; `None` when the checkpoint has no `name`.
fn read_counts(dir: &Path, name: &str) -> Result<Option<Vec<usize>>, TrainError> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TrainError::Checkpoint(format!("{name} is damaged: {e}")))
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

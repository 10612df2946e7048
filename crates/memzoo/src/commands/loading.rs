//! What the commands read from a run directory: its model with the latest (or a named)
//! checkpoint, checked against the family the checkpoint holds, and its data as segments.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use memzoo_data::Split;
use memzoo_stack::TransformerXl;
use memzoo_train::{SegmentModel, SegmentSource, checkpoint};

use crate::config::RunConfig;
use crate::data_setup::batcher;
use crate::error::CliError;

/// The model of a run directory with its latest checkpoint, on `device` (no autodiff).
pub fn load_xl(run_dir: &Path, device: &Device) -> Result<(RunConfig, TransformerXl), CliError> {
    let config = RunConfig::from_run_dir(run_dir, &[])?;
    let model = load_xl_config(run_dir, &config, device)?;
    Ok((config, model))
}

/// The stack the run trained ([`RunConfig::stack`]: `[model]`, or the Reformer's or the
/// Memorizing Transformer's preset) with the latest checkpoint of `run_dir`, whose family must
/// be the stack's.
pub(super) fn load_xl_config(
    run_dir: &Path,
    config: &RunConfig,
    device: &Device,
) -> Result<TransformerXl, CliError> {
    load_checkpoint(run_dir, config.stack().init(device)?)
}

/// The data a model reads in segments of `len`: documents per row (with resets) on data made
/// of documents (the generated corpus, rust-code), for every family; the ordered stream
/// otherwise.
pub(super) fn source(
    config: &RunConfig,
    splits: &crate::data_setup::Splits,
    split: Split,
    len: usize,
) -> Result<Box<dyn SegmentSource>, CliError> {
    let batch = config.train.batch;
    // Text read with the run's own tokenizer is one stream.
    if splits.codec.is_none()
        && let Some(d) = crate::data_setup::doc_batcher(&config.data, split, batch, len)?
    {
        return Ok(Box::new(d));
    }
    Ok(Box::new(batcher(splits, split, batch, len)?))
}

pub(super) fn latest_checkpoint(run_dir: &Path) -> Result<PathBuf, CliError> {
    checkpoint::latest(&run_dir.join("checkpoints"))?.ok_or_else(|| CliError::NoCheckpoint {
        dir: run_dir.to_path_buf(),
    })
}

/// The latest checkpoint of `run_dir` into `model`, which must be of the family it holds.
pub(crate) fn load_checkpoint<M: SegmentModel>(run_dir: &Path, model: M) -> Result<M, CliError> {
    load_checkpoint_dir(&latest_checkpoint(run_dir)?, model)
}

/// The checkpoint in `dir` into `model`, which must be of the family it holds.
pub(crate) fn load_checkpoint_dir<M: SegmentModel>(dir: &Path, model: M) -> Result<M, CliError> {
    let dir = dir.to_path_buf();
    let trainer = checkpoint::read_trainer_state(&dir)?;
    if !model.accepts_family(&trainer.family) {
        return Err(CliError::Family {
            dir,
            found: trainer.family,
            expected: format!("the run's config.toml a `{}` one", model.family()),
        });
    }
    Ok(checkpoint::load_model(&dir, model)?)
}

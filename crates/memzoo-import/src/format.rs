//! One trait for every peer's checkpoint layout, and the registry `memzoo import --from` and
//! `memzoo export --to` look formats up in by name.
//!
//! A [`PeerFormat`] is three steps each way, the same for every peer:
//!
//! - in: find the weights ([`PeerFormat::locate`]), read the peer's config into the memzoo
//!   stack config that computes its function ([`PeerFormat::read_config`],
//!   [`PeerFormat::stack`]), build that stack and map the tensors in
//!   ([`PeerFormat::map_in`]); every tensor of the checkpoint must be used. [`import`] runs
//!   them (the load preamble and the final check live there once);
//! - out: the peer's config of a memzoo stack, or the field the peer cannot express
//!   ([`PeerFormat::config_of`]), the model's tensors under the peer's names
//!   ([`PeerFormat::map_out`]) and the files ([`PeerFormat::write`], from
//!   [`PeerFormat::config_json`], [`PeerFormat::state_dict`] and [`PeerFormat::side_files`],
//!   whose defaults most peers keep); [`export`] runs them.
//!
//! The formats are listed once, in [`FORMATS`]; [`format()`] finds one by name, and an unknown
//! name is an error listing the known ones.

use std::path::Path;

use burn::tensor::Device;
use memzoo_stack::{TransformerXl, XlConfig};

use crate::error::ImportError;
use crate::mapping::{self, Located, PeerTensors, Source};
use crate::reader::TensorMap;

/// A peer's checkpoint layout: how its files become a memzoo stack and back. Implemented by a
/// unit type per peer (one file per peer); [`FORMATS`] lists them.
pub trait PeerFormat: Sync {
    /// The peer's config: what its `config.json` (and the tensors' shapes) say, in the peer's
    /// own field names.
    type Config: serde::Serialize;

    /// The name `--from` / `--to` take (`hf-transfo-xl`).
    const NAME: &'static str;

    /// The checkpoint's weight file and the directory of its side files, from the source path
    /// the user gave (a directory, or the weight file itself).
    fn locate(&self, src: &Path) -> Result<Located, ImportError>;

    /// The peer's config, from the files beside the weights and the tensors' shapes; a field
    /// that disagrees with the tensors, or asks for what memzoo cannot express, is an error
    /// naming it.
    fn read_config(&self, at: &Located, tensors: &TensorMap) -> Result<Self::Config, ImportError>;

    /// The memzoo stack that computes the peer's model: the family's preset with the options
    /// that make it the peer's function.
    fn stack(&self, config: &Self::Config, at: &Located) -> Result<XlConfig, ImportError>;

    /// Moves the checkpoint's tensors into `model` (built from [`stack`](Self::stack)): each
    /// one taken from `tensors` is checked for its name and shape; what is left there is
    /// reported by the caller. `at` gives the side files (fixed LSH rotations).
    fn map_in(
        &self,
        config: &Self::Config,
        at: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError>;

    /// The peer's config of a memzoo stack, when the peer can express it; the error names the
    /// field it cannot.
    fn config_of(&self, stack: &XlConfig) -> Result<Self::Config, ImportError>;

    /// The model's values (or gradients, for parity tests) under the peer's names: the inverse
    /// of [`map_in`](Self::map_in).
    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError>;

    /// The peer's `config.json` of `config` (default: its fields as they are).
    fn config_json(&self, config: &Self::Config) -> Result<serde_json::Value, ImportError> {
        mapping::to_json(config)
    }

    /// The tensors an export writes (default: [`map_out`](Self::map_out)'s values; a peer whose
    /// files leave tied copies out says so here).
    fn state_dict(
        &self,
        config: &Self::Config,
        model: &TransformerXl,
    ) -> Result<PeerTensors, ImportError> {
        let _ = config;
        self.map_out(model, Source::Values)
    }

    /// Files an export writes beside the weights (a name and its tensors; an empty one is
    /// not written): none by default.
    fn side_files(&self, model: &TransformerXl) -> Vec<(&'static str, PeerTensors)> {
        let _ = model;
        Vec::new()
    }

    /// Writes `config` and the model's tensors into `dir` as the peer's own code reads them:
    /// `config.json`, `model.safetensors` and the side files.
    fn write(
        &self,
        config: &Self::Config,
        model: &TransformerXl,
        dir: &Path,
    ) -> Result<(), ImportError> {
        let json = self.config_json(config)?;
        let tensors = self.state_dict(config, model)?;
        mapping::write_checkpoint(dir, &json, tensors, &self.side_files(model))
    }

    /// The stack of the checkpoint `src`, from its config files alone, before any weight is
    /// read or parameter allocated: what `memzoo import` estimates the model's memory from.
    /// `None` (the default) for a peer whose sizes are read from the weights themselves (the
    /// model is then the size of the tensors already read).
    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError> {
        let _ = src;
        Ok(None)
    }

    /// The id of byte 0 a model of this stack reads text with (a run's `data.byte_offset`):
    /// 0, a byte is its own id, unless the peer's vocabulary says otherwise.
    fn byte_offset(&self, stack: &XlConfig) -> u16 {
        let _ = stack;
        0
    }
}

/// What an import gives: the model with the checkpoint's weights, the stack config it was built
/// from, and the peer's config it was read as.
pub struct Imported<C> {
    /// The model.
    pub model: TransformerXl,
    /// Its stack config (what a run directory's `[model]` holds).
    pub stack: XlConfig,
    /// The peer's config.
    pub peer: C,
}

/// Reads the checkpoint `src` of format `F`: locates it, reads its tensors and config, builds
/// the stack and maps every tensor in (a tensor left over is an error naming it).
pub fn import<F: PeerFormat>(
    format: &F,
    src: &Path,
    device: &Device,
) -> Result<Imported<F::Config>, ImportError> {
    let at = format.locate(src)?;
    let mut tensors = TensorMap::read(&at.weights)?;
    let peer = format.read_config(&at, &tensors)?;
    let stack = format.stack(&peer, &at)?;
    let mut model = stack.init(device)?;
    format.map_in(&peer, &at, &mut tensors, &mut model, device)?;
    tensors.finish()?;
    Ok(Imported { model, stack, peer })
}

/// Writes `model` (of stack `stack`) into `dir` in format `F`'s layout.
pub fn export<F: PeerFormat>(
    format: &F,
    model: &TransformerXl,
    stack: &XlConfig,
    dir: &Path,
) -> Result<(), ImportError> {
    let config = format.config_of(stack)?;
    format.write(&config, model, dir)
}

/// A format as the registry holds it: [`PeerFormat`] with its config type erased, so that the
/// formats sit in one list and are looked up by name.
pub trait Format: Sync {
    /// [`PeerFormat::NAME`].
    fn name(&self) -> &'static str;
    /// [`import`]: the model and its stack config.
    fn import(&self, src: &Path, device: &Device)
    -> Result<(TransformerXl, XlConfig), ImportError>;
    /// [`export`].
    fn export(
        &self,
        model: &TransformerXl,
        stack: &XlConfig,
        dir: &Path,
    ) -> Result<(), ImportError>;
    /// [`PeerFormat::byte_offset`].
    fn byte_offset(&self, stack: &XlConfig) -> u16;
    /// [`PeerFormat::stack_from_config`].
    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError>;
}

impl<F: PeerFormat> Format for F {
    fn name(&self) -> &'static str {
        F::NAME
    }

    fn import(
        &self,
        src: &Path,
        device: &Device,
    ) -> Result<(TransformerXl, XlConfig), ImportError> {
        let imported = import(self, src, device)?;
        Ok((imported.model, imported.stack))
    }

    fn export(
        &self,
        model: &TransformerXl,
        stack: &XlConfig,
        dir: &Path,
    ) -> Result<(), ImportError> {
        export(self, model, stack, dir)
    }

    fn byte_offset(&self, stack: &XlConfig) -> u16 {
        PeerFormat::byte_offset(self, stack)
    }

    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError> {
        PeerFormat::stack_from_config(self, src)
    }
}

/// Every format memzoo reads and writes, in the order `--help` and errors list them.
pub static FORMATS: &[&dyn Format] = &[
    &crate::hf_transfo_xl::HfTransfoXl,
    &crate::labml_xl::LabmlXl,
    &crate::lucidrains_memorizing::LucidrainsMemorizing,
    &crate::hf_reformer::HfReformer,
    &crate::lucidrains_reformer::LucidrainsReformer,
    &crate::lucidrains_compressive::LucidrainsCompressive,
    &crate::lucidrains_rmt::LucidrainsRmt,
    &crate::lucidrains_block_recurrent::LucidrainsBlockRecurrent,
];

/// The names of [`FORMATS`].
pub fn names() -> Vec<&'static str> {
    FORMATS.iter().map(|f| f.name()).collect()
}

/// The format called `name`; an unknown name is an error listing the known ones.
pub fn format(name: &str) -> Result<&'static dyn Format, ImportError> {
    FORMATS
        .iter()
        .copied()
        .find(|f| f.name() == name)
        .ok_or_else(|| ImportError::UnknownFormat {
            name: name.to_string(),
            known: names().join(", "),
        })
}

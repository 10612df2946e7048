//! Checkpoints from the PyTorch world, read into memzoo models without executing pickle code.
//!
//! - [`reader::TensorMap`]: a checkpoint file (`*.safetensors`, or a PyTorch `torch.save` file
//!   read by burn-store's pickle *reader*) as a name → tensor map from which the importer takes
//!   each tensor, so that a missing, misshaped or unknown tensor is an error naming it.
//! - [`hf_transfo_xl`]: HF's `TransfoXLLMHeadModel` (transformers ≤ 4.x; removed in 5.0), from
//!   a directory with `config.json` and `model.safetensors` or `pytorch_model.bin`, into
//!   [`memzoo_xl::TransformerXl`] for any shape (`transfo-xl-wt103`'s adaptive input and
//!   softmax included); and back ([`hf_transfo_xl::export`]).
//! - [`labml_xl`]: labml-nn's Transformer-XL language model (`state_dict` of its
//!   `AutoregressiveModel`: learned relative tables, pre-LN, value/output biases), and back.
//! - [`lucidrains_memorizing`]: memorizing-transformers-pytorch's `MemorizingTransformer`
//!   (multi-query T5 layers and a kNN layer with an XL and a kNN memory), and back.
//! - [`hf_reformer`]: HF's `ReformerModelWithLMHead` (transformers 5.x; `google/reformer-enwik8`
//!   and `crime-and-punishment` shapes: axial positions, LSH and local layers, factorised
//!   buckets, HF's concatenating head), optionally with the LSH rotations of one HF pass; and
//!   back.
//! - [`lucidrains_reformer`]: reformer-pytorch's `ReformerLM` (summed axial positions, LSH
//!   layers, the mean of the two streams), optionally with the rotations of one pass; and back.
//! - [`import_source`] / [`export_to`]: the two by the name `memzoo import --from` and
//!   `memzoo export --to` take.

pub mod error;
pub mod hf_reformer;
pub mod hf_transfo_xl;
pub mod labml_xl;
pub mod lucidrains_memorizing;
pub mod lucidrains_reformer;
pub mod reader;

pub use error::ImportError;
pub use hf_reformer::HfReformerConfig;
pub use hf_transfo_xl::HfTransfoXlConfig;
pub use labml_xl::LabmlXlConfig;
pub use lucidrains_memorizing::MemorizingPeerConfig;
pub use reader::TensorMap;

use std::path::Path;

use burn::tensor::Device;
use memzoo_xl::{TransformerXl, XlConfig};

/// The sources [`import_source`] and [`export_to`] accept.
pub const SOURCES: &[&str] = &[
    "hf-transfo-xl",
    "labml-xl",
    "lucidrains-memorizing",
    "hf-reformer",
    "lucidrains-reformer",
];

/// The id of byte 0 that a model imported from `source` with config `xl` reads text with (a
/// run's `data.byte_offset`): 2 for an `hf-reformer` of `google/reformer-enwik8`'s vocabulary
/// of 258 ([`hf_reformer::byte_offset`]), else 0.
pub fn byte_offset(source: &str, xl: &XlConfig) -> u16 {
    match source {
        "hf-reformer" => hf_reformer::byte_offset(xl.vocab_size),
        _ => 0,
    }
}

/// Imports the checkpoint `src` of `source` (one of [`SOURCES`]) into memzoo's stack and its
/// config.
pub fn import_source(
    source: &str,
    src: &Path,
    device: &Device,
) -> Result<(TransformerXl, XlConfig), ImportError> {
    match source {
        "hf-transfo-xl" => {
            let (model, hf) = hf_transfo_xl::load_transformer_xl(src, device)?;
            Ok((model, hf.xl_config()?))
        }
        "labml-xl" => {
            let (model, labml) = labml_xl::load(src, device)?;
            Ok((model, labml.xl_config()?))
        }
        "lucidrains-memorizing" => {
            let (model, peer) = lucidrains_memorizing::load(src, device)?;
            Ok((model, peer.xl_config()?))
        }
        "hf-reformer" => {
            let (model, hf) = hf_reformer::load(src, device)?;
            let fixed = src.join(hf_reformer::ROTATIONS_FILE).is_file();
            Ok((model, hf.xl_config(fixed)?))
        }
        "lucidrains-reformer" => {
            let (model, cfg) = lucidrains_reformer::load(src, device)?;
            Ok((
                model,
                cfg.xl_config(lucidrains_reformer::fixed_buckets(src)?)?,
            ))
        }
        other => Err(ImportError::Unsupported(format!(
            "source `{other}`: supported are {}",
            SOURCES.join(", ")
        ))),
    }
}

/// The config of the model that the checkpoint `src` of `source` holds, read from its
/// `config.json` alone, before any weight is read or parameter allocated: what `memzoo import`
/// estimates the model's memory from. `None` for the sources whose sizes are read from the
/// weights themselves (labml-xl, lucidrains-memorizing: the model is then the size of the
/// tensors already read).
pub fn source_config(source: &str, src: &Path) -> Result<Option<XlConfig>, ImportError> {
    Ok(match source {
        "hf-transfo-xl" => Some(hf_transfo_xl::HfTransfoXlConfig::read(src)?.xl_config()?),
        "hf-reformer" => {
            Some(hf_reformer::HfReformerConfig::read(&src.join("config.json"))?.xl_config(false)?)
        }
        "lucidrains-reformer" => {
            let (_, dir) = lucidrains_reformer::locate(src)?;
            let cfg =
                lucidrains_reformer::LucidrainsReformerConfig::read(&dir.join("config.json"))?;
            Some(cfg.xl_config(None)?)
        }
        _ => None,
    })
}

/// Writes `model` (with its config `xl`) into `dir` in the layout of `target` (one of
/// [`SOURCES`]).
pub fn export_to(
    target: &str,
    model: &TransformerXl,
    xl: &XlConfig,
    dir: &Path,
) -> Result<(), ImportError> {
    match target {
        "hf-transfo-xl" => hf_transfo_xl::export(model, xl, dir),
        "labml-xl" => labml_xl::export(model, xl, dir),
        "lucidrains-memorizing" => lucidrains_memorizing::export(model, xl, dir),
        "hf-reformer" => hf_reformer::export(model, xl, dir),
        "lucidrains-reformer" => lucidrains_reformer::export(model, xl, dir),
        other => Err(ImportError::Unsupported(format!(
            "target `{other}`: supported are {}",
            SOURCES.join(", ")
        ))),
    }
}

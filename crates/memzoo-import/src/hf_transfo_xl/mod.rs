//! HF `TransfoXLLMHeadModel` checkpoints (transformers 4.x) in memzoo.
//!
//! A model directory holds `config.json` and `model.safetensors` (what `save_pretrained`
//! writes: tied copies left out) or `pytorch_model.bin` (`torch.save` of the state dict: every
//! key, tied copies included). Names map as follows (`l` a layer, `i` a cluster; HF's linear
//! weights are `[out, in]`, memzoo's `[in, out]`, so every one is transposed):
//!
//! | HF | memzoo |
//! |---|---|
//! | `transformer.layers.l.dec_attn.qkv_net.weight` `[3 h dh, d]` | rows `0..h dh` → `attention.query`, rows `h dh..3 h dh` → `attention.key_value` (keys then values) |
//! | `….dec_attn.o_net.weight`, `….dec_attn.r_net.weight` | `attention.output`, `attention.r_net` |
//! | `….dec_attn.r_w_bias` / `r_r_bias` (`untie_r`) or `transformer.r_w_bias` / `r_r_bias` | `u` / `v`: `XlBiases::content` / `position`, per layer or shared |
//! | `….dec_attn.layer_norm`, `….pos_ff.layer_norm` | `block.norm_attention`, `block.norm_ff` (post-LN) |
//! | `….pos_ff.CoreNet.0`, `….pos_ff.CoreNet.3` | `block.ff_in`, `block.ff_out` |
//! | `transformer.word_emb.emb_layers.i.weight`, `emb_projs.i` `[d_proj, d_i]` | the embedding's tables; projections transposed |
//! | `crit.out_layers.i.bias`, `crit.cluster_weight`, `crit.cluster_bias`, untied `crit.out_projs.i` | the softmax's |
//! | `crit.out_layers.i.weight`, tied `crit.out_projs.i`, tied per-layer `r_w_bias`/`r_r_bias` | tied copies: must equal what they are tied to |
//! | `transformer.pos_emb.inv_freq` | a buffer: must equal `10000^(-2k/d_model)`, which memzoo computes |
//!
//! Every shape loads into memzoo's [`TransformerXl`]: `cutoffs = []` with `d_embed = d_model`
//! into its plain embedding and tied (or linear) output, any other into its adaptive embedding
//! and adaptive log-softmax. HF starts a sequence (`mems=None`) from `mem_len` zero vectors per
//! layer, which the first segment attends to like any memory: the imported config sets
//! `zero_first_memory`, so memzoo does the same. HF's pre-LN variant (`pre_lnorm = true`) has no
//! final LayerNorm: imported with `pre_ln = true, final_norm = false`.
//!
//! The export ([`hf_state_dict`], [`HfTransfoXlConfig::from_xl`], [`export`]) writes what
//! HF's `save_pretrained` writes: `config.json` and `model.safetensors` without tied copies.
//!
//! Where things live: the config mapping (HF's `config.json` to and from a stack config) in
//! `config.rs`; the tensors in (the layers, the adaptive embedding and softmax, the tied-copy
//! checks) in `load.rs`; the tensors out (HF's names, `save_pretrained`'s state dict) in
//! `to_hf.rs`; the [`PeerFormat`] that ties them together here.

use std::path::Path;

use burn::tensor::Device;
use memzoo_stack::{TransformerXl, XlConfig};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source};
use crate::reader::TensorMap;

mod config;
mod load;
mod to_hf;

pub use config::HfTransfoXlConfig;
use load::map_in;
pub use to_hf::{hf_state_dict, transformer_xl_to_hf};

/// The names of a layer's block (post-LN or pre-LN norms, `CoreNet` feed-forward) in HF's
/// state dict.
fn block_names(l: usize) -> BlockNames {
    let p = format!("transformer.layers.{l}.");
    BlockNames {
        norm_attention: format!("{p}dec_attn.layer_norm"),
        norm_ff: format!("{p}pos_ff.layer_norm"),
        ff_in: format!("{p}pos_ff.CoreNet.0"),
        ff_out: format!("{p}pos_ff.CoreNet.3"),
    }
}

/// HF's `TransfoXLLMHeadModel` as a [`PeerFormat`] (`hf-transfo-xl`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HfTransfoXl;

impl PeerFormat for HfTransfoXl {
    type Config = HfTransfoXlConfig;
    const NAME: &'static str = "hf-transfo-xl";

    /// A model directory ([`mapping::model_dir`]).
    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::model_dir(src)
    }

    fn read_config(&self, at: &Located, _: &TensorMap) -> Result<HfTransfoXlConfig, ImportError> {
        HfTransfoXlConfig::read(&at.dir)
    }

    fn stack(&self, config: &HfTransfoXlConfig, _: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError> {
        let at = self.locate(src)?;
        Ok(Some(HfTransfoXlConfig::read(&at.dir)?.xl_config()?))
    }

    fn map_in(
        &self,
        config: &HfTransfoXlConfig,
        _: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        map_in(config, &config.xl_config()?, tensors, model, device)
    }

    fn config_of(&self, stack: &XlConfig) -> Result<HfTransfoXlConfig, ImportError> {
        HfTransfoXlConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(transformer_xl_to_hf(model, src))
    }

    /// With `architectures`, as `save_pretrained` writes it.
    fn config_json(&self, config: &HfTransfoXlConfig) -> Result<serde_json::Value, ImportError> {
        let mut value = mapping::to_json(config)?;
        value["architectures"] = serde_json::json!(["TransfoXLLMHeadModel"]);
        value["adaptive"] = serde_json::json!(true);
        Ok(value)
    }

    /// What HF's `save_pretrained` writes: tied copies left out ([`hf_state_dict`]).
    fn state_dict(
        &self,
        config: &HfTransfoXlConfig,
        model: &TransformerXl,
    ) -> Result<PeerTensors, ImportError> {
        Ok(hf_state_dict(model, config))
    }
}

/// Loads an HF TransfoXL directory of any shape into memzoo's [`TransformerXl`]; every tensor
/// of the checkpoint is used or checked. Returns HF's config too.
pub fn load_transformer_xl(
    dir: &Path,
    device: &Device,
) -> Result<(TransformerXl, HfTransfoXlConfig), ImportError> {
    let imported = crate::format::import(&HfTransfoXl, dir, device)?;
    Ok((imported.model, imported.peer))
}

/// [`load_transformer_xl`] from a config and tensors in hand; leaves unknown tensors in `map`.
pub fn transformer_xl_from(
    cfg: &HfTransfoXlConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    let xl = cfg.xl_config()?;
    let mut model = xl.init(device)?;
    map_in(cfg, &xl, map, &mut model, device)?;
    Ok(model)
}

/// Writes an HF TransfoXL model directory ([`HfTransfoXl`]'s [`PeerFormat::write`]) from a
/// memzoo stack and its config; the config must be HF-shaped
/// ([`HfTransfoXlConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&HfTransfoXl, model, xl, dir)
}

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

use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
use memzoo_relative::PositionKind;
use memzoo_relative::{PositionConfig, PositionParams, XlBiases};
use memzoo_stack::{
    AdaptiveEmbedding, AdaptiveLogSoftmax, AdaptiveLogSoftmaxTensors, InputEmbedding,
    LayerAttention, LayerKind, OutputLayer, PeerCompat, TransformerXl, XlConfig, XlError, XlLayer,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source, put};
use crate::reader::TensorMap;

fn default_true() -> bool {
    true
}

/// The fields of HF's `TransfoXLConfig` (`config.json`) that shape the model; the defaults are
/// HF's (`transfo-xl-wt103`'s).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HfTransfoXlConfig {
    /// Must be `transfo-xl` when present.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Vocabulary size.
    #[serde(default = "HfTransfoXlConfig::d_vocab")]
    pub vocab_size: usize,
    /// Adaptive cluster bounds.
    #[serde(default = "HfTransfoXlConfig::d_cutoffs")]
    pub cutoffs: Vec<usize>,
    /// Model width.
    #[serde(default = "HfTransfoXlConfig::d_1024")]
    pub d_model: usize,
    /// Width of the first cluster's embedding.
    #[serde(default = "HfTransfoXlConfig::d_1024")]
    pub d_embed: usize,
    /// Heads.
    #[serde(default = "HfTransfoXlConfig::d_16")]
    pub n_head: usize,
    /// Head width.
    #[serde(default = "HfTransfoXlConfig::d_64")]
    pub d_head: usize,
    /// Feed-forward width.
    #[serde(default = "HfTransfoXlConfig::d_4096")]
    pub d_inner: usize,
    /// Cluster width divisor.
    #[serde(default = "HfTransfoXlConfig::d_4")]
    pub div_val: usize,
    /// Pre-LayerNorm blocks.
    #[serde(default)]
    pub pre_lnorm: bool,
    /// Layers.
    #[serde(default = "HfTransfoXlConfig::d_18")]
    pub n_layer: usize,
    /// Memory length.
    #[serde(default = "HfTransfoXlConfig::d_1600")]
    pub mem_len: usize,
    /// Distances beyond it share its encoding (0 or less: none).
    #[serde(default = "HfTransfoXlConfig::d_1000")]
    pub clamp_len: i64,
    /// Every query sees `mem_len` keys.
    #[serde(default = "default_true")]
    pub same_length: bool,
    /// Attention type: only 0 (relative, XL's) exists in HF's code.
    #[serde(default)]
    pub attn_type: usize,
    /// Sampled softmax: HF supports only `<= 0` (none).
    #[serde(default = "HfTransfoXlConfig::d_minus1")]
    pub sample_softmax: i64,
    /// Dropout.
    #[serde(default = "HfTransfoXlConfig::d_dropout")]
    pub dropout: f64,
    /// Attention dropout.
    #[serde(default)]
    pub dropatt: f64,
    /// `u`/`v` per layer.
    #[serde(default = "default_true")]
    pub untie_r: bool,
    /// LayerNorm epsilon.
    #[serde(default = "HfTransfoXlConfig::d_eps")]
    pub layer_norm_epsilon: f64,
    /// Per cluster: the softmax's projection is the embedding's.
    #[serde(default)]
    pub tie_projs: Option<Vec<bool>>,
    /// What `tie_projs` defaults to: `[false, true, ...]` when true.
    #[serde(default = "default_true")]
    pub proj_share_all_but_first: bool,
    /// The softmax's tables are the embedding's.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

impl HfTransfoXlConfig {
    fn d_vocab() -> usize {
        267735
    }
    fn d_cutoffs() -> Vec<usize> {
        vec![20000, 40000, 200000]
    }
    fn d_1024() -> usize {
        1024
    }
    fn d_16() -> usize {
        16
    }
    fn d_64() -> usize {
        64
    }
    fn d_4096() -> usize {
        4096
    }
    fn d_4() -> usize {
        4
    }
    fn d_18() -> usize {
        18
    }
    fn d_1600() -> usize {
        1600
    }
    fn d_1000() -> i64 {
        1000
    }
    fn d_minus1() -> i64 {
        -1
    }
    fn d_dropout() -> f64 {
        0.1
    }
    fn d_eps() -> f64 {
        1e-5
    }

    /// Reads `dir/config.json`.
    pub fn read(dir: &Path) -> Result<Self, ImportError> {
        let path = dir.join("config.json");
        let config: Self = mapping::read_json(&path)?;
        if let Some(t) = &config.model_type
            && t != "transfo-xl"
        {
            return Err(ImportError::Read {
                path,
                message: format!("model_type is `{t}`, this importer reads `transfo-xl`"),
            });
        }
        Ok(config)
    }

    /// `tie_projs` as HF derives it: given, or `[false, true, ...]` with
    /// `proj_share_all_but_first`, else all false.
    pub fn tie_projs(&self) -> Vec<bool> {
        self.tie_projs.clone().unwrap_or_else(|| {
            (0..=self.cutoffs.len())
                .map(|i| i > 0 && self.proj_share_all_but_first)
                .collect()
        })
    }

    /// The embedding width of cluster `i`: `d_embed / div_val^i` (all `d_embed` when
    /// `div_val = 1`).
    fn width(&self, i: usize) -> usize {
        if self.div_val == 1 {
            self.d_embed
        } else {
            self.d_embed / self.div_val.pow(i as u32)
        }
    }

    /// Whether cluster `i`'s embedding is projected to `d_model` (`emb_projs.i`).
    fn projected(&self, i: usize) -> bool {
        self.div_val > 1 || self.width(i) != self.d_model
    }

    /// Whether the model is a plain Transformer-XL (`cutoffs = []`, one table of width
    /// `d_model`): memzoo's plain embedding and tied output; otherwise adaptive.
    pub fn is_plain(&self) -> bool {
        self.cutoffs.is_empty() && self.div_val == 1 && self.d_embed == self.d_model
    }

    /// The memzoo config of the whole model (layers, adaptive input and output, HF's first
    /// memory of zeros).
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        if self.attn_type != 0 {
            return Err(ImportError::Unsupported(format!(
                "attn_type = {}: HF's code has only attn_type 0 (XL's relative attention)",
                self.attn_type
            )));
        }
        if self.sample_softmax > 0 {
            return Err(ImportError::Unsupported(format!(
                "sample_softmax = {}: a sampled softmax is a training device HF does not run either",
                self.sample_softmax
            )));
        }
        let clamp = usize::try_from(self.clamp_len).ok().filter(|&c| c > 0);
        let config = XlConfig::new()
            .with_vocab_size(self.vocab_size)
            .with_d_model(self.d_model)
            .with_n_layers(self.n_layer)
            .with_n_heads(self.n_head)
            .with_d_head(Some(self.d_head))
            .with_d_inner(self.d_inner)
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_mem_len(self.mem_len)
            .with_same_length(self.same_length)
            .with_positions(PositionConfig::new().with_clamp_len(clamp))
            .with_pre_ln(self.pre_lnorm)
            .with_compat(
                PeerCompat::new()
                    .with_final_norm(false)
                    .with_zero_first_memory(true),
            )
            .with_tie_weights(self.tie_word_embeddings)
            .with_untie_rel_bias(self.untie_r)
            .with_d_embed((self.d_embed != self.d_model).then_some(self.d_embed))
            .with_cutoffs(self.cutoffs.clone())
            .with_div_val(self.div_val)
            .with_tie_projs(if self.is_plain() {
                Vec::new()
            } else {
                self.tie_projs()
            })
            .with_layer_norm_epsilon(self.layer_norm_epsilon)
            .with_scale_embedding(true);
        config.validate()?;
        Ok(config)
    }

    /// HF's config of a memzoo stack, when HF's TransfoXL can express it: every layer `xl`,
    /// XL's sinusoids, post-LN or pre-LN without a final norm, `sqrt(d_model)` scale, a tied
    /// output when plain (HF's plain output is the adaptive softmax with one cluster: a tied or
    /// own table with a bias). The error names the field that cannot be expressed.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        if xl.layer_kinds().iter().any(|&k| k != LayerKind::Xl) {
            return no(format!(
                "layers {:?}: HF's TransfoXL has only XL relative attention",
                xl.layer_kinds()
            ));
        }
        if xl.positions.kind != PositionKind::Xl {
            return no(format!(
                "positions.kind = {:?}: HF's TransfoXL has XL's sinusoids only",
                xl.positions.kind
            ));
        }
        if xl.pre_ln && xl.compat.final_norm {
            return no(
                "pre_ln = true with compat.final_norm = true: HF's pre-LN TransfoXL has no final \
                 LayerNorm"
                    .into(),
            );
        }
        if !xl.scale_embedding {
            return no(
                "scale_embedding = false: HF's TransfoXL always scales by sqrt(d_model)".into(),
            );
        }
        if xl.document_resets {
            return no("document_resets = true: HF's TransfoXL has no document resets".into());
        }
        if xl.compat.value_output_bias {
            return no(
                "compat.value_output_bias = true: HF's TransfoXL attention has no value or output bias"
                    .into(),
            );
        }
        let n_clusters = xl.cutoffs.len() + 1;
        let tie_projs: Vec<bool> = (0..n_clusters)
            .map(|i| xl.tie_projs.get(i).copied().unwrap_or(false))
            .collect();
        Ok(Self {
            model_type: Some("transfo-xl".into()),
            vocab_size: xl.vocab_size,
            cutoffs: xl.cutoffs.clone(),
            d_model: xl.d_model,
            d_embed: xl.embed_width(),
            n_head: xl.n_heads,
            d_head: xl.head_width(),
            d_inner: xl.d_inner,
            div_val: xl.div_val,
            pre_lnorm: xl.pre_ln,
            n_layer: xl.n_layers,
            mem_len: xl.mem_len,
            clamp_len: xl.positions.clamp_len.map_or(-1, |c| c as i64),
            same_length: xl.same_length,
            attn_type: 0,
            sample_softmax: -1,
            dropout: xl.dropout,
            dropatt: xl.dropatt,
            untie_r: xl.untie_rel_bias,
            layer_norm_epsilon: xl.layer_norm_epsilon,
            tie_projs: Some(tie_projs),
            proj_share_all_but_first: false,
            tie_word_embeddings: xl.tie_weights,
        })
    }
}

/// Host values of a float tensor (for the tied-copy checks).
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// Takes `{prefix}r_w_bias` and `{prefix}r_r_bias` (`u`, `v`) into `biases`.
fn biases(
    map: &mut TensorMap,
    prefix: &str,
    biases: &mut XlBiases,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::param(
        map,
        &format!("{prefix}r_w_bias"),
        &mut biases.content,
        device,
    )?;
    mapping::param(
        map,
        &format!("{prefix}r_r_bias"),
        &mut biases.position,
        device,
    )
}

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

/// The tied copies HF's `state_dict` (a `pytorch_model.bin`; `save_pretrained` leaves them
/// out) holds, as renaming rules for [`mapping::tied_copies`]: names alone say which tensor
/// each duplicates, given the config's ties. The shared `u`/`v` under every layer (without
/// `untie_r`), the softmax's tables (`tie_word_embeddings`: the embedding's), and each tied
/// projection of a projected cluster (`tie_projs`: the embedding's, of cluster 0 when
/// `div_val = 1`).
fn tied_copy_rules(cfg: &HfTransfoXlConfig) -> Vec<(String, String)> {
    let mut rules = Vec::new();
    if !cfg.untie_r {
        rules.push((
            r"^transformer\.layers\.\d+\.dec_attn\.(r_[wr]_bias)$".into(),
            "transformer.$1".into(),
        ));
    }
    if cfg.tie_word_embeddings {
        rules.push((
            r"^crit\.out_layers\.(\d+)\.weight$".into(),
            "transformer.word_emb.emb_layers.$1.weight".into(),
        ));
    }
    if !cfg.is_plain() {
        for (i, tied) in cfg.tie_projs().into_iter().enumerate() {
            if tied && cfg.projected(i) {
                let to = if cfg.div_val == 1 { 0 } else { i };
                rules.push((
                    format!(r"^crit\.out_projs\.{i}$"),
                    format!("transformer.word_emb.emb_projs.{to}"),
                ));
            }
        }
    }
    rules
}

/// Replaces the weights of `layers` (and the shared `u`/`v`) by the checkpoint's.
fn load_layers(
    map: &mut TensorMap,
    cfg: &HfTransfoXlConfig,
    layers: &mut [XlLayer],
    shared: &mut Option<XlBiases>,
    device: &Device,
) -> Result<(), ImportError> {
    let (d, hd) = (cfg.d_model, cfg.n_head * cfg.d_head);
    if !cfg.untie_r {
        let s = shared
            .as_mut()
            .ok_or_else(|| XlError::Config("tied u/v without the shared biases".into()))?;
        biases(map, "transformer.", s, device)?;
    }
    for (l, layer) in layers.iter_mut().enumerate() {
        let p = format!("transformer.layers.{l}.");
        let LayerAttention::Relative(att) = &mut layer.attention else {
            return Err(
                XlError::Config(format!("layer {l} is not a relative-attention layer")).into(),
            );
        };
        // qkv_net: [3 h dh, d] = [W_q; W_k; W_v]
        let name = format!("{p}dec_attn.qkv_net.weight");
        let qkv = map.float(&name, [3 * hd, d], device)?;
        let q = mapping::from_torch(qkv.clone().narrow(0, 0, hd));
        mapping::set_linear(&mut att.query, q, None, &name)?;
        let kv = mapping::from_torch(qkv.narrow(0, hd, 2 * hd));
        mapping::set_linear(&mut att.key_value, kv, None, &name)?;
        mapping::linear(
            map,
            &format!("{p}dec_attn.o_net"),
            &mut att.output,
            false,
            device,
        )?;
        let PositionParams::Xl(xp) = &mut att.scheme else {
            return Err(XlError::Config("XL attention without W_R".into()).into());
        };
        mapping::linear(
            map,
            &format!("{p}dec_attn.r_net"),
            &mut xp.r_net,
            false,
            device,
        )?;
        if cfg.untie_r {
            let own = xp
                .biases
                .as_mut()
                .ok_or_else(|| XlError::Config(format!("layer {l}: untied u/v missing")))?;
            biases(map, &format!("{p}dec_attn."), own, device)?;
        }
        block_names(l).take(map, &mut layer.block, device)?;
    }
    // The sinusoid's frequencies are a buffer HF saves; memzoo computes them.
    let name = "transformer.pos_emb.inv_freq";
    if map.contains(name) {
        let half = d / 2;
        let got = host(map.float::<1>(name, [half], device)?);
        for (k, g) in got.iter().enumerate() {
            let want = 1.0 / 10000f64.powf(2.0 * k as f64 / d as f64);
            if ((*g as f64) - want).abs() > 1e-6 * want.max(1e-30) + 1e-12 {
                return Err(ImportError::Value {
                    name: name.into(),
                    message: format!(
                        "frequency {k} is {g}, memzoo's sinusoid uses 10000^(-2k/d_model) = {want}"
                    ),
                });
            }
        }
    }
    Ok(())
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

/// HF's tensors into `model` (built from `xl`, [`HfTransfoXlConfig::xl_config`]).
fn map_in(
    cfg: &HfTransfoXlConfig,
    xl: &XlConfig,
    map: &mut TensorMap,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::tied_copies(map, &tied_copy_rules(cfg))?;
    load_layers(
        map,
        cfg,
        &mut model.layers,
        &mut model.shared_biases,
        device,
    )?;
    if !cfg.is_plain() {
        let (embedding, softmax) = adaptive_from(cfg, xl, map, device)?;
        model.embedding = InputEmbedding::Adaptive(embedding);
        model.output = OutputLayer::Adaptive(softmax);
        return Ok(());
    }
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("a plain config built an adaptive embedding".into()).into());
    };
    let table_name = "transformer.word_emb.emb_layers.0.weight";
    mapping::embedding(map, table_name, embedding, device)?;
    match &mut model.output {
        // The tied copy of the table is checked with the others (`tied_copy_rules`).
        OutputLayer::Tied(b) => mapping::param(map, "crit.out_layers.0.bias", b, device)?,
        OutputLayer::Linear(output) => {
            mapping::linear(map, "crit.out_layers.0", output, true, device)?;
        }
        OutputLayer::Adaptive(_) => {
            return Err(XlError::Config("a plain config built an adaptive output".into()).into());
        }
    }
    Ok(())
}

/// The adaptive embedding and softmax of an adaptive checkpoint: owned tensors taken, tied
/// copies checked against the embedding's.
fn adaptive_from(
    cfg: &HfTransfoXlConfig,
    xl: &XlConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<(AdaptiveEmbedding, AdaptiveLogSoftmax), ImportError> {
    let emb_cfg = xl.adaptive_embedding();
    let bounds = emb_cfg.validate()?;
    let n = bounds.len() - 1;
    let width = |i: usize| cfg.width(i);
    let size = |i: usize| bounds[i + 1] - bounds[i];
    let n_tables = if cfg.div_val == 1 { 1 } else { n };
    let table_rows = |i: usize| {
        if cfg.div_val == 1 {
            cfg.vocab_size
        } else {
            size(i)
        }
    };
    let mut tables = Vec::with_capacity(n_tables);
    let mut projections = Vec::with_capacity(n_tables);
    for i in 0..n_tables {
        let p = "transformer.word_emb.";
        tables.push(map.float(
            &format!("{p}emb_layers.{i}.weight"),
            [table_rows(i), width(i)],
            device,
        )?);
        projections.push(if cfg.projected(i) {
            Some(
                map.float(
                    &format!("{p}emb_projs.{i}"),
                    [cfg.d_model, width(i)],
                    device,
                )?
                .transpose(),
            )
        } else {
            None
        });
    }
    let embedding = AdaptiveEmbedding::from_tensors(&emb_cfg, tables.clone(), projections.clone())?;

    // The softmax: owned tensors taken, tied copies checked against the embedding's.
    let sm_cfg = xl.adaptive_softmax();
    let tie_projs = cfg.tie_projs();
    let (v, de, dp) = (cfg.vocab_size, cfg.d_embed, cfg.d_model);
    let clusters = n - 1;
    let (cluster_weight, cluster_bias) = if clusters > 0 {
        (
            Some(map.float("crit.cluster_weight", [clusters, de], device)?),
            Some(map.float("crit.cluster_bias", [clusters], device)?),
        )
    } else {
        (None, None)
    };
    let mut out = AdaptiveLogSoftmaxTensors {
        cluster_weight,
        cluster_bias,
        biases: Vec::with_capacity(n),
        tables: Vec::new(),
        projections: Vec::with_capacity(n),
    };
    if cfg.div_val == 1 {
        // One output layer over the whole vocabulary, split at the cutoffs.
        let bias = map.float::<1>("crit.out_layers.0.bias", [v], device)?;
        out.biases = (0..n)
            .map(|i| bias.clone().narrow(0, bounds[i], size(i)))
            .collect();
        // A tied table's copy was checked with the others (`tied_copy_rules`).
        if !cfg.tie_word_embeddings {
            let w = map.float::<2>("crit.out_layers.0.weight", [v, de], device)?;
            out.tables = (0..n)
                .map(|i| w.clone().narrow(0, bounds[i], size(i)))
                .collect();
        }
    } else {
        for i in 0..n {
            let p = format!("crit.out_layers.{i}.");
            out.biases
                .push(map.float(&format!("{p}bias"), [size(i)], device)?);
            if !cfg.tie_word_embeddings {
                out.tables
                    .push(map.float(&format!("{p}weight"), [size(i), width(i)], device)?);
            }
        }
    }
    for i in 0..n {
        let name = format!("crit.out_projs.{i}");
        let tied = tie_projs.get(i).copied().unwrap_or(false);
        if !cfg.projected(i) {
            out.projections.push(None);
            if map.contains(&name) {
                return Err(ImportError::Value {
                    name,
                    message: format!("present, but d_embed = d_model = {dp} needs no projection"),
                });
            }
        } else if tied {
            // The embedding's projection; its copy was checked (`tied_copy_rules`).
            out.projections.push(None);
        } else {
            out.projections
                .push(Some(map.float(&name, [dp, width(i)], device)?.transpose()));
        }
    }
    let softmax = AdaptiveLogSoftmax::from_tensors(&sm_cfg, out, device)?;
    Ok((embedding, softmax))
}

/// The layers' tensors under HF's names (`transformer.layers.*`, the `u`/`v` biases).
fn layers_to_hf(
    out: &mut PeerTensors,
    layers: &[XlLayer],
    shared: Option<&XlBiases>,
    src: Source<'_>,
) {
    if let Some(s) = shared {
        for (name, p) in [("r_w_bias", &s.content), ("r_r_bias", &s.position)] {
            put(out, format!("transformer.{name}"), src.get(p));
            for l in 0..layers.len() {
                put(
                    out,
                    format!("transformer.layers.{l}.dec_attn.{name}"),
                    src.get(p),
                );
            }
        }
    }
    let tr = |t: Option<Tensor<2>>| t.map(|t| t.transpose());
    for (l, layer) in layers.iter().enumerate() {
        let p = format!("transformer.layers.{l}.");
        let Some(att) = layer.attention.relative() else {
            continue;
        };
        let qkv = match (src.get(&att.query.weight), src.get(&att.key_value.weight)) {
            (Some(q), Some(kv)) => Some(Tensor::cat(vec![q.transpose(), kv.transpose()], 0)),
            _ => None,
        };
        put(out, format!("{p}dec_attn.qkv_net.weight"), qkv);
        put(
            out,
            format!("{p}dec_attn.o_net.weight"),
            tr(src.get(&att.output.weight)),
        );
        let xp = match &att.scheme {
            PositionParams::Xl(xp) => Some(xp),
            _ => None,
        };
        if let Some(xp) = xp {
            put(
                out,
                format!("{p}dec_attn.r_net.weight"),
                tr(src.get(&xp.r_net.weight)),
            );
        }
        if let Some(b) = xp.and_then(|xp| xp.biases.as_ref()) {
            put(out, format!("{p}dec_attn.r_w_bias"), src.get(&b.content));
            put(out, format!("{p}dec_attn.r_r_bias"), src.get(&b.position));
        }
        block_names(l).put(out, &layer.block, src);
    }
}

/// A [`TransformerXl`]'s tensors (or gradients) under HF's names, tied copies included (as
/// HF's `state_dict` names them: `crit.out_layers.i.weight` is the embedding's table when
/// tied, and so on). Layers other than XL relative attention are left out.
pub fn transformer_xl_to_hf(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    layers_to_hf(&mut out, &model.layers, model.shared_biases.as_ref(), src);
    match (&model.embedding, &model.output) {
        (InputEmbedding::Adaptive(emb), OutputLayer::Adaptive(sm)) => {
            adaptive_to_hf(&mut out, emb, sm, src)
        }
        (InputEmbedding::Plain(emb), output) => {
            let table = src.get(&emb.weight);
            put(
                &mut out,
                "transformer.word_emb.emb_layers.0.weight".into(),
                table.clone(),
            );
            match output {
                OutputLayer::Linear(output) => {
                    put(
                        &mut out,
                        "crit.out_layers.0.weight".into(),
                        src.get(&output.weight).map(|w| w.transpose()),
                    );
                    if let Some(b) = &output.bias {
                        put(&mut out, "crit.out_layers.0.bias".into(), src.get(b));
                    }
                }
                OutputLayer::Tied(bias) => {
                    put(&mut out, "crit.out_layers.0.weight".into(), table);
                    put(&mut out, "crit.out_layers.0.bias".into(), src.get(bias));
                }
                OutputLayer::Adaptive(_) => {}
            }
        }
        (InputEmbedding::Adaptive(_), _) => {}
    }
    out
}

fn adaptive_to_hf(
    out: &mut PeerTensors,
    emb: &AdaptiveEmbedding,
    sm: &AdaptiveLogSoftmax,
    src: Source<'_>,
) {
    let div1 = emb.div_val() == 1;
    for (i, t) in emb.tables().iter().enumerate() {
        put(
            out,
            format!("transformer.word_emb.emb_layers.{i}.weight"),
            src.get(t),
        );
    }
    for (i, p) in emb.projections().iter().enumerate() {
        if let Some(p) = p {
            put(
                out,
                format!("transformer.word_emb.emb_projs.{i}"),
                src.get(p).map(|t| t.transpose()),
            );
        }
    }
    if let Some(w) = sm.cluster_weight() {
        put(out, "crit.cluster_weight".into(), src.get(w));
    }
    if let Some(b) = sm.cluster_bias() {
        put(out, "crit.cluster_bias".into(), src.get(b));
    }
    let biases: Vec<Option<Tensor<1>>> = sm.biases().iter().map(|b| src.get(b)).collect();
    if div1 {
        if biases.iter().all(Option::is_some) {
            let all = Tensor::cat(biases.into_iter().flatten().collect(), 0);
            put(out, "crit.out_layers.0.bias".into(), Some(all));
        }
    } else {
        for (i, b) in biases.into_iter().enumerate() {
            put(out, format!("crit.out_layers.{i}.bias"), b);
        }
    }
    // Output tables: the embedding's when tied.
    let tables: Vec<Option<Tensor<2>>> = if sm.tables().is_empty() {
        emb.tables().iter().map(|t| src.get(t)).collect()
    } else {
        let own: Vec<Option<Tensor<2>>> = sm.tables().iter().map(|t| src.get(t)).collect();
        if div1 && own.iter().all(Option::is_some) {
            vec![Some(Tensor::cat(own.into_iter().flatten().collect(), 0))]
        } else {
            own
        }
    };
    for (i, t) in tables.into_iter().enumerate() {
        put(out, format!("crit.out_layers.{i}.weight"), t);
    }
    for (i, p) in sm.projections().iter().enumerate() {
        let t = match p {
            Some(p) => src.get(p),
            None => emb.projections()[if div1 { 0 } else { i }]
                .as_ref()
                .and_then(|p| src.get(p)),
        };
        put(out, format!("crit.out_projs.{i}"), t.map(|t| t.transpose()));
    }
}

/// The tensors HF's `save_pretrained` writes for this model: [`transformer_xl_to_hf`]'s
/// values without the tied copies (`crit.out_layers.i.weight` when tied, tied
/// `crit.out_projs.i`, the layers' copies of shared `u`/`v`), plus the sinusoid's
/// `transformer.pos_emb.inv_freq` buffer (`10000^(-2k/d_model)`).
pub fn hf_state_dict(model: &TransformerXl, config: &HfTransfoXlConfig) -> PeerTensors {
    let mut out = transformer_xl_to_hf(model, Source::Values);
    let n = config.cutoffs.len() + 1;
    let tie_projs = config.tie_projs();
    for i in 0..n {
        if config.tie_word_embeddings {
            out.remove(&format!("crit.out_layers.{i}.weight"));
        }
        if tie_projs.get(i).copied().unwrap_or(false) {
            out.remove(&format!("crit.out_projs.{i}"));
        }
    }
    if !config.untie_r {
        for l in 0..config.n_layer {
            for name in ["r_w_bias", "r_r_bias"] {
                out.remove(&format!("transformer.layers.{l}.dec_attn.{name}"));
            }
        }
    }
    let d = config.d_model;
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|k| (1.0 / 10000f64.powf(2.0 * k as f64 / d as f64)) as f32)
        .collect();
    out.insert(
        "transformer.pos_emb.inv_freq".into(),
        TensorData::new(inv_freq, [d / 2]),
    );
    out
}

/// Writes an HF TransfoXL model directory ([`HfTransfoXl`]'s [`PeerFormat::write`]) from a
/// memzoo stack and its config; the config must be HF-shaped
/// ([`HfTransfoXlConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&HfTransfoXl, model, xl, dir)
}

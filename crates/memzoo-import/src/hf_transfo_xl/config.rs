//! HF's `TransfoXLConfig` (`config.json`) and the memzoo stack config that computes the same
//! function, both ways.

use std::path::Path;

use memzoo_relative::PositionConfig;
use memzoo_relative::PositionKind;
use memzoo_stack::{LayerKind, PeerCompat, XlConfig};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::mapping;

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
    pub(super) fn width(&self, i: usize) -> usize {
        if self.div_val == 1 {
            self.d_embed
        } else {
            self.d_embed / self.div_val.pow(i as u32)
        }
    }

    /// Whether cluster `i`'s embedding is projected to `d_model` (`emb_projs.i`).
    pub(super) fn projected(&self, i: usize) -> bool {
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
        crate::mapping::expressible(&crate::mapping::rmt_layer_checks(xl), "HF's TransfoXL")?;
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

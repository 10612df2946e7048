//! compressive-transformer-pytorch (lucidrains, 0.4.0) checkpoints in memzoo.
//!
//! The checkpoint is the `state_dict` of its `CompressiveTransformer` as `model.safetensors`,
//! with a `config.json` of the constructor's arguments (`seq_len`, `mem_len`, `cmem_len`,
//! `cmem_ratio`, `reconstruction_loss_weight`, ...; the weights give the sizes).
//!
//! The package's model, and what it is in memzoo's stack ([`TransformerXl`] with
//! [`CompressiveConfig`]):
//! - an unscaled embedding (`scale_embedding = false`), pre-LN residual blocks and no final
//!   norm (`final_norm = false`), a linear head with a bias (`tie_weights = false`); a GELU
//!   feed-forward `dim → 4 dim → dim` with biases;
//! - attention: `to_q`, `to_kv` (key then value) without bias, `to_out` with one
//!   (`attention_output_bias`); positions are a learned table `pos_emb` `[heads, L, d_head]`,
//!   `L = seq_len + mem_len + cmem_len`, scored `q·E / sqrt(d_head)` with no biases: memzoo's
//!   `learned` layers with `max_distance = L − 1`, their query and key biases zero; the
//!   package indexes the table from the end of the current window, so that while its memories
//!   fill every distance is shifted (`compressive.window_end_positions`);
//! - the memories hold the normalised layer inputs (detached): memzoo normalises its memory of
//!   layer inputs with the LayerNorm as a constant (`compressive.memory_norm_gradients =
//!   false`), the same function and gradients at fixed weights; the compression is
//!   `Conv1d(dim, dim, ratio, stride = ratio)` (`compressive.function = "conv"`);
//! - the reconstruction loss reconstructs the attention over the whole incoming memory
//!   (`compressive.reconstruct_whole_memory`), as a mean squared error, weighted by
//!   `reconstruction_loss_weight / depth`.
//!
//! Not the same, and why:
//! - the package detaches `to_kv.weight` in place in its first pass that compresses, so that
//!   parameter never trains again (also not from the LM loss); memzoo trains `W_kv` from the LM
//!   loss, holding it constant in the reconstruction loss only (the paper's intent);
//! - it pads old memory that is not a multiple of `cmem_ratio` by `n mod ratio` zeros (memzoo:
//!   to the next multiple); with `mem_len` and `seq_len` multiples of the ratio neither pads;
//! - it updates no memory for a segment shorter than `seq_len` (memzoo does);
//! - export writes the package's `config.json` and `model.safetensors` of a stack it can
//!   express ([`CompressivePeerConfig::from_xl`] names the first field it cannot), the segment
//!   length from the position table (`max_distance + 1 − mem_len − cmem_len`);
//! - refused by name: `gru_gated_residual`, `mogrify_gru`, `enhanced_recurrence`,
//!   `memory_layers` other than all, `ff_glu`, `emb_dim` other than `dim`.
//!
//! | package (`l` a layer, 0-based) | memzoo |
//! |---|---|
//! | `token_emb.weight` `[V, d]` | the plain embedding |
//! | `attn_layers.l.fn.norm`, `ff_layers.l.fn.norm` | `block.norm_attention`, `block.norm_ff` |
//! | `attn_layers.l.fn.fn.to_q.weight` | `attention.query` (transposed) |
//! | `attn_layers.l.fn.fn.to_kv.weight` `[2d, d]` | `attention.key_value` (transposed) |
//! | `attn_layers.l.fn.fn.to_out.weight`, `.bias` | `attention.output` |
//! | `attn_layers.l.fn.fn.compress_mem_fn.conv.weight` `[d, d, c]`, `.bias` | `compressive.convs[l]` (`[c d, d]`) |
//! | `pos_emb` `[h, L, dh]` | every layer's learned table, row `L − 1 + d` = `pos_emb[:, L − 1 − d]` |
//! | `ff_layers.l.fn.fn.w1`, `.w2` | `block.ff_in`, `block.ff_out` |
//! | `to_logits.1.weight`, `.bias` | the linear output |

use std::path::Path;

use burn::tensor::{Device, Tensor};
use memzoo_relative::{PositionConfig, PositionKind, PositionParams};
use memzoo_stack::{
    Activation, CompressionKind, CompressiveConfig, InputEmbedding, LayerKind, OutputLayer,
    PeerCompat, TransformerXl, XlConfig,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source};
use crate::reader::TensorMap;

/// The constructor arguments of the package's `CompressiveTransformer` (`config.json`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompressivePeerConfig {
    /// Vocabulary size.
    pub num_tokens: usize,
    /// Model width.
    pub dim: usize,
    /// Segment length.
    pub seq_len: usize,
    /// Layers.
    pub depth: usize,
    /// Heads (`d_head = dim / heads`).
    pub heads: usize,
    /// XL memory length.
    pub mem_len: usize,
    /// Compressed memory length.
    pub cmem_len: usize,
    /// Compression rate.
    #[serde(default = "four")]
    pub cmem_ratio: usize,
    /// Weight of the reconstruction loss.
    #[serde(default = "one")]
    pub reconstruction_loss_weight: f64,
    /// Must be false (memzoo has plain residuals).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub gru_gated_residual: bool,
    /// Must be false.
    #[serde(default)]
    pub mogrify_gru: bool,
    /// Must be false (memzoo's layer `l` reads its own memory).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub enhanced_recurrence: bool,
    /// Must be false.
    #[serde(default)]
    pub ff_glu: bool,
    /// Must be all layers (1-based) or absent.
    #[serde(default)]
    pub memory_layers: Option<Vec<usize>>,
    /// Must be absent or `dim`.
    #[serde(default)]
    pub emb_dim: Option<usize>,
}

fn four() -> usize {
    4
}
fn one() -> f64 {
    1.0
}

impl CompressivePeerConfig {
    /// The position table's length, `seq_len + mem_len + cmem_len`.
    pub fn table_len(&self) -> usize {
        self.seq_len + self.mem_len + self.cmem_len
    }

    /// The memzoo stack that computes the package's model.
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        let all: Vec<usize> = (1..=self.depth).collect();
        mapping::expressible(
            &[
                (self.gru_gated_residual, "gru_gated_residual = true"),
                (self.mogrify_gru, "mogrify_gru = true"),
                (self.enhanced_recurrence, "enhanced_recurrence = true"),
                (self.ff_glu, "ff_glu = true"),
                (
                    self.memory_layers.as_ref().is_some_and(|m| *m != all),
                    "memory_layers other than every layer",
                ),
                (
                    self.emb_dim.is_some_and(|e| e != self.dim),
                    "emb_dim other than dim",
                ),
            ],
            "memzoo's compressive stack",
        )?;
        if self.heads == 0 || !self.dim.is_multiple_of(self.heads) {
            return Err(ImportError::Unsupported(format!(
                "dim ({}) must be a multiple of heads ({})",
                self.dim, self.heads
            )));
        }
        Ok(XlConfig::new()
            .with_vocab_size(self.num_tokens)
            .with_d_model(self.dim)
            .with_n_layers(self.depth)
            .with_n_heads(self.heads)
            .with_d_head(Some(self.dim / self.heads))
            .with_d_inner(4 * self.dim)
            .with_dropout(0.0)
            .with_dropatt(0.0)
            .with_mem_len(self.mem_len)
            .with_pre_ln(true)
            .with_compat(
                PeerCompat::new()
                    .with_final_norm(false)
                    .with_attention_output_bias(true),
            )
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_ff_activation(Activation::Gelu)
            .with_layers(vec![LayerKind::Learned; self.depth])
            .with_positions(
                PositionConfig::new()
                    .with_kind(PositionKind::Learned)
                    .with_max_distance(self.table_len() - 1)
                    .with_learned_biases(false),
            )
            .with_compressive(Some(
                CompressiveConfig::new()
                    .with_cmem_len(self.cmem_len)
                    .with_ratio(self.cmem_ratio)
                    .with_function(CompressionKind::Conv)
                    .with_reconstruction_weight(self.reconstruction_loss_weight)
                    .with_reconstruct_whole_memory(true)
                    .with_window_end_positions(true)
                    .with_memory_norm_gradients(false),
            )))
    }
}

impl CompressivePeerConfig {
    /// The package's config of a memzoo stack; the error names the first field the package
    /// cannot express.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let Some(c) = &xl.compressive else {
            return Err(ImportError::Unsupported(
                "compressive = none: lucidrains-compressive needs a compressive stack".into(),
            ));
        };
        let kinds = xl.layer_kinds();
        let window = xl.positions.max_distance + 1;
        let seq_len = window.saturating_sub(xl.mem_len + c.cmem_len);
        mapping::expressible(
            &mapping::rmt_layer_checks(xl),
            "compressive-transformer-pytorch",
        )?;
        mapping::expressible(
            &[
                (!xl.pre_ln, "pre_ln = false"),
                (xl.compat.final_norm, "compat.final_norm = true"),
                (xl.tie_weights, "tie_weights = true"),
                (xl.scale_embedding, "scale_embedding = true"),
                (xl.is_adaptive(), "an adaptive embedding"),
                (
                    !xl.compat.attention_output_bias,
                    "compat.attention_output_bias = false",
                ),
                (
                    xl.compat.value_output_bias,
                    "compat.value_output_bias = true",
                ),
                (xl.kv_heads.is_some(), "kv_heads"),
                (
                    xl.ff_activation != Activation::Gelu,
                    "ff_activation other than gelu",
                ),
                (xl.d_inner != 4 * xl.d_model, "d_inner other than 4 d_model"),
                (
                    xl.head_width() * xl.n_heads != xl.d_model,
                    "n_heads d_head other than d_model",
                ),
                (
                    kinds.iter().any(|k| *k != LayerKind::Learned),
                    "layers other than `learned`",
                ),
                (
                    c.function != CompressionKind::Conv,
                    "compressive.function other than conv",
                ),
                (
                    !c.reconstruct_whole_memory,
                    "compressive.reconstruct_whole_memory = false",
                ),
                (
                    !c.window_end_positions,
                    "compressive.window_end_positions = false",
                ),
                (
                    c.memory_norm_gradients,
                    "compressive.memory_norm_gradients = true",
                ),
                (
                    seq_len == 0,
                    "positions.max_distance below mem_len + cmem_len",
                ),
                (xl.mem_len < seq_len, "mem_len below the segment length"),
                (
                    c.cmem_len < xl.mem_len / c.ratio.max(1),
                    "cmem_len below mem_len / ratio",
                ),
            ],
            "lucidrains-compressive",
        )?;
        Ok(Self {
            num_tokens: xl.vocab_size,
            dim: xl.d_model,
            seq_len,
            depth: xl.n_layers,
            heads: xl.n_heads,
            mem_len: xl.mem_len,
            cmem_len: c.cmem_len,
            cmem_ratio: c.ratio,
            reconstruction_loss_weight: c.reconstruction_weight,
            gru_gated_residual: false,
            mogrify_gru: false,
            enhanced_recurrence: false,
            ff_glu: false,
            memory_layers: None,
            emb_dim: None,
        })
    }
}

/// The package's checkpoint layout (`memzoo import --from lucidrains-compressive`).
pub struct LucidrainsCompressive;

fn block_names(l: usize) -> BlockNames {
    BlockNames {
        norm_attention: format!("attn_layers.{l}.fn.norm"),
        norm_ff: format!("ff_layers.{l}.fn.norm"),
        ff_in: format!("ff_layers.{l}.fn.fn.w1"),
        ff_out: format!("ff_layers.{l}.fn.fn.w2"),
    }
}

impl PeerFormat for LucidrainsCompressive {
    type Config = CompressivePeerConfig;
    const NAME: &'static str = "lucidrains-compressive";

    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, &["model.safetensors"], "CompressiveTransformer")
    }

    fn read_config(
        &self,
        at: &Located,
        tensors: &TensorMap,
    ) -> Result<CompressivePeerConfig, ImportError> {
        let path = at.beside("config.json");
        let cfg: CompressivePeerConfig = mapping::read_json(&path)?;
        if let Some(t) = tensors.get("pos_emb") {
            let want = [cfg.heads, cfg.table_len(), cfg.dim / cfg.heads.max(1)];
            if t.shape().as_slice() != want.as_slice() {
                return Err(ImportError::Shape {
                    name: "pos_emb".into(),
                    found: t.shape().to_vec(),
                    expected: want.to_vec(),
                });
            }
        }
        Ok(cfg)
    }

    fn stack(&self, config: &CompressivePeerConfig, _: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn map_in(
        &self,
        config: &CompressivePeerConfig,
        _: &Located,
        map: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        let (h, d) = (config.heads, config.dim);
        let (dh, table, c) = (d / h, config.table_len(), config.cmem_ratio);
        let InputEmbedding::Plain(emb) = &mut model.embedding else {
            return Err(ImportError::Unsupported(
                "the compressive stack has a plain embedding".into(),
            ));
        };
        mapping::embedding(map, "token_emb.weight", emb, device)?;
        // pos_emb[:, L - 1 - d] is distance d; memzoo's row of distance d is M + d, M = L - 1.
        let pos: Tensor<3> = map.float("pos_emb", [h, table, dh], device)?;
        let rows = pos.flip([1]).swap_dims(0, 1); // [L, h, dh], row d = distance d
        let full = Tensor::cat(vec![Tensor::zeros([table - 1, h, dh], device), rows], 0);
        for (l, layer) in model.layers.iter_mut().enumerate() {
            let p = format!("attn_layers.{l}.fn.fn");
            let a = layer.attention.relative_mut().ok_or_else(|| {
                ImportError::Unsupported(format!("layer {l} is not a relative layer"))
            })?;
            mapping::linear(map, &format!("{p}.to_q"), &mut a.query, false, device)?;
            mapping::linear(map, &format!("{p}.to_kv"), &mut a.key_value, false, device)?;
            mapping::linear(map, &format!("{p}.to_out"), &mut a.output, true, device)?;
            let PositionParams::Learned(lp) = &mut a.scheme else {
                return Err(ImportError::Unsupported(format!(
                    "layer {l} is not `learned`"
                )));
            };
            mapping::set(&mut lp.embedding, full.clone(), "pos_emb")?;
            let qb = lp.query_bias.dims();
            mapping::set(&mut lp.query_bias, Tensor::zeros(qb, device), "pos_emb")?;
            let kb = lp.key_bias.dims();
            mapping::set(&mut lp.key_bias, Tensor::zeros(kb, device), "pos_emb")?;
            block_names(l).take(map, &mut layer.block, device)?;
        }
        let comp = model
            .compressive
            .as_mut()
            .ok_or_else(|| ImportError::Unsupported("the stack is not compressive".into()))?;
        for (l, conv) in comp.convs.iter_mut().enumerate() {
            let name = format!("attn_layers.{l}.fn.fn.compress_mem_fn.conv");
            let w: Tensor<3> = map.float(&format!("{name}.weight"), [d, d, c], device)?;
            // [out, in, k] → row k d + i of [c d, d].
            let w = w.permute([2, 1, 0]).reshape([c * d, d]);
            let b = map.float(&format!("{name}.bias"), [d], device)?;
            mapping::set_linear(conv, w, Some(b), &format!("{name}.weight"))?;
        }
        match &mut model.output {
            OutputLayer::Linear(out) => mapping::linear(map, "to_logits.1", out, true, device),
            _ => Err(ImportError::Unsupported(
                "the compressive stack has a linear output".into(),
            )),
        }
    }

    fn config_of(&self, stack: &XlConfig) -> Result<CompressivePeerConfig, ImportError> {
        CompressivePeerConfig::from_xl(stack)
    }

    /// The values, after checking what the package's one position table and bias-free scores
    /// need: every layer's table the same, the query and key biases zero.
    fn state_dict(
        &self,
        _: &CompressivePeerConfig,
        model: &TransformerXl,
    ) -> Result<PeerTensors, ImportError> {
        let mut first: Option<Vec<f32>> = None;
        for (l, layer) in model.layers.iter().enumerate() {
            let PositionParams::Learned(lp) = &layer.attention.local().scheme else {
                return Err(ImportError::Unsupported(format!(
                    "layer {l} is not `learned`"
                )));
            };
            let host = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>();
            let table = host(lp.embedding.val()).map_err(|e| ImportError::Value {
                name: format!("layer {l}'s position table"),
                message: format!("{e:?}"),
            })?;
            let biases = [
                lp.query_bias.val().abs().max(),
                lp.key_bias.val().abs().max(),
            ];
            if biases.into_iter().any(|b| b.into_scalar::<f32>() != 0.0) {
                return Err(ImportError::Unsupported(format!(
                    "layer {l}'s learned query/key position biases are not zero: \
                     lucidrains-compressive has none"
                )));
            }
            match &first {
                Some(t) if *t != table => {
                    return Err(ImportError::Unsupported(format!(
                        "layer {l}'s position table differs from layer 0's: \
                         lucidrains-compressive shares one table (pos_emb)"
                    )));
                }
                Some(_) => {}
                None => first = Some(table),
            }
        }
        self.map_out(model, Source::Values)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        compressive_to_peer(model, src)
    }
}

/// The model's values or gradients under the package's names (the inverse of the import; the
/// learned tables' rows of distances `0..L` as `pos_emb`, from layer 0's table for values and
/// summed over the layers for gradients, the package sharing one table).
pub fn compressive_to_peer(
    model: &TransformerXl,
    src: Source<'_>,
) -> Result<PeerTensors, ImportError> {
    let mut out = PeerTensors::new();
    if let Some(e) = model.embedding.plain() {
        mapping::put(&mut out, "token_emb.weight".into(), src.get(&e.weight));
    }
    let mut pos: Option<Tensor<3>> = None;
    for (l, layer) in model.layers.iter().enumerate() {
        let p = format!("attn_layers.{l}.fn.fn");
        let a = layer.attention.local();
        mapping::put_linear(&mut out, &format!("{p}.to_q"), &a.query, src);
        mapping::put_linear(&mut out, &format!("{p}.to_kv"), &a.key_value, src);
        mapping::put_linear(&mut out, &format!("{p}.to_out"), &a.output, src);
        if let PositionParams::Learned(lp) = &a.scheme
            && let Some(t) = src.get(&lp.embedding)
        {
            let [rows, h, dh] = t.dims();
            let m = rows / 2;
            // Rows M..=2M are distances 0..=M; pos_emb[:, L - 1 - d].
            let t = t
                .narrow(0, m, m + 1)
                .flip([0])
                .swap_dims(0, 1)
                .reshape([h, m + 1, dh]);
            pos = Some(match (pos, matches!(src, Source::Values)) {
                (Some(p), true) => p,
                (Some(p), false) => p + t,
                (None, _) => t,
            });
        }
        block_names(l).put(&mut out, &layer.block, src);
    }
    mapping::put(&mut out, "pos_emb".into(), pos);
    if let Some(comp) = &model.compressive {
        for (l, conv) in comp.convs.iter().enumerate() {
            let name = format!("attn_layers.{l}.fn.fn.compress_mem_fn.conv");
            if let Some(w) = src.get(&conv.weight) {
                let [cd, d] = w.dims();
                let w = w.reshape([cd / d, d, d]).permute([2, 1, 0]);
                mapping::put(&mut out, format!("{name}.weight"), Some(w));
            }
            if let Some(b) = &conv.bias {
                mapping::put(&mut out, format!("{name}.bias"), src.get(b));
            }
        }
    }
    if let OutputLayer::Linear(o) = &model.output {
        mapping::put_linear(&mut out, "to_logits.1", o, src);
    }
    Ok(out)
}

/// Loads a `CompressiveTransformer` checkpoint (a directory with `model.safetensors` and
/// `config.json`); every tensor is used. Returns the package's config too.
pub fn load(
    src: &Path,
    device: &Device,
) -> Result<(TransformerXl, CompressivePeerConfig), ImportError> {
    let imported = crate::format::import(&LucidrainsCompressive, src, device)?;
    Ok((imported.model, imported.peer))
}

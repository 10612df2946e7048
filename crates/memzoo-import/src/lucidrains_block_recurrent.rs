//! block-recurrent-transformer-pytorch (lucidrains, 0.4.4) checkpoints in memzoo.
//!
//! The checkpoint is the `state_dict` of its `BlockRecurrentTransformer` as
//! `model.safetensors` (with its LayerNorms' zero `beta` buffers), with a `config.json` of the
//! constructor's arguments (the weights give the sizes, and must agree).
//!
//! The package's model, and what it is in memzoo's stack ([`TransformerXl`] with
//! [`BlockRecurrentConfig`]):
//! - a memzoo segment is one of the package's blocks (`block_width` tokens); its forward over
//!   `max_seq_len` tokens (`max_seq_len / block_width` blocks, the states and the XL memories
//!   in the graph from block to block) and its `RecurrentTrainerWrapper`, which carries them
//!   detached from one such segment to the next, are memzoo's unrolled training step of
//!   `block_recurrent.bptt_segments = max_seq_len / block_width` blocks;
//! - the XL memory of the last block's keys and values of every layer (`mem_len =
//!   block_width`, `compat.memory_keys_values`, kept in the graph within the unroll as the
//!   package keeps its memories within one forward), one key/value head (`kv_heads = 1`);
//! - rotary positions with xPos scaling over `2 × block_width` positions (`rotary` layers,
//!   `positions.xpos_scale_base = 512`, `positions.rotary_width = 2 block_width`);
//! - qk-RMSNorm in the recurrent layer and its state's three attentions, or in every layer
//!   (`all_layers_qk_rmsnorm`): `qk_norm`, with the scale the package computes, `1 /
//!   sqrt(dim_head)` (its `qk_rmsnorm_scale = 8` is stored but never reaches the scores);
//! - pre-norm blocks of bias-free LayerNorms (`compat.norm_bias = false`), bias-free
//!   projections, a GEGLU feed-forward of width `int(dim · ff_mult · 2 / 3)` without biases
//!   (`ff_activation = "geglu"`, `d_inner` written out, `compat.ff_bias = false`), an unscaled
//!   embedding, a final LayerNorm and an untied bias-free output (`compat.output_bias =
//!   false`);
//! - the state container of the recurrent layer (`recurrent_layers`, one) read by the layer
//!   `read_recurrent_layers` names (`block_recurrent.layer`, `.read_layer`, both 0-based
//!   here), its learned EMA the fixed gate with `b_g = −learned_ema_beta`, no state
//!   feed-forward, `c_0 ~ N(0, 0.1)` (`initial_std`).
//!
//! Not the same, and why:
//! - refused by name: more than one recurrent layer (memzoo's stack has one),
//!   `use_compressed_mem = true` (its convolution-compressed memory), `max_seq_len` not a multiple of `block_width`;
//! - the package updates its XL memories only after a full block (a shorter last block, in
//!   generation, leaves them): memzoo always updates them. Training reads full blocks only;
//! - the package's loss ignores targets equal to `ignore_index`; memzoo's ignores none.
//!
//! | package (`l` a layer, 0-based; `c` = `layers.w.0.state_container`, `w` the recurrent one) | memzoo |
//! |---|---|
//! | `token_emb.weight` | the plain embedding |
//! | `layers.l.0.norm.gamma` (`.beta` zero) | `block.norm_attention` (no bias) |
//! | `layers.l.0.to_q.weight`, `.to_kv.weight` | `attention.query`, `.key_value` (transposed) |
//! | `layers.l.0.to_out.weight` `[d, h dh (1 + reads)]` | `attention.output` and, in the reading layer, `block_recurrent.to_state_output` |
//! | `layers.l.0.attn.q_scale`, `.k_scale` | `attention.qk_norm` |
//! | `layers.l.1.0.gamma`, `.1.weight`, `.3.weight` | `block.norm_ff`, `block.ff_in`, `block.ff_out` |
//! | `c.init_state`, `c.state_pos_ids`, `c.state_norm.gamma` | `initial`, `state_ids`, `state_norm` |
//! | `c.q_to_state`, `c.q_from_state`, `c.state_to_q`, `c.state_to_kv` | `to_state_query`, `from_state_query`, `state_query`, `state_key_value` |
//! | `c.to_state_out.weight` (per head `[self_h ; cross_h]`) | `state_output` (`[self ; cross]`, rows permuted) |
//! | `c.state_out_to_gate`, `c.learned_ema_beta` | `attention_gate.candidate`, `attention_gate.bias = −β` |
//! | `c.to_state_cross_attn`, `.state_self_attn`, `.from_state_cross_attn` `.q_scale`, `.k_scale` | `read_qk_norm`, `self_qk_norm`, `cross_qk_norm` |
//! | `to_logits.0.gamma`, `to_logits.1.weight` | the final norm, the linear output |

use std::path::Path;

use burn::module::Param;
use burn::nn::LayerNorm;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_relative::{PositionConfig, PositionKind, QkNorm};
use memzoo_stack::{
    Activation, BlockRecurrent, BlockRecurrentConfig, GateKind, InputEmbedding, LayerKind, Norm,
    NormKind, OutputLayer, PeerCompat, QkNormConfig, TransformerXl, XlConfig,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::lucidrains_rmt::ff_width;
use crate::mapping::{self, Located, PeerTensors, Source};
use crate::reader::TensorMap;

/// The package's rotary `scale_base` (xPos's `γ`), fixed in its constructor.
pub const XPOS_SCALE_BASE: f64 = 512.0;
/// The scale of the package's qk-RMSNorm scores, `1 / sqrt(dim_head)`: its `Attention`
/// sets `qk_rmsnorm_scale` (8) but never passes it to `Attend`, which scales by
/// `dim_head^(−1/2)` on both its paths.
pub fn qk_scale(dim_head: usize) -> f64 {
    1.0 / (dim_head as f64).sqrt()
}
/// The standard deviation of the package's `init_state`.
pub const INITIAL_STD: f64 = 0.1;

/// The constructor arguments of the package's `BlockRecurrentTransformer` (`config.json`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BlockRecurrentPeerConfig {
    /// Vocabulary size.
    pub num_tokens: usize,
    /// Model width.
    pub dim: usize,
    /// Layers.
    pub depth: usize,
    /// Width of each head.
    #[serde(default = "crate::mapping::defaults::dim_head")]
    pub dim_head: usize,
    /// Heads.
    #[serde(default = "crate::mapping::defaults::heads")]
    pub heads: usize,
    /// qk-RMSNorm in every layer, not only the recurrent one.
    #[serde(default)]
    pub all_layers_qk_rmsnorm: bool,
    /// The feed-forward's multiplier: its width is `int(dim · ff_mult · 2 / 3)`.
    #[serde(default = "crate::mapping::defaults::ff_mult")]
    pub ff_mult: f64,
    /// Tokens of one forward (blocks in the graph together): a multiple of `block_width`.
    #[serde(default = "max_seq_len")]
    pub max_seq_len: usize,
    /// Tokens of a block (memzoo's segment, and the XL memory's length).
    #[serde(default = "block_width")]
    pub block_width: usize,
    /// The recurrent layers, 1-based (`None`: `depth / 2`); memzoo takes one.
    #[serde(default)]
    pub recurrent_layers: Option<Vec<usize>>,
    /// The layers reading each recurrent layer's state, 1-based (`None`: the same).
    #[serde(default)]
    pub read_recurrent_layers: Option<Vec<usize>>,
    /// State vectors (`None`: `block_width`).
    #[serde(default)]
    pub num_state_vectors: Option<usize>,
    /// The loss's ignored target (memzoo ignores none).
    #[serde(default = "minus_hundred")]
    pub ignore_index: i64,
    /// PyTorch's fused attention (the same function, scaled by `1 / sqrt(dim_head)` as the
    /// plain path).
    #[serde(default)]
    pub use_flash_attn: bool,
    /// Must be false (memzoo has no convolution-compressed XL memory).
    #[serde(default)]
    pub use_compressed_mem: bool,
    /// Unused without `use_compressed_mem`.
    #[serde(default = "four_usize")]
    pub compressed_mem_factor: usize,
}

fn four_usize() -> usize {
    4
}
fn max_seq_len() -> usize {
    1024
}
fn block_width() -> usize {
    512
}
fn minus_hundred() -> i64 {
    -100
}

impl BlockRecurrentPeerConfig {
    /// The recurrent (writing) layer and the layer reading its state, 1-based.
    pub fn layers(&self) -> Result<(usize, usize), ImportError> {
        let write = self
            .recurrent_layers
            .clone()
            .unwrap_or_else(|| vec![self.depth / 2]);
        let read = self
            .read_recurrent_layers
            .clone()
            .unwrap_or_else(|| write.clone());
        let [w] = write[..] else {
            return Err(ImportError::Unsupported(format!(
                "recurrent_layers = {write:?}: memzoo's Block-Recurrent stack has one recurrent \
                 layer"
            )));
        };
        let [r] = read[..] else {
            return Err(ImportError::Unsupported(format!(
                "read_recurrent_layers = {read:?}: one read layer per recurrent layer"
            )));
        };
        if w == 0 || w > self.depth || r == 0 || r > w {
            return Err(ImportError::Unsupported(format!(
                "recurrent_layers = [{w}], read_recurrent_layers = [{r}]: need 1 <= read <= \
                 write <= depth ({})",
                self.depth
            )));
        }
        Ok((w, r))
    }

    /// The memzoo stack that computes the package's model.
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        mapping::expressible(
            &[
                (self.use_compressed_mem, "use_compressed_mem = true"),
                (
                    self.block_width == 0 || !self.max_seq_len.is_multiple_of(self.block_width),
                    "max_seq_len not a positive multiple of block_width",
                ),
            ],
            "memzoo's Block-Recurrent stack",
        )?;
        let (write, read) = self.layers()?;
        let d_inner = ff_width(self.dim, self.ff_mult);
        if d_inner == 0 {
            return Err(ImportError::Unsupported(format!(
                "ff_mult = {} gives a feed-forward of width 0",
                self.ff_mult
            )));
        }
        let recurrent = BlockRecurrentConfig::new()
            .with_state_len(self.num_state_vectors.unwrap_or(self.block_width))
            .with_layer(write - 1)
            .with_read_layer((read != write).then_some(read - 1))
            .with_gate(GateKind::Fixed)
            .with_state_ff(false)
            .with_bptt_segments(self.max_seq_len / self.block_width)
            .with_initial_std(INITIAL_STD);
        let config = XlConfig::new()
            .with_vocab_size(self.num_tokens)
            .with_d_model(self.dim)
            .with_n_layers(self.depth)
            .with_n_heads(self.heads)
            .with_d_head(Some(self.dim_head))
            .with_kv_heads(Some(1))
            .with_d_inner(d_inner)
            .with_dropout(0.0)
            .with_dropatt(0.0)
            .with_final_dropout(false)
            .with_mem_len(self.block_width)
            .with_pre_ln(true)
            .with_norm(NormKind::Layer)
            .with_norm_gain_std(Some(0.0))
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_ff_activation(Activation::Geglu)
            .with_layers(vec![LayerKind::Rotary; self.depth])
            .with_positions(
                PositionConfig::new()
                    .with_kind(PositionKind::Rotary)
                    .with_xpos_scale_base(Some(XPOS_SCALE_BASE))
                    .with_rotary_width(Some(2 * self.block_width)),
            )
            .with_qk_norm(Some(
                QkNormConfig::new()
                    .with_all_layers(self.all_layers_qk_rmsnorm)
                    .with_scale(qk_scale(self.dim_head)),
            ))
            .with_compat(
                PeerCompat::new()
                    .with_ff_bias(false)
                    .with_norm_bias(false)
                    .with_output_bias(false)
                    .with_memory_keys_values(true),
            )
            .with_block_recurrent(Some(recurrent));
        config.validate()?;
        Ok(config)
    }

    /// The package's config of a memzoo stack; the error names the first field the package
    /// cannot express.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let Some(rec) = &xl.block_recurrent else {
            return Err(ImportError::Unsupported(
                "block_recurrent = none: lucidrains-block-recurrent needs a Block-Recurrent stack"
                    .into(),
            ));
        };
        let c = &xl.compat;
        let p = &xl.positions;
        let qk = xl.qk_norm.as_ref();
        mapping::expressible(
            &[
                (
                    rec.gate != GateKind::Fixed,
                    "block_recurrent.gate = \"lstm\"",
                ),
                (rec.state_ff, "block_recurrent.state_ff = true"),
                (rec.memory_replay, "block_recurrent.memory_replay = true"),
                (!xl.pre_ln, "pre_ln = false"),
                (!c.final_norm, "compat.final_norm = false"),
                (xl.norm != NormKind::Layer, "norm other than layer"),
                (c.norm_bias, "compat.norm_bias = true"),
                (c.output_bias, "compat.output_bias = true"),
                (c.ff_bias, "compat.ff_bias = true"),
                (!c.memory_keys_values, "compat.memory_keys_values = false"),
                (
                    c.attention_output_bias || c.value_output_bias,
                    "attention biases",
                ),
                (
                    xl.layer_norm_epsilon != 1e-5,
                    "layer_norm_epsilon other than 1e-5",
                ),
                (xl.tie_weights, "tie_weights = true"),
                (xl.scale_embedding, "scale_embedding = true"),
                (xl.is_adaptive(), "an adaptive embedding"),
                (
                    xl.layer_kinds().iter().any(|k| *k != LayerKind::Rotary),
                    "layers other than `rotary`",
                ),
                (
                    p.xpos_scale_base != Some(XPOS_SCALE_BASE) || p.rotary_theta != 10000.0,
                    "rotary positions other than xPos with scale base 512 and theta 10000",
                ),
                (
                    p.rotary_width != Some(2 * xl.mem_len),
                    "positions.rotary_width other than 2 mem_len",
                ),
                (
                    qk.is_none_or(|q| q.scale != qk_scale(xl.head_width())),
                    "qk_norm other than scale 1/sqrt(d_head)",
                ),
                (
                    xl.ff_activation != Activation::Geglu,
                    "ff_activation other than geglu",
                ),
                (xl.kv_heads != Some(1), "kv_heads other than 1"),
                (xl.mem_len == 0, "mem_len = 0"),
                (
                    xl.dropout != 0.0 || xl.dropatt != 0.0,
                    "dropout or dropatt above 0",
                ),
                (
                    xl.residual_streams != 1 || xl.compressive.is_some() || xl.rmt.is_some(),
                    "residual streams, a compressive or an RMT stack",
                ),
                (
                    c.null_key_value || c.value_residual || xl.learned_positions.is_some(),
                    "recurrent-memory-transformer-pytorch's layer options",
                ),
            ],
            "block-recurrent-transformer-pytorch",
        )?;
        // An integer multiplier where one gives `d_inner`, else one just above it.
        let ff_mult = (1..=64)
            .map(f64::from)
            .find(|&m| ff_width(xl.d_model, m) == xl.d_inner)
            .unwrap_or((xl.d_inner as f64 + 0.5) * 3.0 / (2.0 * xl.d_model as f64));
        let block = xl.mem_len;
        let read = rec.read_layer.unwrap_or(rec.layer) + 1;
        Ok(Self {
            num_tokens: xl.vocab_size,
            dim: xl.d_model,
            depth: xl.n_layers,
            dim_head: xl.head_width(),
            heads: xl.n_heads,
            all_layers_qk_rmsnorm: qk.is_some_and(|q| q.all_layers),
            ff_mult,
            max_seq_len: block * rec.bptt_segments,
            block_width: block,
            recurrent_layers: Some(vec![rec.layer + 1]),
            read_recurrent_layers: Some(vec![read]),
            num_state_vectors: Some(rec.state_len),
            ignore_index: -100,
            use_flash_attn: false,
            use_compressed_mem: false,
            compressed_mem_factor: 4,
        })
    }
}

/// The package's checkpoint layout (`memzoo import --from lucidrains-block-recurrent`).
pub struct LucidrainsBlockRecurrent;

fn unsupported(m: &str) -> ImportError {
    ImportError::Unsupported(m.to_string())
}

/// Rows of `to_state_out`'s input in memzoo's order `[self ; cross]` (heads of `dh` each),
/// as rows of the package's per-head `[self_h ; cross_h]`: memzoo row `r` is package row
/// `index[r]`.
fn state_out_rows(heads: usize, dh: usize) -> Vec<i64> {
    let mut index = Vec::with_capacity(2 * heads * dh);
    for part in 0..2 {
        for h in 0..heads {
            for e in 0..dh {
                index.push((h * 2 * dh + part * dh + e) as i64);
            }
        }
    }
    index
}

/// The inverse permutation of [`state_out_rows`].
fn inverse(index: &[i64]) -> Vec<i64> {
    let mut inv = vec![0; index.len()];
    for (r, &p) in index.iter().enumerate() {
        inv[p as usize] = r as i64;
    }
    inv
}

fn select_rows(t: Tensor<2>, rows: &[i64]) -> Tensor<2> {
    let device = t.device();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(rows.to_vec(), [rows.len()]), &device);
    t.select(0, idx)
}

/// Takes the package's bias-free LayerNorm `{prefix}.gamma` (its `.beta` buffer must be zero).
fn take_gain(
    map: &mut TensorMap,
    prefix: &str,
    gamma: &mut Param<Tensor<1>>,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::param(map, &format!("{prefix}.gamma"), gamma, device)?;
    let name = format!("{prefix}.beta");
    let beta = map.float(&name, gamma.dims(), device)?;
    let largest = beta.abs().max().into_scalar::<f32>();
    if largest != 0.0 {
        return Err(ImportError::Value {
            name,
            message: format!(
                "the bias-free LayerNorm's beta buffer must be zero, its largest |value| is \
                 {largest}"
            ),
        });
    }
    Ok(())
}

fn take_norm(
    map: &mut TensorMap,
    prefix: &str,
    norm: &mut Norm,
    device: &Device,
) -> Result<(), ImportError> {
    take_gain(map, prefix, &mut norm.gamma, device)
}

fn take_layer_norm(
    map: &mut TensorMap,
    prefix: &str,
    norm: &mut LayerNorm,
    device: &Device,
) -> Result<(), ImportError> {
    take_gain(map, prefix, &mut norm.gamma, device)
}

fn take_qk(
    map: &mut TensorMap,
    prefix: &str,
    norm: Option<&mut QkNorm>,
    device: &Device,
) -> Result<(), ImportError> {
    let norm = norm.ok_or_else(|| unsupported("the layer has qk-RMSNorm"))?;
    mapping::param(map, &format!("{prefix}.q_scale"), &mut norm.query, device)?;
    mapping::param(map, &format!("{prefix}.k_scale"), &mut norm.key, device)
}

/// `{prefix}.gamma` and its zero `.beta` (values; a gradient of the gain alone).
fn put_gain(out: &mut PeerTensors, prefix: &str, gamma: &Param<Tensor<1>>, src: Source<'_>) {
    let g = src.get(gamma);
    if matches!(src, Source::Values)
        && let Some(g) = &g
    {
        mapping::put(out, format!("{prefix}.beta"), Some(g.zeros_like()));
    }
    mapping::put(out, format!("{prefix}.gamma"), g);
}

fn put_qk(out: &mut PeerTensors, prefix: &str, norm: &Option<QkNorm>, src: Source<'_>) {
    if let Some(n) = norm {
        mapping::put(out, format!("{prefix}.q_scale"), src.get(&n.query));
        mapping::put(out, format!("{prefix}.k_scale"), src.get(&n.key));
    }
}

impl PeerFormat for LucidrainsBlockRecurrent {
    type Config = BlockRecurrentPeerConfig;
    const NAME: &'static str = "lucidrains-block-recurrent";

    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, &["model.safetensors"], "BlockRecurrentTransformer")
    }

    fn read_config(
        &self,
        at: &Located,
        tensors: &TensorMap,
    ) -> Result<BlockRecurrentPeerConfig, ImportError> {
        let cfg: BlockRecurrentPeerConfig = mapping::read_json(&at.beside("config.json"))?;
        // The feed-forward's width, as the weights have it.
        if let Some(t) = tensors.get("layers.0.1.3.weight") {
            let want = [cfg.dim, ff_width(cfg.dim, cfg.ff_mult)];
            if t.shape().as_slice() != want.as_slice() {
                return Err(ImportError::Shape {
                    name: "layers.0.1.3.weight".into(),
                    found: t.shape().to_vec(),
                    expected: want.to_vec(),
                });
            }
        }
        Ok(cfg)
    }

    fn stack(
        &self,
        config: &BlockRecurrentPeerConfig,
        _: &Located,
    ) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn map_in(
        &self,
        _: &BlockRecurrentPeerConfig,
        _: &Located,
        map: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        let InputEmbedding::Plain(emb) = &mut model.embedding else {
            return Err(unsupported(
                "the Block-Recurrent stack has a plain embedding",
            ));
        };
        mapping::embedding(map, "token_emb.weight", emb, device)?;
        let rec = model
            .block_recurrent
            .as_mut()
            .ok_or_else(|| unsupported("the stack is not a Block-Recurrent Transformer"))?;
        let (write, read) = (
            rec.config.layer,
            rec.config.read_layer.unwrap_or(rec.config.layer),
        );
        for (l, layer) in model.layers.iter_mut().enumerate() {
            let p = format!("layers.{l}.0");
            let a = layer
                .attention
                .relative_mut()
                .ok_or_else(|| unsupported("the Block-Recurrent stack's layers are rotary"))?;
            take_norm(
                map,
                &format!("{p}.norm"),
                &mut layer.block.norm_attention,
                device,
            )?;
            mapping::linear(map, &format!("{p}.to_q"), &mut a.query, false, device)?;
            mapping::linear(map, &format!("{p}.to_kv"), &mut a.key_value, false, device)?;
            // to_out reads [self-attention ; the state's read] in the reading layer.
            let inner = a.n_heads * a.d_head;
            let reads = usize::from(l == read);
            let name = format!("{p}.to_out.weight");
            let w = map
                .float(&name, [a.d_model, inner * (1 + reads)], device)?
                .transpose();
            mapping::set(&mut a.output.weight, w.clone().narrow(0, 0, inner), &name)?;
            if reads == 1 {
                mapping::set(
                    &mut rec.to_state_output.weight,
                    w.narrow(0, inner, inner),
                    &name,
                )?;
            }
            if a.qk_norm.is_some() {
                take_qk(map, &format!("{p}.attn"), a.qk_norm.as_mut(), device)?;
            }
            if l == write {
                take_state(map, &format!("{p}.state_container"), rec, device)?;
            }
            let b = &mut layer.block;
            take_norm(map, &format!("layers.{l}.1.0"), &mut b.norm_ff, device)?;
            mapping::linear(map, &format!("layers.{l}.1.1"), &mut b.ff_in, false, device)?;
            mapping::linear(
                map,
                &format!("layers.{l}.1.3"),
                &mut b.ff_out,
                false,
                device,
            )?;
        }
        let norm = model
            .final_norm
            .as_mut()
            .ok_or_else(|| unsupported("the Block-Recurrent stack has a final norm"))?;
        take_norm(map, "to_logits.0", norm, device)?;
        match &mut model.output {
            OutputLayer::Linear(out) => mapping::linear(map, "to_logits.1", out, false, device),
            _ => Err(unsupported("the Block-Recurrent stack has a linear output")),
        }
    }

    fn config_of(&self, stack: &XlConfig) -> Result<BlockRecurrentPeerConfig, ImportError> {
        BlockRecurrentPeerConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(block_recurrent_to_peer(model, src))
    }
}

/// The state container `c` (`{c}.init_state`, ...) into `rec`.
fn take_state(
    map: &mut TensorMap,
    c: &str,
    rec: &mut BlockRecurrent,
    device: &Device,
) -> Result<(), ImportError> {
    let n = |s: &str| format!("{c}.{s}");
    mapping::param(map, &n("init_state"), &mut rec.initial, device)?;
    mapping::param(map, &n("state_pos_ids"), &mut rec.state_ids, device)?;
    take_layer_norm(map, &n("state_norm"), &mut rec.state_norm, device)?;
    mapping::linear(
        map,
        &n("q_to_state"),
        &mut rec.to_state_query,
        false,
        device,
    )?;
    mapping::linear(
        map,
        &n("q_from_state"),
        &mut rec.from_state_query,
        false,
        device,
    )?;
    mapping::linear(map, &n("state_to_q"), &mut rec.state_query, false, device)?;
    mapping::linear(
        map,
        &n("state_to_kv"),
        &mut rec.state_key_value,
        false,
        device,
    )?;
    let name = n("to_state_out.weight");
    let (h, dh) = (rec.n_heads, rec.d_head);
    let d = rec.initial.dims()[1];
    let w = map.float(&name, [d, 2 * h * dh], device)?.transpose();
    mapping::set(
        &mut rec.state_output.weight,
        select_rows(w, &state_out_rows(h, dh)),
        &name,
    )?;
    mapping::linear(
        map,
        &n("state_out_to_gate"),
        &mut rec.attention_gate.candidate,
        true,
        device,
    )?;
    // The learned EMA `σ(β) z + (1 − σ(β)) c` is the fixed gate with b_g = −β.
    let name = n("learned_ema_beta");
    let beta = map.float(&name, [d], device)?;
    let bias = rec
        .attention_gate
        .bias
        .as_mut()
        .ok_or_else(|| unsupported("the state's gate is fixed"))?;
    mapping::set(bias, beta.neg(), &name)?;
    take_qk(
        map,
        &n("to_state_cross_attn"),
        rec.read_qk_norm.as_mut(),
        device,
    )?;
    take_qk(
        map,
        &n("state_self_attn"),
        rec.self_qk_norm.as_mut(),
        device,
    )?;
    take_qk(
        map,
        &n("from_state_cross_attn"),
        rec.cross_qk_norm.as_mut(),
        device,
    )
}

/// The model's values or gradients under the package's names (the inverse of the import).
pub fn block_recurrent_to_peer(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    if let Some(e) = model.embedding.plain() {
        mapping::put(&mut out, "token_emb.weight".into(), src.get(&e.weight));
    }
    let Some(rec) = &model.block_recurrent else {
        return out;
    };
    let (write, read) = (
        rec.config.layer,
        rec.config.read_layer.unwrap_or(rec.config.layer),
    );
    for (l, layer) in model.layers.iter().enumerate() {
        let p = format!("layers.{l}.0");
        put_gain(
            &mut out,
            &format!("{p}.norm"),
            &layer.block.norm_attention.gamma,
            src,
        );
        if let Some(a) = layer.attention.relative() {
            mapping::put_linear(&mut out, &format!("{p}.to_q"), &a.query, src);
            mapping::put_linear(&mut out, &format!("{p}.to_kv"), &a.key_value, src);
            let own = src.get(&a.output.weight);
            let to_out = match (l == read, own) {
                (true, Some(own)) => src
                    .get(&rec.to_state_output.weight)
                    .map(|r| Tensor::cat(vec![own, r], 0)),
                (_, own) => own,
            };
            mapping::put(
                &mut out,
                format!("{p}.to_out.weight"),
                to_out.map(|w| w.transpose()),
            );
            put_qk(&mut out, &format!("{p}.attn"), &a.qk_norm, src);
        }
        if l == write {
            put_state(&mut out, &format!("{p}.state_container"), rec, src);
        }
        let b = &layer.block;
        put_gain(&mut out, &format!("layers.{l}.1.0"), &b.norm_ff.gamma, src);
        mapping::put_linear(&mut out, &format!("layers.{l}.1.1"), &b.ff_in, src);
        mapping::put_linear(&mut out, &format!("layers.{l}.1.3"), &b.ff_out, src);
    }
    if let Some(n) = &model.final_norm {
        put_gain(&mut out, "to_logits.0", &n.gamma, src);
    }
    if let OutputLayer::Linear(o) = &model.output {
        mapping::put_linear(&mut out, "to_logits.1", o, src);
    }
    out
}

/// The state container under the package's names `{c}.*`.
fn put_state(out: &mut PeerTensors, c: &str, rec: &BlockRecurrent, src: Source<'_>) {
    let n = |s: &str| format!("{c}.{s}");
    mapping::put(out, n("init_state"), src.get(&rec.initial));
    mapping::put(out, n("state_pos_ids"), src.get(&rec.state_ids));
    put_gain(out, &n("state_norm"), &rec.state_norm.gamma, src);
    mapping::put_linear(out, &n("q_to_state"), &rec.to_state_query, src);
    mapping::put_linear(out, &n("q_from_state"), &rec.from_state_query, src);
    mapping::put_linear(out, &n("state_to_q"), &rec.state_query, src);
    mapping::put_linear(out, &n("state_to_kv"), &rec.state_key_value, src);
    let rows = inverse(&state_out_rows(rec.n_heads, rec.d_head));
    mapping::put(
        out,
        n("to_state_out.weight"),
        src.get(&rec.state_output.weight)
            .map(|w| select_rows(w, &rows).transpose()),
    );
    mapping::put_linear(
        out,
        &n("state_out_to_gate"),
        &rec.attention_gate.candidate,
        src,
    );
    if let Some(b) = &rec.attention_gate.bias {
        mapping::put(out, n("learned_ema_beta"), src.get(b).map(|b| b.neg()));
    }
    put_qk(out, &n("to_state_cross_attn"), &rec.read_qk_norm, src);
    put_qk(out, &n("state_self_attn"), &rec.self_qk_norm, src);
    put_qk(out, &n("from_state_cross_attn"), &rec.cross_qk_norm, src);
}

/// Loads a `BlockRecurrentTransformer` checkpoint (a directory with `model.safetensors` and
/// `config.json`); every tensor is used. Returns the package's config too.
pub fn load(
    src: &Path,
    device: &Device,
) -> Result<(TransformerXl, BlockRecurrentPeerConfig), ImportError> {
    let imported = crate::format::import(&LucidrainsBlockRecurrent, src, device)?;
    Ok((imported.model, imported.peer))
}

//! recurrent-memory-transformer-pytorch (lucidrains, 0.7.0) checkpoints in memzoo.
//!
//! The checkpoint is the `state_dict` of its `RecurrentMemoryTransformer` as
//! `model.safetensors`, with a `config.json` of the constructor's arguments (and the wrapper's
//! `truncate_at_step`; the weights give the sizes, and must agree).
//!
//! The package's model, and what it is in memzoo's stack ([`TransformerXl`] with
//! [`RmtConfig`]):
//! - the memory layout: `m` read tokens (the carried memory plus `read_memory_emb`; the first
//!   segment reads `read_memory_emb` alone), the segment, `m` write tokens (`memory_tokens`),
//!   the written memory taken after the final norm, the read and write tokens seeing each
//!   other (`memory_not_causal`): `rmt.peer_layout = true`, `rmt.causal_memory = false`;
//!   the wrapper's `truncate_at_step` is `rmt.bptt_segments`;
//! - learned absolute positions of the segment's tokens, `pos_emb` (`seq_len` rows;
//!   `learned_positions`, `absolute` layers), an unscaled embedding whose gradient is scaled
//!   by `emb_gradient_frac` (`compat.embedding_gradient_scale`);
//! - pre-norm blocks of RMSNorm (`norm = "rms"`, PyTorch's `eps`: float32's machine epsilon)
//!   and a final RMSNorm; bias-free projections; attention with a learned null key and value
//!   per head (`compat.null_key_value`) and, in every layer but the first, the first layer's
//!   values mixed in by a learned sigmoid gate per head (`compat.value_residual`); a GEGLU
//!   feed-forward of width `int(dim · ff_mult · 2 / 3)` without biases
//!   (`ff_activation = "geglu"`, `d_inner` written out, `compat.ff_bias = false`); its
//!   hyper-connections (`num_residual_streams`, 4 by default: `residual_streams`, see
//!   [`HyperConnection`]; with 1 the hyper-connections package's plain `x + f(x)`); an untied
//!   head with a bias.
//!
//! - its dropout: `ff_dropout` between the feed-forward's layers only (memzoo's `dropout` with
//!   `ff_output_dropout`, `attention_output_dropout` and `embedding_dropout` off), and
//!   `attn_dropout` on the attention probabilities (`dropatt`).
//!
//! Not the same, and why:
//! - refused by name: `use_xl_memories = true` (memzoo's RMT reads no XL memory; the package's
//!   wrapper only reads its XL memories in `generate` and memory-replay backpropagation),
//!   `rotary_pos_emb`, `abs_pos_emb = false`, `memory_not_causal = false` (the package's
//!   causal path fails on the null key's extra column, or with flash attention hides each
//!   token from itself), `add_write_to_next_write_mem`,
//!   `always_have_read_memories = false`, `causal = false`; the package's loss ignores targets
//!   equal to `ignore_index`, memzoo's does not;
//! - export writes the package's `config.json` and `model.safetensors` of a stack it can
//!   express ([`RmtPeerConfig::from_xl`] names the first field it cannot).
//!
//! | package (`l` a layer, 0-based) | memzoo |
//! |---|---|
//! | `token_emb.weight` `[V, d]`, `pos_emb.weight` `[seq_len, d]` | the plain embedding, `position_embedding` |
//! | `read_memory_emb`, `memory_tokens` `[m, d]` | `rmt.read_embedding`, `rmt.memory` |
//! | `layers.l.0.branch.norm.weight` | `block.norm_attention` |
//! | `layers.l.0.branch.to_q.weight`, `.to_kv.weight`, `.to_out.weight` | `attention.query`, `.key_value`, `.output` (transposed) |
//! | `layers.l.0.branch.null_kv` `[2, h, dh]` | `attention.peer.null_kv` |
//! | `layers.l.0.branch.learned_value_residual_mix.0.weight` `[h, d]` | `attention.peer.value_gate` (`l > 0`) |
//! | `layers.l.1.branch.0.weight`, `.1.weight`, `.4.weight` | `block.norm_ff`, `block.ff_in`, `block.ff_out` |
//! | `layers.l.b.static_alpha`, `.dynamic_alpha_fn`, `.dynamic_alpha_scale` `[]`, `.static_beta`, `.dynamic_beta_fn`, `.dynamic_beta_scale` `[]`, `.norm.gamma` (`b` 0: attention, 1: feed-forward) | `block.hyper_attention`, `block.hyper_ff` (scales `[1]`) |
//! | `norm.weight`, `to_logits.weight`, `.bias` | the final norm, the linear output |

use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::{
    Activation, HyperConnection, InputEmbedding, LayerKind, NormKind, OutputLayer, PeerCompat,
    RmtConfig, TransformerXl, XlConfig,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source};
use crate::reader::TensorMap;

/// PyTorch's `nn.RMSNorm(dim)` epsilon (`eps=None`): float32's machine epsilon.
pub const RMS_EPS: f64 = f32::EPSILON as f64;

/// The constructor arguments of the package's `RecurrentMemoryTransformer` (`config.json`),
/// with the wrapper's `truncate_at_step`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RmtPeerConfig {
    /// Model width.
    pub dim: usize,
    /// Vocabulary size.
    pub num_tokens: usize,
    /// Layers.
    pub depth: usize,
    /// Memory tokens `m`.
    pub num_memory_tokens: usize,
    /// Segment length (rows of `pos_emb`).
    pub seq_len: usize,
    /// Width of each head.
    #[serde(default = "crate::mapping::defaults::dim_head")]
    pub dim_head: usize,
    /// Heads.
    #[serde(default = "crate::mapping::defaults::heads")]
    pub heads: usize,
    /// The feed-forward's multiplier: its width is `int(dim · ff_mult · 2 / 3)`.
    #[serde(default = "crate::mapping::defaults::ff_mult")]
    pub ff_mult: f64,
    /// Dropout on the attention probabilities.
    #[serde(default)]
    pub attn_dropout: f64,
    /// Dropout inside the feed-forward.
    #[serde(default)]
    pub ff_dropout: f64,
    /// Must be true (memzoo's causal language model).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub causal: bool,
    /// Must be true (learned absolute positions).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub abs_pos_emb: bool,
    /// Must be false.
    #[serde(default)]
    pub rotary_pos_emb: bool,
    /// Must be false (memzoo's RMT reads no XL memory).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub use_xl_memories: bool,
    /// Unused without XL memories.
    #[serde(default)]
    pub xl_mem_len: Option<usize>,
    /// Unused without XL memories.
    #[serde(default)]
    pub enhanced_xl_recurrence: bool,
    /// The factor of the embedding's gradient.
    #[serde(default = "tenth")]
    pub emb_gradient_frac: f64,
    /// Must be true (the read and write tokens see each other).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub memory_not_causal: bool,
    /// Must be false.
    #[serde(default)]
    pub add_write_to_next_write_mem: bool,
    /// Unused without `add_write_to_next_write_mem`.
    #[serde(default = "crate::mapping::defaults::yes")]
    pub next_write_mem_stop_grad: bool,
    /// Must be true (the first segment reads `read_memory_emb`).
    #[serde(default = "crate::mapping::defaults::yes")]
    pub always_have_read_memories: bool,
    /// Residual streams of its hyper-connections (1: plain residuals).
    #[serde(default = "four_streams")]
    pub num_residual_streams: usize,
    /// Flash attention (the same function).
    #[serde(default)]
    pub use_flash_attn: bool,
    /// The loss's ignored target (memzoo ignores none).
    #[serde(default = "minus_one")]
    pub ignore_index: i64,
    /// The wrapper's segments between detaches of the memory (`None`: memzoo's default
    /// `bptt_segments`, 2).
    #[serde(default)]
    pub truncate_at_step: Option<usize>,
}

fn four_streams() -> usize {
    4
}
fn tenth() -> f64 {
    0.1
}
fn minus_one() -> i64 {
    -1
}

/// The package's feed-forward width, `int(dim · mult · 2 / 3)` as Python computes it.
pub fn ff_width(dim: usize, mult: f64) -> usize {
    (dim as f64 * mult * 2.0 / 3.0) as usize
}

impl RmtPeerConfig {
    /// The memzoo stack that computes the package's model.
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        mapping::expressible(
            &[
                (self.use_xl_memories, "use_xl_memories = true"),
                (self.num_residual_streams == 0, "num_residual_streams = 0"),
                (self.rotary_pos_emb, "rotary_pos_emb = true"),
                (!self.abs_pos_emb, "abs_pos_emb = false"),
                (!self.causal, "causal = false"),
                (!self.memory_not_causal, "memory_not_causal = false"),
                (
                    self.add_write_to_next_write_mem,
                    "add_write_to_next_write_mem = true",
                ),
                (
                    !self.always_have_read_memories,
                    "always_have_read_memories = false",
                ),
            ],
            "memzoo's RMT stack",
        )?;
        let d_inner = ff_width(self.dim, self.ff_mult);
        if d_inner == 0 || self.truncate_at_step == Some(0) {
            return Err(ImportError::Unsupported(format!(
                "ff_mult = {} gives a feed-forward of width {d_inner}, truncate_at_step = {:?}: \
                 both must be positive",
                self.ff_mult, self.truncate_at_step
            )));
        }
        let rmt = RmtConfig::new()
            .with_mem_tokens(self.num_memory_tokens)
            .with_peer_layout(true)
            .with_causal_memory(false);
        let rmt = match self.truncate_at_step {
            Some(k) => rmt.with_bptt_segments(k),
            None => rmt,
        };
        let config = XlConfig::new()
            .with_vocab_size(self.num_tokens)
            .with_d_model(self.dim)
            .with_n_layers(self.depth)
            .with_n_heads(self.heads)
            .with_d_head(Some(self.dim_head))
            .with_d_inner(d_inner)
            // The package's `ff_dropout` sits between the feed-forward's layers only.
            .with_dropout(self.ff_dropout)
            .with_embedding_dropout(false)
            .with_attention_output_dropout(false)
            .with_ff_output_dropout(false)
            .with_dropatt(self.attn_dropout)
            .with_final_dropout(false)
            .with_mem_len(0)
            .with_pre_ln(true)
            .with_residual_streams(self.num_residual_streams)
            .with_norm(NormKind::Rms)
            .with_layer_norm_epsilon(RMS_EPS)
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_ff_activation(Activation::Geglu)
            .with_layers(vec![LayerKind::Absolute; self.depth])
            .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute))
            .with_learned_positions(Some(self.seq_len))
            .with_compat(
                PeerCompat::new()
                    .with_ff_bias(false)
                    .with_null_key_value(true)
                    .with_value_residual(self.depth > 1)
                    .with_embedding_gradient_scale(self.emb_gradient_frac),
            )
            .with_rmt(Some(rmt));
        config.validate()?;
        Ok(config)
    }

    /// The package's config of a memzoo stack; the error names the first field the package
    /// cannot express.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let Some(rmt) = &xl.rmt else {
            return Err(ImportError::Unsupported(
                "rmt = none: lucidrains-rmt needs an RMT stack".into(),
            ));
        };
        let c = &xl.compat;
        let kinds = xl.layer_kinds();
        mapping::expressible(
            &[
                (!rmt.peer_layout, "rmt.peer_layout = false"),
                (rmt.causal_memory, "rmt.causal_memory = true"),
                (!xl.pre_ln, "pre_ln = false"),
                (!c.final_norm, "compat.final_norm = false"),
                (xl.norm != NormKind::Rms, "norm other than rms"),
                (
                    xl.layer_norm_epsilon != RMS_EPS,
                    "layer_norm_epsilon other than float32's epsilon (PyTorch's RMSNorm)",
                ),
                (xl.tie_weights, "tie_weights = true"),
                (xl.scale_embedding, "scale_embedding = true"),
                (xl.is_adaptive(), "an adaptive embedding"),
                (
                    kinds.iter().any(|k| *k != LayerKind::Absolute),
                    "layers other than `absolute`",
                ),
                (
                    xl.learned_positions.is_none(),
                    "learned_positions = none (sinusoids)",
                ),
                (
                    xl.ff_activation != Activation::Geglu,
                    "ff_activation other than geglu",
                ),
                (c.ff_bias, "compat.ff_bias = true"),
                (!c.null_key_value, "compat.null_key_value = false"),
                (
                    c.value_residual != (xl.n_layers > 1),
                    "compat.value_residual other than on (with 2 layers or more)",
                ),
                (
                    c.attention_output_bias || c.value_output_bias,
                    "attention biases",
                ),
                (
                    xl.kv_heads.is_some_and(|h| h != xl.n_heads),
                    "kv_heads other than n_heads",
                ),
                (xl.final_dropout, "final_dropout = true"),
            ],
            "recurrent-memory-transformer-pytorch",
        )?;
        // An integer multiplier where one gives `d_inner`, else one just above it.
        let ff_mult = (1..=64)
            .map(f64::from)
            .find(|&m| ff_width(xl.d_model, m) == xl.d_inner)
            .unwrap_or((xl.d_inner as f64 + 0.5) * 3.0 / (2.0 * xl.d_model as f64));
        Ok(Self {
            dim: xl.d_model,
            num_tokens: xl.vocab_size,
            depth: xl.n_layers,
            num_memory_tokens: rmt.mem_tokens,
            seq_len: xl.learned_positions.unwrap_or(0),
            dim_head: xl.head_width(),
            heads: xl.n_heads,
            ff_mult,
            attn_dropout: xl.dropatt,
            ff_dropout: xl.dropout,
            causal: true,
            abs_pos_emb: true,
            rotary_pos_emb: false,
            use_xl_memories: false,
            xl_mem_len: None,
            enhanced_xl_recurrence: false,
            emb_gradient_frac: c.embedding_gradient_scale,
            memory_not_causal: true,
            add_write_to_next_write_mem: false,
            next_write_mem_stop_grad: true,
            always_have_read_memories: true,
            num_residual_streams: xl.residual_streams,
            use_flash_attn: false,
            ignore_index: -1,
            truncate_at_step: Some(rmt.bptt_segments),
        })
    }
}

/// The package's checkpoint layout (`memzoo import --from lucidrains-rmt`).
pub struct LucidrainsRmt;

fn block_names(l: usize) -> BlockNames {
    BlockNames {
        norm_attention: format!("layers.{l}.0.branch.norm"),
        norm_ff: format!("layers.{l}.1.branch.0"),
        ff_in: format!("layers.{l}.1.branch.1"),
        ff_out: format!("layers.{l}.1.branch.4"),
    }
}

fn unsupported(m: &str) -> ImportError {
    ImportError::Unsupported(m.to_string())
}

impl PeerFormat for LucidrainsRmt {
    type Config = RmtPeerConfig;
    const NAME: &'static str = "lucidrains-rmt";

    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, &["model.safetensors"], "RecurrentMemoryTransformer")
    }

    fn read_config(&self, at: &Located, tensors: &TensorMap) -> Result<RmtPeerConfig, ImportError> {
        let cfg: RmtPeerConfig = mapping::read_json(&at.beside("config.json"))?;
        // The feed-forward's width, as the weights have it.
        if let Some(t) = tensors.get("layers.0.1.branch.4.weight") {
            let want = [cfg.dim, ff_width(cfg.dim, cfg.ff_mult)];
            if t.shape().as_slice() != want.as_slice() {
                return Err(ImportError::Shape {
                    name: "layers.0.1.branch.4.weight".into(),
                    found: t.shape().to_vec(),
                    expected: want.to_vec(),
                });
            }
        }
        Ok(cfg)
    }

    fn stack(&self, config: &RmtPeerConfig, _: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn map_in(
        &self,
        _: &RmtPeerConfig,
        _: &Located,
        map: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        let InputEmbedding::Plain(emb) = &mut model.embedding else {
            return Err(unsupported("the RMT stack has a plain embedding"));
        };
        mapping::embedding(map, "token_emb.weight", emb, device)?;
        let pos = model
            .position_embedding
            .as_mut()
            .ok_or_else(|| unsupported("the RMT stack has learned positions"))?;
        mapping::embedding(map, "pos_emb.weight", pos, device)?;
        let rmt = model
            .rmt
            .as_mut()
            .ok_or_else(|| unsupported("the stack is not an RMT"))?;
        mapping::param(map, "memory_tokens", &mut rmt.memory, device)?;
        let read = rmt
            .read_embedding
            .as_mut()
            .ok_or_else(|| unsupported("the RMT stack has the peer layout"))?;
        mapping::param(map, "read_memory_emb", read, device)?;
        for (l, layer) in model.layers.iter_mut().enumerate() {
            let p = format!("layers.{l}.0.branch");
            let a = layer
                .attention
                .relative_mut()
                .ok_or_else(|| unsupported("the RMT stack's layers are absolute"))?;
            mapping::linear(map, &format!("{p}.to_q"), &mut a.query, false, device)?;
            mapping::linear(map, &format!("{p}.to_kv"), &mut a.key_value, false, device)?;
            mapping::linear(map, &format!("{p}.to_out"), &mut a.output, false, device)?;
            let peer = a
                .peer
                .as_mut()
                .ok_or_else(|| unsupported("the RMT stack's layers have a null key/value"))?;
            if let Some(null) = peer.null_kv.as_mut() {
                mapping::param(map, &format!("{p}.null_kv"), null, device)?;
            }
            if let Some(gate) = peer.value_gate.as_mut() {
                let name = format!("{p}.learned_value_residual_mix.0");
                mapping::linear(map, &name, gate, false, device)?;
            }
            block_names(l).take(map, &mut layer.block, device)?;
            let block = &mut layer.block;
            for (branch, hyper) in [(0, &mut block.hyper_attention), (1, &mut block.hyper_ff)] {
                if let Some(hc) = hyper.as_mut() {
                    take_hyper(map, &format!("layers.{l}.{branch}"), hc, device)?;
                }
            }
        }
        let norm = model
            .final_norm
            .as_mut()
            .ok_or_else(|| unsupported("the RMT stack has a final norm"))?;
        mapping::norm(map, "norm", norm, device)?;
        match &mut model.output {
            OutputLayer::Linear(out) => mapping::linear(map, "to_logits", out, true, device),
            _ => Err(unsupported("the RMT stack has a linear output")),
        }
    }

    fn config_of(&self, stack: &XlConfig) -> Result<RmtPeerConfig, ImportError> {
        RmtPeerConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(rmt_to_peer(model, src))
    }
}

/// The model's values or gradients under the package's names (the inverse of the import).
pub fn rmt_to_peer(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    if let Some(e) = model.embedding.plain() {
        mapping::put(&mut out, "token_emb.weight".into(), src.get(&e.weight));
    }
    if let Some(p) = &model.position_embedding {
        mapping::put(&mut out, "pos_emb.weight".into(), src.get(&p.weight));
    }
    if let Some(rmt) = &model.rmt {
        mapping::put(&mut out, "memory_tokens".into(), src.get(&rmt.memory));
        if let Some(r) = &rmt.read_embedding {
            mapping::put(&mut out, "read_memory_emb".into(), src.get(r));
        }
    }
    for (l, layer) in model.layers.iter().enumerate() {
        let p = format!("layers.{l}.0.branch");
        if let Some(a) = layer.attention.relative() {
            mapping::put_linear(&mut out, &format!("{p}.to_q"), &a.query, src);
            mapping::put_linear(&mut out, &format!("{p}.to_kv"), &a.key_value, src);
            mapping::put_linear(&mut out, &format!("{p}.to_out"), &a.output, src);
            if let Some(peer) = &a.peer {
                if let Some(null) = &peer.null_kv {
                    mapping::put(&mut out, format!("{p}.null_kv"), src.get(null));
                }
                if let Some(gate) = &peer.value_gate {
                    let name = format!("{p}.learned_value_residual_mix.0");
                    mapping::put_linear(&mut out, &name, gate, src);
                }
            }
        }
        block_names(l).put(&mut out, &layer.block, src);
        let block = &layer.block;
        for (branch, hyper) in [(0, &block.hyper_attention), (1, &block.hyper_ff)] {
            if let Some(hc) = hyper {
                put_hyper(&mut out, &format!("layers.{l}.{branch}"), hc, src);
            }
        }
    }
    if let Some(n) = &model.final_norm {
        mapping::put_norm(&mut out, "norm", n, src);
    }
    if let OutputLayer::Linear(o) = &model.output {
        mapping::put_linear(&mut out, "to_logits", o, src);
    }
    out
}

/// A branch's hyper-connection (`{prefix}.static_alpha`, `.dynamic_alpha_fn`,
/// `.dynamic_alpha_scale` (a 0-d tensor), `.static_beta`, `.dynamic_beta_fn`,
/// `.dynamic_beta_scale`, `.norm.gamma`) into `hc`.
fn take_hyper(
    map: &mut TensorMap,
    prefix: &str,
    hc: &mut HyperConnection,
    device: &Device,
) -> Result<(), ImportError> {
    let name = |n: &str| format!("{prefix}.{n}");
    mapping::param(map, &name("static_alpha"), &mut hc.static_alpha, device)?;
    mapping::param(
        map,
        &name("dynamic_alpha_fn"),
        &mut hc.dynamic_alpha,
        device,
    )?;
    mapping::param(map, &name("static_beta"), &mut hc.static_beta, device)?;
    mapping::param(map, &name("dynamic_beta_fn"), &mut hc.dynamic_beta, device)?;
    mapping::param(map, &name("norm.gamma"), &mut hc.gamma, device)?;
    for (n, p) in [
        ("dynamic_alpha_scale", &mut hc.dynamic_alpha_scale),
        ("dynamic_beta_scale", &mut hc.dynamic_beta_scale),
    ] {
        // PyTorch's scalar parameter, `[]`; memzoo's `[1]`.
        let n = name(n);
        let data = crate::reader::float_data(&n, map.take(&n, &[])?)?;
        let value = data.try_to_vec::<f32>().map_err(|e| ImportError::Value {
            name: n.clone(),
            message: format!("{e:?}"),
        })?;
        let value = Tensor::from_data(TensorData::new(value, [1]), device);
        mapping::set(p, value, &n)?;
    }
    Ok(())
}

/// `hc` under the package's names (its scales as 0-d tensors).
fn put_hyper(out: &mut PeerTensors, prefix: &str, hc: &HyperConnection, src: Source<'_>) {
    let name = |n: &str| format!("{prefix}.{n}");
    mapping::put(out, name("static_alpha"), src.get(&hc.static_alpha));
    mapping::put(out, name("dynamic_alpha_fn"), src.get(&hc.dynamic_alpha));
    mapping::put(out, name("static_beta"), src.get(&hc.static_beta));
    mapping::put(out, name("dynamic_beta_fn"), src.get(&hc.dynamic_beta));
    mapping::put(out, name("norm.gamma"), src.get(&hc.gamma));
    for (n, p) in [
        ("dynamic_alpha_scale", &hc.dynamic_alpha_scale),
        ("dynamic_beta_scale", &hc.dynamic_beta_scale),
    ] {
        if let Some(t) = src.get(p)
            && let Ok(v) = t.into_data().convert::<f32>().try_to_vec::<f32>()
        {
            out.insert(name(n), TensorData::new(v, Vec::<usize>::new()));
        }
    }
}

/// Loads a `RecurrentMemoryTransformer` checkpoint (a directory with `model.safetensors` and
/// `config.json`); every tensor is used. Returns the package's config too.
pub fn load(src: &Path, device: &Device) -> Result<(TransformerXl, RmtPeerConfig), ImportError> {
    let imported = crate::format::import(&LucidrainsRmt, src, device)?;
    Ok((imported.model, imported.peer))
}

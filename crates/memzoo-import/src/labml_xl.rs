//! labml-nn's Transformer-XL (`labml_nn.transformers.xl`) checkpoints in memzoo.
//!
//! The checkpoint is the `state_dict` of labml's language model (`AutoregressiveModel` of
//! `labml_nn/transformers/xl/experiment.py`: `nn.Embedding` → `TransformerXL` → `generator`),
//! as `model.safetensors` or a `torch.save` file (`model.pth`, `model.pt`, `pytorch_model.bin`;
//! read without running pickle), with an optional `config.json` of labml's `Configs` fields
//! that the weights do not hold (see [`LabmlXlConfig`]).
//!
//! labml's model, and what it is in memzoo's stack ([`TransformerXl`]):
//! - sequence-first tensors (`[seq, batch, d]`); memzoo is batch-first — the same function;
//! - no `sqrt(d_model)` embedding scale (`scale_embedding = false`), an untied `generator` with
//!   a bias (`tie_weights = false`);
//! - pre-LN layers, the memory normalised by the layer's `norm_self_attn` too, and a final
//!   LayerNorm (`pre_ln = true, final_norm = true`); ReLU feed-forward with biases;
//! - attention with no query/key bias but a value and an output bias
//!   (`value_output_bias = true`), `d_k = d_model / heads`;
//! - learned relative positions (labml's `get_scores`): with `d = i - j` the distance of
//!   query `i` to key `j`, `s [ (q_i + b_q)·k_j + q_i·E[P - d] + b_k[P - d] ]` over tables of
//!   `2P` rows (`P = 2^12` in labml), i.e. memzoo's `learned` scheme with
//!   `max_distance = P`, whose table of `2P + 1` rows holds distance `d` in row `P + d`:
//!   memzoo's rows `1..=2P` are labml's rows `2P - 1..=0` (reversed), and its row 0 (distance
//!   `-P`, a key `P` positions in the future, which labml has no row for and no causal model
//!   reads) is zero. labml needs `mem_len + seq_len <= P` (its table slice starts at
//!   `P - klen`); memzoo clamps longer distances to `P`;
//! - memory: every layer's input of the last `mem_len` positions (labml's `merge_memory`),
//!   and no memory before the first segment (`zero_first_memory = false`); causal mask, every
//!   memory position visible (`same_length = false`).
//!
//! Dropout in training differs where labml has none: memzoo also drops the embedding and the
//! final hidden states with `dropout` (labml: attention probabilities, feed-forward hidden,
//! and both residual branches, as memzoo). In evaluation the two are the same function.
//!
//! | labml (`l` a layer) | memzoo |
//! |---|---|
//! | `src_embed.weight` `[V, d]` | the plain embedding |
//! | `transformer.layers.l.self_attn.query.linear.weight` `[d, d]` | `attention.query` (transposed) |
//! | `….self_attn.key.linear.weight`, `….value.linear.weight` | `attention.key_value` (keys then values, transposed) |
//! | `….self_attn.value.linear.bias` | `attention.value_bias` |
//! | `….self_attn.output.weight`, `.bias` | `attention.output` |
//! | `….self_attn.key_pos_embeddings` `[2P, h, d_k]`, `key_pos_bias` `[2P, h]` | `scheme.Learned.embedding` / `key_bias`, reversed, a zero row in front |
//! | `….self_attn.query_pos_bias` `[h, d_k]` | `scheme.Learned.query_bias` |
//! | `….norm_self_attn`, `….norm_ff` | `block.norm_attention`, `block.norm_ff` |
//! | `….feed_forward.layer1`, `….feed_forward.layer2` | `block.ff_in`, `block.ff_out` |
//! | `transformer.norm` | the final norm |
//! | `generator.weight` `[V, d]`, `generator.bias` | the linear output |

use std::path::Path;

use burn::tensor::{Device, Tensor};
use memzoo_relative::{PositionConfig, PositionKind, PositionParams};
use memzoo_stack::{
    InputEmbedding, LayerKind, OutputLayer, PeerCompat, TransformerXl, XlConfig, XlError,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source, put, put_linear, put_norm};
use crate::reader::TensorMap;

/// labml's LayerNorm epsilon (`nn.LayerNorm`'s default).
const EPS: f64 = 1e-5;

/// The weight files looked for in a directory, in this order.
pub const WEIGHT_FILES: &[&str] = &[
    "model.safetensors",
    "model.pth",
    "model.pt",
    "pytorch_model.bin",
];

/// labml's Transformer-XL language model: the shape (read from the tensors) and the fields of
/// labml's `Configs` the weights do not hold. Field names are labml's.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct LabmlXlConfig {
    /// Vocabulary size (`src_embed` rows).
    pub n_tokens: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads (`d_k = d_model / heads`).
    pub heads: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Layers.
    pub n_layers: usize,
    /// Half the relative tables' rows (labml's `RelativeMultiHeadAttention.P`, `2^12`).
    #[serde(rename = "P")]
    pub p: usize,
    /// Memory length. Not in the weights: `config.json`, else labml's `Configs` default, 128.
    pub mem_len: usize,
    /// Dropout (labml's `dropout`: attention probabilities, feed-forward, residuals). Not in
    /// the weights: `config.json`, else labml's `Configs` default, 0.0.
    pub dropout: f64,
}

/// `config.json` beside a labml checkpoint: any of labml's `Configs` fields (others are
/// ignored); the shape fields, when given, must agree with the tensors.
#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    n_tokens: Option<usize>,
    d_model: Option<usize>,
    heads: Option<usize>,
    d_ff: Option<usize>,
    n_layers: Option<usize>,
    mem_len: Option<usize>,
    dropout: Option<f64>,
}

impl LabmlXlConfig {
    /// The shape of the checkpoint in `map` (and `P`), with `mem_len` and `dropout` from the
    /// config file (else labml's defaults); a shape field of the file that disagrees with the
    /// tensors is an error naming it.
    fn infer(map: &TensorMap, file: &ConfigFile, file_path: &Path) -> Result<Self, ImportError> {
        let shape = |name: &str| -> Result<Vec<usize>, ImportError> {
            map.get(name)
                .map(|t| t.shape().to_vec())
                .ok_or_else(|| ImportError::Missing {
                    name: name.into(),
                    expected: Vec::new(),
                })
        };
        let bad = |name: &str, message: String| ImportError::Value {
            name: name.into(),
            message,
        };
        let emb = shape("src_embed.weight")?;
        let [n_tokens, d_model] = emb[..] else {
            return Err(bad(
                "src_embed.weight",
                format!("has shape {emb:?}, expected [V, d]"),
            ));
        };
        let n_layers = map
            .names()
            .filter_map(|n| n.strip_prefix("transformer.layers."))
            .filter_map(|r| r.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |l| l + 1);
        if n_layers == 0 {
            return Err(ImportError::Missing {
                name: "transformer.layers.0.*".into(),
                expected: Vec::new(),
            });
        }
        let name = "transformer.layers.0.self_attn.query_pos_bias";
        let qb = shape(name)?;
        let [heads, d_k] = qb[..] else {
            return Err(bad(
                name,
                format!("has shape {qb:?}, expected [heads, d_k]"),
            ));
        };
        if heads == 0 || heads * d_k != d_model {
            return Err(bad(
                name,
                format!("has shape {qb:?}: heads x d_k must be d_model = {d_model}"),
            ));
        }
        let name = "transformer.layers.0.self_attn.key_pos_bias";
        let kb = shape(name)?;
        let rows = kb.first().copied().unwrap_or(0);
        if rows == 0 || rows % 2 != 0 {
            return Err(bad(
                name,
                format!("has shape {kb:?}: labml's tables have 2P rows, an even number"),
            ));
        }
        let name = "transformer.layers.0.feed_forward.layer1.weight";
        let ff = shape(name)?;
        let d_ff = ff.first().copied().unwrap_or(0);
        let cfg = Self {
            n_tokens,
            d_model,
            heads,
            d_ff,
            n_layers,
            p: rows / 2,
            mem_len: file.mem_len.unwrap_or(128),
            dropout: file.dropout.unwrap_or(0.0),
        };
        for (field, given, found) in [
            ("n_tokens", file.n_tokens, n_tokens),
            ("d_model", file.d_model, d_model),
            ("heads", file.heads, heads),
            ("d_ff", file.d_ff, d_ff),
            ("n_layers", file.n_layers, n_layers),
        ] {
            if let Some(g) = given
                && g != found
            {
                return Err(ImportError::Read {
                    path: file_path.to_path_buf(),
                    message: format!("{field} = {g}, but the checkpoint's tensors have {found}"),
                });
            }
        }
        Ok(cfg)
    }

    /// The memzoo stack that computes labml's model (see the module docs).
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        let config = XlConfig::new()
            .with_vocab_size(self.n_tokens)
            .with_d_model(self.d_model)
            .with_n_layers(self.n_layers)
            .with_n_heads(self.heads)
            .with_d_head(Some(self.d_model / self.heads.max(1)))
            .with_d_inner(self.d_ff)
            .with_dropout(self.dropout)
            .with_dropatt(self.dropout)
            .with_mem_len(self.mem_len)
            .with_same_length(false)
            .with_positions(
                PositionConfig::new()
                    .with_kind(PositionKind::Learned)
                    .with_max_distance(self.p),
            )
            .with_pre_ln(true)
            .with_compat(
                PeerCompat::new()
                    .with_final_norm(true)
                    .with_value_output_bias(true)
                    .with_zero_first_memory(false),
            )
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_layer_norm_epsilon(EPS);
        config.validate()?;
        Ok(config)
    }

    /// labml's config of a memzoo stack, when labml's model can express it; the error names
    /// the field that cannot be.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        if xl.layer_kinds().iter().any(|&k| k != LayerKind::Learned) {
            return no(format!(
                "layers {:?}: labml's TransformerXL has only learned relative attention",
                xl.layer_kinds()
            ));
        }
        let checks = [
            (
                xl.is_adaptive(),
                "an adaptive embedding and softmax (cutoffs, div_val, d_embed)",
            ),
            (
                !xl.pre_ln || !xl.compat.final_norm,
                "pre_ln = true with compat.final_norm = true is labml's only layout",
            ),
            (
                xl.tie_weights,
                "tie_weights = true: labml's generator is its own linear layer",
            ),
            (
                xl.scale_embedding,
                "scale_embedding = true: labml does not scale the embedding",
            ),
            (
                !xl.compat.value_output_bias,
                "compat.value_output_bias = false: labml's attention has both biases",
            ),
            (
                xl.same_length,
                "same_length = true: labml's mask shows every memory position",
            ),
            (
                xl.compat.zero_first_memory,
                "compat.zero_first_memory = true: labml starts without memory",
            ),
            (
                xl.document_resets,
                "document_resets = true: labml has no document resets",
            ),
            (
                xl.layer_norm_epsilon != EPS,
                "layer_norm_epsilon other than 1e-5",
            ),
            (
                xl.head_width() * xl.n_heads != xl.d_model,
                "d_head x n_heads other than d_model",
            ),
        ];
        mapping::expressible(&checks, "labml's TransformerXL")?;
        mapping::expressible(&mapping::rmt_layer_checks(xl), "labml's TransformerXL")?;
        Ok(Self {
            n_tokens: xl.vocab_size,
            d_model: xl.d_model,
            heads: xl.n_heads,
            d_ff: xl.d_inner,
            n_layers: xl.n_layers,
            p: xl.positions.max_distance,
            mem_len: xl.mem_len,
            dropout: xl.dropout,
        })
    }
}

/// labml-nn's Transformer-XL as a [`PeerFormat`] (`labml-xl`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LabmlXl;

impl PeerFormat for LabmlXl {
    type Config = LabmlXlConfig;
    const NAME: &'static str = "labml-xl";

    /// The file itself, or in a directory the first of [`WEIGHT_FILES`], else its only weight
    /// file of any name (labml's experiments save `state_dict.pt`).
    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, WEIGHT_FILES, "labml")
    }

    /// The shape from the tensors, `mem_len` and `dropout` from an optional `config.json`.
    fn read_config(&self, at: &Located, tensors: &TensorMap) -> Result<LabmlXlConfig, ImportError> {
        let path = at.beside("config.json");
        let file: ConfigFile = mapping::read_json_or_default(&path)?;
        LabmlXlConfig::infer(tensors, &file, &path)
    }

    fn stack(&self, config: &LabmlXlConfig, _: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn map_in(
        &self,
        config: &LabmlXlConfig,
        _: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        map_in(config, tensors, model, device)
    }

    fn config_of(&self, stack: &XlConfig) -> Result<LabmlXlConfig, ImportError> {
        LabmlXlConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(transformer_xl_to_labml(model, src))
    }
}

/// Loads a labml Transformer-XL checkpoint (a weight file, or a directory holding one and
/// perhaps `config.json`); every tensor is used. Returns labml's config too.
pub fn load(src: &Path, device: &Device) -> Result<(TransformerXl, LabmlXlConfig), ImportError> {
    let imported = crate::format::import(&LabmlXl, src, device)?;
    Ok((imported.model, imported.peer))
}

/// labml's table `[2P, ...]` (row `P - d` for distance `d`) as memzoo's `[2P + 1, ...]` (row
/// `P + d`): reversed, a zero row (distance `-P`) in front.
fn table_from_labml<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let mut dims = t.dims();
    dims[0] = 1;
    let zero = Tensor::zeros(dims, &t.device());
    Tensor::cat(vec![zero, t.flip([0])], 0)
}

/// memzoo's table `[2P + 1, ...]` as labml's `[2P, ...]` (the inverse of
/// [`table_from_labml`]; row 0, distance `-P`, has no place in labml's).
fn table_to_labml<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    let rows = t.dims()[0];
    t.narrow(0, 1, rows - 1).flip([0])
}

/// [`load`] from a config and tensors in hand; leaves unknown tensors in `map`.
pub fn transformer_xl_from(
    cfg: &LabmlXlConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    let mut model = cfg.xl_config()?.init(device)?;
    map_in(cfg, map, &mut model, device)?;
    Ok(model)
}

/// The names of a layer's block (norms and feed-forward) in labml's state dict.
fn block_names(l: usize) -> BlockNames {
    let pre = format!("transformer.layers.{l}.");
    BlockNames {
        norm_attention: format!("{pre}norm_self_attn"),
        norm_ff: format!("{pre}norm_ff"),
        ff_in: format!("{pre}feed_forward.layer1"),
        ff_out: format!("{pre}feed_forward.layer2"),
    }
}

/// labml's tensors into `model` (built from [`LabmlXlConfig::xl_config`]).
fn map_in(
    cfg: &LabmlXlConfig,
    map: &mut TensorMap,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    let (h, dk, p) = (cfg.heads, cfg.d_model / cfg.heads, cfg.p);
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let a = format!("transformer.layers.{l}.self_attn.");
        let att = layer.attention.relative_mut().ok_or_else(|| {
            XlError::Config(format!("layer {l} is not a relative-attention layer"))
        })?;
        mapping::linear(
            map,
            &format!("{a}query.linear"),
            &mut att.query,
            false,
            device,
        )?;
        let [d, _] = att.query.weight.dims();
        let wk = map.float(&format!("{a}key.linear.weight"), [d, d], device)?;
        let wv = map.float(&format!("{a}value.linear.weight"), [d, d], device)?;
        let name = format!("{a}key.linear.weight");
        let kv = mapping::from_torch(Tensor::cat(vec![wk, wv], 0));
        mapping::set_linear(&mut att.key_value, kv, None, &name)?;
        let value_bias = att
            .value_bias
            .as_mut()
            .ok_or_else(|| XlError::Config(format!("layer {l}: no value bias")))?;
        mapping::param(map, &format!("{a}value.linear.bias"), value_bias, device)?;
        mapping::linear(map, &format!("{a}output"), &mut att.output, true, device)?;
        let PositionParams::Learned(lp) = &mut att.scheme else {
            return Err(XlError::Config(format!("layer {l}: not a learned-position layer")).into());
        };
        let name = format!("{a}key_pos_embeddings");
        let e = map.float::<3>(&name, [2 * p, h, dk], device)?;
        mapping::set(&mut lp.embedding, table_from_labml(e), &name)?;
        let name = format!("{a}key_pos_bias");
        let kb = map.float::<2>(&name, [2 * p, h], device)?;
        mapping::set(&mut lp.key_bias, table_from_labml(kb), &name)?;
        mapping::param(
            map,
            &format!("{a}query_pos_bias"),
            &mut lp.query_bias,
            device,
        )?;
        block_names(l).take(map, &mut layer.block, device)?;
    }
    let final_norm = model
        .final_norm
        .as_mut()
        .ok_or_else(|| XlError::Config("a pre-LN stack without its final norm".into()))?;
    mapping::norm(map, "transformer.norm", final_norm, device)?;
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("labml's embedding is one table".into()).into());
    };
    mapping::embedding(map, "src_embed.weight", embedding, device)?;
    let OutputLayer::Linear(output) = &mut model.output else {
        return Err(XlError::Config("labml's generator is a linear layer".into()).into());
    };
    mapping::linear(map, "generator", output, true, device)
}

/// A labml-shaped [`TransformerXl`]'s tensors (or gradients) under labml's state-dict names
/// (the inverse of the import mapping). Parts labml's model has no place for are left out.
pub fn transformer_xl_to_labml(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    for (l, layer) in model.layers.iter().enumerate() {
        let a = format!("transformer.layers.{l}.self_attn.");
        if let Some(att) = layer.attention.relative() {
            put(
                &mut out,
                format!("{a}query.linear.weight"),
                src.get(&att.query.weight).map(|w| w.transpose()),
            );
            if let Some(kv) = src.get(&att.key_value.weight) {
                let inner = kv.dims()[1] / 2;
                put(
                    &mut out,
                    format!("{a}key.linear.weight"),
                    Some(kv.clone().narrow(1, 0, inner).transpose()),
                );
                put(
                    &mut out,
                    format!("{a}value.linear.weight"),
                    Some(kv.narrow(1, inner, inner).transpose()),
                );
            }
            if let Some(b) = &att.value_bias {
                put(&mut out, format!("{a}value.linear.bias"), src.get(b));
            }
            put_linear(&mut out, &format!("{a}output"), &att.output, src);
            if let PositionParams::Learned(lp) = &att.scheme {
                put(
                    &mut out,
                    format!("{a}key_pos_embeddings"),
                    src.get(&lp.embedding).map(table_to_labml),
                );
                put(
                    &mut out,
                    format!("{a}key_pos_bias"),
                    src.get(&lp.key_bias).map(table_to_labml),
                );
                put(
                    &mut out,
                    format!("{a}query_pos_bias"),
                    src.get(&lp.query_bias),
                );
            }
        }
        block_names(l).put(&mut out, &layer.block, src);
    }
    if let Some(n) = &model.final_norm {
        put_norm(&mut out, "transformer.norm", n, src);
    }
    if let InputEmbedding::Plain(e) = &model.embedding {
        put(&mut out, "src_embed.weight".into(), src.get(&e.weight));
    }
    if let OutputLayer::Linear(o) = &model.output {
        put_linear(&mut out, "generator", o, src);
    }
    out
}

/// Writes a labml checkpoint directory ([`LabmlXl`]'s [`PeerFormat::write`]); the config must
/// be labml-shaped ([`LabmlXlConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&LabmlXl, model, xl, dir)
}

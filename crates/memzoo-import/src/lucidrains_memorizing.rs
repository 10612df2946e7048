//! memorizing-transformers-pytorch (lucidrains, 0.4.1) checkpoints in memzoo.
//!
//! The checkpoint is the `state_dict` of its `MemorizingTransformer`, as `model.safetensors` or
//! a `torch.save` file (`model.pt`, `model.pth`, `pytorch_model.bin`; read without running
//! pickle), with a `config.json` of the constructor's arguments that the weights do not hold
//! (see [`MemorizingPeerConfig`]; absent ones take the package's defaults).
//!
//! The package's model, and what it is in memzoo's stack ([`TransformerXl`]):
//! - an unscaled embedding (`scale_embedding = false`), pre-LN residual blocks
//!   (`PreNormResidual`) and a head `LayerNorm` → `Linear` with a bias (`final_norm`,
//!   `tie_weights = false`); a GELU feed-forward `dim → ff_mult·dim → dim` with biases
//!   (`ff_activation = "gelu"`, `d_inner = ff_mult · dim`);
//! - multi-query attention: `to_q` per head, `to_kv` one key and one value of `dim_head` shared
//!   by every head (`kv_heads = 1`), no query/key/value bias; `to_out` has a bias in the plain
//!   layers (`attention_output_bias`) and none in the kNN layer;
//! - T5 relative biases (`positions.kind = "t5"`, 32 buckets, max distance 128, causal), the
//!   table multiplied by `sqrt(dim_head)` (`positions.bias_scale`) and indexed by `i - j` over
//!   `cat(memory, segment)`, not the true distance `i + mlen - j` (`positions.memory_offset =
//!   false`); one table (`rel_pos_bias`) shared by the plain layers, another (`knn_rel_pos_bias`)
//!   by the kNN layers (`shared_t5`: the model's [`memzoo_stack::SharedT5`]; each layer's own
//!   table, unused, is given the same values);
//! - the XL memory (`xl_max_memories` = `mem_len`, in every layer) holds detached keys and
//!   values (`memory_keys_values`; memzoo's default caches layer inputs and projects them
//!   again, which `memory_gradients = false` makes the same function and gradients at fixed
//!   weights, but in training projects the memory with the current weights);
//! - the kNN layers (`memorizing_layers`, 1-based): cosine scores `τ q̂·k̂` with a learned
//!   per-head `log τ` (`scale`), one softmax over the `num_retrieved_memories` retrieved pairs
//!   and the local keys, no gate (`knn.mixing = "joint"`); the kNN memory receives the pairs
//!   leaving the XL memory (`knn.feed = "evicted"`) and is emptied when an add would take it
//!   above `max_knn_memories` (`knn.when_full = "reset"`). The package searches a faiss HNSW
//!   index (approximate); memzoo's `auto` index is exact up to 262,144 pairs.
//!
//! Not the same, and why:
//! - after its first reset the package's kNN memory miscounts (the pairs that triggered the
//!   reset are not counted, so it grows past `max_knn_memories`) and its value database, a ring
//!   of `max_knn_memories` slots, then no longer matches the faiss ids: a search can return the
//!   value of another pair than the key it found. memzoo keeps the intended behaviour (a reset
//!   whenever a row would exceed `max_knn_memories`); the two agree until the package's second
//!   reset-free overflow (`xtask/peers/fixtures/lucidrains_memorizing.py` explains it).
//! - the package's loss ignores targets equal to `pad_id` (0); memzoo's does not.
//! - dropout in training: the package drops attention probabilities (`attn_dropout`, memzoo's
//!   `dropatt`) and inside the feed-forward (`ff_dropout`): memzoo's `dropout` set to
//!   `ff_dropout`, with `ff_output_dropout`, `attention_output_dropout` and
//!   `embedding_dropout` off.
//!   Evaluation is the same function.
//! - options the package has that memzoo does not express are refused by name:
//!   `xl_memory_layers` other than all layers, `shift_knn_memories_down`,
//!   `shift_xl_memories_down`, `clear_memories_on_{sos,eos}_token_id`, `knn_attn_heads` other
//!   than `heads`.
//!
//! | package (`l` a layer, 0-based) | memzoo |
//! |---|---|
//! | `token_emb.weight` `[V, d]` | the plain embedding |
//! | `layers.l.0.norm`, `layers.l.1.norm` | `block.norm_attention`, `block.norm_ff` |
//! | `layers.l.0.fn.to_q.weight` `[h·dh, d]` | `attention.query` (transposed) |
//! | `layers.l.0.fn.to_kv.weight` `[2dh, d]` | `attention.key_value` (transposed; key then value) |
//! | `layers.l.0.fn.to_out.weight`, `.bias` | `attention.output` |
//! | `layers.l.0.fn.scale` `[h, 1, 1]` (kNN layers) | `log_scale` `[h]` |
//! | `rel_pos_bias.relative_attention_bias.weight` `[32, h]` | every plain layer's T5 table |
//! | `knn_rel_pos_bias.relative_attention_bias.weight` | every kNN layer's T5 table |
//! | `layers.l.1.fn.net.0`, `layers.l.1.fn.net.3` | `block.ff_in`, `block.ff_out` |
//! | `to_logits.0`, `to_logits.1` | the final norm, the linear output |

use std::path::Path;

use burn::tensor::{Device, Tensor};
use memzoo_knn::KnnMixing;
use memzoo_memory::WhenFull;
use memzoo_relative::{PositionConfig, PositionKind, PositionParams};
use memzoo_stack::{
    Activation, InputEmbedding, KnnFeed, KnnLayerConfig, LayerAttention, LayerKind, OutputLayer,
    PeerCompat, TransformerXl, XlConfig, XlError,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source, put, put_linear, put_norm};
use crate::reader::TensorMap;

/// The package's LayerNorm epsilon (`nn.LayerNorm`'s default).
const EPS: f64 = 1e-5;
/// `T5RelativePositionBias`'s fixed bucket count and maximum distance.
const NUM_BUCKETS: usize = 32;
const MAX_DISTANCE: usize = 128;

/// The weight files looked for in a directory, in this order.
pub const WEIGHT_FILES: &[&str] = &[
    "model.safetensors",
    "model.pt",
    "model.pth",
    "pytorch_model.bin",
];

/// `MemorizingTransformer`'s constructor arguments that shape the function (field names are
/// the package's). The shape is read from the tensors; the rest from `config.json`, else the
/// package's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct MemorizingPeerConfig {
    /// Vocabulary size.
    pub num_tokens: usize,
    /// Model width.
    pub dim: usize,
    /// Layers.
    pub depth: usize,
    /// Query heads (every layer).
    pub heads: usize,
    /// Width of each head, and of the one shared key and value.
    pub dim_head: usize,
    /// Feed-forward width multiplier.
    pub ff_mult: usize,
    /// The kNN layers, 1-based. Default: `(depth / 2,)`.
    pub memorizing_layers: Vec<usize>,
    /// kNN memory capacity per batch row. Default: 250,000.
    pub max_knn_memories: usize,
    /// Pairs retrieved per query. Default: 32.
    pub num_retrieved_memories: usize,
    /// XL memory length (0: none). Default: 0.
    pub xl_max_memories: usize,
    /// Dropout on attention probabilities. Default: 0.
    pub attn_dropout: f64,
    /// Dropout inside the feed-forward. Default: 0.
    pub ff_dropout: f64,
}

/// `config.json`: the constructor's arguments (unknown ones are refused by name when they
/// change the function, see [`MemorizingPeerConfig::infer`]).
#[derive(Debug, Default, Deserialize)]
struct ConfigFile {
    num_tokens: Option<usize>,
    dim: Option<usize>,
    depth: Option<usize>,
    heads: Option<usize>,
    dim_head: Option<usize>,
    ff_mult: Option<usize>,
    knn_attn_heads: Option<usize>,
    memorizing_layers: Option<LayerList>,
    max_knn_memories: Option<usize>,
    num_retrieved_memories: Option<usize>,
    xl_max_memories: Option<usize>,
    xl_memory_layers: Option<LayerList>,
    attn_dropout: Option<f64>,
    ff_dropout: Option<f64>,
    shift_knn_memories_down: Option<f64>,
    shift_xl_memories_down: Option<f64>,
    clear_memories_on_sos_token_id: Option<i64>,
    clear_memories_on_eos_token_id: Option<i64>,
}

/// One layer number or a list of them (the package's `cast_tuple`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LayerList {
    One(usize),
    Many(Vec<usize>),
}

impl LayerList {
    fn to_vec(&self) -> Vec<usize> {
        match self {
            LayerList::One(l) => vec![*l],
            LayerList::Many(v) => v.clone(),
        }
    }
}

/// The layers (1-based) of `list` that a model of `depth` layers has, sorted, each once.
fn layer_set(list: &LayerList, depth: usize) -> Vec<usize> {
    let mut given: Vec<usize> = list
        .to_vec()
        .into_iter()
        .filter(|l| (1..=depth).contains(l))
        .collect();
    given.sort_unstable();
    given.dedup();
    given
}

impl MemorizingPeerConfig {
    /// The shape from the tensors in `map`, the rest from `file` or the package's defaults; a
    /// file field that disagrees with the tensors, or asks for what memzoo cannot express, is
    /// an error naming it.
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
        let file_err = |message: String| ImportError::Read {
            path: file_path.to_path_buf(),
            message,
        };
        let name = "token_emb.weight";
        let emb = shape(name)?;
        let [num_tokens, dim] = emb[..] else {
            return Err(bad(name, format!("has shape {emb:?}, expected [V, d]")));
        };
        let depth = map
            .names()
            .filter_map(|n| n.strip_prefix("layers."))
            .filter_map(|r| r.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |l| l + 1);
        if depth == 0 {
            return Err(ImportError::Missing {
                name: "layers.0.*".into(),
                expected: Vec::new(),
            });
        }
        let name = "rel_pos_bias.relative_attention_bias.weight";
        let rb = shape(name)?;
        let [NUM_BUCKETS, heads] = rb[..] else {
            return Err(bad(
                name,
                format!("has shape {rb:?}, expected [{NUM_BUCKETS}, heads]"),
            ));
        };
        let name = "layers.0.0.fn.to_kv.weight";
        let kv = shape(name)?;
        let dim_head = kv.first().copied().unwrap_or(0) / 2;
        if kv.len() != 2 || dim_head == 0 || kv[0] != 2 * dim_head {
            return Err(bad(
                name,
                format!("has shape {kv:?}, expected [2 dim_head, dim]"),
            ));
        }
        let name = "layers.0.1.fn.net.0.weight";
        let ff = shape(name)?;
        let inner = ff.first().copied().unwrap_or(0);
        if inner == 0 || !inner.is_multiple_of(dim) {
            return Err(bad(
                name,
                format!("has shape {ff:?}: its rows must be ff_mult x dim = ff_mult x {dim}"),
            ));
        }
        // kNN layers: those with a temperature `scale` (the file must agree).
        let found: Vec<usize> = (0..depth)
            .filter(|l| map.contains(&format!("layers.{l}.0.fn.scale")))
            .map(|l| l + 1)
            .collect();
        let memorizing_layers = match &file.memorizing_layers {
            Some(list) => {
                let given = layer_set(list, depth);
                if given != found {
                    return Err(file_err(format!(
                        "memorizing_layers = {given:?}, but the checkpoint's kNN layers (with a \
                         `scale`) are {found:?}"
                    )));
                }
                given
            }
            None => found,
        };
        if memorizing_layers.is_empty() {
            return Err(ImportError::Missing {
                name: "layers.*.0.fn.scale (no kNN layer)".into(),
                expected: vec![heads, 1, 1],
            });
        }
        let cfg = Self {
            num_tokens,
            dim,
            depth,
            heads,
            dim_head,
            ff_mult: inner / dim,
            memorizing_layers,
            max_knn_memories: file.max_knn_memories.unwrap_or(250_000),
            num_retrieved_memories: file.num_retrieved_memories.unwrap_or(32),
            xl_max_memories: file.xl_max_memories.unwrap_or(0),
            attn_dropout: file.attn_dropout.unwrap_or(0.0),
            ff_dropout: file.ff_dropout.unwrap_or(0.0),
        };
        for (field, given, found) in [
            ("num_tokens", file.num_tokens, num_tokens),
            ("dim", file.dim, dim),
            ("depth", file.depth, depth),
            ("heads", file.heads, heads),
            ("knn_attn_heads", file.knn_attn_heads, heads),
            ("dim_head", file.dim_head, dim_head),
            ("ff_mult", file.ff_mult, cfg.ff_mult),
        ] {
            if let Some(g) = given
                && g != found
            {
                return Err(file_err(format!(
                    "{field} = {g}, but the checkpoint's tensors have {found}{}",
                    if field == "knn_attn_heads" {
                        " (memzoo's kNN layers have the other layers' heads)"
                    } else {
                        ""
                    }
                )));
            }
        }
        if let Some(list) = &file.xl_memory_layers {
            let given = layer_set(list, depth);
            if cfg.xl_max_memories > 0 && given != (1..=depth).collect::<Vec<_>>() {
                return Err(ImportError::Unsupported(format!(
                    "xl_memory_layers = {given:?}: memzoo keeps an XL memory in every layer"
                )));
            }
        }
        for (field, v) in [
            ("shift_knn_memories_down", file.shift_knn_memories_down),
            ("shift_xl_memories_down", file.shift_xl_memories_down),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ImportError::Unsupported(format!(
                    "{field} = {}: memzoo reads each layer's own memories",
                    v.unwrap_or(0.0)
                )));
            }
        }
        for (field, v) in [
            (
                "clear_memories_on_sos_token_id",
                file.clear_memories_on_sos_token_id,
            ),
            (
                "clear_memories_on_eos_token_id",
                file.clear_memories_on_eos_token_id,
            ),
        ] {
            if let Some(t) = v {
                return Err(ImportError::Unsupported(format!(
                    "{field} = {t}: memzoo clears kNN memories on document starts given with \
                     each segment (document_resets), not on a token"
                )));
            }
        }
        Ok(cfg)
    }

    /// The memzoo stack that computes the package's model (see the module docs).
    pub fn xl_config(&self) -> Result<XlConfig, ImportError> {
        let layers = (1..=self.depth)
            .map(|l| {
                if self.memorizing_layers.contains(&l) {
                    LayerKind::Knn
                } else {
                    LayerKind::T5
                }
            })
            .collect();
        let config = XlConfig::new()
            .with_vocab_size(self.num_tokens)
            .with_d_model(self.dim)
            .with_n_layers(self.depth)
            .with_n_heads(self.heads)
            .with_d_head(Some(self.dim_head))
            .with_d_inner(self.ff_mult * self.dim)
            .with_dropout(self.ff_dropout)
            .with_embedding_dropout(false)
            .with_attention_output_dropout(false)
            .with_ff_output_dropout(false)
            .with_dropatt(self.attn_dropout)
            .with_mem_len(self.xl_max_memories)
            .with_same_length(false)
            .with_positions(
                PositionConfig::new()
                    .with_kind(PositionKind::T5)
                    .with_num_buckets(NUM_BUCKETS)
                    .with_max_distance(MAX_DISTANCE)
                    .with_bidirectional(false)
                    .with_bias_scale((self.dim_head as f64).sqrt())
                    .with_memory_offset(false),
            )
            .with_layers(layers)
            .with_knn(
                KnnLayerConfig::new()
                    .with_top_k(self.num_retrieved_memories)
                    .with_max_memories(self.max_knn_memories)
                    .with_mixing(KnnMixing::Joint)
                    .with_feed(KnnFeed::Evicted)
                    .with_when_full(WhenFull::Reset),
            )
            .with_pre_ln(true)
            .with_compat(
                PeerCompat::new()
                    .with_final_norm(true)
                    .with_attention_output_bias(true)
                    .with_memory_keys_values(true)
                    .with_shared_t5(true)
                    .with_zero_first_memory(false),
            )
            .with_tie_weights(false)
            .with_scale_embedding(false)
            .with_layer_norm_epsilon(EPS)
            .with_kv_heads(Some(1))
            .with_ff_activation(Activation::Gelu)
            .with_ff_inner_dropout(true)
            .with_final_dropout(false)
            .with_norm_gain_std(Some(0.0))
            .with_embedding_std(Some(1.0));
        config.validate()?;
        Ok(config)
    }

    /// The package's config of a memzoo stack, when the package can express it; the error
    /// names the field that cannot be.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        let kinds = xl.layer_kinds();
        if kinds
            .iter()
            .any(|k| !matches!(k, LayerKind::T5 | LayerKind::Knn))
        {
            return no(format!(
                "layers {kinds:?}: the package has only T5 and kNN layers"
            ));
        }
        let p = &xl.positions;
        let knn = &xl.knn;
        let checks = [
            (xl.is_adaptive(), "an adaptive embedding and softmax"),
            (
                !xl.pre_ln || !xl.compat.final_norm,
                "pre_ln = true with compat.final_norm = true is the package's only layout",
            ),
            (
                xl.tie_weights,
                "tie_weights = true: its head is a linear layer",
            ),
            (xl.scale_embedding, "scale_embedding = true"),
            (
                xl.compat.value_output_bias,
                "compat.value_output_bias = true",
            ),
            (
                !xl.compat.attention_output_bias,
                "compat.attention_output_bias = false: its attention's to_out has a bias",
            ),
            (
                xl.kv_heads != Some(1),
                "kv_heads other than 1 (multi-query)",
            ),
            (
                xl.ff_activation != Activation::Gelu,
                "ff_activation other than gelu",
            ),
            (xl.same_length, "same_length = true"),
            (
                xl.compat.zero_first_memory,
                "compat.zero_first_memory = true",
            ),
            (xl.document_resets, "document_resets = true"),
            (
                xl.layer_norm_epsilon != EPS,
                "layer_norm_epsilon other than 1e-5",
            ),
            (
                p.num_buckets != NUM_BUCKETS || p.max_distance != MAX_DISTANCE || p.bidirectional,
                "T5 positions other than 32 causal buckets up to distance 128",
            ),
            (
                (p.bias_scale - (xl.head_width() as f64).sqrt()).abs() > 1e-12,
                "positions.bias_scale other than sqrt(d_head)",
            ),
            (p.memory_offset, "positions.memory_offset = true"),
            (
                knn.mixing != KnnMixing::Joint,
                "knn.mixing other than joint",
            ),
            (knn.feed != KnnFeed::Evicted, "knn.feed other than evicted"),
            (
                knn.when_full != WhenFull::Reset,
                "knn.when_full other than reset",
            ),
            (
                !xl.d_inner.is_multiple_of(xl.d_model),
                "d_inner not a multiple of d_model (ff_mult)",
            ),
        ];
        mapping::expressible(&checks, "memorizing-transformers-pytorch")?;
        mapping::expressible(
            &mapping::rmt_layer_checks(xl),
            "memorizing-transformers-pytorch",
        )?;
        Ok(Self {
            num_tokens: xl.vocab_size,
            dim: xl.d_model,
            depth: xl.n_layers,
            heads: xl.n_heads,
            dim_head: xl.head_width(),
            ff_mult: xl.d_inner / xl.d_model,
            memorizing_layers: kinds
                .iter()
                .enumerate()
                .filter(|(_, k)| **k == LayerKind::Knn)
                .map(|(l, _)| l + 1)
                .collect(),
            max_knn_memories: knn.max_memories,
            num_retrieved_memories: knn.top_k,
            xl_max_memories: xl.mem_len,
            attn_dropout: xl.dropatt,
            ff_dropout: xl.dropout,
        })
    }
}

/// memorizing-transformers-pytorch as a [`PeerFormat`] (`lucidrains-memorizing`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LucidrainsMemorizing;

impl PeerFormat for LucidrainsMemorizing {
    type Config = MemorizingPeerConfig;
    const NAME: &'static str = "lucidrains-memorizing";

    /// The file itself, or in a directory the first of [`WEIGHT_FILES`] (else its only weight
    /// file).
    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, WEIGHT_FILES, "MemorizingTransformer")
    }

    /// The shape from the tensors, the rest from an optional `config.json`.
    fn read_config(
        &self,
        at: &Located,
        tensors: &TensorMap,
    ) -> Result<MemorizingPeerConfig, ImportError> {
        let path = at.beside("config.json");
        let file: ConfigFile = mapping::read_json_or_default(&path)?;
        MemorizingPeerConfig::infer(tensors, &file, &path)
    }

    fn stack(&self, config: &MemorizingPeerConfig, _: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config()
    }

    fn map_in(
        &self,
        config: &MemorizingPeerConfig,
        _: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        map_in(config, tensors, model, device)
    }

    fn config_of(&self, stack: &XlConfig) -> Result<MemorizingPeerConfig, ImportError> {
        MemorizingPeerConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        transformer_xl_to_peer(model, src)
    }
}

/// Loads a `MemorizingTransformer` checkpoint (a weight file, or a directory holding one and
/// perhaps `config.json`); every tensor is used. Returns the package's config too.
pub fn load(
    src: &Path,
    device: &Device,
) -> Result<(TransformerXl, MemorizingPeerConfig), ImportError> {
    let imported = crate::format::import(&LucidrainsMemorizing, src, device)?;
    Ok((imported.model, imported.peer))
}

const T5_TABLE: &str = "rel_pos_bias.relative_attention_bias.weight";
const KNN_T5_TABLE: &str = "knn_rel_pos_bias.relative_attention_bias.weight";

/// [`load`] from a config and tensors in hand; leaves unknown tensors in `map`.
pub fn transformer_xl_from(
    cfg: &MemorizingPeerConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    transformer_xl_as(&cfg.xl_config()?, cfg, map, device)
}

/// [`transformer_xl_from`] into the stack of `xl`, [`MemorizingPeerConfig::xl_config`] or a
/// variant of it that computes the same function (e.g. `memory_keys_values = false` with
/// `memory_gradients = false`).
pub fn transformer_xl_as(
    xl: &XlConfig,
    cfg: &MemorizingPeerConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    let mut model = xl.init(device)?;
    map_in(cfg, map, &mut model, device)?;
    Ok(model)
}

/// The names of a layer's block (`PreNormResidual` norms, the feed-forward `net`) in the
/// package's state dict.
fn block_names(l: usize) -> BlockNames {
    BlockNames {
        norm_attention: format!("layers.{l}.0.norm"),
        norm_ff: format!("layers.{l}.1.norm"),
        ff_in: format!("layers.{l}.1.fn.net.0"),
        ff_out: format!("layers.{l}.1.fn.net.3"),
    }
}

/// The package's tensors into `model` (a stack of [`MemorizingPeerConfig::xl_config`] or a
/// variant of it).
fn map_in(
    cfg: &MemorizingPeerConfig,
    map: &mut TensorMap,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    let h = cfg.heads;
    let table = map.float::<2>(T5_TABLE, [NUM_BUCKETS, h], device)?;
    let knn_table = map.float::<2>(KNN_T5_TABLE, [NUM_BUCKETS, h], device)?;
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let a = format!("layers.{l}.0.fn.");
        let (t5, t5_name) = match &mut layer.attention {
            LayerAttention::Relative(_) => (&table, T5_TABLE),
            LayerAttention::Knn(knn) => {
                let name = format!("{a}scale");
                let scale = map.float::<3>(&name, [h, 1, 1], device)?;
                mapping::set(&mut knn.log_scale, scale.reshape([h]), &name)?;
                // No gate in the package (`mixing = joint` leaves it unused).
                mapping::set(&mut knn.gate, Tensor::zeros([h], device), &name)?;
                (&knn_table, KNN_T5_TABLE)
            }
            LayerAttention::Hashed(_) => {
                return Err(XlError::Config(format!("layer {l} is an LSH/local layer")).into());
            }
        };
        let att = layer
            .attention
            .relative_mut()
            .ok_or_else(|| XlError::Config(format!("layer {l}: no relative attention")))?;
        mapping::linear(map, &format!("{a}to_q"), &mut att.query, false, device)?;
        mapping::linear(map, &format!("{a}to_kv"), &mut att.key_value, false, device)?;
        let bias = att.output.bias.is_some();
        mapping::linear(map, &format!("{a}to_out"), &mut att.output, bias, device)?;
        // The layer's own table is unused under `shared_t5`: the same values, for a config
        // that turns sharing off.
        let PositionParams::T5(p) = &mut att.scheme else {
            return Err(XlError::Config(format!("layer {l}: not a T5 layer")).into());
        };
        // A copy of its own, not a clone: parameters sharing one tensor would share one
        // autodiff node, and its gradient would go to whichever is visited first.
        let own = Tensor::from_data(t5.clone().into_data(), device);
        mapping::set(&mut p.bias, own, t5_name)?;
        block_names(l).take(map, &mut layer.block, device)?;
    }
    let shared = model
        .shared_t5
        .as_mut()
        .ok_or_else(|| XlError::Config("a stack without shared T5 tables".into()))?;
    shared.set_tables(table, knn_table);
    let final_norm = model
        .final_norm
        .as_mut()
        .ok_or_else(|| XlError::Config("a pre-LN stack without its final norm".into()))?;
    mapping::norm(map, "to_logits.0", final_norm, device)?;
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("the package's embedding is one table".into()).into());
    };
    mapping::embedding(map, "token_emb.weight", embedding, device)?;
    let OutputLayer::Linear(output) = &mut model.output else {
        return Err(XlError::Config("the package's head is a linear layer".into()).into());
    };
    mapping::linear(map, "to_logits.1", output, true, device)
}

/// The T5 tables of the plain and of the kNN layers, each as the package's one shared table:
/// the model's (`shared_t5`); without sharing, the layers' own, whose values must agree across
/// layers (else an error naming the layers) and whose gradients are summed.
fn shared_tables(
    model: &TransformerXl,
    src: Source<'_>,
) -> Result<[Option<Tensor<2>>; 2], ImportError> {
    if let Some(shared) = &model.shared_t5 {
        let get = |knn: bool| shared.table(knn).and_then(|p| src.get(p));
        return Ok([get(false), get(true)]);
    }
    let mut tables: [Vec<(usize, Tensor<2>)>; 2] = [Vec::new(), Vec::new()];
    for (l, layer) in model.layers.iter().enumerate() {
        let knn = matches!(layer.attention, LayerAttention::Knn(_));
        if let Some(att) = layer.attention.relative()
            && let PositionParams::T5(p) = &att.scheme
            && let Some(t) = src.get(&p.bias)
        {
            tables[usize::from(knn)].push((l, t));
        }
    }
    let mut out = [None, None];
    for (i, list) in tables.into_iter().enumerate() {
        let name = [T5_TABLE, KNN_T5_TABLE][i];
        let mut it = list.into_iter();
        let Some((first_layer, first)) = it.next() else {
            continue;
        };
        let mut acc = first.clone();
        for (l, t) in it {
            match src {
                Source::Gradients(_) => acc = acc + t,
                Source::Values => {
                    let a: Vec<f32> = first
                        .clone()
                        .into_data()
                        .convert::<f32>()
                        .try_to_vec::<f32>()
                        .unwrap();
                    let b: Vec<f32> = t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
                    if a != b {
                        return Err(ImportError::Value {
                            name: name.into(),
                            message: format!(
                                "the package shares one table, but memzoo's layers \
                                 {first_layer} and {l} hold different ones (trained apart)"
                            ),
                        });
                    }
                }
            }
        }
        out[i] = Some(acc);
    }
    Ok(out)
}

/// A package-shaped [`TransformerXl`]'s tensors (or gradients) under the package's state-dict
/// names (the inverse of the import mapping; the T5 tables as in `shared_tables`).
pub fn transformer_xl_to_peer(
    model: &TransformerXl,
    src: Source<'_>,
) -> Result<PeerTensors, ImportError> {
    let mut out = PeerTensors::new();
    for (l, layer) in model.layers.iter().enumerate() {
        let a = format!("layers.{l}.0.fn.");
        if let LayerAttention::Knn(knn) = &layer.attention {
            put(
                &mut out,
                format!("{a}scale"),
                src.get(&knn.log_scale).map(|s| {
                    let h = s.dims()[0];
                    s.reshape([h, 1, 1])
                }),
            );
        }
        if let Some(att) = layer.attention.relative() {
            put(
                &mut out,
                format!("{a}to_q.weight"),
                src.get(&att.query.weight).map(|w| w.transpose()),
            );
            put(
                &mut out,
                format!("{a}to_kv.weight"),
                src.get(&att.key_value.weight).map(|w| w.transpose()),
            );
            put_linear(&mut out, &format!("{a}to_out"), &att.output, src);
        }
        block_names(l).put(&mut out, &layer.block, src);
    }
    let [plain, knn] = shared_tables(model, src)?;
    put(&mut out, T5_TABLE.into(), plain);
    put(&mut out, KNN_T5_TABLE.into(), knn);
    if let Some(n) = &model.final_norm {
        put_norm(&mut out, "to_logits.0", n, src);
    }
    if let InputEmbedding::Plain(e) = &model.embedding {
        put(&mut out, "token_emb.weight".into(), src.get(&e.weight));
    }
    if let OutputLayer::Linear(o) = &model.output {
        put_linear(&mut out, "to_logits.1", o, src);
    }
    Ok(out)
}

/// Writes a checkpoint directory for the package ([`LucidrainsMemorizing`]'s
/// [`PeerFormat::write`]); the config must be expressible ([`MemorizingPeerConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&LucidrainsMemorizing, model, xl, dir)
}

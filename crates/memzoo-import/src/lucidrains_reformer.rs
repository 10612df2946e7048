//! reformer-pytorch's (lucidrains, 1.4.4) `ReformerLM` checkpoints in memzoo.
//!
//! A directory with `config.json` (the keyword arguments `ReformerLM` was built with) and the
//! model's `state_dict` as `model.safetensors` or a `torch.save` file (`model.pt`, `model.pth`,
//! `pytorch_model.bin`; pickle parsed, never run) imports into the Reformer preset of the stack
//! with the options that make it reformer-pytorch's function:
//! - the embedding plus axial positions that *sum* two full-width tables
//!   (`axial_positional_embedding` without `axial_dims`, reformer-pytorch's default:
//!   `axial.summed = true`), no `sqrt(d_model)` scale;
//! - `depth` LSH layers (all hashed), reversible: `x` is duplicated into two streams and the head
//!   reads their mean (`head_input = "mean"`), then `norm` (a LayerNorm, eps 1e-5) and `out.1`
//!   (a linear layer with a bias);
//! - pre-LN blocks (`PreNorm`), attention with `toqk`, `tov` (no bias) and `to_out` (with a
//!   bias: `lsh.output_bias = true`), a GELU (erf) feed-forward `w1`, `w2` of width
//!   `dim · ff_mult` with biases;
//! - LSH: chunks of `bucket_size` seeing one chunk back, `n_hashes` rounds,
//!   `seq_len / bucket_size` buckets, one set of rotations for all heads, keys `q / |q|` and
//!   scores scaled by `dim_head^-0.5` (`lsh.scores = "scaled_unit_keys"`), no de-duplication
//!   of rounds (`Reformer`'s `lsh_allow_duplicate_attention = True`: `lsh.dedup_rounds = false`).
//!
//! reformer-pytorch draws its rotations with `torch.randn` on every forward pass; the rotations
//! of one pass, saved as `rotations.safetensors` (`layers.{l}`, `[1, dim_head, n_hashes,
//! n_buckets / 2]`) beside the model, are imported as the layers' fixed rotations (as for
//! `hf-reformer`); their shape fixes `n_buckets`, so the model then reads sequences of
//! `n_buckets · bucket_size` tokens as reformer-pytorch did in that pass.
//!
//! Not supported (errors that name the argument): rotary, absolute or fixed positions (the
//! default without `axial_position_emb`), `causal = False`, `random_rotations_per_head`
//! (rotations per batch row and head), local attention heads, memory key/values, PKM layers,
//! GLU, ScaleNorm, ReZero, weight tying, `emb_dim` other than `dim`, full attention (`ReformerLM`
//! keeps `Reformer`'s `lsh_allow_duplicate_attention` and `lsh_attend_across_buckets` at their
//! defaults, which memzoo computes). Dropout
//! (`lsh_dropout` aside, which is memzoo's `dropatt`) only acts in training: memzoo's sites
//! differ.
//!
//! | reformer-pytorch (`l` a layer) | memzoo |
//! |---|---|
//! | `token_emb.weight` `[V, d]` | the plain embedding |
//! | `pos_emb.weights.0` `[1, a_1, 1, d]`, `.1` `[1, 1, a_2, d]` | `axial.rows`, `axial.cols` (summed) |
//! | `reformer.layers.blocks.l.f.net.norm`, `….g.net.norm` | `block.norm_attention`, `block.norm_ff` |
//! | `….f.net.fn.toqk.weight`, `.tov.weight`, `.to_out` | `attention.query`, `.value`, `.output` |
//! | `….g.net.fn.fn.w1`, `.w2` | `block.ff_in`, `block.ff_out` |
//! | `reformer.layers.irrev_blocks.l.*` | the same tensors (checked equal) |
//! | `norm`, `out.1` | the final norm, the linear output |

use std::path::Path;

use burn::tensor::Device;
use memzoo_reformer::{LshConfig, LshScores};
use memzoo_stack::{
    Activation, AxialConfig, HeadInput, InputEmbedding, LayerAttention, LayerKind, OutputLayer,
    ReformerConfig, TransformerXl, XlConfig, XlError,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source, put, put_linear, put_norm};
use crate::reader::TensorMap;

/// The file of fixed LSH rotations read beside a checkpoint.
pub use crate::hf_reformer::ROTATIONS_FILE;

/// The weight files looked for in a directory, in this order.
pub const WEIGHT_FILES: &[&str] = &[
    "model.safetensors",
    "model.pt",
    "model.pth",
    "pytorch_model.bin",
];

/// `ReformerLM`'s keyword arguments (names and defaults are reformer-pytorch 1.4.4's).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LucidrainsReformerConfig {
    /// Vocabulary size.
    pub num_tokens: usize,
    /// Model width.
    pub dim: usize,
    /// Layers.
    pub depth: usize,
    /// Longest sequence.
    pub max_seq_len: usize,
    /// Heads per layer.
    pub heads: usize,
    /// Width of each head.
    pub dim_head: usize,
    /// LSH chunk (bucket) length.
    pub bucket_size: usize,
    /// LSH hash rounds.
    pub n_hashes: usize,
    /// Feed-forward chunks (no numerical effect).
    pub ff_chunks: usize,
    /// Attention chunks (no numerical effect).
    pub attn_chunks: usize,
    /// Causal masking.
    pub causal: bool,
    /// Layers share weights.
    pub weight_tie: bool,
    /// Dropout on attention probabilities.
    pub lsh_dropout: f64,
    /// Dropout inside the feed-forward (training only).
    pub ff_dropout: f64,
    /// Feed-forward width multiplier.
    pub ff_mult: usize,
    /// A custom activation class (only `null`, GELU, imports).
    pub ff_activation: Option<serde_json::Value>,
    /// Gated feed-forward.
    pub ff_glu: bool,
    /// Dropout after attention (training only).
    pub post_attn_dropout: f64,
    /// Layer dropout (training only).
    pub layer_dropout: f64,
    /// Rotations per batch row and head.
    pub random_rotations_per_head: bool,
    /// ScaleNorm instead of LayerNorm.
    pub use_scale_norm: bool,
    /// ReZero instead of PreNorm.
    pub use_rezero: bool,
    /// Full attention instead of LSH.
    pub use_full_attn: bool,
    /// Full attention up to this length.
    pub full_attn_thres: usize,
    /// Reversible above this length (no numerical effect).
    pub reverse_thres: usize,
    /// Memory key/values per layer.
    pub num_mem_kv: usize,
    /// One value head shared by the heads.
    pub one_value_head: bool,
    /// Embedding width (projected to `dim`).
    pub emb_dim: Option<usize>,
    /// No output layer.
    pub return_embeddings: bool,
    /// Output tied to the embedding.
    pub weight_tie_embedding: bool,
    /// Sinusoidal absolute positions.
    pub fixed_position_emb: bool,
    /// Learned absolute positions.
    pub absolute_position_emb: bool,
    /// Axial positions.
    pub axial_position_emb: bool,
    /// Axial grid (default: `(ceil(max_seq_len / bucket_size), bucket_size)`).
    pub axial_position_shape: Option<Vec<usize>>,
    /// Local attention heads.
    pub n_local_attn_heads: usize,
    /// Product-key memory layers.
    pub pkm_layers: Vec<usize>,
    /// Product keys.
    pub pkm_num_keys: usize,
}

impl Default for LucidrainsReformerConfig {
    /// `ReformerLM`'s defaults (`num_tokens`, `dim`, `depth`, `max_seq_len` have none: 0).
    fn default() -> Self {
        Self {
            num_tokens: 0,
            dim: 0,
            depth: 0,
            max_seq_len: 0,
            heads: 8,
            dim_head: 64,
            bucket_size: 64,
            n_hashes: 4,
            ff_chunks: 100,
            attn_chunks: 1,
            causal: false,
            weight_tie: false,
            lsh_dropout: 0.0,
            ff_dropout: 0.0,
            ff_mult: 4,
            ff_activation: None,
            ff_glu: false,
            post_attn_dropout: 0.0,
            layer_dropout: 0.0,
            random_rotations_per_head: false,
            use_scale_norm: false,
            use_rezero: false,
            use_full_attn: false,
            full_attn_thres: 0,
            reverse_thres: 0,
            num_mem_kv: 0,
            one_value_head: false,
            emb_dim: None,
            return_embeddings: false,
            weight_tie_embedding: false,
            fixed_position_emb: false,
            absolute_position_emb: false,
            axial_position_emb: false,
            axial_position_shape: None,
            n_local_attn_heads: 0,
            pkm_layers: Vec::new(),
            pkm_num_keys: 128,
        }
    }
}

impl LucidrainsReformerConfig {
    /// Reads `config.json` (unknown arguments are errors naming them).
    pub fn read(path: &Path) -> Result<Self, ImportError> {
        mapping::read_json(path)
    }

    /// The axial grid.
    pub fn axial_shape(&self) -> Vec<usize> {
        self.axial_position_shape.clone().unwrap_or_else(|| {
            vec![
                self.max_seq_len.div_ceil(self.bucket_size.max(1)),
                self.bucket_size,
            ]
        })
    }

    /// The memzoo stack that computes reformer-pytorch's model (see the module docs);
    /// `fixed_buckets`: the LSH layers hold fixed rotations for this many buckets.
    pub fn xl_config(&self, fixed_buckets: Option<usize>) -> Result<XlConfig, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        for (name, v) in [
            ("num_tokens", self.num_tokens),
            ("dim", self.dim),
            ("depth", self.depth),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return no(format!(
                    "{name} is missing from config.json (ReformerLM needs it)"
                ));
            }
        }
        let unsupported = [
            (
                !self.causal,
                "causal = False (memzoo imports the causal language model)",
            ),
            (
                !self.axial_position_emb,
                "axial_position_emb = False (rotary, absolute or fixed positions are not layers \
                 of memzoo's stack)",
            ),
            (self.weight_tie, "weight_tie = True"),
            (self.ff_glu, "ff_glu = True"),
            (
                self.ff_activation.as_ref().is_some_and(|v| !v.is_null()),
                "a custom ff_activation",
            ),
            (
                self.random_rotations_per_head,
                "random_rotations_per_head = True (rotations per batch row)",
            ),
            (self.use_scale_norm, "use_scale_norm = True"),
            (self.use_rezero, "use_rezero = True"),
            (
                self.use_full_attn || self.full_attn_thres > 0,
                "full attention (use_full_attn, full_attn_thres)",
            ),
            (self.num_mem_kv > 0, "num_mem_kv > 0"),
            (self.one_value_head, "one_value_head = True"),
            (
                self.emb_dim.is_some_and(|e| e != self.dim),
                "emb_dim other than dim",
            ),
            (self.return_embeddings, "return_embeddings = True"),
            (self.weight_tie_embedding, "weight_tie_embedding = True"),
            (self.n_local_attn_heads > 0, "n_local_attn_heads > 0"),
            (!self.pkm_layers.is_empty(), "pkm_layers"),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            return no(format!("{what}: memzoo cannot express it"));
        }
        let shape = self.axial_shape();
        let Ok([a1, a2]) = <[usize; 2]>::try_from(shape.clone()) else {
            return no(format!(
                "axial_position_shape {shape:?}: memzoo's axial positions have two axes"
            ));
        };
        let reformer = ReformerConfig::new()
            .with_vocab_size(self.num_tokens)
            .with_d_model(self.dim)
            .with_n_layers(self.depth)
            .with_n_heads(self.heads)
            .with_d_head(self.dim_head)
            .with_d_ff(self.dim * self.ff_mult)
            .with_max_seq_len(a1 * a2)
            .with_attn_layers(vec![LayerKind::Lsh])
            .with_lsh(
                LshConfig::new()
                    .with_scores(LshScores::ScaledUnitKeys)
                    .with_chunk_len(self.bucket_size)
                    .with_n_buckets(fixed_buckets)
                    .with_n_rounds(self.n_hashes)
                    .with_n_chunks_before(1)
                    .with_n_chunks_after(0)
                    .with_causal(true)
                    .with_dedup_rounds(false),
            )
            .with_reversible(true)
            .with_ff_chunk_len(0)
            .with_axial_positions(false)
            .with_dropout(0.0)
            .with_dropatt(self.lsh_dropout)
            .with_ff_activation(Activation::Gelu)
            .with_layer_norm_eps(1e-5)
            .with_head_input(HeadInput::Mean)
            .with_mem_len(0);
        reformer.validate()?;
        let mut xl = reformer.stack();
        xl.lsh = xl
            .lsh
            .with_fixed_rotations(fixed_buckets.is_some())
            .with_output_bias(true);
        let xl = xl.with_axial(Some(
            AxialConfig::new([a1, a2], [self.dim, self.dim])
                .with_summed(true)
                .with_std(Some(1.0)),
        ));
        xl.validate()?;
        Ok(xl)
    }

    /// reformer-pytorch's arguments for a memzoo stack, when `ReformerLM` can express it; the
    /// error names the field that cannot be.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        if xl.layer_kinds().iter().any(|&k| k != LayerKind::Lsh) {
            return no(format!(
                "layers {:?}: ReformerLM's layers are all LSH",
                xl.layer_kinds()
            ));
        }
        let Some(axial) = xl.axial.as_ref().filter(|a| a.summed) else {
            return no(
                "no summed axial positions: ReformerLM's axial positions sum two tables".into(),
            );
        };
        let lsh = &xl.lsh;
        let peer = "ReformerLM";
        mapping::expressible(
            &[
                (
                    xl.compat.head_input != HeadInput::Mean,
                    "compat.head_input other than mean",
                ),
                (lsh.rotations_per_head, "lsh.rotations_per_head = true"),
                (!lsh.bucket_factors.is_empty(), "lsh.bucket_factors"),
                (
                    lsh.scores != LshScores::ScaledUnitKeys || lsh.key_eps != 0.0,
                    "LSH scores other than scaled unit keys",
                ),
                (!lsh.output_bias, "lsh.output_bias = false"),
                (
                    lsh.n_chunks_before != 1 || lsh.n_chunks_after != 0,
                    "chunks other than one back",
                ),
                (
                    xl.ff_activation != Activation::Gelu,
                    "a feed-forward other than GELU",
                ),
                (
                    xl.layer_norm_epsilon != 1e-5,
                    "layer_norm_epsilon other than 1e-5",
                ),
                (
                    !xl.d_inner.is_multiple_of(xl.d_model),
                    "d_inner not a multiple of d_model",
                ),
            ],
            peer,
        )?;
        mapping::expressible(&mapping::reformer_checks(xl), peer)?;
        mapping::expressible(&mapping::rmt_layer_checks(xl), peer)?;
        Ok(Self {
            num_tokens: xl.vocab_size,
            dim: xl.d_model,
            depth: xl.n_layers,
            max_seq_len: axial.shape[0] * axial.shape[1],
            heads: xl.n_heads,
            dim_head: xl.head_width(),
            bucket_size: lsh.chunk_len,
            n_hashes: lsh.n_rounds,
            causal: true,
            lsh_dropout: xl.dropatt,
            ff_mult: xl.d_inner / xl.d_model,
            axial_position_emb: true,
            axial_position_shape: Some(axial.shape.to_vec()),
            ..Self::default()
        })
    }
}

/// reformer-pytorch's `ReformerLM` as a [`PeerFormat`] (`lucidrains-reformer`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LucidrainsReformer;

impl PeerFormat for LucidrainsReformer {
    type Config = LucidrainsReformerConfig;
    const NAME: &'static str = "lucidrains-reformer";

    /// The file itself, or in a directory the first of [`WEIGHT_FILES`] (else its only weight
    /// file); `config.json` and [`ROTATIONS_FILE`] beside it.
    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::locate(src, WEIGHT_FILES, "reformer-pytorch")
    }

    fn read_config(
        &self,
        at: &Located,
        _: &TensorMap,
    ) -> Result<LucidrainsReformerConfig, ImportError> {
        LucidrainsReformerConfig::read(&at.beside("config.json"))
    }

    /// With fixed rotations for the bucket count their shape gives, when [`ROTATIONS_FILE`] is
    /// beside the weights.
    fn stack(
        &self,
        config: &LucidrainsReformerConfig,
        at: &Located,
    ) -> Result<XlConfig, ImportError> {
        config.xl_config(buckets_of(mapping::read_rotations(at)?.as_ref()))
    }

    /// Without reading the rotations: they do not change the model's size.
    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError> {
        let at = self.locate(src)?;
        let config = LucidrainsReformerConfig::read(&at.beside("config.json"))?;
        Ok(Some(config.xl_config(None)?))
    }

    fn map_in(
        &self,
        _: &LucidrainsReformerConfig,
        at: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        mapping::with_rotations(at, |rotations| map_in(tensors, rotations, model, device))
    }

    fn config_of(&self, stack: &XlConfig) -> Result<LucidrainsReformerConfig, ImportError> {
        LucidrainsReformerConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(reformer_to_lucidrains(model, src))
    }

    /// [`ROTATIONS_FILE`] when the layers hold fixed rotations. (`model.safetensors` holds
    /// the state dict without the `irrev_blocks` copies: load it with
    /// `load_state_dict(strict=False)`.)
    fn side_files(&self, model: &TransformerXl) -> Vec<(&'static str, PeerTensors)> {
        vec![(ROTATIONS_FILE, mapping::rotations_of(model))]
    }
}

/// The bucket count fixed rotations are for (`2 x` their last axis), if any.
fn buckets_of(rotations: Option<&TensorMap>) -> Option<usize> {
    let map = rotations?;
    let first = map.names().next()?;
    map.get(first).map(|t| 2 * t.shape()[t.shape().len() - 1])
}

/// Whether `src` holds fixed rotations, and for how many buckets.
pub fn fixed_buckets(src: &Path) -> Result<Option<usize>, ImportError> {
    let at = LucidrainsReformer.locate(src)?;
    Ok(buckets_of(mapping::read_rotations(&at)?.as_ref()))
}

/// Loads a reformer-pytorch `ReformerLM` checkpoint (see the module docs); every tensor is
/// used. Returns its config too.
pub fn load(
    src: &Path,
    device: &Device,
) -> Result<(TransformerXl, LucidrainsReformerConfig), ImportError> {
    let imported = crate::format::import(&LucidrainsReformer, src, device)?;
    Ok((imported.model, imported.peer))
}

/// The irreversible block list (`irrev_blocks`, reformer-pytorch's copy of `blocks` without the
/// reversible wrapper: `f.fn.…` for `f.net.fn.…`), names alone saying which tensor each
/// duplicates.
const IRREVERSIBLE_COPIES: [(&str, &str); 1] = [(
    r"^reformer\.layers\.irrev_blocks\.(\d+)\.([fg])\.(.*)$",
    "reformer.layers.blocks.$1.$2.net.$3",
)];

/// [`load`] from a config and tensors in hand; leaves unknown tensors in the maps.
pub fn reformer_from(
    cfg: &LucidrainsReformerConfig,
    map: &mut TensorMap,
    rotations: Option<&mut TensorMap>,
    fixed_buckets: Option<usize>,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    let mut model = cfg.xl_config(fixed_buckets)?.init(device)?;
    map_in(map, rotations, &mut model, device)?;
    Ok(model)
}

/// The names of a layer's block (the reversible list's `f` and `g` wrappers) in
/// reformer-pytorch's state dict.
fn block_names(l: usize) -> BlockNames {
    let p = format!("reformer.layers.blocks.{l}.");
    BlockNames {
        norm_attention: format!("{p}f.net.norm"),
        norm_ff: format!("{p}g.net.norm"),
        ff_in: format!("{p}g.net.fn.fn.w1"),
        ff_out: format!("{p}g.net.fn.fn.w2"),
    }
}

/// reformer-pytorch's tensors (and the fixed rotations, `layers.{l}`) into `model` (built from
/// [`LucidrainsReformerConfig::xl_config`]).
fn map_in(
    map: &mut TensorMap,
    rotations: Option<&mut TensorMap>,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::tied_copies(map, &IRREVERSIBLE_COPIES)?;
    let mut rotations = rotations;
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let p = format!("reformer.layers.blocks.{l}.f.net.fn.");
        let LayerAttention::Hashed(att) = &mut layer.attention else {
            return Err(XlError::Config(format!("layer {l} is not an LSH layer")).into());
        };
        mapping::linear(map, &format!("{p}toqk"), &mut att.query, false, device)?;
        mapping::linear(map, &format!("{p}tov"), &mut att.value, false, device)?;
        mapping::linear(map, &format!("{p}to_out"), &mut att.output, true, device)?;
        if let Some(r) = rotations.as_deref_mut() {
            mapping::set_fixed_rotations(r, l, att, device)?;
        }
        block_names(l).take(map, &mut layer.block, device)?;
    }
    let final_norm = model
        .final_norm
        .as_mut()
        .ok_or_else(|| XlError::Config("a pre-LN stack without its final norm".into()))?;
    mapping::norm(map, "norm", final_norm, device)?;
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("ReformerLM's embedding is one table".into()).into());
    };
    mapping::embedding(map, "token_emb.weight", embedding, device)?;
    let axial = model
        .axial
        .as_mut()
        .ok_or_else(|| XlError::Config("the stack has no axial positions".into()))?;
    let ([a1, d], [a2, _]) = (axial.rows.dims(), axial.cols.dims());
    let rows = map.float::<4>("pos_emb.weights.0", [1, a1, 1, d], device)?;
    let cols = map.float::<4>("pos_emb.weights.1", [1, 1, a2, d], device)?;
    mapping::set(&mut axial.rows, rows.reshape([a1, d]), "pos_emb.weights.0")?;
    mapping::set(&mut axial.cols, cols.reshape([a2, d]), "pos_emb.weights.1")?;
    let OutputLayer::Linear(output) = &mut model.output else {
        return Err(XlError::Config("ReformerLM's output is a linear layer".into()).into());
    };
    mapping::linear(map, "out.1", output, true, device)
}

/// A ReformerLM-shaped stack's tensors (or gradients) under reformer-pytorch's names (the
/// reversible block list's; `named_parameters` gives those), the inverse of the import.
pub fn reformer_to_lucidrains(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    for (l, layer) in model.layers.iter().enumerate() {
        let p = format!("reformer.layers.blocks.{l}.");
        if let LayerAttention::Hashed(att) = &layer.attention {
            put_linear(&mut out, &format!("{p}f.net.fn.toqk"), &att.query, src);
            put_linear(&mut out, &format!("{p}f.net.fn.tov"), &att.value, src);
            put_linear(&mut out, &format!("{p}f.net.fn.to_out"), &att.output, src);
        }
        block_names(l).put(&mut out, &layer.block, src);
    }
    if let Some(n) = &model.final_norm {
        put_norm(&mut out, "norm", n, src);
    }
    if let InputEmbedding::Plain(e) = &model.embedding {
        put(&mut out, "token_emb.weight".into(), src.get(&e.weight));
    }
    if let Some(axial) = &model.axial {
        let ([a1, d1], [a2, d2]) = (axial.rows.dims(), axial.cols.dims());
        put(
            &mut out,
            "pos_emb.weights.0".into(),
            src.get(&axial.rows).map(|t| t.reshape([1, a1, 1, d1])),
        );
        put(
            &mut out,
            "pos_emb.weights.1".into(),
            src.get(&axial.cols).map(|t| t.reshape([1, 1, a2, d2])),
        );
    }
    if let OutputLayer::Linear(o) = &model.output {
        put_linear(&mut out, "out.1", o, src);
    }
    out
}

/// Writes a reformer-pytorch checkpoint directory ([`LucidrainsReformer`]'s
/// [`PeerFormat::write`]); the config must be expressible
/// ([`LucidrainsReformerConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&LucidrainsReformer, model, xl, dir)
}

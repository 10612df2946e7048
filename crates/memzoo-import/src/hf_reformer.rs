//! HF transformers' Reformer (`ReformerModelWithLMHead`, transformers 5.x) checkpoints in memzoo.
//!
//! A directory with `config.json` (HF's `ReformerConfig`) and `model.safetensors` or
//! `pytorch_model.bin` (pickle parsed, never run) imports into memzoo's layer stack as the
//! Reformer preset ([`memzoo_stack::ReformerConfig::stack`]) with the options that make it HF's
//! function:
//! - `attn_layers` as the layers (`lsh` / `local`), reversible residuals, pre-LN blocks with
//!   `layer_norm_eps` (HF's default 1e-12), a ReLU or GELU (erf) feed-forward with biases
//!   chunked by `chunk_size_feed_forward`, axial positions `axial_pos_shape` /
//!   `axial_pos_embds_dim` added to unscaled token embeddings;
//! - HF's head (`head_input = "concat"`): a LayerNorm over `cat(y_1, y_2)` (`2 d_model`) and a
//!   decoder from `2 d_model` with a bias;
//! - LSH layers: chunks of `lsh_attn_chunk_length` with `lsh_num_chunks_before/after`,
//!   `num_hashes` rounds, `num_buckets` as one count or factorised (`[a, b]`:
//!   `lsh.bucket_factors`), rotations per head (`lsh.rotations_per_head`), shared-QK keys
//!   normalised as HF's `_len_and_dim_norm` (`q rsqrt(mean(q²) + 1e-6) / sqrt(d_head)`:
//!   `lsh.scores = "unit_keys"`, `lsh.key_eps = 1e-6`), no further `1/sqrt(d_head)`, no
//!   de-duplication of hash rounds (`lsh.dedup_rounds = false`);
//! - local layers: their own chunk length and neighbours (`lsh.local_chunk_len`,
//!   `lsh.local_n_chunks_before/after`), scores `q·k / sqrt(d_head)`.
//!
//! HF has no memory across segments: each call reads one sequence (`mem_len = 0`). HF draws new
//! LSH rotations with `torch.randn` on every forward pass (unless `hash_seed`, which reseeds
//! torch's generator: memzoo cannot replay torch's generator). memzoo draws them from its
//! own seed (fixed in evaluation, fresh per training step), so an imported model computes HF's
//! function for *other* random rotations. To reproduce one HF pass exactly, save the rotations
//! HF drew (`[heads, d_head, num_hashes, Σ num_buckets / 2]` per LSH layer, e.g. by wrapping
//! `LSHSelfAttention._hash_vectors` as `xtask/peers/fixtures/hf_reformer.py` does) as
//! `rotations.safetensors` (`layers.{l}`) beside the model: the import then keeps them as the
//! layers' fixed rotations (`lsh.fixed_rotations = true`), used by every pass but training steps.
//!
//! The LM head's bias: transformers 5.x builds `lm_head.decoder` with `bias=False` and never
//! adds `lm_head.bias` (it loads and ignores it; a model trained with 5.x keeps it at its
//! initial zeros), where 4.x tied `lm_head.decoder.bias` to it and added it. memzoo adds it, as
//! 4.x and the model as trained (`google/reformer-enwik8` has one): for a 5.x checkpoint whose
//! bias is not zero, memzoo's logits are 5.x's plus that bias.
//!
//! Older checkpoints hold HF's mask constants as buffers (`….self_attention.mask_value_float32`
//! and the like); they are taken, and must hold HF's values.
//!
//! Differences in training only (dropout sites): HF drops the token embedding before adding the
//! positions and the feed-forward's hidden layer before its activation; memzoo drops the sum and
//! not inside the feed-forward. In evaluation the two are the same function.
//!
//! | HF (`l` a layer) | memzoo |
//! |---|---|
//! | `reformer.embeddings.word_embeddings.weight` `[V, d]` | the plain embedding |
//! | `reformer.embeddings.position_embeddings.weights.0` `[a_1, 1, d_1]`, `.1` `[1, a_2, d_2]` | `axial.rows`, `axial.cols` |
//! | `reformer.encoder.layers.l.attention.layer_norm` | `block.norm_attention` |
//! | `….attention.self_attention.query_key.weight` (LSH) / `.query.weight`, `.key.weight` (local) | `attention.query` / `attention.key` (transposed) |
//! | `….attention.self_attention.value.weight`, `….attention.output.dense.weight` | `attention.value`, `attention.output` |
//! | `….feed_forward.layer_norm`, `….feed_forward.dense.dense`, `….feed_forward.output.dense` | `block.norm_ff`, `block.ff_in`, `block.ff_out` |
//! | `reformer.encoder.layer_norm` `[2d]` | the final norm |
//! | `lm_head.decoder.weight` `[V, 2d]`, `lm_head.bias` (= `lm_head.decoder.bias`) | the linear output |

use std::path::Path;

use burn::tensor::Device;
use memzoo_reformer::LshConfig;
use memzoo_stack::{
    Activation, HeadInput, InputEmbedding, LayerAttention, LayerKind, OutputLayer, ReformerConfig,
    TransformerXl, XlConfig, XlError,
};
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::format::PeerFormat;
use crate::mapping::{self, BlockNames, Located, PeerTensors, Source, put, put_linear, put_norm};
use crate::reader::TensorMap;

/// The file of fixed LSH rotations read beside a checkpoint (`layers.{l}` per LSH layer).
pub use crate::mapping::{ROTATIONS_FILE, rotations_of};

/// Vocabulary of `google/reformer-enwik8`: the 256 bytes after tensor2tensor's two reserved ids.
pub const ENWIK8_VOCAB: usize = 258;

/// Id of byte 0 in `google/reformer-enwik8` (its model card encodes `list(s.encode("utf-8")) +
/// 2`): tensor2tensor's `ByteTextEncoder` reserves PAD 0 and EOS 1, and trax trained the model
/// on enwik8 so encoded.
pub const ENWIK8_BYTE_OFFSET: u16 = 2;

/// The byte offset (id of byte 0, a run's `data.byte_offset`) of an HF Reformer with this
/// vocabulary: [`ENWIK8_BYTE_OFFSET`] for a vocabulary of exactly [`ENWIK8_VOCAB`], else 0.
///
/// HF's config has no field for it (`google/reformer-enwik8` ships no tokenizer; the model card
/// adds the 2 by hand), so the vocabulary decides: 258 is 256 bytes + tensor2tensor's 2
/// reserved ids and no other byte layout; `crime-and-punishment` (sentencepiece, 320) and any
/// other size keep 0, and `data.byte_offset` in the run's config.toml overrides either.
pub fn byte_offset(vocab_size: usize) -> u16 {
    if vocab_size == ENWIK8_VOCAB {
        ENWIK8_BYTE_OFFSET
    } else {
        0
    }
}

/// HF's key normalisation epsilon (`LSHSelfAttention._len_norm`).
const KEY_EPS: f64 = 1e-6;

/// HF's `num_buckets`: one count, a factorised list, or unset (HF then picks it from the first
/// sequence's length).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum NumBuckets {
    /// One count per round.
    One(usize),
    /// Factors `[f_1, .., f_k]`: `Π f_i` buckets.
    Factors(Vec<usize>),
}

/// HF's `ReformerConfig` (the fields that shape the model; field names and defaults are HF's).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct HfReformerConfig {
    /// Width of one head.
    pub attention_head_size: usize,
    /// Attention kind per layer, `"lsh"` or `"local"`; its length is the number of layers.
    pub attn_layers: Vec<String>,
    /// Std of the axial tables' initialiser.
    pub axial_norm_std: f64,
    /// Axial positions (else a learned table per position, which memzoo has no layer for).
    pub axial_pos_embds: bool,
    /// Axial grid.
    pub axial_pos_shape: Vec<usize>,
    /// Axial widths (sum: `hidden_size`).
    pub axial_pos_embds_dim: Vec<usize>,
    /// Positions per LM-head chunk (no numerical effect).
    pub chunk_size_lm_head: usize,
    /// Positions per feed-forward chunk (0: all).
    pub chunk_size_feed_forward: usize,
    /// Feed-forward width.
    pub feed_forward_size: usize,
    /// Seed of the LSH rotations (torch's generator; not reproducible outside torch).
    pub hash_seed: Option<u64>,
    /// Feed-forward activation.
    pub hidden_act: String,
    /// Dropout on embeddings, branch outputs, feed-forward and the head's input.
    pub hidden_dropout_prob: f64,
    /// Model width.
    pub hidden_size: usize,
    /// Std of the initialiser.
    pub initializer_range: f64,
    /// Causal (a language model).
    pub is_decoder: bool,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Local layers: chunks before.
    pub local_num_chunks_before: usize,
    /// Local layers: chunks after.
    pub local_num_chunks_after: usize,
    /// Local layers: attention dropout.
    pub local_attention_probs_dropout_prob: f64,
    /// Local layers: chunk length.
    pub local_attn_chunk_length: usize,
    /// LSH layers: chunk length.
    pub lsh_attn_chunk_length: Option<usize>,
    /// LSH layers: attention dropout.
    pub lsh_attention_probs_dropout_prob: Option<f64>,
    /// LSH layers: chunks before.
    pub lsh_num_chunks_before: Option<usize>,
    /// LSH layers: chunks after.
    pub lsh_num_chunks_after: Option<usize>,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// Heads per layer.
    pub num_attention_heads: usize,
    /// LSH buckets per round.
    pub num_buckets: Option<NumBuckets>,
    /// LSH hash rounds.
    pub num_hashes: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Decoder tied to the embedding (impossible for the `2 d_model` decoder).
    pub tie_word_embeddings: bool,
}

impl Default for HfReformerConfig {
    /// transformers 5's `ReformerConfig` defaults.
    fn default() -> Self {
        Self {
            attention_head_size: 64,
            attn_layers: ["local", "lsh", "local", "lsh", "local", "lsh"]
                .map(String::from)
                .to_vec(),
            axial_norm_std: 1.0,
            axial_pos_embds: true,
            axial_pos_shape: vec![64, 64],
            axial_pos_embds_dim: vec![64, 192],
            chunk_size_lm_head: 0,
            chunk_size_feed_forward: 0,
            feed_forward_size: 512,
            hash_seed: None,
            hidden_act: "relu".into(),
            hidden_dropout_prob: 0.05,
            hidden_size: 256,
            initializer_range: 0.02,
            is_decoder: false,
            layer_norm_eps: 1e-12,
            local_num_chunks_before: 1,
            local_num_chunks_after: 0,
            local_attention_probs_dropout_prob: 0.05,
            local_attn_chunk_length: 64,
            lsh_attn_chunk_length: Some(64),
            lsh_attention_probs_dropout_prob: Some(0.0),
            lsh_num_chunks_before: Some(1),
            lsh_num_chunks_after: Some(0),
            max_position_embeddings: 4096,
            num_attention_heads: 12,
            num_buckets: None,
            num_hashes: 1,
            vocab_size: 320,
            tie_word_embeddings: false,
        }
    }
}

impl HfReformerConfig {
    /// Reads `config.json`.
    pub fn read(path: &Path) -> Result<Self, ImportError> {
        let read_err = |message: String| ImportError::Read {
            path: path.to_path_buf(),
            message,
        };
        let text = crate::reader::read_config_text(path)?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| read_err(e.to_string()))?;
        if let Some(t) = value.get("model_type").and_then(|t| t.as_str())
            && t != "reformer"
        {
            return Err(read_err(format!(
                "model_type = \"{t}\": hf-reformer reads HF's Reformer (\"reformer\")"
            )));
        }
        serde_json::from_value(value).map_err(|e| read_err(e.to_string()))
    }

    /// The layer kinds of `attn_layers`.
    fn kinds(&self) -> Result<Vec<LayerKind>, ImportError> {
        self.attn_layers
            .iter()
            .map(|k| match k.as_str() {
                "lsh" => Ok(LayerKind::Lsh),
                "local" => Ok(LayerKind::Local),
                other => Err(ImportError::Unsupported(format!(
                    "attn_layers entry \"{other}\": HF's Reformer has \"lsh\" and \"local\""
                ))),
            })
            .collect()
    }

    /// The memzoo stack that computes HF's model (see the module docs); `fixed_rotations`: the
    /// LSH layers hold fixed rotations.
    pub fn xl_config(&self, fixed_rotations: bool) -> Result<XlConfig, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        let kinds = self.kinds()?;
        if !self.is_decoder {
            return no("is_decoder = false: only the causal language model \
                 (ReformerModelWithLMHead) imports; HF's bidirectional local attention wraps \
                 around the sequence"
                .into());
        }
        if !self.axial_pos_embds {
            return no(
                "axial_pos_embds = false: a learned table per position is not a layer \
                 of memzoo's stack"
                    .into(),
            );
        }
        if self.tie_word_embeddings {
            return no("tie_word_embeddings = true: HF's decoder reads 2 x hidden_size".into());
        }
        let (Ok([a1, a2]), Ok([d1, d2])) = (
            <[usize; 2]>::try_from(self.axial_pos_shape.clone()),
            <[usize; 2]>::try_from(self.axial_pos_embds_dim.clone()),
        ) else {
            return no(format!(
                "axial_pos_shape {:?} / axial_pos_embds_dim {:?}: memzoo's axial positions \
                 have two axes",
                self.axial_pos_shape, self.axial_pos_embds_dim
            ));
        };
        let activation = match self.hidden_act.as_str() {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            other => {
                return no(format!(
                    "hidden_act = \"{other}\": memzoo has relu and gelu"
                ));
            }
        };
        let (n_buckets, factors) = match &self.num_buckets {
            Some(NumBuckets::One(n)) => (Some(*n), Vec::new()),
            Some(NumBuckets::Factors(f)) if f.len() == 1 => (Some(f[0]), Vec::new()),
            Some(NumBuckets::Factors(f)) => (None, f.clone()),
            None if kinds.contains(&LayerKind::Lsh) => {
                return no(
                    "num_buckets = null: HF picks it from the length of the first \
                     sequence it reads (and writes it into its config); set num_buckets in \
                     config.json"
                        .into(),
                );
            }
            None => (None, Vec::new()),
        };
        let lsh_chunk = match self.lsh_attn_chunk_length {
            Some(c) => c,
            None if kinds.contains(&LayerKind::Lsh) => {
                return no("lsh_attn_chunk_length = null (unchunked LSH attention)".into());
            }
            None => self.local_attn_chunk_length,
        };
        let reformer = ReformerConfig::new()
            .with_vocab_size(self.vocab_size)
            .with_d_model(self.hidden_size)
            .with_n_layers(kinds.len())
            .with_n_heads(self.num_attention_heads)
            .with_d_head(self.attention_head_size)
            .with_d_ff(self.feed_forward_size)
            .with_max_seq_len(a1 * a2)
            .with_attn_layers(kinds)
            .with_lsh(
                LshConfig::new()
                    .with_chunk_len(lsh_chunk)
                    .with_n_buckets(n_buckets)
                    .with_n_rounds(self.num_hashes)
                    .with_n_chunks_before(self.lsh_num_chunks_before.unwrap_or(1))
                    .with_n_chunks_after(self.lsh_num_chunks_after.unwrap_or(0))
                    .with_causal(true)
                    .with_local_chunk_len(Some(self.local_attn_chunk_length))
                    .with_bucket_factors(factors)
                    .with_dedup_rounds(false)
                    .with_rotations_per_head(true)
                    .with_key_eps(KEY_EPS),
            )
            .with_reversible(true)
            .with_ff_chunk_len(self.chunk_size_feed_forward)
            .with_axial_positions(true)
            .with_axial_shape(Some([a1, a2]))
            .with_axial_dims(Some([d1, d2]))
            .with_dropout(self.hidden_dropout_prob)
            .with_dropatt(self.lsh_attention_probs_dropout_prob.unwrap_or(0.0))
            .with_init_std(self.initializer_range)
            .with_axial_std(Some(self.axial_norm_std))
            .with_mem_len(0)
            .with_layer_norm_eps(self.layer_norm_eps)
            .with_ff_activation(activation)
            .with_head_input(HeadInput::Concat);
        reformer.validate()?;
        let mut xl = reformer.stack();
        xl.lsh = xl
            .lsh
            .with_fixed_rotations(fixed_rotations)
            .with_local_n_chunks_before(Some(self.local_num_chunks_before))
            .with_local_n_chunks_after(Some(self.local_num_chunks_after));
        // HF drops the head's input (after the final LayerNorm) in training.
        let xl = xl.with_final_dropout(true);
        xl.validate()?;
        Ok(xl)
    }

    /// HF's config of a memzoo stack, when HF's Reformer can express it; the error names the
    /// field that cannot be.
    pub fn from_xl(xl: &XlConfig) -> Result<Self, ImportError> {
        let no = |m: String| Err(ImportError::Unsupported(m));
        let mut attn_layers = Vec::new();
        for k in xl.layer_kinds() {
            attn_layers.push(match k {
                LayerKind::Lsh => "lsh".to_string(),
                LayerKind::Local => "local".to_string(),
                other => {
                    return no(format!(
                        "a {other:?} layer: HF's Reformer has only lsh and local layers"
                    ));
                }
            });
        }
        let Some(axial) = &xl.axial else {
            return no("no axial positions: HF's Reformer needs axial or absolute ones".into());
        };
        let lsh = &xl.lsh;
        let peer = "HF's Reformer";
        mapping::expressible(
            &[
                (
                    xl.compat.head_input != HeadInput::Concat,
                    "compat.head_input other than concat",
                ),
                (!lsh.rotations_per_head, "lsh.rotations_per_head = false"),
                (
                    lsh.scores != memzoo_reformer::LshScores::UnitKeys || lsh.key_eps != KEY_EPS,
                    "LSH scores other than unit keys with key_eps = 1e-6",
                ),
                (xl.ff_inner_dropout, "ff_inner_dropout = true"),
            ],
            peer,
        )?;
        mapping::expressible(&mapping::reformer_checks(xl), peer)?;
        mapping::expressible(&mapping::rmt_layer_checks(xl), peer)?;
        let num_buckets = match (&lsh.bucket_factors[..], lsh.n_buckets) {
            ([], Some(n)) => Some(NumBuckets::One(n)),
            ([], None) => None,
            (f, _) => Some(NumBuckets::Factors(f.to_vec())),
        };
        Ok(Self {
            attention_head_size: xl.head_width(),
            attn_layers,
            axial_norm_std: axial.std.unwrap_or(xl.init_std),
            axial_pos_embds: true,
            axial_pos_shape: axial.shape.to_vec(),
            axial_pos_embds_dim: axial.dims.to_vec(),
            chunk_size_lm_head: 0,
            chunk_size_feed_forward: xl.ff_chunk_len,
            feed_forward_size: xl.d_inner,
            hash_seed: None,
            hidden_act: match xl.ff_activation {
                Activation::Relu => "relu".into(),
                Activation::Gelu => "gelu".into(),
                // Refused above (`rmt_layer_checks`).
                Activation::Geglu => return no("ff_activation = \"geglu\"".into()),
            },
            hidden_dropout_prob: xl.dropout,
            hidden_size: xl.d_model,
            initializer_range: xl.init_std,
            is_decoder: true,
            layer_norm_eps: xl.layer_norm_epsilon,
            local_num_chunks_before: lsh.local_n_chunks_before.unwrap_or(lsh.n_chunks_before),
            local_num_chunks_after: lsh.local_n_chunks_after.unwrap_or(lsh.n_chunks_after),
            local_attention_probs_dropout_prob: xl.dropatt,
            local_attn_chunk_length: lsh.local_chunk_len.unwrap_or(lsh.chunk_len),
            lsh_attn_chunk_length: Some(lsh.chunk_len),
            lsh_attention_probs_dropout_prob: Some(xl.dropatt),
            lsh_num_chunks_before: Some(lsh.n_chunks_before),
            lsh_num_chunks_after: Some(lsh.n_chunks_after),
            max_position_embeddings: axial.shape[0] * axial.shape[1],
            num_attention_heads: xl.n_heads,
            num_buckets,
            num_hashes: lsh.n_rounds,
            vocab_size: xl.vocab_size,
            tie_word_embeddings: false,
        })
    }
}

/// HF's `ReformerModelWithLMHead` as a [`PeerFormat`] (`hf-reformer`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HfReformer;

impl PeerFormat for HfReformer {
    type Config = HfReformerConfig;
    const NAME: &'static str = "hf-reformer";

    /// A model directory ([`mapping::model_dir`]), perhaps with [`ROTATIONS_FILE`].
    fn locate(&self, src: &Path) -> Result<Located, ImportError> {
        mapping::model_dir(src)
    }

    fn read_config(&self, at: &Located, _: &TensorMap) -> Result<HfReformerConfig, ImportError> {
        HfReformerConfig::read(&at.beside("config.json"))
    }

    /// With fixed rotations when [`ROTATIONS_FILE`] is beside the weights.
    fn stack(&self, config: &HfReformerConfig, at: &Located) -> Result<XlConfig, ImportError> {
        config.xl_config(at.beside(ROTATIONS_FILE).is_file())
    }

    /// Without reading the rotations: they do not change the model's size.
    fn stack_from_config(&self, src: &Path) -> Result<Option<XlConfig>, ImportError> {
        let at = self.locate(src)?;
        Ok(Some(
            HfReformerConfig::read(&at.beside("config.json"))?.xl_config(false)?,
        ))
    }

    fn map_in(
        &self,
        _: &HfReformerConfig,
        at: &Located,
        tensors: &mut TensorMap,
        model: &mut TransformerXl,
        device: &Device,
    ) -> Result<(), ImportError> {
        mapping::with_rotations(at, |rotations| map_in(tensors, rotations, model, device))
    }

    fn config_of(&self, stack: &XlConfig) -> Result<HfReformerConfig, ImportError> {
        HfReformerConfig::from_xl(stack)
    }

    fn map_out(&self, model: &TransformerXl, src: Source<'_>) -> Result<PeerTensors, ImportError> {
        Ok(reformer_to_hf(model, src))
    }

    /// HF's `ReformerConfig`, `model_type` `reformer` (load the export with
    /// `ReformerModelWithLMHead.from_pretrained`).
    fn config_json(&self, config: &HfReformerConfig) -> Result<serde_json::Value, ImportError> {
        let mut json = mapping::to_json(config)?;
        json["model_type"] = "reformer".into();
        json["architectures"] = serde_json::json!(["ReformerModelWithLMHead"]);
        json["num_hidden_layers"] = config.attn_layers.len().into();
        Ok(json)
    }

    /// [`ROTATIONS_FILE`] when the layers hold fixed rotations.
    fn side_files(&self, model: &TransformerXl) -> Vec<(&'static str, PeerTensors)> {
        vec![(ROTATIONS_FILE, rotations_of(model))]
    }

    /// 2 for `google/reformer-enwik8`'s vocabulary of 258 ([`byte_offset`]), else 0.
    fn byte_offset(&self, stack: &XlConfig) -> u16 {
        byte_offset(stack.vocab_size)
    }
}

/// Loads an HF Reformer directory (`config.json`, weights, and perhaps
/// [`ROTATIONS_FILE`]); every tensor is used. Returns HF's config too.
pub fn load(dir: &Path, device: &Device) -> Result<(TransformerXl, HfReformerConfig), ImportError> {
    let imported = crate::format::import(&HfReformer, dir, device)?;
    Ok((imported.model, imported.peer))
}

/// HF's mask constants, which older checkpoints (transformers before 4.x made them
/// non-persistent) saved as buffers: `(name, value)`.
const MASK_BUFFERS: [(&str, f32); 4] = [
    ("self_mask_value_float16", -1e3),
    ("self_mask_value_float32", -1e5),
    ("mask_value_float16", -1e4),
    ("mask_value_float32", -1e9),
];

/// Takes the mask-constant buffers of an attention layer (`prefix`: `….self_attention.`) if the
/// checkpoint holds them; a value other than HF's is an error naming it (memzoo masks with
/// -1e9 and scores a query's own key below every other visible key, as HF's constants do).
fn mask_buffers(map: &mut TensorMap, prefix: &str) -> Result<(), ImportError> {
    for (buffer, value) in MASK_BUFFERS {
        let name = format!("{prefix}{buffer}");
        if let Some(t) = map.take_optional(&name, &[])? {
            let got = crate::reader::float_data(&name, t)?
                .try_to_vec::<f32>()
                .unwrap_or_default();
            if got != [value] {
                return Err(ImportError::Value {
                    name,
                    message: format!("holds {got:?}, HF's constant is {value:e}"),
                });
            }
        }
    }
    Ok(())
}

/// [`load`] from a config and tensors in hand (and the fixed rotations, `layers.{l}`); leaves
/// unknown tensors in the maps.
pub fn reformer_from(
    cfg: &HfReformerConfig,
    map: &mut TensorMap,
    rotations: Option<&mut TensorMap>,
    device: &Device,
) -> Result<TransformerXl, ImportError> {
    let mut model = cfg.xl_config(rotations.is_some())?.init(device)?;
    map_in(map, rotations, &mut model, device)?;
    Ok(model)
}

/// The names of a layer's block in HF's state dict.
fn block_names(l: usize) -> BlockNames {
    let pre = format!("reformer.encoder.layers.{l}.");
    BlockNames {
        norm_attention: format!("{pre}attention.layer_norm"),
        norm_ff: format!("{pre}feed_forward.layer_norm"),
        ff_in: format!("{pre}feed_forward.dense.dense"),
        ff_out: format!("{pre}feed_forward.output.dense"),
    }
}

/// `save_pretrained` keeps one name of the tied LM-head bias; a `pytorch_model.bin` has both,
/// which must agree.
const TIED_COPIES: [(&str, &str); 1] = [(r"^lm_head\.decoder\.bias$", "lm_head.bias")];

/// HF's tensors (and the fixed rotations, `layers.{l}`) into `model` (built from
/// [`HfReformerConfig::xl_config`]).
fn map_in(
    map: &mut TensorMap,
    rotations: Option<&mut TensorMap>,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::tied_copies(map, &TIED_COPIES)?;
    let mut rotations = rotations;
    for (l, layer) in model.layers.iter_mut().enumerate() {
        let a = format!("reformer.encoder.layers.{l}.attention.");
        let LayerAttention::Hashed(att) = &mut layer.attention else {
            return Err(XlError::Config(format!("layer {l} is not an lsh or local layer")).into());
        };
        let s = format!("{a}self_attention.");
        if att.key.is_some() {
            mapping::linear(map, &format!("{s}query"), &mut att.query, false, device)?;
        } else {
            mapping::linear(map, &format!("{s}query_key"), &mut att.query, false, device)?;
        }
        if let Some(key) = &mut att.key {
            mapping::linear(map, &format!("{s}key"), key, false, device)?;
        }
        if att.key.is_none()
            && let Some(r) = rotations.as_deref_mut()
        {
            mapping::set_fixed_rotations(r, l, att, device)?;
        }
        mask_buffers(map, &s)?;
        mapping::linear(map, &format!("{s}value"), &mut att.value, false, device)?;
        mapping::linear(
            map,
            &format!("{a}output.dense"),
            &mut att.output,
            false,
            device,
        )?;
        block_names(l).take(map, &mut layer.block, device)?;
    }
    let final_norm = model
        .final_norm
        .as_mut()
        .ok_or_else(|| XlError::Config("a pre-LN stack without its final norm".into()))?;
    mapping::norm(map, "reformer.encoder.layer_norm", final_norm, device)?;
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("HF's embedding is one table".into()).into());
    };
    mapping::embedding(
        map,
        "reformer.embeddings.word_embeddings.weight",
        embedding,
        device,
    )?;
    let axial = model
        .axial
        .as_mut()
        .ok_or_else(|| XlError::Config("the stack has no axial positions".into()))?;
    let ([a1, d1], [a2, d2]) = (axial.rows.dims(), axial.cols.dims());
    let p = "reformer.embeddings.position_embeddings.weights";
    let rows = map.float::<3>(&format!("{p}.0"), [a1, 1, d1], device)?;
    let cols = map.float::<3>(&format!("{p}.1"), [1, a2, d2], device)?;
    mapping::set(&mut axial.rows, rows.reshape([a1, d1]), &format!("{p}.0"))?;
    mapping::set(&mut axial.cols, cols.reshape([a2, d2]), &format!("{p}.1"))?;
    let OutputLayer::Linear(output) = &mut model.output else {
        return Err(XlError::Config("HF's decoder is a linear layer".into()).into());
    };
    let [_, v] = output.weight.dims();
    let name = "lm_head.decoder.weight";
    let w = mapping::from_torch(map.float(name, [v, output.weight.dims()[0]], device)?);
    let b = map.float("lm_head.bias", [v], device)?;
    mapping::set_linear(output, w, Some(b), name)
}

/// An HF-shaped Reformer stack's tensors (or gradients) under HF's names (the inverse of the
/// import mapping; the tied `lm_head.decoder.bias` under `lm_head.bias` only, as
/// `save_pretrained` writes it). Fixed rotations are not HF parameters and are left out.
pub fn reformer_to_hf(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    for (l, layer) in model.layers.iter().enumerate() {
        let pre = format!("reformer.encoder.layers.{l}.");
        let a = format!("{pre}attention.");
        if let LayerAttention::Hashed(att) = &layer.attention {
            let s = format!("{a}self_attention.");
            match &att.key {
                Some(key) => {
                    put_linear(&mut out, &format!("{s}query"), &att.query, src);
                    put_linear(&mut out, &format!("{s}key"), key, src);
                }
                None => put_linear(&mut out, &format!("{s}query_key"), &att.query, src),
            }
            put_linear(&mut out, &format!("{s}value"), &att.value, src);
            put_linear(&mut out, &format!("{a}output.dense"), &att.output, src);
        }
        block_names(l).put(&mut out, &layer.block, src);
    }
    if let Some(n) = &model.final_norm {
        put_norm(&mut out, "reformer.encoder.layer_norm", n, src);
    }
    if let InputEmbedding::Plain(e) = &model.embedding {
        put(
            &mut out,
            "reformer.embeddings.word_embeddings.weight".into(),
            src.get(&e.weight),
        );
    }
    if let Some(axial) = &model.axial {
        let ([a1, d1], [a2, d2]) = (axial.rows.dims(), axial.cols.dims());
        let p = "reformer.embeddings.position_embeddings.weights";
        put(
            &mut out,
            format!("{p}.0"),
            src.get(&axial.rows).map(|t| t.reshape([a1, 1, d1])),
        );
        put(
            &mut out,
            format!("{p}.1"),
            src.get(&axial.cols).map(|t| t.reshape([1, a2, d2])),
        );
    }
    if let OutputLayer::Linear(o) = &model.output {
        put(
            &mut out,
            "lm_head.decoder.weight".into(),
            src.get(&o.weight).map(|w| w.transpose()),
        );
        if let Some(b) = &o.bias {
            put(&mut out, "lm_head.bias".into(), src.get(b));
        }
    }
    out
}

/// Writes an HF Reformer directory ([`HfReformer`]'s [`PeerFormat::write`]); the config
/// must be HF-shaped ([`HfReformerConfig::from_xl`]).
pub fn export(model: &TransformerXl, xl: &XlConfig, dir: &Path) -> Result<(), ImportError> {
    crate::format::export(&HfReformer, model, xl, dir)
}

//! `cargo xtask bench quality`: learning curves of memzoo and its PyTorch peers, side by side.
//!
//! For each family ([`xl_small`], [`reformer_small`], [`memorizing_small`],
//! [`compressive_small`], [`rmt_small`], [`block_recurrent_small`]) memzoo trains with
//! the real trainer ([`memzoo_train::train`]) on a text file split as `memzoo train --data FILE`
//! splits it (last 5% of the bytes valid, the 5% before it test, the rest train; ordered
//! batches of `batch` contiguous rows, memory carried), checkpointing at every evaluation
//! point. Each of those checkpoints is then scored on the **whole validation split, in order,
//! memory carried** ([`memzoo_train::evaluate`]), cut into `batch` contiguous rows as `memzoo
//! train` evaluates (`../shared/peers/quality_tfxl.py` reads it as one row: that starts cold once
//! instead of 8 times and runs several times slower). The peer, `xtask/peers/quality.py`,
//! trains the same shape with the same recipe ([`train_config`]; the numbers are passed to it
//! as JSON, so they live only here) and scores the same tokens at the same steps. Where memzoo's
//! model is the import of the peer's ([`Family::peer_format`]), both start from the peer's
//! seeded initial weights (`quality.py --init-out`, imported by memzoo).
//!
//! Every point of both curves is one JSON line
//! (`{"kind":"quality","family","impl","step","valid_bpc","train_loss","wall_s"}`; `train_loss`
//! is the mean training loss in nats over the last `gcd(10, eval points)` steps, `wall_s` the
//! training seconds up to that step, evaluations excluded), then a Markdown table and one SVG
//! chart per family (`quality-<family>.svg`).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use burn::tensor::Device;
use memzoo_data::{ByteTokenizer, Corpus, OrderedBatcher, SplitRule, Token};
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::MemorizingConfig;
use memzoo_stack::XlConfig;
use memzoo_stack::{LshConfig, ReformerConfig};
use memzoo_train::{RunOptions, SegmentModel, TrainConfig, checkpoint, evaluate};
use serde::{Deserialize, Serialize};

use crate::BenchArgs;
use crate::plot::{Axes, Series, chart};

/// The families, in the order they run by default.
pub const FAMILIES: [&str; 6] = [
    "xl",
    "reformer",
    "memorizing",
    "compressive",
    "rmt",
    "block-recurrent",
];

/// Default evaluation points (those within `--steps`, and `--steps` itself).
pub const DEFAULT_EVAL_AT: [usize; 5] = [50, 100, 200, 300, 400];

/// One point of a learning curve.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct QualityPoint {
    /// Always `quality`.
    pub kind: String,
    /// `xl`, `reformer` or `memorizing`.
    pub family: String,
    /// `memzoo` or the peer's name.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Optimizer steps done.
    pub step: usize,
    /// Bits per byte over the whole validation split.
    pub valid_bpc: f64,
    /// Mean training loss (nats) over the last steps before `step`.
    pub train_loss: f64,
    /// Training seconds up to `step` (evaluations excluded).
    pub wall_s: f64,
}

/// A memzoo model configuration of one family.
pub enum FamilyModel {
    /// Transformer-XL.
    Xl(XlConfig),
    /// Reformer.
    Reformer(ReformerConfig),
    /// Memorizing Transformer.
    Memorizing(MemorizingConfig),
}

/// One family: memzoo's config, the batch shape, and the peer's arguments (from the same
/// numbers).
pub struct Family {
    /// `xl`, `reformer` or `memorizing`.
    pub name: &'static str,
    /// memzoo's model.
    pub model: FamilyModel,
    /// Rows per step.
    pub batch: usize,
    /// Tokens per row and segment (and per evaluation segment); a step reads the model's
    /// `bptt_segments` segments of it (1 but for the RMT).
    pub tgt_len: usize,
    /// The peer's model arguments (`--config {"model": ...}` of `quality.py`).
    pub peer_model: serde_json::Value,
    /// The peer's virtual environment under `~/.cache/memzoo-peers`.
    pub peer_venv: &'static str,
    /// The `memzoo import` format of the peer's checkpoints, for a family whose memzoo model
    /// is the import of the peer's: memzoo then starts from the peer's own seeded initial
    /// weights (`quality.py --init-out`). `None`: each side initialises its own.
    pub peer_format: Option<&'static str>,
}

/// XL-small against HF TransfoXL 4.37.2 (`venv-tfxl`), as `../shared/peers/quality_tfxl.py`:
/// 6 layers, d_model 256, 8 heads x 32, d_inner 1024, tgt_len 128, mem_len 128, batch 8,
/// clamp_len 1000, tied embedding, post-LN, `u`/`v` per layer, dropout 0.1, dropatt 0.
///
/// Peer: `TransfoXLConfig(vocab_size=256, cutoffs=[], div_val=1, d_model=256, d_embed=256,
/// n_head=8, d_head=32, d_inner=1024, n_layer=6, mem_len=128, clamp_len=1000,
/// same_length=False, dropout=0.1, dropatt=0.0, pre_lnorm=False, untie_r=True,
/// tie_word_embeddings=True)`. The initialisation is each library's default.
pub fn xl_small() -> Family {
    let c = XlConfig::new()
        .with_vocab_size(256)
        .with_n_layers(6)
        .with_d_model(256)
        .with_n_heads(8)
        .with_d_head(Some(32))
        .with_d_inner(1024)
        .with_dropout(0.1)
        .with_dropatt(0.0)
        .with_mem_len(128)
        .with_same_length(false)
        .with_positions(
            PositionConfig::new()
                .with_kind(PositionKind::Xl)
                .with_clamp_len(Some(1000)),
        )
        .with_pre_ln(false)
        .with_tie_weights(true)
        .with_untie_rel_bias(true);
    let (batch, tgt_len) = (8, 128);
    let peer_model = serde_json::json!({
        "n_layer": c.n_layers, "d_model": c.d_model, "n_head": c.n_heads, "d_head": c.head_width(),
        "d_inner": c.d_inner, "mem_len": c.mem_len,
        "clamp_len": c.positions.clamp_len.map_or(-1, |l| l as i64),
        "tgt_len": tgt_len, "batch": batch, "dropout": c.dropout, "dropatt": c.dropatt,
        "pre_lnorm": c.pre_ln, "tie": c.tie_weights, "untie_r": c.untie_rel_bias,
    });
    Family {
        name: "xl",
        model: FamilyModel::Xl(c),
        batch,
        tgt_len,
        peer_model,
        peer_venv: "venv-tfxl",
        peer_format: None,
    }
}

/// A Reformer this 2-core machine trains 400 steps in minutes, against reformer-pytorch's
/// `ReformerLM` (`venv`): 3 layers (a step of the peer took 1.1 s with 4 layers, 0.82 s with 3
/// and 0.57 s with 2 on the shared machine; memzoo 0.57 s with 4), d_model 128, 4 heads x 32, d_ff 512, max_seq_len 256 (=
/// tgt_len: each 256-byte window read on its own, no memory), bucket_size 32 (8 buckets), 2
/// hash rounds, one chunk back, causal, reversible, no feed-forward chunking, axial positions
/// 16 x 16 of two concatenated 64-wide halves, dropout 0.1, dropatt 0, batch 8.
///
/// Peer: `ReformerLM(num_tokens=256, dim=128, depth=3, max_seq_len=256, heads=4, dim_head=32,
/// bucket_size=32, n_hashes=2, ff_chunks=1, ff_mult=4, causal=True, lsh_dropout=0.0,
/// ff_dropout=0.1, axial_position_emb=True, axial_position_shape=(16, 16))`, its `pos_emb`
/// replaced by `AxialPositionalEmbedding(128, (16, 16), axial_dims=(64, 64))` and hash-round
/// de-duplication switched on, as memzoo. Not matched: where dropout applies, the
/// initialisation, evaluation rotations (see the script's header).
pub fn reformer_small() -> Family {
    let c = ReformerConfig::new()
        .with_vocab_size(256)
        .with_n_layers(3)
        .with_d_model(128)
        .with_n_heads(4)
        .with_d_head(32)
        .with_d_ff(512)
        .with_max_seq_len(256)
        .with_attn_layers(Vec::new())
        // reformer-pytorch's score convention (q·k̂ / sqrt(d_head)), as the peer.
        .with_lsh(
            LshConfig::new()
                .with_scores(memzoo_reformer::LshScores::ScaledUnitKeys)
                .with_chunk_len(32)
                .with_n_buckets(None)
                .with_n_rounds(2)
                .with_n_chunks_before(1)
                .with_n_chunks_after(0)
                .with_causal(true),
        )
        .with_reversible(true)
        .with_ff_chunk_len(0)
        .with_axial_positions(true)
        .with_axial_shape(Some([16, 16]))
        .with_axial_dims(None)
        .with_dropout(0.1)
        .with_dropatt(0.0);
    let (batch, tgt_len) = (8, 256);
    let peer_model = serde_json::json!({
        "depth": c.n_layers, "dim": c.d_model, "heads": c.n_heads, "dim_head": c.d_head,
        "ff_mult": c.d_ff / c.d_model, "max_seq_len": c.max_seq_len,
        "bucket_size": c.lsh.chunk_len, "n_hashes": c.lsh.n_rounds, "axial_shape": c.axial_shape,
        "tgt_len": tgt_len, "batch": batch, "dropout": c.dropout, "dropatt": c.dropatt,
    });
    Family {
        name: "reformer",
        model: FamilyModel::Reformer(c),
        batch,
        tgt_len,
        peer_model,
        peer_venv: "venv",
        peer_format: None,
    }
}

/// A small Memorizing Transformer against memorizing-transformers-pytorch (`venv`): 4 layers,
/// d_model 128, 4 heads x 32, d_inner 512, the 3rd layer a kNN layer (top-32, 4,096 memories
/// per row, cleared at the start of an evaluation and when the data wraps), an XL memory of
/// 128 on every layer, T5 relative positions (32 buckets, max distance 128, causal), pre-LN,
/// untied output, tgt_len 128, batch 8, dropout 0.1, dropatt 0.
///
/// Peer: `MemorizingTransformer(num_tokens=256, dim=128, depth=4, dim_head=32, heads=4,
/// attn_dropout=0.0, ff_mult=4, ff_dropout=0.1, memorizing_layers=(3,),
/// max_knn_memories=4096, num_retrieved_memories=32, xl_max_memories=128)`. Not matched:
/// multi-query attention, one softmax over memory and local keys without a gate, when keys
/// enter the kNN memory and how it evicts, where dropout applies (see the script's header).
pub fn memorizing_small() -> Family {
    // From the family's defaults: pre-LN, untied output, the reference's initial scale.
    let xl = MemorizingConfig::new()
        .xl
        .with_vocab_size(256)
        .with_n_layers(4)
        .with_d_model(128)
        .with_n_heads(4)
        .with_d_head(Some(32))
        .with_d_inner(512)
        .with_dropout(0.1)
        .with_dropatt(0.0)
        .with_mem_len(128)
        .with_positions(
            PositionConfig::new()
                .with_kind(PositionKind::T5)
                .with_num_buckets(32)
                .with_max_distance(128)
                .with_bidirectional(false),
        )
        .with_pre_ln(true)
        .with_tie_weights(false);
    let c = MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(vec![2])
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(32)
                .with_max_memories(4096)
                .with_attn_scale_init(20.0),
        )
        .with_xl_memory(true);
    let (batch, tgt_len) = (8, 128);
    let peer_model = serde_json::json!({
        "depth": c.xl.n_layers, "dim": c.xl.d_model, "heads": c.xl.n_heads,
        "dim_head": c.xl.head_width(), "ff_mult": c.xl.d_inner / c.xl.d_model,
        // lucidrains counts layers from 1.
        "knn_layer": c.knn_layers[0] + 1, "topk": c.knn.top_k, "max_knn_memories": c.knn.max_memories,
        "xl_max_memories": c.xl.mem_len, "tgt_len": tgt_len, "batch": batch,
        "dropout": c.xl.dropout, "dropatt": c.xl.dropatt,
    });
    Family {
        name: "memorizing",
        model: FamilyModel::Memorizing(c),
        batch,
        tgt_len,
        peer_model,
        peer_venv: "venv",
        peer_format: None,
    }
}

/// A Compressive Transformer against compressive-transformer-pytorch 0.4.0 (`venv`), the
/// stack `memzoo import --from lucidrains-compressive` builds for the peer's model: 4 layers,
/// d_model 128, 4 heads x 32, pre-LN, learned positions over the window, an XL memory of 128
/// and a compressed memory of 32 at rate 4 (conv compression, trained by the reconstruction
/// loss, weight 1), tgt_len 128, batch 8, dropout 0.1.
///
/// Peer: `CompressiveTransformer(num_tokens=256, dim=128, seq_len=128, depth=4, heads=4,
/// mem_len=128, cmem_len=32, cmem_ratio=4, enhanced_recurrence=False,
/// gru_gated_residual=False, attn_dropout=0.0, ff_dropout=0.1, attn_layer_dropout=0.1,
/// reconstruction_loss_weight=1.0)`, with its in-place detach of `to_kv.weight` replaced by a
/// detached copy in the reconstruction loss (see the script's header). memzoo starts from the
/// peer's initial scale (PyTorch's defaults: linears std ≈ 0.05, embedding N(0, 1)) and drops
/// where the peer does: the attention's output (`attn_layer_dropout`) and between the
/// feed-forward's layers (`ff_dropout`), not the embedding, the feed-forward's output or the
/// final hidden states. Not matched: the peer's position table starts at zero.
pub fn compressive_small() -> Family {
    let (batch, tgt_len) = (8, 128);
    let peer_model = serde_json::json!({
        "num_tokens": 256, "dim": 128, "seq_len": tgt_len, "depth": 4, "heads": 4,
        "mem_len": 128, "cmem_len": 32, "cmem_ratio": 4, "reconstruction_loss_weight": 1.0,
        "gru_gated_residual": false, "mogrify_gru": false, "enhanced_recurrence": false,
        "ff_glu": false, "batch": batch, "tgt_len": tgt_len, "dropout": 0.1, "dropatt": 0.0,
    });
    let peer: memzoo_import::CompressivePeerConfig =
        serde_json::from_value(peer_model.clone()).expect("the peer's arguments");
    // The peer's initial scale (PyTorch's defaults): linears ~ U(±1/sqrt(fan_in)), std
    // 1/sqrt(3 · 128) ≈ 0.05; the token embedding N(0, 1).
    let c = peer
        .xl_config()
        .expect("a stack memzoo computes")
        .with_dropout(0.1)
        .with_init_std(0.05)
        .with_embedding_std(Some(1.0))
        // The peer's dropout sites: the attention's output and inside the feed-forward.
        .with_embedding_dropout(false)
        .with_ff_output_dropout(false)
        .with_final_dropout(false);
    Family {
        name: "compressive",
        model: FamilyModel::Xl(c),
        batch,
        tgt_len,
        peer_model,
        peer_venv: "venv",
        peer_format: Some("lucidrains-compressive"),
    }
}

/// A Recurrent Memory Transformer against recurrent-memory-transformer-pytorch 0.7.0
/// (`venv`), the stack `memzoo import --from lucidrains-rmt` builds for the peer's model: 4
/// layers, d_model 128, 4 heads x 32, RMSNorm pre-norm blocks, a GEGLU feed-forward of width
/// `int(128 · 4 · 2/3)`, learned positions over the segment, 16 memory tokens (the package's
/// layout: read tokens = memory + a learned read embedding, learned write tokens, the memory
/// tokens see each other), value residuals, plain residuals (`num_residual_streams = 1`), no
/// XL memory, the embedding's gradient scaled by 0.1; segments of 128, batch 8, and
/// backpropagation through 2 segments per step (`truncate_at_step = 2`), dropout 0.1 in the
/// feed-forward.
///
/// Peer: `RecurrentMemoryTransformer(dim=128, num_tokens=256, depth=4, heads=4, dim_head=32,
/// num_memory_tokens=16, seq_len=128, ff_mult=4, ff_dropout=0.1, attn_dropout=0.0,
/// use_xl_memories=False, num_residual_streams=1)`; each step reads 2 segments of every row
/// with the memory in the graph across them, then detaches it and carries it to the next
/// step (what the package's `RecurrentMemoryTransformerWrapper` does with
/// `truncate_at_step = 2`). memzoo drops where the peer does (between the feed-forward's
/// layers only: the import's dropout sites) and starts from the peer's initial scale
/// (PyTorch's defaults: linears std ≈ 0.05, embeddings N(0, 1)).
pub fn rmt_small() -> Family {
    let (batch, tgt_len, segments) = (8, 128, 2);
    let peer_model = serde_json::json!({
        "num_tokens": 256, "dim": 128, "depth": 4, "heads": 4, "dim_head": 32,
        "num_memory_tokens": 16, "seq_len": tgt_len, "ff_mult": 4.0, "ff_dropout": 0.1,
        "attn_dropout": 0.0, "use_xl_memories": false, "num_residual_streams": 1,
        "truncate_at_step": segments, "batch": batch, "tgt_len": tgt_len,
        "segments_per_step": segments,
    });
    let peer: memzoo_import::RmtPeerConfig =
        serde_json::from_value(peer_model.clone()).expect("the peer's arguments");
    let c = peer
        .xl_config()
        .expect("a stack memzoo computes")
        .with_init_std(0.05)
        .with_embedding_std(Some(1.0));
    Family {
        name: "rmt",
        model: FamilyModel::Xl(c),
        batch,
        tgt_len,
        peer_model,
        peer_venv: "venv",
        peer_format: Some("lucidrains-rmt"),
    }
}

/// A Block-Recurrent Transformer against block-recurrent-transformer-pytorch 0.4.4 (`venv`),
/// the stack `memzoo import --from lucidrains-block-recurrent` builds for the peer's model: 4
/// layers, d_model 128, 4 heads x 32 with one key/value head, bias-free pre-LN blocks, rotary
/// positions with xPos, a GEGLU feed-forward, an XL memory of the last block's keys and values,
/// and the recurrent layer 2 with a state of 64 vectors (qk-RMSNorm, the fixed gate); blocks of
/// 64 (memzoo's segments), two per step (`max_seq_len = 128`: the peer's forward reads them in
/// turn, states and memories in the graph, and carries them detached to the next step), batch
/// 8. The package has no dropout, so neither side drops (the recipe's 0.1 does not apply).
///
/// Peer: `BlockRecurrentTransformer(num_tokens=256, dim=128, depth=4, heads=4, dim_head=32,
/// ff_mult=4, max_seq_len=128, block_width=64, recurrent_layers=(2,), num_state_vectors=64)`.
pub fn block_recurrent_small() -> Family {
    let (batch, block, blocks) = (8, 64, 2);
    let peer_model = serde_json::json!({
        "num_tokens": 256, "dim": 128, "depth": 4, "heads": 4, "dim_head": 32, "ff_mult": 4,
        "max_seq_len": block * blocks, "block_width": block, "recurrent_layers": [2],
        "num_state_vectors": 64, "batch": batch, "tgt_len": block, "segments_per_step": blocks,
    });
    let peer: memzoo_import::BlockRecurrentPeerConfig =
        serde_json::from_value(peer_model.clone()).expect("the peer's arguments");
    let c = peer
        .xl_config()
        .expect("a stack memzoo computes")
        .with_init_std(0.05)
        .with_embedding_std(Some(1.0));
    Family {
        name: "block-recurrent",
        model: FamilyModel::Xl(c),
        batch,
        tgt_len: block,
        peer_model,
        peer_venv: "venv",
        peer_format: Some("lucidrains-block-recurrent"),
    }
}

/// XL-small with the faster-learning initialisation measured on `XlConfig::init_std`:
/// weights from N(0, 0.03), the tied embedding from N(0, 0.02) (HF's scheme otherwise); the
/// same peer and recipe as `xl`.
pub fn xl_fast() -> Family {
    let mut fam = xl_small();
    if let FamilyModel::Xl(c) = fam.model {
        fam.model = FamilyModel::Xl(c.with_init_std(0.03).with_embedding_std(Some(0.02)));
    }
    fam.name = "xl-fast";
    fam
}

/// The family named `name`.
pub fn family(name: &str) -> Result<Family, String> {
    match name {
        "xl" => Ok(xl_small()),
        "reformer" => Ok(reformer_small()),
        "memorizing" => Ok(memorizing_small()),
        "compressive" => Ok(compressive_small()),
        "rmt" => Ok(rmt_small()),
        "block-recurrent" => Ok(block_recurrent_small()),
        "xl-fast" => Ok(xl_fast()),
        other => Err(format!(
            "unknown family `{other}` in --families: expected {}",
            FAMILIES.join(", ")
        )),
    }
}

/// The recipe of both sides: `seed` (`--seed`, default 0), AdamW lr 1e-3, weight decay 0.01 on every parameter,
/// betas (0.9, 0.999), eps 1e-8 (PyTorch's), 50 linear warm-up steps then cosine to 0 at
/// `steps`, global grad-norm clip 0.25. `log_every` is the train-loss window; a checkpoint every
/// `checkpoint_every` steps, all kept, gives the models to evaluate.
pub fn train_config(
    seed: u64,
    steps: usize,
    batch: usize,
    tgt_len: usize,
    log_every: usize,
    checkpoint_every: usize,
) -> TrainConfig {
    // The presets' quality recipe (`memzoo::preset::quality`): the same for memzoo's
    // `--preset *-small` runs and for this comparison.
    memzoo::preset::quality(batch, tgt_len)
        .with_steps(steps)
        .with_grad_accum(1)
        .with_seed(seed)
        .with_log_every(log_every)
        .with_eval_every(0)
        .with_checkpoint_every(checkpoint_every)
        .with_keep_checkpoints(steps / checkpoint_every + 1)
}

/// The recipe as the peer script's `--config {"recipe": ...}`.
fn peer_recipe(t: &TrainConfig, threads: usize) -> serde_json::Value {
    serde_json::json!({
        "seed": t.seed, "threads": threads, "lr": t.schedule.lr, "warmup": t.schedule.warmup,
        "weight_decay": t.weight_decay, "beta_1": t.adam.beta_1, "beta_2": t.adam.beta_2,
        "eps": t.adam.epsilon, "clip": t.clip_norm,
        "valid_fraction": 0.05, "test_fraction": 0.05,
    })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The evaluation points: `--eval-at` (sorted, each in `1..=steps`), or the defaults within
/// `steps` plus `steps` itself.
pub fn eval_points(steps: usize, eval_at: Option<&[usize]>) -> Result<Vec<usize>, String> {
    let mut points: Vec<usize> = match eval_at {
        Some(given) => {
            for &s in given {
                if s == 0 || s > steps {
                    return Err(format!(
                        "--eval-at {s} is outside the run: evaluation points must be in 1..={steps} (--steps)"
                    ));
                }
            }
            given.to_vec()
        }
        None => DEFAULT_EVAL_AT
            .iter()
            .copied()
            .filter(|&s| s < steps)
            .chain([steps])
            .collect(),
    };
    points.sort_unstable();
    points.dedup();
    if points.is_empty() {
        return Err("--eval-at names no step".into());
    }
    Ok(points)
}

/// The workspace root (xtask's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `--data`, or `../shared/data/tinyshakespeare.txt` beside the workspace.
fn data_path(args: &BenchArgs) -> PathBuf {
    args.data.clone().unwrap_or_else(|| {
        workspace_root()
            .join("..")
            .join("shared")
            .join("data")
            .join("tinyshakespeare.txt")
    })
}

/// The train and validation tokens of `path`, split as `memzoo train --data FILE`.
fn load_data(path: &Path) -> Result<(Vec<Token>, Vec<Token>), String> {
    if !path.is_file() {
        return Err(format!(
            "the quality data {} is missing (give another file with --data)",
            path.display()
        ));
    }
    let corpus = Corpus::load(path, None, &SplitRule::generic())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let tok = ByteTokenizer::new();
    Ok((tok.encode(&corpus.train), tok.encode(&corpus.valid)))
}

/// Runs the families of `--families` on both sides: prints and appends (`--out`) every point,
/// then the table and the charts.
pub fn run(args: &BenchArgs, device: &Device) -> Result<Vec<QualityPoint>, String> {
    let names: Vec<String> = match &args.families {
        Some(f) => f.iter().map(|s| s.trim().to_string()).collect(),
        None => FAMILIES.iter().map(|s| s.to_string()).collect(),
    };
    // Check every name before the first (long) run.
    let families = names
        .iter()
        .map(|n| family(n))
        .collect::<Result<Vec<_>, _>>()?;
    let steps = args.steps.unwrap_or(400);
    let eval_at = eval_points(steps, args.eval_at.as_deref())?;
    let path = data_path(args);
    let (train, valid) = load_data(&path)?;
    if let Some(out) = &args.out {
        // Fail now, not after the first training run.
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| format!("cannot open --out {}: {e}", out.display()))?;
    }
    let mut points = Vec::new();
    let mut notes = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for fam in &families {
        // Where memzoo's model is the import of the peer's, both start from the peer's weights.
        let start = match (fam.peer_format, args.no_peers) {
            (Some(format), false) => {
                peer_initial_model(fam, args, steps, &eval_at, &path)?.map(|dir| (format, dir))
            }
            _ => None,
        };
        let run = MemzooRun {
            fam,
            args,
            device,
            steps,
            eval_at: &eval_at,
            train: &train,
            valid: &valid,
            path: &path,
            start: start.as_ref().map(|(f, d)| (*f, d.path())),
        };
        for p in run_memzoo(run)? {
            crate::emit(&p, args.out.as_ref())?;
            points.push(p);
        }
        if args.no_peers {
            continue;
        }
        // A failed peer is reported at the end: the other families still run.
        match run_peer(fam, args, steps, &eval_at, &path) {
            Ok(PeerRun::Done(ps)) => {
                for p in ps {
                    crate::emit(&p, args.out.as_ref())?;
                    points.push(p);
                }
            }
            Ok(PeerRun::Skipped(why)) => {
                eprintln!("{why}");
                notes.push(why);
            }
            Err(e) => {
                eprintln!("error: {e}");
                failures.push(e);
            }
        }
    }
    println!();
    println!("{}", markdown(&points));
    for n in notes {
        println!("{n}");
    }
    let plot_dir = args.plot.clone().or_else(|| {
        args.out
            .as_ref()
            .map(|p| p.parent().map(PathBuf::from).unwrap_or_default())
    });
    if let Some(dir) = plot_dir {
        let data = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for p in write_plots(&points, &dir, &data)? {
            eprintln!("plot: {}", p.display());
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    Ok(points)
}

/// One family's memzoo run: what it trains on and where it is scored.
#[derive(Clone, Copy)]
struct MemzooRun<'a> {
    fam: &'a Family,
    args: &'a BenchArgs,
    device: &'a Device,
    steps: usize,
    eval_at: &'a [usize],
    train: &'a [Token],
    valid: &'a [Token],
    path: &'a Path,
    /// The peer's initial model to start from: its `memzoo import` format and directory.
    start: Option<(&'static str, &'a Path)>,
}

/// Trains one family in memzoo, checkpointing at every evaluation point, then scores each of
/// those checkpoints on the whole validation split.
fn run_memzoo(run: MemzooRun) -> Result<Vec<QualityPoint>, String> {
    match &run.fam.model {
        FamilyModel::Xl(c) => {
            let init = |d: &Device| c.init(d).map_err(|e| e.to_string());
            match run.start {
                Some((format, dir)) => {
                    run.train_and_score(&init, &|d: &Device| start_from_peer(c, format, dir, d))
                }
                None => run.train_and_score(&init, &init),
            }
        }
        FamilyModel::Reformer(c) => {
            let init = |d: &Device| c.init(d).map_err(|e| e.to_string());
            run.train_and_score(&init, &init)
        }
        FamilyModel::Memorizing(c) => {
            let init = |d: &Device| c.init(d).map_err(|e| e.to_string());
            run.train_and_score(&init, &init)
        }
    }
}

impl MemzooRun<'_> {
    /// Trains from `first(device)` and scores the checkpoints, loaded into `init(device)`.
    fn train_and_score<M: SegmentModel>(
        self,
        init: &dyn Fn(&Device) -> Result<M, String>,
        first: &dyn Fn(&Device) -> Result<M, String>,
    ) -> Result<Vec<QualityPoint>, String> {
        let MemzooRun {
            fam,
            args,
            device,
            steps,
            eval_at,
            train,
            valid,
            path,
            start,
        } = self;
        let window = eval_at.iter().fold(10, |g, &s| gcd(g, s));
        let every = eval_at.iter().fold(0, |g, &s| gcd(g, s));
        let mut config = train_config(args.seed, steps, fam.batch, fam.tgt_len, window, every);
        config.replicas = args.replicas;
        let run_dir = std::env::temp_dir().join(format!(
            "memzoo-quality-{}-{}",
            fam.name,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&run_dir);
        let result = (|| {
            let train_device = device.clone().autodiff();
            train_device.seed(config.seed);
            let model = first(&train_device)?;
            // The RMT reads `bptt_segments` segments of every row per step.
            let tokens_per_step = fam.batch * fam.tgt_len * model.bptt_segments().max(1);
            let name = path.display();
            let mut data = OrderedBatcher::named(
                &format!("the train split of {name}"),
                train.to_vec(),
                fam.batch,
                fam.tgt_len,
            )
            .map_err(|e| e.to_string())?
            .drop_last(true);
            eprintln!(
                "quality {}: memzoo trains {steps} steps ({} rows x {} tokens), evaluating at {eval_at:?}, from {}",
                fam.name,
                fam.batch,
                fam.tgt_len,
                match start {
                    Some((_, dir)) => format!("the peer's initial weights ({})", dir.display()),
                    None => "its own initialisation".into(),
                }
            );
            let options = RunOptions {
                run_dir: run_dir.clone(),
                resume: false,
                quiet: true,
            };
            memzoo_train::train(model, &config, &mut data, None, &options)
                .map_err(|e| format!("memzoo {} training: {e}", fam.name))?;
            let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
                .map_err(|e| format!("cannot read {}/metrics.jsonl: {e}", run_dir.display()))?;
            let log = train_log(&metrics, tokens_per_step);
            let mut valid_data = OrderedBatcher::named(
                &format!("the valid split of {name}"),
                valid.to_vec(),
                fam.batch,
                fam.tgt_len,
            )
            .map_err(|e| e.to_string())?
            .drop_last(true);
            let mut points = Vec::new();
            for &s in eval_at {
                let dir = run_dir.join("checkpoints").join(format!("step-{s:08}"));
                let model = checkpoint::load_model(&dir, init(device)?)
                    .map_err(|e| format!("memzoo {} checkpoint at step {s}: {e}", fam.name))?;
                let r = evaluate(&model, &mut valid_data, fam.tgt_len, None)
                    .map_err(|e| format!("memzoo {} evaluation at step {s}: {e}", fam.name))?;
                let (train_loss, wall_s) = log.at(s).ok_or_else(|| {
                    format!(
                        "memzoo {}: metrics.jsonl has no training record at step {s}",
                        fam.name
                    )
                })?;
                points.push(QualityPoint {
                    kind: "quality".into(),
                    family: fam.name.into(),
                    implementation: "memzoo".into(),
                    step: s,
                    valid_bpc: r.bpc,
                    train_loss,
                    wall_s: (wall_s * 100.0).round() / 100.0,
                });
            }
            Ok(points)
        })();
        let _ = std::fs::remove_dir_all(&run_dir);
        result
    }
}

/// The training records of a `metrics.jsonl`: per logged step, the window's mean loss and the
/// training seconds so far (each window's tokens over its tokens/s).
pub struct TrainLog {
    /// `(step, loss, cumulative seconds)`, in step order.
    pub records: Vec<(usize, f64, f64)>,
}

impl TrainLog {
    /// The loss and seconds logged at `step`.
    pub fn at(&self, step: usize) -> Option<(f64, f64)> {
        self.records
            .iter()
            .find(|r| r.0 == step)
            .map(|&(_, l, s)| (l, s))
    }
}

/// Reads the `train` records of a `metrics.jsonl` (`tokens_per_step` = batch x tgt_len).
pub fn train_log(metrics: &str, tokens_per_step: usize) -> TrainLog {
    use std::collections::BTreeMap;
    let mut by_step: BTreeMap<usize, (Option<f64>, Option<f64>)> = BTreeMap::new();
    for v in metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["split"] == "train")
    {
        let (Some(step), Some(value)) = (v["step"].as_u64(), v["value"].as_f64()) else {
            continue;
        };
        let e = by_step.entry(step as usize).or_default();
        match v["metric"].as_str() {
            Some("loss") => e.0 = Some(value),
            Some("tokens_per_s") => e.1 = Some(value),
            _ => {}
        }
    }
    let (mut prev, mut secs) = (0, 0.0);
    let mut records = Vec::new();
    for (step, (loss, tps)) in by_step {
        if let (Some(loss), Some(tps)) = (loss, tps) {
            secs += ((step - prev) * tokens_per_step) as f64 / tps;
            prev = step;
            records.push((step, loss, secs));
        }
    }
    TrainLog { records }
}

/// The family's model `config` with the weights of the peer's checkpoint `dir` (format
/// `format`), on `device`: the import's tensors moved into `config`'s model, whose settings
/// the import does not carry (the quality recipe's dropout) stay the family's. Every
/// parameter's shape must agree.
fn start_from_peer(
    config: &XlConfig,
    format: &str,
    dir: &Path,
    device: &Device,
) -> Result<memzoo_stack::TransformerXl, String> {
    use burn::module::Module;
    let reader = memzoo_import::format(format).map_err(|e| e.to_string())?;
    let (imported, _) = reader
        .import(dir, device)
        .map_err(|e| format!("importing the peer's initial model {}: {e}", dir.display()))?;
    let model = config.init(device).map_err(|e| e.to_string())?;
    let (want, got) = (param_shapes(&model), param_shapes(&imported));
    if want != got {
        return Err(format!(
            "the peer's initial model {} has parameters of shapes {got:?}, the family's model {want:?}",
            dir.display()
        ));
    }
    Ok(model.load_record(imported.into_record()))
}

/// The shapes of a model's parameters, in module order.
fn param_shapes<M: burn::module::Module>(model: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl burn::module::ModuleVisitor for Shapes {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<D>>,
        ) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut v = Shapes(Vec::new());
    model.visit(&mut v);
    v.0
}

/// The peer's seeded initial model (`quality.py --init-out`), written into a temporary
/// directory; `None` (said on stderr) when the peer's venv is missing.
fn peer_initial_model(
    fam: &Family,
    args: &BenchArgs,
    steps: usize,
    eval_at: &[usize],
    data: &Path,
) -> Result<Option<TempDir>, String> {
    let Some(python) = peer_python(fam) else {
        eprintln!(
            "quality {}: no peer venv, so memzoo starts from its own initialisation",
            fam.name
        );
        return Ok(None);
    };
    let dir = TempDir::new(&format!("memzoo-quality-init-{}", fam.name))?;
    let mut command = peer_command(fam, args, steps, eval_at, data, &python);
    let out = command
        .arg("--init-out")
        .arg(dir.path())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the {} peer could not write its initial model ({}): {}",
            fam.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Some(dir))
}

/// A directory under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Result<Self, String> {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The peer's venv python, if it is set up.
fn peer_python(fam: &Family) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let python = home
        .join(".cache")
        .join("memzoo-peers")
        .join(fam.peer_venv)
        .join("bin")
        .join("python");
    python.exists().then_some(python)
}

/// `python quality.py FAMILY STEPS EVAL_AT DATA --config JSON` with the family's numbers and
/// the recipe (OpenMP threads that wait passively unless `OMP_WAIT_POLICY` is set).
fn peer_command(
    fam: &Family,
    args: &BenchArgs,
    steps: usize,
    eval_at: &[usize],
    data: &Path,
    python: &Path,
) -> Command {
    let script = workspace_root()
        .join("xtask")
        .join("peers")
        .join("quality.py");
    let window = eval_at.iter().fold(10, |g, &s| gcd(g, s));
    let every = eval_at.iter().fold(0, |g, &s| gcd(g, s));
    let t = train_config(args.seed, steps, fam.batch, fam.tgt_len, window, every);
    let config =
        serde_json::json!({"model": fam.peer_model, "recipe": peer_recipe(&t, args.threads)});
    let csv: Vec<String> = eval_at.iter().map(|s| s.to_string()).collect();
    let mut command = Command::new(python);
    crate::measure::cap_peer(&mut command);
    // On a shared machine, OpenMP threads that spin while they wait stall for seconds whenever
    // another process holds a core (reformer-pytorch: 1-16 s per step instead of ~1.1 s).
    if std::env::var_os("OMP_WAIT_POLICY").is_none() {
        command.env("OMP_WAIT_POLICY", "PASSIVE");
    }
    command
        .arg(&script)
        .arg(fam.name)
        .arg(steps.to_string())
        .arg(csv.join(","))
        .arg(data)
        .arg("--config")
        .arg(config.to_string());
    command
}

/// What became of a peer run.
pub enum PeerRun {
    /// Its points.
    Done(Vec<QualityPoint>),
    /// Not run, and why (no venv).
    Skipped(String),
}

/// Runs `xtask/peers/quality.py` for one family with the peer's venv python, echoing its
/// stderr (progress) and collecting its points.
fn run_peer(
    fam: &Family,
    args: &BenchArgs,
    steps: usize,
    eval_at: &[usize],
    data: &Path,
) -> Result<PeerRun, String> {
    let Some(python) = peer_python(fam) else {
        return Ok(PeerRun::Skipped(format!(
            "quality {}: peer skipped: ~/.cache/memzoo-peers/{}/bin/python is missing; set the peers up with `bash ../shared/peers/setup.sh` (or pass --no-peers)",
            fam.name, fam.peer_venv
        )));
    };
    let mut command = peer_command(fam, args, steps, eval_at, data, &python);
    eprintln!("quality {}: peer {command:?}", fam.name);
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
    // Echo the peer's progress and keep its last lines for an error message.
    let stderr = child.stderr.take().expect("piped stderr");
    let echo = std::thread::spawn(move || {
        let mut tail: Vec<String> = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            tail.push(line);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
        tail
    });
    let stdout = child.stdout.take().expect("piped stdout");
    let mut out = String::new();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        out.push_str(&line);
        out.push('\n');
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the {} peer: {e}", fam.name))?;
    let tail = echo.join().unwrap_or_default().join("\n");
    if !status.success() {
        return Err(format!(
            "the {} peer ({}) failed ({status}); the end of its stderr:\n{tail}",
            fam.name,
            python.display(),
        ));
    }
    let points = parse_peer_output(&out, fam.name)?;
    let got: Vec<usize> = points.iter().map(|p| p.step).collect();
    if got != eval_at {
        return Err(format!(
            "the {} peer reported steps {got:?}, expected {eval_at:?}; the end of its stderr:\n{tail}",
            fam.name
        ));
    }
    Ok(PeerRun::Done(points))
}

/// The `quality` points of a peer's stdout for `family`: JSON lines with `"kind": "quality"`
/// (other lines are ignored); a quality line with a missing or bad field is an error naming it.
pub fn parse_peer_output(text: &str, family: &str) -> Result<Vec<QualityPoint>, String> {
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        if v["kind"] != "quality" {
            continue;
        }
        let p: QualityPoint = serde_json::from_value(v)
            .map_err(|e| format!("peer output line {}: {e}: {line}", i + 1))?;
        if p.family != family {
            return Err(format!(
                "peer output line {}: family `{}`, expected `{family}`: {line}",
                i + 1,
                p.family
            ));
        }
        if !p.valid_bpc.is_finite() {
            return Err(format!(
                "peer output line {}: valid_bpc is {}: {line}",
                i + 1,
                p.valid_bpc
            ));
        }
        points.push(p);
    }
    Ok(points)
}

/// The table: per family and evaluation step, memzoo's and the peer's validation bpc, their
/// difference and the training seconds of each.
pub fn markdown(points: &[QualityPoint]) -> String {
    let mut families: Vec<&str> = Vec::new();
    for p in points {
        if !families.contains(&p.family.as_str()) {
            families.push(&p.family);
        }
    }
    let mut s = String::from(
        "| family | step | memzoo valid bpc | peer valid bpc | memzoo - peer | memzoo train s | peer train s | peer |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let f2 =
        |v: Option<f64>, digits: usize| v.map_or("–".to_string(), |v| format!("{v:.digits$}"));
    for fam in families {
        let of = |memzoo: bool| -> Vec<&QualityPoint> {
            points
                .iter()
                .filter(|p| p.family == fam && (p.implementation == "memzoo") == memzoo)
                .collect()
        };
        let (ours, peers) = (of(true), of(false));
        let mut steps: Vec<usize> = ours.iter().chain(&peers).map(|p| p.step).collect();
        steps.sort_unstable();
        steps.dedup();
        for step in steps {
            let m = ours.iter().find(|p| p.step == step);
            let q = peers.iter().find(|p| p.step == step);
            let diff = m.zip(q).map(|(m, q)| m.valid_bpc - q.valid_bpc);
            let _ = writeln!(
                s,
                "| {fam} | {step} | {} | {} | {} | {} | {} | {} |",
                f2(m.map(|p| p.valid_bpc), 3),
                f2(q.map(|p| p.valid_bpc), 3),
                diff.map_or("–".to_string(), |d| format!("{d:+.3}")),
                f2(m.map(|p| p.wall_s), 0),
                f2(q.map(|p| p.wall_s), 0),
                q.map_or("–", |p| p.implementation.as_str()),
            );
        }
    }
    s
}

/// One chart per family, `quality-<family>.svg`: validation bpc against steps, one line per
/// implementation.
pub fn write_plots(
    points: &[QualityPoint],
    dir: &Path,
    data: &str,
) -> Result<Vec<PathBuf>, String> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut written = Vec::new();
    let mut families: Vec<&str> = Vec::new();
    for p in points {
        if !families.contains(&p.family.as_str()) {
            families.push(&p.family);
        }
    }
    for fam in families {
        let mut series: Vec<Series> = Vec::new();
        for p in points.iter().filter(|p| p.family == fam) {
            match series.iter_mut().find(|s| s.name == p.implementation) {
                Some(s) => s.points.push((p.step as f64, p.valid_bpc)),
                None => series.push(Series {
                    name: p.implementation.clone(),
                    points: vec![(p.step as f64, p.valid_bpc)],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let svg = chart(
            &format!("{fam}: validation bpc, {data}"),
            "training step",
            "valid bits per byte",
            &series,
            Axes::Linear,
        );
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join(format!("quality-{fam}.svg"));
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

//! The memory inspector (`memzoo inspect`): what a run's memory does on a text, per token.
//!
//! [`inspect`] reads a text as `memzoo eval` reads a split: in segments, the state (XL memory,
//! kNN memories) carried from one to the next, the first segment starting the document. Each
//! segment is read twice with the same weights:
//!
//! - **with the memory**: a traced evaluation step ([`Step::with_trace`]): its per-token
//!   losses, and what every layer's attention did ([`memzoo_stack::LayerTrace`]: the mass on
//!   the memory (the XL memory; a Compressive Transformer's compressed memory apart; an RMT's
//!   memory tokens), on the retrieved kNN pairs and on the segment, recomputed from the real
//!   probabilities (for LSH and local layers from the same hashes and chunks); the retrieved
//!   pairs; an LSH layer's buckets);
//! - **without**: from a fresh state (no XL memory, empty kNN memories), its losses only.
//!
//! The result, an [`Inspection`], is indexed by query: entry `t` is the query at token `t`,
//! which predicts token `t + 1` (its loss is that token's). [`page::render`] turns it into one
//! self-contained HTML page.

mod page;
mod positions;

pub use page::render;

use burn::tensor::{Int, Tensor, TensorData};
use memzoo_memory::KnnIndex;
use memzoo_stack::{LayerAttention, LayerTrace, Step, Trace, TransformerXl, XlError, XlMemory};
use serde::{Deserialize, Serialize};

use positions::{PositionLog, PositionedIndex};

/// What went wrong inspecting a text, naming the bad value.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// A text too short to score (fewer than two tokens).
    #[error("{text}: {tokens} token(s), at least 2 are needed (one to read, one to predict)")]
    TooShort {
        /// The text's name.
        text: String,
        /// Its tokens.
        tokens: usize,
    },
    /// A token the model has no embedding for.
    #[error(
        "{text}: token {index} ({piece:?}) has id {id}, outside the model's vocabulary of \
         {vocab} (model.vocab_size)"
    )]
    Vocab {
        /// The text's name.
        text: String,
        /// The token's index in the text.
        index: usize,
        /// The token as text.
        piece: String,
        /// Its id.
        id: i64,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// An option out of range.
    #[error("{0}")]
    Option(String),
    /// The model.
    #[error(transparent)]
    Xl(#[from] XlError),
    /// A kNN memory.
    #[error(transparent)]
    Memory(#[from] memzoo_memory::MemoryError),
}

/// How [`inspect`] reads the text.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    /// Tokens per segment (the run's `train.tgt_len`, as `memzoo eval`).
    pub tgt_len: usize,
    /// Retrieved neighbours kept per query and head (the heaviest by attention weight).
    pub neighbours: usize,
    /// Tokens of a region in the summary's "where memory helped most".
    pub region_len: usize,
    /// Regions and single tokens listed in the summary.
    pub top: usize,
}

impl Default for InspectOptions {
    fn default() -> Self {
        Self {
            tgt_len: 128,
            neighbours: 3,
            region_len: 48,
            top: 12,
        }
    }
}

/// A retrieved pair as the query's attention weighed it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    /// Position (token index) in the text of the stored key; -1: not found among the stored
    /// keys (never expected).
    pub position: i64,
    /// Its weight in the layer's output mix (attention probability times the gate).
    pub weight: f32,
    /// Cosine similarity of query and key, what the search ranks by.
    pub score: f32,
}

/// One layer of an [`Inspection`]: per query and head, `[query][head]` row-major.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LayerInspection {
    /// The layer's kind (`xl`, `t5`, `knn`, `lsh`, ...).
    pub kind: String,
    /// Attention heads.
    pub heads: usize,
    /// Attention mass `[compressed memory, memory, knn, segment]` per query and head (sums
    /// to 1).
    pub mass: Vec<[f32; 4]>,
    /// Whether the layer reads a compressed memory (a Compressive Transformer's).
    pub compressed: bool,
    /// kNN layers: per query and head, the `neighbours_per_head` heaviest retrieved pairs
    /// (fewer where fewer were found: padded with position -1, weight 0).
    pub neighbours: Vec<Neighbour>,
    /// Neighbours kept per query and head (0: none, not a kNN layer).
    pub neighbours_per_head: usize,
    /// LSH layers: the bucket of every query per head and round, `[query][head][round]`.
    pub buckets: Vec<u32>,
    /// Hash rounds (0: not an LSH layer).
    pub rounds: usize,
}

/// A stretch of the text where the memory helped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Region {
    /// First token.
    pub start: usize,
    /// Tokens.
    pub len: usize,
    /// Sum of `loss_without - loss_with` over its tokens, nats.
    pub gain: f64,
}

/// Mean losses and where the memory helped most.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Tokens scored (every token but the first).
    pub tokens: usize,
    /// Mean loss with the memory, bits per token (bpc for bytes).
    pub bpc_with: f64,
    /// Mean loss with the same weights reading no memory, bits per token.
    pub bpc_without: f64,
    /// The regions with the largest total gain, best first, not overlapping.
    pub regions: Vec<Region>,
    /// The single tokens with the largest gain, best first (token indices).
    pub tokens_top: Vec<usize>,
}

/// What the memory did on a text: per token, losses with and without it; per layer and head,
/// where the attention went (see the module docs for the indexing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inspection {
    /// Where the model came from (run dir, checkpoint).
    pub model: String,
    /// The model family (`xl`, `memorizing`, `reformer`).
    pub family: String,
    /// The text's name.
    pub text: String,
    /// Bytes of the text read, and in the file (more: truncated by `--max-bytes`).
    pub bytes_read: usize,
    /// Bytes in the file.
    pub bytes_total: usize,
    /// Tokens per segment.
    pub tgt_len: usize,
    /// XL memory length.
    pub mem_len: usize,
    /// What the model's memory is, as the page names it (`XL memory`, `memory tokens`).
    pub memory: String,
    /// The text's tokens as text (a UTF-8 character on its first byte, empty on the others).
    pub pieces: Vec<String>,
    /// Loss of token `t + 1` with the memory, nats (`t` = query index).
    pub loss_with: Vec<f32>,
    /// Loss of token `t + 1` from a fresh state per segment, nats.
    pub loss_without: Vec<f32>,
    /// Every layer, bottom to top.
    pub layers: Vec<LayerInspection>,
    /// Mean losses, and where memory helped most.
    pub summary: Summary,
}

/// The model's kNN memories for one row, each wrapped to record its keys' positions.
fn positioned_state(
    model: &TransformerXl,
) -> Result<(memzoo_stack::XlState, Vec<PositionLog>), InspectError> {
    let mut state = model.new_state(1, &model.device())?;
    // Pairs leaving an XL memory that starts as zeros come after `mem_len` zero pairs.
    let evicted = model.knn_attentions().any(|a| a.evicted_feed().is_some());
    let start = if evicted && model.zero_first_memory {
        -(model.mem_len as i64)
    } else {
        0
    };
    let mut logs = Vec::new();
    state.knn = std::mem::take(&mut state.knn)
        .into_iter()
        .map(|inner| {
            let (index, log) = PositionedIndex::wrap(inner, start);
            logs.push(log);
            Box::new(index) as Box<dyn KnnIndex>
        })
        .collect();
    Ok((state, logs))
}

/// Host copy of a float tensor, row-major.
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().iter::<f32>().collect()
}

/// Reads `tokens` with `model` (on a device without autodiff) as the module docs say.
/// `pieces` are the tokens as text (one per token), `text` the text's name.
pub fn inspect(
    model: &TransformerXl,
    tokens: &[i64],
    pieces: Vec<String>,
    text: &str,
    opts: &InspectOptions,
) -> Result<Inspection, InspectError> {
    let n = tokens.len();
    if n < 2 {
        return Err(InspectError::TooShort {
            text: text.into(),
            tokens: n,
        });
    }
    if pieces.len() != n {
        return Err(InspectError::Option(format!(
            "{} pieces for {n} tokens",
            pieces.len()
        )));
    }
    if opts.tgt_len == 0 {
        return Err(InspectError::Option(
            "the segment length must be positive".into(),
        ));
    }
    let vocab = model.vocab_size;
    if let Some((index, &id)) = tokens
        .iter()
        .enumerate()
        .find(|&(_, &id)| id < 0 || id as usize >= vocab)
    {
        return Err(InspectError::Vocab {
            text: text.into(),
            index,
            piece: pieces[index].clone(),
            id,
            vocab,
        });
    }
    let device = model.device();
    let queries = n - 1;
    let mut layers: Vec<LayerInspection> = model
        .layers
        .iter()
        .map(|l| LayerInspection {
            kind: format!("{:?}", l.attention.kind()).to_lowercase(),
            heads: match &l.attention {
                LayerAttention::Hashed(a) => a.n_heads,
                other => other.local().n_heads,
            },
            mass: Vec::new(),
            compressed: model.compressive_config().is_some(),
            neighbours: Vec::new(),
            neighbours_per_head: 0,
            buckets: Vec::new(),
            rounds: 0,
        })
        .collect();
    let knn_layers: Vec<usize> = model
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| matches!(l.attention, LayerAttention::Knn(_)))
        .map(|(i, _)| i)
        .collect();
    let (mut state, logs) = positioned_state(model)?;
    let mut blank = model.new_state(1, &device)?;
    let (mut loss_with, mut loss_without) = (Vec::with_capacity(queries), Vec::new());
    loss_without.reserve(queries);
    let as_tensor = |ids: &[i64]| {
        Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &device)
    };
    for start in (0..queries).step_by(opts.tgt_len) {
        let len = opts.tgt_len.min(queries - start);
        let inputs = as_tensor(&tokens[start..start + len]);
        let targets = as_tensor(&tokens[start + 1..start + len + 1]);
        let trace = Trace::new();
        let step = Step::reset(&[start == 0]).with_trace(trace.clone());
        let with = model.eval_step(inputs.clone(), targets.clone(), &mut state, &step)?;
        loss_with.extend(host(with.nll));
        // A fresh state: no XL memory, empty kNN memories.
        blank.xl = XlMemory::empty();
        blank.xl_valid.clear();
        for m in blank.knn.iter_mut() {
            m.clear(&[0])?;
        }
        let without = model.eval_step(inputs, targets, &mut blank, &Step::reset(&[true]))?;
        loss_without.extend(host(without.nll));
        for (l, record) in trace.take() {
            let layer = &mut layers[l];
            let log = knn_layers
                .iter()
                .position(|&k| k == l)
                .and_then(|i| logs.get(i));
            collect(layer, record, len, opts.neighbours, log, model)?;
        }
    }
    let summary = summarize(&loss_with, &loss_without, opts);
    Ok(Inspection {
        model: String::new(),
        family: model.stack_family().into(),
        text: text.into(),
        bytes_read: 0,
        bytes_total: 0,
        tgt_len: opts.tgt_len,
        mem_len: model.mem_len,
        memory: match model.rmt_config() {
            Some(_) => "memory tokens".into(),
            None => "XL memory".into(),
        },
        pieces,
        loss_with,
        loss_without,
        layers,
        summary,
    })
}

/// Appends one segment's record of a layer (`len` queries) to `layer`.
fn collect(
    layer: &mut LayerInspection,
    record: LayerTrace,
    len: usize,
    keep: usize,
    log: Option<&PositionLog>,
    model: &TransformerXl,
) -> Result<(), InspectError> {
    let h = layer.heads;
    match record {
        LayerTrace::Attention(probe) => {
            // [1, h, len] -> per query, per head.
            let compressed = probe.compressed.map(host);
            let memory = host(probe.memory);
            let segment = host(probe.segment);
            let knn = probe.retrieved.as_ref().map(|r| host(r.mass.clone()));
            let at = |v: &Option<Vec<f32>>, i: usize| v.as_ref().map_or(0.0, |v| v[i]);
            for t in 0..len {
                for head in 0..h {
                    let i = head * len + t;
                    let mass = [at(&compressed, i), memory[i], at(&knn, i), segment[i]];
                    layer.mass.push(mass);
                }
            }
            if let Some(r) = probe.retrieved {
                let kk = r.weights.dims()[3];
                let dh = r.keys.dims()[4];
                let weights = host(r.weights);
                let scores = host(r.scores);
                let keys = host(r.keys);
                let group = h / model.knn_memory.kv_heads().max(1);
                let log = log.map(PositionLog::lock);
                layer.neighbours_per_head = keep;
                for t in 0..len {
                    for head in 0..h {
                        let base = (t * h + head) * kk;
                        let mut slots: Vec<usize> = (0..kk).collect();
                        slots.sort_by(|&a, &b| weights[base + b].total_cmp(&weights[base + a]));
                        let mut seen: Vec<&[f32]> = Vec::new();
                        for &s in slots.iter().take(keep) {
                            let key = &keys[(base + s) * dh..(base + s + 1) * dh];
                            let nth = seen.iter().filter(|&&k| k == key).count();
                            seen.push(key);
                            let position = match (&log, weights[base + s] > 0.0) {
                                (Some(log), true) => {
                                    log.lookup(head / group.max(1), key, nth).unwrap_or(-1)
                                }
                                _ => -1,
                            };
                            layer.neighbours.push(Neighbour {
                                position,
                                weight: weights[base + s],
                                score: scores[base + s],
                            });
                        }
                        for _ in kk.min(keep)..keep {
                            layer.neighbours.push(Neighbour {
                                position: -1,
                                weight: 0.0,
                                score: 0.0,
                            });
                        }
                    }
                }
            }
        }
        LayerTrace::Buckets { buckets, offset } => {
            let [_, bh, rounds, padded] = buckets.dims();
            let ids: Vec<i64> = buckets.into_data().iter::<i64>().collect();
            layer.rounds = rounds;
            for t in 0..len {
                for head in 0..bh {
                    for r in 0..rounds {
                        let at = (head * rounds + r) * padded + offset + t;
                        layer.buckets.push(ids[at].max(0) as u32);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Mean bits with and without memory; the best regions and tokens by gain.
fn summarize(with: &[f32], without: &[f32], opts: &InspectOptions) -> Summary {
    let n = with.len();
    let ln2 = std::f64::consts::LN_2;
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / n.max(1) as f64 / ln2;
    // gain[t]: of token t + 1.
    let gain: Vec<f64> = with
        .iter()
        .zip(without)
        .map(|(&w, &o)| o as f64 - w as f64)
        .collect();
    let w = opts.region_len.clamp(1, n.max(1));
    let mut prefix = vec![0.0; n + 1];
    for (i, g) in gain.iter().enumerate() {
        prefix[i + 1] = prefix[i] + g;
    }
    let mut windows: Vec<(f64, usize)> = (0..=n.saturating_sub(w))
        .map(|s| (prefix[s + w] - prefix[s], s))
        .collect();
    windows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut regions: Vec<Region> = Vec::new();
    for (g, s) in windows {
        if regions.len() >= opts.top || g <= 0.0 {
            break;
        }
        if regions
            .iter()
            .all(|r| s + w <= r.start || r.start + r.len <= s)
        {
            regions.push(Region {
                start: s + 1,
                len: w,
                gain: g,
            });
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| gain[b].total_cmp(&gain[a]));
    let tokens_top = order
        .into_iter()
        .take(opts.top)
        .filter(|&t| gain[t] > 0.0)
        .map(|t| t + 1)
        .collect();
    Summary {
        tokens: n,
        bpc_with: mean(with),
        bpc_without: mean(without),
        regions,
        tokens_top,
    }
}

/// The tokens of a byte-level text as text: a UTF-8 character on its first byte, nothing on
/// its other bytes (invalid bytes as U+FFFD).
pub fn byte_pieces(bytes: &[u8]) -> Vec<String> {
    let mut pieces = Vec::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            pieces.push(c.to_string());
            pieces.extend((1..c.len_utf8()).map(|_| String::new()));
        }
        pieces.extend(chunk.invalid().iter().map(|_| "\u{FFFD}".to_string()));
    }
    pieces
}

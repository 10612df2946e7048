//! Relative positions: the three schemes, their per-distance encodings and the key mask.
//!
//! Everything here depends only on `(qlen, mlen)`, never on a layer, so a model builds one
//! [`RelativeContext`] per forward pass and hands it to every layer.

use burn::config::Config;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::shift::{distance_of_column, n_columns};

/// Which relative position scheme an attention layer uses.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PositionKind {
    /// Transformer-XL (Dai et al. 2019, sec. 3.3): sinusoidal `R` projected by `W_R`, with the
    /// global content bias `u` and position bias `v`.
    #[default]
    Xl,
    /// Learned relative embeddings with key and query position biases (the labml variant).
    Learned,
    /// T5's bucketed scalar bias per head (Raffel et al. 2020), as the Memorizing Transformer
    /// uses for its local attention.
    T5,
    /// No relative term: scores are `s q_i·k_j` alone, and the stack adds sinusoidal
    /// *absolute* positions to the token embeddings (Vaswani et al. 2017), which index the
    /// positions of one segment. This is the vanilla Transformer of Al-Rfou et al. (2018),
    /// the baseline of the Transformer-XL paper: it cannot carry a memory (`mem_len = 0`).
    Absolute,
    /// Rotary positions (Su et al. 2021), with xPos scaling (Sun et al. 2022) when
    /// `xpos_scale_base` is set: queries and keys are rotated by their positions, so `s
    /// rot(q_i)·rot(k_j)` depends on `i + mlen − j` alone (see [`crate::rotary`];
    /// block-recurrent-transformer-pytorch's layers). No parameters.
    Rotary,
}

impl std::str::FromStr for PositionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "xl" => Ok(PositionKind::Xl),
            "learned" => Ok(PositionKind::Learned),
            "t5" => Ok(PositionKind::T5),
            "absolute" => Ok(PositionKind::Absolute),
            "rotary" => Ok(PositionKind::Rotary),
            other => Err(format!(
                "unknown position scheme `{other}`: expected xl, learned, t5, absolute or rotary"
            )),
        }
    }
}

/// Configuration of the relative position scheme.
#[derive(Config, Debug, PartialEq)]
pub struct PositionConfig {
    /// The scheme. Default: `xl`.
    #[config(default = "PositionKind::Xl")]
    pub kind: PositionKind,
    /// XL only: distances beyond `clamp_len` use the encoding of `clamp_len`. Default: none.
    #[config(default = "None")]
    pub clamp_len: Option<usize>,
    /// Learned: the table covers distances `-max_distance..=max_distance` (larger ones are
    /// clamped). T5: the distance at which the last bucket starts. Default: 128.
    #[config(default = 128)]
    pub max_distance: usize,
    /// T5 only: number of buckets. Default: 32.
    #[config(default = 32)]
    pub num_buckets: usize,
    /// T5 only: give future keys their own buckets (half of them). Default: false (causal).
    #[config(default = false)]
    pub bidirectional: bool,
    /// T5 only: the bias added is `bias_scale · β_bucket` (memorizing-transformers-pytorch
    /// multiplies its tables by `sqrt(d_head)`). Default: 1.0 (the table as is).
    #[config(default = 1.0)]
    pub bias_scale: f64,
    /// T5 only: the bucket of query `i` and key `j` of `cat(memory, segment)` is that of the
    /// true distance `d = i + mlen - j`. false: of `d = i - j`, the distance as if the
    /// memory were not there, as memorizing-transformers-pytorch 0.4.1 computes it (its bias
    /// table is built for query positions `0..qlen` against key positions `0..klen`); the
    /// causal mask still uses the true distance. Default: true.
    #[config(default = true)]
    pub memory_offset: bool,
    /// Learned only: the query bias `b_q` and the per-distance key bias `b_k,d` (labml's
    /// scheme) take part in the scores. false: the scores are `q_i·k_j + q_i·E_d` alone, as
    /// compressive-transformer-pytorch's (the two parameters stay in the model at zero, and no
    /// gradient reaches them, so a fine-tuned import still exports). Default: true.
    #[config(default = true)]
    pub learned_biases: bool,
    /// Rotary only: the frequency base `b`, `θ_k = b^(−2k / d_head)`. Default: 10000.
    #[config(default = 10000.0)]
    pub rotary_theta: f64,
    /// Rotary only: xPos's scale base `γ` (the peer's `scale_base`, 512); `None`: plain
    /// rotary positions, no xPos scaling. Default: none.
    #[config(default = "None")]
    pub xpos_scale_base: Option<f64>,
    /// Rotary only: the keys sit at positions `width − klen .. width` and the xPos exponent is
    /// centred at `width / 2` (block-recurrent-transformer-pytorch: `2 × block_width`); the
    /// same relative positions whatever it is, it only fixes where the float rounding
    /// happens. `None`: `klen`. Default: none.
    #[config(default = "None")]
    pub rotary_width: Option<usize>,
}

impl Default for PositionConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl PositionConfig {
    /// Checks the scheme's own fields; `d_model` is the attention width.
    pub fn validate(&self, d_model: usize) -> Result<(), String> {
        match self.kind {
            PositionKind::Rotary => {
                if !(self.rotary_theta.is_finite() && self.rotary_theta > 0.0) {
                    return Err(format!(
                        "rotary_theta must be positive, got {}",
                        self.rotary_theta
                    ));
                }
                if let Some(g) = self.xpos_scale_base
                    && !(g.is_finite() && g > 0.0)
                {
                    return Err(format!("xpos_scale_base must be positive, got {g}"));
                }
            }
            PositionKind::Absolute => {
                if !d_model.is_multiple_of(2) {
                    return Err(format!(
                        "absolute positions need an even d_model for the sin/cos pairs, got d_model = {d_model}"
                    ));
                }
            }
            PositionKind::Xl => {
                if !d_model.is_multiple_of(2) {
                    return Err(format!(
                        "xl positions need an even d_model for the sin/cos pairs, got d_model = {d_model}"
                    ));
                }
                if self.clamp_len == Some(0) {
                    return Err("clamp_len = 0 would give every distance the same encoding; use a positive value or none".into());
                }
            }
            PositionKind::Learned => {
                if self.max_distance == 0 {
                    return Err("learned positions need max_distance > 0".into());
                }
            }
            PositionKind::T5 => {
                let per_side = if self.bidirectional {
                    if !self.num_buckets.is_multiple_of(2) {
                        return Err(format!(
                            "bidirectional T5 buckets are split in two halves: num_buckets must be even, got {}",
                            self.num_buckets
                        ));
                    }
                    self.num_buckets / 2
                } else {
                    self.num_buckets
                };
                if per_side < 2 {
                    return Err(format!(
                        "T5 positions need at least 2 buckets per direction, got num_buckets = {}",
                        self.num_buckets
                    ));
                }
                if !self.bias_scale.is_finite() {
                    return Err(format!(
                        "T5 bias_scale must be finite, got {}",
                        self.bias_scale
                    ));
                }
                if self.max_distance <= per_side / 2 {
                    return Err(format!(
                        "T5 max_distance ({}) must exceed the exact range num_buckets/2 = {}",
                        self.max_distance,
                        per_side / 2
                    ));
                }
            }
        }
        Ok(())
    }

    /// Size of the per-distance parameter table (learned: `2 max_distance + 1`, T5: buckets).
    pub fn table_len(&self) -> usize {
        match self.kind {
            PositionKind::Xl | PositionKind::Absolute | PositionKind::Rotary => 0,
            PositionKind::Learned => 2 * self.max_distance + 1,
            PositionKind::T5 => self.num_buckets,
        }
    }

    /// Row of the parameter table used for distance `d = query position - key position`.
    pub fn table_index(&self, d: i64) -> usize {
        match self.kind {
            PositionKind::Xl | PositionKind::Absolute | PositionKind::Rotary => 0,
            PositionKind::Learned => {
                let m = self.max_distance as i64;
                (d.clamp(-m, m) + m) as usize
            }
            PositionKind::T5 => {
                t5_bucket(d, self.bidirectional, self.num_buckets, self.max_distance)
            }
        }
    }

    /// The distance the XL sinusoid is evaluated at for distance `d` (after `clamp_len`).
    pub fn clamped(&self, d: i64) -> i64 {
        match self.clamp_len {
            Some(c) => d.clamp(-(c as i64), c as i64),
            None => d,
        }
    }
}

/// T5's relative position bucket of distance `d = query position - key position`.
///
/// Small distances get a bucket each (`max_exact = buckets / 2` of them); larger ones share
/// logarithmically wider buckets up to `max_distance`, beyond which all fall in the last.
/// Causal (`bidirectional = false`): future keys (`d < 0`) share bucket 0 with `d = 0`.
pub fn t5_bucket(d: i64, bidirectional: bool, num_buckets: usize, max_distance: usize) -> usize {
    let mut buckets = num_buckets;
    let mut offset = 0;
    let n = if bidirectional {
        buckets /= 2;
        if d < 0 {
            offset = buckets;
        }
        d.unsigned_abs() as usize
    } else {
        d.max(0) as usize
    };
    let max_exact = buckets / 2;
    let bucket = if n < max_exact {
        n
    } else {
        let ratio =
            (n as f64 / max_exact as f64).ln() / (max_distance as f64 / max_exact as f64).ln();
        let large = max_exact + (ratio * (buckets - max_exact) as f64) as usize;
        large.min(buckets - 1)
    };
    offset + bucket
}

/// Sinusoidal encoding of distance `d` in `d_model` dims: `[sin(d ω_k)…, cos(d ω_k)…]`,
/// `ω_k = 10000^(-2k / d_model)`: the sines then the cosines, concatenated as Transformer-XL's
/// code builds `R` (`PositionalEmbedding`). Vaswani et al. 2017 interleave them instead; the
/// features are the same up to a permutation, which the projection `W_R` absorbs.
pub fn sinusoid(d: i64, d_model: usize, out: &mut Vec<f32>) {
    let half = d_model / 2;
    let start = out.len();
    out.resize(start + d_model, 0.0);
    for k in 0..half {
        let inv_freq = 1.0 / 10000f64.powf(2.0 * k as f64 / d_model as f64);
        let angle = d as f64 * inv_freq;
        out[start + k] = angle.sin() as f32;
        out[start + half + k] = angle.cos() as f32;
    }
}

/// Which keys each query may attend to (`true` in a mask = hidden, Burn's convention).
// One value per forward pass: the size of the `Explicit` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// Every query sees every key.
    None,
    /// Query `i` (absolute position `mlen + i`) sees keys `j <= mlen + i`; with a window `w`,
    /// only the `w` most recent of those (`j > mlen + i - w`), so that every query sees the
    /// same number of keys (Transformer-XL's `same_length`).
    Causal {
        /// The number of keys every query sees (`None`: all its causal keys).
        window: Option<usize>,
    },
    /// An explicit mask, `[1 or batch, qlen, klen]`, `true` = hidden.
    Explicit(Tensor<3, Bool>),
}

impl AttentionMask {
    /// The causal mask with no window.
    pub fn causal() -> Self {
        AttentionMask::Causal { window: None }
    }

    /// Materialises the mask, `[1 or batch, qlen, klen]`, or `None` when nothing is hidden.
    pub fn build(&self, qlen: usize, mlen: usize, device: &Device) -> Option<Tensor<3, Bool>> {
        let klen = qlen + mlen;
        match self {
            AttentionMask::None => None,
            AttentionMask::Explicit(mask) => Some(mask.clone()),
            AttentionMask::Causal { window } => {
                let mut hidden = vec![false; qlen * klen];
                let mut any = false;
                for i in 0..qlen {
                    let pos = (mlen + i) as i64;
                    for j in 0..klen {
                        let ji = j as i64;
                        let h = ji > pos || window.is_some_and(|w| ji <= pos - w as i64);
                        hidden[i * klen + j] = h;
                        any |= h;
                    }
                }
                any.then(|| Tensor::from_data(TensorData::new(hidden, [1, qlen, klen]), device))
            }
        }
    }
}

/// Position information shared by every layer of one forward pass.
///
/// Columns are indexed by distance, `c ↦ klen - 1 - c`, [`n_columns`] of them (see
/// [`crate::shift`]): all `klen + qlen - 1` distances, or only the `klen` non-negative ones under
/// a causal mask, and one more.
#[derive(Debug, Clone)]
pub struct RelativeContext {
    /// Queries in this segment.
    pub qlen: usize,
    /// Memory keys prepended to the segment.
    pub mlen: usize,
    /// The scheme's position indices.
    pub index: PositionIndex,
    /// Hidden keys, `[1 or batch, qlen, klen]` (`true` = hidden), `None` if all are visible.
    pub mask: Option<Tensor<3, Bool>>,
    /// The score given to hidden keys before the softmax: `-inf` when every query keeps at
    /// least one visible key (causal masks: the query itself), so that `exp` of it is an exact
    /// 0 without libm's underflow path; `-1e9` for explicit masks, where a fully hidden row
    /// then attends uniformly instead of producing NaN.
    pub mask_value: f32,
    /// T5: a table `[num_buckets, heads]` that every T5 layer reading this context uses
    /// instead of its own (one table shared across layers, as memorizing-transformers-pytorch
    /// has); `None`: each layer its own. See [`with_t5_table`](Self::with_t5_table).
    pub t5_table: Option<Tensor<2>>,
    /// The first layer's values, for the later layers with a value gate (value residual
    /// learning); `None`: none. See [`with_value_residual`](Self::with_value_residual).
    pub value_residual: Option<crate::attention::ValueResidual>,
    /// A slot every layer reading this context fills with its projections; `None`: none. See
    /// [`with_projection_tap`](Self::with_projection_tap).
    pub projection_tap: Option<crate::attention::ProjectionTap>,
    /// The memory handed to a layer with cached keys and values already ends with the
    /// segment's own entries (`mlen + qlen` of them): the layer splits it and appends
    /// nothing. See [`with_memory_holding_segment`](Self::with_memory_holding_segment).
    pub memory_holds_segment: bool,
}

impl RelativeContext {
    /// Builds the context for `qlen` queries over `mlen` memory keys plus the segment.
    pub fn new(
        positions: &PositionConfig,
        d_model: usize,
        qlen: usize,
        mlen: usize,
        mask: &AttentionMask,
        device: &Device,
    ) -> Self {
        let klen = qlen + mlen;
        // A causal mask hides every negative distance: score only the klen non-negative ones
        // (and one more, which the shift needs as its row stride).
        let causal = matches!(mask, AttentionMask::Causal { .. });
        let w = n_columns(qlen, klen, causal);
        let distances = (0..w).map(|c| distance_of_column(c, klen));
        let index = match positions.kind {
            PositionKind::Absolute => PositionIndex::Absolute,
            // Each layer rotates its own heads (`crate::rotary::RotaryTables`).
            PositionKind::Rotary => PositionIndex::Rotary,
            PositionKind::Xl => {
                let mut data = Vec::with_capacity(w * d_model);
                for d in distances {
                    sinusoid(positions.clamped(d), d_model, &mut data);
                }
                PositionIndex::Xl(Tensor::from_data(
                    TensorData::new(data, [w, d_model]),
                    device,
                ))
            }
            PositionKind::Learned => {
                let idx: Vec<i64> = distances.map(|d| positions.table_index(d) as i64).collect();
                PositionIndex::Learned(Tensor::from_data(TensorData::new(idx, [w]), device))
            }
            PositionKind::T5 => {
                // Bucket of d = i + mlen - j (or i - j without `memory_offset`), per distance
                // once, then laid out per pair.
                let offset = if positions.memory_offset { mlen } else { 0 } as i64;
                let bucket: Vec<i64> = (-(klen as i64)..=klen as i64)
                    .map(|d| positions.table_index(d) as i64)
                    .collect();
                let at = |d: i64| bucket[(d + klen as i64) as usize];
                let idx: Vec<i64> = (0..qlen)
                    .flat_map(|i| (0..klen).map(move |j| i as i64 + offset - j as i64))
                    .map(at)
                    .collect();
                PositionIndex::T5(Tensor::from_data(
                    TensorData::new(idx, [qlen * klen]),
                    device,
                ))
            }
        };
        Self::of_index(index, qlen, mlen, mask, device)
    }

    /// The context of `index` for `qlen` queries over `mlen` memory keys under `mask`.
    fn of_index(
        index: PositionIndex,
        qlen: usize,
        mlen: usize,
        mask: &AttentionMask,
        device: &Device,
    ) -> Self {
        Self {
            qlen,
            mlen,
            index,
            mask: mask.build(qlen, mlen, device),
            mask_value: match mask {
                AttentionMask::Causal { .. } => f32::NEG_INFINITY,
                _ => -1.0e9,
            },
            t5_table: None,
            value_residual: None,
            projection_tap: None,
            memory_holds_segment: false,
        }
    }

    /// The context of an XL scheme whose layers hold their `W_R R` per distance in a table
    /// covering distances `-1 ..= max_distance` ([`PositionIndex::XlRows`]), where this pass
    /// fits it: a causal mask and no distance beyond `max_distance`; else `None` (build it
    /// with [`new`](Self::new)). It computes the same scores as the sinusoid context without
    /// projecting a sinusoid per column in every pass.
    ///
    /// The table holds distance `d` in row `max_distance - d` (`clamp_len` applied to what
    /// the row holds), and column `c` of the pass is distance `klen - 1 - c`, so the pass's
    /// `klen + 1` columns are the rows from `max_distance + 1 - klen` on, a range read in
    /// place.
    pub fn with_table_rows(
        positions: &PositionConfig,
        max_distance: usize,
        qlen: usize,
        mlen: usize,
        mask: &AttentionMask,
        device: &Device,
    ) -> Option<Self> {
        let klen = qlen + mlen;
        let causal = matches!(mask, AttentionMask::Causal { .. });
        if positions.kind != PositionKind::Xl || !causal || klen == 0 || klen - 1 > max_distance {
            return None;
        }
        let len = n_columns(qlen, klen, true);
        debug_assert_eq!(distance_of_column(0, klen), klen as i64 - 1);
        let index = PositionIndex::XlRows {
            first: max_distance + 1 - klen,
            len,
        };
        Some(Self::of_index(index, qlen, mlen, mask, device))
    }

    /// The same context with a T5 table that every T5 layer reading it uses instead of its
    /// own (a table shared across layers; its gradient is the sum over those layers).
    ///
    /// # Shapes
    /// - `table`: `[num_buckets, heads]`
    pub fn with_t5_table(mut self, table: Tensor<2>) -> Self {
        self.t5_table = Some(table);
        self
    }

    /// The same context carrying a fresh [`ValueResidual`](crate::ValueResidual): its first
    /// layer stores its values, the later layers with a value gate mix them into theirs. One
    /// per forward pass.
    pub fn with_value_residual(mut self) -> Self {
        self.value_residual = Some(Default::default());
        self
    }

    /// The same context for layers whose cached memory already ends with the segment's own
    /// key/value entries (`cat(memory, entries(x))`, built once by the caller, which keeps it
    /// as the next memory too): a layer with `memory_keys_values` then reads it as it is,
    /// where it would append the entries itself (a copy of the whole memory per layer and
    /// pass; generation, one token over a long memory, reads little else).
    pub fn with_memory_holding_segment(mut self) -> Self {
        self.memory_holds_segment = true;
        self
    }

    /// The same context carrying `tap`: every relative layer reading it stores its queries,
    /// keys and values there ([`ProjectionTap`](crate::ProjectionTap)).
    pub fn with_projection_tap(mut self, tap: crate::attention::ProjectionTap) -> Self {
        self.projection_tap = Some(tap);
        self
    }

    /// Keys per query: `mlen + qlen`.
    pub fn klen(&self) -> usize {
        self.qlen + self.mlen
    }

    /// `scores` with hidden keys set to [`mask_value`](Self::mask_value).
    ///
    /// # Shapes
    /// - `scores`: `[batch, heads, qlen, klen]`
    pub fn mask_scores(&self, scores: Tensor<4>) -> Tensor<4> {
        match &self.mask {
            Some(mask) => {
                let [batch, heads, qlen, klen] = scores.dims();
                let mb = mask.dims()[0];
                let mask = mask
                    .clone()
                    .reshape([mb, 1, qlen, klen])
                    .expand([batch, heads, qlen, klen]);
                scores.mask_fill(mask, self.mask_value)
            }
            None => scores,
        }
    }
}

/// The position indices of one scheme for one (qlen, mlen), computed once per forward pass.
#[derive(Debug, Clone)]
pub enum PositionIndex {
    /// XL: the sinusoid of every (clamped) distance, `[columns, d_model]`.
    Xl(Tensor<2>),
    /// XL read from each layer's table of `W_R R` per distance
    /// ([`RelativeMultiHeadAttention::with_position_table`](crate::RelativeMultiHeadAttention::with_position_table),
    /// for generation): the columns are the table's rows `first .. first + len` (the table
    /// holds distance `d` in row `max_distance - d`, so the columns' distances `klen - 1`
    /// down to -1, the causal shift's extra column, are consecutive rows).
    XlRows {
        /// The row of the first column (distance `klen - 1`).
        first: usize,
        /// Columns: `klen + 1`.
        len: usize,
    },
    /// Learned: the parameter-table row of every distance, `[columns]`.
    Learned(Tensor<1, Int>),
    /// T5: the bucket of every (query, key) pair, `bucket(i + mlen - j)` at `i * klen + j`,
    /// `[qlen * klen]` (a bias needs no shift: it is gathered straight into key order).
    T5(Tensor<1, Int>),
    /// Absolute: nothing per distance (the positions were added to the embeddings).
    Absolute,
    /// Rotary: nothing shared (each layer builds its tables of `d_head` from `qlen`, `mlen`).
    Rotary,
}

impl PositionIndex {
    /// The scheme these indices belong to.
    pub fn kind(&self) -> PositionKind {
        match self {
            PositionIndex::Xl(_) | PositionIndex::XlRows { .. } => PositionKind::Xl,
            PositionIndex::Learned(_) => PositionKind::Learned,
            PositionIndex::T5(_) => PositionKind::T5,
            PositionIndex::Absolute => PositionKind::Absolute,
            PositionIndex::Rotary => PositionKind::Rotary,
        }
    }
}

//! Reversible Reformer layers and the Reformer language model (Kitaev et al. 2020, sec. 3).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::config::Config;
use burn::module::Module;
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor};

use crate::attention::{
    AttentionKind, ForwardOptions, LshScores, ReformerAttention, ReformerAttentionConfig,
};
use crate::error::ReformerError;
use crate::feedforward::{
    AxialPositionalEmbedding, AxialPositionalEmbeddingConfig, ChunkedFeedForward,
    ChunkedFeedForwardConfig,
};
use crate::rng::{dropout_mask, mix};

/// Seed tags of the random sites of a block / the model.
const TAG_ATTENTION: u64 = 1;
const TAG_DROP_F: u64 = 2;
const TAG_DROP_G: u64 = 3;
const TAG_EMBED: u64 = 1_000_001;
const TAG_LAYER: u64 = 1_000;

/// Applies an explicit, seeded dropout mask (the same seed replays the same mask).
fn dropout(x: Tensor<3>, p: f64, opts: &ForwardOptions, tag: u64) -> Tensor<3> {
    if !opts.train {
        return x;
    }
    match dropout_mask(x.dims(), p, mix(opts.seed, tag), &x.device()) {
        Some(mask) => x * mask,
        None => x,
    }
}

/// One Reformer layer: `F` = attention, `G` = feed-forward, each with a pre-LayerNorm and
/// dropout on its output.
///
/// Reversible (RevNet, eq. in sec. 3): `y_1 = x_1 + F(x_2)`, `y_2 = x_2 + G(y_1)`, inverted by
/// `x_2 = y_2 - G(y_1)`, `x_1 = y_1 - F(x_2)`. Plain residual: `x += F(x); x += G(x)`.
///
/// # Shapes
/// - every activation: `[batch, len, d_model]`
#[derive(Module, Debug)]
pub struct ReformerBlock {
    /// LayerNorm before the attention.
    pub norm_attention: LayerNorm,
    /// LSH or local attention.
    pub attention: ReformerAttention,
    /// LayerNorm before the feed-forward.
    pub norm_ff: LayerNorm,
    /// Chunked feed-forward.
    pub ff: ChunkedFeedForward,
    /// Dropout rate on the outputs of `F` and `G`.
    pub dropout: f64,
}

impl ReformerBlock {
    /// `F(x) = Dropout(Attention(LN(x)))`.
    pub fn f(
        &self,
        x: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> Tensor<3> {
        self.f_recorded(x, pad, opts, None).0
    }

    /// [`f`](Self::f) with the LSH bucket ids it used, hashing with `buckets` when given (see
    /// [`ReformerAttention::forward_recorded`]).
    pub(crate) fn f_recorded(
        &self,
        x: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
        buckets: Option<Tensor<4, Int>>,
    ) -> (Tensor<3>, Option<Tensor<4, Int>>) {
        let (out, used) = self.attention.forward_recorded(
            self.norm_attention.forward(x),
            pad,
            &opts.child(TAG_ATTENTION),
            buckets,
        );
        (dropout(out, self.dropout, opts, TAG_DROP_F), used)
    }

    /// The dropout mask of `G` for activations of `shape` (`None`: no dropout).
    fn g_mask(
        &self,
        shape: [usize; 3],
        opts: &ForwardOptions,
        device: &Device,
    ) -> Option<Tensor<3>> {
        if !opts.train {
            return None;
        }
        dropout_mask(shape, self.dropout, mix(opts.seed, TAG_DROP_G), device)
    }

    /// `G(x) = Dropout(FF(LN(x)))` with the feed-forward computed chunk by chunk.
    pub fn g(&self, x: Tensor<3>, opts: &ForwardOptions) -> Tensor<3> {
        let mask = self.g_mask(x.dims(), opts, &x.device());
        let out = self.ff.forward(self.norm_ff.forward(x));
        match mask {
            Some(m) => out * m,
            None => out,
        }
    }

    /// `G` on a slice of positions with the matching slice of the dropout mask (`G` is
    /// position-wise, so this equals the same slice of [`g`](Self::g)).
    fn g_part(&self, x: Tensor<3>, mask: Option<Tensor<3>>) -> Tensor<3> {
        let out = self.ff.forward_chunk(self.norm_ff.forward(x));
        match mask {
            Some(m) => out * m,
            None => out,
        }
    }

    /// `(y_1, y_2) = (x_1 + F(x_2), x_2 + G(y_1))`.
    pub fn forward_reversible(
        &self,
        x1: Tensor<3>,
        x2: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> (Tensor<3>, Tensor<3>) {
        let (y1, y2, _) = self.forward_reversible_recorded(x1, x2, pad, opts);
        (y1, y2)
    }

    /// [`forward_reversible`](Self::forward_reversible), also returning the LSH bucket ids of
    /// `F` (`None` for local attention), which [`reverse`](Self::reverse) replays.
    pub fn forward_reversible_recorded(
        &self,
        x1: Tensor<3>,
        x2: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> (Tensor<3>, Tensor<3>, Option<Tensor<4, Int>>) {
        let (f, buckets) = self.f_recorded(x2.clone(), pad, opts, None);
        let y1 = x1 + f;
        let y2 = x2 + self.g(y1.clone(), opts);
        (y1, y2, buckets)
    }

    /// `x + F(x)`, then `+ G(.)`.
    pub fn forward_residual(
        &self,
        x: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> Tensor<3> {
        let x = x.clone() + self.f(x, pad, opts);
        x.clone() + self.g(x, opts)
    }

    /// The inverse of [`forward_reversible`](Self::forward_reversible) (no gradients).
    pub fn inverse(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        opts: &ForwardOptions,
    ) -> (Tensor<3>, Tensor<3>) {
        let x2 = y2 - self.g(y1.clone(), opts);
        let x1 = y1 - self.f(x2.clone(), pad, opts);
        (x1, x2)
    }

    /// One layer of the reversible backward pass.
    ///
    /// From the outputs `(y_1, y_2)` and their gradients `(dy_1, dy_2)` (untracked tensors),
    /// rebuilds the inputs and returns `(x_1, x_2, dx_1, dx_2)`, adding this block's parameter
    /// gradients to `acc`. `G` is recomputed and differentiated `ff_chunk` positions at a time,
    /// so its `d_ff` activation never exists for the whole sequence; `F` is recomputed once on a
    /// fresh leaf. `self` must live on an autodiff device; dropout masks replay the forward pass
    /// through `opts`. `buckets`: the LSH bucket ids the forward pass used (from
    /// [`forward_reversible_recorded`](Self::forward_reversible_recorded)); `F` attends with
    /// them rather than hashing the rebuilt `x_2`, whose rounding error can flip an argmax and
    /// so differentiate another sparsity pattern than the forward used (`None`: hash again).
    #[allow(clippy::too_many_arguments)]
    pub fn reverse<M: Module>(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        dy1: Tensor<3>,
        dy2: Tensor<3>,
        pad: Option<Tensor<2, Bool>>,
        buckets: Option<Tensor<4, Int>>,
        opts: &ForwardOptions,
        model: &M,
        acc: &mut GradientsAccumulator<M>,
    ) -> (Tensor<3>, Tensor<3>, Tensor<3>, Tensor<3>) {
        let [b, l, d] = y1.dims();
        let chunk = if self.ff.chunk_len == 0 {
            l
        } else {
            self.ff.chunk_len.min(l)
        };
        let mask = self.g_mask([b, l, d], opts, &y1.device());
        // G phase: dG/dy1 and G(y1), chunk by chunk.
        let mut g_vals = Vec::new();
        let mut g_grads = Vec::new();
        for s in (0..l).step_by(chunk) {
            let e = (s + chunk).min(l);
            let leaf = y1.clone().slice([0..b, s..e]).autodiff().require_grad();
            let m = mask.clone().map(|m| m.slice([0..b, s..e]));
            let out = self.g_part(leaf.clone(), m);
            let dy2_part = dy2.clone().slice([0..b, s..e]);
            let mut grads = (out.clone() * dy2_part).sum().backward();
            g_grads.push(leaf.grad(&grads).expect("leaf requires grad").inner());
            acc.accumulate(model, GradientsParams::from_module(&mut grads, self));
            g_vals.push(out.inner());
        }
        let x2 = y2 - Tensor::cat(g_vals, 1);
        let dy1_total = dy1 + Tensor::cat(g_grads, 1);
        // F phase.
        let leaf = x2.clone().autodiff().require_grad();
        let (out, _) = self.f_recorded(
            leaf.clone(),
            pad.map(|p| p.autodiff()),
            opts,
            buckets.map(|b| b.autodiff()),
        );
        let mut grads = (out.clone() * dy1_total.clone()).sum().backward();
        let dx2 = dy2 + leaf.grad(&grads).expect("leaf requires grad").inner();
        acc.accumulate(model, GradientsParams::from_module(&mut grads, self));
        let x1 = y1 - out.inner();
        (x1, x2, dy1_total, dx2)
    }
}

/// Configuration of a [`ReformerLm`]. Defaults: the Reformer-small reference (6 layers,
/// d_model 256, 8 heads x 32, seq 4096, bucket 64, 4 rounds, causal, reversible, chunked FF,
/// axial positions, bytes).
#[derive(Config, Debug)]
pub struct ReformerConfig {
    /// Vocabulary size. Default: 256 (bytes).
    #[config(default = 256)]
    pub vocab_size: usize,
    /// Model width. Default: 256.
    #[config(default = 256)]
    pub d_model: usize,
    /// Number of layers. Default: 6.
    #[config(default = 6)]
    pub n_layers: usize,
    /// Attention heads per layer. Default: 8.
    #[config(default = 8)]
    pub n_heads: usize,
    /// Width of each head. Default: 32.
    #[config(default = 32)]
    pub d_head: usize,
    /// Inner width of the feed-forward. Default: 1024.
    #[config(default = 1024)]
    pub d_ff: usize,
    /// Longest sequence (the axial grid covers it). Default: 4096.
    #[config(default = 4096)]
    pub max_seq_len: usize,
    /// Attention type per layer, `"lsh"` or `"local"`, repeated to `n_layers`; empty: all
    /// LSH. Default: empty.
    #[config(default = "Vec::new()")]
    pub attn_layers: Vec<AttentionKind>,
    /// LSH: how a query scores its shared-QK keys. Default: unit keys and no further scale, as
    /// trax and HF (`scaled_unit_keys`: also `1/sqrt(d_head)`, as reformer-pytorch).
    #[config(default = "LshScores::UnitKeys")]
    pub lsh_scores: LshScores,
    /// Chunk length of the attention (= LSH bucket size). Default: 64.
    #[config(default = 64)]
    pub bucket_size: usize,
    /// LSH buckets per round (even); `None`: length / bucket size. Default: none.
    #[config(default = "None")]
    pub n_buckets: Option<usize>,
    /// LSH hash rounds. Default: 4.
    #[config(default = 4)]
    pub n_rounds: usize,
    /// Chunks before its own a chunk attends to. Default: 1.
    #[config(default = 1)]
    pub n_chunks_before: usize,
    /// Chunks after its own a chunk attends to. Default: 0.
    #[config(default = 0)]
    pub n_chunks_after: usize,
    /// Causal (language model) masking. Default: true.
    #[config(default = true)]
    pub causal: bool,
    /// Reversible residual layers (activations rebuilt in the backward). Default: true.
    #[config(default = true)]
    pub reversible: bool,
    /// Positions per feed-forward chunk (0: no chunking). Default: 512.
    #[config(default = 512)]
    pub ff_chunk_len: usize,
    /// Axial position embeddings (else none). Default: true.
    #[config(default = true)]
    pub axial_positions: bool,
    /// Axial grid `(a_1, a_2)`, `a_1 a_2 >= max_seq_len`; `None`: the smallest near-square
    /// grid. Default: none (64 x 64 for 4096).
    #[config(default = "None")]
    pub axial_shape: Option<[usize; 2]>,
    /// Axial widths `(d_1, d_2)`, `d_1 + d_2 = d_model`; `None`: halves. Default: none.
    #[config(default = "None")]
    pub axial_dims: Option<[usize; 2]>,
    /// Dropout on embeddings and on the outputs of attention and feed-forward. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Standard deviation of the normal initialiser of the embedding and every weight matrix
    /// (biases start at zero, LayerNorms at gain 1), HF Reformer's `initializer_range`.
    /// Default: 0.02.
    #[config(default = 0.02)]
    pub init_std: f64,
    /// Standard deviation of the axial position embeddings' normal initialiser (`None`:
    /// `init_std`, the token embedding's). The token and position embeddings are summed, so
    /// they start at one scale, as in reformer-pytorch (both N(0, 1)). HF's Reformer draws
    /// them from N(0, `axial_norm_std` = 1) beside tokens from N(0, 0.02): the positions drown
    /// the tokens 50:1, and a small Reformer trained so sat at the unigram level (4.84 bpc on
    /// tiny Shakespeare after 250 steps, 3.58 with `None`). Default: none.
    #[config(default = "None")]
    pub axial_std: Option<f64>,
    /// Seed of the (fixed) hash rotations in evaluation. Default: 0.
    #[config(default = 0)]
    pub eval_seed: u64,
    /// Base seed of the per-step rotations and dropout masks of `train_step`. Default: 1.
    #[config(default = 1)]
    pub train_seed: u64,
}

impl ReformerConfig {
    /// Reformer-small, memzoo's reference for CPU-sized runs (= [`ReformerConfig::new`]).
    pub fn small() -> Self {
        Self::new()
    }

    /// The Reformer's enwik8 configuration (Kitaev et al. 2020; trax's `reformer_enwik8.gin`):
    /// 12 reversible layers, d_model 1024, 8 heads x 128, feed-forward 4096, attention
    /// `[local, local, lsh, local]` repeated, LSH with 512 buckets of 256 positions and 2 hash
    /// rounds, dropout 0.2, sequences of 65,536 bytes with axial positions 128 x 512 (widths
    /// 256 + 768). memzoo uses one chunk length for local and LSH layers (trax's local bins are
    /// 128 long).
    pub fn enwik8() -> Self {
        Self::new()
            .with_n_layers(12)
            .with_d_model(1024)
            .with_n_heads(8)
            .with_d_head(128)
            .with_d_ff(4096)
            .with_attn_layers(vec![
                AttentionKind::Local,
                AttentionKind::Local,
                AttentionKind::Lsh,
                AttentionKind::Local,
            ])
            .with_bucket_size(256)
            .with_n_buckets(Some(512))
            .with_n_rounds(2)
            .with_dropout(0.2)
            .with_max_seq_len(65_536)
            .with_axial_shape(Some([128, 512]))
            .with_axial_dims(Some([256, 768]))
    }

    /// The attention type of every layer.
    pub fn layer_kinds(&self) -> Result<Vec<AttentionKind>, ReformerError> {
        if self.attn_layers.is_empty() {
            return Ok(vec![AttentionKind::Lsh; self.n_layers]);
        }
        (0..self.n_layers)
            .map(|i| Ok(self.attn_layers[i % self.attn_layers.len()]))
            .collect()
    }

    /// The axial grid.
    pub fn axial_grid(&self) -> [usize; 2] {
        self.axial_shape.unwrap_or_else(|| {
            let a1 = (self.max_seq_len as f64).sqrt().ceil().max(1.0) as usize;
            [a1, self.max_seq_len.div_ceil(a1).max(1)]
        })
    }

    /// The axial widths.
    pub fn axial_widths(&self) -> [usize; 2] {
        self.axial_dims
            .unwrap_or([self.d_model / 2, self.d_model - self.d_model / 2])
    }

    fn attention(&self, kind: AttentionKind) -> ReformerAttentionConfig {
        ReformerAttentionConfig::new(self.d_model, self.n_heads, self.d_head)
            .with_kind(kind)
            .with_lsh_scores(self.lsh_scores)
            .with_chunk_len(self.bucket_size)
            .with_n_buckets(self.n_buckets)
            .with_n_rounds(self.n_rounds)
            .with_n_chunks_before(self.n_chunks_before)
            .with_n_chunks_after(self.n_chunks_after)
            .with_causal(self.causal)
            .with_dropatt(self.dropatt)
            .with_initializer(self.initializer())
    }

    fn initializer(&self) -> Initializer {
        Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        }
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), ReformerError> {
        let bad = |m: String| Err(ReformerError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_head", self.d_head),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
            ("bucket_size", self.bucket_size),
            ("n_rounds", self.n_rounds),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        for (name, p) in [("dropout", self.dropout), ("dropatt", self.dropatt)] {
            if !(0.0..1.0).contains(&p) {
                return bad(format!("{name} must be in [0, 1), got {p}"));
            }
        }
        let axial_std = self.axial_std.unwrap_or(self.init_std);
        for (name, std) in [("init_std", self.init_std), ("axial_std", axial_std)] {
            if !(std.is_finite() && std > 0.0) {
                return bad(format!("{name} must be positive, got {std}"));
            }
        }
        if self.axial_positions {
            let [a1, a2] = self.axial_grid();
            let [d1, d2] = self.axial_widths();
            if a1 * a2 < self.max_seq_len || a1 == 0 || a2 == 0 {
                return bad(format!(
                    "axial_shape {a1} x {a2} = {} must cover max_seq_len {}",
                    a1 * a2,
                    self.max_seq_len
                ));
            }
            if d1 + d2 != self.d_model || d1 == 0 || d2 == 0 {
                return bad(format!(
                    "axial_dims ({d1}, {d2}) must be positive and sum to d_model {}",
                    self.d_model
                ));
            }
        }
        for kind in self.layer_kinds()? {
            self.attention(kind).validate()?;
        }
        Ok(())
    }

    /// Validates the config and initialises the model.
    pub fn init(&self, device: &Device) -> Result<ReformerLm, ReformerError> {
        self.validate()?;
        let ff = ChunkedFeedForwardConfig::new(self.d_model, self.d_ff)
            .with_chunk_len(self.ff_chunk_len)
            .with_initializer(self.initializer());
        let blocks = self
            .layer_kinds()?
            .into_iter()
            .map(|kind| {
                Ok(ReformerBlock {
                    norm_attention: LayerNormConfig::new(self.d_model).init(device),
                    attention: self.attention(kind).init(device)?,
                    norm_ff: LayerNormConfig::new(self.d_model).init(device),
                    ff: ff.init(device)?,
                    dropout: self.dropout,
                })
            })
            .collect::<Result<Vec<_>, ReformerError>>()?;
        let positions = if self.axial_positions {
            Some(
                AxialPositionalEmbeddingConfig::new(self.axial_grid(), self.axial_widths())
                    .with_initializer(Initializer::Normal {
                        mean: 0.0,
                        std: self.axial_std.unwrap_or(self.init_std),
                    })
                    .init(device)?,
            )
        } else {
            None
        };
        Ok(ReformerLm {
            embedding: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(self.initializer())
                .init(device),
            positions,
            blocks,
            norm: LayerNormConfig::new(self.d_model).init(device),
            output: {
                let mut output = LinearConfig::new(self.d_model, self.vocab_size)
                    .with_initializer(self.initializer())
                    .init(device);
                output.bias = Some(Initializer::Zeros.init([self.vocab_size], device));
                output
            },
            reversible: self.reversible,
            dropout: self.dropout,
            max_seq_len: self.max_seq_len,
            vocab_size: self.vocab_size,
            eval_seed: self.eval_seed,
            eval_rounds: None,
            train_seed: self.train_seed,
            steps: StepCounter::default(),
        })
    }
}

/// Counts `train_step` calls so each step draws fresh rotations and dropout masks.
#[derive(Debug, Clone, Default)]
pub struct StepCounter(Arc<AtomicU64>);

impl StepCounter {
    /// The current count, then increments it.
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The Reformer language model: token + axial position embeddings, a stack of (reversible)
/// LSH / local attention layers with chunked feed-forwards, LayerNorm and a linear head.
///
/// In reversible mode the input is duplicated, `(x_1, x_2) = (e, e)`, and the head reads
/// `(y_1 + y_2) / 2`.
///
/// # Shapes
/// - `tokens`, `targets`: `[batch, len]`, `len <= max_seq_len`
/// - logits: `[batch, len, vocab_size]`
#[derive(Module, Debug)]
pub struct ReformerLm {
    /// Token embedding.
    pub embedding: Embedding,
    /// Axial position embedding.
    pub positions: Option<AxialPositionalEmbedding>,
    /// The layers.
    pub blocks: Vec<ReformerBlock>,
    /// Final LayerNorm.
    pub norm: LayerNorm,
    /// Output projection to the vocabulary.
    pub output: Linear,
    /// Reversible residual layers.
    pub reversible: bool,
    /// Embedding dropout.
    pub dropout: f64,
    /// Longest sequence.
    pub max_seq_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Seed of the evaluation rotations.
    #[module(skip)]
    pub eval_seed: u64,
    /// Hash rounds of every LSH layer in evaluation passes (`None`: the configured
    /// `n_rounds`); see [`ReformerLm::with_eval_rounds`].
    #[module(skip)]
    pub eval_rounds: Option<usize>,
    /// Base seed of training steps.
    #[module(skip)]
    pub train_seed: u64,
    /// Steps taken by [`ReformerLm::train_step`].
    #[module(skip)]
    pub steps: StepCounter,
}

/// Mean cross-entropy of `logits` against `targets`, weighted by `weights` when given
/// (`Σ w_i (-log p_i(t_i)) / Σ w_i`).
///
/// # Shapes
/// - `logits`: `[batch, len, vocab]`; `targets`, `weights`: `[batch, len]`
pub fn cross_entropy(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    weights: Option<Tensor<2>>,
) -> Tensor<1> {
    let [b, l, _] = logits.dims();
    let picked = log_softmax(logits, 2)
        .gather(2, targets.unsqueeze_dim::<3>(2))
        .reshape([b, l]);
    match weights {
        None => picked.mean().neg(),
        Some(w) => (picked * w.clone()).sum().neg() / w.sum().clamp_min(1e-9),
    }
}

impl ReformerLm {
    /// Options of the evaluation pass (rotations fixed by `eval_seed`, no dropout).
    pub fn eval_options(&self) -> ForwardOptions {
        let opts = ForwardOptions::eval(self.eval_seed);
        match self.eval_rounds {
            Some(r) => opts.with_rounds(r),
            None => opts,
        }
    }

    /// The same model evaluated with `n_rounds` hash rounds in every LSH layer (more rounds:
    /// fewer (query, key) pairs missed by the hashing; the paper evaluates a model trained
    /// with few rounds with more).
    pub fn with_eval_rounds(mut self, n_rounds: usize) -> Self {
        self.eval_rounds = Some(n_rounds);
        self
    }

    fn check_tokens(&self, tokens: &Tensor<2, Int>) -> Result<(), ReformerError> {
        let [b, l] = tokens.dims();
        if b == 0 || l == 0 || l > self.max_seq_len {
            return Err(ReformerError::Input(format!(
                "tokens of shape [{b}, {l}]: need batch > 0 and 0 < len <= max_seq_len {}",
                self.max_seq_len
            )));
        }
        Ok(())
    }

    /// Token plus position embeddings with dropout: `[batch, len, d_model]`.
    pub fn embed(
        &self,
        tokens: Tensor<2, Int>,
        opts: &ForwardOptions,
    ) -> Result<Tensor<3>, ReformerError> {
        self.check_tokens(&tokens)?;
        let l = tokens.dims()[1];
        let mut x = self.embedding.forward(tokens);
        if let Some(p) = &self.positions {
            x = x + p.forward(l)?;
        }
        Ok(dropout(x, self.dropout, opts, TAG_EMBED))
    }

    /// The stack on embeddings: the head's input `[batch, len, d_model]`.
    fn stack(&self, x: Tensor<3>, opts: &ForwardOptions) -> Tensor<3> {
        if self.reversible {
            let (mut x1, mut x2) = (x.clone(), x);
            for (i, blk) in self.blocks.iter().enumerate() {
                (x1, x2) = blk.forward_reversible(x1, x2, None, &opts.child(TAG_LAYER + i as u64));
            }
            (x1 + x2).mul_scalar(0.5)
        } else {
            let mut x = x;
            for (i, blk) in self.blocks.iter().enumerate() {
                x = blk.forward_residual(x, None, &opts.child(TAG_LAYER + i as u64));
            }
            x
        }
    }

    /// Logits under explicit options.
    pub fn forward_with(
        &self,
        tokens: Tensor<2, Int>,
        opts: &ForwardOptions,
    ) -> Result<Tensor<3>, ReformerError> {
        let x = self.embed(tokens, opts)?;
        Ok(self.output.forward(self.norm.forward(self.stack(x, opts))))
    }

    /// Logits in evaluation mode (fixed rotations, no dropout).
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Result<Tensor<3>, ReformerError> {
        self.forward_with(tokens, &self.eval_options())
    }

    /// Cross-entropy under explicit options, optionally weighted per position.
    pub fn forward_loss_with(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        weights: Option<Tensor<2>>,
        opts: &ForwardOptions,
    ) -> Result<Tensor<1>, ReformerError> {
        if targets.dims() != tokens.dims() {
            return Err(ReformerError::Input(format!(
                "targets {:?} do not match tokens {:?}",
                targets.dims(),
                tokens.dims()
            )));
        }
        let logits = self.forward_with(tokens, opts)?;
        Ok(cross_entropy(logits, targets, weights))
    }

    /// Mean cross-entropy in evaluation mode.
    pub fn forward_loss(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
    ) -> Result<Tensor<1>, ReformerError> {
        self.forward_loss_with(tokens, targets, None, &self.eval_options())
    }

    /// One training step: loss and parameter gradients, with fresh rotations and dropout masks
    /// (seeded by `train_seed` and a step counter). See [`train_step_with`](Self::train_step_with).
    pub fn train_step(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
    ) -> Result<(Tensor<1>, GradientsParams), ReformerError> {
        let opts = self.next_train_options();
        self.train_step_with(tokens, targets, None, &opts)
    }

    /// Training options for the next step: a fresh seed for rotations and dropout masks.
    pub fn next_train_options(&self) -> ForwardOptions {
        ForwardOptions::train(mix(self.train_seed, self.steps.next()))
    }

    /// Loss and parameter gradients of one step under `opts`.
    ///
    /// Reversible models run the stack forward on a `valid()` copy (no graph), keep only the
    /// top activations and each LSH layer's bucket ids, then walk back layer by layer
    /// ([`ReformerBlock::reverse`], attending with those buckets): activation memory does not
    /// grow with depth; the bucket ids do, by `batch x heads x rounds x len` integers per LSH
    /// layer. Plain models use one `backward()`. The model must live on an autodiff device. The
    /// returned loss is detached.
    pub fn train_step_with(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        weights: Option<Tensor<2>>,
        opts: &ForwardOptions,
    ) -> Result<(Tensor<1>, GradientsParams), ReformerError> {
        if !self.output.weight.val().is_autodiff() {
            return Err(ReformerError::Input(
                "train_step needs the model on an autodiff device (device.autodiff())".into(),
            ));
        }
        if !self.reversible {
            let loss = self.forward_loss_with(tokens, targets, weights, opts)?;
            let grads = GradientsParams::from_grads(loss.clone().backward(), self);
            return Ok((loss.inner(), grads));
        }
        if targets.dims() != tokens.dims() {
            return Err(ReformerError::Input(format!(
                "targets {:?} do not match tokens {:?}",
                targets.dims(),
                tokens.dims()
            )));
        }
        let mut acc = GradientsAccumulator::<ReformerLm>::new();
        // 1. Embeddings with a (small) graph.
        let e = self.embed(tokens, opts)?;
        // 2. The stack without a graph; only the top activations are kept.
        //    Each LSH layer's bucket ids are kept too (small integers per head, round and
        //    position), so that the backward attends with the forward's sparsity pattern.
        let valid = self.valid();
        let (mut y1, mut y2) = (e.clone().inner(), e.clone().inner());
        let mut buckets = Vec::with_capacity(valid.blocks.len());
        for (i, blk) in valid.blocks.iter().enumerate() {
            let o = opts.child(TAG_LAYER + i as u64);
            let (b1, b2, used) = blk.forward_reversible_recorded(y1, y2, None, &o);
            (y1, y2) = (b1, b2);
            buckets.push(used);
        }
        drop(valid);
        // 3. Head and loss on fresh leaves.
        let y1t = y1.clone().autodiff().require_grad();
        let y2t = y2.clone().autodiff().require_grad();
        let h = (y1t.clone() + y2t.clone()).mul_scalar(0.5);
        let logits = self.output.forward(self.norm.forward(h));
        let loss = cross_entropy(logits, targets, weights);
        let mut g = loss.clone().backward();
        let mut dy1 = y1t.grad(&g).expect("leaf requires grad").inner();
        let mut dy2 = y2t.grad(&g).expect("leaf requires grad").inner();
        acc.accumulate(self, GradientsParams::from_module(&mut g, &self.norm));
        acc.accumulate(self, GradientsParams::from_module(&mut g, &self.output));
        // 4. Walk back through the layers, rebuilding inputs from outputs.
        for (i, blk) in self.blocks.iter().enumerate().rev() {
            let o = opts.child(TAG_LAYER + i as u64);
            let b = buckets.pop().flatten();
            (y1, y2, dy1, dy2) = blk.reverse(y1, y2, dy1, dy2, None, b, &o, self, &mut acc);
        }
        // 5. Into the embeddings.
        let mut g = (e * (dy1 + dy2)).sum().backward();
        acc.accumulate(self, GradientsParams::from_module(&mut g, &self.embedding));
        if let Some(p) = &self.positions {
            acc.accumulate(self, GradientsParams::from_module(&mut g, p));
        }
        Ok((loss.inner(), acc.grads()))
    }
}

//! The Compressive Transformer (Rae et al. 2019, arXiv 1911.05507) as an option of the layer
//! stack ([`XlConfig::compressive`](crate::XlConfig::compressive)): besides its XL memory of
//! `mem_len` positions, every layer keeps a compressed memory of `cmem_len` vectors, fed by
//! what leaves the XL memory, compressed at rate `c`.
//!
//! Per layer `l` and segment, with `h` the layer's input (paper, Algorithm 1):
//!
//! - attention reads `cat(cm, m, h)` (compressed memory, memory, segment) with the layer's
//!   relative positions, the compressed vectors as `cmem_len` more keys before the memory;
//! - `old = cat(m, h)[.. mlen + qlen - mem_len]` leaves the memory, `m ← cat(m, h)[-mem_len..]`;
//! - `cm ← cat(cm, f_c(old))[-cmem_len..]`, with `f_c` a 1D convolution of kernel and stride
//!   `c` (the paper's best), or max / mean pooling of windows of `c` (sec. 3.1);
//! - training adds the attention-reconstruction loss (sec. 3.2, Algorithm 2)
//!   `L^attn = ‖attn(h, old) − attn(h, f_c(old))‖²` (as a mean over its elements, the peer's
//!   `mse_loss`; a scale the weight absorbs), `attn` the layer's content attention
//!   `softmax(q kᵀ / sqrt(d_head)) v` with its current `W_q`, `W_k`, `W_v` held constant and
//!   `h`, `old` detached: it trains the compression alone (the LM loss never reaches `f_c`,
//!   since compressed memories are read detached). The loss added to the LM loss is
//!   `weight · Σ_l L^attn_l / n_layers`.
//!
//! The memories hold what the attention reads: a pre-LN layer normalises its memory with its
//! LayerNorm, so `f_c` compresses `LN(old)` and the compressed vectors are read as they are
//! (not normalised again); a post-LN layer's memory needs no norm. Both memories are detached
//! ([`CompressedMemory`] in [`XlState`]), cleared per row at document starts
//! (with `document_resets`), and saved in checkpoints beside the XL memory.
//!
//! kNN layers (the Memorizing Transformer's) combine with it: their local attention reads
//! `cat(cm, m, h)` like any layer's and they search their kNN memory of every segment read
//! (`knn.feed = "segment"`); their reconstruction loss uses their local attention's
//! projections with plain dot-product scores.
//!
//! Old memory that does not fill whole windows of `c` (only when `mem_len` or the segment
//! length is not a multiple of `c`) is padded with zeros at its front.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_fused::softmax::softmax;
use memzoo_reformer::ForwardOptions;
use memzoo_relative::shift::{distance_of_column, n_columns};
use memzoo_relative::{
    AttentionMask, PositionIndex, PositionKind, ProjectionTap, Projections,
    RelativeMultiHeadAttention, linear_rows,
};
use serde::{Deserialize, Serialize};

use crate::error::XlError;
use crate::memory::{XlMemory, XlState};
use crate::stack::{
    KnnFeed, LayerAttention, LayerContext, LayerKind, ProbeLayout, Replay, Residual, Trace,
    TransformerXl, XlConfig, XlLayer, document_mask,
};

/// How old memories are compressed (Rae et al. 2019, sec. 3.1), windows of `c` positions to
/// one vector.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CompressionKind {
    /// A 1D convolution with kernel size and stride `c` over the time axis, `d → d` with a
    /// bias: `f_c(old)_i = b + Σ_{k<c} W_k old_{ic+k}` (the paper's best on enwik8; the peer's
    /// `ConvCompress`). Trained by the attention-reconstruction loss.
    #[default]
    Conv,
    /// Max pooling, kernel and stride `c`: `f_c(old)_i = max_{k<c} old_{ic+k}` (no parameters,
    /// no reconstruction loss).
    Max,
    /// Mean pooling, kernel and stride `c`: `f_c(old)_i = (1/c) Σ_{k<c} old_{ic+k}` (no
    /// parameters, no reconstruction loss).
    Mean,
    /// Most-used (sec. 3.1, after the DNC's usage-based freeing): of the `n c` leaving
    /// positions, the `n` with the highest average attention are kept as they are, in their
    /// order, the rest dropped. A position's usage `u_j = (1/R_j) Σ_τ Σ_i ā_τ(i, j)` is the
    /// attention mass the queries `i` of each segment `τ` that read it gave it (`ā` averaged
    /// over heads), averaged over the `R_j` segments that read it (as a segment position and
    /// in the XL memory); ties keep the more recent. No parameters, no reconstruction loss;
    /// every layer `xl`, `learned` or `t5`.
    #[serde(rename = "most_used")]
    MostUsed,
}

/// Settings of the Compressive Transformer ([`XlConfig::compressive`](crate::XlConfig::compressive));
/// the XL memory is the stack's `mem_len`. TOML: `[model.compressive]`.
#[derive(Config, Debug)]
pub struct CompressiveConfig {
    /// Compressed memory vectors per layer, `n_cm` (0: none; the model is then Transformer-XL
    /// on the compressive code path). Default: 32.
    #[config(default = 32)]
    pub cmem_len: usize,
    /// Compression rate `c`: `c` old positions become one vector. Default: 4 (the paper's
    /// PG-19 and WikiText-103 rate; enwik8: 3).
    #[config(default = 4)]
    pub ratio: usize,
    /// The compression function `f_c`. Default: conv.
    #[config(default = "CompressionKind::Conv")]
    pub function: CompressionKind,
    /// Weight of the attention-reconstruction loss added to the LM loss (the peer's
    /// `reconstruction_loss_weight`). Default: 1.
    #[config(default = 1.0)]
    pub reconstruction_weight: f64,
    /// Peer compatibility (compressive-transformer-pytorch 0.4.0): the reconstruction loss
    /// reconstructs the attention over the whole incoming XL memory from the new compressed
    /// vectors, instead of over the positions being compressed (the paper's `old_mem`; the
    /// two agree when `mem_len` equals the segment length). Default: false.
    #[config(default = false)]
    pub reconstruct_whole_memory: bool,
    /// Peer compatibility: a `learned` layer's table row of distance `d` is that of
    /// `d + (mem_len − mlen) + (cmem_len − cmem)`, the peer indexing its position table from
    /// the end of the current window of `cmem + mlen + qlen` keys (its memories still filling
    /// shift every distance). Default: false.
    #[config(default = false)]
    pub window_end_positions: bool,
    /// Gradients reach a pre-LN layer's LayerNorm through its XL memory, normalised in every
    /// segment (memzoo's XL memory, with `memory_gradients`); false: the memory is normalised
    /// with the LayerNorm as a constant, as the peer, which caches the normalised inputs
    /// (`W_k`, `W_v` still get the memory's gradient, as both do). Default: true.
    #[config(default = true)]
    pub memory_norm_gradients: bool,
}

/// The compression functions of a compressive stack, one per layer.
///
/// # Shapes
/// - old memory `[batch, n c, d_model]` → compressed `[batch, n, d_model]`
#[derive(Module, Debug)]
pub struct Compression {
    /// Per layer, the convolution as the linear map of a window's `c d_model` values
    /// (`[c d_model, d_model]`, row `k d_model + i` holding the conv weight `W[o, i, k]`);
    /// empty for pooling.
    pub convs: Vec<Linear>,
    /// The settings.
    #[module(skip)]
    pub config: CompressiveConfig,
}

/// The compressed memories of a compressive stack: per layer `[batch, cmem, d_model]`, detached,
/// and per row how many of the most recent belong to the row's current document (with
/// `document_resets`; empty: all). With the most-used function it also carries the usage of
/// every XL memory position.
#[derive(Debug, Clone, Default)]
pub struct CompressedMemory {
    /// The compressed vectors of every layer.
    pub layers: XlMemory,
    /// Per row, the valid most recent compressed vectors.
    pub valid: Vec<usize>,
    /// Most-used compression: per layer `[batch, mlen, 1]`, the attention mass each XL
    /// memory position has received, summed over the segments that read it (aligned with
    /// the XL memory; empty otherwise).
    pub usage: XlMemory,
    /// Most-used compression: per XL memory position, how many segments have read it (`R_j`;
    /// the same for every row and layer).
    pub usage_reads: Vec<usize>,
}

impl CompressiveConfig {
    /// Checks the settings against the stack's, naming the bad value.
    pub fn validate(&self, stack: &XlConfig) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        if self.ratio == 0 {
            return bad("compressive.ratio must be positive, got 0".into());
        }
        if stack.mem_len == 0 {
            return bad(
                "compressive needs an XL memory to compress (mem_len > 0), got mem_len = 0".into(),
            );
        }
        if !stack.mem_len.is_multiple_of(self.ratio) {
            return bad(format!(
                "mem_len ({}) must be a multiple of compressive.ratio ({})",
                stack.mem_len, self.ratio
            ));
        }
        if !(self.reconstruction_weight.is_finite() && self.reconstruction_weight >= 0.0) {
            return bad(format!(
                "compressive.reconstruction_weight must be finite and >= 0, got {}",
                self.reconstruction_weight
            ));
        }
        if stack.residual != Residual::Sequential {
            return bad(format!(
                "compressive needs residual = \"sequential\", got {:?} (the reversible backward \
                 does not carry compressed memories)",
                stack.residual
            ));
        }
        let kinds = stack.layer_kinds();
        if let Some(k) = kinds.iter().find(|k| {
            !matches!(
                k,
                LayerKind::Xl | LayerKind::Learned | LayerKind::T5 | LayerKind::Knn
            )
        }) {
            return bad(format!(
                "compressive stacks read cat(cmem, mem, x) with relative layers (xl, learned, \
                 t5) or kNN layers; layer kind {k:?} is not one"
            ));
        }
        if kinds.contains(&LayerKind::Knn) && stack.knn.feed == KnnFeed::Evicted {
            return bad(
                "knn.feed = \"evicted\" in a compressive stack: what leaves the XL memory is \
                 compressed; use knn.feed = \"segment\""
                    .into(),
            );
        }
        if self.function == CompressionKind::MostUsed
            && let Some(k) = kinds
                .iter()
                .find(|k| !matches!(k, LayerKind::Xl | LayerKind::Learned | LayerKind::T5))
        {
            return bad(format!(
                "compressive.function = \"most_used\" needs every layer xl, learned or t5 (its \
                 usage is the relative attention's); layer kind {k:?} is not one"
            ));
        }
        if self.window_end_positions && kinds.iter().any(|k| *k != LayerKind::Learned) {
            return bad("compressive.window_end_positions needs every layer `learned`".into());
        }
        for (name, on) in [
            ("compat.memory_keys_values", stack.compat.memory_keys_values),
            ("compat.zero_first_memory", stack.compat.zero_first_memory),
            ("same_length", stack.same_length),
        ] {
            if on {
                return bad(format!("compressive does not support {name} = true"));
            }
        }
        if stack.axial.is_some() {
            return bad("compressive does not support axial positions (mem_len > 0)".into());
        }
        Ok(())
    }

    /// Initialises the compression of a stack of `n_layers` layers of width `d_model`.
    pub fn init(&self, n_layers: usize, d_model: usize, device: &Device) -> Compression {
        let convs = match self.function {
            CompressionKind::Conv => (0..n_layers)
                .map(|_| {
                    // PyTorch's Conv1d default: U(±1/sqrt(fan_in)), fan_in = c d_model.
                    let fan_in = (self.ratio * d_model) as f64;
                    let bound = 1.0 / fan_in.sqrt();
                    LinearConfig::new(self.ratio * d_model, d_model)
                        .with_initializer(Initializer::Uniform {
                            min: -bound,
                            max: bound,
                        })
                        .init(device)
                })
                .collect(),
            CompressionKind::Max | CompressionKind::Mean | CompressionKind::MostUsed => Vec::new(),
        };
        Compression {
            convs,
            config: self.clone(),
        }
    }
}

impl Compression {
    /// `f_c` of layer `l` on old memory `[batch, n, d]` (`n` a multiple of `c`, else padded
    /// with zeros at the front) → `[batch, ceil(n / c), d]`.
    ///
    /// # Shapes
    /// - `old`: `[batch, n, d_model]` → `[batch, ceil(n / c), d_model]`
    pub fn compress(&self, l: usize, old: Tensor<3>) -> Result<Tensor<3>, XlError> {
        let c = self.config.ratio;
        let [b, n, d] = old.dims();
        let pad = (c - n % c) % c;
        let old = if pad > 0 {
            Tensor::cat(vec![Tensor::zeros([b, pad, d], &old.device()), old], 1)
        } else {
            old
        };
        let w = (n + pad) / c;
        Ok(match self.config.function {
            CompressionKind::Conv => {
                let conv = self
                    .convs
                    .get(l)
                    .ok_or_else(|| XlError::Input(format!("no compression for layer {l}")))?;
                linear_rows(conv, old.reshape([b, w, c * d]))
            }
            CompressionKind::Max => old.reshape([b, w, c, d]).max_dim(2).reshape([b, w, d]),
            CompressionKind::Mean => old.reshape([b, w, c, d]).mean_dim(2).reshape([b, w, d]),
            CompressionKind::MostUsed => {
                return Err(XlError::Input(
                    "most-used compression selects by usage (the stack's forward pass), not by \
                     windows"
                        .into(),
                ));
            }
        })
    }
}

/// Most-used compression: per row, the `n` positions of `old` with the highest `usage`
/// (`[batch, len]` row-major, host), kept in their order; ties keep the more recent.
///
/// # Shapes
/// - `old`: `[batch, len, d_model]` → `[batch, n, d_model]`
fn select_most_used(old: Tensor<3>, usage: &[f32], n: usize) -> Tensor<3> {
    let [b, len, d] = old.dims();
    let mut index = Vec::with_capacity(b * n * d);
    for row in usage.chunks(len) {
        let mut order: Vec<usize> = (0..len).collect();
        // Highest usage first; on a tie the more recent position.
        order.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(j.cmp(&i)));
        let mut kept = order[..n.min(len)].to_vec();
        kept.sort_unstable();
        index.extend(kept.iter().flat_map(|&i| std::iter::repeat_n(i as i64, d)));
    }
    let device = old.device();
    let index = Tensor::<3, Int>::from_data(TensorData::new(index, [b, n.min(len), d]), &device);
    old.gather(1, index)
}

/// The content attention of the reconstruction loss, `softmax(q kᵀ) v` with `q` already
/// scaled by `1 / sqrt(d_head)`, no mask, no positions: on `flex` the fused attention kernel
/// (no position term), elsewhere tensor ops.
///
/// # Shapes
/// - `q`: `[batch, heads, qlen, d_head]`, `k`, `v`: `[batch, heads, n, d_head]` →
///   `[batch, heads, qlen, d_head]`
fn content_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    if memzoo_fused::supports(&q.device())
        && let Ok(out) = memzoo_fused::relative_attention_fused(
            q.clone(),
            k.clone(),
            v.clone(),
            memzoo_fused::RelativePosition::None,
            None,
            memzoo_fused::RelParams::new(f32::NEG_INFINITY),
        )
    {
        return out;
    }
    softmax(q.matmul(k.swap_dims(2, 3)), 3).matmul(v)
}

/// What the layers of a compressive stack read in one segment, per layer.
struct SegmentReads<'a> {
    /// The layers' inputs `h`.
    inputs: &'a [Tensor<3>],
    /// Most-used compression: the attention mass each position of `cat(m, h)` received
    /// (empty otherwise).
    received: &'a [Tensor<2>],
    /// The attention's queries, keys and values (`None` for a layer that did not leave them;
    /// empty when the reconstruction loss is not computed).
    projections: &'a [Option<Projections>],
}

/// Per-head keys and values of `h` with the attention's parameters as constants,
/// `[batch, heads, len, d_head]` each.
fn constant_keys_values(a: &RelativeMultiHeadAttention, h: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
    let (k, v) = a.kv_heads_constant(h);
    let k = a.share_kv_heads(k).swap_dims(1, 2);
    let v = a.share_kv_heads(v).swap_dims(1, 2);
    (k, v)
}

impl XlLayer {
    /// The attention mass each key of `cat(m, x)` receives from the segment's queries, summed
    /// over the queries and averaged over the heads, `Σ_i ā(i, j)` (the usage of most-used
    /// compression), as constants. Relative layers only.
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `m`: `[batch, mlen, d_model]` → `[batch, mlen + qlen]`
    pub(crate) fn received_attention(
        &self,
        x: Tensor<3>,
        m: Option<Tensor<3>>,
        cx: &LayerContext<'_>,
    ) -> Result<Tensor<2>, XlError> {
        let kind = self.attention.kind();
        let a = match &self.attention {
            LayerAttention::Relative(a) => a,
            _ => {
                return Err(XlError::Input(format!(
                    "most-used compression reads a relative layer's attention, not a {kind:?} \
                     layer's"
                )));
            }
        };
        let ctx = cx.positions.ok_or_else(|| {
            XlError::Input(format!("a {kind:?} layer needs its position context"))
        })?;
        let probs = a
            .probabilities(x.detach(), m.map(Tensor::detach), ctx, cx.shared)?
            .detach();
        let [b, _, _, k] = probs.dims();
        Ok(probs.sum_dim(2).mean_dim(1).reshape([b, k]))
    }

    /// The memory as this layer's attention reads it: `LN(m)` in a pre-LN block (the
    /// LayerNorm constant unless `norm_gradients`), `m` in a post-LN one.
    ///
    /// # Shapes
    /// - `m`: `[batch, len, d_model]` → same
    pub fn read_memory(&self, m: Tensor<3>, norm_gradients: bool) -> Tensor<3> {
        if !self.block.pre_ln {
            return m;
        }
        if norm_gradients {
            self.block.norm_attention.forward(m)
        } else {
            self.block.norm_attention.clone().no_grad().forward(m)
        }
    }
}

impl TransformerXl {
    /// The compressive stack's settings, where it is one.
    pub fn compressive_config(&self) -> Option<&CompressiveConfig> {
        self.compressive.as_ref().map(|c| &c.config)
    }

    /// Reads one segment of a compressive stack on top of `state` and moves both memories on;
    /// with `train`, also returns the weighted attention-reconstruction loss (`None` when no
    /// memory was compressed or `f_c` has no parameters). With a `trace`, every layer records
    /// where its attention went (the compressed memory apart from the XL memory).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub(crate) fn forward_compressive(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
        train: bool,
        trace: Option<&Trace>,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), XlError> {
        let comp = self
            .compressive
            .as_ref()
            .ok_or_else(|| XlError::Input("this stack is not compressive".into()))?;
        let cfg = &comp.config;
        let [batch, qlen] = tokens.dims();
        let device = tokens.device();
        if reset.len() != batch {
            return Err(XlError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        self.check_memory(batch, &state.xl)?;
        let cmem = &state.compressed.layers;
        self.check_compressed(batch, cmem)?;
        let (mlen, clen) = (state.xl.len(), cmem.len());
        // kNN layers (searched over everything read, beside the compressed memory).
        let n_knn = self.n_knn_layers();
        if state.knn.is_empty() && n_knn > 0 {
            state.knn = self.new_state(batch, &device)?.knn;
        }
        if state.knn.len() != n_knn || state.knn.iter().any(|m| m.batch() != batch) {
            return Err(XlError::Input(format!(
                "state has {} kNN memories for a model of {n_knn} kNN layers and a batch of \
                 {batch}",
                state.knn.len()
            )));
        }
        if self.document_resets {
            let rows: Vec<usize> = (0..batch).filter(|&b| reset[b]).collect();
            for m in state.knn.iter_mut() {
                m.clear(&rows)?;
            }
        }
        let mask = if self.document_resets {
            if state.xl_valid.len() != batch {
                state.xl_valid = vec![mlen; batch];
            }
            if state.compressed.valid.len() != batch {
                state.compressed.valid = vec![clen; batch];
            }
            for (b, &r) in reset.iter().enumerate() {
                if r {
                    state.xl_valid[b] = 0;
                    state.compressed.valid[b] = 0;
                }
            }
            // cat(cm, m): the valid keys are the most recent of both together.
            let valid: Vec<usize> = (0..batch)
                .map(|b| state.xl_valid[b] + state.compressed.valid[b])
                .collect();
            document_mask(&valid, qlen, clen + mlen, None, &device)
        } else {
            AttentionMask::causal()
        };
        let mut contexts = self.contexts(batch, qlen, clen + mlen, &mask, &device)?;
        self.window_end_positions(&mut contexts, qlen, (mlen, clen), &mask, &device);
        // The reconstruction loss reads each layer's queries and the keys and values of what
        // it compresses: the attention's own, kept as it computes them.
        let tap = (train && cfg.function == CompressionKind::Conv && cfg.cmem_len > 0)
            .then(ProjectionTap::default);
        if let Some(tap) = &tap {
            for (_, _, ctx) in contexts.iter_mut() {
                ctx.projection_tap = Some(tap.clone());
            }
        }
        let mut projections = Vec::with_capacity(self.layers.len());
        let mut h = self.embed(tokens, opts)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let norm_grads = cfg.memory_norm_gradients;
        let mut stores = state.knn.iter_mut();
        let most_used = cfg.function == CompressionKind::MostUsed && cfg.cmem_len > 0;
        let mut received = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            inputs.push(h.clone());
            let mem = state
                .xl
                .layer(l)
                .map(|m| layer.read_memory(m.clone(), norm_grads));
            let prefix = match (cmem.layer(l).cloned(), mem) {
                (Some(c), Some(m)) => Some(Tensor::cat(vec![c, m], 1)),
                (c, m) => c.or(m),
            };
            let store = match layer.attention {
                LayerAttention::Knn(_) => stores.next().map(|s| s.as_mut()),
                _ => None,
            };
            let mut cx = self.layer_context(l, &contexts, store, opts);
            let layout = ProbeLayout::Compressed { compressed: clen };
            cx.trace = trace.map(|t| t.slot(l, layout));
            // Empty, so that a layer that does not fill it (a kNN layer) leaves nothing stale.
            let _ = tap.as_ref().and_then(ProjectionTap::take);
            h = layer.block.forward(h, None, opts, |x, _| {
                if most_used {
                    let all = layer.received_attention(x.clone(), prefix.clone(), &cx)?;
                    // The keys after the compressed ones: cat(m, x).
                    received.push(all.narrow(1, clen, mlen + qlen));
                }
                Ok::<_, XlError>(layer.attend(x, prefix, &mut cx, Replay::Nothing)?.0)
            })?;
            projections.push(tap.as_ref().and_then(ProjectionTap::take));
        }
        drop(contexts);
        drop(stores);
        let hidden = self.finish(h, opts);
        let reads = SegmentReads {
            inputs: &inputs,
            received: &received,
            projections: &projections,
        };
        let aux = self.compress_memories(comp, state, reads, qlen, train)?;
        Ok((hidden, aux))
    }

    /// A compressed memory of the stack's layers and width for `batch` rows (or none).
    fn check_compressed(&self, batch: usize, cmem: &XlMemory) -> Result<(), XlError> {
        let Some(first) = cmem.layer(0) else {
            return Ok(());
        };
        let [cb, _, cd] = first.dims();
        if cmem.n_layers() != self.layers.len() || cb != batch || cd != self.d_model {
            return Err(XlError::Input(format!(
                "compressed memory has {} layers of [{cb}, _, {cd}], the model needs {} of \
                 [{batch}, _, {}]",
                cmem.n_layers(),
                self.layers.len(),
                self.d_model
            )));
        }
        Ok(())
    }

    /// With `compressive.window_end_positions`, the learned layers' distances shifted by the
    /// memories' missing positions: counted from the end of a window of `cmem_len + mem_len +
    /// qlen` keys, the memories (`(mlen, clen)` positions) still filling. `mlen` is the
    /// memory the segment started from, also where a generator's cache holds the segment's
    /// earlier tokens after it.
    fn window_end_positions(
        &self,
        contexts: &mut [crate::stack::ContextEntry<'_>],
        qlen: usize,
        (mlen, clen): (usize, usize),
        mask: &AttentionMask,
        device: &Device,
    ) {
        let Some(cfg) = self.compressive_config().filter(|c| c.window_end_positions) else {
            return;
        };
        let missing =
            (self.mem_len.saturating_sub(mlen) + cfg.cmem_len.saturating_sub(clen)) as i64;
        for (p, _, ctx) in contexts.iter_mut() {
            if p.kind != PositionKind::Learned {
                continue;
            }
            let klen = ctx.klen();
            let causal = matches!(mask, AttentionMask::Causal { .. });
            let idx: Vec<i64> = (0..n_columns(qlen, klen, causal))
                .map(|c| p.table_index(distance_of_column(c, klen) + missing) as i64)
                .collect();
            let w = idx.len();
            ctx.index =
                PositionIndex::Learned(Tensor::from_data(TensorData::new(idx, [w]), device));
        }
    }

    /// Reads tokens of an unfinished segment on top of the `committed` state through `cache`:
    /// per layer the keys and values (`[k; v]` entries) of `cat(cm, m)` and of the segment's
    /// tokens read so far, which it extends by the tokens' own; an empty `cache` is filled from
    /// the committed memories first (once per segment). Generation's read of one new token
    /// ([`crate::RecurrentModel::peek_continue`]): a query sees the compressed memory, the
    /// memory and the segment's earlier tokens at the distances a pass over the whole segment
    /// gives it, and only its own keys and values are projected; the memories move on (and
    /// compress) when the segment completes, read by [`forward_compressive`](Self::forward_compressive).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]` → `[batch, qlen, d_model]`; `cache`: per layer `[batch,
    ///   clen + mlen + read, 2 kv_heads d_head]`
    pub(crate) fn peek_compressive(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut XlMemory,
        committed: &XlState,
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        let [batch, qlen] = tokens.dims();
        let device = tokens.device();
        self.check_memory(batch, &committed.xl)?;
        self.check_compressed(batch, &committed.compressed.layers)?;
        let (mlen, clen) = (committed.xl.len(), committed.compressed.layers.len());
        if let Some(c) = cache.layer(0) {
            let [cb, len, _] = c.dims();
            if cache.n_layers() != self.layers.len() || cb != batch || len < mlen + clen {
                return Err(XlError::Input(format!(
                    "a generation cache of {} layers of {:?} for a batch of {batch} over \
                     memories of {} positions",
                    cache.n_layers(),
                    c.dims(),
                    mlen + clen
                )));
            }
        }
        fn relative(layer: &XlLayer) -> Result<&RelativeMultiHeadAttention, XlError> {
            layer.attention.relative().ok_or_else(|| {
                XlError::Input("a compressive stack's layers are relative attention".into())
            })
        }
        if cache.is_empty() && mlen + clen > 0 {
            let mut entries = Vec::with_capacity(self.layers.len());
            for (l, layer) in self.layers.iter().enumerate() {
                let mem = committed
                    .xl
                    .layer(l)
                    .map(|m| layer.read_memory(m.clone(), false));
                let compressed = committed.compressed.layers.layer(l).cloned();
                let prefix = match (compressed, mem) {
                    (Some(c), Some(m)) => Tensor::cat(vec![c, m], 1),
                    (c, m) => c.or(m).ok_or_else(|| {
                        XlError::Input(format!("layer {l} has no memory to cache"))
                    })?,
                };
                entries.push(relative(layer)?.cache_entry(prefix));
            }
            *cache = XlMemory::from_layers(entries).map_err(XlError::Input)?;
        }
        let mask = AttentionMask::causal();
        let mut contexts = self.contexts(batch, qlen, cache.len(), &mask, &device)?;
        self.window_end_positions(&mut contexts, qlen, (mlen, clen), &mask, &device);
        // The cache handed to a layer ends with the tokens' own entries.
        for (_, _, ctx) in contexts.iter_mut() {
            ctx.memory_holds_segment = true;
        }
        let h = self.embed(tokens, opts)?;
        // The tokens' entries written into the cache's buffers in place (a failed pass leaves
        // the cache as it was).
        cache.begin_append(qlen);
        let mut pass = |mut h: Tensor<3>| -> Result<Tensor<3>, XlError> {
            for (l, layer) in self.layers.iter().enumerate() {
                let reader = layer
                    .clone()
                    .caching_keys_values()
                    .ok_or_else(|| XlError::Input(format!("layer {l} caches no keys/values")))?;
                let a = relative(layer)?;
                let mut cx = self.layer_context(l, &contexts, None, opts);
                h = layer.block.forward(h, None, opts, |x, _| {
                    let all = cache
                        .append(l, a.cache_entry(x.clone()))
                        .map_err(XlError::Input)?;
                    Ok::<_, XlError>(reader.attend(x, Some(all), &mut cx, Replay::Nothing)?.0)
                })?;
            }
            Ok(h)
        };
        let h = pass(h);
        cache.finish_append(h.is_ok());
        Ok(self.finish(h?, opts))
    }

    /// Moves the XL and compressed memories on past a segment whose layers read `reads`; with
    /// `train` and a trainable `f_c`, the weighted reconstruction loss.
    fn compress_memories(
        &self,
        comp: &Compression,
        state: &mut XlState,
        reads: SegmentReads<'_>,
        qlen: usize,
        train: bool,
    ) -> Result<Option<Tensor<1>>, XlError> {
        let SegmentReads {
            inputs,
            received,
            projections,
        } = reads;
        let cfg = &comp.config;
        if self.mem_len == 0 {
            // Read with no memory (`with_mem_len(0)`): neither memory is kept.
            state.xl = XlMemory::empty();
            state.compressed = CompressedMemory::default();
            return Ok(None);
        }
        let mlen = state.xl.len();
        // The compressed vectors the layers read before the memory, `cat(cm, m, h)`.
        let clen = state.compressed.layers.len();
        let total = mlen + qlen;
        let keep = total.min(self.mem_len);
        let n_old = total - keep;
        let trainable = train && cfg.function == CompressionKind::Conv && cfg.cmem_len > 0;
        let mut new_mem = Vec::with_capacity(inputs.len());
        let mut new_cmem = Vec::with_capacity(inputs.len());
        let mut aux: Option<Tensor<1>> = None;
        let mut windows = 0;
        // Most-used: R_j of every position of cat(m, h), this segment's read counted.
        let most_used = !received.is_empty();
        let batch = inputs.first().map_or(0, |t| t.dims()[0]);
        let carried = &state.compressed;
        let usage_fits = carried.usage_reads.len() == mlen
            && carried.usage.n_layers() == inputs.len()
            && carried.usage.len() == mlen;
        let reads: Vec<usize> = match usage_fits {
            true => carried.usage_reads.clone(),
            false => vec![0; mlen],
        }
        .into_iter()
        .chain(std::iter::repeat_n(0, qlen))
        .map(|r| r + 1)
        .collect();
        // Positions of cat(m, h) before a row's current document never win.
        let stale: Vec<usize> = (0..batch)
            .map(|b| match state.xl_valid.get(b) {
                Some(&v) if self.document_resets => total.saturating_sub(v + qlen),
                _ => 0,
            })
            .collect();
        let mut new_usage = Vec::with_capacity(received.len());
        for (l, (layer, input)) in self.layers.iter().zip(inputs).enumerate() {
            let input = input.clone().detach();
            let all = match state.xl.layer(l) {
                Some(m) => Tensor::cat(vec![m.clone(), input.clone()], 1),
                None => input.clone(),
            };
            new_mem.push(all.clone().narrow(1, n_old, keep));
            let usage = match received.get(l) {
                Some(now) => {
                    let device = now.device();
                    let before = match (usage_fits, carried.usage.layer(l)) {
                        (true, Some(u)) => u.clone().reshape([batch, mlen]),
                        _ => Tensor::zeros([batch, mlen], &device),
                    };
                    let sums = Tensor::cat(vec![before, Tensor::zeros([batch, qlen], &device)], 1)
                        + now.clone();
                    new_usage.push(
                        sums.clone()
                            .narrow(1, n_old, keep)
                            .reshape([batch, keep, 1]),
                    );
                    (n_old > 0).then(|| sums.narrow(1, 0, n_old))
                }
                None => None,
            };
            let old_cmem = state.compressed.layers.layer(l).cloned();
            if n_old == 0 || cfg.cmem_len == 0 {
                if let Some(c) = old_cmem {
                    new_cmem.push(c);
                }
                continue;
            }
            // What the attention read of the leaving positions, constant.
            let old = layer.read_memory(all.narrow(1, 0, n_old), false).detach();
            let compressed = match usage {
                Some(sums) => {
                    // u_j = (1/R_j) Σ_τ Σ_i ā_τ(i, j); stale positions below any usage.
                    let sums: Vec<f32> = sums.into_data().try_to_vec::<f32>().map_err(|e| {
                        XlError::Input(format!("usage is not f32 on the host: {e:?}"))
                    })?;
                    let u: Vec<f32> = sums
                        .chunks(n_old)
                        .zip(&stale)
                        .flat_map(|(row, &s)| {
                            let row = row.iter().zip(&reads).enumerate();
                            row.map(move |(j, (&x, &r))| if j < s { -1.0 } else { x / r as f32 })
                        })
                        .collect();
                    select_most_used(old.clone(), &u, n_old.div_ceil(cfg.ratio))
                }
                _ => comp.compress(l, old.clone())?,
            };
            windows = compressed.dims()[1];
            let cat = match old_cmem {
                Some(c) => Tensor::cat(vec![c, compressed.clone().detach()], 1),
                None => compressed.clone().detach(),
            };
            let n = cat.dims()[1];
            let kept = n.min(cfg.cmem_len);
            new_cmem.push(cat.narrow(1, n - kept, kept));
            if !trainable {
                continue;
            }
            // L^attn = ‖attn(h, old) − attn(h, f_c(old))‖² (mean), q and old constant.
            let a = layer
                .attention
                .relative()
                .ok_or_else(|| XlError::Input(format!("layer {l} has no relative attention")))?;
            let scale = 1.0 / (a.d_head as f64).sqrt();
            let (q_, kt, vt) = match projections.get(l).cloned().flatten() {
                // The attention's own: its queries and the keys and values of `old` (or of
                // the whole memory), rows `clen..` of `cat(cm, m, h)`, as constants.
                Some((q, k, v)) => {
                    let n = match (cfg.reconstruct_whole_memory, mlen > 0) {
                        (true, true) => mlen,
                        _ => n_old,
                    };
                    let rows = |t: Tensor<4>| t.narrow(1, clen, n).detach().swap_dims(1, 2);
                    let q = q.detach().mul_scalar(scale).swap_dims(1, 2);
                    (q, rows(k), rows(v))
                }
                // Computed again with the layer's weights held constant.
                None => {
                    let target = match (cfg.reconstruct_whole_memory, state.xl.layer(l)) {
                        (true, Some(m)) => layer.read_memory(m.clone(), false).detach(),
                        _ => old,
                    };
                    let xq = layer.read_memory(input, false).detach();
                    let [b, q, _] = xq.dims();
                    let query = a.clone().no_grad();
                    // Scaled by 1 / sqrt(d_head) while the rows are contiguous (before the
                    // heads' swap, where an elementwise op would walk a strided view).
                    let q_ = linear_rows(&query.query, xq)
                        .mul_scalar(scale)
                        .reshape([b, q, a.n_heads, a.d_head])
                        .swap_dims(1, 2);
                    let (kt, vt) = constant_keys_values(a, target);
                    (q_, kt, vt)
                }
            };
            let (kc, vc) = constant_keys_values(a, compressed);
            let want = content_attention(q_.clone(), kt, vt).detach();
            let got = content_attention(q_, kc, vc);
            let diff = got - want;
            let loss = (diff.clone() * diff).mean();
            aux = Some(match aux {
                Some(t) => t + loss,
                None => loss,
            });
        }
        // Document positions: the memory keeps the valid suffix of cat(m, h); a compressed
        // vector is valid when its whole window is.
        if self.document_resets && !state.xl_valid.is_empty() {
            let n_c = new_cmem.first().map_or(0, |t| t.dims()[1]);
            if state.compressed.valid.len() != state.xl_valid.len() {
                state.compressed.valid = vec![0; state.xl_valid.len()];
            }
            for (v, cv) in state
                .xl_valid
                .iter_mut()
                .zip(state.compressed.valid.iter_mut())
            {
                let seen = *v + qlen;
                if windows > 0 {
                    let valid_old = seen.saturating_sub(keep);
                    // Most-used keeps positions, the valid ones the most recent selected.
                    let full = match most_used {
                        true => valid_old,
                        false => valid_old / cfg.ratio.max(1),
                    };
                    *cv = if full >= windows { *cv + windows } else { full }.min(n_c);
                } else {
                    *cv = (*cv).min(n_c);
                }
                *v = seen.min(keep);
            }
        }
        state.xl = XlMemory::from_layers(new_mem).map_err(XlError::Input)?;
        state.compressed.layers = XlMemory::from_layers(new_cmem).map_err(XlError::Input)?;
        if most_used {
            state.compressed.usage = XlMemory::from_layers(new_usage).map_err(XlError::Input)?;
            state.compressed.usage_reads = reads[n_old..].to_vec();
        }
        let n_layers = self.layers.len().max(1) as f64;
        Ok(aux.map(|a| a.mul_scalar(cfg.reconstruction_weight / n_layers)))
    }
}

impl TransformerXl {
    /// Reads one segment of a compressive stack as its training step does
    /// ([`TransformerXl::train_step`]): the hidden states (with the graph) and the weighted
    /// attention-reconstruction loss (`None` when nothing was compressed), moving both
    /// memories on. Dropout follows the model's device, as in [`forward_state`](Self::forward_state).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`, `[1]`
    pub fn forward_compressive_train(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), XlError> {
        self.forward_compressive(tokens, state, reset, None, true, None)
    }
}

impl TransformerXl {
    /// The same compressive model reading a compressed memory of `cmem_len` vectors (0: none,
    /// the baseline that shows what the compressed memory adds; longer: as the XL memory can
    /// be at evaluation). A stack that is not compressive is returned as it is.
    pub fn with_cmem_len(mut self, cmem_len: usize) -> Self {
        if let Some(c) = self.compressive.as_mut() {
            c.config.cmem_len = cmem_len;
        }
        self
    }
}

//! kNN-augmented attention (Wu et al. 2022, sec. 3): local attention plus attention over the
//! top-k (key, value) pairs retrieved from an external memory, mixed by a learned gate. The
//! local part is `memzoo_relative`'s attention with T5 biases; the memory is `memzoo_memory`'s.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Tensor, TensorData};
use memzoo_fused::softmax::softmax;
use memzoo_memory::{KnnIndex, Retrieved};
use serde::{Deserialize, Serialize};

use memzoo_relative::{
    PositionConfig, PositionKind, RelativeAttentionConfig, RelativeContext,
    RelativeMultiHeadAttention,
};

use crate::error::KnnError;

/// Value a hidden score is set to before the softmax.
pub(crate) const MASKED: f32 = -1.0e9;

/// How a kNN layer combines local attention and attention over the retrieved pairs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum KnnMixing {
    /// Two softmaxes, one over the local keys and one over the retrieved ones, mixed per head
    /// by a learned gate `g = sigmoid(b_g)` (Wu et al. 2022, sec. 3.2).
    #[default]
    Gate,
    /// One softmax over the retrieved and the local keys together, no gate
    /// (memorizing-transformers-pytorch's `KNNAttention`); the gate parameter is unused.
    Joint,
}

/// Configuration of a [`KnnAttention`] layer.
#[derive(Config, Debug)]
pub struct KnnAttentionConfig {
    /// Width of the layer's input and output.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Relative positions of the local attention. Default: T5 buckets, as the paper.
    #[config(default = "PositionConfig::new().with_kind(PositionKind::T5)")]
    pub positions: PositionConfig,
    /// Dropout on the layer output. Default: 0.0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Dropout on the attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Initial temperature `τ` of the normalised scores `τ q̂·k̂` (learned per head, as
    /// log τ). Default: 20 (with unit vectors, `1/sqrt(d_head)` would make every softmax
    /// nearly uniform).
    #[config(default = 20.0)]
    pub attn_scale_init: f64,
    /// Initial gate bias `b_g` (`g = sigmoid(b_g)`). Default: 0 (g = 0.5).
    #[config(default = 0.0)]
    pub gate_init: f64,
    /// How local and retrieved attention are combined. Default: `gate` (the paper).
    #[config(default = "KnnMixing::Gate")]
    pub mixing: KnnMixing,
    /// Key/value heads (`RelativeAttentionConfig::n_kv_heads`; `Some(1)`: multi-query, one
    /// key and value per position shared by every head). Default: none (one per head).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Gradients through the XL memory's keys and values
    /// (`RelativeAttentionConfig::memory_gradients`). Default: true.
    #[config(default = true)]
    pub memory_gradients: bool,
    /// The XL memory holds cached keys/values
    /// (`RelativeAttentionConfig::memory_keys_values`; the keys normalised, see
    /// [`KnnAttention::cache_entry`]). Default: false.
    #[config(default = false)]
    pub memory_keys_values: bool,
    /// Initialiser of the projections. Default: normal(0, 0.02).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl KnnAttentionConfig {
    /// Checks the configuration, naming the bad value.
    pub fn validate(&self) -> Result<(), KnnError> {
        if !(self.attn_scale_init.is_finite() && self.attn_scale_init > 0.0) {
            return Err(KnnError::Config(format!(
                "attn_scale_init must be positive, got {}",
                self.attn_scale_init
            )));
        }
        if !self.gate_init.is_finite() {
            return Err(KnnError::Config(format!(
                "gate_init must be finite, got {}",
                self.gate_init
            )));
        }
        self.relative().validate()?;
        Ok(())
    }

    fn relative(&self) -> RelativeAttentionConfig {
        RelativeAttentionConfig::new(self.d_model, self.n_heads, self.d_head)
            .with_positions(self.positions.clone())
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_n_kv_heads(self.n_kv_heads)
            .with_memory_gradients(self.memory_gradients)
            .with_memory_keys_values(self.memory_keys_values)
            .with_initializer(self.initializer.clone())
    }

    /// Initialises the layer after validating the configuration.
    pub fn init(&self, device: &Device) -> Result<KnnAttention, KnnError> {
        self.validate()?;
        let h = self.n_heads;
        let fill = |v: f64| {
            Param::from_tensor(Tensor::from_data(
                TensorData::new(vec![v as f32; h], [h]),
                device,
            ))
        };
        Ok(KnnAttention {
            attention: self.relative().init(device)?,
            log_scale: fill(self.attn_scale_init.ln()),
            gate: fill(self.gate_init),
            mixing: self.mixing,
            evicted_feed: None,
            fused_memory: true,
            n_heads: h,
            d_head: self.d_head,
        })
    }
}

/// The output of [`KnnAttention::forward`].
#[derive(Debug, Clone)]
pub struct KnnAttentionOutput {
    /// Layer output, `[batch, qlen, d_model]`.
    pub output: Tensor<3>,
    /// The segment's normalised keys, `[batch, qlen, n_kv_heads, d_head]` (one per key/value
    /// head, not copied to the query heads), detached: what goes into the memory after the
    /// step.
    pub keys: Tensor<4>,
    /// The segment's values, `[batch, qlen, n_kv_heads, d_head]`, detached.
    pub values: Tensor<4>,
    /// The memory pairs the segment's queries attended to.
    pub retrieved: Retrieved,
}

/// kNN-augmented multi-head attention (the Memorizing Transformer's memory layer).
///
/// With `q̂ = q/‖q‖`, `k̂ = k/‖k‖` (Wu et al. normalise keys and queries so that keys
/// computed by older parameters stay comparable) and a learned per-head temperature `τ`:
///
/// - local: `A_c = softmax(τ q̂_i·k̂_j + β_bucket(i-j))` over `cat(XL memory, segment)`
///   (causal), `V_c = A_c V`;
/// - memory: `A_m = softmax(τ q̂_i·k̂_m)` over the top-k retrieved `(k̂_m, v_m)` of query
///   `i` (its own row and head, no position bias), `V_m = A_m V_mem`;
/// - `out = W_o [g ⊙ V_m + (1 - g) ⊙ V_c]`, `g = sigmoid(b_g)` per head (sec. 3.2). A
///   query with no memory at all (empty memory) uses `V_c` alone.
///
/// Retrieved pairs are constants (no gradient reaches the memory); the segment's `(k̂, v)`
/// are returned detached for the caller to add to the memory after the step.
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct KnnAttention {
    /// Projections `W_q`, `[W_k; W_v]`, `W_o` and the T5 bias table, with the local
    /// attention's dropouts.
    pub attention: RelativeMultiHeadAttention,
    /// `log τ` per head, `[heads]`.
    pub log_scale: Param<Tensor<1>>,
    /// `b_g` per head, `[heads]` (unused with `mixing = joint`).
    pub gate: Param<Tensor<1>>,
    /// How local and retrieved attention are combined (from the config).
    #[module(skip)]
    pub mixing: KnnMixing,
    /// `Some(mem_len)`: the memory receives the pairs leaving an XL memory of `mem_len`
    /// positions instead of the segment's (see [`set_evicted_feed`](Self::set_evicted_feed)).
    #[module(skip)]
    evicted_feed: Option<usize>,
    /// Whether the attention over the retrieved pairs may run as the fused kernel (where it
    /// applies, see [`fused_memory_applies`](Self::fused_memory_applies)); `false`: tensor ops
    /// always (the reference the kernel is tested against).
    #[module(skip)]
    pub fused_memory: bool,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
}

/// `x / ‖x‖` along the last dim. The floor goes under the square root: a zero vector would
/// otherwise backpropagate `0 * d sqrt(0) = NaN` (the Reformer's padded queries did).
pub fn l2_normalize<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let norm = x
        .clone()
        .powi_scalar(2)
        .sum_dim(D - 1)
        .clamp_min(1e-12)
        .sqrt();
    x / norm
}

impl KnnAttention {
    /// The same layer drawing its dropout masks (on the output and on the local and retrieved
    /// probabilities) from `seed` (`None`: the device's generator); see
    /// [`RelativeMultiHeadAttention::dropout_seed`].
    pub fn with_dropout_seed(mut self, seed: Option<u64>) -> Self {
        self.attention = self.attention.with_dropout_seed(seed);
        self
    }

    /// Local + kNN attention of the segment `x` (see the type docs); `knn` is searched with
    /// the segment's queries for the `top_k` best pairs each.
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        knn: &dyn KnnIndex,
        top_k: usize,
    ) -> Result<KnnAttentionOutput, KnnError> {
        let [batch, _, _] = x.dims();
        let (h, hk, dh) = (self.n_heads, self.attention.n_kv_heads, self.d_head);
        let c = knn.config();
        if c.n_heads != h || c.kv_heads() != hk || c.d_head != dh || knn.batch() != batch {
            return Err(KnnError::Input(format!(
                "kNN memory holds {} rows x {} heads ({} kv heads) x {} dims, the layer needs \
                 {batch} x {h} ({hk}) x {dh}",
                knn.batch(),
                c.n_heads,
                c.kv_heads(),
                c.d_head
            )));
        }
        self.forward_retrieving(x, memory, ctx, |q| Ok(knn.search(q, top_k)?))
    }

    /// [`forward`](Self::forward) with the memory pairs given by `retrieve(q̂)` (the segment's
    /// detached normalised queries, `[batch, qlen, heads, d_head]`): a search, or the pairs an
    /// earlier pass retrieved (the reversible backward replays them, as the memory has moved
    /// on since). The output's [`retrieved`](KnnAttentionOutput::retrieved) holds them.
    pub fn forward_retrieving(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        retrieve: impl FnOnce(Tensor<4>) -> Result<Retrieved, KnnError>,
    ) -> Result<KnnAttentionOutput, KnnError> {
        if self.mixing == KnnMixing::Joint {
            return self.forward_joint(x, memory, ctx, retrieve);
        }
        let [batch, qlen, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        let att = &self.attention;
        let mlen = ctx.mlen;
        let (q, k, v, tau_h) = self.normalized(x, memory, ctx)?;
        let tau = tau_h.clone().reshape([1, h, 1, 1]);

        // Local: τ q̂·k̂ + β. `scores` multiplies by 1/sqrt(d_head), so q̂ enters as τ sqrt(d_head) q̂.
        let qh = q.clone().swap_dims(1, 2); // [batch, heads, qlen, dh]
        let q_in = qh * tau.mul_scalar((dh as f32).sqrt());
        let (kh, vh) = (k.clone().swap_dims(1, 2), v.clone().swap_dims(1, 2));
        let local = att.attend(q_in, kh, vh, ctx, None)?; // [batch, heads, qlen, dh]

        // Memory: top-k of q̂ in this row's and head's store, constants: A_m V_mem,
        // [batch, qlen, heads, dh].
        let found = retrieve(q.clone().detach())?;
        let remote = self.memory_read(q, tau_h, &found)?;

        // g = sigmoid(b_g) per head, 0 where the query found nothing.
        let found_any = found.mask.clone().float().min_dim(3).neg().add_scalar(1.0); // [b, q, h, 1]
        let g = sigmoid(self.gate.val()).reshape([1, 1, h, 1]) * found_any;
        let local = local.swap_dims(1, 2); // [batch, qlen, heads, dh]
        let mixed = remote * g.clone() + local * g.neg().add_scalar(1.0);
        let context = mixed.reshape([batch, qlen, h * dh]);
        let output = att.project_output(context);
        Ok(KnnAttentionOutput {
            output,
            keys: att.unshare_kv_heads(k.narrow(1, mlen, qlen)).detach(),
            values: att.unshare_kv_heads(v.narrow(1, mlen, qlen)).detach(),
            retrieved: found,
        })
    }

    /// The normalised queries and keys `q̂`, `k̂` of `cat(memory, x)` and its values (each
    /// `[batch, len, heads, d_head]`), and the temperature `τ` per head (`[heads]`).
    fn normalized(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>, Tensor<1>), KnnError> {
        let (q, k, v) = self.attention.project(x, memory, ctx)?;
        Ok((
            l2_normalize(q),
            l2_normalize(k),
            v,
            self.log_scale.val().exp(),
        ))
    }

    /// [`forward_retrieving`](Self::forward_retrieving) with `mixing = joint`
    /// (memorizing-transformers-pytorch's `KNNAttention`): one softmax over the retrieved and
    /// the local keys,
    /// `A = softmax([τ q̂_i·k̂_m]_m ++ [τ q̂_i·k̂_j + β_bucket]_j)`,
    /// `out = W_o (Σ_m A_im v_m + Σ_j A_ij v_j)`; empty slots take no weight.
    fn forward_joint(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        retrieve: impl FnOnce(Tensor<4>) -> Result<Retrieved, KnnError>,
    ) -> Result<KnnAttentionOutput, KnnError> {
        let [batch, qlen, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        let att = &self.attention;
        let (mlen, klen) = (ctx.mlen, ctx.klen());
        let (q, k, v, tau_h) = self.normalized(x, memory, ctx)?;
        let tau = tau_h.clone().reshape([1, h, 1, 1]);
        // Local scores τ q̂·k̂ + β (as `forward_retrieving`): [batch, heads, qlen, klen].
        let q_in = q.clone().swap_dims(1, 2) * tau.clone().mul_scalar((dh as f32).sqrt());
        let local = ctx.mask_scores(att.scores(q_in, k.clone().swap_dims(1, 2), ctx, None)?);
        let found = retrieve(q.clone().detach())?;
        if self.fused_memory && self.fused_memory_applies(&q) {
            // The remote part fused, with its log-partition; the local softmax and the mix as
            // tensor ops (`joint_mix`).
            let context = self.joint_mix(q, tau_h, &found, local, v.clone().swap_dims(1, 2))?;
            return Ok(KnnAttentionOutput {
                output: att.project_output(context.reshape([batch, qlen, h * dh])),
                keys: k.narrow(1, mlen, qlen).detach(),
                values: v.narrow(1, mlen, qlen).detach(),
                retrieved: found,
            });
        }
        // Memory scores τ q̂·k̂_m: [n, 1, dh] x [n, dh, k] -> [batch, heads, qlen, k].
        let kk = found.keys.dims()[3];
        let n = batch * qlen * h;
        let remote = q
            .reshape([n, 1, dh])
            .matmul(found.keys.clone().reshape([n, kk, dh]).swap_dims(1, 2))
            .reshape([batch, qlen, h, kk])
            .mask_fill(found.mask.clone(), MASKED)
            .swap_dims(1, 2)
            * tau;
        let probs = att.drop_probs(softmax(Tensor::cat(vec![remote, local], 3), 3));
        let from_memory = probs
            .clone()
            .narrow(3, 0, kk)
            .swap_dims(1, 2)
            .reshape([n, 1, kk])
            .matmul(found.values.clone().reshape([n, kk, dh]))
            .reshape([batch, qlen, h, dh]);
        let from_local = probs
            .narrow(3, kk, klen)
            .matmul(v.clone().swap_dims(1, 2))
            .swap_dims(1, 2);
        let context = (from_memory + from_local).reshape([batch, qlen, h * dh]);
        Ok(KnnAttentionOutput {
            output: att.project_output(context),
            keys: att.unshare_kv_heads(k.narrow(1, mlen, qlen)).detach(),
            values: att.unshare_kv_heads(v.narrow(1, mlen, qlen)).detach(),
            retrieved: found,
        })
    }

    /// The same layer reading its XL memory as cached keys and values when `on`
    /// ([`RelativeMultiHeadAttention::with_memory_keys_values`]).
    pub fn with_memory_keys_values(mut self, on: bool) -> Self {
        self.attention = self.attention.with_memory_keys_values(on);
        self
    }

    /// The same layer holding its local attention's `W_R R_d` per distance
    /// ([`RelativeMultiHeadAttention::with_position_table`]; unchanged unless XL positions).
    pub fn with_position_table(mut self, max_distance: usize) -> Self {
        self.attention = self.attention.with_position_table(max_distance);
        self
    }

    /// What a key/value XL memory caches for inputs `h`: the normalised keys `k̂` and the
    /// values, as [`RelativeMultiHeadAttention::cache_entry`] lays them out.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 n_kv_heads d_head]`
    pub fn cache_entry(&self, h: Tensor<3>) -> Tensor<3> {
        let [b, len, _] = h.dims();
        let (hk, dh) = (self.attention.n_kv_heads, self.d_head);
        let m = self.attention.cache_entry(h);
        let k = l2_normalize(m.clone().narrow(2, 0, hk * dh).reshape([b, len, hk, dh]));
        let v = m.narrow(2, hk * dh, hk * dh).reshape([b, len, hk, dh]);
        RelativeMultiHeadAttention::pack_entry(k, v)
    }

    /// The pairs of `cat(memory, x)` (the XL memory as the layer reads it: inputs, or cached
    /// keys/values) that the kNN memory receives, the first `n` of them (`n >= 1`).
    ///
    /// # Shapes
    /// - `memory`: `[batch, mlen, d_model]` (or cached entries), `x`: `[batch, qlen, d_model]`
    /// - output: `[batch, n, n_kv_heads, d_head]` each, detached
    pub fn leading_pairs(
        &self,
        memory: Option<Tensor<3>>,
        x: Tensor<3>,
        n: usize,
    ) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = match memory {
            Some(m) if self.attention.memory_keys_values => {
                let (km, vm) = self.attention.cached_kv_heads(m);
                let (kx, vx) = self.memory_pairs(x);
                (
                    Tensor::cat(vec![km.detach(), kx], 1),
                    Tensor::cat(vec![vm.detach(), vx], 1),
                )
            }
            Some(m) => self.memory_pairs(Tensor::cat(vec![m, x], 1)),
            None => self.memory_pairs(x),
        };
        (k.narrow(1, 0, n), v.narrow(1, 0, n))
    }

    /// [`leading_pairs`](Self::leading_pairs) of a cache that already ends with the segment's
    /// entries ([`RelativeContext::with_memory_holding_segment`]): its first `n` pairs, the
    /// keys as the entries hold them (normalised, [`cache_entry`](Self::cache_entry)).
    ///
    /// # Shapes
    /// - `memory`: `[batch, mlen + qlen, 2 n_kv_heads d_head]`
    /// - output: `[batch, n, n_kv_heads, d_head]` each, detached
    pub fn leading_pairs_held(&self, memory: Tensor<3>, n: usize) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = self.attention.cached_kv_heads(memory.detach());
        (k.narrow(1, 0, n), v.narrow(1, 0, n))
    }

    /// Which pairs the stack adds to this layer's kNN memory: `None`, the segment's
    /// ([`KnnAttentionOutput::keys`]); `Some(mem_len)`, those leaving the layer's XL memory of
    /// `mem_len` positions, the first `mlen + qlen - mem_len` of `cat(memory, segment)`
    /// (memorizing-transformers-pytorch), through [`memory_pairs`](Self::memory_pairs).
    pub fn set_evicted_feed(&mut self, mem_len: Option<usize>) {
        self.evicted_feed = mem_len;
    }

    /// See [`set_evicted_feed`](Self::set_evicted_feed).
    pub fn evicted_feed(&self) -> Option<usize> {
        self.evicted_feed
    }

    /// The pairs this layer stores for inputs `h` (what the memory receives for them): the
    /// normalised keys `k̂` and the values of the key/value heads, detached.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, n_kv_heads, d_head]` each
    pub fn memory_pairs(&self, h: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = self.attention.kv_heads_constant(h);
        (l2_normalize(k).detach(), v.detach())
    }

    /// [`forward`](Self::forward), then adds the segment's `(k̂, v)` to `knn`.
    pub fn forward_and_store(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        knn: &mut dyn KnnIndex,
        top_k: usize,
    ) -> Result<Tensor<3>, KnnError> {
        let out = self.forward(x, memory, ctx, &*knn, top_k)?;
        knn.add(out.keys, out.values)?;
        Ok(out.output)
    }
}

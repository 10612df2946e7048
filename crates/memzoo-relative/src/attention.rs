//! Relative multi-head attention with memory keys prepended.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Tensor, TensorData};
use memzoo_fused::softmax::softmax;
use std::sync::{Arc, Mutex};

use memzoo_reformer::rng::{dropout_mask, mix};

use crate::error::RelativeError;
use crate::positions::{PositionConfig, PositionIndex, PositionKind, RelativeContext, sinusoid};
use crate::rotary::{QkNorm, RotarySpec, RotaryTables};
use crate::rows::linear_rows;
use crate::shift::relative_shift;

/// Seed tags of the attention's own dropout masks under a
/// [`dropout_seed`](RelativeMultiHeadAttention::dropout_seed).
const TAG_DROP_OUTPUT: u64 = 1;
const TAG_DROP_PROBS: u64 = 2;

/// Configuration of a [`RelativeMultiHeadAttention`] layer.
#[derive(Config, Debug)]
pub struct RelativeAttentionConfig {
    /// Width of the layer's input and output.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// The relative position scheme. Default: Transformer-XL.
    #[config(default = "PositionConfig::new()")]
    pub positions: PositionConfig,
    /// Dropout on the layer output. Default: 0.0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Dropout on the attention probabilities ("dropatt"). Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// XL only: whether this layer owns its `u`/`v` biases (untied). When false they are
    /// shared across layers and passed to [`RelativeMultiHeadAttention::forward`]. Default: true.
    #[config(default = true)]
    pub own_biases: bool,
    /// A learned bias `b_v` on the values and `b_o` on the output projection (labml's
    /// `MultiHeadAttention`, whose value and output linear layers have biases while query and
    /// key have none): `v_j = W_v h_j + b_v`, `out = W_o c + b_o`. Both start at zero. A key
    /// bias would be pointless: `q_i·b_k` is the same for every key of a query, and the softmax
    /// cancels it. Default: false (no biases, as Transformer-XL).
    #[config(default = false)]
    pub value_output_bias: bool,
    /// A learned bias `b_o` on the output projection alone, `out = W_o c + b_o`, starting at
    /// zero (memorizing-transformers-pytorch's `Attention.to_out`). Implied by
    /// `value_output_bias`. Default: false.
    #[config(default = false)]
    pub output_bias: bool,
    /// Key/value heads, each shared by `n_heads / n_kv_heads` query heads; `Some(1)`:
    /// multi-query attention (Shazeer 2019; memorizing-transformers-pytorch's `to_kv`, one
    /// key and one value of `d_head` per position). `W_k`, `W_v` are then
    /// `d_model -> n_kv_heads * d_head`. `None`: one per query head. Default: none.
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Gradients reach `W_k`, `W_v` (and `b_v`) through the memory's keys and values (memzoo,
    /// which projects the cached layer inputs in every segment). false: the memory's keys and
    /// values are constants, as in a model that caches them detached
    /// (memorizing-transformers-pytorch); the forward pass is the same. Default: true.
    #[config(default = true)]
    pub memory_gradients: bool,
    /// The memory given to [`RelativeMultiHeadAttention::forward`] is cached keys and values
    /// (`[batch, mlen, 2 n_kv_heads d_head]`, see
    /// [`cache_entry`](RelativeMultiHeadAttention::cache_entry)), not layer inputs to project.
    /// Default: false.
    #[config(default = false)]
    pub memory_keys_values: bool,
    /// In training on `flex`, the fused attention kernel keeps no probabilities for the
    /// backward pass and computes them again there (FlashAttention's trade): the same
    /// gradients, `4 · batch · n_heads · qlen · klen` bytes less per layer held for the
    /// backward, for a second computation of the scores and their softmax. For long memories
    /// (`klen = mem_len + qlen`), where the probabilities are most of a step's memory. No
    /// effect on the tensor-op path or without gradients. Default: false.
    #[config(default = false)]
    pub recompute_probabilities: bool,
    /// A learned null key and value per head, `[2, n_heads, d_head]`, prepended to the keys
    /// and visible to every query (recurrent-memory-transformer-pytorch's `null_kv`): the
    /// output is `softmax_j(s q·[k_null, k_j]) [v_null, v_j]`. Absolute positions only (the
    /// null key has no distance) and a key/value per head. Default: false.
    #[config(default = false)]
    pub null_key_value: bool,
    /// A value gate `W_g`: `d_model -> n_heads`, no bias: the layer mixes the values of the
    /// pass's first layer into its own, `v ← v + σ(W_g x)_h (v_1 − v)`, read from the
    /// context's [`ValueResidual`] (value residual learning; recurrent-memory-transformer-pytorch's
    /// `learned_value_residual_mix`). A layer without a gate reading such a context stores
    /// its values there when it is the first. Absolute positions only, a key/value per head.
    /// Default: false.
    #[config(default = false)]
    pub value_gate: bool,
    /// qk-RMSNorm with this fixed score scale: queries and keys l2-normalised
    /// per head and scaled by learned gains before the positions, the scores `s q̂·k̂` (see
    /// [`crate::rotary`]). Rotary or absolute positions only. Default: none.
    #[config(default = "None")]
    pub qk_norm: Option<f64>,
    /// Initialiser of every weight. Default: normal(0, 0.02), as Transformer-XL.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

/// The values of the first layer of one forward pass (`[batch, klen, n_heads, d_head]`, in
/// the graph), which the later layers with a value gate mix into theirs (value residual
/// learning). A context carries one ([`RelativeContext::with_value_residual`]); clones share it.
#[derive(Debug, Clone, Default)]
pub struct ValueResidual(Arc<Mutex<Option<Tensor<4>>>>);

/// The per-head projections of one attention call, `[batch, len, n_heads, d_head]` each: the
/// queries `W_q x` of the segment and the keys `W_k` and values `W_v` of `cat(memory, x)`,
/// in the graph. See [`ProjectionTap`].
pub type Projections = (Tensor<4>, Tensor<4>, Tensor<4>);

/// A slot a relative layer fills with its [`Projections`] each time it reads a context that
/// carries it ([`RelativeContext::with_projection_tap`]), for a caller that needs them again
/// (the Compressive Transformer's reconstruction loss reads the queries and the keys and
/// values of the memory it compresses). Clones share it; [`take`](Self::take) empties it.
#[derive(Debug, Clone, Default)]
pub struct ProjectionTap(Arc<Mutex<Option<Projections>>>);

impl ProjectionTap {
    /// The projections of the last call that filled the slot since the last `take`, if any.
    pub fn take(&self) -> Option<Projections> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }

    fn set(&self, projections: Projections) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(projections);
        }
    }
}

/// Transformer-XL's global content bias `u` and position bias `v`, `[n_heads, d_head]` each.
///
/// Owned by a layer (untied) or by the model and passed to every layer (shared, as the paper).
#[derive(Module, Debug)]
pub struct XlBiases {
    /// `u`: added to the query when scoring content (terms A + C).
    pub content: Param<Tensor<2>>,
    /// `v`: added to the query when scoring positions (terms B + D).
    pub position: Param<Tensor<2>>,
}

impl XlBiases {
    /// New biases drawn from `initializer`.
    pub fn init(n_heads: usize, d_head: usize, initializer: &Initializer, device: &Device) -> Self {
        Self {
            content: initializer.init([n_heads, d_head], device),
            position: initializer.init([n_heads, d_head], device),
        }
    }
}

/// The position parameters of Transformer-XL's scheme: `W_R`, and `u`/`v` when the layer owns
/// them (untied; otherwise the model shares one pair across layers).
#[derive(Module, Debug)]
pub struct XlPositionParams {
    /// `W_R`, projecting the sinusoid `R` into every head.
    pub r_net: Linear,
    /// `u`, `v` of this layer (untied), or `None` when shared.
    pub biases: Option<XlBiases>,
}

impl XlPositionParams {
    /// The layer's own `u`/`v` biases, else the model's `shared` ones.
    pub fn biases_or<'a>(
        &'a self,
        shared: Option<&'a XlBiases>,
    ) -> Result<&'a XlBiases, RelativeError> {
        self.biases.as_ref().or(shared).ok_or_else(|| {
            RelativeError::Input(
                "XL attention without its own u/v biases needs the shared ones".into(),
            )
        })
    }
}

/// The position parameters of the learned scheme (labml).
#[derive(Module, Debug)]
pub struct LearnedPositionParams {
    /// Per-distance key embeddings `E`, `[2 max_distance + 1, n_heads, d_head]`.
    pub embedding: Param<Tensor<3>>,
    /// Query position bias `b_q`, `[n_heads, d_head]`.
    pub query_bias: Param<Tensor<2>>,
    /// Per-distance key bias `b_k`, `[2 max_distance + 1, n_heads]`.
    pub key_bias: Param<Tensor<2>>,
}

/// The position parameters of T5's scheme: one scalar per bucket and head.
#[derive(Module, Debug)]
pub struct T5PositionParams {
    /// `β`, `[num_buckets, n_heads]`.
    pub bias: Param<Tensor<2>>,
}

/// The position parameters of the absolute scheme: none in the layer (the stack adds the
/// positions to its embeddings). `heads` only gives the variant a module to hold.
#[derive(Module, Debug)]
pub struct AbsolutePositionParams {
    /// Number of heads (a constant, no parameter).
    pub heads: usize,
}

/// The parameters of one position scheme ([`PositionKind`]), exactly those it uses.
#[derive(Module, Debug)]
pub enum PositionParams {
    /// Transformer-XL: sinusoids projected by `W_R`, biases `u`, `v`.
    Xl(XlPositionParams),
    /// Learned relative embeddings and biases.
    Learned(LearnedPositionParams),
    /// T5 bucketed scalar biases.
    T5(T5PositionParams),
    /// Absolute positions: no parameters in the layer.
    Absolute(AbsolutePositionParams),
    /// Rotary positions (with xPos): no parameters (the rotation is fixed).
    Rotary(AbsolutePositionParams),
}

/// The extra parameters of a peer's attention ([`RelativeAttentionConfig::null_key_value`],
/// [`RelativeAttentionConfig::value_gate`]).
#[derive(Module, Debug)]
pub struct PeerAttentionParams {
    /// The null key and value per head, `[2, n_heads, d_head]` (`[0]` the key, `[1]` the value).
    pub null_kv: Option<Param<Tensor<3>>>,
    /// `W_g`: `d_model -> n_heads`, the value residual's gate.
    pub value_gate: Option<Linear>,
}

/// Multi-head attention whose scores depend on the distance between query and key.
///
/// Queries come from the segment `x`; keys and values from `cat(memory, x)`, so `qlen` queries
/// see `klen = mlen + qlen` keys. With `q_i = W_q x_i`, `k_j = W_k h_j`, `s = 1/sqrt(d_head)`
/// and `d = i + mlen - j`, the score of (i, j) is, per scheme:
///
/// - **XL** (Dai et al. 2019, eq. in sec. 3.3):
///   `s [ (q_i + u)·k_j  +  (q_i + v)·W_R R_d ]` — terms (a)+(c) and (b)+(d);
/// - **learned** (labml): `s [ (q_i + b_q)·k_j + q_i·E_d + b_k,d ]`, `E`, `b_k` learned per
///   clamped distance, `b_q` a learned query bias;
/// - **T5**: `s q_i·k_j + β_bucket(d)`, one learned scalar per head and bucket;
/// - **absolute** (Vaswani et al. 2017): `s q_i·k_j`, the positions being in `x` itself.
///
/// Hidden keys (causal mask, window, explicit mask) get `-inf` (causal) or `-1e9` (explicit
/// masks) before the softmax (see [`RelativeContext::mask_value`]).
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`
/// - `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct RelativeMultiHeadAttention {
    /// `W_q`: `d_model -> n_heads * d_head`.
    pub query: Linear,
    /// `[W_k; W_v]` fused: `d_model -> 2 * n_kv_heads * d_head` (`n_kv_heads = n_heads`
    /// unless configured).
    pub key_value: Linear,
    /// Output projection `n_heads * d_head -> d_model` (with the bias `b_o` when
    /// `value_output_bias`).
    pub output: Linear,
    /// `b_v`, `[n_heads * d_head]`, added to every value (`value_output_bias`; else `None`).
    pub value_bias: Option<Param<Tensor<1>>>,
    /// The position scheme's parameters.
    pub scheme: PositionParams,
    /// A null key/value and a value gate (`None`: neither).
    pub peer: Option<PeerAttentionParams>,
    /// qk-RMSNorm's gains and scale ([`RelativeAttentionConfig::qk_norm`]; `None`: none).
    pub qk_norm: Option<QkNorm>,
    /// Dropout on the output.
    pub dropout: Dropout,
    /// Dropout on the attention probabilities.
    pub dropatt: Dropout,
    /// The position scheme.
    #[module(skip)]
    pub positions: PositionConfig,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of each head.
    pub d_head: usize,
    /// Width of the input.
    pub d_model: usize,
    /// Key/value heads (`n_heads` unless multi-query / grouped); from the config, not stored
    /// in records.
    #[module(skip)]
    pub n_kv_heads: usize,
    /// Whether gradients flow through the memory's keys and values (from the config).
    #[module(skip)]
    pub memory_gradients: bool,
    /// Whether the memory holds cached keys/values instead of layer inputs (from the config).
    #[module(skip)]
    pub memory_keys_values: bool,
    /// Whether the fused kernel computes the probabilities again in the backward pass instead
    /// of keeping them (from the config).
    #[module(skip)]
    pub recompute_probabilities: bool,
    /// Seed of this pass's dropout masks ([`with_dropout_seed`](Self::with_dropout_seed)):
    /// `Some`, the masks on the output and on the probabilities are drawn on the host from it
    /// (the same seed, the same masks, whichever thread runs the pass and whatever it drew
    /// before); `None`, Burn's `Dropout` draws them from the device's generator.
    #[module(skip)]
    pub dropout_seed: Option<u64>,
    /// XL only, for generation: `W_R R_d` of every distance `d` in `-1 ..= n`, row `n - d`
    /// (farthest first, the order of a pass's columns), `[n + 2, n_heads * d_head]`, detached
    /// ([`with_position_table`](Self::with_position_table)); read by contexts of
    /// [`PositionIndex::XlRows`]. `None`: every pass projects its sinusoids.
    #[module(skip)]
    pub position_table: Option<Box<Tensor<2>>>,
}

impl RelativeAttentionConfig {
    /// Key/value heads: `n_kv_heads`, else `n_heads`.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Checks the configuration, naming the bad value.
    pub fn validate(&self) -> Result<(), RelativeError> {
        let bad = |msg: String| Err(RelativeError::Config(msg));
        if self.d_model == 0 || self.n_heads == 0 || self.d_head == 0 {
            return bad(format!(
                "d_model ({}), n_heads ({}) and d_head ({}) must all be positive",
                self.d_model, self.n_heads, self.d_head
            ));
        }
        let hk = self.kv_heads();
        if hk == 0 || !self.n_heads.is_multiple_of(hk) {
            return bad(format!(
                "n_kv_heads ({hk}) must be positive and divide n_heads ({})",
                self.n_heads
            ));
        }
        if (self.null_key_value || self.value_gate)
            && (self.positions.kind != PositionKind::Absolute || hk != self.n_heads)
        {
            return bad(format!(
                "a null key/value and a value gate need absolute positions and a key/value per \
                 head, got {:?} positions and {hk} key/value heads for {} heads",
                self.positions.kind, self.n_heads
            ));
        }
        if let Some(scale) = self.qk_norm
            && (!scale.is_finite()
                || !matches!(
                    self.positions.kind,
                    PositionKind::Rotary | PositionKind::Absolute
                ))
        {
            return bad(format!(
                "qk_norm = {scale} needs a finite scale and rotary or absolute positions, got \
                 {:?} positions",
                self.positions.kind
            ));
        }
        if self.positions.kind == PositionKind::Rotary && !self.d_head.is_multiple_of(2) {
            return bad(format!(
                "rotary positions rotate pairs of dimensions: d_head must be even, got {}",
                self.d_head
            ));
        }
        for (name, p) in [("dropout", self.dropout), ("dropatt", self.dropatt)] {
            if !(0.0..1.0).contains(&p) {
                return bad(format!("{name} must be in [0, 1), got {p}"));
            }
        }
        self.positions
            .validate(self.d_model)
            .map_err(RelativeError::Config)
    }

    /// Initialises the layer after validating the configuration.
    pub fn init(&self, device: &Device) -> Result<RelativeMultiHeadAttention, RelativeError> {
        self.validate()?;
        let inner = self.n_heads * self.d_head;
        let linear = |i, o| {
            LinearConfig::new(i, o)
                .with_bias(false)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let (h, dh) = (self.n_heads, self.d_head);
        let hk = self.kv_heads();
        let mut output = linear(inner, self.d_model);
        if self.value_output_bias || self.output_bias {
            output.bias = Some(Initializer::Zeros.init([self.d_model], device));
        }
        let value_bias = self
            .value_output_bias
            .then(|| Initializer::Zeros.init([hk * dh], device));
        let table = self.positions.table_len();
        let kind = self.positions.kind;
        let init = &self.initializer;
        let scheme = match kind {
            PositionKind::Xl => PositionParams::Xl(XlPositionParams {
                r_net: linear(self.d_model, inner),
                biases: self.own_biases.then(|| XlBiases::init(h, dh, init, device)),
            }),
            PositionKind::Learned => {
                // Without the biases (`learned_biases = false`) they stay at zero.
                let bias = match self.positions.learned_biases {
                    true => init,
                    false => &Initializer::Zeros,
                };
                PositionParams::Learned(LearnedPositionParams {
                    embedding: init.init([table, h, dh], device),
                    query_bias: bias.init([h, dh], device),
                    key_bias: bias.init([table, h], device),
                })
            }
            PositionKind::T5 => PositionParams::T5(T5PositionParams {
                bias: init.init([table, h], device),
            }),
            PositionKind::Absolute => PositionParams::Absolute(AbsolutePositionParams { heads: h }),
            PositionKind::Rotary => PositionParams::Rotary(AbsolutePositionParams { heads: h }),
        };
        let peer = (self.null_key_value || self.value_gate).then(|| PeerAttentionParams {
            null_kv: self.null_key_value.then(|| init.init([2, h, dh], device)),
            value_gate: self.value_gate.then(|| linear(self.d_model, h)),
        });
        Ok(RelativeMultiHeadAttention {
            query: linear(self.d_model, inner),
            key_value: linear(self.d_model, 2 * hk * dh),
            output,
            value_bias,
            scheme,
            peer,
            qk_norm: self.qk_norm.map(|scale| QkNorm::new(dh, scale, device)),
            dropout: DropoutConfig::new(self.dropout).init(),
            dropatt: DropoutConfig::new(self.dropatt).init(),
            positions: self.positions.clone(),
            n_heads: h,
            d_head: dh,
            d_model: self.d_model,
            n_kv_heads: hk,
            memory_gradients: self.memory_gradients,
            memory_keys_values: self.memory_keys_values,
            recompute_probabilities: self.recompute_probabilities,
            dropout_seed: None,
            position_table: None,
        })
    }
}

impl RelativeMultiHeadAttention {
    /// Attention of the segment `x` over `cat(memory, x)`.
    ///
    /// `shared` supplies XL's `u`/`v` when the layer does not own them.
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`
    /// - `memory`: `[batch, mlen, d_model]` with `mlen = ctx.mlen`
    /// - output: `[batch, qlen, d_model]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<3>, RelativeError> {
        let [batch, qlen, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        // A value gate reads the input of every key: the memory's (its inputs) and the
        // segment's.
        let gate_input = match &memory {
            Some(m) if self.has_value_gate() && !self.memory_keys_values => {
                Tensor::cat(vec![m.clone(), x.clone()], 1)
            }
            _ => x.clone(),
        };
        let (q, k, v) = self.project(x, memory, ctx)?;
        if let Some(tap) = &ctx.projection_tap {
            tap.set((q.clone(), k.clone(), v.clone()));
        }
        let v = self.mix_values(gate_input, v, ctx)?;
        // [batch, len, heads, d_head] -> [batch, heads, len, d_head]; fused where it applies.
        let [q, k, v] = [q, k, v].map(|t| t.swap_dims(1, 2));
        let null_kv = self.peer.as_ref().and_then(|p| p.null_kv.as_ref());
        let context = match null_kv {
            Some(null) => self.attend_null(q, k, v, null.val(), ctx, shared)?,
            None => self.attend(q, k, v, ctx, shared)?,
        };
        let context = context.swap_dims(1, 2).reshape([batch, qlen, h * dh]);
        Ok(self.project_output(context))
    }

    /// Whether the layer mixes the first layer's values into its own
    /// ([`RelativeAttentionConfig::value_gate`]).
    pub fn has_value_gate(&self) -> bool {
        self.peer.as_ref().is_some_and(|p| p.value_gate.is_some())
    }

    /// Value residual learning ([`RelativeAttentionConfig::value_gate`]): the first layer of
    /// a context with a [`ValueResidual`] stores its values `v_1`; a layer with a gate returns
    /// `v + σ(W_g x)_h (v_1 − v)`. Without a value residual in the context, `v` unchanged
    /// (a gate then is an error).
    ///
    /// # Shapes
    /// - `x`: the inputs of the keys (a memory's, then the segment's), `[batch, len,
    ///   d_model]`; `v`: `[batch, len, heads, d_head]` → as `v`
    fn mix_values(
        &self,
        x: Tensor<3>,
        v: Tensor<4>,
        ctx: &RelativeContext,
    ) -> Result<Tensor<4>, RelativeError> {
        let gate = self.peer.as_ref().and_then(|p| p.value_gate.as_ref());
        let Some(slot) = &ctx.value_residual else {
            return match gate {
                Some(_) => Err(RelativeError::Input(
                    "a layer with a value gate reads a context without a value residual \
                     (RelativeContext::with_value_residual)"
                        .into(),
                )),
                None => Ok(v),
            };
        };
        let mut first = slot
            .0
            .lock()
            .map_err(|_| RelativeError::Input("the value residual's lock is poisoned".into()))?;
        match (gate, first.as_ref()) {
            (None, None) => {
                *first = Some(v.clone());
                Ok(v)
            }
            (None, Some(_)) => Ok(v),
            (Some(_), None) => Err(RelativeError::Input(
                "a layer with a value gate runs before any layer stored its values (the \
                 first layer has no gate)"
                    .into(),
            )),
            (Some(gate), Some(v1)) => {
                if v1.dims() != v.dims() {
                    return Err(RelativeError::Input(format!(
                        "the first layer's values are {:?}, this layer's {:?}",
                        v1.dims(),
                        v.dims()
                    )));
                }
                let [b, len, h, _] = v.dims();
                if x.dims()[1] != len {
                    return Err(RelativeError::Input(format!(
                        "a value gate reads the inputs of {} keys, the values are of {len} \
                         (a memory of cached keys and values has no inputs to gate)",
                        x.dims()[1]
                    )));
                }
                let g = sigmoid(linear_rows(gate, x)).reshape([b, len, h, 1]);
                Ok(v.clone() + g * (v1.clone() - v))
            }
        }
    }

    /// The scores of the null key, `s q·k_null`.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`, `null`: `[2, heads, d_head]` → `[batch, heads, qlen, 1]`
    pub(crate) fn null_scores(q: Tensor<4>, null: Tensor<3>) -> Tensor<4> {
        let [_, h, _, dh] = q.dims();
        let nk = null.narrow(0, 0, 1).reshape([1, h, 1, dh]);
        let scale = 1.0 / (dh as f32).sqrt();
        (q.mul_scalar(scale) * nk).sum_dim(3)
    }

    /// [`attend`](Self::attend) with a null key and value (`[2, heads, d_head]`) prepended,
    /// visible to every query: `softmax(s q·k_null ∘ mask(scores)) [v_null ∘ v]`.
    ///
    /// # Shapes
    /// As [`attend`](Self::attend); `null`: `[2, heads, d_head]`.
    pub fn attend_null(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        null: Tensor<3>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        if self.fused_null_applies(&q, ctx) {
            return self.attend_null_fused(q, k, v, null, ctx);
        }
        self.attend_null_tensor_ops(q, k, v, null, ctx, shared)
    }

    /// [`attend_null`](Self::attend_null) as tensor ops (every backend and scheme; the
    /// reference of its fused path).
    ///
    /// # Shapes
    /// As [`attend_null`](Self::attend_null).
    pub fn attend_null_tensor_ops(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        null: Tensor<3>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        let [b, h, _, dh] = q.dims();
        let nv = null.clone().narrow(0, 1, 1).reshape([1, h, 1, dh]);
        let null_scores = Self::null_scores(q.clone(), null);
        let scores = ctx.mask_scores(self.scores(q, k, ctx, shared)?);
        let probs = self.drop_probs(softmax(Tensor::cat(vec![null_scores, scores], 3), 3));
        let v = Tensor::cat(vec![nv.expand([b, h, 1, dh]), v], 2);
        Ok(probs.matmul(v))
    }

    /// The per-head queries of `x` and keys and values of `cat(memory, x)`, checked against
    /// the context.
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
    /// - `q`: `[batch, qlen, heads, d_head]`; `k`, `v`: `[batch, mlen + qlen, heads, d_head]`
    #[allow(clippy::type_complexity)]
    pub fn project(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>), RelativeError> {
        let [batch, qlen, d_model] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        if d_model != self.d_model {
            return Err(RelativeError::Input(format!(
                "x has width {d_model}, the layer expects {}",
                self.d_model
            )));
        }
        let held = ctx.memory_holds_segment && self.memory_keys_values;
        let given = memory.as_ref().map_or(0, |m| m.dims()[1]);
        let mlen = match held {
            true => given.checked_sub(qlen).ok_or_else(|| {
                RelativeError::Input(format!(
                    "the memory should end with the segment's {qlen} entries, it holds {given}"
                ))
            })?,
            false => given,
        };
        if qlen != ctx.qlen || mlen != ctx.mlen {
            return Err(RelativeError::Input(format!(
                "context built for qlen {} / mlen {}, got qlen {qlen} / mlen {mlen}",
                ctx.qlen, ctx.mlen
            )));
        }
        let (k, v) = match memory {
            // The cache already ends with the segment's entries (the caller appended them).
            Some(m) if held => self.cached_keys_values(m),
            // Keys/values cached by an earlier segment (`memory_keys_values`).
            // The segment's entries appended to the cache's, then split: one contiguous
            // copy of the memory (splitting the cache first would make `cat` copy each
            // strided half element by element).
            Some(m) if self.memory_keys_values => {
                let entries = Tensor::cat(vec![m, self.cache_entry_in_graph(x.clone())], 1);
                self.cached_keys_values(entries)
            }
            // Cached inputs projected with constant parameters (`memory_gradients = false`).
            Some(m) if !self.memory_gradients => {
                let (km, vm) = self.keys_values_with(m, true);
                let (kx, vx) = self.keys_values(x.clone());
                (Tensor::cat(vec![km, kx], 1), Tensor::cat(vec![vm, vx], 1))
            }
            Some(m) => self.keys_values(Tensor::cat(vec![m, x.clone()], 1)),
            None => self.keys_values(x.clone()),
        };
        let q = linear_rows(&self.query, x).reshape([batch, qlen, h, dh]);
        Ok((q, k, v))
    }

    /// The same layer reading its memory as cached keys and values
    /// ([`cache_entry`](Self::cache_entry)) when `on`, as layer inputs to project otherwise:
    /// the two compute the same outputs from the same history (the cache holds what the
    /// projection would compute again), so a trained layer can generate from a cache.
    pub fn with_memory_keys_values(mut self, on: bool) -> Self {
        self.memory_keys_values = on;
        self
    }

    /// The same layer with [`recompute_probabilities`](RelativeAttentionConfig::recompute_probabilities)
    /// set to `on`: the fused kernel's backward computes the probabilities again instead of
    /// keeping them (the same outputs and gradients).
    pub fn with_recompute_probabilities(mut self, on: bool) -> Self {
        self.recompute_probabilities = on;
        self
    }

    /// The same layer holding `W_R R_d` for every distance `d` in `-1 ..= max_distance`
    /// (`clamp_len` applied), computed once with the current `W_R`, detached, for contexts of
    /// [`PositionIndex::XlRows`] ([`RelativeContext::with_table_rows`]). In generation one
    /// token at a time over a memory of `m` positions, projecting the sinusoids of the
    /// `m + 2` columns is `2 d_model h d_head` FLOPs per position and layer in every pass;
    /// the table reads them. For inference: `W_R` gets no gradient through the table. Layers
    /// of another scheme are returned unchanged.
    pub fn with_position_table(mut self, max_distance: usize) -> Self {
        let PositionParams::Xl(p) = &self.scheme else {
            return self;
        };
        let device = p.r_net.weight.device();
        let mut data = Vec::with_capacity((max_distance + 2) * self.d_model);
        // Row `max_distance - d`: the farthest distance first, as a pass's columns run
        // (`distance_of_column`), so a pass reads a range of rows.
        for d in (-1..=max_distance as i64).rev() {
            sinusoid(self.positions.clamped(d), self.d_model, &mut data);
        }
        let r = Tensor::<2>::from_data(
            TensorData::new(data, [max_distance + 2, self.d_model]),
            &device,
        );
        self.position_table = Some(Box::new(p.r_net.forward(r).detach()));
        self
    }

    /// XL's `W_R R` of the context's columns, `[W, n_heads, d_head]`: the sinusoids
    /// projected by `W_R`, or read from [`position_table`](Self::position_table).
    pub(crate) fn projected_positions(
        &self,
        p: &XlPositionParams,
        index: &PositionIndex,
    ) -> Result<Tensor<3>, RelativeError> {
        match index {
            PositionIndex::Xl(sinusoid) => {
                let w = sinusoid.dims()[0];
                Ok(p.r_net
                    .forward(sinusoid.clone())
                    .reshape([w, self.n_heads, self.d_head]))
            }
            PositionIndex::XlRows { first, len } => self.table_rows(*first, *len),
            other => Err(RelativeError::Input(format!(
                "XL positions from a {:?} context",
                other.kind()
            ))),
        }
    }

    /// `W_R R` of the context's columns read from [`position_table`](Self::position_table):
    /// the rows `first .. first + len` (a view, no copy).
    ///
    /// # Shapes
    /// → `[len, n_heads, d_head]`
    fn table_rows(&self, first: usize, len: usize) -> Result<Tensor<3>, RelativeError> {
        let table = self.position_table.as_ref().ok_or_else(|| {
            RelativeError::Input(
                "the context reads XL positions from a table this layer does not hold \
                 (RelativeMultiHeadAttention::with_position_table)"
                    .into(),
            )
        })?;
        let rows = table.dims()[0];
        if first + len > rows {
            return Err(RelativeError::Input(format!(
                "the context reads position-table rows {first}..{} of a table of {rows}: the \
                 table was built for shorter passes",
                first + len
            )));
        }
        Ok(table
            .as_ref()
            .clone()
            .narrow(0, first, len)
            .reshape([len, self.n_heads, self.d_head]))
    }

    /// The per-head keys `W_k h_j` and values `W_v h_j (+ b_v)` of the inputs `h` (key/value
    /// heads shared by their query heads, see [`share_kv_heads`](Self::share_kv_heads)).
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `k`, `v`: `[batch, len, n_heads, d_head]`
    pub fn keys_values(&self, h: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        self.keys_values_with(h, false)
    }

    /// What a key/value memory caches for inputs `h` (`memory_keys_values`): the keys and
    /// values of the `n_kv_heads` heads, concatenated, detached.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 n_kv_heads d_head]`
    pub fn cache_entry(&self, h: Tensor<3>) -> Tensor<3> {
        let (k, v) = self.kv_heads_of(h, true);
        Self::pack_entry(k, v)
    }

    /// [`cache_entry`](Self::cache_entry) in the graph: the gradient of what reads the entry
    /// reaches `h` and the projections (a Block-Recurrent stack's memory within an unroll,
    /// as block-recurrent-transformer-pytorch keeps its memories within one forward).
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 n_kv_heads d_head]`
    pub fn cache_entry_in_graph(&self, h: Tensor<3>) -> Tensor<3> {
        let (k, v) = self.kv_heads_of(h, false);
        let [b, len, hk, dh] = k.dims();
        Tensor::cat(
            vec![k.reshape([b, len, hk * dh]), v.reshape([b, len, hk * dh])],
            2,
        )
    }

    /// `[k; v]` of `[batch, len, n_kv_heads, d_head]` each as one cache entry, detached.
    pub fn pack_entry(k: Tensor<4>, v: Tensor<4>) -> Tensor<3> {
        let [b, len, hk, dh] = k.dims();
        Tensor::cat(
            vec![k.reshape([b, len, hk * dh]), v.reshape([b, len, hk * dh])],
            2,
        )
        .detach()
    }

    /// The per-head keys and values of cached entries ([`cache_entry`](Self::cache_entry)).
    ///
    /// # Shapes
    /// - `m`: `[batch, mlen, 2 n_kv_heads d_head]` → `[batch, mlen, n_heads, d_head]` each
    pub fn cached_keys_values(&self, m: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = self.cached_kv_heads(m);
        (self.share_kv_heads(k), self.share_kv_heads(v))
    }

    /// The keys and values of the `n_kv_heads` heads in cached entries (not yet shared by
    /// the query heads).
    ///
    /// # Shapes
    /// - `m`: `[batch, mlen, 2 n_kv_heads d_head]` → `[batch, mlen, n_kv_heads, d_head]` each
    pub fn cached_kv_heads(&self, m: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let [b, len, _] = m.dims();
        let (hk, dh) = (self.n_kv_heads, self.d_head);
        // Heads first, then the halves: strided views of the cache (a reshape after the
        // narrow would copy each half, the whole memory, in every pass).
        let kv = m.reshape([b, len, 2 * hk, dh]);
        (kv.clone().narrow(2, 0, hk), kv.narrow(2, hk, hk))
    }

    /// The keys `W_k h_j` and values `W_v h_j (+ b_v)` of the `n_kv_heads` heads (not yet
    /// shared by the query heads), with the parameters as constants.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, n_kv_heads, d_head]` each
    pub fn kv_heads_constant(&self, h: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        self.kv_heads_of(h, true)
    }

    /// [`keys_values`](Self::keys_values), with the parameters as constants when `constant`.
    fn keys_values_with(&self, h: Tensor<3>, constant: bool) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = self.kv_heads_of(h, constant);
        (self.share_kv_heads(k), self.share_kv_heads(v))
    }

    /// Keys and values of the `n_kv_heads` heads (not yet shared by the query heads).
    fn kv_heads_of(&self, h: Tensor<3>, constant: bool) -> (Tensor<4>, Tensor<4>) {
        let [batch, len, d_model] = h.dims();
        let (hk, dh) = (self.n_kv_heads, self.d_head);
        let w = self.key_value.weight.val();
        let w = if constant { w.detach() } else { w };
        // On `[batch * len, d_model]` rows: one weight-gradient product (see `linear_rows`).
        let rows = memzoo_fused::linear(h.reshape([batch * len, d_model]), w, None);
        // `[W_k | W_v]`'s columns as 2 hk heads, the keys' first: each half is a strided view
        // of the product (a reshape after the narrow would copy it), which the fused
        // attention reads in place.
        let kv = rows.reshape([batch, len, 2 * hk, dh]);
        let k = kv.clone().narrow(2, 0, hk);
        let v = kv.narrow(2, hk, hk);
        // v_j = W_v h_j (+ b_v)
        let v = match &self.value_bias {
            Some(b) => {
                let b = b.val();
                let b = if constant { b.detach() } else { b };
                v + b.reshape([1, 1, hk, dh])
            }
            None => v,
        };
        (k, v)
    }

    /// Keys or values of `n_kv_heads` heads repeated for the `n_heads` query heads (each
    /// key/value head serves `n_heads / n_kv_heads` consecutive query heads); the identity
    /// without multi-query / grouped attention. The gradient of a shared head is the sum over
    /// the query heads it serves.
    ///
    /// # Shapes
    /// - `t`: `[batch, len, n_kv_heads, d_head]` → `[batch, len, n_heads, d_head]`
    pub fn share_kv_heads(&self, t: Tensor<4>) -> Tensor<4> {
        let (h, hk) = (self.n_heads, self.n_kv_heads);
        if hk == h {
            return t;
        }
        let [b, len, _, dh] = t.dims();
        t.reshape([b, len, hk, 1, dh])
            .expand([b, len, hk, h / hk, dh])
            .reshape([b, len, h, dh])
    }

    /// The inverse of [`share_kv_heads`](Self::share_kv_heads) on a tensor it produced (or a
    /// per-position function of one): the first query head of every group; the identity
    /// without multi-query / grouped attention.
    ///
    /// # Shapes
    /// - `t`: `[batch, len, n_heads, d_head]` → `[batch, len, n_kv_heads, d_head]`
    pub fn unshare_kv_heads(&self, t: Tensor<4>) -> Tensor<4> {
        let (h, hk) = (self.n_heads, self.n_kv_heads);
        if hk == h {
            return t;
        }
        let [b, len, _, dh] = t.dims();
        t.reshape([b, len, hk, h / hk, dh])
            .narrow(3, 0, 1)
            .reshape([b, len, hk, dh])
    }

    /// `Dropout(W_o c (+ b_o))` of the heads' concatenated context `c`, `[batch, qlen, heads * d_head]`.
    pub fn project_output(&self, context: Tensor<3>) -> Tensor<3> {
        self.drop(
            &self.dropout,
            linear_rows(&self.output, context),
            TAG_DROP_OUTPUT,
        )
    }

    /// Dropout on attention probabilities ("dropatt").
    pub fn drop_probs<const D: usize>(&self, probs: Tensor<D>) -> Tensor<D> {
        self.drop(&self.dropatt, probs, TAG_DROP_PROBS)
    }

    /// The same attention drawing its dropout masks from `seed` (`None`: from the device's
    /// generator); see [`dropout_seed`](Self::dropout_seed). A training pass that must replay
    /// (a resumed run, replicas on threads) gives each layer and pass a seed of its own.
    pub fn with_dropout_seed(mut self, seed: Option<u64>) -> Self {
        self.dropout_seed = seed;
        self
    }

    /// Whether the attention drops anything in training (output or probabilities).
    pub fn has_dropout(&self) -> bool {
        self.dropout.prob > 0.0 || self.dropatt.prob > 0.0
    }

    /// `dropout` applied to `x`: Burn's, or, with a [`dropout_seed`](Self::dropout_seed), an
    /// inverted-dropout mask drawn from `mix(seed, tag)` (active where Burn's is: a training
    /// layer on an autodiff device).
    fn drop<const D: usize>(&self, dropout: &Dropout, x: Tensor<D>, tag: u64) -> Tensor<D> {
        let Some(seed) = self.dropout_seed else {
            return dropout.forward(x);
        };
        if !dropout.training.is_enabled() || !x.device().is_autodiff() {
            return x;
        }
        match dropout_mask(x.dims(), dropout.prob, mix(seed, tag), &x.device()) {
            Some(mask) => x * mask,
            None => x,
        }
    }

    /// The T5 bias table this layer reads, `bias_scale · β` (`[table_len, heads]`): the
    /// context's shared table if it carries one (`shared_t5`), else the layer's own `own`.
    /// memorizing-transformers-pytorch scales its bias by `sqrt(d_head)` (`bias_scale`).
    pub(crate) fn t5_table(
        &self,
        own: &Param<Tensor<2>>,
        ctx: &RelativeContext,
    ) -> Result<Tensor<2>, RelativeError> {
        let table = match &ctx.t5_table {
            Some(t) if t.dims() != own.dims() => {
                return Err(RelativeError::Input(format!(
                    "the context's shared T5 table is {:?}, the layer's {:?}",
                    t.dims(),
                    own.dims()
                )));
            }
            Some(t) => t.clone(),
            None => own.val(),
        };
        let s = self.positions.bias_scale;
        Ok(if s == 1.0 { table } else { table.mul_scalar(s) })
    }

    /// The queries and keys whose product is the whole score where positions are absolute
    /// or rotary (no position term): `(s q', k')` with `scores = s q'·k'ᵀ`.
    ///
    /// - absolute: Vaswani et al. (2017), eq. 1, `q·k / sqrt(d_head)`; with qk-RMSNorm
    ///   `s q̂·k̂` (`s` its scale);
    /// - rotary: `s rot(q̂_i, i + mlen)·rot(k̂_j, j)` ([`crate::rotary`]), `q̂`, `k̂` normalised
    ///   with qk-RMSNorm (`s` its scale), else `q`, `k` (`s = 1/sqrt(d_head)`).
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`; `k`: `[batch, heads, klen, d_head]`; the same out
    pub fn content_operands(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
    ) -> Result<(Tensor<4>, Tensor<4>), RelativeError> {
        let dh = q.dims()[3];
        let klen = k.dims()[2];
        let (q, k, s) = match &self.qk_norm {
            Some(norm) => {
                let (q, k) = norm.normalise(q, k);
                (q, k, norm.scale)
            }
            None => (q, k, 1.0 / (dh as f64).sqrt()),
        };
        match self.scheme {
            PositionParams::Absolute(_) => Ok((q.mul_scalar(s), k)),
            PositionParams::Rotary(_) => {
                let p = &self.positions;
                let spec = RotarySpec {
                    d_head: dh,
                    klen,
                    width: p.rotary_width,
                    theta: p.rotary_theta,
                    xpos: p.xpos_scale_base,
                    query_scale: s,
                };
                Ok(RotaryTables::new(spec, &q.device()).apply(q, k))
            }
            _ => Err(RelativeError::Input(format!(
                "{:?} positions add a position term to the scores",
                self.positions.kind
            ))),
        }
    }

    /// Pre-softmax scores `[batch, heads, qlen, klen]` (see the type docs for the formulas).
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`, `k`: `[batch, heads, klen, d_head]`
    pub fn scores(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Result<Tensor<4>, RelativeError> {
        let [_, h, qlen, dh] = q.dims();
        let klen = k.dims()[2];
        let scale = 1.0 / (dh as f32).sqrt();
        let per_head = |p: &Param<Tensor<2>>| p.val().reshape([1, h, 1, dh]);
        let kt = k.clone().transpose();
        let mismatch = || {
            RelativeError::Input(format!(
                "the context was built for {:?} positions, the layer uses {:?}",
                ctx.index.kind(),
                self.positions.kind
            ))
        };
        match (&self.scheme, &ctx.index) {
            (
                PositionParams::Xl(p),
                index @ (PositionIndex::Xl(_) | PositionIndex::XlRows { .. }),
            ) => {
                let biases = p.biases_or(shared)?;
                // W_R R: [W, h, dh] -> [1, h, dh, W]
                let r = self
                    .projected_positions(p, index)?
                    .permute([1, 2, 0])
                    .unsqueeze_dim::<4>(0);
                // (a) + (c): (q + u)·k ;  (b) + (d): (q + v)·W_R R, re-indexed by key.
                let ac = (q.clone() + per_head(&biases.content))
                    .mul_scalar(scale)
                    .matmul(kt);
                let bd = (q + per_head(&biases.position)).mul_scalar(scale).matmul(r);
                Ok(ac + relative_shift(bd, klen))
            }
            (PositionParams::Learned(p), PositionIndex::Learned(idx)) => {
                let w = idx.dims()[0];
                // E_d per column: [W, h, dh] -> [1, h, dh, W]; b_k,d: [W, h] -> [1, h, 1, W]
                let e = p
                    .embedding
                    .val()
                    .select(0, idx.clone())
                    .permute([1, 2, 0])
                    .unsqueeze_dim::<4>(0);
                if !self.positions.learned_biases {
                    // q_i·k_j + q_i·E_d (compressive-transformer-pytorch's scores).
                    let ac = q.clone().mul_scalar(scale).matmul(kt);
                    let bd = q.mul_scalar(scale).matmul(e);
                    return Ok(ac + relative_shift(bd, klen));
                }
                let bk = p
                    .key_bias
                    .val()
                    .select(0, idx.clone())
                    .transpose()
                    .reshape([1, h, 1, w]);
                let ac = (q.clone() + per_head(&p.query_bias))
                    .mul_scalar(scale)
                    .matmul(kt);
                let bd = q.mul_scalar(scale).matmul(e) + bk.mul_scalar(scale);
                Ok(ac + relative_shift(bd, klen))
            }
            (PositionParams::T5(p), PositionIndex::T5(idx)) => {
                // β_{bucket(i + mlen - j)} gathered per pair: [table, h] -> [h, qlen * klen]
                // -> [1, h, qlen, klen], shared by every batch row.
                let beta = self
                    .t5_table(&p.bias, ctx)?
                    .transpose()
                    .select(1, idx.clone())
                    .reshape([1, h, qlen, klen]);
                Ok(q.mul_scalar(scale).matmul(kt) + beta)
            }
            (PositionParams::Absolute(_), PositionIndex::Absolute)
            | (PositionParams::Rotary(_), PositionIndex::Rotary) => {
                let (q, k) = self.content_operands(q, k)?;
                Ok(q.matmul(k.transpose()))
            }
            _ => Err(mismatch()),
        }
    }
}

//! Relative multi-head attention with memory keys prepended.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use crate::error::RelativeError;
use crate::positions::{PositionConfig, PositionIndex, PositionKind, RelativeContext};
use crate::rows::linear_rows;
use crate::shift::relative_shift;

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
    /// Initialiser of every weight. Default: normal(0, 0.02), as Transformer-XL.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
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

/// The parameters of one position scheme ([`PositionKind`]), exactly those it uses.
#[derive(Module, Debug)]
pub enum PositionParams {
    /// Transformer-XL: sinusoids projected by `W_R`, biases `u`, `v`.
    Xl(XlPositionParams),
    /// Learned relative embeddings and biases.
    Learned(LearnedPositionParams),
    /// T5 bucketed scalar biases.
    T5(T5PositionParams),
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
/// - **T5**: `s q_i·k_j + β_bucket(d)`, one learned scalar per head and bucket.
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
    /// `[W_k; W_v]` fused: `d_model -> 2 * n_heads * d_head`.
    pub key_value: Linear,
    /// Output projection `n_heads * d_head -> d_model` (with the bias `b_o` when
    /// `value_output_bias`).
    pub output: Linear,
    /// `b_v`, `[n_heads * d_head]`, added to every value (`value_output_bias`; else `None`).
    pub value_bias: Option<Param<Tensor<1>>>,
    /// The position scheme's parameters.
    pub scheme: PositionParams,
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
}

impl RelativeAttentionConfig {
    /// Checks the configuration, naming the bad value.
    pub fn validate(&self) -> Result<(), RelativeError> {
        let bad = |msg: String| Err(RelativeError::Config(msg));
        if self.d_model == 0 || self.n_heads == 0 || self.d_head == 0 {
            return bad(format!(
                "d_model ({}), n_heads ({}) and d_head ({}) must all be positive",
                self.d_model, self.n_heads, self.d_head
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
        let mut output = linear(inner, self.d_model);
        let value_bias = self.value_output_bias.then(|| {
            output.bias = Some(Initializer::Zeros.init([self.d_model], device));
            Initializer::Zeros.init([inner], device)
        });
        let table = self.positions.table_len();
        let kind = self.positions.kind;
        let init = &self.initializer;
        let scheme = match kind {
            PositionKind::Xl => PositionParams::Xl(XlPositionParams {
                r_net: linear(self.d_model, inner),
                biases: self.own_biases.then(|| XlBiases::init(h, dh, init, device)),
            }),
            PositionKind::Learned => PositionParams::Learned(LearnedPositionParams {
                embedding: init.init([table, h, dh], device),
                query_bias: init.init([h, dh], device),
                key_bias: init.init([table, h], device),
            }),
            PositionKind::T5 => PositionParams::T5(T5PositionParams {
                bias: init.init([table, h], device),
            }),
        };
        Ok(RelativeMultiHeadAttention {
            query: linear(self.d_model, inner),
            key_value: linear(self.d_model, 2 * inner),
            output,
            value_bias,
            scheme,
            dropout: DropoutConfig::new(self.dropout).init(),
            dropatt: DropoutConfig::new(self.dropatt).init(),
            positions: self.positions.clone(),
            n_heads: h,
            d_head: dh,
            d_model: self.d_model,
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
        let (q, k, v) = self.project(x, memory, ctx)?;
        // [batch, len, heads, d_head] -> [batch, heads, len, d_head]; fused where it applies.
        let [q, k, v] = [q, k, v].map(|t| t.swap_dims(1, 2));
        let context =
            self.attend(q, k, v, ctx, shared)?
                .swap_dims(1, 2)
                .reshape([batch, qlen, h * dh]);
        Ok(self.project_output(context))
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
        let mlen = memory.as_ref().map_or(0, |m| m.dims()[1]);
        if qlen != ctx.qlen || mlen != ctx.mlen {
            return Err(RelativeError::Input(format!(
                "context built for qlen {} / mlen {}, got qlen {qlen} / mlen {mlen}",
                ctx.qlen, ctx.mlen
            )));
        }
        let keys_in = match memory {
            Some(m) => Tensor::cat(vec![m, x.clone()], 1),
            None => x.clone(),
        };
        let klen = qlen + mlen;
        let q = linear_rows(&self.query, x).reshape([batch, qlen, h, dh]);
        let kv = linear_rows(&self.key_value, keys_in).reshape([batch, klen, 2, h, dh]);
        let k = kv.clone().narrow(2, 0, 1).reshape([batch, klen, h, dh]);
        let v = kv.narrow(2, 1, 1).reshape([batch, klen, h, dh]);
        // v_j = W_v h_j (+ b_v)
        let v = match &self.value_bias {
            Some(b) => v + b.val().reshape([1, 1, h, dh]),
            None => v,
        };
        Ok((q, k, v))
    }

    /// `Dropout(W_o c (+ b_o))` of the heads' concatenated context `c`, `[batch, qlen, heads * d_head]`.
    pub fn project_output(&self, context: Tensor<3>) -> Tensor<3> {
        self.dropout.forward(linear_rows(&self.output, context))
    }

    /// Dropout on attention probabilities ("dropatt").
    pub fn drop_probs<const D: usize>(&self, probs: Tensor<D>) -> Tensor<D> {
        self.dropatt.forward(probs)
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
        let kt = k.transpose();
        let mismatch = || {
            RelativeError::Input(format!(
                "the context was built for {:?} positions, the layer uses {:?}",
                ctx.index.kind(),
                self.positions.kind
            ))
        };
        match (&self.scheme, &ctx.index) {
            (PositionParams::Xl(p), PositionIndex::Xl(sinusoid)) => {
                let biases = p.biases.as_ref().or(shared).ok_or_else(|| {
                    RelativeError::Input(
                        "XL attention without its own u/v biases needs the shared ones".into(),
                    )
                })?;
                let w = sinusoid.dims()[0];
                // W_R R: [W, h*dh] -> [1, h, dh, W]
                let r = p
                    .r_net
                    .forward(sinusoid.clone())
                    .reshape([w, h, dh])
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
                let beta = p
                    .bias
                    .val()
                    .transpose()
                    .select(1, idx.clone())
                    .reshape([1, h, qlen, klen]);
                Ok(q.mul_scalar(scale).matmul(kt) + beta)
            }
            _ => Err(mismatch()),
        }
    }
}

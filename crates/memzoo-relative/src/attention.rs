//! Relative multi-head attention with memory keys prepended.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor};

use crate::error::RelativeError;
use crate::positions::{PositionConfig, PositionKind, RelativeContext};
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
    /// Output projection `n_heads * d_head -> d_model`.
    pub output: Linear,
    /// XL: `W_R`, projecting the sinusoid `R` into every head.
    pub r_net: Option<Linear>,
    /// XL (own biases): `u`, `v`.
    pub xl_biases: Option<XlBiases>,
    /// Learned: per-distance key embeddings `E`, `[2 max_distance + 1, n_heads, d_head]`.
    pub rel_embedding: Option<Param<Tensor<3>>>,
    /// Learned: query position bias `b_q`, `[n_heads, d_head]`.
    pub query_bias: Option<Param<Tensor<2>>>,
    /// Learned: per-distance key bias `b_k`; T5: per-bucket bias `β`. `[table, n_heads]`.
    pub rel_bias: Option<Param<Tensor<2>>>,
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
        let table = self.positions.table_len();
        let kind = self.positions.kind;
        Ok(RelativeMultiHeadAttention {
            query: linear(self.d_model, inner),
            key_value: linear(self.d_model, 2 * inner),
            output: linear(inner, self.d_model),
            r_net: (kind == PositionKind::Xl).then(|| linear(self.d_model, inner)),
            xl_biases: (kind == PositionKind::Xl && self.own_biases)
                .then(|| XlBiases::init(h, dh, &self.initializer, device)),
            rel_embedding: (kind == PositionKind::Learned)
                .then(|| self.initializer.init([table, h, dh], device)),
            query_bias: (kind == PositionKind::Learned)
                .then(|| self.initializer.init([h, dh], device)),
            rel_bias: (kind != PositionKind::Xl).then(|| self.initializer.init([table, h], device)),
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
    ) -> Tensor<3> {
        let [batch, qlen, _] = x.dims();
        let (h, dh) = (self.n_heads, self.d_head);
        debug_assert_eq!(qlen, ctx.qlen, "context built for another qlen");
        let keys_in = match memory {
            Some(m) => Tensor::cat(vec![m, x.clone()], 1),
            None => x.clone(),
        };
        let klen = keys_in.dims()[1];
        debug_assert_eq!(klen, ctx.klen(), "context built for another mlen");

        // [batch, len, heads, d_head] -> [batch, heads, len, d_head]
        let heads = |t: Tensor<3>, len| t.reshape([batch, len, h, dh]).swap_dims(1, 2);
        let q = heads(self.query.forward(x), qlen);
        let kv = self
            .key_value
            .forward(keys_in)
            .reshape([batch, klen, 2, h, dh]);
        let k = heads(
            kv.clone().narrow(2, 0, 1).reshape([batch, klen, h * dh]),
            klen,
        );
        let v = heads(kv.narrow(2, 1, 1).reshape([batch, klen, h * dh]), klen);
        let scores = self.scores(q, k, ctx, shared);

        let scores = match &ctx.mask {
            Some(mask) => {
                let [mb, _, _] = mask.dims();
                let mask = mask
                    .clone()
                    .reshape([mb, 1, qlen, klen])
                    .expand([batch, h, qlen, klen]);
                scores.mask_fill(mask, ctx.mask_value)
            }
            None => scores,
        };
        let probs = self.dropatt.forward(softmax(scores, 3));
        let context = probs
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([batch, qlen, h * dh]);
        self.dropout.forward(self.output.forward(context))
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
    ) -> Tensor<4> {
        let [_, h, _, dh] = q.dims();
        let klen = k.dims()[2];
        let scale = 1.0 / (dh as f32).sqrt();
        let per_head = |p: &Param<Tensor<2>>| p.val().reshape([1, h, 1, dh]);
        let kt = k.transpose();
        match self.positions.kind {
            PositionKind::Xl => {
                let biases = self
                    .xl_biases
                    .as_ref()
                    .or(shared)
                    .expect("XL attention without own biases needs shared u/v biases");
                let r_net = self.r_net.as_ref().expect("XL attention has W_R");
                let sinusoid = ctx.sinusoid.clone().expect("context has XL sinusoids");
                let w = sinusoid.dims()[0];
                // W_R R: [W, h*dh] -> [1, h, dh, W]
                let r = r_net
                    .forward(sinusoid)
                    .reshape([w, h, dh])
                    .permute([1, 2, 0])
                    .unsqueeze_dim::<4>(0);
                // (a) + (c): (q + u)·k ;  (b) + (d): (q + v)·W_R R, re-indexed by key.
                let ac = (q.clone() + per_head(&biases.content))
                    .mul_scalar(scale)
                    .matmul(kt);
                let bd = (q + per_head(&biases.position)).mul_scalar(scale).matmul(r);
                ac + relative_shift(bd, klen)
            }
            PositionKind::Learned => {
                let idx = ctx.table_index.clone().expect("context has table indices");
                let w = idx.dims()[0];
                let emb = self
                    .rel_embedding
                    .as_ref()
                    .expect("learned embeddings")
                    .val();
                let bias = self.rel_bias.as_ref().expect("learned key bias").val();
                let qb = self.query_bias.as_ref().expect("learned query bias");
                // E_d per column: [W, h, dh] -> [1, h, dh, W]; b_k,d: [W, h] -> [1, h, 1, W]
                let e = emb
                    .select(0, idx.clone())
                    .permute([1, 2, 0])
                    .unsqueeze_dim::<4>(0);
                let bk = bias.select(0, idx).transpose().reshape([1, h, 1, w]);
                let ac = (q.clone() + per_head(qb)).mul_scalar(scale).matmul(kt);
                let bd = q.mul_scalar(scale).matmul(e) + bk.mul_scalar(scale);
                ac + relative_shift(bd, klen)
            }
            PositionKind::T5 => {
                let idx = ctx.pair_index.clone().expect("context has pair indices");
                let qlen = q.dims()[2];
                let bias = self.rel_bias.as_ref().expect("T5 bias table").val();
                // β_{bucket(i + mlen - j)} gathered per pair: [table, h] -> [h, qlen * klen]
                // -> [1, h, qlen, klen], shared by every batch row.
                let beta = bias.transpose().select(1, idx).reshape([1, h, qlen, klen]);
                q.mul_scalar(scale).matmul(kt) + beta
            }
        }
    }
}

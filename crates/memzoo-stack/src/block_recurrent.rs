//! The Block-Recurrent Transformer (Hutchins, Schlag, Wu, Dyer & Neyshabur 2022, arXiv
//! 2203.07852) as an option of the layer stack
//! ([`XlConfig::block_recurrent`](crate::XlConfig::block_recurrent)): one layer of the stack
//! (`layer`) is a recurrent layer that carries a state of `S` vectors from one block to the
//! next. A block is one segment of the stack (the trainer's `tgt_len`, the paper's window `W`);
//! the XL memory of `mem_len = W` positions is the paper's sliding window over the previous
//! block, and `bptt_segments` blocks with the state in the graph are the paper's segment
//! (4096 tokens = 8 blocks of 512).
//!
//! Per block `τ`, with `x` the recurrent layer's input as its attention reads it (`LN(h)` in a
//! pre-LN block, `h` in a post-LN one) and `c_τ` the state (`[batch, S, d_model]`; paper sec.
//! 3, fig. 1):
//!
//! - `ĉ = LN_s(c_τ) + P`: the normalised state plus the learned state IDs `P` (`[S, d_model]`;
//!   the state has no positions otherwise);
//! - keys and values are shared by the two directions: the tokens' `K_x = W_k x`, `V_x = W_v x`
//!   are the layer's own (its relative attention's projections), the state's
//!   `K_c, V_c = W^c_kv ĉ`;
//! - **vertical** (tokens): `o = W_o [Attn_rel(Q_x, [K_mem; K_x], [V_mem; V_x]) ; Attn(W_qx x,
//!   K_c, V_c)]`: the layer's causal self-attention over the block (and the XL memory, with the
//!   stack's positions) and a cross-attention to the state (no mask, no positions), projected
//!   together (here `W_o [a ; b] = W_o^self a + W_o^cross b`: the relative attention's own
//!   output projection plus `to_state_output`); the rest of the layer (residual, LayerNorms,
//!   feed-forward) is the stack's block;
//! - **horizontal** (state): `h_c = W^c_o [Attn(W_qc ĉ, K_c, V_c) ; Attn(W_qcx ĉ, K_x, V_x)]`: the
//!   state attends to itself and cross-attends to every token of the block (no mask);
//! - the residual connections of the state are gates (sec. 3.2), `c' = gate_1(c_τ, h_c)`, then
//!   with `state_ff` `c_{τ+1} = gate_2(c', MLP(LN(c')))`, else `c_{τ+1} = c'`:
//!   - **fixed** gate: `z = W_z h + b_z`, `g = σ(b_g)`, `c_new = c ⊙ g + z ⊙ (1 − g)`;
//!   - **LSTM** gate: `z = tanh(W_z h + b_z)`, `i = σ(W_i h + b_i − 1)`, `f = σ(W_f h + b_f +
//!     1)`, `c_new = c ⊙ f + z ⊙ i`.
//!
//! `Attn(Q, K, V) = softmax(Q Kᵀ / sqrt(d_head)) V` per head, with the stack's heads and head
//! width. The first block (and, with `document_resets`, a row that starts a document) reads the
//! learned initial state `c_0` (`[S, d_model]`). The state stays in the graph for
//! `bptt_segments` blocks (the trainer's unrolled step, as the RMT's), then is detached.
//!
//! kNN layers (the Memorizing Transformer's) combine with it, the recurrent one included (its
//! local attention's keys and values are the ones the state reads).
//!
//! Dropout: what the tokens read from the state is dropped at the stack's `dropout` as the
//! self-attention's output is (with it by the block in a seeded stack; on its own in a device
//! stack, whose relative attention drops its own output); the state's update has no dropout.
//!
//! **Peer** (lucidrains' `block-recurrent-transformer-pytorch` 0.4.4): its `StateContainer` is
//! this state with `kv_heads = 1`, `state_ff = false` and the fixed gate (its learned EMA, `b_g
//! = −β`), checked at 1e-4 (`tests/block_recurrent.rs`); its whole model is this stack with
//! `rotary` layers, `qk_norm`, a key/value XL memory, GEGLU, bias-free LayerNorms and
//! `read_layer` (`memzoo import --from lucidrains-block-recurrent`, `docs/import.md`).
//!
//! With `compat.memory_keys_values`, the XL memory (the blocks' keys and values) stays in the
//! graph for the `bptt_segments` blocks as the state does, and is detached with it.
//!
//! The gates follow the paper's equations (sec. 3.2); `state_ff = false` is its `:skip`
//! configurations, and the fan-in initialisation of the state's projections
//! ([`BlockRecurrentConfig::init`]) the scaling of the authors' code.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, LayerNorm, Linear};
use burn::tensor::activation::{sigmoid, tanh};
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_fused::softmax::softmax;
use memzoo_reformer::ForwardOptions;
use memzoo_relative::{QkNorm, linear_rows};
use serde::{Deserialize, Serialize};

use crate::error::XlError;
use crate::memory::{Carried, XlState};
use crate::stack::{
    Activation, LayerAttention, LayerContext, LayerKind, Replay, Residual, TAG_DROP_STATE_READ,
    Trace, TransformerXl, XlConfig, XlLayer, seeded_dropout,
};

/// The gate that replaces the state's residual connections (Hutchins et al. 2022, sec. 3.2).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum GateKind {
    /// `c_new = c ⊙ σ(b_g) + (W_z h + b_z) ⊙ (1 − σ(b_g))`: a learned per-channel moving
    /// average (the paper's best configurations).
    #[default]
    Fixed,
    /// `c_new = c ⊙ σ(W_f h + b_f + 1) + tanh(W_z h + b_z) ⊙ σ(W_i h + b_i − 1)`.
    Lstm,
}

/// Settings of the Block-Recurrent Transformer
/// ([`XlConfig::block_recurrent`](crate::XlConfig::block_recurrent)); the block is the stack's
/// segment, the sliding window its XL memory (`mem_len`). TOML: `[model.block_recurrent]`.
#[derive(Config, Debug)]
pub struct BlockRecurrentConfig {
    /// State vectors `S` carried from block to block. Default: 512 (the paper's).
    #[config(default = 512)]
    pub state_len: usize,
    /// Index (from 0, bottom) of the recurrent layer; it must be below `n_layers`. Default: 0
    /// (the paper's 12-layer models put it at index 9, the 10th layer; the presets set it).
    #[config(default = 0)]
    pub layer: usize,
    /// The gate of the state's residual connections. Default: fixed.
    #[config(default = "GateKind::Fixed")]
    pub gate: GateKind,
    /// The state's feed-forward (`MLP(LN(c))`, `d_inner` wide, the stack's activation) and its
    /// second gate (the paper's `:dual` configurations); false: the state's update is the
    /// attention and its gate alone (the paper's `:skip` configurations, its best, and the
    /// peer's). Default: false.
    #[config(default = false)]
    pub state_ff: bool,
    /// Blocks one training step unrolls with the state in the graph (backpropagation through
    /// time over `k` blocks, then the state is detached); 1: detached after every block, and
    /// the update of the state gets no gradient. Default: 2.
    #[config(default = 2)]
    pub bptt_segments: usize,
    /// Memory-replay backpropagation through the `bptt_segments` blocks (as the RMT's
    /// [`memory_replay`](crate::RmtConfig::memory_replay)): the same gradients in the memory
    /// of one block. Default: false.
    #[config(default = false)]
    pub memory_replay: bool,
    /// Index (from 0) of the layer whose tokens read the state (the vertical
    /// cross-attention), at or below the recurrent `layer`, which writes it from its own keys
    /// and values (block-recurrent-transformer-pytorch's `read_recurrent_layers`): the state
    /// a block reads is still `c_τ`, read before it is written. `None`: `layer` (the paper's).
    /// Default: none.
    #[config(default = "None")]
    pub read_layer: Option<usize>,
    /// Standard deviation of `c_0`'s normal initialiser (the peer's 0.1). Default: 1.
    #[config(default = 1.0)]
    pub initial_std: f64,
}

/// One gate of the state (see [`GateKind`]); `h` is the update, `c` the state it replaces.
///
/// # Shapes
/// - `c`, `h`: `[batch, S, d_model]` → `[batch, S, d_model]`
#[derive(Module, Debug)]
pub struct StateGate {
    /// `W_z`, `b_z`.
    pub candidate: Linear,
    /// The fixed gate's `b_g` (`[d_model]`).
    pub bias: Option<Param<Tensor<1>>>,
    /// The LSTM gate's `W_i`, `b_i`.
    pub input: Option<Linear>,
    /// The LSTM gate's `W_f`, `b_f`.
    pub forget: Option<Linear>,
}

/// The state's feed-forward and its gate: `c_new = gate(c, W_2 act(W_1 LN(c)))`.
#[derive(Module, Debug)]
pub struct StateFeedForward {
    /// The LayerNorm before it.
    pub norm: LayerNorm,
    /// `d_model → d_inner`.
    pub ff_in: Linear,
    /// `d_inner → d_model`.
    pub ff_out: Linear,
    /// The second gate.
    pub gate: StateGate,
    /// The stack's activation.
    #[module(skip)]
    pub activation: Activation,
}

/// The parameters of the recurrent layer's state (the layer's own attention and block are the
/// stack's layer at `config.layer`).
///
/// # Shapes
/// - `initial`, `state_ids`: `[S, d_model]`; query projections `d_model → heads d_head`;
///   `state_key_value`: `d_model → 2 kv_heads d_head`; `state_output`: `2 heads d_head → d_model`
#[derive(Module, Debug)]
pub struct BlockRecurrent {
    /// `c_0`, the state of a first block, `N(0, initial_std)`.
    pub initial: Param<Tensor<2>>,
    /// `P`, the learned state IDs added to the normalised state, `N(0, 1)` (they are added
    /// after a LayerNorm; the peer's scale).
    pub state_ids: Param<Tensor<2>>,
    /// `LN_s`, the state's LayerNorm.
    pub state_norm: LayerNorm,
    /// `W_qx`: the tokens' queries of the state (vertical cross-attention).
    pub to_state_query: Linear,
    /// The vertical cross-attention's share of the layer's output projection.
    pub to_state_output: Linear,
    /// `W_qc`: the state's queries of itself.
    pub state_query: Linear,
    /// `W_qcx`: the state's queries of the block's tokens.
    pub from_state_query: Linear,
    /// `W^c_kv`: the state's keys and values, `d_model → 2 kv_heads d_head` (the stack's
    /// `kv_heads`, each key/value head shared by `n_heads / kv_heads` query heads).
    pub state_key_value: Linear,
    /// `W^c_o` of `[self ; cross]`.
    pub state_output: Linear,
    /// The first gate (after the attention).
    pub attention_gate: StateGate,
    /// qk-RMSNorm of the tokens' read of the state (`W_qx x` against `K_c`; see
    /// [`QkNormConfig`](crate::QkNormConfig)), where the recurrent layer has it.
    pub read_qk_norm: Option<QkNorm>,
    /// qk-RMSNorm of the state's attention to itself.
    pub self_qk_norm: Option<QkNorm>,
    /// qk-RMSNorm of the state's attention to the block's tokens.
    pub cross_qk_norm: Option<QkNorm>,
    /// The state's feed-forward and second gate (`state_ff`).
    pub ff: Option<StateFeedForward>,
    /// Heads.
    #[module(skip)]
    pub n_heads: usize,
    /// Key/value heads of the state (the stack's `kv_heads`, else `n_heads`).
    #[module(skip)]
    pub n_kv_heads: usize,
    /// Width of a head.
    #[module(skip)]
    pub d_head: usize,
    /// The settings.
    #[module(skip)]
    pub config: BlockRecurrentConfig,
    /// Whether blocks read the state carried from the previous one (false: every block reads
    /// `c_0`, the baseline of [`TransformerXl::without_carried_memory`]).
    #[module(skip)]
    pub carry: bool,
}

/// The carried state of a Block-Recurrent Transformer, `c_τ`: `[batch, S, d_model]` (`None`: no
/// block read yet).
pub type RecurrentState = Carried;

impl BlockRecurrentConfig {
    /// Checks the settings against the stack's, naming the bad value.
    pub fn validate(&self, stack: &XlConfig) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        crate::stack::positive(&[
            ("block_recurrent.state_len", self.state_len),
            ("block_recurrent.bptt_segments", self.bptt_segments),
        ])?;
        if self.layer >= stack.n_layers {
            return bad(format!(
                "block_recurrent.layer ({}) must be below n_layers ({})",
                self.layer, stack.n_layers
            ));
        }
        if stack.compressive.is_some() || stack.rmt.is_some() {
            return bad(
                "block_recurrent cannot be combined with compressive or rmt (one carried \
                 memory per stack)"
                    .into(),
            );
        }
        if stack.residual != Residual::Sequential {
            return bad(format!(
                "block_recurrent needs residual = \"sequential\", got {:?} (the reversible \
                 backward does not carry the state)",
                stack.residual
            ));
        }
        if let Some(k) = stack
            .layer_kinds()
            .iter()
            .find(|k| matches!(k, LayerKind::Lsh | LayerKind::Local))
        {
            return bad(format!(
                "block_recurrent stacks need xl, learned, t5, absolute or knn layers (the \
                 recurrent layer shares its relative attention's keys and values); layer kind \
                 {k:?} is not one"
            ));
        }
        if stack.compat.memory_keys_values && self.memory_replay {
            return bad(
                "block_recurrent.memory_replay = true is not supported with \
                 compat.memory_keys_values = true (the key/value memory stays in the graph \
                 across the unrolled blocks, which a replay does not restore)"
                    .into(),
            );
        }
        if let Some(r) = self.read_layer
            && r > self.layer
        {
            return bad(format!(
                "block_recurrent.read_layer ({r}) must be at or below block_recurrent.layer \
                 ({}): the state is read before it is written",
                self.layer
            ));
        }
        if !(self.initial_std.is_finite() && self.initial_std > 0.0) {
            return bad(format!(
                "block_recurrent.initial_std must be positive, got {}",
                self.initial_std
            ));
        }
        if self.state_ff && stack.ff_activation == Activation::Geglu {
            return bad(
                "ff_activation = \"geglu\" is not supported with block_recurrent.state_ff = \
                 true (the state's feed-forward is one layer wide): use relu or gelu"
                    .into(),
            );
        }
        Ok(())
    }

    /// Initialises the state's parameters for a stack (its width, heads, feed-forward and
    /// LayerNorms). The tokens' side (`to_state_query`, `to_state_output`) is drawn as the
    /// stack's attention, `N(0, init_std)`; the state's own projections (`state_query`,
    /// `from_state_query`, `state_key_value`, `state_output`, the gates, the state's
    /// feed-forward) from `N(0, 1/sqrt(fan_in))` (the reference implementation's variance
    /// scaling), and `c_0`, `P` from `N(0, 1)`: the state is then unit-scale from the first
    /// block. (At `init_std` the update `z` is about 1e-3 of `c_0` and vanishes under the
    /// state's LayerNorm: a tiny stack then learned to read its state far later.) Biases are 0.
    pub fn init(&self, stack: &XlConfig, device: &Device) -> BlockRecurrent {
        let (d, hd) = (stack.d_model, stack.n_heads * stack.head_width());
        let n_kv_heads = stack.kv_heads.unwrap_or(stack.n_heads);
        let plain = |i: usize, o: usize| {
            let mut l = stack.init_linear(i, o, device);
            l.bias = None;
            l
        };
        let scaled = |i: usize, o: usize, bias: bool| {
            let mut l = stack.init_linear(i, o, device);
            l.weight = Initializer::Normal {
                mean: 0.0,
                std: 1.0 / (i as f64).sqrt(),
            }
            .init([i, o], device);
            if !bias {
                l.bias = None;
            }
            l
        };
        let unit = Initializer::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let initial = Initializer::Normal {
            mean: 0.0,
            std: self.initial_std,
        };
        // qk-RMSNorm in the state's three attentions where the recurrent layer has it.
        let qk = || {
            stack
                .qk_norm_scale(self.layer)
                .map(|s| QkNorm::new(stack.head_width(), s, device))
        };
        let gate = || StateGate {
            candidate: scaled(d, d, true),
            bias: (self.gate == GateKind::Fixed).then(|| Initializer::Zeros.init([d], device)),
            input: (self.gate == GateKind::Lstm).then(|| scaled(d, d, true)),
            forget: (self.gate == GateKind::Lstm).then(|| scaled(d, d, true)),
        };
        BlockRecurrent {
            initial: initial.init([self.state_len, d], device),
            state_ids: unit.init([self.state_len, d], device),
            state_norm: stack.init_norm(device),
            to_state_query: plain(d, hd),
            to_state_output: plain(hd, d),
            state_query: scaled(d, hd, false),
            from_state_query: scaled(d, hd, false),
            state_key_value: scaled(d, 2 * n_kv_heads * stack.head_width(), false),
            state_output: scaled(2 * hd, d, false),
            attention_gate: gate(),
            read_qk_norm: qk(),
            self_qk_norm: qk(),
            cross_qk_norm: qk(),
            ff: self.state_ff.then(|| StateFeedForward {
                norm: stack.init_norm(device),
                ff_in: scaled(d, stack.d_inner, true),
                ff_out: scaled(stack.d_inner, d, true),
                gate: gate(),
                activation: stack.ff_activation,
            }),
            n_heads: stack.n_heads,
            n_kv_heads,
            d_head: stack.head_width(),
            config: self.clone(),
            carry: true,
        }
    }
}

impl StateGate {
    /// `c_new` from the state `c` and the update `h` (see [`GateKind`] for the equations).
    ///
    /// # Shapes
    /// - `c`, `h`: `[batch, S, d_model]` → `[batch, S, d_model]`
    pub fn forward(&self, c: Tensor<3>, h: Tensor<3>) -> Tensor<3> {
        let z = linear_rows(&self.candidate, h.clone());
        match (&self.bias, &self.input, &self.forget) {
            (_, Some(wi), Some(wf)) => {
                // z = tanh(W_z h + b_z); i = σ(W_i h + b_i − 1); f = σ(W_f h + b_f + 1)
                let i = sigmoid(linear_rows(wi, h.clone()).sub_scalar(1.0));
                let f = sigmoid(linear_rows(wf, h).add_scalar(1.0));
                c * f + tanh(z) * i
            }
            (Some(b), _, _) => {
                // g = σ(b_g); c ⊙ g + z ⊙ (1 − g)
                let g = sigmoid(b.val()).unsqueeze_dims::<3>(&[0, 1]);
                c * g.clone() + z * (g.neg() + 1.0)
            }
            _ => z,
        }
    }
}

impl StateFeedForward {
    /// `gate(c, W_2 act(W_1 LN(c) + b_1) + b_2)`.
    ///
    /// # Shapes
    /// - `c`: `[batch, S, d_model]` → `[batch, S, d_model]`
    pub fn forward(&self, c: Tensor<3>) -> Tensor<3> {
        let h = linear_rows(&self.ff_in, self.norm.forward(c.clone()));
        let h = match self.activation {
            Activation::Relu => burn::tensor::activation::relu(h),
            // GEGLU is refused with block_recurrent (`validate_peer_layers`).
            Activation::Gelu | Activation::Geglu => memzoo_fused::gelu(h),
        };
        self.gate.forward(c, linear_rows(&self.ff_out, h))
    }
}

/// `softmax(q kᵀ / sqrt(d_head)) v` per head, no mask; with qk-RMSNorm `softmax(s q̂ k̂ᵀ) v`
/// (`memzoo_relative::rotary`).
///
/// # Shapes
/// - `q`: `[batch, heads, n, d_head]`, `k`, `v`: `[batch, heads, m, d_head]` →
///   `[batch, heads, n, d_head]`
fn attend(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, norm: Option<&QkNorm>) -> Tensor<4> {
    let (q, k, s) = match norm {
        Some(n) => {
            let (q, k) = n.normalise(q, k);
            (q, k, n.scale)
        }
        None => {
            let dh = k.dims()[3] as f64;
            (q, k, 1.0 / dh.sqrt())
        }
    };
    let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(s);
    softmax(scores, 3).matmul(v)
}

/// What a block's read of the state leaves for its write: `ĉ = LN_s(c) + P` and `K_c`, `V_c`
/// (`[batch, S, d_model]`, `[batch, heads, S, d_head]` each).
#[derive(Debug, Clone)]
pub struct StateRead {
    /// `ĉ`.
    pub normed: Tensor<3>,
    /// `K_c`.
    pub keys: Tensor<4>,
    /// `V_c`.
    pub values: Tensor<4>,
}

impl BlockRecurrent {
    /// `[batch, n, heads d_head]` → `[batch, heads, n, d_head]`.
    fn heads(&self, t: Tensor<3>) -> Tensor<4> {
        let [b, n, _] = t.dims();
        t.reshape([b, n, self.n_heads, self.d_head]).swap_dims(1, 2)
    }

    /// `[batch, n, kv_heads d_head]` → `[batch, heads, n, d_head]`, each key/value head
    /// repeated for the query heads it serves.
    fn kv_heads(&self, t: Tensor<3>) -> Tensor<4> {
        let [b, n, _] = t.dims();
        let (h, hk, dh) = (self.n_heads, self.n_kv_heads, self.d_head);
        t.reshape([b, n, hk, 1, dh])
            .expand([b, n, hk, h / hk, dh])
            .reshape([b, n, h, dh])
            .swap_dims(1, 2)
    }

    /// `[batch, heads, n, d_head]` → `[batch, n, heads d_head]`.
    fn merge(&self, t: Tensor<4>) -> Tensor<3> {
        let [b, _, n, _] = t.dims();
        t.swap_dims(1, 2)
            .reshape([b, n, self.n_heads * self.d_head])
    }

    /// The state a block of `batch` rows reads: the carried one (`None`: none yet), `c_0` for
    /// every row without carry and, with `resets`, for the rows that start a document.
    ///
    /// # Shapes
    /// - `carried`: `[batch, S, d_model]` → `[batch, S, d_model]`
    pub fn read_state(
        &self,
        carried: Option<&Tensor<3>>,
        batch: usize,
        resets: Option<&[bool]>,
    ) -> Result<Tensor<3>, XlError> {
        let [s, d] = self.initial.dims();
        let fresh = self
            .initial
            .val()
            .unsqueeze_dim::<3>(0)
            .expand([batch, s, d]);
        let Some(c) = carried.filter(|_| self.carry) else {
            return Ok(fresh);
        };
        if c.dims() != [batch, s, d] {
            return Err(XlError::Input(format!(
                "the carried block-recurrent state is {:?}, the model needs [{batch}, {s}, {d}]",
                c.dims()
            )));
        }
        match resets.filter(|r| r.iter().any(|&r| r)) {
            Some(r) => {
                let keep: Vec<f32> = r.iter().map(|&r| f32::from(u8::from(!r))).collect();
                let keep =
                    Tensor::<3>::from_data(TensorData::new(keep, [batch, 1, 1]), &c.device());
                Ok(c.clone() * keep.clone() + fresh * (keep.neg() + 1.0))
            }
            None => Ok(c.clone()),
        }
    }

    /// `ĉ = LN_s(c) + P` and `K_c, V_c = W^c_kv ĉ`: what the block's read and write share.
    ///
    /// # Shapes
    /// - `c`: `[batch, S, d_model]`
    pub fn prepare(&self, c: Tensor<3>) -> StateRead {
        let hkd = self.n_kv_heads * self.d_head;
        // ĉ = LN_s(c) + P
        let normed = self.state_norm.forward(c) + self.state_ids.val().unsqueeze_dim(0);
        // K_c, V_c = W^c_kv ĉ
        let kv = linear_rows(&self.state_key_value, normed.clone());
        StateRead {
            keys: self.kv_heads(kv.clone().narrow(2, 0, hkd)),
            values: self.kv_heads(kv.narrow(2, hkd, hkd)),
            normed,
        }
    }

    /// The tokens' read of the state (vertical): `W_o^cross Attn(W_qx x, K_c, V_c)`, to add to
    /// the reading layer's self-attention output.
    ///
    /// # Shapes
    /// - `x`: `[batch, n, d_model]` (the block as the reading layer's attention reads it) →
    ///   `[batch, n, d_model]`
    pub fn read(&self, x: Tensor<3>, state: &StateRead) -> Tensor<3> {
        let q = self.heads(linear_rows(&self.to_state_query, x));
        let read = attend(
            q,
            state.keys.clone(),
            state.values.clone(),
            self.read_qk_norm.as_ref(),
        );
        linear_rows(&self.to_state_output, self.merge(read))
    }

    /// The next state `c_{τ+1}` (horizontal): `h_c = W^c_o [Attn(W_qc ĉ, K_c, V_c) ;
    /// Attn(W_qcx ĉ, K_x, V_x)]`, `c' = gate_1(c, h_c)`, `c_{τ+1} = gate_2(c', MLP(LN(c')))`
    /// with `state_ff`, else `c'`.
    ///
    /// # Shapes
    /// - `kx`, `vx`: the recurrent layer's keys and values of the block, `[batch, n, heads,
    ///   d_head]`; `c`: `[batch, S, d_model]` → `[batch, S, d_model]`
    pub fn write(&self, kx: Tensor<4>, vx: Tensor<4>, c: Tensor<3>, state: StateRead) -> Tensor<3> {
        let own = attend(
            self.heads(linear_rows(&self.state_query, state.normed.clone())),
            state.keys,
            state.values,
            self.self_qk_norm.as_ref(),
        );
        let cross = attend(
            self.heads(linear_rows(&self.from_state_query, state.normed)),
            kx.swap_dims(1, 2),
            vx.swap_dims(1, 2),
            self.cross_qk_norm.as_ref(),
        );
        let h = linear_rows(
            &self.state_output,
            Tensor::cat(vec![self.merge(own), self.merge(cross)], 2),
        );
        let next = self.attention_gate.forward(c, h);
        match &self.ff {
            Some(ff) => ff.forward(next),
            None => next,
        }
    }

    /// One recurrent step of the block, read and write at the same layer: what the tokens
    /// read from the state ([`read`](Self::read)) and the next state
    /// ([`write`](Self::write)).
    ///
    /// # Shapes
    /// - `x`: `[batch, n, d_model]` (the block as the attention reads it); `kx`, `vx`: the
    ///   layer's keys and values of `x`, `[batch, n, heads, d_head]`; `c`: `[batch, S,
    ///   d_model]` → (`[batch, n, d_model]`, `[batch, S, d_model]`)
    pub fn step(
        &self,
        x: Tensor<3>,
        kx: Tensor<4>,
        vx: Tensor<4>,
        c: Tensor<3>,
    ) -> (Tensor<3>, Tensor<3>) {
        let state = self.prepare(c.clone());
        let read = self.read(x, &state);
        (read, self.write(kx, vx, c, state))
    }
}

impl XlLayer {
    /// A layer of a Block-Recurrent stack that reads or writes the state: the block with its
    /// attention output, plus, where `reads`, what the tokens read from the state
    /// ([`BlockRecurrent::read`]); and, where `write` carries `c_τ`, the next state from this
    /// layer's keys and values of the block ([`BlockRecurrent::write`]).
    ///
    /// # Shapes
    /// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]` (or cached keys
    ///   and values), `write`: `[batch, S, d_model]` → (`[batch, qlen, d_model]`, `[batch, S,
    ///   d_model]` where written)
    #[allow(clippy::too_many_arguments)]
    pub fn forward_recurrent(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
        recurrent: &BlockRecurrent,
        state: &StateRead,
        reads: bool,
        write: Option<Tensor<3>>,
    ) -> Result<(Tensor<3>, Option<Tensor<3>>), XlError> {
        let a = self.attention.relative().ok_or_else(|| {
            XlError::Input("the recurrent layer needs a relative attention".into())
        })?;
        let opts = cx.opts.clone();
        let mut next = None;
        let out = self.block.forward(x, memory, opts.as_ref(), |x, m| {
            if let Some(c) = write {
                let (kx, vx) = a.keys_values(x.clone());
                next = Some(recurrent.write(kx, vx, c, state.clone()));
            }
            let attended = self.attend(x.clone(), m, &mut cx, Replay::Nothing)?.0;
            if !reads {
                return Ok::<_, XlError>(attended);
            }
            let read = recurrent.read(x, state);
            // Dropped as the attention's output is: by the block in a seeded stack, here in a
            // device stack (whose relative attention drops only its own output).
            let read = match (&opts, self.block.drops_attention) {
                (_, true) => read,
                (Some(o), false) => {
                    seeded_dropout(read, self.block.dropout.prob, o, TAG_DROP_STATE_READ)
                }
                (None, false) => self.block.dropout.forward(read),
            };
            Ok(attended + read)
        })?;
        Ok((out, next))
    }
}

impl TransformerXl {
    /// The Block-Recurrent Transformer's settings, where the stack is one.
    pub fn block_recurrent_config(&self) -> Option<&BlockRecurrentConfig> {
        self.block_recurrent.as_ref().map(|r| &r.config)
    }

    /// Reads one block of a Block-Recurrent stack on top of `state` (its XL memory and its
    /// carried state `c_τ`) and writes `c_{τ+1}` into it (in the graph with `keep_graph`,
    /// detached otherwise); every layer's attention (the recurrent one's self-attention, not
    /// its read of the state) records into `trace` when given. `reset[b]`: row `b` starts a document (with `document_resets`: it
    /// reads `c_0` and its XL memory is hidden).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]`, `reset`: `batch` flags → `[batch, len, d_model]`
    pub(crate) fn forward_block_recurrent(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
        keep_graph: bool,
        trace: Option<&Trace>,
    ) -> Result<Tensor<3>, XlError> {
        self.read_block_recurrent(tokens, state, reset, opts, keep_graph, trace, false)
    }

    /// Reads tokens of an unfinished block that follow those `view` already holds after its XL
    /// memory, and keeps them there (none leaves it), reading the carried state `c_τ` and
    /// writing none: generation's read of one new token
    /// ([`crate::RecurrentModel::peek_continue`]). A token's output reads only `c_τ` and the
    /// keys before it, so it is what a pass over the whole block gives it; `c_{τ+1}` is
    /// written when the block completes.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub(crate) fn peek_block_recurrent(
        &self,
        tokens: Tensor<2, Int>,
        view: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        self.read_block_recurrent(tokens, view, reset, opts, false, None, true)
    }

    /// [`forward_block_recurrent`](Self::forward_block_recurrent), or with `peek`
    /// [`peek_block_recurrent`](Self::peek_block_recurrent)'s read.
    #[allow(clippy::too_many_arguments)]
    fn read_block_recurrent(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
        keep_graph: bool,
        trace: Option<&Trace>,
        peek: bool,
    ) -> Result<Tensor<3>, XlError> {
        let rec = self.block_recurrent.as_ref().ok_or_else(|| {
            XlError::Input("this stack is not a Block-Recurrent Transformer".into())
        })?;
        let [batch, qlen] = tokens.dims();
        let device = tokens.device();
        let mask = self.prepare(&tokens, state, reset)?;
        self.check_memory(batch, &state.xl)?;
        let resets = self.document_resets.then_some(reset);
        let c = rec.read_state(state.block_recurrent.value.as_ref(), batch, resets)?;
        let contexts = self.contexts(batch, qlen, state.xl.len(), &mask, &device)?;
        let mut h = self.embed(tokens, opts)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut next = None;
        let shared = rec.prepare(c.clone());
        let (write_layer, read_layer) = (rec.config.layer, rec.config.read_layer);
        let read_layer = read_layer.unwrap_or(write_layer);
        // kNN layers search and then extend their memories (`prepare` made and cleared them).
        let mut stores = state.knn.iter_mut();
        for (l, layer) in self.layers.iter().enumerate() {
            // The layer's input, or its keys/values (`memory_keys_values`), in the graph
            // within an unroll (as the peer's memories within one forward).
            inputs.push(
                match (self.memory_keys_values, keep_graph) {
                    (false, _) => Some(h.clone()),
                    (true, true) => layer.cache_entry_in_graph(h.clone()),
                    (true, false) => layer.cache_entry(h.clone()),
                }
                .ok_or_else(|| XlError::Input(format!("layer {l} caches no keys/values")))?,
            );
            let store = match layer.attention {
                LayerAttention::Knn(_) => Some(
                    stores
                        .next()
                        .ok_or_else(|| XlError::Input("fewer kNN memories than kNN layers".into()))?
                        .as_mut(),
                ),
                _ => None,
            };
            let mut cx = self.layer_context(l, &contexts, store, opts);
            cx.trace = trace.map(|t| t.slot(l, crate::stack::ProbeLayout::XlMemory));
            let memory = state.xl.layer(l).cloned();
            h = if l == write_layer || l == read_layer {
                let write = (l == write_layer && !peek).then(|| c.clone());
                let (out, c_next) =
                    layer.forward_recurrent(h, memory, cx, rec, &shared, l == read_layer, write)?;
                next = c_next.or(next);
                out
            } else {
                layer.forward(h, memory, cx)?
            };
        }
        drop(contexts);
        drop(stores);
        if peek {
            // Every position stays until the block completes; the state is as it was.
            let len = state.xl.len() + qlen;
            state.xl = self.next_memory(std::mem::take(&mut state.xl), &inputs, len, true);
            if self.document_resets {
                for v in state.xl_valid.iter_mut() {
                    *v = (*v + qlen).min(len);
                }
            }
            return Ok(self.finish(h, opts));
        }
        // A key/value memory stays in the graph within an unroll; layer inputs never do.
        self.advance_with(
            state,
            &inputs,
            qlen,
            !(keep_graph && self.memory_keys_values),
        );
        state.block_recurrent.value = next.map(|c| if keep_graph { c } else { c.detach() });
        Ok(self.finish(h, opts))
    }
}

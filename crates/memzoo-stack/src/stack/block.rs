//! One residual block ([`XlBlock`]): attention and feed-forward around the stream, post- or
//! pre-LN, with its dropout sites.

use burn::module::Module;
use burn::nn::{Dropout, Linear};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use memzoo_fused::gelu;
use memzoo_reformer::{ForwardOptions, chunked};
use memzoo_relative::linear_rows;

use super::*;

/// The residual structure of a layer around any attention: LayerNorms and the position-wise
/// feed-forward (post-LN as Transformer-XL, or pre-LN), as one stream or, pre-LN, as the two
/// branches `F` ([`attention_branch`](Self::attention_branch)) and `G`
/// ([`ff_branch`](Self::ff_branch)) of a reversible layer.
///
/// Dropout: with `opts` (a seeded pass, [`Randomness::Seeded`]) every mask is drawn from the
/// pass's seed and replays exactly; without, Burn's `Dropout` draws them.
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlBlock {
    /// LayerNorm (or RMSNorm) of the attention block.
    pub norm_attention: Norm,
    /// Feed-forward `d_model -> d_inner`.
    pub ff_in: Linear,
    /// Feed-forward `d_inner -> d_model`.
    pub ff_out: Linear,
    /// LayerNorm (or RMSNorm) of the feed-forward block.
    pub norm_ff: Norm,
    /// The attention branch's hyper-connection (`XlConfig::residual_streams > 1`; the block's
    /// input and output are then the `s` streams, `[batch, len, s d_model]`).
    pub hyper_attention: Option<HyperConnection>,
    /// The feed-forward branch's hyper-connection.
    pub hyper_ff: Option<HyperConnection>,
    /// The feed-forward's activation.
    #[module(skip)]
    pub activation: Activation,
    /// Dropout in the feed-forward (and, in seeded passes, on the attention's output).
    pub dropout: Dropout,
    /// Pre-LN instead of post-LN.
    pub pre_ln: bool,
    /// Dropout between the feed-forward's layers too.
    pub ff_inner_dropout: bool,
    /// Dropout on the feed-forward's output.
    pub ff_output_dropout: bool,
    /// Positions per feed-forward chunk (0: all).
    pub ff_chunk_len: usize,
    /// Gradients through the memory's LayerNorm (pre-LN; `XlConfig::memory_gradients`).
    #[module(skip)]
    pub memory_gradients: bool,
    /// The memory is cached keys/values, not normalised (`XlConfig::memory_keys_values`).
    #[module(skip)]
    pub memory_keys_values: bool,
    /// The block drops the attention's output in a pass with options (a seeded stack, whose
    /// relative and kNN attention have no output dropout of their own); `false` (a device
    /// stack): relative and kNN attention drop their own output, LSH and local none.
    #[module(skip)]
    pub drops_attention: bool,
}

/// The dropout masks of one feed-forward pass in a seeded pass, `[batch, len, width]` each.
#[derive(Clone, Debug, Default)]
pub struct FfMasks {
    /// After the activation (`d_inner` wide), when `ff_inner_dropout`.
    pub inner: Option<Tensor<3>>,
    /// On the output (`d_model` wide).
    pub outer: Option<Tensor<3>>,
}

impl FfMasks {
    /// The masks of positions `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        let cut = |m: &Option<Tensor<3>>| {
            m.clone().map(|m| {
                let b = m.dims()[0];
                m.slice([0..b, range.clone()])
            })
        };
        FfMasks {
            inner: cut(&self.inner),
            outer: cut(&self.outer),
        }
    }
}

impl XlBlock {
    /// Applies the block with `attend(x, memory)` as its attention (see the type docs).
    pub fn forward<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        opts: Option<&ForwardOptions>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        if let (Some(ha), Some(hf)) = (&self.hyper_attention, &self.hyper_ff) {
            // Hyper-connections: each branch reads a mix of the streams and is added back to
            // every stream with its weights (`hyper.rs`).
            let (input, state) = ha.width(x);
            let h = ha.depth(self.attention_branch(input, memory, opts, attend)?, state);
            let (input, state) = hf.width(h);
            return Ok(hf.depth(self.ff_branch(input, opts), state));
        }
        if self.pre_ln {
            // h = x + F(x);  out = h + G(h)
            let h = x.clone() + self.attention_branch(x, memory, opts, attend)?;
            let g = self.ff_branch(h.clone(), opts);
            Ok(h + g)
        } else {
            // h = LN(x + Attn(cat(m, x)));  out = LN(h + FF(h))
            let a = self.drop_attention(attend(x.clone(), memory)?, opts);
            let h = self.norm_attention.forward(x + a);
            let f = self.feed_forward_with(h.clone(), opts);
            Ok(self.norm_ff.forward(h + f))
        }
    }

    /// `F(x) = Dropout(Attn(LN(x), LN(memory)))`, the attention branch of a pre-LN block.
    pub fn attention_branch<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        opts: Option<&ForwardOptions>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        let norm = |t: Tensor<3>| self.norm_attention.forward(t);
        // Without memory gradients the memory is normalised with constant parameters.
        let memory = match memory {
            // Cached keys/values enter the attention as they are.
            Some(m) if self.memory_keys_values => Some(m),
            Some(m) if !self.memory_gradients => {
                Some(self.norm_attention.clone().no_grad().forward(m))
            }
            m => m.map(norm),
        };
        let a = attend(norm(x), memory)?;
        Ok(self.drop_attention(a, opts))
    }

    /// In a pass with options, the dropout on the attention's output where the block owns it
    /// ([`drops_attention`](Self::drops_attention); otherwise relative and kNN attention apply
    /// their own and LSH / local attention none).
    pub(crate) fn drop_attention(&self, a: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        match opts {
            Some(o) if self.drops_attention => seeded_dropout(a, self.dropout.prob, o, TAG_DROP_F),
            _ => a,
        }
    }

    /// `G(x) = FF(LN(x))`, the feed-forward branch of a pre-LN block.
    pub fn ff_branch(&self, x: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        self.feed_forward_with(self.norm_ff.forward(x), opts)
    }

    /// [`ff_branch`](Self::ff_branch) of some positions, with their slice of the pass's masks
    /// (`G` is position-wise, so this equals that slice of the whole).
    pub fn ff_branch_part(&self, x: Tensor<3>, masks: &FfMasks) -> Tensor<3> {
        self.ff_masked(self.norm_ff.forward(x), masks)
    }

    /// The feed-forward's dropout masks for activations of `shape` in a seeded pass.
    pub fn ff_masks(&self, shape: [usize; 3], opts: &ForwardOptions, device: &Device) -> FfMasks {
        let [b, l, _] = shape;
        let p = self.dropout.prob;
        // The activation's width (`ff_out`'s input; GEGLU halves `ff_in`'s output).
        let d_inner = self.ff_out.weight.dims()[0];
        FfMasks {
            inner: self
                .ff_inner_dropout
                .then(|| seeded_mask([b, l, d_inner], p, opts, TAG_DROP_FF_INNER, device))
                .flatten(),
            outer: self
                .ff_output_dropout
                .then(|| seeded_mask(shape, p, opts, TAG_DROP_G, device))
                .flatten(),
        }
    }

    /// `FF(x) = Dropout(W_2 Dropout(act(W_1 x)))` (the inner dropout only with
    /// `ff_inner_dropout`, the outer only with `ff_output_dropout`), `ff_chunk_len` positions
    /// at a time; masks from Burn's `Dropout`.
    pub fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.feed_forward_with(x, None)
    }

    /// [`feed_forward`](Self::feed_forward), with seeded masks in a seeded pass.
    pub(crate) fn feed_forward_with(
        &self,
        x: Tensor<3>,
        opts: Option<&ForwardOptions>,
    ) -> Tensor<3> {
        match opts {
            Some(o) => {
                let masks = self.ff_masks(x.dims(), o, &x.device());
                chunked(x, self.ff_chunk_len, |c, r| {
                    self.ff_masked(c, &masks.slice(r))
                })
            }
            None => chunked(x, self.ff_chunk_len, |c, _| {
                let h = self.activate(linear_rows(&self.ff_in, c));
                let h = if self.ff_inner_dropout {
                    self.dropout.forward(h)
                } else {
                    h
                };
                let out = linear_rows(&self.ff_out, h);
                if self.ff_output_dropout {
                    self.dropout.forward(out)
                } else {
                    out
                }
            }),
        }
    }

    /// The feed-forward of a chunk with explicit masks.
    pub(crate) fn ff_masked(&self, x: Tensor<3>, masks: &FfMasks) -> Tensor<3> {
        let h = self.activate(linear_rows(&self.ff_in, x));
        let h = match &masks.inner {
            Some(m) => h * m.clone(),
            None => h,
        };
        let out = linear_rows(&self.ff_out, h);
        match &masks.outer {
            Some(m) => out * m.clone(),
            None => out,
        }
    }

    pub(crate) fn activate(&self, x: Tensor<3>) -> Tensor<3> {
        match self.activation {
            Activation::Relu => relu(x),
            Activation::Gelu => gelu(x),
            Activation::Geglu => {
                // [a, g] = W_1 x; a · gelu(g)
                let half = x.dims()[2] / 2;
                let a = x.clone().narrow(2, 0, half);
                a * gelu(x.narrow(2, half, half))
            }
        }
    }
}

//! The Transformer-XL language model (Dai et al. 2019).

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig,
    Linear, LinearConfig, Relu,
};
use burn::tensor::{Device, Int, Tensor};
use memzoo_relative::{
    AttentionMask, PositionConfig, RelativeAttentionConfig, RelativeContext,
    RelativeMultiHeadAttention, XlBiases,
};

use crate::error::XlError;
use crate::memory::XlMemory;

/// Configuration of a [`TransformerXl`] language model. Defaults: the XL-small reference
/// config (6 layers, d_model 256, 8 heads x 32, d_inner 1024, mem_len 128, bytes).
#[derive(Config, Debug)]
pub struct XlConfig {
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
    /// Width of each head; `None` means `d_model / n_heads` (which must then divide). Default: none.
    #[config(default = "None")]
    pub d_head: Option<usize>,
    /// Inner width of the position-wise feed-forward. Default: 1024.
    #[config(default = 1024)]
    pub d_inner: usize,
    /// Dropout on embeddings, attention output, feed-forward and final output. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention probabilities. Default: 0.0.
    #[config(default = 0.0)]
    pub dropatt: f64,
    /// Positions of earlier segments kept as memory (0: no recurrence). Default: 128.
    #[config(default = 128)]
    pub mem_len: usize,
    /// Every query attends to exactly `mem_len` keys (itself and the `mem_len - 1` before it)
    /// instead of `mlen + i + 1`. Default: false.
    #[config(default = false)]
    pub same_length: bool,
    /// Relative position scheme (XL's own by default; `clamp_len` lives here).
    #[config(default = "PositionConfig::new()")]
    pub positions: PositionConfig,
    /// Pre-LayerNorm residual blocks instead of the paper's post-LN. Default: false.
    #[config(default = false)]
    pub pre_ln: bool,
    /// Output layer shares the embedding matrix. Default: true.
    #[config(default = true)]
    pub tie_weights: bool,
    /// XL's `u`/`v` biases per layer instead of shared across layers. Default: false (shared).
    #[config(default = false)]
    pub untie_rel_bias: bool,
    /// Standard deviation of the normal initialiser, HF TransfoXL's `init_std` scheme: every
    /// weight matrix, the embedding (also the tied output layer), the `u`/`v` biases and the
    /// relative tables are drawn from N(0, init_std), LayerNorm gains from N(1, init_std), every
    /// bias is zero. Default: 0.02 (HF's and the paper's code).
    ///
    /// Measured faster (one seed, XL-small on tiny Shakespeare with the recipe of `cargo xtask
    /// bench quality`): `init_std = 0.03` with `embedding_std = Some(0.02)` reaches 3.42 / 3.07
    /// / 2.89 / 2.82 bpc at steps 100-400 against HF's 3.50 / 3.10 / 2.92 / 2.85 (0.04: 2.81 at
    /// 400); a larger *embedding* is slower (it strengthens the tied model's self-prediction).
    #[config(default = 0.02)]
    pub init_std: f64,
    /// Standard deviation of the embedding's normal initialiser, when it should differ from
    /// `init_std` (`None`: `init_std`, as HF). A larger one (e.g. `1/sqrt(d_model)`, unit-scale
    /// inputs after the `sqrt(d_model)` scale) makes a tied model predict its input token: its
    /// first loss is ~11 nats instead of ln 256 = 5.5, and a tied post-LN XL-small stalls at
    /// the unigram level. Default: none.
    #[config(default = "None")]
    pub embedding_std: Option<f64>,
}

impl XlConfig {
    /// The width of one head.
    pub fn head_width(&self) -> usize {
        self.d_head.unwrap_or(self.d_model / self.n_heads.max(1))
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_inner", self.d_inner),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive, got 0"));
            }
        }
        if self.d_head.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "d_model ({}) is not divisible by n_heads ({}); set d_head explicitly or change one",
                self.d_model, self.n_heads
            ));
        }
        if self.d_head == Some(0) {
            return bad("d_head must be positive, got 0".into());
        }
        if self.same_length && self.mem_len == 0 {
            return bad("same_length needs mem_len > 0 (every query sees mem_len keys)".into());
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return bad(format!("init_std must be positive, got {}", self.init_std));
        }
        if let Some(std) = self.embedding_std
            && !(std.is_finite() && std > 0.0)
        {
            return bad(format!("embedding_std must be positive, got {std}"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        self.attention().validate()?;
        Ok(())
    }

    fn initializer(&self) -> Initializer {
        Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        }
    }

    fn attention(&self) -> RelativeAttentionConfig {
        RelativeAttentionConfig::new(self.d_model, self.n_heads, self.head_width())
            .with_positions(self.positions.clone())
            .with_dropout(self.dropout)
            .with_dropatt(self.dropatt)
            .with_own_biases(self.untie_rel_bias)
            .with_initializer(self.initializer())
    }

    /// A linear layer with HF's initialisation: weight ~ N(0, init_std), bias 0.
    fn init_linear(&self, d_in: usize, d_out: usize, device: &Device) -> Linear {
        let mut linear = LinearConfig::new(d_in, d_out)
            .with_initializer(self.initializer())
            .init(device);
        linear.bias = linear
            .bias
            .map(|_| Initializer::Zeros.init([d_out], device));
        linear
    }

    /// A LayerNorm with HF's initialisation: gain ~ N(1, init_std), bias 0.
    pub fn init_norm(&self, device: &Device) -> LayerNorm {
        let mut norm = LayerNormConfig::new(self.d_model).init(device);
        norm.gamma = Initializer::Normal {
            mean: 1.0,
            std: self.init_std,
        }
        .init([self.d_model], device);
        norm
    }

    /// The residual block (LayerNorms and feed-forward) of one layer, for any attention.
    pub fn init_block(&self, device: &Device) -> XlBlock {
        XlBlock {
            norm_attention: self.init_norm(device),
            ff_in: self.init_linear(self.d_model, self.d_inner, device),
            ff_out: self.init_linear(self.d_inner, self.d_model, device),
            norm_ff: self.init_norm(device),
            activation: Relu::new(),
            dropout: DropoutConfig::new(self.dropout).init(),
            pre_ln: self.pre_ln,
        }
    }

    /// Validates the config and initialises the model.
    pub fn init(&self, device: &Device) -> Result<TransformerXl, XlError> {
        self.validate()?;
        let init = self.initializer();
        let attention = self.attention();
        let layers = (0..self.n_layers)
            .map(|_| {
                Ok(XlLayer {
                    attention: attention.init(device)?,
                    block: self.init_block(device),
                })
            })
            .collect::<Result<Vec<_>, XlError>>()?;
        Ok(TransformerXl {
            // Embeddings ~ N(0, init_std) as HF (see `embedding_std`).
            embedding: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: self.embedding_std.unwrap_or(self.init_std),
                })
                .init(device),
            layers,
            shared_biases: (!self.untie_rel_bias)
                .then(|| XlBiases::init(self.n_heads, self.head_width(), &init, device)),
            final_norm: self.pre_ln.then(|| self.init_norm(device)),
            output: (!self.tie_weights)
                .then(|| self.init_linear(self.d_model, self.vocab_size, device)),
            output_bias: self
                .tie_weights
                .then(|| Initializer::Zeros.init([self.vocab_size], device)),
            dropout: DropoutConfig::new(self.dropout).init(),
            positions: self.positions.clone(),
            d_model: self.d_model,
            vocab_size: self.vocab_size,
            mem_len: self.mem_len,
            same_length: self.same_length,
        })
    }
}

/// The residual structure of a Transformer-XL layer around any attention: LayerNorms and the
/// position-wise feed-forward (post-LN as the paper, or pre-LN). [`XlLayer`] puts relative
/// attention inside it; the Memorizing Transformer's kNN layer puts kNN attention inside it.
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlBlock {
    /// LayerNorm of the attention block.
    pub norm_attention: LayerNorm,
    /// Feed-forward `d_model -> d_inner`.
    pub ff_in: Linear,
    /// Feed-forward `d_inner -> d_model`.
    pub ff_out: Linear,
    /// LayerNorm of the feed-forward block.
    pub norm_ff: LayerNorm,
    /// ReLU of the feed-forward.
    pub activation: Relu,
    /// Dropout in the feed-forward.
    pub dropout: Dropout,
    /// Pre-LN instead of post-LN.
    pub pre_ln: bool,
}

impl XlBlock {
    /// Applies the block with `attend(x, memory)` as its attention (see the type docs).
    pub fn forward<E>(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        attend: impl FnOnce(Tensor<3>, Option<Tensor<3>>) -> Result<Tensor<3>, E>,
    ) -> Result<Tensor<3>, E> {
        if self.pre_ln {
            // h = x + Attn(LN(cat(m, x)));  out = h + FF(LN(h))
            let norm = |t: Tensor<3>| self.norm_attention.forward(t);
            let a = attend(norm(x.clone()), memory.map(norm))?;
            let h = x + a;
            let f = self.feed_forward(self.norm_ff.forward(h.clone()));
            Ok(h + f)
        } else {
            // h = LN(x + Attn(cat(m, x)));  out = LN(h + FF(h))
            let a = attend(x.clone(), memory)?;
            let h = self.norm_attention.forward(x + a);
            let f = self.feed_forward(h.clone());
            Ok(self.norm_ff.forward(h + f))
        }
    }

    /// `FF(x) = Dropout(W_2 Dropout(ReLU(W_1 x)))`
    pub fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self
            .dropout
            .forward(self.activation.forward(self.ff_in.forward(x)));
        self.dropout.forward(self.ff_out.forward(h))
    }
}

/// One Transformer-XL layer: relative attention over `cat(memory, x)` inside an [`XlBlock`].
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlLayer {
    /// Relative multi-head attention.
    pub attention: RelativeMultiHeadAttention,
    /// LayerNorms and feed-forward around it.
    pub block: XlBlock,
}

impl XlLayer {
    /// Applies the layer (see the type docs for shapes).
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        shared: Option<&XlBiases>,
    ) -> Tensor<3> {
        let attend =
            |x, m| Ok::<_, std::convert::Infallible>(self.attention.forward(x, m, ctx, shared));
        match self.block.forward(x, memory, attend) {
            Ok(out) => out,
            Err(never) => match never {},
        }
    }
}

/// The output of a [`TransformerXl`] forward pass.
#[derive(Debug, Clone)]
pub struct XlOutput {
    /// Final hidden states, `[batch, qlen, d_model]`.
    pub hidden: Tensor<3>,
    /// The memory to pass to the next segment (detached).
    pub memory: XlMemory,
}

/// The Transformer-XL language model.
///
/// `forward(tokens, memory)` reads one segment, attending over the memory of earlier segments,
/// and returns the next memory: recurrence is explicit, nothing is hidden in the module.
///
/// # Shapes
/// - `tokens`: `[batch, qlen]`
/// - hidden: `[batch, qlen, d_model]`, logits: `[batch, qlen, vocab]`
#[derive(Module, Debug)]
pub struct TransformerXl {
    /// Token embedding (scaled by `sqrt(d_model)` on lookup).
    pub embedding: Embedding,
    /// The layers.
    pub layers: Vec<XlLayer>,
    /// `u`, `v` shared by all layers (unless untied).
    pub shared_biases: Option<XlBiases>,
    /// Final LayerNorm (pre-LN only).
    pub final_norm: Option<LayerNorm>,
    /// Untied output layer.
    pub output: Option<Linear>,
    /// Output bias of the tied output layer.
    pub output_bias: Option<Param<Tensor<1>>>,
    /// Dropout on embeddings and final output.
    pub dropout: Dropout,
    /// Position scheme, shared by every layer.
    #[module(skip)]
    pub positions: PositionConfig,
    /// Model width.
    pub d_model: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Positions kept as memory after each segment.
    pub mem_len: usize,
    /// Every query sees exactly `mem_len` keys.
    pub same_length: bool,
}

impl TransformerXl {
    /// The same model with another memory length (e.g. longer for evaluation, as the paper).
    pub fn with_mem_len(mut self, mem_len: usize) -> Self {
        self.mem_len = mem_len;
        self
    }

    /// The attention mask the model uses by default: causal, and with `same_length` a window
    /// of `mem_len` keys.
    pub fn default_mask(&self) -> AttentionMask {
        AttentionMask::Causal {
            window: self.same_length.then_some(self.mem_len),
        }
    }

    /// Reads one segment with the model's default (causal) mask.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`; every `memory` layer `[batch, mlen, d_model]`
    pub fn forward(&self, tokens: Tensor<2, Int>, memory: &XlMemory) -> Result<XlOutput, XlError> {
        self.forward_masked(tokens, memory, &self.default_mask())
    }

    /// Reads one segment with an explicit mask over its `mlen + qlen` keys.
    pub fn forward_masked(
        &self,
        tokens: Tensor<2, Int>,
        memory: &XlMemory,
        mask: &AttentionMask,
    ) -> Result<XlOutput, XlError> {
        let [batch, qlen] = tokens.dims();
        self.check_memory(batch, memory)?;
        let mlen = memory.len();
        let device = tokens.device();
        let ctx = RelativeContext::new(&self.positions, self.d_model, qlen, mlen, mask, &device);
        if let Some(m) = &ctx.mask {
            let [mb, mq, mk] = m.dims();
            if (mb != 1 && mb != batch) || mq != qlen || mk != qlen + mlen {
                return Err(XlError::Input(format!(
                    "mask has shape [{mb}, {mq}, {mk}], expected [1 or {batch}, {qlen}, {}]",
                    qlen + mlen
                )));
            }
        }

        // h_0 = Dropout(E[tokens] * sqrt(d_model))
        let scale = (self.d_model as f64).sqrt();
        let mut h = self
            .dropout
            .forward(self.embedding.forward(tokens).mul_scalar(scale));
        let mut inputs = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            inputs.push(h.clone());
            let mem = memory.layer(l).cloned();
            h = layer.forward(h, mem, &ctx, self.shared_biases.as_ref());
        }
        if let Some(norm) = &self.final_norm {
            h = norm.forward(h);
        }
        Ok(XlOutput {
            hidden: self.dropout.forward(h),
            memory: memory.update(&inputs, self.mem_len),
        })
    }

    fn check_memory(&self, batch: usize, memory: &XlMemory) -> Result<(), XlError> {
        if memory.is_empty() {
            return Ok(());
        }
        if memory.n_layers() != self.layers.len() {
            return Err(XlError::Input(format!(
                "memory has {} layers, the model {}",
                memory.n_layers(),
                self.layers.len()
            )));
        }
        let [mb, _, md] = memory.layer(0).expect("non-empty").dims();
        if mb != batch || md != self.d_model {
            return Err(XlError::Input(format!(
                "memory is [{mb}, _, {md}], tokens need [{batch}, _, {}]",
                self.d_model
            )));
        }
        Ok(())
    }

    /// Output logits from hidden states: `h Eᵀ + b` (tied) or a separate linear layer.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, qlen, d_model]` → `[batch, qlen, vocab]`
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        match (&self.output, &self.output_bias) {
            (Some(output), _) => output.forward(hidden),
            (None, bias) => {
                let [b, q, d] = hidden.dims();
                let w = self.embedding.weight.val(); // [vocab, d]
                let logits = hidden.reshape([b * q, d]).matmul(w.transpose());
                let logits = match bias {
                    Some(bias) => logits + bias.val().unsqueeze_dim(0),
                    None => logits,
                };
                logits.reshape([b, q, self.vocab_size])
            }
        }
    }

    /// Mean next-token cross-entropy (nats) of one segment, and the next memory.
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[batch, qlen]`; loss: `[1]`
    pub fn forward_loss(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        memory: &XlMemory,
    ) -> Result<(Tensor<1>, XlMemory), XlError> {
        if tokens.dims() != targets.dims() {
            return Err(XlError::Input(format!(
                "tokens {:?} and targets {:?} differ in shape",
                tokens.dims(),
                targets.dims()
            )));
        }
        let device = tokens.device();
        let [b, q] = targets.dims();
        let out = self.forward(tokens, memory)?;
        let logits = self.logits(out.hidden).reshape([b * q, self.vocab_size]);
        let loss = CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets.reshape([b * q]));
        Ok((loss, out.memory))
    }
}

//! The stack ([`TransformerXl`]): embedding, layers and output, and how it reads a segment
//! with its carried state.

use burn::module::{Module, Param};
use burn::nn::{Dropout, Embedding, Linear};
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_knn::KnnAttention;
use memzoo_memory::{KnnIndex, KnnMemoryConfig};
use memzoo_reformer::rng::mix;
use memzoo_reformer::{AxialPositionalEmbedding, ForwardOptions};
use memzoo_relative::{
    AttentionMask, PositionConfig, PositionKind, RelativeContext, XlBiases, linear_rows,
};

use super::*;
use crate::adaptive::{AdaptiveEmbedding, AdaptiveLogSoftmax};
use crate::error::XlError;
use crate::memory::{XlMemory, XlState};

/// The output of a [`TransformerXl`] forward pass.
#[derive(Debug, Clone)]
pub struct XlOutput {
    /// Final hidden states, `[batch, qlen, d_model]`.
    pub hidden: Tensor<3>,
    /// The memory to pass to the next segment (detached).
    pub memory: XlMemory,
}

/// The layer stack's language model: Transformer-XL, and with `knn` layers the Memorizing
/// Transformer.
///
/// `forward(tokens, memory)` reads one segment, attending over the memory of earlier segments,
/// and returns the next memory: recurrence is explicit, nothing is hidden in the module. A
/// stack with kNN layers reads with [`forward_state`](Self::forward_state), whose
/// [`XlState`] also holds the kNN memories.
///
/// The ways to run it:
///
/// | step | method | returns |
/// |---|---|---|
/// | plain forward | [`forward`](Self::forward) (XL memory), [`forward_state`](Self::forward_state) (whole state), [`forward_masked`](Self::forward_masked) (explicit mask) | hidden states |
/// | training | [`train_step`](Self::train_step) | mean loss, gradients |
/// | evaluation | [`eval_step`](Self::eval_step) | per-target losses (and hits) |
/// | generation | [`logits`](Self::logits) of the hidden states | the distribution |
///
/// Training and evaluation share one loss path (`stack/loss.rs`), the only place hidden states
/// become losses; [`Step`] says which rows start a document, the weights and the randomness.
///
/// # Shapes
/// - `tokens`: `[batch, qlen]`
/// - hidden: `[batch, qlen, d_model]`, logits: `[batch, qlen, vocab]`
#[derive(Module, Debug)]
pub struct TransformerXl {
    /// Token embedding: one table, or adaptive (scaled by `sqrt(d_model)` unless
    /// `scale_embedding` is off).
    pub embedding: InputEmbedding,
    /// Axial position embeddings added to the token embedding (the Reformer's).
    pub axial: Option<AxialPositionalEmbedding>,
    /// The layers, bottom to top.
    pub layers: Vec<XlLayer>,
    /// `u`, `v` shared by all XL layers (unless untied).
    pub shared_biases: Option<XlBiases>,
    /// T5 tables shared across layers (`XlConfig::shared_t5`); the layers' own tables are then
    /// unused.
    pub shared_t5: Option<SharedT5>,
    /// The XL memory caches keys/values (`XlConfig::memory_keys_values`).
    #[module(skip)]
    pub memory_keys_values: bool,
    /// For generation: every XL-position layer holds `W_R R_d` for the distances `-1 ..= n`
    /// ([`memzoo_relative::RelativeMultiHeadAttention::with_position_table`]), and passes
    /// whose distances it covers read it ([`TransformerXl::for_generation`]). `None`: none
    /// does.
    #[module(skip)]
    pub position_table: Option<usize>,
    /// For generation: a pass appends each layer's key/value entries to its memory once,
    /// hands the layer the result (which it reads as it is,
    /// [`RelativeContext::with_memory_holding_segment`]) and keeps it as the next memory,
    /// instead of the layer appending them and the memory update appending them again
    /// ([`TransformerXl::for_generation`]).
    #[module(skip)]
    pub memory_holds_segment: bool,
    /// Final LayerNorm or RMSNorm (pre-LN with `final_norm` only).
    pub final_norm: Option<Norm>,
    /// Learned absolute positions added to the token embedding (`XlConfig::learned_positions`,
    /// absolute layers; `None`: sinusoids where the layers are absolute).
    pub position_embedding: Option<Embedding>,
    /// Factor of the gradient reaching the input embedding (`compat.embedding_gradient_scale`).
    #[module(skip)]
    pub embedding_gradient_scale: f64,
    /// Residual streams of the layers (`XlConfig::residual_streams`; above 1: hyper-connections).
    #[module(skip)]
    pub residual_streams: usize,
    /// The output distribution: tied, a linear layer, or an adaptive log-softmax.
    pub output: OutputLayer,
    /// Dropout on embeddings and final output.
    pub dropout: Dropout,
    /// Configuration of every kNN layer's memory.
    #[module(skip)]
    pub knn_memory: KnnMemoryConfig,
    /// Model width.
    pub d_model: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Positions kept as memory after each segment.
    pub mem_len: usize,
    /// Memory lengths a training step draws the length it reads from
    /// ([`XlConfig::train_memory_lengths`]; empty: the whole memory).
    pub train_memory_lengths: Vec<usize>,
    /// Every query sees exactly `mem_len` keys.
    pub same_length: bool,
    /// Pairs each kNN layer retrieves per query.
    pub top_k: usize,
    /// Rows starting a document hide their XL memory and clear their kNN memories.
    pub document_resets: bool,
    /// Seed of the LSH layers' rotations (layer `l` uses `lsh_seed + l`).
    pub lsh_seed: u64,
    /// Factor of a plain embedding (`sqrt(d_model)` or 1; an adaptive one applies its own).
    #[module(skip)]
    pub scale: f64,
    /// A sequence starts from `mem_len` zero vectors per layer (HF's `init_mems`).
    pub zero_first_memory: bool,
    /// One residual stream or two reversible ones.
    #[module(skip)]
    pub residual: Residual,
    /// Dropout on the final hidden states.
    pub final_dropout: bool,
    /// Dropout on the input embedding.
    pub embedding_dropout: bool,
    /// Device or seeded randomness.
    #[module(skip)]
    pub randomness: Randomness,
    /// Base seed of seeded training steps.
    #[module(skip)]
    pub train_seed: u64,
    /// What the head reads from a reversible stack's two streams.
    #[module(skip)]
    pub head_input: HeadInput,
    /// Hash rounds of every LSH layer in seeded evaluation passes (`None`: the configured
    /// `n_rounds`); see [`TransformerXl::with_eval_rounds`].
    #[module(skip)]
    pub eval_rounds: Option<usize>,
    /// Seeded training steps taken (each draws fresh rotations and masks).
    #[module(skip)]
    pub steps: StepCounter,
    /// A device stack's training passes draw their dropout masks from this seed instead of
    /// the device's generator ([`with_dropout_seed`](TransformerXl::with_dropout_seed)).
    #[module(skip)]
    pub dropout_seed: Option<u64>,
    /// The compression functions of a Compressive Transformer (`XlConfig::compressive`).
    pub compressive: Option<crate::compressive::Compression>,
    /// The memory tokens of a Recurrent Memory Transformer (`XlConfig::rmt`).
    pub rmt: Option<crate::rmt::Rmt>,
    /// The recurrent layer's state parameters of a Block-Recurrent Transformer
    /// (`XlConfig::block_recurrent`).
    pub block_recurrent: Option<crate::block_recurrent::BlockRecurrent>,
}

/// The input embedding of the stack.
///
/// # Shapes
/// - `tokens`: `[batch, len]` → `[batch, len, d_model]`
#[derive(Module, Debug)]
pub enum InputEmbedding {
    /// One `[vocab, d_model]` table.
    Plain(Embedding),
    /// Adaptive input embedding (Baevski & Auli 2019), its `sqrt(d_model)` scale inside.
    Adaptive(AdaptiveEmbedding),
}

impl InputEmbedding {
    /// The plain table, if the embedding is one.
    pub fn plain(&self) -> Option<&Embedding> {
        match self {
            InputEmbedding::Plain(e) => Some(e),
            InputEmbedding::Adaptive(_) => None,
        }
    }

    /// The adaptive embedding, if the embedding is one.
    pub fn adaptive(&self) -> Option<&AdaptiveEmbedding> {
        match self {
            InputEmbedding::Plain(_) => None,
            InputEmbedding::Adaptive(e) => Some(e),
        }
    }

    /// The device of the parameters.
    pub fn device(&self) -> Device {
        match self {
            InputEmbedding::Plain(e) => e.weight.val().device(),
            InputEmbedding::Adaptive(e) => e.tables()[0].val().device(),
        }
    }

    /// `s · E[tokens]` for a plain table (`scale` = `s`: `sqrt(d_model)` or 1); the adaptive
    /// embedding applies its own scale and ignores `scale`.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]` → `[batch, len, d_model]`
    pub fn embed(&self, tokens: Tensor<2, Int>, scale: f64) -> Tensor<3> {
        match self {
            InputEmbedding::Plain(e) => {
                let x = e.forward(tokens);
                if scale == 1.0 { x } else { x.mul_scalar(scale) }
            }
            InputEmbedding::Adaptive(e) => e.forward(tokens),
        }
    }
}

/// Sinusoidal absolute position encodings of positions `0..len` (Vaswani et al. 2017, sec.
/// 3.5: `PE(p, 2k) = sin(p / 10000^(2k/d))`, `PE(p, 2k+1) = cos(...)`, here laid out as the
/// XL sinusoid is, sines in the first half and cosines in the second).
///
/// # Shapes
/// - output: `[len, d_model]`
pub fn absolute_positions(len: usize, d_model: usize, device: &Device) -> Tensor<2> {
    let mut data = Vec::with_capacity(len * d_model);
    for p in 0..len {
        memzoo_relative::positions::sinusoid(p as i64, d_model, &mut data);
    }
    Tensor::from_data(TensorData::new(data, [len, d_model]), device)
}

/// The output distribution of the stack.
#[derive(Module, Debug)]
pub enum OutputLayer {
    /// Logits `h Eᵀ + b` against the plain embedding table; holds `b`, `[vocab]`.
    Tied(Param<Tensor<1>>),
    /// A separate linear layer `d_model -> vocab`.
    Linear(Linear),
    /// Projected adaptive log-softmax (Grave et al. 2017), its tied tables and projections
    /// read from the adaptive embedding.
    Adaptive(AdaptiveLogSoftmax),
}

impl TransformerXl {
    /// The same model with another memory length (e.g. longer for evaluation, as the paper).
    pub fn with_mem_len(mut self, mem_len: usize) -> Self {
        self.mem_len = mem_len;
        // kNN layers fed from the XL memory's evictions follow its length.
        for layer in self.layers.iter_mut() {
            if let LayerAttention::Knn(a) = &mut layer.attention
                && a.evicted_feed().is_some()
            {
                a.set_evicted_feed(Some(mem_len));
            }
        }
        self
    }

    /// The model for generating in segments of at most `segment_len` tokens: the same
    /// logits from the same tokens at less cost per pass, with a state of its own. Its XL
    /// memory caches every layer's keys and values ([`caching_keys_values`](Self::caching_keys_values)),
    /// and its XL-position layers hold `W_R R_d` for every distance a pass can reach,
    /// `mem_len + segment_len - 1` (or `clamp_len`), instead of projecting a sinusoid per
    /// column in every pass. `None` where the stack caches no keys.
    ///
    /// Per token of one-token generation over a memory of `m` positions, each layer then
    /// computes only the scores and the weighted values over the `m` keys (`~4 h d_head`
    /// FLOPs per position) instead of also projecting their keys, values and positions
    /// (`6 d_model h d_head`).
    pub fn for_generation(&self, segment_len: usize) -> Option<Self> {
        let mut model = self.caching_keys_values()?;
        let max_distance = self.mem_len + segment_len.max(1) - 1;
        model.layers = std::mem::take(&mut model.layers)
            .into_iter()
            .map(|l| l.with_position_table(max_distance))
            .collect();
        model.position_table = Some(max_distance);
        // Relative and kNN layers read a memory that holds the segment (LSH and local ones
        // read `cat(memory, x)` of layer inputs, which the stack does not cache for them).
        model.memory_holds_segment = self.relative_and_knn_only();
        Some(model)
    }

    /// Whether every layer is a relative or a kNN attention (no LSH or local ones).
    pub fn relative_and_knn_only(&self) -> bool {
        self.layers.iter().all(|l| {
            matches!(
                l.attention,
                LayerAttention::Relative(_) | LayerAttention::Knn(_)
            )
        })
    }

    /// The same model with an XL memory that caches every layer's keys and values
    /// (`XlConfig::compat.memory_keys_values`) instead of its inputs; `None` where the stack
    /// cannot (LSH or local layers, reversible residuals, `zero_first_memory`, a compressive,
    /// RMT or Block-Recurrent stack) or already does.
    ///
    /// Both compute the same logits from the same tokens: the cache holds `W_k h`, `W_v h`
    /// (pre-LN: of `LN(h)`), which the input memory projects again in every segment. In
    /// generation one token at a time over a memory of `m` positions, that projection is
    /// `4 d_model h d_head` FLOPs per position and layer, most of a token's cost; the cache
    /// computes it once per position. Not for training: gradients do not reach `W_k`, `W_v`
    /// through the memory (they never do across segments, which are detached).
    pub fn caching_keys_values(&self) -> Option<Self> {
        let unsupported = self.memory_keys_values
            || self.residual == Residual::Reversible
            || self.zero_first_memory
            || self.compressive.is_some()
            || self.rmt.is_some()
            || self.block_recurrent.is_some();
        if unsupported {
            return None;
        }
        let mut model = self.clone();
        model.layers = std::mem::take(&mut model.layers)
            .into_iter()
            .map(XlLayer::caching_keys_values)
            .collect::<Option<Vec<_>>>()?;
        model.memory_keys_values = true;
        Some(model)
    }

    /// Options of a seeded evaluation pass: rotations fixed by `lsh.seed`, no dropout (and
    /// [`with_eval_rounds`](Self::with_eval_rounds)'s hash rounds).
    pub fn eval_options(&self) -> ForwardOptions {
        let opts = ForwardOptions::eval(self.lsh_seed);
        match self.eval_rounds {
            Some(r) => opts.with_rounds(r),
            None => opts,
        }
    }

    /// The same model evaluated (seeded passes) with `n_rounds` hash rounds in every LSH layer
    /// (more rounds: fewer (query, key) pairs missed by the hashing; the Reformer paper
    /// evaluates a model trained with few rounds with more).
    pub fn with_eval_rounds(mut self, n_rounds: usize) -> Self {
        self.eval_rounds = Some(n_rounds);
        self
    }

    /// Options of the next seeded training step: a fresh seed (from `train_seed` and a step
    /// counter) for rotations and dropout masks.
    pub fn next_train_options(&self) -> ForwardOptions {
        ForwardOptions::train(mix(self.train_seed, self.steps.next()))
    }

    /// The same model with a step counter of its own at `count`: its next seeded training
    /// step draws from `mix(train_seed, count)` (see [`StepCounter`]).
    pub fn with_step_count(mut self, count: u64) -> Self {
        self.steps = StepCounter::at(count);
        self
    }

    /// The same model whose training passes, in a device stack ([`Randomness::Device`]), draw
    /// every dropout mask from `seed` instead of the device's generator (`None`: from the
    /// generator again): the masks of embeddings, attention (output and probabilities),
    /// feed-forward and final output, at the sites and rates the generator would have drawn
    /// them, each from `seed`, the layer and the site. A pass is then one function of its seed,
    /// whichever thread runs it and whatever was drawn before (replicas on threads, a resumed
    /// run). LSH layers keep their fixed rotations. A seeded stack ignores it (its step counter
    /// seeds it, [`with_step_count`](Self::with_step_count)).
    pub fn with_dropout_seed(mut self, seed: Option<u64>) -> Self {
        self.dropout_seed = seed;
        self
    }

    /// Options of the next training pass: a seeded stack's fresh ones
    /// ([`next_train_options`](Self::next_train_options)), a device stack's from its dropout
    /// seed ([`with_dropout_seed`](Self::with_dropout_seed)); `None`: the device's generator
    /// draws (a device stack without a dropout seed).
    pub fn train_options(&self) -> Option<ForwardOptions> {
        match self.randomness {
            Randomness::Seeded => Some(self.next_train_options()),
            Randomness::Device => self.dropout_seed.map(ForwardOptions::train),
        }
    }

    /// The kind of every layer, bottom to top.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        self.layers.iter().map(|l| l.attention.kind()).collect()
    }

    /// The model family the stack is, by its layers (the label checkpoints carry): `memorizing`
    /// with kNN layers, `reformer` with LSH or local attention layers (and no kNN ones), `xl`
    /// otherwise. The randomness does not enter: an XL stack with `randomness = "seeded"` is
    /// still `xl`.
    pub fn stack_family(&self) -> &'static str {
        if self.compressive.is_some() {
            return "compressive";
        }
        if self.rmt.is_some() {
            return "rmt";
        }
        if self.block_recurrent.is_some() {
            return "block-recurrent";
        }
        LayerKind::family_of(&self.layer_kinds())
    }

    /// The label checkpoints written before [`stack_family`](Self::stack_family) looked at the
    /// layers gave this stack: `memorizing` with kNN layers, else `reformer` with seeded
    /// randomness, else `xl`. Loading accepts it beside the current one, so older runs still
    /// resume and generate.
    pub fn legacy_family(&self) -> &'static str {
        if self.n_knn_layers() > 0 {
            "memorizing"
        } else if self.randomness == Randomness::Seeded {
            "reformer"
        } else {
            "xl"
        }
    }

    /// Number of kNN layers.
    pub fn n_knn_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.attention, LayerAttention::Knn(_)))
            .count()
    }

    /// The kNN attention of every kNN layer, bottom to top.
    pub fn knn_attentions(&self) -> impl Iterator<Item = &KnnAttention> {
        self.layers.iter().filter_map(|l| match &l.attention {
            LayerAttention::Knn(a) => Some(a),
            _ => None,
        })
    }

    /// The attention mask the model uses by default: causal, and with `same_length` a window
    /// of `mem_len` keys.
    pub fn default_mask(&self) -> AttentionMask {
        AttentionMask::Causal {
            window: self.same_length.then_some(self.mem_len),
        }
    }

    /// Empty kNN memories (one per kNN layer) for `batch` rows, and no XL memory.
    pub fn new_state(&self, batch: usize, device: &Device) -> Result<XlState, XlError> {
        let knn = (0..self.n_knn_layers())
            .map(|_| self.knn_memory.init(batch, device))
            .collect::<Result<_, _>>()?;
        Ok(XlState::with_knn(knn))
    }

    /// With `zero_first_memory`, the memory a sequence starts from when `memory` is empty:
    /// `mem_len` zero vectors per layer (HF's `init_mems`); `None` otherwise.
    pub(crate) fn first_memory(
        &self,
        memory: &XlMemory,
        batch: usize,
        device: &Device,
    ) -> Option<XlMemory> {
        (self.zero_first_memory && memory.is_empty() && self.mem_len > 0)
            .then(|| XlMemory::zeros(self.layers.len(), batch, self.mem_len, self.d_model, device))
    }

    /// Reads one segment with the model's default (causal) mask.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`; every `memory` layer `[batch, mlen, d_model]`
    pub fn forward(&self, tokens: Tensor<2, Int>, memory: &XlMemory) -> Result<XlOutput, XlError> {
        self.forward_masked(tokens, memory, &self.default_mask())
    }

    /// Reads one segment with an explicit mask over its `mlen + qlen` keys (a stack without
    /// kNN layers; see [`forward_state`](Self::forward_state) for those).
    pub fn forward_masked(
        &self,
        tokens: Tensor<2, Int>,
        memory: &XlMemory,
        mask: &AttentionMask,
    ) -> Result<XlOutput, XlError> {
        if self.n_knn_layers() > 0
            || self.compressive.is_some()
            || self.rmt.is_some()
            || self.block_recurrent.is_some()
        {
            return Err(XlError::Input(format!(
                "this stack has kNN layers or a carried memory besides the XL memory ({:?}, \
                 {}): read it with forward_state and an XlState",
                self.layer_kinds(),
                self.stack_family()
            )));
        }
        let first = self.first_memory(memory, tokens.dims()[0], &tokens.device());
        // A clone shares the tensors; a pass that appends in place copies them first.
        let mut memory = first.unwrap_or_else(|| memory.clone());
        let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
        let (hidden, inputs) = self.run(tokens, &mut memory, mask, &mut [], opts.as_ref())?;
        Ok(XlOutput {
            hidden,
            memory: self.next_memory(memory, &inputs, self.mem_len, true),
        })
    }

    /// Reads one segment; returns the final hidden states and updates `state` (the XL memory
    /// and, in kNN layers, retrieval from and then addition to their kNN memories).
    /// `reset[b]`: row `b` starts a new document here (with `document_resets`: its kNN
    /// memories are cleared and its XL memory hidden). A seeded stack reads with its
    /// evaluation options ([`eval_options`](Self::eval_options): fixed rotations, no dropout).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub fn forward_state(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<Tensor<3>, XlError> {
        let opts = (self.randomness == Randomness::Seeded).then(|| self.eval_options());
        self.forward_state_with(tokens, state, reset, opts.as_ref())
    }

    /// [`forward_state`](Self::forward_state) under explicit seeded options (`None`: the
    /// device's randomness), with a graph for plain autodiff.
    pub(crate) fn forward_state_with(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        self.forward_state_traced(tokens, state, reset, opts, None)
    }

    /// [`forward_state_with`](Self::forward_state_with), every layer recording into `trace`
    /// (when given) what its attention did.
    pub(crate) fn forward_state_traced(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
        trace: Option<&Trace>,
    ) -> Result<Tensor<3>, XlError> {
        // A compressive stack reads through its own path.
        if self.compressive.is_some() {
            return Ok(self
                .forward_compressive(tokens, state, reset, opts, false, trace)?
                .0);
        }
        // A Recurrent Memory Transformer reads its memory tokens (detached after the read).
        if self.rmt.is_some() {
            return self.forward_rmt(tokens, state, reset, opts, false, trace);
        }
        // A Block-Recurrent Transformer carries its state (detached after the read).
        if self.block_recurrent.is_some() {
            return self.forward_block_recurrent(tokens, state, reset, opts, false, trace);
        }
        let qlen = tokens.dims()[1];
        let mask = self.prepare(&tokens, state, reset)?;
        let knn = &mut state.knn;
        let (hidden, inputs) = self.run_traced(tokens, &mut state.xl, &mask, knn, opts, trace)?;
        self.advance(state, &inputs, qlen);
        Ok(hidden)
    }

    /// Checks `state` against the segment, clears the rows that start a document, and returns
    /// the attention mask over `mlen + qlen` keys.
    pub(crate) fn prepare(
        &self,
        tokens: &Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<AttentionMask, XlError> {
        self.reset_rows(tokens, state, reset)?;
        let qlen = tokens.dims()[1];
        Ok(if self.document_resets {
            document_mask(
                &state.xl_valid,
                qlen,
                state.xl.len(),
                self.same_length.then_some(self.mem_len),
                &tokens.device(),
            )
        } else {
            self.default_mask()
        })
    }

    /// [`prepare`](Self::prepare)'s work on the state alone: checks `state` against the
    /// segment and clears the rows that start a document (their kNN memories, and with
    /// `document_resets` their valid XL memory), for a caller that builds its own mask.
    pub(crate) fn reset_rows(
        &self,
        tokens: &Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
    ) -> Result<(), XlError> {
        let batch = tokens.dims()[0];
        let device = tokens.device();
        if reset.len() != batch {
            return Err(XlError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        let n_knn = self.n_knn_layers();
        if state.knn.is_empty() && n_knn > 0 {
            state.knn = self.new_state(batch, &device)?.knn;
        }
        if state.knn.len() != n_knn {
            return Err(XlError::Input(format!(
                "state has {} kNN memories, the model {n_knn} kNN layers",
                state.knn.len()
            )));
        }
        if let Some(m) = state.knn.iter().find(|m| m.batch() != batch) {
            return Err(XlError::Input(format!(
                "kNN memory has {} rows, tokens have batch {batch}",
                m.batch()
            )));
        }
        if let Some(zeros) = self.first_memory(&state.xl, batch, &device) {
            state.xl = zeros;
        }
        let mlen = state.xl.len();
        if self.document_resets {
            let rows: Vec<usize> = (0..batch).filter(|&b| reset[b]).collect();
            for m in state.knn.iter_mut() {
                m.clear(&rows)?;
            }
            if state.xl_valid.len() != batch {
                state.xl_valid = vec![mlen; batch];
            }
            for (v, &r) in state.xl_valid.iter_mut().zip(reset) {
                if r {
                    *v = 0;
                }
            }
        }
        Ok(())
    }

    /// Moves the XL memory on past a segment of `qlen` whose layers read `inputs`.
    pub(crate) fn advance(&self, state: &mut XlState, inputs: &[Tensor<3>], qlen: usize) {
        self.advance_with(state, inputs, qlen, true);
    }

    /// [`advance`](Self::advance), the new memory detached or (`detach = false`, a
    /// Block-Recurrent unroll's key/value memory) in the graph.
    pub(crate) fn advance_with(
        &self,
        state: &mut XlState,
        inputs: &[Tensor<3>],
        qlen: usize,
        detach: bool,
    ) {
        state.xl = self.next_memory(std::mem::take(&mut state.xl), inputs, self.mem_len, detach);
        if self.document_resets {
            let new_mlen = state.xl.len();
            for v in state.xl_valid.iter_mut() {
                *v = (*v + qlen).min(new_mlen);
            }
        }
    }

    /// The memory after a pass over `memory` whose layers left `inputs` ([`run`](Self::run)):
    /// the last `mem_len` positions of each layer's `cat(memory, input)`; where the pass
    /// appended to the memory itself ([`memory_holds_segment`](Self::memory_holds_segment)),
    /// its last `mem_len` positions.
    pub(crate) fn next_memory(
        &self,
        memory: XlMemory,
        inputs: &[Tensor<3>],
        mem_len: usize,
        detach: bool,
    ) -> XlMemory {
        match self.memory_holds_segment {
            true => memory.keep_recent(mem_len),
            false => memory.update_with(inputs, mem_len, detach),
        }
    }

    /// One position context per position scheme in use (most stacks use one), checked
    /// against the mask.
    pub(crate) fn contexts(
        &self,
        batch: usize,
        qlen: usize,
        mlen: usize,
        mask: &AttentionMask,
        device: &Device,
    ) -> Result<Vec<ContextEntry<'_>>, XlError> {
        let mut contexts: Vec<ContextEntry<'_>> = Vec::new();
        for (layer, p) in self
            .layers
            .iter()
            .filter_map(|l| Some((l, l.attention.positions()?)))
        {
            let key = self.shared_t5_key(layer, p);
            if !contexts.iter().any(|(q, k, _)| *q == p && *k == key) {
                // Generation: XL positions from the layers' tables where they reach.
                let ctx = self
                    .position_table
                    .and_then(|max| {
                        RelativeContext::with_table_rows(p, max, qlen, mlen, mask, device)
                    })
                    .unwrap_or_else(|| {
                        RelativeContext::new(p, self.d_model, qlen, mlen, mask, device)
                    });
                // With `shared_t5`: the model's table of this kind of layer.
                let ctx = match (key, &self.shared_t5) {
                    (Some(knn), Some(t)) => match t.table(knn) {
                        Some(table) => ctx.with_t5_table(table.val()),
                        None => ctx,
                    },
                    _ => ctx,
                };
                // Value residuals: the pass's first layer leaves its values to the others.
                let ctx = match self.value_residual() {
                    true => ctx.with_value_residual(),
                    false => ctx,
                };
                let ctx = match self.memory_holds_segment {
                    true => ctx.with_memory_holding_segment(),
                    false => ctx,
                };
                contexts.push((p, key, ctx));
            }
        }
        if let Some(m) = contexts.first().and_then(|(_, _, c)| c.mask.as_ref()) {
            let [mb, mq, mk] = m.dims();
            if (mb != 1 && mb != batch) || mq != qlen || mk != qlen + mlen {
                return Err(XlError::Input(format!(
                    "mask has shape [{mb}, {mq}, {mk}], expected [1 or {batch}, {qlen}, {}]",
                    qlen + mlen
                )));
            }
        }
        Ok(contexts)
    }

    /// Which shared T5 table a layer with positions `p` reads (`shared_t5`): `Some(true)` the
    /// kNN layers', `Some(false)` the T5 layers'; `None`: its own (no sharing, or not T5).
    pub(crate) fn shared_t5_key(&self, layer: &XlLayer, p: &PositionConfig) -> Option<bool> {
        (self.shared_t5.is_some() && p.kind == PositionKind::T5)
            .then_some(matches!(layer.attention, LayerAttention::Knn(_)))
    }

    /// What layer `l` reads besides its input: its position context, the shared biases, its
    /// kNN memory (`knn`) and its seeded options.
    pub(crate) fn layer_context<'a>(
        &'a self,
        l: usize,
        contexts: &'a [ContextEntry<'a>],
        knn: Option<&'a mut (dyn KnnIndex + 'static)>,
        opts: Option<&ForwardOptions>,
    ) -> LayerContext<'a> {
        let layer = &self.layers[l];
        let positions = layer
            .attention
            .positions()
            .and_then(|p| {
                let key = self.shared_t5_key(layer, p);
                contexts.iter().find(|(q, k, _)| *q == p && *k == key)
            })
            .map(|(_, _, ctx)| ctx);
        LayerContext {
            positions,
            shared: self.shared_biases.as_ref(),
            knn: knn.map(|s| (s, self.top_k)),
            seed: self.lsh_seed.wrapping_add(l as u64),
            opts: opts.map(|o| o.child(TAG_LAYER + l as u64)),
            randomness: self.randomness,
            trace: None,
        }
    }

    /// `h_0`: the token embedding (times `sqrt(d_model)` unless off; adaptive:
    /// `Σ_i 1[t in cluster i] E_i P_i · sqrt(d_model)`), plus axial positions, with dropout.
    pub(crate) fn embed(
        &self,
        tokens: Tensor<2, Int>,
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        self.embed_from(tokens, opts, 0)
    }

    /// [`embed`](Self::embed) of tokens at positions `first..` of their segment (absolute or
    /// learned positions; generation reads a segment's later tokens on their own).
    pub(crate) fn embed_from(
        &self,
        tokens: Tensor<2, Int>,
        opts: Option<&ForwardOptions>,
        first: usize,
    ) -> Result<Tensor<3>, XlError> {
        let qlen = tokens.dims()[1];
        let device = tokens.device();
        let mut h = self.embedding.embed(tokens, self.scale);
        if let Some(axial) = &self.axial {
            if first > 0 {
                return Err(XlError::Input(format!(
                    "axial positions index whole sequences: tokens from position {first} \
                     cannot be read on their own"
                )));
            }
            h = h + axial.forward(qlen)?;
        }
        if let Some(table) = &self.position_embedding {
            let rows = table.weight.dims()[0];
            if first + qlen > rows {
                return Err(XlError::Input(format!(
                    "a segment of {} tokens, the learned positions cover {rows} \
                     (learned_positions)",
                    first + qlen
                )));
            }
            h = h + table
                .weight
                .val()
                .narrow(0, first, qlen)
                .unsqueeze_dim::<3>(0);
        } else if self.absolute_positions() {
            let table = absolute_positions(first + qlen, self.d_model, &device);
            h = h + table.narrow(0, first, qlen).unsqueeze_dim::<3>(0);
        }
        // e ← f e + (1 − f) stopgrad(e): the forward unchanged, the gradient scaled by f.
        let f = self.embedding_gradient_scale;
        if f != 1.0 {
            h = h.clone().mul_scalar(f) + h.detach().mul_scalar(1.0 - f);
        }
        if !self.embedding_dropout {
            return Ok(h);
        }
        Ok(match opts {
            Some(o) => seeded_dropout(h, self.dropout.prob, o, TAG_EMBED),
            None => self.dropout.forward(h),
        })
    }

    /// The head's input from the last layer's output(s): the final norm (where there is one)
    /// and dropout.
    pub(crate) fn finish(&self, h: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        let h = match &self.final_norm {
            Some(norm) => norm.forward(h),
            None => h,
        };
        if !self.final_dropout {
            return h;
        }
        match opts {
            Some(o) => seeded_dropout(h, self.dropout.prob, o, TAG_FINAL),
            None => self.dropout.forward(h),
        }
    }

    /// The layers over one segment: final hidden states (after the final norm and dropout)
    /// and every layer's memory material (its input; reversible: its `x_2` stream). `knn`:
    /// one memory per kNN layer.
    pub(crate) fn run(
        &self,
        tokens: Tensor<2, Int>,
        memory: &mut XlMemory,
        mask: &AttentionMask,
        knn: &mut [Box<dyn KnnIndex>],
        opts: Option<&ForwardOptions>,
    ) -> Result<(Tensor<3>, Vec<Tensor<3>>), XlError> {
        self.run_traced(tokens, memory, mask, knn, opts, None)
    }

    /// [`run`](Self::run), every layer recording into `trace` (when given).
    pub(crate) fn run_traced(
        &self,
        tokens: Tensor<2, Int>,
        memory: &mut XlMemory,
        mask: &AttentionMask,
        knn: &mut [Box<dyn KnnIndex>],
        opts: Option<&ForwardOptions>,
        trace: Option<&Trace>,
    ) -> Result<(Tensor<3>, Vec<Tensor<3>>), XlError> {
        let [batch, qlen] = tokens.dims();
        self.check_memory(batch, memory)?;
        let device = tokens.device();
        let contexts = self.contexts(batch, qlen, memory.len(), mask, &device)?;
        let h = self.embed(tokens, opts)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut stores = knn.iter_mut();
        let mut next_store = |layer: &XlLayer| match layer.attention {
            LayerAttention::Knn(_) => stores
                .next()
                .map(|s| Some(s.as_mut()))
                .ok_or_else(|| XlError::Input("fewer kNN memories than kNN layers".into())),
            _ => Ok(None),
        };
        let h = match self.residual {
            Residual::Sequential => {
                let mut h = expand_streams(h, self.residual_streams);
                if self.memory_holds_segment {
                    memory.begin_append(qlen);
                }
                // (A failed pass leaves the memory as it was, below.)
                let pass = || -> Result<Tensor<3>, XlError> {
                    for (l, layer) in self.layers.iter().enumerate() {
                        // The layer's input, or its keys/values (`memory_keys_values`).
                        let cached = match self.memory_keys_values {
                            true => layer.cache_entry(h.clone()).ok_or_else(|| {
                                XlError::Input(format!("layer {l} caches no keys/values"))
                            })?,
                            false => h.clone(),
                        };
                        // Generation: the segment's entries appended to the memory in place.
                        let (cached, read) = match self.memory_holds_segment {
                            true => {
                                let all = memory.append(l, cached).map_err(XlError::Input)?;
                                (all.clone(), Some(all))
                            }
                            false => (cached, memory.layer(l).cloned()),
                        };
                        inputs.push(cached);
                        let mut cx = self.layer_context(l, &contexts, next_store(layer)?, opts);
                        cx.trace = trace.map(|t| t.slot(l, ProbeLayout::XlMemory));
                        h = layer.forward(h, read, cx)?;
                    }
                    Ok(h)
                };
                let h = pass();
                if self.memory_holds_segment {
                    memory.finish_append(h.is_ok());
                }
                reduce_streams(h?, self.residual_streams)
            }
            Residual::Reversible => {
                let (mut x1, mut x2) = (h.clone(), h);
                for (l, layer) in self.layers.iter().enumerate() {
                    inputs.push(x2.clone());
                    let mut cx = self.layer_context(l, &contexts, next_store(layer)?, opts);
                    cx.trace = trace.map(|t| t.slot(l, ProbeLayout::XlMemory));
                    let (y1, y2, _) =
                        layer.forward_reversible(x1, x2, memory.layer(l).cloned(), cx)?;
                    (x1, x2) = (y1, y2);
                }
                self.merge_streams(x1, x2)
            }
        };
        Ok((self.finish(h, opts), inputs))
    }

    /// The head's input from a reversible stack's streams: `(y_1 + y_2) / 2`, or
    /// `cat(y_1, y_2)` (`[batch, len, 2 d_model]`) with a `concat` head.
    pub(crate) fn merge_streams(&self, y1: Tensor<3>, y2: Tensor<3>) -> Tensor<3> {
        match self.head_input {
            HeadInput::Mean => (y1 + y2).mul_scalar(0.5),
            HeadInput::Concat => Tensor::cat(vec![y1, y2], 2),
        }
    }

    /// Whether layers mix the first layer's values into theirs (`compat.value_residual`: some
    /// layer has a value gate).
    pub fn value_residual(&self) -> bool {
        self.layers
            .iter()
            .any(|l| l.attention.relative().is_some_and(|a| a.has_value_gate()))
    }

    /// Whether the stack's layers are absolute ([`LayerKind::Absolute`]): its embeddings then
    /// carry sinusoidal positions of the segment.
    pub fn absolute_positions(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.attention.kind() == LayerKind::Absolute)
    }

    pub(crate) fn check_memory(&self, batch: usize, memory: &XlMemory) -> Result<(), XlError> {
        if memory.is_empty() {
            return Ok(());
        }
        if self.absolute_positions() {
            return Err(XlError::Input(format!(
                "a memory of {} positions reaches a stack with absolute positions, which index \
                 one segment (the memory's keys would share the segment's positions): read it \
                 with mem_len 0",
                memory.len()
            )));
        }
        if self.axial.is_some() {
            return Err(XlError::Input(format!(
                "a memory of {} positions reaches a stack with axial positions, which index one \
                 segment (the memory's keys would share the segment's positions): read it with \
                 mem_len 0",
                memory.len()
            )));
        }
        if memory.n_layers() != self.layers.len() {
            return Err(XlError::Input(format!(
                "memory has {} layers, the model {}",
                memory.n_layers(),
                self.layers.len()
            )));
        }
        let [mb, _, md] = memory.layer(0).expect("non-empty").dims();
        // Layer inputs, or cached keys/values of 2 kv heads x d_head.
        let width = match (self.memory_keys_values, self.layers[0].attention.relative()) {
            (true, Some(a)) => 2 * a.n_kv_heads * a.d_head,
            _ => self.d_model,
        };
        if mb != batch || md != width {
            return Err(XlError::Input(format!(
                "memory is [{mb}, _, {md}], tokens need [{batch}, _, {width}]"
            )));
        }
        Ok(())
    }

    /// Generation step's head: the output distribution of hidden states as logits, `h Eᵀ + b`
    /// (tied) or a separate linear layer; for an adaptive output the full log-probabilities
    /// (which are their own logits: `log_softmax(log p) = log p`). Losses do not go through
    /// here but through [`eval_step`](Self::eval_step) / [`train_step`](Self::train_step),
    /// which score only the targets (an adaptive output never builds `[tokens, vocab]` there).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, qlen, d_model]` → `[batch, qlen, vocab]`
    ///
    /// # Panics
    /// If `hidden` is not `d_model` wide, or the output is tied to an embedding it does not
    /// fit (a hand-assembled model; [`XlConfig::init`] and the importer build matching ones).
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        let [b, q, d] = hidden.dims();
        match (&self.output, &self.embedding) {
            (OutputLayer::Linear(output), _) => linear_rows(output, hidden),
            (OutputLayer::Tied(bias), InputEmbedding::Plain(embedding)) => {
                let w = embedding.weight.val(); // [vocab, d]
                let logits = hidden.reshape([b * q, d]).matmul(w.transpose());
                let logits = logits + bias.val().unsqueeze_dim(0);
                logits.reshape([b, q, self.vocab_size])
            }
            (OutputLayer::Adaptive(softmax), InputEmbedding::Adaptive(embedding)) => softmax
                .log_probs(hidden.reshape([b * q, d]), embedding)
                .expect("the adaptive softmax is built for its embedding and d_model")
                .reshape([b, q, self.vocab_size]),
            (OutputLayer::Tied(_), InputEmbedding::Adaptive(_))
            | (OutputLayer::Adaptive(_), InputEmbedding::Plain(_)) => {
                panic!("the output is tied to another kind of embedding")
            }
        }
    }

    /// The device of the parameters.
    pub fn device(&self) -> Device {
        self.embedding.device()
    }
}

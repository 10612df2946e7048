//! The Memorizing Transformer language model (Wu et al. 2022): Transformer-XL layers with
//! kNN-augmented attention at chosen depths.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Initializer;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_memory::{HnswConfig, IndexKind, KnnIndex, KnnMemoryConfig};
use memzoo_relative::{AttentionMask, PositionConfig, PositionKind, RelativeContext};
use memzoo_xl::{TransformerXl, XlBlock, XlConfig, XlMemory};

use crate::attention::{KnnAttention, KnnAttentionConfig};
use crate::error::KnnError;

/// Configuration of a [`MemorizingTransformer`]. Defaults: Memorizing-small (6 layers,
/// d_model 256, 8 heads x 32, T5 relative positions, XL memory 512, the kNN layer 4th of 6,
/// top-32 over 16,384 memories per row).
#[derive(Config, Debug)]
pub struct MemorizingConfig {
    /// The XL backbone: `n_layers` counts every layer, kNN ones included; `mem_len` is the
    /// XL memory. Default: XL-small with T5 positions, `mem_len` 512, pre-LN residual blocks
    /// and an untied output layer, as the reference implementation
    /// (memorizing-transformers-pytorch; the paper's decoder is pre-LN too), and weights and
    /// embedding drawn from N(0, 0.05): the scale of PyTorch's default initialisation that the
    /// reference keeps (kaiming-uniform, std `1/sqrt(3 fan_in)` = 0.051 at a fan-in of 128).
    /// With HF's 0.02 the model learnt more slowly at first (`cargo xtask bench quality`:
    /// 4.18 bpc at step 50 against the reference's 4.00; 3.99 with 0.05, and level or ahead at
    /// every later step).
    #[config(
        default = "XlConfig::new().with_positions(PositionConfig::new().with_kind(PositionKind::T5)).with_mem_len(512).with_pre_ln(true).with_tie_weights(false).with_init_std(0.05)"
    )]
    pub xl: XlConfig,
    /// 0-based depths of the kNN layers (the paper: the 9th of 12, i.e. `[8]`). Empty: plain
    /// XL with the same layers. Default: `[3]` (the 4th of 6).
    #[config(default = "vec![3]")]
    pub knn_layers: Vec<usize>,
    /// Retrieved pairs per query. Default: 32 (the paper).
    #[config(default = 32)]
    pub top_k: usize,
    /// kNN memories per (batch row, head), oldest evicted first. Default: 16,384.
    #[config(default = 16384)]
    pub max_memories: usize,
    /// kNN search structure. Default: `auto` (exact up to `auto_crossover`, then HNSW).
    #[config(default = "IndexKind::Auto")]
    pub index: IndexKind,
    /// Where `auto` switches to HNSW. Default: 262,144 (see `KnnMemoryConfig`).
    #[config(default = 262144)]
    pub auto_crossover: usize,
    /// HNSW parameters. Default: connectivity 32, expansion_add 64, expansion_search by size.
    #[config(default = "HnswConfig::new()")]
    pub hnsw: HnswConfig,
    /// Keep the XL memory (segment recurrence); false: `mem_len` 0. Default: true.
    #[config(default = true)]
    pub xl_memory: bool,
    /// Initial temperature of the kNN layers' normalised scores. Default: 20.
    #[config(default = 20.0)]
    pub attn_scale_init: f64,
}

impl MemorizingConfig {
    /// The XL backbone of the plain (non-kNN) layers.
    fn backbone(&self) -> XlConfig {
        let n = self.xl.n_layers.saturating_sub(self.knn_layers.len());
        let mem_len = if self.xl_memory { self.xl.mem_len } else { 0 };
        self.xl.clone().with_n_layers(n).with_mem_len(mem_len)
    }

    fn knn_attention(&self) -> KnnAttentionConfig {
        let xl = &self.xl;
        KnnAttentionConfig::new(xl.d_model, xl.n_heads, xl.head_width())
            .with_dropout(xl.dropout)
            .with_dropatt(xl.dropatt)
            .with_attn_scale_init(self.attn_scale_init)
            .with_initializer(Initializer::Normal {
                mean: 0.0,
                std: xl.init_std,
            })
    }

    /// The configuration of every kNN layer's memory.
    pub fn memory(&self) -> KnnMemoryConfig {
        KnnMemoryConfig::new(self.xl.n_heads, self.xl.head_width())
            .with_max_memories(self.max_memories)
            .with_kind(self.index)
            .with_auto_crossover(self.auto_crossover)
            .with_hnsw(self.hnsw.clone())
    }

    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), KnnError> {
        self.xl.validate()?;
        if self.xl.same_length {
            // Every layer (the kNN one's local attention too) attends under a plain causal
            // mask; accepting the flag would silently train another model than asked for.
            return Err(KnnError::Config(
                "xl.same_length = true is not supported by the Memorizing Transformer (its \
                 layers use a plain causal mask): set it to false"
                    .into(),
            ));
        }
        let n = self.xl.n_layers;
        let mut seen = vec![false; n];
        for &l in &self.knn_layers {
            if l >= n {
                return Err(KnnError::Config(format!(
                    "knn_layers contains {l}, but there are only {n} layers (0-based)"
                )));
            }
            if std::mem::replace(&mut seen[l], true) {
                return Err(KnnError::Config(format!(
                    "knn_layers lists layer {l} twice"
                )));
            }
        }
        if self.knn_layers.len() == n {
            return Err(KnnError::Config(format!(
                "all {n} layers are kNN layers; at least one must be a plain XL layer"
            )));
        }
        if self.top_k == 0 {
            return Err(KnnError::Config("top_k must be positive, got 0".into()));
        }
        if self.top_k > self.max_memories {
            return Err(KnnError::Config(format!(
                "top_k ({}) exceeds max_memories ({})",
                self.top_k, self.max_memories
            )));
        }
        self.backbone().validate()?;
        self.knn_attention().validate()?;
        self.memory().validate()?;
        Ok(())
    }

    /// Validates the config and initialises the model.
    pub fn init(&self, device: &Device) -> Result<MemorizingTransformer, KnnError> {
        self.validate()?;
        let xl = &self.xl;
        let attention = self.knn_attention();
        let mut knn_layers = self.knn_layers.clone();
        knn_layers.sort_unstable();
        let knn = knn_layers
            .iter()
            .map(|_| {
                Ok(KnnLayer {
                    attention: attention.init(device)?,
                    block: xl.init_block(device),
                })
            })
            .collect::<Result<Vec<_>, KnnError>>()?;
        Ok(MemorizingTransformer {
            xl: self.backbone().init(device)?,
            knn,
            knn_depths: knn_layers,
            knn_positions: attention.positions.clone(),
            memory: self.memory(),
            top_k: self.top_k,
        })
    }
}

/// A Transformer-XL layer whose attention is [`KnnAttention`]: the same residual block
/// ([`XlBlock`]: LayerNorms and feed-forward, post-LN or pre-LN) around kNN attention.
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]` → `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct KnnLayer {
    /// kNN-augmented attention.
    pub attention: KnnAttention,
    /// LayerNorms and feed-forward around it.
    pub block: XlBlock,
}

impl KnnLayer {
    /// Applies the layer, searching `knn` and then adding the segment's pairs to it.
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        ctx: &RelativeContext,
        knn: &mut dyn KnnIndex,
        top_k: usize,
    ) -> Result<Tensor<3>, KnnError> {
        self.block.forward(x, memory, |x, m| {
            self.attention.forward_and_store(x, m, ctx, knn, top_k)
        })
    }
}

/// The recurrence state of a [`MemorizingTransformer`], owned by the caller (the trainer):
/// the XL memory and one kNN memory per kNN layer. Host-side, not part of the Module.
#[derive(Debug, Default)]
pub struct MemorizingState {
    /// Cached layer inputs of the last `mem_len` positions (every layer).
    pub xl: XlMemory,
    /// One memory per kNN layer (in depth order), each with one store per (row, head).
    pub knn: Vec<Box<dyn KnnIndex>>,
    /// Per row, how many of the most recent XL memory positions belong to the row's current
    /// document (older ones are hidden from attention). Empty: all valid.
    pub xl_valid: Vec<usize>,
}

impl MemorizingState {
    /// No memory yet; the first forward pass creates the kNN memories for its batch size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries stored per row in kNN layer `l` (by depth order).
    pub fn knn_len(&self, l: usize, row: usize) -> usize {
        self.knn.get(l).map_or(0, |m| m.len(row))
    }

    /// Saves the kNN memories into `dir/knn-<i>` (the XL memory is one segment: recompute it).
    pub fn save_knn(&self, dir: &std::path::Path) -> Result<(), KnnError> {
        for (i, m) in self.knn.iter().enumerate() {
            m.save(&dir.join(format!("knn-{i}")))?;
        }
        Ok(())
    }

    /// Opens kNN memories saved by [`save_knn`](Self::save_knn) for `model` (empty XL memory).
    pub fn open_knn(
        dir: &std::path::Path,
        model: &MemorizingTransformer,
        device: &Device,
    ) -> Result<Self, KnnError> {
        let knn = (0..model.knn.len())
            .map(|i| memzoo_memory::open(&dir.join(format!("knn-{i}")), &model.memory, device))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            xl: XlMemory::empty(),
            knn,
            xl_valid: Vec::new(),
        })
    }
}

/// The Memorizing Transformer language model.
///
/// `forward(tokens, state, reset)` reads one segment: every layer attends over the XL
/// memory and the segment; the kNN layers also attend over the top-k pairs retrieved from
/// their memory and then add the segment's pairs to it. `reset[b]` marks a row whose
/// document starts at this segment: its kNN memories are cleared and its XL memory hidden.
///
/// # Shapes
/// - `tokens`: `[batch, qlen]`; hidden: `[batch, qlen, d_model]`; logits `[batch, qlen, vocab]`
#[derive(Module, Debug)]
pub struct MemorizingTransformer {
    /// The XL backbone: embedding, the plain layers (in depth order), output layer.
    pub xl: TransformerXl,
    /// The kNN layers, in depth order.
    pub knn: Vec<KnnLayer>,
    /// Depth of each kNN layer (0-based, sorted).
    pub knn_depths: Vec<usize>,
    /// Positions of the kNN layers' local attention (T5).
    #[module(skip)]
    pub knn_positions: PositionConfig,
    /// Configuration of the kNN memories.
    #[module(skip)]
    pub memory: KnnMemoryConfig,
    /// Retrieved pairs per query.
    pub top_k: usize,
}

impl MemorizingTransformer {
    /// Total number of layers.
    pub fn n_layers(&self) -> usize {
        self.xl.layers.len() + self.knn.len()
    }

    /// Empty kNN memories (one per kNN layer) for `batch` rows.
    pub fn new_state(&self, batch: usize, device: &Device) -> Result<MemorizingState, KnnError> {
        let knn = (0..self.knn.len())
            .map(|_| self.memory.init(batch, device))
            .collect::<Result<_, _>>()?;
        Ok(MemorizingState {
            xl: XlMemory::empty(),
            knn,
            xl_valid: Vec::new(),
        })
    }

    /// The causal mask over `mlen + qlen` keys that also hides, per row, the XL memory
    /// positions older than the row's document (`valid[b]` most recent ones are kept).
    fn mask(&self, valid: &[usize], qlen: usize, mlen: usize, device: &Device) -> AttentionMask {
        if valid.iter().all(|&v| v >= mlen) {
            return AttentionMask::causal();
        }
        let klen = qlen + mlen;
        let mut hidden = Vec::with_capacity(valid.len() * qlen * klen);
        for &v in valid {
            let first = mlen - v.min(mlen);
            for i in 0..qlen {
                hidden.extend((0..klen).map(|j| j > mlen + i || j < first));
            }
        }
        AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
            TensorData::new(hidden, [valid.len(), qlen, klen]),
            device,
        ))
    }

    /// Reads one segment; returns the final hidden states and updates `state`.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags → `[batch, qlen, d_model]`
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut MemorizingState,
        reset: &[bool],
    ) -> Result<Tensor<3>, KnnError> {
        let [batch, qlen] = tokens.dims();
        let device = tokens.device();
        if reset.len() != batch {
            return Err(KnnError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        if state.knn.is_empty() && !self.knn.is_empty() {
            state.knn = self.new_state(batch, &device)?.knn;
        }
        if state.knn.len() != self.knn.len() {
            return Err(KnnError::Input(format!(
                "state has {} kNN memories, the model {} kNN layers",
                state.knn.len(),
                self.knn.len()
            )));
        }
        if let Some(m) = state.knn.iter().find(|m| m.batch() != batch) {
            return Err(KnnError::Input(format!(
                "kNN memory has {} rows, tokens have batch {batch}",
                m.batch()
            )));
        }
        let memory = &state.xl;
        let n_layers = self.n_layers();
        if !memory.is_empty() {
            let [mb, _, md] = memory.layer(0).expect("non-empty").dims();
            if memory.n_layers() != n_layers || mb != batch || md != self.xl.d_model {
                return Err(KnnError::Input(format!(
                    "XL memory is {} layers x [{mb}, _, {md}], the model needs {n_layers} x [{batch}, _, {}]",
                    memory.n_layers(),
                    self.xl.d_model
                )));
            }
        }
        let rows: Vec<usize> = (0..batch).filter(|&b| reset[b]).collect();
        for m in state.knn.iter_mut() {
            m.clear(&rows)?;
        }
        let mlen = memory.len();
        if state.xl_valid.len() != batch {
            state.xl_valid = vec![mlen; batch];
        }
        for (v, &r) in state.xl_valid.iter_mut().zip(reset) {
            if r {
                *v = 0;
            }
        }
        let mask = self.mask(&state.xl_valid, qlen, mlen, &device);
        let d_model = self.xl.d_model;
        let ctx = RelativeContext::new(&self.xl.positions, d_model, qlen, mlen, &mask, &device);
        let knn_ctx = if self.knn_positions == self.xl.positions {
            ctx.clone()
        } else {
            RelativeContext::new(&self.knn_positions, d_model, qlen, mlen, &mask, &device)
        };

        // h_0 = Dropout(E[tokens] * sqrt(d_model))
        let scale = (d_model as f64).sqrt();
        let xl = &self.xl;
        let mut h = xl
            .dropout
            .forward(xl.embedding.forward(tokens).mul_scalar(scale));
        let mut inputs = Vec::with_capacity(n_layers);
        let (mut plain, mut knn) = (xl.layers.iter(), self.knn.iter().zip(state.knn.iter_mut()));
        for l in 0..n_layers {
            inputs.push(h.clone());
            let mem = memory.layer(l).cloned();
            h = if self.knn_depths.contains(&l) {
                let (layer, store) = knn.next().expect("one memory per kNN layer");
                layer.forward(h, mem, &knn_ctx, store.as_mut(), self.top_k)?
            } else {
                let layer = plain.next().expect("plain layers fill the rest");
                layer.forward(h, mem, &ctx, xl.shared_biases.as_ref())
            };
        }
        if let Some(norm) = &xl.final_norm {
            h = norm.forward(h);
        }
        state.xl = memory.update(&inputs, xl.mem_len);
        let new_mlen = state.xl.len();
        for v in state.xl_valid.iter_mut() {
            *v = (*v + qlen).min(new_mlen);
        }
        Ok(xl.dropout.forward(h))
    }

    /// Output logits from hidden states (tied embedding or the output layer).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, qlen, d_model]` → `[batch, qlen, vocab]`
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<3> {
        self.xl.logits(hidden)
    }

    /// Mean next-token cross-entropy (nats) of one segment; updates `state`.
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[batch, qlen]`; loss: `[1]`
    pub fn forward_loss(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        state: &mut MemorizingState,
        reset: &[bool],
    ) -> Result<Tensor<1>, KnnError> {
        if tokens.dims() != targets.dims() {
            return Err(KnnError::Input(format!(
                "tokens {:?} and targets {:?} differ in shape",
                tokens.dims(),
                targets.dims()
            )));
        }
        let device = tokens.device();
        let [b, q] = targets.dims();
        let hidden = self.forward(tokens, state, reset)?;
        let logits = self.logits(hidden).reshape([b * q, self.xl.vocab_size]);
        Ok(CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets.reshape([b * q])))
    }
}

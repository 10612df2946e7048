//! One layer of the stack ([`XlLayer`]): its attention of any kind in its block, the
//! reversible coupling's `F` and `G`, and what a layer reads (`LayerContext`).

use burn::module::{Module, Param};
use burn::tensor::{Int, Tensor};
use memzoo_knn::KnnAttention;
use memzoo_memory::{KnnIndex, Retrieved};
use memzoo_reformer::{
    AttentionKind as ReformerKind, ForwardOptions, ReformerAttention, reversible,
};
use memzoo_relative::{
    AttentionProbe, PositionConfig, RelativeContext, RelativeMultiHeadAttention, XlBiases,
};

use super::*;
use crate::error::XlError;

/// The attention of one layer: relative (XL, learned or T5 positions) or kNN-augmented.
#[derive(Module, Debug)]
pub enum LayerAttention {
    /// Relative multi-head attention over `cat(memory, x)`.
    Relative(RelativeMultiHeadAttention),
    /// kNN-augmented attention: local attention plus the pairs retrieved from a kNN memory.
    Knn(KnnAttention),
    /// The Reformer's LSH or local attention over `cat(memory, x)`.
    Hashed(ReformerAttention),
}

impl LayerAttention {
    /// The layer's kind.
    pub fn kind(&self) -> LayerKind {
        match self {
            LayerAttention::Relative(a) => LayerKind::of_positions(a.positions.kind),
            LayerAttention::Knn(_) => LayerKind::Knn,
            LayerAttention::Hashed(a) => match a.kind {
                ReformerKind::Lsh => LayerKind::Lsh,
                ReformerKind::Local => LayerKind::Local,
            },
        }
    }

    /// The relative attention over `cat(memory, x)`: the layer itself, or a kNN layer's local
    /// attention (its projections are shared with the retrieval, Wu et al. sec. 3); `None`
    /// for LSH and local layers.
    pub fn relative(&self) -> Option<&RelativeMultiHeadAttention> {
        match self {
            LayerAttention::Relative(a) => Some(a),
            LayerAttention::Knn(a) => Some(&a.attention),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// [`relative`](Self::relative), mutably (what an importer writes a checkpoint's weights
    /// into).
    pub fn relative_mut(&mut self) -> Option<&mut RelativeMultiHeadAttention> {
        match self {
            LayerAttention::Relative(a) => Some(a),
            LayerAttention::Knn(a) => Some(&mut a.attention),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// [`relative`](Self::relative) of a layer known to have one.
    ///
    /// # Panics
    /// On an LSH or local layer.
    pub fn local(&self) -> &RelativeMultiHeadAttention {
        self.relative()
            .expect("an LSH or local layer has no relative attention")
    }

    /// The position scheme whose [`RelativeContext`] the layer reads (`None`: it reads none).
    pub(crate) fn positions(&self) -> Option<&PositionConfig> {
        self.relative().map(|a| &a.positions)
    }
}

/// One layer of the stack: its attention over `cat(memory, x)` inside an [`XlBlock`].
///
/// # Shapes
/// - `x`: `[batch, qlen, d_model]`, `memory`: `[batch, mlen, d_model]`
/// - output: `[batch, qlen, d_model]`
#[derive(Module, Debug)]
pub struct XlLayer {
    /// The attention.
    pub attention: LayerAttention,
    /// LayerNorms and feed-forward around it.
    pub block: XlBlock,
}

/// What a layer's attention drew in a pass, replayed by the reversible backward so that it
/// differentiates exactly the forward's function.
#[derive(Clone, Debug, Default)]
pub enum Replay {
    /// Nothing to replay (relative and local attention).
    #[default]
    Nothing,
    /// The LSH bucket ids, `[batch, heads, rounds, padded len]`: hashing the rebuilt input
    /// again could flip an argmax and attend to another set of keys.
    Buckets(Box<Tensor<4, Int>>),
    /// The pairs a kNN layer retrieved (its memory has moved on since).
    Retrieved(Box<Retrieved>),
}

impl XlLayer {
    /// What a key/value XL memory (`XlConfig::memory_keys_values`) caches of this layer for
    /// its input `h`: the keys and values its attention computes from it (pre-LN: from
    /// `LN(h)`), detached; `None` for LSH and local layers.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 kv_heads d_head]`
    pub fn cache_entry(&self, h: Tensor<3>) -> Option<Tensor<3>> {
        let h = if self.block.pre_ln {
            self.block.norm_attention.forward(h)
        } else {
            h
        };
        match &self.attention {
            LayerAttention::Relative(a) => Some(a.cache_entry(h)),
            LayerAttention::Knn(a) => Some(a.cache_entry(h)),
            LayerAttention::Hashed(_) => None,
        }
    }

    /// [`cache_entry`](Self::cache_entry) kept in the graph (relative layers; `None` for
    /// the others): a Block-Recurrent stack's key/value memory within an unroll.
    ///
    /// # Shapes
    /// - `h`: `[batch, len, d_model]` → `[batch, len, 2 kv_heads d_head]`
    pub fn cache_entry_in_graph(&self, h: Tensor<3>) -> Option<Tensor<3>> {
        let h = if self.block.pre_ln {
            self.block.norm_attention.forward(h)
        } else {
            h
        };
        match &self.attention {
            LayerAttention::Relative(a) => Some(a.cache_entry_in_graph(h)),
            _ => None,
        }
    }

    /// The same layer reading its XL memory as cached keys and values
    /// ([`cache_entry`](Self::cache_entry)); `None` for LSH and local layers, which cache none.
    pub fn caching_keys_values(self) -> Option<Self> {
        let attention = match self.attention {
            LayerAttention::Relative(a) => {
                LayerAttention::Relative(a.with_memory_keys_values(true))
            }
            LayerAttention::Knn(a) => LayerAttention::Knn(a.with_memory_keys_values(true)),
            LayerAttention::Hashed(_) => return None,
        };
        let mut block = self.block;
        block.memory_keys_values = true;
        Some(Self { attention, block })
    }

    /// The same layer holding `W_R R_d` for the distances `-1 ..= max_distance` where its
    /// attention has XL positions (`RelativeMultiHeadAttention::with_position_table`).
    pub fn with_position_table(self, max_distance: usize) -> Self {
        let attention = match self.attention {
            LayerAttention::Relative(a) => {
                LayerAttention::Relative(a.with_position_table(max_distance))
            }
            LayerAttention::Knn(a) => LayerAttention::Knn(a.with_position_table(max_distance)),
            hashed => hashed,
        };
        Self { attention, ..self }
    }

    /// Applies the layer (see [`LayerContext`] for what it reads besides `x` and `memory`); a
    /// kNN layer searches its kNN memory and then adds the segment's pairs to it.
    pub fn forward(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
    ) -> Result<Tensor<3>, XlError> {
        let opts = cx.opts.clone();
        self.block.forward(x, memory, opts.as_ref(), |x, m| {
            Ok(self.attend(x, m, &mut cx, Replay::Nothing)?.0)
        })
    }

    /// `F(x) = Dropout(Attn(LN(x), LN(memory)))` of a pre-LN layer, with what the attention
    /// drew; `replay` (from an earlier pass) is attended with instead of hashing or searching.
    pub fn f(
        &self,
        x: Tensor<3>,
        memory: Option<Tensor<3>>,
        cx: &mut LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Replay), XlError> {
        let opts = cx.opts.clone();
        let mut drawn = Replay::Nothing;
        let f = self
            .block
            .attention_branch(x, memory, opts.as_ref(), |x, m| {
                let (a, r) = self.attend(x, m, cx, replay)?;
                drawn = r;
                Ok::<_, XlError>(a)
            })?;
        Ok((f, drawn))
    }

    /// `G(x) = FF(LN(x))` of a pre-LN layer (dropout from `opts` in a seeded pass).
    pub fn g(&self, x: Tensor<3>, opts: Option<&ForwardOptions>) -> Tensor<3> {
        self.block.ff_branch(x, opts)
    }

    /// One reversible layer, `(y_1, y_2) = (x_1 + F(x_2), x_2 + G(y_1))`, with what `F` drew
    /// (for [`reverse`](Self::reverse)). `memory`: the `x_2` stream of the previous segment.
    pub fn forward_reversible(
        &self,
        x1: Tensor<3>,
        x2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
    ) -> Result<(Tensor<3>, Tensor<3>, Replay), XlError> {
        let opts = cx.opts.clone();
        reversible::couple(
            x1,
            x2,
            |x2| self.f(x2, memory, &mut cx, Replay::Nothing),
            |y1| self.g(y1, opts.as_ref()),
        )
    }

    /// The inverse of [`forward_reversible`](Self::forward_reversible) (no gradients),
    /// attending as the forward did through `replay`.
    pub fn inverse(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Tensor<3>), XlError> {
        let opts = cx.opts.clone();
        let mut err = None;
        let out = reversible::uncouple(
            y1,
            y2,
            |x2| match self.f(x2.clone(), memory, &mut cx, replay) {
                Ok((f, _)) => f,
                Err(e) => {
                    err = Some(e);
                    x2.zeros_like()
                }
            },
            |y1| self.g(y1, opts.as_ref()),
        );
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// One layer of the reversible backward ([`memzoo_reformer::reversible::reverse`]): from
    /// the outputs and their gradients (untracked), the inputs and theirs, handing every
    /// partial backward's gradients to `collect`. `self` lives on an autodiff device; `cx` and
    /// `replay` are the forward's (its seeded options, the buckets or pairs it drew).
    #[allow(clippy::too_many_arguments)]
    pub fn reverse(
        &self,
        y1: Tensor<3>,
        y2: Tensor<3>,
        dy1: Tensor<3>,
        dy2: Tensor<3>,
        memory: Option<Tensor<3>>,
        mut cx: LayerContext<'_>,
        replay: Replay,
        collect: &mut impl FnMut(&mut burn::tensor::Gradients),
    ) -> Result<(Tensor<3>, Tensor<3>, Tensor<3>, Tensor<3>), XlError> {
        let opts = cx
            .opts
            .clone()
            .ok_or_else(|| XlError::Input("the reversible backward needs a seeded pass".into()))?;
        let masks = self.block.ff_masks(y1.dims(), &opts, &y1.device());
        reversible::reverse(
            y1,
            y2,
            dy1,
            dy2,
            self.block.ff_chunk_len,
            |x, range| self.block.ff_branch_part(x, &masks.slice(range)),
            |x2| Ok(self.f(x2, memory, &mut cx, replay)?.0),
            collect,
        )
    }

    /// The layer's attention alone over `cat(memory, x)` (inputs already normalised in a
    /// pre-LN block), and what it drew; `replay` (from an earlier pass) is used instead of
    /// hashing or searching again.
    pub(crate) fn attend(
        &self,
        x: Tensor<3>,
        m: Option<Tensor<3>>,
        cx: &mut LayerContext<'_>,
        replay: Replay,
    ) -> Result<(Tensor<3>, Replay), XlError> {
        let missing = |what: &str| {
            XlError::Input(format!("a {:?} layer needs {what}", self.attention.kind()))
        };
        match &self.attention {
            LayerAttention::Relative(a) => {
                let ctx = cx
                    .positions
                    .ok_or_else(|| missing("its position context"))?;
                if let Some(slot) = &cx.trace {
                    let split = slot.layout().split(ctx.mlen);
                    slot.record_probe(a.probe(x.clone(), m.clone(), ctx, cx.shared, split)?);
                }
                let out = match cx.attention_dropout_seed().filter(|_| a.has_dropout()) {
                    Some(seed) => a
                        .clone()
                        .with_dropout_seed(Some(seed))
                        .forward(x, m, ctx, cx.shared)?,
                    None => a.forward(x, m, ctx, cx.shared)?,
                };
                Ok((out, Replay::Nothing))
            }
            LayerAttention::Knn(a) => {
                let seeded = cx
                    .attention_dropout_seed()
                    .filter(|_| a.attention.has_dropout())
                    .map(|seed| a.clone().with_dropout_seed(Some(seed)));
                let a = seeded.as_ref().unwrap_or(a);
                let ctx = cx
                    .positions
                    .ok_or_else(|| missing("its position context"))?;
                if let Replay::Retrieved(found) = replay {
                    let out = a.forward_retrieving(x, m, ctx, |_| Ok(*found))?;
                    return Ok((out.output, Replay::Retrieved(Box::new(out.retrieved))));
                }
                let (store, top_k) = cx.knn.as_mut().ok_or_else(|| {
                    missing("its kNN memory: read with forward_state and an XlState")
                })?;
                let evicted = a.evicted_feed().map(|mem_len| {
                    let klen = ctx.klen();
                    (klen.saturating_sub(mem_len), m.clone(), x.clone())
                });
                // A traced pass probes the layer's attention over the pairs it retrieved.
                let probed = cx.trace.as_ref().map(|s| (s.clone(), x.clone(), m.clone()));
                let out = a.forward(x, m, ctx, &**store, *top_k)?;
                if let Some((slot, x, m)) = probed {
                    let split = slot.layout().split(ctx.mlen);
                    slot.record_probe(a.probe(x, m, ctx, &out.retrieved, split)?);
                }
                match evicted {
                    // knn.feed = evicted: the first klen - mem_len of cat(memory, x).
                    Some((n, m, x)) if n > 0 => {
                        let (k, v) = match (ctx.memory_holds_segment, m) {
                            // The cache already ends with the segment's entries.
                            (true, Some(m)) => a.leading_pairs_held(m, n),
                            (_, m) => a.leading_pairs(m, x, n),
                        };
                        store.add(k, v)?;
                    }
                    Some(_) => {}
                    None => store.add(out.keys, out.values)?,
                }
                Ok((out.output, Replay::Retrieved(Box::new(out.retrieved))))
            }
            LayerAttention::Hashed(a) => {
                // One causal sequence cat(m, x); the segment's rows of the output.
                let [_, qlen, _] = x.dims();
                let seq = match m {
                    Some(m) => Tensor::cat(vec![m, x], 1),
                    None => x,
                };
                let len = seq.dims()[1];
                let opts = match &cx.opts {
                    Some(o) if cx.randomness == Randomness::Seeded => o.child(TAG_ATTENTION),
                    _ => ForwardOptions {
                        seed: cx.seed,
                        train: seq.device().is_autodiff(),
                        n_rounds: None,
                    },
                };
                let buckets = match replay {
                    Replay::Buckets(b) => Some(*b),
                    _ => None,
                };
                let traced = cx.trace.as_ref().map(|slot| (slot.clone(), seq.clone()));
                let (out, used) = a.forward_recorded(seq, None, &opts, buckets);
                if let Some((slot, seq)) = traced {
                    let offset = len - qlen;
                    // Masses on the memory before the segment, from the same hashes.
                    let split = slot.layout().split(offset);
                    let bounds = [split.compressed, split.compressed + split.memory, len];
                    let mut masses = a.masses(seq, &bounds, &opts, used.clone()).into_iter();
                    let mut next = || {
                        masses
                            .next()
                            .expect("one mass per bound")
                            .narrow(2, offset, qlen)
                    };
                    let compressed = next();
                    slot.record_probe(AttentionProbe {
                        compressed: (split.compressed > 0).then_some(compressed),
                        memory: next(),
                        segment: next(),
                        retrieved: None,
                    });
                    if let Some(b) = &used {
                        slot.record(LayerTrace::Buckets {
                            buckets: Box::new(b.clone()),
                            offset,
                        });
                    }
                }
                let replay = used.map_or(Replay::Nothing, |b| Replay::Buckets(Box::new(b)));
                Ok((out.narrow(1, len - qlen, qlen), replay))
            }
        }
    }
}

/// A position context of one forward pass: the scheme, the shared T5 table it carries
/// (`Some(knn)`, see `TransformerXl::shared_t5`; `None`: none) and the context.
pub(crate) type ContextEntry<'a> = (&'a PositionConfig, Option<bool>, RelativeContext);

/// The T5 tables shared across layers (`XlConfig::shared_t5`), `[num_buckets, n_heads]` each:
/// one read by every `t5` layer, one by every `knn` layer (memorizing-transformers-pytorch's
/// `rel_pos_bias` and `knn_rel_pos_bias`); `None` where the stack has no such layer.
#[derive(Module, Debug)]
pub struct SharedT5 {
    /// The `t5` layers' table.
    pub plain: Option<Param<Tensor<2>>>,
    /// The `knn` layers' table.
    pub knn: Option<Param<Tensor<2>>>,
}

impl SharedT5 {
    /// The kNN layers' table (`knn`) or the T5 layers'.
    pub fn table(&self, knn: bool) -> Option<&Param<Tensor<2>>> {
        if knn {
            self.knn.as_ref()
        } else {
            self.plain.as_ref()
        }
    }

    /// Sets both tables (a checkpoint's, on import): `plain` for the `t5` layers, `knn` for
    /// the `knn` layers.
    pub fn set_tables(&mut self, plain: Tensor<2>, knn: Tensor<2>) {
        self.plain = Some(Param::from_tensor(plain));
        self.knn = Some(Param::from_tensor(knn));
    }
}

/// What one layer reads besides its input and memory.
pub struct LayerContext<'a> {
    /// The position context of the layer's scheme (relative and kNN layers).
    pub positions: Option<&'a RelativeContext>,
    /// XL's `u`/`v` shared across layers (XL layers without their own).
    pub shared: Option<&'a XlBiases>,
    /// The layer's kNN memory and how many pairs to retrieve per query (kNN layers).
    pub knn: Option<(&'a mut (dyn KnnIndex + 'static), usize)>,
    /// Seed of the LSH rotations outside seeded passes (LSH layers).
    pub seed: u64,
    /// The layer's options in a pass with options: a seeded stack's training or evaluation
    /// pass ([`Randomness::Seeded`]: every dropout mask and LSH rotation), or a device stack's
    /// training pass with a dropout seed ([`TransformerXl::with_dropout_seed`]: its dropout
    /// masks); `None`: the device's randomness.
    pub opts: Option<ForwardOptions>,
    /// The stack's randomness: with [`Randomness::Device`], LSH layers keep their fixed
    /// rotations (`seed`) whatever `opts` say.
    pub randomness: Randomness,
    /// Where the layer records what its attention did in a traced pass ([`Trace`]); `None`:
    /// nothing is recorded or computed for it.
    pub trace: Option<TraceSlot>,
}

impl LayerContext<'_> {
    /// The seed of a relative or kNN attention's own dropout masks in a pass with options
    /// (`None`: the device's generator draws them).
    pub fn attention_dropout_seed(&self) -> Option<u64> {
        self.opts
            .as_ref()
            .filter(|o| o.train)
            .map(|o| o.child(TAG_ATTENTION_DROPOUT).seed)
    }
}

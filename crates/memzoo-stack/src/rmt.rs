//! The Recurrent Memory Transformer (Bulatov, Kuratov & Burtsev 2022, arXiv 2207.06881) as an
//! option of the layer stack ([`XlConfig::rmt`](crate::XlConfig::rmt)): `m` memory tokens are
//! read at the start of every segment and written at its end, and the written memory is the
//! next segment's read memory.
//!
//! Per segment `τ`, with `H⁰_τ` the segment's token embeddings and `H^mem_τ` the memory
//! (`[batch, m, d_model]`; paper sec. 3, decoder-only form):
//!
//! - `H̃⁰_τ = [H^mem_τ ∘ H⁰_τ ∘ H^mem_τ]`: the memory as `m` read tokens before the segment and
//!   as `m` write tokens after it (`∘` concatenation along positions);
//! - `H̃^N_τ = Transformer(H̃⁰_τ)`, the stack's layers under the causal mask over the
//!   `2m + len` positions (read tokens see earlier read tokens, the segment sees the read
//!   tokens and its past, write tokens see everything before them);
//! - `[H^read_τ ∘ H^N_τ ∘ H^write_τ] := H̃^N_τ`, the segment's outputs `H^N_τ` go to the head;
//! - `H^mem_{τ+1} := H^write_τ` (after the stack's final norm, where it has one; the final
//!   dropout is applied to the segment's outputs only).
//!
//! `H^mem_0` is a learned parameter (the initial memory tokens, `N(0, init_std)`), and a row
//! that starts a document (with `document_resets`) reads `H^mem_0` again.
//!
//! **Backpropagation through time** (paper sec. 3, "gradients flow from the current segment
//! to the previous ones through memory"): the memory stays in the graph for `bptt_segments`
//! segments. The trainer (`memzoo_train`) reads `k = bptt_segments` consecutive segments per
//! optimizer step ([`TransformerXl::train_unroll`]), sums their mean losses (`L = (1/k) Σ_τ
//! L_τ`, as the peer weighs its segments by length, equal here), runs one backward and one
//! optimizer step, and then detaches the memory it carries to the next step. `k = 1`: the
//! memory is detached after every segment and the write tokens get no gradient.
//!
//! **Peer compatibility** (lucidrains' `recurrent-memory-transformer-pytorch` 0.7.0,
//! `RecurrentMemoryTransformer.forward`): with `peer_layout` the read tokens are the memory plus a
//! learned read embedding (`read_memory_emb`), the write tokens are the learned tokens
//! (`memory_tokens`, not the memory: the peer's default `add_write_to_next_write_mem =
//! False`), and the first segment (and a reset row) reads the read embedding alone (the
//! peer's `always_have_read_memories`, i.e. a zero memory); with `causal_memory = false` the
//! read tokens see each other and the write tokens each other (the peer's
//! `memory_not_causal = True`), where the paper's mask is the plain causal one. The peer's
//! layers (RMSNorm, a GEGLU feed-forward, a null key/value, value residuals, learned absolute
//! positions, hyper-connections) are options of the stack, which `memzoo import --from
//! lucidrains-rmt` sets (see `docs/import.md`).
//!
//! **RMT + Transformer-XL** (the paper's combination, sec. 3 and its Tr-XL + RMT runs): with
//! `mem_len > 0` every layer also reads an XL memory of the last `mem_len` segment tokens'
//! inputs (not the memory tokens'), before the read tokens: `cat(xl_l, [read, segment,
//! write])`, every query seeing all of it (under `document_resets` only the row's current
//! document), its relative distances counted from each query's place in that sequence. The
//! XL memory is detached between segments, as XL's; the memory tokens carry the gradient.
//!
//! RMT needs sequential residuals and layers with `xl`, `t5` or `absolute` positions.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_reformer::ForwardOptions;
use memzoo_relative::AttentionMask;

use crate::error::XlError;
use crate::memory::{Carried, XlMemory, XlState};
use crate::stack::{LayerKind, ProbeLayout, Residual, Trace, TransformerXl, XlConfig};

/// Settings of the Recurrent Memory Transformer ([`XlConfig::rmt`](crate::XlConfig::rmt)).
/// TOML: `[model.rmt]`.
#[derive(Config, Debug)]
pub struct RmtConfig {
    /// Memory tokens `m`, read before every segment and written after it. Default: 10 (the
    /// paper's language-modelling runs use 1 to 50; 10 is one of its settings).
    #[config(default = 10)]
    pub mem_tokens: usize,
    /// Segments one training step unrolls with the memory in the graph (backpropagation
    /// through time over `k` segments, then the memory is detached); 1: the memory is
    /// detached after every segment. Default: 2.
    #[config(default = 2)]
    pub bptt_segments: usize,
    /// Memory-replay backpropagation through the `bptt_segments`: the forward keeps no
    /// graph, only each segment's starting memory, and the backward replays the segments last
    /// to first, one graph at a time. The same gradients (exact, up to the order of float
    /// sums) in the memory of one segment, for one more forward pass. Default: false.
    #[config(default = false)]
    pub memory_replay: bool,
    /// The paper's causal mask over `[read, segment, write]` (read token `i` sees read tokens
    /// `<= i`, write token `i` sees write tokens `<= i`); false: the read tokens see each
    /// other and the write tokens see each other (the peer's `memory_not_causal = True`).
    /// Default: true.
    #[config(default = true)]
    pub causal_memory: bool,
    /// Peer compatibility (recurrent-memory-transformer-pytorch 0.7.0): read tokens are the
    /// memory plus a learned read embedding, write tokens are the learned memory tokens
    /// (the paper's: the memory itself), and a fresh memory is zero (the paper's: the learned
    /// tokens). Default: false.
    #[config(default = false)]
    pub peer_layout: bool,
}

/// The parameters of a Recurrent Memory Transformer's memory.
///
/// # Shapes
/// - `memory`: `[m, d_model]`; `read_embedding`: `[m, d_model]`
#[derive(Module, Debug)]
pub struct Rmt {
    /// `H^mem_0`, the initial memory (the paper's layout), or the write tokens of every
    /// segment (`peer_layout`: the peer's `memory_tokens`).
    pub memory: Param<Tensor<2>>,
    /// The peer's learned read embedding (`read_memory_emb`), added to the read tokens
    /// (`peer_layout` only).
    pub read_embedding: Option<Param<Tensor<2>>>,
    /// The settings.
    #[module(skip)]
    pub config: RmtConfig,
    /// Whether segments read the memory carried from the previous one (false: every segment
    /// reads a fresh memory, the baseline of [`TransformerXl::without_carried_memory`]).
    #[module(skip)]
    pub carry: bool,
}

/// The carried memory of a Recurrent Memory Transformer: the last segment's written memory
/// `H^mem_{τ+1}`, `[batch, m, d_model]` (`None`: no segment read yet).
pub type RmtMemory = Carried;

impl RmtConfig {
    /// Checks the settings against the stack's, naming the bad value.
    pub fn validate(&self, stack: &XlConfig) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        crate::stack::positive(&[
            ("rmt.mem_tokens", self.mem_tokens),
            ("rmt.bptt_segments", self.bptt_segments),
        ])?;
        if stack.compressive.is_some() {
            return bad(
                "rmt and compressive cannot be combined (one memory beside the XL memory per \
                 stack)"
                    .into(),
            );
        }
        if stack.residual != Residual::Sequential {
            return bad(format!(
                "rmt needs residual = \"sequential\", got {:?} (the reversible backward does not \
                 carry memory tokens)",
                stack.residual
            ));
        }
        if let Some(k) = stack
            .layer_kinds()
            .iter()
            .find(|k| !matches!(k, LayerKind::Xl | LayerKind::T5 | LayerKind::Absolute))
        {
            return bad(format!(
                "rmt stacks read [read, segment, write] with xl, t5 or absolute layers; layer \
                 kind {k:?} is not one"
            ));
        }
        for (name, on) in [
            ("compat.memory_keys_values", stack.compat.memory_keys_values),
            ("compat.zero_first_memory", stack.compat.zero_first_memory),
            ("same_length", stack.same_length),
        ] {
            if on {
                return bad(format!("rmt does not support {name} = true"));
            }
        }
        if stack.axial.is_some() {
            return bad("rmt does not support axial positions".into());
        }
        Ok(())
    }

    /// Initialises the memory parameters of a stack of width `d_model`, drawn from
    /// `N(0, std)` (the peer: 0.02).
    pub fn init(&self, d_model: usize, std: f64, device: &Device) -> Rmt {
        let init = Initializer::Normal { mean: 0.0, std };
        Rmt {
            memory: init.init([self.mem_tokens, d_model], device),
            read_embedding: self
                .peer_layout
                .then(|| init.init([self.mem_tokens, d_model], device)),
            config: self.clone(),
            carry: true,
        }
    }
}

impl Rmt {
    /// A fresh memory `H^mem_0` for `batch` rows: the learned tokens, or zeros with
    /// `peer_layout`.
    ///
    /// # Shapes
    /// - → `[batch, m, d_model]`
    fn fresh(&self, batch: usize) -> Tensor<3> {
        let [m, d] = self.memory.dims();
        if self.config.peer_layout {
            return Tensor::zeros([batch, m, d], &self.memory.device());
        }
        self.memory
            .val()
            .unsqueeze_dim::<3>(0)
            .expand([batch, m, d])
    }

    /// The read and write tokens of a segment reading memory `mem`.
    ///
    /// # Shapes
    /// - `mem`: `[batch, m, d_model]` → both `[batch, m, d_model]`
    fn read_write(&self, mem: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let [b, m, d] = mem.dims();
        match &self.read_embedding {
            Some(e) => (
                mem + e.val().unsqueeze_dim::<3>(0),
                self.memory.val().unsqueeze_dim::<3>(0).expand([b, m, d]),
            ),
            None => (mem.clone(), mem),
        }
    }
}

/// The attention mask of `[read (m), segment (len), write (m)]` over `cat(xl, [read, segment,
/// write])` (`mlen` XL memory positions, `valid[b]` of them, the most recent, in row `b`'s
/// document; `None`: all): the causal mask, or with `causal_memory = false` the peer's (read
/// tokens see all read tokens; segment tokens the read tokens and their past; write tokens
/// everything). Every query sees the row's valid XL memory.
///
/// # Shapes
/// - → `[1 or batch, 2m + len, mlen + 2m + len]`, `true` = hidden
fn memory_mask(
    m: usize,
    len: usize,
    causal_memory: bool,
    mlen: usize,
    valid: Option<&[usize]>,
    device: &Device,
) -> AttentionMask {
    let all_valid = valid.is_none_or(|v| v.iter().all(|&v| v >= mlen));
    if causal_memory && all_valid {
        return AttentionMask::causal();
    }
    let n = 2 * m + len;
    let hidden_in_sequence = |i: usize, j: usize| {
        if causal_memory {
            j > i
        } else if i < m {
            j >= m
        } else if i < m + len {
            j > i
        } else {
            false
        }
    };
    let rows: Vec<usize> = match valid {
        Some(v) if !all_valid => v.to_vec(),
        _ => vec![mlen],
    };
    let mut hidden = Vec::with_capacity(rows.len() * n * (mlen + n));
    for &v in &rows {
        let first = mlen - v.min(mlen);
        for i in 0..n {
            hidden.extend((0..mlen + n).map(|j| match j < mlen {
                true => j < first,
                false => hidden_in_sequence(i, j - mlen),
            }));
        }
    }
    AttentionMask::Explicit(Tensor::<3, Bool>::from_data(
        TensorData::new(hidden, [rows.len(), n, mlen + n]),
        device,
    ))
}

impl TransformerXl {
    /// The Recurrent Memory Transformer's settings, where the stack is one.
    pub fn rmt_config(&self) -> Option<&RmtConfig> {
        self.rmt.as_ref().map(|r| &r.config)
    }

    /// The same model with every segment reading a fresh memory (an RMT's `H^mem_0`, a
    /// Block-Recurrent stack's initial state `c_0`) instead of the carried one: the baseline
    /// that shows what the carried memory adds. Any other stack is returned as it is.
    pub fn without_carried_memory(mut self) -> Self {
        if let Some(r) = self.rmt.as_mut() {
            r.carry = false;
        }
        if let Some(r) = self.block_recurrent.as_mut() {
            r.carry = false;
        }
        self
    }

    /// Reads one segment of an RMT stack on top of `state.rmt` and writes the next memory
    /// into it (in the graph with `keep_graph`, detached otherwise). `reset[b]`: row `b`
    /// starts a document (with `document_resets`: it reads a fresh memory). With a `trace`,
    /// every layer records where the segment's queries attended (the read memory tokens as
    /// the memory).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]`, `reset`: `batch` flags → `[batch, len, d_model]`
    pub(crate) fn forward_rmt(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
        keep_graph: bool,
        trace: Option<&Trace>,
    ) -> Result<Tensor<3>, XlError> {
        let rmt = self.rmt.as_ref().ok_or_else(|| {
            XlError::Input("this stack is not a Recurrent Memory Transformer".into())
        })?;
        let [batch, len] = tokens.dims();
        let device = tokens.device();
        if reset.len() != batch {
            return Err(XlError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        let m = rmt.config.mem_tokens;
        let mem = self.rmt_memory(state, reset)?;
        // H̃⁰_τ = [read ∘ H⁰_τ ∘ write].
        let (read, write) = rmt.read_write(mem);
        // RMT + Transformer-XL: every query also reads the XL memory of the segments' tokens.
        // (`reset_rows` hides, per row, what came before the row's document.)
        self.reset_rows(&tokens, state, reset)?;
        self.check_memory(batch, &state.xl)?;
        let mlen = state.xl.len();
        let valid = (self.document_resets && mlen > 0).then_some(state.xl_valid.as_slice());
        let mask = memory_mask(m, len, rmt.config.causal_memory, mlen, valid, &device);
        let h = self.embed(tokens, opts)?;
        let h = Tensor::cat(vec![read, h, write], 1);
        // (Hyper-connections' streams never meet an XL memory: validation refuses both.)
        let mut h = crate::stack::expand_streams(h, self.residual_streams);
        let contexts = self.contexts(batch, 2 * m + len, mlen, &mask, &device)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        for l in 0..self.layers.len() {
            if self.mem_len > 0 {
                inputs.push(h.clone().narrow(1, m, len));
            }
            let mut cx = self.layer_context(l, &contexts, None, opts);
            cx.trace = trace.map(|t| t.slot(l, ProbeLayout::MemoryTokens { m, len }));
            h = self.layers[l].forward(h, state.xl.layer(l).cloned(), cx)?;
        }
        drop(contexts);
        if self.mem_len > 0 {
            self.advance(state, &inputs, len);
        }
        let h = crate::stack::reduce_streams(h, self.residual_streams);
        // [H^read ∘ H^N ∘ H^write] := H̃^N_τ; H^mem_{τ+1} := H^write_τ.
        let written = h.clone().narrow(1, m + len, m);
        let written = match &self.final_norm {
            Some(norm) => norm.forward(written),
            None => written,
        };
        state.rmt.value = Some(match keep_graph {
            true => written,
            false => written.detach(),
        });
        Ok(self.finish(h.narrow(1, m, len), opts))
    }

    /// `H^mem_τ`, the memory a segment reads: the carried one, a fresh one for rows that start
    /// a document (with `document_resets`) or where nothing is carried.
    ///
    /// # Shapes
    /// - `reset`: `batch` flags → `[batch, m, d_model]`
    fn rmt_memory(&self, state: &XlState, reset: &[bool]) -> Result<Tensor<3>, XlError> {
        let rmt = self.rmt.as_ref().ok_or_else(|| {
            XlError::Input("this stack is not a Recurrent Memory Transformer".into())
        })?;
        let (batch, m) = (reset.len(), rmt.config.mem_tokens);
        let fresh = rmt.fresh(batch);
        let Some(t) = state.rmt.value.as_ref().filter(|_| rmt.carry) else {
            return Ok(fresh);
        };
        if t.dims() != [batch, m, self.d_model] {
            return Err(XlError::Input(format!(
                "the carried RMT memory is {:?}, the model needs [{batch}, {m}, {}]",
                t.dims(),
                self.d_model
            )));
        }
        if !(self.document_resets && reset.iter().any(|&r| r)) {
            return Ok(t.clone());
        }
        let keep: Vec<f32> = reset.iter().map(|&r| f32::from(u8::from(!r))).collect();
        let keep = Tensor::<3>::from_data(TensorData::new(keep, [batch, 1, 1]), &t.device());
        Ok(t.clone() * keep.clone() + fresh * (keep.neg() + 1.0))
    }

    /// Whether generation can keep what an unfinished segment's tokens leave
    /// ([`peek_rmt`](Self::peek_rmt)): an RMT stack without hyper-connections, with
    /// sequential residuals (the caller checks the rest: no kNN layers, and with document
    /// resets a state read whole).
    pub(crate) fn rmt_peeks(&self) -> bool {
        self.rmt.is_some() && self.residual_streams == 1 && self.residual == Residual::Sequential
    }

    /// Reads tokens of an unfinished segment on top of the `committed` memory through `view`:
    /// per layer the inputs of the XL memory (RMT + Transformer-XL), of the read tokens and of
    /// the segment's tokens read so far, which it extends by the tokens' own; an empty `view`
    /// is filled first with the XL memory's and the read tokens' (once per segment: the read
    /// tokens see only the XL memory and each other). Generation's read of new tokens
    /// ([`crate::RecurrentModel::peek_continue`]): a segment token sees the read tokens and
    /// the segment's earlier tokens, and the write tokens after the segment see it, so what
    /// a token gets is what a pass over the whole segment gives it; the memory is written when
    /// the segment completes ([`forward_rmt`](Self::forward_rmt)).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, qlen]`, `reset`: `batch` flags (the segment's first read) →
    ///   `[batch, qlen, d_model]`; `view`: per layer `[batch, xl + m + read, d_model]`
    pub(crate) fn peek_rmt(
        &self,
        tokens: Tensor<2, Int>,
        view: &mut XlMemory,
        committed: &XlState,
        reset: &[bool],
        opts: Option<&ForwardOptions>,
    ) -> Result<Tensor<3>, XlError> {
        let rmt = self.rmt.as_ref().ok_or_else(|| {
            XlError::Input("this stack is not a Recurrent Memory Transformer".into())
        })?;
        if !self.rmt_peeks() {
            return Err(XlError::Input(
                "this RMT stack cannot read a segment's tokens on their own".into(),
            ));
        }
        let [batch, _] = tokens.dims();
        let device = tokens.device();
        let m = rmt.config.mem_tokens;
        if reset.len() != batch {
            return Err(XlError::Input(format!(
                "reset has {} flags for a batch of {batch}",
                reset.len()
            )));
        }
        if let Some(v) = view.layer(0) {
            let [vb, _, vd] = v.dims();
            if view.n_layers() != self.layers.len() || vb != batch || vd != self.d_model {
                return Err(XlError::Input(format!(
                    "an RMT view of {} layers of {:?}, the model needs {} of [{batch}, _, {}]",
                    view.n_layers(),
                    v.dims(),
                    self.layers.len(),
                    self.d_model
                )));
            }
        }
        // A pass over `h` reading `view`'s layer inputs (or nothing), each layer's input
        // written after them into the view's buffers in place (a failed pass leaves the view
        // as it was).
        let read = |h: Tensor<3>, mask: AttentionMask, view: &mut XlMemory| {
            let [_, len, _] = h.dims();
            let mlen = view.len();
            let contexts = self.contexts(batch, len, mlen, &mask, &device)?;
            view.begin_append(len);
            let mut pass = |mut h: Tensor<3>| -> Result<Tensor<3>, XlError> {
                for (l, layer) in self.layers.iter().enumerate() {
                    let all = view.append(l, h.clone()).map_err(XlError::Input)?;
                    let before = (mlen > 0).then(|| all.narrow(1, 0, mlen));
                    let cx = self.layer_context(l, &contexts, None, opts);
                    h = layer.forward(h, before, cx)?;
                }
                Ok(h)
            };
            let h = pass(h);
            view.finish_append(h.is_ok());
            h
        };
        self.check_memory(batch, &committed.xl)?;
        let xl = committed.xl.len();
        if view.is_empty() {
            let mem = self.rmt_memory(committed, reset)?;
            *view = committed.xl.clone();
            // The read tokens see the XL memory and each other (causally with
            // `causal_memory`), nothing after.
            let mask = match rmt.config.causal_memory {
                true => AttentionMask::causal(),
                false => AttentionMask::None,
            };
            read(rmt.read_write(mem).0, mask, view)?;
        }
        let first = view.len().checked_sub(xl + m).ok_or_else(|| {
            XlError::Input(format!(
                "an RMT view of {} positions, fewer than the {xl} of the XL memory and the {m} \
                 read tokens",
                view.len()
            ))
        })?;
        let h = self.embed_from(tokens, opts, first)?;
        let h = read(h, AttentionMask::causal(), view)?;
        Ok(self.finish(h, opts))
    }
}

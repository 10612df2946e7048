//! Generation for every family: a seeded [`Sampler`] (temperature, top-k, top-p) and a
//! [`Generator`] that reads the context the way the model was trained, through
//! [`SegmentModel`].
//!
//! # What "cached" means
//!
//! A model that carries state across segments ([`crate::RecurrentModel::carries_state`]: the
//! Transformer-XL's memory; the Memorizing Transformer's XL memory and kNN memory) reads the
//! prompt and the generated text in segments of `segment_len` tokens, as in training and
//! evaluation. The state is carried across *completed* segments only. The tokens of the
//! current, unfinished segment are read on top of that state as they come
//! ([`crate::RecurrentModel::peek_continue`]): the layer stack keeps them after its XL memory,
//! none leaving it before the segment completes, and searches its kNN memories read-only, so
//! each new token is one query over the memory and the segment's earlier tokens, which is what
//! a segment pass computes for it. When the segment is complete it is read once more for good
//! ([`crate::RecurrentModel::segment_logits`]), which moves the state on: the XL memory keeps
//! the last `mem_len` layer inputs, the kNN memory stores the segment's keys and values. A
//! compressive or Block-Recurrent stack does the same with its XL memory, its compressed memory
//! or recurrent state as it was until the segment completes (and is compressed, or writes the
//! next state); an RMT stack keeps its read tokens' and the segment's layer inputs, and writes
//! its memory when the segment completes. A model that keeps nothing of an unfinished segment
//! (LSH or local layers; an RMT stack with hyper-connections) reads it again for every new
//! token
//! ([`crate::RecurrentModel::peek_logits`], which leaves the state as it was): one pass over at
//! most `segment_len` tokens per token.
//!
//! Recomputing ([`recompute_logits`], [`generate_recompute`]) reads the whole context from a
//! fresh state for every token, in the same segments. Attention inside a segment is causal,
//! and a kNN layer searches its memory before it adds the segment to it, so a position's output
//! does not depend on the later tokens of its segment: the two are one function, with the same
//! logits and the same tokens (the integration tests check both for every family, across
//! several segment boundaries).
//!
//! The generator reads a copy of the model made for it
//! ([`RecurrentModel::for_generation`](crate::RecurrentModel::for_generation)), which computes
//! the same logits at less cost: the layer stack's copy keeps **keys and values** in its XL
//! memory instead of layer inputs (each position projected once, when it enters the memory,
//! not again in every later pass) and reads Transformer-XL's projected positions `W_R R_d`
//! from a table per distance (projected once for every distance a pass can reach, not per
//! column in every pass). One token over a memory of `m` positions then costs each layer the
//! scores and values over the `m` keys, not their projections
//! (`cargo xtask bench scale --families generate`; `docs/benchmarks.md`).
//!
//! - **Transformer-XL**: with `segment_len` 1 every token is one step over the memory; with a
//!   `mem_len` covering the whole context, that is exactly one causal pass over the whole
//!   context (the classic key/value cache; `memzoo generate --segment-len 1 --mem-len N`).
//! - **Memorizing Transformer**: it generates retrieving from its kNN memory *and* adding to
//!   it: every completed segment's keys and values go into the memory, where every later token
//!   finds them. The current segment's tokens search read-only views of the memory.
//! - **Reformer** (no state across segments): every token reads a sliding window of the last
//!   `segment_len` tokens again, from scratch. There is no sound cache: LSH attention sorts the
//!   whole window into hash buckets and chunks, so a new token can move every other position
//!   into another chunk, and the axial position embeddings shift as the window slides.
//!
//! ```no_run
//! use memzoo_train::generate::{GenerateConfig, SampleConfig, generate};
//! # fn demo(model: &memzoo_stack::TransformerXl, device: &burn::tensor::Device) {
//! let sampler = SampleConfig::new().with_temperature(0.8).with_top_p(Some(0.9));
//! let config = GenerateConfig::new(100, 64).with_sampler(sampler);
//! let prompt: Vec<i64> = b"ROMEO:".iter().map(|&b| b as i64).collect();
//! let out = generate(model, &prompt, &config, device).unwrap();
//! println!("{} tokens, {:.1} tokens/s", out.tokens.len(), 1.0 / out.seconds_per_token);
//! # }
//! ```

use std::borrow::Cow;
use std::time::Instant;

use burn::config::Config;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::error::TrainError;
use crate::model::SegmentModel;

/// Errors of sampling and generation; each names the bad value.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The temperature is negative or not a finite number.
    #[error("temperature must be a finite number >= 0 (0: greedy), got {0}")]
    Temperature(f64),
    /// `top_k` is 0.
    #[error("top_k must be positive, got {0}")]
    TopK(usize),
    /// `top_p` is outside (0, 1].
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f64),
    /// `segment_len` is 0.
    #[error("segment_len must be positive, got {0}")]
    SegmentLen(usize),
    /// Nothing to continue.
    #[error("the prompt is empty: generation continues at least one token")]
    EmptyPrompt,
    /// A token the model has no embedding for.
    #[error("token {token} is outside the model's vocabulary 0..{vocab}")]
    Token {
        /// The token.
        token: i64,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// Logits that cannot be sampled from.
    #[error("cannot sample: {0}")]
    Logits(String),
    /// The model refused its input.
    #[error(transparent)]
    Model(#[from] TrainError),
}

impl From<memzoo_stack::XlError> for GenerateError {
    fn from(e: memzoo_stack::XlError) -> Self {
        GenerateError::Model(e.into())
    }
}

/// Settings of a [`Sampler`]. The next token is drawn from `softmax(logits / temperature)`
/// restricted to the `top_k` most likely tokens, then to the smallest most-likely set whose
/// probability reaches `top_p`, renormalised.
#[derive(Config, Debug)]
pub struct SampleConfig {
    /// Softmax temperature; 0 takes the most likely token (greedy, the lowest id on a tie).
    /// Default: 1.0.
    #[config(default = 1.0)]
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (on a tie, the lower ids). Default: none (all).
    #[config(default = "None")]
    pub top_k: Option<usize>,
    /// Nucleus: keep the fewest most likely tokens whose probability (after the temperature and
    /// top-k) sums to at least `p`, in (0, 1]. Default: none (all).
    #[config(default = "None")]
    pub top_p: Option<f64>,
    /// Seed of the draws. Default: 0.
    #[config(default = 0)]
    pub seed: u64,
}

impl SampleConfig {
    /// Checks the settings, naming the bad value.
    pub fn validate(&self) -> Result<(), GenerateError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(GenerateError::Temperature(self.temperature));
        }
        if self.top_k == Some(0) {
            return Err(GenerateError::TopK(0));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(GenerateError::TopP(p));
        }
        Ok(())
    }

    /// A sampler with these settings, seeded.
    pub fn init(&self) -> Result<Sampler, GenerateError> {
        self.validate()?;
        Ok(Sampler {
            config: self.clone(),
            rng: StdRng::seed_from_u64(self.seed),
        })
    }
}

/// Draws tokens from logits (see [`SampleConfig`]); seeded, so a run replays.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SampleConfig,
    rng: StdRng,
}

impl Sampler {
    /// The tokens a draw can return with their probabilities, most likely first (ties: lower
    /// id first); one token with probability 1 at temperature 0.
    ///
    /// # Shapes
    /// - `logits`: `[vocab]`
    pub fn distribution(&self, logits: &[f32]) -> Result<Vec<(usize, f64)>, GenerateError> {
        if logits.is_empty() {
            return Err(GenerateError::Logits("no logits (vocabulary of 0)".into()));
        }
        if let Some((i, v)) = logits.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(GenerateError::Logits(format!(
                "logit {v} of token {i} is not finite"
            )));
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Stable: equal logits keep the lower id first.
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let c = &self.config;
        if c.temperature == 0.0 {
            return Ok(vec![(order[0], 1.0)]);
        }
        if let Some(k) = c.top_k {
            order.truncate(k);
        }
        // p_i = exp((l_i - max) / T) / Σ_j exp((l_j - max) / T)
        let max = logits[order[0]] as f64;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] as f64 - max) / c.temperature).exp())
            .collect();
        normalise(&mut probs);
        if let Some(p) = c.top_p {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&q| {
                    acc += q;
                    acc >= p
                })
                .map_or(probs.len(), |i| i + 1);
            order.truncate(keep);
            probs.truncate(keep);
            normalise(&mut probs);
        }
        Ok(order.into_iter().zip(probs).collect())
    }

    /// Draws one token.
    ///
    /// # Shapes
    /// - `logits`: `[vocab]`
    pub fn sample(&mut self, logits: &[f32]) -> Result<usize, GenerateError> {
        let dist = self.distribution(logits)?;
        if dist.len() == 1 {
            return Ok(dist[0].0);
        }
        let mut u: f64 = self.rng.random();
        for &(token, p) in &dist {
            u -= p;
            if u < 0.0 {
                return Ok(token);
            }
        }
        // Rounding left a sliver of probability at the end.
        Ok(dist[dist.len() - 1].0)
    }
}

fn normalise(p: &mut [f64]) {
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|q| *q /= total);
}

/// Configuration of [`generate`] and [`generate_recompute`].
#[derive(Config, Debug)]
pub struct GenerateConfig {
    /// New tokens to generate.
    pub tokens: usize,
    /// Tokens per segment: the training segment length reads the context as in training (the
    /// window of a model without state across segments).
    pub segment_len: usize,
    /// The sampler. Default: temperature 1, no top-k or top-p, seed 0.
    #[config(default = "SampleConfig::new()")]
    pub sampler: SampleConfig,
}

/// The output of [`generate`] or [`generate_recompute`].
#[derive(Debug, Clone)]
pub struct Generation {
    /// The new tokens.
    pub tokens: Vec<i64>,
    /// Seconds per new token ([`generate`]: after the prompt is read).
    pub seconds_per_token: f64,
}

/// Reads a context token by token, carrying the model's state across completed segments, and
/// gives the logits of the next token (see the module docs). Batch of one.
pub struct Generator<'m, M: SegmentModel> {
    /// The model, or its copy for generation ([`RecurrentModel::for_generation`]: the layer
    /// stack caching its memory's keys and values), which computes the same logits.
    ///
    /// [`RecurrentModel::for_generation`]: crate::RecurrentModel::for_generation
    model: Cow<'m, M>,
    segment_len: usize,
    device: Device,
    /// The state after the completed segments.
    state: M::State,
    /// Tokens of the current, unfinished segment (no state: the window).
    current: Vec<i64>,
    /// What the model keeps of the current segment's tokens read so far
    /// ([`RecurrentModel::peek_continue`](crate::RecurrentModel::peek_continue)); `None` at a
    /// segment's start.
    peek: Option<M::State>,
    /// Tokens of `current` that `peek` holds.
    peeked: usize,
    /// Completed segments read into `state`.
    segments: usize,
    /// The next token's logits `[1, 1, vocab]`, once computed.
    next: Option<Tensor<3>>,
}

impl<'m, M: SegmentModel> Generator<'m, M> {
    /// A generator that has read nothing yet (a new document).
    pub fn new(model: &'m M, segment_len: usize, device: &Device) -> Result<Self, GenerateError> {
        if segment_len == 0 {
            return Err(GenerateError::SegmentLen(segment_len));
        }
        let model = match model.for_generation(segment_len) {
            Some(copy) => Cow::Owned(copy),
            None => Cow::Borrowed(model),
        };
        Ok(Self {
            model,
            segment_len,
            device: device.clone(),
            state: M::State::default(),
            current: Vec::new(),
            peek: None,
            peeked: 0,
            segments: 0,
            next: None,
        })
    }

    /// Reads `tokens` after what was read before; each segment they complete is read into
    /// the state. Complete segments that the model reads alike in any split
    /// ([`RecurrentModel::split_free_tokens`](crate::RecurrentModel::split_free_tokens): an XL
    /// memory still holding every token) are read in one pass: the same logits and state as
    /// one segment at a time, in one pass instead of many (a long prompt with `segment_len` 1).
    pub fn read(&mut self, tokens: &[i64]) -> Result<(), GenerateError> {
        let vocab = self.model.vocab_size();
        let read = self.segments * self.segment_len;
        let whole = (tokens.len() / self.segment_len) * self.segment_len;
        let tokens = if self.current.is_empty()
            && whole > self.segment_len
            && read + whole <= self.model.split_free_tokens()
        {
            let (merged, rest) = tokens.split_at(whole);
            for &token in merged {
                check_token(token, vocab)?;
            }
            let ids = token_tensor(merged, &self.device);
            let reset = [self.segments == 0];
            let logits = self.model.segment_logits(ids, &mut self.state, &reset)?;
            self.next = Some(last_position(logits));
            self.segments += whole / self.segment_len;
            rest
        } else {
            tokens
        };
        for &token in tokens {
            check_token(token, vocab)?;
            self.next = None;
            self.current.push(token);
            if !self.model.carries_state() {
                if self.current.len() > self.segment_len {
                    self.current.remove(0);
                }
            } else if self.current.len() == self.segment_len {
                // Complete: read it for good, moving the state on.
                let ids = token_tensor(&self.current, &self.device);
                let reset = [self.segments == 0];
                let logits = self.model.segment_logits(ids, &mut self.state, &reset)?;
                self.next = Some(last_position(logits));
                self.current.clear();
                (self.peek, self.peeked) = (None, 0);
                self.segments += 1;
            }
        }
        Ok(())
    }

    /// Logits `[vocab]` of the token after everything read so far.
    pub fn next_logits(&mut self) -> Result<Vec<f32>, GenerateError> {
        let next = match &self.next {
            Some(next) => next.clone(),
            None => {
                if self.current.is_empty() {
                    return Err(GenerateError::EmptyPrompt);
                }
                let reset = [self.segments == 0];
                let logits = if self.model.carries_state() {
                    self.peek_logits(&reset)?
                } else {
                    let ids = token_tensor(&self.current, &self.device);
                    self.model
                        .segment_logits(ids, &mut M::State::default(), &reset)?
                };
                let next = last_position(logits);
                self.next = Some(next.clone());
                next
            }
        };
        host_logits(next)
    }

    /// Logits of the unfinished segment's tokens read since the last call: only those, on
    /// top of what the model keeps of the earlier ones
    /// ([`RecurrentModel::peek_continue`](crate::RecurrentModel::peek_continue)), or the
    /// whole unfinished segment again where it keeps nothing.
    fn peek_logits(&mut self, reset: &[bool]) -> Result<Tensor<3>, GenerateError> {
        let ids = token_tensor(&self.current[self.peeked..], &self.device);
        let read = self
            .model
            .peek_continue(ids, &mut self.state, &mut self.peek, reset);
        // After a failed read nothing of the segment is kept: the next reads it all.
        if self.peek.is_none() {
            self.peeked = 0;
        }
        if let Some(logits) = read? {
            self.peeked = self.current.len();
            return Ok(logits);
        }
        let ids = token_tensor(&self.current, &self.device);
        Ok(self.model.peek_logits(ids, &mut self.state, reset)?)
    }

    /// Draws `tokens` new tokens with `sampler`, reading each before drawing the next.
    pub fn sample(
        &mut self,
        sampler: &mut Sampler,
        tokens: usize,
    ) -> Result<Vec<i64>, GenerateError> {
        let mut out = Vec::with_capacity(tokens.min(1 << 16));
        for _ in 0..tokens {
            let token = sampler.sample(&self.next_logits()?)? as i64;
            self.read(&[token])?;
            out.push(token);
        }
        Ok(out)
    }

    /// The state after the completed segments (e.g. the kNN memory, to save it). The layer
    /// stack's XL memory here holds cached keys and values
    /// ([`memzoo_stack::TransformerXl::caching_keys_values`]), which only the generator reads.
    pub fn state(&self) -> &M::State {
        &self.state
    }

    /// Completed segments read into the state.
    pub fn segments(&self) -> usize {
        self.segments
    }
}

/// Generates `config.tokens` tokens after `prompt` with the state carried across segments:
/// each new token costs one query over the state and its segment's earlier tokens, or (a model
/// that keeps nothing of an unfinished segment) one pass over at most `segment_len` tokens; see
/// the module docs.
pub fn generate<M: SegmentModel>(
    model: &M,
    prompt: &[i64],
    config: &GenerateConfig,
    device: &Device,
) -> Result<Generation, GenerateError> {
    let mut sampler = config.sampler.init()?;
    let mut generator = Generator::new(model, config.segment_len, device)?;
    generator.read(prompt)?;
    generator.next_logits()?;
    let start = Instant::now();
    let tokens = generator.sample(&mut sampler, config.tokens)?;
    Ok(Generation {
        tokens,
        seconds_per_token: start.elapsed().as_secs_f64() / config.tokens.max(1) as f64,
    })
}

/// The reference: every new token recomputes the whole context from a fresh state
/// ([`recompute_logits`]). The same tokens as [`generate`], at a cost growing with the context.
pub fn generate_recompute<M: SegmentModel>(
    model: &M,
    prompt: &[i64],
    config: &GenerateConfig,
    device: &Device,
) -> Result<Generation, GenerateError> {
    let mut sampler = config.sampler.init()?;
    let mut context = prompt.to_vec();
    let mut tokens = Vec::with_capacity(config.tokens.min(1 << 16));
    let start = Instant::now();
    for _ in 0..config.tokens {
        let logits = recompute_logits(model, &context, config.segment_len, device)?;
        let token = sampler.sample(&logits)? as i64;
        context.push(token);
        tokens.push(token);
    }
    Ok(Generation {
        tokens,
        seconds_per_token: start.elapsed().as_secs_f64() / config.tokens.max(1) as f64,
    })
}

/// Logits `[vocab]` of the token after `context`, from scratch: a model with state reads the
/// context in segments of `segment_len` from a fresh state; one without reads the window of
/// the last `segment_len` tokens.
pub fn recompute_logits<M: SegmentModel>(
    model: &M,
    context: &[i64],
    segment_len: usize,
    device: &Device,
) -> Result<Vec<f32>, GenerateError> {
    if segment_len == 0 {
        return Err(GenerateError::SegmentLen(segment_len));
    }
    if context.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let vocab = model.vocab_size();
    for &token in context {
        check_token(token, vocab)?;
    }
    let n = context.len();
    let mut state = M::State::default();
    if !model.carries_state() {
        let window = &context[n.saturating_sub(segment_len)..];
        let logits = model.segment_logits(token_tensor(window, device), &mut state, &[true])?;
        return host_logits(last_position(logits));
    }
    // The segment holding the last token starts at `last`; the ones before are complete.
    let last = (n - 1) / segment_len * segment_len;
    for (i, start) in (0..last).step_by(segment_len).enumerate() {
        let segment = token_tensor(&context[start..start + segment_len], device);
        model.segment_logits(segment, &mut state, &[i == 0])?;
    }
    let segment = token_tensor(&context[last..], device);
    let logits = model.segment_logits(segment, &mut state, &[last == 0])?;
    host_logits(last_position(logits))
}

fn check_token(token: i64, vocab: usize) -> Result<(), GenerateError> {
    if token < 0 || token as u64 >= vocab as u64 {
        return Err(GenerateError::Token { token, vocab });
    }
    Ok(())
}

/// `[1, len]` token ids.
fn token_tensor(tokens: &[i64], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(tokens.to_vec(), [1, tokens.len()]), device)
}

/// `[1, len, vocab]` → `[1, 1, vocab]`
fn last_position(logits: Tensor<3>) -> Tensor<3> {
    let q = logits.dims()[1];
    logits.narrow(1, q - 1, 1)
}

fn host_logits(logits: Tensor<3>) -> Result<Vec<f32>, GenerateError> {
    logits
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .map_err(|e| GenerateError::Logits(format!("reading the logits: {e:?}")))
}

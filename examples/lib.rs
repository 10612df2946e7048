//! Small helpers shared by the examples: command-line flags, the copy-text data set and
//! segment batching with per-position weights, and the weighted loss of an XL model.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The value of `--name VALUE` on the command line, if given.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The parsed value of `--name VALUE`, `default` when absent; exits with a message naming the
/// flag when the value does not parse.
pub fn arg_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match arg(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("error: {name} {v}: not a valid value");
            std::process::exit(2)
        }),
    }
}

/// The device from `--device` (default `flex`), or exit with the error. Also keeps freed
/// tensor memory in the process ([`memzoo::backend::tune_allocator`]).
pub fn device_from_args() -> Device {
    memzoo::backend::tune_allocator();
    let name = arg("--device").unwrap_or_else(|| "flex".into());
    memzoo::backend::parse_device(&name).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    })
}

/// Nats to bits.
pub fn bits(nats: f32) -> f32 {
    nats / std::f32::consts::LN_2
}

/// The copy-text data of the XL examples: documents of `passage` random letters `a..=z`, then
/// `repeats` times `gap` dots and the same letters again, then a newline. Every repeated
/// letter sits exactly `passage + gap` positions after the same letter in the copy before.
///
/// Returns the bytes and, per byte, whether it is a repeated letter (predictable only from
/// `passage + gap` positions back; guessing it costs log2 26 = 4.70 bits).
pub fn copy_text(
    bytes: usize,
    passage: usize,
    gap: usize,
    repeats: usize,
    seed: u64,
) -> (Vec<u8>, Vec<bool>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut text = Vec::with_capacity(bytes + (repeats + 1) * (passage + gap) + 1);
    let mut copy = Vec::with_capacity(text.capacity());
    while text.len() < bytes {
        let letters: Vec<u8> = (0..passage)
            .map(|_| rng.random_range(b'a'..=b'z'))
            .collect();
        text.extend_from_slice(&letters);
        copy.extend(std::iter::repeat_n(false, passage));
        for _ in 0..repeats {
            text.extend(std::iter::repeat_n(b'.', gap));
            copy.extend(std::iter::repeat_n(false, gap));
            text.extend_from_slice(&letters);
            copy.extend(std::iter::repeat_n(true, passage));
        }
        text.push(b'\n');
        copy.push(false);
    }
    (text, copy)
}

/// One segment of [`ordered_segments`]: inputs, next-token targets and per-target weights.
pub struct Segment {
    /// `[batch, len]` input tokens.
    pub tokens: Tensor<2, Int>,
    /// `[batch, len]` next tokens.
    pub targets: Tensor<2, Int>,
    /// `[batch, len]` 1.0 where the target is flagged (e.g. a copied letter), else 0.0.
    pub weights: Tensor<2>,
}

/// Cuts a token stream into `batch` contiguous rows and yields segments of `len` tokens, each
/// row continuing where it stopped (the order recurrence needs). `flags[t]` marks targets to
/// weigh separately (`weights`).
pub fn ordered_segments(
    stream: &[u8],
    flags: &[bool],
    batch: usize,
    len: usize,
    device: &Device,
) -> Vec<Segment> {
    let row_len = (stream.len() - 1) / batch;
    let steps = row_len / len;
    (0..steps)
        .map(|s| {
            let mut x = Vec::with_capacity(batch * len);
            let mut y = Vec::with_capacity(batch * len);
            let mut w = Vec::with_capacity(batch * len);
            for r in 0..batch {
                let start = r * row_len + s * len;
                x.extend(stream[start..start + len].iter().map(|&b| b as i64));
                y.extend(stream[start + 1..start + len + 1].iter().map(|&b| b as i64));
                w.extend(
                    flags[start + 1..start + len + 1]
                        .iter()
                        .map(|&f| if f { 1.0f32 } else { 0.0 }),
                );
            }
            Segment {
                tokens: Tensor::from_data(TensorData::new(x, [batch, len]), device),
                targets: Tensor::from_data(TensorData::new(y, [batch, len]), device),
                weights: Tensor::from_data(TensorData::new(w, [batch, len]), device),
            }
        })
        .collect()
}

/// Losses of one segment (nats): the mean over every target (what is trained), the mean over
/// the flagged targets and over the others (detached scalars), and the next memory.
pub struct SegmentLoss {
    /// Mean next-token cross-entropy over all targets (with the graph).
    pub loss: Tensor<1>,
    /// Mean over the flagged targets and their count.
    pub flagged: (f32, f32),
    /// Mean over the other targets and their count.
    pub other: (f32, f32),
    /// The memory for the next segment (detached).
    pub memory: XlMemory,
}

/// Splits the next-token loss of a segment by its weights: `nll_i = -log p(y_i)` from
/// `logits` (`[batch, len, vocab]`), `loss = mean_i nll_i` (with the graph), `flagged =
/// Σ w_i nll_i / Σ w_i` and the mean over the others (detached, with their counts).
pub fn split_loss(logits: Tensor<3>, seg: &Segment) -> (Tensor<1>, (f32, f32), (f32, f32)) {
    let [b, q] = seg.tokens.dims();
    let nll = log_softmax(logits, 2)
        .gather(2, seg.targets.clone().unsqueeze_dim::<3>(2))
        .reshape([b, q])
        .neg();
    let w = seg.weights.clone();
    let sum = |t: Tensor<2>| -> f32 { t.sum().into_scalar() };
    let n_flag = sum(w.clone());
    let n_all = (b * q) as f32;
    let nll_flag = sum(nll.clone().detach() * w);
    let nll_all = sum(nll.clone().detach());
    let mean = |s: f32, n: f32| if n > 0.0 { s / n } else { f32::NAN };
    (
        nll.mean(),
        (mean(nll_flag, n_flag), n_flag),
        (mean(nll_all - nll_flag, n_all - n_flag), n_all - n_flag),
    )
}

/// Runs `model` on a segment with `memory` and splits the loss by the segment's weights
/// ([`split_loss`]).
pub fn xl_segment_loss(
    model: &TransformerXl,
    seg: &Segment,
    memory: &XlMemory,
) -> Result<SegmentLoss, String> {
    let out = model
        .forward(seg.tokens.clone(), memory)
        .map_err(|e| e.to_string())?;
    let (loss, flagged, other) = split_loss(model.logits(out.hidden), seg);
    Ok(SegmentLoss {
        loss,
        flagged,
        other,
        memory: out.memory,
    })
}

/// Running sums of weighted means, for printing windows of steps.
#[derive(Default, Debug, Clone, Copy)]
pub struct Window {
    sum: f64,
    n: f64,
}

impl Window {
    /// Adds a mean over `n` items.
    pub fn push(&mut self, (mean, n): (f32, f32)) {
        if n > 0.0 && mean.is_finite() {
            self.sum += (mean * n) as f64;
            self.n += n as f64;
        }
    }

    /// The mean so far (NaN if empty), then starts over.
    pub fn take(&mut self) -> f32 {
        let m = if self.n > 0.0 {
            (self.sum / self.n) as f32
        } else {
            f32::NAN
        };
        *self = Self::default();
        m
    }
}

/// The repeated-passage task of the XL examples (see [`copy_text`]) and how it is cut into
/// segments. Defaults: 6 letters, 1 dot, 6 repeats (copy distance 7), segments of 4 tokens,
/// 16 rows: every repeated letter's source lies beyond its segment, in the memory.
#[derive(Debug, Clone, Copy)]
pub struct CopyTask {
    /// Letters per passage.
    pub passage: usize,
    /// Dots before each repeat.
    pub gap: usize,
    /// Repeats per document.
    pub repeats: usize,
    /// Tokens per segment.
    pub seg_len: usize,
    /// Rows per batch.
    pub batch: usize,
}

impl Default for CopyTask {
    fn default() -> Self {
        Self {
            passage: 6,
            gap: 1,
            repeats: 6,
            seg_len: 4,
            batch: 16,
        }
    }
}

impl CopyTask {
    /// Checks the task, naming the bad value.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("passage", self.passage),
            ("repeats", self.repeats),
            ("seg_len", self.seg_len),
            ("batch", self.batch),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive, got 0"));
            }
        }
        Ok(())
    }

    /// Distance from a repeated letter back to its source.
    pub fn distance(&self) -> usize {
        self.passage + self.gap
    }

    /// `segments` segments of fresh text drawn with `seed`.
    pub fn segments(&self, segments: usize, seed: u64, device: &Device) -> Vec<Segment> {
        let bytes = segments * self.batch * self.seg_len + self.batch * (self.seg_len + 1);
        let (text, copy) = copy_text(bytes, self.passage, self.gap, self.repeats, seed);
        let mut segs = ordered_segments(&text, &copy, self.batch, self.seg_len, device);
        segs.truncate(segments);
        segs
    }
}

/// The small XL of the examples: 2 layers, d_model 32, 4 heads, d_inner 64, no dropout, the
/// embedding drawn from N(0, 0.1).
pub fn small_xl(mem_len: usize) -> XlConfig {
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(32)
        .with_n_heads(4)
        .with_d_inner(64)
        .with_mem_len(mem_len)
        .with_dropout(0.0)
        // The tied output's logits start at a scale ~ d_model * embedding_std: HF's 0.02 gives
        // XL-small (d_model 256) ~5, this d_model of 32 only ~0.6, and the copy was then not
        // learnt in 1,000 steps (4.9 bits); 0.1 gives ~3 and learns it (0.3 bits).
        .with_embedding_std(Some(0.1))
}

/// Trains `model` (on an autodiff device) on `steps` segments of `task` with AdamW at `lr`
/// after a linear warm-up of `warmup` steps, carrying the memory from segment to segment;
/// prints the mean losses every `log_every` steps (0: never).
pub fn train_on_copy_task(
    mut model: TransformerXl,
    task: &CopyTask,
    steps: usize,
    lr: f64,
    warmup: usize,
    log_every: usize,
) -> Result<TransformerXl, String> {
    use burn::optim::GradientsParams;
    task.validate()?;
    let device = model.device();
    // The trainer's AdamW (PyTorch's epsilon), without weight decay.
    let mut optim = memzoo::train::TrainConfig::new()
        .with_weight_decay(0.0)
        .optimizer();
    let mut memory = XlMemory::empty();
    let (mut all, mut copied, mut rest) = (Window::default(), Window::default(), Window::default());
    let start = std::time::Instant::now();
    for (step, seg) in task.segments(steps, 7, &device).into_iter().enumerate() {
        let out = xl_segment_loss(&model, &seg, &memory)?;
        memory = out.memory; // carried to the next segment, detached
        all.push((out.loss.clone().into_scalar::<f32>(), 1.0));
        copied.push(out.flagged);
        rest.push(out.other);
        let grads = GradientsParams::from_grads(out.loss.backward(), &model);
        let rate = lr * ((step + 1) as f64 / warmup.max(1) as f64).min(1.0);
        model = optim.step(rate, model, grads);
        if log_every > 0 && (step + 1) % log_every == 0 {
            println!(
                "step {:5}  loss {:.3} bits/char | repeated letters {:.3} bits | rest {:.3}  ({:.0}s)",
                step + 1,
                bits(all.take()),
                bits(copied.take()),
                bits(rest.take()),
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(model)
}

/// Mean losses (bits) of `model` (no autodiff) on `segments` fresh segments of `task`, memory
/// carried: `(repeated letters, the rest)`.
pub fn eval_on_copy_task(
    model: &TransformerXl,
    task: &CopyTask,
    segments: usize,
    seed: u64,
) -> Result<(f32, f32), String> {
    task.validate()?;
    let device = model.device();
    let mut memory = XlMemory::empty();
    let (mut copied, mut rest) = (Window::default(), Window::default());
    for seg in task.segments(segments, seed, &device) {
        let out = xl_segment_loss(model, &seg, &memory)?;
        memory = out.memory;
        copied.push(out.flagged);
        rest.push(out.other);
    }
    Ok((bits(copied.take()), bits(rest.take())))
}

/// Ends the program with `error: <message>` and exit code 1 if `result` is an error.
pub fn exit_on_error(result: Result<(), String>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Rows of whole documents, read `seg_len` tokens at a time; row `r` starts `r` segments into
/// its first document so that the rows' resets are staggered.
pub struct DocumentRows {
    rows: Vec<(Vec<u8>, Vec<bool>)>,
    seg_len: usize,
    doc_len: usize,
}

impl DocumentRows {
    /// `batch` rows with text for `segments` segments of `seg_len` tokens.
    pub fn new(batch: usize, segments: usize, seg_len: usize, seed: u64) -> Self {
        let doc_len = copy_text(1, 6, 1, 6, 0).0.len();
        let rows = (0..batch)
            .map(|r| {
                let bytes = (segments + r + 1) * seg_len + doc_len;
                let (t, c) = copy_text(bytes, 6, 1, 6, seed + r as u64);
                let skip = (r * seg_len) % doc_len;
                (t[skip..].to_vec(), c[skip..].to_vec())
            })
            .collect();
        Self {
            rows,
            seg_len,
            doc_len,
        }
    }

    /// Segment `s` of every row and, per row, whether a document starts with it.
    pub fn segment(&self, s: usize, device: &Device) -> (Segment, Vec<bool>) {
        let (b, l) = (self.rows.len(), self.seg_len);
        let (mut x, mut y, mut w, mut reset) = (vec![], vec![], vec![], vec![]);
        for (r, (text, copy)) in self.rows.iter().enumerate() {
            let start = s * l;
            x.extend(text[start..start + l].iter().map(|&t| t as i64));
            y.extend(text[start + 1..start + l + 1].iter().map(|&t| t as i64));
            w.extend(
                copy[start + 1..start + l + 1]
                    .iter()
                    .map(|&c| c as u8 as f32),
            );
            reset.push((start + r * l).is_multiple_of(self.doc_len));
        }
        let seg = Segment {
            tokens: Tensor::<2, Int>::from_data(TensorData::new(x, [b, l]), device),
            targets: Tensor::<2, Int>::from_data(TensorData::new(y, [b, l]), device),
            weights: Tensor::from_data(TensorData::new(w, [b, l]), device),
        };
        (seg, reset)
    }
}

/// The small Memorizing Transformer of the examples: 3 pre-LN layers (the middle one with
/// kNN attention when `knn`), d_model 32, 4 heads x 8, T5 positions, XL memory 8 (none
/// unless `xl_memory`), top-8 retrieval from up to 1,024 entries per row and head (exact
/// search: `auto` picks it for small memories).
pub fn small_memorizing(knn: bool, xl_memory: bool) -> memzoo_knn::MemorizingConfig {
    use memzoo::relative::{PositionConfig, PositionKind};
    let xl = XlConfig::new()
        .with_n_layers(3)
        .with_d_model(32)
        .with_n_heads(4)
        .with_d_inner(64)
        .with_mem_len(8)
        .with_pre_ln(true)
        .with_dropout(0.0)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    memzoo_knn::MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(if knn { vec![1] } else { vec![] })
        .with_top_k(8)
        .with_max_memories(1024)
        .with_xl_memory(xl_memory)
}

/// Trains `model` (on an autodiff device) for `steps` segments of 16 rows x 7 tokens of
/// [`DocumentRows`] (each segment fresh text), AdamW at `lr` after 20 warm-up steps; every
/// `log_every` steps (0: never) prints the losses, the kNN memory fill and the mean gate.
pub fn train_memorizing(
    mut model: memzoo_knn::MemorizingTransformer,
    steps: usize,
    lr: f64,
    log_every: usize,
) -> Result<memzoo_knn::MemorizingTransformer, String> {
    use burn::optim::GradientsParams;
    use burn::tensor::activation::sigmoid;
    let device = model.device();
    let (batch, seg_len) = (16, 7);
    let rows = DocumentRows::new(batch, steps, seg_len, 7);
    // The trainer's AdamW (PyTorch's epsilon), without weight decay.
    let mut optim = memzoo::train::TrainConfig::new()
        .with_weight_decay(0.0)
        .optimizer();
    let mut state = memzoo_knn::MemorizingState::new();
    let (mut all, mut copied) = (Window::default(), Window::default());
    let start = std::time::Instant::now();
    for step in 0..steps {
        let (seg, reset) = rows.segment(step, &device);
        // Rows whose document starts here: kNN memory cleared, XL memory hidden.
        let hidden = model
            .forward_state(seg.tokens.clone(), &mut state, &reset)
            .map_err(|e| e.to_string())?;
        let (loss, flagged, _) = split_loss(model.logits(hidden), &seg);
        all.push((loss.clone().into_scalar::<f32>(), 1.0));
        copied.push(flagged);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let rate = lr * ((step + 1) as f64 / 20.0).min(1.0);
        model = optim.step(rate, model, grads);
        if log_every > 0 && (step + 1) % log_every == 0 {
            let fill: Vec<usize> = (0..batch).map(|r| state.knn_len(0, r)).collect();
            let gate: Vec<f32> = match model.knn_attentions().next() {
                Some(k) => sigmoid(k.gate.val())
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .map_err(|e| format!("{e:?}"))?,
                None => vec![0.0],
            };
            println!(
                "step {:5}  loss {:.3} bits/char | repeated letters {:.3} bits | kNN memory: \
                 {:.1} entries per row on average (row 0: {}) | gate {:.2}  ({:.0}s)",
                step + 1,
                bits(all.take()),
                bits(copied.take()),
                fill.iter().sum::<usize>() as f64 / batch as f64,
                fill[0],
                gate.iter().sum::<f32>() / gate.len() as f32,
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(model)
}

#[cfg(test)]
mod tests;

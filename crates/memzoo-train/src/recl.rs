//! How far a model really looks back: per-token losses at bounded contexts, and the relative
//! effective context length (RECL) of a group of models (Dai et al. 2019, sec. 4.3 and
//! appendix C).
//!
//! **Losses at context `c`.** [`context_losses`] scores fixed blocks of `seg_len` tokens of a
//! split. For context `c` (a multiple of `seg_len`) each block is read at the end of a window
//! of the `c` tokens before it, from a fresh state, in segments of `seg_len` with the model's
//! own memories carried (XL memory, kNN memory) — so the model sees nothing before the window:
//! the first token of a block sees exactly `c` tokens, its `j`-th `c + j`. Vanilla and
//! no-recurrence models see their segment only, whatever `c`. Blocks start at least at the
//! largest context inside their document, so every context is real text of the same document.
//!
//! **RECL.** With `l_i(c, t)` the loss of model `i` on token `t` with context `c`, the
//! baseline is `b(c, t) = min_i l_i(c, t)`; over the set `T` of the `r`-fraction of tokens
//! with the largest `b(c, t)`,
//!
//! ```text
//! f_i(c, c') = 1/|T| Σ_{t∈T} min(b(c, t), l_i(c', t))
//! g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)
//! ```
//!
//! and RECL is the first `c` of the increasing list whose step to the next context gains less
//! than the threshold (the paper: 0.01): `g_i(c, c + Δ) < 0.01`. A model still gaining at
//! the last context has a RECL of at least that context ([`Recl::at_least`]).

use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_data::Token;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::model::SegmentModel;

/// The losses of one model at several contexts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LossTable {
    /// Context lengths, increasing.
    pub contexts: Vec<usize>,
    /// `losses[k][t]`: nats of scored token `t` with context `contexts[k]`.
    pub losses: Vec<Vec<f64>>,
}

impl LossTable {
    /// Mean loss (nats) at each context.
    pub fn mean_losses(&self) -> Vec<f64> {
        self.losses
            .iter()
            .map(|l| l.iter().sum::<f64>() / l.len().max(1) as f64)
            .collect()
    }
}

/// One model's relative effective context length.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Recl {
    /// The RECL: the context at which the next step stopped gaining.
    pub recl: usize,
    /// The model still gained at the last step: its RECL is at least [`Recl::recl`].
    pub at_least: bool,
    /// `g_i(c_k, c_{k+1})` for each step taken, in order.
    pub gains: Vec<f64>,
}

/// The RECL of every model of a group (`tables[i]` is model `i`'s losses) for the ratio `r`
/// (the share of hardest tokens compared, in `(0, 1]`) and the gain `threshold` (the paper's
/// 0.01). Every table must have the same contexts and the same tokens.
pub fn recl(tables: &[LossTable], r: f64, threshold: f64) -> Result<Vec<Recl>, TrainError> {
    let bad = |m: String| Err(TrainError::Config(m));
    let Some(first) = tables.first() else {
        return bad("RECL needs at least one model".into());
    };
    if !(r > 0.0 && r <= 1.0) {
        return bad(format!("the RECL ratio r must be in (0, 1], got {r}"));
    }
    if !threshold.is_finite() {
        return bad(format!(
            "the RECL threshold must be finite, got {threshold}"
        ));
    }
    let contexts = &first.contexts;
    if contexts.is_empty() || contexts.windows(2).any(|w| w[0] >= w[1]) {
        return bad(format!(
            "RECL contexts must be non-empty and increasing, got {contexts:?}"
        ));
    }
    let n = first.losses.first().map_or(0, Vec::len);
    if n == 0 {
        return bad("RECL needs at least one scored token".into());
    }
    for (i, t) in tables.iter().enumerate() {
        if &t.contexts != contexts
            || t.losses.len() != contexts.len()
            || t.losses.iter().any(|l| l.len() != n)
        {
            return bad(format!(
                "model {i}'s loss table ({} contexts {:?}, {:?} tokens) differs from model 0's \
                 ({} contexts {contexts:?}, {n} tokens each)",
                t.losses.len(),
                t.contexts,
                t.losses.iter().map(Vec::len).collect::<Vec<_>>(),
                contexts.len()
            ));
        }
        if let Some(x) = t.losses.iter().flatten().find(|x| !x.is_finite()) {
            return bad(format!("model {i}'s losses hold a non-finite value {x}"));
        }
    }
    let keep = ((r * n as f64).ceil() as usize).clamp(1, n);
    // Per step k: the baseline over the group at c_k and its hardest tokens T.
    let steps: Vec<(Vec<f64>, Vec<usize>)> = (0..contexts.len() - 1)
        .map(|k| {
            let base: Vec<f64> = (0..n)
                .map(|t| {
                    tables
                        .iter()
                        .map(|m| m.losses[k][t])
                        .fold(f64::INFINITY, f64::min)
                })
                .collect();
            let mut order: Vec<usize> = (0..n).collect();
            // Largest baseline first; ties by position, so T is unique.
            order.sort_by(|&a, &b| base[b].total_cmp(&base[a]).then(a.cmp(&b)));
            order.truncate(keep);
            (base, order)
        })
        .collect();
    Ok(tables
        .iter()
        .map(|m| {
            let mut gains = Vec::new();
            for (k, (base, top)) in steps.iter().enumerate() {
                // f(c, c) = mean_T min(b, l_i(c)) = mean_T b, as b <= l_i(c).
                let f_cc = top.iter().map(|&t| base[t]).sum::<f64>() / keep as f64;
                let f_cn = top
                    .iter()
                    .map(|&t| base[t].min(m.losses[k + 1][t]))
                    .sum::<f64>()
                    / keep as f64;
                let g = (f_cc.exp() - f_cn.exp()) / f_cc.exp();
                gains.push(g);
                if g < threshold {
                    return Recl {
                        recl: contexts[k],
                        at_least: false,
                        gains,
                    };
                }
            }
            Recl {
                recl: *contexts.last().expect("non-empty"),
                at_least: true,
                gains,
            }
        })
        .collect())
}

/// Up to `n_blocks` blocks `(document, offset)` of `seg_len` scored tokens (and the target
/// after each), each starting at least `max_context` tokens into its document, taken round
/// robin over the documents (block `k` of every long enough document, then block `k + 1`),
/// consecutive blocks of a document `stride` tokens apart.
pub fn probe_blocks(
    doc_lens: &[usize],
    seg_len: usize,
    max_context: usize,
    stride: usize,
    n_blocks: usize,
) -> Vec<(usize, usize)> {
    let stride = stride.max(seg_len).max(1);
    let fits = |d: usize, k: usize| max_context + k * stride + seg_len < doc_lens[d];
    let mut blocks = Vec::new();
    let mut k = 0;
    while blocks.len() < n_blocks {
        let round: Vec<usize> = (0..doc_lens.len()).filter(|&d| fits(d, k)).collect();
        if round.is_empty() {
            break;
        }
        for d in round {
            if blocks.len() == n_blocks {
                break;
            }
            blocks.push((d, max_context + k * stride));
        }
        k += 1;
    }
    blocks
}

/// The loss of every token of `blocks` (see [`probe_blocks`]) at each of `contexts`, as the
/// [module docs](self) describe: `batch` windows are read side by side, each chunk of rows on
/// its own thread. Tokens are ordered block by block.
///
/// Errors when a context is not a multiple of `seg_len`, when a block's window leaves its
/// document, or when the model fails.
pub fn context_losses<M: SegmentModel>(
    model: &M,
    docs: &[Vec<Token>],
    blocks: &[(usize, usize)],
    seg_len: usize,
    contexts: &[usize],
    batch: usize,
) -> Result<LossTable, TrainError> {
    let bad = |m: String| Err(TrainError::Config(m));
    if seg_len == 0 || batch == 0 || blocks.is_empty() {
        return bad(format!(
            "context losses need a positive seg_len ({seg_len}) and batch ({batch}) and at \
             least one block ({} given)",
            blocks.len()
        ));
    }
    if let Some(c) = contexts.iter().find(|c| !c.is_multiple_of(seg_len)) {
        return bad(format!(
            "context {c} is not a multiple of the segment length {seg_len}"
        ));
    }
    let max_c = contexts.iter().copied().max().unwrap_or(0);
    for &(d, o) in blocks {
        let len = docs.get(d).map_or(0, Vec::len);
        if o < max_c || o + seg_len >= len {
            return bad(format!(
                "block at token {o} of document {d} ({len} tokens) cannot have {max_c} tokens \
                 of context before it and {seg_len} + 1 tokens from it"
            ));
        }
    }
    let model = model.valid();
    let device = crate::trainer::model_device(&model)?;
    let losses = contexts
        .iter()
        .map(|&c| {
            // Clones share the parameters' storage: one model, one handle per thread.
            let chunks: Vec<&[(usize, usize)]> = blocks.chunks(batch).collect();
            let replicas: Vec<M> = chunks.iter().map(|_| model.clone()).collect();
            let chunks: Vec<Vec<f64>> = replicas
                .into_par_iter()
                .zip(chunks.into_par_iter())
                .map(|(m, chunk)| window_losses(&m, &device, docs, chunk, seg_len, c))
                .collect::<Result<_, _>>()?;
            Ok(chunks.concat())
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    Ok(LossTable {
        contexts: contexts.to_vec(),
        losses,
    })
}

/// The losses of the last `seg_len` tokens of each block's window of `c + seg_len` tokens,
/// read from a fresh state in segments of `seg_len`.
fn window_losses<M: SegmentModel>(
    model: &M,
    device: &Device,
    docs: &[Vec<Token>],
    blocks: &[(usize, usize)],
    seg_len: usize,
    c: usize,
) -> Result<Vec<f64>, TrainError> {
    let rows = blocks.len();
    let segment = |shift: usize, k: usize| -> Tensor<2, Int> {
        let data: Vec<i64> = blocks
            .iter()
            .flat_map(|&(d, o)| {
                let start = o - c + k * seg_len + shift;
                docs[d][start..start + seg_len].iter().map(|&t| t as i64)
            })
            .collect();
        Tensor::from_data(TensorData::new(data, [rows, seg_len]), device)
    };
    let mut state = M::State::default();
    let n_seg = c / seg_len + 1;
    // A fresh state: every row starts a document at the window's first segment.
    let starts = vec![true; rows];
    let within = vec![false; rows];
    for k in 0..n_seg - 1 {
        let reset = if k == 0 { &starts } else { &within };
        model.segment_nll(segment(0, k), segment(1, k), &mut state, reset, false)?;
    }
    let reset = if n_seg == 1 { &starts } else { &within };
    // ℓ_t = -log p(y_t)
    let nll = model
        .segment_nll(
            segment(0, n_seg - 1),
            segment(1, n_seg - 1),
            &mut state,
            reset,
            false,
        )?
        .nll
        .reshape([rows * seg_len]);
    let values = nll
        .into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| TrainError::Model(format!("reading the losses: {e:?}")))?;
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(contexts: &[usize], losses: &[&[f64]]) -> LossTable {
        LossTable {
            contexts: contexts.to_vec(),
            losses: losses.iter().map(|l| l.to_vec()).collect(),
        }
    }

    /// A made-up group of two models on four tokens, computed by hand.
    ///
    /// Model A: contexts 0 / 100 / 200, losses (nats) per token
    ///   c=0:   [2.0, 1.0, 3.0, 0.5]
    ///   c=100: [1.0, 1.0, 2.0, 0.5]
    ///   c=200: [1.0, 1.0, 2.0, 0.5]
    /// Model B:
    ///   c=0:   [2.5, 0.8, 3.0, 0.6]
    ///   c=100: [2.5, 0.8, 2.9, 0.6]
    ///   c=200: [2.5, 0.8, 2.9, 0.6]
    ///
    /// r = 1: step 0 -> 100: b(0) = [2.0, 0.8, 3.0, 0.5], mean 1.575, exp = 4.8312.
    ///   A: min(b, l_A(100)) = [1.0, 0.8, 2.0, 0.5], mean 1.075, exp 2.9300; g = 0.39347 -> go on.
    ///   B: min(b, l_B(100)) = [2.0, 0.8, 2.9, 0.5], mean 1.55, exp 4.7115; g = 0.02469 -> go on.
    /// step 100 -> 200: b(100) = [1.0, 0.8, 2.0, 0.5], mean 1.075.
    ///   A: l_A(200) = l_A(100): min = b on every token but none lower -> g = 0 -> RECL 100.
    ///   B: min(b, l_B(200)) = b -> g = 0 -> RECL 100.
    /// r = 0.25 (1 token): step 0: the hardest baseline token is t=2 (3.0).
    ///   A: min(3.0, 2.0) = 2.0: g = 1 - e^-1 = 0.63212 -> on; step 1: t=2 (b = 2.0): g = 0.
    ///   B: min(3.0, 2.9) = 2.9: g = 1 - e^-0.1 = 0.09516 -> on; step 1: g = 0.
    #[test]
    fn recl_matches_a_hand_computation() {
        let a = table(
            &[0, 100, 200],
            &[
                &[2.0, 1.0, 3.0, 0.5],
                &[1.0, 1.0, 2.0, 0.5],
                &[1.0, 1.0, 2.0, 0.5],
            ],
        );
        let b = table(
            &[0, 100, 200],
            &[
                &[2.5, 0.8, 3.0, 0.6],
                &[2.5, 0.8, 2.9, 0.6],
                &[2.5, 0.8, 2.9, 0.6],
            ],
        );
        let group = [a.clone(), b.clone()];
        let out = recl(&group, 1.0, 0.01).unwrap();
        let e = |x: f64| x.exp();
        let g_a = (e(1.575) - e(1.075)) / e(1.575);
        let g_b = (e(1.575) - e(1.55)) / e(1.575);
        assert!((out[0].gains[0] - g_a).abs() < 1e-12, "{:?}", out[0]);
        assert!((g_a - 0.39347).abs() < 1e-4);
        assert!((out[1].gains[0] - g_b).abs() < 1e-12, "{:?}", out[1]);
        assert!((g_b - 0.02469).abs() < 1e-4);
        assert_eq!((out[0].recl, out[0].at_least), (100, false));
        assert_eq!((out[1].recl, out[1].at_least), (100, false));
        // A threshold of 0.03 stops B at the first step, not A.
        let out = recl(&group, 1.0, 0.03).unwrap();
        assert_eq!(out[0].recl, 100);
        assert_eq!(out[1].recl, 0);
        // r = 0.25: one token, the hardest.
        let out = recl(&group, 0.25, 0.01).unwrap();
        assert!((out[0].gains[0] - (1.0 - e(-1.0))).abs() < 1e-12);
        assert!((out[1].gains[0] - (1.0 - e(-0.1))).abs() < 1e-12);
        assert_eq!(out[0].gains[1], 0.0);
        // r = 0.25 with threshold 0.1: A goes on (0.632), B stops at 0 (0.095).
        let out = recl(&group, 0.25, 0.1).unwrap();
        assert_eq!((out[0].recl, out[1].recl), (100, 0));
        // A model alone that keeps gaining reaches the end: "at least".
        let c = table(&[0, 10], &[&[2.0], &[1.0]]);
        let out = recl(&[c], 1.0, 0.01).unwrap();
        assert_eq!((out[0].recl, out[0].at_least), (10, true));
    }

    #[test]
    fn recl_refuses_bad_groups() {
        let a = table(&[0, 100], &[&[1.0, 2.0], &[1.0, 1.0]]);
        let short = table(&[0, 100], &[&[1.0], &[1.0]]);
        let msg = |r: Result<Vec<Recl>, TrainError>| format!("{}", r.unwrap_err());
        assert!(msg(recl(&[a.clone(), short], 1.0, 0.01)).contains("model 1"));
        assert!(msg(recl(std::slice::from_ref(&a), 0.0, 0.01)).contains("r must be in (0, 1]"));
        assert!(msg(recl(std::slice::from_ref(&a), f64::NAN, 0.01)).contains("got NaN"));
        assert!(msg(recl(&[], 1.0, 0.01)).contains("at least one model"));
        let down = table(&[100, 0], &[&[1.0], &[1.0]]);
        assert!(msg(recl(&[down], 1.0, 0.01)).contains("increasing"));
        let nan = table(&[0, 100], &[&[f64::NAN], &[1.0]]);
        assert!(msg(recl(&[nan], 1.0, 0.01)).contains("non-finite"));
    }

    #[test]
    fn probe_blocks_round_robin_past_the_context() {
        // seg 4, max context 8, stride 6: doc 0 (30 tokens) fits offsets 8, 14 (14+4 < 30),
        // 20 (24 < 30), 26? 30 < 30 no; doc 1 (13 tokens): 8 + 4 = 12 < 13 fits k=0 only;
        // doc 2 (12 tokens): 12 < 12 no.
        let b = probe_blocks(&[30, 13, 12], 4, 8, 6, 10);
        assert_eq!(b, vec![(0, 8), (1, 8), (0, 14), (0, 20)]);
        assert_eq!(
            probe_blocks(&[30, 13, 12], 4, 8, 6, 2),
            vec![(0, 8), (1, 8)]
        );
    }
}

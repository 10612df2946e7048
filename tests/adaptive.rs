//! The adaptive softmax in the one loss path: training and evaluation compute the head and only
//! the tail clusters their targets fall in, never the `[tokens, vocab]` log-probabilities; the
//! full distribution is built only where a caller asks for it (generation, accuracy).

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_stack::{
    AdaptiveLogSoftmax, OutputLayer, Step, TransformerXl, XlConfig, XlMemory, XlState, target_nll,
};
use memzoo_tests::*;
use memzoo_train::RecurrentModel;

/// The WikiText-103 vocabulary and clusters (267,735 words, cutoffs 20k / 40k / 200k, div_val
/// 1, tied as `xl-wt103-base`) on a one-layer stack of width `d`.
fn wt103_sized(d: usize) -> XlConfig {
    XlConfig::wt103_base()
        .with_n_layers(1)
        .with_d_model(d)
        .with_n_heads(2)
        .with_d_head(Some(d / 2))
        .with_d_inner(2 * d)
        .with_dropout(0.0)
        .with_mem_len(8)
}

const VOCAB: usize = 267_735;

/// Ids drawn from the head (< 20k), the first tail cluster (20k..40k) and the last one
/// (200k..267,735): never the third cluster (40k..200k).
fn ids(batch: usize, len: usize, seed: u64, device: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..(batch * len) as i64)
        .map(|i| {
            let r = (i * 7919 + seed as i64 * 104_729) % 19_999;
            match i % 3 {
                0 => r,
                1 => 20_000 + r,
                _ => 200_000 + (r * 3) % 67_735,
            }
        })
        .collect();
    Tensor::from_data(TensorData::new(v, [batch, len]), device)
}

fn model(d: usize, device: &Device) -> TransformerXl {
    let model = wt103_sized(d).init(device).unwrap();
    assert!(matches!(model.output, OutputLayer::Adaptive(_)));
    seeded_weights(model, 5, |_| 0.3)
}

/// The widest output of the evaluation and training steps is the last cluster's 67,735 words
/// (the widest cluster a target falls in), not the vocabulary; with every target in the head
/// it is the head (20,000 words + 3 cluster logits). Only the distribution (`logits`) is
/// `vocab` wide.
#[test]
fn adaptive_loss_computes_only_the_target_clusters() {
    let dev = flex().autodiff();
    let model = model(16, &dev);
    let (x, y) = (ids(2, 12, 1, &dev), ids(2, 12, 2, &dev));
    AdaptiveLogSoftmax::take_widest_output();
    let scores = model
        .eval_step(x.clone(), y.clone(), &mut XlState::new(), &Step::default())
        .unwrap();
    assert_eq!(scores.nll.dims(), [2, 12]);
    assert_eq!(
        AdaptiveLogSoftmax::take_widest_output(),
        67_735,
        "eval step"
    );
    // The trainer's contract: its training and evaluation steps.
    let reset = [false, false];
    let (loss, _grads) = RecurrentModel::train_step(
        &model,
        x.clone(),
        y.clone(),
        &mut XlState::new(),
        &reset,
        None,
    )
    .unwrap();
    assert!(loss.is_finite());
    assert_eq!(
        AdaptiveLogSoftmax::take_widest_output(),
        67_735,
        "train step"
    );
    RecurrentModel::segment_nll(
        &model,
        x.clone(),
        y.clone(),
        &mut XlState::new(),
        &reset,
        false,
    )
    .unwrap();
    assert_eq!(
        AdaptiveLogSoftmax::take_widest_output(),
        67_735,
        "segment_nll"
    );
    // Targets in the head only: no tail cluster at all.
    let head_only = Tensor::<2, Int>::from_data(
        TensorData::new((0..24).map(|i| i * 811).collect::<Vec<i64>>(), [2, 12]),
        &dev,
    );
    model
        .eval_step(x.clone(), head_only, &mut XlState::new(), &Step::default())
        .unwrap();
    assert_eq!(
        AdaptiveLogSoftmax::take_widest_output(),
        20_003,
        "head only"
    );
    // Accuracy asks for the argmax: the whole distribution.
    let scores = model
        .eval_step(
            x.clone(),
            y.clone(),
            &mut XlState::new(),
            &Step::default().with_hits(true),
        )
        .unwrap();
    assert!(scores.hits.is_some());
    assert_eq!(AdaptiveLogSoftmax::take_widest_output(), VOCAB, "hits");
    // Generation asks for the distribution.
    let hidden = model.forward(x, &XlMemory::empty()).unwrap().hidden;
    assert_eq!(model.logits(hidden).dims(), [2, 12, VOCAB]);
    assert_eq!(AdaptiveLogSoftmax::take_widest_output(), VOCAB, "logits");
}

/// The target-only NLL equals the full log-softmax at the targets: against the model's full
/// distribution for every target, and against a naive f64 computation of Grave et al.'s
/// formula from the raw tables for a few rows.
#[test]
fn adaptive_target_nll_equals_the_full_log_softmax() {
    let dev = flex();
    let model = model(8, &dev);
    let (x, y) = (ids(2, 9, 3, &dev), ids(2, 9, 4, &dev));
    let got = host(
        model
            .eval_step(x.clone(), y.clone(), &mut XlState::new(), &Step::default())
            .unwrap()
            .nll,
    );
    let hidden = model.forward(x, &XlMemory::empty()).unwrap().hidden;
    // An adaptive output's logits are its log-probabilities: read them at the targets.
    let [b, q] = y.dims();
    let full = host(
        model
            .logits(hidden.clone())
            .gather(2, y.clone().reshape([b, q, 1]))
            .neg(),
    );
    // f32 losses of ~15 nats: to 1e-5 of their size.
    for (r, (g, f)) in got.iter().zip(&full).enumerate() {
        assert!(
            (g - f).abs() <= 1e-5 * f.abs().max(1.0),
            "row {r}: target-only {g} vs full log-softmax {f}"
        );
    }
    assert!(
        got.iter().zip(&got[1..]).any(|(a, b)| (a - b).abs() > 1e-2),
        "losses do not vary: {got:?}"
    );

    // Naive: log p(w) = log_softmax([h E_0ᵀ + b_0 ; h W_cᵀ + b_c])[w or cluster]
    //                   (+ log_softmax(h E_iᵀ + b_i)[w - c_i] in tail cluster i).
    let OutputLayer::Adaptive(sm) = &model.output else {
        unreachable!()
    };
    let emb = model.embedding.adaptive().unwrap();
    let table = host(emb.tables()[0].val()); // [vocab, d], div_val 1, no projections
    assert!(emb.projections()[0].is_none());
    let biases: Vec<Vec<f32>> = sm.biases().iter().map(|b| host(b.val())).collect();
    let cw = host(sm.cluster_weight().unwrap().val());
    let cb = host(sm.cluster_bias().unwrap().val());
    let bounds = [0usize, 20_000, 40_000, 200_000, VOCAB];
    let d = 8;
    let h = host(hidden);
    let targets: Vec<i64> = y.into_data().convert::<i64>().try_into_vec().unwrap();
    let dot = |row: &[f32], w: &[f32]| -> f64 {
        row.iter().zip(w).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let log_softmax_at = |logits: &[f64], k: usize| -> f64 {
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        logits[k] - m - z.ln()
    };
    for r in [0usize, 1, 2, 7, 11, 17] {
        let hr = &h[r * d..(r + 1) * d];
        let t = targets[r] as usize;
        let mut head: Vec<f64> = (0..20_000)
            .map(|w| dot(hr, &table[w * d..(w + 1) * d]) + biases[0][w] as f64)
            .collect();
        head.extend((0..3).map(|c| dot(hr, &cw[c * d..(c + 1) * d]) + cb[c] as f64));
        let cluster = bounds.iter().rposition(|&b| b <= t).unwrap();
        let lp = if cluster == 0 {
            log_softmax_at(&head, t)
        } else {
            let (lo, hi) = (bounds[cluster], bounds[cluster + 1]);
            let tail: Vec<f64> = (lo..hi)
                .map(|w| dot(hr, &table[w * d..(w + 1) * d]) + biases[cluster][w - lo] as f64)
                .collect();
            log_softmax_at(&head, 20_000 + cluster - 1) + log_softmax_at(&tail, t - lo)
        };
        assert!(
            (got[r] as f64 + lp).abs() <= 1e-5 * lp.abs().max(1.0),
            "row {r} (target {t}, cluster {cluster}): {} vs naive {}",
            got[r],
            -lp
        );
    }
}

/// The cost of an adaptive-softmax loss on the WikiText-103 vocabulary, target-only against
/// the full log-probabilities (what the loss computed before): `cargo test -p memzoo-tests
/// --release adaptive_loss_cost -- --ignored --nocapture` (run each alone, under
/// `/usr/bin/time -v`, for its peak memory).
fn loss_cost(full: bool) {
    let dev = flex().autodiff();
    let model = model(64, &dev);
    let (x, y) = (ids(4, 150, 1, &dev), ids(4, 150, 2, &dev));
    let hidden = model
        .forward(x, &XlMemory::empty())
        .unwrap()
        .hidden
        .detach();
    let mut seconds = Vec::new();
    for _ in 0..3 {
        // The loss alone, from hidden states that want gradients.
        let hidden = hidden.clone().require_grad();
        let t0 = Instant::now();
        let loss = if full {
            target_nll(model.logits(hidden.clone()), y.clone()).mean()
        } else {
            let [b, q, d] = hidden.dims();
            let OutputLayer::Adaptive(sm) = &model.output else {
                unreachable!()
            };
            sm.nll(
                hidden.clone().reshape([b * q, d]),
                y.clone().reshape([b * q]),
                model.embedding.adaptive().unwrap(),
            )
            .unwrap()
            .mean()
        };
        let grads = loss.clone().backward();
        let _: f32 = loss.into_scalar();
        drop(grads);
        seconds.push(t0.elapsed().as_secs_f64());
    }
    eprintln!(
        "adaptive loss + backward, 600 tokens, vocab {VOCAB}, d 64, {}: {:.3} s (best of 3), widest output {}",
        if full {
            "full log-probs"
        } else {
            "target-only"
        },
        seconds.iter().cloned().fold(f64::INFINITY, f64::min),
        AdaptiveLogSoftmax::take_widest_output()
    );
}

#[test]
#[ignore = "a measurement: run alone for its time and peak memory"]
fn adaptive_loss_cost_target_only() {
    loss_cost(false);
}

#[test]
#[ignore = "a measurement: run alone for its time and peak memory"]
fn adaptive_loss_cost_full_log_probs() {
    loss_cost(true);
}

//! Tests of the examples' helpers: the copy-text data, the segment cutting and the split loss
//! against naive formulas.

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};

use super::*;

fn flex() -> Device {
    memzoo::backend::parse_device("flex").unwrap()
}

#[test]
fn copy_text_repeats_every_passage_at_the_stated_distance() {
    let (passage, gap, repeats) = (6, 1, 6);
    let (text, copy) = copy_text(500, passage, gap, repeats, 3);
    assert_eq!(text.len(), copy.len());
    assert!(text.len() >= 500);
    let doc = passage + repeats * (gap + passage) + 1;
    assert_eq!(text.len() % doc, 0, "whole documents only");
    let d = passage + gap;
    for (i, &flag) in copy.iter().enumerate() {
        if flag {
            assert!(text[i].is_ascii_lowercase());
            assert_eq!(text[i], text[i - d], "byte {i} is not a copy from {d} back");
        }
    }
    // Per document: the first passage is not flagged, the repeats are.
    let flagged = copy[..doc].iter().filter(|&&f| f).count();
    assert_eq!(flagged, repeats * passage);
    assert!(copy[..passage].iter().all(|&f| !f));
    assert_eq!(text[doc - 1], b'\n');
    assert_eq!(&text[passage..passage + gap], &b"."[..]);
}

#[test]
fn ordered_segments_continue_each_row_and_shift_targets() {
    let stream: Vec<u8> = (0..=40u8).collect();
    let flags: Vec<bool> = stream.iter().map(|&b| b % 3 == 0).collect();
    let segs = ordered_segments(&stream, &flags, 2, 4, &flex());
    // row_len = 40 / 2 = 20, 5 segments of 4
    assert_eq!(segs.len(), 5);
    let ints = |t: Tensor<2, burn::tensor::Int>| {
        t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
    };
    let x1 = ints(segs[1].tokens.clone());
    let y1 = ints(segs[1].targets.clone());
    assert_eq!(x1, vec![4, 5, 6, 7, 24, 25, 26, 27]);
    assert_eq!(y1, vec![5, 6, 7, 8, 25, 26, 27, 28]);
    let w1 = segs[1]
        .weights
        .clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    let want: Vec<f32> = y1
        .iter()
        .map(|&t| if t % 3 == 0 { 1.0 } else { 0.0 })
        .collect();
    assert_eq!(w1, want);
}

#[test]
fn split_loss_matches_the_naive_cross_entropy() {
    let device = flex();
    let (b, q, v) = (2, 3, 5);
    let logits: Vec<f32> = (0..b * q * v)
        .map(|i| ((i * 7 % 11) as f32) * 0.3 - 1.0)
        .collect();
    let targets: Vec<i64> = vec![0, 4, 2, 1, 3, 3];
    let weights: Vec<f32> = vec![1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
    let seg = Segment {
        tokens: Tensor::from_data(TensorData::new(vec![0i64; b * q], [b, q]), &device),
        targets: Tensor::from_data(TensorData::new(targets.clone(), [b, q]), &device),
        weights: Tensor::from_data(TensorData::new(weights.clone(), [b, q]), &device),
    };
    let (loss, flagged, other) = split_loss(
        Tensor::from_data(TensorData::new(logits.clone(), [b, q, v]), &device),
        &seg,
    );
    // nll_i = log Σ_j exp(z_ij) - z_i,t_i
    let nll: Vec<f64> = (0..b * q)
        .map(|i| {
            let z = &logits[i * v..(i + 1) * v];
            let lse = z.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
            lse - z[targets[i] as usize] as f64
        })
        .collect();
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    let fl: Vec<f64> = (0..b * q)
        .filter(|&i| weights[i] > 0.0)
        .map(|i| nll[i])
        .collect();
    let ot: Vec<f64> = (0..b * q)
        .filter(|&i| weights[i] == 0.0)
        .map(|i| nll[i])
        .collect();
    let avg = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    let close = |a: f32, b: f64| (a as f64 - b).abs() < 1e-5;
    assert!(close(loss.into_scalar::<f32>(), mean));
    assert!(
        close(flagged.0, avg(&fl)) && flagged.1 == 3.0,
        "{flagged:?}"
    );
    assert!(close(other.0, avg(&ot)) && other.1 == 3.0, "{other:?}");
}

#[test]
fn window_weighs_means_by_their_counts_and_skips_empty_ones() {
    let mut w = Window::default();
    w.push((1.0, 1.0));
    w.push((4.0, 3.0));
    w.push((f32::NAN, 0.0));
    assert!((w.take() - 13.0 / 4.0).abs() < 1e-6);
    assert!(w.take().is_nan(), "take starts over");
}

#[test]
fn the_small_xl_learns_the_copy_through_its_memory_and_not_without() {
    // A shortened xl_train: with memory the repeated letters fall far below guessing
    // (log2 26 = 4.70 bits); without memory they cannot.
    let task = CopyTask::default();
    let run = |mem_len: usize| {
        let device = flex().autodiff();
        device.seed(0);
        let model = small_xl(mem_len).init(&device).unwrap();
        let model = train_on_copy_task(model, &task, 1000, 3e-3, 20, 0).unwrap();
        eval_on_copy_task(&model.valid(), &task, 64, 5).unwrap()
    };
    let (with, _) = run(8);
    let (without, _) = run(0);
    eprintln!("repeated letters: {with:.3} bits with memory, {without:.3} without");
    assert!(with < 1.0, "with memory: {with}");
    assert!(without > 4.0, "without memory: {without}");
}

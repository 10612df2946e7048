//! Transformer-XL: recurrence against one masked pass, detached memory, overfitting.

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use memzoo_relative::{AttentionMask, PositionConfig, PositionKind};
use memzoo_stack::{TransformerXl, XlConfig, XlMemory};
use memzoo_tests::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

fn tokens(batch: usize, len: usize, vocab: usize, seed: u64, dev: &Device) -> Tensor<2, Int> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data: Vec<i64> = (0..batch * len)
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), dev)
}

/// The mask of one pass over `total` positions that reproduces segment-by-segment recurrence:
/// position p (in segment s = p / qlen) sees q <= p with q >= max(0, s*qlen - mem_len).
fn banded_mask(total: usize, qlen: usize, mem_len: usize, dev: &Device) -> Tensor<3, Bool> {
    let mut hidden = vec![false; total * total];
    for p in 0..total {
        let first = ((p / qlen) * qlen).saturating_sub(mem_len);
        for q in 0..total {
            hidden[p * total + q] = q > p || q < first;
        }
    }
    Tensor::from_data(TensorData::new(hidden, [1, total, total]), dev)
}

fn check_recurrence(model: &TransformerXl, qlen: usize, n_seg: usize, dev: &Device, what: &str) {
    let batch = 2;
    let total = qlen * n_seg;
    let toks = tokens(batch, total, 40, 3, dev);

    let mut memory = XlMemory::empty();
    let mut seg_out = Vec::new();
    for s in 0..n_seg {
        let seg = toks.clone().narrow(1, s * qlen, qlen);
        let out = model.forward(seg, &memory).unwrap();
        assert!(
            out.memory.len() <= model.mem_len,
            "{what}: memory longer than mem_len"
        );
        memory = out.memory;
        seg_out.push(out.hidden);
    }
    let seg_out = host(Tensor::cat(seg_out, 1));

    let mask = AttentionMask::Explicit(banded_mask(total, qlen, model.mem_len, dev));
    let full = model
        .forward_masked(toks, &XlMemory::empty(), &mask)
        .unwrap();
    assert_close(&seg_out, &host(full.hidden), 1e-4, what);
}

#[test]
fn recurrence_equals_one_banded_pass() {
    let dev = flex();
    // qlen == mem_len, qlen < mem_len (memory spans several segments), qlen > mem_len.
    for (qlen, mem_len) in [(4, 4), (3, 7), (6, 4), (5, 1)] {
        for pre_ln in [false, true] {
            for kind in [PositionKind::Xl, PositionKind::Learned, PositionKind::T5] {
                let positions = PositionConfig::new()
                    .with_kind(kind)
                    .with_num_buckets(8)
                    .with_max_distance(10);
                let model = small_xl(mem_len)
                    .with_pre_ln(pre_ln)
                    .with_positions(positions)
                    .init(&dev)
                    .unwrap();
                let what = format!("qlen {qlen} mem_len {mem_len} pre_ln {pre_ln} {kind:?}");
                check_recurrence(&model, qlen, 4, &dev, &what);
            }
        }
    }
}

#[test]
fn evaluation_with_other_lengths_keeps_recurrence_exact() {
    // Trained with mem_len 4; evaluated with a longer memory and a different segment length.
    let dev = flex();
    let model = small_xl(4).init(&dev).unwrap().with_mem_len(9);
    check_recurrence(&model, 5, 4, &dev, "eval mem_len 9, qlen 5");
    let model = model.with_mem_len(2);
    check_recurrence(&model, 7, 3, &dev, "eval mem_len 2, qlen 7");
}

#[test]
fn memory_keeps_the_last_mem_len_positions() {
    let dev = flex();
    let model = small_xl(5).with_n_layers(1).init(&dev).unwrap();
    let toks = tokens(1, 12, 40, 5, &dev);
    // Memory after segments of 3, 3, 3, 3: the layer input at positions 7..12.
    let mut memory = XlMemory::empty();
    for s in 0..4 {
        memory = model
            .forward(toks.clone().narrow(1, 3 * s, 3), &memory)
            .unwrap()
            .memory;
    }
    assert_eq!(memory.len(), 5);
    let emb = model
        .embedding
        .plain()
        .unwrap()
        .forward(toks)
        .mul_scalar((32f64).sqrt());
    let want = host(emb.narrow(1, 7, 5));
    assert_close(
        &host(memory.layer(0).unwrap().clone()),
        &want,
        1e-6,
        "memory window",
    );
}

#[test]
fn memory_is_detached_from_the_previous_segment() {
    let dev = flex().autodiff();
    let model = small_xl(6).init(&dev).unwrap();
    let (seg1, seg2) = (tokens(2, 6, 40, 8, &dev), tokens(2, 6, 40, 9, &dev));
    let targets = tokens(2, 6, 40, 10, &dev);

    // Segment 1 on the autodiff device: its memory must be a graph-free leaf.
    let out1 = model.forward(seg1.clone(), &XlMemory::empty()).unwrap();
    for t in out1.memory.layers() {
        assert!(!t.is_require_grad(), "memory still tracks gradients");
    }
    let (loss, _) = memory_loss(&model, seg2.clone(), targets.clone(), &out1.memory).unwrap();
    let grads = loss.backward();

    // The same memory computed with no graph at all (inference copy of the model).
    let inner = model.valid();
    let mem_const = inner
        .forward(seg1.inner(), &XlMemory::empty())
        .unwrap()
        .memory
        .to_device(&dev);
    let (loss2, _) = memory_loss(&model, seg2, targets, &mem_const).unwrap();
    let grads2 = loss2.backward();

    // If segment 2's backward reached segment 1's graph, the parameters used in both
    // segments would collect extra gradient there.
    let params = [
        &model.layers[0].block.ff_in.weight,
        &model.layers[0].attention.local().query.weight,
        &model.layers[2].attention.local().key_value.weight,
    ];
    for p in params {
        let g1 = host(p.grad(&grads).expect("gradient"));
        let g2 = host(p.grad(&grads2).expect("gradient"));
        assert!(g1.iter().any(|v| *v != 0.0));
        assert_close(&g1, &g2, 1e-6, "gradient through detached memory");
    }
    let e1 = host(
        model
            .embedding
            .plain()
            .unwrap()
            .weight
            .grad(&grads)
            .unwrap(),
    );
    let e2 = host(
        model
            .embedding
            .plain()
            .unwrap()
            .weight
            .grad(&grads2)
            .unwrap(),
    );
    assert_close(&e1, &e2, 1e-6, "embedding gradient");
}

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Trains across many segments carrying memory and prints RSS after each step. Run by
/// `training_across_segments_does_not_grow_memory` in a process of its own.
#[test]
#[ignore = "probe run in a child process"]
fn rss_probe() {
    let dev = flex().autodiff();
    let mut model = small_xl(32)
        .with_d_model(64)
        .with_d_inner(256)
        .with_n_layers(2)
        .init(&dev)
        .unwrap();
    let mut optim = AdamWConfig::new().init();
    let mut memory = XlMemory::empty();
    let data = tokens(8, 32 * 61, 40, 1, &dev);
    for step in 0..60 {
        let seg = data.clone().narrow(1, 32 * step, 32);
        let tgt = data.clone().narrow(1, 32 * step + 1, 32);
        let (loss, next) = memory_loss(&model, seg, tgt, &memory).unwrap();
        memory = next;
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        println!("RSS {step} {}", resident_bytes());
    }
}

#[test]
fn training_across_segments_does_not_grow_memory() {
    if resident_bytes() == 0 {
        eprintln!("no /proc/self/statm: skipping");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "xl::rss_probe",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rss: Vec<usize> = stdout
        .lines()
        .filter_map(|l| l.find("RSS ").map(|i| &l[i + 4..]))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(rss.len(), 60, "{stdout}");
    let growth = rss[59] as f64 - rss[15] as f64;
    eprintln!(
        "RSS after step 15: {} MiB, after 60: {} MiB",
        rss[15] >> 20,
        rss[59] >> 20
    );
    // One step's graph here holds several MiB of activations; 45 leaked graphs would add far more.
    assert!(
        growth < 24.0 * 1048576.0,
        "RSS grew by {:.1} MiB over 45 steps",
        growth / 1048576.0
    );
}

#[test]
fn small_xl_overfits_a_fixed_batch() {
    let dev = flex().autodiff();
    let mut model = small_xl(8)
        .with_d_model(64)
        .with_n_layers(2)
        .with_d_inner(128)
        .init(&dev)
        .unwrap();
    let mut optim = AdamWConfig::new().init();
    let data = tokens(4, 17, 40, 21, &dev);
    let (x, y) = (data.clone().narrow(1, 0, 16), data.narrow(1, 1, 16));
    let mut losses = vec![];
    for _ in 0..80 {
        let (loss, _) = memory_loss(&model, x.clone(), y.clone(), &XlMemory::empty()).unwrap();
        losses.push(loss.clone().into_scalar::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    eprintln!("overfit: loss {first:.3} -> {last:.3}");
    assert!(
        first > 3.0,
        "initial loss {first} should be near ln(40) = 3.7"
    );
    assert!(last < 0.25 * first, "loss only fell from {first} to {last}");
}

#[test]
fn bad_configs_and_inputs_are_errors() {
    let dev = flex();
    let err = XlConfig::new()
        .with_d_model(250)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("250") && err.contains("n_heads (8)"), "{err}");
    let err = small_xl(0)
        .with_same_length(true)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("mem_len"), "{err}");
    let err = small_xl(4)
        .with_n_layers(0)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("n_layers"), "{err}");
    let err = small_xl(4)
        .with_dropout(1.0)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dropout"), "{err}");

    let model = small_xl(4).init(&dev).unwrap();
    let mem = model
        .forward(tokens(2, 4, 40, 1, &dev), &XlMemory::empty())
        .unwrap()
        .memory;
    let err = model
        .forward(tokens(3, 4, 40, 1, &dev), &mem)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[2, _, 32]") && err.contains("[3, _, 32]"),
        "{err}"
    );
    let err = memory_loss(
        &model,
        tokens(2, 4, 40, 1, &dev),
        tokens(2, 5, 40, 1, &dev),
        &mem,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("[2, 5]"), "{err}");
}

/// `same_length` at model level: segment-by-segment recurrence, where every query attends to
/// exactly the `mem_len` positions ending at itself (memory included), equals one pass over the
/// whole sequence whose position p sees q in (p - mem_len, p], at every layer.
#[test]
fn same_length_recurrence_equals_one_sliding_window_pass() {
    let dev = flex();
    for (qlen, mem_len) in [(4, 4), (3, 7), (6, 4)] {
        let model = small_xl(mem_len).with_same_length(true).init(&dev).unwrap();
        let (batch, n_seg) = (2, 4);
        let total = qlen * n_seg;
        let toks = tokens(batch, total, 40, 8, &dev);
        let mut memory = XlMemory::empty();
        let mut seg_out = Vec::new();
        for s in 0..n_seg {
            let out = model
                .forward(toks.clone().narrow(1, s * qlen, qlen), &memory)
                .unwrap();
            memory = out.memory;
            seg_out.push(out.hidden);
        }
        let hidden: Vec<bool> = (0..total * total)
            .map(|i| {
                let (p, q) = (i / total, i % total);
                q > p || q + mem_len <= p
            })
            .collect();
        let mask = AttentionMask::Explicit(Tensor::from_data(
            TensorData::new(hidden, [1, total, total]),
            &dev,
        ));
        let full = model
            .forward_masked(toks.clone(), &XlMemory::empty(), &mask)
            .unwrap();
        let what = format!("same_length, qlen {qlen}, mem_len {mem_len}");
        assert_close(
            &host(Tensor::cat(seg_out, 1)),
            &host(full.hidden),
            1e-4,
            &what,
        );
        // and it is another model than the plain causal one (the window bites)
        let mut plain = model.clone();
        plain.same_length = false;
        let plain_out = host(plain.forward(toks, &XlMemory::empty()).unwrap().hidden);
        let windowed = host(
            model
                .forward(tokens(batch, total, 40, 8, &dev), &XlMemory::empty())
                .unwrap()
                .hidden,
        );
        assert!(
            max_abs_diff(&plain_out, &windowed) > 1e-3,
            "{what}: the window changes nothing"
        );
    }
}

//! The Compressive Transformer in the stack: its invalid combinations refused by name, its
//! memories (a naive replay of the paper's update written here) and their checkpoints.

use burn::tensor::Tensor;
use memzoo_stack::{CompressiveConfig, LayerKind, Residual, XlConfig, XlState};
use memzoo_tests::*;
use memzoo_train::SegmentModel;

fn tiny() -> XlConfig {
    tiny_stack().with_mem_len(4).with_compressive(Some(
        CompressiveConfig::new().with_cmem_len(3).with_ratio(2),
    ))
}

#[test]
fn compressive_refuses_invalid_combinations_by_name() {
    let dev = flex();
    let err = |c: XlConfig| c.init(&dev).unwrap_err().to_string();
    assert!(err(tiny().with_mem_len(0)).contains("mem_len = 0"));
    assert!(err(tiny().with_mem_len(5)).contains("mem_len (5)"));
    assert!(err(tiny().with_residual(Residual::Reversible)).contains("Reversible"));
    let lsh = tiny().with_layers(vec![LayerKind::Xl, LayerKind::Lsh]);
    assert!(err(lsh).contains("Lsh"));
    let knn = tiny()
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
        .with_knn(memzoo_stack::KnnLayerConfig::new().with_feed(memzoo_stack::KnnFeed::Evicted));
    assert!(err(knn).contains("knn.feed"));
    let c = CompressiveConfig::new().with_ratio(0);
    assert!(err(tiny().with_compressive(Some(c))).contains("ratio"));
}

/// Segment by segment, the XL memory is the last `mem_len` layer inputs and the compressed
/// memory the last `cmem_len` of `f_c` of what left it (mean pooling, written out here), and
/// both survive a checkpoint.
#[test]
fn compressive_memories_follow_the_paper_and_survive_checkpoints() {
    let dev = flex();
    let cfg = tiny().with_compressive(Some(
        CompressiveConfig::new()
            .with_cmem_len(3)
            .with_ratio(2)
            .with_function(memzoo_stack::CompressionKind::Mean),
    ));
    let model = cfg.init(&dev).unwrap();
    let mut state = XlState::new();
    let (mut mem, mut cmem): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (vec![vec![]; 2], vec![vec![]; 2]);
    let d = 16;
    for s in 0..4 {
        let tokens = Tensor::<2, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(
                (0..3).map(|i| (s * 3 + i) as i64 % 256).collect::<Vec<_>>(),
                [1, 3],
            ),
            &dev,
        );
        // Each layer's input, read through the memory the forward pass leaves.
        let before = state.xl.clone();
        model.forward_state(tokens, &mut state, &[false]).unwrap();
        for l in 0..2 {
            let kept = host(state.xl.layer(l).unwrap().clone());
            let input: Vec<f32> = kept[kept.len() - 3 * d..].to_vec();
            let mut all = before.layer(l).map(|t| host(t.clone())).unwrap_or_default();
            assert_eq!(all, mem[l]);
            all.extend_from_slice(&input);
            let n = all.len() / d;
            let keep = n.min(4);
            let old: Vec<f32> = all[..(n - keep) * d].to_vec();
            mem[l] = all[(n - keep) * d..].to_vec();
            assert_eq!(kept, mem[l], "memory {s}.{l}");
            if !old.is_empty() {
                // LN of the old positions (pre-LN is off: the memory as it is), mean of pairs,
                // zero-padded at the front to whole pairs.
                let m = old.len() / d;
                let mut padded = vec![0.0; (m % 2) * d];
                padded.extend_from_slice(&old);
                for w in 0..padded.len() / (2 * d) {
                    for i in 0..d {
                        cmem[l].push((padded[2 * w * d + i] + padded[(2 * w + 1) * d + i]) / 2.0);
                    }
                }
                let c = cmem[l].len() / d;
                cmem[l] = cmem[l][c.saturating_sub(3) * d..].to_vec();
            }
            if !cmem[l].is_empty() {
                let got = host(state.compressed.layers.layer(l).unwrap().clone());
                let diff = got
                    .iter()
                    .zip(&cmem[l])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    got.len() == cmem[l].len() && diff < 1e-5,
                    "compressed {s}.{l}: {diff}"
                );
            }
        }
    }
    assert_eq!(state.compressed.layers.len(), 3);
    let dir = std::env::temp_dir().join(format!("memzoo-compressive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    memzoo_stack::TransformerXl::save_state(&state, &dir).unwrap();
    let back = model.load_state(&dir, &dev).unwrap();
    for l in 0..2 {
        assert_eq!(
            host(back.compressed.layers.layer(l).unwrap().clone()),
            host(state.compressed.layers.layer(l).unwrap().clone())
        );
        assert_eq!(
            host(back.xl.layer(l).unwrap().clone()),
            host(state.xl.layer(l).unwrap().clone())
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn tokens(rows: &[Vec<i64>], dev: &burn::tensor::Device) -> Tensor<2, burn::tensor::Int> {
    let (b, q) = (rows.len(), rows[0].len());
    let data: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_data(burn::tensor::TensorData::new(data, [b, q]), dev)
}

/// With `document_resets`, a row that starts a document reads as a fresh model would: its XL
/// memory hidden at once, and each compressed vector hidden until its whole window was read
/// after the reset (the row beside it keeps both memories).
#[test]
fn compressive_document_resets_read_as_a_fresh_row() {
    let dev = flex();
    let cfg = tiny()
        .with_document_resets(true)
        .with_pre_ln(true)
        .with_compressive(Some(
            CompressiveConfig::new().with_cmem_len(3).with_ratio(2),
        ));
    let model = cfg.init(&dev).unwrap();
    let seg = |s: usize, row: usize| -> Vec<i64> {
        (0..4)
            .map(|i| ((s * 4 + i) * (row + 3) % 97) as i64)
            .collect()
    };
    let (mut both, mut fresh) = (XlState::new(), XlState::new());
    for s in 0..8 {
        let reset = s == 2;
        let h = model
            .forward_state(
                tokens(&[seg(s, 0), seg(s, 1)], &dev),
                &mut both,
                &[false, reset],
            )
            .unwrap();
        if s < 2 {
            continue;
        }
        let alone = model
            .forward_state(tokens(&[seg(s, 1)], &dev), &mut fresh, &[false])
            .unwrap();
        let row = host(h.narrow(0, 1, 1));
        let want = host(alone);
        let diff = row
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(diff < 1e-5, "segment {s}: max |diff| {diff}");
    }
    // The fresh row has compressed vectors by now, so hidden ones were tested too.
    assert_eq!(fresh.compressed.layers.len(), 3);
    assert_eq!(both.compressed.valid, vec![3, 3]);
}

/// A kNN layer in a compressive stack: training steps run with both memories and the kNN
/// memory, and generation reads the stack.
#[test]
fn compressive_stack_with_a_knn_layer_trains_and_generates() {
    use memzoo_stack::RecurrentModel;
    let dev = flex().autodiff();
    let cfg = tiny()
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(2)
                .with_max_memories(64),
        );
    let model = cfg.init(&dev).unwrap();
    assert_eq!(model.stack_family(), "compressive");
    let mut state = XlState::new();
    let mut losses = Vec::new();
    for s in 0..4 {
        let x = tokens(&[(0..4).map(|i| (s * 4 + i) as i64).collect()], &dev);
        let y = tokens(&[(1..5).map(|i| (s * 4 + i) as i64).collect()], &dev);
        let (loss, grads) =
            RecurrentModel::train_step(&model, x, y, &mut state, &[false], None).unwrap();
        assert!(loss.is_finite());
        assert!(!grads.is_empty());
        losses.push(loss);
    }
    assert_eq!(
        state.knn_len(0, 0),
        16,
        "every segment's pairs in the kNN memory"
    );
    assert_eq!(state.compressed.layers.len(), 3);
    let x = tokens(&[vec![1, 2, 3]], &dev);
    let logits = model.peek_logits(x, &mut state, &[false]).unwrap();
    assert_eq!(logits.dims(), [1, 3, 256]);
    assert_eq!(state.knn_len(0, 0), 16, "peeking adds nothing");
}

/// Most-used compression (Rae et al. 2019, sec. 3.1), against a replay written here: with
/// weights of 1e-7 every query attends uniformly over the keys it sees, so the attention mass
/// each position receives, its average over the segments that read it, which positions win and
/// the order they are kept in are all known by hand. The usage survives a checkpoint.
#[test]
fn most_used_compression_keeps_the_most_attended_positions() {
    let dev = flex();
    let (mem_len, cmem_len, ratio, qlen, d) = (4, 3, 2, 3, 16);
    let cfg = tiny().with_init_std(1e-7).with_compressive(Some(
        CompressiveConfig::new()
            .with_cmem_len(cmem_len)
            .with_ratio(ratio)
            .with_function(memzoo_stack::CompressionKind::MostUsed),
    ));
    let model = cfg.init(&dev).unwrap();
    let mut state = XlState::new();
    // The replay: global positions in the XL and compressed memories, each position's summed
    // usage and reads, and (per layer) each position's vector while it sat in the XL memory.
    let (mut mem, mut cmem): (Vec<usize>, Vec<usize>) = (vec![], vec![]);
    let (mut usage, mut reads) = (vec![0.0f64; 64], vec![0usize; 64]);
    let mut vectors: Vec<Vec<Vec<f32>>> = vec![vec![vec![]; 64]; 2];
    for s in 0..6 {
        let segment: Vec<usize> = (s * qlen..(s + 1) * qlen).collect();
        let keys: Vec<usize> = mem.iter().chain(&segment).copied().collect();
        let (clen, mlen) = (cmem.len(), mem.len());
        for i in 0..qlen {
            // Query i sees the compressed memory, the memory and the segment up to itself.
            let seen = clen + mlen + i + 1;
            for &k in &keys[..mlen + i + 1] {
                usage[k] += 1.0 / seen as f64;
            }
        }
        for &k in &keys {
            reads[k] += 1;
        }
        let n_old = keys.len().saturating_sub(mem_len);
        let old = &keys[..n_old];
        mem = keys[n_old..].to_vec();
        if n_old > 0 {
            let mut order = old.to_vec();
            let avg = |k: usize| usage[k] / reads[k] as f64;
            order.sort_by(|&a, &b| avg(b).total_cmp(&avg(a)).then(b.cmp(&a)));
            let mut kept = order[..n_old.div_ceil(ratio)].to_vec();
            kept.sort();
            cmem.extend(kept);
            cmem = cmem[cmem.len().saturating_sub(cmem_len)..].to_vec();
        }

        let tokens = tokens(
            &[(0..qlen).map(|i| (s * qlen + i) as i64 * 7 % 256).collect()],
            &dev,
        );
        model.forward_state(tokens, &mut state, &[false]).unwrap();
        for (l, seen) in vectors.iter_mut().enumerate() {
            let kept = host(state.xl.layer(l).unwrap().clone());
            for (p, v) in mem.iter().zip(kept.chunks(d)) {
                if seen[*p].is_empty() {
                    seen[*p] = v.to_vec();
                }
            }
            // The compressed vectors are the winners' own vectors, bit for bit, in order.
            if !cmem.is_empty() {
                let want: Vec<f32> = cmem.iter().flat_map(|&p| seen[p].clone()).collect();
                let got = host(state.compressed.layers.layer(l).unwrap().clone());
                assert_eq!(got, want, "segment {s}, layer {l}: kept {cmem:?}");
            }
            let got = host(state.compressed.usage.layer(l).unwrap().clone());
            for (p, u) in mem.iter().zip(&got) {
                assert!(
                    (*u as f64 - usage[*p]).abs() < 1e-4,
                    "usage of {p}: {u} vs {}",
                    usage[*p]
                );
            }
        }
        let want_reads: Vec<usize> = mem.iter().map(|&p| reads[p]).collect();
        assert_eq!(state.compressed.usage_reads, want_reads, "segment {s}");
    }
    // Not simply the most recent: usage decides (position 0 was read alone by its own queries).
    assert!(cmem.windows(2).any(|w| w[1] - w[0] > 1), "kept {cmem:?}");
    let dir = std::env::temp_dir().join(format!("memzoo-most-used-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    memzoo_stack::TransformerXl::save_state(&state, &dir).unwrap();
    let back = model.load_state(&dir, &dev).unwrap();
    assert_eq!(back.compressed.usage_reads, state.compressed.usage_reads);
    for l in 0..2 {
        assert_eq!(
            host(back.compressed.usage.layer(l).unwrap().clone()),
            host(state.compressed.usage.layer(l).unwrap().clone())
        );
    }
    let _ = std::fs::remove_dir_all(dir);
    // A kNN layer's attention is not the relative attention whose usage it reads.
    let knn = tiny()
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
        .with_compressive(Some(
            CompressiveConfig::new().with_function(memzoo_stack::CompressionKind::MostUsed),
        ));
    let err = knn.init(&dev).unwrap_err().to_string();
    assert!(err.contains("most_used") && err.contains("Knn"), "{err}");
}

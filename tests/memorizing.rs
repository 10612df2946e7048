//! kNN-augmented attention (`memzoo_knn`) against naive computations, and the Memorizing
//! Transformer built on it (the layer stack with kNN layers, `MemorizingConfig`): memories
//! filled and reset per row, gradients into the kNN layer, bad configs named, and multi-query
//! kNN memories against the layout of a store per query head.

// The naive references index like the formulas they spell out.
#![allow(clippy::needless_range_loop)]

use burn::module::Param;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_knn::{KnnAttentionConfig, l2_normalize};
use memzoo_memory::{IndexKind, KnnMemoryConfig};
use memzoo_relative::{AttentionMask, PositionConfig, PositionKind, RelativeContext, t5_bucket};
use memzoo_stack::{KnnLayerConfig, MemorizingConfig, MemorizingState, Step, XlConfig};
use memzoo_tests::host;

fn device() -> Device {
    Device::flex()
}

/// Deterministic pseudo-random numbers in [-1, 1) (the numbers these tests were written with).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn normalize(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    v.iter().map(|x| x / n).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn softmax(s: &[f32]) -> Vec<f32> {
    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f32 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

/// `x [n, i] @ w [i, o]`
fn matmul(x: &[f32], w: &[f32], n: usize, i: usize, o: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * o];
    for r in 0..n {
        for c in 0..o {
            out[r * o + c] = (0..i).map(|j| x[r * i + j] * w[j * o + c]).sum();
        }
    }
    out
}

#[test]
fn knn_attention_with_exact_memory_equals_naive() {
    let (b, l, mlen, dm, h, dh, top_k) = (2, 4, 3, 8, 2, 4, 3);
    let klen = l + mlen;
    let dev = device();
    let positions = PositionConfig::new()
        .with_kind(PositionKind::T5)
        .with_num_buckets(8)
        .with_max_distance(16);
    let mut layer = KnnAttentionConfig::new(dm, h, dh)
        .with_positions(positions.clone())
        .init(&dev)
        .unwrap();
    // Non-trivial gate and temperature per head, and a non-zero T5 table.
    let tau = [3.0f32, 7.0];
    let b_g = [0.4f32, -1.1];
    layer.log_scale = Param::from_tensor(Tensor::from_data(
        TensorData::new(tau.iter().map(|t| t.ln()).collect::<Vec<_>>(), [h]),
        &dev,
    ));
    layer.gate = Param::from_tensor(Tensor::from_data(TensorData::new(b_g.to_vec(), [h]), &dev));
    let table = noise(8 * h, 99);
    layer.attention.scheme =
        memzoo_relative::PositionParams::T5(memzoo_relative::T5PositionParams {
            bias: Param::from_tensor(Tensor::from_data(
                TensorData::new(table.clone(), [8, h]),
                &dev,
            )),
        });

    // Memory: row 0 holds 6 pairs, row 1 only 2 (< top_k): its third slot is masked.
    let n = 6;
    let mem_k = noise(b * n * h * dh, 5);
    let mem_v = noise(b * n * h * dh, 6);
    let mut knn = KnnMemoryConfig::new(h, dh)
        .with_kind(IndexKind::Exact)
        .with_max_memories(64)
        .init(b, &dev)
        .unwrap();
    // Normalised keys, as the layer stores them.
    let mem_kn: Vec<f32> = mem_k.chunks(dh).flat_map(normalize).collect();
    let t4 = |v: Vec<f32>, s: [usize; 4]| Tensor::<4>::from_data(TensorData::new(v, s), &dev);
    knn.add(
        t4(mem_kn.clone(), [b, n, h, dh]),
        t4(mem_v.clone(), [b, n, h, dh]),
    )
    .unwrap();
    // Clear row 1, then give it 2 pairs of its own; `add` takes every row, so row 0 receives
    // two zero pairs alongside (accounted for in `stored`).
    let keep_row1 = 2;
    knn.clear(&[1]).unwrap();
    let row1 = |v: &[f32]| {
        let mut out = vec![0.0; b * keep_row1 * h * dh];
        let per = keep_row1 * h * dh;
        out[per..].copy_from_slice(&v[n * h * dh..n * h * dh + per]);
        out
    };
    knn.add(
        t4(row1(&mem_kn), [b, keep_row1, h, dh]),
        t4(row1(&mem_v), [b, keep_row1, h, dh]),
    )
    .unwrap();
    // Host view of what each (row, head) now stores.
    let stored = |row: usize, head: usize| -> Vec<(Vec<f32>, Vec<f32>)> {
        let mut out = Vec::new();
        if row == 0 {
            for i in 0..n {
                let at = ((i) * h + head) * dh;
                out.push((mem_kn[at..at + dh].to_vec(), mem_v[at..at + dh].to_vec()));
            }
            // Row 0 also received the zero vectors added alongside row 1's pairs.
            for _ in 0..keep_row1 {
                out.push((vec![0.0; dh], vec![0.0; dh]));
            }
        } else {
            for i in 0..keep_row1 {
                let at = ((n + i) * h + head) * dh;
                out.push((mem_kn[at..at + dh].to_vec(), mem_v[at..at + dh].to_vec()));
            }
        }
        out
    };
    assert_eq!((knn.len(0), knn.len(1)), (n + keep_row1, keep_row1));

    let x = noise(b * l * dm, 1);
    let m = noise(b * mlen * dm, 2);
    let t3 = |v: Vec<f32>, s: [usize; 3]| Tensor::<3>::from_data(TensorData::new(v, s), &dev);
    let ctx = RelativeContext::new(&positions, dm, l, mlen, &AttentionMask::causal(), &dev);
    let out = layer
        .forward(
            t3(x.clone(), [b, l, dm]),
            Some(t3(m.clone(), [b, mlen, dm])),
            &ctx,
            knn.as_ref(),
            top_k,
        )
        .unwrap();
    let got = host(out.output);

    // Naive.
    let wq = host(layer.attention.query.weight.val());
    let wkv = host(layer.attention.key_value.weight.val());
    let wo = host(layer.attention.output.weight.val());
    let mut want = vec![0.0f32; b * l * dm];
    let mut want_keys = vec![0.0f32; b * l * h * dh];
    for row in 0..b {
        let mut keys_in = m[row * mlen * dm..(row + 1) * mlen * dm].to_vec();
        keys_in.extend_from_slice(&x[row * l * dm..(row + 1) * l * dm]);
        let q = matmul(&x[row * l * dm..(row + 1) * l * dm], &wq, l, dm, h * dh);
        let kv = matmul(&keys_in, &wkv, klen, dm, 2 * h * dh);
        let mut ctx_rows = vec![0.0f32; l * h * dh];
        for head in 0..h {
            let g = 1.0 / (1.0 + (-b_g[head]).exp());
            let mem = stored(row, head);
            for i in 0..l {
                let qi = normalize(&q[i * h * dh + head * dh..i * h * dh + (head + 1) * dh]);
                // Local: τ q̂·k̂_j + β(bucket(i + mlen - j)), causal.
                let mut scores = Vec::new();
                let mut vals = Vec::new();
                for j in 0..=(mlen + i) {
                    let kj = normalize(
                        &kv[j * 2 * h * dh + head * dh..j * 2 * h * dh + (head + 1) * dh],
                    );
                    let vj = &kv[j * 2 * h * dh + h * dh + head * dh
                        ..j * 2 * h * dh + h * dh + (head + 1) * dh];
                    let bucket = t5_bucket((i + mlen) as i64 - j as i64, false, 8, 16);
                    scores.push(tau[head] * dot(&qi, &kj) + table[bucket * h + head]);
                    vals.push(vj.to_vec());
                }
                let p = softmax(&scores);
                let mut local = vec![0.0f32; dh];
                for (pj, vj) in p.iter().zip(&vals) {
                    for c in 0..dh {
                        local[c] += pj * vj[c];
                    }
                }
                // Memory: brute-force top-k of q̂ among this row's and head's pairs.
                let mut ranked: Vec<(f32, usize)> = mem
                    .iter()
                    .enumerate()
                    .map(|(s, (k, _))| (dot(&qi, k), s))
                    .collect();
                ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
                ranked.truncate(top_k);
                let p = softmax(
                    &ranked
                        .iter()
                        .map(|(s, _)| tau[head] * s)
                        .collect::<Vec<_>>(),
                );
                let mut remote = vec![0.0f32; dh];
                for (pj, (_, s)) in p.iter().zip(&ranked) {
                    for c in 0..dh {
                        remote[c] += pj * mem[*s].1[c];
                    }
                }
                for c in 0..dh {
                    ctx_rows[i * h * dh + head * dh + c] = g * remote[c] + (1.0 - g) * local[c];
                }
            }
            for i in 0..l {
                let j = mlen + i;
                let kj =
                    normalize(&kv[j * 2 * h * dh + head * dh..j * 2 * h * dh + (head + 1) * dh]);
                let at = ((row * l + i) * h + head) * dh;
                want_keys[at..at + dh].copy_from_slice(&kj);
            }
        }
        let o = matmul(&ctx_rows, &wo, l, h * dh, dm);
        want[row * l * dm..(row + 1) * l * dm].copy_from_slice(&o);
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() < 1e-5 * (1.0 + w.abs()),
            "output {i}: {g} vs naive {w}"
        );
    }
    for (g, w) in host(out.keys).iter().zip(&want_keys) {
        assert!((g - w).abs() < 1e-5, "stored key {g} vs naive {w}");
    }
}

#[test]
fn empty_memory_leaves_local_attention_only() {
    // With nothing stored the gate is off: the output equals the same layer with g forced
    // to 0, i.e. changing b_g changes nothing.
    let (b, l, dm, h, dh) = (1, 5, 8, 2, 4);
    let dev = device();
    let cfg = KnnAttentionConfig::new(dm, h, dh);
    let mut layer = cfg.init(&dev).unwrap();
    let knn = KnnMemoryConfig::new(h, dh)
        .with_max_memories(16)
        .init(b, &dev)
        .unwrap();
    let x = Tensor::<3>::from_data(TensorData::new(noise(b * l * dm, 3), [b, l, dm]), &dev);
    let ctx = RelativeContext::new(&cfg.positions, dm, l, 0, &AttentionMask::causal(), &dev);
    let a = host(
        layer
            .forward(x.clone(), None, &ctx, knn.as_ref(), 4)
            .unwrap()
            .output,
    );
    layer.gate = Param::from_tensor(Tensor::from_data(
        TensorData::new(vec![5.0f32, -5.0], [h]),
        &dev,
    ));
    let c = host(
        layer
            .forward(x, None, &ctx, knn.as_ref(), 4)
            .unwrap()
            .output,
    );
    for (p, q) in a.iter().zip(&c) {
        assert!((p - q).abs() < 1e-6);
    }
    assert!(
        a.iter().any(|v| v.abs() > 1e-4),
        "output is not trivially zero"
    );
}

/// A zero vector normalises to zero with a finite gradient (the floor under the square root:
/// `sqrt(0)`'s infinite derivative times 0 was NaN).
#[test]
fn l2_normalize_of_a_zero_vector_has_a_finite_gradient() {
    let dev = device().autodiff();
    let x = Tensor::<2>::from_data(
        TensorData::new(vec![0.0f32, 0.0, 0.0, 3.0, 4.0, 0.0], [2, 3]),
        &dev,
    )
    .require_grad();
    let y = l2_normalize(x.clone());
    let weights = Tensor::<2>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, 1.0, 2.0, 3.0], [2, 3]),
        &dev,
    );
    let grads = (y.clone() * weights).sum().backward();
    let g: Vec<f32> = x.grad(&grads).unwrap().into_data().try_to_vec().unwrap();
    assert!(g.iter().all(|v| v.is_finite()), "{g:?}");
    let y: Vec<f32> = y.into_data().try_to_vec().unwrap();
    assert_eq!(&y[..3], &[0.0, 0.0, 0.0]);
    assert!((y[3] - 0.6).abs() < 1e-6 && (y[4] - 0.8).abs() < 1e-6);
}

fn tiny(knn_layers: Vec<usize>) -> MemorizingConfig {
    MemorizingConfig::new()
        .with_xl(
            XlConfig::new()
                .with_vocab_size(32)
                .with_d_model(16)
                .with_n_layers(3)
                .with_n_heads(2)
                .with_d_inner(32)
                .with_dropout(0.0)
                .with_mem_len(6)
                .with_positions(PositionConfig::new().with_kind(PositionKind::T5)),
        )
        .with_knn_layers(knn_layers)
        .with_knn(KnnLayerConfig::new().with_top_k(4).with_max_memories(20))
}

/// [`tiny`] retrieving the best `top_k` pairs.
fn tiny_top(knn_layers: Vec<usize>, top_k: usize) -> MemorizingConfig {
    let cfg = tiny(knn_layers);
    let knn = cfg.knn.clone().with_top_k(top_k);
    cfg.with_knn(knn)
}

fn tokens(b: usize, l: usize, seed: u64, dev: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = noise(b * l, seed)
        .iter()
        .map(|x| ((x + 1.0) * 15.9) as i64)
        .collect();
    Tensor::from_data(TensorData::new(v, [b, l]), dev)
}

#[test]
fn model_fills_and_resets_memories_per_row() {
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    assert_eq!(model.layers.len(), 3);
    let mut state = MemorizingState::new();
    let h = model
        .forward_state(tokens(2, 8, 1, &dev), &mut state, &[true, true])
        .unwrap();
    assert_eq!(h.dims(), [2, 8, 16]);
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (8, 8));
    assert_eq!(state.xl.len(), 6);
    model
        .forward_state(tokens(2, 8, 2, &dev), &mut state, &[false, false])
        .unwrap();
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (16, 16));
    model
        .forward_state(tokens(2, 8, 3, &dev), &mut state, &[false, true])
        .unwrap();
    // Row 0: 24 added, capacity 20; row 1 cleared, then this segment.
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (20, 8));
    let err = model
        .forward_state(tokens(2, 8, 4, &dev), &mut state, &[false])
        .unwrap_err();
    assert!(err.to_string().contains("reset has 1 flags"), "{err}");
}

#[test]
fn reset_row_sees_nothing_of_the_previous_document() {
    // Segment B after segment A with reset = true must equal B read with a fresh state,
    // row by row, while the other row (no reset) differs.
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    model
        .forward_state(tokens(2, 8, 11, &dev), &mut state, &[true, true])
        .unwrap();
    let seg_b = tokens(2, 8, 12, &dev);
    let carried = host(
        model
            .forward_state(seg_b.clone(), &mut state, &[true, false])
            .unwrap(),
    );
    let mut fresh = MemorizingState::new();
    let alone = host(
        model
            .forward_state(seg_b, &mut fresh, &[true, true])
            .unwrap(),
    );
    let per_row = 8 * 16;
    for (a, f) in carried[..per_row].iter().zip(&alone[..per_row]) {
        assert!((a - f).abs() < 1e-4, "reset row differs: {a} vs {f}");
    }
    let diff: f32 = carried[per_row..]
        .iter()
        .zip(&alone[per_row..])
        .map(|(a, f)| (a - f).abs())
        .sum();
    assert!(diff > 1e-3, "the row without reset should use its memories");
}

#[test]
fn reset_hides_the_old_document_while_it_lingers_in_a_longer_xl_memory() {
    // mem_len 6 > qlen 4: after a reset, the XL memory still holds 2 positions of the old
    // document during the *next* segment too; they must stay hidden. Segments A | B C with a
    // reset at B must give, for C, what B C gives from a fresh state.
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    let (a, b, c) = (
        tokens(1, 4, 31, &dev),
        tokens(1, 4, 32, &dev),
        tokens(1, 4, 33, &dev),
    );
    let mut carried = MemorizingState::new();
    model.forward_state(a, &mut carried, &[true]).unwrap();
    model
        .forward_state(b.clone(), &mut carried, &[true])
        .unwrap();
    assert_eq!(carried.xl.len(), 6);
    let with_old = host(
        model
            .forward_state(c.clone(), &mut carried, &[false])
            .unwrap(),
    );
    let mut fresh = MemorizingState::new();
    model.forward_state(b, &mut fresh, &[true]).unwrap();
    assert_eq!(fresh.xl.len(), 4);
    let alone = host(model.forward_state(c, &mut fresh, &[false]).unwrap());
    for (x, y) in with_old.iter().zip(&alone) {
        assert!((x - y).abs() < 1e-4, "old document leaked: {x} vs {y}");
    }
}

#[test]
fn loss_backpropagates_into_gate_temperature_and_projections() {
    let dev = device().autodiff();
    let model = tiny(vec![2]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    // First segment fills the memory; the second retrieves from it.
    let _ = model
        .eval_step(
            tokens(2, 8, 21, &dev),
            tokens(2, 8, 22, &dev),
            &mut state,
            &Step::reset(&[true, true]),
        )
        .unwrap();
    let loss = model
        .eval_step(
            tokens(2, 8, 23, &dev),
            tokens(2, 8, 24, &dev),
            &mut state,
            &Step::reset(&[false, false]),
        )
        .unwrap()
        .nll
        .mean();
    let value = loss.clone().into_scalar::<f32>();
    assert!(
        value.is_finite() && value > 2.0,
        "loss {value} (ln 32 = 3.47)"
    );
    let grads = loss.backward();
    let memzoo_stack::LayerAttention::Knn(att) = &model.layers[2].attention else {
        panic!("layer 2 is the kNN layer")
    };
    for (name, g) in [
        ("gate", att.gate.val().grad(&grads).map(host)),
        ("log_scale", att.log_scale.val().grad(&grads).map(host)),
        (
            "query",
            att.attention.query.weight.val().grad(&grads).map(host),
        ),
    ] {
        let g = g.unwrap_or_else(|| panic!("{name} has no gradient"));
        assert!(g.iter().any(|v| v.abs() > 0.0), "{name} gradient is zero");
    }
}

#[test]
fn bad_configs_name_the_value() {
    let dev = device();
    for (cfg, needle) in [
        (tiny(vec![3]), "knn_layers contains 3"),
        (tiny(vec![1, 1]), "twice"),
        (tiny(vec![0, 1, 2]), "all 3 layers"),
        (tiny_top(vec![1], 0), "knn.top_k"),
        (tiny_top(vec![1], 21), "exceeds knn.max_memories"),
    ] {
        let err = cfg.init(&dev).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    // No kNN layer: a plain XL of the same shape.
    let plain = tiny(vec![]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    plain
        .forward_state(tokens(1, 4, 1, &dev), &mut state, &[true])
        .unwrap();
    assert!(state.knn.is_empty());
}

/// The memory layout before stores were per kv head: a store per query head holding copies
/// of its kv head's pairs, behind the grouped config the layer checks.
#[derive(Debug)]
struct ExpandedCopies {
    grouped: KnnMemoryConfig,
    inner: Box<dyn memzoo_memory::KnnIndex>,
}

impl memzoo_memory::KnnIndex for ExpandedCopies {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }
    fn config(&self) -> &KnnMemoryConfig {
        &self.grouped
    }
    fn batch(&self) -> usize {
        self.inner.batch()
    }
    fn add(
        &mut self,
        keys: Tensor<4>,
        values: Tensor<4>,
    ) -> Result<(), memzoo_memory::MemoryError> {
        // [b, t, kv, d] -> [b, t, kv * group, d], kv head g copied to query heads g * group..
        let group = self.grouped.group();
        let expand = |x: Tensor<4>| {
            let [b, t, kv, d] = x.dims();
            x.reshape([b, t, kv, 1, d])
                .expand([b, t, kv, group, d])
                .reshape([b, t, kv * group, d])
        };
        self.inner.add(expand(keys), expand(values))
    }
    fn search(
        &self,
        queries: Tensor<4>,
        k: usize,
    ) -> Result<memzoo_memory::Retrieved, memzoo_memory::MemoryError> {
        self.inner.search(queries, k)
    }
    fn clear(&mut self, rows: &[usize]) -> Result<(), memzoo_memory::MemoryError> {
        self.inner.clear(rows)
    }
    fn rows(&self) -> &[memzoo_memory::RowState] {
        self.inner.rows()
    }
    fn snapshot(&self) -> Result<memzoo_memory::persist::Snapshot, memzoo_memory::MemoryError> {
        self.inner.snapshot()
    }
    fn save_extra(&self, dir: &std::path::Path) -> Result<Vec<u32>, memzoo_memory::MemoryError> {
        self.inner.save_extra(dir)
    }
}

#[test]
fn multi_query_model_equals_the_model_with_a_store_per_query_head() {
    // kv_heads 1 and 2 on 4 query heads: the memory stores each kv head once; the same model
    // reading a memory of per-query-head copies (the old layout) gives the same outputs,
    // segment after segment (the ring wraps at 20, row 1 resets), with the exact search's
    // top-k on the host and on the device.
    use memzoo_memory::TopkPlacement;
    let dev = device();
    for kv in [1, 2] {
        let mut config = tiny(vec![1]);
        config.xl = config
            .xl
            .clone()
            .with_d_model(32)
            .with_n_heads(4)
            .with_kv_heads(Some(kv));
        let model = config.init(&dev).unwrap();
        let memory = config.memory();
        assert_eq!((memory.n_heads, memory.kv_heads()), (4, kv));
        for topk in [TopkPlacement::Host, TopkPlacement::Device] {
            let memory = memory.clone().with_topk(topk);
            let mut grouped = MemorizingState::new();
            grouped.knn = vec![memory.init(2, &dev).unwrap()];
            let mut copies = MemorizingState::new();
            copies.knn = vec![Box::new(ExpandedCopies {
                grouped: memory.clone(),
                inner: memory.clone().with_n_kv_heads(None).init(2, &dev).unwrap(),
            })];
            let resets = [[true, true], [false, false], [false, true], [false, false]];
            for (s, reset) in resets.iter().enumerate() {
                let x = tokens(2, 8, 10 + s as u64, &dev);
                let a = host(model.forward_state(x.clone(), &mut grouped, reset).unwrap());
                let b = host(model.forward_state(x, &mut copies, reset).unwrap());
                for (p, q) in a.iter().zip(&b) {
                    assert!(
                        (p - q).abs() < 1e-5,
                        "kv {kv} {topk:?} segment {s}: {p} vs {q}"
                    );
                }
                assert_eq!(grouped.knn[0].rows(), copies.knn[0].rows(), "segment {s}");
            }
            // The memories themselves: the same pairs found for any queries.
            let d = memory.d_head;
            let q = Tensor::<4>::from_data(
                TensorData::new(noise(2 * 5 * 4 * d, 77), [2, 5, 4, d]),
                &dev,
            );
            let (a, b) = (
                grouped.knn[0].search(q.clone(), 4).unwrap(),
                copies.knn[0].search(q, 4).unwrap(),
            );
            assert_eq!(
                host(a.keys),
                host(b.keys),
                "kv {kv} {topk:?}: retrieved keys"
            );
            assert_eq!(
                host(a.values),
                host(b.values),
                "kv {kv} {topk:?}: retrieved values"
            );
            // The grouped memory holds kv heads: a quarter / half of the copies' floats.
            let (g, c) = (
                grouped.knn[0].snapshot().unwrap(),
                copies.knn[0].snapshot().unwrap(),
            );
            assert_eq!(g.keys.len() * (4 / kv), c.keys.len());
        }
        // A memory built for the query heads does not fit the grouped layer.
        let mut wrong = MemorizingState::new();
        wrong.knn = vec![memory.clone().with_n_kv_heads(None).init(2, &dev).unwrap()];
        let err = model
            .forward_state(tokens(2, 8, 1, &dev), &mut wrong, &[true, true])
            .unwrap_err();
        assert!(err.to_string().contains("kv heads"), "{err}");
    }
}

//! Tests of the kNN layer against naive computations (the Memorizing Transformer built on it:
//! `tests/memorizing.rs`).

// The naive references index like the formulas they spell out.
#![allow(clippy::needless_range_loop)]

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use memzoo_memory::{IndexKind, KnnMemoryConfig};
use memzoo_relative::{AttentionMask, PositionConfig, PositionKind, RelativeContext, t5_bucket};

use crate::*;

fn device() -> Device {
    Device::flex()
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap()
}

/// Deterministic pseudo-random numbers in [-1, 1).
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
    let y = crate::l2_normalize(x.clone());
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

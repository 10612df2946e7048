use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::{dev, rand_tensor, to_vec};
use crate::attention::{
    ChunkParams, ForwardOptions, LshKernel, LshScores, MASKED, SELF_SCORE, hash_buckets,
    hash_buckets_factored, hash_buckets_with, local_attention, lsh_attention,
};
use crate::config::{LshConfig, ReformerAttentionConfig};
use crate::layer::AttentionKind;
use crate::rng::random_rotations;

/// Naive attention of one (batch, head) with explicit rules, on row-major `[l, dh]` slices.
/// `shared_qk`: keys are unit-normalised queries and the self score is SELF_SCORE.
fn naive_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    l: usize,
    dh: usize,
    shared_qk: bool,
    visible: impl Fn(usize, usize) -> bool,
) -> Vec<f32> {
    let key = |j: usize| -> Vec<f32> {
        let row = &k[j * dh..(j + 1) * dh];
        if shared_qk {
            let n = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            row.iter().map(|x| x / n).collect()
        } else {
            row.to_vec()
        }
    };
    let mut out = vec![0.0; l * dh];
    for i in 0..l {
        let qi = &q[i * dh..(i + 1) * dh];
        let scores: Vec<f32> = (0..l)
            .map(|j| {
                if !visible(i, j) {
                    MASKED
                } else if shared_qk && i == j {
                    SELF_SCORE
                } else {
                    qi.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f32>() / (dh as f32).sqrt()
                }
            })
            .collect();
        let m = scores.iter().cloned().fold(f32::MIN, f32::max);
        let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f32 = e.iter().sum();
        for j in 0..l {
            for d in 0..dh {
                out[i * dh + d] += e[j] / z * v[j * dh + d];
            }
        }
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn buckets_follow_the_argmax_rule() {
    let device = dev();
    let (b, h, l, dh, r, nb) = (2, 3, 7, 5, 3, 6);
    let x = rand_tensor([b, h, l, dh], 1, &device);
    let rot = random_rotations(dh, r, nb, 2, &device);
    // tensor ops, and the fused kernel (Auto on flex)
    for got in [
        hash_buckets(x.clone(), rot.clone()),
        hash_buckets_with(x.clone(), rot.clone(), LshKernel::Auto),
    ] {
        assert_eq!(got.dims(), [b, h, r, l]);
        let got: Vec<i64> = got
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap();
        let xv = to_vec(x.clone());
        let rv = to_vec(rot.clone());
        let half = nb / 2;
        for bi in 0..b {
            for hi in 0..h {
                for li in 0..l {
                    let row = &xv[((bi * h + hi) * l + li) * dh..][..dh];
                    for ri in 0..r {
                        // [xR, -xR]
                        let mut vals = vec![0f32; nb];
                        for j in 0..half {
                            let s: f32 =
                                (0..dh).map(|d| row[d] * rv[(d * r + ri) * half + j]).sum();
                            vals[j] = s;
                            vals[j + half] = -s;
                        }
                        let arg = (0..nb).fold(0, |a, j| if vals[j] > vals[a] { j } else { a });
                        assert_eq!(got[((bi * h + hi) * r + ri) * l + li], arg as i64);
                    }
                }
            }
        }
    }
}

#[test]
fn lsh_with_one_chunk_equals_full_attention() {
    let device = dev();
    let (b, h, l, dh) = (2, 2, 12, 4);
    for (causal, rounds, with_pad) in [(false, 1, false), (true, 1, false), (true, 3, true)] {
        let qk = rand_tensor([b, h, l, dh], 3, &device).mul_scalar(2.0);
        let v = rand_tensor([b, h, l, dh], 4, &device);
        let rot = random_rotations(dh, rounds, 4, 5, &device);
        // batch 1 hides keys 9.. as padding
        let pad_v: Vec<bool> = (0..b * l)
            .map(|i| with_pad && i / l == 1 && i % l >= 9)
            .collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad_v.clone(), [b, l]), &device);
        let params = ChunkParams {
            chunk_len: l,
            before: 0,
            after: 0,
            causal,
            dedup_rounds: true,
            lsh_scores: LshScores::ScaledUnitKeys,
            kernel: LshKernel::Auto,
            key_eps: 0.0,
        };
        let out = lsh_attention(qk.clone(), v.clone(), rot, Some(pad), params, None);
        let (out, qkv, vv) = (to_vec(out), to_vec(qk), to_vec(v));
        for bh in 0..b * h {
            let s = bh * l * dh..(bh + 1) * l * dh;
            let bi = bh / h;
            let visible = |i: usize, j: usize| (!causal || j <= i) && !pad_v[bi * l + j];
            let want = naive_attention(
                &qkv[s.clone()],
                &qkv[s.clone()],
                &vv[s.clone()],
                l,
                dh,
                true,
                visible,
            );
            let d = max_diff(&out[s], &want);
            assert!(
                d < 1e-5,
                "causal={causal} rounds={rounds} pad={with_pad}: max diff {d}"
            );
        }
    }
}

/// Points in tight clusters: every query has clear neighbours (its cluster), found by
/// hashing with high probability; more rounds miss fewer.
#[test]
fn more_rounds_approach_full_attention() {
    let device = dev();
    let (l, dh, n_clusters) = (64, 16, 8);
    let centers = to_vec(rand_tensor([n_clusters, dh], 10, &device));
    let noise = to_vec(rand_tensor([l, dh], 11, &device));
    // position i belongs to cluster (i * 5) % 8: clusters are spread over the sequence
    let mut qk = vec![0f32; l * dh];
    for i in 0..l {
        let c = (i * 5) % n_clusters;
        for d in 0..dh {
            qk[i * dh + d] = 10.0 * (centers[c * dh + d] + 0.05 * noise[i * dh + d]);
        }
    }
    let v = to_vec(rand_tensor([l, dh], 12, &device));
    let full = naive_attention(&qk, &qk, &v, l, dh, true, |_, _| true);
    let t =
        |x: &Vec<f32>| Tensor::<4>::from_data(TensorData::new(x.clone(), [1, 1, l, dh]), &device);
    let err = |rounds: usize, dedup_rounds: bool| -> f32 {
        let params = ChunkParams {
            chunk_len: 8,
            before: 1,
            after: 1,
            causal: false,
            dedup_rounds,
            lsh_scores: LshScores::ScaledUnitKeys,
            kernel: LshKernel::Auto,
            key_eps: 0.0,
        };
        // mean over rotation seeds of the mean absolute error
        let mut total = 0.0;
        for seed in 0..4 {
            let rot = random_rotations(dh, rounds, 8, 100 + seed, &device);
            let out = to_vec(lsh_attention(t(&qk), t(&v), rot, None, params, None));
            total += out
                .iter()
                .zip(&full)
                .map(|(a, b)| (a - b).abs())
                .sum::<f32>()
                / out.len() as f32;
        }
        total / 4.0
    };
    let (e1, e2, e8) = (err(1, true), err(2, true), err(8, true));
    let e8_dup = err(8, false);
    eprintln!("mean |lsh - full|: rounds 1 {e1}, 2 {e2}, 8 {e8}; 8 without dedup {e8_dup}");
    assert!(
        e8 < 0.5 * e1,
        "8 rounds ({e8}) should clearly beat 1 round ({e1})"
    );
    assert!(e2 < e1, "2 rounds ({e2}) should beat 1 round ({e1})");
    // without de-duplication keys found in several rounds count several times
    assert!(
        e8 < e8_dup,
        "dedup ({e8}) should beat duplicates ({e8_dup})"
    );
    assert!(
        e8 < 0.02,
        "8 rounds should be close to full attention, mean error {e8}"
    );
}

/// Causal masking by original position inside the sorted chunks: changing the values of
/// future tokens changes no output at or before t (with the hashes held fixed).
#[test]
fn lsh_causal_ignores_future_values() {
    let device = dev();
    let (b, h, l, dh) = (1, 2, 32, 8);
    let qk = rand_tensor([b, h, l, dh], 20, &device);
    let v = rand_tensor([b, h, l, dh], 21, &device);
    let t = 13;
    let bump = rand_tensor([b, h, l - t - 1, dh], 22, &device);
    let v2 = v.clone().slice_assign(
        [0..b, 0..h, t + 1..l],
        v.clone().slice([0..b, 0..h, t + 1..l]) + bump,
    );
    let rot = random_rotations(dh, 2, 4, 23, &device);
    let params = ChunkParams {
        chunk_len: 4,
        before: 1,
        after: 1,
        causal: true,
        dedup_rounds: true,
        lsh_scores: LshScores::ScaledUnitKeys,
        kernel: LshKernel::Auto,
        key_eps: 0.0,
    };
    let a = lsh_attention(qk.clone(), v, rot.clone(), None, params, None);
    let c = lsh_attention(qk, v2, rot, None, params, None);
    let past = |x: Tensor<4>| to_vec(x.slice([0..b, 0..h, 0..t + 1]));
    let later = |x: Tensor<4>| to_vec(x.slice([0..b, 0..h, t + 1..l]));
    assert_eq!(
        past(a.clone()),
        past(c.clone()),
        "an output at <= t depends on the future"
    );
    assert!(
        max_diff(&later(a), &later(c)) > 1e-3,
        "the perturbation must reach later outputs"
    );
}

/// Whole layers: perturbing every token after t (embeddings, hence hashes too) changes no
/// output at <= t — local attention with several chunks, LSH with one chunk. The length is
/// not a multiple of the chunk length (auto-padding).
#[test]
fn causal_layers_ignore_the_future() {
    let device = dev();
    let (b, l, d, t) = (2, 21, 16, 9);
    for (kind, chunk) in [(AttentionKind::Local, 4), (AttentionKind::Lsh, 24)] {
        let layer = ReformerAttentionConfig::new(d, 2, 8)
            .with_kind(kind)
            .with_lsh(LshConfig::new().with_chunk_len(chunk).with_n_rounds(2))
            .init(&device)
            .unwrap();
        let x = rand_tensor([b, l, d], 30, &device);
        let x2 = x.clone().slice_assign(
            [0..b, t + 1..l],
            rand_tensor([b, l - t - 1, d], 31, &device),
        );
        let opts = ForwardOptions::eval(7);
        let a = layer.forward(x, None, &opts);
        let c = layer.forward(x2, None, &opts);
        assert_eq!(a.dims(), [b, l, d]);
        let past = |y: Tensor<3>| to_vec(y.slice([0..b, 0..t + 1]));
        let d_past = max_diff(&past(a.clone()), &past(c.clone()));
        assert!(d_past < 1e-6, "{kind:?}: output at <= t moved by {d_past}");
        let d_all = max_diff(&to_vec(a), &to_vec(c));
        assert!(d_all > 1e-4, "{kind:?}: later outputs must change");
    }
}

/// Local attention equals naive attention restricted to the chunk window.
#[test]
fn local_attention_matches_windowed_naive() {
    let device = dev();
    let (b, h, l, dh, c) = (1, 2, 16, 4, 4);
    for (before, after, causal) in [(1, 0, true), (1, 1, false), (2, 1, true)] {
        let q = rand_tensor([b, h, l, dh], 40, &device);
        let k = rand_tensor([b, h, l, dh], 41, &device);
        let v = rand_tensor([b, h, l, dh], 42, &device);
        let params = ChunkParams {
            chunk_len: c,
            before,
            after,
            causal,
            dedup_rounds: false,
            lsh_scores: LshScores::UnitKeys,
            kernel: LshKernel::Auto,
            key_eps: 0.0,
        };
        let out = to_vec(local_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            params,
            None,
        ));
        let (qv, kv, vv) = (to_vec(q), to_vec(k), to_vec(v));
        for bh in 0..b * h {
            let s = bh * l * dh..(bh + 1) * l * dh;
            let visible = |i: usize, j: usize| {
                let (ci, cj) = (i / c, j / c);
                (!causal || j <= i) && cj + before >= ci && cj <= ci + after
            };
            let want = naive_attention(
                &qv[s.clone()],
                &kv[s.clone()],
                &vv[s.clone()],
                l,
                dh,
                false,
                visible,
            );
            let d = max_diff(&out[s], &want);
            assert!(
                d < 1e-5,
                "before={before} after={after} causal={causal}: diff {d}"
            );
        }
    }
}

#[test]
fn bad_bucket_counts_are_errors_naming_the_value() {
    let err = ReformerAttentionConfig::new(16, 2, 8)
        .with_lsh(LshConfig::new().with_n_buckets(Some(7)))
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains('7'), "{err}");
    // An unknown kind in a config file names itself.
    let err = serde_json::from_str::<AttentionKind>("\"global\"").unwrap_err();
    assert!(err.to_string().contains("global"), "{err}");
}

#[test]
fn auto_bucket_count_is_even() {
    let layer = ReformerAttentionConfig::new(16, 2, 8)
        .with_lsh(LshConfig::new().with_chunk_len(4))
        .init(&dev())
        .unwrap();
    assert_eq!(layer.buckets_for(12), 4);
    assert_eq!(layer.buckets_for(16), 4);
    assert_eq!(layer.buckets_for(4), 2);
    let _ = Tensor::<1, Int>::arange(0..2, &Device::flex());
}

/// The wrapped chunk window of LSH de-duplication against `(k - q + before) mod nc` on integers.
#[test]
fn chunk_window_wraps_like_a_remainder() {
    let device = dev();
    for (nc, before, after) in [
        (1, 0, 0),
        (3, 0, 0),
        (4, 1, 0),
        (5, 1, 1),
        (8, 2, 3),
        (6, 5, 0),
    ] {
        let pairs: Vec<(usize, usize)> =
            (0..nc).flat_map(|q| (0..nc).map(move |k| (q, k))).collect();
        let d: Vec<f32> = pairs.iter().map(|&(q, k)| k as f32 - q as f32).collect();
        let d = Tensor::<1>::from_data(TensorData::new(d, [pairs.len()]), &device);
        let got = crate::attention::in_window(d, nc, before, after)
            .into_data()
            .try_to_vec::<bool>()
            .unwrap();
        for (&(q, k), got) in pairs.iter().zip(got) {
            let want = (k + nc + before - q) % nc <= before + after;
            assert_eq!(
                got, want,
                "nc {nc} before {before} after {after}: q {q} k {k}"
            );
        }
    }
}

/// LSH attention of one (batch, head), written out on the host in f64 from the algorithm's
/// definition: the `r * l` (round, position) elements sorted by (round offset + bucket,
/// position); chunks of `c` of that sorted sequence; a query sees its chunk and `before` /
/// `after` neighbouring chunks, wrapping around the whole sorted sequence (distinct chunks
/// only); scores `q_i · k_j / sqrt(dh)` with `k_j = q_j / |q_j|`, [`SELF_SCORE`] for `j = i`,
/// minus `ln(count)` where `count` is the number of rounds whose windows hold the pair, and
/// [`MASKED`] for hidden keys; then the rounds mixed by the softmax of their log-partitions.
#[allow(clippy::too_many_arguments)]
fn naive_lsh(
    qk: &[f32],
    v: &[f32],
    buckets: &[i64],
    (l, dh, r, nb): (usize, usize, usize, usize),
    params: ChunkParams,
    pad: &[bool],
) -> Vec<f64> {
    let q = |i: usize| -> Vec<f64> { qk[i * dh..(i + 1) * dh].iter().map(|&x| x as f64).collect() };
    let k = |j: usize| -> Vec<f64> {
        let row = q(j);
        let n = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-6);
        row.iter().map(|x| x / n).collect()
    };
    // Sorted elements (round, position).
    let mut elems: Vec<(usize, usize)> =
        (0..r).flat_map(|rr| (0..l).map(move |p| (rr, p))).collect();
    elems.sort_by_key(|&(rr, p)| ((rr * nb) as i64 + buckets[rr * l + p], p));
    let c = params.chunk_len;
    let nc = r * l / c;
    let before = params.before.min(nc - 1);
    let after = params.after.min(nc - 1 - before);
    let mut chunk_of = vec![0usize; r * l]; // (round, position) -> chunk
    for (s, &(rr, p)) in elems.iter().enumerate() {
        chunk_of[rr * l + p] = s / c;
    }
    let window = |cq: usize| -> Vec<usize> {
        let mut w = vec![cq];
        w.extend((1..=before).map(|s| (cq + nc - s) % nc));
        w.extend((1..=after).map(|s| (cq + s) % nc));
        w
    };
    let count = |i: usize, j: usize| -> usize {
        (0..r)
            .filter(|&rr| window(chunk_of[rr * l + i]).contains(&chunk_of[rr * l + j]))
            .count()
    };
    let mut outs = vec![vec![0f64; dh]; r * l]; // per (round, position)
    let mut lses = vec![0f64; r * l];
    for (s, &(rr, i)) in elems.iter().enumerate() {
        let mut scores = Vec::new();
        let mut values = Vec::new();
        for cj in window(s / c) {
            for &(_, j) in &elems[cj * c..(cj + 1) * c] {
                let hidden = (params.causal && j > i) || pad[j];
                let score = if hidden {
                    MASKED as f64
                } else {
                    let base = if i == j {
                        SELF_SCORE as f64
                    } else {
                        // trax / HF: q_i · k̂_j; reformer-pytorch: q_i · k̂_j / sqrt(d_head)
                        let dot = q(i).iter().zip(k(j)).map(|(a, b)| a * b).sum::<f64>();
                        match params.lsh_scores {
                            LshScores::UnitKeys => dot,
                            LshScores::ScaledUnitKeys => dot / (dh as f64).sqrt(),
                        }
                    };
                    if params.dedup_rounds && r > 1 {
                        base - (count(i, j).max(1) as f64).ln()
                    } else {
                        base
                    }
                };
                scores.push(score);
                values.push(j);
            }
        }
        let m = scores.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
        for (x, &j) in scores.iter().zip(&values) {
            let p = (x - m).exp() / z;
            for d in 0..dh {
                outs[rr * l + i][d] += p * v[j * dh + d] as f64;
            }
        }
        lses[rr * l + i] = m + z.ln();
    }
    let mut out = vec![0f64; l * dh];
    for i in 0..l {
        let m = (0..r).map(|rr| lses[rr * l + i]).fold(f64::MIN, f64::max);
        let w: Vec<f64> = (0..r).map(|rr| (lses[rr * l + i] - m).exp()).collect();
        let z: f64 = w.iter().sum();
        for rr in 0..r {
            for d in 0..dh {
                out[i * dh + d] += w[rr] / z * outs[rr * l + i][d];
            }
        }
    }
    out
}

/// LSH attention with several chunks and several rounds equals the naive reference: the sort
/// order, the chunk windows (wrapping across the sorted sequence and across rounds), the
/// duplicate counts and the mixing of the rounds all show (one chunk hides them). Both
/// implementations: tensor ops and the fused kernel (which `Auto` picks on flex).
#[test]
fn lsh_with_many_chunks_and_rounds_matches_the_naive_reference() {
    let device = dev();
    let (b, h, dh) = (2, 2, 8);
    assert!(
        memzoo_fused::supports(&device),
        "the fused kernel runs on the test device"
    );
    for kernel in [LshKernel::Auto, LshKernel::Tensor] {
        let cases = [
            // (len, chunk, rounds, buckets, before, after, causal, dedup, pad)
            (24, 4, 3, 4, 1, 0, true, true, true),
            (24, 4, 3, 6, 1, 1, false, true, false),
            (24, 4, 2, 4, 2, 1, true, false, false),
            (16, 4, 4, 8, 1, 0, true, true, false),
            (8, 4, 1, 2, 1, 1, true, true, true), // 2 chunks: the window is clamped
        ];
        for (n, &(l, c, r, nb, before, after, causal, dedup_rounds, with_pad)) in
            cases.iter().enumerate()
        {
            // Both score conventions, alternating over the cases.
            let lsh_scores = if n % 2 == 0 {
                LshScores::UnitKeys
            } else {
                LshScores::ScaledUnitKeys
            };
            let qk = rand_tensor([b, h, l, dh], 50 + n as u64, &device).mul_scalar(1.5);
            let v = rand_tensor([b, h, l, dh], 60 + n as u64, &device);
            let rot = random_rotations(dh, r, nb, 70 + n as u64, &device);
            let pad_v: Vec<bool> = (0..b * l)
                .map(|i| with_pad && i / l == 1 && i % l >= l - 3)
                .collect();
            let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad_v.clone(), [b, l]), &device);
            let params = ChunkParams {
                chunk_len: c,
                before,
                after,
                causal,
                dedup_rounds,
                lsh_scores,
                kernel,
                key_eps: 0.0,
            };
            let buckets: Vec<i64> = hash_buckets(qk.clone(), rot.clone())
                .into_data()
                .iter::<i64>()
                .collect();
            let out = to_vec(lsh_attention(
                qk.clone(),
                v.clone(),
                rot,
                Some(pad),
                params,
                None,
            ));
            let (qkv, vv) = (to_vec(qk), to_vec(v));
            let mut worst = 0f64;
            for bh in 0..b * h {
                let s = bh * l * dh..(bh + 1) * l * dh;
                let bi = bh / h;
                let want = naive_lsh(
                    &qkv[s.clone()],
                    &vv[s.clone()],
                    &buckets[bh * r * l..(bh + 1) * r * l],
                    (l, dh, r, nb),
                    params,
                    &pad_v[bi * l..(bi + 1) * l],
                );
                for (got, want) in out[s].iter().zip(&want) {
                    assert!(got.is_finite());
                    worst = worst.max((*got as f64 - want).abs());
                }
            }
            assert!(
                worst < 1e-5,
                "{kernel:?}, case {n}: max |lsh - naive| = {worst:e}"
            );
        }
    }
}

/// Per-head rotations and a factorised bucket count (HF's `num_buckets = [a, b]`): each head
/// hashes with its own rotations; factor `i` takes its own `f_i / 2` columns of `xR`, and the
/// bucket is `h_1 + f_1 h_2` (checked here by the naive rule), in `0..f_1 f_2`.
#[test]
fn factored_per_head_buckets_follow_the_argmax_rule() {
    let device = dev();
    let (b, h, l, dh, r) = (2, 3, 7, 5, 3);
    let factors = [2usize, 4];
    let half = factors.iter().sum::<usize>() / 2;
    let x = rand_tensor([b, h, l, dh], 11, &device);
    let rot = rand_tensor([h, dh, r, half], 12, &device);
    let got = hash_buckets_factored(x.clone(), rot.clone(), &factors);
    assert_eq!(got.dims(), [b, h, r, l]);
    let got: Vec<i64> = got
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .unwrap();
    let (xv, rv) = (to_vec(x), to_vec(rot));
    let argmax =
        |vals: &[f32]| (0..vals.len()).fold(0, |a, j| if vals[j] > vals[a] { j } else { a });
    for bi in 0..b {
        for hi in 0..h {
            for li in 0..l {
                let row = &xv[((bi * h + hi) * l + li) * dh..][..dh];
                for ri in 0..r {
                    let xr: Vec<f32> = (0..half)
                        .map(|c| {
                            (0..dh)
                                .map(|d| row[d] * rv[((hi * dh + d) * r + ri) * half + c])
                                .sum()
                        })
                        .collect();
                    // factor 1: columns 0..1 → [xR_0, -xR_0]; factor 2: columns 1..3
                    let h1 = argmax(&[xr[0], -xr[0]]);
                    let h2 = argmax(&[xr[1], xr[2], -xr[1], -xr[2]]);
                    let want = (h1 + 2 * h2) as i64;
                    assert_eq!(got[((bi * h + hi) * r + ri) * l + li], want);
                }
            }
        }
    }
    // One head of rotations and one factor: the plain hash.
    let x = rand_tensor([b, h, l, dh], 13, &device);
    let rot = random_rotations(dh, r, 6, 14, &device);
    let plain = hash_buckets(x.clone(), rot.clone());
    let one = hash_buckets_factored(x, rot.reshape([1, dh, r, 3]), &[6]);
    assert_eq!(plain.into_data(), one.into_data());
}

/// One [`LshConfig`] serves both kinds of layer: a local layer takes its own chunk length and
/// window where they are set, an LSH layer the shared ones; the defaults are the config's
/// (64 / 4 rounds), and a bad local chunk length is refused by name.
#[test]
fn one_lsh_config_sets_both_kinds_of_layer() {
    let lsh = LshConfig::new()
        .with_chunk_len(8)
        .with_n_chunks_before(2)
        .with_local_chunk_len(Some(4))
        .with_local_n_chunks_after(Some(1))
        .with_causal(false);
    let layer = |kind| {
        ReformerAttentionConfig::new(16, 2, 8)
            .with_kind(kind)
            .with_lsh(lsh.clone())
            .init(&dev())
            .unwrap()
    };
    let (local, hashed) = (layer(AttentionKind::Local), layer(AttentionKind::Lsh));
    let window = |l: &crate::ReformerAttention| (l.chunk_len, l.n_chunks_before, l.n_chunks_after);
    assert_eq!(window(&local), (4, 2, 1));
    assert_eq!(window(&hashed), (8, 2, 0));
    let d = ReformerAttentionConfig::new(16, 2, 8).lsh;
    assert_eq!((d.chunk_len, d.n_rounds), (64, 4));
    let err = ReformerAttentionConfig::new(16, 2, 8)
        .with_lsh(LshConfig::new().with_local_chunk_len(Some(0)))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("local_chunk_len"), "{err}");
}

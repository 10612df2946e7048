//! Relative attention against naive double loops over (query i, key j).

use burn::tensor::{Device, Tensor};
use memzoo_relative::shift::{n_columns, relative_shift};
use memzoo_relative::{
    AttentionMask, PositionConfig, PositionKind, PositionParams, RelativeAttentionConfig,
    RelativeContext, RelativeMultiHeadAttention, XlBiases,
};
use memzoo_tests::*;

/// `relative_shift` of a `[2, 3, qlen, S]` tensor of distinct values against the index formula
/// `out[i, j] = x[i, qlen - 1 - i + j]`, on the entries `exact(i, j)` names.
fn check_shift(qlen: usize, mlen: usize, causal: bool, exact: impl Fn(usize, usize) -> bool) {
    let klen = qlen + mlen;
    let s = n_columns(qlen, klen, causal);
    let x = randn([2, 3, qlen, s], 7, &flex());
    let xs = host(x.clone());
    let out = host(relative_shift(x, klen));
    assert_eq!(out.len(), 2 * 3 * qlen * klen);
    let mut checked = 0;
    for bh in 0..6 {
        for i in 0..qlen {
            for j in (0..klen).filter(|&j| exact(i, j)) {
                let want = xs[bh * qlen * s + i * s + (qlen - 1 - i + j)];
                let got = out[bh * qlen * klen + i * klen + j];
                assert_eq!(got, want, "qlen {qlen} mlen {mlen} bh {bh} i {i} j {j}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 6 * qlen, "every query has a visible key");
}

#[test]
fn relative_shift_matches_index_formula() {
    for (qlen, mlen) in [(1, 0), (1, 4), (4, 0), (5, 3), (3, 7), (6, 6)] {
        check_shift(qlen, mlen, false, |_, _| true);
    }
}

#[test]
fn causal_relative_shift_is_exact_on_every_visible_key() {
    for (qlen, mlen) in [(1, 0), (1, 4), (4, 0), (5, 3), (3, 7), (6, 6)] {
        check_shift(qlen, mlen, true, |i, j| j <= i + mlen);
    }
}

fn naive_sinusoid(d: i64, dm: usize) -> Vec<f64> {
    let mut v = vec![0.0; dm];
    for k in 0..dm / 2 {
        let a = d as f64 / 10000f64.powf((2 * k) as f64 / dm as f64);
        v[k] = a.sin();
        v[dm / 2 + k] = a.cos();
    }
    v
}

/// T5's bucket in the form of the reference (Mesh TensorFlow), with relative_position = j - i.
fn naive_t5_bucket(relative_position: i64, bidirectional: bool, nb: usize, maxd: usize) -> usize {
    let mut num_buckets = nb as i64;
    let mut ret = 0i64;
    let mut n = -relative_position;
    if bidirectional {
        num_buckets /= 2;
        if n < 0 {
            ret += num_buckets;
        }
        n = n.abs();
    } else {
        n = n.max(0);
    }
    let max_exact = num_buckets / 2;
    if n < max_exact {
        ret += n;
    } else {
        let v = max_exact
            + ((n as f64 / max_exact as f64).ln() / (maxd as f64 / max_exact as f64).ln()
                * (num_buckets - max_exact) as f64) as i64;
        ret += v.min(num_buckets - 1);
    }
    ret as usize
}

fn param2(p: &burn::module::Param<Tensor<2>>) -> Mat {
    Mat::from_tensor(p.val())
}

/// The attention output computed with plain loops, in f64.
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // the formula's indices, as written in the paper
fn naive_attention(
    att: &RelativeMultiHeadAttention,
    shared: Option<&XlBiases>,
    x: &Tensor<3>,
    mem: Option<&Tensor<3>>,
    causal: bool,
    window: Option<usize>,
) -> Vec<f32> {
    let [batch, qlen, dm] = x.dims();
    let mlen = mem.map_or(0, |m| m.dims()[1]);
    let klen = qlen + mlen;
    let (h, dh) = (att.n_heads, att.d_head);
    let pos = &att.positions;
    let wq = param2(&att.query.weight);
    let wkv = param2(&att.key_value.weight);
    let wo = param2(&att.output.weight);
    let scale = 1.0 / (dh as f64).sqrt();
    let mut out = Vec::new();
    for b in 0..batch {
        let xb = Mat::from_tensor(x.clone().narrow(0, b, 1).reshape([qlen, dm]));
        let cat = match mem {
            Some(m) => {
                let mb = Mat::from_tensor(m.clone().narrow(0, b, 1).reshape([mlen, dm]));
                let mut data = mb.data.clone();
                data.extend_from_slice(&xb.data);
                Mat {
                    rows: klen,
                    cols: dm,
                    data,
                }
            }
            None => xb.clone(),
        };
        let q = xb.matmul(&wq);
        let kv = cat.matmul(&wkv);
        let mut ctx = Mat {
            rows: qlen,
            cols: h * dh,
            data: vec![0.0; qlen * h * dh],
        };
        for hd in 0..h {
            // Key/value head g serves query heads g·h/hk .. (g+1)·h/hk (hk = h: its own).
            let hk = att.n_kv_heads;
            let g = hd / (h / hk);
            let qh = |i: usize| q.row(i)[hd * dh..(hd + 1) * dh].to_vec();
            let kh = |j: usize| kv.row(j)[g * dh..(g + 1) * dh].to_vec();
            let vh = |j: usize| kv.row(j)[hk * dh + g * dh..hk * dh + (g + 1) * dh].to_vec();
            for i in 0..qlen {
                let qi = qh(i);
                let mut scores = Vec::with_capacity(klen);
                for j in 0..klen {
                    let d = (i + mlen) as i64 - j as i64;
                    let visible = !causal || (d >= 0 && window.is_none_or(|w| d < w as i64));
                    if !visible {
                        scores.push(None);
                        continue;
                    }
                    let kj = kh(j);
                    let s = match pos.kind {
                        PositionKind::Xl => {
                            let PositionParams::Xl(p) = &att.scheme else {
                                panic!("XL parameters")
                            };
                            let biases = p.biases.as_ref().or(shared).unwrap();
                            let u = param2(&biases.content);
                            let v = param2(&biases.position);
                            let wr = param2(&p.r_net.weight);
                            let dc = match pos.clamp_len {
                                Some(c) => d.clamp(-(c as i64), c as i64),
                                None => d,
                            };
                            let rd = Mat {
                                rows: 1,
                                cols: dm,
                                data: naive_sinusoid(dc, dm),
                            };
                            let r = rd.matmul(&wr);
                            let r = &r.data[hd * dh..(hd + 1) * dh];
                            let qu: Vec<f64> =
                                qi.iter().zip(u.row(hd)).map(|(a, b)| a + b).collect();
                            let qv: Vec<f64> =
                                qi.iter().zip(v.row(hd)).map(|(a, b)| a + b).collect();
                            scale * (dot(&qu, &kj) + dot(&qv, r))
                        }
                        PositionKind::Learned => {
                            let m = pos.max_distance as i64;
                            let idx = (d.clamp(-m, m) + m) as usize;
                            let PositionParams::Learned(p) = &att.scheme else {
                                panic!("learned parameters")
                            };
                            let e = host(p.embedding.val());
                            let e = &e[(idx * h + hd) * dh..(idx * h + hd + 1) * dh];
                            let e: Vec<f64> = e.iter().map(|&x| x as f64).collect();
                            let bk = param2(&p.key_bias).at(idx, hd);
                            let bq = param2(&p.query_bias);
                            let qb: Vec<f64> =
                                qi.iter().zip(bq.row(hd)).map(|(a, b)| a + b).collect();
                            scale * (dot(&qb, &kj) + dot(&qi, &e) + bk)
                        }
                        PositionKind::T5 => {
                            // Without `memory_offset` the bucket ignores the memory: j - i.
                            let offset = if pos.memory_offset { mlen } else { 0 };
                            let bucket = naive_t5_bucket(
                                j as i64 - (i + offset) as i64,
                                pos.bidirectional,
                                pos.num_buckets,
                                pos.max_distance,
                            );
                            let PositionParams::T5(p) = &att.scheme else {
                                panic!("T5 parameters")
                            };
                            let beta = param2(&p.bias).at(bucket, hd) * pos.bias_scale;
                            scale * dot(&qi, &kj) + beta
                        }
                        // Vaswani et al. (2017): q·k / sqrt(d_head), no term per distance.
                        PositionKind::Absolute => match &att.qk_norm {
                            Some(n) => {
                                let (qn, kn) = naive_qk_norm(&qi, &kj, n);
                                n.scale * dot(&qn, &kn)
                            }
                            None => scale * dot(&qi, &kj),
                        },
                        // Keys at positions width - klen + j, queries at the last qlen.
                        PositionKind::Rotary => {
                            let (qn, kn, s) = match &att.qk_norm {
                                Some(n) => {
                                    let (qn, kn) = naive_qk_norm(&qi, &kj, n);
                                    (qn, kn, n.scale)
                                }
                                None => (qi.clone(), kj.clone(), scale),
                            };
                            let width = pos.rotary_width.unwrap_or(klen) as f64;
                            let start = width - klen as f64;
                            let centre = (width as usize / 2) as f64;
                            let rq = naive_rotary(&qn, start + (mlen + i) as f64, centre, pos, 1.0);
                            let rk = naive_rotary(&kn, start + j as f64, centre, pos, -1.0);
                            s * dot(&rq, &rk)
                        }
                    };
                    scores.push(Some(s));
                }
                let p = masked_softmax(&scores);
                for j in 0..klen {
                    let vj = vh(j);
                    for e in 0..dh {
                        ctx.data[i * h * dh + hd * dh + e] += p[j] * vj[e];
                    }
                }
            }
        }
        let bo = att.output.bias.as_ref().map(|b| host(b.val()));
        let o = ctx.matmul(&wo);
        out.extend(
            o.data
                .iter()
                .enumerate()
                .map(|(n, &v)| v as f32 + bo.as_ref().map_or(0.0, |b| b[n % dm])),
        );
    }
    out
}

struct Case {
    positions: PositionConfig,
    qlen: usize,
    mlen: usize,
    causal: bool,
    window: Option<usize>,
    own_biases: bool,
}

/// Relative attention with `h` heads (the config changed by `configure`) against the naive
/// computation on `case`.
fn check_with(
    case: Case,
    h: usize,
    configure: impl Fn(RelativeAttentionConfig) -> RelativeAttentionConfig,
    dev: &Device,
) {
    let (dm, dh, batch) = (16, 6, 2);
    let mut att = configure(RelativeAttentionConfig::new(dm, h, dh))
        .with_positions(case.positions.clone())
        .with_own_biases(case.own_biases)
        .with_initializer(burn::nn::Initializer::Normal {
            mean: 0.0,
            std: 0.3,
        })
        .init(dev)
        .unwrap();
    // An output bias starts at zero: draw one, so that a missing `+ b_o` shows.
    if let Some(b) = &mut att.output.bias {
        *b = burn::module::Param::from_tensor(randn([dm], 13, dev));
    }
    let shared = (!case.own_biases).then(|| {
        XlBiases::init(
            h,
            dh,
            &burn::nn::Initializer::Normal {
                mean: 0.0,
                std: 0.3,
            },
            dev,
        )
    });
    let x = randn([batch, case.qlen, dm], 11, dev);
    let mem = (case.mlen > 0).then(|| randn([batch, case.mlen, dm], 12, dev));
    let mask = if case.causal {
        AttentionMask::Causal {
            window: case.window,
        }
    } else {
        AttentionMask::None
    };
    let ctx = RelativeContext::new(&case.positions, dm, case.qlen, case.mlen, &mask, dev);
    let got = host(
        att.forward(x.clone(), mem.clone(), &ctx, shared.as_ref())
            .unwrap(),
    );
    let want = naive_attention(
        &att,
        shared.as_ref(),
        &x,
        mem.as_ref(),
        case.causal,
        case.window,
    );
    let what = format!(
        "{:?} qlen {} mlen {} causal {} window {:?}",
        case.positions.kind, case.qlen, case.mlen, case.causal, case.window
    );
    assert_close(&got, &want, 2e-4, &what);

    // A key/value cache handed over with the segment's own entries already appended
    // (generation, `with_memory_holding_segment`) gives the same outputs; a cache shorter than
    // the segment is an error naming both lengths.
    if let Some(m) = &mem {
        let cached = att.clone().with_memory_keys_values(true);
        let all = Tensor::cat(
            vec![cached.cache_entry(m.clone()), cached.cache_entry(x.clone())],
            1,
        );
        let held = ctx.clone().with_memory_holding_segment();
        let out = cached
            .forward(x.clone(), Some(all.clone()), &held, shared.as_ref())
            .unwrap();
        assert_close(
            &host(out),
            &want,
            2e-4,
            &format!("{what}, cache holding the segment"),
        );
        if case.qlen > 1 {
            let short = all.narrow(1, 0, case.qlen - 1);
            let err = cached
                .forward(x.clone(), Some(short), &held, shared.as_ref())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("segment's {}", case.qlen)),
                "{what}: {err}"
            );
        }
    }

    // Generation's form of XL positions: `W_R R_d` read from a table per distance gives
    // the same outputs (fused kernel) and scores (tensor ops) as the projected sinusoids.
    let klen = case.qlen + case.mlen;
    let rows = |max| {
        RelativeContext::with_table_rows(&case.positions, max, case.qlen, case.mlen, &mask, dev)
    };
    if case.positions.kind != PositionKind::Xl || !case.causal {
        assert!(rows(klen).is_none(), "{what}: no table rows");
        return;
    }
    // The table covers every distance of the pass (each row holding its clamped sinusoid),
    // so its rows for the pass's columns are consecutive.
    let reach = klen - 1;
    if reach > 0 {
        assert!(
            rows(reach - 1).is_none(),
            "{what}: a table short of the pass"
        );
    }
    let tabled = att.clone().with_position_table(reach + 3);
    let rows = rows(reach + 3).expect("a causal XL pass within the table");
    let out = tabled
        .forward(x.clone(), mem.clone(), &rows, shared.as_ref())
        .unwrap();
    assert_close(&host(out), &want, 2e-4, &format!("{what}, table"));
    let (q, k, _) = att.project(x, mem, &ctx).unwrap();
    let [q, k] = [q, k].map(|t| t.swap_dims(1, 2));
    let scores = |a: &RelativeMultiHeadAttention, c| {
        host(a.scores(q.clone(), k.clone(), c, shared.as_ref()).unwrap())
    };
    assert_close(
        &scores(&tabled, &rows),
        &scores(&att, &ctx),
        1e-5,
        &format!("{what}, table scores"),
    );
    // A layer without the table refuses a context that reads one.
    assert!(
        att.forward(
            randn([batch, case.qlen, dm], 3, dev),
            None,
            &rows,
            shared.as_ref()
        )
        .is_err()
    );
}

fn shapes() -> Vec<(usize, usize, bool, Option<usize>)> {
    vec![
        (5, 0, true, None),
        (5, 3, true, None),
        (3, 7, true, None),
        (6, 10, true, None),
        (6, 4, true, Some(4)),
        (4, 3, false, None),
        (1, 5, true, None),
    ]
}

/// [`check_with`] on every one of [`shapes`], with 2 heads and the config as built.
fn check_shapes(positions: PositionConfig, own_biases: bool, dev: &Device) {
    check_shapes_with(positions, own_biases, 2, |c| c, dev)
}

/// [`check_with`] on every one of [`shapes`].
fn check_shapes_with(
    positions: PositionConfig,
    own_biases: bool,
    h: usize,
    configure: impl Fn(RelativeAttentionConfig) -> RelativeAttentionConfig + Copy,
    dev: &Device,
) {
    for (qlen, mlen, causal, window) in shapes() {
        let case = Case {
            positions: positions.clone(),
            qlen,
            mlen,
            causal,
            window,
            own_biases,
        };
        check_with(case, h, configure, dev);
    }
}

#[test]
fn xl_attention_matches_naive() {
    let dev = flex();
    for own_biases in [true, false] {
        check_shapes(PositionConfig::new(), own_biases, &dev);
    }
    check_shapes(PositionConfig::new().with_clamp_len(Some(2)), true, &dev);
}

/// `x` at position `t` rotated in the planes `(c, c + d/2)` by `t θ_c`, `θ_c =
/// b^(−2c/d)`, then scaled by `ζ_c^(sign (t − centre)/γ)` (xPos), from the papers' formulas.
fn naive_rotary(x: &[f64], t: f64, centre: f64, pos: &PositionConfig, sign: f64) -> Vec<f64> {
    let d = x.len();
    let half = d / 2;
    let mut out = vec![0.0; d];
    for c in 0..half {
        let theta = pos.rotary_theta.powf(-2.0 * c as f64 / d as f64);
        let (sin, cos) = (t * theta).sin_cos();
        let zeta = (2.0 * c as f64 + 0.4 * d as f64) / (1.4 * d as f64);
        let s = pos
            .xpos_scale_base
            .map_or(1.0, |g| zeta.powf(sign * (t - centre) / g));
        out[c] = (x[c] * cos - x[c + half] * sin) * s;
        out[c + half] = (x[c + half] * cos + x[c] * sin) * s;
    }
    out
}

/// qk-RMSNorm's `q / ‖q‖ g_q`, `k / ‖k‖ g_k`.
fn naive_qk_norm(q: &[f64], k: &[f64], n: &memzoo_relative::QkNorm) -> (Vec<f64>, Vec<f64>) {
    let unit = |x: &[f64], g: Vec<f32>| {
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        x.iter().zip(g).map(|(v, g)| v / norm * g as f64).collect()
    };
    (unit(q, host(n.query.val())), unit(k, host(n.key.val())))
}

/// Rotary positions (plain, with xPos, with a wider position range, with qk-RMSNorm and
/// learned gains) against the papers' formulas.
#[test]
fn rotary_attention_matches_naive() {
    let dev = flex();
    let rotary = PositionConfig::new().with_kind(PositionKind::Rotary);
    check_shapes(rotary.clone(), true, &dev);
    let xpos = rotary
        .with_xpos_scale_base(Some(3.0))
        .with_rotary_theta(100.0);
    check_shapes(xpos.clone(), true, &dev);
    check_shapes(xpos.clone().with_rotary_width(Some(40)), true, &dev);
    check_shapes_with(xpos, true, 2, |c| c.with_qk_norm(Some(8.0)), &dev);
    // qk-RMSNorm needs rotary or absolute positions.
    let err = RelativeAttentionConfig::new(8, 2, 4)
        .with_qk_norm(Some(8.0))
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("qk_norm"), "{err}");
}

#[test]
fn absolute_attention_matches_naive() {
    let absolute = PositionConfig::new().with_kind(PositionKind::Absolute);
    check_shapes(absolute, true, &flex());
}

#[test]
fn learned_attention_matches_naive() {
    let learned = PositionConfig::new()
        .with_kind(PositionKind::Learned)
        .with_max_distance(4);
    check_shapes(learned, true, &flex());
}

#[test]
fn t5_attention_matches_naive() {
    for bidirectional in [false, true] {
        let t5 = PositionConfig::new()
            .with_kind(PositionKind::T5)
            .with_num_buckets(8)
            .with_max_distance(9)
            .with_bidirectional(bidirectional);
        check_shapes(t5, true, &flex());
    }
}

/// memorizing-transformers-pytorch's layer: one key/value head for all (multi-query) or one
/// per two query heads (grouped), an output bias, and T5 biases scaled by `sqrt(d_head)` and
/// bucketed by `i - j` (no memory offset).
#[test]
fn multi_query_output_bias_and_scaled_memory_free_t5_match_naive() {
    let dev = flex();
    for kv_heads in [1, 2] {
        let positions = PositionConfig::new()
            .with_kind(PositionKind::T5)
            .with_num_buckets(8)
            .with_max_distance(9)
            .with_bias_scale(6f64.sqrt())
            .with_memory_offset(false);
        let configure =
            |c: RelativeAttentionConfig| c.with_n_kv_heads(Some(kv_heads)).with_output_bias(true);
        check_shapes_with(positions, true, 4, configure, &dev);
    }
    let err = RelativeAttentionConfig::new(16, 4, 4)
        .with_n_kv_heads(Some(3))
        .init(&dev)
        .unwrap_err();
    assert!(err.to_string().contains("n_kv_heads (3)"), "{err}");
    let t5 = PositionConfig::new()
        .with_kind(PositionKind::T5)
        .with_bias_scale(f64::NAN);
    let err = RelativeAttentionConfig::new(16, 4, 4)
        .with_positions(t5)
        .init(&dev)
        .unwrap_err();
    assert!(err.to_string().contains("bias_scale"), "{err}");
}

#[test]
fn t5_buckets_match_reference_formula() {
    for bidirectional in [false, true] {
        for (nb, maxd) in [(32, 128), (8, 9), (16, 40)] {
            for d in -300i64..300 {
                assert_eq!(
                    memzoo_relative::t5_bucket(d, bidirectional, nb, maxd),
                    naive_t5_bucket(-d, bidirectional, nb, maxd),
                    "d {d} bidirectional {bidirectional} nb {nb} maxd {maxd}"
                );
            }
        }
    }
}

#[test]
fn bad_attention_configs_are_errors_naming_the_value() {
    let dev = flex();
    let err = RelativeAttentionConfig::new(15, 3, 5)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("d_model = 15"), "{err}");
    let err = RelativeAttentionConfig::new(16, 2, 8)
        .with_dropatt(1.5)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dropatt") && err.contains("1.5"), "{err}");
    let t5 = PositionConfig::new()
        .with_kind(PositionKind::T5)
        .with_num_buckets(7)
        .with_bidirectional(true);
    let err = RelativeAttentionConfig::new(16, 2, 8)
        .with_positions(t5)
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("got 7"), "{err}");
}

/// Autodiff gradients of the attention against central finite differences (in f32).
#[test]
fn attention_gradients_match_finite_differences() {
    use burn::module::Param;
    let dev = flex().autodiff();
    for kind in [PositionKind::Xl, PositionKind::Learned, PositionKind::T5] {
        let positions = PositionConfig::new()
            .with_kind(kind)
            .with_max_distance(6)
            .with_num_buckets(8);
        let att = RelativeAttentionConfig::new(8, 2, 4)
            .with_positions(positions.clone())
            .with_initializer(burn::nn::Initializer::Normal {
                mean: 0.0,
                std: 0.5,
            })
            .init(&dev)
            .unwrap();
        let x = randn([1, 4, 8], 5, &dev);
        let mem = randn([1, 3, 8], 6, &dev);
        let w = randn([1, 4, 8], 7, &dev);
        let ctx = RelativeContext::new(&positions, 8, 4, 3, &AttentionMask::causal(), &dev);
        let loss_of = |a: &RelativeMultiHeadAttention| {
            (a.forward(x.clone(), Some(mem.clone()), &ctx, None).unwrap() * w.clone()).sum()
        };
        let grads = loss_of(&att).backward();
        let checks: Vec<(&str, &Param<Tensor<2>>)> = vec![
            ("query", &att.query.weight),
            ("key_value", &att.key_value.weight),
        ];
        for (name, p) in checks {
            let g = host(p.grad(&grads).unwrap());
            let base = host(p.val());
            for idx in [0usize, 5, 17, 30] {
                let eps = 1e-2f32;
                let eval = |delta: f32| {
                    let mut v = base.clone();
                    v[idx] += delta;
                    let t = Tensor::<2>::from_data(
                        burn::tensor::TensorData::new(v, p.val().dims()),
                        &dev,
                    );
                    let mut a = att.clone();
                    if name == "query" {
                        a.query.weight = Param::from_tensor(t);
                    } else {
                        a.key_value.weight = Param::from_tensor(t);
                    }
                    loss_of(&a).into_scalar::<f32>()
                };
                let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
                assert!(
                    (fd - g[idx]).abs() < 2e-2 * (1.0 + fd.abs()),
                    "{kind:?} {name}[{idx}]: autodiff {} vs finite difference {fd}",
                    g[idx]
                );
            }
        }
    }
}

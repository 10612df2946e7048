//! LSH chunked attention (Kitaev et al. 2020, sec. 2) as one CPU kernel: sort by bucket, gather,
//! chunk with look-around (wrapping over the sorted sequence), scores, masks, round
//! de-duplication, softmax with log-partition, unsort and the mixture of rounds; and its
//! hand-written backward. Plain slices in, plain slices out; one rayon task per (batch, head) row,
//! the products per chunk by `gemm` (single-threaded inside a task).
//!
//! The maths, per row, with `R = rounds * len` sorted elements and `nc = R / c` chunks of `c`:
//! - sorted order: ascending `(bucket + round * n_buckets, position)`; `pos_t` is the original
//!   position of sorted element `t`, `undo` the inverse permutation;
//! - `q_t = x_{pos_t}`, `k_t = q_t / max(|q_t|, 1e-6)` (shared QK), `v_t = v_{pos_t}`;
//! - query chunk `i` sees key chunks `i, i-1, .., i-before, i+1, .., i+after` (mod `nc`);
//! - `s_tu = scale * q_t · k_u`; `SELF_SCORE` where `pos_t = pos_u`; then `- log count_tu`
//!   (de-duplication: the number of rounds whose chunk windows hold the pair, at least 1); then
//!   `MASKED` where `pos_u > pos_t` (causal) or `pos_u` is padding;
//! - `P_tu = exp(s_tu - lse_t)`, `lse_t = log Σ_u exp s_tu`, `o_t = Σ_u P_tu v_u`;
//! - output `y_p = Σ_r w_rp o_{undo(r, p)}` with `w_rp = softmax_r(lse_{undo(r, p)})`.
//!
//! Backward, from `g_p = dL/dy_p`:
//! - `do_t = w_rp g_p`, `dlse_t = w_rp g_p · (o_t - y_p)` for `t = undo(r, p)`;
//! - `dP_tu = do_t · v_u`, `ds_tu = P_tu (dP_tu - do_t · o_t + dlse_t)` (zero where the score
//!   was filled: self, causal, padding), `dv_u += Σ_t P_tu do_t`;
//! - `dq_t += scale Σ_u ds_tu k_u`, `dk_u += scale Σ_t ds_tu q_t`;
//! - `dq_t += (dk_t - k_t (k_t · dk_t)) / |q_t|` (or `dk_t / 1e-6` under the floor);
//! - scatter `dq_t`, `dv_t` to position `pos_t`, summed over the rounds.

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

/// Settings of the kernel: the chunk geometry, masks and the score convention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LshKernelParams {
    /// Chunk length (bucket size) `c`; divides the sequence length.
    pub chunk_len: usize,
    /// Buckets per round (bucket ids lie in `0..n_buckets`).
    pub n_buckets: usize,
    /// Chunks before its own that a chunk attends to (capped at `nc - 1`).
    pub before: usize,
    /// Chunks after its own (capped so that no chunk is seen twice).
    pub after: usize,
    /// Hide keys whose original position is after the query's.
    pub causal: bool,
    /// Lower a pair's score by the log of the number of rounds whose windows hold it.
    pub dedup_rounds: bool,
    /// Multiplies `q · k̂` (1 or `1/sqrt(d_head)`).
    pub scale: f32,
    /// Score of a query's own key.
    pub self_score: f32,
    /// Score of a hidden key.
    pub masked: f32,
}

/// Sizes of one call: `n` rows of `len` positions, `rounds` hash rounds, `d_head` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LshDims {
    /// Rows (batch x heads).
    pub n: usize,
    /// Sequence length (a multiple of the chunk length).
    pub len: usize,
    /// Hash rounds.
    pub rounds: usize,
    /// Head width.
    pub d_head: usize,
}

/// What the forward pass keeps for the backward: the sorted outputs and log-partitions.
#[derive(Clone, Debug)]
pub struct LshSaved {
    /// `o_t` per row, in sorted order: `[n, rounds * len, d_head]`.
    pub out_sorted: Vec<f32>,
    /// `lse_t` per row, in sorted order: `[n, rounds * len]`.
    pub lse_sorted: Vec<f32>,
}

/// The floor of `|q|^2` under the square root (as the unfused path: a zero query stays finite).
const NORM_FLOOR: f32 = 1e-12;

/// Geometry shared by every row: chunk count and the window's chunk offsets.
#[derive(Clone, Debug)]
struct Geometry {
    c: usize,
    nc: usize,
    before: usize,
    after: usize,
    /// Window parts: offsets of the key chunks from the query chunk, own chunk first.
    offsets: Vec<isize>,
    /// `log(k)` for `k = 0..=rounds` (`log 0` is never used: counts are clamped to 1).
    log_count: Vec<f32>,
}

impl Geometry {
    fn new(d: LshDims, p: &LshKernelParams) -> Self {
        let c = p.chunk_len;
        let nc = d.rounds * d.len / c;
        let before = p.before.min(nc - 1);
        let after = p.after.min(nc - 1 - before);
        let mut offsets = vec![0isize];
        offsets.extend((1..=before).map(|s| -(s as isize)));
        offsets.extend((1..=after).map(|s| s as isize));
        let log_count = (0..=d.rounds).map(|k| (k.max(1) as f32).ln()).collect();
        Self {
            c,
            nc,
            before,
            after,
            offsets,
            log_count,
        }
    }

    fn width(&self) -> usize {
        self.c * self.offsets.len()
    }

    fn key_chunk(&self, i: usize, off: isize) -> usize {
        (i as isize + off).rem_euclid(self.nc as isize) as usize
    }

    /// Whether key chunk `kc` is in the (wrapping) window of query chunk `qc`.
    fn in_window(&self, qc: u32, kc: u32) -> bool {
        let u = kc as i64 - qc as i64 + self.before as i64;
        let b = (self.before + self.after) as i64;
        let nc = self.nc as i64;
        (0..=b).contains(&u) || u >= nc || u + nc <= b
    }
}

/// One row's sorted copies and bookkeeping.
struct Row {
    /// Sorted element -> original position.
    pos: Vec<u32>,
    /// `(round * len + position)` -> sorted element.
    undo: Vec<u32>,
    /// De-duplication: for sorted element `t` and round `r`, the chunk holding `pos_t` in round
    /// `r`, at `t * rounds + r` (empty without de-duplication).
    locs: Vec<u32>,
    q: Vec<f32>,
    k: Vec<f32>,
    /// `max(|q_t|, 1e-6)`.
    norm: Vec<f32>,
    /// Whether `|q_t|` is under the floor (then the norm is a constant).
    floored: Vec<bool>,
    v: Vec<f32>,
}

impl Row {
    fn new(
        d: LshDims,
        p: &LshKernelParams,
        g: &Geometry,
        qk: &[f32],
        v: &[f32],
        buckets: &[i64],
    ) -> Self {
        let (l, dh, r) = (d.len, d.d_head, d.rounds);
        let rl = r * l;
        // Counting sort by bucket-with-round-offset; stable, so ties keep position order.
        let nb = p.n_buckets * r;
        let key = |idx: usize| {
            let b = buckets[idx].clamp(0, p.n_buckets as i64 - 1) as usize;
            b + (idx / l) * p.n_buckets
        };
        let mut start = vec![0u32; nb + 1];
        for idx in 0..rl {
            start[key(idx) + 1] += 1;
        }
        for b in 0..nb {
            start[b + 1] += start[b];
        }
        let mut undo = vec![0u32; rl];
        let mut pos = vec![0u32; rl];
        for idx in 0..rl {
            let kb = key(idx);
            let t = start[kb] as usize;
            start[kb] += 1;
            undo[idx] = t as u32;
            pos[t] = (idx % l) as u32;
        }
        let locs = if p.dedup_rounds && r > 1 {
            let mut locs = vec![0u32; rl * r];
            for t in 0..rl {
                let pt = pos[t] as usize;
                for rr in 0..r {
                    locs[t * r + rr] = undo[rr * l + pt] / g.c as u32;
                }
            }
            locs
        } else {
            Vec::new()
        };
        let mut sq = vec![0f32; rl * dh];
        let mut sk = vec![0f32; rl * dh];
        let mut sv = vec![0f32; rl * dh];
        let mut norm = vec![0f32; rl];
        let mut floored = vec![false; rl];
        for t in 0..rl {
            let src = pos[t] as usize * dh;
            let x = &qk[src..src + dh];
            sq[t * dh..(t + 1) * dh].copy_from_slice(x);
            sv[t * dh..(t + 1) * dh].copy_from_slice(&v[src..src + dh]);
            let ss: f32 = x.iter().map(|a| a * a).sum();
            let nrm = ss.max(NORM_FLOOR).sqrt();
            norm[t] = nrm;
            floored[t] = ss <= NORM_FLOOR;
            for (kk, a) in sk[t * dh..(t + 1) * dh].iter_mut().zip(x) {
                *kk = a / nrm;
            }
        }
        Self {
            pos,
            undo,
            locs,
            q: sq,
            k: sk,
            norm,
            floored,
            v: sv,
        }
    }

    /// Scores of query chunk `i` against its window, masks applied, into `s` (`[c, w]`);
    /// `live` (when given) marks the entries that came from `q · k` (their gradient flows).
    fn scores(
        &self,
        d: LshDims,
        p: &LshKernelParams,
        g: &Geometry,
        pad: &[bool],
        i: usize,
        s: &mut [f32],
        mut live: Option<&mut [bool]>,
    ) {
        let (c, dh, w, r) = (g.c, d.d_head, g.width(), d.rounds);
        for (m, &off) in g.offsets.iter().enumerate() {
            let j = g.key_chunk(i, off);
            // S[:, m] = scale Q_i K_j^T
            unsafe {
                gemm(
                    c,
                    c,
                    dh,
                    s.as_mut_ptr().add(m * c),
                    1,
                    w as isize,
                    false,
                    self.q.as_ptr().add(i * c * dh),
                    1,
                    dh as isize,
                    self.k.as_ptr().add(j * c * dh),
                    dh as isize,
                    1,
                    0.0,
                    p.scale,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        }
        let dedup = !self.locs.is_empty();
        for a in 0..c {
            let t = i * c + a;
            let pt = self.pos[t];
            let lt = if dedup {
                &self.locs[t * r..(t + 1) * r]
            } else {
                &[][..]
            };
            let row = &mut s[a * w..(a + 1) * w];
            for (m, &off) in g.offsets.iter().enumerate() {
                let j = g.key_chunk(i, off);
                for b in 0..c {
                    let u = j * c + b;
                    let pu = self.pos[u];
                    let x = &mut row[m * c + b];
                    let mut ok = true;
                    if pt == pu {
                        *x = p.self_score;
                        ok = false;
                    }
                    if dedup {
                        let lu = &self.locs[u * r..(u + 1) * r];
                        let count = lt
                            .iter()
                            .zip(lu)
                            .filter(|&(&qc, &kc)| g.in_window(qc, kc))
                            .count();
                        *x -= g.log_count[count];
                    }
                    if (p.causal && pu > pt) || pad.get(pu as usize).copied().unwrap_or(false) {
                        *x = p.masked;
                        ok = false;
                    }
                    if let Some(live) = live.as_deref_mut() {
                        live[a * w + m * c + b] = ok;
                    }
                }
            }
        }
    }
}

/// Softmax of each row of `s` (rows of `w`) in place: `p = exp(s - max) / Σ`; returns the
/// rows' `lse = log Σ + max`. The backward recomputes `p` this way, not as `exp(s - lse)`:
/// with every key hidden, `s = lse = MASKED` to f32 precision and `exp(s - lse)` would be 1.
fn softmax_rows(s: &mut [f32], w: usize) -> Vec<f32> {
    s.chunks_exact_mut(w)
        .map(|sa| {
            let m = sa.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut z = 0.0;
            for x in sa.iter_mut() {
                *x = (*x - m).exp();
                z += *x;
            }
            for x in sa.iter_mut() {
                *x /= z;
            }
            z.ln() + m
        })
        .collect()
}

/// Round weights `w_r = softmax_r(lse)` of position `p` and the sorted indices `undo(r, p)`.
fn round_weights(row: &Row, lse: &[f32], l: usize, p: usize, ts: &mut [usize], w: &mut [f32]) {
    let r = ts.len();
    let mut m = f32::NEG_INFINITY;
    for rr in 0..r {
        ts[rr] = row.undo[rr * l + p] as usize;
        m = m.max(lse[ts[rr]]);
    }
    let mut z = 0.0;
    for rr in 0..r {
        w[rr] = (lse[ts[rr]] - m).exp();
        z += w[rr];
    }
    for x in w.iter_mut() {
        *x /= z;
    }
}

/// Forward pass. Inputs `qk`, `v`: `[n, len, d_head]`; `buckets`: `[n, rounds, len]`;
/// `pad`: `[n, len]` (`true` = hidden key) or empty. Returns the output `[n, len, d_head]`
/// and what the backward needs.
pub fn forward(
    d: LshDims,
    p: &LshKernelParams,
    qk: &[f32],
    v: &[f32],
    buckets: &[i64],
    pad: &[bool],
) -> (Vec<f32>, LshSaved) {
    let (n, l, dh, r) = (d.n, d.len, d.d_head, d.rounds);
    let rl = r * l;
    let g = Geometry::new(d, p);
    let mut y = vec![0f32; n * l * dh];
    let mut out_sorted = vec![0f32; n * rl * dh];
    let mut lse_sorted = vec![0f32; n * rl];
    y.par_chunks_mut(l * dh)
        .zip(out_sorted.par_chunks_mut(rl * dh))
        .zip(lse_sorted.par_chunks_mut(rl))
        .enumerate()
        .for_each(|(ni, ((y, out), lse))| {
            let row = Row::new(
                d,
                p,
                &g,
                &qk[ni * l * dh..(ni + 1) * l * dh],
                &v[ni * l * dh..(ni + 1) * l * dh],
                &buckets[ni * rl..(ni + 1) * rl],
            );
            let pad = if pad.is_empty() {
                pad
            } else {
                &pad[ni * l..(ni + 1) * l]
            };
            let (c, w) = (g.c, g.width());
            let mut s = vec![0f32; c * w];
            for i in 0..g.nc {
                row.scores(d, p, &g, pad, i, &mut s, None);
                lse[i * c..(i + 1) * c].copy_from_slice(&softmax_rows(&mut s, w));
                for (m, &off) in g.offsets.iter().enumerate() {
                    let j = g.key_chunk(i, off);
                    // O_i += P[:, m] V_j
                    unsafe {
                        gemm(
                            c,
                            dh,
                            c,
                            out.as_mut_ptr().add(i * c * dh),
                            1,
                            dh as isize,
                            m > 0,
                            s.as_ptr().add(m * c),
                            1,
                            w as isize,
                            row.v.as_ptr().add(j * c * dh),
                            1,
                            dh as isize,
                            1.0,
                            1.0,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
            }
            let mut ts = vec![0usize; r];
            let mut wr = vec![0f32; r];
            for pp in 0..l {
                round_weights(&row, lse, l, pp, &mut ts, &mut wr);
                let yp = &mut y[pp * dh..(pp + 1) * dh];
                for rr in 0..r {
                    let o = &out[ts[rr] * dh..(ts[rr] + 1) * dh];
                    for (a, b) in yp.iter_mut().zip(o) {
                        *a += wr[rr] * b;
                    }
                }
            }
        });
    (
        y,
        LshSaved {
            out_sorted,
            lse_sorted,
        },
    )
}

/// Backward pass: gradients of `qk` and `v` (`[n, len, d_head]` each) from the output's
/// gradient `dy` (`[n, len, d_head]`), with the inputs and [`LshSaved`] of the forward pass.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    d: LshDims,
    p: &LshKernelParams,
    qk: &[f32],
    v: &[f32],
    buckets: &[i64],
    pad: &[bool],
    saved: &LshSaved,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (n, l, dh, r) = (d.n, d.len, d.d_head, d.rounds);
    let rl = r * l;
    let g = Geometry::new(d, p);
    let mut dqk = vec![0f32; n * l * dh];
    let mut dv = vec![0f32; n * l * dh];
    dqk.par_chunks_mut(l * dh)
        .zip(dv.par_chunks_mut(l * dh))
        .enumerate()
        .for_each(|(ni, (dqk, dvo))| {
            let row = Row::new(
                d,
                p,
                &g,
                &qk[ni * l * dh..(ni + 1) * l * dh],
                &v[ni * l * dh..(ni + 1) * l * dh],
                &buckets[ni * rl..(ni + 1) * rl],
            );
            let pad = if pad.is_empty() {
                pad
            } else {
                &pad[ni * l..(ni + 1) * l]
            };
            let out = &saved.out_sorted[ni * rl * dh..(ni + 1) * rl * dh];
            let lse = &saved.lse_sorted[ni * rl..(ni + 1) * rl];
            let dy = &dy[ni * l * dh..(ni + 1) * l * dh];
            // Through the mixture of rounds: do_t, dlse_t, and D_t = do_t · o_t.
            let mut gout = vec![0f32; rl * dh];
            let mut glse = vec![0f32; rl];
            let mut dot_o = vec![0f32; rl];
            let mut ts = vec![0usize; r];
            let mut wr = vec![0f32; r];
            let mut yp = vec![0f32; dh];
            for pp in 0..l {
                round_weights(&row, lse, l, pp, &mut ts, &mut wr);
                yp.fill(0.0);
                for rr in 0..r {
                    let o = &out[ts[rr] * dh..(ts[rr] + 1) * dh];
                    for (a, b) in yp.iter_mut().zip(o) {
                        *a += wr[rr] * b;
                    }
                }
                let gp = &dy[pp * dh..(pp + 1) * dh];
                for rr in 0..r {
                    let t = ts[rr];
                    let o = &out[t * dh..(t + 1) * dh];
                    let mut go = 0.0;
                    let mut gd = 0.0;
                    for k in 0..dh {
                        gout[t * dh + k] = wr[rr] * gp[k];
                        go += gp[k] * o[k];
                        gd += gp[k] * (o[k] - yp[k]);
                    }
                    dot_o[t] = wr[rr] * go;
                    glse[t] = wr[rr] * gd;
                }
            }
            let (c, w) = (g.c, g.width());
            let mut s = vec![0f32; c * w];
            let mut live = vec![false; c * w];
            let mut dp = vec![0f32; c * w];
            let mut dq = vec![0f32; rl * dh];
            let mut dk = vec![0f32; rl * dh];
            let mut dvs = vec![0f32; rl * dh];
            for i in 0..g.nc {
                row.scores(d, p, &g, pad, i, &mut s, Some(&mut live));
                softmax_rows(&mut s, w);
                for (m, &off) in g.offsets.iter().enumerate() {
                    let j = g.key_chunk(i, off);
                    unsafe {
                        // dP[:, m] = dO_i V_j^T
                        gemm(
                            c,
                            c,
                            dh,
                            dp.as_mut_ptr().add(m * c),
                            1,
                            w as isize,
                            false,
                            gout.as_ptr().add(i * c * dh),
                            1,
                            dh as isize,
                            row.v.as_ptr().add(j * c * dh),
                            dh as isize,
                            1,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                        // dV_j += P[:, m]^T dO_i
                        gemm(
                            c,
                            dh,
                            c,
                            dvs.as_mut_ptr().add(j * c * dh),
                            1,
                            dh as isize,
                            true,
                            s.as_ptr().add(m * c),
                            w as isize,
                            1,
                            gout.as_ptr().add(i * c * dh),
                            1,
                            dh as isize,
                            1.0,
                            1.0,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
                // dS = P (dP - D + dlse), zero where the score was filled
                for a in 0..c {
                    let t = i * c + a;
                    let shift = glse[t] - dot_o[t];
                    let base = a * w;
                    for e in base..base + w {
                        dp[e] = if live[e] { s[e] * (dp[e] + shift) } else { 0.0 };
                    }
                }
                for (m, &off) in g.offsets.iter().enumerate() {
                    let j = g.key_chunk(i, off);
                    unsafe {
                        // dQ_i += scale dS[:, m] K_j
                        gemm(
                            c,
                            dh,
                            c,
                            dq.as_mut_ptr().add(i * c * dh),
                            1,
                            dh as isize,
                            true,
                            dp.as_ptr().add(m * c),
                            1,
                            w as isize,
                            row.k.as_ptr().add(j * c * dh),
                            1,
                            dh as isize,
                            1.0,
                            p.scale,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                        // dK_j += scale dS[:, m]^T Q_i
                        gemm(
                            c,
                            dh,
                            c,
                            dk.as_mut_ptr().add(j * c * dh),
                            1,
                            dh as isize,
                            true,
                            dp.as_ptr().add(m * c),
                            w as isize,
                            1,
                            row.q.as_ptr().add(i * c * dh),
                            1,
                            dh as isize,
                            1.0,
                            p.scale,
                            false,
                            false,
                            false,
                            Parallelism::None,
                        );
                    }
                }
            }
            // k = q / |q|: dq += (dk - k (k · dk)) / |q| (dk / |q| under the floor), then
            // scatter the sorted gradients to their positions.
            for t in 0..rl {
                let (kt, dkt) = (&row.k[t * dh..(t + 1) * dh], &dk[t * dh..(t + 1) * dh]);
                let nrm = row.norm[t];
                let kd: f32 = if row.floored[t] {
                    0.0
                } else {
                    kt.iter().zip(dkt).map(|(a, b)| a * b).sum()
                };
                let dst = row.pos[t] as usize * dh;
                for k in 0..dh {
                    dqk[dst + k] += dq[t * dh + k] + (dkt[k] - kt[k] * kd) / nrm;
                    dvo[dst + k] += dvs[t * dh + k];
                }
            }
        });
    (dqk, dv)
}

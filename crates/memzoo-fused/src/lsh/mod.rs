//! LSH chunked attention (Kitaev et al. 2020, sec. 2) as one CPU kernel: sort by bucket, gather,
//! chunk with look-around (wrapping over the sorted sequence), scores, masks, round
//! de-duplication, softmax with log-partition, unsort and the mixture of rounds; and its
//! hand-written backward; and the hashing ([`hash`]). Plain slices in, plain slices out; one rayon
//! task per (batch, head) row, the products per chunk by `gemm` (single-threaded inside a task),
//! the element-wise loops branch-free (compiled for AVX2 too, picked at run time).
//!
//! The maths, per row, with `R = rounds * len` sorted elements and `nc = R / c` chunks of `c`:
//! - sorted order: ascending `(bucket + round * n_buckets, position)`; `pos_t` is the original
//!   position of sorted element `t`, `undo` the inverse permutation;
//! - `q_t = x_{pos_t}`, `k_t = q_t / max(|q_t|, 1e-6)` (shared QK), `v_t = v_{pos_t}`;
//! - query chunk `i` sees key chunks `i-before, .., i, .., i+after` (mod `nc`); the sorted rows
//!   are stored with the last `before` chunks copied in front and the first `after` behind, so a
//!   window is `w` consecutive rows and each product one `gemm` call;
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
//!
//! Where things live: the types, the per-row sort and gather (`Row`), the forward pass and
//! the hashing here; the backward pass in `backward.rs`; the branch-free element-wise loops
//! (masks, softmax, score gradients) and the `gemm` call in `loops.rs`.

use rayon::prelude::*;

mod backward;
mod loops;

pub use backward::backward;
use loops::{WindowKeys, mask_row, matmul, softmax_rows};
pub(crate) use loops::{exp_f32, max_f32, round_and_pow2, sum_f32};

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
    /// Chunks before a chunk in its window (capped).
    before: usize,
    /// `before + after` (capped).
    span: usize,
    /// Window parts: offsets of the key chunks from the query chunk, `-before..=after`.
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
        let offsets = (-(before as isize)..=after as isize).collect();
        let log_count = (0..=d.rounds).map(|k| (k.max(1) as f32).ln()).collect();
        Self {
            c,
            nc,
            before,
            span: before + after,
            offsets,
            log_count,
        }
    }

    fn width(&self) -> usize {
        self.c * self.offsets.len()
    }

    /// Rows of the extended sorted layout: the last `before` chunks, the `nc` chunks, the
    /// first `after` chunks, so that every window is `w` consecutive rows (chunk `i`'s starts
    /// at row `i * c`) and its products are single matrix products.
    fn ext_rows(&self) -> usize {
        self.c * (self.nc + self.span)
    }

    /// Row of sorted element 0 in the extended layout.
    fn ext0(&self) -> usize {
        self.c * self.before
    }

    /// Copies the wrapped chunks of an extended `[ext_rows, dh]` buffer from its sorted rows.
    fn fill_wrap(&self, x: &mut [f32], dh: usize) {
        let (c, nc, e0) = (self.c, self.nc, self.ext0());
        x.copy_within(nc * c * dh..(nc * c + e0) * dh, 0);
        let after = self.span - self.before;
        x.copy_within(e0 * dh..(e0 + after * c) * dh, (e0 + nc * c) * dh);
    }

    /// Adds the wrapped chunks' rows of an extended gradient buffer into their sorted rows.
    fn fold_wrap(&self, x: &mut [f32], dh: usize) {
        let (c, nc, e0) = (self.c, self.nc, self.ext0());
        for k in 0..e0 * dh {
            x[nc * c * dh + k] += x[k];
        }
        let after = self.span - self.before;
        for k in 0..after * c * dh {
            x[e0 * dh + k] += x[(e0 + nc * c) * dh + k];
        }
    }

    fn key_chunk(&self, i: usize, off: isize) -> usize {
        (i as isize + off).rem_euclid(self.nc as isize) as usize
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
    /// Sorted queries, keys and values in the extended layout ([`Geometry::ext_rows`]).
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
        for (idx, u) in undo.iter_mut().enumerate() {
            let kb = key(idx);
            let t = start[kb] as usize;
            start[kb] += 1;
            *u = t as u32;
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
        let (ext, e0) = (g.ext_rows(), g.ext0());
        let mut sq = vec![0f32; ext * dh];
        let mut sk = vec![0f32; ext * dh];
        let mut sv = vec![0f32; ext * dh];
        let mut norm = vec![0f32; rl];
        let mut floored = vec![false; rl];
        for t in 0..rl {
            let src = pos[t] as usize * dh;
            let x = &qk[src..src + dh];
            let te = t + e0;
            sq[te * dh..(te + 1) * dh].copy_from_slice(x);
            sv[te * dh..(te + 1) * dh].copy_from_slice(&v[src..src + dh]);
            let ss: f32 = x.iter().map(|a| a * a).sum();
            let nrm = ss.max(NORM_FLOOR).sqrt();
            norm[t] = nrm;
            floored[t] = ss <= NORM_FLOOR;
            for (kk, a) in sk[te * dh..(te + 1) * dh].iter_mut().zip(x) {
                *kk = a / nrm;
            }
        }
        for x in [&mut sq, &mut sk, &mut sv] {
            g.fill_wrap(x, dh);
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
    #[allow(clippy::too_many_arguments)]
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
        // S = scale Q_i K_win^T
        let (q0, k0) = ((i * c + g.ext0()) * dh, i * c * dh);
        matmul(
            (c, w, dh),
            s,
            w,
            false,
            &self.q[q0..],
            (1, dh),
            &self.k[k0..],
            (dh, 1),
            p.scale,
        );
        // The window's keys: position, padding, and (de-duplication) chunk per round
        // (round-major, `+ nc` so that differences with a query's chunk are not negative).
        let dedup = !self.locs.is_empty();
        let mut kpos = Vec::with_capacity(w);
        let mut khid = Vec::with_capacity(w);
        let mut klocs = vec![0u32; if dedup { w * r } else { 0 }];
        for (m, &off) in g.offsets.iter().enumerate() {
            let j = g.key_chunk(i, off);
            for (b, u) in (j * c..(j + 1) * c).enumerate() {
                let pu = self.pos[u];
                kpos.push(pu);
                khid.push(pad.get(pu as usize).copied().unwrap_or(false) as u32);
                if dedup {
                    for rr in 0..r {
                        klocs[rr * w + m * c + b] = self.locs[u * r + rr] + g.nc as u32;
                    }
                }
            }
        }
        let mut log_count = vec![0f32; w];
        let mut count = vec![0u32; w];
        let keys = WindowKeys {
            pos: &kpos,
            hidden: &khid,
            locs: &klocs,
        };
        for a in 0..c {
            let t = i * c + a;
            let lt = if dedup {
                &self.locs[t * r..(t + 1) * r]
            } else {
                &[][..]
            };
            let query = (self.pos[t], lt);
            let scratch = (&mut count[..], &mut log_count[..]);
            let live_row = live.as_deref_mut().map(|l| &mut l[a * w..(a + 1) * w]);
            mask_row(
                p,
                g,
                &keys,
                query,
                &mut s[a * w..(a + 1) * w],
                live_row,
                scratch,
            );
        }
    }
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
                softmax_rows(&mut s, w, &mut lse[i * c..(i + 1) * c]);
                // O_i = P V_win
                matmul(
                    (c, dh, w),
                    &mut out[i * c * dh..],
                    dh,
                    false,
                    &s,
                    (1, w),
                    &row.v[i * c * dh..],
                    (1, dh),
                    1.0,
                );
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

/// Bucket ids `h(x) = argmax([xR; -xR])` per round (sec. 2), without materialising `xR`:
/// positions in blocks, one product per block, the first maximum as Burn's `argmax` takes it.
/// `x`: `[n, len, d_head]`; `rotations`: `[d_head, rounds, half]`; returns `[n, rounds, len]`.
pub fn hash(
    x: &[f32],
    (n, len, dh): (usize, usize, usize),
    rotations: &[f32],
    rounds: usize,
) -> Vec<i64> {
    let half = rotations.len() / (dh * rounds);
    let cols = rounds * half;
    let mut out = vec![0i64; n * rounds * len];
    const BLOCK: usize = 256;
    out.par_chunks_mut(rounds * len)
        .enumerate()
        .for_each(|(ni, out)| {
            let xr = &x[ni * len * dh..(ni + 1) * len * dh];
            let mut prod = vec![0f32; BLOCK * cols];
            for start in (0..len).step_by(BLOCK) {
                let rows = BLOCK.min(len - start);
                // xR for the block: [rows, rounds * half]
                matmul(
                    (rows, cols, dh),
                    &mut prod,
                    cols,
                    false,
                    &xr[start * dh..],
                    (1, dh),
                    rotations,
                    (1, cols),
                    1.0,
                );
                for a in 0..rows {
                    for rr in 0..rounds {
                        let v = &prod[a * cols + rr * half..a * cols + (rr + 1) * half];
                        // first maximum of [v, -v]
                        let (mut best, mut arg) = (v[0], 0usize);
                        for (j, &x) in v.iter().enumerate().skip(1) {
                            if x > best {
                                (best, arg) = (x, j);
                            }
                        }
                        for (j, &x) in v.iter().enumerate() {
                            if -x > best {
                                (best, arg) = (-x, half + j);
                            }
                        }
                        out[rr * len + start + a] = arg as i64;
                    }
                }
            }
        });
    out
}

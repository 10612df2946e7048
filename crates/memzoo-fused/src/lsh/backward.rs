//! The LSH kernel's backward pass (the maths is in the module docs of [`super`]).

use rayon::prelude::*;

use super::loops::{matmul, score_grads, softmax_rows};
use super::{Geometry, LshDims, LshKernelParams, LshSaved, Row, round_weights};

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
            let mut lse_scratch = vec![0f32; c];
            let mut shift = vec![0f32; c];
            let mut dq = vec![0f32; rl * dh];
            let mut dk = vec![0f32; g.ext_rows() * dh];
            let mut dvs = vec![0f32; g.ext_rows() * dh];
            for i in 0..g.nc {
                row.scores(d, p, &g, pad, i, &mut s, Some(&mut live));
                softmax_rows(&mut s, w, &mut lse_scratch);
                let win = i * c * dh;
                // dP = dO_i V_win^T
                matmul(
                    (c, w, dh),
                    &mut dp,
                    w,
                    false,
                    &gout[i * c * dh..],
                    (1, dh),
                    &row.v[win..],
                    (dh, 1),
                    1.0,
                );
                // dV_win += P^T dO_i
                matmul(
                    (w, dh, c),
                    &mut dvs[win..],
                    dh,
                    true,
                    &s,
                    (w, 1),
                    &gout[i * c * dh..],
                    (1, dh),
                    1.0,
                );
                for a in 0..c {
                    shift[a] = glse[i * c + a] - dot_o[i * c + a];
                }
                score_grads(&s, &mut dp, &live, &shift);
                // dQ_i += scale dS K_win, dK_win += scale dS^T Q_i
                matmul(
                    (c, dh, w),
                    &mut dq[i * c * dh..],
                    dh,
                    true,
                    &dp,
                    (1, w),
                    &row.k[win..],
                    (1, dh),
                    p.scale,
                );
                matmul(
                    (w, dh, c),
                    &mut dk[win..],
                    dh,
                    true,
                    &dp,
                    (w, 1),
                    &row.q[(i * c + g.ext0()) * dh..],
                    (1, dh),
                    p.scale,
                );
            }
            for x in [&mut dk, &mut dvs] {
                g.fold_wrap(x, dh);
            }
            // k = q / |q|: dq += (dk - k (k · dk)) / |q| (dk / |q| under the floor), then
            // scatter the sorted gradients to their positions.
            for t in 0..rl {
                let te = (t + g.ext0()) * dh;
                let (kt, dkt) = (&row.k[te..te + dh], &dk[te..te + dh]);
                let inv = 1.0 / row.norm[t];
                let kd: f32 = if row.floored[t] {
                    0.0
                } else {
                    kt.iter().zip(dkt).map(|(a, b)| a * b).sum()
                };
                let dst = row.pos[t] as usize * dh;
                for k in 0..dh {
                    dqk[dst + k] += dq[t * dh + k] + (dkt[k] - kt[k] * kd) * inv;
                    dvo[dst + k] += dvs[te + k];
                }
            }
        });
    (dqk, dv)
}

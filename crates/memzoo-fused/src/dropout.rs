//! Seeded inverted-dropout masks drawn on the host: the one generator every replayable mask in
//! memzoo comes from (`memzoo_reformer::rng::dropout_mask`, relative and kNN attention with a
//! dropout seed). It lives here for the optimisation level: drawing a mask is a loop over every
//! element of an activation, a hot loop in every training step with dropout.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `n` values of an inverted-dropout mask drawn from `seed`: element `i` is `0` where the
/// `i`-th uniform draw `u_i ∈ [0, 1)` of `StdRng::seed_from_u64(seed)` is below `p`, else
/// `1 / (1 - p)`. The same `(n, p, seed)` give the same mask on every machine and thread.
pub fn mask_values(n: usize, p: f64, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let keep = (1.0 / (1.0 - p)) as f32;
    (0..n)
        .map(|_| if rng.random::<f64>() < p { 0.0 } else { keep })
        .collect()
}

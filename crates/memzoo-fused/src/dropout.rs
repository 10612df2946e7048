//! Seeded inverted-dropout masks drawn on the host: the one generator every replayable mask in
//! memzoo comes from (`memzoo_reformer::rng::dropout_mask`, relative and kNN attention with a
//! dropout seed). It lives here for the optimisation level: drawing a mask is a loop over every
//! element of an activation, a hot loop in every training step with dropout.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;

/// Elements drawn per task.
const CHUNK: usize = 1 << 15;

/// `n` values of an inverted-dropout mask drawn from `seed`: element `i` is `0` where the
/// `i`-th uniform draw `u_i ∈ [0, 1)` of `StdRng::seed_from_u64(seed)` is below `p`, else
/// `1 / (1 - p)`. The same `(n, p, seed)` give the same mask on every machine and thread.
///
/// Drawn in parallel: `StdRng` is ChaCha12, whose stream can start at any word; draw `i`
/// reads the stream's 32-bit words `2i` and `2i + 1` (one `u64`), so each chunk of elements
/// starts its own copy of the generator at its first element's word, and the mask is the one
/// the sequential loop draws.
pub fn mask_values(n: usize, p: f64, seed: u64) -> Vec<f32> {
    let keep = (1.0 / (1.0 - p)) as f32;
    // `random::<f64>()` is `u = (x >> 11) 2^-53` of the next `u64` `x`; `2^53 p` is exact in
    // f64, so `u < p` exactly when the integer `x >> 11` is below `ceil(2^53 p)` (a NaN `p`
    // gives 0: nothing dropped, as no `u < NaN` holds).
    let threshold = (p * (1u64 << 53) as f64).ceil() as u64;
    let start = ChaCha12Rng::seed_from_u64(seed);
    let mut mask = vec![0f32; n];
    mask.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = start.clone();
            rng.set_word_pos(2 * (c * CHUNK) as u128);
            // The draws a block at a time (`fill` reads the stream's words in order, two
            // per `u64`, as `next_u64` does), then a branch-free loop over them.
            let mut words = [0u64; 512];
            for block in chunk.chunks_mut(words.len()) {
                let words = &mut words[..block.len()];
                rng.fill(words);
                for (m, &x) in block.iter_mut().zip(words.iter()) {
                    *m = if (x >> 11) < threshold { 0.0 } else { keep };
                }
            }
        });
    mask
}

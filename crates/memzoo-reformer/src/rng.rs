//! Explicit, seeded randomness.
//!
//! Everything random inside a Reformer layer (hash rotations, dropout masks) is drawn on the host
//! from a seed derived from `(step seed, layer, purpose)`, so the reversible backward pass can
//! replay exactly the masks and rotations of the forward pass.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Mixes a seed with a tag (splitmix64 finaliser): distinct tags give independent streams.
pub fn mix(seed: u64, tag: u64) -> u64 {
    let mut z = seed
        ^ tag
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` standard normal samples (Box–Muller) from `seed`.
pub fn normal_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = rng.random::<f64>().max(1e-300);
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    out
}

/// Random rotations of the LSH hash, `[d_head, n_rounds, n_buckets / 2]`, drawn from `seed`.
pub fn random_rotations(
    d_head: usize,
    n_rounds: usize,
    n_buckets: usize,
    seed: u64,
    device: &Device,
) -> Tensor<3> {
    let half = n_buckets / 2;
    let data = normal_vec(d_head * n_rounds * half, seed);
    Tensor::from_data(TensorData::new(data, [d_head, n_rounds, half]), device)
}

/// An inverted-dropout mask (`0` or `1 / (1 - p)`) of `shape` drawn from `seed`
/// ([`memzoo_fused::dropout::mask_values`]), or `None` when `p == 0`.
///
/// Drawn on the host on every backend (the same mask on each). A device that is not the host
/// CPU receives it packed, one bit an element ([`memzoo_fused::dropout::keep_words`]), and
/// rebuilds the values itself ([`mask_from_keep_words`]): 32 times fewer bytes to copy than
/// the `f32` mask (for the Reformer's enwik8 model, 537 MB a layer and pass).
pub fn dropout_mask<const D: usize>(
    shape: [usize; D],
    p: f64,
    seed: u64,
    device: &Device,
) -> Option<Tensor<D>> {
    if p <= 0.0 {
        return None;
    }
    let n: usize = shape.iter().product();
    if memzoo_backend::is_host_cpu(device) {
        let data = memzoo_fused::dropout::mask_values(n, p, seed);
        return Some(Tensor::from_data(TensorData::new(data, shape), device));
    }
    let words = memzoo_fused::dropout::keep_words(n, p, seed);
    Some(mask_from_keep_words(&words, shape, p, device))
}

/// The inverted-dropout mask of `shape` whose element `i` keeps (`1 / (1 - p)`, the value
/// [`memzoo_fused::dropout::mask_values`] gives, as an `f32`) where bit `i % 32` of
/// `words[i / 32]` is set, else `0`: the words go to `device` as they are, and the bits are
/// read there, `(w >> j) & 1` (an arithmetic shift of the sign-extended word reads the same
/// low 32 bits).
///
/// # Shapes
/// - `words`: `⌈n / 32⌉` with `n` the product of `shape`
/// - output: `shape`
pub fn mask_from_keep_words<const D: usize>(
    words: &[u32],
    shape: [usize; D],
    p: f64,
    device: &Device,
) -> Tensor<D> {
    let n: usize = shape.iter().product();
    if p >= 1.0 {
        // Every element dropped (and `0 · ∞` would be NaN).
        return Tensor::zeros(shape, device);
    }
    let w = words.len();
    debug_assert_eq!(w, n.div_ceil(32), "one word per 32 elements");
    let words: Vec<i32> = words.iter().map(|&x| x as i32).collect();
    let words = Tensor::<1, Int>::from_data(TensorData::new(words, [w]), device);
    let shifts = memzoo_backend::index_range(32, device)
        .reshape([1, 32])
        .cast(words.dtype());
    let keep = (1.0 / (1.0 - p)) as f32;
    words
        .reshape([w, 1])
        .expand([w, 32])
        .bitwise_right_shift(shifts.expand([w, 32]))
        .bitwise_and_scalar(1)
        .reshape([w * 32])
        .slice(0..n)
        .float()
        .mul_scalar(keep)
        .reshape(shape)
}

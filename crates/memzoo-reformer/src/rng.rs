//! Explicit, seeded randomness.
//!
//! Everything random inside a Reformer layer (hash rotations, dropout masks) is drawn on the host
//! from a seed derived from `(step seed, layer, purpose)`, so the reversible backward pass can
//! replay exactly the masks and rotations of the forward pass.

use burn::tensor::{Device, Tensor, TensorData};
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
    let data = memzoo_fused::dropout::mask_values(n, p, seed);
    Some(Tensor::from_data(TensorData::new(data, shape), device))
}

//! Keys and recall for the memory's tests and for the benchmarks (`cargo xtask bench memory`,
//! which times them).
//!
//! Keys are drawn from [`clustered_keys`], a mixture of Gaussians around random unit
//! centroids, normalised: attention keys cluster (by token type, position, head role) far more
//! than isotropic random vectors, which are HNSW's worst case. Values carry each entry's id in
//! their first component so that recall can be read off a [`Retrieved`].

use burn::tensor::{Device, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::MemoryError;
use crate::{KnnIndex, Retrieved};

/// `n` unit vectors of `d` dims: `clusters` random unit centroids plus Gaussian noise of
/// standard deviation `spread / sqrt(d)` per component, then normalised. `clusters = 0` gives
/// isotropic random unit vectors.
pub fn clustered_keys(n: usize, d: usize, clusters: usize, spread: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut gauss = move || {
        // Box-Muller
        let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random::<f32>());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    };
    let normalise = |v: &mut [f32]| {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        v.iter_mut().for_each(|x| *x /= n);
    };
    let mut centroids = vec![0.0f32; clusters * d];
    for c in centroids.chunks_mut(d.max(1)) {
        c.iter_mut().for_each(|x| *x = gauss());
        normalise(c);
    }
    let noise = if clusters == 0 {
        1.0
    } else {
        spread / (d as f32).sqrt()
    };
    let mut out = vec![0.0f32; n * d];
    let mut pick = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    for v in out.chunks_mut(d) {
        let c = if clusters == 0 {
            None
        } else {
            Some(pick.random_range(0..clusters))
        };
        for (j, x) in v.iter_mut().enumerate() {
            let base = c.map_or(0.0, |c| centroids[c * d + j]);
            *x = base + noise * gauss();
        }
        normalise(v);
    }
    out
}

/// Adds `stored` entries to every (row, kv head) of `index`, in segments of `segment` tokens.
/// Keys come from `keys` (`[n, d]`, cycled); entry `i`'s value is `[i, 0, …]`.
pub fn fill(
    index: &mut dyn KnnIndex,
    keys: &[f32],
    stored: usize,
    segment: usize,
    device: &Device,
) -> Result<(), MemoryError> {
    let (b, h, d) = (
        index.batch(),
        index.config().kv_heads(),
        index.config().d_head,
    );
    let n = keys.len() / d;
    let mut done = 0;
    while done < stored {
        let t = segment.min(stored - done);
        let (k, v) = segment_tensors(keys, n, done, t, b, h, d, device);
        index.add(k, v)?;
        done += t;
    }
    Ok(())
}

/// Keys and values `[b, t, h, d]` of entries `first..first + t` (same entries in every row
/// and head, keys taken cyclically from `keys`).
#[allow(clippy::too_many_arguments)]
pub fn segment_tensors(
    keys: &[f32],
    n: usize,
    first: usize,
    t: usize,
    b: usize,
    h: usize,
    d: usize,
    device: &Device,
) -> (Tensor<4>, Tensor<4>) {
    let mut k = Vec::with_capacity(b * t * h * d);
    let mut v = vec![0.0f32; b * t * h * d];
    for _ in 0..b {
        for i in 0..t {
            let id = first + i;
            let src = (id % n) * d;
            for _ in 0..h {
                k.extend_from_slice(&keys[src..src + d]);
            }
        }
    }
    for (o, chunk) in v.chunks_mut(d).enumerate() {
        chunk[0] = ((o / h) % t + first) as f32;
    }
    let shape = [b, t, h, d];
    (
        Tensor::from_data(TensorData::new(k, shape), device),
        Tensor::from_data(TensorData::new(v, shape), device),
    )
}

/// The entry ids in a [`Retrieved`] filled by [`fill`] (`-1` for empty slots),
/// `[batch, tokens, heads, k]` row-major.
pub fn retrieved_ids(r: &Retrieved) -> Vec<i64> {
    let [b, t, h, k, d] = r.values.dims();
    let v = r
        .values
        .clone()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32");
    // Through integers: a device stores its booleans in its own width (`u32` on CubeCL).
    let m = r
        .mask
        .clone()
        .int()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .expect("i64");
    (0..b * t * h * k)
        .map(|i| {
            if m[i] != 0 {
                -1
            } else {
                v[i * d].round() as i64
            }
        })
        .collect()
}

/// Mean recall@k of `approx` against `exact` (id sets per query, order ignored).
pub fn recall(approx: &[i64], exact: &[i64], k: usize) -> f64 {
    let mut hit = 0usize;
    let mut total = 0usize;
    for (a, e) in approx.chunks(k).zip(exact.chunks(k)) {
        let want: Vec<i64> = e.iter().copied().filter(|&x| x >= 0).collect();
        total += want.len();
        hit += a.iter().filter(|x| want.contains(x)).count();
    }
    if total == 0 {
        1.0
    } else {
        hit as f64 / total as f64
    }
}

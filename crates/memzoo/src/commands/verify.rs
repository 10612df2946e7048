//! `memzoo devices --verify DEVICE`: large-shape operations on a device against answers
//! computed on the host, at the sizes the papers' presets reach.
//!
//! Small tensors agree across backends (the parity tests); some of Burn 0.22.1's CubeCL kernels
//! do not past 65,535 elements along a dimension, at least on Mesa's software drivers (lavapipe
//! and llvmpipe; `docs/backends.md`): `arange` stops at 65,534, a top 32 of 65,536 slots never
//! returns the last ones, and some reductions skip elements. memzoo works around the ones its
//! models use (its index ranges, the kNN search's blocks, the Reformer's device sort, whose
//! checks here must pass); the others are reported so that a GPU's answers are known.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::error::CliError;

/// Whose operation a check runs, and whether memzoo's models run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// memzoo's own (its workarounds): must be right on every device.
    Memzoo,
    /// Burn's, as memzoo's models use it (a failure makes them wrong on this device).
    BurnUsed,
    /// Burn's, which memzoo's models no longer use (reported for Burn's sake).
    BurnAvoided,
}

/// One check's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// What was computed, with its shape.
    pub check: String,
    /// Whose operation it is.
    pub role: Role,
    /// `None` when the device's answer is the host's; else the first difference.
    pub difference: Option<String>,
}

/// The first index where `got` and `want` differ beyond `tol` (relative to `want`'s scale).
fn first_difference(got: &[f64], want: &[f64], tol: f64) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} values, not {}", got.len(), want.len()));
    }
    (0..got.len())
        .find(|&i| (got[i] - want[i]).abs() > tol * want[i].abs().max(1.0))
        .map(|i| format!("at {i}: {} instead of {}", got[i], want[i]))
}

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    let v = t
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_default();
    v.into_iter().map(f64::from).collect()
}

fn ints<const D: usize>(t: Tensor<D, Int>) -> Vec<f64> {
    let v = t
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .unwrap_or_default();
    v.into_iter().map(|x| x as f64).collect()
}

/// `rows` rows of `len` values `(i mod 7) - 3`, each ending in `100` (a maximum at the tail).
fn ramp(rows: usize, len: usize) -> Vec<f32> {
    (0..rows * len)
        .map(|i| {
            if (i + 1) % len == 0 {
                100.0
            } else {
                (i % 7) as f32 - 3.0
            }
        })
        .collect()
}

/// Every check on `device`.
pub fn verify(device: &Device) -> Vec<Verdict> {
    let mut out = Vec::new();
    let mut record = |check: String, role: Role, difference: Option<String>| {
        out.push(Verdict {
            check,
            role,
            difference,
        })
    };
    let n = 131_072;
    let want: Vec<f64> = (0..n).map(|i| i as f64).collect();
    record(
        format!("memzoo_backend::index_range({n})"),
        Role::Memzoo,
        first_difference(&ints(memzoo_backend::index_range(n, device)), &want, 0.0),
    );
    record(
        format!("Burn's arange(0..{n})"),
        Role::BurnAvoided,
        first_difference(&ints(Tensor::arange(0..n as i64, device)), &want, 0.0),
    );

    // Reductions: long rows, many short rows, and the presets' weights (xl-enwik8-base's
    // feed-forward, reformer-enwik8's).
    for dims in [
        [1, 1_000_003],
        [1, 65_535],
        [2_048, 512],
        [4_096, 1_024],
        [70_000, 16],
    ] {
        let [m, c] = dims;
        let v = ramp(m, c);
        let t = Tensor::<2>::from_data(TensorData::new(v.clone(), dims), device);
        let total: f64 = v.iter().map(|&x| f64::from(x)).sum();
        let squares: f64 = v.iter().map(|&x| f64::from(x).powi(2)).sum();
        let rows: Vec<f64> = v
            .chunks(c)
            .map(|r| r.iter().map(|&x| f64::from(x)).sum())
            .collect();
        let maxima: Vec<f64> = v
            .chunks(c)
            .map(|r| f64::from(r.iter().cloned().fold(f32::MIN, f32::max)))
            .collect();
        let sum = floats(t.clone().sum());
        let sq = floats(t.clone().powi_scalar(2).sum());
        record(
            format!("sum of {dims:?}"),
            Role::BurnUsed,
            first_difference(&sum, &[total], 1e-4),
        );
        record(
            format!("sum of squares of {dims:?} (the gradient norm's)"),
            Role::BurnUsed,
            first_difference(&sq, &[squares], 1e-4),
        );
        record(
            format!("sum_dim(1) of {dims:?}"),
            Role::BurnUsed,
            first_difference(&floats(t.clone().sum_dim(1)), &rows, 1e-4),
        );
        record(
            format!("max_dim(1) of {dims:?}"),
            Role::BurnUsed,
            first_difference(&floats(t.max_dim(1)), &maxima, 0.0),
        );
    }

    // The LSH hash's argmax over many rows (reformer-enwik8 hashes 8 x 65,536 x 2 rows).
    let (m, c) = (131_072, 64);
    let v: Vec<f32> = (0..m * c)
        .map(|i| ((i * 7_919) % 10_007) as f32 / 10_007.0)
        .collect();
    let want: Vec<f64> = v
        .chunks(c)
        .map(|r| (0..c).fold(0, |b, j| if r[j] > r[b] { j } else { b }) as f64)
        .collect();
    let t = Tensor::<2>::from_data(TensorData::new(v, [m, c]), device);
    record(
        format!("argmax(1) of [{m}, {c}] (the LSH hash's)"),
        Role::BurnUsed,
        first_difference(&ints(t.argmax(1)), &want, 0.0),
    );

    // The loss's mean over the presets' targets: xl-enwik8-base's 22 x 512, reformer-enwik8's
    // 65,536 a row (8 rows: a batch of 8), block-recurrent-paper's 32 x 4,096.
    for dims in [[22, 512], [8, 65_536], [32, 4_096]] {
        let [m, c] = dims;
        let v = ramp(m, c);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / (m * c) as f64;
        let t = Tensor::<2>::from_data(TensorData::new(v, dims), device);
        record(
            format!("mean of {dims:?} (a loss's)"),
            Role::BurnUsed,
            first_difference(&floats(t.mean()), &[mean], 1e-4),
        );
    }

    // Top 32 of a full kNN store (memorizing-paper: 65,536 slots), Burn's and memzoo's.
    let (rows, slots, k) = (8, 65_536, 32);
    let v = ramp(rows, slots);
    let want_top = vec![(slots - 1) as f64; rows];
    let t = Tensor::<2>::from_data(TensorData::new(v, [rows, slots]), device);
    let (_, idx) = t.topk_with_indices(k, 1);
    let firsts: Vec<f64> = ints(idx).chunks(k).map(|c| c[0]).collect();
    record(
        format!("Burn's top {k} of [{rows}, {slots}] (the best's index)"),
        Role::BurnAvoided,
        first_difference(&firsts, &want_top, 0.0),
    );
    record(
        "the kNN memory's device search over 70,000 keys (naive top 32)".into(),
        Role::Memzoo,
        knn_search_difference(device),
    );

    // The Reformer's device bucket sort at reformer-enwik8's size.
    let (rows, len, values) = (8, 131_072, 1_024);
    let mut rng = StdRng::seed_from_u64(5);
    let keys: Vec<i64> = (0..rows * len)
        .map(|_| rng.random_range(0..values as i64))
        .collect();
    let want: Vec<f64> = keys
        .chunks(len)
        .flat_map(|r| {
            let mut idx: Vec<usize> = (0..len).collect();
            idx.sort_by_key(|&i| r[i]);
            idx.into_iter().map(|i| i as f64)
        })
        .collect();
    let t = Tensor::<2, Int>::from_data(TensorData::new(keys, [rows, len]), device);
    record(
        format!("the Reformer's device bucket sort of [{rows}, {len}] keys below {values}"),
        Role::Memzoo,
        first_difference(
            &ints(memzoo_reformer::order::stable_order(t, values)),
            &want,
            0.0,
        ),
    );
    out
}

/// The first query whose device search misses one of its naive top 32 (an exact store with
/// the top-k on the device, 70,000 clustered keys of width 16), `None` when none does.
fn knn_search_difference(device: &Device) -> Option<String> {
    use memzoo_memory::keys::{clustered_keys, retrieved_ids, segment_tensors};
    use memzoo_memory::{IndexKind, KnnMemoryConfig, TopkPlacement};
    let (n, d, t, k) = (70_000, 16, 4, 32);
    let keys = clustered_keys(n, d, 8, 0.5, 21);
    let queries = clustered_keys(t, d, 8, 0.5, 22);
    let mut index = match KnnMemoryConfig::new(1, d)
        .with_kind(IndexKind::Exact)
        .with_topk(TopkPlacement::Device)
        .with_max_memories(1 << 17)
        .init(1, device)
    {
        Ok(index) => index,
        Err(e) => return Some(format!("no store: {e}")),
    };
    let (kt, vt) = segment_tensors(&keys, n, 0, n, 1, 1, d, device);
    let q = Tensor::<4>::from_data(TensorData::new(queries.clone(), [1, t, 1, d]), device);
    let found = match index.add(kt, vt).and_then(|_| index.search(q, k)) {
        Ok(r) => retrieved_ids(&r),
        Err(e) => return Some(format!("search failed: {e}")),
    };
    for (qi, q) in queries.chunks(d).enumerate() {
        let mut scored: Vec<(f32, i64)> = keys
            .chunks(d)
            .zip(0..)
            .map(|(key, i)| (key.iter().zip(q).map(|(a, b)| a * b).sum(), i))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut want: Vec<i64> = scored[..k].iter().map(|&(_, i)| i).collect();
        let mut got = found[qi * k..(qi + 1) * k].to_vec();
        want.sort_unstable();
        got.sort_unstable();
        if got != want {
            let missing: Vec<i64> = want.into_iter().filter(|i| !got.contains(i)).collect();
            return Some(format!("query {qi} misses {missing:?}"));
        }
    }
    None
}

/// `memzoo devices --verify DEVICE`: [`verify`], one line a check (or JSON). An error when a
/// check memzoo's models depend on fails.
pub fn devices_verify(device_name: &str, json: bool) -> Result<(), CliError> {
    let device = super::device(device_name)?;
    let verdicts = verify(&device);
    if json {
        println!(
            "{}",
            serde_json::json!({"device": device_name, "checks": verdicts})
        );
    } else {
        println!("large-shape operations on {device_name} against the host:");
        for v in &verdicts {
            let result = match &v.difference {
                None => "ok".to_string(),
                Some(d) => format!("WRONG ({d})"),
            };
            let whose = match v.role {
                Role::Memzoo => " [memzoo's]",
                Role::BurnUsed => "",
                Role::BurnAvoided => " [Burn's; memzoo works around it]",
            };
            println!("  {:70} {result}{whose}", v.check);
        }
    }
    let broken: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.role != Role::BurnAvoided && v.difference.is_some())
        .map(|v| v.check.as_str())
        .collect();
    if broken.is_empty() {
        Ok(())
    } else {
        Err(CliError::DeviceFailed {
            device: device_name.to_string(),
            doing: "verifying large-shape operations",
            message: format!("wrong results: {}", broken.join("; ")),
        })
    }
}

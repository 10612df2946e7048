//! Rotary positions with xPos scaling, and qk-RMSNorm: the attention of
//! block-recurrent-transformer-pytorch's layers.
//!
//! **Rotary positions** (Su et al. 2021, arXiv 2104.09864): a query or key `x` at position `t`
//! is rotated in `d_head / 2` planes, `rot(x, t) = x ⊙ cos(t θ) + rotate_half(x) ⊙ sin(t θ)`,
//! with `θ_k = base^(−2k / d_head)` (the frequencies repeated for the two halves) and
//! `rotate_half([x_1; x_2]) = [−x_2; x_1]`, so `rot(q, i)·rot(k, j)` depends on `i − j` alone.
//!
//! **xPos** (Sun et al. 2022, arXiv 2212.10554): the query is also scaled by `ζ^(t / γ)` and the
//! key by `ζ^(−t / γ)` per plane, `ζ_k = (2k + 0.4 d_head) / (1.4 d_head)` and `γ` the scale
//! base, so that the product decays with the distance `(i − j) / γ`. The exponent is centred,
//! `t − width / 2` (as the peer computes it; the centre cancels in every product).
//!
//! Positions: `klen` keys (memory then segment) sit at `width − klen .. width` and the `qlen`
//! queries at the last `qlen` of those (`width = klen` unless given: the peer's `2 ×
//! block_width`), the same relative positions whatever `width` is.
//!
//! **qk-RMSNorm** (the peer's `qk_rmsnorm`; ViT-22B's qk-normalisation): queries and keys are
//! l2-normalised per head, `q̂ = q / max(‖q‖, 1e-12) ⊙ g_q`, `k̂ = k / max(‖k‖, 1e-12) ⊙ g_k`
//! (learned gains `g_q`, `g_k` of `d_head`, starting at 1), before the rotation, and the
//! scores are `s q̂·k̂` with a fixed scale `s` (ViT-22B's learned-temperature-free form; the
//! peer's 0.4.4 computes `s = 1 / sqrt(d_head)`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{Device, Tensor, TensorData};

/// The learned gains of qk-RMSNorm (see the module docs) and its fixed score scale.
///
/// # Shapes
/// - `query`, `key`: `[d_head]`
#[derive(Module, Debug)]
pub struct QkNorm {
    /// `g_q`, the queries' gain per dimension.
    pub query: Param<Tensor<1>>,
    /// `g_k`, the keys' gain per dimension.
    pub key: Param<Tensor<1>>,
    /// `s`, the scale of the scores (replacing `1 / sqrt(d_head)`).
    pub scale: f64,
}

impl QkNorm {
    /// Gains of 1 for heads of `d_head`, scores scaled by `scale`.
    pub fn new(d_head: usize, scale: f64, device: &Device) -> Self {
        Self {
            query: Initializer::Ones.init([d_head], device),
            key: Initializer::Ones.init([d_head], device),
            scale,
        }
    }

    /// `(q / max(‖q‖, 1e-12) ⊙ g_q, k / max(‖k‖, 1e-12) ⊙ g_k)`, per head and position.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`, `k`: `[batch, heads, klen, d_head]` → the same
    pub fn normalise(&self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let gain = |p: &Param<Tensor<1>>| p.val().unsqueeze_dims::<4>(&[0, 1, 2]);
        (l2norm(q) * gain(&self.query), l2norm(k) * gain(&self.key))
    }
}

/// `x / max(‖x‖, 1e-12)` over the last dimension (PyTorch's `F.normalize`).
///
/// # Shapes
/// - `x`: `[..., d]` → the same
pub fn l2norm<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let norm = x
        .clone()
        .powi_scalar(2)
        .sum_dim(D - 1)
        .sqrt()
        .clamp_min(1e-12);
    x / norm
}

/// The rotation and xPos scale of each key position (see the module docs), folded into two
/// tables per side so that a rotation is two products and a sum:
///
/// `rot(x, t) ζ^(±t/γ) = x ⊙ (cos(tθ) ζ^(±t/γ)) + swap(x) ⊙ (±sin(tθ) ζ^(±t/γ))`,
///
/// with `swap([x_1; x_2]) = [x_2; x_1]` and the sign `−` on the first half (so that
/// `swap(x) ⊙ ±sin = rotate_half(x) ⊙ sin`). The queries' tables also hold the scores' scale `s`.
///
/// # Shapes
/// - `query_cos`, `query_sin`, `key_cos`, `key_sin`: `[klen, d_head]` (row `j` is key `j`; the
///   queries take the last `qlen` rows)
#[derive(Debug, Clone)]
pub struct RotaryTables {
    /// `cos(t θ) ζ^((t − width/2) / γ) s` per position, for the queries.
    pub query_cos: Tensor<2>,
    /// `±sin(t θ) ζ^((t − width/2) / γ) s` per position, for the queries.
    pub query_sin: Tensor<2>,
    /// `cos(t θ) ζ^(−(t − width/2) / γ)` per position, for the keys.
    pub key_cos: Tensor<2>,
    /// `±sin(t θ) ζ^(−(t − width/2) / γ)` per position, for the keys.
    pub key_sin: Tensor<2>,
}

/// What [`RotaryTables::new`] builds its tables from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotarySpec {
    /// The width of a head (even).
    pub d_head: usize,
    /// The number of keys (memory then segment).
    pub klen: usize,
    /// The keys sit at positions `width − klen .. width` (`None`: `klen`).
    pub width: Option<usize>,
    /// The frequency base `base` of `θ_k = base^(−2k / d_head)`.
    pub theta: f64,
    /// The xPos scale base `γ` (`None`: no xPos scaling, `ζ^… = 1`).
    pub xpos: Option<f64>,
    /// The scores' scale `s`, folded into the queries' tables.
    pub query_scale: f64,
}

impl RotaryTables {
    /// The tables of `spec` (see [`RotarySpec`]) on `device`.
    ///
    /// The host's values are computed once per spec and kept (a pass builds its tables again,
    /// and generation runs a pass per token: the `cos`, `sin` and `powf` of every entry were
    /// 29% of a Block-Recurrent token).
    pub fn new(spec: RotarySpec, device: &Device) -> Self {
        let tables = host_tables(spec);
        let t = |v: &[f32]| {
            Tensor::<2>::from_data(
                TensorData::new(v.to_vec(), [spec.klen, spec.d_head]),
                device,
            )
        };
        let [query_cos, query_sin, key_cos, key_sin] = &*tables;
        Self {
            query_cos: t(query_cos),
            query_sin: t(query_sin),
            key_cos: t(key_cos),
            key_sin: t(key_sin),
        }
    }

    /// `rot(q, i) ζ^(i/γ) s` and `rot(k, j) ζ^(−j/γ)`: the queries at the last `qlen` positions.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, qlen, d_head]`, `k`: `[batch, heads, klen, d_head]` → the same
    pub fn apply(&self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let qlen = q.dims()[2];
        let klen = self.key_cos.dims()[0];
        let rows = |t: &Tensor<2>, from: usize, n: usize| {
            t.clone().narrow(0, from, n).unsqueeze_dims::<4>(&[0, 1])
        };
        let at = |x: Tensor<4>, cos: &Tensor<2>, sin: &Tensor<2>, from: usize, n: usize| {
            x.clone() * rows(cos, from, n) + swap_halves(x) * rows(sin, from, n)
        };
        (
            at(q, &self.query_cos, &self.query_sin, klen - qlen, qlen),
            at(k, &self.key_cos, &self.key_sin, 0, klen),
        )
    }
}

/// The four tables of [`RotaryTables`] for `spec` (row-major `[klen, d_head]`), computed once
/// per spec and kept for the process (at most [`KEPT_TABLES`] specs; the lot is dropped when
/// full).
fn host_tables(spec: RotarySpec) -> Arc<[Vec<f32>; 4]> {
    type Key = (usize, usize, Option<usize>, u64, Option<u64>, u64);
    type Kept = Mutex<HashMap<Key, Arc<[Vec<f32>; 4]>>>;
    static KEPT: OnceLock<Kept> = OnceLock::new();
    let RotarySpec {
        d_head,
        klen,
        width,
        theta,
        xpos,
        query_scale,
    } = spec;
    let key = (
        d_head,
        klen,
        width,
        theta.to_bits(),
        xpos.map(f64::to_bits),
        query_scale.to_bits(),
    );
    let kept = KEPT.get_or_init(Default::default);
    if let Some(t) = kept.lock().ok().and_then(|k| k.get(&key).cloned()) {
        return t;
    }
    let width = width.unwrap_or(klen) as i64;
    let half = d_head / 2;
    let mut tables: [Vec<f32>; 4] = Default::default();
    for j in 0..klen as i64 {
        let t = (width - klen as i64 + j) as f64;
        let power = (t - (width / 2) as f64) / xpos.unwrap_or(1.0);
        for c in 0..d_head {
            // The peer's frequencies, cat(freqs, freqs): plane `k = c mod d_head/2`.
            let k = (c % half) as f64;
            let inv_freq = 1.0 / theta.powf(2.0 * k / d_head as f64);
            let (sin, cos) = (t * inv_freq).sin_cos();
            // rotate_half's sign: its first half is −x_2.
            let sin = if c < half { -sin } else { sin };
            let zeta = (2.0 * k + 0.4 * d_head as f64) / (1.4 * d_head as f64);
            let scale = match xpos {
                Some(_) => zeta.powf(power),
                None => 1.0,
            };
            let query = scale * query_scale;
            tables[0].push((cos * query) as f32);
            tables[1].push((sin * query) as f32);
            tables[2].push((cos / scale) as f32);
            tables[3].push((sin / scale) as f32);
        }
    }
    let tables = Arc::new(tables);
    if let Ok(mut k) = kept.lock() {
        if k.len() >= KEPT_TABLES {
            k.clear();
        }
        k.insert(key, tables.clone());
    }
    tables
}

/// The most specs whose rotary tables [`host_tables`] keeps.
const KEPT_TABLES: usize = 512;

/// `[x_1; x_2] ↦ [x_2; x_1]` over the last dimension (halves of `d_head / 2`).
///
/// # Shapes
/// - `x`: `[..., d_head]` → the same
fn swap_halves<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let d = x.dims()[D - 1];
    let x1 = x.clone().narrow(D - 1, 0, d / 2);
    let x2 = x.narrow(D - 1, d / 2, d - d / 2);
    Tensor::cat(vec![x2, x1], D - 1)
}

/// `[x_1; x_2] ↦ [−x_2; x_1]` over the last dimension (halves of `d_head / 2`).
///
/// # Shapes
/// - `x`: `[..., d_head]` → the same
pub fn rotate_half<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let d = x.dims()[D - 1];
    let x1 = x.clone().narrow(D - 1, 0, d / 2);
    let x2 = x.narrow(D - 1, d / 2, d - d / 2);
    Tensor::cat(vec![x2.neg(), x1], D - 1)
}

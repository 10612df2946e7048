//! Chunked position-wise feed-forward and axial position embeddings (Kitaev et al. 2020, sec. 3
//! "Chunking"; axial positions as in trax's `AxialPositionalEncoding`).

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use memzoo_fused::gelu;

use crate::error::ReformerError;

/// Configuration of a [`ChunkedFeedForward`].
#[derive(Config, Debug)]
pub struct ChunkedFeedForwardConfig {
    /// Width of input and output.
    pub d_model: usize,
    /// Inner width.
    pub d_ff: usize,
    /// Positions processed at once; `0`: the whole sequence. Default: 512.
    #[config(default = 512)]
    pub chunk_len: usize,
    /// Initialiser of the weights (the biases start at zero, as HF's Reformer). Default:
    /// normal(0, 0.02).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl ChunkedFeedForwardConfig {
    /// Initialises the layer after checking the widths.
    pub fn init(&self, device: &Device) -> Result<ChunkedFeedForward, ReformerError> {
        if self.d_model == 0 || self.d_ff == 0 {
            return Err(ReformerError::Config(format!(
                "feed-forward widths must be positive, got d_model {} and d_ff {}",
                self.d_model, self.d_ff
            )));
        }
        let linear = |i, o| {
            let mut l = LinearConfig::new(i, o)
                .with_initializer(self.initializer.clone())
                .init(device);
            l.bias = l.bias.map(|_| Initializer::Zeros.init([o], device));
            l
        };
        Ok(ChunkedFeedForward {
            inner: linear(self.d_model, self.d_ff),
            outer: linear(self.d_ff, self.d_model),
            chunk_len: self.chunk_len,
        })
    }
}

/// `FF(x) = W_2 GELU(W_1 x + b_1) + b_2`, computed `chunk_len` positions at a time so the
/// `[batch, len, d_ff]` activation never exists for the whole sequence (sec. 3).
///
/// # Shapes
/// - `x`: `[batch, len, d_model]`
/// - output: `[batch, len, d_model]`
#[derive(Module, Debug)]
pub struct ChunkedFeedForward {
    /// `W_1, b_1`: `d_model -> d_ff`.
    pub inner: Linear,
    /// `W_2, b_2`: `d_ff -> d_model`.
    pub outer: Linear,
    /// Positions per chunk (`0`: all).
    pub chunk_len: usize,
}

impl ChunkedFeedForward {
    /// The feed-forward of a single chunk (no chunking).
    pub fn forward_chunk(&self, x: Tensor<3>) -> Tensor<3> {
        self.outer.forward(gelu(self.inner.forward(x)))
    }

    /// The feed-forward of the whole sequence, chunk by chunk.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        chunked(x, self.chunk_len, |c, _| self.forward_chunk(c))
    }
}

/// A position-wise `f` applied `chunk_len` positions at a time (`0`: all at once), so its
/// inner activations never exist for the whole sequence (Kitaev et al. 2020, sec. 3
/// "Chunking"). `f(chunk, positions)` also gets the chunk's positions (to slice a mask).
///
/// # Shapes
/// - `x`: `[batch, len, d]` → `[batch, len, d_out]`
pub fn chunked(
    x: Tensor<3>,
    chunk_len: usize,
    f: impl Fn(Tensor<3>, std::ops::Range<usize>) -> Tensor<3>,
) -> Tensor<3> {
    let l = x.dims()[1];
    if chunk_len == 0 || l <= chunk_len {
        return f(x, 0..l);
    }
    let parts = x
        .split(chunk_len, 1)
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let s = i * chunk_len;
            let e = s + c.dims()[1];
            f(c, s..e)
        })
        .collect();
    Tensor::cat(parts, 1)
}

/// Configuration of an [`AxialPositionalEmbedding`].
#[derive(Config, Debug)]
pub struct AxialPositionalEmbeddingConfig {
    /// The factorisation `(a_1, a_2)` of the position grid; `a_1 * a_2` bounds the length.
    pub shape: [usize; 2],
    /// Widths `(d_1, d_2)` of the two tables; their concatenation has `d_1 + d_2 = d_model`.
    pub dims: [usize; 2],
    /// Initialiser of the tables (`ReformerConfig` sets it to the token embedding's scale, see
    /// `ReformerConfig::axial_std`). Default: normal(0, 1), as trax and HF.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 1.0 }")]
    pub initializer: Initializer,
    /// Sum the two tables instead of concatenating them: position `p = i a_2 + j` gets
    /// `E_1[i] + E_2[j]`, both `d_model` wide (`dims = [d_model, d_model]`; reformer-pytorch's
    /// default, `axial_positional_embedding` with no `axial_dims`). Default: false.
    #[config(default = false)]
    pub summed: bool,
}

impl AxialPositionalEmbeddingConfig {
    /// Initialises the tables after checking the shape.
    pub fn init(&self, device: &Device) -> Result<AxialPositionalEmbedding, ReformerError> {
        if self.shape.contains(&0) || self.dims.contains(&0) {
            return Err(ReformerError::Config(format!(
                "axial shape {:?} and dims {:?} must be positive",
                self.shape, self.dims
            )));
        }
        if self.summed && self.dims[0] != self.dims[1] {
            return Err(ReformerError::Config(format!(
                "summed axial tables have one width, got dims {:?}",
                self.dims
            )));
        }
        Ok(AxialPositionalEmbedding {
            rows: self.initializer.init([self.shape[0], self.dims[0]], device),
            cols: self.initializer.init([self.shape[1], self.dims[1]], device),
            summed: self.summed,
        })
    }
}

/// Axial position embeddings: position `p = i a_2 + j` gets `cat(E_1[i], E_2[j])`, so
/// `a_1 d_1 + a_2 d_2` parameters cover `a_1 a_2` positions.
///
/// # Shapes
/// - output of [`forward`](Self::forward): `[1, len, d_1 + d_2]`
#[derive(Module, Debug)]
pub struct AxialPositionalEmbedding {
    /// `E_1`: `[a_1, d_1]`.
    pub rows: Param<Tensor<2>>,
    /// `E_2`: `[a_2, d_2]`.
    pub cols: Param<Tensor<2>>,
    /// `E_1[i] + E_2[j]` (`d_1 = d_2`) instead of `cat(E_1[i], E_2[j])`.
    pub summed: bool,
}

impl AxialPositionalEmbedding {
    /// Positions `0..len` covered by the grid.
    pub fn max_len(&self) -> usize {
        self.rows.dims()[0] * self.cols.dims()[0]
    }

    /// The embeddings of positions `0..len`; `len` must not exceed [`max_len`](Self::max_len).
    pub fn forward(&self, len: usize) -> Result<Tensor<3>, ReformerError> {
        let [a1, d1] = self.rows.dims();
        let [a2, d2] = self.cols.dims();
        if len > a1 * a2 {
            return Err(ReformerError::Input(format!(
                "sequence length {len} exceeds the axial position grid {a1} x {a2} = {}",
                a1 * a2
            )));
        }
        let rows = self.rows.val().reshape([a1, 1, d1]).expand([a1, a2, d1]);
        let cols = self.cols.val().reshape([1, a2, d2]).expand([a1, a2, d2]);
        let grid = if self.summed {
            (rows + cols).reshape([1, a1 * a2, d1])
        } else {
            Tensor::cat(vec![rows, cols], 2).reshape([1, a1 * a2, d1 + d2])
        };
        Ok(grid.slice([0..1, 0..len]))
    }
}

use burn::tensor::Tensor;

use super::{dev, rand_tensor, to_vec};
use crate::feedforward::{AxialPositionalEmbeddingConfig, ChunkedFeedForwardConfig};

#[test]
fn chunked_feed_forward_equals_unchunked() {
    let device = dev();
    let ff = ChunkedFeedForwardConfig::new(8, 24)
        .with_chunk_len(3)
        .with_initializer(burn::nn::Initializer::Normal {
            mean: 0.0,
            std: 0.5,
        })
        .init(&device)
        .unwrap();
    let x = rand_tensor([2, 10, 8], 1, &device);
    let chunked = to_vec(ff.forward(x.clone()));
    let whole = to_vec(ff.forward_chunk(x.clone()));
    // naive: W_2 gelu(W_1 x + b_1) + b_2, position by position with host loops
    let (w1, b1) = (
        to_vec(ff.inner.weight.val()),
        to_vec(ff.inner.bias.clone().unwrap().val()),
    );
    let (w2, b2) = (
        to_vec(ff.outer.weight.val()),
        to_vec(ff.outer.bias.clone().unwrap().val()),
    );
    let gelu_t = |v: Vec<f32>| {
        to_vec(burn::tensor::activation::gelu(Tensor::<1>::from_floats(
            v.as_slice(),
            &device,
        )))
    };
    let xv = to_vec(x);
    for p in 0..20 {
        let row = &xv[p * 8..(p + 1) * 8];
        let h: Vec<f32> = (0..24)
            .map(|j| b1[j] + (0..8).map(|i| row[i] * w1[i * 24 + j]).sum::<f32>())
            .collect();
        let h = gelu_t(h);
        for o in 0..8 {
            let want = b2[o] + (0..24).map(|j| h[j] * w2[j * 8 + o]).sum::<f32>();
            assert!(
                (chunked[p * 8 + o] - want).abs() < 1e-4,
                "pos {p} out {o}: {} vs {want}",
                chunked[p * 8 + o]
            );
            assert!((chunked[p * 8 + o] - whole[p * 8 + o]).abs() < 1e-6);
        }
    }
}

#[test]
fn axial_positions_concatenate_the_two_tables() {
    let device = dev();
    let axial = AxialPositionalEmbeddingConfig::new([3, 4], [2, 5])
        .init(&device)
        .unwrap();
    assert_eq!(axial.max_len(), 12);
    let out = axial.forward(10).unwrap();
    assert_eq!(out.dims(), [1, 10, 7]);
    let out = to_vec(out);
    let rows = to_vec(axial.rows.val());
    let cols = to_vec(axial.cols.val());
    for p in 0..10 {
        let (i, j) = (p / 4, p % 4);
        let want: Vec<f32> = rows[i * 2..i * 2 + 2]
            .iter()
            .chain(&cols[j * 5..j * 5 + 5])
            .cloned()
            .collect();
        assert_eq!(&out[p * 7..p * 7 + 7], want.as_slice(), "position {p}");
    }
    let err = axial.forward(13).unwrap_err().to_string();
    assert!(err.contains("13"), "{err}");
}

/// Summed axial positions (reformer-pytorch's default): position `p = i a_2 + j` gets
/// `E_1[i] + E_2[j]`, both tables `d_model` wide; tables of two widths are refused.
#[test]
fn summed_axial_positions_add_the_two_tables() {
    let device = dev();
    let axial = AxialPositionalEmbeddingConfig::new([3, 4], [5, 5])
        .with_summed(true)
        .init(&device)
        .unwrap();
    let out = axial.forward(10).unwrap();
    assert_eq!(out.dims(), [1, 10, 5]);
    let (out, rows, cols) = (
        to_vec(out),
        to_vec(axial.rows.val()),
        to_vec(axial.cols.val()),
    );
    for p in 0..10 {
        let (i, j) = (p / 4, p % 4);
        for c in 0..5 {
            assert_eq!(
                out[p * 5 + c],
                rows[i * 5 + c] + cols[j * 5 + c],
                "position {p}"
            );
        }
    }
    let err = AxialPositionalEmbeddingConfig::new([3, 4], [2, 5])
        .with_summed(true)
        .init(&device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[2, 5]"), "{err}");
}

//! Small helpers shared by the examples.

use burn::tensor::{Device, Int, Tensor, TensorData};

/// The value of `--name VALUE` on the command line, if given.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The device from `--device` (default `flex`), or exit with the error.
pub fn device_from_args() -> Device {
    let name = arg("--device").unwrap_or_else(|| "flex".into());
    memzoo::backend::parse_device(&name).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    })
}

/// Cuts a token stream into `batch` contiguous rows and yields `(inputs, targets)` segments of
/// `len` tokens, each row continuing where it stopped: the order recurrence needs.
pub fn ordered_segments(
    stream: &[u8],
    batch: usize,
    len: usize,
    device: &Device,
) -> Vec<(Tensor<2, Int>, Tensor<2, Int>)> {
    let row_len = (stream.len() - 1) / batch;
    let steps = row_len / len;
    (0..steps)
        .map(|s| {
            let mut x = Vec::with_capacity(batch * len);
            let mut y = Vec::with_capacity(batch * len);
            for r in 0..batch {
                let start = r * row_len + s * len;
                x.extend(stream[start..start + len].iter().map(|&b| b as i64));
                y.extend(stream[start + 1..start + len + 1].iter().map(|&b| b as i64));
            }
            (
                Tensor::from_data(TensorData::new(x, [batch, len]), device),
                Tensor::from_data(TensorData::new(y, [batch, len]), device),
            )
        })
        .collect()
}

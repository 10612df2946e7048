use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::dev;
use crate::order::{prefix_sum, stable_order};

/// Keys in `0..n_values` drawn from `seed`, the last of each row `n_values - 1` (the top bit
/// set).
fn keys(rows: usize, len: usize, n_values: usize, seed: u64) -> Vec<i64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<i64> = (0..rows * len)
        .map(|_| rng.random_range(0..n_values as i64))
        .collect();
    for r in 0..rows {
        out[r * len + len - 1] = n_values as i64 - 1;
    }
    out
}

fn int_tensor(v: Vec<i64>, rows: usize, len: usize) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(v, [rows, len]), &dev())
}

fn ints(t: Tensor<2, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
}

#[test]
fn prefix_sums_in_levels_equal_the_running_sum() {
    // One level, two (65 blocks), with and without padding to whole blocks.
    for (rows, len) in [(2, 1), (3, 64), (2, 65), (2, 4096), (3, 4_173)] {
        let x = keys(rows, len, 5, len as u64);
        let expected: Vec<i64> = x
            .chunks(len)
            .flat_map(|row| {
                row.iter().scan(0, |sum, v| {
                    *sum += v;
                    Some(*sum)
                })
            })
            .collect();
        let got = ints(prefix_sum(int_tensor(x, rows, len)));
        assert_eq!(got, expected, "rows {rows}, len {len}");
    }
}

#[test]
fn radix_order_is_the_stable_sort_by_key() {
    for (rows, len, n_values) in [
        (2, 5, 1),
        (3, 17, 2),
        (2, 64, 7),
        (2, 130, 1024),
        (3, 4_173, 300),
        (1, 8_192, 4_096),
    ] {
        let k = keys(rows, len, n_values, (rows * len + n_values) as u64);
        // The order a stable sort of the positions by key gives, row by row (Rust's `sort_by_key`
        // is stable).
        let expected: Vec<i64> = k
            .chunks(len)
            .flat_map(|row| {
                let mut idx: Vec<usize> = (0..len).collect();
                idx.sort_by_key(|&i| row[i]);
                idx.into_iter().map(|i| i as i64)
            })
            .collect();
        let got = ints(stable_order(int_tensor(k, rows, len), n_values));
        assert_eq!(got, expected, "rows {rows}, len {len}, {n_values} values");
    }
}

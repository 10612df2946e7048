//! `memzoo devices`: the device strings and which backends this binary has; with `--measure
//! DEVICE`, that device's float32 matrix-product rate at the shapes the papers' presets train
//! with, to set a run's tokens/s against (a model step is mostly these products).

use std::time::Instant;

use burn::tensor::{Distribution, Tensor};
use serde::Serialize;

use crate::error::CliError;

/// A product `[batch, m, k] x [batch, k, n]` and what it stands for.
#[derive(Clone, Debug)]
pub struct ProductShape {
    /// What the shape is.
    pub name: String,
    /// `[batch, m, k, n]`.
    pub dims: [usize; 4],
}

/// The shapes `memzoo devices --measure` times: the peak of a large square product, and
/// Transformer-XL's enwik8 base as `--preset xl-enwik8-base` trains it (read from the preset:
/// 22 x 512 tokens, d_model 512, 8 heads of 64, feed-forward 2,048, 1,024 keys with the
/// memory): its feed-forward's first product and each head's scores and values.
pub fn product_shapes() -> Vec<ProductShape> {
    let preset = crate::config::Preset::XlEnwik8Base;
    let (model, train) = (preset.model(), preset.train());
    let tokens = train.batch * train.tgt_len;
    let heads = train.batch * model.n_heads;
    let (q, dh, klen) = (
        train.tgt_len,
        model.head_width(),
        train.tgt_len + model.mem_len,
    );
    let name = |what: &str| format!("{} {what}", preset.name());
    vec![
        ProductShape {
            name: "square 4096".into(),
            dims: [1, 4096, 4096, 4096],
        },
        ProductShape {
            name: name("feed-forward"),
            dims: [1, tokens, model.d_model, model.d_inner],
        },
        ProductShape {
            name: name("scores (per head)"),
            dims: [heads, q, dh, klen],
        },
        ProductShape {
            name: name("values (per head)"),
            dims: [heads, q, klen, dh],
        },
    ]
}

/// One shape's rate.
#[derive(Clone, Debug, Serialize)]
pub struct ProductRate {
    /// The shape's name.
    pub name: String,
    /// `[batch, m, k, n]`.
    pub dims: [usize; 4],
    /// The median of the timed products, in seconds.
    pub seconds: f64,
    /// `2 batch m k n` over the median.
    pub gflops: f64,
}

/// The float32 rate of `device` (a device string) at each of `shapes`: per shape, one untimed
/// product, then the median of `repeats` products, each waited for on the device.
pub fn measure_products(
    device_name: &str,
    shapes: &[ProductShape],
    repeats: usize,
) -> Result<Vec<ProductRate>, CliError> {
    if repeats == 0 {
        return Err(CliError::Flag {
            flag: "--repeats",
            value: "0".into(),
            reason: "at least one product must be timed".into(),
        });
    }
    let device = super::device(device_name)?;
    let sync = || {
        device.sync().map_err(|e| CliError::DeviceFailed {
            device: device_name.to_string(),
            doing: "computing a matrix product",
            message: format!("{e:?}"),
        })
    };
    let mut rates = Vec::new();
    for shape in shapes {
        let [batch, m, k, n] = shape.dims;
        let normal = Distribution::Normal(0.0, 1.0);
        let a = Tensor::<3>::random([batch, m, k], normal, &device);
        let b = Tensor::<3>::random([batch, k, n], normal, &device);
        sync()?;
        let mut times = Vec::with_capacity(repeats);
        for run in 0..=repeats {
            let start = Instant::now();
            let c = a.clone().matmul(b.clone());
            sync()?;
            drop(c);
            if run > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let seconds = times[times.len() / 2];
        let flop = 2.0 * (batch * m * k * n) as f64;
        rates.push(ProductRate {
            name: shape.name.clone(),
            dims: shape.dims,
            seconds,
            gflops: flop / seconds / 1e9,
        });
    }
    Ok(rates)
}

/// `memzoo devices --measure DEVICE`: [`measure_products`] at [`product_shapes`], one line per
/// shape, or JSON.
pub fn devices_measure(device_name: &str, repeats: usize, json: bool) -> Result<(), CliError> {
    let rates = measure_products(device_name, &product_shapes(), repeats)?;
    if json {
        let out = serde_json::json!({"device": device_name, "products": rates});
        println!("{out}");
        return Ok(());
    }
    println!("float32 matrix products on {device_name} (median of {repeats}):");
    for r in &rates {
        let [batch, m, k, n] = r.dims;
        println!(
            "  {:34} {batch:>3} x [{m} x {k}] x [{k} x {n}]  {:>9.1} GFLOP/s  ({:.2} ms)",
            r.name,
            r.gflops,
            r.seconds * 1e3
        );
    }
    Ok(())
}

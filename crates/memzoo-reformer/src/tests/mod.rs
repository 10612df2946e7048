use burn::tensor::{Device, Tensor, TensorData};

use crate::rng::normal_vec;

mod attention;
mod fused;
mod order;

pub(crate) fn dev() -> Device {
    Device::flex()
}

/// A standard normal tensor drawn from `seed`.
pub(crate) fn rand_tensor<const D: usize>(
    shape: [usize; D],
    seed: u64,
    device: &Device,
) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(normal_vec(n, seed), shape), device)
}

pub(crate) fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}
mod layers;

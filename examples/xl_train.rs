//! Train a small Transformer-XL on generated text whose second half can only be predicted from
//! memory, and watch the loss fall.
//!
//! ```text
//! cargo run --release --example xl_train [-- --device flex --steps 300]
//! ```

use burn::optim::{AdamWConfig, GradientsParams};
use memzoo::prelude::*;
use memzoo_examples::{arg, device_from_args, ordered_segments};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn main() {
    let device = device_from_args().autodiff();
    let steps: usize = arg("--steps").and_then(|s| s.parse().ok()).unwrap_or(300);

    // Documents: a random 48-letter passage, then the same passage again 64 letters later, so
    // the second copy is predictable only by looking back beyond the 32-token segment.
    let mut rng = StdRng::seed_from_u64(7);
    let mut text = Vec::new();
    while text.len() < 400_000 {
        let passage: Vec<u8> = (0..48).map(|_| rng.random_range(b'a'..=b'z')).collect();
        text.extend_from_slice(&passage);
        text.extend(std::iter::repeat_n(b'.', 16));
        text.extend_from_slice(&passage);
        text.push(b'\n');
    }

    let config = XlConfig::new()
        .with_n_layers(2)
        .with_d_model(128)
        .with_n_heads(4)
        .with_d_inner(256)
        .with_mem_len(96)
        .with_dropout(0.0);
    let mut model = config.init(&device).expect("valid config");
    let mut optim = AdamWConfig::new().init();
    let segments = ordered_segments(&text, 8, 32, &device);
    let mut memory = XlMemory::empty();
    let mut window = Vec::new();
    for (step, (x, y)) in segments.into_iter().take(steps).enumerate() {
        let (loss, next) = model.forward_loss(x, y, &memory).expect("shapes fit");
        memory = next; // carried to the next segment, detached
        window.push(loss.clone().into_scalar::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        if (step + 1) % 25 == 0 {
            let mean = window.iter().sum::<f32>() / window.len() as f32;
            println!(
                "step {:4}  loss {:.3} nats  ({:.3} bits/char)",
                step + 1,
                mean,
                mean / std::f32::consts::LN_2
            );
            window.clear();
        }
    }
}

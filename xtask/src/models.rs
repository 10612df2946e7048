//! Model training-throughput benchmarks (forward + cross-entropy + backward + AdamW).

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_xl::{XlConfig, XlMemory};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::BenchArgs;
use crate::measure::{Measurement, median, peak_rss_mb, time_steps};

/// Random byte tokens `[batch, len]`.
fn random_tokens(batch: usize, len: usize, rng: &mut StdRng, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = (0..batch * len).map(|_| rng.random_range(0..256)).collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), device)
}

/// XL-small: 6 layers, d_model 256, 8 heads x 32, d_inner 1024, tgt_len 128, mem_len 128,
/// batch 8, vocab 256, f32; memory carried across steps as in training.
pub fn xl_small(args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let (batch, tgt_len) = (8, 128);
    // The defaults are XL-small; like the peers' reference run: no dropout, u/v per layer.
    let config = XlConfig::new().with_dropout(0.0).with_untie_rel_bias(true);
    let device = device.clone().autodiff();
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let mut optim = AdamWConfig::new().init();
    let mut memory = XlMemory::empty();
    let mut rng = StdRng::seed_from_u64(0);
    let times = time_steps(args.warmup(), args.steps(), || {
        let tokens = random_tokens(batch, tgt_len + 1, &mut rng, &device);
        let (x, y) = (
            tokens.clone().narrow(1, 0, tgt_len),
            tokens.narrow(1, 1, tgt_len),
        );
        let (loss, next) = model.forward_loss(x, y, &memory).expect("valid shapes");
        memory = next;
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(2.5e-4, model.clone(), grads);
        device.sync().expect("device sync");
    });
    let med = median(&times);
    Ok(Measurement {
        name: "xl-small".into(),
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config: serde_json::json!({
            "n_layers": config.n_layers, "d_model": config.d_model, "n_heads": config.n_heads,
            "d_head": config.head_width(), "d_inner": config.d_inner, "tgt_len": tgt_len,
            "mem_len": config.mem_len, "batch": batch, "vocab": config.vocab_size,
            "dropout": config.dropout, "untie_rel_bias": config.untie_rel_bias,
        }),
        steps: times.len(),
        step_s_median: med,
        step_s_min: times[0],
        step_s_max: times[times.len() - 1],
        tokens_per_s: (batch * tgt_len) as f64 / med,
        params,
        peak_rss_mb: peak_rss_mb(),
    })
}

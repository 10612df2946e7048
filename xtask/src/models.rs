//! Model training-throughput benchmarks (forward + cross-entropy + backward + AdamW) of the
//! presets, stepped with the trainer's optimizer (`TrainConfig::optimizer`: PyTorch's epsilon,
//! not Burn's default 1e-5).

use burn::module::Module;
use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_stack::{ReformerConfig, Step, XlConfig, XlState};
use memzoo_train::parallel::{shard_rows, train_step_sharded};
use memzoo_train::{Segment, TrainConfig};
use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::BenchArgs;
use crate::measure::{Measurement, median, peak_rss_kib, peak_rss_mb, rss_kib, time_steps};

/// memzoo's measurement of steps of `tokens` tokens that took `times` seconds (sorted), each
/// `flops_per_token` model FLOPs per token ([`crate::flops`]), against `device`'s matrix-product
/// rate.
#[allow(clippy::too_many_arguments)]
pub(crate) fn measured(
    name: String,
    args: &BenchArgs,
    config: serde_json::Value,
    times: &[f64],
    tokens: usize,
    params: usize,
    flops_per_token: f64,
    device: &Device,
) -> Measurement {
    let med = median(times);
    let mut m = Measurement {
        name,
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config,
        steps: times.len(),
        step_s_median: med,
        step_s_min: times.first().copied().unwrap_or(f64::NAN),
        step_s_max: times.last().copied().unwrap_or(f64::NAN),
        tokens_per_s: tokens as f64 / med,
        params,
        peak_rss_mb: peak_rss_mb(),
        ..Default::default()
    };
    crate::flops::annotate(&mut m, flops_per_token, device);
    m
}

/// A segment of random byte tokens, `batch` rows of `len` (no document starts).
pub(crate) fn random_segment(batch: usize, len: usize, rng: &mut StdRng) -> Segment {
    let data: Vec<i64> = (0..batch * (len + 1))
        .map(|_| rng.random_range(0..256))
        .collect();
    let rows = data.chunks(len + 1);
    Segment::new(
        batch,
        len,
        rows.clone().flat_map(|r| r[..len].to_vec()).collect(),
        rows.flat_map(|r| r[1..].to_vec()).collect(),
    )
    .expect("batch x len tokens")
}

/// The replicas a benchmark trains with: `--replicas`, else the trainer's choice.
fn replicas(args: &BenchArgs, device: &Device, batch: usize) -> usize {
    args.replicas
        .unwrap_or_else(|| memzoo_train::parallel::auto_replicas(device, batch))
}

/// The XL-small preset (`XlConfig::small`) as the peers' reference run has it: no dropout, `u`/`v`
/// per layer.
pub(crate) fn bench_xl() -> XlConfig {
    XlConfig::small()
        .with_dropout(0.0)
        .with_untie_rel_bias(true)
}

/// XL-small: 6 layers, d_model 256, 8 heads x 32, d_inner 1024, tgt_len 128, mem_len 128,
/// batch 8, vocab 256, f32; memory carried across steps as in training. The step is the
/// trainer's: the batch split over data-parallel replicas (`--replicas`, default as the trainer).
pub fn xl_small(args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let (batch, tgt_len) = (8, 128);
    let config = bench_xl();
    let device = device.clone().autodiff();
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let replicas = replicas(args, &device, batch);
    let mut optim = TrainConfig::new().optimizer();
    let mut memories: Vec<XlState> = (0..replicas).map(|_| XlState::new()).collect();
    let mut rng = StdRng::seed_from_u64(0);
    let times = time_steps(args.warmup(), args.steps(), || {
        let segment = random_segment(batch, tgt_len, &mut rng);
        let (_, grads) =
            train_step_sharded(&model, &device, &segment, &mut memories).expect("valid shapes");
        model = optim.step(2.5e-4, model.clone(), grads);
        device.sync().expect("device sync");
    });
    Ok(measured(
        "xl-small".into(),
        args,
        serde_json::json!({
            "n_layers": config.n_layers, "d_model": config.d_model, "n_heads": config.n_heads,
            "d_head": config.head_width(), "d_inner": config.d_inner, "tgt_len": tgt_len,
            "mem_len": config.mem_len, "batch": batch, "vocab": config.vocab_size,
            "dropout": config.dropout, "untie_rel_bias": config.untie_rel_bias,
            "replicas": replicas,
        }),
        &times,
        batch * tgt_len,
        params,
        crate::flops::train_flops_per_token(&config, tgt_len, batch),
        &device,
    ))
}

/// XL-small evaluated as `memzoo_train::evaluate` does (no autodiff, memory carried, the
/// cross-entropy and the recall sums of each segment), the batch's rows split over replicas
/// (`--replicas`, default as the trainer: one per thread on flex). `--replicas 1` is the
/// evaluation of before it was sharded.
pub fn xl_small_eval(args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    use memzoo_train::parallel::eval_step_sharded;
    let (batch, tgt_len) = (8, 128);
    let config = bench_xl();
    let model = config.init(device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let replicas = replicas(args, device, batch);
    let mut memories: Vec<XlState> = (0..replicas).map(|_| XlState::new()).collect();
    let mut rng = StdRng::seed_from_u64(0);
    let times = time_steps(args.warmup(), args.steps(), || {
        let segment = random_segment(batch, tgt_len, &mut rng);
        eval_step_sharded(&model, device, &segment, &mut memories).expect("valid shapes");
    });
    Ok(measured(
        "xl-small-eval".into(),
        args,
        serde_json::json!({"model": "xl-small", "batch": batch, "tgt_len": tgt_len,
            "mem_len": config.mem_len, "replicas": replicas}),
        &times,
        batch * tgt_len,
        params,
        crate::flops::forward_flops_per_token(&config, tgt_len, batch),
        device,
    ))
}

/// XL-small trained by `memzoo-train` (data iterator, metrics, memory carried, clipping,
/// schedule): compare with `xl-small`, the bare model loop; the difference is the trainer's cost.
pub fn xl_small_trainer(args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    use memzoo_data::{ByteTokenizer, LongRangeConfig, OrderedBatcher, generate_corpus};
    use memzoo_train::{RunOptions, TrainConfig, train};

    let (batch, tgt_len) = (8, 128);
    let config = bench_xl();
    let device = device.clone().autodiff();
    let model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let corpus = generate_corpus(&LongRangeConfig::default()).map_err(|e| e.to_string())?;
    let tokens = ByteTokenizer::new().encode(&corpus.train);
    let mut data = OrderedBatcher::new(tokens, batch, tgt_len)
        .map_err(|e| e.to_string())?
        .drop_last(true);
    let (warmup, steps) = (args.warmup(), args.steps());
    let train_config = TrainConfig::sized(warmup + steps, batch, tgt_len)
        .with_log_every(1)
        .with_eval_every(0)
        .with_checkpoint_every(0);
    let dir = std::env::temp_dir().join(format!("memzoo-bench-trainer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    train(model, &train_config, &mut data, None, &options).map_err(|e| e.to_string())?;
    // The trainer's own per-step throughput (its log windows exclude checkpoints).
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).map_err(|e| e.to_string())?;
    let mut step_s: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["metric"] == "tokens_per_s" && v["step"].as_u64().unwrap_or(0) > warmup as u64
        })
        .filter_map(|v| v["value"].as_f64())
        .map(|tps| (batch * tgt_len) as f64 / tps)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    step_s.sort_by(f64::total_cmp);
    Ok(measured(
        "xl-small-trainer".into(),
        args,
        serde_json::json!({"model": "xl-small", "batch": batch, "tgt_len": tgt_len,
            "data": "generated long-range corpus", "clip_norm": 0.25}),
        &step_s,
        batch * tgt_len,
        params,
        crate::flops::train_flops_per_token(&config, tgt_len, batch),
        &device,
    ))
}

/// Reformer-small: 6 layers, d_model 256, 8 heads x 32, seq 4096, bucket 64, 4 rounds, causal,
/// reversible, chunked FF, axial positions, batch 1 (the defaults of `ReformerConfig`).
pub fn reformer_small(args: &BenchArgs, device: &Device) -> Result<Measurement, String> {
    let config = ReformerConfig::small();
    let len = if args.quick { 1024 } else { config.max_seq_len };
    let reps = args.steps.unwrap_or(if args.quick { 1 } else { 3 });
    let t = train_step_timing(&config, 1, len, reps, &device.clone().autodiff())?;
    let config_r = config;
    let config = serde_json::json!({"n_layers": config_r.n_layers, "d_model": config_r.d_model,
        "n_heads": config_r.n_heads, "d_head": config_r.d_head, "seq": len,
        "bucket_size": config_r.lsh.chunk_len, "n_rounds": config_r.lsh.n_rounds,
        "reversible": config_r.reversible, "batch": 1});
    let flops = crate::flops::train_flops_per_token(&stack_of(&config_r, len), len, 1);
    Ok(step_measurement(
        "reformer-small",
        args,
        config,
        &t,
        reps,
        flops,
        device,
    ))
}

/// `reformer-step-<layers>-<rev|plain>-<len>[-<d_model>]`: one training step of a Reformer LM
/// of Reformer-small's shape (`d_model` 256 unless given, `d_ff = 4 d_model`, 8 heads), batch
/// 1, reversible or plain residuals: the activation memory a reversible stack saves (peak RSS
/// above the model's; run one configuration per process).
pub fn reformer_step(
    target: &str,
    args: &BenchArgs,
    device: &Device,
) -> Result<Measurement, String> {
    let bad = || {
        format!(
            "bad target `{target}`: expected reformer-step-<layers>-<rev|plain>-<len>[-<d_model>]"
        )
    };
    let parts: Vec<&str> = target.split('-').skip(2).collect();
    let num = |i: usize| -> Result<usize, String> {
        parts.get(i).and_then(|p| p.parse().ok()).ok_or_else(bad)
    };
    let layers = num(0)?;
    let reversible = match parts.get(1) {
        Some(&"rev") => true,
        Some(&"plain") => false,
        _ => return Err(bad()),
    };
    let len = num(2)?;
    let d_model = if parts.len() > 3 { num(3)? } else { 256 };
    let config = ReformerConfig::small()
        .with_n_layers(layers)
        .with_reversible(reversible)
        .with_max_seq_len(len.max(64))
        .with_d_model(d_model)
        .with_d_ff(4 * d_model)
        .with_d_head(d_model / 8);
    let reps = args.steps.unwrap_or(1);
    let t = train_step_timing(&config, 1, len, reps, &device.clone().autodiff())?;
    let flops = crate::flops::train_flops_per_token(&stack_of(&config, len), len, 1);
    let config = serde_json::json!({"n_layers": layers, "reversible": reversible, "seq": len,
        "d_model": d_model, "batch": 1});
    Ok(step_measurement(
        target, args, config, &t, reps, flops, device,
    ))
}

/// The stack of a Reformer read in sequences of `len` (its LSH buckets follow the length).
pub fn stack_of(config: &ReformerConfig, len: usize) -> XlConfig {
    config.clone().with_max_seq_len(len.max(64)).stack()
}

/// A [`StepTiming`] of `reps` steps as a measurement named `name`, its `config` completed with
/// the memory the steps took above the model's (`rss_above_baseline_mb`), with `flops_per_token`
/// model FLOPs per token against `device`'s matrix-product rate.
fn step_measurement(
    name: &str,
    args: &BenchArgs,
    mut config: serde_json::Value,
    t: &StepTiming,
    reps: usize,
    flops_per_token: f64,
    device: &Device,
) -> Measurement {
    config["rss_above_baseline_mb"] =
        serde_json::json!((t.peak_rss_kib - t.rss_baseline_kib) as f64 / 1024.0);
    let mut m = Measurement {
        name: name.to_string(),
        implementation: "memzoo".into(),
        backend: args.device.clone(),
        threads: args.threads,
        config,
        steps: reps,
        step_s_median: t.seconds,
        step_s_min: t.seconds,
        step_s_max: t.seconds,
        tokens_per_s: t.tokens_per_s,
        params: 0,
        peak_rss_mb: t.peak_rss_kib as f64 / 1024.0,
        ..Default::default()
    };
    crate::flops::annotate(&mut m, flops_per_token, device);
    m
}

/// One measurement of [`train_step_timing`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepTiming {
    /// Layers of the model.
    pub n_layers: usize,
    /// Reversible layers.
    pub reversible: bool,
    /// Batch size.
    pub batch: usize,
    /// Sequence length.
    pub len: usize,
    /// Seconds per training step (loss + gradients), mean of the timed steps.
    pub seconds: f64,
    /// Tokens per second of training.
    pub tokens_per_s: f64,
    /// Resident set size after building the model and one warm-up step (KiB).
    pub rss_baseline_kib: u64,
    /// Peak resident set size at the end (KiB, `VmHWM`).
    pub peak_rss_kib: u64,
}

/// Times `train_step` of a Reformer built from `config` on `device` (an autodiff device):
/// one warm-up step on a short sequence, then `reps` steps on random tokens `[batch, len]`.
/// Run one configuration per process: the peak is the whole process's `VmHWM`, so
/// `peak_rss_kib - rss_baseline_kib` is the step's activation memory.
pub fn train_step_timing(
    config: &ReformerConfig,
    batch: usize,
    len: usize,
    reps: usize,
    device: &Device,
) -> Result<StepTiming, String> {
    let model = config.init(device).map_err(|e| e.to_string())?;
    let tokens = |l: usize, seed: u64| {
        let v: Vec<i64> = memzoo_reformer::rng::normal_vec(batch * l, seed)
            .into_iter()
            .map(|x| ((x.abs() * 1000.0) as i64) % config.vocab_size as i64)
            .collect();
        Tensor::<2, Int>::from_data(TensorData::new(v, [batch, l]), device)
    };
    let warm = len.min(config.lsh.chunk_len * 2);
    let _ = model
        .train_step(
            tokens(warm, 1),
            tokens(warm, 2),
            &mut XlState::new(),
            &Step::default(),
        )
        .map_err(|e| e.to_string())?;
    let rss_baseline_kib = rss_kib();
    let reps = reps.max(1);
    let start = Instant::now();
    for r in 0..reps {
        let (loss, grads) = model
            .train_step(
                tokens(len, 10 + r as u64),
                tokens(len, 20 + r as u64),
                &mut XlState::new(),
                &Step::default(),
            )
            .map_err(|e| e.to_string())?;
        let _: f32 = loss.into_scalar();
        drop(grads);
    }
    let seconds = start.elapsed().as_secs_f64() / reps as f64;
    Ok(StepTiming {
        n_layers: config.n_layers,
        reversible: config.reversible,
        batch,
        len,
        seconds,
        tokens_per_s: (batch * len) as f64 / seconds,
        rss_baseline_kib,
        peak_rss_kib: peak_rss_kib(),
    })
}

/// Memorizing-small: 6 layers, d_model 256, 8 query heads x 32 sharing one key/value head
/// (multi-query, `kv_heads = 1`, as memorizing-transformers-pytorch), seq 512, kNN layer 4,
/// top-32, 16,384 memories per row, batch 2, no XL memory (as the PyTorch peer runs it);
/// with `knn = false` the same model without the kNN layer (the overhead baseline). The kNN
/// memory (one store per row: the kv head) is prefilled with `prefill` random unit keys per
/// row (the peer: 8,192) and keeps filling during the timed steps, as in training.
pub fn memorizing_small(
    args: &BenchArgs,
    device: &Device,
    knn: bool,
    prefill: usize,
) -> Result<Measurement, String> {
    use memzoo_stack::MemorizingConfig;
    let (batch, len) = (2, 512);
    // The Memorizing-small preset (T5 positions, pre-LN, an untied head, kNN layer 4, top-32
    // of 16,384) with the peer's multi-query attention and no dropout.
    let small = MemorizingConfig::small();
    let xl = small.xl.clone().with_dropout(0.0).with_kv_heads(Some(1));
    let config = small
        .with_xl(xl)
        .with_xl_memory(false)
        .with_knn_layers(if knn { vec![3] } else { vec![] });
    let device = device.clone().autodiff();
    let mut model = config.init(&device).map_err(|e| e.to_string())?;
    let params = model.num_params();
    let replicas = replicas(args, &device, batch);
    let mut optim = TrainConfig::new().optimizer();
    let mut rng = StdRng::seed_from_u64(0);
    let memory = config.memory();
    let (h, d) = (memory.kv_heads(), memory.d_head);
    // One state per replica, for its rows, each kNN memory prefilled with random unit keys
    // (per kv head).
    let mut states = Vec::new();
    for rows in shard_rows(batch, replicas) {
        let rows = rows.len();
        let mut state = model.new_state(rows, &device).map_err(|e| e.to_string())?;
        for store in state.knn.iter_mut() {
            let mut left = prefill.min(config.knn.max_memories);
            while left > 0 {
                let n = left.min(1024);
                let mut unit = |normalise: bool| {
                    let mut v: Vec<f32> = (0..rows * n * h * d)
                        .map(|_| rng.random_range(-1.0f32..1.0))
                        .collect();
                    if normalise {
                        for x in v.chunks_mut(d) {
                            let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-6);
                            x.iter_mut().for_each(|a| *a /= norm);
                        }
                    }
                    Tensor::<4>::from_data(TensorData::new(v, [rows, n, h, d]), &device)
                };
                let (k, v) = (unit(true), unit(false));
                store.add(k, v).map_err(|e| e.to_string())?;
                left -= n;
            }
        }
        states.push(state);
    }
    let times = time_steps(args.warmup(), args.steps(), || {
        let segment = random_segment(batch, len, &mut rng);
        let (_, grads) =
            train_step_sharded(&model, &device, &segment, &mut states).expect("valid shapes");
        model = optim.step(2.5e-4, model.clone(), grads);
        device.sync().expect("device sync");
    });
    Ok(measured(
        match (knn, prefill >= config.knn.max_memories) {
            (false, _) => "memorizing-small-noknn".into(),
            (true, false) => "memorizing-small".into(),
            (true, true) => "memorizing-small-full".into(),
        },
        args,
        serde_json::json!({"n_layers": 6, "d_model": 256, "heads": 8, "kv_heads": 1, "d_head": 32,
            "seq": len, "knn_layers": config.knn_layers, "top_k": 32, "max_memories": 16384,
            "prefill_memories": prefill, "xl_memory": 0,
            "batch": batch, "index": format!("{:?}", config.knn.index), "replicas": replicas}),
        &times,
        batch * len,
        params,
        crate::flops::train_flops_per_token(&config.stack(), len, batch),
        &device,
    ))
}

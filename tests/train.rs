//! The trainer: exact resume, checkpoint errors, schedule, clipping, config handling, and the
//! proof that memory matters.

use std::path::{Path, PathBuf};

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use memzoo::config::RunConfig;
use memzoo_data::OrderedBatcher;
use memzoo_stack::TransformerXl;
use memzoo_tests::*;
use memzoo_train::grads::{global_norm, scale_and_clip};
use memzoo_train::parallel::{shard_rows, train_step_sharded};
use memzoo_train::{
    AdamConfig, RunOptions, ScheduleConfig, Segment, SegmentModel, SegmentSource, TrainConfig,
    train,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memzoo-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn tiny_train(steps: usize) -> TrainConfig {
    TrainConfig::sized(steps, 4, 16)
        .with_log_every(100)
        .with_eval_every(0)
        .with_checkpoint_every(4)
        .with_schedule(ScheduleConfig::new().with_lr(3e-3).with_warmup(2))
}

fn stream() -> Vec<u16> {
    small_corpus()
}

fn batcher(tokens: &[u16]) -> OrderedBatcher {
    OrderedBatcher::new(tokens.to_vec(), 4, 16)
        .unwrap()
        .drop_last(true)
}

fn options(dir: &Path, resume: bool) -> RunOptions {
    RunOptions {
        run_dir: dir.to_path_buf(),
        resume,
        quiet: true,
    }
}

/// The error of a training run that must fail (`what` names the case in the panic otherwise).
fn train_error(
    model: TransformerXl,
    config: &TrainConfig,
    data: &mut dyn SegmentSource,
    options: &RunOptions,
    what: &str,
) -> String {
    match train(model, config, data, None, options) {
        Ok(_) => panic!("{what}: the run succeeded"),
        Err(e) => e.to_string(),
    }
}

fn params(model: &TransformerXl) -> Vec<f32> {
    let mut v = host(model.embedding.plain().unwrap().weight.val());
    v.extend(host(model.layers[1].block.ff_out.weight.val()));
    v.extend(host(model.layers[0].attention.local().query.weight.val()));
    v
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    resume_equals_straight(1);
}

/// With data-parallel replicas each checkpoint holds one carried state per replica.
#[test]
fn resumed_data_parallel_run_equals_uninterrupted_run() {
    let dir_b = resume_equals_straight(2);
    assert!(
        dir_b
            .join("checkpoints/step-00000012/state/shard-1/memory.safetensors")
            .exists()
    );
    // The shards carry the memories of their rows: resuming with another count is refused.
    let err = train_error(
        tiny_xl().init(&flex().autodiff()).unwrap(),
        &tiny_train(16).with_replicas(Some(1)),
        &mut batcher(&stream()),
        &options(&dir_b, true),
        "another replica count must fail",
    );
    assert!(
        err.contains("train.replicas = 1") && err.contains("2 replicas"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir_b);
}

/// Trains 12 steps straight and 8 + 4 with a resume in between; returns the resumed run's
/// directory (the caller removes it).
fn resume_equals_straight(replicas: usize) -> PathBuf {
    let dev = flex().autodiff();
    let tokens = stream();
    let tiny_train = |steps| tiny_train(steps).with_replicas(Some(replicas));

    let model = seeded_weights(tiny_xl().init(&dev).unwrap(), 1, xl_init_std(&tiny_xl()));
    let init = model.clone();
    let dir_a = scratch(&format!("straight-{replicas}"));
    let straight = train(
        model,
        &tiny_train(12),
        &mut batcher(&tokens),
        None,
        &options(&dir_a, false),
    )
    .unwrap();

    // Same start, killed after the checkpoint of step 8: the same run whose checkpoints
    // after step 8 are gone, resumed with a new model object and a new data iterator.
    let dir_b = scratch(&format!("resumed-{replicas}"));
    train(
        init,
        &tiny_train(12),
        &mut batcher(&tokens),
        None,
        &options(&dir_b, false),
    )
    .unwrap();
    let ckpts = dir_b.join("checkpoints");
    std::fs::remove_dir_all(ckpts.join("step-00000012")).unwrap();
    std::fs::write(ckpts.join("latest"), "step-00000008").unwrap();
    let fresh = tiny_xl().init(&dev).unwrap();
    let resumed = train(
        fresh,
        &tiny_train(12),
        &mut batcher(&tokens),
        None,
        &options(&dir_b, true),
    )
    .unwrap();
    assert_eq!(resumed.steps, 12);
    assert_close(
        &params(&straight.model),
        &params(&resumed.model),
        1e-6,
        "resumed parameters",
    );

    // Both runs wrote metrics and kept at most two checkpoints.
    let kept = std::fs::read_dir(dir_b.join("checkpoints"))
        .unwrap()
        .count();
    assert!(kept <= 3, "{kept} entries (2 checkpoints + latest)");
    assert!(
        std::fs::read_to_string(dir_b.join("metrics.jsonl"))
            .unwrap()
            .contains("\"loss\"")
    );
    let _ = std::fs::remove_dir_all(dir_a);
    dir_b
}

/// A segment of `batch` rows cut from `tokens` at `offset`; rows listed in `reset` start a
/// document; `padded` lists `(row, from)`: that row's targets from `from` on are `PAD`
/// (ignored by the loss).
fn segment_at(
    tokens: &[u16],
    batch: usize,
    len: usize,
    offset: usize,
    reset: &[usize],
    padded: &[(usize, usize)],
) -> Segment {
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for r in 0..batch {
        let start = offset + r * 101;
        let row: Vec<i64> = tokens[start..start + len + 1]
            .iter()
            .map(|&t| t as i64)
            .collect();
        inputs.extend_from_slice(&row[..len]);
        let mut t = row[1..].to_vec();
        for &(_, from) in padded.iter().filter(|(row, _)| *row == r) {
            t[from..].iter_mut().for_each(|x| *x = PAD as i64);
        }
        targets.extend(t);
    }
    Segment::new(batch, len, inputs, targets)
        .and_then(|s| s.with_reset((0..batch).map(|r| reset.contains(&r)).collect()))
        .unwrap()
}

const PAD: usize = 0;

/// Every parameter's gradient, flattened in visiting order.
fn flat_grads<M: burn::module::Module>(model: &M, grads: &GradientsParams) -> Vec<f32> {
    param_vectors(model, Some(grads))
        .into_iter()
        .flat_map(|g| g.expect("every parameter has a gradient"))
        .collect()
}

/// Which targets a test segment's loss counts.
#[derive(Clone, Copy, Debug)]
enum Counted {
    /// Every target (`PAD` targets too).
    All,
    /// All but the `PAD` targets.
    NotPad,
    /// All but the `PAD` targets and every third target (a `counted` selection).
    Selected,
}

/// Runs three consecutive segments (memory carried; on the third, a reset row, a row of
/// padding alone and one half padded) with `replicas` data-parallel replicas: the losses and
/// gradients of each step.
fn sharded_steps<M: SegmentModel>(
    model: &M,
    replicas: usize,
    counted: Counted,
) -> Vec<(f64, Vec<f32>)> {
    let dev = flex().autodiff();
    let tokens = stream();
    let mut states: Vec<M::State> = (0..replicas).map(|_| M::State::default()).collect();
    (0..3)
        .map(|step| {
            let (reset, padded): (&[usize], &[(usize, usize)]) = match step {
                2 => (&[3], &[(0, 0), (1, 6)]),
                _ => (&[], &[]),
            };
            let seg = segment_at(&tokens, 5, 12, step * 12, reset, padded);
            let seg = match counted {
                Counted::All => seg,
                Counted::NotPad => seg.with_pad(Some(PAD as i64)),
                Counted::Selected => seg
                    .with_pad(Some(PAD as i64))
                    .with_counted((0..5 * 12).map(|i| i % 3 != 0).collect())
                    .unwrap(),
            };
            let (loss, grads) = train_step_sharded(model, &dev, &seg, &mut states).unwrap();
            (loss, flat_grads(model, &grads))
        })
        .collect()
}

/// Data-parallel replicas (even and uneven shards, one row each) compute the loss and the
/// gradients of one pass over the whole batch, memory carried per shard across segments.
fn data_parallel_matches_one_pass<M: SegmentModel>(model: &M, what: &str) {
    for counted in [Counted::All, Counted::NotPad, Counted::Selected] {
        let want = sharded_steps(model, 1, counted);
        for replicas in [2, 3, 5] {
            let got = sharded_steps(model, replicas, counted);
            for (step, ((l1, g1), (lr, gr))) in want.iter().zip(&got).enumerate() {
                let what = format!("{what}, {replicas} replicas, {counted:?}, step {step}");
                assert!(
                    (l1 - lr).abs() < 1e-5 * l1.abs(),
                    "{what}: loss {l1} vs {lr}"
                );
                let scale = g1.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                assert!(scale > 1e-4, "{what}: gradients carry signal");
                assert_close(gr, g1, 1e-5 * scale, &format!("{what}: gradients"));
            }
        }
    }
}

#[test]
fn data_parallel_xl_step_equals_one_pass() {
    let dev = flex().autodiff();
    let model = seeded_weights(tiny_xl().init(&dev).unwrap(), 5, xl_init_std(&tiny_xl()));
    data_parallel_matches_one_pass(&model, "XL");
}

#[test]
fn data_parallel_memorizing_step_equals_one_pass() {
    let dev = flex().autodiff();
    let cfg = tiny_memorizing();
    let model = seeded_weights(cfg.init(&dev).unwrap(), 6, xl_init_std(&cfg.xl));
    data_parallel_matches_one_pass(&model, "Memorizing");
}

#[test]
fn bad_replica_counts_are_config_errors() {
    for bad in [0, 5] {
        let err = tiny_train(4)
            .with_replicas(Some(bad))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("got {bad}")) && err.contains("train.batch (4)"),
            "{err}"
        );
    }
    assert_eq!(shard_rows(7, 3), vec![0..3, 3..5, 5..7]);
}

#[test]
fn damaged_or_foreign_checkpoints_are_clear_errors() {
    let dev = flex().autodiff();
    let tokens = stream();
    let dir = scratch("damaged");
    let model = tiny_xl().init(&dev).unwrap();
    train(
        model,
        &tiny_train(4),
        &mut batcher(&tokens),
        None,
        &options(&dir, false),
    )
    .unwrap();

    // Another architecture.
    let other = tiny_xl().with_d_model(48).init(&dev).unwrap();
    let err = train_error(
        other,
        &tiny_train(8),
        &mut batcher(&tokens),
        &options(&dir, true),
        "foreign checkpoint must fail",
    );
    assert!(
        err.contains("model.bpk") && err.contains("does not fit"),
        "{err}"
    );

    // A truncated model file.
    let ckpt = dir.join("checkpoints/step-00000004/model.bpk");
    let bytes = std::fs::read(&ckpt).unwrap();
    std::fs::write(&ckpt, &bytes[..bytes.len() / 2]).unwrap();
    let model = tiny_xl().init(&dev).unwrap();
    let err = train_error(
        model,
        &tiny_train(8),
        &mut batcher(&tokens),
        &options(&dir, true),
        "truncated checkpoint must fail",
    );
    assert!(err.contains("model.bpk"), "{err}");

    // Data of another shape than the checkpoint's position.
    let model = tiny_xl().init(&dev).unwrap();
    std::fs::write(&ckpt, &bytes).unwrap();
    let mut other_data = OrderedBatcher::new(tokens.clone(), 2, 16).unwrap();
    let err = train_error(
        model,
        &tiny_train(8),
        &mut other_data,
        &options(&dir, true),
        "mismatched data position must fail",
    );
    assert!(err.contains("data position"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unwritable_run_directory_is_an_error() {
    let dev = flex().autodiff();
    let file = scratch("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let model = tiny_xl().init(&dev).unwrap();
    let err = train_error(
        model,
        &tiny_train(2),
        &mut batcher(&stream()),
        &options(&file.join("run"), false),
        "run dir under a file must fail",
    );
    assert!(err.contains("cannot create run directory"), "{err}");
    let _ = std::fs::remove_file(file);
}

#[test]
fn schedule_warms_up_linearly_then_decays_by_cosine() {
    let s = ScheduleConfig::cosine(1.0, 10, 0.1);
    assert!((s.lr_at(0, 110) - 0.1).abs() < 1e-12);
    assert!((s.lr_at(9, 110) - 1.0).abs() < 1e-12);
    assert!((s.lr_at(10, 110) - 1.0).abs() < 1e-12);
    // halfway through the decay: (1 + 0.1) / 2
    assert!((s.lr_at(60, 110) - 0.55).abs() < 1e-12);
    assert!((s.lr_at(110, 110) - 0.1).abs() < 1e-12);
    assert!((s.lr_at(500, 110) - 0.1).abs() < 1e-12);
}

#[test]
fn global_norm_clipping_matches_a_naive_norm() {
    let dev = flex().autodiff();
    let model = tiny_xl().init(&dev).unwrap();
    let x = burn::tensor::Tensor::<2, burn::tensor::Int>::zeros([2, 8], &dev);
    let (loss, _) = memory_loss(&model, x.clone(), x, &memzoo_stack::XlMemory::empty()).unwrap();
    let grads = GradientsParams::from_grads(loss.backward(), &model);

    // Naive: every parameter's gradient to the host, sum of squares.
    struct Collect<'a>(&'a GradientsParams, f64);
    impl burn::module::ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.0.get::<D>(p.id) {
                self.1 += host(g).iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
            }
        }
    }
    let mut c = Collect(&grads, 0.0);
    model.visit(&mut c);
    let naive = c.1.sqrt();
    let norm = global_norm(&model, &grads);
    assert!((norm - naive).abs() < 1e-4 * naive, "{norm} vs {naive}");

    let (clipped, before) = scale_and_clip(&model, grads, 0.5, Some(naive / 4.0));
    assert!((before - naive * 0.5).abs() < 1e-4 * naive);
    let after = global_norm(&model, &clipped);
    assert!(
        (after - naive / 4.0).abs() < 1e-3 * naive,
        "clipped norm {after}"
    );
}

#[test]
fn config_files_and_overrides_are_checked() {
    let dir = scratch("config");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.toml");
    std::fs::write(
        &file,
        "[model]\nmem_len = 32\nn_layers = 3\n[train]\nsteps = 7\n",
    )
    .unwrap();
    let c = RunConfig::resolve(Some(&file), &["model.d_model=64".into()]).unwrap();
    assert_eq!(
        (
            c.model.mem_len,
            c.model.n_layers,
            c.model.d_model,
            c.train.steps
        ),
        (32, 3, 64, 7)
    );

    std::fs::write(&file, "[model]\nmem_lenn = 32\n").unwrap();
    let err = RunConfig::resolve(Some(&file), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.mem_lenn"), "{err}");
    let err = RunConfig::resolve(None, &["train.steps=many".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid config"), "{err}");
    let err = RunConfig::resolve(None, &["nosection.x=1".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("nosection"), "{err}");
    let c = RunConfig::resolve(None, &["model.d_model=102".into()]).unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("d_model (102)"), "{err}");
    // A saved config reads back to the same values.
    let c = RunConfig::resolve(None, &["model.positions.clamp_len=40".into()]).unwrap();
    std::fs::write(dir.join("config.toml"), c.to_toml()).unwrap();
    let back = RunConfig::from_run_dir(&dir, &[]).unwrap();
    assert_eq!(back.model.positions.clamp_len, Some(40));
    assert_eq!(back.to_toml(), c.to_toml());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_corpus_shorter_than_one_batch_is_an_error() {
    let dir = scratch("short");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tiny.txt");
    std::fs::write(&file, "far too short for a batch of eight rows\n".repeat(3)).unwrap();
    let mut c = RunConfig::default();
    c.data.source = Some(file.display().to_string());
    let err = memzoo::commands::train(&c, "flex", &dir.join("run"), false, false, true, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs at least"), "{err}");
    std::fs::write(&file, "").unwrap();
    let err = memzoo::commands::train(&c, "flex", &dir.join("run"), false, false, true, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty") || err.contains("tiny.txt"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Random 5-letter passages, each repeated 8 times: a character is predictable only from the
/// one 6 positions back, beyond a 4-token segment but inside an 8-token memory.
fn periodic_stream(seed: u64, passages: usize) -> Vec<u16> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for _ in 0..passages {
        let p: Vec<u16> = (0..5)
            .map(|_| rng.random_range(b'a'..=b'z') as u16)
            .collect();
        for _ in 0..8 {
            out.extend_from_slice(&p);
            out.push(b' ' as u16);
        }
    }
    out
}

#[test]
fn memory_beats_no_memory_on_text_only_memory_can_predict() {
    let dev = flex().autodiff();
    let train_tokens = periodic_stream(1, 3000);
    let valid_tokens = periodic_stream(2, 100);
    let run = |mem_len: usize, name: &str| {
        let cfg = tiny_xl().with_mem_len(mem_len).with_vocab_size(128);
        // The same draw for both runs (a seeded host RNG, not the shared device RNG).
        let model = seeded_weights(cfg.init(&dev).unwrap(), 3, xl_init_std(&cfg));
        let cfg = tiny_train(2000)
            .with_batch(16)
            .with_tgt_len(4)
            .with_checkpoint_every(0)
            .with_schedule(ScheduleConfig::cosine(3e-3, 20, 1.0));
        let dir = scratch(name);
        let mut data = OrderedBatcher::new(train_tokens.clone(), 16, 4)
            .unwrap()
            .drop_last(true);
        let out = train(model, &cfg, &mut data, None, &options(&dir, false)).unwrap();
        let mut valid = OrderedBatcher::new(valid_tokens.clone(), 4, 4)
            .unwrap()
            .drop_last(true);
        let r = memzoo_train::evaluate(&out.model, &mut valid, 4, None).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        r
    };
    let with = run(8, "mem8");
    let without = run(0, "mem0");
    eprintln!(
        "valid bpc with memory {:.3}, without {:.3} (random letters: {:.3})",
        with.bpc,
        without.bpc,
        (26f64).log2()
    );
    // Without memory 5/6 of the letters are still a guess (~4 bits); with it they are copied.
    assert!(
        without.bpc > 3.0,
        "no-memory model cannot beat guessing here: {}",
        without.bpc
    );
    assert!(
        with.bpc < 0.6 * without.bpc,
        "memory {} vs none {}",
        with.bpc,
        without.bpc
    );
}

/// The whole update, step by step, against PyTorch: HF TransfoXL 4.37.2 trained with
/// `torch.optim.AdamW`, `clip_grad_norm_` and the warm-up + cosine schedule from the `plain`
/// fixture's weights on a fixed token stream (`xtask/peers/fixtures/hf_transfo_xl_train.py`
/// wrote every step's loss, gradient norm and rate, and 16 rows of the final tied embedding). memzoo
/// imports the same weights and trains with the same recipe, on one replica and on two (each
/// carrying its rows' memories; their gradients summed): the trajectories must agree step by
/// step. Any difference in the model, the loss, AdamW, the clipping, the schedule, the weight
/// decay, the data order or the memory carried shows here.
#[test]
fn training_from_hf_weights_follows_pytorch_step_by_step() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl");
    let text = std::fs::read_to_string(fixtures.join("train/trajectory.json")).unwrap();
    let t: serde_json::Value = serde_json::from_str(&text).unwrap();
    let r = &t["recipe"];
    let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("recipe.{k}"));
    let int = |k: &str| num(k) as usize;
    let tokens: Vec<u16> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u16)
        .collect();
    let steps = t["steps"].as_array().unwrap();
    assert_eq!(steps.len(), int("steps"));
    let peer = |k: &str| -> Vec<f64> { steps.iter().map(|s| s[k].as_f64().unwrap()).collect() };
    for replicas in [1, 2] {
        let dev = flex().autodiff();
        let (model, _) =
            memzoo_import::hf_transfo_xl::load_transformer_xl(&fixtures.join("plain"), &dev)
                .expect("import the plain fixture");
        let config = TrainConfig::new()
            .with_steps(int("steps"))
            .with_batch(int("batch"))
            .with_tgt_len(int("tgt_len"))
            .with_schedule(ScheduleConfig::cosine(num("lr"), int("warmup"), 0.0))
            .with_weight_decay(num("weight_decay"))
            .with_adam(
                AdamConfig::new()
                    .with_beta_1(num("beta_1"))
                    .with_beta_2(num("beta_2"))
                    .with_epsilon(num("eps")),
            )
            .with_clip_norm(Some(num("clip")))
            .with_grad_accum(1)
            .with_replicas(Some(replicas))
            .with_log_every(1)
            .with_eval_every(0)
            .with_checkpoint_every(0);
        let mut data = OrderedBatcher::new(tokens.clone(), int("batch"), int("tgt_len"))
            .unwrap()
            .drop_last(true);
        let dir = scratch(&format!("pytorch-trajectory-{replicas}"));
        let out = train(model, &config, &mut data, None, &options(&dir, false)).unwrap();
        let ours = |metric: &str| train_metric(&dir, metric);
        let what = format!("{replicas} replica(s)");
        for (metric, peer_key, tol) in [
            ("lr", "lr", 1e-9),
            ("loss", "loss", 1e-4),
            ("grad_norm", "grad_norm", 1e-4),
        ] {
            let (a, b) = (ours(metric), peer(peer_key));
            assert_eq!(a.len(), b.len(), "{metric} records, {what}");
            for (s, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    (x - y).abs() <= tol * y.abs().max(1.0),
                    "{metric} at step {}: memzoo {x}, PyTorch {y} ({what})",
                    s + 1
                );
            }
        }
        // The loss fell (the run learnt something), so the comparison is not of a frozen model.
        let loss = ours("loss");
        assert!(loss[loss.len() - 1] < loss[0] - 0.5, "{loss:?}");
        let weights = memzoo_import::hf_transfo_xl::transformer_xl_to_hf(
            &out.model,
            memzoo_import::mapping::Source::Values,
        );
        let name = "transformer.word_emb.emb_layers.0.weight";
        let got = weights[name]
            .clone()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap();
        // The fixture holds the first 16 rows.
        let got = &got[..16 * 16];
        let want: Vec<f32> = t["final"][name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_close(got, &want, 1e-4, &format!("final {name}, {what}"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The trainer's log lines carry what a pooling device's allocator holds (CubeCL's: wgpu,
/// CUDA), and nothing on flex. Checked against the model's own size: after a step the live
/// bytes hold at least the weights and AdamW's two moments, `3 x 4 bytes x parameters`, and
/// the reserved bytes and their peak hold at least the live ones.
#[test]
fn backend_trainer_reports_the_device_allocator() {
    let tokens = stream();
    let specs = memzoo_backend::test_devices().unwrap_or_else(|e| panic!("{e}"));
    for spec in specs {
        let name = spec.to_string();
        let dev = spec
            .init()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .autodiff();
        let model = seeded_weights(tiny_xl().init(&dev).unwrap(), 1, xl_init_std(&tiny_xl()));
        let weights_mib = (4 * model.num_params()) as f64 / (1u64 << 20) as f64;
        let dir = scratch(&format!("allocator-{}", name.replace(':', "-")));
        let config = tiny_train(2).with_log_every(1).with_checkpoint_every(0);
        train(
            model,
            &config,
            &mut batcher(&tokens),
            None,
            &options(&dir, false),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let in_use = train_metric(&dir, "device_mib_in_use");
        let reserved = train_metric(&dir, "device_mib_reserved");
        let peak = train_metric(&dir, "device_mib_reserved_peak");
        if dev.memory_pool_usage().is_none() {
            assert!(
                in_use.is_empty() && reserved.is_empty() && peak.is_empty(),
                "{name} has no pools but the log reads some"
            );
            println!("{name}: no pools, no allocator lines");
            continue;
        }
        assert_eq!(
            (in_use.len(), reserved.len(), peak.len()),
            (2, 2, 2),
            "{name}: one reading per logged step"
        );
        println!(
            "{name}: in use {in_use:?} MiB, reserved {reserved:?}, peak {peak:?}; weights {weights_mib:.3} MiB"
        );
        for s in 0..2 {
            assert!(
                in_use[s] >= 3.0 * weights_mib,
                "{name}: {} MiB in use after step {} holds less than the weights and two moments ({} MiB)",
                in_use[s],
                s + 1,
                3.0 * weights_mib
            );
            assert!(
                reserved[s] >= in_use[s] && peak[s] >= reserved[s],
                "{name}: reserved {} / peak {} below the {} MiB in use",
                reserved[s],
                peak[s],
                in_use[s]
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The Recurrent Memory Transformer in the stack: its invalid combinations refused by name,
//! its memory carried, reset and checkpointed, its backpropagation through `k` segments
//! checked against finite differences, and its sharded unroll against one replica; its
//! memory-replay backpropagation against the one-graph unroll; RMT + Transformer-XL.

use burn::module::Param;
use burn::tensor::{Int, Tensor, TensorData};
use memzoo_data::Batch;
use memzoo_stack::{
    LayerKind, Residual, RmtConfig, TransformerXl, UnrollSegment, XlConfig, XlState,
};
use memzoo_tests::*;
use memzoo_train::SegmentModel;

fn tiny() -> XlConfig {
    tiny_stack()
        .with_mem_len(0)
        .with_document_resets(true)
        .with_rmt(Some(RmtConfig::new().with_mem_tokens(3)))
}

fn tokens(batch: usize, len: usize, seed: usize) -> Tensor<2, Int> {
    let data: Vec<i64> = (0..batch * len)
        .map(|i| ((i * 37 + seed * 101 + 11) % 256) as i64)
        .collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), &flex())
}

#[test]
fn rmt_refuses_invalid_combinations_by_name() {
    let dev = flex();
    let err = |c: XlConfig| c.init(&dev).unwrap_err().to_string();
    assert!(err(tiny().with_residual(Residual::Reversible)).contains("Reversible"));
    assert!(err(tiny().with_layers(vec![LayerKind::Xl, LayerKind::Lsh])).contains("Lsh"));
    assert!(err(tiny().with_layers(vec![LayerKind::Xl, LayerKind::Knn])).contains("Knn"));
    let zero = RmtConfig::new().with_mem_tokens(0);
    assert!(err(tiny().with_rmt(Some(zero))).contains("rmt.mem_tokens"));
    let zero = RmtConfig::new().with_bptt_segments(0);
    assert!(err(tiny().with_rmt(Some(zero))).contains("rmt.bptt_segments"));
    let cmp = tiny().with_compressive(Some(memzoo_stack::CompressiveConfig::new()));
    assert!(err(cmp.with_mem_len(4)).contains("compressive"));
    assert_eq!(tiny().init(&dev).unwrap().stack_family(), "rmt");
}

/// The memory is carried (the second segment reads differently than with a fresh memory), a
/// reset row reads as a fresh state does, `without_carried_memory` reads every segment
/// fresh, and the memory survives a checkpoint.
#[test]
fn rmt_memory_is_carried_reset_and_checkpointed() {
    let dev = flex();
    for peer_layout in [false, true] {
        let cfg = tiny().with_rmt(Some(
            RmtConfig::new()
                .with_mem_tokens(3)
                .with_peer_layout(peer_layout)
                .with_causal_memory(!peer_layout),
        ));
        let model = cfg.init(&dev).unwrap();
        let mut state = XlState::new();
        model
            .forward_state(tokens(2, 5, 0), &mut state, &[false, false])
            .unwrap();
        let mem = state.rmt.value.clone().unwrap();
        assert_eq!(mem.dims(), [2, 3, 16]);
        let carried = |s: &XlState| {
            let mut c = XlState::new();
            c.rmt = s.rmt.clone();
            c
        };
        assert_carried_and_reset(&model, &state, carried, tokens(2, 5, 1));

        let dir =
            std::env::temp_dir().join(format!("memzoo-rmt-{}-{peer_layout}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TransformerXl::save_state(&state, &dir).unwrap();
        let back = model.load_state(&dir, &dev).unwrap();
        assert_eq!(host(back.rmt.value.unwrap()), host(mem));
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn segments(k: usize, batch: usize) -> Vec<UnrollSegment> {
    (0..k)
        .map(|s| UnrollSegment {
            inputs: tokens(batch, 4, s).to_device(&flex().autodiff()),
            targets: tokens(batch, 4, s + 7).to_device(&flex().autodiff()),
            reset: vec![false; batch],
            weights: None,
        })
        .collect()
}

/// The gradient of a 3-segment unroll along a random direction of the initial memory (which
/// reaches the second and third segments only through the written memories) matches central
/// finite differences of the unrolled loss.
#[test]
fn rmt_backpropagates_through_segments() {
    let dev = flex().autodiff();
    let cfg = tiny().with_rmt(Some(
        RmtConfig::new().with_mem_tokens(3).with_bptt_segments(3),
    ));
    // Weights drawn from a seeded generator at the init's scale: the same model every run.
    let mut model = seeded_weights(cfg.init(&dev).unwrap(), 17, |_: &str| 0.02);
    // Unit-scale memory tokens, so that a step of `eps` is small against them.
    let r = model.rmt.as_mut().unwrap();
    r.memory = Param::from_tensor(randn([3, 16], 9, &dev));
    let loss = |m: &TransformerXl| {
        let (l, g) = m.train_unroll(segments(3, 2), &mut XlState::new()).unwrap();
        (l.into_scalar::<f64>(), g)
    };
    let (_, grads) = loss(&model);
    let id = model.rmt.as_ref().unwrap().memory.id;
    let g = host(grads.get::<2>(id).unwrap());
    // Along the gradient itself: the largest directional derivative, ‖g‖ (~2.6e-4). Along a
    // random direction it was ~5e-5, and the loss differences were a few float32 steps of a
    // loss near 5.5 (one step is 4.8e-7): machines whose products round differently (AVX-512
    // or not) then disagreed by more than the tolerance.
    let dir = Tensor::<2>::from_data(TensorData::new(g.clone(), [3, 16]), &dev);
    let dir = dir
        .clone()
        .div_scalar(dir.powf_scalar(2.0).sum().sqrt().into_scalar::<f32>());
    let v = host(dir.clone());
    let analytic: f64 = g.iter().zip(&v).map(|(a, b)| f64::from(a * b)).sum();
    let shifted = |eps: f32| {
        let mut m = model.clone();
        let r = m.rmt.as_mut().unwrap();
        let w = r.memory.val() + dir.clone().mul_scalar(eps);
        r.memory = Param::from_tensor(w.detach());
        loss(&m).0
    };
    // A step of 0.1 against unit-scale tokens: the loss moves by ~100 float32 steps, and
    // the curvature term stays well under the tolerance (1e-2: 0.00023838, 1e-1: 0.00025749,
    // backward 0.00025910).
    let eps = 1e-1;
    let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * f64::from(eps));
    assert!(
        (analytic - numeric).abs() < 0.03 * numeric.abs(),
        "d loss / d memory along v: backward {analytic:.6}, finite differences {numeric:.6}"
    );
    // With the memory detached after every segment the gradient is another one.
    let mut state = XlState::new();
    let mut cut = vec![0.0f32; g.len()];
    for s in segments(3, 2) {
        let (_, gs) = model.train_unroll(vec![s], &mut state).unwrap();
        // Past the first segment the initial memory is not read: no gradient.
        if let Some(gs) = gs.get::<2>(id) {
            for (c, x) in cut.iter_mut().zip(host(gs)) {
                *c += x / 3.0;
            }
        }
    }
    assert!(
        max_abs_diff(&cut, &g) > 1e-5,
        "k = 3 reaches past the first segment"
    );
    assert!(!state.rmt.value.unwrap().is_require_grad());
}

fn batch(k: usize, rows: usize, len: usize) -> Vec<Batch> {
    (0..k)
        .map(|s| {
            let x: Vec<i64> = (0..rows * len)
                .map(|i| ((i * 13 + s * 29) % 256) as i64)
                .collect();
            let y: Vec<i64> = (0..rows * len)
                .map(|i| ((i * 7 + s * 31 + 1) % 256) as i64)
                .collect();
            Batch::new(rows, len, x, y).unwrap()
        })
        .collect()
}

/// Two replicas, each unrolling its rows of two segments, give one replica's loss and
/// gradients (and carry the same memories).
#[test]
fn rmt_sharded_unroll_matches_one_replica() {
    let dev = flex().autodiff();
    let model = tiny().init(&dev).unwrap();
    let segs = batch(2, 4, 5);
    let run = |r: usize| {
        let mut states: Vec<XlState> = (0..r).map(|_| XlState::new()).collect();
        let placement = vec![dev.clone(); r];
        let (loss, grads) = memzoo_train::unroll::train_unroll_streamed(
            &model,
            &dev,
            &placement,
            &segs,
            &mut states,
            None,
        )
        .unwrap();
        (loss, param_vectors(&model, Some(&grads)))
    };
    let (l1, g1) = run(1);
    let (l2, g2) = run(2);
    assert!((l1 - l2).abs() < 1e-5, "{l1} vs {l2}");
    for (a, b) in g1.iter().zip(&g2) {
        match (a, b) {
            (Some(a), Some(b)) => assert_close(a, b, 1e-5, "gradient"),
            (a, b) => assert_eq!(a.is_some(), b.is_some()),
        }
    }
}

/// Memory-replay backpropagation is the one-graph unroll: over three segments, with seeded
/// dropout and a row starting a new document in the middle, in both memory layouts, the same
/// losses, every gradient and the carried memory.
#[test]
fn rmt_memory_replay_matches_the_unroll() {
    let dev = flex().autodiff();
    for peer_layout in [false, true] {
        let rmt = RmtConfig::new()
            .with_mem_tokens(3)
            .with_bptt_segments(3)
            .with_peer_layout(peer_layout);
        let model = tiny()
            .with_dropout(0.1)
            .with_rmt(Some(rmt))
            .init(&dev)
            .unwrap();
        // Weights at scale 0.3, so that the memory carries weight from segment to segment.
        let model = seeded_weights(model, 13, |_: &str| 0.3).with_dropout_seed(Some(7));
        let mut replayed = model.clone();
        replayed.rmt.as_mut().unwrap().config.memory_replay = true;
        let segs = || {
            let mut s = segments(3, 2);
            s[1].reset[1] = true;
            s
        };
        let compared = assert_replay_matches_unroll(&model, &replayed, segs);
        assert!(compared >= 20, "{compared} gradients compared");
    }
    // A model whose parameters are not drawn yet: every one gets its gradient.
    let rmt = RmtConfig::new()
        .with_mem_tokens(3)
        .with_bptt_segments(3)
        .with_memory_replay(true);
    let lazy = tiny().with_rmt(Some(rmt)).init(&dev).unwrap();
    let (_, grads) = lazy
        .train_unroll(segments(3, 2), &mut XlState::new())
        .unwrap();
    let got = param_vectors(&lazy, Some(&grads));
    assert!(
        got.iter().all(Option::is_some),
        "a parameter without gradient"
    );
    // Without dropout and without a dropout seed (the replay draws one for its step).
    let rmt = RmtConfig::new().with_mem_tokens(3).with_bptt_segments(3);
    let model = seeded_weights(
        tiny().with_rmt(Some(rmt)).init(&dev).unwrap(),
        5,
        |_: &str| 0.3,
    );
    let mut replayed = model.clone();
    replayed.rmt.as_mut().unwrap().config.memory_replay = true;
    assert_replay_matches_unroll(&model, &replayed, || segments(3, 2));
}

/// Through the trainer (a model as `memzoo train` builds it, its parameters initialised
/// lazily), memory replay trains exactly as the one-graph unroll: the same loss at every step
/// and the same weights after four.
#[test]
fn rmt_memory_replay_trains_as_the_unroll() {
    let dev = flex().autodiff();
    let rmt = RmtConfig::new().with_mem_tokens(3).with_bptt_segments(3);
    let model = tiny().with_rmt(Some(rmt)).init(&dev).unwrap();
    // The same weights for both: drawn now, in the module's order (a lazy parameter is drawn
    // at its first read, and the replay reads them all before its first segment).
    let _ = param_vectors(&model, None);
    let run = |replay: bool| {
        let mut model = model.clone();
        model.rmt.as_mut().unwrap().config.memory_replay = replay;
        let dir =
            std::env::temp_dir().join(format!("memzoo-replay-{}-{replay}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let options = memzoo_train::RunOptions {
            run_dir: dir.clone(),
            resume: false,
            quiet: true,
        };
        let mut data = memzoo_data::OrderedBatcher::new(small_corpus(), 4, 8)
            .unwrap()
            .drop_last(true);
        let config = memzoo_train::TrainConfig::sized(4, 4, 8)
            .with_replicas(Some(1))
            .with_log_every(1)
            .with_eval_every(0)
            .with_checkpoint_every(0)
            .with_schedule(
                memzoo_train::ScheduleConfig::new()
                    .with_lr(3e-3)
                    .with_warmup(1),
            );
        let out = memzoo_train::train_on_devices(
            model,
            &config,
            std::slice::from_ref(&dev),
            &mut data,
            None,
            &options,
        )
        .unwrap();
        let losses = train_losses(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let weights: Vec<f32> = param_vectors(&out.model, None)
            .into_iter()
            .flat_map(|p| p.unwrap())
            .collect();
        (losses, weights)
    };
    let (l1, w1) = run(false);
    let (l2, w2) = run(true);
    assert_eq!(l1.len(), 4);
    for (a, b) in l1.iter().zip(&l2) {
        assert!((a - b).abs() < 1e-5, "losses {l1:?} vs {l2:?}");
    }
    assert_close(&w1, &w2, 1e-5, "weights after 4 steps");
}

/// RMT + Transformer-XL (`mem_len > 0`): the first segment reads as the RMT alone (same
/// weights, no XL memory yet); the XL memory holds the segment tokens' layer inputs, sliding
/// by the segment; the next segment reads it (emptying it changes the output); a row starting
/// a document reads as a fresh row; and memory replay through it is the one-graph unroll.
#[test]
fn rmt_with_an_xl_memory() {
    let dev = flex();
    let model = seeded_weights(tiny().with_mem_len(6).init(&dev).unwrap(), 3, |_: &str| 0.3);
    let alone = model.clone().with_mem_len(0);
    let read = |m: &TransformerXl, s: &mut XlState, t: Tensor<2, Int>, reset: [bool; 2]| {
        host(m.forward_state(t, s, &reset).unwrap())
    };
    let (mut s, mut a) = (XlState::new(), XlState::new());
    let first = read(&model, &mut s, tokens(2, 5, 0), [false; 2]);
    assert_close(
        &first,
        &read(&alone, &mut a, tokens(2, 5, 0), [false; 2]),
        1e-5,
        "first",
    );
    assert_eq!((s.xl.len(), s.xl.n_layers()), (5, 2));
    let before: Vec<Vec<f32>> = (0..2)
        .map(|l| host(s.xl.layer(l).unwrap().clone()))
        .collect();
    let mut emptied = XlState::new();
    emptied.rmt = s.rmt.clone();
    let next = read(&model, &mut s, tokens(2, 5, 1), [false, true]);
    // The window slid by 5: the oldest kept position is the first segment's last (row 0).
    let d = 16;
    for (l, b) in before.iter().enumerate() {
        let after = host(s.xl.layer(l).unwrap().clone());
        assert_eq!(s.xl.len(), 6);
        assert_eq!(&after[..d], &b[4 * d..5 * d], "layer {l}");
    }
    let no_xl = read(&model, &mut emptied, tokens(2, 5, 1), [false, true]);
    let half = next.len() / 2;
    assert!(
        max_abs_diff(&next[..half], &no_xl[..half]) > 1e-4,
        "row 0 reads the XL memory"
    );
    // Row 1 starts a document: neither memory reaches it.
    let fresh = read(&model, &mut XlState::new(), tokens(2, 5, 1), [false; 2]);
    assert_close(
        &next[half..],
        &fresh[half..],
        1e-5,
        "row 1 reads as a fresh row",
    );
    // Memory replay through the XL memory (and a reset) is the one-graph unroll.
    let ad = flex().autodiff();
    let rmt = RmtConfig::new().with_mem_tokens(3).with_bptt_segments(3);
    let cfg = tiny().with_mem_len(6).with_rmt(Some(rmt));
    let model = seeded_weights(cfg.init(&ad).unwrap(), 4, |_: &str| 0.3);
    let mut replayed = model.clone();
    replayed.rmt.as_mut().unwrap().config.memory_replay = true;
    let segs = || {
        let mut s = segments(3, 2);
        s[2].reset[0] = true;
        s
    };
    assert_replay_matches_unroll(&model, &replayed, segs);
}

//! Generation (`memzoo_train::generate`): the sampler against naive formulas, and for every
//! family the cached generator (state carried across completed segments, the current segment
//! read again per token) against recomputing the whole context for every token.
//!
//! The models' weights come from a seeded host generator ([`seeded_weights`]), not Burn's
//! device RNG (which concurrently running tests share).

use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo::commands::{self, GenerateOptions};
use memzoo::config::RunConfig;
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::{LshConfig, MemorizingConfig, ReformerConfig, XlMemory};
use memzoo_tests::*;
use memzoo_train::generate::{
    GenerateConfig, GenerateError, Generator, SampleConfig, generate, generate_recompute,
    recompute_logits,
};
use memzoo_train::{RecurrentModel, SegmentModel};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Distinct seeded logits.
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect()
}

/// Naive `softmax(l / T)` over the tokens in `keep`, in f64.
fn naive_softmax(l: &[f32], t: f64, keep: &[usize]) -> Vec<f64> {
    let e: Vec<f64> = keep.iter().map(|&i| (l[i] as f64 / t).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// The sampler keeps exactly the top-k set (the k largest logits) and the top-p set (the
/// fewest most likely tokens reaching p), with renormalised softmax(l / T) probabilities.
#[test]
fn sampler_keeps_the_top_k_and_top_p_sets_of_the_naive_formulas() {
    let v = 12;
    for seed in 0..5 {
        let l = logits(v, seed);
        for t in [0.3, 1.0, 2.5] {
            for k in [None, Some(1), Some(3), Some(7), Some(v), Some(v + 5)] {
                for p in [None, Some(0.05), Some(0.5), Some(0.9), Some(1.0)] {
                    let what = format!("seed {seed}, T {t}, top_k {k:?}, top_p {p:?}");
                    let sampler = SampleConfig::new()
                        .with_temperature(t)
                        .with_top_k(k)
                        .with_top_p(p)
                        .init()
                        .unwrap();
                    let got = sampler.distribution(&l).unwrap();
                    // top-k: token i is kept when fewer than k tokens have a larger logit.
                    let mut keep: Vec<usize> = (0..v)
                        .filter(|&i| k.is_none_or(|k| l.iter().filter(|&&x| x > l[i]).count() < k))
                        .collect();
                    let mut probs = naive_softmax(&l, t, &keep);
                    // top-p: the fewest tokens, most likely first, whose probability reaches p.
                    if let Some(p) = p {
                        let mut idx: Vec<usize> = (0..keep.len()).collect();
                        idx.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap());
                        let (mut sum, mut n) = (0.0, 0);
                        while n < idx.len() && sum < p - 1e-12 {
                            sum += probs[idx[n]];
                            n += 1;
                        }
                        let kept: Vec<usize> = idx[..n].iter().map(|&j| keep[j]).collect();
                        keep.retain(|i| kept.contains(i));
                        probs = naive_softmax(&l, t, &keep);
                    }
                    let mut got_set: Vec<usize> = got.iter().map(|&(i, _)| i).collect();
                    got_set.sort_unstable();
                    assert_eq!(got_set, keep, "{what}: kept set");
                    for (&i, &q) in keep.iter().zip(&probs) {
                        let g = got.iter().find(|&&(j, _)| j == i).unwrap().1;
                        assert!((g - q).abs() < 1e-9, "{what}: p({i}) {g} vs naive {q}");
                    }
                }
            }
        }
    }
}

/// Temperature 0 is the argmax (lowest id on a tie); a tiny temperature puts all the mass there.
#[test]
fn temperature_zero_is_the_argmax() {
    for seed in 0..20 {
        let l = logits(30, 100 + seed);
        let argmax = (0..l.len()).fold(0, |best, i| if l[i] > l[best] { i } else { best });
        let mut greedy = SampleConfig::new()
            .with_temperature(0.0)
            .with_seed(seed)
            .init()
            .unwrap();
        for _ in 0..3 {
            assert_eq!(greedy.sample(&l).unwrap(), argmax, "seed {seed}");
        }
        let cold = SampleConfig::new().with_temperature(1e-4).init().unwrap();
        let d = cold.distribution(&l).unwrap();
        assert_eq!(d[0].0, argmax);
        assert!(d[0].1 > 1.0 - 1e-12, "T 1e-4: p(argmax) = {}", d[0].1);
    }
    let tie = [1.0, 3.0, 0.5, 3.0];
    let mut greedy = SampleConfig::new().with_temperature(0.0).init().unwrap();
    assert_eq!(
        greedy.sample(&tie).unwrap(),
        1,
        "a tie goes to the lower id"
    );
}

/// A seeded large draw: frequencies within 5 standard errors of softmax(l / T) (with top-k:
/// renormalised over the k largest, nothing else ever drawn); the same seed replays the draw.
#[test]
fn seeded_draws_follow_the_softmax() {
    let l = [0.3f32, -1.2, 2.0, 0.9, -0.4, 1.5];
    let n = 40_000;
    for (t, k) in [(1.0, None), (0.7, None), (1.6, Some(3))] {
        let config = SampleConfig::new()
            .with_temperature(t)
            .with_top_k(k)
            .with_seed(42);
        let mut sampler = config.init().unwrap();
        let draws: Vec<usize> = (0..n).map(|_| sampler.sample(&l).unwrap()).collect();
        let keep: Vec<usize> = match k {
            None => (0..l.len()).collect(),
            Some(_) => vec![2, 5, 3],
        };
        let p = naive_softmax(&l, t, &keep);
        for (i, count) in (0..l.len()).map(|i| (i, draws.iter().filter(|&&d| d == i).count())) {
            let f = count as f64 / n as f64;
            let q = keep.iter().position(|&j| j == i).map_or(0.0, |j| p[j]);
            let bound = 5.0 * (q * (1.0 - q) / n as f64).sqrt();
            assert!(
                (f - q).abs() <= bound,
                "T {t}, top_k {k:?}: token {i} drawn {f:.4}, softmax {q:.4} (bound {bound:.4})"
            );
        }
        let mut again = config.init().unwrap();
        assert!(draws[..100].iter().all(|&d| again.sample(&l).unwrap() == d));
    }
}

/// Bad settings are errors naming the value; so are logits that cannot be sampled from.
#[test]
fn bad_sampler_values_are_refused_naming_them() {
    let base = SampleConfig::new;
    for (what, config, expect) in [
        ("temperature NaN", base().with_temperature(f64::NAN), "NaN"),
        ("temperature negative", base().with_temperature(-1.0), "-1"),
        (
            "temperature infinite",
            base().with_temperature(f64::INFINITY),
            "inf",
        ),
        ("top_p NaN", base().with_top_p(Some(f64::NAN)), "NaN"),
        ("top_p 0", base().with_top_p(Some(0.0)), "got 0"),
        ("top_p above 1", base().with_top_p(Some(1.5)), "1.5"),
        ("top_p negative", base().with_top_p(Some(-0.1)), "-0.1"),
        ("top_k 0", base().with_top_k(Some(0)), "got 0"),
    ] {
        let err = config
            .init()
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        let msg = err.to_string();
        let name = what.split(' ').next().unwrap();
        assert!(msg.contains(name) && msg.contains(expect), "{what}: {msg}");
    }
    let mut sampler = base().init().unwrap();
    let msg = sampler.sample(&[0.0, f32::NAN]).unwrap_err().to_string();
    assert!(msg.contains("NaN") && msg.contains("token 1"), "{msg}");
    assert!(sampler.sample(&[]).is_err());
}

/// A fixed pseudo-random walk of tokens, independent of both generators.
fn walk(n: usize, vocab: usize, seed: usize) -> Vec<i64> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13 + 3) % vocab) as i64)
        .collect()
}

/// The cached generator against recomputation, token by token: after reading `prompt` and
/// then each token of `walk`, the next-token logits agree to 1e-4; then `generate` and
/// `generate_recompute` draw the same tokens (greedy and sampled). Returns the generator's
/// completed segments.
fn check_cached_equals_recomputed<M: SegmentModel>(
    model: &M,
    segment_len: usize,
    prompt: &[i64],
    new: usize,
    dev: &Device,
    what: &str,
) -> usize {
    let mut generator = Generator::new(model, segment_len, dev).unwrap();
    generator.read(prompt).unwrap();
    let mut context = prompt.to_vec();
    let mut worst = 0f32;
    for (step, next) in walk(new, model.vocab_size(), 1).into_iter().enumerate() {
        let cached = generator.next_logits().unwrap();
        let full = recompute_logits(model, &context, segment_len, dev).unwrap();
        assert!(cached.iter().all(|x| x.is_finite()), "{what}: step {step}");
        worst = worst.max(max_abs_diff(&cached, &full));
        generator.read(&[next]).unwrap();
        context.push(next);
    }
    assert!(
        worst < 1e-4,
        "{what}: cached vs recomputed logits: max |diff| = {worst:e}"
    );
    assert!(
        context.len() > 2 * segment_len,
        "{what}: fewer than two segment boundaries crossed"
    );
    for (t, k, p) in [
        (0.0, None, None),
        (1.0, None, None),
        (0.8, Some(5), Some(0.9)),
    ] {
        let config = GenerateConfig::new(new, segment_len).with_sampler(
            SampleConfig::new()
                .with_temperature(t)
                .with_top_k(k)
                .with_top_p(p)
                .with_seed(9),
        );
        let a = generate(model, prompt, &config, dev).unwrap().tokens;
        let b = generate_recompute(model, prompt, &config, dev)
            .unwrap()
            .tokens;
        assert_eq!(a.len(), new);
        assert_eq!(
            a, b,
            "{what}, temperature {t}: cached and recomputed tokens differ"
        );
    }
    generator.segments()
}

/// Transformer-XL: segments of 4 and one-token steps over a memory of 6 (shorter than the
/// context), and one-token steps over a memory covering the context, which equal one causal
/// pass over the whole context (computed here directly, without the generator).
#[test]
fn xl_cached_generation_equals_recomputation() {
    let dev = flex();
    let model = seeded_weights(small_xl(6).init(&dev).unwrap(), 1, |_| 0.2);
    let prompt = walk(5, 40, 7);
    let segments =
        check_cached_equals_recomputed(&model, 4, &prompt, 12, &dev, "xl, segments of 4");
    assert_eq!(segments, (5 + 12) / 4);
    // One-token steps over the memory of 6, sliding: the generator's cache appends in place
    // and moves to new buffers every 16 or so tokens (`XlMemory::begin_append`).
    check_cached_equals_recomputed(
        &model,
        1,
        &prompt,
        40,
        &dev,
        "xl, one-token steps, memory 6",
    );

    // With a memory covering the context, the generator reads the prompt in one pass
    // (`split_free_tokens`): the same logits as token by token.
    let new = 10;
    let model = model.with_mem_len(prompt.len() + new);
    assert_eq!(model.split_free_tokens(), prompt.len() + new);
    check_cached_equals_recomputed(&model, 1, &prompt, new, &dev, "xl, one-token steps");
    let mut generator = Generator::new(&model, 1, &dev).unwrap();
    generator.read(&prompt).unwrap();
    let mut context = prompt.clone();
    let mut worst = 0f32;
    for next in walk(new, 40, 2) {
        let ids =
            Tensor::<2, Int>::from_data(TensorData::new(context.clone(), [1, context.len()]), &dev);
        let hidden = model.forward(ids, &XlMemory::empty()).unwrap().hidden;
        let q = context.len();
        let full = host(model.logits(hidden).narrow(1, q - 1, 1));
        worst = worst.max(max_abs_diff(&generator.next_logits().unwrap(), &full));
        generator.read(&[next]).unwrap();
        context.push(next);
    }
    assert!(
        worst < 1e-4,
        "one-token steps vs one pass: max |diff| = {worst:e}"
    );
    // The generator read through its key/value cache: every layer's memory holds the
    // `[k; v]` of 4 heads of 8 (width 64), not the layer inputs (d_model 32).
    let memory = &generator.state().xl;
    assert_eq!(memory.len(), prompt.len() + new);
    for l in 0..3 {
        assert_eq!(memory.layer(l).unwrap().dims()[2], 2 * 4 * 8, "layer {l}");
    }
    assert!(model.for_generation(1).unwrap().for_generation(1).is_none());
}

/// What `model` keeps of the first two tokens of a document's unfinished segment
/// (`RecurrentModel::peek_continue` from an empty state), which it must keep.
fn first_peek<M: RecurrentModel<State = memzoo_stack::XlState>>(
    model: &M,
    dev: &Device,
    what: &str,
) -> memzoo_stack::XlState {
    let mut peek = None;
    let x = Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 2], [1, 2]), dev);
    let read = model.peek_continue(x, &mut memzoo_stack::XlState::new(), &mut peek, &[false]);
    assert!(read.unwrap().is_some(), "{what}: no peek_continue");
    peek.expect("kept")
}

/// For each `(config, what)`, a seeded model that keeps `(positions, width)` of the first two
/// tokens of a document's unfinished segment ([`first_peek`]), and whose generator equals
/// recomputation over `new` tokens after a prompt of 2, in segments of `len`.
fn check_kept_reads(
    configs: Vec<(memzoo_stack::XlConfig, &str)>,
    seed: u64,
    kept: (usize, usize),
    (new, len): (usize, usize),
    dev: &Device,
) {
    for (config, what) in configs {
        let std = xl_init_std(&config);
        let model = seeded_weights(config.init(dev).unwrap(), seed, std);
        let first = first_peek(&model, dev, what).xl;
        assert_eq!(first.len(), kept.0, "{what}");
        assert_eq!(first.layer(0).unwrap().dims()[2], kept.1, "{what}");
        let prompt = walk(2, 40, 3);
        let segments = check_cached_equals_recomputed(&model, len, &prompt, new, dev, what);
        assert_eq!(segments, (2 + new) / len, "{what}");
    }
}

/// A compressive stack keeps the keys and values of its memories and of its unfinished
/// segment's tokens as it reads them (`RecurrentModel::peek_continue`: a new token is one query
/// that projects only its own, where it was a pass over the segment so far that projected both
/// memories again) and compresses only when a segment completes: the generator equals
/// recomputation across segments whose memories fill, are compressed and fill the compressed
/// memory, with relative (XL) positions, with the lucidrains peer's learned positions counted
/// from the end of a window whose memories are still filling, and with document resets (the
/// generator's first segment starts a document; a run on documents has them).
#[test]
fn compressive_cached_generation_equals_recomputation() {
    use memzoo_stack::CompressiveConfig;
    let dev = flex();
    let compressive = CompressiveConfig::new().with_cmem_len(3).with_ratio(2);
    let xl = small_xl(4).with_compressive(Some(compressive.clone()));
    let learned = small_xl(4)
        .with_pre_ln(true)
        .with_positions(PositionConfig::new().with_kind(PositionKind::Learned))
        .with_compressive(Some(compressive.with_window_end_positions(true)));
    // It keeps every layer's keys and values of the tokens read (4 heads of 8: width 64),
    // not their inputs (d_model 32). Segments of 3 over a memory of 4: the first two
    // segments are read while the memory fills (the learned positions shift), the later
    // ones compress.
    let configs = vec![
        (xl.clone(), "compressive, XL positions"),
        (learned, "compressive, learned"),
        (
            xl.with_document_resets(true),
            "compressive, document resets",
        ),
    ];
    check_kept_reads(configs, 4, (2, 2 * 4 * 8), (19, 3), &dev);
}

/// A Block-Recurrent stack keeps the tokens of its unfinished block after its XL memory as it
/// reads them, reading the carried state and writing none until the block completes: the
/// generator equals recomputation across several blocks, for memzoo's layout (XL positions,
/// the state read and written by the first layer; also with document resets, as the presets
/// have) and for the lucidrains peer's (rotary positions with xPos, one key/value head, the
/// key/value memory of the last block).
#[test]
fn block_recurrent_cached_generation_equals_recomputation() {
    use memzoo_stack::BlockRecurrentConfig;
    let dev = flex();
    let own = small_xl(4).with_block_recurrent(Some(
        BlockRecurrentConfig::new().with_state_len(3).with_layer(0),
    ));
    let peer: memzoo_import::BlockRecurrentPeerConfig = serde_json::from_value(serde_json::json!({
        "num_tokens": 40, "dim": 32, "depth": 3, "heads": 4, "dim_head": 8, "ff_mult": 2,
        "max_seq_len": 8, "block_width": 4, "recurrent_layers": [2], "num_state_vectors": 3,
    }))
    .unwrap();
    let lucidrains = peer.xl_config().unwrap();
    // The tokens' inputs (memzoo's layout: d_model 32) or keys and values (the peer's: one
    // key/value head of 8, width 16).
    let configs = vec![
        (own.clone(), "block-recurrent"),
        (
            own.with_document_resets(true),
            "block-recurrent, document resets",
        ),
    ];
    check_kept_reads(configs, 5, (2, 32), (15, 4), &dev);
    let peer = vec![(lucidrains, "block-recurrent, peer's")];
    check_kept_reads(peer, 5, (2, 2 * 8), (15, 4), &dev);
}

/// An RMT stack keeps the layer inputs of its read tokens (once per segment: they see only
/// each other) and of its unfinished segment's tokens as it reads them, and writes its memory
/// when the segment completes: the generator equals recomputation across several segments, the
/// memory carried, for the paper's layout (a causal mask over the memory tokens, XL positions),
/// with an XL memory of 5 segment tokens before the read tokens (RMT + Transformer-XL), both
/// also with document resets (as the presets have), and for the lucidrains peer's (the read
/// tokens seeing each other, a learned read embedding, learned absolute positions, a null
/// key/value, value residuals, RMSNorm).
#[test]
fn rmt_cached_generation_equals_recomputation() {
    use memzoo_stack::RmtConfig;
    let dev = flex();
    let paper = small_xl(0).with_rmt(Some(RmtConfig::new().with_mem_tokens(3)));
    let with_xl = small_xl(5).with_rmt(Some(RmtConfig::new().with_mem_tokens(3)));
    let peer: memzoo_import::RmtPeerConfig = serde_json::from_value(serde_json::json!({
        "num_tokens": 40, "dim": 32, "depth": 3, "heads": 4, "dim_head": 8,
        "num_memory_tokens": 3, "seq_len": 4, "ff_mult": 2, "use_xl_memories": false,
        "num_residual_streams": 1,
    }))
    .unwrap();
    let lucidrains = peer.xl_config().unwrap();
    // The 3 read tokens' inputs and the 2 tokens' (no XL memory yet), of d_model 32.
    let configs = vec![
        (paper.clone(), "rmt"),
        (with_xl.clone(), "rmt + xl"),
        (lucidrains, "rmt, peer's"),
        (paper.with_document_resets(true), "rmt, document resets"),
        (
            with_xl.with_document_resets(true),
            "rmt + xl, document resets",
        ),
    ];
    check_kept_reads(configs, 6, (3 + 2, 32), (15, 4), &dev);
}

/// A generator's read of an unfinished segment refuses a state or a kept view that does not
/// fit the tokens, naming the shapes, and keeps nothing of the failed read.
#[test]
fn peek_continue_refuses_states_of_another_batch() {
    use memzoo_stack::{CompressiveConfig, RmtConfig, XlState};
    let dev = flex();
    let tokens = |batch: usize| {
        let ids: Vec<i64> = (0..batch * 3).map(|i| (i % 40) as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(ids, [batch, 3]), &dev)
    };
    // A compressive model's memory of two rows, read with one.
    let compressive = small_xl(4).with_compressive(Some(
        CompressiveConfig::new().with_cmem_len(2).with_ratio(2),
    ));
    let model = seeded_weights(
        compressive.init(&dev).unwrap(),
        7,
        xl_init_std(&compressive),
    );
    let mut state = XlState::new();
    model
        .segment_logits(tokens(2), &mut state, &[false, false])
        .unwrap();
    let mut peek = None;
    let err = model
        .peek_continue(tokens(1), &mut state, &mut peek, &[false])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[2, _, 32]") && err.contains("[1, _, 32]"),
        "{err}"
    );
    assert!(peek.is_none());
    // An RMT's kept view of one row, continued with two.
    let rmt = small_xl(0).with_rmt(Some(RmtConfig::new().with_mem_tokens(3)));
    let model = seeded_weights(rmt.init(&dev).unwrap(), 7, xl_init_std(&rmt));
    let mut peek = Some(first_peek(&model, &dev, "rmt"));
    let err = model
        .peek_continue(tokens(2), &mut XlState::new(), &mut peek, &[false, false])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("RMT view") && err.contains("[1, 5, 32]"),
        "{err}"
    );
    assert!(peek.is_none());
}

/// The Memorizing Transformer generates retrieving from its kNN memory and adding to it: the
/// cached generator (read-only views of the memory for the current segment) equals
/// recomputation, and the memory holds exactly the completed segments.
#[test]
fn memorizing_cached_generation_equals_recomputation() {
    let dev = flex();
    let xl = small_xl(4)
        .with_pre_ln(true)
        .with_tie_weights(false)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    let config = |knn| {
        MemorizingConfig::new()
            .with_xl(xl.clone())
            .with_knn_layers(vec![1])
            .with_knn(knn)
    };
    let init = |config: MemorizingConfig| {
        let std = xl_init_std(&config.stack());
        seeded_weights(config.init(&dev).unwrap(), 2, std)
    };
    let model = init(config(tiny_knn()));
    // A kNN layer reads a segment's own keys locally and earlier ones from its memory: the
    // split into segments matters, so a prompt is read segment by segment.
    assert_eq!(model.split_free_tokens(), 0);
    let (prompt, new, len) = (walk(6, 40, 3), 13, 4);
    let segments = check_cached_equals_recomputed(&model, len, &prompt, new, &dev, "memorizing");
    assert_eq!(segments, (6 + 13) / len);
    // Fed with the pairs leaving the XL memory (memorizing-transformers-pytorch) and mixed in
    // one softmax: the generator's cache, which holds each segment's entries after the memory,
    // hands the kNN memory the same pairs.
    let evicted = init(config(
        tiny_knn()
            .with_feed(memzoo_stack::KnnFeed::Evicted)
            .with_mixing(memzoo_knn::KnnMixing::Joint),
    ));
    check_cached_equals_recomputed(
        &evicted,
        len,
        &prompt,
        new,
        &dev,
        "memorizing, evicted feed",
    );

    // After generating: the kNN memory holds every completed segment and nothing of the
    // re-read unfinished one.
    let mut generator = Generator::new(&model, len, &dev).unwrap();
    generator.read(&prompt).unwrap();
    let mut sampler = SampleConfig::new().with_seed(3).init().unwrap();
    generator.sample(&mut sampler, new).unwrap();
    let done = (prompt.len() + new) / len * len;
    assert_eq!(generator.state().knn_len(0, 0), done);
    assert_eq!(generator.state().xl.len(), 4);
    // Retrieval changes the prediction: the same weights with an empty kNN memory differ.
    let mut no_knn = memzoo_stack::MemorizingState::new();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![5i64, 9, 1], [1, 3]), &dev);
    let fresh = host(
        model
            .segment_logits(ids.clone(), &mut no_knn, &[true])
            .unwrap(),
    );
    let mut state = memzoo_stack::MemorizingState::new();
    let context = walk(16, 40, 4);
    for (i, seg) in context.chunks(len).enumerate() {
        let ids = Tensor::<2, Int>::from_data(TensorData::new(seg.to_vec(), [1, len]), &dev);
        model.segment_logits(ids, &mut state, &[i == 0]).unwrap();
    }
    state.xl = XlMemory::empty();
    state.xl_valid.clear();
    let recalled = host(model.segment_logits(ids, &mut state, &[false]).unwrap());
    assert!(
        max_abs_diff(&fresh, &recalled) > 1e-3,
        "the kNN memory changes nothing"
    );
}

/// The Reformer has no state across segments: every token reads the window of the last
/// `segment_len` tokens; cached and recomputed are the same, and tokens before the window do
/// not matter.
#[test]
fn reformer_generation_reads_a_sliding_window() {
    let dev = flex();
    let model = ReformerConfig::new()
        .with_vocab_size(40)
        .with_d_model(16)
        .with_n_layers(2)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_max_seq_len(8)
        .with_attn_layers(vec![
            memzoo_stack::LayerKind::Local,
            memzoo_stack::LayerKind::Lsh,
        ])
        .with_lsh(LshConfig::new().with_chunk_len(2).with_n_rounds(2))
        .with_dropout(0.0)
        .with_axial_positions(false)
        .with_init_std(0.3)
        .init(&dev)
        .unwrap();
    let model = seeded_weights(model, 3, |_| 0.3);
    assert!(
        model.for_generation(6).is_none(),
        "LSH and local layers cache no keys: the model generates as it is"
    );
    let prompt = walk(5, 40, 5);
    let segments = check_cached_equals_recomputed(&model, 6, &prompt, 10, &dev, "reformer");
    assert_eq!(segments, 0, "no state: nothing committed");
    let context = walk(11, 40, 6);
    let mut changed = context.clone();
    changed[0] = (changed[0] + 1) % 40;
    let a = recompute_logits(&model, &context, 6, &dev).unwrap();
    assert!(max_abs_diff(&a, &recompute_logits(&model, &changed, 6, &dev).unwrap()) == 0.0);
    changed[8] = (changed[8] + 1) % 40;
    assert!(max_abs_diff(&a, &recompute_logits(&model, &changed, 6, &dev).unwrap()) > 1e-4);
}

/// Inputs the generator refuses, naming them.
#[test]
fn generator_refuses_bad_inputs_naming_them() {
    let dev = flex();
    let model = small_xl(4).init(&dev).unwrap();
    let msg = |e: GenerateError| e.to_string();
    assert!(msg(Generator::new(&model, 0, &dev).err().unwrap()).contains("segment_len"));
    let mut generator = Generator::new(&model, 4, &dev).unwrap();
    assert!(msg(generator.next_logits().unwrap_err()).contains("prompt is empty"));
    let e = msg(generator.read(&[3, 40]).unwrap_err());
    assert!(e.contains("token 40") && e.contains("0..40"), "{e}");
    let e = msg(recompute_logits(&model, &[-2], 4, &dev).unwrap_err());
    assert!(e.contains("token -2"), "{e}");
    let config = GenerateConfig::new(3, 4);
    assert!(generate(&model, &[], &config, &dev).is_err());
}

/// `memzoo generate` takes a run of every family (trained 2 steps) and refuses bad values
/// naming the flag.
#[test]
fn cli_generates_from_a_run_of_every_family() {
    let dir = std::env::temp_dir().join(format!("memzoo-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let common = [
        "train.batch=2",
        "train.tgt_len=8",
        "train.steps=2",
        "train.eval_segments=1",
    ];
    let families: [(&str, &[&str]); 3] = [
        (
            "xl",
            &[
                "model.n_layers=1",
                "model.d_model=16",
                "model.n_heads=2",
                "model.d_inner=32",
            ],
        ),
        (
            "memorizing",
            &[
                "model.n_layers=2",
                "model.d_model=16",
                "model.n_heads=2",
                "model.d_inner=32",
                "model.layers=[\"t5\", \"knn\"]",
                "model.knn.top_k=4",
                "model.knn.max_memories=64",
            ],
        ),
        ("reformer", &TINY_REFORMER[1..]),
    ];
    let opts = |sampler: SampleConfig, mem_len| GenerateOptions {
        prompt: "ab".into(),
        tokens: 10,
        sampler,
        segment_len: None,
        mem_len,
        compare_recompute: true,
    };
    for (family, sets) in families {
        let run_dir = dir.join(family);
        let mut all = vec![format!("model.preset={family}-tiny")];
        all.extend(common.iter().chain(sets).map(|s| s.to_string()));
        let config = RunConfig::resolve(None, &all).unwrap();
        commands::train(&config, "flex", &run_dir, false, false, true, true).unwrap();
        commands::generate(&run_dir, "flex", &opts(SampleConfig::new(), None), true)
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        if family == "reformer" {
            let e = commands::generate(&run_dir, "flex", &opts(SampleConfig::new(), Some(8)), true)
                .unwrap_err();
            assert!(e.to_string().contains("--mem-len"), "{family}: {e}");
        }
    }
    let xl = dir.join("xl");
    for (flag, sampler) in [
        (
            "--temperature",
            SampleConfig::new().with_temperature(f64::NAN),
        ),
        ("--top-k", SampleConfig::new().with_top_k(Some(0))),
        ("--top-p", SampleConfig::new().with_top_p(Some(1.5))),
    ] {
        let e = commands::generate(&xl, "flex", &opts(sampler, None), true).unwrap_err();
        assert!(e.to_string().contains(flag), "{flag}: {e}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

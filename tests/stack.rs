//! The layer stack: layer kinds per depth, the Memorizing Transformer as its preset, combinations
//! no peer offers, the errors of invalid ones, and checkpoints of the layout before the stack.

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_relative::{AttentionMask, PositionConfig, PositionKind, RelativeContext};
use memzoo_stack::{LayerContext, LayerKind, Randomness, Step, XlConfig, XlMemory, XlState};
use memzoo_stack::{MemorizingConfig, MemorizingState};
use memzoo_tests::*;

/// The fixture's token ids: `[2, 6]` per segment (as the program that wrote it).
fn fixture_tokens(seg: usize, dev: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..12)
        .map(|i| ((i * 7 + seg * 5 + i * i) % 32) as i64)
        .collect();
    Tensor::from_data(TensorData::new(v, [2, 6]), dev)
}

fn tiny() -> XlConfig {
    XlConfig::new()
        .with_vocab_size(32)
        .with_d_model(16)
        .with_n_layers(2)
        .with_n_heads(2)
        .with_d_inner(32)
        .with_mem_len(4)
        .with_dropout(0.0)
}

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/legacy")
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// Checkpoints written by memzoo before the layer stack (tests/fixtures/legacy: an XL with
/// shared u/v, a learned-position XL whose unused shared u/v the old code created, a Memorizing
/// Transformer with its kNN layer at depth 1), loaded into today's models, give the logits the
/// old code computed and stored beside them, over two segments with memory carried.
#[test]
fn checkpoints_from_before_the_stack_load_and_compute_the_same() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let dir = fixture_dir();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let want = |name: &str| -> Vec<f64> {
        expected[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    for (name, config) in [
        ("xl", tiny()),
        (
            "learned",
            tiny().with_positions(
                PositionConfig::new()
                    .with_kind(PositionKind::Learned)
                    .with_max_distance(8),
            ),
        ),
    ] {
        let fresh = config.init(&dev).unwrap();
        // The current layout's loader refuses the old file; the converter takes it.
        assert!(
            fresh
                .clone()
                .try_load_file(dir.join(format!("{name}.bpk")))
                .is_err()
        );
        let (model, converted) =
            memzoo_stack::legacy::load_any(fresh, &dir.join(format!("{name}.bpk"))).unwrap();
        assert!(converted, "{name}: read as the old layout");
        let mut memory = XlMemory::empty();
        let mut logits = Vec::new();
        for s in 0..2 {
            let out = model.forward(fixture_tokens(s, &dev), &memory).unwrap();
            memory = out.memory;
            logits.extend(host(model.logits(out.hidden)));
        }
        let d = max_diff(&logits, &want(name));
        assert!(d < 1e-5, "{name}: max |logit diff| {d}");
    }

    let config = MemorizingConfig::new()
        .with_xl(
            tiny()
                .with_n_layers(3)
                .with_positions(PositionConfig::new().with_kind(PositionKind::T5)),
        )
        .with_knn_layers(vec![1])
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(4)
                .with_max_memories(64),
        );
    let (model, converted) =
        memzoo_stack::legacy::load_any(config.init(&dev).unwrap(), &dir.join("memorizing.bpk"))
            .unwrap();
    assert!(converted);
    assert_eq!(
        model.layer_kinds(),
        [LayerKind::T5, LayerKind::Knn, LayerKind::T5]
    );
    let mut state = MemorizingState::new();
    let mut logits = Vec::new();
    for s in 0..2 {
        let reset = [s == 0, s == 0];
        let h = model
            .forward_state(fixture_tokens(s, &dev), &mut state, &reset)
            .unwrap();
        logits.extend(host(model.logits(h)));
    }
    let d = max_diff(&logits, &want("memorizing"));
    assert!(d < 1e-5, "memorizing: max |logit diff| {d}");

    // A file of another architecture names what does not fit.
    let wrong = tiny().with_d_model(8).init(&dev).unwrap();
    let err = memzoo_stack::legacy::load_any(wrong, &dir.join("xl.bpk")).unwrap_err();
    assert_mentions(&err, &["xl.bpk", "does not fit"], "another architecture");
}

/// A stack of mixed kinds is the composition of its layers, each reading the context of its own
/// position scheme: computed here layer by layer from the modules, against the model's forward.
#[test]
fn a_mixed_stack_composes_its_layers_with_their_own_positions() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let config = tiny()
        .with_n_layers(3)
        .with_positions(PositionConfig::new().with_max_distance(32))
        .with_layers(vec![LayerKind::Xl, LayerKind::T5, LayerKind::Learned]);
    let model = config.init(&dev).unwrap();
    assert_eq!(
        model.layer_kinds(),
        [LayerKind::Xl, LayerKind::T5, LayerKind::Learned]
    );
    let seg0 = fixture_tokens(0, &dev);
    let seg1 = fixture_tokens(1, &dev);
    let first = model.forward(seg0, &XlMemory::empty()).unwrap();
    let got = host(model.forward(seg1.clone(), &first.memory).unwrap().hidden);

    let (qlen, mlen) = (6, 4);
    let mut h = model
        .embedding
        .plain()
        .unwrap()
        .forward(seg1)
        .mul_scalar((16f64).sqrt());
    for (l, kind) in [PositionKind::Xl, PositionKind::T5, PositionKind::Learned]
        .into_iter()
        .enumerate()
    {
        let positions = PositionConfig::new().with_max_distance(32).with_kind(kind);
        let ctx = RelativeContext::new(&positions, 16, qlen, mlen, &AttentionMask::causal(), &dev);
        let mem = first.memory.layer(l).cloned();
        let cx = LayerContext {
            positions: Some(&ctx),
            shared: model.shared_biases.as_ref(),
            knn: None,
            seed: 0,
            opts: None,
            randomness: Randomness::Device,
            trace: None,
        };
        h = model.layers[l].forward(h, mem, cx).unwrap();
    }
    let want = host(h);
    let d = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d < 1e-5, "max |diff| {d}");
}

/// A kNN layer in a stack that no peer offers (XL and learned layers around it) trains: the
/// loss on a repeated batch falls well below its start, and every parameter gets a gradient.
#[test]
fn a_knn_layer_between_xl_and_learned_layers_trains() {
    use burn::optim::GradientsParams;
    let dev = memzoo_backend::parse_device("flex").unwrap().autodiff();
    let config = tiny()
        .with_n_layers(3)
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn, LayerKind::Learned])
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(4)
                .with_max_memories(64),
        );
    let mut model = config.init(&dev).unwrap();
    let mut optim = memzoo_train::TrainConfig::new()
        .with_weight_decay(0.0)
        .optimizer();
    let inputs = fixture_tokens(0, &dev);
    let targets = fixture_tokens(1, &dev);
    let mut first = None;
    let mut last = 0.0;
    for step in 0..60 {
        let mut state = XlState::new();
        // Two segments: the second retrieves the first's pairs from the kNN memory.
        model
            .forward_state(inputs.clone(), &mut state, &[true, true])
            .unwrap();
        assert_eq!(state.knn_len(0, 0), 6);
        let loss = model
            .eval_step(
                inputs.clone(),
                targets.clone(),
                &mut state,
                &Step::default(),
            )
            .map(|s| s.nll.mean())
            .unwrap();
        last = loss.clone().into_scalar::<f64>();
        first.get_or_insert(last);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        if step == 0 {
            assert_eq!(
                grads.len(),
                param_tensors(&model),
                "every parameter has a gradient"
            );
        }
        model = optim.step(3e-3, model, grads);
    }
    let first = first.unwrap();
    assert!(first > 3.0 && last < 0.5 * first, "loss {first} -> {last}");
}

/// Number of float parameter tensors of `model`.
fn param_tensors<M: Module>(model: &M) -> usize {
    struct Count(usize);
    impl burn::module::ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, _: &burn::module::Param<Tensor<D>>) {
            self.0 += 1;
        }
    }
    let mut count = Count(0);
    model.visit(&mut count);
    count.0
}

/// Invalid stacks are errors that say why.
#[test]
fn invalid_stacks_say_why() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    for (config, needle) in [
        (
            tiny().with_layers(vec![LayerKind::Xl]),
            "layers lists 1 kinds",
        ),
        (
            tiny().with_layers(vec![LayerKind::Knn, LayerKind::Knn]),
            "at least one must be a relative-attention layer",
        ),
        (
            tiny()
                .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
                .with_same_length(true),
            "same_length = true is not supported with knn layers",
        ),
        (
            tiny()
                .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
                .with_knn(memzoo_stack::KnnLayerConfig::new().with_top_k(0)),
            "knn.top_k must be positive",
        ),
        (
            tiny().with_recompute_attention(true).with_dropatt(0.1),
            "recompute_attention = true needs dropatt = 0 (got 0.1)",
        ),
    ] {
        let err = config.init(&dev).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    // A stack with kNN layers needs its kNN memory: the memory-only forward says so.
    let model = tiny()
        .with_layers(vec![LayerKind::Xl, LayerKind::Knn])
        .init(&dev)
        .unwrap();
    let err = model
        .forward(fixture_tokens(0, &dev), &XlMemory::empty())
        .unwrap_err()
        .to_string();
    assert!(err.contains("forward_state"), "{err}");
    // The Memorizing preset describes its stack itself.
    let err = MemorizingConfig::new()
        .with_xl(tiny().with_layers(vec![LayerKind::Xl, LayerKind::Xl]))
        .init(&dev)
        .unwrap_err()
        .to_string();
    assert!(err.contains("set by the preset"), "{err}");
    // A relative layer reading the context of another scheme is an error, not a panic.
    let model = tiny().init(&dev).unwrap();
    let t5 = PositionConfig::new().with_kind(PositionKind::T5);
    let ctx = RelativeContext::new(&t5, 16, 6, 0, &AttentionMask::causal(), &dev);
    let x = Tensor::<3>::zeros([2, 6, 16], &dev);
    let cx = LayerContext {
        positions: Some(&ctx),
        shared: model.shared_biases.as_ref(),
        knn: None,
        seed: 0,
        opts: None,
        randomness: Randomness::Device,
        trace: None,
    };
    let err = model.layers[0].forward(x, None, cx).unwrap_err();
    assert_mentions(&err, &["T5", "Xl"], "a layer given another's positions");
}

/// The papers' presets: Transformer-XL's base models have the parameter counts its paper
/// reports (Dai et al. 2019, tables 1 and 2: 41M for enwik8 base, 151M for WikiText-103 base),
/// and every preset validates.
#[test]
fn presets_are_the_papers_configurations() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    for (config, paper) in [
        (XlConfig::enwik8_base(), 41.0e6),
        (XlConfig::wt103_base(), 151.0e6),
    ] {
        let params = config.init(&dev).unwrap().num_params() as f64;
        assert!(
            (params / paper - 1.0).abs() < 0.02,
            "{params} parameters, the paper {paper}"
        );
    }
    assert_eq!(XlConfig::small().n_layers, XlConfig::new().n_layers);
    memzoo_stack::ReformerConfig::enwik8().validate().unwrap();
    memzoo_stack::ReformerConfig::small().validate().unwrap();
    let paper = MemorizingConfig::paper();
    paper.validate().unwrap();
    let kinds = paper.stack().layer_kinds();
    assert_eq!(kinds.len(), 12);
    assert_eq!(
        kinds.iter().position(|&k| k == LayerKind::Knn),
        Some(8),
        "the 9th of 12 layers"
    );
    MemorizingConfig::small().validate().unwrap();

    // The CLI's presets (their schedules too) are checked in tests/config.rs.
}

/// LSH and local layers in an XL stack attend over `cat(memory, segment)` as one causal
/// sequence: the segment's output equals the Reformer layer applied to that sequence by hand
/// (its last `qlen` rows), and a stack of local, LSH, XL and kNN layers — a kNN memory layer in
/// a Reformer-style stack, which no peer offers — trains.
#[test]
fn lsh_and_local_layers_read_memory_and_train_beside_knn() {
    use burn::optim::GradientsParams;
    use memzoo_reformer::ForwardOptions;
    use memzoo_stack::LayerAttention;
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let config = tiny()
        .with_layers(vec![LayerKind::Xl, LayerKind::Lsh])
        .with_lsh(
            memzoo_stack::LshConfig::new()
                .with_chunk_len(4)
                .with_n_rounds(2)
                .with_seed(9),
        );
    let model = config.init(&dev).unwrap();
    let first = model
        .forward(fixture_tokens(0, &dev), &XlMemory::empty())
        .unwrap();
    let seg = fixture_tokens(1, &dev);
    // The stack's layer-1 input, computed through layer 0 by hand.
    let positions = PositionConfig::new();
    let ctx = RelativeContext::new(&positions, 16, 6, 4, &AttentionMask::causal(), &dev);
    let x0 = model
        .embedding
        .plain()
        .unwrap()
        .forward(seg.clone())
        .mul_scalar(4.0);
    let cx = LayerContext {
        positions: Some(&ctx),
        shared: model.shared_biases.as_ref(),
        knn: None,
        seed: 0,
        opts: None,
        randomness: Randomness::Device,
        trace: None,
    };
    let x1 = model.layers[0]
        .forward(x0, first.memory.layer(0).cloned(), cx)
        .unwrap();
    let LayerAttention::Hashed(lsh) = &model.layers[1].attention else {
        panic!("layer 1 is LSH")
    };
    let seq = Tensor::cat(vec![first.memory.layer(1).cloned().unwrap(), x1.clone()], 1);
    let a = lsh
        .forward(seq, None, &ForwardOptions::eval(9 + 1))
        .narrow(1, 4, 6);
    // Post-LN block: h = LN(x + a); out = LN(h + FF(h)).
    let block = &model.layers[1].block;
    let h = block.norm_attention.forward(x1 + a);
    let want = host(block.norm_ff.forward(h.clone() + block.feed_forward(h)));
    let got = host(model.forward(seg, &first.memory).unwrap().hidden);
    let d = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d < 1e-5, "max |diff| {d}");

    // Local, LSH, XL, kNN, trained on a repeated batch: the loss falls well below its start.
    let dev = dev.autodiff();
    let config = tiny()
        .with_n_layers(4)
        .with_layers(vec![
            LayerKind::Local,
            LayerKind::Lsh,
            LayerKind::Xl,
            LayerKind::Knn,
        ])
        .with_lsh(
            memzoo_stack::LshConfig::new()
                .with_chunk_len(4)
                .with_n_rounds(2),
        )
        .with_knn(
            memzoo_stack::KnnLayerConfig::new()
                .with_top_k(4)
                .with_max_memories(64),
        );
    let mut model = config.init(&dev).unwrap();
    let mut optim = memzoo_train::TrainConfig::new()
        .with_weight_decay(0.0)
        .optimizer();
    let (inputs, targets) = (fixture_tokens(0, &dev), fixture_tokens(1, &dev));
    let mut losses = Vec::new();
    for _ in 0..60 {
        let mut state = XlState::new();
        model
            .forward_state(inputs.clone(), &mut state, &[true, true])
            .unwrap();
        let loss = model
            .eval_step(
                inputs.clone(),
                targets.clone(),
                &mut state,
                &Step::default(),
            )
            .map(|s| s.nll.mean())
            .unwrap();
        losses.push(loss.clone().into_scalar::<f64>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(first > 3.0 && last < 0.5 * first, "loss {first} -> {last}");

    // Where the maths does not allow it, the config says why.
    let lsh = tiny().with_layers(vec![LayerKind::Xl, LayerKind::Lsh]);
    let err = lsh.with_document_resets(true).init(&dev).unwrap_err();
    assert_mentions(
        &err,
        &["document_resets", "Lsh"],
        "LSH with document resets",
    );
}

/// Checkpoints of the stack from before the embedding and output became enums (their names
/// `embedding.weight`, `output_bias`, `output.weight`, `output.bias`) load and compute what the
/// model that wrote them computed. The old file is the current record with those names written
/// back (the old names spelled out here, not derived from `memzoo_stack::legacy`).
#[test]
fn checkpoints_from_before_the_output_enums_load() {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let old_name = |n: &str| -> String {
        match n {
            "embedding.Plain.weight" => "embedding.weight".into(),
            "output.Tied" => "output_bias".into(),
            "output.Linear.weight" => "output.weight".into(),
            "output.Linear.bias" => "output.bias".into(),
            other => other.into(),
        }
    };
    for tied in [true, false] {
        let config = tiny().with_tie_weights(tied);
        let model = config.init(&dev).unwrap();
        let bytes = model.clone().into_record().into_bytes().unwrap();
        let reader = burn_pack::Reader::from_bytes(bytes).unwrap();
        let mut renamed = 0;
        let tensors: Vec<burn_pack::Tensor> = reader
            .into_tensors()
            .unwrap()
            .into_iter()
            .map(|t| {
                let (name, dtype, shape, id, bytes) = t.into_parts().unwrap();
                let old = old_name(&name);
                renamed += usize::from(old != name);
                burn_pack::Tensor::new(old, dtype, shape, id, bytes)
            })
            .collect();
        assert_eq!(renamed, if tied { 2 } else { 3 }, "tied = {tied}");
        let path =
            std::env::temp_dir().join(format!("memzoo-pre-enum-{tied}-{}.bpk", std::process::id()));
        burn_pack::Writer::new(tensors)
            .write_to_file(&path)
            .unwrap();
        let fresh = config.init(&dev).unwrap();
        let (loaded, converted) = memzoo_stack::legacy::load_any(fresh, &path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(converted, "tied = {tied}: read as an older layout");
        let x = fixture_tokens(0, &dev);
        let a = model.forward(x.clone(), &XlMemory::empty()).unwrap().hidden;
        let b = loaded.forward(x, &XlMemory::empty()).unwrap().hidden;
        assert_eq!(
            host(model.logits(a)),
            host(loaded.logits(b)),
            "tied = {tied}: logits"
        );
    }
}

/// The vanilla Transformer's absolute positions: the sinusoids of Vaswani et al. (2017)
/// written out here, added to the embeddings (a run of one repeated token gives the same
/// logits at every position without positions, different ones with them), and refused beside
/// a memory or other layer kinds.
#[test]
fn absolute_positions_are_sinusoids_added_to_the_embedding() {
    use memzoo_train::RecurrentModel;
    let dev = flex();
    let pe = host(memzoo_stack::absolute_positions(5, 8, &dev));
    for p in 0..5 {
        for k in 0..4 {
            let angle = p as f64 / 10000f64.powf(2.0 * k as f64 / 8.0);
            assert!(
                (pe[p * 8 + k] as f64 - angle.sin()).abs() < 1e-6,
                "sin p {p} k {k}"
            );
            assert!(
                (pe[p * 8 + 4 + k] as f64 - angle.cos()).abs() < 1e-6,
                "cos p {p} k {k}"
            );
        }
    }
    let vanilla = tiny()
        .with_mem_len(0)
        .with_positions(PositionConfig::new().with_kind(PositionKind::Absolute));
    let tokens = || Tensor::<2, Int>::from_data(TensorData::new(vec![3i64; 6], [1, 6]), &dev);
    let logits = |cfg: &XlConfig| {
        dev.seed(5);
        let model = cfg.init(&dev).unwrap();
        let mut state = Default::default();
        host(RecurrentModel::segment_logits(&model, tokens(), &mut state, &[false]).unwrap())
    };
    let spread = |l: &[f32]| {
        (1..6)
            .map(|p| {
                (0..32)
                    .map(|v| (l[p * 32 + v] - l[v]).abs())
                    .fold(0.0f32, f32::max)
            })
            .fold(0.0f32, f32::max)
    };
    // In a run of equal tokens every key and value is the same, so only the positions added
    // to the embedding can make one position's logits differ from another's.
    assert!(
        spread(&logits(&vanilla)) > 1e-3,
        "absolute positions change nothing"
    );
    let err = |cfg: XlConfig| cfg.init(&dev).map(|_| ()).unwrap_err().to_string();
    let e = err(vanilla.clone().with_mem_len(4));
    assert!(
        e.contains("absolute positions index") && e.contains("mem_len = 4"),
        "{e}"
    );
    let e = err(vanilla
        .clone()
        .with_layers(vec![LayerKind::Absolute, LayerKind::Xl]));
    assert!(e.contains("all layers must be absolute"), "{e}");
}

/// `same_length` holds where documents reset the memory too (the explicit per-row mask keeps
/// the window of `mem_len` keys per query): a row that never resets reads exactly as in a
/// stream, and a row that resets reads its new document as a fresh model does.
#[test]
fn same_length_holds_with_document_resets() {
    use burn::tensor::s;
    use memzoo_train::RecurrentModel;
    let dev = flex();
    dev.seed(3);
    let stream = tiny().with_same_length(true).init(&dev).unwrap();
    let mut docs = stream.clone();
    docs.document_resets = true;
    let (mut s_stream, mut s_docs, mut s_fresh) =
        (Default::default(), Default::default(), Default::default());
    for seg in 0..3 {
        let tokens = fixture_tokens(seg, &dev);
        // Row 1 starts a new document at segment 1.
        let reset = [seg == 0, seg <= 1];
        let a = host(
            RecurrentModel::segment_logits(&stream, tokens.clone(), &mut s_stream, &[false, false])
                .unwrap(),
        );
        let b = host(
            RecurrentModel::segment_logits(&docs, tokens.clone(), &mut s_docs, &reset).unwrap(),
        );
        let row = 6 * 32;
        let d0: Vec<f64> = a[..row].iter().map(|&x| x as f64).collect();
        assert!(
            max_diff(&b[..row], &d0) < 1e-5,
            "segment {seg}: row 0 differs from the stream"
        );
        if seg >= 1 {
            let alone = tokens.slice(s![1..2, 0..6]);
            let f = host(
                RecurrentModel::segment_logits(&stream, alone, &mut s_fresh, &[seg == 1]).unwrap(),
            );
            let f: Vec<f64> = f.iter().map(|&x| x as f64).collect();
            assert!(
                max_diff(&b[row..], &f) < 1e-5,
                "segment {seg}: row 1 differs from a fresh read"
            );
        }
    }
}

/// Training with varied memory lengths (`train_memory_lengths`): a step that draws `m` reads
/// only the most recent `m` memory positions — its loss is the loss of the same weights given
/// a state holding just those — and adds its positions to the whole memory, which keeps
/// `mem_len`. The draws cover the list; a stack with another memory refuses it by name.
#[test]
fn training_with_varied_memory_lengths_reads_the_most_recent_positions() {
    let dev = flex().autodiff();
    let (mem_len, read) = (8, 3);
    let config = tiny()
        .with_mem_len(mem_len)
        .with_randomness(Randomness::Seeded);
    let varied = config.clone().with_train_memory_lengths(vec![read]);
    let plain = config.init(&dev).unwrap();
    let model = varied
        .init(&dev)
        .unwrap()
        .load_record(plain.clone().into_record());
    // A whole memory of 8 positions, from two segments of 6.
    let mut full = XlState::new();
    for s in 0..2 {
        plain
            .forward_state(fixture_tokens(s, &dev), &mut full, &[false, false])
            .unwrap();
    }
    assert_eq!(full.xl.len(), mem_len);
    let whole = || {
        let mut s = XlState::new();
        s.xl = full.xl.clone();
        s
    };
    let (x, y) = (fixture_tokens(2, &dev), fixture_tokens(3, &dev));
    let step = Step::default().with_options(plain.eval_options());
    // The varied model on the whole memory ...
    let mut state = whole();
    let (loss, _) = model
        .train_step(x.clone(), y.clone(), &mut state, &step)
        .unwrap();
    // ... is the plain model on the 3 most recent positions.
    let mut recent = XlState::new();
    recent.xl = XlMemory::from_layers(
        (full.xl.layers().iter())
            .map(|m| m.clone().narrow(1, mem_len - read, read))
            .collect(),
    )
    .unwrap();
    let (want, _) = plain.train_step(x, y, &mut recent, &step).unwrap();
    let (loss, want) = (host(loss)[0], host(want)[0]);
    assert!((loss - want).abs() < 1e-5, "loss {loss} vs {want}");
    // The memory kept: the whole memory's last 2, then the segment's 6 positions (the layer
    // inputs of the pass that read 3).
    assert_eq!(state.xl.len(), mem_len);
    for l in 0..2 {
        let got = host(state.xl.layer(l).unwrap().clone());
        let old = host(full.xl.layer(l).unwrap().clone().narrow(1, mem_len - 2, 2));
        let kept = recent.xl.len();
        let new = host(recent.xl.layer(l).unwrap().clone().narrow(1, kept - 6, 6));
        let d = 16;
        for b in 0..2 {
            let row = &got[b * mem_len * d..(b + 1) * mem_len * d];
            assert_eq!(
                &row[..2 * d],
                &old[b * 2 * d..(b + 1) * 2 * d],
                "layer {l} row {b}"
            );
            assert_eq!(
                &row[2 * d..],
                &new[b * 6 * d..(b + 1) * 6 * d],
                "layer {l} row {b}"
            );
        }
    }
    // Draws per step from the list: over 30 steps, each of three lengths.
    let lengths = vec![0, 4, 8];
    let model = (tiny().with_mem_len(mem_len))
        .with_train_memory_lengths(lengths.clone())
        .with_randomness(Randomness::Seeded)
        .init(&dev)
        .unwrap()
        .load_record(plain.clone().into_record());
    let mut seen = std::collections::BTreeSet::new();
    for s in 0..30 {
        let (x, y) = (fixture_tokens(s, &dev), fixture_tokens(s + 1, &dev));
        let mut state = whole();
        let (loss, _) =
            (model.train_step(x.clone(), y.clone(), &mut state, &Step::default())).unwrap();
        let loss = host(loss)[0];
        // Which length it read: the one whose plain pass on that memory gives its loss.
        let read = lengths.iter().copied().find(|&m| {
            let mut recent = XlState::new();
            if m > 0 {
                recent.xl = XlMemory::from_layers(
                    (full.xl.layers().iter())
                        .map(|t| t.clone().narrow(1, mem_len - m, m))
                        .collect(),
                )
                .unwrap();
            }
            let (l, _) = plain
                .train_step(x.clone(), y.clone(), &mut recent, &step)
                .unwrap();
            (host(l)[0] - loss).abs() < 1e-5
        });
        seen.insert(read.expect("the loss of one of the lengths"));
    }
    assert_eq!(seen.len(), 3, "draws {seen:?}");
    // With document resets: a row that starts a document hides the whole memory (the part
    // read and the part kept), and keeps only the segment it has just read.
    let resets = (tiny().with_mem_len(mem_len))
        .with_document_resets(true)
        .with_randomness(Randomness::Seeded)
        .with_train_memory_lengths(vec![read])
        .init(&dev)
        .unwrap()
        .load_record(plain.clone().into_record());
    let mut state = whole();
    state.xl_valid = vec![mem_len, mem_len];
    let (x, y) = (fixture_tokens(2, &dev), fixture_tokens(3, &dev));
    let step = Step::reset(&[false, true]).with_options(plain.eval_options());
    resets.train_step(x, y, &mut state, &step).unwrap();
    assert_eq!(state.xl.len(), mem_len);
    assert_eq!(
        state.xl_valid,
        vec![mem_len, 6],
        "row 1 keeps its own segment only"
    );
    let rmt = (tiny().with_mem_len(0))
        .with_rmt(Some(memzoo_stack::RmtConfig::new()))
        .with_train_memory_lengths(vec![2]);
    assert_mentions(
        &rmt.init(&dev).unwrap_err(),
        &["train_memory_lengths", "RMT"],
        "an RMT stack",
    );
}

/// Each dropout site turns off on its own (`embedding_dropout`, `attention_output_dropout`,
/// `ff_inner_dropout`, `ff_output_dropout`, `final_dropout`): with every site off, a training
/// pass at dropout 0.5 (an autodiff device, where dropout is live) computes what the
/// evaluation pass does; turning any one site back on changes it, and leaves the evaluation
/// pass as it was.
#[test]
fn dropout_sites_turn_off_one_by_one() {
    let dev = flex().autodiff();
    let none = tiny()
        .with_dropout(0.5)
        .with_embedding_dropout(false)
        .with_attention_output_dropout(false)
        .with_ff_inner_dropout(false)
        .with_ff_output_dropout(false)
        .with_final_dropout(false);
    let tokens = fixture_tokens(0, &dev);
    let passes = |c: &XlConfig| {
        dev.seed(7);
        let model = c.init(&dev).unwrap();
        // The evaluation pass first: it draws the (lazily initialised) weights before any
        // dropout mask is drawn, so every config gets the same weights.
        let eval = model
            .valid()
            .forward(tokens.clone().inner(), &XlMemory::empty())
            .unwrap();
        let train = model.forward(tokens.clone(), &XlMemory::empty()).unwrap();
        (host(train.hidden), host(eval.hidden))
    };
    let (train, eval) = passes(&none);
    assert_close(&train, &eval, 1e-6, "every site off: training = evaluation");
    for (site, c) in [
        ("embedding", none.clone().with_embedding_dropout(true)),
        (
            "attention output",
            none.clone().with_attention_output_dropout(true),
        ),
        (
            "feed-forward inner",
            none.clone().with_ff_inner_dropout(true),
        ),
        (
            "feed-forward output",
            none.clone().with_ff_output_dropout(true),
        ),
        ("final", none.clone().with_final_dropout(true)),
    ] {
        let (t, e) = passes(&c);
        assert_close(&e, &eval, 1e-6, &format!("{site} on: the evaluation pass"));
        assert!(
            max_abs_diff(&t, &e) > 1e-2,
            "{site} dropout on: the training pass must drop something"
        );
    }
}

/// `recompute_attention`: the fused kernel's backward computes the attention probabilities
/// again instead of keeping them. Two models with the same weights, one of each, train on one
/// segment three times with their memories carried (XL and T5 layers, a causal mask over memory and
/// segment; the trainer's optimiser between them): the same losses and the same gradients of every
/// parameter, to the bit, and the loss of the segment, read again, falls (the gradients train).
#[test]
fn recomputed_attention_probabilities_train_the_same() {
    use memzoo_stack::RecurrentModel;
    let dev = flex().autodiff();
    let cfg = small_xl(6).with_layers(vec![LayerKind::Xl, LayerKind::T5, LayerKind::Xl]);
    let run = |recompute: bool| {
        let cfg = cfg.clone().with_recompute_attention(recompute);
        let mut model = seeded_weights(cfg.init(&dev).unwrap(), 5, xl_init_std(&cfg));
        let mut optim = memzoo_train::TrainConfig::new().optimizer();
        let mut state = XlState::new();
        let mut out = Vec::new();
        for _ in 0..3 {
            let ids = |o: i64| {
                let rows: Vec<i64> = (0..2 * 8).map(|i| (3 * (i % 8) + o + i / 8) % 40).collect();
                Tensor::<2, Int>::from_data(TensorData::new(rows, [2, 8]), &dev)
            };
            let (loss, grads) =
                RecurrentModel::train_step(&model, ids(0), ids(1), &mut state, &[false; 2], None)
                    .unwrap();
            out.push((loss, param_vectors(&model, Some(&grads))));
            // The trainer's optimiser, so that later segments see trained weights.
            model = optim.step(1e-2, model, grads);
        }
        out
    };
    let (kept, recomputed) = (run(false), run(true));
    for (s, ((l0, g0), (l1, g1))) in kept.iter().zip(&recomputed).enumerate() {
        assert_eq!(l0.to_bits(), l1.to_bits(), "segment {s}: loss {l0} vs {l1}");
        assert!(g0 == g1, "segment {s}: gradients differ");
        assert!(
            g0.iter().all(Option::is_some),
            "segment {s}: every parameter trains"
        );
    }
    assert!(
        kept[2].0 < kept[0].0,
        "losses {:?}",
        kept.iter().map(|k| k.0).collect::<Vec<_>>()
    );
}

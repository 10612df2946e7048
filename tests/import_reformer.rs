//! Checkpoint import from HF transformers' Reformer: `ReformerModelWithLMHead` read into memzoo's
//! stack (the Reformer preset with HF's options), compared with HF's own outputs.
//!
//! The fixtures (`tests/fixtures/hf-reformer/{enwik8,crime}`) are small random-weight models
//! written and run by transformers 5.x itself (`xtask/peers/fixtures/hf_reformer.py`), with the
//! LSH rotations HF used in those passes (`rotations.safetensors`, read as the layers' fixed
//! rotations). HF's Reformer has no memory across segments: each sequence is read on its own.
//! The reference is HF's code run in float64 (same weights and rotations): HF's float32 run is
//! off where a query sees only itself (see `hf_float32_round_weights_are_off`). Float
//! comparisons: `max |memzoo - HF| <= 1e-4 · max(1, max |HF|)` (`import::check`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use burn::tensor::activation::log_softmax;
use memzoo_import::TensorMap;
use memzoo_import::hf_reformer::{self, HfReformerConfig, reformer_to_hf};
use memzoo_stack::{LayerAttention, Step, XlConfig, XlState};
use memzoo_tests::*;

use crate::import::{EditedCheckpoint, Reference, assert_missing, imported_run, scratch};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hf-reformer")
        .join(name)
}

/// HF's two sequences (`[2, 32]`, the whole axial grid, and `[1, 24]`): log-probabilities,
/// per-token and mean next-token losses; with `grads`, every parameter's gradient of sequence
/// 0's loss (under HF's names, through the export mapping).
fn hf_parity(name: &str, grads: bool) {
    let dev = flex().autodiff();
    let (model, cfg) = hf_reformer::load(&fixture(name), &dev).expect("import");
    assert!(cfg.is_decoder && cfg.axial_pos_embds);
    let r = Reference::at(&fixture(name));
    // Every HF parameter has a gradient in memzoo (none is left out).
    r.check_windows(&model, &dev, 2, grads, reformer_to_hf, &format!("{name}: "));
}

/// `google/reformer-enwik8`-shaped: `[local, lsh, local, lsh]`, chunk lengths 8 (local) and 4
/// (LSH), factorised buckets `[2, 4]`, 4 rounds, ReLU, chunked feed-forward; every gradient.
#[test]
fn hf_reformer_enwik8_matches_hf() {
    hf_parity("enwik8", true);
}

/// `crime-and-punishment`-shaped: `[local, lsh]`, one round, `num_buckets = 4`, GELU.
#[test]
fn hf_reformer_crime_matches_hf() {
    hf_parity("crime", false);
}

/// HF's float32 Reformer is numerically off where a query sees only itself (position 0 always
/// does): its score there is the self-mask value -1e5 in each of the 4 rounds, and the rounds
/// are mixed by `exp(lse_r - logsumexp_r lse_r)` in float32, where `-1e5 + ln 4` is rounded to
/// a multiple of 2^-7, so the weights sum to `4 exp(-1e5 - fl(-1e5 + ln 4)) = 1.0035` and the
/// output is 1.0035 v where the exact answer is v. memzoo mixes rounds with a softmax that
/// subtracts the maximum first (weights exactly 1/4), so it matches HF's float64 run, not its
/// float32 one.
#[test]
fn hf_float32_round_weights_are_off() {
    let lse = -1.0e5f32 + 4f32.ln(); // float32 arithmetic, as HF's
    let factor = 4.0 * ((-1.0e5f32 - lse) as f64).exp();
    assert!((factor - 1.0035).abs() < 1e-4, "{factor}");
    let r = Reference::at(&fixture("enwik8"));
    let (f32s, f64s) = (r.floats("lsh_out.f32"), r.floats("lsh_out.f64"));
    for (a, b) in f32s.iter().zip(&f64s) {
        if b.abs() > 1e-3 {
            let ratio = (*a as f64) / (*b as f64);
            assert!(
                (ratio - factor).abs() < 1e-5,
                "HF float32 / float64 = {ratio}"
            );
        }
    }
    // The error spreads through later layers; memzoo stays with the exact values.
    let dev = flex();
    let (model, _) = hf_reformer::load(&fixture("enwik8"), &dev).unwrap();
    let x = r.tokens::<2>("input_ids.0", &dev);
    let ours = host(log_softmax(window_logits(&model, x).unwrap(), 2));
    let exact = r.floats("log_probs.0");
    let hf32 = r.floats("log_probs_f32.0");
    let (d_ours, d_hf) = (max_abs_diff(&ours, &exact), max_abs_diff(&hf32, &exact));
    assert!(
        d_ours < 1e-4 && d_hf > 1e-3,
        "memzoo {d_ours:e}, HF float32 {d_hf:e}"
    );
}

/// Without the rotations file the import draws its own (memzoo's seeded rotations): the same
/// weights, another random hash, so the LSH layers attend to other keys.
#[test]
fn hf_reformer_without_rotations_uses_its_own() {
    let dev = flex();
    let tmp = scratch("reformer-norot");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("enwik8").join(f), tmp.join(f)).unwrap();
    }
    let (model, _) = hf_reformer::load(&tmp, &dev).unwrap();
    assert!(model.layers.iter().all(|l| match &l.attention {
        LayerAttention::Hashed(a) => a.fixed_rotations().is_none(),
        _ => true,
    }));
    let r = Reference::at(&fixture("enwik8"));
    let x = r.tokens::<2>("input_ids.0", &dev);
    let ours = host(log_softmax(window_logits(&model, x).unwrap(), 2));
    let d = max_abs_diff(&ours, &r.floats("log_probs.0"));
    assert!(
        d.is_finite() && d > 1e-4,
        "other rotations, other buckets: {d:e}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

/// A missing, misshaped or unknown tensor, a rotation of the wrong shape, and a config memzoo
/// cannot express are errors naming them.
#[test]
fn hf_reformer_import_errors_name_the_tensor() {
    let dev = flex();
    let edited = EditedCheckpoint::new(&fixture("enwik8"), "reformer-errors", true);
    let tmp = edited.dir().to_path_buf();
    let config = std::fs::read_to_string(tmp.join("config.json")).unwrap();
    let write = |f: &dyn Fn(&mut BTreeMap<String, TensorData>)| {
        edited.write(f);
    };
    let load = || hf_reformer::load(&tmp, &dev).map(|_| ()).unwrap_err();
    let name = "reformer.encoder.layers.1.attention.self_attention.query_key.weight";
    write(&|m| {
        m.remove(name);
    });
    let err = load();
    assert_missing(&err, name);
    write(&|m| {
        m.insert(
            "reformer.embeddings.position_embeddings.weights.1".into(),
            TensorData::new(vec![0f32; 8 * 5], [8, 1, 5]),
        );
    });
    let err = load().to_string();
    assert!(
        err.contains("position_embeddings.weights.1 has shape [8, 1, 5]"),
        "{err}"
    );
    write(&|m| {
        m.insert(
            "reformer.encoder.layers.0.attention.self_attention.query_key.weight".into(),
            TensorData::new(vec![0f32; 64], [8, 8]),
        );
    });
    let err = load().to_string();
    assert!(
        err.contains("layers.0.attention.self_attention.query_key"),
        "{err}"
    );
    write(&|_| {});
    let mut rot = BTreeMap::new();
    rot.insert(
        "layers.1".to_string(),
        TensorData::new(vec![0f32; 2 * 4 * 4 * 2], [2, 4, 4, 2]),
    );
    memzoo_import::reader::write_safetensors(&tmp.join("rotations.safetensors"), rot).unwrap();
    let err = load().to_string();
    assert!(err.contains("layers.1 has shape [2, 4, 4, 2]"), "{err}");
    std::fs::remove_file(tmp.join("rotations.safetensors")).unwrap();
    // Older checkpoints hold HF's mask constants as buffers: taken when they are HF's values.
    let buffer = "reformer.encoder.layers.1.attention.self_attention.mask_value_float32";
    write(&|m| {
        m.insert(buffer.into(), TensorData::new(vec![-1e9f32], [0usize; 0]));
    });
    hf_reformer::load(&tmp, &dev).expect("HF's constant as a buffer");
    write(&|m| {
        m.insert(buffer.into(), TensorData::new(vec![-1e4f32], [0usize; 0]));
    });
    let err = load().to_string();
    assert!(err.contains(buffer), "{err}");
    write(&|_| {});
    hf_reformer::load(&tmp, &dev).expect("the whole checkpoint imports");
    edited.assert_config_errors(
        &fixture("enwik8"),
        &[
            (
                "\"is_decoder\": true",
                "\"is_decoder\": false",
                "is_decoder",
            ),
            (
                "\"hidden_act\": \"relu\"",
                "\"hidden_act\": \"gelu_new\"",
                "gelu_new",
            ),
            (
                "\"axial_pos_embds\": true",
                "\"axial_pos_embds\": false",
                "axial_pos_embds",
            ),
        ],
        load,
    );
    let mut hf: serde_json::Value = serde_json::from_str(&config).unwrap();
    hf["num_buckets"] = serde_json::Value::Null;
    std::fs::write(tmp.join("config.json"), hf.to_string()).unwrap();
    let err = load().to_string();
    assert!(err.contains("num_buckets"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// `memzoo import --from hf-reformer` writes a run directory that scores as HF (the fixed
/// rotations saved in its checkpoint); `memzoo export --to hf-reformer` writes HF's files bit
/// for bit (names, shapes, values, the rotations and the config); a stack HF cannot express
/// is refused naming the field.
#[test]
fn hf_reformer_run_dir_and_export_round_trip() {
    // Bytes below the fixture's vocabulary of 20.
    let (tmp, run, config, model, r, dev) = imported_run(
        "hf-reformer",
        &fixture("enwik8"),
        "reformer-run",
        "\x03\x04\x05\x06\x07".repeat(2000),
    );
    assert!(config.model.lsh.fixed_rotations && !config.model.lsh.dedup_rounds);
    for s in 0..2 {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        r.check_log_probs(
            s,
            &log_softmax(window_logits(&model, x).unwrap(), 2),
            "run dir: ",
        );
    }
    let out = tmp.join("export");
    memzoo::import::export("hf-reformer", &run, &out, &dev, true).unwrap();
    for file in ["model.safetensors", "rotations.safetensors"] {
        assert_same_tensors(&fixture("enwik8").join(file), &out.join(file));
    }
    let back = HfReformerConfig::read(&out.join("config.json")).unwrap();
    let orig = HfReformerConfig::read(&fixture("enwik8").join("config.json")).unwrap();
    assert_eq!(back, orig, "config round trip");
    let err = HfReformerConfig::from_xl(&XlConfig::new()).unwrap_err();
    assert!(err.to_string().contains("Xl layer"), "{err}");
    let plain = memzoo_stack::ReformerConfig::new().stack();
    let err = HfReformerConfig::from_xl(&plain).unwrap_err();
    assert!(err.to_string().contains("head_input"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// Fixed rotations are used by every pass but training steps, and never trained: evaluation
/// repeats itself exactly, a training step hashes with fresh rotations (its loss is not the
/// evaluation's, and two steps differ), and no gradient reaches the rotations.
#[test]
fn fixed_rotations_serve_evaluation_and_are_never_trained() {
    let dev = flex().autodiff();
    let (model, _) = hf_reformer::load(&fixture("enwik8"), &dev).unwrap();
    let r = Reference::at(&fixture("enwik8"));
    let x = r.tokens::<2>("input_ids.0", &dev);
    let [b, l] = x.dims();
    let (inp, tgt) = (x.clone().slice([0..b, 0..l - 1]), x.slice([0..b, 1..l]));
    let eval = |m: &memzoo_stack::TransformerXl| -> f32 {
        let lp = log_softmax(window_logits(m, inp.clone()).unwrap(), 2);
        lp.gather(2, tgt.clone().reshape([b, l - 1, 1]))
            .neg()
            .mean()
            .into_scalar()
    };
    let e = eval(&model);
    assert_eq!(e, eval(&model), "evaluation is one function");
    let step = || {
        model
            .train_step(
                inp.clone(),
                tgt.clone(),
                &mut XlState::new(),
                &Step::default(),
            )
            .unwrap()
    };
    let ((l1, grads), (l2, _)) = (step(), step());
    let (l1, l2): (f32, f32) = (l1.into_scalar(), l2.into_scalar());
    assert!(
        l1 != l2 && l1 != e,
        "fresh rotations per step: {l1} {l2} (eval {e})"
    );
    for layer in &model.layers {
        if let LayerAttention::Hashed(a) = &layer.attention
            && let Some(rot) = &a.rotations
        {
            assert!(
                grads.get::<4>(rot.id).is_none(),
                "a gradient for the rotations"
            );
        }
    }
}

/// The enwik8 fixture grown to `google/reformer-enwik8`'s vocabulary of 258 (the fixture's 20
/// rows of the embedding, the decoder and its bias, then 238 more of fixed, distinct values),
/// in a scratch directory with the fixture's rotations.
fn enwik8_with_vocab_258(tmp: &Path) -> PathBuf {
    let dir = tmp.join("enwik8-258");
    std::fs::create_dir_all(&dir).unwrap();
    let mut hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("enwik8").join("config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(hf["vocab_size"], 20);
    hf["vocab_size"] = 258.into();
    std::fs::write(dir.join("config.json"), hf.to_string()).unwrap();
    std::fs::copy(
        fixture("enwik8").join(hf_reformer::ROTATIONS_FILE),
        dir.join(hf_reformer::ROTATIONS_FILE),
    )
    .unwrap();
    let full = TensorMap::read(&fixture("enwik8").join("model.safetensors")).unwrap();
    let mut m = BTreeMap::new();
    for n in full.names() {
        let t = full.get(n).unwrap().clone();
        let shape = t.shape().to_vec();
        let t = if shape[0] == 20
            && matches!(
                n,
                "lm_head.bias"
                    | "lm_head.decoder.weight"
                    | "reformer.embeddings.word_embeddings.weight"
            ) {
            let row: usize = shape[1..].iter().product();
            let mut v = t.convert::<f32>().try_to_vec::<f32>().unwrap();
            v.extend((v.len()..258 * row).map(|i| 0.3 * ((i as f32) * 0.618).sin()));
            let mut s = shape.clone();
            s[0] = 258;
            TensorData::new(v, s)
        } else {
            t
        };
        m.insert(n.to_string(), t);
    }
    memzoo_import::reader::write_safetensors(&dir.join("model.safetensors"), m).unwrap();
    dir
}

/// Mean next-token loss of `ids` read as one row in windows of `len` (the full ones), each
/// window on its own (HF's Reformer carries nothing across): `forward_window`, log-softmax and
/// the target's entry, by hand.
fn naive_loss(model: &memzoo_stack::TransformerXl, ids: &[i64], len: usize) -> f64 {
    let dev = flex();
    let (mut total, mut n) = (0.0f64, 0usize);
    for w in 0..(ids.len() - 1) / len {
        let x = burn::tensor::Tensor::<2, burn::tensor::Int>::from_data(
            TensorData::new(ids[w * len..(w + 1) * len].to_vec(), [1, len]),
            &dev,
        );
        let lp = host(log_softmax(window_logits(model, x).unwrap(), 2));
        let v = lp.len() / len;
        for i in 0..len {
            total -= lp[i * v + ids[w * len + i + 1] as usize] as f64;
            n += 1;
        }
    }
    total / n as f64
}

/// `google/reformer-enwik8` reads text as `list(s.encode("utf-8")) + 2` (its model card;
/// tensor2tensor's byte encoder with PAD 0 and EOS 1 reserved). An import of its vocabulary of
/// 258 sets `data.byte_offset = 2`; the run's splits are then the bytes + 2, `memzoo eval`'s
/// pipeline (splits, batcher, evaluation) scores the text as the model fed the ids bytes + 2
/// by hand (and not as the bare bytes), and generated ids decode through the offset as the
/// model card's `chr(x - 2) if x > 1 else ""`. The fixture's vocabulary of 20 keeps offset 0.
#[test]
fn hf_reformer_enwik8_vocabulary_reads_bytes_plus_two() {
    let tmp = scratch("reformer-offset");
    let src = enwik8_with_vocab_258(&tmp);
    let text: Vec<u8> = "Reformer reads enwik8 as bytes + 2; naïve UTF-8 too. "
        .repeat(240)
        .into_bytes();
    let run = import_with_data("hf-reformer", &src, &tmp, &text);
    let dev = flex();
    let (config, model) = memzoo::commands::load_xl(&run, &dev).unwrap();
    assert_eq!(config.model.vocab_size, 258);
    assert_eq!(config.data.byte_offset, 2, "the enwik8 convention");
    let splits = memzoo::data_setup::load_splits(&config.data).unwrap();
    let (_, corpus) = memzoo::data_setup::load_corpus(&config.data).unwrap();
    let plus_two = |b: &[u8]| -> Vec<i64> { b.iter().map(|&c| c as i64 + 2).collect() };
    let valid: Vec<i64> = splits.valid.iter().map(|&t| t as i64).collect();
    assert_eq!(valid, plus_two(&corpus.valid));
    let train: Vec<i64> = splits.train.iter().map(|&t| t as i64).collect();
    assert_eq!(train, plus_two(&corpus.train));

    let len = 16;
    let mut b = memzoo::data_setup::batcher(&splits, memzoo_data::Split::Valid, 1, len).unwrap();
    let r = memzoo_train::evaluate(&model, &mut b, len, None).unwrap();
    let by_hand = naive_loss(&model, &plus_two(&corpus.valid), len);
    assert!(
        (r.loss - by_hand).abs() < 1e-5,
        "eval {} vs bytes + 2 by hand {by_hand}",
        r.loss
    );
    let bare: Vec<i64> = corpus.valid.iter().map(|&c| c as i64).collect();
    let unshifted = naive_loss(&model, &bare, len);
    eprintln!(
        "eval {} nats over {} tokens; bytes + 2 by hand {by_hand}; bare bytes {unshifted}",
        r.loss, r.tokens
    );
    assert!(
        (r.loss - unshifted).abs() > 1e-3,
        "the offset changes the score: {} vs {unshifted}",
        r.loss
    );
    memzoo::commands::eval(&run, "flex", "valid", None, Some(len), Some(2), true).unwrap();

    // Generation: the prompt is bytes + 2, the continuation decodes as the model card does.
    let codec = memzoo_data::TextCodec::for_dir_with_offset(&run, config.data.byte_offset).unwrap();
    let prompt = codec.encode_prompt("Reformer reads").unwrap();
    assert_eq!(prompt, plus_two(b"Reformer reads"));
    let gen_cfg = memzoo_train::generate::GenerateConfig::new(24, len);
    let out = memzoo_train::generate::generate(&model, &prompt, &gen_cfg, &dev).unwrap();
    assert_eq!(out.tokens.len(), 24);
    let card: Vec<u8> = out
        .tokens
        .iter()
        .filter(|&&x| x > 1)
        .map(|&x| (x - 2) as u8)
        .collect();
    assert_eq!(
        codec.decode_continuation(&out.tokens).unwrap(),
        String::from_utf8_lossy(&card)
    );
    let opts = generate_options("Reformer", 4);
    memzoo::commands::generate(&run, "flex", &opts, true).unwrap();

    // The rule: a vocabulary of 258 only; the fixtures' 20 and crime's keep bytes as they are.
    for name in ["enwik8", "crime"] {
        let cfg = HfReformerConfig::read(&fixture(name).join("config.json")).unwrap();
        assert_ne!(cfg.vocab_size, 258);
        assert_eq!(hf_reformer::byte_offset(cfg.vocab_size), 0, "{name}");
    }
    std::fs::remove_dir_all(&tmp).ok();
}

/// A run whose bytes, shifted by `data.byte_offset`, reach past the model's vocabulary is
/// refused by `memzoo eval` and `memzoo generate`, naming the vocabulary, the id and the offset.
#[test]
fn byte_offset_past_the_vocabulary_is_refused() {
    let tmp = scratch("reformer-offset-vocab");
    // Bytes 3..=18: below the fixture's vocabulary of 20, but byte 18 + 2 is id 20.
    let text: Vec<u8> = (0..4000).map(|i| 3 + (i * 7 % 16) as u8).collect();
    let run = import_with_data("hf-reformer", &fixture("enwik8"), &tmp, &text);
    // Offset 0 (vocabulary 20): the bytes fit.
    memzoo::commands::eval(&run, "flex", "valid", None, Some(8), Some(1), true).unwrap();
    let path = run.join("config.toml");
    let cfg = std::fs::read_to_string(&path).unwrap();
    assert!(cfg.contains("byte_offset = 0"), "{cfg}");
    std::fs::write(&path, cfg.replace("byte_offset = 0", "byte_offset = 2")).unwrap();
    let err = memzoo::commands::eval(&run, "flex", "valid", None, Some(8), Some(1), true)
        .unwrap_err()
        .to_string();
    for part in [
        "model.vocab_size = 20",
        "token id 20",
        "data.byte_offset = 258",
    ] {
        assert!(err.contains(part), "`{part}` not in: {err}");
    }
    let opts = generate_options("\x03\x12", 2);
    let err = memzoo::commands::generate(&run, "flex", &opts, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token id 20") && err.contains("prompt"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

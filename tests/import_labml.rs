//! Checkpoint import from labml-nn: its Transformer-XL language model read into memzoo's
//! stack, compared with labml's own outputs.
//!
//! The fixture (`tests/fixtures/labml-xl`) is a small random-weight model run by labml-nn 0.5.1
//! itself (`xtask/peers/fixtures/labml_xl.py`): log-probabilities, losses and carried memories
//! over 3 segments, and the gradient of every parameter for segment 1's mean loss. Float
//! comparisons: `max |memzoo - labml| <= 1e-4 · max(1, max |labml|)` (`import::check`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::optim::GradientsParams;
use burn::tensor::TensorData;
use burn::tensor::activation::log_softmax;
use memzoo_import::labml_xl::{self, LabmlXlConfig, transformer_xl_to_labml};
use memzoo_import::mapping::Source;
use memzoo_stack::{XlConfig, XlMemory};
use memzoo_tests::*;

use crate::import::{
    EditedCheckpoint, Reference, assert_missing, check, check_gradients, imported_run,
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/labml-xl")
}

/// labml's 3 segments: log-probs, per-token and mean losses, each layer's memory, and at
/// segment 1 every parameter's gradient (under labml's names, through the export mapping).
fn labml_parity(src: &Path) {
    let dev = flex().autodiff();
    let (model, cfg) = labml_xl::load(src, &dev).expect("import");
    assert_eq!((cfg.mem_len, cfg.p, cfg.heads, cfg.n_layers), (6, 12, 2, 2));
    let r = Reference::at(&fixture());
    let mut memory = XlMemory::empty();
    for s in 0..3 {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let y = r.tokens::<2>(&format!("targets.{s}"), &dev);
        let out = model.forward(x, &memory).unwrap();
        let loss = r.check_scores(s, log_softmax(model.logits(out.hidden), 2), y);
        for l in 0..cfg.n_layers {
            let m = out.memory.layer(l).unwrap().clone();
            assert_eq!(m.dims()[1], (5 * (s + 1)).min(6), "memory length after {s}");
            check(
                &host(m),
                &r.floats(&format!("mems.{s}.{l}")),
                &format!("memory {s}.{l}"),
            );
        }
        if s == 1 {
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let got = transformer_xl_to_labml(&model, Source::Gradients(&grads));
            // Every labml parameter has a gradient in memzoo (none is left out).
            assert_eq!(got.len(), r.names("grad.").len(), "gradients");
            check_gradients(&got, &r, "grad.", |_| false);
        }
        memory = out.memory;
    }
}

#[test]
fn labml_xl_safetensors_matches_labml() {
    labml_parity(&fixture());
}

/// A missing, misshaped or unknown tensor and a config.json that contradicts the tensors are
/// errors naming them.
#[test]
fn labml_xl_import_errors_name_the_tensor() {
    let dev = flex();
    let edited = EditedCheckpoint::new(&fixture(), "labml-errors", false);
    let tmp = edited.dir().to_path_buf();
    let write = |f: &dyn Fn(&mut BTreeMap<String, TensorData>)| edited.write(f);
    let load = |path: PathBuf| labml_xl::load(&path, &dev).map(|_| ()).unwrap_err();
    let name = "transformer.layers.1.self_attn.value.linear.bias";
    let err = load(write(&|m| {
        m.remove(name);
    }));
    assert_missing(&err, name);
    let err = load(write(&|m| {
        m.insert(
            "transformer.layers.1.self_attn.key_pos_bias".into(),
            TensorData::new(vec![0f32; 20 * 2], [20, 2]),
        );
    }));
    assert!(
        err.to_string()
            .contains("transformer.layers.1.self_attn.key_pos_bias has shape [20, 2]"),
        "{err}"
    );
    let err = load(write(&|m| {
        m.insert(
            "transformer.layers.0.feed_forward.linear_v.weight".into(),
            TensorData::new(vec![0f32; 24 * 16], [24, 16]),
        );
    }));
    assert!(err.to_string().contains("linear_v.weight"), "{err}");
    let err = load(write(&|m| {
        m.insert(
            "transformer.layers.0.self_attn.key_pos_bias".into(),
            TensorData::new(vec![0f32; 7 * 2], [7, 2]),
        );
    }));
    assert!(
        err.to_string().contains("key_pos_bias") && err.to_string().contains("even"),
        "{err}"
    );
    // config.json beside the file: a shape that disagrees is named; mem_len is read.
    let path = write(&|_| {});
    std::fs::write(tmp.join("config.json"), r#"{"heads": 4, "mem_len": 9}"#).unwrap();
    let err = load(path.clone());
    assert!(err.to_string().contains("heads = 4"), "{err}");
    std::fs::write(tmp.join("config.json"), r#"{"mem_len": 9, "seq_len": 2}"#).unwrap();
    let (_, cfg) = labml_xl::load(&path, &dev).unwrap();
    assert_eq!((cfg.mem_len, cfg.dropout), (9, 0.0));
    std::fs::remove_file(tmp.join("config.json")).unwrap();
    let (_, cfg) = labml_xl::load(&path, &dev).unwrap();
    assert_eq!(cfg.mem_len, 128, "labml's Configs default");
    std::fs::remove_dir_all(&tmp).ok();
}

/// `memzoo import --from labml-xl` writes a run directory that scores as labml; `memzoo export
/// --to labml-xl` writes labml's state dict bit for bit, which imports back to the same
/// model; a stack labml cannot express is refused naming the field.
#[test]
fn labml_xl_run_dir_and_export_round_trip() {
    // Bytes below the fixture's vocabulary of 40.
    let (tmp, run, config, model, r, dev) = imported_run(
        "labml-xl",
        &fixture(),
        "labml-run",
        "\x01\x02\x03\x04 ".repeat(2000),
    );
    assert!(config.model.compat.value_output_bias && !config.model.scale_embedding);
    let mut memory = XlMemory::empty();
    for s in 0..3 {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        let out = model.forward(x, &memory).unwrap();
        r.check_log_probs(s, &log_softmax(model.logits(out.hidden), 2), "run dir: ");
        memory = out.memory;
    }
    let out = tmp.join("export");
    memzoo::import::export("labml-xl", &run, &out, &dev, true).unwrap();
    assert_same_tensors(
        &fixture().join("model.safetensors"),
        &out.join("model.safetensors"),
    );
    let (_, back) = labml_xl::load(&out, &dev).unwrap();
    let (_, orig) = labml_xl::load(&fixture(), &dev).unwrap();
    assert_eq!(back, orig, "config round trip");
    let err = LabmlXlConfig::from_xl(&XlConfig::new()).unwrap_err();
    assert!(err.to_string().contains("learned"), "{err}");
    let learned = XlConfig::new().with_positions(
        memzoo_relative::PositionConfig::new().with_kind(memzoo_relative::PositionKind::Learned),
    );
    let err = LabmlXlConfig::from_xl(&learned).unwrap_err();
    assert!(err.to_string().contains("pre_ln"), "{err}");
    // HF's TransfoXL has no value/output bias: exporting a labml import there is refused.
    let err =
        memzoo::import::export("hf-transfo-xl", &run, &tmp.join("hf"), &dev, true).unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("layers") || err.contains("value_output_bias"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

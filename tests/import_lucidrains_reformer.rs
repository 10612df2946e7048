//! Checkpoint import from reformer-pytorch (lucidrains, 1.4.4): its `ReformerLM` read into
//! memzoo's stack (the Reformer preset with summed axial positions, scaled LSH scores, an
//! output bias and the mean of the two streams), compared with reformer-pytorch's own outputs.
//!
//! The fixture (`tests/fixtures/lucidrains-reformer`) is a small random-weight causal model run
//! by reformer-pytorch itself (`xtask/peers/fixtures/lucidrains_reformer.py`), with the LSH
//! rotations of those passes (`rotations.safetensors`, imported as fixed rotations). The
//! reference is its code run in float64 (float32 mixes hash rounds inexactly where a query
//! sees only itself, as HF's does). No memory across segments: each sequence is read on its
//! own. Float comparisons: `max |memzoo - peer| <= 1e-4 · max(1, max |peer|)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use burn::tensor::activation::log_softmax;
use memzoo_import::lucidrains_reformer::{self, LucidrainsReformerConfig, reformer_to_lucidrains};
use memzoo_stack::XlConfig;
use memzoo_tests::*;

use crate::import::{EditedCheckpoint, Reference, assert_missing, imported_run};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lucidrains-reformer")
}

/// A `[2, 32]` sequence: log-probabilities, per-token and mean next-token
/// losses, and every parameter's gradient of sequence 0's loss (under reformer-pytorch's names,
/// through the export mapping; its reversible backward).
#[test]
fn lucidrains_reformer_matches_reformer_pytorch() {
    let dev = flex().autodiff();
    let (model, cfg) = lucidrains_reformer::load(&fixture(), &dev).expect("import");
    assert_eq!((cfg.depth, cfg.n_hashes, cfg.bucket_size), (2, 4, 4));
    let r = Reference::at(&fixture());
    r.check_windows(&model, &dev, 1, true, reformer_to_lucidrains, "");
}

/// A missing or misshaped tensor, an irreversible copy that differs from its reversible
/// original, an unknown tensor and an argument memzoo cannot express are errors naming them.
#[test]
fn lucidrains_reformer_import_errors_name_the_tensor() {
    let dev = flex();
    let edited = EditedCheckpoint::new(&fixture(), "lucid-reformer-errors", true);
    let tmp = edited.dir().to_path_buf();
    let write = |f: &dyn Fn(&mut BTreeMap<String, TensorData>)| {
        edited.write(f);
    };
    let load = || {
        lucidrains_reformer::load(&tmp, &dev)
            .map(|_| ())
            .unwrap_err()
    };
    let name = "reformer.layers.blocks.1.f.net.fn.to_out.bias";
    write(&|m| {
        m.remove(name);
    });
    let err = load();
    assert_missing(&err, name);
    write(&|m| {
        m.insert(
            "pos_emb.weights.1".into(),
            TensorData::new(vec![0f32; 64], [1, 8, 1, 8]),
        );
    });
    let err = load().to_string();
    assert!(
        err.contains("pos_emb.weights.1 has shape [1, 8, 1, 8]"),
        "{err}"
    );
    write(&|m| {
        let w = m["reformer.layers.blocks.0.g.net.fn.fn.w2.bias"].clone();
        let v: Vec<f32> = w
            .try_to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x + 1.0)
            .collect();
        m.insert(
            "reformer.layers.irrev_blocks.0.g.fn.fn.w2.bias".into(),
            TensorData::new(v, [8]),
        );
    });
    let err = load().to_string();
    assert!(
        err.contains("irrev_blocks.0.g.fn.fn.w2.bias") && err.contains("differs"),
        "{err}"
    );
    write(&|m| {
        m.insert(
            "reformer.layers.blocks.0.f.net.fn.mem_kv".into(),
            TensorData::new(vec![0f32; 8], [1, 1, 8]),
        );
    });
    let err = load().to_string();
    assert!(err.contains("mem_kv"), "{err}");
    write(&|_| {});
    lucidrains_reformer::load(&tmp, &dev).expect("the whole checkpoint imports");
    edited.assert_config_errors(
        &fixture(),
        &[
            ("\"causal\": true", "\"causal\": false", "causal"),
            (
                "\"axial_position_emb\": true",
                "\"axial_position_emb\": false",
                "axial_position_emb",
            ),
            (
                "\"n_hashes\": 4",
                "\"n_hashes\": 4, \"n_local_attn_heads\": 1",
                "n_local_attn_heads",
            ),
            (
                "\"n_hashes\": 4",
                "\"n_hashes\": 4, \"no_such_argument\": 1",
                "no_such_argument",
            ),
        ],
        load,
    );
    std::fs::remove_dir_all(&tmp).ok();
}

/// `memzoo import --from lucidrains-reformer` writes a run directory that scores as
/// reformer-pytorch; `memzoo export --to lucidrains-reformer` writes its tensors, rotations and
/// arguments back exactly; a stack it cannot express is refused naming the field.
#[test]
fn lucidrains_reformer_run_dir_and_export_round_trip() {
    let (tmp, run, config, model, r, dev) = imported_run(
        "lucidrains-reformer",
        &fixture(),
        "lucid-reformer-run",
        "\x03\x04\x05\x06\x07".repeat(2000),
    );
    assert!(config.model.axial.as_ref().unwrap().summed && config.model.lsh.output_bias);
    for s in 0..1 {
        let x = r.tokens::<2>(&format!("input_ids.{s}"), &dev);
        r.check_log_probs(
            s,
            &log_softmax(window_logits(&model, x).unwrap(), 2),
            "run dir: ",
        );
    }
    let out = tmp.join("export");
    memzoo::import::export("lucidrains-reformer", &run, &out, &dev, true).unwrap();
    for file in ["model.safetensors", "rotations.safetensors"] {
        assert_same_tensors(&fixture().join(file), &out.join(file));
    }
    let back = LucidrainsReformerConfig::read(&out.join("config.json")).unwrap();
    let orig = LucidrainsReformerConfig::read(&fixture().join("config.json")).unwrap();
    assert_eq!(back, orig, "config round trip");
    let err = LucidrainsReformerConfig::from_xl(&XlConfig::new()).unwrap_err();
    assert!(err.to_string().contains("LSH"), "{err}");
    let plain = memzoo_stack::ReformerConfig::new().stack();
    let err = LucidrainsReformerConfig::from_xl(&plain).unwrap_err();
    assert!(err.to_string().contains("summed"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

//! A run's family on both sides of `memzoo import` / `memzoo export`: an export builds the stack
//! the run trained (`RunConfig::stack`: `[model]`, whatever the family), and an
//! imported run is the family of its stack (`RunConfig::family`), checked as one.

use std::path::{Path, PathBuf};

use memzoo::commands;
use memzoo::config::RunConfig;
use memzoo_tests::{TINY_MEMORIZING, TINY_REFORMER, flex, import_with_data, tiny_cli};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memzoo-family-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Trains `sets` (on the generated corpus, 2 steps of the tiny CLI settings) into `run`.
fn train(run: &Path, sets: &[&str]) {
    let config = RunConfig::resolve(None, &tiny_cli(sets)).unwrap();
    commands::train(&config, "flex", run, false, false, true, true).unwrap();
}

/// A natively trained Reformer (the `reformer-tiny` preset's stack in `[model]`) exports
/// to HF's layout: the export builds the Reformer the run trained, not `[model]`'s
/// Transformer-XL (which failed with a shape mismatch). The export reads back into memzoo and
/// exports again to the same bytes; the imported run is a `reformer` by its stack.
#[test]
fn natively_trained_reformer_exports_and_round_trips() {
    let tmp = scratch("reformer");
    let run = tmp.join("run");
    let hf_reformer = [
        "model.lsh.n_buckets=4",
        "model.lsh.n_rounds=2",
        r#"model.axial={"shape": [4, 4], "dims": [8, 8], "summed": false}"#,
        // The options that make the preset HF's function.
        "model.compat.head_input=\"concat\"",
        "model.lsh.dedup_rounds=false",
        "model.lsh.rotations_per_head=true",
        "model.lsh.key_eps=1e-6",
    ];
    train(&run, &[&TINY_REFORMER[..], &hf_reformer].concat());
    let dev = flex();
    let out = tmp.join("hf");
    memzoo::import::export("hf-reformer", &run, &out, &dev, true).unwrap();
    let back = tmp.join("back");
    memzoo::import::import("hf-reformer", &out, &back, None, false, true).unwrap();
    let imported = RunConfig::from_run_dir(&back, &[]).unwrap();
    assert_eq!(imported.family(), "reformer", "family of the imported run");
    let again = tmp.join("hf-again");
    memzoo::import::export("hf-reformer", &back, &again, &dev, true).unwrap();
    let bytes = |dir: &Path| std::fs::read(dir.join("model.safetensors")).unwrap();
    assert!(
        bytes(&out) == bytes(&again),
        "export -> import -> export changed the weights"
    );
    let _ = std::fs::remove_dir_all(tmp);
}

/// A natively trained Memorizing Transformer is built as such by `memzoo export`: a format that
/// cannot express it says which field (not a shape mismatch of `[model]`'s stack).
#[test]
fn natively_trained_memorizing_export_names_what_the_format_lacks() {
    let tmp = scratch("memorizing");
    let run = tmp.join("run");
    train(&run, &TINY_MEMORIZING);
    let dev = flex();
    for (to, field) in [
        (
            "lucidrains-memorizing",
            "memorizing-transformers-pytorch cannot express",
        ),
        (
            "hf-transfo-xl",
            "HF's TransfoXL has only XL relative attention",
        ),
    ] {
        let err = memzoo::import::export(to, &run, &tmp.join(to), &dev, true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(field) && !err.contains("record has"),
            "export --to {to}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(tmp);
}

/// An imported Reformer (its stack in `[model]`, from no preset) is a `reformer`, and gets
/// the Reformer's machine-memory check: LSH rounds beyond this machine's memory are refused,
/// naming `model.lsh.n_rounds`, before anything is built.
#[test]
fn imported_reformer_gets_the_reformer_memory_check() {
    let tmp = scratch("imported");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-reformer/enwik8");
    let run = import_with_data(
        "hf-reformer",
        &fixture,
        &tmp,
        "\x03\x04\x05\x06\x07".repeat(2000),
    );
    let config = RunConfig::from_run_dir(&run, &["model.lsh.n_rounds=1000000000".into()]).unwrap();
    assert_eq!(config.family(), "reformer");
    // `--resume` with `--overwrite` is refused right after the memory checks: nothing is built
    // or allocated whichever way this goes.
    let err = commands::train(&config, "flex", &run, true, true, true, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.lsh.n_rounds = 1000000000") && err.contains("GiB"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(tmp);
}

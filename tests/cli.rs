//! The CLI's one error type ([`memzoo::CliError`]): each kind the catalogue in `reliability.rs`
//! does not reach, through the command that raises it, names the file, flag or value at fault
//! and has the exit status `main` gives it (2 for a refused flag, 1 for everything else).

use std::path::{Path, PathBuf};

use memzoo::CliError;
use memzoo::commands;
use memzoo::config::RunConfig;
use memzoo_stack::LshConfig;
use memzoo_tests::{flex, generate_options, tiny_cli};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memzoo-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tiny XL run config on the generated corpus (2 steps).
fn tiny(extra: &[&str]) -> RunConfig {
    RunConfig::resolve(None, &tiny_cli(extra)).unwrap()
}

#[track_caller]
fn check(result: Result<(), CliError>, parts: &[&str], exit: i32, what: &str) {
    let err = result.expect_err(what);
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "{what}: `{p}` not in the error: {msg}");
    }
    assert_eq!(err.exit_code(), exit, "{what}: exit status of {msg}");
}

fn generate(run_dir: &Path) -> Result<(), CliError> {
    let opts = generate_options("ab", 2);
    commands::generate(run_dir, "flex", &opts, true)
}

/// Replaces `from` by `to` in the run's `config.toml`.
fn edit_config(run_dir: &Path, from: &str, to: &str) {
    let path = run_dir.join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from} not in {text}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn every_cli_error_kind_names_what_is_wrong() {
    let dir = scratch("kinds");
    let file = dir.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();

    // Io: a run directory under a file.
    let bad_dir = file.join("run");
    check(
        commands::train(&tiny(&[]), "flex", &bad_dir, false, false, true, true).map(|_| ()),
        &["cannot create run directory", "a-file/run"],
        1,
        "run dir under a file",
    );
    // NotDownloaded: a known data set that is not in data_dir.
    let data_dir = format!("data.data_dir={:?}", dir.join("data").display().to_string());
    check(
        commands::train(
            &tiny(&["data.source=\"enwik8\"", &data_dir]),
            "flex",
            &dir.join("run-enwik8"),
            false,
            false,
            true,
            true,
        )
        .map(|_| ()),
        &["`enwik8` is not downloaded", "memzoo data fetch enwik8"],
        1,
        "data set not fetched",
    );
    // Flag: recall's --batch.
    check(
        commands::recall("flex", "xl", 1, 1e-3, 0, 0, true),
        &["--batch 0", "must be positive"],
        2,
        "recall --batch 0",
    );

    // NoCheckpoint: a run directory with its config and nothing trained yet.
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("config.toml"), tiny(&[]).to_toml()).unwrap();
    check(
        commands::eval(&run, "flex", "valid", None, None, Some(1), true),
        &["has no checkpoint yet", "run"],
        1,
        "eval before a checkpoint",
    );
    check(
        generate(&run),
        &["has no checkpoint yet"],
        1,
        "generate before a checkpoint",
    );

    // A trained run for the rest.
    std::fs::remove_dir_all(&run).unwrap();
    commands::train(&tiny(&[]), "flex", &run, false, false, true, true).unwrap();
    let dev = flex();
    // Exists: an export over a checkpoint directory.
    let out = dir.join("export");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("config.json"), "{}").unwrap();
    check(
        memzoo::import::export("hf-transfo-xl", &run, &out, &dev, true),
        &["export/config.json already exists", "new directory"],
        1,
        "export over a config.json",
    );
    // UnknownFormat: an export target memzoo does not know.
    check(
        memzoo::import::export("onnx", &run, &dir.join("onnx"), &dev, true),
        &["unknown source `onnx`", "hf-transfo-xl"],
        2,
        "export --to onnx",
    );
    // Import: a checkpoint directory that is not there (the import crate's error).
    check(
        memzoo::import::import(
            "hf-transfo-xl",
            &dir.join("no-such-checkpoint"),
            &dir.join("imported"),
            None,
            false,
            true,
        ),
        &["no-such-checkpoint"],
        1,
        "import of a missing directory",
    );

    // Family: the run's config.toml names another family than its checkpoint holds.
    // The family is the layers': LSH and local layers make a Reformer.
    edit_config(&run, "layers = []", "layers = [\"lsh\"]");
    edit_config(&run, "document_resets = true", "document_resets = false");
    edit_config(&run, "randomness = \"device\"", "randomness = \"seeded\"");
    check(
        generate(&run),
        &["holds a `xl` model", "config.toml a `reformer` one"],
        1,
        "generate with the family edited",
    );
    edit_config(&run, "layers = [\"lsh\"]", "layers = [\"xl\", \"knn\"]");
    edit_config(&run, "n_layers = 1", "n_layers = 2");
    check(
        memzoo::import::export("hf-transfo-xl", &run, &dir.join("export2"), &dev, true),
        &["holds a `xl` model", "config.toml a `memorizing` one"],
        1,
        "export of a Memorizing run",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A checkpoint's family label follows the stack's layers (`TransformerXl::stack_family`), not
/// its randomness: an XL stack with `randomness = "seeded"` is `xl` (it was saved as `reformer`),
/// LSH or local layers make a `reformer`, kNN layers a `memorizing`. A run whose checkpoint
/// carries the label written before (`reformer`, and no self-checksum, as such checkpoints
/// were) still generates and resumes; the label of another family is refused.
#[test]
fn the_family_label_follows_the_layers_and_old_labels_still_load() {
    use memzoo_stack::{LayerKind, Randomness, TransformerXl};
    use memzoo_train::RecurrentModel;
    use memzoo_train::checkpoint::{latest, read_trainer_state};

    let dev = flex();
    let stack = |randomness, layers: Vec<LayerKind>| {
        let cfg = memzoo_tests::tiny_xl().with_randomness(randomness);
        cfg.with_layers(layers).init(&dev).unwrap()
    };
    let label = |m: &TransformerXl| (RecurrentModel::family(m), m.legacy_family());
    assert_eq!(label(&stack(Randomness::Device, vec![])), ("xl", "xl"));
    assert_eq!(
        label(&stack(Randomness::Seeded, vec![])),
        ("xl", "reformer")
    );
    let lsh = vec![LayerKind::Local, LayerKind::Lsh];
    assert_eq!(label(&stack(Randomness::Device, lsh)), ("reformer", "xl"));
    let reformer = memzoo_stack::ReformerConfig::new()
        .with_n_layers(1)
        .with_d_model(16)
        .with_n_heads(2)
        .with_d_head(8)
        .with_d_ff(32)
        .with_lsh(LshConfig::new().with_chunk_len(4))
        .with_axial_positions(false)
        .init(&dev)
        .unwrap();
    assert_eq!(label(&reformer), ("reformer", "reformer"));
    let memorizing = memzoo_tests::tiny_memorizing().init(&dev).unwrap();
    assert_eq!(RecurrentModel::family(&memorizing), "memorizing");

    let seeded = stack(Randomness::Seeded, vec![]);
    for (found, ok) in [("xl", true), ("reformer", true), ("memorizing", false)] {
        assert_eq!(
            seeded.accepts_family(found),
            ok,
            "a seeded XL stack and `{found}`"
        );
    }

    let dir = scratch("family");
    let run = dir.join("run");
    let randomness = "model.randomness=\"seeded\"";
    commands::train(&tiny(&[randomness]), "flex", &run, false, false, true, true).unwrap();
    let ckpts = run.join("checkpoints");
    let newest = || latest(&ckpts).unwrap().expect("a checkpoint");
    assert_eq!(read_trainer_state(&newest()).unwrap().family, "xl");
    // What a checkpoint written before looks like: labelled `reformer` (its checksums
    // recorded: a trainer.json without them is refused).
    let relabel = |family: &str| {
        memzoo_train::checkpoint::rewrite_trainer_state(&newest(), |t| {
            t.family = family.into();
        })
        .unwrap();
    };
    relabel("reformer");
    assert_eq!(read_trainer_state(&newest()).unwrap().family, "reformer");
    generate(&run).expect("generate from a checkpoint labelled `reformer`");
    let more = tiny(&[randomness, "train.steps=3"]);
    commands::train(&more, "flex", &run, true, false, true, true)
        .expect("resume from a checkpoint labelled `reformer`");
    let state = read_trainer_state(&newest()).unwrap();
    assert_eq!((state.step, state.family.as_str()), (3, "xl"));

    relabel("memorizing");
    check(
        generate(&run),
        &["memorizing"],
        1,
        "generate, another family",
    );
    let more = tiny(&[randomness, "train.steps=4"]);
    let resumed = commands::train(&more, "flex", &run, true, false, true, true).map(|_| ());
    check(resumed, &["memorizing"], 1, "resume, another family");
    let _ = std::fs::remove_dir_all(dir);
}

/// `memzoo recl` on a group of two runs (with and without XL memory) of the generated corpus:
/// it runs end to end, text and JSON; bad contexts, ratios and groups are refused naming the
/// flag (the RECL itself is checked against a hand computation in `memzoo_train::recl`).
#[test]
fn recl_compares_runs_and_refuses_bad_contexts() {
    use memzoo::recl::{ReclOptions, run};
    let dir = scratch("recl");
    let (with, without) = (dir.join("with"), dir.join("without"));
    commands::train(&tiny(&[]), "flex", &with, false, false, true, true).unwrap();
    commands::train(
        &tiny(&["model.mem_len=0"]),
        "flex",
        &without,
        false,
        false,
        true,
        true,
    )
    .unwrap();
    let opts = ReclOptions {
        run_dirs: vec![with.clone(), without.clone()],
        contexts: Some(vec![0, 8, 16]),
        seg_len: None,
        blocks: 4,
        ratios: vec![0.1, 1.0],
        threshold: 0.01,
        mem_len: None,
        split: "valid".into(),
    };
    run(&opts, "flex", false).unwrap();
    run(&opts, "flex", true).unwrap();
    let bad = |o: ReclOptions| run(&o, "flex", true).map(|_| ());
    check(
        bad(ReclOptions {
            contexts: Some(vec![0, 12]),
            ..opts.clone()
        }),
        &["--contexts", "12", "multiple of the segment length 8"],
        2,
        "context not a multiple",
    );
    check(
        bad(ReclOptions {
            contexts: Some(vec![16, 8]),
            ..opts.clone()
        }),
        &["--contexts", "increasing"],
        2,
        "decreasing contexts",
    );
    check(
        bad(ReclOptions {
            ratios: vec![1.5],
            ..opts.clone()
        }),
        &["--r", "1.5"],
        2,
        "ratio above 1",
    );
    check(
        bad(ReclOptions {
            contexts: Some(vec![0, 8_000_000]),
            ..opts.clone()
        }),
        &["no document of the valid split is longer"],
        2,
        "context past every document",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `memzoo eval --knn-memories N --knn-top-k K --rows R`: the run's kNN memory at another size
/// or reach without retraining (the Memorizing Transformer's Table 5), over fewer, longer rows.
/// At the trained values it is the plain evaluation to the last bit; with one pair retrieved it
/// is another function; on a run without kNN layers, or at 0, an error naming the flag.
#[test]
fn eval_reads_a_knn_memory_of_another_size() {
    let dir = scratch("eval-knn-memories");
    let run = dir.join("run");
    commands::train(
        &tiny(&memzoo_tests::TINY_MEMORIZING),
        "flex",
        &run,
        false,
        false,
        true,
        true,
    )
    .unwrap();
    let eval_rows = |knn_memories, knn_top_k, rows| {
        let args = commands::EvalArgs {
            run_dir: run.clone(),
            split: "valid".into(),
            mem_len: None,
            tgt_len: None,
            max_segments: Some(4),
            knn_memories,
            knn_top_k,
            rows,
        };
        commands::eval_with(&args, "flex", true)
    };
    let eval = |knn_memories, knn_top_k| eval_rows(knn_memories, knn_top_k, None);
    let plain = eval(None, None).unwrap();
    let trained = eval(Some(64), Some(4)).unwrap();
    assert_eq!(
        plain.bpc, trained.bpc,
        "the trained size and reach: the same evaluation"
    );
    let one = eval(None, Some(1)).unwrap();
    assert!(
        (one.bpc - plain.bpc).abs() > 1e-6,
        "one retrieved pair: {} against {}",
        one.bpc,
        plain.bpc
    );
    assert_eq!(one.tokens, plain.tokens);
    // `--rows 1`: one row, longer, so the same segments hold a `batch`-th of the tokens.
    let batch = tiny(&memzoo_tests::TINY_MEMORIZING).train.batch;
    let single = eval_rows(None, None, Some(1)).unwrap();
    assert!(batch > 1);
    assert_eq!(
        single.tokens * batch as u64,
        plain.tokens,
        "one row of {batch}"
    );
    check(
        eval_rows(None, None, Some(0)).map(|_| ()),
        &["--rows 0", "positive"],
        2,
        "--rows 0",
    );
    check(
        eval(Some(0), None).map(|_| ()),
        &["--knn-memories 0", "positive"],
        2,
        "--knn-memories 0",
    );
    let xl = dir.join("xl");
    commands::train(&tiny(&[]), "flex", &xl, false, false, true, true).unwrap();
    let args = commands::EvalArgs {
        run_dir: xl.clone(),
        split: "valid".into(),
        mem_len: None,
        tgt_len: None,
        max_segments: Some(1),
        knn_memories: None,
        knn_top_k: Some(8),
        rows: None,
    };
    check(
        commands::eval_with(&args, "flex", true).map(|_| ()),
        &["--knn-top-k 8", "has no kNN layer"],
        2,
        "--knn-top-k on an XL run",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `memzoo devices --measure`: each shape's rate is its FLOP count over its median time, every
/// timing positive; zero repeats and an unknown device are refused by name (exit status 2); the
/// XL shapes are `xl-enwik8-base`'s, as the paper trains it.
#[test]
fn devices_measure_reports_each_shape_and_refuses_bad_flags() {
    use memzoo::commands::{ProductShape, measure_products, product_shapes};
    let shapes = [
        ProductShape {
            name: "small".into(),
            dims: [1, 64, 32, 48],
        },
        ProductShape {
            name: "batched".into(),
            dims: [3, 16, 8, 24],
        },
    ];
    let rates = measure_products("flex", &shapes, 3).unwrap();
    assert_eq!(rates.len(), 2);
    for (r, s) in rates.iter().zip(&shapes) {
        let [b, m, k, n] = s.dims;
        assert_eq!((&r.name, r.dims), (&s.name, s.dims));
        assert!(r.seconds > 0.0, "{}: {} s", r.name, r.seconds);
        let want = 2.0 * (b * m * k * n) as f64 / r.seconds / 1e9;
        assert!(
            (r.gflops - want).abs() <= 1e-9 * want,
            "{}: {} vs {want}",
            r.name,
            r.gflops
        );
    }
    check(
        measure_products("flex", &shapes, 0).map(|_| ()),
        &["--repeats", "0"],
        2,
        "zero repeats",
    );
    check(
        measure_products("flux", &shapes, 1).map(|_| ()),
        &["flux"],
        2,
        "an unknown device",
    );
    // The XL shapes are the preset's: 22 x 512 tokens of d_model 512 into a feed-forward of
    // 2,048; 22 x 8 heads of 64, 512 queries over 512 + 512 keys.
    let dims: Vec<[usize; 4]> = product_shapes()[1..].iter().map(|s| s.dims).collect();
    assert_eq!(
        dims,
        [
            [1, 22 * 512, 512, 2048],
            [22 * 8, 512, 64, 1024],
            [22 * 8, 512, 1024, 64]
        ]
    );
}

//! The run configuration: one model description (`[model]` is the layer stack, the family
//! derived from its layers), presets as whole recipes, no default that follows a user to
//! another size, `config.toml` holding what the run uses, and the old layouts still read.

use std::path::{Path, PathBuf};

use memzoo::config::{ModelKind, Preset, RunConfig};
use memzoo_stack::{LayerKind, LshConfig, PeerCompat, ReformerConfig, XlConfig};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/old-layout")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memzoo-config-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn json(x: &XlConfig) -> serde_json::Value {
    serde_json::to_value(x).unwrap()
}

/// The sample standard deviation of the built model's token embedding table, computed here.
fn embedding_std(config: &RunConfig) -> f64 {
    let dev = memzoo_backend::parse_device("flex").unwrap();
    let model = config.model.init(&dev).unwrap();
    let table = model.embedding.plain().expect("a plain embedding");
    let w: Vec<f32> = table.weight.val().into_data().try_to_vec::<f32>().unwrap();
    let n = w.len() as f64;
    let mean = w.iter().map(|&v| v as f64).sum::<f64>() / n;
    (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
}

/// The trap of the old CLI default: its tiny model drew the embedding from N(0, 0.1), tuned for
/// d_model 64, and a user who grew the sizes with `--set` kept that 0.1 at d_model 256 (tied
/// logits far too large: the run stalled at the unigram level). Now no preset holds a value
/// tuned to a size: the default run grown to XL-small's sizes initialises its embedding as
/// XL-small does, at `init_std` (HF's 0.02), measured on the built tables.
#[test]
fn growing_the_default_model_gives_the_initialisation_of_its_size() {
    let sizes: Vec<String> = [
        "model.n_layers=2",
        "model.d_model=256",
        "model.n_heads=8",
        "model.d_inner=1024",
    ]
    .map(String::from)
    .to_vec();
    let grown = RunConfig::resolve(None, &sizes).unwrap();
    assert_eq!(grown.model.embedding_std, None);
    let small =
        RunConfig::resolve_preset(Some(Preset::XlSmall), None, &["model.n_layers=2".into()])
            .unwrap();
    let (g, s) = (embedding_std(&grown), embedding_std(&small));
    // 65,536 draws: the sample std is within 1% of the true one.
    assert!((g / 0.02 - 1.0).abs() < 0.02, "grown default: std {g}");
    assert!((s / 0.02 - 1.0).abs() < 0.02, "xl-small: std {s}");
    // And the default itself (d_model 64) at the same init_std.
    let tiny = embedding_std(&RunConfig::default());
    assert!((tiny / 0.02 - 1.0).abs() < 0.05, "default: std {tiny}");
}

/// A preset is a whole recipe: `--preset` (or `--model FAMILY`, the family's tiny preset, or
/// `--set model.preset=NAME`) fills the stack and the schedule, `--set` applies on top, the
/// family follows from the layers, and the run's config names the preset.
#[test]
fn presets_set_the_stack_and_the_schedule() {
    let r = RunConfig::resolve_preset(
        Some(Preset::ReformerEnwik8),
        None,
        &[
            "model.n_layers=2".into(),
            "model.layers=[\"lsh\", \"lsh\"]".into(),
        ],
    )
    .unwrap();
    assert_eq!(r.family(), "reformer");
    assert_eq!((r.model.d_model, r.model.n_layers), (1024, 2));
    assert_eq!((r.train.tgt_len, r.train.batch), (65_536, 1));
    assert_eq!(r.model.preset, Some(Preset::ReformerEnwik8));
    let m = RunConfig::resolve_preset(Some(Preset::MemorizingPaper), None, &[]).unwrap();
    assert_eq!(m.family(), "memorizing");
    assert_eq!(
        m.model
            .layer_kinds()
            .iter()
            .position(|&k| k == LayerKind::Knn),
        Some(8),
        "the 9th of 12 layers"
    );
    assert_eq!(m.train.tgt_len, 512);
    m.validate().unwrap();
    // memorizing-small no longer keeps the default run's 8-byte segments.
    let ms = RunConfig::resolve_preset(Some(Preset::MemorizingSmall), None, &[]).unwrap();
    assert_eq!((ms.train.tgt_len, ms.train.batch), (128, 8));
    // --model FAMILY and --set model.preset=NAME are the same as --preset.
    for (kind, family) in [
        (ModelKind::Xl, "xl"),
        (ModelKind::Reformer, "reformer"),
        (ModelKind::Memorizing, "memorizing"),
    ] {
        let a = RunConfig::resolve_preset(Some(Preset::tiny(kind)), None, &[]).unwrap();
        let name = Preset::tiny(kind).name();
        let b = RunConfig::resolve(None, &[format!("model.preset={name}")]).unwrap();
        assert_eq!(a.family(), family);
        assert_eq!(json(&a.model), json(&b.model), "{name}");
        a.validate().unwrap();
    }
    // Two different presets at once are refused, naming both.
    let err = RunConfig::resolve_preset(
        Some(Preset::XlSmall),
        None,
        &["model.preset=reformer-tiny".into()],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("xl-small") && err.contains("reformer-tiny"),
        "{err}"
    );
    // The old layout's keys in --set say what replaced them.
    let err = RunConfig::resolve(None, &["reformer.n_rounds=2".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("old layout") && err.contains("model.lsh.n_rounds"),
        "{err}"
    );
}

/// A run's `config.toml` holds what the run uses — a default XL run well under 100 lines, no
/// kNN or LSH settings in a stack without those layers — and reads back to the same config
/// for every preset.
#[test]
fn config_toml_holds_what_the_run_uses_and_reads_back() {
    let dir = scratch("toml");
    let text = RunConfig::default().to_toml();
    let lines = text.lines().count();
    assert!(lines < 100, "{lines} lines:\n{text}");
    for section in [
        "[model.knn",
        "[model.lsh",
        "reformer",
        "memorizing",
        "model_kind",
    ] {
        assert!(!text.contains(section), "{section} in:\n{text}");
    }
    for preset in [
        Preset::XlTiny,
        Preset::XlSmall,
        Preset::XlWt103Base,
        Preset::ReformerTiny,
        Preset::ReformerEnwik8,
        Preset::MemorizingTiny,
        Preset::MemorizingPaper,
        Preset::CompressiveTiny,
        Preset::CompressivePaper,
        Preset::RmtTiny,
        Preset::RmtPaper,
        Preset::BlockRecurrentTiny,
        Preset::BlockRecurrentPaper,
    ] {
        let config = RunConfig::resolve_preset(Some(preset), None, &[]).unwrap();
        let path = dir.join(format!("{}.toml", preset.name()));
        std::fs::write(&path, config.to_toml()).unwrap();
        let back = RunConfig::resolve(Some(&path), &[]).unwrap();
        assert_eq!(back.model.preset, Some(preset));
        assert_eq!(json(&back.model), json(&config.model), "{}", preset.name());
        assert_eq!(
            serde_json::to_value(&back.train).unwrap(),
            serde_json::to_value(&config.train).unwrap()
        );
    }
    // A hand-written file: a preset and two changes.
    let path = dir.join("mine.toml");
    std::fs::write(
        &path,
        "[model]\npreset = \"xl-small\"\nd_model = 128\n\n[train]\nsteps = 7\n",
    )
    .unwrap();
    let mine = RunConfig::resolve(Some(&path), &[]).unwrap();
    assert_eq!((mine.model.d_model, mine.model.n_layers), (128, 6));
    assert_eq!((mine.train.steps, mine.train.tgt_len), (7, 128));
    std::fs::write(&path, "[model]\npreset = \"xl-huge\"\n").unwrap();
    let err = RunConfig::resolve(Some(&path), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("xl-huge") && err.contains("not a preset"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Run directories written before the one model description (`model_kind` choosing one of
/// `[model]`, `[reformer]`, `[memorizing]`; the fixtures are config.toml files that code wrote,
/// for the default run and `--model reformer`, `--model memorizing`, `--preset
/// memorizing-small`) are read as the layer stack their section described, and a checkpoint of
/// that stack loads under them: `memzoo eval` and `generate` run.
#[test]
fn old_layouts_are_converted_and_their_runs_load() {
    let old_xl = RunConfig::resolve(Some(&fixture("xl.toml")), &[]).unwrap();
    let mut expect = Preset::XlTiny.model();
    expect.embedding_std = Some(0.1); // the old default, which that run trained with
    expect.document_resets = true; // as it ran on the generated documents
    assert_eq!(json(&old_xl.model), json(&expect));
    assert_eq!(old_xl.family(), "xl");
    for (file, preset) in [
        ("reformer.toml", Preset::ReformerTiny),
        ("memorizing.toml", Preset::MemorizingTiny),
        ("memorizing-small.toml", Preset::MemorizingSmall),
    ] {
        let old = RunConfig::resolve(Some(&fixture(file)), &[]).unwrap();
        assert_eq!(json(&old.model), json(&preset.model()), "{file}");
        assert_eq!(
            old.model.preset, None,
            "{file}: the old layout named no preset"
        );
        // The old default schedule (the fixtures ran 1 step).
        assert_eq!(
            serde_json::to_value(&old.train).unwrap(),
            serde_json::to_value(Preset::XlTiny.train().with_steps(1)).unwrap(),
            "{file}"
        );
    }
    // A Reformer trained now, its config.toml replaced by the old layout's: it evaluates.
    let dir = scratch("old-run");
    let run = dir.join("run");
    let config = RunConfig::resolve_preset(
        Some(Preset::ReformerTiny),
        None,
        &["train.steps=1".into(), "train.batch=2".into()],
    )
    .unwrap();
    memzoo::commands::train(&config, "flex", &run, false, false, true, true).unwrap();
    std::fs::copy(fixture("reformer.toml"), run.join("config.toml")).unwrap();
    memzoo::commands::eval(&run, "flex", "valid", None, None, Some(1), true).unwrap();
    // An old file with a model_kind that never existed names it.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "model_kind = \"lstm\"\n").unwrap();
    let err = RunConfig::resolve(Some(&bad), &[]).unwrap_err().to_string();
    assert!(err.contains("lstm"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The peer-compatibility switches live in `[model.compat]`, and a run's `config.toml` lists
/// the section only where it differs from its preset's: the default run has none (80 lines), an
/// imported-like stack writes it and reads it back. Config files written before the section
/// (`tests/fixtures/pre-compat/`: the default run's, `--model reformer`'s and `--model
/// memorizing`'s config.toml, the switches in `[model]`) read as the same stacks, their values
/// moved; `--set model.final_norm=...` names the new key.
#[test]
fn peer_switches_are_one_section_and_older_files_convert() {
    let fixture = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/pre-compat")
            .join(name)
    };
    for (file, preset) in [
        ("xl.toml", Preset::XlTiny),
        ("reformer.toml", Preset::ReformerTiny),
        ("memorizing.toml", Preset::MemorizingTiny),
    ] {
        let text = std::fs::read_to_string(fixture(file)).unwrap();
        assert!(text.contains("\nzero_first_memory = false") && !text.contains("[model.compat"));
        let old = RunConfig::resolve(Some(&fixture(file)), &[]).unwrap();
        assert_eq!(old.model.preset, Some(preset), "{file}");
        assert_eq!(json(&old.model), json(&preset.model()), "{file}");
    }
    // Non-default values move with their keys (an imported HF pre-LN model's switches).
    let dir = scratch("compat");
    let text = std::fs::read_to_string(fixture("xl.toml"))
        .unwrap()
        .replace("\nfinal_norm = true", "\nfinal_norm = false")
        .replace("\npre_ln = false", "\npre_ln = true")
        .replace("\nzero_first_memory = false", "\nzero_first_memory = true");
    let path = dir.join("imported.toml");
    std::fs::write(&path, &text).unwrap();
    let imported = RunConfig::resolve(Some(&path), &[]).unwrap();
    let compat = &imported.model.compat;
    assert!(!compat.final_norm && compat.zero_first_memory && imported.model.pre_ln);
    assert_eq!(
        compat
            .clone()
            .with_final_norm(true)
            .with_zero_first_memory(false),
        PeerCompat::new()
    );
    // Written now: the section where it differs, read back the same.
    let written = imported.to_toml();
    assert!(
        written.contains("[model.compat]") && written.contains("zero_first_memory = true"),
        "{written}"
    );
    std::fs::write(&path, &written).unwrap();
    let back = RunConfig::resolve(Some(&path), &[]).unwrap();
    assert_eq!(json(&back.model), json(&imported.model));
    let default = RunConfig::default().to_toml();
    assert!(
        !default.contains("compat") && !default.contains("final_norm"),
        "{default}"
    );
    assert_eq!(default.lines().count(), 85, "{default}");
    // The old key on the command line names the new one.
    let err = RunConfig::resolve(None, &["model.final_norm=false".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.compat.final_norm"), "{err}");
    let set = RunConfig::resolve(None, &["model.compat.final_norm=false".into()]).unwrap();
    assert!(!set.model.compat.final_norm);
    let _ = std::fs::remove_dir_all(dir);
}

/// The LSH settings are one config with one set of defaults: the stack's `[model.lsh]`, the
/// Reformer preset's `lsh` and a single attention layer's all start from `LshConfig::new()`
/// (chunks of 64, 4 rounds). An old layout's `[reformer]` section, whose LSH settings were
/// fields of the preset (`bucket_size`, `n_rounds`, `eval_seed`, `lsh_scores`, ...), is read
/// with its values in the stack's `lsh`.
#[test]
fn lsh_settings_are_defined_once_and_old_reformer_sections_convert() {
    let once = serde_json::to_value(LshConfig::new()).unwrap();
    for lsh in [
        XlConfig::new().lsh,
        ReformerConfig::new().lsh,
        ReformerConfig::new().stack().lsh,
        memzoo_reformer::ReformerAttentionConfig::new(8, 2, 4).lsh,
    ] {
        assert_eq!(serde_json::to_value(lsh).unwrap(), once);
    }
    assert_eq!(
        (LshConfig::new().chunk_len, LshConfig::new().n_rounds),
        (64, 4)
    );
    let old = std::fs::read_to_string(fixture("reformer.toml")).unwrap();
    let mut text = old.clone();
    for (from, to) in [
        ("bucket_size = 64", "bucket_size = 32"),
        ("n_rounds = 4", "n_rounds = 3"),
        ("eval_seed = 0", "eval_seed = 5"),
        (
            "lsh_scores = \"unit_keys\"",
            "lsh_scores = \"scaled_unit_keys\"",
        ),
    ] {
        assert_eq!(old.matches(from).count(), 1, "{from}");
        text = text.replace(from, to);
    }
    let dir = scratch("old-reformer");
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    let lsh = RunConfig::resolve(Some(&path), &[])
        .unwrap()
        .model
        .lsh
        .clone();
    assert_eq!((lsh.chunk_len, lsh.n_rounds, lsh.seed), (32, 3, 5));
    assert_eq!(lsh.scores, memzoo_reformer::LshScores::ScaledUnitKeys);
    let _ = std::fs::remove_dir_all(dir);
}

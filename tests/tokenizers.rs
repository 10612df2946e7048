//! Runs with their own tokenizer (a SentencePiece model or TransfoXL words in the run
//! directory): `memzoo train`, `eval` and `generate` read and write text with it, not bytes.
//! The tokens the commands read are compared with the tokenizer's own encoding of the file.

use std::path::Path;

use memzoo::commands;
use memzoo::config::RunConfig;
use memzoo::data_setup::{load_splits_with, run_codec};
use memzoo_data::TextCodec;
use memzoo_data::tokenize::sentencepiece::SentencePiece;
use memzoo_tests::tiny_cli;

use crate::import::scratch;

const TEXT: &str = "The cat sat on the mat. Raskolnikov said: this is a test sentence, and he \
was in the crime. The quick brown fox said hello to the world!\n";

/// A SentencePiece run: the data are the model's ids of the text (one stream), training and
/// evaluation run on them, generation writes text.
#[test]
fn sentencepiece_runs_train_eval_and_generate() {
    let tmp = scratch("spm-run");
    let data = tmp.join("text.txt");
    std::fs::write(&data, TEXT.repeat(60)).unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/sentencepiece/tiny.model");
    let run = tmp.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(&model, run.join("spiece.model")).unwrap();
    let data_arg = format!("data.source={}", data.display());
    // The model's vocabulary: the pieces (generation samples every id it has).
    let sp = SentencePiece::read(&model).unwrap();
    let vocab_arg = format!("model.vocab_size={}", sp.len());
    let config = RunConfig::resolve(None, &tiny_cli(&[&data_arg, &vocab_arg])).unwrap();

    // The tokens train reads: the pieces of each split's text.
    let codec = run_codec(&config.data, &run).unwrap();
    assert!(matches!(codec, Some(TextCodec::Pieces(_))));
    let splits = load_splits_with(&config.data, codec).unwrap();
    let corpus = memzoo::data_setup::load_corpus(&config.data).unwrap().1;
    let want: Vec<u16> = sp
        .encode(&String::from_utf8(corpus.train).unwrap())
        .into_iter()
        .map(|i| i as u16)
        .collect();
    assert_eq!(splits.train, want);
    assert!(
        splits.train.len() * 3 < TEXT.len() * 60,
        "pieces, not bytes"
    );
    assert!(splits.name.contains("spiece.model"), "{}", splits.name);

    commands::train(&config, "flex", &run, false, false, true, true).unwrap();
    commands::eval(&run, "flex", "valid", None, None, Some(1), true).unwrap();
    let opts = commands::GenerateOptions {
        prompt: "the cat".into(),
        tokens: 5,
        sampler: memzoo_train::generate::SampleConfig::new(),
        segment_len: None,
        mem_len: None,
        compare_recompute: false,
    };
    commands::generate(&run, "flex", &opts, true).unwrap();
    std::fs::remove_dir_all(&tmp).ok();
}

/// A word-level run (TransfoXL's vocab.json): each line's words then `<eos>`, as HF reads its
/// corpora; a vocabulary too large for 16-bit token ids is refused, naming its size.
#[test]
fn word_runs_read_lines_with_eos() {
    let tmp = scratch("words-run");
    let data = tmp.join("text.txt");
    let lines = "The cat sat on the mat.\nThe dog didn't care.\n";
    std::fs::write(&data, lines.repeat(200)).unwrap();
    let run = tmp.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let vocab =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/transfo-xl-tokenizer/vocab.json");
    std::fs::copy(&vocab, run.join("vocab.json")).unwrap();
    let data_arg = format!("data.source={}", data.display());
    let config = RunConfig::resolve(None, &tiny_cli(&[&data_arg])).unwrap();
    let codec = run_codec(&config.data, &run).unwrap();
    let Some(TextCodec::Words(words)) = &codec else {
        panic!("{codec:?}")
    };
    let eos = words.id("<eos>").unwrap() as u16;
    let line1: Vec<u16> = words
        .encode("The cat sat on the mat.")
        .unwrap()
        .into_iter()
        .map(|i| i as u16)
        .collect();
    let splits = load_splits_with(&config.data, codec.clone()).unwrap();
    assert_eq!(&splits.train[..line1.len()], &line1[..]);
    assert_eq!(splits.train[line1.len()], eos);
    commands::train(&config, "flex", &run, false, false, true, true).unwrap();
    commands::eval(&run, "flex", "test", None, None, Some(1), true).unwrap();

    // 70,000 words do not fit 16-bit token ids.
    let mut big: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&vocab).unwrap()).unwrap();
    big["idx2sym"] = (0..70_000).map(|i| format!("w{i}")).collect();
    big["unk_idx"] = 0.into();
    let big_run = tmp.join("big");
    std::fs::create_dir_all(&big_run).unwrap();
    std::fs::write(big_run.join("vocab.json"), big.to_string()).unwrap();
    let codec = run_codec(&config.data, &big_run).unwrap();
    let err = load_splits_with(&config.data, codec)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("70000") && err.contains("16-bit"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

/// `memzoo import` of a local directory with HF's `vocab.pkl` (and no `vocab.json`) writes the
/// pickle's words into the run as `vocab.json`; a pickle that would run code is refused,
/// naming the global, before anything is written; a `spiece.model` whose pieces are not the
/// model's vocabulary is refused, naming both sizes.
#[test]
fn import_reads_vocab_pkl_and_checks_spiece_model() {
    let tmp = scratch("import-tokenizers");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let with = |name: &str, extra: &[(&str, &str)]| {
        let src = tmp.join(name);
        std::fs::create_dir_all(&src).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixtures.join("hf-transfo-xl/plain").join(f), src.join(f)).unwrap();
        }
        for (from, to) in extra {
            std::fs::copy(fixtures.join(from), src.join(to)).unwrap();
        }
        src
    };
    let src = with("pkl", &[("transfo-xl-tokenizer/vocab-48.pkl", "vocab.pkl")]);
    let run = tmp.join("run-pkl");
    memzoo::import::import("hf-transfo-xl", &src, &run, None, false, true).unwrap();
    let got: memzoo_data::word_vocab::TransfoXlVocabFile =
        serde_json::from_str(&std::fs::read_to_string(run.join("vocab.json")).unwrap()).unwrap();
    let mut want: memzoo_data::word_vocab::TransfoXlVocabFile = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("transfo-xl-tokenizer/vocab.json")).unwrap(),
    )
    .unwrap();
    want.idx2sym.truncate(48);
    assert_eq!(
        serde_json::to_value(&got).unwrap(),
        serde_json::to_value(&want).unwrap()
    );

    let src = with(
        "evil",
        &[("transfo-xl-tokenizer/malicious.pkl", "vocab.pkl")],
    );
    let run = tmp.join("run-evil");
    let err = memzoo::import::import("hf-transfo-xl", &src, &run, None, false, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("system") && err.contains("refused global"),
        "{err}"
    );
    assert!(!run.join("config.toml").exists());

    let src = with("spm", &[("sentencepiece/tiny.model", "spiece.model")]);
    let pieces = SentencePiece::read(&src.join("spiece.model"))
        .unwrap()
        .len();
    let err = memzoo::import::import(
        "hf-transfo-xl",
        &src,
        &tmp.join("run-spm"),
        None,
        false,
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(&format!("{pieces} pieces")) && err.contains("48"),
        "{err}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

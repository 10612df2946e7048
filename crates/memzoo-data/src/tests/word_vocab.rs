//! TransfoXL's word tokenizer against HF's own `TransfoXLTokenizer` (transformers 4.37.2 with
//! sacremoses 0.1.1): `tests/fixtures/transfo-xl-tokenizer`, written by
//! `xtask/peers/fixtures/transfo_xl_tokenizer.py` — a vocabulary HF built, pickled and loaded
//! back, converted by `xtask/peers/transfo_xl_vocab.py`, and HF's tokens, ids and decoded text
//! of sentences with contractions, numbers, hyphens, quotes, brackets, abbreviations, special
//! tokens, Unicode punctuation and unknown words, cased and lower-cased.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::DataError;
use crate::word_vocab::{TransfoXlVocab, TransfoXlVocabFile};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/transfo-xl-tokenizer")
        .join(name)
}

#[derive(Deserialize)]
struct Case {
    text: String,
    tokens: Vec<String>,
    ids: Vec<usize>,
    decoded: String,
    words_to_string: String,
}

fn cases() -> std::collections::BTreeMap<String, Vec<Case>> {
    let text = std::fs::read_to_string(fixture("cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn tokenize_encode_decode_match_hf() {
    let all = cases();
    assert_eq!(all.len(), 2);
    for (file, cases) in &all {
        let vocab = TransfoXlVocab::read(&fixture(file)).unwrap();
        assert_eq!(cases.len(), 8, "{file}");
        for c in cases {
            assert_eq!(
                vocab.tokenize(&c.text),
                c.tokens,
                "{file}: tokens of {:?}",
                c.text
            );
            assert_eq!(
                vocab.encode(&c.text).unwrap(),
                c.ids,
                "{file}: ids of {:?}",
                c.text
            );
            assert_eq!(
                vocab.words_to_string(&c.tokens),
                c.words_to_string,
                "{file}: words_to_string of {:?}",
                c.tokens
            );
            assert_eq!(
                vocab.decode(&c.ids).unwrap(),
                c.decoded,
                "{file}: decode of {:?}",
                c.ids
            );
        }
    }
}

#[test]
fn vocab_errors_name_the_field() {
    let dir = std::env::temp_dir().join(format!("memzoo-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good: TransfoXlVocabFile =
        serde_json::from_str(&std::fs::read_to_string(fixture("vocab.json")).unwrap()).unwrap();
    let write = |f: &dyn Fn(&mut TransfoXlVocabFile)| {
        let mut v = good.clone();
        f(&mut v);
        let p = dir.join("v.json");
        std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
        TransfoXlVocab::read(&p).unwrap_err().to_string()
    };
    assert!(write(&|v| v.format = "pickle".into()).contains("format"));
    assert!(write(&|v| v.language = "de".into()).contains("language = \"de\""));
    assert!(write(&|v| v.unk_idx = Some(1000)).contains("unk_idx = 1000"));
    assert!(write(&|v| v.idx2sym.clear()).contains("idx2sym is empty"));
    // Without any unknown id, an unknown word is an error naming it.
    let mut v = good.clone();
    v.unk_idx = None;
    v.idx2sym[0] = "<pad>".into();
    let vocab = TransfoXlVocab::new(v, "test".into()).unwrap();
    let err = vocab.encode("zebra").unwrap_err();
    assert!(err.to_string().contains("zebra"), "{err}");
    // An id outside the vocabulary is an error, not a panic.
    let vocab = TransfoXlVocab::read(&fixture("vocab.json")).unwrap();
    assert!(matches!(
        vocab.decode(&[1, 88]),
        Err(DataError::TokenOutOfRange {
            id: 88,
            vocab_size: 88
        })
    ));
    let err = TransfoXlVocab::read(&dir.join("missing.json")).unwrap_err();
    assert!(err.to_string().contains("missing.json"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `memzoo generate`'s codec: a run directory with `vocab.json` reads and writes HF's words
/// (the continuation after a space), one without reads bytes.
#[test]
fn text_codec_picks_words_when_the_run_has_a_vocabulary() {
    use crate::word_vocab::{TextCodec, WORD_VOCAB_FILE};
    let dir = std::env::temp_dir().join(format!("memzoo-codec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = TextCodec::for_dir(&dir).unwrap();
    assert!(matches!(bytes, TextCodec::Bytes(_)));
    assert_eq!(bytes.encode_prompt("ab").unwrap(), vec![97, 98]);
    assert_eq!(bytes.encode_prompt("").unwrap(), vec![10]);
    assert_eq!(bytes.decode_continuation(&[104, 105]).unwrap(), "hi");
    assert!(bytes.decode_continuation(&[-1]).is_err());
    // Bytes at offset 2 (google/reformer-enwik8): byte b is id b + 2, a newline 12.
    let shifted = TextCodec::for_dir_with_offset(&dir, 2).unwrap();
    assert_eq!(shifted.vocab_size(), 258);
    assert_eq!(shifted.encode_prompt("ab").unwrap(), vec![97 + 2, 98 + 2]);
    assert_eq!(shifted.encode_prompt("").unwrap(), vec![10 + 2]);
    assert_eq!(
        shifted.decode_continuation(&[104 + 2, 1, 105 + 2]).unwrap(),
        "hi"
    );
    assert!(shifted.decode_continuation(&[258]).is_err());
    std::fs::copy(fixture("vocab.json"), dir.join(WORD_VOCAB_FILE)).unwrap();
    let words = TextCodec::for_dir(&dir).unwrap();
    let all = cases();
    let case = &all["vocab.json"][1];
    let ids: Vec<i64> = case.ids.iter().map(|&i| i as i64).collect();
    assert_eq!(words.encode_prompt(&case.text).unwrap(), ids);
    assert_eq!(words.encode_prompt("").unwrap(), vec![1], "<eos>");
    assert_eq!(
        words.decode_continuation(&ids).unwrap(),
        format!(" {}", case.decoded)
    );
    assert!(words.decode_continuation(&[88]).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

//! SentencePiece unigram models: the fixtures of `xtask/peers/fixtures/sentencepiece_model.py`
//! (written by hand in the protobuf format, not by the `sentencepiece` library), encoded by
//! [`SentencePiece`] and checked against an independent segmentation written naively here: the
//! best-scoring split over every way to cut the normalised text into pieces, by plain
//! recursion; and models trained by the `sentencepiece` library itself
//! (`xtask/peers/fixtures/sentencepiece_real.py`) against the ids of the library and of HF's
//! `ReformerTokenizer`. Parity with HF's ids on the real `google/reformer-crime-and-punishment`
//! model is checked only where `MEMZOO_REFORMER_SPIECE` names its `spiece.model`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::tokenize::sentencepiece::{PieceKind, SPACE, SentencePiece};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sentencepiece")
        .join(name)
}

const SENTENCES: &[&str] = &[
    "Hello World!",
    "The cat sat on the mat.",
    "  the   quick brown fox  ",
    "Raskolnikov said: \"this is a very long sentence\", and he was in crime.",
    "unknown chars 42 zzz qq here",
    "a<sep>b, the<sep>",
    "",
    "   ",
];

/// The best segmentation of `s` (already normalised), by exhaustive recursion with a memo:
/// the largest summed score over pieces (user-defined: `bytes * max_score - 0.1`), where a
/// character no single-character piece covers costs `min_score - 10` as the unknown piece.
fn naive_best(sp: &SentencePiece, s: &str) -> (f64, Vec<u32>) {
    let pieces = sp.pieces();
    let normal: Vec<f32> = pieces
        .iter()
        .filter(|p| p.kind == PieceKind::Normal)
        .map(|p| p.score)
        .collect();
    let min = normal.iter().cloned().fold(f32::INFINITY, f32::min) as f64;
    let max = normal.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let chars: Vec<char> = s.chars().collect();
    fn go(
        i: usize,
        chars: &[char],
        sp: &SentencePiece,
        min: f64,
        max: f64,
        memo: &mut HashMap<usize, (f64, Vec<u32>)>,
    ) -> (f64, Vec<u32>) {
        if i == chars.len() {
            return (0.0, Vec::new());
        }
        if let Some(r) = memo.get(&i) {
            return r.clone();
        }
        let mut best: Option<(f64, Vec<u32>)> = None;
        let mut single = false;
        for j in i + 1..=chars.len() {
            let text: String = chars[i..j].iter().collect();
            for (id, p) in sp.pieces().iter().enumerate() {
                if p.piece != text || !matches!(p.kind, PieceKind::Normal | PieceKind::UserDefined)
                {
                    continue;
                }
                single |= j == i + 1;
                let score = if p.kind == PieceKind::UserDefined {
                    text.len() as f64 * max - 0.1
                } else {
                    p.score as f64
                };
                let (rest, mut ids) = go(j, chars, sp, min, max, memo);
                if best.as_ref().is_none_or(|(b, _)| score + rest > *b) {
                    ids.insert(0, id as u32);
                    best = Some((score + rest, ids));
                }
            }
        }
        if !single {
            let (rest, mut ids) = go(i + 1, chars, sp, min, max, memo);
            let score = min - 10.0 + rest;
            if best.as_ref().is_none_or(|(b, _)| score > *b) {
                ids.insert(0, sp.unk_id());
                best = Some((score, ids));
            }
        }
        let best = best.unwrap();
        memo.insert(i, best.clone());
        best
    }
    go(0, &chars, sp, min, max, &mut HashMap::new())
}

/// Whitespace as SentencePiece's default normaliser treats it, written out naively: trimmed,
/// runs of spaces as one, a space first, spaces as `▁`.
fn naive_normalize(text: &str) -> String {
    let words: Vec<&str> = text.split(' ').filter(|w| !w.is_empty()).collect();
    if words.is_empty() {
        return String::new();
    }
    format!(" {}", words.join(" ")).replace(' ', &SPACE.to_string())
}

/// The pieces' summed score of an encoding (unknowns at `min - 10` each character).
fn score_of(sp: &SentencePiece, pieces: &[(String, u32)]) -> f64 {
    let min = sp
        .pieces()
        .iter()
        .filter(|p| p.kind == PieceKind::Normal)
        .map(|p| p.score)
        .fold(f32::INFINITY, f32::min) as f64;
    let max = sp
        .pieces()
        .iter()
        .filter(|p| p.kind == PieceKind::Normal)
        .map(|p| p.score)
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    pieces
        .iter()
        .map(|(s, id)| {
            let p = &sp.pieces()[*id as usize];
            match p.kind {
                PieceKind::Unknown => s.chars().count() as f64 * (min - 10.0),
                PieceKind::UserDefined => s.len() as f64 * max - 0.1,
                _ => p.score as f64,
            }
        })
        .sum()
}

#[test]
fn sentencepiece_reads_the_model_file() {
    let sp = SentencePiece::read(&fixture("tiny.model")).unwrap();
    let p = sp.pieces();
    assert_eq!(p[0].piece, "<unk>");
    assert_eq!(p[0].kind, PieceKind::Unknown);
    assert_eq!(
        (p[1].kind, p[2].kind),
        (PieceKind::Control, PieceKind::Control)
    );
    assert_eq!(p[3].kind, PieceKind::UserDefined);
    assert_eq!((p[4].piece.as_str(), p[4].score), ("\u{2581}", -3.0));
    assert_eq!(sp.unk_id(), 0);
    assert_eq!(sp.piece_id("\u{2581}the"), Some(5));
    assert!(p.iter().all(|x| x.score <= 0.0));
}

/// Every sentence's ids are the exhaustive search's best segmentation (same score; the same
/// ids where the best is unique, which random scores make it), unknown runs fused.
#[test]
fn sentencepiece_segments_as_the_exhaustive_search() {
    let sp = SentencePiece::read(&fixture("tiny.model")).unwrap();
    for text in SENTENCES {
        let normalized = sp.normalize(text);
        assert_eq!(normalized, naive_normalize(text), "{text:?}");
        let pieces = sp.encode_pieces(text);
        let (best, naive_ids) = naive_best(&sp, &normalized);
        let got = score_of(&sp, &pieces);
        assert!((got - best).abs() < 1e-4, "{text:?}: {got} vs {best}");
        // The naive search keeps one id per unknown character; SentencePiece fuses runs.
        let mut fused: Vec<u32> = Vec::new();
        for id in naive_ids {
            if !(id == sp.unk_id() && fused.last() == Some(&sp.unk_id())) {
                fused.push(id);
            }
        }
        assert_eq!(sp.encode(text), fused, "{text:?}");
        // The pieces cover the normalised text exactly.
        let joined: String = pieces.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(joined, normalized, "{text:?}");
    }
    // Unknown characters: 4 2 (one run "42"), z z z, q q.
    let pieces = sp.encode_pieces("42 zzz");
    let unk: Vec<&str> = pieces
        .iter()
        .filter(|(_, id)| *id == 0)
        .map(|(s, _)| s.as_str())
        .collect();
    assert_eq!(unk, ["42", "zzz"]);
}

/// Text back from ids: spaces restored, the dummy prefix's space removed, control pieces
/// dropped, unknowns as " ⁇ ".
#[test]
fn sentencepiece_decodes_back_to_text() {
    let sp = SentencePiece::read(&fixture("tiny.model")).unwrap();
    for text in ["Hello World!", "The cat sat on the mat.", "a<sep>b"] {
        assert_eq!(sp.decode(&sp.encode(text)).unwrap(), text);
    }
    assert_eq!(
        sp.decode(&sp.encode("  the   quick brown fox  ")).unwrap(),
        "the quick brown fox"
    );
    let mut ids = vec![1];
    ids.extend(sp.encode("the zz cat"));
    ids.push(2);
    assert_eq!(sp.decode(&ids).unwrap(), "the  \u{2047}  cat");
    let err = sp.decode(&[sp.len() as u32]).unwrap_err().to_string();
    assert!(err.contains(&sp.len().to_string()), "{err}");
}

/// The precompiled character map: the longest key wins (`ＡＢ` over `Ａ`), replacements may
/// be longer or shorter, tabs and no-break spaces become spaces and then collapse.
#[test]
fn sentencepiece_applies_the_precompiled_charsmap() {
    let sp = SentencePiece::read(&fixture("tiny-charsmap.model")).unwrap();
    let s = SPACE.to_string();
    assert_eq!(
        sp.normalize("\tＡＢＡ\u{a0}\u{a0}ﬁne…"),
        format!("{s}ABA{s}fine...")
    );
    assert_eq!(sp.normalize("Ａ"), format!("{s}A"));
    assert_eq!(sp.normalize("\t \u{a0}"), "");
    // The identity model keeps them.
    let plain = SentencePiece::read(&fixture("tiny.model")).unwrap();
    assert_eq!(plain.normalize("ＡＢ\tx"), format!("{s}ＡＢ\tx"));
    for text in SENTENCES {
        let (best, _) = naive_best(&sp, &sp.normalize(text));
        assert!(
            (score_of(&sp, &sp.encode_pieces(text)) - best).abs() < 1e-4,
            "{text:?}"
        );
    }
}

/// Byte fallback: an unknown character becomes its UTF-8 bytes' pieces, and decodes back.
#[test]
fn sentencepiece_byte_fallback() {
    let sp = SentencePiece::read(&fixture("tiny-bytes.model")).unwrap();
    let text = "the zé cat";
    let pieces = sp.encode_pieces(text);
    let names: Vec<&str> = pieces.iter().map(|(s, _)| s.as_str()).collect();
    assert!(
        names
            .windows(3)
            .any(|w| w == ["<0x7A>", "<0xC3>", "<0xA9>"]),
        "{names:?}"
    );
    assert!(!sp.encode(text).contains(&0));
    assert_eq!(sp.decode(&sp.encode(text)).unwrap(), text);
}

/// Broken files: errors naming the file and what is wrong, never a panic.
#[test]
fn sentencepiece_refuses_broken_models() {
    let good = std::fs::read(fixture("tiny.model")).unwrap();
    let p = Path::new("broken.model");
    for cut in [1, 7, good.len() / 2, good.len() - 3] {
        let r = SentencePiece::from_bytes(&good[..cut], p);
        if let Err(e) = r {
            assert!(e.to_string().contains("broken.model"), "{e}");
        }
    }
    let err = SentencePiece::from_bytes(b"", p).unwrap_err().to_string();
    assert!(err.contains("no pieces"), "{err}");
    // A BPE model: trainer_spec { model_type: 2 } appended (a later field wins).
    let mut bpe = good.clone();
    bpe.extend([0x12, 0x02, 0x18, 0x02]);
    let err = SentencePiece::from_bytes(&bpe, p).unwrap_err().to_string();
    assert!(err.contains("BPE"), "{err}");
    // unk_id beyond the pieces.
    let mut unk = good;
    unk.extend([0x12, 0x03, 0xc0, 0x02, 0x7f]);
    let err = SentencePiece::from_bytes(&unk, p).unwrap_err().to_string();
    assert!(err.contains("unk_id 127"), "{err}");
}

/// HF's ids for `google/reformer-crime-and-punishment` (transformers'
/// `tests/models/reformer/test_tokenization_reformer.py`), where `MEMZOO_REFORMER_SPIECE`
/// names that model's `spiece.model`; skipped (saying so) otherwise.
#[test]
fn sentencepiece_matches_hf_on_crime_and_punishment() {
    let Some(path) = std::env::var_os("MEMZOO_REFORMER_SPIECE") else {
        eprintln!("skipped: set MEMZOO_REFORMER_SPIECE to crime-and-punishment's spiece.model");
        return;
    };
    let sp = SentencePiece::read(Path::new(&path)).unwrap();
    assert_eq!(sp.len(), 320);
    let cases: [(&str, &[u32]); 3] = [
        ("Hello World!", &[126, 32, 262, 152, 38, 72, 287]),
        (
            "This is a very simple sentence.",
            &[
                108, 265, 24, 111, 4, 258, 156, 7, 51, 279, 58, 7, 76, 25, 69, 278,
            ],
        ),
        (
            "The quick brown fox jumps over the lazy dog.",
            &[
                140, 243, 264, 134, 17, 267, 77, 263, 22, 262, 297, 258, 304, 177, 279, 266, 14,
                89, 13, 35, 261, 299, 272, 137, 275, 278,
            ],
        ),
    ];
    for (text, ids) in cases {
        assert_eq!(sp.encode(text), ids, "{text}");
    }
}

/// Models trained by the `sentencepiece` library itself (`spm-nfkc.model`: its default
/// `nmt_nfkc` normaliser and precompiled character map; `spm-bytes.model`: byte fallback,
/// identity normaliser) encode each sentence of `spm-cases.json` into the ids that the library
/// and HF's `ReformerTokenizer` give, and decode them back as the library does
/// (`xtask/peers/fixtures/sentencepiece_real.py` wrote the models and the cases).
#[test]
fn sentencepiece_matches_the_library_and_hf() {
    #[derive(serde::Deserialize)]
    struct Case {
        text: String,
        ids: Vec<u32>,
        pieces: Vec<String>,
        hf_ids: Vec<u32>,
        decoded: String,
    }
    let cases: std::collections::BTreeMap<String, Vec<Case>> =
        serde_json::from_str(&std::fs::read_to_string(fixture("spm-cases.json")).unwrap()).unwrap();
    assert_eq!(cases.len(), 2);
    for (model, rows) in &cases {
        let sp = SentencePiece::read(&fixture(model)).unwrap();
        for case in rows {
            assert_eq!(case.ids, case.hf_ids, "{model}: the library and HF agree");
            let got = sp.encode(&case.text);
            // The library names an unknown piece by the text it covers.
            let pieces: Vec<String> = got
                .iter()
                .zip(&case.pieces)
                .map(|(&id, theirs)| match id == sp.unk_id() {
                    true => theirs.clone(),
                    false => sp.pieces()[id as usize].piece.clone(),
                })
                .collect();
            assert_eq!(
                (&got, &pieces),
                (&case.ids, &case.pieces),
                "{model}: {:?}",
                case.text
            );
            assert_eq!(
                sp.decode(&got).unwrap(),
                case.decoded,
                "{model}: {:?}",
                case.text
            );
        }
    }
}

//! The data-only pickle reader and HF TransfoXL's `vocab.pkl`: the fixtures of
//! `xtask/peers/fixtures/transfo_xl_pickle.py` (written with Python's own `pickle`) and of
//! `transfo_xl_pickle_hf.py` (`vocab-hf4.pkl`, written by transformers 4.37.2's own
//! `save_vocabulary`) read into the very vocabulary `vocab.json` gives, which tokenises the sentences
//! of `cases.json` into HF's ids; pickles that would run code are refused, naming the global,
//! and run nothing.

use std::path::{Path, PathBuf};

use crate::DataError;
use crate::tokenize::pickle::{self, DictKind, PickleError, PyValue};
use crate::tokenize::transfo_xl_vocab_from_pickle;
use crate::word_vocab::{TransfoXlVocab, TransfoXlVocabFile};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/transfo-xl-tokenizer")
        .join(name)
}

fn json_vocab() -> TransfoXlVocabFile {
    serde_json::from_str(&std::fs::read_to_string(fixture("vocab.json")).unwrap()).unwrap()
}

/// Every variant (protocol 4, protocol 2, legacy and zip torch.save, and the file transformers
/// 4.37.2's own `save_vocabulary` writes, with its Moses objects kept as inert records) gives
/// vocab.json's fields.
#[test]
fn vocab_pkl_reads_as_vocab_json() {
    let want = json_vocab();
    for name in [
        "vocab.pkl",
        "vocab-hf4.pkl",
        "vocab-p2.pkl",
        "vocab-torch.pkl",
        "vocab-torchzip.pkl",
    ] {
        let got = transfo_xl_vocab_from_pickle(&fixture(name)).unwrap();
        assert_eq!(got.idx2sym, want.idx2sym, "{name}");
        assert_eq!(got.unk_idx, want.unk_idx, "{name}");
        assert_eq!(got.never_split, want.never_split, "{name}");
        assert_eq!(
            (got.lower_case, &got.delimiter, &got.language, &got.format),
            (
                want.lower_case,
                &want.delimiter,
                &want.language,
                &want.format
            ),
            "{name}"
        );
    }
}

/// The pickled vocabulary encodes HF's test sentences into HF's ids (cases.json, written by
/// HF's own tokenizer) and decodes them back as HF does.
#[test]
fn vocab_pkl_tokenises_as_hf() {
    #[derive(serde::Deserialize)]
    struct Case {
        text: String,
        ids: Vec<usize>,
        decoded: String,
    }
    let cases: std::collections::BTreeMap<String, Vec<Case>> =
        serde_json::from_str(&std::fs::read_to_string(fixture("cases.json")).unwrap()).unwrap();
    for pkl in ["vocab.pkl", "vocab-hf4.pkl"] {
        let file = transfo_xl_vocab_from_pickle(&fixture(pkl)).unwrap();
        let vocab = TransfoXlVocab::new(file, fixture(pkl)).unwrap();
        for case in &cases["vocab.json"] {
            assert_eq!(vocab.encode(&case.text).unwrap(), case.ids, "{}", case.text);
            assert_eq!(
                vocab.decode(&case.ids).unwrap(),
                case.decoded,
                "{}",
                case.text
            );
        }
    }
}

/// transformers 4.37.2's `vocab.pkl` keeps the objects beside the vocabulary as records, never
/// built: the compiled regular expression with its pattern, the Moses objects with their state.
#[test]
fn hf4_pickle_keeps_objects_as_records() {
    let v = pickle::read_file(&fixture("vocab-hf4.pkl")).unwrap();
    let PyValue::Dict(_, entries) = &v else {
        panic!("{v:?}")
    };
    let mut classes: Vec<&str> = Vec::new();
    fn walk<'a>(v: &'a PyValue, out: &mut Vec<&'a str>) {
        match v {
            PyValue::Record { class, args, state } => {
                out.push(class);
                args.iter().for_each(|a| walk(a, out));
                walk(state, out);
            }
            PyValue::List(x) | PyValue::Tuple(x) | PyValue::Set(x) => {
                x.iter().for_each(|a| walk(a, out))
            }
            PyValue::Dict(_, e) => e.iter().for_each(|(k, x)| {
                walk(k, out);
                walk(x, out)
            }),
            _ => {}
        }
    }
    entries.iter().for_each(|(_, x)| walk(x, &mut classes));
    for want in [
        "re._compile",
        "sacremoses.normalize.MosesPunctNormalizer",
        "sacremoses.tokenize.MosesTokenizer",
        "sacremoses.tokenize.MosesDetokenizer",
    ] {
        assert!(classes.contains(&want), "{want} in {classes:?}");
    }
    // The regular expression is its pattern, as data.
    let Some(PyValue::Record { args, .. }) = v.get("punction_without_space_before_pattern") else {
        panic!("{:?}", v.get("punction_without_space_before_pattern"));
    };
    assert!(
        matches!(&args[0], PyValue::Str(p) if p.contains("[^\\s]")),
        "{args:?}"
    );
}

/// The structure itself: the Counter's counts, the OrderedDict's order, a tuple, None.
#[test]
fn pickle_values_are_pythons() {
    let v = pickle::read_file(&fixture("vocab.pkl")).unwrap();
    let words = json_vocab().idx2sym;
    let Some(PyValue::Dict(DictKind::OrderedDict, sym2idx)) = v.get("sym2idx") else {
        panic!("sym2idx: {:?}", v.get("sym2idx"));
    };
    assert_eq!(sym2idx.len(), words.len());
    for (i, (k, id)) in sym2idx.iter().enumerate() {
        assert_eq!(
            (k, id),
            (&PyValue::Str(words[i].clone()), &PyValue::Int(i as i128))
        );
    }
    let Some(PyValue::Dict(DictKind::Counter, counts)) = v.get("counter") else {
        panic!("counter: {:?}", v.get("counter"));
    };
    // The script counts word i (not a special) as 1000 - i.
    for (k, n) in counts {
        let PyValue::Str(w) = k else { panic!("{k:?}") };
        let i = words.iter().position(|x| x == w).unwrap();
        assert_eq!(n, &PyValue::Int(1000 - i as i128), "{w}");
    }
    assert_eq!(v.get("max_size"), Some(&PyValue::None));
    assert_eq!(v.get("lower_case"), Some(&PyValue::Bool(false)));
    assert_eq!(
        v.get("never_split"),
        Some(&PyValue::Tuple(
            ["<unk>", "<eos>", "<formula>"]
                .iter()
                .map(|s| PyValue::Str(s.to_string()))
                .collect()
        ))
    );
}

/// Hand-written opcodes: integers of every width (negative, beyond 64 bits), floats, bytes,
/// sets, a memoised list filled after it was stored (shared, as in Python), and protocol 0.
#[test]
fn pickle_opcodes_build_the_values_python_would() {
    let p = Path::new("hand.pkl");
    // [K 7, J -2, LONG1 2**70, G 1.5, SHORT_BINBYTES b"ab", EMPTY_SET + ADDITEMS(1)]
    let mut b = vec![0x80, 4, b'(', b'K', 7, b'J'];
    b.extend((-2i32).to_le_bytes());
    b.extend([0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0x40]);
    b.push(b'G');
    b.extend(1.5f64.to_be_bytes());
    b.extend([b'C', 2, b'a', b'b', 0x8f, b'(', b'K', 1, 0x90, b'l', b'.']);
    let v = pickle::read_bytes(&b, p).unwrap();
    assert_eq!(
        v,
        PyValue::List(vec![
            PyValue::Int(7),
            PyValue::Int(-2),
            PyValue::Int(1i128 << 70),
            PyValue::Float(1.5),
            PyValue::Bytes(b"ab".to_vec()),
            PyValue::Set(vec![PyValue::Int(1)]),
        ])
    );
    // x = []; (x, x) with x filled after being memoised: both see the item.
    let b = [
        0x80, 2, b']', b'q', 0, b'h', 0, 0x86, b'q', 1, b'h', 0, b'K', 5, b'a', b'0', b'.',
    ];
    let v = pickle::read_bytes(&b, p).unwrap();
    let five = PyValue::List(vec![PyValue::Int(5)]);
    assert_eq!(v, PyValue::Tuple(vec![five.clone(), five]));
    // Protocol 0: (dp0\nVa\np1\nI-3\ns.
    let v = pickle::read_bytes(b"(dp0\nVa\\u00e9\np1\nI-3\nsF0.25\n0.", p);
    // The float was popped: the dict is what STOP sees.
    let v = v.unwrap();
    assert_eq!(
        v,
        PyValue::Dict(
            DictKind::Dict,
            vec![(PyValue::Str("a\u{e9}".into()), PyValue::Int(-3))]
        )
    );
}

/// A pickle that would call os.system is refused, naming the global, and nothing runs (the
/// file its command would create is not created).
#[test]
fn malicious_pickles_are_refused_by_name() {
    let marker = Path::new("memzoo-pickle-was-run");
    for name in ["malicious.pkl", "malicious-p0.pkl"] {
        let err = pickle::read_file(&fixture(name)).unwrap_err();
        let PickleError::Refused { global, .. } = &err else {
            panic!("{name}: {err}");
        };
        // Python records os.system under its implementing module: posix on Linux.
        assert!(
            ["os.system", "posix.system", "nt.system"].contains(&global.as_str()),
            "{name}: {global}"
        );
        let msg = err.to_string();
        assert!(msg.contains(global.as_str()) && msg.contains(name), "{msg}");
        let err = transfo_xl_vocab_from_pickle(&fixture(name)).unwrap_err();
        assert!(matches!(err, DataError::Pickle(_)), "{err}");
    }
    assert!(!marker.exists(), "a pickle's command ran");
    // Hand-made: builtins.eval through GLOBAL, subprocess via STACK_GLOBAL, and opcodes that
    // build objects.
    let p = Path::new("evil.pkl");
    let err = pickle::read_bytes(b"cbuiltins\neval\n(S'1'\ntR.", p).unwrap_err();
    assert!(err.to_string().contains("builtins.eval"), "{err}");
    let mut b = vec![0x80, 4, 0x8c, 10];
    b.extend(b"subprocess");
    b.extend([0x8c, 5]);
    b.extend(b"Popen");
    b.extend([0x93, b'.']);
    let err = pickle::read_bytes(&b, p).unwrap_err();
    assert!(err.to_string().contains("subprocess.Popen"), "{err}");
    for (bytes, what) in [
        (&b"(i__main__\nX\n."[..], "__main__.X"),
        (&[0x80, 2, b'K', 1, b'Q', b'.'][..], "persistent id"),
        (&[0x80, 2, 0x82, 1, b'.'][..], "extension"),
        (&[0x80, 2, b'K', 1][..], "ends"),
        (&[0x80, 2, 0xff][..], "unknown opcode"),
        (
            &[0x80, 2, b'X', 0xff, 0xff, 0xff, 0x7f][..],
            "past the file's end",
        ),
    ] {
        let err = pickle::read_bytes(bytes, p).unwrap_err();
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

/// A vocabulary whose sym2idx disagrees with idx2sym, or that is no dict, is an error that
/// names the word.
#[test]
fn inconsistent_vocab_pkl_is_refused() {
    let tmp = super::TempDir::new("pickle-vocab");
    // {'idx2sym': ['a', 'b'], 'sym2idx': {'a': 0, 'b': 0}}
    let b = b"(dp0\nVidx2sym\n(lp1\nVa\naVb\nasVsym2idx\n(dp2\nVa\nI0\nsVb\nI0\nss.";
    let path = tmp.path().join("vocab.pkl");
    std::fs::write(&path, b).unwrap();
    let err = transfo_xl_vocab_from_pickle(&path).unwrap_err().to_string();
    assert!(err.contains("sym2idx[\"b\"] = 0"), "{err}");
    std::fs::write(&path, b"(lp0\n.").unwrap();
    let err = transfo_xl_vocab_from_pickle(&path).unwrap_err().to_string();
    assert!(err.contains("holds a list"), "{err}");
}

//! The tokenizers that real checkpoints ship, read without Python:
//!
//! - [`pickle`]: a data-only pickle reader (nothing is ever called; globals outside a small
//!   allowlist of data types are refused by name), and [`transfo_xl_vocab_from_pickle`], which
//!   reads HF TransfoXL's `vocab.pkl` into the same vocabulary as memzoo's `vocab.json`
//!   ([`crate::word_vocab`]).
//! - [`sentencepiece`]: SentencePiece unigram models (`spiece.model`, e.g.
//!   `google/reformer-crime-and-punishment`): the protobuf read by hand, text in and out.

pub mod pickle;
pub mod sentencepiece;

use std::path::Path;

use crate::error::DataError;
use crate::word_vocab::{FORMAT, TransfoXlVocabFile};
use pickle::PyValue;

/// The file name of HF TransfoXL's pickled vocabulary.
pub const TRANSFO_XL_PICKLE: &str = "vocab.pkl";

/// The special tokens HF's `TransfoXLTokenizer` never splits by default (its
/// `all_special_tokens`: `eos_token`, `unk_token`, `additional_special_tokens`).
const DEFAULT_NEVER_SPLIT: [&str; 3] = ["<eos>", "<unk>", "<formula>"];

/// HF TransfoXL's `vocab.pkl` (the tokenizer's pickled `__dict__`, or a legacy `torch.save` of
/// it) as memzoo's vocabulary file, read by [`pickle`] without running it.
///
/// What HF's `TransfoXLTokenizer.__init__` takes from the pickle is what this takes:
/// `idx2sym` and `sym2idx` (checked to agree: every word's id is its first position), and
/// `unk_idx` when there. HF's `__init__` sets `lower_case`, `delimiter`, `never_split` and
/// `language` itself, before the pickle is read and overriding it, from the tokenizer's
/// arguments: here from `tokenizer_config.json` beside the pickle when it has them, else
/// HF's defaults (`false`, `None`, `<eos> <unk> <formula>`, `en`).
pub fn transfo_xl_vocab_from_pickle(path: &Path) -> Result<TransfoXlVocabFile, DataError> {
    let value = pickle::read_file(path)?;
    let bad = |message: String| DataError::Vocab {
        path: path.to_path_buf(),
        message,
    };
    if !matches!(value, PyValue::Dict(..)) {
        return Err(bad(format!(
            "holds a {}, not the tokenizer's attribute dict",
            value.type_name()
        )));
    }
    let idx2sym = match value.get("idx2sym") {
        Some(PyValue::List(words)) => words
            .iter()
            .enumerate()
            .map(|(i, w)| match w {
                PyValue::Str(s) => Ok(s.clone()),
                other => Err(bad(format!("idx2sym[{i}] is a {}", other.type_name()))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(bad(format!("idx2sym is a {}", other.type_name()))),
        None => return Err(bad("has no idx2sym".into())),
    };
    // HF looks ids up in sym2idx: it must give each word its first position in idx2sym.
    let mut first = std::collections::HashMap::with_capacity(idx2sym.len());
    for (i, s) in idx2sym.iter().enumerate() {
        first.entry(s.as_str()).or_insert(i);
    }
    match value.get("sym2idx") {
        Some(PyValue::Dict(_, items)) => {
            if items.len() != first.len() {
                return Err(bad(format!(
                    "sym2idx has {} words, idx2sym {} distinct ones",
                    items.len(),
                    first.len()
                )));
            }
            for (k, v) in items {
                let (PyValue::Str(word), PyValue::Int(id)) = (k, v) else {
                    return Err(bad(format!(
                        "sym2idx maps a {} to a {}",
                        k.type_name(),
                        v.type_name()
                    )));
                };
                if first.get(word.as_str()).map(|&i| i as i128) != Some(*id) {
                    return Err(bad(format!(
                        "sym2idx[{word:?}] = {id}, but idx2sym first has it at {:?}",
                        first.get(word.as_str())
                    )));
                }
            }
        }
        Some(other) => return Err(bad(format!("sym2idx is a {}", other.type_name()))),
        None => return Err(bad("has no sym2idx".into())),
    }
    let unk_idx = match value.get("unk_idx") {
        None | Some(PyValue::None) => None,
        Some(PyValue::Int(i)) if *i >= 0 => Some(*i as usize),
        Some(other) => return Err(bad(format!("unk_idx is {other:?}"))),
    };
    let mut file = TransfoXlVocabFile {
        format: FORMAT.into(),
        idx2sym,
        lower_case: false,
        delimiter: None,
        unk_idx,
        never_split: DEFAULT_NEVER_SPLIT.iter().map(|s| s.to_string()).collect(),
        language: "en".into(),
    };
    let config = path.with_file_name("tokenizer_config.json");
    if config.is_file() {
        apply_tokenizer_config(&mut file, &config)?;
    }
    Ok(file)
}

/// The fields of HF's `tokenizer_config.json` that `TransfoXLTokenizer.__init__` takes.
fn apply_tokenizer_config(file: &mut TransfoXlVocabFile, path: &Path) -> Result<(), DataError> {
    let bad = |message: String| DataError::Vocab {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
        action: "cannot read",
        path: path.to_path_buf(),
        source,
    })?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if let Some(v) = config.get("lower_case") {
        file.lower_case = v
            .as_bool()
            .ok_or_else(|| bad(format!("lower_case is {v}")))?;
    }
    if let Some(v) = config.get("delimiter") {
        file.delimiter = match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            _ => return Err(bad(format!("delimiter is {v}"))),
        };
    }
    if let Some(v) = config.get("language") {
        file.language = v
            .as_str()
            .ok_or_else(|| bad(format!("language is {v}")))?
            .into();
    }
    if let Some(v) = config.get("never_split").filter(|v| !v.is_null()) {
        file.never_split = serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

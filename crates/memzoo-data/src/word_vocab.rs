//! TransfoXL's word-level vocabulary and tokenizer (HF's `TransfoXLTokenizer`, transformers
//! 4.x), read from a JSON file (or from HF's `vocab.pkl` by the data-only reader of
//! [`crate::tokenize`], which `memzoo import` converts into this JSON).
//!
//! HF ships `transfo-xl-wt103`'s vocabulary only as `vocab.pkl`, a pickled Python `__dict__`
//! that `pickle.load` runs as code. `xtask/peers/transfo_xl_vocab.py` converts it once, on a
//! machine with internet and transformers 4.x, into the file this module reads:
//!
//! ```json
//! {"format": "memzoo-transfo-xl-vocab", "idx2sym": ["<eos>", "<unk>", ...],
//!  "lower_case": false, "delimiter": null, "unk_idx": 24,
//!  "never_split": ["<eos>", "<unk>", "<formula>"], "language": "en"}
//! ```
//!
//! Tokenising is HF's `tokenize`: split out the special tokens (`never_split`), then per piece
//! trim, lower-case when `lower_case`, and (unless `delimiter` is `""`, which gives
//! characters) the Moses pipeline for English ([`crate::moses`]: punctuation normaliser,
//! tokenizer with aggressive hyphen splits, no XML escapes) and HF's number splitting
//! (`23,000` → `23 @,@ 000`, `1.80` → `1 @.@ 80`). A word outside the vocabulary is `unk_idx`
//! (else `<unk>`'s id). Decoding is HF's `decode`: the Moses detokenizer, numbers joined back,
//! trimmed, then HF's `clean_up_tokenization` (no space before `.`, `?`, `!`, `,`, `'s`, ...).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::moses;

/// The `format` field of a vocabulary file.
pub const FORMAT: &str = "memzoo-transfo-xl-vocab";

/// The vocabulary file's fields (HF's `TransfoXLTokenizer` attributes of the same names).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransfoXlVocabFile {
    /// Must be [`FORMAT`].
    pub format: String,
    /// The words by id.
    pub idx2sym: Vec<String>,
    /// Lower-case the text before tokenising.
    #[serde(default)]
    pub lower_case: bool,
    /// `""`: split into characters; anything else (HF ignores its value): the Moses pipeline.
    #[serde(default)]
    pub delimiter: Option<String>,
    /// Id of unknown words; `None`: the id of `<unk>` (or `<UNK>`).
    #[serde(default)]
    pub unk_idx: Option<usize>,
    /// Special tokens, never split (HF's `all_special_tokens`).
    #[serde(default)]
    pub never_split: Vec<String>,
    /// Moses language: only `en` is supported.
    #[serde(default = "TransfoXlVocabFile::en")]
    pub language: String,
}

impl TransfoXlVocabFile {
    fn en() -> String {
        "en".into()
    }
}

/// A TransfoXL word vocabulary: tokenise, encode and decode as HF's `TransfoXLTokenizer`.
#[derive(Debug, Clone)]
pub struct TransfoXlVocab {
    file: TransfoXlVocabFile,
    sym2idx: HashMap<String, usize>,
    unk: Option<usize>,
}

impl TransfoXlVocab {
    /// Reads and checks a vocabulary file.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        })?;
        let file: TransfoXlVocabFile =
            serde_json::from_str(&text).map_err(|e| DataError::Vocab {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        Self::new(file, path.to_path_buf())
    }

    /// A vocabulary from its fields; `path` names it in errors.
    pub fn new(file: TransfoXlVocabFile, path: PathBuf) -> Result<Self, DataError> {
        let bad = |message: String| DataError::Vocab {
            path: path.clone(),
            message,
        };
        if file.format != FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {FORMAT:?} (convert HF's vocab.pkl with \
                 xtask/peers/transfo_xl_vocab.py)",
                file.format
            )));
        }
        if file.language != "en" {
            return Err(bad(format!(
                "language = {:?}: only the English Moses rules are implemented",
                file.language
            )));
        }
        if file.idx2sym.is_empty() {
            return Err(bad("idx2sym is empty".into()));
        }
        // HF's sym2idx: the first id of a word listed twice (`add_symbol` skips repeats).
        let mut sym2idx = HashMap::with_capacity(file.idx2sym.len());
        for (i, s) in file.idx2sym.iter().enumerate() {
            sym2idx.entry(s.clone()).or_insert(i);
        }
        let unk = match file.unk_idx {
            Some(u) if u >= file.idx2sym.len() => {
                return Err(bad(format!(
                    "unk_idx = {u} is outside the vocabulary of {}",
                    file.idx2sym.len()
                )));
            }
            Some(u) => Some(u),
            None => sym2idx
                .get("<unk>")
                .or_else(|| sym2idx.get("<UNK>"))
                .copied(),
        };
        Ok(Self { file, sym2idx, unk })
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.file.idx2sym.len()
    }

    /// Whether the vocabulary is empty (never, once read).
    pub fn is_empty(&self) -> bool {
        self.file.idx2sym.is_empty()
    }

    /// The file's fields.
    pub fn file(&self) -> &TransfoXlVocabFile {
        &self.file
    }

    /// The words of `text`, as HF's `tokenize`.
    pub fn tokenize(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (piece, special) in split_special(text, &self.file.never_split) {
            if special {
                out.push(piece.to_string());
                continue;
            }
            let mut line = piece.trim().to_string();
            if self.file.lower_case {
                line = line.to_lowercase();
            }
            if self.file.delimiter.as_deref() == Some("") {
                out.extend(line.chars().map(String::from));
            } else {
                let normalized = moses::normalize_punctuation(&line);
                let words = moses::tokenize(&normalized, &self.file.never_split);
                out.extend(words.iter().flat_map(|w| tokenize_numbers(w)));
            }
        }
        out
    }

    /// The id of `word` (unknown words: the unknown id).
    pub fn id(&self, word: &str) -> Result<usize, DataError> {
        match self.sym2idx.get(word).copied().or(self.unk) {
            Some(i) => Ok(i),
            None => Err(DataError::InvalidValue {
                name: "word".into(),
                value: format!("{word:?}"),
                reason: "not in the vocabulary, which has no <unk> for it".into(),
            }),
        }
    }

    /// The ids of `text` ([`tokenize`](Self::tokenize), then [`id`](Self::id)).
    pub fn encode(&self, text: &str) -> Result<Vec<usize>, DataError> {
        self.tokenize(text).iter().map(|w| self.id(w)).collect()
    }

    /// The text of `ids`, as HF's `decode` (Moses detokenizer, numbers joined, HF's clean-up).
    pub fn decode(&self, ids: &[usize]) -> Result<String, DataError> {
        let words = ids
            .iter()
            .map(|&i| {
                self.file
                    .idx2sym
                    .get(i)
                    .cloned()
                    .ok_or(DataError::TokenOutOfRange {
                        id: i as u32,
                        vocab_size: self.len(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(clean_up_tokenization(&self.words_to_string(&words)))
    }

    /// HF's `convert_tokens_to_string`: the Moses detokenizer, then `@,@` / `@.@` joined.
    pub fn words_to_string(&self, words: &[String]) -> String {
        let text = moses::detokenize(words);
        text.replace(" @,@ ", ",")
            .replace(" @.@ ", ".")
            .trim()
            .to_string()
    }
}

/// `text` cut at every occurrence of a special token (longest first at each position, as
/// HF's trie): `(piece, is_special)`, empty pieces left out.
fn split_special<'a>(text: &'a str, special: &[String]) -> Vec<(&'a str, bool)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let hit = special
            .iter()
            .filter(|s| !s.is_empty() && rest.starts_with(s.as_str()))
            .max_by_key(|s| s.len());
        match hit {
            Some(s) => {
                if start < i {
                    out.push((&text[start..i], false));
                }
                out.push((&text[i..i + s.len()], true));
                i += s.len();
                start = i;
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    if start < text.len() {
        out.push((&text[start..], false));
    }
    out
}

/// HF's `tokenize_numbers` of one word: `,` and `.` between two digits become their own
/// `@,@` / `@.@` tokens (`re.sub(r"(?<=\d)[,.](?=\d)", r" @\g<0>@ ", w).split()`).
fn tokenize_numbers(word: &str) -> Vec<String> {
    let chars: Vec<char> = word.chars().collect();
    let mut out = String::with_capacity(word.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        // Python's `\d`: a Unicode decimal digit (`\p{Nd}`).
        let between_digits = i > 0
            && moses::is_nd(chars[i - 1])
            && chars.get(i + 1).is_some_and(|&n| moses::is_nd(n));
        if (c == ',' || c == '.') && between_digits {
            out.push_str(&format!(" @{c}@ "));
        } else {
            out.push(c);
        }
    }
    out.split_whitespace().map(String::from).collect()
}

/// HF's `clean_up_tokenization` (on by default in `decode`).
pub fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

/// The file name of a run's word vocabulary (a [`TransfoXlVocab`] file): `memzoo import`
/// copies it from the checkpoint directory into the run directory, and `memzoo generate` reads
/// and writes words with it.
pub const WORD_VOCAB_FILE: &str = "vocab.json";

/// How text becomes token ids and back: bytes (memzoo's default), a TransfoXL word
/// vocabulary, or a SentencePiece model.
#[derive(Debug, Clone)]
pub enum TextCodec {
    /// One token per byte ([`crate::ByteTokenizer`]).
    Bytes(crate::ByteTokenizer),
    /// TransfoXL's words.
    Words(TransfoXlVocab),
    /// SentencePiece pieces (`spiece.model`).
    Pieces(crate::tokenize::sentencepiece::SentencePiece),
}

impl TextCodec {
    /// The word vocabulary `dir/vocab.json` when there is one, else the SentencePiece model
    /// `dir/spiece.model` when there is one, else bytes.
    pub fn for_dir(dir: &Path) -> Result<Self, DataError> {
        Self::for_dir_with_offset(dir, 0)
    }

    /// [`TextCodec::for_dir`] with bytes at ids `byte_offset + b`
    /// ([`crate::ByteTokenizer::with_offset`]; a run's `data.byte_offset`).
    pub fn for_dir_with_offset(dir: &Path, byte_offset: crate::Token) -> Result<Self, DataError> {
        let path = dir.join(WORD_VOCAB_FILE);
        let pieces = crate::tokenize::sentencepiece::model_path(dir);
        if path.is_file() {
            Ok(TextCodec::Words(TransfoXlVocab::read(&path)?))
        } else if pieces.is_file() {
            Ok(TextCodec::Pieces(
                crate::tokenize::sentencepiece::SentencePiece::read(&pieces)?,
            ))
        } else {
            Ok(TextCodec::Bytes(
                crate::ByteTokenizer::new().with_offset(byte_offset)?,
            ))
        }
    }

    /// Number of ids the codec writes: the byte tokenizer's (with its offset) or the words'.
    pub fn vocab_size(&self) -> usize {
        match self {
            TextCodec::Bytes(t) => t.vocab_size(),
            TextCodec::Words(v) => v.len(),
            TextCodec::Pieces(p) => p.len(),
        }
    }

    /// The ids of a text (a corpus, a prompt), as the codec writes them.
    pub fn encode_text(&self, text: &str) -> Result<Vec<i64>, DataError> {
        Ok(match self {
            TextCodec::Bytes(t) => t
                .encode(text.as_bytes())
                .iter()
                .map(|&t| t as i64)
                .collect(),
            TextCodec::Words(v) => v.encode(text)?.iter().map(|&t| t as i64).collect(),
            TextCodec::Pieces(p) => p.encode(text).iter().map(|&t| t as i64).collect(),
        })
    }

    /// The ids of a corpus (training or evaluation text): as [`encode_text`](Self::encode_text),
    /// except that words are read line by line with `<eos>` after each line, as HF's
    /// TransfoXL corpora are (`encode_file(..., add_eos=True)`).
    pub fn encode_corpus(&self, text: &str) -> Result<Vec<i64>, DataError> {
        let TextCodec::Words(v) = self else {
            return self.encode_text(text);
        };
        let eos = v.sym2idx.get("<eos>").copied();
        let mut ids = Vec::with_capacity(text.len() / 4);
        for line in text.lines() {
            ids.extend(v.encode(line)?.iter().map(|&t| t as i64));
            ids.extend(eos.map(|e| e as i64));
        }
        Ok(ids)
    }

    /// The ids of a prompt; an empty one starts from a newline byte (bytes) or `<eos>`, else
    /// id 0 (words: TransfoXL separates lines with `<eos>`).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<i64>, DataError> {
        let mut ids = self.encode_text(text)?;
        if ids.is_empty() {
            ids.push(match self {
                TextCodec::Bytes(t) => t.byte_id(b'\n') as i64,
                TextCodec::Words(v) => v.sym2idx.get("<eos>").copied().unwrap_or(0) as i64,
                // A word boundary.
                TextCodec::Pieces(p) => p
                    .piece_id(&crate::tokenize::sentencepiece::SPACE.to_string())
                    .unwrap_or(p.unk_id()) as i64,
            });
        }
        Ok(ids)
    }

    /// The text of generated ids, to print after the prompt: the bytes (invalid UTF-8
    /// replaced), or the detokenised words after a space.
    pub fn decode_continuation(&self, ids: &[i64]) -> Result<String, DataError> {
        let out_of_range = |id: i64, vocab_size: usize| DataError::TokenOutOfRange {
            id: id.clamp(0, u32::MAX as i64) as u32,
            vocab_size,
        };
        match self {
            TextCodec::Bytes(t) => {
                let tokens = ids
                    .iter()
                    .map(|&i| {
                        crate::Token::try_from(i).map_err(|_| out_of_range(i, t.vocab_size()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                t.decode_lossy(&tokens)
            }
            TextCodec::Words(v) => {
                let ids = ids
                    .iter()
                    .map(|&i| usize::try_from(i).map_err(|_| out_of_range(i, v.len())))
                    .collect::<Result<Vec<_>, _>>()?;
                let text = v.decode(&ids)?;
                Ok(if text.is_empty() {
                    text
                } else {
                    format!(" {text}")
                })
            }
            TextCodec::Pieces(p) => {
                let ids = ids
                    .iter()
                    .map(|&i| u32::try_from(i).map_err(|_| out_of_range(i, p.len())))
                    .collect::<Result<Vec<_>, _>>()?;
                p.decode_continuation(&ids)
            }
        }
    }
}

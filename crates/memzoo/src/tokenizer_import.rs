//! The tokenizer a checkpoint directory ships, carried into an imported run: a TransfoXL word
//! vocabulary (`vocab.json`, or HF's pickled `vocab.pkl` read by memzoo-data's data-only
//! reader, never run, and written as `vocab.json`), or a SentencePiece model (`spiece.model`).
//! `memzoo generate` then reads and writes text with it ([`memzoo_data::TextCodec::for_dir`]).

use std::path::{Path, PathBuf};

use memzoo_data::tokenize::sentencepiece::{SPIECE_MODEL_FILE, SentencePiece};
use memzoo_data::tokenize::{TRANSFO_XL_PICKLE, transfo_xl_vocab_from_pickle};
use memzoo_data::{TextCodec, TransfoXlVocab, WORD_VOCAB_FILE};

use crate::error::CliError;

/// A checkpoint's tokenizer, read and checked against the model's vocabulary.
#[derive(Debug)]
pub enum CheckpointTokenizer {
    /// `vocab.json`, copied as it is.
    WordsJson(PathBuf),
    /// `vocab.pkl`, read into the fields `vocab.json` holds.
    WordsPickle(PathBuf, memzoo_data::word_vocab::TransfoXlVocabFile),
    /// `spiece.model`, copied as it is.
    Pieces(PathBuf),
}

/// The tokenizer in `src` (a checkpoint directory), if any: `vocab.json` first, else
/// `vocab.pkl`, else `spiece.model`. Its size must be the model's `vocab_size`; otherwise an
/// error names both.
pub fn checkpoint_tokenizer(
    src: &Path,
    vocab_size: usize,
) -> Result<Option<CheckpointTokenizer>, CliError> {
    let mismatch = |path: &Path, n: usize, what: &str| {
        CliError::Config(format!(
            "{} has {n} {what}, the model a vocabulary of {vocab_size}",
            path.display()
        ))
    };
    let json = src.join(WORD_VOCAB_FILE);
    if json.is_file() {
        let words = TransfoXlVocab::read(&json)?;
        if words.len() != vocab_size {
            return Err(mismatch(&json, words.len(), "words"));
        }
        return Ok(Some(CheckpointTokenizer::WordsJson(json)));
    }
    let pickle = src.join(TRANSFO_XL_PICKLE);
    if pickle.is_file() {
        let file = transfo_xl_vocab_from_pickle(&pickle)?;
        let words = TransfoXlVocab::new(file.clone(), pickle.clone())?;
        if words.len() != vocab_size {
            return Err(mismatch(&pickle, words.len(), "words"));
        }
        return Ok(Some(CheckpointTokenizer::WordsPickle(pickle, file)));
    }
    let pieces = src.join(SPIECE_MODEL_FILE);
    if pieces.is_file() {
        let sp = SentencePiece::read(&pieces)?;
        if sp.len() != vocab_size {
            return Err(mismatch(&pieces, sp.len(), "pieces"));
        }
        return Ok(Some(CheckpointTokenizer::Pieces(pieces)));
    }
    Ok(None)
}

impl CheckpointTokenizer {
    /// What the run reads text with, for messages: `words (vocab.pkl)` and the like.
    pub fn describe(&self) -> &'static str {
        match self {
            CheckpointTokenizer::WordsJson(_) => "words (vocab.json)",
            CheckpointTokenizer::WordsPickle(..) => "words (vocab.pkl, written as vocab.json)",
            CheckpointTokenizer::Pieces(_) => "SentencePiece (spiece.model)",
        }
    }

    /// The codec that reads and writes text with this tokenizer.
    pub fn codec(&self) -> Result<TextCodec, CliError> {
        Ok(match self {
            CheckpointTokenizer::WordsJson(p) => TextCodec::Words(TransfoXlVocab::read(p)?),
            CheckpointTokenizer::WordsPickle(p, file) => {
                TextCodec::Words(TransfoXlVocab::new(file.clone(), p.clone())?)
            }
            CheckpointTokenizer::Pieces(p) => TextCodec::Pieces(SentencePiece::read(p)?),
        })
    }

    /// Writes the tokenizer into the run directory (`vocab.json` or `spiece.model`).
    pub fn write(&self, run_dir: &Path) -> Result<(), CliError> {
        let copy = |from: &Path, name: &str| {
            std::fs::copy(from, run_dir.join(name))
                .map(|_| ())
                .map_err(|e| CliError::io(format!("cannot copy {}", from.display()), e))
        };
        match self {
            CheckpointTokenizer::WordsJson(p) => copy(p, WORD_VOCAB_FILE),
            CheckpointTokenizer::Pieces(p) => copy(p, SPIECE_MODEL_FILE),
            CheckpointTokenizer::WordsPickle(p, file) => {
                let out = run_dir.join(WORD_VOCAB_FILE);
                let text = serde_json::to_string(file).map_err(|e| {
                    CliError::Config(format!("cannot write {} as JSON: {e}", p.display()))
                })?;
                std::fs::write(&out, text)
                    .map_err(|e| CliError::io(format!("cannot write {}", out.display()), e))
            }
        }
    }
}

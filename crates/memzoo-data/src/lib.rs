//! Data for memzoo: byte-level tokenizer, corpus readers and splits, the ordered batches
//! that segment-level recurrence needs, data set manifests and their download, a generated
//! long-range corpus, generated tasks ([`tasks`]: duplication, recall, copied text), a corpus
//! of real Rust code from cargo's registry sources ([`rust_code`]), and corpus statistics.
//!
//! This crate does not depend on Burn: it works on plain token vectors. A [`Batch`] holds
//! `inputs` / `targets` as row-major `[batch, len]` `Vec<i64>`, ready for
//! `Tensor::from_data(TensorData::new(batch.inputs, [batch.batch, batch.len]), &device)`.
//!
//! A typical training pipeline:
//!
//! ```
//! use memzoo_data::{generate_corpus, ByteTokenizer, LongRangeConfig, OrderedBatcher};
//!
//! let cfg = LongRangeConfig { documents: 20, valid_documents: 2, test_documents: 2, ..Default::default() };
//! let corpus = generate_corpus(&cfg)?;
//! let tok = ByteTokenizer::new();
//! let mut batches = OrderedBatcher::named("train", tok.encode(&corpus.train), 4, 64)?;
//! let first = batches.next_batch().unwrap();
//! assert_eq!(first.shape(), [4, 64]);
//! // the next step of every row starts where this one stopped
//! let second = batches.next_batch().unwrap();
//! assert_eq!(second.inputs[0], first.targets[63]);
//! # Ok::<(), memzoo_data::DataError>(())
//! ```

#![warn(missing_docs)]

pub mod batcher;
pub mod corpus;
pub mod error;
pub mod fetch;
pub mod manifest;
pub mod moses;
pub mod rust_code;
pub mod stats;
pub mod synthetic;
pub mod tasks;
pub mod tokenize;
pub mod tokenizer;
pub mod word_vocab;

pub use batcher::{Batch, BatcherState, DocBatcher, OrderedBatcher};
pub use corpus::{
    Corpus, FileKind, Split, SplitRanges, SplitRule, file_kind, machine_memory, max_data_bytes,
    read_bytes, read_bytes_bounded, read_text_bounded, regular_file, zip_members,
};
pub use error::DataError;
pub use fetch::{
    FetchOptions, FetchOutcome, fetch, fetch_from, fetch_with, part_path, sha256_file, verify,
};
pub use manifest::{Check, Manifest};
pub use rust_code::{
    CodeDocument, CrateEntry, PreparedSummary, RustCodeManifest, SplitSummary, build, load_split,
    prepare, registry_src_dirs,
};
pub use stats::{CorpusStats, byte_stats, stats};
pub use synthetic::{
    LongRangeConfig, LongRangeDocument, PassageKind, generate, generate_corpus, generate_split,
    join_documents, join_with_mask, recallable_mask,
};
pub use tasks::copy_text::{CopyTask, CopyText, copy_text};
pub use tasks::duplication::Duplication;
pub use tasks::recall::{RecallStream, RecallTask};
pub use tasks::{Task, TaskPosition, TaskStream};
pub use tokenizer::{BOS, BYTE_VOCAB, ByteTokenizer, EOS, PAD, Token};
pub use word_vocab::{TextCodec, TransfoXlVocab, WORD_VOCAB_FILE};

#[cfg(test)]
mod tests;

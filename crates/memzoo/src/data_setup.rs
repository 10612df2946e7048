//! Turning a `[data]` section into token streams and ordered batchers.

use std::path::{Path, PathBuf};

use memzoo_data::{
    ByteTokenizer, Corpus, Manifest, OrderedBatcher, Split, SplitRule, TextCodec, Token, rust_code,
};

use crate::config::DataConfig;
use crate::error::CliError;

/// The three splits as token streams, with a name for messages.
pub struct Splits {
    /// What the data is (file, data set or generated corpus).
    pub name: String,
    /// Training tokens.
    pub train: Vec<Token>,
    /// Validation tokens.
    pub valid: Vec<Token>,
    /// Test tokens.
    pub test: Vec<Token>,
    /// The byte tokenizer of the data (bytes at `data.byte_offset`).
    pub tokenizer: ByteTokenizer,
    /// The run's own tokenizer (words or SentencePiece) when it made the tokens instead
    /// ([`load_splits_with`]); `None`: bytes.
    pub codec: Option<TextCodec>,
}

impl Splits {
    /// The tokens of one split.
    pub fn get(&self, split: Split) -> &[Token] {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
        }
    }
}

/// Loads the corpus a `[data]` section names and tokenises it (bytes).
pub fn load_corpus(cfg: &DataConfig) -> Result<(String, Corpus), CliError> {
    match cfg.source.as_deref() {
        None | Some("") | Some("generated") => {
            let corpus = memzoo_data::generate_corpus(&cfg.generated)?;
            Ok((
                format!("generated long-range corpus (seed {})", cfg.generated.seed),
                corpus,
            ))
        }
        Some(rust_code::NAME) => {
            let dir = rust_code_dir(cfg);
            let join = |split| -> Result<Vec<u8>, CliError> {
                let docs = rust_code::load_split(&dir, split)?;
                Ok(docs.into_iter().flat_map(|d| d.text).collect())
            };
            let corpus = Corpus {
                train: join(Split::Train)?,
                valid: join(Split::Valid)?,
                test: join(Split::Test)?,
            };
            Ok((
                format!("data set {} ({})", rust_code::NAME, dir.display()),
                corpus,
            ))
        }
        Some(name) if Manifest::known().contains(&name) => {
            let manifest = Manifest::load(name)?;
            let path = manifest.local_path(Path::new(&cfg.data_dir));
            if !path.exists() {
                return Err(CliError::NotDownloaded {
                    name: name.to_string(),
                    path,
                });
            }
            let corpus = manifest.load_corpus(Path::new(&cfg.data_dir))?;
            Ok((format!("data set {name}"), corpus))
        }
        Some(path) => {
            let rule = SplitRule::Fractions {
                valid: cfg.valid_fraction,
                test: cfg.test_fraction,
            };
            let corpus = Corpus::load(Path::new(path), cfg.member.as_deref(), &rule)?;
            Ok((path.to_string(), corpus))
        }
    }
}

/// Where `memzoo data prepare rust-code` writes the prepared corpus: `data_dir/rust-code/`.
pub fn rust_code_dir(cfg: &DataConfig) -> PathBuf {
    Path::new(&cfg.data_dir).join(rust_code::NAME)
}

/// The byte tokenizer of a `[data]` section: byte `b` is id `data.byte_offset + b`.
pub fn tokenizer(cfg: &DataConfig) -> Result<ByteTokenizer, CliError> {
    Ok(ByteTokenizer::new().with_offset(cfg.byte_offset)?)
}

/// Loads and tokenises the three splits ([`tokenizer`]).
pub fn load_splits(cfg: &DataConfig) -> Result<Splits, CliError> {
    let (name, corpus) = load_corpus(cfg)?;
    let tok = tokenizer(cfg)?;
    Ok(Splits {
        name,
        train: tok.encode(&corpus.train),
        valid: tok.encode(&corpus.valid),
        test: tok.encode(&corpus.test),
        tokenizer: tok,
        codec: None,
    })
}

/// The tokenizer a run directory holds ([`TextCodec::for_dir_with_offset`]: `vocab.json`
/// words or a `spiece.model`, which `memzoo import` puts there, or which a user puts in a new
/// run directory before `memzoo train`); `None` for bytes.
pub fn run_codec(cfg: &DataConfig, run_dir: &Path) -> Result<Option<TextCodec>, CliError> {
    match TextCodec::for_dir_with_offset(run_dir, cfg.byte_offset)? {
        TextCodec::Bytes(_) => Ok(None),
        codec => Ok(Some(codec)),
    }
}

/// [`load_splits`], the text tokenised by `codec` when there is one
/// ([`TextCodec::encode_corpus`]; the bytes read as UTF-8, invalid sequences replaced). Data
/// made of documents is then read as one stream. A codec with more ids than memzoo's data
/// pipeline holds ([`Token`]: 16 bits) is refused, naming its size.
pub fn load_splits_with(cfg: &DataConfig, codec: Option<TextCodec>) -> Result<Splits, CliError> {
    let Some(codec) = codec else {
        return load_splits(cfg);
    };
    check_codec_fits(&codec)?;
    let (name, corpus) = load_corpus(cfg)?;
    let encode = |bytes: &[u8]| -> Result<Vec<Token>, CliError> {
        let ids = codec.encode_corpus(&String::from_utf8_lossy(bytes))?;
        // Fits: every id is below the codec's size, checked above.
        Ok(ids.into_iter().map(|i| i as Token).collect())
    };
    Ok(Splits {
        name: format!("{name}, {}", codec_name(&codec)),
        train: encode(&corpus.train)?,
        valid: encode(&corpus.valid)?,
        test: encode(&corpus.test)?,
        tokenizer: tokenizer(cfg)?,
        codec: Some(codec),
    })
}

/// Refuses a codec whose ids do not fit a [`Token`].
pub fn check_codec_fits(codec: &TextCodec) -> Result<(), CliError> {
    let most = Token::MAX as usize + 1;
    if codec.vocab_size() > most {
        return Err(CliError::Config(format!(
            "the run's tokenizer ({}) has {} ids, more than the {most} memzoo's data pipeline \
             holds (16-bit token ids): train and eval cannot read text with it yet; generate can",
            codec_name(codec),
            codec.vocab_size()
        )));
    }
    Ok(())
}

/// The codec, for messages.
fn codec_name(codec: &TextCodec) -> &'static str {
    match codec {
        TextCodec::Bytes(_) => "bytes",
        TextCodec::Words(_) => "words of vocab.json",
        TextCodec::Pieces(_) => "pieces of spiece.model",
    }
}

/// An ordered batcher over one split (full-length segments only).
///
/// Evaluation splits of text in the long-range format carry its recallable positions as the
/// target mask, so evaluation also reports the loss on exactly those positions.
pub fn batcher(
    splits: &Splits,
    split: Split,
    batch: usize,
    len: usize,
) -> Result<OrderedBatcher, CliError> {
    let label = format!("the {} split of {}", split.as_str(), splits.name);
    let tokens = splits.get(split).to_vec();
    // Recallable positions are a property of bytes: none for a run's own tokenizer.
    let mask = (split != Split::Train && splits.codec.is_none()).then(|| {
        // Back to the bytes (reserved ids, below the offset, as byte 0: never recallable).
        let tok = &splits.tokenizer;
        let bytes: Vec<u8> = tokens
            .iter()
            .map(|&t| tok.id_byte(t).unwrap_or(0))
            .collect();
        memzoo_data::recallable_mask(&bytes)
    });
    let b = OrderedBatcher::named(&label, tokens, batch, len)?;
    let b = match mask {
        Some(m) if m.iter().any(|&x| x) => b.with_target_mask(m)?,
        _ => b,
    };
    Ok(b.drop_last(true))
}

/// The bytes of each document of a split when the data has documents
/// ([`DataConfig::has_documents`]): the crates of the prepared `rust-code` corpus, or the
/// generated corpus's documents. `None` for a plain file or data set (one stream).
pub fn document_texts(cfg: &DataConfig, split: Split) -> Result<Option<Vec<Vec<u8>>>, CliError> {
    if !cfg.has_documents() {
        return Ok(None);
    }
    Ok(Some(if cfg.source.as_deref() == Some(rust_code::NAME) {
        rust_code::load_split(&rust_code_dir(cfg), split)?
            .into_iter()
            .map(|d| d.text)
            .collect()
    } else {
        memzoo_data::generate_split(&cfg.generated, split)?
            .into_iter()
            .map(|d| d.text)
            .collect()
    }))
}

/// Documents laid out per row (each starting at a segment boundary, `reset` where a new one
/// starts, padding ignored by the loss) when the data has documents
/// ([`DataConfig::has_documents`]): the generated corpus, or the prepared `rust-code` corpus
/// (one document per crate). `None` for a plain file or data set, which is read as one stream.
///
/// Byte 0 occurs in neither (the rust-code builder skips files holding it): its id pads.
/// Evaluation splits of the generated corpus carry each document's recallable positions as
/// the target mask, as [`batcher`] does for the stream.
pub fn doc_batcher(
    cfg: &DataConfig,
    split: Split,
    batch: usize,
    len: usize,
) -> Result<Option<memzoo_data::DocBatcher>, CliError> {
    let Some(texts) = document_texts(cfg, split)? else {
        return Ok(None);
    };
    let tok = tokenizer(cfg)?;
    let docs: Vec<Vec<Token>> = texts.iter().map(|t| tok.encode(t)).collect();
    if cfg.source.as_deref() == Some(rust_code::NAME) {
        let label = format!("the {split} split of {}", rust_code::NAME);
        let b = memzoo_data::DocBatcher::named(&label, &docs, batch, len, tok.byte_id(0))?;
        return Ok(Some(b));
    }
    // Byte 0 never occurs in the generated text: its id pads, and its targets are ignored.
    let b = memzoo_data::DocBatcher::new(&docs, batch, len, tok.byte_id(0))?;
    if split == Split::Train {
        return Ok(Some(b));
    }
    let masks: Vec<Vec<bool>> = texts
        .iter()
        .map(|t| memzoo_data::recallable_mask(t))
        .collect();
    Ok(Some(b.with_target_masks(&masks)?))
}

//! Byte-level tokenizer: one token per byte (ids `0..256`) plus named special tokens
//! (ids `256..`), optionally shifted by a byte offset: with offset `k`, byte `b` is id `b + k`
//! and ids `0..k` are reserved (tensor2tensor's `ByteTextEncoder` with `k` reserved ids, as
//! trax's enwik8 models and HF's `google/reformer-enwik8` read text: `k = 2`, PAD 0, EOS 1).

use serde::{Deserialize, Serialize};

use crate::DataError;

/// A token id. Bytes are `0..256`; special tokens follow from 256 on.
pub type Token = u16;

/// Number of byte tokens (ids `0..256`).
pub const BYTE_VOCAB: usize = 256;

/// Conventional name of the begin-of-document token.
pub const BOS: &str = "BOS";
/// Conventional name of the end-of-document token.
pub const EOS: &str = "EOS";
/// Conventional name of the padding token (its targets are ignored by the loss).
pub const PAD: &str = "PAD";

/// Byte-level tokenizer with optional named special tokens and byte offset.
///
/// Byte `b` is token `offset + b`; the `i`-th special token is `offset + 256 + i`, in the
/// order given to [`ByteTokenizer::with_specials`]. The vocabulary size is
/// `offset + 256 + specials`. Ids below the offset are reserved: they decode to nothing.
/// The offset is 0 unless set with [`ByteTokenizer::with_offset`].
///
/// ```
/// use memzoo_data::{ByteTokenizer, BOS, EOS};
/// let tok = ByteTokenizer::with_specials([BOS, EOS]).unwrap();
/// assert_eq!(tok.vocab_size(), 258);
/// assert_eq!(tok.special(EOS), Some(257));
/// assert_eq!(tok.encode(b"hi"), vec![104, 105]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteTokenizer {
    specials: Vec<String>,
    /// Id of byte 0 (ids below it are reserved). Default 0.
    #[serde(default)]
    offset: Token,
}

impl ByteTokenizer {
    /// A tokenizer with the 256 byte tokens only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tokenizer with the 256 byte tokens and the given special tokens, ids `256, 257, ...`
    /// in order.
    ///
    /// Errors on an empty name, a duplicate name or more than `65536 - 256` names.
    pub fn with_specials<I, S>(names: I) -> Result<Self, DataError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut specials: Vec<String> = Vec::new();
        for name in names {
            let name = name.as_ref();
            if name.is_empty() {
                return Err(DataError::invalid(
                    "special token name",
                    "\"\"",
                    "must not be empty",
                ));
            }
            if specials.iter().any(|s| s == name) {
                return Err(DataError::invalid(
                    "special token name",
                    name,
                    "given twice",
                ));
            }
            specials.push(name.to_string());
        }
        if specials.len() > Token::MAX as usize + 1 - BYTE_VOCAB {
            return Err(DataError::invalid(
                "number of special tokens",
                specials.len(),
                format!(
                    "at most {} fit in a u16 vocabulary",
                    Token::MAX as usize + 1 - BYTE_VOCAB
                ),
            ));
        }
        Ok(Self {
            specials,
            offset: 0,
        })
    }

    /// The same tokenizer with byte `b` at id `offset + b` (and the specials after the bytes);
    /// ids `0..offset` are reserved.
    ///
    /// ```
    /// use memzoo_data::ByteTokenizer;
    /// // google/reformer-enwik8: `list(s.encode("utf-8")) + 2`, ids 0 and 1 reserved.
    /// let tok = ByteTokenizer::new().with_offset(2).unwrap();
    /// assert_eq!(tok.encode(b"hi"), vec![106, 107]);
    /// assert_eq!(tok.vocab_size(), 258);
    /// ```
    ///
    /// Errors when the ids would not fit in a [`Token`].
    pub fn with_offset(self, offset: Token) -> Result<Self, DataError> {
        if offset as usize + BYTE_VOCAB + self.specials.len() > Token::MAX as usize + 1 {
            return Err(DataError::invalid(
                "byte offset",
                offset,
                format!(
                    "{offset} + 256 bytes + {} special tokens do not fit in a u16 vocabulary",
                    self.specials.len()
                ),
            ));
        }
        Ok(Self { offset, ..self })
    }

    /// Id of byte 0 (ids below it are reserved).
    pub fn offset(&self) -> Token {
        self.offset
    }

    /// `offset + 256 + ` the number of special tokens.
    pub fn vocab_size(&self) -> usize {
        self.offset as usize + BYTE_VOCAB + self.specials.len()
    }

    /// Names of the special tokens, in id order (the first has id 256).
    pub fn specials(&self) -> &[String] {
        &self.specials
    }

    /// Id of the special token `name`, if the tokenizer has it.
    pub fn special(&self, name: &str) -> Option<Token> {
        self.specials
            .iter()
            .position(|s| s == name)
            .map(|i| (self.offset as usize + BYTE_VOCAB + i) as Token)
    }

    /// Id of the special token `name`, or an error that lists the known ones.
    pub fn special_id(&self, name: &str) -> Result<Token, DataError> {
        self.special(name).ok_or_else(|| DataError::UnknownSpecial {
            name: name.to_string(),
            known: self.specials.clone(),
        })
    }

    /// Name of special token `id`; `None` for byte tokens and ids outside the vocabulary.
    pub fn special_name(&self, id: Token) -> Option<&str> {
        (id as usize)
            .checked_sub(self.offset as usize + BYTE_VOCAB)
            .and_then(|i| self.specials.get(i))
            .map(String::as_str)
    }

    /// Whether `id` is one of the special tokens.
    pub fn is_special(&self, id: Token) -> bool {
        self.special_name(id).is_some()
    }

    /// Id of byte `b`: `offset + b`.
    pub fn byte_id(&self, b: u8) -> Token {
        self.offset + b as Token
    }

    /// The byte of id `id` when it is a byte token (`offset <= id < offset + 256`).
    pub fn id_byte(&self, id: Token) -> Option<u8> {
        id.checked_sub(self.offset)
            .and_then(|b| u8::try_from(b).ok())
    }

    /// One token per byte.
    pub fn encode(&self, bytes: &[u8]) -> Vec<Token> {
        bytes.iter().map(|&b| self.byte_id(b)).collect()
    }

    /// `[bos] bytes [eos]`: a document with optional boundary tokens.
    pub fn encode_document(
        &self,
        bytes: &[u8],
        bos: Option<Token>,
        eos: Option<Token>,
    ) -> Vec<Token> {
        let mut out = Vec::with_capacity(bytes.len() + 2);
        out.extend(bos);
        out.extend(bytes.iter().map(|&b| self.byte_id(b)));
        out.extend(eos);
        out
    }

    /// The bytes of `tokens`; special tokens are written as `<NAME>`, reserved ids (below the
    /// offset) as nothing (HF's model card of `google/reformer-enwik8` decodes them so).
    ///
    /// Errors on an id outside the vocabulary.
    pub fn decode(&self, tokens: &[Token]) -> Result<Vec<u8>, DataError> {
        self.decode_impl(tokens, true)
    }

    /// The bytes of `tokens` with special tokens left out.
    ///
    /// Errors on an id outside the vocabulary.
    pub fn decode_skip_specials(&self, tokens: &[Token]) -> Result<Vec<u8>, DataError> {
        self.decode_impl(tokens, false)
    }

    /// [`ByteTokenizer::decode`] as text, invalid UTF-8 replaced by U+FFFD.
    pub fn decode_lossy(&self, tokens: &[Token]) -> Result<String, DataError> {
        Ok(String::from_utf8_lossy(&self.decode(tokens)?).into_owned())
    }

    fn decode_impl(&self, tokens: &[Token], show_specials: bool) -> Result<Vec<u8>, DataError> {
        let mut out = Vec::with_capacity(tokens.len());
        for &t in tokens {
            if let Some(b) = self.id_byte(t) {
                out.push(b);
            } else if t < self.offset {
                // reserved (PAD / EOS of tensor2tensor's byte encoder): no byte
            } else if let Some(name) = self.special_name(t) {
                if show_specials {
                    out.push(b'<');
                    out.extend_from_slice(name.as_bytes());
                    out.push(b'>');
                }
            } else {
                return Err(DataError::TokenOutOfRange {
                    id: t as u32,
                    vocab_size: self.vocab_size(),
                });
            }
        }
        Ok(out)
    }
}

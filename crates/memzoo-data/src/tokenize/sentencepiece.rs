//! SentencePiece unigram models (`spiece.model`, e.g. `google/reformer-crime-and-punishment`'s),
//! read and run in Rust: text in, ids out, and back, as the `sentencepiece` library that HF's
//! `ReformerTokenizer` calls.
//!
//! The `.model` file is a protobuf `ModelProto`, read here by hand (only the fields below):
//! its `pieces` (`piece`, `score`, `type`), the `trainer_spec` (`model_type`, `unk_id`,
//! `byte_fallback`) and the `normalizer_spec` (`precompiled_charsmap`, `add_dummy_prefix`,
//! `remove_extra_whitespaces`, `escape_whitespaces`).
//!
//! Encoding is SentencePiece's:
//! 1. **normalise**: each longest prefix found in the precompiled character map (a Darts
//!    double-array trie of replacements: NFKC and the model's rules) is replaced, other
//!    characters kept; leading, trailing and repeated spaces removed
//!    (`remove_extra_whitespaces`); a space put first (`add_dummy_prefix`); spaces written as
//!    `▁` (U+2581, `escape_whitespaces`);
//! 2. **segment** by Viterbi: the segmentation into pieces (normal and user-defined) whose
//!    summed score is largest, where a character no piece covers is the unknown piece with
//!    score `min score - 10` (consecutive unknowns fused into one), or its UTF-8 bytes
//!    (`<0x41>` pieces) with `byte_fallback`.
//!
//! Decoding joins the pieces, `▁` back to spaces, byte pieces back to bytes, control pieces
//! dropped, unknown ones as ` ⁇ `, and removes the dummy prefix's leading space.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::DataError;

/// The file name of a SentencePiece model beside a checkpoint or in a run directory.
pub const SPIECE_MODEL_FILE: &str = "spiece.model";

/// SentencePiece's whitespace symbol.
pub const SPACE: char = '\u{2581}';

/// What SentencePiece writes for an unknown piece when decoding.
pub const UNK_SURFACE: &str = " \u{2047} ";

/// Score below the lowest piece's given to an unknown character.
const UNK_PENALTY: f32 = 10.0;

/// A piece's type (`SentencePiece.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    /// A normal piece.
    Normal,
    /// The unknown piece.
    Unknown,
    /// A control symbol (`<s>`, `</s>`): never matched in text, decoded to nothing.
    Control,
    /// A user-defined symbol: always matched where it occurs.
    UserDefined,
    /// Unused: never matched.
    Unused,
    /// A byte (`<0x41>`), for byte fallback.
    Byte,
}

/// One piece of the vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// Its text (spaces as `▁`).
    pub piece: String,
    /// Its log-probability (unigram).
    pub score: f32,
    /// Its type.
    pub kind: PieceKind,
}

/// A SentencePiece unigram model.
#[derive(Debug, Clone)]
pub struct SentencePiece {
    pieces: Vec<Piece>,
    /// Matchable pieces (normal, user-defined) by text.
    index: HashMap<String, u32>,
    /// The longest matchable piece, in characters.
    max_chars: usize,
    unk_id: u32,
    unk_score: f32,
    max_score: f32,
    byte_fallback: bool,
    /// The piece of each byte (`<0x41>`), by byte.
    byte_ids: Vec<Option<u32>>,
    normalizer: Normalizer,
}

#[derive(Debug, Clone)]
struct Normalizer {
    charsmap: Option<CharsMap>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
}

impl SentencePiece {
    /// Reads a `.model` file.
    pub fn read(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// A model from the bytes of a `.model` file; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, DataError> {
        let bad = |message: String| DataError::Vocab {
            path: path.to_path_buf(),
            message,
        };
        let mut pieces = Vec::new();
        let mut model_type = 1u64;
        let mut unk_id = 0u64;
        let mut byte_fallback = false;
        let mut normalizer = Normalizer {
            charsmap: None,
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        };
        let mut treat_whitespace_as_suffix = false;
        for field in Fields::new(bytes) {
            let (number, value) = field.map_err(|e| bad(format!("ModelProto: {e}")))?;
            match (number, value) {
                (1, Value::Bytes(b)) => pieces
                    .push(read_piece(b).map_err(|e| bad(format!("piece {}: {e}", pieces.len())))?),
                (2, Value::Bytes(b)) => {
                    for f in Fields::new(b) {
                        match f.map_err(|e| bad(format!("trainer_spec: {e}")))? {
                            (3, Value::Varint(v)) => model_type = v,
                            (24, Value::Varint(v)) => treat_whitespace_as_suffix = v != 0,
                            (35, Value::Varint(v)) => byte_fallback = v != 0,
                            (40, Value::Varint(v)) => unk_id = v,
                            _ => {}
                        }
                    }
                }
                (3, Value::Bytes(b)) => {
                    for f in Fields::new(b) {
                        match f.map_err(|e| bad(format!("normalizer_spec: {e}")))? {
                            (2, Value::Bytes(m)) if !m.is_empty() => {
                                normalizer.charsmap = Some(
                                    CharsMap::new(m)
                                        .map_err(|e| bad(format!("precompiled_charsmap: {e}")))?,
                                )
                            }
                            (3, Value::Varint(v)) => normalizer.add_dummy_prefix = v != 0,
                            (4, Value::Varint(v)) => normalizer.remove_extra_whitespaces = v != 0,
                            (5, Value::Varint(v)) => normalizer.escape_whitespaces = v != 0,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if model_type != 1 {
            let name = match model_type {
                2 => "BPE",
                3 => "WORD",
                4 => "CHAR",
                _ => "unknown",
            };
            return Err(bad(format!(
                "model_type {model_type} ({name}): only unigram models (1) are implemented"
            )));
        }
        if treat_whitespace_as_suffix {
            return Err(bad(
                "treat_whitespace_as_suffix is set: not implemented".into()
            ));
        }
        if pieces.is_empty() {
            return Err(bad("has no pieces".into()));
        }
        let unk_id = u32::try_from(unk_id)
            .ok()
            .filter(|&u| (u as usize) < pieces.len())
            .ok_or_else(|| {
                bad(format!(
                    "unk_id {unk_id} is outside the {} pieces",
                    pieces.len()
                ))
            })?;
        if pieces[unk_id as usize].kind != PieceKind::Unknown {
            return Err(bad(format!(
                "unk_id {unk_id} is the piece {:?}, not of the unknown type",
                pieces[unk_id as usize].piece
            )));
        }
        let mut index = HashMap::new();
        let mut byte_ids = vec![None; 256];
        let (mut min_score, mut max_score) = (f32::INFINITY, f32::NEG_INFINITY);
        let mut max_chars = 1;
        for (i, p) in pieces.iter().enumerate() {
            match p.kind {
                PieceKind::Normal | PieceKind::UserDefined => {
                    if p.piece.is_empty() {
                        return Err(bad(format!("piece {i} is empty")));
                    }
                    if index.insert(p.piece.clone(), i as u32).is_some() {
                        return Err(bad(format!("piece {:?} is listed twice", p.piece)));
                    }
                    max_chars = max_chars.max(p.piece.chars().count());
                    if p.kind == PieceKind::Normal {
                        min_score = min_score.min(p.score);
                        max_score = max_score.max(p.score);
                    }
                }
                PieceKind::Byte => {
                    let b = p
                        .piece
                        .strip_prefix("<0x")
                        .and_then(|h| h.strip_suffix('>'))
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| bad(format!("byte piece {:?} is not <0xNN>", p.piece)))?;
                    byte_ids[b as usize] = Some(i as u32);
                }
                _ => {}
            }
        }
        if !min_score.is_finite() {
            (min_score, max_score) = (0.0, 0.0);
        }
        if byte_fallback && byte_ids.iter().any(Option::is_none) {
            return Err(bad(
                "byte_fallback is set but not all 256 byte pieces exist".into(),
            ));
        }
        Ok(Self {
            pieces,
            index,
            max_chars,
            unk_id,
            unk_score: min_score - UNK_PENALTY,
            max_score,
            byte_fallback,
            byte_ids,
            normalizer,
        })
    }

    /// Number of pieces (the vocabulary size).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether there are no pieces (never, once read).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The pieces by id.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// The id of a piece's text, if it is one.
    pub fn piece_id(&self, piece: &str) -> Option<u32> {
        self.index.get(piece).copied().or_else(|| {
            self.pieces
                .iter()
                .position(|p| p.piece == piece)
                .map(|i| i as u32)
        })
    }

    /// `text` normalised as SentencePiece does before segmenting (spaces as `▁`).
    pub fn normalize(&self, text: &str) -> String {
        self.normalizer.normalize(text)
    }

    /// The pieces of `text`: `(surface, id)` pairs; an unknown run's surface is its text.
    pub fn encode_pieces(&self, text: &str) -> Vec<(String, u32)> {
        let normalized = self.normalize(text);
        let s = normalized.as_str();
        // Character boundaries (byte offsets), so that pieces are whole characters.
        let bounds: Vec<usize> = s
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(s.len()))
            .collect();
        let n = bounds.len() - 1;
        // best[j]: (score, start char, id) of the best path ending at char j.
        let mut best: Vec<Option<(f32, usize, u32)>> = vec![None; n + 1];
        best[0] = Some((0.0, 0, 0));
        for start in 0..n {
            let Some((base, _, _)) = best[start] else {
                continue;
            };
            let mut single = false;
            for len in 1..=self.max_chars.min(n - start) {
                let piece = &s[bounds[start]..bounds[start + len]];
                let Some(&id) = self.index.get(piece) else {
                    continue;
                };
                let p = &self.pieces[id as usize];
                let score = if p.kind == PieceKind::UserDefined {
                    piece.len() as f32 * self.max_score - 0.1
                } else {
                    p.score
                };
                single |= len == 1;
                let candidate = base + score;
                let end = start + len;
                if best[end].is_none_or(|(b, _, _)| candidate > b) {
                    best[end] = Some((candidate, start, id));
                }
            }
            if !single {
                let candidate = base + self.unk_score;
                if best[start + 1].is_none_or(|(b, _, _)| candidate > b) {
                    best[start + 1] = Some((candidate, start, self.unk_id));
                }
            }
        }
        let mut path = Vec::new();
        let mut end = n;
        while end > 0 {
            let (_, start, id) = best[end].expect("every character is reachable");
            path.push((start, end, id));
            end = start;
        }
        path.reverse();
        let mut out: Vec<(String, u32)> = Vec::with_capacity(path.len());
        let mut prev_unk = false;
        for (start, end, id) in path {
            let surface = &s[bounds[start]..bounds[end]];
            let unk = id == self.unk_id;
            if unk && self.byte_fallback {
                for b in surface.bytes() {
                    let id = self.byte_ids[b as usize].expect("checked when read");
                    out.push((self.pieces[id as usize].piece.clone(), id));
                }
            } else if unk && prev_unk {
                out.last_mut()
                    .expect("a previous unknown")
                    .0
                    .push_str(surface);
            } else {
                out.push((surface.to_string(), id));
            }
            prev_unk = unk && !self.byte_fallback;
        }
        out
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_pieces(text)
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.decode_with(ids, true)
    }

    /// The text of `ids` that continue a text: as [`decode`](Self::decode), but a first piece's
    /// leading space is kept (it separates the continuation from the text before it).
    pub fn decode_continuation(&self, ids: &[u32]) -> Result<String, DataError> {
        self.decode_with(ids, false)
    }

    fn decode_with(&self, ids: &[u32], strip_prefix: bool) -> Result<String, DataError> {
        let mut out = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        let mut first = strip_prefix;
        for &id in ids {
            let p = self
                .pieces
                .get(id as usize)
                .ok_or(DataError::TokenOutOfRange {
                    id,
                    vocab_size: self.len(),
                })?;
            if p.kind == PieceKind::Byte {
                let b = self.byte_ids.iter().position(|&x| x == Some(id));
                bytes.extend(b.map(|b| b as u8));
                continue;
            }
            if !bytes.is_empty() {
                out.push_str(&String::from_utf8_lossy(&bytes));
                bytes.clear();
                first = false;
            }
            let text = match p.kind {
                PieceKind::Control | PieceKind::Unused => continue,
                PieceKind::Unknown => UNK_SURFACE.to_string(),
                _ => p.piece.replace(SPACE, " "),
            };
            let text = if first && self.normalizer.add_dummy_prefix {
                text.strip_prefix(' ').map(str::to_string).unwrap_or(text)
            } else {
                text
            };
            first = false;
            out.push_str(&text);
        }
        if !bytes.is_empty() {
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        Ok(out)
    }
}

impl Normalizer {
    /// SentencePiece's `Normalizer::Normalize`.
    fn normalize(&self, text: &str) -> String {
        let space = if self.escape_whitespaces {
            SPACE.to_string()
        } else {
            " ".to_string()
        };
        let mut input = text.as_bytes();
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (rep, len) = self.prefix(input);
                if rep != " " {
                    break;
                }
                input = &input[len..];
            }
        }
        let mut out = String::with_capacity(text.len() + 8);
        if input.is_empty() {
            return out;
        }
        if self.add_dummy_prefix {
            out.push_str(&space);
        }
        let mut prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (rep, len) = self.prefix(input);
            let mut sp = rep.as_str();
            if prev_space {
                sp = sp.trim_start_matches(' ');
            }
            if !sp.is_empty() {
                for c in sp.chars() {
                    if c == ' ' && self.escape_whitespaces {
                        out.push(SPACE);
                    } else {
                        out.push(c);
                    }
                }
                prev_space = sp.ends_with(' ');
            }
            input = &input[len..];
            prev_space &= self.remove_extra_whitespaces;
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space.as_str()) {
                out.truncate(out.len() - space.len());
            }
        }
        out
    }

    /// The replacement of the longest prefix of `input` the character map has, or its first
    /// character (U+FFFD for a byte that starts no UTF-8 character); and the bytes consumed.
    fn prefix(&self, input: &[u8]) -> (String, usize) {
        if let Some(map) = &self.charsmap
            && let Some((rep, len)) = map.longest(input)
        {
            return (rep.to_string(), len);
        }
        let len = utf8_len(input);
        match std::str::from_utf8(&input[..len]) {
            Ok(c) => (c.to_string(), len),
            Err(_) => ("\u{FFFD}".to_string(), 1),
        }
    }
}

/// The length of the UTF-8 character `input` starts with (1 for a malformed one).
fn utf8_len(input: &[u8]) -> usize {
    let n = match input[0] {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    };
    if n > input.len() || std::str::from_utf8(&input[..n]).is_err() {
        1
    } else {
        n
    }
}

/// SentencePiece's precompiled character map: a `u32` (little-endian) byte length of a Darts
/// double-array trie, the trie (`u32` units), then the replacement strings, each ended by a
/// zero byte; the trie maps a byte string to the offset of its replacement.
#[derive(Debug, Clone)]
struct CharsMap {
    units: Vec<u32>,
    normalized: Vec<u8>,
}

impl CharsMap {
    fn new(blob: &[u8]) -> Result<Self, String> {
        let size = blob
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
            .ok_or("shorter than 4 bytes")?;
        let trie = blob
            .get(4..4 + size)
            .filter(|_| size % 4 == 0 && size > 0)
            .ok_or_else(|| format!("a trie of {size} bytes in a blob of {}", blob.len()))?;
        let units = trie
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Self {
            units,
            normalized: blob[4 + size..].to_vec(),
        })
    }

    /// The replacement of the longest prefix of `key` in the trie, and its length.
    fn longest(&self, key: &[u8]) -> Option<(&str, usize)> {
        let unit = |pos: usize| self.units.get(pos).copied();
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let has_leaf = |u: u32| (u >> 8) & 1 == 1;
        let value = |u: u32| (u & ((1u32 << 31) - 1)) as usize;
        let label = |u: u32| u & ((1u32 << 31) | 0xff);
        let mut pos = offset(unit(0)?);
        let mut found = None;
        for (i, &c) in key.iter().enumerate() {
            pos ^= c as usize;
            let u = unit(pos)?;
            if label(u) != c as u32 {
                break;
            }
            pos ^= offset(u);
            if has_leaf(u)
                && let Some(v) = unit(pos)
            {
                found = Some((value(v), i + 1));
            }
        }
        let (start, len) = found?;
        let rest = self.normalized.get(start..)?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        Some((std::str::from_utf8(&rest[..end]).ok()?, len))
    }
}

/// A protobuf field's value (wire types 0, 1, 2, 5).
enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The fields of one protobuf message, in order.
struct Fields<'a> {
    bytes: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            failed: false,
        }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .bytes
                .get(self.pos)
                .ok_or_else(|| format!("truncated varint at byte {}", self.pos))?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "a field of {n} bytes runs past the end at byte {}",
                    self.pos
                )
            })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn field(&mut self) -> Result<(u64, Value<'a>), String> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = self.varint()?;
                let n = usize::try_from(n).map_err(|_| "length out of range".to_string())?;
                Value::Bytes(self.take(n)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().unwrap())),
            w => return Err(format!("wire type {w} at byte {}", self.pos)),
        };
        Ok((key >> 3, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.bytes.len() {
            return None;
        }
        let f = self.field();
        self.failed = f.is_err();
        Some(f)
    }
}

/// One `SentencePiece` message.
fn read_piece(bytes: &[u8]) -> Result<Piece, String> {
    let mut piece = Piece {
        piece: String::new(),
        score: 0.0,
        kind: PieceKind::Normal,
    };
    for f in Fields::new(bytes) {
        match f? {
            (1, Value::Bytes(b)) => {
                piece.piece = String::from_utf8(b.to_vec()).map_err(|_| "piece is not UTF-8")?
            }
            (2, Value::Fixed32(bits)) => piece.score = f32::from_bits(bits),
            (3, Value::Varint(t)) => {
                piece.kind = match t {
                    1 => PieceKind::Normal,
                    2 => PieceKind::Unknown,
                    3 => PieceKind::Control,
                    4 => PieceKind::UserDefined,
                    5 => PieceKind::Unused,
                    6 => PieceKind::Byte,
                    t => return Err(format!("type {t} is unknown")),
                }
            }
            _ => {}
        }
    }
    Ok(piece)
}

/// The path of a run's or checkpoint's SentencePiece model.
pub fn model_path(dir: &Path) -> PathBuf {
    dir.join(SPIECE_MODEL_FILE)
}

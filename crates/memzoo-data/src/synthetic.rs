//! A generated long-range corpus: text whose next characters can only be predicted from
//! text much further back than one segment, so that memory has something to prove.
//!
//! Each document states a random passage, then a stretch of filler text (common English
//! words in random order, which carry no information about the passage), then recalls the
//! passage. Two kinds of passage:
//!
//! - [`PassageKind::Words`]: random lower-case "words"; the recall repeats the passage:
//!   ```text
//!   remember: qzvk wor lapte mmzx dud yio.
//!   the of was time people and ... (min_gap..=max_gap bytes of filler)
//!   recall: qzvk wor lapte mmzx dud yio.
//!   ```
//! - [`PassageKind::KeyValue`]: random `key=value` pairs; the recall lists the pairs again in
//!   a new random order, so only the values (not the keys) are predictable:
//!   ```text
//!   remember: ab=xyz cd=qwer ef=tt.
//!   ...
//!   recall: cd=qwer ef=tt ab=xyz.
//!   ```
//!
//! The recalled bytes (the whole passage for `Words`, the values for `KeyValue`) are the
//! *recallable* positions: a model without access to the statement can only guess them
//! (about `log2(26)` = 4.7 bits per letter), a model that remembers can copy them. Their
//! byte ranges come with each [`LongRangeDocument`], and [`recallable_mask`] recovers them
//! from any text in this format.
//!
//! [`LongRangeConfig::near`] is the dense mode of `memzoo train`'s default run (one word,
//! recalled 8 times, every letter from one fixed distance), [`LongRangeConfig::far`] the mode of
//! long gaps for kNN memories.
//!
//! Everything is deterministic from [`LongRangeConfig::seed`]; document `i` of a split does
//! not depend on how many documents are generated.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::{Corpus, DataError, Split, Token};

/// What a passage is made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassageKind {
    /// Random lower-case words, recalled verbatim.
    #[default]
    Words,
    /// Random `key=value` pairs, recalled in a new order (values are recallable).
    KeyValue,
}

/// Configuration of the long-range corpus. Every field has a documented default
/// (`#[serde(default)]`: a TOML table may give only some).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LongRangeConfig {
    /// Seed of everything. Default `0`.
    pub seed: u64,
    /// Training documents. Default `2000` (1,084,373 bytes with the other defaults, 6.4% of
    /// them recallable).
    pub documents: usize,
    /// Validation documents (independent of the training ones). Default `200`.
    pub valid_documents: usize,
    /// Test documents. Default `200`.
    pub test_documents: usize,
    /// Words or key=value pairs. Default [`PassageKind::Words`].
    pub kind: PassageKind,
    /// Words (or pairs) per passage. Default `6`.
    pub items: usize,
    /// Fewest letters of a random word / key / value. Default `3`.
    pub min_word_len: usize,
    /// Most letters of a random word / key / value. Default `7`.
    pub max_word_len: usize,
    /// Fewest filler bytes between the statement and a recall. Default `300`: beyond a
    /// segment of 128 and a memory of 128 tokens.
    pub min_gap: usize,
    /// Most filler bytes between the statement and a recall (uniform in
    /// `min_gap..=max_gap`). Default `600`.
    pub max_gap: usize,
    /// Recalls per document, each after its own filler. Default `1`.
    pub repeats: usize,
}

impl Default for LongRangeConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            documents: 2000,
            valid_documents: 200,
            test_documents: 200,
            kind: PassageKind::Words,
            items: 6,
            min_word_len: 3,
            max_word_len: 7,
            min_gap: 300,
            max_gap: 600,
            repeats: 1,
        }
    }
}

impl LongRangeConfig {
    /// The far mode for kNN / long memories: gaps of 2,500..=4,000 bytes, 500 training
    /// documents (1,669,242 bytes, 1.0% of them recallable), 50 valid / 50 test.
    pub fn far() -> Self {
        Self {
            documents: 500,
            valid_documents: 50,
            test_documents: 50,
            min_gap: 2500,
            max_gap: 4000,
            ..Self::default()
        }
    }

    /// The near mode of `memzoo train`'s default run: a passage of one 12-letter word, stated
    /// and then recalled 8 times with no filler, so that every recalled letter lies exactly
    /// [`recall_distance`](Self::recall_distance) = 22 bytes after its source (the statement or
    /// the previous recall):
    /// ```text
    /// remember: qzvkwolaptem.
    /// recall: qzvkwolaptem.
    /// ... (8 recalls)
    /// ```
    /// 2,000 training documents of 200 bytes (400,000 bytes, 48% of them recallable), 200
    /// valid / 200 test. A model reading segments shorter than 22 bytes can predict the
    /// recalled letters only from its memory (a random letter costs `log2(26)` = 4.70 bits
    /// otherwise); one whose memory reaches 21 positions back can copy them from a fixed
    /// distance, which a small XL learns in a few thousand steps.
    pub fn near() -> Self {
        Self {
            items: 1,
            min_word_len: 12,
            max_word_len: 12,
            min_gap: 0,
            max_gap: 0,
            repeats: 8,
            ..Self::default()
        }
    }

    /// The distance in bytes from every recalled byte to its source when it is the same for
    /// all of them (one word length and one gap, `Words` passages): the passage, `".\n"`, the
    /// gap and `"recall: "`. `None` when lengths or gaps vary (or for `KeyValue` passages,
    /// whose recall reorders the pairs).
    pub fn recall_distance(&self) -> Option<usize> {
        if self.kind != PassageKind::Words
            || self.min_word_len != self.max_word_len
            || self.min_gap != self.max_gap
        {
            return None;
        }
        let passage = self.items * self.min_word_len + self.items.saturating_sub(1);
        Some(passage + 2 + self.min_gap + RECALL.len())
    }

    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), DataError> {
        let pos = |name: &str, v: usize| {
            if v == 0 {
                Err(DataError::invalid(name, v, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        pos("long_range.items", self.items)?;
        pos("long_range.min_word_len", self.min_word_len)?;
        pos("long_range.repeats", self.repeats)?;
        if self.max_word_len < self.min_word_len {
            return Err(DataError::invalid(
                "long_range.max_word_len",
                self.max_word_len,
                format!("must be at least min_word_len = {}", self.min_word_len),
            ));
        }
        if self.max_word_len > 64 {
            return Err(DataError::invalid(
                "long_range.max_word_len",
                self.max_word_len,
                "must be at most 64",
            ));
        }
        if self.max_gap < self.min_gap {
            return Err(DataError::invalid(
                "long_range.max_gap",
                self.max_gap,
                format!("must be at least min_gap = {}", self.min_gap),
            ));
        }
        if self.max_gap > 1 << 24 {
            return Err(DataError::invalid(
                "long_range.max_gap",
                self.max_gap,
                "must be at most 16777216",
            ));
        }
        Ok(())
    }

    /// Number of documents of `split`.
    pub fn documents_of(&self, split: Split) -> usize {
        match split {
            Split::Train => self.documents,
            Split::Valid => self.valid_documents,
            Split::Test => self.test_documents,
        }
    }
}

/// One generated document and where its recallable bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongRangeDocument {
    /// The text (ASCII, ends with `\n`).
    pub text: Vec<u8>,
    /// Byte ranges of `text` that can only be predicted by remembering the statement.
    pub recall: Vec<Range<usize>>,
}

impl LongRangeDocument {
    /// `[text.len()]`: `true` at recallable bytes.
    pub fn recall_mask(&self) -> Vec<bool> {
        let mut m = vec![false; self.text.len()];
        for r in &self.recall {
            m[r.clone()].iter_mut().for_each(|b| *b = true);
        }
        m
    }
}

/// The training documents' texts.
pub fn generate(cfg: &LongRangeConfig) -> Result<Vec<Vec<u8>>, DataError> {
    Ok(generate_split(cfg, Split::Train)?
        .into_iter()
        .map(|d| d.text)
        .collect())
}

/// The documents of one split, with their recallable ranges. The three splits use
/// independent random streams of the same seed.
pub fn generate_split(
    cfg: &LongRangeConfig,
    split: Split,
) -> Result<Vec<LongRangeDocument>, DataError> {
    cfg.validate()?;
    let split_id = match split {
        Split::Train => 1,
        Split::Valid => 2,
        Split::Test => 3,
    };
    Ok((0..cfg.documents_of(split))
        .map(|i| {
            let mut rng = SplitMix64::new(
                cfg.seed ^ SplitMix64::mix(split_id) ^ SplitMix64::mix(0x1000 + i as u64),
            );
            document(cfg, &mut rng)
        })
        .collect())
}

/// The three splits as one [`Corpus`] of bytes (documents concatenated; each ends in `\n`).
pub fn generate_corpus(cfg: &LongRangeConfig) -> Result<Corpus, DataError> {
    let join = |split| -> Result<Vec<u8>, DataError> {
        Ok(generate_split(cfg, split)?
            .into_iter()
            .flat_map(|d| d.text)
            .collect())
    };
    Ok(Corpus {
        train: join(Split::Train)?,
        valid: join(Split::Valid)?,
        test: join(Split::Test)?,
    })
}

/// Joins documents into one token stream: `[bos] doc [eos] [bos] doc [eos] ...`.
pub fn join_documents(docs: &[Vec<u8>], bos: Option<Token>, eos: Option<Token>) -> Vec<Token> {
    let mut out = Vec::with_capacity(docs.iter().map(|d| d.len() + 2).sum());
    for d in docs {
        out.extend(bos);
        out.extend(d.iter().map(|&b| b as Token));
        out.extend(eos);
    }
    out
}

/// [`join_documents`] for generated documents, with the matching recallable mask (`false`
/// at the boundary tokens): ready for
/// [`OrderedBatcher::with_target_mask`](crate::OrderedBatcher::with_target_mask).
pub fn join_with_mask(
    docs: &[LongRangeDocument],
    bos: Option<Token>,
    eos: Option<Token>,
) -> (Vec<Token>, Vec<bool>) {
    let texts: Vec<Vec<u8>> = docs.iter().map(|d| d.text.clone()).collect();
    let tokens = join_documents(&texts, bos, eos);
    let mut mask = Vec::with_capacity(tokens.len());
    for d in docs {
        mask.extend(bos.map(|_| false));
        mask.extend(d.recall_mask());
        mask.extend(eos.map(|_| false));
    }
    (tokens, mask)
}

const REMEMBER: &[u8] = b"remember: ";
const RECALL: &[u8] = b"recall: ";

/// `[text.len()]`: `true` at the recallable bytes of any text in the long-range format
/// (one document or many concatenated), found by parsing: a `recall: ` line's words equal to
/// the last `remember: ` passage (`Words`), or its values equal to the stated values of the
/// same keys (`KeyValue`).
pub fn recallable_mask(text: &[u8]) -> Vec<bool> {
    let mut mask = vec![false; text.len()];
    let mut passage: Option<&[u8]> = None;
    let mut line_start = 0;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |p| line_start + p);
        let line = &text[line_start..line_end];
        if let Some(rest) = line.strip_prefix(REMEMBER) {
            passage = rest.strip_suffix(b".");
        } else if let (Some(rest), Some(stated)) = (line.strip_prefix(RECALL), passage) {
            let body = rest.strip_suffix(b".").unwrap_or(rest);
            let offset = line_start + RECALL.len();
            if stated.contains(&b'=') {
                let mut i = 0;
                for item in body.split(|&b| b == b' ') {
                    if let Some(eq) = item.iter().position(|&b| b == b'=') {
                        let (key, value) = (&item[..eq], &item[eq + 1..]);
                        let found = stated.split(|&b| b == b' ').any(|s| {
                            s.len() == item.len()
                                && s[..eq] == *key
                                && s[eq] == b'='
                                && s[eq + 1..] == *value
                        });
                        if found {
                            mask[offset + i + eq + 1..offset + i + item.len()]
                                .iter_mut()
                                .for_each(|m| *m = true);
                        }
                    }
                    i += item.len() + 1;
                }
            } else if body == stated {
                mask[offset..offset + body.len()]
                    .iter_mut()
                    .for_each(|m| *m = true);
            }
        }
        line_start = line_end + 1;
    }
    mask
}

/// Filler vocabulary: frequent English words (no `:` or `=`, never a marker).
const FILLER: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "world", "life", "hand", "part", "child", "eye", "woman", "place", "work",
];

fn random_word(cfg: &LongRangeConfig, rng: &mut SplitMix64, out: &mut Vec<u8>) {
    let len = rng.range_incl(cfg.min_word_len, cfg.max_word_len);
    for _ in 0..len {
        out.push(b'a' + rng.below(26) as u8);
    }
}

/// Exactly `gap` bytes of filler, ending with `\n` (when `gap > 0`).
fn filler(rng: &mut SplitMix64, gap: usize, out: &mut Vec<u8>) {
    let start = out.len();
    let mut line = 0;
    while out.len() - start < gap {
        let w = FILLER[rng.below(FILLER.len() as u64) as usize].as_bytes();
        if line > 0 {
            if line + 1 + w.len() > 72 {
                out.push(b'\n');
                line = 0;
            } else {
                out.push(b' ');
                line += 1;
            }
        }
        out.extend_from_slice(w);
        line += w.len();
    }
    out.truncate(start + gap);
    if gap > 0 {
        *out.last_mut().expect("gap > 0") = b'\n';
    }
}

fn document(cfg: &LongRangeConfig, rng: &mut SplitMix64) -> LongRangeDocument {
    let mut text = Vec::new();
    let mut recall = Vec::new();
    // The passage: items separated by spaces.
    let mut items: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(cfg.items);
    for _ in 0..cfg.items {
        let mut key = Vec::new();
        random_word(cfg, rng, &mut key);
        let mut value = Vec::new();
        if cfg.kind == PassageKind::KeyValue {
            // Distinct keys, so that a recalled key names exactly one value.
            while items.iter().any(|(k, _)| *k == key) {
                key.clear();
                random_word(cfg, rng, &mut key);
            }
            random_word(cfg, rng, &mut value);
        }
        items.push((key, value));
    }
    let write_items =
        |text: &mut Vec<u8>, recall: &mut Vec<Range<usize>>, order: &[usize], record: bool| {
            let body_start = text.len();
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    text.push(b' ');
                }
                let (key, value) = &items[i];
                text.extend_from_slice(key);
                if cfg.kind == PassageKind::KeyValue {
                    text.push(b'=');
                    let v0 = text.len();
                    text.extend_from_slice(value);
                    if record {
                        recall.push(v0..text.len());
                    }
                }
            }
            if record && cfg.kind == PassageKind::Words {
                recall.push(body_start..text.len());
            }
            text.extend_from_slice(b".\n");
        };
    let mut order: Vec<usize> = (0..cfg.items).collect();
    text.extend_from_slice(REMEMBER);
    write_items(&mut text, &mut recall, &order, false);
    for _ in 0..cfg.repeats {
        let gap = rng.range_incl(cfg.min_gap, cfg.max_gap);
        filler(rng, gap, &mut text);
        if cfg.kind == PassageKind::KeyValue {
            // Fisher-Yates: the keys come back in a new order.
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        text.extend_from_slice(RECALL);
        write_items(&mut text, &mut recall, &order, true);
    }
    LongRangeDocument { text, recall }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator whose output is fixed forever, so
/// a seed names the same corpus across versions of this crate and of `rand`.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        Self::mix(self.0)
    }

    /// Uniform in `0..n` (multiply-shift; bias below 2^-40 for the small `n` used here).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range_incl(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo) as u64 + 1) as usize
    }
}

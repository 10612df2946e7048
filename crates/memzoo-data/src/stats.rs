//! Corpus statistics for `memzoo data stats`.

use serde::{Deserialize, Serialize};

use crate::Token;

/// Summary of a token stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CorpusStats {
    /// Number of tokens (bytes for a byte-level stream).
    pub tokens: u64,
    /// Number of distinct token ids that occur.
    pub distinct: usize,
    /// Unigram (order-0) entropy `H = -sum_s p(s) log2 p(s)` in bits per token: the bpc of a
    /// model that only knows symbol frequencies, a ceiling any trained model must beat.
    pub unigram_entropy_bits: f64,
    /// The most frequent tokens with their counts, most frequent first (at most 10).
    pub top: Vec<(Token, u64)>,
}

/// Statistics of `tokens`.
pub fn stats(tokens: &[Token]) -> CorpusStats {
    let mut counts = vec![0u64; Token::MAX as usize + 1];
    for &t in tokens {
        counts[t as usize] += 1;
    }
    let n = tokens.len() as f64;
    let mut entropy = 0.0;
    let mut distinct = 0;
    for &c in &counts {
        if c > 0 {
            distinct += 1;
            let p = c as f64 / n;
            entropy -= p * p.log2();
        }
    }
    let mut top: Vec<(Token, u64)> = counts
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(t, &c)| (t as Token, c))
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(10);
    CorpusStats {
        tokens: tokens.len() as u64,
        distinct,
        unigram_entropy_bits: entropy.max(0.0),
        top,
    }
}

/// Statistics of a byte string (each byte one token).
pub fn byte_stats(bytes: &[u8]) -> CorpusStats {
    let tokens: Vec<Token> = bytes.iter().map(|&b| b as Token).collect();
    stats(&tokens)
}

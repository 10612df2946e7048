use crate::{Token, byte_stats, stats};

/// Naive `-sum p log2 p` over a count table.
fn naive_entropy(tokens: &[Token]) -> f64 {
    let mut counts = std::collections::BTreeMap::new();
    for &t in tokens {
        *counts.entry(t).or_insert(0usize) += 1;
    }
    let n = tokens.len() as f64;
    counts
        .values()
        .map(|&c| c as f64 / n)
        .map(|p| -p * p.log2())
        .sum()
}

#[test]
fn entropy_of_known_distributions() {
    let s = byte_stats(b"aabb");
    assert_eq!((s.tokens, s.distinct), (4, 2));
    assert!((s.unigram_entropy_bits - 1.0).abs() < 1e-12);

    let all: Vec<u8> = (0..=255u8).collect();
    let s = byte_stats(&all);
    assert_eq!(s.distinct, 256);
    assert!((s.unigram_entropy_bits - 8.0).abs() < 1e-12);

    let s = byte_stats(b"zzzz");
    assert_eq!((s.distinct, s.unigram_entropy_bits), (1, 0.0));
    assert_eq!(s.top, vec![(b'z' as Token, 4)]);

    let s = stats(&[]);
    assert_eq!((s.tokens, s.distinct, s.unigram_entropy_bits), (0, 0, 0.0));
}

#[test]
fn entropy_matches_naive_formula_on_skewed_data() {
    // Skewed: square of a uniform byte, folded to 40 symbols, plus some special ids.
    let mut tokens: Vec<Token> = super::lcg_bytes(20_000, 7)
        .iter()
        .map(|&b| ((b as u32 * b as u32) % 40) as Token)
        .collect();
    tokens.extend([300, 300, 301]);
    let s = stats(&tokens);
    assert_eq!(s.tokens, 20_003);
    assert_eq!(
        s.distinct,
        tokens
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    assert!((s.unigram_entropy_bits - naive_entropy(&tokens)).abs() < 1e-9);
    // most frequent first
    assert!(s.top.windows(2).all(|w| w[0].1 >= w[1].1));
    assert_eq!(
        s.top[0].1,
        tokens.iter().filter(|&&t| t == s.top[0].0).count() as u64
    );
}

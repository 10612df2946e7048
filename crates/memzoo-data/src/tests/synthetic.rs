use crate::{
    LongRangeConfig, OrderedBatcher, PassageKind, Split, generate, generate_corpus, generate_split,
    join_with_mask, recallable_mask,
};

fn small(kind: PassageKind) -> LongRangeConfig {
    LongRangeConfig {
        documents: 40,
        valid_documents: 5,
        test_documents: 5,
        kind,
        ..LongRangeConfig::default()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn defaults_are_documented_values() {
    let d = LongRangeConfig::default();
    assert_eq!(
        (
            d.seed,
            d.documents,
            d.items,
            d.min_gap,
            d.max_gap,
            d.repeats
        ),
        (0, 2000, 6, 300, 600, 1)
    );
    // a TOML table may give only some fields
    let c: LongRangeConfig =
        toml::from_str("seed = 5\nmin_gap = 2500\nmax_gap = 4000\nkind = \"key_value\"").unwrap();
    assert_eq!(
        (c.seed, c.min_gap, c.kind, c.documents),
        (5, 2500, PassageKind::KeyValue, 2000)
    );
    assert!(toml::from_str::<LongRangeConfig>("gap = 3").is_err());
}

#[test]
fn default_corpus_is_pinned() {
    // The generator is self-contained (SplitMix64), so these numbers never change: a seed
    // names the same corpus in every version (the numbers are also in the docs).
    let c = generate_corpus(&LongRangeConfig::default()).unwrap();
    assert_eq!(
        (c.train.len(), c.valid.len(), c.test.len()),
        (1_084_373, 110_664, 110_217)
    );
    let s = crate::byte_stats(&c.train);
    assert_eq!(s.distinct, 30); // a-z, space, newline, ':' and '.'
}

#[test]
fn deterministic_from_the_seed() {
    let cfg = small(PassageKind::Words);
    assert_eq!(generate(&cfg).unwrap(), generate(&cfg).unwrap());
    let other = LongRangeConfig {
        seed: 1,
        ..cfg.clone()
    };
    assert_ne!(generate(&cfg).unwrap(), generate(&other).unwrap());
    // document i does not depend on how many are generated
    let fewer = LongRangeConfig {
        documents: 10,
        ..cfg.clone()
    };
    assert_eq!(generate(&fewer).unwrap()[..], generate(&cfg).unwrap()[..10]);
    // splits are independent streams
    assert_ne!(
        generate_split(&cfg, Split::Valid).unwrap()[0],
        generate_split(&cfg, Split::Train).unwrap()[0]
    );
    // pin the format of the first document of seed 0
    let first = String::from_utf8(generate(&cfg).unwrap()[0].clone()).unwrap();
    assert!(
        first.starts_with("remember: ") && first.ends_with(".\n"),
        "{first}"
    );
    assert!(
        first.lines().last().unwrap().starts_with("recall: "),
        "{first}"
    );
}

#[test]
fn words_are_recalled_far_beyond_one_segment() {
    let cfg = small(PassageKind::Words);
    for doc in generate_split(&cfg, Split::Train).unwrap() {
        let text = &doc.text;
        let stated_at = b"remember: ".len();
        let stated_end = find(text, b".\n").unwrap();
        let passage = &text[stated_at..stated_end];
        assert_eq!(passage.split(|&b| b == b' ').count(), cfg.items);
        assert!(
            passage
                .split(|&b| b == b' ')
                .all(|w| (3..=7).contains(&w.len()) && w.iter().all(u8::is_ascii_lowercase))
        );
        assert_eq!(doc.recall.len(), 1);
        let r = doc.recall[0].clone();
        assert_eq!(&text[r.clone()], passage);
        assert_eq!(&text[r.start - b"recall: ".len()..r.start], b"recall: ");
        // filler between statement and recall: min_gap..=max_gap bytes
        let gap = r.start - b"recall: ".len() - (stated_end + 2);
        assert!((300..=600).contains(&gap), "gap {gap}");
        // the 256 bytes before the recall do not hold the passage: its only earlier
        // occurrence is the statement, more than 300 bytes back
        assert!(find(&text[r.start - 256..r.start], passage).is_none());
        assert_eq!(find(text, passage), Some(stated_at));
        assert_eq!(recallable_mask(text), doc.recall_mask());
    }
}

#[test]
fn key_values_recall_only_the_values() {
    let cfg = LongRangeConfig {
        repeats: 2,
        ..small(PassageKind::KeyValue)
    };
    for doc in generate_split(&cfg, Split::Valid).unwrap() {
        let text = String::from_utf8(doc.text.clone()).unwrap();
        let stated = text
            .lines()
            .next()
            .unwrap()
            .strip_prefix("remember: ")
            .unwrap()
            .strip_suffix('.')
            .unwrap();
        let pairs: std::collections::BTreeMap<&str, &str> = stated
            .split(' ')
            .map(|p| p.split_once('=').unwrap())
            .collect();
        assert_eq!(pairs.len(), cfg.items, "keys are distinct");
        let recalls: Vec<&str> = text.lines().filter(|l| l.starts_with("recall: ")).collect();
        assert_eq!(recalls.len(), 2);
        for line in recalls {
            let body = line
                .strip_prefix("recall: ")
                .unwrap()
                .strip_suffix('.')
                .unwrap();
            let got: std::collections::BTreeMap<&str, &str> = body
                .split(' ')
                .map(|p| p.split_once('=').unwrap())
                .collect();
            assert_eq!(got, pairs);
        }
        assert_eq!(doc.recall.len(), 2 * cfg.items);
        for r in &doc.recall {
            assert_eq!(doc.text[r.start - 1], b'=');
            assert!(pairs.values().any(|v| v.as_bytes() == &doc.text[r.clone()]));
        }
        assert_eq!(recallable_mask(&doc.text), doc.recall_mask());
    }
}

#[test]
fn far_mode_gaps_exceed_two_thousand() {
    let cfg = LongRangeConfig {
        documents: 10,
        ..LongRangeConfig::far()
    };
    for doc in generate_split(&cfg, Split::Train).unwrap() {
        let stated_end = find(&doc.text, b".\n").unwrap() + 2;
        let distance = doc.recall[0].start - stated_end;
        assert!(distance > 2500, "{distance}");
        assert!(distance <= 4000 + b"recall: ".len());
    }
}

#[test]
fn near_mode_recalls_every_letter_from_one_distance() {
    let cfg = LongRangeConfig {
        documents: 20,
        ..LongRangeConfig::near()
    };
    // "remember: " + 12 letters + ".\n", then 8 x ("recall: " + 12 letters + ".\n").
    let distance = 12 + ".\n".len() + "recall: ".len();
    assert_eq!(cfg.recall_distance(), Some(distance));
    for doc in generate_split(&cfg, Split::Train).unwrap() {
        assert_eq!(doc.text.len(), 10 + 12 + 2 + 8 * (8 + 12 + 2));
        assert_eq!(doc.recall.len(), 8);
        let mask = doc.recall_mask();
        assert_eq!(mask, recallable_mask(&doc.text));
        for p in (0..doc.text.len()).filter(|&p| mask[p]) {
            assert!(doc.text[p].is_ascii_lowercase(), "byte {p}");
            assert_eq!(doc.text[p], doc.text[p - distance], "byte {p}");
        }
    }
    // Varying lengths or gaps: no single distance.
    assert_eq!(LongRangeConfig::default().recall_distance(), None);
    assert_eq!(LongRangeConfig::far().recall_distance(), None);
}

#[test]
fn joined_stream_masks_feed_the_batcher() {
    let cfg = small(PassageKind::Words);
    let docs = generate_split(&cfg, Split::Test).unwrap();
    let (tokens, mask) = join_with_mask(&docs, Some(256), Some(257));
    assert_eq!(tokens.len(), mask.len());
    assert_eq!(
        tokens.len(),
        docs.iter().map(|d| d.text.len() + 2).sum::<usize>()
    );
    assert_eq!(tokens.iter().filter(|&&t| t == 256).count(), docs.len());
    // the mask, parsed from the raw bytes of the joined stream, is the same
    let bytes: Vec<u8> = tokens
        .iter()
        .map(|&t| if t < 256 { t as u8 } else { b'\n' })
        .collect();
    assert_eq!(recallable_mask(&bytes), mask);
    let recallable = mask.iter().filter(|&&m| m).count();
    assert!(recallable > 0);

    let mut it = OrderedBatcher::new(tokens, 2, 64)
        .unwrap()
        .with_target_mask(mask.clone())
        .unwrap();
    let row_len = it.row_len();
    let selected: usize = it
        .by_ref()
        .map(|b| b.target_mask.unwrap().iter().filter(|&&m| m).count())
        .sum();
    // naive: every masked position that is a target (not a row start, not in the dropped tail)
    let want = (0..2 * row_len)
        .filter(|&i| i % row_len != 0 && mask[i])
        .count();
    assert_eq!(selected, want);
    assert!(selected + 3 >= recallable, "{selected} of {recallable}");

    let corpus = generate_corpus(&cfg).unwrap();
    assert_eq!(
        corpus.test,
        docs.iter()
            .flat_map(|d| d.text.clone())
            .collect::<Vec<u8>>()
    );
}

#[test]
fn invalid_config_is_rejected_with_its_value() {
    for (cfg, needle) in [
        (
            LongRangeConfig {
                min_gap: 700,
                ..LongRangeConfig::default()
            },
            "max_gap = 600",
        ),
        (
            LongRangeConfig {
                items: 0,
                ..LongRangeConfig::default()
            },
            "items = 0",
        ),
        (
            LongRangeConfig {
                min_word_len: 8,
                ..LongRangeConfig::default()
            },
            "max_word_len = 7",
        ),
    ] {
        let err = generate(&cfg).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}

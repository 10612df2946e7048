use crate::{BOS, ByteTokenizer, DataError, EOS, PAD, Token};

#[test]
fn bytes_round_trip() {
    let tok = ByteTokenizer::new();
    let all: Vec<u8> = (0..=255u8).collect();
    let ids = tok.encode(&all);
    assert_eq!(ids, (0..256).map(|i| i as Token).collect::<Vec<_>>());
    assert_eq!(tok.decode(&ids).unwrap(), all);
    assert_eq!(tok.vocab_size(), 256);
    assert_eq!(
        tok.decode_lossy(&tok.encode("héllo".as_bytes())).unwrap(),
        "héllo"
    );
}

#[test]
fn special_tokens_follow_the_bytes() {
    let tok = ByteTokenizer::with_specials([BOS, EOS, PAD]).unwrap();
    assert_eq!(tok.vocab_size(), 259);
    assert_eq!(tok.special(BOS), Some(256));
    assert_eq!(tok.special(EOS), Some(257));
    assert_eq!(tok.special(PAD), Some(258));
    assert_eq!(tok.special("MASK"), None);
    assert_eq!(tok.special_name(257), Some("EOS"));
    assert_eq!(tok.special_name(65), None);
    assert!(tok.is_special(258) && !tok.is_special(255) && !tok.is_special(259));

    let doc = tok.encode_document(b"ab", Some(256), Some(257));
    assert_eq!(doc, vec![256, 97, 98, 257]);
    assert_eq!(tok.decode(&doc).unwrap(), b"<BOS>ab<EOS>");
    assert_eq!(tok.decode_skip_specials(&doc).unwrap(), b"ab");

    let json = serde_json::to_string(&tok).unwrap();
    let back: ByteTokenizer = serde_json::from_str(&json).unwrap();
    assert_eq!(back, tok);
}

#[test]
fn tokenizer_errors_name_the_bad_value() {
    let tok = ByteTokenizer::with_specials([BOS]).unwrap();
    let err = tok.decode(&[65, 300]).unwrap_err();
    assert!(matches!(
        err,
        DataError::TokenOutOfRange {
            id: 300,
            vocab_size: 257
        }
    ));
    assert!(
        err.to_string().contains("300") && err.to_string().contains("257"),
        "{err}"
    );

    let err = ByteTokenizer::with_specials([BOS, EOS, BOS]).unwrap_err();
    assert!(
        err.to_string().contains("BOS") && err.to_string().contains("twice"),
        "{err}"
    );
    assert!(ByteTokenizer::with_specials([""]).is_err());

    let err = tok.special_id("SEP").unwrap_err();
    assert!(
        err.to_string().contains("SEP") && err.to_string().contains("BOS"),
        "{err}"
    );
    assert_eq!(tok.special_id(BOS).unwrap(), 256);
}

/// With offset 2 the tokenizer is `google/reformer-enwik8`'s: its model card encodes
/// `list(s.encode("utf-8")) + 2` and decodes `chr(x - 2) if x > 1 else ""` (tensor2tensor's
/// `ByteTextEncoder` with 2 reserved ids, PAD 0 and EOS 1). That rule, written out here per
/// id, against the tokenizer over every byte, multi-byte UTF-8 text, the reserved ids and the
/// specials after the bytes.
#[test]
fn byte_offset_is_the_enwik8_model_cards_rule() {
    let card_encode = |s: &[u8]| -> Vec<Token> { s.iter().map(|&c| c as Token + 2).collect() };
    let card_decode = |ids: &[Token]| -> Vec<u8> {
        ids.iter()
            .filter(|&&x| x > 1)
            .map(|&x| (x - 2) as u8)
            .collect()
    };
    let tok = ByteTokenizer::new().with_offset(2).unwrap();
    assert_eq!(tok.offset(), 2);
    assert_eq!(tok.vocab_size(), 258, "enwik8's vocab_size");
    let all: Vec<u8> = (0..=255u8).collect();
    let text = "naïve — 漢字 ok".as_bytes();
    for s in [&all[..], text, b""] {
        let ids = tok.encode(s);
        assert_eq!(ids, card_encode(s));
        assert_eq!(tok.decode(&ids).unwrap(), s, "round trip");
    }
    assert_eq!(tok.encode(b"A"), vec![67]);
    // Reserved ids decode to nothing, as the card's decoder.
    let ids: Vec<Token> = vec![0, 106, 1, 107, 0];
    assert_eq!(tok.decode(&ids).unwrap(), card_decode(&ids));
    assert_eq!(tok.decode(&ids).unwrap(), b"hi");
    assert_eq!(
        tok.decode_lossy(&tok.encode(text)).unwrap(),
        "naïve — 漢字 ok"
    );
    // 258 is past the vocabulary; specials come after the shifted bytes.
    let err = tok.decode(&[258]).unwrap_err();
    assert!(matches!(
        err,
        DataError::TokenOutOfRange {
            id: 258,
            vocab_size: 258
        }
    ));
    let tok = ByteTokenizer::with_specials([BOS])
        .unwrap()
        .with_offset(2)
        .unwrap();
    assert_eq!(tok.special(BOS), Some(258));
    assert_eq!(tok.special_name(258), Some(BOS));
    assert_eq!(tok.special_name(257), None);
    assert_eq!(tok.decode(&[258, 106]).unwrap(), b"<BOS>h");
    // Saved before the offset existed: offset 0.
    let old: ByteTokenizer = serde_json::from_str(r#"{"specials":[]}"#).unwrap();
    assert_eq!(old, ByteTokenizer::new());
    let back: ByteTokenizer = serde_json::from_str(&serde_json::to_string(&tok).unwrap()).unwrap();
    assert_eq!(back, tok);
    // Ids that do not fit in a u16 are refused, naming the offset.
    let err = ByteTokenizer::new().with_offset(65300).unwrap_err();
    assert!(err.to_string().contains("65300"), "{err}");
}

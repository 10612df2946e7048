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

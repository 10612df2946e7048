use std::io::Write;

use super::TempDir;
use crate::{
    Corpus, DataError, FileKind, Manifest, Split, SplitRule, file_kind, read_bytes, zip_members,
};

fn write_gz(path: &std::path::Path, data: &[u8]) {
    let f = std::fs::File::create(path).unwrap();
    let mut enc = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap();
}

fn write_zip(path: &std::path::Path, members: &[(&str, &[u8])]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, data) in members {
        z.start_file(*name, opts).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

#[test]
fn tail_bytes_rule_is_first_90_next_5_last_5() {
    // enwik8 proportions on a 100-byte file: 90 / 5 / 5
    let data: Vec<u8> = (0..100u8).collect();
    let rule = SplitRule::TailBytes { valid: 5, test: 5 };
    let c = Corpus::from_bytes(data.clone(), &rule).unwrap();
    assert_eq!(c.train, data[..90]);
    assert_eq!(c.valid, data[90..95]);
    assert_eq!(c.test, data[95..]);
    assert_eq!(
        SplitRule::enwik8(),
        SplitRule::TailBytes {
            valid: 5_000_000,
            test: 5_000_000
        }
    );
    let (tr, va, te) = SplitRule::enwik8().ranges(100_000_000).unwrap();
    assert_eq!(
        (tr, va, te),
        (
            0..90_000_000,
            90_000_000..95_000_000,
            95_000_000..100_000_000
        )
    );

    let err = Corpus::from_bytes(vec![1; 10], &rule).unwrap_err();
    assert!(err.to_string().contains("only 10 bytes"), "{err}");
}

#[test]
fn fraction_rule_is_last_valid_previous_test() {
    let data = super::lcg_bytes(1000, 1);
    let c = Corpus::from_bytes(data.clone(), &SplitRule::generic()).unwrap();
    // last 5% (50 bytes) valid, the 50 before test
    assert_eq!(c.valid, data[950..]);
    assert_eq!(c.test, data[900..950]);
    assert_eq!(c.train, data[..900]);
    assert_eq!(c.len(), 1000);

    let c = Corpus::from_bytes(
        data.clone(),
        &SplitRule::Fractions {
            valid: 0.1,
            test: 0.0,
        },
    )
    .unwrap();
    assert_eq!((c.train.len(), c.valid.len(), c.test.len()), (900, 100, 0));

    for (rule, needle) in [
        (
            SplitRule::Fractions {
                valid: 1.5,
                test: 0.0,
            },
            "split.valid = 1.5",
        ),
        (
            SplitRule::Fractions {
                valid: 0.6,
                test: 0.5,
            },
            "split.valid + split.test",
        ),
        (
            SplitRule::Fractions {
                valid: -0.1,
                test: 0.0,
            },
            "split.valid = -0.1",
        ),
    ] {
        let err = Corpus::from_bytes(data.clone(), &rule).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    // 5% of 10 bytes is empty: a clear error rather than an empty split
    let err = Corpus::from_bytes(vec![1; 10], &SplitRule::generic()).unwrap_err();
    assert!(err.to_string().contains("only 10 bytes"), "{err}");
}

#[test]
fn reads_plain_gzip_and_zip() {
    let dir = TempDir::new("read");
    let data = super::lcg_bytes(50_000, 3);

    let plain = dir.join("a.txt");
    std::fs::write(&plain, &data).unwrap();
    assert_eq!(file_kind(&plain).unwrap(), FileKind::Plain);
    assert_eq!(read_bytes(&plain, None).unwrap(), data);

    let gz = dir.join("a.txt.gz");
    write_gz(&gz, &data);
    assert_eq!(file_kind(&gz).unwrap(), FileKind::Gzip);
    assert_eq!(read_bytes(&gz, None).unwrap(), data);

    let zip1 = dir.join("one.zip");
    write_zip(&zip1, &[("enwik8", &data)]);
    assert_eq!(file_kind(&zip1).unwrap(), FileKind::Zip);
    assert_eq!(zip_members(&zip1).unwrap(), vec!["enwik8".to_string()]);
    assert_eq!(read_bytes(&zip1, None).unwrap(), data);
    assert_eq!(read_bytes(&zip1, Some("enwik8")).unwrap(), data);

    let zip3 = dir.join("three.zip");
    write_zip(
        &zip3,
        &[
            ("d/train.txt", b"train text"),
            ("d/valid.txt", b"valid"),
            ("d/test.txt", b"test"),
        ],
    );
    assert_eq!(read_bytes(&zip3, Some("d/valid.txt")).unwrap(), b"valid");
    let err = read_bytes(&zip3, None).unwrap_err();
    assert!(
        err.to_string().contains("3 files") && err.to_string().contains("d/train.txt"),
        "{err}"
    );
    let err = read_bytes(&zip3, Some("d/nope.txt")).unwrap_err();
    assert!(
        err.to_string().contains("d/nope.txt") && err.to_string().contains("three.zip"),
        "{err}"
    );

    let rule = SplitRule::Members {
        train: "d/train.txt".into(),
        valid: "d/valid.txt".into(),
        test: "d/test.txt".into(),
    };
    let c = Corpus::load(&zip3, None, &rule).unwrap();
    assert_eq!(
        (c.get(Split::Train), c.get(Split::Valid), c.get(Split::Test)),
        (&b"train text"[..], &b"valid"[..], &b"test"[..])
    );

    // a member asked of a plain file
    let err = read_bytes(&plain, Some("x")).unwrap_err();
    assert!(err.to_string().contains("not a zip"), "{err}");
}

#[test]
fn bad_files_give_errors_that_name_them() {
    let dir = TempDir::new("bad");
    let missing = dir.join("missing.txt");
    let err = read_bytes(&missing, None).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }));
    assert!(
        err.to_string().contains("missing.txt") && err.to_string().contains("does not exist"),
        "{err}"
    );

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let err = Corpus::load(&empty, None, &SplitRule::generic()).unwrap_err();
    assert!(matches!(err, DataError::Empty { .. }));
    assert!(
        err.to_string().contains("empty.txt") && err.to_string().contains("empty"),
        "{err}"
    );

    let empty_gz = dir.join("empty.gz");
    write_gz(&empty_gz, b"");
    assert!(matches!(
        read_bytes(&empty_gz, None).unwrap_err(),
        DataError::Empty { .. }
    ));

    let bad_gz = dir.join("bad.gz");
    std::fs::write(&bad_gz, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
    let err = read_bytes(&bad_gz, None).unwrap_err();
    assert!(
        matches!(err, DataError::Archive { .. }) && err.to_string().contains("bad.gz"),
        "{err}"
    );

    let bad_zip = dir.join("bad.zip");
    std::fs::write(&bad_zip, b"PK\x03\x04 this is not a zip").unwrap();
    let err = read_bytes(&bad_zip, None).unwrap_err();
    assert!(
        matches!(err, DataError::Archive { .. }) && err.to_string().contains("bad.zip"),
        "{err}"
    );
}

#[test]
fn split_names_parse() {
    for (s, want) in [
        ("train", Split::Train),
        ("VALID", Split::Valid),
        ("validation", Split::Valid),
        ("test", Split::Test),
    ] {
        assert_eq!(s.parse::<Split>().unwrap(), want);
    }
    let err = "eval".parse::<Split>().unwrap_err();
    assert!(err.to_string().contains("eval"), "{err}");
    assert_eq!(Split::Valid.to_string(), "valid");
}

#[test]
fn tiny_shakespeare_generic_split() {
    let Some(path) = super::tiny_shakespeare() else {
        eprintln!("skipped: shared/data/tinyshakespeare.txt not found");
        return;
    };
    let m = Manifest::load("tiny-shakespeare").unwrap();
    let c = Corpus::load(&path, m.member.as_deref(), &m.split).unwrap();
    let all = std::fs::read(&path).unwrap();
    let n = all.len();
    let k = n * 5 / 100; // floor(5%)
    assert_eq!(c.valid, all[n - k..]);
    assert_eq!(c.test, all[n - 2 * k..n - k]);
    assert_eq!(c.train, all[..n - 2 * k]);
    assert!(c.train.starts_with(b"First Citizen:"));
}

use crate::{Check, DataError, Manifest, SplitRule, sha256_file};

#[test]
fn every_embedded_manifest_is_valid() {
    let all = Manifest::all().unwrap();
    let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "enwik8",
            "text8",
            "wikitext-103-raw",
            "pg19-sample",
            "tiny-shakespeare"
        ]
    );
    for m in &all {
        m.validate().unwrap();
        assert!(m.size > 0);
        match m.check {
            Check::Sha256 => assert_eq!(m.sha256.as_ref().map(String::len), Some(64), "{}", m.name),
            Check::SizeOnly => assert!(m.sha256.is_none()),
        }
        // the manifest round-trips through TOML
        let text = toml::to_string(m).unwrap();
        assert_eq!(&Manifest::from_toml_str("round trip", &text).unwrap(), m);
    }
    let enwik8 = Manifest::load("enwik8").unwrap();
    assert_eq!(enwik8.split, SplitRule::enwik8());
    assert_eq!(enwik8.member.as_deref(), Some("enwik8"));
    assert_eq!(Manifest::load("text8").unwrap().check, Check::SizeOnly);
    assert!(matches!(
        Manifest::load("wikitext-103-raw").unwrap().split,
        SplitRule::Members { .. }
    ));
    // names are forgiving about case and _ / -
    assert_eq!(
        Manifest::load("Tiny_Shakespeare").unwrap().name,
        "tiny-shakespeare"
    );
}

#[test]
fn tiny_shakespeare_manifest_matches_the_shared_file() {
    let Some(path) = super::tiny_shakespeare() else {
        eprintln!("skipped: shared/data/tinyshakespeare.txt not found");
        return;
    };
    let m = Manifest::load("tiny-shakespeare").unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), m.size);
    assert_eq!(Some(sha256_file(&path).unwrap()), m.sha256);
    crate::verify(&m, &path).unwrap();
}

#[test]
fn unknown_and_bad_manifests_are_explained() {
    let err = Manifest::load("enwik9").unwrap_err();
    assert!(matches!(err, DataError::UnknownDataset { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("enwik9") && msg.contains("enwik8") && msg.contains("tiny-shakespeare"),
        "{msg}"
    );

    let good = r#"
name = "x"
description = "d"
url = "https://example.org/x.txt"
file = "x.txt"
size = 10
check = "sha256"
sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
[split]
rule = "fractions"
valid = 0.1
test = 0.1
"#;
    Manifest::from_toml_str("good", good).unwrap();
    for (from, to, needle) in [
        (
            "check = \"sha256\"\n",
            "check = \"size-only\"\n",
            "must not have a sha256",
        ),
        ("sha256 = \"ba78", "# sha256 = \"ba78", "needs a sha256"),
        ("ba7816bf", "BA7816BF", "64 lower-case hex"),
        (
            "https://example.org",
            "ftp://example.org",
            "ftp://example.org",
        ),
        ("file = \"x.txt\"", "file = \"../x.txt\"", "../x.txt"),
        ("size = 10", "size = 0", "size"),
        ("valid = 0.1", "valid = 2.0", "split.valid = 2"),
        ("rule = \"fractions\"", "rule = \"halves\"", "halves"),
        ("description", "descripton", "descripton"),
    ] {
        let text = good.replacen(from, to, 1);
        assert_ne!(text, good, "{from}");
        let err = Manifest::from_toml_str("bad.toml", &text).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("bad.toml") && msg.contains(needle),
            "{from} -> {to}: {msg}"
        );
    }

    let err = Manifest::load_file(std::path::Path::new("/nonexistent/m.toml")).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }));
}

#[test]
fn every_file_in_datasets_is_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datasets");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "toml")
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    on_disk.sort();
    // rust-code.toml is a manifest of its own kind, embedded by `rust_code`.
    on_disk.retain(|n| n != crate::rust_code::NAME);
    let mut known: Vec<String> = Manifest::known().iter().map(|s| s.to_string()).collect();
    known.sort();
    assert_eq!(
        on_disk, known,
        "add new manifests to EMBEDDED in manifest.rs"
    );
}

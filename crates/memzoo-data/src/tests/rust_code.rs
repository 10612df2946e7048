//! The rust-code corpus builder on a small fake registry, and the embedded manifest.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::TempDir;
use crate::rust_code::{self, RustCodeManifest, split_file};
use crate::{DataError, Split};

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The split rule, written out independently of `split_of`.
fn rule(name: &str) -> Split {
    let h = Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h[..8]);
    match u64::from_be_bytes(first) % 100 {
        n if n < 90 => Split::Train,
        n if n < 95 => Split::Valid,
        _ => Split::Test,
    }
}

/// An expected document: name, split, bytes.
type Expected = (&'static str, Split, Vec<u8>);

/// A fake registry with two versions of `alpha` and `zeta` (train), `fake-crate-13` (valid)
/// and `fake-crate-62` (test); returns it and the documents expected, in document order.
fn fake_registry(dir: &TempDir) -> (PathBuf, Vec<Expected>) {
    let reg = dir.join("registry-src-index");
    // alpha 0.10.0: nested dirs, a non-.rs file, a file with a NUL byte, one without a final
    // newline; listed out of order on purpose.
    let a10 = reg.join("alpha-0.10.0");
    write(&a10, "src/lib.rs", b"pub mod a;\npub fn alpha() {}\n");
    write(&a10, "src/a/mod.rs", b"pub struct A;");
    write(&a10, "src/a/b/deep.rs", b"// deep\n");
    write(&a10, "build.rs", b"fn main() {}\n");
    write(&a10, "README.md", b"# not rust\n");
    write(&a10, "src/nul.rs", b"const X: u8 = 0;\n\0binary\n");
    write(&a10, "src/lib.rs.orig", b"not .rs\n");
    let a9 = reg.join("alpha-0.9.0");
    write(&a9, "src/lib.rs", b"pub fn old() {}\n");
    let z = reg.join("zeta-1.0.0");
    write(&z, "src/lib.rs", b"//! zeta\n");
    write(&z, "src/Z.rs", b"// capital Z sorts before l\n");
    let v = reg.join("fake-crate-13-0.1.0");
    write(&v, "src/main.rs", b"fn main() { println!(\"valid\"); }\n");
    let t = reg.join("fake-crate-62-2.0.0");
    write(&t, "tests/t.rs", b"#[test]\nfn t() {}\n");
    write(&t, "src/lib.rs", b"");
    // a crate not pinned: never read
    write(&reg.join("unpinned-1.0.0"), "src/lib.rs", b"x\n");

    let expected = vec![
        (
            "alpha-0.9.0",
            Split::Train,
            b"// file: src/lib.rs\npub fn old() {}\n".to_vec(),
        ),
        (
            "alpha-0.10.0",
            Split::Train,
            b"// file: build.rs\nfn main() {}\n\
              // file: src/a/b/deep.rs\n// deep\n\
              // file: src/a/mod.rs\npub struct A;\n\
              // file: src/lib.rs\npub mod a;\npub fn alpha() {}\n"
                .to_vec(),
        ),
        (
            "zeta-1.0.0",
            Split::Train,
            b"// file: src/Z.rs\n// capital Z sorts before l\n\
              // file: src/lib.rs\n//! zeta\n"
                .to_vec(),
        ),
        (
            "fake-crate-13-0.1.0",
            Split::Valid,
            b"// file: src/main.rs\nfn main() { println!(\"valid\"); }\n".to_vec(),
        ),
        (
            "fake-crate-62-2.0.0",
            Split::Test,
            b"// file: src/lib.rs\n// file: tests/t.rs\n#[test]\nfn t() {}\n".to_vec(),
        ),
    ];
    (reg, expected)
}

fn pinned() -> Vec<(String, String)> {
    [
        ("fake-crate-62", "2.0.0"),
        ("zeta", "1.0.0"),
        ("alpha", "0.10.0"),
        ("fake-crate-13", "0.1.0"),
        ("alpha", "0.9.0"),
        ("not-unpacked", "1.0.0"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect()
}

fn fake_manifest(reg: &Path) -> RustCodeManifest {
    let m = RustCodeManifest::scan(&pinned(), &[reg.to_path_buf()], "test").unwrap();
    // through its TOML, as the embedded one is read
    RustCodeManifest::from_toml_str("fake", &m.to_toml()).unwrap()
}

#[test]
fn builder_orders_files_and_documents_and_checks_them() {
    let dir = TempDir::new("rust-code");
    let (reg, expected) = fake_registry(&dir);
    for (name, split, _) in &expected {
        let crate_name = name.rsplit_once('-').unwrap().0;
        assert_eq!(rule(crate_name), *split, "{name}");
    }
    let m = fake_manifest(&reg);
    assert!(m.is_complete());
    // per-document sizes, checksums and file counts as pinned
    let entries = m.crates();
    assert_eq!(entries.len(), 5, "the crate not unpacked is left out");
    for (e, (name, split, text)) in entries.iter().zip(&expected) {
        assert_eq!(e.document_name(), *name);
        assert_eq!(e.split, *split);
        assert_eq!(e.bytes, text.len() as u64);
        assert_eq!(e.sha256, sha(text), "{name}");
    }
    assert_eq!(
        entries.iter().map(|e| e.files).collect::<Vec<_>>(),
        [1, 4, 2, 1, 2]
    );
    assert_eq!((m.documents, m.files), (5, 10));
    let whole: Vec<u8> = expected.iter().flat_map(|e| e.2.clone()).collect();
    assert_eq!(m.sha256, sha(&whole));
    assert_eq!(m.bytes, whole.len() as u64);
    assert_eq!(
        m.crate_names(Split::Train),
        ["alpha-0.9.0", "alpha-0.10.0", "zeta-1.0.0"]
    );
    assert_eq!(m.crate_names(Split::Valid), ["fake-crate-13-0.1.0"]);
    assert_eq!(m.crate_names(Split::Test), ["fake-crate-62-2.0.0"]);

    // build: the documents in order, byte for byte, from the first registry holding each
    let empty = dir.join("empty-registry");
    std::fs::create_dir_all(&empty).unwrap();
    let docs = rust_code::build(&m, &[empty.clone(), reg.clone()]).unwrap();
    let got: Vec<(&str, Split, &[u8])> = docs
        .iter()
        .map(|d| (d.name.as_str(), d.split, d.text.as_slice()))
        .collect();
    let want: Vec<(&str, Split, &[u8])> = expected
        .iter()
        .map(|(n, s, t)| (*n, *s, t.as_slice()))
        .collect();
    assert_eq!(got, want);
    assert!(docs.iter().all(|d| !d.text.contains(&0)));

    // select: a subset, in document order
    let sub = m.select(&["zeta", "fake-crate-62"]).unwrap();
    assert!(!sub.is_complete());
    assert_eq!(
        sub.crates()
            .iter()
            .map(|c| c.document_name())
            .collect::<Vec<_>>(),
        ["zeta-1.0.0", "fake-crate-62-2.0.0"]
    );
    assert_eq!(
        sub.bytes,
        (expected[2].2.len() + expected[4].2.len()) as u64
    );
    let err = m.select(&["zeta", "serde"]).unwrap_err().to_string();
    assert!(err.contains("serde") && err.contains("not pinned"), "{err}");

    // a crate missing from every registry: named with its version and `cargo fetch`
    let err = rust_code::build(&m, std::slice::from_ref(&empty)).unwrap_err();
    assert!(matches!(err, DataError::CrateMissing { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("alpha 0.9.0") && msg.contains("cargo fetch") && msg.contains("Cargo.lock"),
        "{msg}"
    );

    // an edited file: the crate's checksum no longer matches
    write(&reg.join("zeta-1.0.0"), "src/lib.rs", b"//! Zeta\n");
    let err = rust_code::build(&m, std::slice::from_ref(&reg)).unwrap_err();
    assert!(matches!(
        err,
        DataError::DocumentMismatch {
            field: "sha256",
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("zeta-1.0.0") && msg.contains("sha256"),
        "{msg}"
    );
    // a file added: the size differs
    write(&reg.join("zeta-1.0.0"), "src/lib.rs", b"//! zeta\n");
    write(&reg.join("zeta-1.0.0"), "src/new.rs", b"\n");
    let msg = rust_code::build(&m, &[reg]).unwrap_err().to_string();
    assert!(msg.contains("zeta-1.0.0") && msg.contains("size"), "{msg}");
}

#[test]
fn prepared_corpus_round_trips_and_is_checked() {
    let dir = TempDir::new("rust-code-prepare");
    let (reg, expected) = fake_registry(&dir);
    let m = fake_manifest(&reg);
    let out = dir.join("data/rust-code");
    let summary = rust_code::prepare(&m, std::slice::from_ref(&reg), &out).unwrap();
    assert!(summary.verified);
    let whole: Vec<u8> = expected.iter().flat_map(|e| e.2.clone()).collect();
    assert_eq!(summary.sha256, sha(&whole));
    assert_eq!(summary.files, 10);
    for (s, split) in summary.splits.iter().zip(Split::ALL) {
        let want: Vec<&Expected> = expected.iter().filter(|e| e.1 == split).collect();
        assert_eq!(s.split, split);
        assert_eq!(s.docs, want.len());
        assert_eq!(s.bytes, want.iter().map(|e| e.2.len() as u64).sum::<u64>());
        let docs = rust_code::load_split(&out, split).unwrap();
        let got: Vec<(&str, Split, &[u8])> = docs
            .iter()
            .map(|d| (d.name.as_str(), d.split, d.text.as_slice()))
            .collect();
        let want: Vec<(&str, Split, &[u8])> = want
            .iter()
            .map(|(n, s, t)| (*n, *s, t.as_slice()))
            .collect();
        assert_eq!(got, want, "{split}");
    }

    // a selection is written without the whole-corpus check
    let sub_dir = dir.join("sub");
    let sub = rust_code::prepare(&m.select(&["zeta"]).unwrap(), &[reg], &sub_dir).unwrap();
    assert!(!sub.verified);
    assert_eq!(
        rust_code::load_split(&sub_dir, Split::Valid).unwrap(),
        Vec::new()
    );

    // a damaged split file, then a missing index: errors naming the file and the command
    let train = split_file(&out, Split::Train);
    let mut bytes = std::fs::read(&train).unwrap();
    bytes[3] ^= 1;
    std::fs::write(&train, &bytes).unwrap();
    let msg = rust_code::load_split(&out, Split::Train)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("train.txt")
            && msg.contains("alpha-0.9.0")
            && msg.contains("memzoo data prepare rust-code"),
        "{msg}"
    );
    std::fs::write(&train, &bytes[1..]).unwrap();
    let msg = rust_code::load_split(&out, Split::Train)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("damaged") && msg.contains("bytes"), "{msg}");
    std::fs::remove_file(out.join(rust_code::INDEX_FILE)).unwrap();
    let err = rust_code::load_split(&out, Split::Valid).unwrap_err();
    assert!(matches!(err, DataError::NotPrepared { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("index.json") && msg.contains("memzoo data prepare rust-code"),
        "{msg}"
    );
}

#[test]
fn bad_manifests_are_explained() {
    let dir = TempDir::new("rust-code-bad");
    let (reg, _) = fake_registry(&dir);
    let good = fake_manifest(&reg).to_toml();
    let zeta =
        sha(b"// file: src/Z.rs\n// capital Z sorts before l\n// file: src/lib.rs\n//! zeta\n");
    for (from, to, needle) in [
        ("name = \"rust-code\"", "name = \"rust\"", "rust"),
        ("split = \"valid\"", "split = \"train\"", "the rule"),
        (zeta.as_str(), "ABC", "ABC"),
        ("documents = 5", "documents = 6", "documents is 6"),
        ("files = 10", "files = 11", "files is 11"),
        (
            "version = \"0.9.0\"",
            "version = \"0.11.0\"",
            "document order",
        ),
    ] {
        let text = good.replacen(from, to, 1);
        assert_ne!(text, good, "{from}");
        let msg = RustCodeManifest::from_toml_str("bad.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("bad.toml") && msg.contains(needle),
            "{from}: {msg}"
        );
    }
}

/// The (name, version) of every registry package of the workspace's Cargo.lock.
fn lockfile_registry_packages() -> Vec<(String, String)> {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    let lock: toml::Table = toml::from_str(&std::fs::read_to_string(lock).unwrap()).unwrap();
    lock["package"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p.get("source")
                .and_then(|s| s.as_str())
                .is_some_and(|s| s.starts_with("registry+"))
        })
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["version"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The embedded manifest parses, and every crate it pins is a registry package of the
/// workspace's Cargo.lock at that version.
#[test]
fn embedded_manifest_pins_crates_of_the_lockfile() {
    let m = RustCodeManifest::embedded().unwrap();
    assert!(m.is_complete());
    assert!(m.documents > 100, "{} documents", m.documents);
    for split in Split::ALL {
        assert!(!m.crate_names(split).is_empty(), "{split}");
    }
    let registry: std::collections::HashSet<(String, String)> =
        lockfile_registry_packages().into_iter().collect();
    for c in m.crates() {
        assert!(
            registry.contains(&(c.name.clone(), c.version.clone())),
            "{} is not a registry package of Cargo.lock",
            c.document_name()
        );
        assert_eq!(c.split, rule(&c.name), "{}", c.name);
    }
}

/// Regenerates `datasets/rust-code.toml` from this machine's cargo registry sources and the
/// workspace's Cargo.lock (every registry package of the lockfile that is unpacked):
/// `MEMZOO_WRITE_RUST_CODE=1 cargo test -p memzoo-data rust_code::regenerate -- --ignored`.
#[test]
#[ignore = "writes datasets/rust-code.toml"]
fn regenerate() {
    if std::env::var_os("MEMZOO_WRITE_RUST_CODE").is_none() {
        eprintln!("set MEMZOO_WRITE_RUST_CODE=1 to write datasets/rust-code.toml");
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pinned = lockfile_registry_packages();
    let notes = std::env::var("MEMZOO_RUST_CODE_NOTES").unwrap_or_default();
    let m = RustCodeManifest::scan(&pinned, &rust_code::registry_src_dirs(), &notes).unwrap();
    std::fs::write(root.join("datasets/rust-code.toml"), m.to_toml()).unwrap();
    eprintln!(
        "{} of {} registry packages pinned: {} files, {} bytes",
        m.documents,
        pinned.len(),
        m.files,
        m.bytes
    );
}

//! `rust-code`: a long-document corpus of real Rust code that every machine building memzoo
//! already has: the `.rs` sources of the registry crates pinned in memzoo's own `Cargo.lock`,
//! as cargo unpacks them under `$CARGO_HOME/registry/src/<index>/NAME-VERSION/`.
//!
//! A crate is **one document**: its `.rs` files (every regular file whose name ends in `.rs`,
//! anywhere under the crate's directory; symbolic links are not followed) sorted bytewise by
//! their path relative to the crate's directory (`/`-separated), each written as
//!
//! ```text
//! // file: src/lib.rs
//! <the file's bytes>
//! ```
//!
//! that is a header line `// file: <relative path>\n`, then the file's bytes, then `\n` when
//! the file does not end with one. So an identifier defined in `src/lib.rs` recurs in
//! `src/de/mod.rs` thousands of bytes later, beyond any context window. Two rules keep the
//! bytes usable as byte-level tokens: a file containing a NUL byte is skipped (byte 0 stays
//! free for the padding id of [`DocBatcher`](crate::DocBatcher)), and so is a file whose path
//! is not UTF-8.
//!
//! The manifest `datasets/rust-code.toml` (embedded, [`RustCodeManifest::embedded`]) pins
//! each crate's version, split, file count, byte size and SHA-256 of its document, and the
//! SHA-256 of the whole corpus (every document concatenated in document order). A crate's
//! split is a function of its name alone ([`split_of`]), so every version of a crate lands in
//! the same split. Document order: train, valid, test; within a split by name then version.
//!
//! [`build`] reads and verifies the documents; [`prepare`] writes them under a directory
//! (`memzoo data prepare rust-code`: `data/rust-code/`), one file per split plus an index,
//! which [`load_split`] reads back.

use std::cmp::Ordering;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{DataError, Split};

/// The data set's name (`memzoo data prepare rust-code`, `[data] source = "rust-code"`).
pub const NAME: &str = "rust-code";

/// The header line written before each file of a document (followed by its relative path).
pub const FILE_HEADER: &str = "// file: ";

/// Name of the index of a prepared corpus.
pub const INDEX_FILE: &str = "index.json";

/// The embedded manifest text.
const EMBEDDED: &str = include_str!("../../../datasets/rust-code.toml");

/// One crate as one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeDocument {
    /// `NAME-VERSION`, e.g. `serde-1.0.228` (the crate's directory in cargo's registry).
    pub name: String,
    /// The split the manifest assigns it.
    pub split: Split,
    /// The document's bytes (see the [module docs](self) for the layout); never contains 0.
    pub text: Vec<u8>,
}

/// One pinned crate of the manifest (a `[[crate]]` table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrateEntry {
    /// Crate name.
    pub name: String,
    /// Exact version, as in `Cargo.lock`.
    pub version: String,
    /// Its split ([`split_of`] of the name).
    pub split: Split,
    /// Number of `.rs` files in its document.
    pub files: u64,
    /// Size of its document in bytes.
    pub bytes: u64,
    /// Lower-case hex SHA-256 of its document.
    pub sha256: String,
}

impl CrateEntry {
    /// `NAME-VERSION`: the document's name and the crate's directory in cargo's registry.
    pub fn document_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

/// `datasets/rust-code.toml`, parsed and checked: the pinned crates in document order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RustCodeManifest {
    /// Always `rust-code`.
    pub name: String,
    /// One line about the data.
    pub description: String,
    /// The rules (document layout, split assignment, order) and where the list comes from.
    pub notes: String,
    /// Number of documents (crates) of the whole corpus.
    pub documents: u64,
    /// Number of `.rs` files of the whole corpus.
    pub files: u64,
    /// Bytes of the whole corpus.
    pub bytes: u64,
    /// SHA-256 of the whole corpus: every document concatenated in document order.
    pub sha256: String,
    /// The crates, in document order.
    #[serde(rename = "crate")]
    crates: Vec<CrateEntry>,
    /// Whether `crates` is the whole list (not a [`RustCodeManifest::select`]ion): only then
    /// does the whole-corpus checksum apply.
    #[serde(skip)]
    complete: bool,
}

/// The split of a crate, by the rule written in the manifest's notes: the first 8 bytes of
/// the SHA-256 of the crate's name, as a big-endian integer, modulo 100: below 90 train, below
/// 95 valid, else test (about 90 / 5 / 5 by crate).
pub fn split_of(crate_name: &str) -> Split {
    let h = Sha256::digest(crate_name.as_bytes());
    let n = u64::from_be_bytes(h[..8].try_into().expect("8 bytes")) % 100;
    match n {
        0..90 => Split::Train,
        90..95 => Split::Valid,
        _ => Split::Test,
    }
}

/// Lower-case hex SHA-256 of `bytes`.
fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn split_rank(split: Split) -> usize {
    Split::ALL.iter().position(|&s| s == split).unwrap_or(0)
}

/// Versions compared field by field (`0.9.1 < 0.10.0`): the dot-separated numbers of the part
/// before any `-` or `+`, numerically, then the whole string bytewise.
fn cmp_versions(a: &str, b: &str) -> Ordering {
    let key = |v: &str| -> Vec<u64> {
        v.split(['-', '+'])
            .next()
            .unwrap_or("")
            .split('.')
            .map(|p| p.parse().unwrap_or(u64::MAX))
            .collect()
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

/// Document order: split (train, valid, test), then name bytewise, then version.
fn cmp_document_order(a: &CrateEntry, b: &CrateEntry) -> Ordering {
    split_rank(a.split)
        .cmp(&split_rank(b.split))
        .then_with(|| a.name.cmp(&b.name))
        .then_with(|| cmp_versions(&a.version, &b.version))
}

fn is_sha256_hex(h: &str) -> bool {
    h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl RustCodeManifest {
    /// The manifest compiled into the crate (`datasets/rust-code.toml`).
    pub fn embedded() -> Result<Self, DataError> {
        Self::from_toml_str("datasets/rust-code.toml", EMBEDDED)
    }

    /// Parses and checks a manifest; `origin` names it in errors. Checks: the name, every
    /// checksum's format, each crate's split against [`split_of`], the document order, no
    /// crate twice, and that the totals are the sums of the crates.
    pub fn from_toml_str(origin: &str, text: &str) -> Result<Self, DataError> {
        let bad = |message: String| DataError::Manifest {
            name: origin.to_string(),
            message,
        };
        let mut m: RustCodeManifest = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if m.name != NAME {
            return Err(bad(format!("name is {:?}, expected {NAME:?}", m.name)));
        }
        if !is_sha256_hex(&m.sha256) {
            return Err(bad(format!(
                "sha256 {:?} must be 64 lower-case hex digits",
                m.sha256
            )));
        }
        for c in &m.crates {
            let doc = c.document_name();
            if !is_sha256_hex(&c.sha256) {
                return Err(bad(format!(
                    "crate {doc}: sha256 {:?} must be 64 lower-case hex digits",
                    c.sha256
                )));
            }
            if c.split != split_of(&c.name) {
                return Err(bad(format!(
                    "crate {doc}: split is {}, the rule (sha256 of the name) gives {}",
                    c.split,
                    split_of(&c.name)
                )));
            }
        }
        for w in m.crates.windows(2) {
            if cmp_document_order(&w[0], &w[1]) != Ordering::Less {
                return Err(bad(format!(
                    "crate {} ({}) is listed after {} ({}): crates must be in document order \
                     (train, valid, test; by name, then version) and listed once",
                    w[1].document_name(),
                    w[1].split,
                    w[0].document_name(),
                    w[0].split
                )));
            }
        }
        let (docs, files, bytes) = m.totals();
        for (field, stated, sum) in [
            ("documents", m.documents, docs),
            ("files", m.files, files),
            ("bytes", m.bytes, bytes),
        ] {
            if stated != sum {
                return Err(bad(format!(
                    "{field} is {stated}, but the crates listed sum to {sum}"
                )));
            }
        }
        m.complete = true;
        Ok(m)
    }

    /// The manifest as TOML (what `datasets/rust-code.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// `(documents, files, bytes)` of the crates listed.
    fn totals(&self) -> (u64, u64, u64) {
        (
            self.crates.len() as u64,
            self.crates.iter().map(|c| c.files).sum(),
            self.crates.iter().map(|c| c.bytes).sum(),
        )
    }

    /// The pinned crates, in document order.
    pub fn crates(&self) -> &[CrateEntry] {
        &self.crates
    }

    /// Whether this is the whole corpus (not a [`select`](Self::select)ion of it).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The same manifest restricted to the crates `names` (every version of each; in document
    /// order whatever the order of `names`). The totals are those of the selection; the whole
    /// corpus checksum is kept but no longer checked ([`is_complete`](Self::is_complete) is
    /// false unless every crate is selected).
    ///
    /// Errors naming the first name that is not a pinned crate.
    pub fn select(&self, names: &[&str]) -> Result<Self, DataError> {
        if let Some(unknown) = names
            .iter()
            .find(|n| !self.crates.iter().any(|c| c.name == **n))
        {
            return Err(DataError::invalid(
                "crate",
                unknown,
                format!(
                    "is not pinned by the rust-code manifest ({} crates, e.g. {})",
                    self.crates.len(),
                    self.crates
                        .iter()
                        .take(5)
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let mut out = self.clone();
        out.crates.retain(|c| names.contains(&c.name.as_str()));
        out.complete = self.complete && out.crates.len() == self.crates.len();
        (out.documents, out.files, out.bytes) = out.totals();
        Ok(out)
    }

    /// The document names (`NAME-VERSION`) of one split, in document order.
    pub fn crate_names(&self, split: Split) -> Vec<String> {
        self.crates
            .iter()
            .filter(|c| c.split == split)
            .map(CrateEntry::document_name)
            .collect()
    }

    /// A manifest pinning `crates` (name, version) as found in `registries`, each read as
    /// [`build`] reads it: what `datasets/rust-code.toml` is generated from. Crates found in
    /// no registry directory are left out (a crate that the build does not unpack, e.g. one for
    /// another platform).
    pub fn scan(
        crates: &[(String, String)],
        registries: &[PathBuf],
        notes: &str,
    ) -> Result<Self, DataError> {
        let mut found: Vec<(CrateEntry, Vec<u8>)> = Vec::new();
        for (name, version) in crates {
            let Some(dir) = find_crate(registries, name, version) else {
                continue;
            };
            let doc = read_document(&dir)?;
            let entry = CrateEntry {
                name: name.clone(),
                version: version.clone(),
                split: split_of(name),
                files: doc.files as u64,
                bytes: doc.text.len() as u64,
                sha256: sha256_hex(&doc.text),
            };
            found.push((entry, doc.text));
        }
        found.sort_by(|a, b| cmp_document_order(&a.0, &b.0));
        found.dedup_by(|a, b| a.0.name == b.0.name && a.0.version == b.0.version);
        let mut whole = Sha256::new();
        for (_, text) in &found {
            whole.update(text);
        }
        let entries: Vec<CrateEntry> = found.into_iter().map(|(e, _)| e).collect();
        let mut m = RustCodeManifest {
            name: NAME.into(),
            description: "The .rs sources of the registry crates pinned in memzoo's Cargo.lock, \
                          one document per crate"
                .into(),
            notes: notes.to_string(),
            documents: 0,
            files: 0,
            bytes: 0,
            sha256: hex(&whole.finalize()),
            crates: entries,
            complete: true,
        };
        (m.documents, m.files, m.bytes) = m.totals();
        Ok(m)
    }
}

/// Every `$CARGO_HOME/registry/src/*` directory (`CARGO_HOME` defaults to `~/.cargo`), sorted;
/// empty when there is none.
pub fn registry_src_dirs() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .or_else(|| std::env::var_os("USERPROFILE"))
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".cargo"))
        });
    let Some(home) = home else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(home.join("registry").join("src")) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The first `registries` directory holding `NAME-VERSION/`.
fn find_crate(registries: &[PathBuf], name: &str, version: &str) -> Option<PathBuf> {
    registries
        .iter()
        .map(|r| r.join(format!("{name}-{version}")))
        .find(|d| d.is_dir())
}

/// A crate's document and how many files it holds.
struct ReadDocument {
    text: Vec<u8>,
    files: usize,
}

/// Every regular `.rs` file under `dir` (symbolic links not followed), as `(path relative to
/// dir with / separators, full path)`; paths that are not UTF-8 are left out.
fn rs_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, DataError> {
    let mut out = Vec::new();
    let mut pending = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, d)) = pending.pop() {
        let entries = fs::read_dir(&d).map_err(|e| DataError::io("cannot list", &d, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| DataError::io("cannot list", &d, e))?;
            let path = entry.path();
            let ty = entry
                .file_type()
                .map_err(|e| DataError::io("cannot stat", &path, e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let rel = format!("{prefix}{name}");
            if ty.is_dir() {
                pending.push((format!("{rel}/"), path));
            } else if ty.is_file() && name.ends_with(".rs") {
                out.push((rel, path));
            }
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// The document of the crate unpacked at `dir` (layout in the [module docs](self)).
fn read_document(dir: &Path) -> Result<ReadDocument, DataError> {
    let mut text = Vec::new();
    let mut files = 0;
    for (rel, path) in rs_files(dir)? {
        let bytes = fs::read(&path).map_err(|e| DataError::io("cannot read", &path, e))?;
        if bytes.contains(&0) {
            continue;
        }
        text.extend_from_slice(FILE_HEADER.as_bytes());
        text.extend_from_slice(rel.as_bytes());
        text.push(b'\n');
        text.extend_from_slice(&bytes);
        if bytes.last().is_some_and(|&b| b != b'\n') {
            text.push(b'\n');
        }
        files += 1;
    }
    Ok(ReadDocument { text, files })
}

/// Reads each crate of `manifest` from the first of `registries` that has its
/// `NAME-VERSION/` directory, in document order, verifying each document's size and SHA-256.
///
/// Errors: a crate in none of them ([`DataError::CrateMissing`], naming it and `cargo
/// fetch`); a document whose size or checksum differs ([`DataError::DocumentMismatch`],
/// naming the crate and its directory).
pub fn build(
    manifest: &RustCodeManifest,
    registries: &[PathBuf],
) -> Result<Vec<CodeDocument>, DataError> {
    manifest
        .crates
        .iter()
        .map(|c| {
            let dir = find_crate(registries, &c.name, &c.version).ok_or_else(|| {
                DataError::CrateMissing {
                    name: c.name.clone(),
                    version: c.version.clone(),
                    searched: registries.to_vec(),
                }
            })?;
            let doc = read_document(&dir)?;
            let what = || format!("crate {} in {}", c.document_name(), dir.display());
            if doc.text.len() as u64 != c.bytes {
                return Err(DataError::DocumentMismatch {
                    what: what(),
                    field: "size",
                    expected: format!("{} bytes", c.bytes),
                    actual: format!("{} bytes", doc.text.len()),
                });
            }
            let sha = sha256_hex(&doc.text);
            if sha != c.sha256 {
                return Err(DataError::DocumentMismatch {
                    what: what(),
                    field: "sha256",
                    expected: c.sha256.clone(),
                    actual: sha,
                });
            }
            Ok(CodeDocument {
                name: c.document_name(),
                split: c.split,
                text: doc.text,
            })
        })
        .collect()
}

/// Documents and bytes of one split of a prepared corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitSummary {
    /// The split.
    pub split: Split,
    /// Number of documents.
    pub docs: usize,
    /// Bytes of its documents.
    pub bytes: u64,
}

/// What [`prepare`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedSummary {
    /// The directory written.
    pub dir: PathBuf,
    /// Train, valid and test.
    pub splits: Vec<SplitSummary>,
    /// `.rs` files in all documents.
    pub files: u64,
    /// SHA-256 of every document concatenated in document order.
    pub sha256: String,
    /// Whether that checksum was verified against the manifest (a complete one).
    pub verified: bool,
}

/// One document in the index of a prepared corpus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct IndexEntry {
    name: String,
    split: Split,
    /// Byte offset in its split's file.
    offset: u64,
    bytes: u64,
    sha256: String,
}

/// `index.json` of a prepared corpus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Index {
    name: String,
    sha256: String,
    documents: Vec<IndexEntry>,
}

/// The file of one split in a prepared directory (`train.txt`, ...).
pub fn split_file(dir: &Path, split: Split) -> PathBuf {
    dir.join(format!("{}.txt", split.as_str()))
}

/// Writes `bytes` to `path` through a `.tmp` file renamed into place.
fn write_atomic(path: &Path, parts: &[&[u8]]) -> Result<(), DataError> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(|e| DataError::io("cannot create", &tmp, e))?;
    for p in parts {
        f.write_all(p)
            .map_err(|e| DataError::io("cannot write", &tmp, e))?;
    }
    f.sync_all()
        .map_err(|e| DataError::io("cannot write", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| DataError::io("cannot rename into place", path, e))
}

/// [`build`], then writes the corpus under `out_dir` (created if needed): `train.txt`,
/// `valid.txt`, `test.txt` (each split's documents concatenated in document order) and
/// `index.json` (every document's name, split, byte offset in its split's file, size and
/// SHA-256), written last so that a stopped run leaves no index. With a complete manifest the
/// SHA-256 of all documents concatenated is checked against the manifest's.
pub fn prepare(
    manifest: &RustCodeManifest,
    registries: &[PathBuf],
    out_dir: &Path,
) -> Result<PreparedSummary, DataError> {
    let docs = build(manifest, registries)?;
    let mut whole = Sha256::new();
    for d in &docs {
        whole.update(&d.text);
    }
    let sha256 = hex(&whole.finalize());
    let verified = manifest.complete;
    if verified && sha256 != manifest.sha256 {
        return Err(DataError::DocumentMismatch {
            what: "the whole corpus (every document concatenated)".into(),
            field: "sha256",
            expected: manifest.sha256.clone(),
            actual: sha256,
        });
    }
    fs::create_dir_all(out_dir).map_err(|e| DataError::io("cannot create", out_dir, e))?;
    let index_path = out_dir.join(INDEX_FILE);
    match fs::remove_file(&index_path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(DataError::io("cannot remove", &index_path, e));
        }
        _ => {}
    }
    let mut index = Index {
        name: NAME.into(),
        sha256: sha256.clone(),
        documents: Vec::new(),
    };
    let mut splits = Vec::new();
    for split in Split::ALL {
        let parts: Vec<&CodeDocument> = docs.iter().filter(|d| d.split == split).collect();
        let mut offset = 0u64;
        for d in &parts {
            index.documents.push(IndexEntry {
                name: d.name.clone(),
                split,
                offset,
                bytes: d.text.len() as u64,
                sha256: sha256_hex(&d.text),
            });
            offset += d.text.len() as u64;
        }
        let texts: Vec<&[u8]> = parts.iter().map(|d| d.text.as_slice()).collect();
        write_atomic(&split_file(out_dir, split), &texts)?;
        splits.push(SplitSummary {
            split,
            docs: parts.len(),
            bytes: offset,
        });
    }
    let json = serde_json::to_vec_pretty(&index).expect("serialisable");
    write_atomic(&index_path, &[&json])?;
    Ok(PreparedSummary {
        dir: out_dir.to_path_buf(),
        splits,
        files: manifest.crates.iter().map(|c| c.files).sum(),
        sha256,
        verified,
    })
}

/// The documents of one split of a corpus [`prepare`] wrote in `dir`, each checked against
/// the index (offset, size, SHA-256).
///
/// Errors ([`DataError::NotPrepared`], naming the file and `memzoo data prepare rust-code`)
/// when the index or the split's file is missing or does not match.
pub fn load_split(dir: &Path, split: Split) -> Result<Vec<CodeDocument>, DataError> {
    let index_path = dir.join(INDEX_FILE);
    let not_prepared = |path: &Path, reason: String| DataError::NotPrepared {
        name: NAME,
        path: path.to_path_buf(),
        reason,
    };
    let read = |path: &Path| {
        fs::read(path).map_err(|e| {
            let reason = if e.kind() == std::io::ErrorKind::NotFound {
                "does not exist".to_string()
            } else {
                format!("cannot be read: {e}")
            };
            not_prepared(path, reason)
        })
    };
    let index: Index = serde_json::from_slice(&read(&index_path)?)
        .map_err(|e| not_prepared(&index_path, format!("is damaged: {e}")))?;
    if index.name != NAME {
        return Err(not_prepared(
            &index_path,
            format!("is the index of {:?}, not {NAME}", index.name),
        ));
    }
    let path = split_file(dir, split);
    let bytes = read(&path)?;
    let entries: Vec<&IndexEntry> = index
        .documents
        .iter()
        .filter(|d| d.split == split)
        .collect();
    let total: u64 = entries.iter().map(|d| d.bytes).sum();
    if total != bytes.len() as u64 {
        return Err(not_prepared(
            &path,
            format!("is damaged: {} bytes, its index lists {total}", bytes.len()),
        ));
    }
    let mut docs = Vec::with_capacity(entries.len());
    for d in entries {
        let text = usize::try_from(d.offset)
            .ok()
            .zip(usize::try_from(d.offset + d.bytes).ok())
            .and_then(|(a, b)| bytes.get(a..b))
            .ok_or_else(|| {
                not_prepared(
                    &path,
                    format!(
                        "is damaged: document {} at {}..{} is out of range",
                        d.name,
                        d.offset,
                        d.offset + d.bytes
                    ),
                )
            })?;
        let sha = sha256_hex(text);
        if sha != d.sha256 {
            return Err(not_prepared(
                &path,
                format!(
                    "is damaged: document {} has sha256 {sha}, its index says {}",
                    d.name, d.sha256
                ),
            ));
        }
        docs.push(CodeDocument {
            name: d.name.clone(),
            split,
            text: text.to_vec(),
        });
    }
    Ok(docs)
}

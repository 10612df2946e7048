//! Data set manifests: where a known data set lives, how big it is, its checksum and how
//! to split it. One TOML file per data set under `datasets/`, embedded in the binary.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Corpus, DataError, SplitRule};

/// How a downloaded file is verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// Size and sha256 must both match the manifest.
    Sha256,
    /// No published checksum is known: only the size is checked, and the computed sha256 is
    /// printed (and returned) so that it can be recorded.
    SizeOnly,
}

/// A known data set.
///
/// ```toml
/// name = "enwik8"
/// description = "First 10^8 bytes of an English Wikipedia XML dump (Hutter Prize)"
/// url = "http://mattmahoney.net/dc/enwik8.zip"
/// file = "enwik8.zip"
/// size = 36445475
/// check = "sha256"
/// sha256 = "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc"
/// member = "enwik8"
///
/// [split]
/// rule = "tail_bytes"
/// valid = 5000000
/// test = 5000000
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Short name (`memzoo data fetch NAME`), equal to the file stem of the manifest.
    pub name: String,
    /// One line about the data.
    pub description: String,
    /// Canonical download URL (http or https).
    pub url: String,
    /// File name of the download in the data directory.
    pub file: String,
    /// Size of the download in bytes.
    pub size: u64,
    /// How the download is verified.
    pub check: Check,
    /// Lower-case hex sha256 of the download; required with `check = "sha256"`, absent with
    /// `check = "size-only"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Archive member that holds the text, for a zip holding several files (or to be
    /// explicit about a single one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// Where the numbers come from, licence, caveats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// How the text is split into train / valid / test.
    pub split: SplitRule,
}

/// The manifests compiled into the crate, `(name, TOML text)`.
const EMBEDDED: &[(&str, &str)] = &[
    ("enwik8", include_str!("../../../datasets/enwik8.toml")),
    ("text8", include_str!("../../../datasets/text8.toml")),
    (
        "wikitext-103-raw",
        include_str!("../../../datasets/wikitext-103-raw.toml"),
    ),
    (
        "pg19-sample",
        include_str!("../../../datasets/pg19-sample.toml"),
    ),
    (
        "tiny-shakespeare",
        include_str!("../../../datasets/tiny-shakespeare.toml"),
    ),
];

impl Manifest {
    /// Names of the embedded manifests.
    pub fn known() -> Vec<&'static str> {
        EMBEDDED.iter().map(|(n, _)| *n).collect()
    }

    /// All embedded manifests, parsed.
    pub fn all() -> Result<Vec<Manifest>, DataError> {
        EMBEDDED.iter().map(|(n, _)| Self::load(n)).collect()
    }

    /// The embedded manifest `datasets/<name>.toml`. Case and `_` / `-` do not matter
    /// (`tiny_shakespeare` finds `tiny-shakespeare`).
    pub fn load(name: &str) -> Result<Manifest, DataError> {
        let wanted = name.trim().to_ascii_lowercase().replace('_', "-");
        let (n, text) = EMBEDDED.iter().find(|(n, _)| *n == wanted).ok_or_else(|| {
            DataError::UnknownDataset {
                name: name.to_string(),
                known: Self::known().iter().map(|s| s.to_string()).collect(),
            }
        })?;
        let m = Self::from_toml_str(n, text)?;
        if m.name != *n {
            return Err(DataError::Manifest {
                name: n.to_string(),
                message: format!("its name field is {:?}, its file is {n}.toml", m.name),
            });
        }
        Ok(m)
    }

    /// A manifest from a TOML file of the user's.
    pub fn load_file(path: &Path) -> Result<Manifest, DataError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| DataError::file("cannot read", path, e))?;
        Self::from_toml_str(&path.display().to_string(), &text)
    }

    /// Parses and validates a manifest; `origin` names it in errors.
    pub fn from_toml_str(origin: &str, text: &str) -> Result<Manifest, DataError> {
        let m: Manifest = toml::from_str(text).map_err(|e| DataError::Manifest {
            name: origin.to_string(),
            message: e.to_string(),
        })?;
        m.validate().map_err(|e| match e {
            DataError::Manifest { message, .. } => DataError::Manifest {
                name: origin.to_string(),
                message,
            },
            other => other,
        })?;
        Ok(m)
    }

    /// Path of the downloaded file in `data_dir` (where [`fetch`](crate::fetch()) puts it).
    pub fn local_path(&self, data_dir: &Path) -> std::path::PathBuf {
        data_dir.join(&self.file)
    }

    /// Reads the downloaded file from `data_dir` and splits it by the manifest's rule
    /// (reading [`Manifest::member`] of an archive).
    pub fn load_corpus(&self, data_dir: &Path) -> Result<Corpus, DataError> {
        Corpus::load(
            &self.local_path(data_dir),
            self.member.as_deref(),
            &self.split,
        )
    }

    /// Checks the fields: URL scheme, plain file name, size, checksum format and `check`
    /// consistency, split rule.
    pub fn validate(&self) -> Result<(), DataError> {
        let bad = |message: String| DataError::Manifest {
            name: self.name.clone(),
            message,
        };
        if self.name.is_empty() {
            return Err(bad("name must not be empty".into()));
        }
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(bad(format!(
                "url {:?} must start with http:// or https://",
                self.url
            )));
        }
        if self.file.is_empty()
            || self.file.contains(['/', '\\'])
            || self.file == "."
            || self.file == ".."
            || self.file.ends_with(".part")
        {
            return Err(bad(format!(
                "file {:?} must be a plain file name (not ending in .part)",
                self.file
            )));
        }
        if self.size == 0 {
            return Err(bad(
                "size must be the download's size in bytes, not 0".into()
            ));
        }
        match (self.check, &self.sha256) {
            (Check::Sha256, None) => {
                return Err(bad(
                    "check = \"sha256\" needs a sha256 field (or check = \"size-only\")".into(),
                ));
            }
            (Check::SizeOnly, Some(_)) => {
                return Err(bad(
                    "check = \"size-only\" must not have a sha256 field".into()
                ));
            }
            (Check::Sha256, Some(h)) => {
                if h.len() != 64
                    || !h
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(bad(format!(
                        "sha256 {h:?} must be 64 lower-case hex digits"
                    )));
                }
            }
            (Check::SizeOnly, None) => {}
        }
        self.split.validate().map_err(|e| bad(e.to_string()))
    }
}

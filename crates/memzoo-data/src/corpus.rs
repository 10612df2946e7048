//! Corpus readers (plain text, `.gz`, `.zip`) and train / valid / test split rules.

use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::DataError;

/// One of the three standard splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training data.
    Train,
    /// Validation data (model selection, early stopping).
    Valid,
    /// Held-out test data.
    Test,
}

impl Split {
    /// All three, in the order train, valid, test.
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    /// `"train"`, `"valid"` or `"test"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = DataError;

    /// Parses `train`, `valid` / `validation` / `dev`, `test` (any case).
    fn from_str(s: &str) -> Result<Self, DataError> {
        match s.to_ascii_lowercase().as_str() {
            "train" => Ok(Split::Train),
            "valid" | "validation" | "val" | "dev" => Ok(Split::Valid),
            "test" => Ok(Split::Test),
            _ => Err(DataError::invalid(
                "split",
                s,
                "expected train, valid or test",
            )),
        }
    }
}

/// Byte ranges `(train, valid, test)` of a file, from [`SplitRule::ranges`].
pub type SplitRanges = (
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
);

/// How one data file (or archive) becomes train / valid / test.
///
/// In a manifest this is the `[split]` table, tagged by `rule`:
///
/// ```toml
/// [split]
/// rule = "tail_bytes"   # enwik8, text8
/// valid = 5000000
/// test = 5000000
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
pub enum SplitRule {
    /// Layout `train | valid | test` by byte counts from the end: the last `test` bytes are
    /// test, the `valid` bytes before them valid, everything before that train.
    /// For the 10^8-byte enwik8 and text8 with 5M / 5M this is the standard first 90M / next
    /// 5M / last 5M split.
    TailBytes {
        /// Bytes of validation data.
        valid: u64,
        /// Bytes of test data.
        test: u64,
    },
    /// Layout `train | test | valid` by fractions of the file: the last `valid` fraction is
    /// validation, the `test` fraction before it test, the rest train.
    /// The generic rule for any text file is `valid = 0.05, test = 0.05`.
    Fractions {
        /// Fraction of the bytes for validation, in `[0, 1)`.
        valid: f64,
        /// Fraction of the bytes for test, in `[0, 1)`.
        test: f64,
    },
    /// Each split is its own member of a `.zip` archive (WikiText-103).
    Members {
        /// Member holding the training data.
        train: String,
        /// Member holding the validation data.
        valid: String,
        /// Member holding the test data.
        test: String,
    },
}

impl Default for SplitRule {
    /// The generic rule, [`SplitRule::generic`].
    fn default() -> Self {
        Self::generic()
    }
}

impl SplitRule {
    /// enwik8 / text8: last 5,000,000 bytes test, the 5,000,000 before valid, the rest train.
    pub fn enwik8() -> Self {
        SplitRule::TailBytes {
            valid: 5_000_000,
            test: 5_000_000,
        }
    }

    /// Generic text: last 5% valid, the 5% before test, the rest train.
    pub fn generic() -> Self {
        SplitRule::Fractions {
            valid: 0.05,
            test: 0.05,
        }
    }

    /// Checks the numbers of the rule (fractions in range, non-empty member names).
    pub fn validate(&self) -> Result<(), DataError> {
        match self {
            SplitRule::TailBytes { .. } => Ok(()),
            SplitRule::Fractions { valid, test } => {
                for (name, v) in [("split.valid", *valid), ("split.test", *test)] {
                    if !(0.0..1.0).contains(&v) {
                        return Err(DataError::invalid(name, v, "a fraction must be in [0, 1)"));
                    }
                }
                if valid + test >= 1.0 {
                    return Err(DataError::invalid(
                        "split.valid + split.test",
                        valid + test,
                        "must be below 1 to leave training data",
                    ));
                }
                Ok(())
            }
            SplitRule::Members { train, valid, test } => {
                for (name, v) in [
                    ("split.train", train),
                    ("split.valid", valid),
                    ("split.test", test),
                ] {
                    if v.is_empty() {
                        return Err(DataError::invalid(
                            name,
                            "\"\"",
                            "archive member name must not be empty",
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// Byte ranges `(train, valid, test)` of a file of `len` bytes.
    ///
    /// Errors for [`SplitRule::Members`] (which splits by member, not by range), when the
    /// file is too short to leave training data, or when a non-zero fraction rounds to no
    /// bytes.
    pub fn ranges(&self, len: usize) -> Result<SplitRanges, DataError> {
        self.validate()?;
        match self {
            SplitRule::TailBytes { valid, test } => {
                let (v, t) = (*valid as usize, *test as usize);
                if v.saturating_add(t) >= len {
                    return Err(DataError::invalid(
                        "split",
                        format!("tail_bytes valid={v} test={t}"),
                        format!(
                            "the data has only {len} bytes, nothing would be left for training"
                        ),
                    ));
                }
                let train_end = len - v - t;
                Ok((0..train_end, train_end..train_end + v, train_end + v..len))
            }
            SplitRule::Fractions { valid, test } => {
                let v = (len as f64 * valid).floor() as usize;
                let t = (len as f64 * test).floor() as usize;
                for (name, frac, n) in [("split.valid", *valid, v), ("split.test", *test, t)] {
                    if frac > 0.0 && n == 0 {
                        return Err(DataError::invalid(
                            name,
                            frac,
                            format!("the data has only {len} bytes, this fraction of it is empty"),
                        ));
                    }
                }
                if v + t >= len {
                    return Err(DataError::invalid(
                        "split",
                        format!("fractions valid={valid} test={test}"),
                        format!(
                            "the data has only {len} bytes, nothing would be left for training"
                        ),
                    ));
                }
                let train_end = len - v - t;
                // train | test | valid
                Ok((0..train_end, train_end + t..len, train_end..train_end + t))
            }
            SplitRule::Members { .. } => Err(DataError::invalid(
                "split.rule",
                "members",
                "splits by archive member; use Corpus::load on the archive",
            )),
        }
    }
}

/// The kind of a data file, recognised by its first bytes (not by its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// Anything that is not gzip or zip.
    Plain,
    /// gzip (`1f 8b`).
    Gzip,
    /// zip (`PK\x03\x04`, or `PK\x05\x06` for an empty archive).
    Zip,
}

/// Recognises `path` as plain, gzip or zip by its magic bytes.
pub fn file_kind(path: &Path) -> Result<FileKind, DataError> {
    let mut f = open(path)?;
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < 4 {
        match f.read(&mut magic[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DataError::io("cannot read", path, e)),
        }
    }
    Ok(if n >= 2 && magic[..2] == [0x1f, 0x8b] {
        FileKind::Gzip
    } else if n == 4 && (magic == *b"PK\x03\x04" || magic == *b"PK\x05\x06") {
        FileKind::Zip
    } else {
        FileKind::Plain
    })
}

fn open(path: &Path) -> Result<File, DataError> {
    File::open(path).map_err(|e| DataError::file("cannot open", path, e))
}

/// This machine's memory in bytes (`MemTotal` of /proc/meminfo), where it can be read.
pub fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The most bytes [`read_bytes`] reads from a data file (decompressed): a quarter of this
/// machine's memory (the bytes, their ids and the batcher's copies live in it at once), 16 GiB
/// where the machine's memory cannot be read.
pub fn max_data_bytes() -> u64 {
    machine_memory().map_or(16 << 30, |m| m / 4)
}

/// `path` must be a regular file (following links): a FIFO would block forever and a device
/// such as `/dev/zero` never ends. Returns its size.
pub fn regular_file(path: &Path) -> Result<u64, DataError> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::file("cannot read", path, e))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            if t.is_fifo() {
                "a FIFO"
            } else if t.is_char_device() {
                "a character device"
            } else if t.is_block_device() {
                "a block device"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a file"
            }
        }
        #[cfg(not(unix))]
        {
            "not a file"
        }
    };
    Err(DataError::NotRegular {
        path: path.to_path_buf(),
        kind,
    })
}

/// Reads at most `limit` bytes from `reader`; more is [`DataError::TooLarge`] for `path`.
fn read_limited(
    reader: impl Read,
    path: &Path,
    limit: u64,
    what: &'static str,
    on_error: impl Fn(std::io::Error) -> DataError,
) -> Result<Vec<u8>, DataError> {
    let mut out = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(on_error)?;
    if out.len() as u64 > limit {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            what,
            limit,
            why: String::new(),
        });
    }
    Ok(out)
}

/// Reads a small text file (a config) of at most `limit` bytes: a regular file (not a FIFO or
/// a device), its size checked before and while it is read.
pub fn read_text_bounded(path: &Path, limit: u64) -> Result<String, DataError> {
    let len = regular_file(path)?;
    if len > limit {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            what: "holds",
            limit,
            why: ": a config file is small".into(),
        });
    }
    let bytes = read_limited(open(path)?, path, limit, "holds", |e| {
        DataError::io("cannot read", path, e)
    })?;
    String::from_utf8(bytes).map_err(|e| {
        DataError::io(
            "cannot read",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

/// Reads the bytes of a data file: plain text as is, `.gz` decompressed, `.zip` the single
/// file member (or `member` when given; required when the archive holds several files), at
/// most [`max_data_bytes`] of them ([`read_bytes_bounded`]).
///
/// Errors name the file: missing ([`DataError::NotFound`]), empty ([`DataError::Empty`]),
/// a corrupt archive or a missing / ambiguous member ([`DataError::Archive`]), not a regular
/// file ([`DataError::NotRegular`]), too large ([`DataError::TooLarge`]).
pub fn read_bytes(path: &Path, member: Option<&str>) -> Result<Vec<u8>, DataError> {
    read_bytes_bounded(path, member, max_data_bytes())
}

/// [`read_bytes`] reading at most `limit` bytes (decompressed: a gzip or zip bomb stops at the
/// limit, an error naming it). `path` must be a regular file.
pub fn read_bytes_bounded(
    path: &Path,
    member: Option<&str>,
    limit: u64,
) -> Result<Vec<u8>, DataError> {
    let too_large = |what: &'static str| DataError::TooLarge {
        path: path.to_path_buf(),
        what,
        limit,
        why: ": a quarter of this machine's memory".into(),
    };
    let len = regular_file(path)?;
    let kind = file_kind(path)?;
    if member.is_some() && kind != FileKind::Zip {
        return Err(DataError::Archive {
            path: path.to_path_buf(),
            message: format!(
                "member {:?} asked for, but the file is not a zip archive",
                member.unwrap_or_default()
            ),
        });
    }
    let data = match kind {
        FileKind::Plain => {
            if len > limit {
                return Err(too_large("holds"));
            }
            read_limited(open(path)?, path, limit, "holds", |e| {
                DataError::io("cannot read", path, e)
            })
            .map_err(|e| match e {
                DataError::TooLarge { .. } => too_large("holds"),
                e => e,
            })?
        }
        FileKind::Gzip => read_limited(
            flate2::read::MultiGzDecoder::new(BufReader::new(open(path)?)),
            path,
            limit,
            "decompresses to",
            |e| DataError::Archive {
                path: path.to_path_buf(),
                message: format!("bad gzip data: {e}"),
            },
        )
        .map_err(|e| match e {
            DataError::TooLarge { .. } => too_large("decompresses to"),
            e => e,
        })?,
        FileKind::Zip => read_zip_member(path, member, limit).map_err(|e| match e {
            DataError::TooLarge { .. } => too_large("decompresses to"),
            e => e,
        })?,
    };
    if data.is_empty() {
        let shown = match member {
            Some(m) => PathBuf::from(format!("{}:{m}", path.display())),
            None => path.to_path_buf(),
        };
        return Err(DataError::Empty { path: shown });
    }
    Ok(data)
}

/// Names of the file members (not directories) of a zip archive, in archive order.
pub fn zip_members(path: &Path) -> Result<Vec<String>, DataError> {
    let archive = open_zip(path)?;
    let mut names = Vec::new();
    for name in archive.file_names() {
        let name = name.map_err(|e| DataError::Archive {
            path: path.to_path_buf(),
            message: format!("bad member name: {e}"),
        })?;
        if !name.ends_with('/') {
            names.push(name.into_owned());
        }
    }
    Ok(names)
}

fn open_zip(path: &Path) -> Result<zip::ZipArchive<BufReader<File>>, DataError> {
    zip::ZipArchive::new(BufReader::new(open(path)?)).map_err(|e| DataError::Archive {
        path: path.to_path_buf(),
        message: format!("not a readable zip archive: {e}"),
    })
}

fn read_zip_member(path: &Path, member: Option<&str>, limit: u64) -> Result<Vec<u8>, DataError> {
    let members = zip_members(path)?;
    let name = match member {
        Some(m) => {
            if !members.iter().any(|n| n == m) {
                return Err(DataError::Archive {
                    path: path.to_path_buf(),
                    message: format!("no member {m:?}; members: {members:?}"),
                });
            }
            m.to_string()
        }
        None => match members.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(DataError::Archive {
                    path: path.to_path_buf(),
                    message: "the archive holds no file".into(),
                });
            }
            many => {
                return Err(DataError::Archive {
                    path: path.to_path_buf(),
                    message: format!(
                        "the archive holds {} files, name one of {many:?}",
                        many.len()
                    ),
                });
            }
        },
    };
    let mut archive = open_zip(path)?;
    let mut file = archive.by_name(&name).map_err(|e| DataError::Archive {
        path: path.to_path_buf(),
        message: format!("member {name:?}: {e}"),
    })?;
    let too_large = || DataError::TooLarge {
        path: path.to_path_buf(),
        what: "decompresses to",
        limit,
        why: String::new(),
    };
    if file.size() > limit {
        return Err(too_large());
    }
    read_limited(&mut file, path, limit, "decompresses to", |e| {
        DataError::Archive {
            path: path.to_path_buf(),
            message: format!("member {name:?}: {e}"),
        }
    })
}

/// A corpus in its three splits, as raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// Training bytes.
    pub train: Vec<u8>,
    /// Validation bytes.
    pub valid: Vec<u8>,
    /// Test bytes.
    pub test: Vec<u8>,
}

impl Corpus {
    /// Splits `data` by `rule` (any rule but [`SplitRule::Members`]).
    pub fn from_bytes(mut data: Vec<u8>, rule: &SplitRule) -> Result<Self, DataError> {
        let (train, valid, test) = rule.ranges(data.len())?;
        let (valid, test) = match rule {
            // train | valid | test
            SplitRule::TailBytes { .. } => {
                let test_v = data.split_off(test.start);
                let valid_v = data.split_off(valid.start);
                (valid_v, test_v)
            }
            // train | test | valid
            _ => {
                let valid_v = data.split_off(valid.start);
                let test_v = data.split_off(test.start);
                (valid_v, test_v)
            }
        };
        debug_assert_eq!(data.len(), train.end);
        Ok(Corpus {
            train: data,
            valid,
            test,
        })
    }

    /// Reads `path` ([`read_bytes`], with `member` for a multi-file zip) and splits it by
    /// `rule`; with [`SplitRule::Members`] each split is read from its own zip member and
    /// `member` must be `None`.
    pub fn load(path: &Path, member: Option<&str>, rule: &SplitRule) -> Result<Self, DataError> {
        match rule {
            SplitRule::Members { train, valid, test } => {
                rule.validate()?;
                if let Some(m) = member {
                    return Err(DataError::invalid(
                        "member",
                        m,
                        "the split rule `members` names its own archive members",
                    ));
                }
                Ok(Corpus {
                    train: read_bytes(path, Some(train))?,
                    valid: read_bytes(path, Some(valid))?,
                    test: read_bytes(path, Some(test))?,
                })
            }
            _ => Self::from_bytes(read_bytes(path, member)?, rule),
        }
    }

    /// The bytes of one split.
    pub fn get(&self, split: Split) -> &[u8] {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
        }
    }

    /// Total bytes over the three splits.
    pub fn len(&self) -> usize {
        self.train.len() + self.valid.len() + self.test.len()
    }

    /// Whether all three splits are empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

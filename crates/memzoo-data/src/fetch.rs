//! Downloads of manifest data sets: progress bar, resume, checksum, atomic rename.
//!
//! The download goes to `<dest_dir>/<file>.part`. A `.part` left by a broken earlier
//! download is resumed with an HTTP `Range` request; within one call a connection that
//! breaks is resumed the same way up to [`FetchOptions::retries`] times. When all bytes are
//! there, size and sha256 are checked and only then is the file renamed to its final name,
//! so the final name never holds a half-written or unverified file. A final file that is
//! already there and verifies is not downloaded again.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::{Check, DataError, Manifest};

/// Options of [`fetch_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchOptions {
    /// Show a progress bar on stderr (only when stderr is a terminal). Default `true`.
    pub progress: bool,
    /// How many times a broken transfer is resumed within one call. Default 3.
    pub retries: u32,
    /// Connection timeout. Default 30 s.
    pub connect_timeout: Duration,
    /// Longest wait for any single read. Default 60 s.
    pub read_timeout: Duration,
    /// Print one line per event (resume, verified, size-only sha256) to stderr. Default `true`.
    pub verbose: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            progress: true,
            retries: 3,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            verbose: true,
        }
    }
}

/// What [`fetch_with`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchOutcome {
    /// The verified file under its final name.
    pub path: PathBuf,
    /// Its sha256 (lower-case hex), computed from the bytes on disk.
    pub sha256: String,
    /// Bytes received over the network by this call (0 when the file was already there).
    pub downloaded: u64,
    /// Offsets at which a transfer was resumed with a `Range` request, in order.
    pub resumed_at: Vec<u64>,
    /// The file was already present and verified: nothing was downloaded.
    pub already_present: bool,
}

/// Downloads `manifest` into `dest_dir` from its canonical URL; returns the final path.
/// See the [module docs](self).
pub fn fetch(manifest: &Manifest, dest_dir: &Path, progress: bool) -> Result<PathBuf, DataError> {
    fetch_from(&manifest.url, manifest, dest_dir, progress)
}

/// [`fetch`] from another URL (a mirror, or a test server), verified against `manifest`.
pub fn fetch_from(
    url: &str,
    manifest: &Manifest,
    dest_dir: &Path,
    progress: bool,
) -> Result<PathBuf, DataError> {
    let opts = FetchOptions {
        progress,
        ..FetchOptions::default()
    };
    fetch_with(url, manifest, dest_dir, &opts).map(|o| o.path)
}

/// Lower-case hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, DataError> {
    let mut f = File::open(path).map_err(|e| DataError::io("cannot open", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| DataError::io("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Checks size and (per [`Manifest::check`]) sha256 of `path`; returns the computed sha256.
pub fn verify(manifest: &Manifest, path: &Path) -> Result<String, DataError> {
    let len = std::fs::metadata(path)
        .map_err(|e| DataError::io("cannot stat", path, e))?
        .len();
    if len != manifest.size {
        return Err(DataError::SizeMismatch {
            path: path.to_path_buf(),
            expected: manifest.size,
            actual: len,
        });
    }
    let actual = sha256_file(path)?;
    if let (Check::Sha256, Some(expected)) = (manifest.check, &manifest.sha256)
        && actual != *expected
    {
        return Err(DataError::ChecksumMismatch {
            path: path.to_path_buf(),
            expected: expected.clone(),
            actual,
        });
    }
    Ok(actual)
}

/// The `.part` path of a manifest's download in `dest_dir`.
pub fn part_path(manifest: &Manifest, dest_dir: &Path) -> PathBuf {
    dest_dir.join(format!("{}.part", manifest.file))
}

/// [`fetch_from`] with all options, reporting what was done.
pub fn fetch_with(
    url: &str,
    manifest: &Manifest,
    dest_dir: &Path,
    opts: &FetchOptions,
) -> Result<FetchOutcome, DataError> {
    manifest.validate()?;
    std::fs::create_dir_all(dest_dir)
        .map_err(|e| DataError::io("cannot create directory", dest_dir, e))?;
    let final_path = dest_dir.join(&manifest.file);
    let part = part_path(manifest, dest_dir);
    let say = |msg: String| {
        if opts.verbose {
            eprintln!("{msg}");
        }
    };

    if final_path.exists() {
        match verify(manifest, &final_path) {
            Ok(sha) => {
                if manifest.check == Check::SizeOnly {
                    say(format!(
                        "{}: present, size {} matches (size-only check); sha256 {sha}",
                        final_path.display(),
                        manifest.size
                    ));
                }
                return Ok(FetchOutcome {
                    path: final_path,
                    sha256: sha,
                    downloaded: 0,
                    resumed_at: vec![],
                    already_present: true,
                });
            }
            Err(e) => say(format!("{e}; downloading it again")),
        }
    }

    let agent = ureq::AgentBuilder::new()
        .timeout_connect(opts.connect_timeout)
        .timeout_read(opts.read_timeout)
        .user_agent(concat!("memzoo-data/", env!("CARGO_PKG_VERSION")))
        .build();

    let mut bar = Progress::new(opts.progress, &manifest.name, manifest.size);
    let mut downloaded = 0u64;
    let mut resumed_at = Vec::new();
    let mut failures = 0u32;
    loop {
        let have = match std::fs::metadata(&part) {
            Ok(m) if m.len() > manifest.size => {
                say(format!(
                    "{}: {} bytes, more than the expected {}; starting over",
                    part.display(),
                    m.len(),
                    manifest.size
                ));
                remove(&part)?;
                0
            }
            Ok(m) => m.len(),
            Err(_) => 0,
        };
        if have == manifest.size {
            break;
        }
        if have > 0 {
            resumed_at.push(have);
            say(format!(
                "{}: resuming at byte {have} of {}",
                part.display(),
                manifest.size
            ));
        }
        bar.restart_at(have);
        match transfer(&agent, url, &part, have, manifest.size, &mut bar) {
            Ok(n) => downloaded += n,
            Err(Transfer::Fatal(e)) => {
                bar.finish();
                return Err(e);
            }
            Err(Transfer::Broken(n, e)) => {
                downloaded += n;
                failures += 1;
                if failures > opts.retries {
                    bar.finish();
                    return Err(e);
                }
                say(format!("{e}; retrying ({failures}/{})", opts.retries));
            }
        }
    }
    bar.finish();

    let sha = match verify(manifest, &part) {
        Ok(sha) => sha,
        Err(e) => {
            // Bad bytes must not be resumed from: drop them.
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    if manifest.check == Check::SizeOnly {
        say(format!(
            "{}: size {} matches; no published checksum (size-only check), computed sha256 {sha}",
            manifest.file, manifest.size
        ));
    }
    std::fs::rename(&part, &final_path)
        .map_err(|e| DataError::io("cannot rename to", &final_path, e))?;
    Ok(FetchOutcome {
        path: final_path,
        sha256: sha,
        downloaded,
        resumed_at,
        already_present: false,
    })
}

fn remove(path: &Path) -> Result<(), DataError> {
    std::fs::remove_file(path).map_err(|e| DataError::io("cannot remove", path, e))
}

/// A one-line progress bar on stderr, drawn only when stderr is a terminal, at most ten
/// times a second.
struct Progress {
    show: bool,
    name: String,
    total: u64,
    pos: u64,
    started: Instant,
    start_pos: u64,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(show: bool, name: &str, total: u64) -> Self {
        Self {
            show: show && std::io::stderr().is_terminal(),
            name: name.to_string(),
            total,
            pos: 0,
            started: Instant::now(),
            start_pos: 0,
            drawn: None,
        }
    }

    /// Position before a transfer: the rate counts from here.
    fn restart_at(&mut self, pos: u64) {
        self.pos = pos;
        self.start_pos = pos;
        self.started = Instant::now();
    }

    fn set(&mut self, pos: u64) {
        self.pos = pos;
        if !self.show
            || self
                .drawn
                .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.drawn = Some(Instant::now());
        const WIDTH: u64 = 30;
        let filled = (self.pos.min(self.total) * WIDTH / self.total.max(1)) as usize;
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.pos.saturating_sub(self.start_pos)) as f64 / secs / 1e6;
        let mb = |b: u64| b as f64 / 1e6;
        eprint!(
            "\r{} [{}{}] {:.1}/{:.1} MB {rate:.1} MB/s ",
            self.name,
            "=".repeat(filled),
            " ".repeat(WIDTH as usize - filled),
            mb(self.pos),
            mb(self.total)
        );
    }

    /// Clears the line.
    fn finish(&mut self) {
        if self.show && self.drawn.is_some() {
            eprint!("\r{}\r", " ".repeat(self.name.len() + 70));
            self.drawn = None;
        }
    }
}

/// Why one transfer stopped early.
enum Transfer {
    /// Retrying will not help (HTTP error status, bad server answer, local I/O error).
    Fatal(DataError),
    /// The connection broke after `n` new bytes; resuming may help.
    Broken(u64, DataError),
}

/// One HTTP request appending to `part` from byte `have`; returns the bytes written.
fn transfer(
    agent: &ureq::Agent,
    url: &str,
    part: &Path,
    have: u64,
    size: u64,
    bar: &mut Progress,
) -> Result<u64, Transfer> {
    let http = |message: String| DataError::Http {
        url: url.to_string(),
        message,
    };
    let mut req = agent.get(url);
    if have > 0 {
        req = req.set("Range", &format!("bytes={have}-"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(416, _)) if have > 0 => {
            // Our partial file does not fit the server's: start over next round.
            let _ = std::fs::remove_file(part);
            return Err(Transfer::Broken(
                0,
                http(format!("range from byte {have} not satisfiable (HTTP 416)")),
            ));
        }
        Err(ureq::Error::Status(code, _)) => {
            return Err(Transfer::Fatal(http(format!("HTTP status {code}"))));
        }
        Err(e) => return Err(Transfer::Broken(0, http(e.to_string()))),
    };
    let append = match (have, resp.status()) {
        (_, 200) => false, // a whole file (also when the server ignored the range: start over)
        (h, 206) if h > 0 => {
            let range = resp.header("content-range").unwrap_or("");
            let start = range
                .strip_prefix("bytes ")
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.trim().parse::<u64>().ok());
            if start != Some(h) {
                return Err(Transfer::Fatal(http(format!(
                    "asked for bytes from {h}, the server answered Content-Range {range:?}"
                ))));
            }
            true
        }
        (_, s) => return Err(Transfer::Fatal(http(format!("unexpected HTTP status {s}")))),
    };
    let start = if append { have } else { 0 };
    bar.restart_at(start);
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(part)
        .map_err(|e| Transfer::Fatal(DataError::io("cannot write", part, e)))?;
    let mut reader = resp.into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut written = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = file.sync_all();
                return Err(Transfer::Broken(
                    written,
                    http(format!(
                        "connection broke after {} bytes: {e}",
                        start + written
                    )),
                ));
            }
        };
        if start + written + n as u64 > size {
            let _ = std::fs::remove_file(part);
            return Err(Transfer::Fatal(http(format!(
                "the server sent more than the expected {size} bytes"
            ))));
        }
        file.write_all(&buf[..n])
            .map_err(|e| Transfer::Fatal(DataError::io("cannot write", part, e)))?;
        written += n as u64;
        bar.set(start + written);
    }
    file.sync_all()
        .map_err(|e| Transfer::Fatal(DataError::io("cannot sync", part, e)))?;
    if start + written < size {
        return Err(Transfer::Broken(
            written,
            http(format!(
                "the transfer ended after {} of {size} bytes",
                start + written
            )),
        ));
    }
    Ok(written)
}

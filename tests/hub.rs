//! Hugging Face Hub ids as import sources (`memzoo_import::hub`), against a Hub served from this
//! test on 127.0.0.1: the file list (`/api/models/{repo}/revision/{rev}`) and the files
//! (`/{repo}/resolve/{rev}/{file}`, answering ranged requests with the headers `hf-hub` reads:
//! `etag`, `x-repo-commit`, `content-range`), the import fixtures as its files. Each test has its
//! own server and cache directory, and passes its options explicitly (no environment variable
//! is set: tests run in parallel).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::import::scratch;
use memzoo_import::ImportError;
use memzoo_import::hub::{self, HubError, HubOptions};
use memzoo_tests::generate_options;

/// The commit every served revision resolves to.
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One request the server saw: the path and the `Range` header.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    range: Option<String>,
}

/// A Hub on 127.0.0.1 serving one repository's files; stops when dropped.
struct FakeHub {
    endpoint: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Files whose full download is cut after half their bytes.
    truncate: Arc<Mutex<Vec<String>>>,
    /// Files listed in the file list but not served (404).
    hidden: Arc<Mutex<Vec<String>>>,
    /// An ETag to send instead of the content's hash (a hostile server's).
    etag: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHub {
    /// Serves `files` (name → bytes) as repository `repo`, at any revision.
    fn start(repo: &str, files: BTreeMap<String, Vec<u8>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let truncate = Arc::new(Mutex::new(Vec::new()));
        let hidden = Arc::new(Mutex::new(Vec::new()));
        let etag = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, t, h, st) = (seen.clone(), truncate.clone(), hidden.clone(), stop.clone());
        let e = etag.clone();
        let repo = repo.to_string();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    let _ = serve(stream, &repo, &files, &s, &t, &h, &e);
                }
            }
        });
        Self {
            endpoint,
            seen,
            truncate,
            hidden,
            etag,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The paths of the requests for whole files (not the one-byte metadata requests).
    fn downloads(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.contains("/resolve/") && s.range.as_deref() != Some("bytes=0-0"))
            .map(|s| s.path)
            .collect()
    }

    fn options(&self, cache: &Path) -> HubOptions {
        HubOptions {
            revision: "main".into(),
            offline: false,
            endpoint: self.endpoint.clone(),
            cache_dir: cache.to_path_buf(),
            token: None,
            progress: false,
        }
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A content hash for the ETag (FNV-1a, 64 bits: any stable function of the bytes will do).
fn etag(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// Answers one request (one per connection: `Connection: close`).
fn serve(
    mut stream: TcpStream,
    repo: &str,
    files: &BTreeMap<String, Vec<u8>>,
    seen: &Mutex<Vec<Seen>>,
    truncate: &Mutex<Vec<String>>,
    hidden: &Mutex<Vec<String>>,
    etag_override: &Mutex<Option<String>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        range: range.clone(),
    });
    let not_found = |stream: &mut TcpStream| {
        stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
        )
    };
    if let Some(rest) = path.strip_prefix(&format!("/api/models/{repo}/revision/")) {
        let _revision = rest;
        let siblings: Vec<_> = files
            .keys()
            .map(|f| serde_json::json!({ "rfilename": f }))
            .collect();
        let body = serde_json::json!({ "sha": COMMIT, "siblings": siblings }).to_string();
        return write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let Some(rest) = path.strip_prefix(&format!("/{repo}/resolve/")) else {
        return not_found(&mut stream);
    };
    let Some((_revision, file)) = rest.split_once('/') else {
        return not_found(&mut stream);
    };
    let Some(bytes) = files.get(file) else {
        return not_found(&mut stream);
    };
    if hidden.lock().unwrap().iter().any(|f| f == file) {
        return not_found(&mut stream);
    }
    let n = bytes.len();
    // `bytes=a-b` or `bytes=a-`.
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or((r, ""));
            let a: usize = a.parse().unwrap_or(0);
            let b: usize = b.parse().map_or(n - 1, |b: usize| b.min(n - 1));
            (a, b)
        }
        None => (0, n - 1),
    };
    let body = &bytes[start..=end];
    let cut = start == 0 && end + 1 == n && truncate.lock().unwrap().iter().any(|f| f == file);
    write!(
        stream,
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{end}/{n}\r\n\
         ETag: \"{}\"\r\nX-Repo-Commit: {COMMIT}\r\nConnection: close\r\n\r\n",
        body.len(),
        etag_override
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| etag(bytes))
    )?;
    if cut {
        stream.write_all(&body[..body.len() / 2])?;
        stream.flush()?;
        // Closed early: the client reads half of what Content-Length promised.
        return stream.shutdown(std::net::Shutdown::Both);
    }
    stream.write_all(body)?;
    // Drain what the client may still send, so that closing does not reset the connection.
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 64];
    let _ = reader.read(&mut sink);
    Ok(())
}

/// The served files: the plain HF TransfoXL fixture (config.json, model.safetensors) and a
/// pytorch_model.bin the import must not fetch (model.safetensors comes first).
fn transfo_xl_files() -> BTreeMap<String, Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/plain");
    let mut files = BTreeMap::new();
    for f in ["config.json", "model.safetensors"] {
        files.insert(f.to_string(), std::fs::read(dir.join(f)).unwrap());
    }
    files.insert("pytorch_model.bin".into(), b"never fetched".to_vec());
    files.insert("README.md".into(), b"# a model card".to_vec());
    files
}

/// `owner/name` is a Hub id; paths with more parts, dots or spaces are not.
#[test]
fn hub_ids_are_owner_slash_name() {
    for id in [
        "transfo-xl/transfo-xl-wt103",
        "google/reformer-enwik8",
        "google/reformer-crime-and-punishment",
        "me/my_model.v2",
    ] {
        assert!(hub::is_hub_id(id), "{id}");
    }
    for not in [
        "model",
        "a/b/c",
        "../x",
        "./x",
        "/abs/x",
        "a/",
        "a b/c",
        "a/.hidden",
        "runs/x..y",
    ] {
        assert!(!hub::is_hub_id(not), "{not}");
    }
}

/// The options come from Python's variables: HF_HUB_CACHE over HF_HOME/hub, HF_TOKEN over the
/// token file, HF_ENDPOINT, HF_HUB_OFFLINE.
#[test]
fn hub_options_read_pythons_environment_variables() {
    let tmp = scratch("hub-env");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("token"), "hf_from_file\n").unwrap();
    let home = tmp.to_str().unwrap().to_string();
    let vars = |pairs: &[(&str, &str)]| {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubOptions::from_vars(move |k| map.get(k).cloned())
    };
    let o = vars(&[("HF_HOME", &home)]);
    assert_eq!(o.cache_dir, tmp.join("hub"));
    assert_eq!(o.token.as_deref(), Some("hf_from_file"));
    assert_eq!(o.endpoint, hub::DEFAULT_ENDPOINT);
    assert!(!o.offline);
    assert_eq!(o.revision, "main");
    let o = vars(&[
        ("HF_HOME", &home),
        ("HF_HUB_CACHE", "/elsewhere"),
        ("HF_TOKEN", "hf_env"),
        ("HF_ENDPOINT", "http://127.0.0.1:9/"),
        ("HF_HUB_OFFLINE", "1"),
    ]);
    assert_eq!(o.cache_dir, PathBuf::from("/elsewhere"));
    assert_eq!(o.token.as_deref(), Some("hf_env"));
    assert_eq!(o.endpoint, "http://127.0.0.1:9");
    assert!(o.offline);
    for (v, on) in [("true", true), ("YES", true), ("0", false), ("off", false)] {
        assert_eq!(vars(&[("HF_HUB_OFFLINE", v)]).offline, on, "{v}");
    }
    std::fs::remove_dir_all(&tmp).ok();
}

/// The first import downloads the checkpoint's files (not the second weight file, not the
/// model card) into Python's cache layout; the second finds every blob in the cache and asks
/// only for the one-byte metadata; offline, with the server gone, the cache alone serves it;
/// and the imported run is the one a local import of the same files writes.
#[test]
fn hub_import_downloads_once_then_reads_the_cache() {
    let tmp = scratch("hub-import");
    let cache = tmp.join("hf-cache");
    let repo = "tiny/transfo-xl";
    let files = transfo_xl_files();
    let server = FakeHub::start(repo, files.clone());
    let options = server.options(&cache);

    let dir = hub::snapshot(repo, &options).unwrap();
    let repo_dir = cache.join("models--tiny--transfo-xl");
    assert_eq!(dir, repo_dir.join("snapshots").join(COMMIT));
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let mut downloaded = server.downloads();
    downloaded.sort();
    assert_eq!(
        downloaded,
        [
            format!("/{repo}/resolve/{COMMIT}/config.json"),
            format!("/{repo}/resolve/{COMMIT}/model.safetensors"),
        ]
    );
    for f in ["config.json", "model.safetensors"] {
        let p = dir.join(f);
        // A link into blobs/, named by the ETag, as Python's cache has it.
        let target = std::fs::read_link(&p).unwrap();
        assert_eq!(
            target,
            Path::new("../../blobs").join(etag(&files[f])),
            "{f}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), files[f], "{f}");
    }
    assert!(!dir.join("pytorch_model.bin").exists());

    // Second time: the blobs are complete, nothing is downloaded again.
    let before = server.seen().len();
    assert_eq!(hub::snapshot(repo, &options).unwrap(), dir);
    let again: Vec<Seen> = server.seen()[before..].to_vec();
    assert!(
        again
            .iter()
            .all(|s| !s.path.contains("/resolve/") || s.range.as_deref() == Some("bytes=0-0")),
        "{again:?}"
    );
    assert_eq!(
        again.len(),
        3,
        "the file list and two metadata requests: {again:?}"
    );

    // Offline, with no server at all.
    drop(server);
    let offline = HubOptions {
        offline: true,
        endpoint: "http://127.0.0.1:9".into(),
        ..options.clone()
    };
    assert_eq!(hub::snapshot(repo, &offline).unwrap(), dir);
    // The commit itself is a revision too.
    let by_commit = HubOptions {
        revision: COMMIT.into(),
        ..offline.clone()
    };
    assert_eq!(hub::snapshot(repo, &by_commit).unwrap(), dir);

    // The import of the snapshot is the import of the local files.
    let from_hub = tmp.join("from-hub");
    memzoo::import::import("hf-transfo-xl", &dir, &from_hub, None, false, true).unwrap();
    let local = tmp.join("local");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf-transfo-xl/plain");
    memzoo::import::import("hf-transfo-xl", &fixture, &local, None, false, true).unwrap();
    assert_eq!(
        std::fs::read_to_string(from_hub.join("config.toml")).unwrap(),
        std::fs::read_to_string(local.join("config.toml")).unwrap()
    );
    let device = memzoo_tests::flex();
    let (_, a) = memzoo::commands::load_xl(&from_hub, &device).unwrap();
    let (_, b) = memzoo::commands::load_xl(&local, &device).unwrap();
    assert_eq!(
        memzoo_tests::param_vectors(&a, None),
        memzoo_tests::param_vectors(&b, None)
    );
    std::fs::remove_dir_all(&tmp).ok();
}

/// Offline with nothing cached: an error naming the repository, the revision and the cache;
/// with the revision cached but another asked for, the same.
#[test]
fn hub_offline_without_a_cached_copy_is_an_error() {
    let tmp = scratch("hub-offline");
    let cache = tmp.join("hf-cache");
    let options = HubOptions {
        revision: "v1.0".into(),
        offline: true,
        endpoint: "http://127.0.0.1:9".into(),
        cache_dir: cache.clone(),
        token: None,
        progress: false,
    };
    let err = hub::snapshot("tiny/transfo-xl", &options).unwrap_err();
    assert!(matches!(err, HubError::NotCached { .. }), "{err}");
    // A revision that would leave the cache is refused before anything is read.
    for bad in ["../../etc", "a/../b", "", "main/"] {
        let o = HubOptions {
            revision: bad.into(),
            ..options.clone()
        };
        let err = hub::snapshot("tiny/transfo-xl", &o).unwrap_err();
        assert!(matches!(err, HubError::UnsafeName { .. }), "{bad}: {err}");
    }
    let msg = err.to_string();
    for part in [
        "tiny/transfo-xl",
        "v1.0",
        cache.to_str().unwrap(),
        "offline",
    ] {
        assert!(msg.contains(part), "{part}: {msg}");
    }
    // Through the CLI's resolution: HF_HUB_OFFLINE's flag, and a path that exists is a path.
    let err = memzoo::import::source_dir(Path::new("tiny/transfo-xl"), "main", true);
    // (The environment's cache is not this test's: whatever it holds, no such repo is there.)
    assert!(err.is_err());
    let here = memzoo::import::source_dir(&tmp, "main", true).unwrap();
    assert_eq!(here, tmp);
    std::fs::remove_dir_all(&tmp).ok();
}

/// A repository the Hub does not have, and a listed file it does not serve: HTTP 404, naming
/// the repository, the revision and the file.
#[test]
fn hub_404_names_the_repo_revision_and_file() {
    let tmp = scratch("hub-404");
    let cache = tmp.join("hf-cache");
    let server = FakeHub::start("tiny/transfo-xl", transfo_xl_files());
    let err = hub::snapshot("tiny/missing", &server.options(&cache)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HubError::Status { status: 404, .. }), "{msg}");
    for part in [
        "tiny/missing",
        "main",
        "file list",
        "HF_TOKEN",
        "nor is it a directory",
    ] {
        assert!(msg.contains(part), "{part}: {msg}");
    }
    drop(server);

    // config.json listed but not served.
    let mut files = transfo_xl_files();
    files.insert("vocab.pkl".into(), Vec::new());
    let server = FakeHub::start("tiny/transfo-xl", files);
    let listed_only = "vocab.pkl";
    server.hidden.lock().unwrap().push(listed_only.into());
    let err = hub::snapshot("tiny/transfo-xl", &server.options(&cache)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HubError::Status { status: 404, .. }), "{msg}");
    assert!(
        msg.contains(listed_only) && msg.contains("tiny/transfo-xl"),
        "{msg}"
    );

    // And as the import's error.
    let err: ImportError = err.into();
    assert!(err.to_string().contains("HTTP 404"), "{err}");

    // A server whose ETag would name a path outside the cache.
    server.hidden.lock().unwrap().clear();
    *server.etag.lock().unwrap() = Some("../../../escaped".into());
    let err = hub::snapshot("tiny/transfo-xl", &server.options(&cache)).unwrap_err();
    assert!(matches!(err, HubError::UnsafeName { .. }), "{err}");
    assert!(err.to_string().contains("ETag of config.json"), "{err}");
    assert!(!tmp.join("escaped").exists() && !cache.join("escaped").exists());
    std::fs::remove_dir_all(&tmp).ok();
}

/// A download cut short: an error naming the file, no blob of it in the cache (what arrived
/// kept as the blob's `.part`); the next import (the server mended) asks for the rest only and
/// completes it.
#[test]
fn hub_truncated_download_is_an_error_and_leaves_no_blob() {
    let tmp = scratch("hub-truncated");
    let cache = tmp.join("hf-cache");
    let repo = "tiny/transfo-xl";
    let files = transfo_xl_files();
    let server = FakeHub::start(repo, files.clone());
    server
        .truncate
        .lock()
        .unwrap()
        .push("model.safetensors".into());
    let options = server.options(&cache);
    let err = hub::snapshot(repo, &options).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains(repo) && msg.contains("main"),
        "{msg}"
    );
    let blob = cache
        .join("models--tiny--transfo-xl/blobs")
        .join(etag(&files["model.safetensors"]));
    assert!(!blob.exists(), "a truncated blob is in the cache");
    assert!(
        !cache
            .join("models--tiny--transfo-xl/snapshots")
            .join(COMMIT)
            .join("model.safetensors")
            .exists()
    );

    // What arrived waits as `<etag>.part`: the next import asks for the rest only.
    let full = files["model.safetensors"].len();
    let part = blob.with_extension("part");
    let part_len = std::fs::metadata(&part)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    assert!(part_len < full, "{part_len} of {full}");
    eprintln!("truncated: {msg} ({part_len} of {full} bytes kept)");

    server.truncate.lock().unwrap().clear();
    let before = server.seen().len();
    let dir = hub::snapshot(repo, &options).unwrap();
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        files["model.safetensors"]
    );
    let rest: Vec<Option<String>> = server.seen()[before..]
        .iter()
        .filter(|s| {
            s.path.ends_with("/model.safetensors") && s.range.as_deref() != Some("bytes=0-0")
        })
        .map(|s| s.range.clone())
        .collect();
    assert_eq!(rest, [Some(format!("bytes={part_len}-"))]);
    assert!(!part.exists());
    std::fs::remove_dir_all(&tmp).ok();
}

/// The command line's path, in a child process of this test binary whose environment names
/// the Hub (`HF_ENDPOINT`) and the cache (`HF_HUB_CACHE`) as a user's would: `memzoo import
/// --from hf-transfo-xl tiny/transfo-xl-words` resolves the id, downloads the checkpoint and
/// its pickled vocabulary (read without running it), and writes a run whose `vocab.json`
/// holds the pickle's words, which `memzoo generate` reads; then the same with
/// `HF_HUB_OFFLINE=1` and no server.
#[test]
fn hub_id_imports_through_the_cli_environment() {
    let tmp = scratch("hub-cli");
    let cache = tmp.join("hf-cache");
    let mut files = transfo_xl_files();
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/transfo-xl-tokenizer");
    files.insert(
        "vocab.pkl".into(),
        std::fs::read(tokenizer.join("vocab-48.pkl")).unwrap(),
    );
    let server = FakeHub::start("tiny/transfo-xl-words", files);
    let child = |step: &str, endpoint: &str, offline: bool| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "hub::hub_cli_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env("MEMZOO_HUB_CHILD", &tmp)
        .env("MEMZOO_HUB_STEP", step)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", &cache)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
        if offline {
            cmd.env("HF_HUB_OFFLINE", "1");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{step}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    child("online", &server.endpoint, false);
    assert_eq!(server.downloads().len(), 3, "{:?}", server.downloads());
    let endpoint = server.endpoint.clone();
    drop(server);
    child("offline", &endpoint, true);
    std::fs::remove_dir_all(&tmp).ok();
}

/// The child of [`hub_id_imports_through_the_cli_environment`].
#[test]
#[ignore = "run as a child process by hub_id_imports_through_the_cli_environment"]
fn hub_cli_child() {
    let Some(tmp) = std::env::var_os("MEMZOO_HUB_CHILD").map(PathBuf::from) else {
        return;
    };
    let step = std::env::var("MEMZOO_HUB_STEP").unwrap();
    let src =
        memzoo::import::source_dir(Path::new("tiny/transfo-xl-words"), "main", false).unwrap();
    assert!(src.starts_with(tmp.join("hf-cache")), "{}", src.display());
    let run = tmp.join(format!("run-{step}"));
    memzoo::import::import("hf-transfo-xl", &src, &run, None, false, true).unwrap();
    // The run's vocabulary: the pickle's 48 words, as vocab.json has them.
    let words: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("vocab.json")).unwrap()).unwrap();
    let all: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/transfo-xl-tokenizer/vocab.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        words["idx2sym"].as_array().unwrap()[..],
        all["idx2sym"].as_array().unwrap()[..48]
    );
    let codec = memzoo_data::TextCodec::for_dir(&run).unwrap();
    assert!(matches!(codec, memzoo_data::TextCodec::Words(_)));
    let opts = generate_options("the cat sat on the", 4);
    memzoo::commands::generate(&run, "flex", &opts, true).unwrap();
}

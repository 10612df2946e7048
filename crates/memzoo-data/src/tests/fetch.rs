//! `fetch` against a real HTTP server on 127.0.0.1 started by the test: real sockets, real
//! `Range` requests, a connection cut midway, wrong bytes.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::TempDir;
use crate::{
    Check, DataError, FetchOptions, Manifest, SplitRule, fetch_from, fetch_with, part_path,
    sha256_file,
};

/// What the server does with one request.
#[derive(Clone, Debug)]
enum Plan {
    /// Serve the body (honouring `Range`).
    Serve,
    /// Send the headers of a full answer but cut the connection after this many body bytes.
    CutAfter(usize),
    /// Answer 200 with the whole body even when a range was asked for.
    IgnoreRange,
    /// Answer with this status and no body.
    Status(u16),
}

/// A tiny HTTP/1.1 server: one request per connection, plans taken in order (then `Serve`).
struct Server {
    url: String,
    log: Arc<Mutex<Vec<Option<String>>>>,
    plans: Arc<Mutex<Vec<Plan>>>,
    stop: Arc<Mutex<bool>>,
    addr: std::net::SocketAddr,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    fn start(body: Vec<u8>, plans: Vec<Plan>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let plans = Arc::new(Mutex::new(plans));
        let stop = Arc::new(Mutex::new(false));
        let (log2, plans2, stop2) = (log.clone(), plans.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            // bounded: a test never needs more than 50 connections
            for conn in listener.incoming().take(50) {
                if *stop2.lock().unwrap() {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let plan = {
                    let mut p = plans2.lock().unwrap();
                    if p.is_empty() {
                        Plan::Serve
                    } else {
                        p.remove(0)
                    }
                };
                let _ = handle(conn, &body, plan, &log2);
            }
        });
        Server {
            url: format!("http://{addr}/data/file.bin"),
            log,
            plans,
            stop,
            addr,
            handle: Some(handle),
        }
    }

    /// The `Range` header of each request so far (`None`: no range).
    fn ranges(&self) -> Vec<Option<String>> {
        self.log.lock().unwrap().clone()
    }

    fn push(&self, plan: Plan) {
        self.plans.lock().unwrap().push(plan);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        *self.stop.lock().unwrap() = true;
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn handle(
    mut conn: TcpStream,
    body: &[u8],
    plan: Plan,
    log: &Mutex<Vec<Option<String>>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    if request_line.is_empty() {
        return Ok(()); // the wake-up connection
    }
    let mut range = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    log.lock().unwrap().push(range.clone());
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    let n = body.len();
    match plan {
        Plan::Status(code) => {
            write!(
                conn,
                "HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
        }
        Plan::IgnoreRange => {
            write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
            )?;
            conn.write_all(body)?;
        }
        Plan::Serve | Plan::CutAfter(_) => {
            let from = start.unwrap_or(0);
            if from >= n && start.is_some() {
                write!(
                    conn,
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{n}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )?;
                return Ok(());
            }
            if start.is_some() {
                write!(
                    conn,
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{n}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    n - 1,
                    n - from
                )?;
            } else {
                write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
                )?;
            }
            let rest = &body[from..];
            match plan {
                Plan::CutAfter(k) => {
                    conn.write_all(&rest[..k.min(rest.len())])?;
                    conn.flush()?;
                    // cut: close the connection with the body unfinished
                    conn.shutdown(std::net::Shutdown::Both)?;
                }
                _ => conn.write_all(rest)?,
            }
        }
    }
    conn.flush()
}

fn manifest_for(body: &[u8], check: Check) -> Manifest {
    let dir = TempDir::new("sha");
    let p = dir.join("b");
    std::fs::write(&p, body).unwrap();
    let sha = sha256_file(&p).unwrap();
    Manifest {
        name: "test-data".into(),
        description: "bytes served by the test".into(),
        url: "https://example.invalid/never-used".into(),
        file: "file.bin".into(),
        size: body.len() as u64,
        check,
        sha256: (check == Check::Sha256).then_some(sha),
        member: None,
        notes: None,
        split: SplitRule::generic(),
    }
}

fn quiet(retries: u32) -> FetchOptions {
    FetchOptions {
        progress: false,
        retries,
        verbose: false,
        ..FetchOptions::default()
    }
}

#[test]
fn sha256_matches_a_known_vector() {
    let dir = TempDir::new("vec");
    let p = dir.join("abc");
    std::fs::write(&p, b"abc").unwrap();
    // FIPS 180-2 test vector
    assert_eq!(
        sha256_file(&p).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn downloads_verifies_and_does_not_download_twice() {
    let body = super::lcg_bytes(300_000, 11);
    let server = Server::start(body.clone(), vec![]);
    let dir = TempDir::new("plain");
    let m = manifest_for(&body, Check::Sha256);
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap();
    assert_eq!(out.path, dir.join("file.bin"));
    assert_eq!(std::fs::read(&out.path).unwrap(), body);
    assert_eq!(
        (out.downloaded, out.already_present, out.resumed_at.len()),
        (300_000, false, 0)
    );
    assert_eq!(Some(out.sha256.clone()), m.sha256);
    assert!(!part_path(&m, dir.path()).exists());
    assert_eq!(server.ranges(), vec![None]);

    // present and verified: no request at all
    let again = fetch_from(&server.url, &m, dir.path(), false).unwrap();
    assert_eq!(again, out.path);
    assert_eq!(server.ranges().len(), 1);

    // a corrupted file under the final name is downloaded again and replaced
    std::fs::write(&out.path, b"garbage").unwrap();
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap();
    assert_eq!(std::fs::read(&out.path).unwrap(), body);
    assert_eq!(server.ranges().len(), 2);
}

#[test]
fn a_broken_download_resumes_with_a_range_request() {
    let body = super::lcg_bytes(400_000, 12);
    let cut = 150_000;
    let server = Server::start(body.clone(), vec![Plan::CutAfter(cut)]);
    let dir = TempDir::new("resume");
    let m = manifest_for(&body, Check::Sha256);
    let final_path = dir.join("file.bin");
    let part = part_path(&m, dir.path());

    // no retries: the first call fails, leaving the bytes it got in .part and no final file
    let err = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap_err();
    assert!(matches!(err, DataError::Http { .. }), "{err}");
    assert!(err.to_string().contains(&server.url), "{err}");
    assert!(!final_path.exists());
    let have = std::fs::metadata(&part).unwrap().len() as usize;
    assert!(have > 0 && have <= cut, "kept {have} bytes");
    assert_eq!(std::fs::read(&part).unwrap(), body[..have]);

    // the next call asks only for the rest
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap();
    assert_eq!(server.ranges(), vec![None, Some(format!("bytes={have}-"))]);
    assert_eq!(out.resumed_at, vec![have as u64]);
    assert_eq!(out.downloaded, (body.len() - have) as u64);
    assert_eq!(std::fs::read(&final_path).unwrap(), body);
    assert!(!part.exists());
}

#[test]
fn one_call_survives_two_cuts() {
    let body = super::lcg_bytes(500_000, 13);
    let server = Server::start(
        body.clone(),
        vec![Plan::CutAfter(100_000), Plan::CutAfter(120_000)],
    );
    let dir = TempDir::new("retry");
    let m = manifest_for(&body, Check::Sha256);
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(3)).unwrap();
    assert_eq!(std::fs::read(&out.path).unwrap(), body);
    let ranges = server.ranges();
    assert_eq!(ranges.len(), 3);
    assert_eq!(ranges[0], None);
    assert_eq!(out.resumed_at.len(), 2);
    for (r, at) in ranges[1..].iter().zip(&out.resumed_at) {
        assert_eq!(r.as_deref(), Some(format!("bytes={at}-").as_str()));
    }
    // nothing was downloaded twice
    assert_eq!(out.downloaded, body.len() as u64);
}

#[test]
fn wrong_bytes_fail_the_checksum_and_leave_nothing() {
    let body = super::lcg_bytes(200_000, 14);
    let mut wrong = body.clone();
    wrong[123_456] ^= 0x20;
    let server = Server::start(wrong.clone(), vec![]);
    let dir = TempDir::new("checksum");
    let m = manifest_for(&body, Check::Sha256);
    let err = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap_err();
    let DataError::ChecksumMismatch {
        path,
        expected,
        actual,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(Some(expected.clone()), m.sha256);
    assert_eq!(*actual, manifest_for(&wrong, Check::Sha256).sha256.unwrap());
    assert!(path.ends_with("file.bin.part"));
    assert!(
        err.to_string().contains(expected.as_str()) && err.to_string().contains(actual.as_str())
    );
    assert!(!dir.join("file.bin").exists());
    assert!(
        !part_path(&m, dir.path()).exists(),
        "bad bytes must not be resumed from"
    );

    // a wrong size is an error too (the server sends fewer bytes than the manifest says)
    let server = Server::start(body[..1000].to_vec(), vec![]);
    let err = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap_err();
    assert!(err.to_string().contains("1000 of 200000"), "{err}");
    assert!(!dir.join("file.bin").exists());
}

#[test]
fn size_only_manifest_returns_the_computed_checksum() {
    let body = super::lcg_bytes(50_000, 15);
    let server = Server::start(body.clone(), vec![]);
    let dir = TempDir::new("sizeonly");
    let m = manifest_for(&body, Check::SizeOnly);
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap();
    assert_eq!(
        out.sha256,
        manifest_for(&body, Check::Sha256).sha256.unwrap()
    );
    assert_eq!(std::fs::read(&out.path).unwrap(), body);
}

#[test]
fn server_that_ignores_ranges_and_http_errors() {
    let body = super::lcg_bytes(80_000, 16);
    let server = Server::start(body.clone(), vec![Plan::IgnoreRange]);
    let dir = TempDir::new("norange");
    let m = manifest_for(&body, Check::Sha256);
    // a stale partial download: the server answers 200 with the whole file, which replaces it
    std::fs::write(part_path(&m, dir.path()), &body[..30_000]).unwrap();
    let out = fetch_with(&server.url, &m, dir.path(), &quiet(0)).unwrap();
    assert_eq!(server.ranges(), vec![Some("bytes=30000-".to_string())]);
    assert_eq!(std::fs::read(&out.path).unwrap(), body);

    let dir = TempDir::new("404");
    server.push(Plan::Status(404));
    let err = fetch_with(&server.url, &m, dir.path(), &quiet(2)).unwrap_err();
    assert!(
        err.to_string().contains("404") && err.to_string().contains(&server.url),
        "{err}"
    );
    assert!(!dir.join("file.bin").exists());
}

#[test]
fn fetched_zip_loads_as_a_corpus() {
    // an enwik8-like archive: one member, tail_bytes split
    let text = super::lcg_bytes(30_000, 17);
    let mut zip_bytes = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut zip_bytes);
        let o = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file("mini8", o).unwrap();
        z.write_all(&text).unwrap();
        z.finish().unwrap();
    }
    let zip_bytes = zip_bytes.into_inner();
    let server = Server::start(zip_bytes.clone(), vec![Plan::CutAfter(7_000)]);
    let dir = TempDir::new("zipcorpus");
    let mut m = manifest_for(&zip_bytes, Check::Sha256);
    m.file = "mini8.zip".into();
    m.member = Some("mini8".into());
    m.split = SplitRule::TailBytes {
        valid: 1000,
        test: 2000,
    };
    let path = fetch_with(&server.url, &m, dir.path(), &quiet(1))
        .unwrap()
        .path;
    assert_eq!(path, m.local_path(dir.path()));
    let c = m.load_corpus(dir.path()).unwrap();
    assert_eq!(c.train, text[..27_000]);
    assert_eq!(c.valid, text[27_000..28_000]);
    assert_eq!(c.test, text[28_000..]);
}

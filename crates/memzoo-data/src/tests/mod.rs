//! The crate's tests (one test binary).

mod batcher;
mod corpus;
mod fetch;
mod manifest;
mod pickle;
mod rust_code;
mod sentencepiece;
mod stats;
mod synthetic;
mod tasks;
mod tokenizer;
mod word_vocab;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh empty directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("memzoo-data-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shared tiny Shakespeare file, if this checkout has `../shared` beside it.
pub(crate) fn tiny_shakespeare() -> Option<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        here.join("../../../shared/data/tinyshakespeare.txt"),
        PathBuf::from("/work/shared/data/tinyshakespeare.txt"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Deterministic pseudo-random bytes (a small LCG, independent of the crate's generator).
pub(crate) fn lcg_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

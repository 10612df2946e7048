//! Checkpoints from the Hugging Face Hub: a model id (`owner/name`) where a checkpoint directory
//! is accepted, downloaded with the `hf-hub` crate into the standard Hugging Face cache, the one
//! Python's `huggingface_hub` reads and writes (`blobs/` named by ETag, `snapshots/<commit>/`
//! links to them, `refs/<revision>` holding the commit).
//!
//! The settings are Python's environment variables ([`HubOptions::from_env`]): `HF_ENDPOINT`,
//! `HF_HUB_CACHE` (else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), `HF_TOKEN` (else the
//! file `HF_TOKEN_PATH`, else `HF_HOME/token`) and `HF_HUB_OFFLINE`. Online, the repository's
//! file list at the revision gives its commit; each file the importers read
//! ([`CHECKPOINT_FILES`], and the first of [`WEIGHT_FILES`] it lists) is asked for by one small
//! ranged request, and downloaded (with a progress bar on a terminal) unless the cache already
//! holds its blob at full size. Offline, the cache alone is read: `refs/<revision>` (or the
//! commit itself) names the snapshot.
//!
//! [`snapshot`] returns the snapshot directory, which every importer reads as it reads a local
//! checkpoint directory. Every error names the repository, the revision and, where there is
//! one, the file.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};

/// The files of a checkpoint directory that an importer may read besides the weights: fetched
/// when the repository has them (`config.json` must be there).
pub const CHECKPOINT_FILES: &[&str] = &[
    "config.json",
    "rotations.safetensors",
    "vocab.json",
    "vocab.pkl",
    "spiece.model",
    "tokenizer_config.json",
];

/// Weight files in order of preference: only the first the repository has is fetched.
pub const WEIGHT_FILES: &[&str] = &[
    "model.safetensors",
    "pytorch_model.bin",
    "model.pth",
    "model.pt",
];

/// What the first request of a snapshot fetches, for messages.
const FILE_LIST: &str = "the file list";

/// The Hub's default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how Hub files are fetched.
#[derive(Debug, Clone, PartialEq)]
pub struct HubOptions {
    /// Branch, tag or commit (`--revision`; default `main`).
    pub revision: String,
    /// Read the cache alone, never the network (`HF_HUB_OFFLINE=1` or `--offline`).
    pub offline: bool,
    /// The Hub's address (`HF_ENDPOINT`).
    pub endpoint: String,
    /// The cache directory (`HF_HUB_CACHE`, else `HF_HOME/hub`).
    pub cache_dir: PathBuf,
    /// The access token for private and gated repositories (`HF_TOKEN`, else the token file).
    pub token: Option<String>,
    /// Draw a progress bar per downloaded file (only shown on a terminal).
    pub progress: bool,
}

impl HubOptions {
    /// The options Python's `huggingface_hub` would use, from the environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`HubOptions::from_env`] with the variables read through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let cache = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| home_dir().join(".cache"));
            cache.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(&token_path).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        Self {
            revision: "main".into(),
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v)),
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            cache_dir,
            token,
            progress: true,
        }
    }
}

/// `huggingface_hub`'s reading of a boolean variable.
fn is_true(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Why a Hub checkpoint could not be had. Every variant names the repository and revision.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The Hub answered with an error status (404: no such repository, revision or file; 401 /
    /// 403: private or gated, which needs `HF_TOKEN`).
    #[error(
        "the Hub ({endpoint}) answered HTTP {status} for {what} of {repo} at revision \
         {revision}{}",
        status_hint(*status, what)
    )]
    Status {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// `the file X` or `the file list`.
        what: String,
        /// The endpoint asked.
        endpoint: String,
        /// The HTTP status.
        status: u16,
    },
    /// The request failed for another reason (network, a malformed answer, the cache).
    #[error("cannot fetch {what} of {repo} at revision {revision} from {endpoint}: {message}")]
    Request {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// `the file X` or `the file list`.
        what: String,
        /// The endpoint asked.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// A download ended early: the file in the cache is shorter than the Hub said.
    #[error(
        "the download of {file} of {repo} at revision {revision} was truncated: {got} of {expected} \
         bytes (the partial file was removed; run the import again)"
    )]
    Truncated {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The file.
        file: String,
        /// The size the Hub gave.
        expected: u64,
        /// The size received.
        got: u64,
    },
    /// The repository has no `config.json`: not a checkpoint memzoo imports.
    #[error("{repo} at revision {revision} has no config.json (its files: {files})")]
    NoConfig {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The files it lists.
        files: String,
    },
    /// A name that would become a path in the cache and is not a safe one: a revision with a
    /// `..` component, or an ETag or commit from the server with other than letters, digits,
    /// `-`, `_`, `.`.
    #[error("{what} {value:?} of {repo} at revision {revision} cannot name a file in the cache")]
    UnsafeName {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// `the revision`, `the ETag of X`, `the commit`.
        what: String,
        /// The name.
        value: String,
    },
    /// Offline, and the cache does not hold the revision or a file of it.
    #[error(
        "offline (HF_HUB_OFFLINE or --offline) and the cache {cache} holds no {what} of {repo} at \
         revision {revision}: import it once online"
    )]
    NotCached {
        /// The repository id.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// `snapshot` or `file X`.
        what: String,
        /// The cache directory.
        cache: PathBuf,
    },
}

/// Whether `source` reads as a Hub model id: `owner/name`, each part of letters, digits, `-`,
/// `_` and `.`, neither starting with `.` nor `-`. (A caller checks first that it is no path
/// on disk.)
pub fn is_hub_id(source: &str) -> bool {
    let mut parts = source.split('/');
    let (Some(owner), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && !p.starts_with(['.', '-'])
            && !p.contains("..")
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    part_ok(owner) && part_ok(name)
}

/// A local checkpoint directory for `source`: `source` itself when it exists on disk, else the
/// Hub snapshot of the model id it names ([`snapshot`]). `None`: neither a path nor an id.
pub fn resolve(source: &Path, options: &HubOptions) -> Option<Result<PathBuf, HubError>> {
    if source.exists() {
        return Some(Ok(source.to_path_buf()));
    }
    let id = source.to_str().filter(|s| is_hub_id(s))?;
    Some(snapshot(id, options))
}

/// The snapshot directory of model `repo` at `options.revision` in the cache, with the
/// checkpoint's files in it: downloaded where the cache lacks them (online), or the cache
/// alone (`options.offline`).
pub fn snapshot(repo: &str, options: &HubOptions) -> Result<PathBuf, HubError> {
    let unsafe_name = |what: &str, value: &str| HubError::UnsafeName {
        repo: repo.into(),
        revision: options.revision.clone(),
        what: what.into(),
        value: value.into(),
    };
    // A branch may hold `/` (`refs/pr/1`), never an empty or `..` part.
    if !options.revision.split('/').all(safe_name) {
        return Err(unsafe_name("the revision", &options.revision));
    }
    if options.offline {
        return cached_snapshot(repo, options);
    }
    let hub = Hub::new(repo, options)?;
    let info = hub
        .api
        .repo(hub.at(&options.revision))
        .info()
        .map_err(|e| hub.error(FILE_LIST, e))?;
    let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    if !listed.contains(&"config.json") {
        return Err(HubError::NoConfig {
            repo: repo.into(),
            revision: options.revision.clone(),
            files: listed.join(", "),
        });
    }
    let mut files: Vec<&str> = CHECKPOINT_FILES
        .iter()
        .copied()
        .filter(|f| listed.contains(f))
        .collect();
    files.extend(WEIGHT_FILES.iter().copied().find(|f| listed.contains(f)));
    if !safe_name(&info.sha) {
        return Err(unsafe_name("the commit", &info.sha));
    }
    // Every file from the one commit the file list named, even if the branch moves meanwhile.
    let pinned = hub.at(&info.sha);
    let cache = Cache::new(options.cache_dir.clone());
    let mut dir = None;
    for file in files {
        let path = hub.fetch(&pinned, file)?;
        dir = path.parent().map(Path::to_path_buf);
    }
    // `refs/<revision>` names the commit, so that an offline import of the same revision (and
    // Python) finds the snapshot.
    if info.sha != options.revision {
        cache
            .repo(hub.at(&options.revision))
            .create_ref(&info.sha)
            .map_err(|e| hub.error("the cache's refs", ApiError::IoError(e)))?;
    }
    Ok(dir.unwrap_or_else(|| cache.repo(pinned).pointer_path(&info.sha)))
}

/// One repository on the Hub, with its client.
struct Hub<'a> {
    repo: &'a str,
    options: &'a HubOptions,
    api: Api,
}

impl<'a> Hub<'a> {
    fn new(repo: &'a str, options: &'a HubOptions) -> Result<Self, HubError> {
        let api = ApiBuilder::from_cache(Cache::new(options.cache_dir.clone()))
            .with_endpoint(options.endpoint.clone())
            .with_token(options.token.clone())
            .with_progress(options.progress)
            .with_user_agent("memzoo", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| hub_error(repo, options, "a client", e))?;
        Ok(Self { repo, options, api })
    }

    fn at(&self, revision: &str) -> Repo {
        Repo::with_revision(self.repo.into(), RepoType::Model, revision.into())
    }

    /// `file` of the pinned commit in the cache: its blob reused when complete, else downloaded;
    /// a short download removed and reported.
    fn fetch(&self, pinned: &Repo, file: &str) -> Result<PathBuf, HubError> {
        let what = format!("the file {file}");
        let api = self.api.repo(pinned.clone());
        let meta = self
            .api
            .metadata(&api.url(file))
            .map_err(|e| self.error(&what, e))?;
        for (name, value) in [("ETag", meta.etag()), ("commit", meta.commit_hash())] {
            if !safe_name(value) {
                return Err(HubError::UnsafeName {
                    repo: self.repo.into(),
                    revision: self.options.revision.clone(),
                    what: format!("the {name} of {file}"),
                    value: value.into(),
                });
            }
        }
        let cache = Cache::new(self.options.cache_dir.clone()).repo(pinned.clone());
        let blob = cache.blob_path(meta.etag());
        let pointer = cache.pointer_path(meta.commit_hash()).join(file);
        let expected = meta.size() as u64;
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
        if size(&blob) == Some(expected) {
            if size(&pointer) != Some(expected) {
                link(&blob, &pointer).map_err(|e| self.error(&what, ApiError::IoError(e)))?;
            }
            return Ok(pointer);
        }
        let path = api.download(file).map_err(|e| self.error(&what, e))?;
        let got = size(&path).unwrap_or(0);
        if got != expected {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&blob);
            return Err(HubError::Truncated {
                repo: self.repo.into(),
                revision: self.options.revision.clone(),
                file: file.into(),
                expected,
                got,
            });
        }
        Ok(path)
    }

    /// `e`, met while fetching `what`, as a [`HubError`] naming the repository and revision.
    fn error(&self, what: &str, e: ApiError) -> HubError {
        hub_error(self.repo, self.options, what, e)
    }
}

/// `e`, met while fetching `what` of `repo`, as a [`HubError`] naming the repository and
/// revision (an HTTP error status as [`HubError::Status`]).
fn hub_error(repo: &str, options: &HubOptions, what: &str, e: ApiError) -> HubError {
    let (repo, revision, endpoint) = (
        repo.to_string(),
        options.revision.clone(),
        options.endpoint.clone(),
    );
    if let ApiError::RequestError(inner) = &e
        && let ureq::Error::StatusCode(status) = **inner
    {
        return HubError::Status {
            repo,
            revision,
            what: what.into(),
            endpoint,
            status,
        };
    }
    HubError::Request {
        repo,
        revision,
        what: what.into(),
        endpoint,
        message: e.to_string(),
    }
}

/// Whether `name` can be one component of a path in the cache: not empty, not `.` or `..`,
/// only letters, digits, `-`, `_` and `.`.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Advice for an HTTP error status met fetching `what`.
fn status_hint(status: u16, what: &str) -> &'static str {
    match status {
        // The first request: the id may be a mistyped local path too.
        401 | 404 if what == FILE_LIST => {
            " (no such repository or revision, or a private or gated one, which needs an access \
             token: set HF_TOKEN; nor is it a directory here)"
        }
        401 | 403 => {
            " (a private or gated repository needs an access token: set HF_TOKEN; the Hub also \
             answers 401 for a repository that does not exist)"
        }
        404 => " (no such repository, revision or file)",
        _ => "",
    }
}

/// `pointer` made a relative symbolic link to `blob` (as the cache's other snapshot files), or a
/// copy where links are not allowed.
fn link(blob: &Path, pointer: &Path) -> std::io::Result<()> {
    if let Some(parent) = pointer.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let _ = std::fs::remove_file(pointer);
    #[cfg(unix)]
    {
        // snapshots/<commit>/<file> -> ../../blobs/<etag> (one more `..` per folder in file).
        let depth = pointer
            .parent()
            .and_then(|p| p.strip_prefix(blob.parent()?.parent()?).ok())
            .map_or(2, |rel| rel.components().count());
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(blob.file_name().unwrap_or_default());
        std::os::unix::fs::symlink(target, pointer)
    }
    #[cfg(not(unix))]
    {
        std::fs::copy(blob, pointer).map(|_| ())
    }
}

/// The cached snapshot of `repo` at `options.revision` with its `config.json`, without the
/// network.
fn cached_snapshot(repo: &str, options: &HubOptions) -> Result<PathBuf, HubError> {
    let not_cached = |what: String| HubError::NotCached {
        repo: repo.into(),
        revision: options.revision.clone(),
        what,
        cache: options.cache_dir.clone(),
    };
    let cache = Cache::new(options.cache_dir.clone()).repo(Repo::with_revision(
        repo.into(),
        RepoType::Model,
        options.revision.clone(),
    ));
    let refs = options
        .cache_dir
        .join(Repo::model(repo.into()).folder_name())
        .join("refs")
        .join(&options.revision);
    let commit = match std::fs::read_to_string(&refs) {
        Ok(commit) => commit.trim().to_string(),
        // A commit asked for by its hash has no ref.
        Err(_) => options.revision.clone(),
    };
    let dir = cache.pointer_path(&commit);
    if !dir.is_dir() {
        return Err(not_cached("snapshot".into()));
    }
    if !dir.join("config.json").is_file() {
        return Err(not_cached("file config.json".into()));
    }
    Ok(dir)
}

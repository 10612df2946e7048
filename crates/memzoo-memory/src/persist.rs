//! Saving and opening a memory: `header.json`, `keys.f32`, `values.f32` (memory-mapped when
//! read) and, for HNSW, the usearch index files.

use std::fs;
use std::path::Path;

use burn::tensor::Device;
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::config::{HnswConfig, IndexKind, KnnMemoryConfig};
use crate::error::MemoryError;
use crate::exact::ExactIndex;
use crate::hnsw::UsearchIndex;
use crate::{KnnIndex, RowState};

/// Identifies the file format.
pub const FORMAT: &str = "memzoo-knn-memory";
/// Current format version: 2 stores one head per kv head (`n_kv_heads`); version 1 (no
/// `n_kv_heads`) stored `n_heads` heads, copies of their kv head for a grouped layer.
pub const VERSION: u32 = 2;

/// Host copy of a memory's pairs.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Fill state per row.
    pub rows: Vec<RowState>,
    /// Slots per (row, kv head) in `keys` / `values` (the largest row `len`).
    pub slots: usize,
    /// `[batch, kv_heads, slots, d_head]`, row-major.
    pub keys: Vec<f32>,
    /// `[batch, kv_heads, slots, d_head]`, row-major.
    pub values: Vec<f32>,
}

/// The `header.json` of a saved memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// Always [`FORMAT`].
    pub format: String,
    /// Format version.
    pub version: u32,
    /// `exact` or `hnsw`.
    pub kind: IndexKind,
    /// Batch rows.
    pub batch: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Stored (key/value) heads: the heads of the data files. Absent in version 1, whose
    /// files hold `n_heads` heads.
    #[serde(default)]
    pub n_kv_heads: Option<usize>,
    /// Width of keys and values.
    pub d_head: usize,
    /// Capacity per (row, kv head).
    pub max_memories: usize,
    /// HNSW parameters (connectivity is fixed in the index files).
    pub hnsw: HnswConfig,
    /// Slots per (row, kv head) in the data files.
    pub slots: usize,
    /// Fill state per row.
    pub rows: Vec<RowState>,
    /// CRC-32 of `keys.f32`.
    pub keys_crc32: u32,
    /// CRC-32 of `values.f32`.
    pub values_crc32: u32,
    /// CRC-32 of every usearch index file, `b * kv_heads + g` (HNSW only).
    pub index_crc32: Vec<u32>,
}

fn write_f32(path: &Path, data: &[f32]) -> Result<u32, MemoryError> {
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for x in data {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    fs::write(path, &bytes).map_err(|e| MemoryError::io(path, e))?;
    Ok(crc32fast::hash(&bytes))
}

/// Saves `index` into `dir` (see the module docs for the layout).
pub fn save<I: KnnIndex + ?Sized>(index: &I, dir: &Path) -> Result<(), MemoryError> {
    fs::create_dir_all(dir).map_err(|e| MemoryError::io(dir, e))?;
    let config = index.config();
    let snap = index.snapshot()?;
    let keys_crc32 = write_f32(&dir.join("keys.f32"), &snap.keys)?;
    let values_crc32 = write_f32(&dir.join("values.f32"), &snap.values)?;
    let index_crc32 = index.save_extra(dir)?;
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        kind: index.kind(),
        batch: index.batch(),
        n_heads: config.n_heads,
        n_kv_heads: Some(config.kv_heads()),
        d_head: config.d_head,
        max_memories: config.max_memories,
        hnsw: config.hnsw.clone(),
        slots: snap.slots,
        rows: snap.rows,
        keys_crc32,
        values_crc32,
        index_crc32,
    };
    let path = dir.join("header.json");
    let json = serde_json::to_string_pretty(&header).expect("header serialises");
    fs::write(&path, json).map_err(|e| MemoryError::io(&path, e))
}

/// Reads a `f32` file through a memory map, checking its length and CRC-32.
fn read_f32(dir: &Path, name: &str, len: usize, crc: u32) -> Result<Vec<f32>, MemoryError> {
    let path = dir.join(name);
    let corrupt = |message: String| MemoryError::Corrupt {
        dir: dir.to_path_buf(),
        message,
    };
    let file = fs::File::open(&path).map_err(|e| MemoryError::io(&path, e))?;
    let size = file
        .metadata()
        .map_err(|e| MemoryError::io(&path, e))?
        .len();
    if Some(size) != (len as u64).checked_mul(4) {
        return Err(corrupt(format!(
            "{name} has {size} bytes, the header implies {len} floats"
        )));
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the file is opened read-only and not modified while mapped (we own the dir).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| MemoryError::io(&path, e))?;
    let actual = crc32fast::hash(&map);
    if actual != crc {
        return Err(corrupt(format!(
            "{name} has CRC-32 {actual:08x}, the header says {crc:08x}"
        )));
    }
    Ok(map
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// Opens a memory saved by [`KnnIndex::save`], on `device`.
///
/// `config` must agree with the saved memory in `n_heads`, `n_kv_heads`, `d_head`,
/// `max_memories`, the backend (`auto` resolved) and HNSW connectivity; search-time
/// parameters (`expansion_search`, `topk`) are taken from `config`. Any missing, damaged
/// (CRC, size) or mismatched file is a [`MemoryError`] naming it.
///
/// A version-1 memory (saved before stores were per kv head) holds `n_heads` heads; opened
/// with a grouped config (`n_kv_heads < n_heads`) it keeps the first head of every group,
/// after checking that the group's heads are identical copies (what a grouped layer stored
/// then); heads that differ (a memory of a layer without grouped heads) are an error.
pub fn open(
    dir: &Path,
    config: &KnnMemoryConfig,
    device: &Device,
) -> Result<Box<dyn KnnIndex>, MemoryError> {
    config.validate()?;
    let corrupt = |message: String| MemoryError::Corrupt {
        dir: dir.to_path_buf(),
        message,
    };
    let path = dir.join("header.json");
    let text = fs::read_to_string(&path).map_err(|e| MemoryError::io(&path, e))?;
    let header: Header =
        serde_json::from_str(&text).map_err(|e| corrupt(format!("header.json: {e}")))?;
    if header.format != FORMAT || !(1..=VERSION).contains(&header.version) {
        return Err(corrupt(format!(
            "header.json is format `{}` v{}, expected `{FORMAT}` v1 to v{VERSION}",
            header.format, header.version
        )));
    }
    // The heads in the data files: version 1 stored one per query head.
    let saved_kv = match (header.version, header.n_kv_heads) {
        (1, _) => header.n_heads,
        (_, Some(hk)) if hk > 0 && header.n_heads.is_multiple_of(hk) => hk,
        (_, hk) => {
            return Err(corrupt(format!(
                "header.json v{} has n_kv_heads {hk:?}, expected a divisor of n_heads {}",
                header.version, header.n_heads
            )));
        }
    };
    let kind = config.resolved_kind();
    let checks = [
        ("n_heads", header.n_heads, config.n_heads),
        ("d_head", header.d_head, config.d_head),
        ("max_memories", header.max_memories, config.max_memories),
    ];
    for (name, saved, wanted) in checks {
        if saved != wanted {
            return Err(corrupt(format!(
                "saved {name} = {saved}, the config asks for {wanted}"
            )));
        }
    }
    // Saved heads per kv head of the config: 1, or the group size for a version-1 memory
    // of copies (see the docs).
    let stride = if saved_kv == config.kv_heads() {
        1
    } else if header.version == 1 && saved_kv == config.n_heads {
        config.group()
    } else {
        return Err(corrupt(format!(
            "saved {saved_kv} key/value heads, the config asks for n_kv_heads = {}",
            config.kv_heads()
        )));
    };
    if header.kind != kind {
        return Err(corrupt(format!(
            "saved index kind {:?}, the config resolves to {kind:?}",
            header.kind
        )));
    }
    if kind == IndexKind::Hnsw && header.hnsw.connectivity != config.hnsw.connectivity {
        return Err(corrupt(format!(
            "saved HNSW connectivity {}, the config asks for {}",
            header.hnsw.connectivity, config.hnsw.connectivity
        )));
    }
    if header.batch == 0 || header.rows.len() != header.batch {
        return Err(corrupt(format!(
            "header lists {} rows for batch {}",
            header.rows.len(),
            header.batch
        )));
    }
    for (b, r) in header.rows.iter().enumerate() {
        let full_ok = r.len == header.max_memories || r.next == r.len % header.max_memories;
        if r.len > header.slots || r.len > header.max_memories || !full_ok {
            return Err(corrupt(format!(
                "row {b} has len {} and next {} (slots {}, max_memories {})",
                r.len, r.next, header.slots, header.max_memories
            )));
        }
    }
    let n = [saved_kv, header.slots, header.d_head]
        .into_iter()
        .try_fold(header.batch, usize::checked_mul)
        .ok_or_else(|| {
            corrupt(format!(
                "header.json: batch {} x heads {saved_kv} x slots {} x d_head {} floats overflow",
                header.batch, header.slots, header.d_head
            ))
        })?;
    let keys = read_f32(dir, "keys.f32", n, header.keys_crc32)?;
    let values = read_f32(dir, "values.f32", n, header.values_crc32)?;
    let mut snap = Snapshot {
        rows: header.rows.clone(),
        slots: header.slots,
        keys,
        values,
    };
    if stride > 1 {
        snap = one_head_per_group(snap, saved_kv, stride, header.d_head).map_err(corrupt)?;
    }
    // A reset-when-full memory reopens with every row searchable (which rows were reset by
    // their last add is not saved).
    Ok(config.wrap(match kind {
        IndexKind::Hnsw => {
            let expected = header.batch * saved_kv;
            if header.index_crc32.len() != expected {
                return Err(corrupt(format!(
                    "header lists {} index checksums, expected {expected}",
                    header.index_crc32.len()
                )));
            }
            for (i, &crc) in header.index_crc32.iter().enumerate() {
                let name = UsearchIndex::file_name(i / saved_kv, i % saved_kv);
                let path = dir.join(&name);
                let bytes = fs::read(&path).map_err(|e| MemoryError::io(&path, e))?;
                let actual = crc32fast::hash(&bytes);
                if actual != crc {
                    return Err(corrupt(format!(
                        "{name} has CRC-32 {actual:08x}, the header says {crc:08x}"
                    )));
                }
            }
            Box::new(UsearchIndex::from_snapshot(config, snap, dir, stride)?) as Box<dyn KnnIndex>
        }
        _ => Box::new(ExactIndex::from_snapshot(config, snap, device)),
    }))
}

/// `snap` (`[batch, heads, slots, d]`, `heads = kv_heads * group`) with only the first head
/// of every group of `group` consecutive heads, after checking that the group's stored pairs
/// (every row's first `len` slots) are identical; else a message naming the first that differs.
fn one_head_per_group(
    snap: Snapshot,
    heads: usize,
    group: usize,
    d: usize,
) -> Result<Snapshot, String> {
    let (slots, kv_heads) = (snap.slots, heads / group);
    let at = |b: usize, h: usize| (b * heads + h) * slots * d;
    let mut keys = Vec::with_capacity(snap.keys.len() / group);
    let mut values = Vec::with_capacity(snap.values.len() / group);
    for (b, row) in snap.rows.iter().enumerate() {
        for g in 0..kv_heads {
            let first = at(b, g * group);
            for j in 1..group {
                let other = at(b, g * group + j);
                let n = row.len * d;
                for (name, data) in [("keys", &snap.keys), ("values", &snap.values)] {
                    if data[first..first + n] != data[other..other + n] {
                        return Err(format!(
                            "version-1 {name} of row {b}: head {} differs from head {} of its \
                             group of {group}, so they are not copies of one kv head (a memory \
                             of a layer without grouped heads cannot be opened with \
                             n_kv_heads = {kv_heads})",
                            g * group + j,
                            g * group
                        ));
                    }
                }
            }
            keys.extend_from_slice(&snap.keys[first..first + slots * d]);
            values.extend_from_slice(&snap.values[first..first + slots * d]);
        }
    }
    Ok(Snapshot {
        keys,
        values,
        ..snap
    })
}

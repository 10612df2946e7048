//! Config files of earlier layouts, converted to today's on reading: the layout before the one
//! model description (`model_kind` choosing `[model]`, `[reformer]` or `[memorizing]`), keys
//! that have since moved into sub-sections (the Reformer's LSH settings into `lsh`, the
//! Memorizing preset's kNN settings into `knn`, the peer-compatibility switches into
//! `[model.compat]`), and settings of layers a stack does not have. Each conversion is tested
//! with config files the earlier code wrote (`tests/fixtures/old-layout/`,
//! `tests/fixtures/pre-compat/`).

use std::path::Path;

use memzoo_stack::{MemorizingConfig, PeerCompat, ReformerConfig};
use serde::Serialize;
use serde_json::Value;

use super::{ModelKind, Preset, merge};
use crate::error::CliError;

/// The sections and keys of the layout before the one model description (`model_kind`,
/// `[reformer]`, `[memorizing]`), which old run directories hold.
pub(super) const OLD_SECTIONS: [&str; 3] = ["model_kind", "reformer", "memorizing"];

/// Converts the layout of runs written before the one model description: `model_kind`
/// picked one of `[model]` (Transformer-XL), `[reformer]` and `[memorizing]` (the Reformer's
/// and the Memorizing Transformer's preset configs). The chosen section becomes the layer
/// stack in `[model]` (its fields filled from the old defaults, `reformer-tiny` and
/// `memorizing-tiny`, where the file lacks them); the others are dropped. `None` for a file in
/// today's layout.
pub(super) fn convert_old_layout(
    user: &mut Value,
    path: &Path,
) -> Result<Option<String>, CliError> {
    let Some(table) = user.as_object_mut() else {
        return Ok(None);
    };
    if !OLD_SECTIONS.iter().any(|k| table.contains_key(*k)) {
        return Ok(None);
    }
    let shown = path.display();
    let kind: ModelKind = match table.remove("model_kind") {
        None => ModelKind::Xl,
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            CliError::Config(format!(
                "config {shown}: model_kind = {v} (an old layout) is not xl, reformer or \
                 memorizing"
            ))
        })?,
    };
    let mut reformer = table.remove("reformer");
    let mut memorizing = table.remove("memorizing");
    // Keys that have moved since: the Reformer's LSH settings into its `lsh`, the Memorizing
    // preset's kNN settings into its `knn`, the stack's peer-compatibility switches into its
    // `compat`.
    if let Some(old) = reformer.as_mut().and_then(Value::as_object_mut) {
        let mut lsh = serde_json::Map::new();
        for (old_key, key) in OLD_REFORMER_LSH_KEYS {
            if let Some(v) = old.remove(old_key) {
                lsh.insert(key.into(), v);
            }
        }
        if !lsh.is_empty() {
            old.insert("lsh".into(), Value::Object(lsh));
        }
    }
    if let Some(old) = memorizing.as_mut().and_then(Value::as_object_mut) {
        let mut knn = serde_json::Map::new();
        for key in OLD_MEMORIZING_KNN_KEYS {
            if let Some(v) = old.remove(key) {
                knn.insert(key.into(), v);
            }
        }
        if !knn.is_empty() {
            old.insert("knn".into(), Value::Object(knn));
        }
        if let Some(xl) = old.get_mut("xl") {
            move_compat_keys(xl);
        }
    }
    // The old section over the old defaults, read as the preset config it was.
    fn section<C: Serialize + serde::de::DeserializeOwned>(
        defaults: &C,
        old: Option<&Value>,
        name: &str,
        shown: &std::path::Display<'_>,
    ) -> Result<C, CliError> {
        let mut base = serde_json::to_value(defaults).expect("serialisable");
        if let Some(old) = old {
            merge(&mut base, old, name)?;
        }
        serde_json::from_value(base).map_err(|e| {
            CliError::Config(format!(
                "config {shown}: old section [{name}] is invalid: {e}"
            ))
        })
    }
    let stack = match kind {
        ModelKind::Xl => None,
        ModelKind::Reformer => {
            let config: ReformerConfig = section(
                &Preset::reformer_tiny(),
                reformer.as_ref(),
                "reformer",
                &shown,
            )?;
            config.validate()?;
            Some(config.stack())
        }
        ModelKind::Memorizing => {
            let config: MemorizingConfig = section(
                &Preset::memorizing_tiny(),
                memorizing.as_ref(),
                "memorizing",
                &shown,
            )?;
            config.validate()?;
            Some(config.stack())
        }
    };
    let name = match kind {
        ModelKind::Xl => "xl",
        ModelKind::Reformer => "reformer",
        ModelKind::Memorizing => "memorizing",
    };
    let section = match kind {
        ModelKind::Xl => "[model]",
        ModelKind::Reformer => "[reformer]",
        ModelKind::Memorizing => "[memorizing]",
    };
    if let Some(stack) = stack {
        table.insert(
            "model".into(),
            serde_json::to_value(stack).expect("serialisable"),
        );
    }
    // Settings of layers the stack does not have read as the starting point's, as a run
    // written now leaves them out (their defaults have changed since: the LSH chunks).
    if let Some(model) = table.get_mut("model").and_then(Value::as_object_mut) {
        let kinds: Vec<String> = model
            .get("layers")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !kinds.iter().any(|k| k == "knn") {
            model.remove("knn");
        }
        if !kinds.iter().any(|k| matches!(k.as_str(), "lsh" | "local")) {
            model.remove("lsh");
        }
    }
    Ok(Some(format!(
        "config {shown} has the old layout (model_kind = \"{name}\"); its {section} section is \
         read as the layer stack in [model] (a {name} stack). A run written now keeps only \
         [model], [train] and [data]."
    )))
}

/// The old `[reformer]` section's LSH keys and their names in the preset's `lsh`
/// ([`memzoo_stack::LshConfig`]).
const OLD_REFORMER_LSH_KEYS: [(&str, &str); 13] = [
    ("bucket_size", "chunk_len"),
    ("n_buckets", "n_buckets"),
    ("n_rounds", "n_rounds"),
    ("n_chunks_before", "n_chunks_before"),
    ("n_chunks_after", "n_chunks_after"),
    ("causal", "causal"),
    ("lsh_scores", "scores"),
    ("eval_seed", "seed"),
    ("local_chunk_len", "local_chunk_len"),
    ("bucket_factors", "bucket_factors"),
    ("dedup_rounds", "dedup_rounds"),
    ("rotations_per_head", "rotations_per_head"),
    ("key_eps", "key_eps"),
];

/// The old `[memorizing]` section's kNN keys, now those of its `knn`
/// ([`memzoo_stack::KnnLayerConfig`]).
const OLD_MEMORIZING_KNN_KEYS: [&str; 6] = [
    "top_k",
    "max_memories",
    "index",
    "auto_crossover",
    "hnsw",
    "attn_scale_init",
];

/// Moves the peer-compatibility switches a stack's section sets at its top level (where
/// `config.toml` files held them before `[model.compat]`) into its `compat`; the names moved,
/// `None` where there were none.
pub(super) fn move_compat_keys(stack: &mut Value) -> Option<Vec<&'static str>> {
    let table = stack.as_object_mut()?;
    let moved: Vec<(&str, Value)> = PeerCompat::KEYS
        .iter()
        .filter_map(|&k| table.remove(k).map(|v| (k, v)))
        .collect();
    if moved.is_empty() {
        return None;
    }
    let compat = table
        .entry("compat")
        .or_insert_with(|| Value::Object(Default::default()));
    let names = moved.iter().map(|(k, _)| *k).collect();
    if let Some(compat) = compat.as_object_mut() {
        for (k, v) in moved {
            // A value the file also sets in [model.compat] wins.
            compat.entry(k).or_insert(v);
        }
    }
    Some(names)
}

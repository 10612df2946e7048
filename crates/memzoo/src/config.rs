//! The run configuration of the CLI: one TOML file with `[model]`, `[train]` and `[data]`
//! sections, every field overridable from the command line with `--set section.field=value`.

use std::path::Path;

use memzoo_data::LongRangeConfig;
use memzoo_stack::{LayerKind, NormKind, PeerCompat, XlConfig};
use memzoo_train::TrainConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::CliError;
pub use crate::preset::Preset;

mod convert;
use convert::{OLD_SECTIONS, convert_old_layout, move_compat_keys};

/// A model family, as `memzoo train --model FAMILY` names it: the family's tiny preset
/// ([`Preset::tiny`]). A run stores no family: it is derived from the layers of `[model]`
/// ([`RunConfig::family`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Transformer-XL (`xl-tiny`).
    #[default]
    Xl,
    /// Reformer: LSH attention, reversible layers (`reformer-tiny`).
    Reformer,
    /// Memorizing Transformer: XL layers and kNN attention over an external memory
    /// (`memorizing-tiny`).
    Memorizing,
}

/// `[model]`: the layer stack, and the preset it started from, if any.
///
/// In a TOML file, `preset = "NAME"` fills every field from that preset first, then the
/// file's other fields apply on top; a run's `config.toml` names its preset and lists the
/// fields the run uses.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ModelSection {
    /// The preset the model started from (a record of the recipe; the stack's fields are the
    /// model). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// The layer stack.
    #[serde(flatten)]
    pub stack: XlConfig,
}

impl ModelSection {
    /// The stack of `preset`, naming it.
    pub fn from_preset(preset: Preset) -> Self {
        Self {
            preset: Some(preset),
            stack: preset.model(),
        }
    }
}

impl std::ops::Deref for ModelSection {
    type Target = XlConfig;
    fn deref(&self) -> &XlConfig {
        &self.stack
    }
}

impl std::ops::DerefMut for ModelSection {
    fn deref_mut(&mut self) -> &mut XlConfig {
        &mut self.stack
    }
}

/// Where the data comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// A text file (plain, `.gz` or `.zip`) or the name of a known data set (`memzoo data list`),
    /// or `rust-code` (the `.rs` sources of the crates in memzoo's Cargo.lock, one document per
    /// crate, prepared by `memzoo data prepare rust-code` under `data_dir`). Empty: the generated
    /// long-range corpus (`[data.generated]`).
    ///
    /// Data made of documents (the generated corpus, `rust-code`; [`DataConfig::has_documents`])
    /// are read as documents by every family, in `memzoo train` and `memzoo eval` alike: each
    /// document laid out in one batch row from a segment boundary (padded with byte 0, whose
    /// targets the loss ignores), and the row's memory cleared where its document starts
    /// ([`RunConfig::on_data`]). Any other file or data set is read as one stream.
    #[serde(default)]
    pub source: Option<String>,
    /// Member of a `.zip` archive to read (default: its only member).
    #[serde(default)]
    pub member: Option<String>,
    /// Fraction of a plain file used for validation (its last part). Default 0.05.
    #[serde(default = "default_fraction")]
    pub valid_fraction: f64,
    /// Fraction used for test (the part before validation). Default 0.05.
    #[serde(default = "default_fraction")]
    pub test_fraction: f64,
    /// Where known data sets are downloaded. Default `data`.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// The generated long-range corpus (used when `source` is empty).
    #[serde(default)]
    pub generated: LongRangeConfig,
    /// Id of byte 0: byte `b` is token `byte_offset + b` everywhere text becomes ids and back
    /// (the three splits, `memzoo eval`, `memzoo generate`'s prompt and output, `--data` on
    /// import); ids below it are reserved. Default 0 (a byte is its own id). 2 for
    /// `google/reformer-enwik8` (tensor2tensor's byte encoder reserves PAD 0 and EOS 1), which
    /// `memzoo import --from hf-reformer` sets from the model's vocabulary of 258.
    #[serde(default)]
    pub byte_offset: u16,
}

impl DataConfig {
    /// Whether the data are documents, read per row with memory resets at document starts
    /// (see [`DataConfig::source`]): the generated corpus and `rust-code`.
    pub fn has_documents(&self) -> bool {
        matches!(
            self.source.as_deref(),
            None | Some("") | Some("generated") | Some(memzoo_data::rust_code::NAME)
        )
    }
}

fn default_fraction() -> f64 {
    0.05
}

fn default_data_dir() -> String {
    "data".into()
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            source: None,
            member: None,
            valid_fraction: default_fraction(),
            test_fraction: default_fraction(),
            data_dir: default_data_dir(),
            generated: LongRangeConfig::default(),
            byte_offset: 0,
        }
    }
}

/// Everything a run needs besides the device: `[model]` (the layer stack), `[train]` and
/// `[data]`. The family is not stored: [`RunConfig::family`] derives it from the layers.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RunConfig {
    /// The layer stack (`[model]`).
    pub model: ModelSection,
    /// Training configuration (`[train]`).
    pub train: TrainConfig,
    /// Data (`[data]`).
    pub data: DataConfig,
}

impl Default for RunConfig {
    /// The default run ([`Preset::XlTiny`]): a tiny XL learning in about a minute on 2 cores to
    /// copy text whose source lies 22 bytes back (the generated corpus of
    /// `LongRangeConfig::near`): always beyond its segment of 8 bytes, always within its memory
    /// of 24. Many cheap steps learn that copy (a head attending 21 positions back, into the
    /// memory); the 4-layer, d_model 128 XL with segments of 64 bytes did not learn it in 1,000
    /// steps. No dropout: the task has nothing to overfit.
    fn default() -> Self {
        Self::with_preset(Preset::XlTiny)
    }
}

impl RunConfig {
    /// `preset`'s stack and recipe on the default data (the generated corpus).
    pub fn with_preset(preset: Preset) -> Self {
        Self {
            model: ModelSection::from_preset(preset),
            train: preset.train(),
            data: DataConfig {
                generated: LongRangeConfig::near(),
                ..DataConfig::default()
            },
        }
    }

    /// Defaults, then the TOML file (if any), then the `--set` overrides, in that order.
    ///
    /// Unknown sections or fields and ill-typed values are errors that name them.
    pub fn resolve(file: Option<&Path>, sets: &[String]) -> Result<Self, CliError> {
        Self::resolve_preset(None, file, sets)
    }

    /// Defaults, then the preset (if any), then the TOML file, then the `--set` overrides.
    pub fn resolve_preset(
        preset: Option<Preset>,
        file: Option<&Path>,
        sets: &[String],
    ) -> Result<Self, CliError> {
        // The file first: its `[model] preset` (or an old layout) decides what it starts from.
        let (user, file_preset) = match file {
            Some(path) => {
                let (user, preset) = read_file(path)?;
                (Some(user), preset)
            }
            None => (None, None),
        };
        // `--set model.preset=NAME` chooses the preset as `--preset NAME` does.
        let mut set_preset = None;
        for set in sets {
            if let Some((key, raw)) = set.split_once('=')
                && key.trim() == "model.preset"
            {
                let v = parse_scalar(raw.trim());
                set_preset = Some(serde_json::from_value::<Preset>(v.clone()).map_err(|_| {
                    CliError::Config(format!(
                        "--set model.preset={v}: not a preset (memzoo train --help lists them)"
                    ))
                })?);
            }
        }
        let mut preset = preset;
        for (what, named) in [
            ("--set model.preset", set_preset),
            ("the config file's preset", file_preset),
        ] {
            match (preset, named) {
                (Some(a), Some(b)) if a != b => {
                    return Err(CliError::Conflict(format!(
                        "preset {} but {what} names {}: give one",
                        a.name(),
                        b.name()
                    )));
                }
                (None, b) => preset = b,
                _ => {}
            }
        }
        let mut base = RunConfig::with_preset(preset.unwrap_or(Preset::XlTiny));
        // A file that describes its model without naming a preset started from none.
        if file.is_some() && preset.is_none() {
            base.model.preset = None;
        }
        let mut value = serde_json::to_value(base).expect("serialisable");
        if let Some(user) = user {
            merge(&mut value, &user, "")?;
        }
        for set in sets {
            let (key, raw) = set.split_once('=').ok_or_else(|| {
                CliError::Config(format!("--set `{set}`: expected section.field=value"))
            })?;
            let key = key.trim();
            if key == "model.preset" {
                continue; // chosen above
            }
            if let Some(old) = OLD_SECTIONS
                .iter()
                .find(|o| key == **o || key.starts_with(&format!("{o}.")))
            {
                return Err(CliError::Config(format!(
                    "--set {key}: `{old}` is an old layout; a run's model is the layer stack in \
                     [model] (pick a family with --model or --preset, then set model.* fields, \
                     e.g. model.lsh.n_rounds or model.knn.max_memories)"
                )));
            }
            if let Some(field) = key.strip_prefix("model.")
                && PeerCompat::KEYS.contains(&field)
            {
                return Err(CliError::Config(format!(
                    "--set {key}: the peer-compatibility switches are in [model.compat]: \
                     --set model.compat.{field}=..."
                )));
            }
            set_path(&mut value, key, parse_scalar(raw.trim()))?;
        }
        Self::from_value(value)
    }

    /// Parses a resolved JSON value, rejecting fields the types do not know and integers a
    /// TOML file cannot hold.
    fn from_value(value: Value) -> Result<Self, CliError> {
        toml_integers(&value, "")?;
        let config: RunConfig = serde_json::from_value(value.clone())
            .map_err(|e| CliError::Config(format!("invalid config: {e}")))?;
        // Burn's Config derive ignores unknown fields: compare with a round trip.
        let back = serde_json::to_value(&config).expect("serialisable");
        unknown_fields(&value, &back, "")?;
        Ok(config)
    }

    /// The layer stack this run trains (`[model]`): whatever builds the run's model
    /// (`memzoo train`, `eval`, `generate`, `export`, `recl`) builds this stack.
    pub fn stack(&self) -> XlConfig {
        self.model.stack.clone()
    }

    /// The run's model family (`xl`, `reformer` or `memorizing`), computed from the layers of
    /// its stack ([`XlConfig::family`]): the one place a run's family is decided, and the label
    /// its checkpoints carry.
    pub fn family(&self) -> &'static str {
        self.model.family()
    }

    /// The config as a run uses it on its data. On data made of documents
    /// ([`DataConfig::has_documents`]) every stack clears a batch row's memory where a new
    /// document starts (`model.document_resets = true`); a stack with LSH or local layers
    /// cannot hide a finished document's memory per row, so one that carries memory
    /// (`model.mem_len` > 0, or kNN layers) is refused there. On a stream, the config as it is.
    pub fn on_data(mut self) -> Result<Self, CliError> {
        if !self.data.has_documents() {
            return Ok(self);
        }
        let kinds = self.model.layer_kinds();
        let hashed = kinds
            .iter()
            .any(|k| matches!(k, LayerKind::Lsh | LayerKind::Local));
        if hashed && (self.model.mem_len > 0 || kinds.contains(&LayerKind::Knn)) {
            return Err(CliError::Config(format!(
                "model.mem_len = {} with model.layers = {:?} on {}: LSH and local layers cannot \
                 clear a finished document's memory per row, and data made of documents reset \
                 memory at every document start; set model.mem_len = 0 without kNN layers, or \
                 train on a stream (a text file or data set)",
                self.model.mem_len,
                kinds,
                self.data
                    .source
                    .as_deref()
                    .unwrap_or("the generated corpus"),
            )));
        }
        // A stack without memory has nothing to reset (and LSH layers refuse the flag).
        if !hashed {
            self.model.document_resets = true;
        }
        Ok(self)
    }

    /// Checks every section, naming the bad field.
    pub fn validate(&self) -> Result<(), CliError> {
        self.model.validate()?;
        if let Some(axial) = &self.model.axial {
            let [a1, a2] = axial.shape;
            if self.train.tgt_len > a1 * a2 {
                return Err(CliError::Config(format!(
                    "train.tgt_len ({}) exceeds the positions model.axial.shape {a1} x {a2} = {} \
                     can number",
                    self.train.tgt_len,
                    a1 * a2
                )));
            }
        }
        if let Some(len) = self.model.learned_positions
            && self.train.tgt_len > len
        {
            return Err(CliError::Config(format!(
                "train.tgt_len ({}) exceeds the {len} positions of model.learned_positions",
                self.train.tgt_len
            )));
        }
        self.train.validate()?;
        if !(0.0..1.0).contains(&(self.data.valid_fraction + self.data.test_fraction)) {
            return Err(CliError::Config(format!(
                "data.valid_fraction + data.test_fraction must be below 1, got {} + {}",
                self.data.valid_fraction, self.data.test_fraction
            )));
        }
        self.data.generated.validate()?;
        Ok(())
    }

    /// The config as TOML (what a run directory keeps): the fields the run uses. The kNN
    /// settings only with kNN layers, the LSH ones only with LSH or local layers,
    /// `train_memory_lengths` only when not empty, `positions.learned_biases` only when off, the
    /// peer-compatibility switches (`[model.compat]`) only where they differ from the preset's,
    /// the generated corpus only when it is the data; what is left out reads back as the
    /// preset's.
    pub fn to_toml(&self) -> String {
        let mut value = serde_json::to_value(self).expect("serialisable");
        let kinds = self.model.layer_kinds();
        if let Some(model) = value.get_mut("model").and_then(Value::as_object_mut) {
            if !kinds.contains(&LayerKind::Knn) {
                model.remove("knn");
            }
            if !kinds
                .iter()
                .any(|k| matches!(k, LayerKind::Lsh | LayerKind::Local))
            {
                model.remove("lsh");
            }
            // The norm kind and the residual streams only where they are not the plain
            // stack's (an imported RMSNorm stack, hyper-connections).
            if self.model.norm == NormKind::Layer {
                model.remove("norm");
            }
            if self.model.residual_streams == 1 {
                model.remove("residual_streams");
            }
            // Training with varied memory lengths only where the run does.
            if self.model.train_memory_lengths.is_empty() {
                model.remove("train_memory_lengths");
            }
            // The learned scheme's biases switch only where it is off (as imports set it).
            if self.model.positions.learned_biases
                && let Some(p) = model.get_mut("positions").and_then(Value::as_object_mut)
            {
                p.remove("learned_biases");
            }
        }
        // The peer-compatibility switches only where they differ from the starting point's.
        let base = serde_json::to_value(RunConfig::with_preset(
            self.model.preset.unwrap_or(Preset::XlTiny),
        ))
        .expect("serialisable");
        if let Some(model) = value.get_mut("model").and_then(Value::as_object_mut)
            && model.get("compat") == base.pointer("/model/compat")
        {
            model.remove("compat");
        }
        let generated = matches!(
            self.data.source.as_deref(),
            None | Some("") | Some("generated")
        );
        if !generated && let Some(data) = value.get_mut("data").and_then(Value::as_object_mut) {
            data.remove("generated");
        }
        // TOML has no null: a `None` is left out where the reader's starting point (the named
        // preset, else the default run) has none too, and written `"none"` where it has a value.
        toml::to_string_pretty(&write_nulls(value, Some(&base))).unwrap_or_default()
    }

    /// Reads a run directory's `config.toml`, then applies `sets`.
    pub fn from_run_dir(run_dir: &Path, sets: &[String]) -> Result<Self, CliError> {
        let path = run_dir.join("config.toml");
        if !path.exists() {
            return Err(CliError::NotARun {
                dir: run_dir.to_path_buf(),
            });
        }
        // Saved configs are complete, but resolve() also fills fields added since.
        Self::resolve(Some(&path), sets)
    }
}

/// A config file as a JSON value (an old layout converted, saying so on stderr), and the
/// preset its `[model]` names.
fn read_file(path: &Path) -> Result<(Value, Option<Preset>), CliError> {
    let text = read_config(path)?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        CliError::Config(format!("config {} is not valid TOML: {e}", path.display()))
    })?;
    let mut user = serde_json::to_value(table)
        .map_err(|e| CliError::Config(format!("config {} cannot be read: {e}", path.display())))?;
    if let Some(note) = convert_old_layout(&mut user, path)? {
        eprintln!("note: {note}");
    }
    if let Some(model) = user.get_mut("model")
        && let Some(moved) = move_compat_keys(model)
    {
        eprintln!(
            "note: config {} sets {} in [model]; they are read from [model.compat] now",
            path.display(),
            moved.join(", ")
        );
    }
    let preset = match user.get("model").and_then(|m| m.get("preset")) {
        None => None,
        Some(v) => Some(serde_json::from_value::<Preset>(v.clone()).map_err(|_| {
            CliError::Config(format!(
                "config {}: model.preset = {v} is not a preset (memzoo train --help lists them)",
                path.display()
            ))
        })?),
    };
    Ok((user, preset))
}

/// The largest config file read (a run's config.toml is a few KiB).
const CONFIG_LIMIT: u64 = 1 << 20;

/// A config file's text: a regular file (not a FIFO, which would block, or a device such as
/// `/dev/zero`, which never ends) of at most [`CONFIG_LIMIT`] bytes.
fn read_config(path: &Path) -> Result<String, CliError> {
    let shown = path.display();
    let cannot = |e| CliError::io(format!("cannot read config {shown}"), e);
    std::fs::metadata(path).map_err(cannot)?;
    let len = memzoo_data::regular_file(path)
        .map_err(|e| CliError::Config(format!("config {shown}: {e}")))?;
    let too_large = || {
        CliError::Config(format!(
            "config {shown} holds more than {CONFIG_LIMIT} bytes: it is not a memzoo config"
        ))
    };
    if len > CONFIG_LIMIT {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(path).map_err(cannot)?, CONFIG_LIMIT + 1),
        &mut bytes,
    )
    .map_err(cannot)?;
    if bytes.len() as u64 > CONFIG_LIMIT {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map_err(|e| CliError::Config(format!("config {shown} is not UTF-8 text: {e}")))
}

/// TOML has no null: a `None` field is dropped where `base` (what a reader starts from) has
/// none either, and written as the string `"none"` where `base` has a value (read back as
/// `None` by [`merge`], as `--set field=none` is).
fn write_nulls(v: Value, base: Option<&Value>) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter_map(|(k, v)| {
                    let b = base.and_then(|b| b.get(&k));
                    if v.is_null() {
                        b.filter(|b| !b.is_null())
                            .map(|_| (k, Value::String(NONE.into())))
                    } else {
                        Some((k.clone(), write_nulls(v, b)))
                    }
                })
                .collect(),
        ),
        other => other,
    }
}

/// How a config file writes `None` where the starting point has a value.
const NONE: &str = "none";

fn parse_scalar(raw: &str) -> Value {
    if raw == "none" || raw == "null" {
        return Value::Null;
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

fn merge(base: &mut Value, user: &Value, path: &str) -> Result<(), CliError> {
    match (base, user) {
        (Value::Object(b), Value::Object(u)) => {
            for (k, v) in u {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v, &p)?,
                    // `"none"` for a field that is not a string: `None` (see `write_nulls`).
                    Some(slot) if v.as_str() == Some(NONE) && !slot.is_string() => {
                        *slot = Value::Null
                    }
                    Some(slot) => *slot = v.clone(),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
            Ok(())
        }
        (b, u) => {
            *b = u.clone();
            Ok(())
        }
    }
}

fn set_path(root: &mut Value, key: &str, value: Value) -> Result<(), CliError> {
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = root;
    for (i, part) in parts.iter().enumerate() {
        let here = parts[..=i].join(".");
        let obj = cur.as_object_mut().ok_or_else(|| {
            CliError::Config(format!(
                "--set {key}: `{}` is not a section",
                parts[..i].join(".")
            ))
        })?;
        if i + 1 == parts.len() {
            if !obj.contains_key(*part) {
                return Err(CliError::Config(format!(
                    "--set {key}: unknown field `{here}`"
                )));
            }
            obj.insert(part.to_string(), value);
            return Ok(());
        }
        cur = obj
            .get_mut(*part)
            .ok_or_else(|| CliError::Config(format!("--set {key}: unknown section `{here}`")))?;
        if cur.is_null() {
            *cur = Value::Object(Default::default());
        }
    }
    Ok(())
}

/// Every integer must fit TOML's (a signed 64-bit one): the run's `config.toml` is written
/// and read back (`eval`, `generate`, `--resume`). The error names the first field above.
fn toml_integers(value: &Value, path: &str) -> Result<(), CliError> {
    match value {
        Value::Number(n) if n.is_u64() && n.as_i64().is_none() => Err(CliError::Config(format!(
            "{path} = {n} is above {}, the largest integer a TOML config holds (the run's \
             config.toml must read back)",
            i64::MAX
        ))),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let p = match path {
                "" => k.clone(),
                _ => format!("{path}.{k}"),
            };
            toml_integers(v, &p)
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| toml_integers(v, &format!("{path}[{i}]"))),
        _ => Ok(()),
    }
}

fn unknown_fields(given: &Value, known: &Value, path: &str) -> Result<(), CliError> {
    if let (Value::Object(g), Value::Object(k)) = (given, known) {
        for (key, v) in g {
            let p = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match k.get(key) {
                None => return Err(CliError::Config(format!("unknown config field `{p}`"))),
                Some(kv) => unknown_fields(v, kv, &p)?,
            }
        }
    }
    Ok(())
}

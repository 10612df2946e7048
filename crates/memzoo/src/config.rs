//! The run configuration of the CLI: one TOML file with `[model]`, `[train]` and `[data]`
//! sections, every field overridable from the command line with `--set section.field=value`.

use std::path::Path;

use memzoo_data::LongRangeConfig;
use memzoo_knn::MemorizingConfig;
use memzoo_train::TrainConfig;
use memzoo_xl::{ReformerConfig, XlConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::CliError;

/// Which model family a run trains.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Transformer-XL.
    #[default]
    Xl,
    /// Reformer (LSH attention, reversible layers).
    Reformer,
    /// Memorizing Transformer (XL + kNN attention over an external memory).
    Memorizing,
}

/// A named model configuration from the papers (`memzoo train --preset NAME`); `--set`
/// overrides its fields. Each sets `model_kind` and that family's section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// XL-small (6 x 256), memzoo's CPU reference (`XlConfig::small`).
    XlSmall,
    /// Transformer-XL's enwik8 base (12 x 512, mem 512; `XlConfig::enwik8_base`).
    XlEnwik8Base,
    /// Transformer-XL's WikiText-103 base (16 x 410, mem 150; `XlConfig::wt103_base`).
    XlWt103Base,
    /// Reformer-small (6 x 256, LSH), memzoo's CPU reference (`ReformerConfig::small`).
    ReformerSmall,
    /// The Reformer's enwik8 configuration (12 x 1024, 64K tokens; `ReformerConfig::enwik8`).
    ReformerEnwik8,
    /// Memorizing-small (6 x 256, kNN layer 4), memzoo's CPU reference.
    MemorizingSmall,
    /// The Memorizing Transformer of Wu et al. 2022 (12 x 1024, kNN layer 9, 64K memories).
    MemorizingPaper,
}

impl Preset {
    /// The preset applied to `config`: its family and that family's model section.
    pub fn apply(self, config: &mut RunConfig) {
        match self {
            Preset::XlSmall | Preset::XlEnwik8Base | Preset::XlWt103Base => {
                config.model_kind = ModelKind::Xl;
                config.model = match self {
                    Preset::XlSmall => XlConfig::small(),
                    Preset::XlEnwik8Base => XlConfig::enwik8_base(),
                    _ => XlConfig::wt103_base(),
                };
            }
            Preset::ReformerSmall | Preset::ReformerEnwik8 => {
                config.model_kind = ModelKind::Reformer;
                config.reformer = match self {
                    Preset::ReformerSmall => ReformerConfig::small(),
                    _ => ReformerConfig::enwik8(),
                };
            }
            Preset::MemorizingSmall | Preset::MemorizingPaper => {
                config.model_kind = ModelKind::Memorizing;
                config.memorizing = match self {
                    Preset::MemorizingSmall => MemorizingConfig::small(),
                    _ => MemorizingConfig::paper(),
                };
            }
        }
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

/// Everything a run needs besides the device.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RunConfig {
    /// The model family.
    pub model_kind: ModelKind,
    /// Transformer-XL configuration (`[model]`).
    pub model: XlConfig,
    /// Reformer configuration (`[reformer]`, used with `model_kind = "reformer"`).
    pub reformer: ReformerConfig,
    /// Memorizing Transformer configuration (`[memorizing]`, with `model_kind = "memorizing"`).
    pub memorizing: MemorizingConfig,
    /// Training configuration (`[train]`).
    pub train: TrainConfig,
    /// Data (`[data]`).
    pub data: DataConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            model_kind: ModelKind::Xl,
            // The default run shows what the XL memory is for, in about a minute on 2 cores:
            // a tiny XL (2 layers, d_model 64, 8 heads of 8) reading segments of 8 bytes with a
            // memory of 24 learns to copy text whose source lies 22 bytes back (the generated
            // corpus of `LongRangeConfig::near`, below): always beyond its segment, always within
            // its memory. Many cheap steps learn that copy (a head attending 21 positions back,
            // into the memory); the 4-layer, d_model 128 XL with segments of 64 bytes did not
            // learn it in 1,000 steps (3 minutes). The embedding at N(0, 0.1): at d_model 64
            // the default 0.02 gives the tied output's logits too small a start (see
            // `XlConfig::embedding_std`). No dropout: the task has nothing to overfit.
            model: XlConfig::new()
                .with_n_layers(2)
                .with_d_model(64)
                .with_n_heads(8)
                .with_d_inner(128)
                .with_mem_len(24)
                .with_dropout(0.0)
                .with_embedding_std(Some(0.1)),
            // A small Reformer: 2 layers (local + LSH), segments of up to 1024 tokens.
            reformer: ReformerConfig::new()
                .with_n_layers(2)
                .with_d_model(128)
                .with_n_heads(4)
                .with_d_head(32)
                .with_d_ff(512)
                .with_max_seq_len(1024)
                .with_axial_shape(Some([32, 32]))
                .with_axial_dims(Some([64, 64]))
                .with_attn_layers(vec![memzoo_xl::LayerKind::Local, memzoo_xl::LayerKind::Lsh]),
            // A small Memorizing Transformer: the small XL with T5 positions, pre-LN and an
            // untied output as the reference, and a kNN layer at depth 2 of 4 (top-32 over up
            // to 16K memories per row and head).
            memorizing: MemorizingConfig::new()
                .with_xl(
                    MemorizingConfig::new()
                        .xl
                        .with_n_layers(4)
                        .with_d_model(128)
                        .with_n_heads(4)
                        .with_d_inner(512)
                        .with_mem_len(64)
                        .with_dropout(0.0)
                        .with_positions(
                            memzoo_relative::PositionConfig::new()
                                .with_kind(memzoo_relative::PositionKind::T5),
                        ),
                )
                .with_knn_layers(vec![2]),
            // 5,000 steps of 16 rows x 8 bytes at lr 3e-3 (one replica: at this size a second
            // costs more than it saves); evaluation on the whole validation split (the first
            // segment of each row has no memory yet, so a partial evaluation over-weights it).
            train: TrainConfig::new()
                .with_steps(5000)
                .with_batch(16)
                .with_tgt_len(8)
                .with_replicas(Some(1))
                .with_log_every(100)
                .with_eval_every(2500)
                .with_checkpoint_every(2500)
                .with_schedule(
                    memzoo_train::ScheduleConfig::new()
                        .with_lr(3e-3)
                        .with_warmup(50),
                ),
            data: DataConfig {
                generated: LongRangeConfig::near(),
                ..DataConfig::default()
            },
        }
    }
}

impl RunConfig {
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
        let mut base = RunConfig::default();
        if let Some(p) = preset {
            p.apply(&mut base);
        }
        let mut value = serde_json::to_value(base).expect("serialisable");
        if let Some(path) = file {
            let text = read_config(path)?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| {
                CliError::Config(format!("config {} is not valid TOML: {e}", path.display()))
            })?;
            let user = serde_json::to_value(table).map_err(|e| {
                CliError::Config(format!("config {} cannot be read: {e}", path.display()))
            })?;
            merge(&mut value, &user, "")?;
        }
        for set in sets {
            let (key, raw) = set.split_once('=').ok_or_else(|| {
                CliError::Config(format!("--set `{set}`: expected section.field=value"))
            })?;
            set_path(&mut value, key.trim(), parse_scalar(raw.trim()))?;
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

    /// The layer stack this run trains: `[model]` for `model_kind = "xl"` (Transformer-XL, and
    /// every imported peer), the Reformer's and the Memorizing Transformer's presets
    /// (`[reformer]`, `[memorizing]`) otherwise. The one place a run's section is chosen:
    /// whatever builds the run's model (`memzoo export`, [`crate::commands::load_xl`]) builds
    /// this stack.
    pub fn stack(&self) -> XlConfig {
        match self.model_kind {
            ModelKind::Xl => self.model.clone(),
            ModelKind::Reformer => self.reformer.stack(),
            ModelKind::Memorizing => self.memorizing.stack(),
        }
    }

    /// The run's model family (`xl`, `reformer` or `memorizing`), computed from the layers of
    /// its [`stack`](Self::stack) ([`XlConfig::family`]), the label its checkpoints carry: an
    /// imported Reformer, whose stack lives in `[model]`, is a `reformer`.
    pub fn family(&self) -> &'static str {
        self.stack().family()
    }

    /// The config as a run uses it on its data. On data made of documents
    /// ([`DataConfig::has_documents`]) every family clears a batch row's memory where a new
    /// document starts: Transformer-XL gets `model.document_resets = true` (the Memorizing
    /// Transformer always has it); a Reformer carries no memory by default, and one that does
    /// (`reformer.mem_len` > 0, or kNN layers) is refused, since its LSH and local layers cannot
    /// hide a finished document's memory per row. On a stream, the config as it is.
    pub fn on_data(mut self) -> Result<Self, CliError> {
        if !self.data.has_documents() {
            return Ok(self);
        }
        match self.model_kind {
            ModelKind::Xl => self.model.document_resets = true,
            ModelKind::Memorizing => {}
            ModelKind::Reformer => {
                let r = &self.reformer;
                if r.mem_len > 0 || r.attn_layers.contains(&memzoo_xl::LayerKind::Knn) {
                    return Err(CliError::Config(format!(
                        "reformer.mem_len = {} with reformer.attn_layers = {:?} on {}: its LSH \
                         and local layers cannot clear a finished document's memory per row, and \
                         data made of documents reset memory at every document start; set \
                         reformer.mem_len = 0 without kNN layers, or train on a stream (a text \
                         file or data set)",
                        r.mem_len,
                        r.attn_layers,
                        self.data
                            .source
                            .as_deref()
                            .unwrap_or("the generated corpus"),
                    )));
                }
            }
        }
        Ok(self)
    }

    /// Checks every section, naming the bad field.
    pub fn validate(&self) -> Result<(), CliError> {
        match self.model_kind {
            ModelKind::Xl => self.model.validate()?,
            ModelKind::Memorizing => self.memorizing.validate()?,
            ModelKind::Reformer => {
                self.reformer.validate()?;
                if self.train.tgt_len > self.reformer.max_seq_len {
                    return Err(CliError::Config(format!(
                        "train.tgt_len ({}) exceeds reformer.max_seq_len ({})",
                        self.train.tgt_len, self.reformer.max_seq_len
                    )));
                }
            }
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

    /// The config as TOML (what a run directory keeps).
    pub fn to_toml(&self) -> String {
        let value = serde_json::to_value(self).expect("serialisable");
        toml::to_string_pretty(&strip_nulls(value)).unwrap_or_default()
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

/// TOML has no null: drop `None` fields.
fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

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

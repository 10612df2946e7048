//! Reporting: burn-train's dashboard (TUI on a terminal), plain log lines otherwise, and every
//! metric appended as a JSON line to `<run-dir>/metrics.jsonl`.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

use burn::tensor::TensorReadError;
use burn::train::Interrupter;
use burn::train::metric::{
    Metric, MetricAttributes, MetricDefinition, MetricEntry, MetricId, MetricMetadata, MetricName,
    NumericAttributes, NumericEntry, SerializedEntry,
};
use burn::train::renderer::{MetricState, MetricsRenderer, default_renderer};
use serde::Serialize;

use crate::error::TrainError;

/// A scalar the trainer computes itself, shown by burn-train's renderer.
#[derive(Clone)]
struct Scalar {
    name: MetricName,
    unit: Option<String>,
    higher_is_better: bool,
}

impl Metric for Scalar {
    type Input = f64;

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: self.unit.clone(),
            higher_is_better: self.higher_is_better,
        }
        .into()
    }

    fn update(
        &mut self,
        item: &f64,
        _metadata: &MetricMetadata,
    ) -> Result<SerializedEntry, TensorReadError> {
        Ok(SerializedEntry::new(format!("{item:.4}"), item.to_string()))
    }

    fn compute(&mut self) -> Result<SerializedEntry, TensorReadError> {
        Ok(SerializedEntry::new(String::new(), String::new()))
    }

    fn clear(&mut self) {}
}

/// One record of `metrics.jsonl`.
#[derive(Serialize, Debug, Clone)]
pub struct MetricRecord {
    /// Optimizer step (1-based) the record belongs to.
    pub step: usize,
    /// `train`, `valid` or `test`.
    pub split: String,
    /// Metric name (`loss`, `bpc`, `ppl`, `lr`, `tokens_per_s`; `grad_norm`, `grad_norm_max`
    /// and `clipped`: the mean and the largest gradient norm before clipping over the logged
    /// window of steps, and the share of them that `train.clip_norm` scaled down).
    pub metric: String,
    /// Its value.
    pub value: f64,
}

/// Drops the records of `<run_dir>/metrics.jsonl` past `step`, and a last line torn by a
/// crash (one without its newline that is not a whole record), rewriting the file atomically;
/// returns how many lines were dropped. A resumed run calls it with its checkpoint's step, so
/// that the steps it repeats are not recorded twice.
///
/// Any other line that is not a record (`{"step": ...}`) is an error naming its number, and
/// the file is left as it was: it is not this function's to guess what it held.
pub fn drop_records_after(run_dir: &Path, step: usize) -> Result<usize, TrainError> {
    let path = run_dir.join("metrics.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(TrainError::io(format!("cannot read {}", path.display()), e)),
    };
    let record_step = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("step")?.as_u64())
    };
    let lines: Vec<&str> = text.lines().collect();
    let torn = !text.is_empty() && !text.ends_with('\n');
    let mut kept = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match record_step(line) {
            Some(s) if s <= step as u64 => kept.push(*line),
            Some(_) => {}
            None if torn && i + 1 == lines.len() => {}
            None => {
                return Err(TrainError::Metrics(format!(
                    "{} line {} is not a metrics record (expected a JSON object with a \
                     `step`, found {:?}): repair or remove that line, then resume",
                    path.display(),
                    i + 1,
                    line.chars().take(80).collect::<String>()
                )));
            }
        }
    }
    let dropped = lines.len() - kept.len();
    if dropped == 0 && !torn {
        return Ok(0);
    }
    let tmp = run_dir.join(".metrics.jsonl.tmp");
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(out.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| TrainError::io(format!("cannot rewrite {}", path.display()), e))?;
    Ok(dropped)
}

/// Where the trainer shows its metrics besides `metrics.jsonl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Show {
    /// burn-train's dashboard (stdout is a terminal).
    Dashboard,
    /// One plain line per record on stdout.
    Lines,
    /// Nothing on stdout (`quiet`); notes go to stderr.
    Nothing,
}

/// The trainer's reporting: dashboard or plain lines, and JSON lines.
pub struct Reporter {
    renderer: Box<dyn MetricsRenderer>,
    ids: Vec<(String, MetricId)>,
    jsonl: File,
    show: Show,
    /// Set when the user quits from the dashboard; the trainer checkpoints and stops.
    pub interrupter: Interrupter,
}

/// Metrics shown on the dashboard: (name, unit, higher is better).
const METRICS: &[(&str, Option<&str>, bool)] = &[
    ("loss", Some("nats"), false),
    ("bpc", Some("bits/char"), false),
    ("ppl", None, false),
    ("lr", None, true),
    ("tokens_per_s", Some("tok/s"), true),
    ("grad_norm", None, false),
    ("grad_norm_max", None, false),
    ("clipped", None, false),
    ("selected_bpc", Some("bits/char"), false),
    ("selected_accuracy", None, true),
    ("device_mib_in_use", Some("MiB"), false),
    ("device_mib_reserved", Some("MiB"), false),
    ("device_mib_reserved_peak", Some("MiB"), false),
];

/// What the devices' allocators hold after a step, summed over `devices` (each counted once),
/// for the devices that pool their memory (CubeCL's: wgpu, CUDA); empty where none does (flex
/// and LibTorch report nothing).
///
/// - `device_mib_in_use`: the live tensors' bytes (weights, gradients, optimiser state, the
///   carried memories): what the step leaves behind;
/// - `device_mib_reserved`: the bytes the allocator holds now, live or kept for reuse;
/// - `device_mib_reserved_peak`: each pool's most pages times their size, summed (the pools
///   may have peaked at different moments, so this bounds the most held at once from above;
///   with one pool holding the large tensors the two are close). With the device's own
///   context it is what `nvidia-smi`'s peak shows; the difference from the live tensors is
///   the step's temporaries (activations kept for the backward) and the pages they leave.
pub(crate) fn allocator_mib(devices: &[burn::tensor::Device]) -> Vec<(&'static str, f64)> {
    let mut seen: Vec<&burn::tensor::Device> = Vec::new();
    // [in use, reserved, reserved peak] of each pooling device, counted once.
    let readings: Vec<[u64; 3]> = devices
        .iter()
        .filter(|d| {
            let new = !seen.contains(d);
            seen.push(d);
            new
        })
        .filter_map(|d| {
            let usage = d.memory_pool_usage()?;
            let pools = d.memory_pool_report().unwrap_or_default();
            let peak: u64 = pools.iter().map(|p| p.pages_peak * p.page_size).sum();
            Some([
                usage.bytes_in_use,
                usage.bytes_reserved,
                peak.max(usage.bytes_reserved),
            ])
        })
        .collect();
    if readings.is_empty() {
        return Vec::new();
    }
    let mib = |i: usize| readings.iter().map(|r| r[i]).sum::<u64>() as f64 / (1u64 << 20) as f64;
    vec![
        ("device_mib_in_use", mib(0)),
        ("device_mib_reserved", mib(1)),
        ("device_mib_reserved_peak", mib(2)),
    ]
}

impl Reporter {
    /// Opens `<run_dir>/metrics.jsonl` for appending and starts the renderer: with `quiet`
    /// nothing on stdout (notes on stderr); otherwise burn-train's TUI when stdout is a
    /// terminal, plain lines when it is not.
    pub fn new(
        run_dir: &Path,
        total_steps: usize,
        start_step: usize,
        quiet: bool,
    ) -> Result<Self, TrainError> {
        let path = run_dir.join("metrics.jsonl");
        let jsonl = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainError::io(format!("cannot open {}", path.display()), e))?;
        let interrupter = Interrupter::new();
        let show = if quiet {
            Show::Nothing
        } else if std::io::stdout().is_terminal() {
            Show::Dashboard
        } else {
            Show::Lines
        };
        let terminal = show == Show::Dashboard;
        let mut renderer: Box<dyn MetricsRenderer> = if terminal {
            default_renderer(interrupter.clone(), None)
        } else {
            Box::new(burn::train::renderer::CliMetricsRenderer::new())
        };
        let mut ids = Vec::new();
        for (name, unit, better) in METRICS {
            let metric = Scalar {
                name: Arc::new(name.to_string()),
                unit: unit.map(str::to_string),
                higher_is_better: *better,
            };
            let id = MetricId::new(Arc::new(name.to_string()));
            renderer.register_metric(MetricDefinition::new(id.clone(), &metric));
            ids.push((name.to_string(), id));
        }
        if terminal {
            renderer.start(1, 0, Some(total_steps), Some("memzoo train"));
            renderer.start_split("train", total_steps);
            renderer.update_split(start_step);
        }
        Ok(Self {
            renderer,
            ids,
            jsonl,
            show,
            interrupter,
        })
    }

    /// Records metrics of `split` at `step`: a JSON line per metric, and the dashboard or one
    /// plain line.
    pub fn record(
        &mut self,
        step: usize,
        split: &str,
        values: &[(&str, f64)],
    ) -> Result<(), TrainError> {
        for (name, value) in values {
            let rec = MetricRecord {
                step,
                split: split.to_string(),
                metric: name.to_string(),
                value: *value,
            };
            let line = serde_json::to_string(&rec).expect("plain record");
            writeln!(self.jsonl, "{line}")
                .map_err(|e| TrainError::io("cannot append to metrics.jsonl", e))?;
            if let Some((_, id)) = self.ids.iter().find(|(n, _)| n == name) {
                let entry = MetricEntry::new(
                    id.clone(),
                    SerializedEntry::new(format!("{value:.4}"), value.to_string()),
                );
                let state = MetricState::Numeric(entry, Some(NumericEntry::Value(*value)));
                match split {
                    "train" => self.renderer.update_train(state),
                    _ => self.renderer.update_valid(state),
                }
            }
        }
        self.jsonl
            .flush()
            .map_err(|e| TrainError::io("cannot flush metrics.jsonl", e))?;
        if self.show == Show::Lines {
            let parts: Vec<String> = values
                .iter()
                .map(|(n, v)| {
                    if *n == "lr" {
                        format!("{n} {v:.2e}")
                    } else {
                        format!("{n} {v:.4}")
                    }
                })
                .collect();
            println!("[{split}] step {step}: {}", parts.join("  "));
        } else if self.show == Show::Dashboard && split == "train" {
            self.renderer.update_split(step);
        }
        Ok(())
    }

    /// A plain message: a line on stdout beside plain lines, on stderr when `quiet` (none
    /// under the dashboard).
    pub fn note(&self, message: &str) {
        match self.show {
            Show::Lines => println!("{message}"),
            Show::Nothing => eprintln!("{message}"),
            Show::Dashboard => {}
        }
    }

    /// Ends the dashboard.
    pub fn finish(&mut self) {
        if self.show == Show::Dashboard {
            self.renderer.end_split();
            self.renderer.end();
            let _ = self.renderer.on_train_end(None);
        }
    }
}

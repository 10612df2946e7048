//! Measurements: timing statistics, memory, JSON lines, Markdown, comparison with peers.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// One benchmark result, printed as one JSON line.
///
/// The field names match those of the PyTorch peer script (`name`, `tokens_per_s`,
/// `step_s_median`, `peak_rss_mb`) so that `--compare` can read either.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Measurement {
    /// Benchmark name, e.g. `xl-small`.
    pub name: String,
    /// Implementation (`memzoo` for ours).
    #[serde(default)]
    pub implementation: String,
    /// Backend / device string.
    #[serde(default)]
    pub backend: String,
    /// CPU threads.
    #[serde(default)]
    pub threads: usize,
    /// The configuration measured.
    #[serde(default)]
    pub config: serde_json::Value,
    /// Timed steps.
    #[serde(default)]
    pub steps: usize,
    /// Median step time in seconds.
    #[serde(default)]
    pub step_s_median: f64,
    /// Fastest step (s).
    #[serde(default)]
    pub step_s_min: f64,
    /// Slowest step (s).
    #[serde(default)]
    pub step_s_max: f64,
    /// Tokens per second at the median step time.
    #[serde(default)]
    pub tokens_per_s: f64,
    /// Trainable parameters.
    #[serde(default)]
    pub params: usize,
    /// Peak resident memory of the process (MiB).
    #[serde(default)]
    pub peak_rss_mb: f64,
    /// Model FLOPs per token counted from the config (`flops::train_flops_per_token`: x3 for
    /// training, x1 for an evaluation); model benchmarks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_per_token: Option<f64>,
    /// Achieved GFLOP/s: `flops_per_token` x `tokens_per_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// The backend's own float32 matrix-product rate in the same process
    /// (`flops::sgemm_gflops`, GFLOP/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sgemm_gflops: Option<f64>,
    /// `gflops / sgemm_gflops`: the fraction of the backend's matrix-product rate reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_sgemm: Option<f64>,
}

/// Times `steps` calls of `step` after `warmup` untimed ones; returns the sorted durations (s).
pub fn time_steps(warmup: usize, steps: usize, mut step: impl FnMut()) -> Vec<f64> {
    for _ in 0..warmup {
        step();
    }
    let mut times: Vec<f64> = (0..steps)
        .map(|_| {
            let t = Instant::now();
            step();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

/// Median of sorted values.
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// Peak resident set size of this process in MiB (`VmHWM`), 0 where /proc is missing.
pub fn peak_rss_mb() -> f64 {
    proc_status_kb("VmHWM:") / 1024.0
}

/// Peak resident set size of this process in KiB (`VmHWM`), 0 where /proc is missing.
pub fn peak_rss_kib() -> u64 {
    proc_status_kb("VmHWM:") as u64
}

/// Resident set size of this process now, in KiB (`VmRSS`), 0 where /proc is missing.
pub fn rss_kib() -> u64 {
    proc_status_kb("VmRSS:") as u64
}

fn proc_status_kb(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A Markdown table of the results.
pub fn markdown(results: &[Measurement]) -> String {
    let mut s = String::from(
        "| benchmark | backend | threads | step (median) | min..max | tokens/s | params | peak RSS | GFLOP/s (of sgemm) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for m in results {
        s += &format!(
            "| {} | {} | {} | {:.3} s | {:.3}..{:.3} | {} | {:.2} M | {:.0} MiB | {} |\n",
            m.name,
            m.backend,
            m.threads,
            m.step_s_median,
            m.step_s_min,
            m.step_s_max,
            rate(m.tokens_per_s),
            m.params as f64 / 1e6,
            m.peak_rss_mb,
            match (m.gflops, m.of_sgemm, m.sgemm_gflops) {
                (Some(g), Some(r), Some(s)) => format!("{g:.0} ({:.0}% of {s:.0})", 100.0 * r),
                _ => "-".into(),
            }
        );
    }
    s
}

/// Tokens/s with as many decimals as a small rate needs: `893`, `12.4`, `0.28`.
pub fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Reads JSON lines: ours, or the peers' (`config` names the benchmark, `impl` the
/// implementation); lines that are not measurements are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<Measurement>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let text_of =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .filter(|v| {
            v.get("status")
                .and_then(|s| s.as_str())
                .is_none_or(|s| s == "ok")
        })
        .filter_map(|v| {
            let name = text_of(&v, "name").or_else(|| text_of(&v, "config"))?;
            Some(Measurement {
                name,
                implementation: text_of(&v, "implementation")
                    .or_else(|| text_of(&v, "impl"))
                    .unwrap_or_default(),
                tokens_per_s: num(&v, "tokens_per_s"),
                step_s_median: num(&v, "step_s_median"),
                peak_rss_mb: num(&v, "peak_rss_mb"),
                ..Default::default()
            })
        })
        .filter(|m| m.tokens_per_s > 0.0)
        .collect())
}

/// Side-by-side table: each of our results against every peer line whose name starts with ours.
pub fn compare(ours: &[Measurement], peers: &[Measurement]) -> String {
    let mut s = String::from(
        "| benchmark | peer | peer tokens/s | memzoo tokens/s | memzoo / peer | peer RSS | memzoo RSS |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for m in ours {
        for p in peers.iter().filter(|p| p.name.starts_with(&m.name)) {
            let ratio = m.tokens_per_s / p.tokens_per_s;
            s += &format!(
                "| {} | {} | {:.0} | {:.0} | {:.2}x | {:.0} MiB | {:.0} MiB |\n",
                m.name,
                if p.implementation.is_empty() {
                    &p.name
                } else {
                    &p.implementation
                },
                p.tokens_per_s,
                m.tokens_per_s,
                ratio,
                p.peak_rss_mb,
                m.peak_rss_mb
            );
        }
    }
    s
}

//! Measurements: timing statistics, memory, JSON lines, Markdown, comparison with peers.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// What `MEMZOO_SIMD` and the build leave memzoo's CPU code (`memzoo_backend::simd`), for the
/// JSON lines: `None` for the default (everything the CPU has), else e.g. `kernels avx2, gemm
/// avx2`.
pub fn simd_setting() -> Option<String> {
    use memzoo_backend::simd::{GEMM_AVX512, SimdLevel, simd_cap};
    let cap = simd_cap();
    if cap == SimdLevel::Avx512 && GEMM_AVX512 {
        return None;
    }
    let gemm = if GEMM_AVX512 { "avx512" } else { "avx2" };
    Some(format!("kernels {cap}, gemm {gemm}"))
}

/// Checks `MEMZOO_SIMD` before a benchmark: a value it knows, and a cap below AVX-512 only in
/// a build whose matrix products cannot use AVX-512 either (else the products would still run
/// the AVX-512 kernels the cap means to leave out).
pub fn check_simd() -> Result<memzoo_backend::simd::SimdLevel, String> {
    use memzoo_backend::simd::{GEMM_AVX512, SimdLevel, simd_level_from_env};
    let level = simd_level_from_env().map_err(|e| e.to_string())?;
    #[cfg(target_arch = "x86_64")]
    if level < SimdLevel::Avx512 && GEMM_AVX512 && std::arch::is_x86_feature_detected!("avx512f") {
        return Err(format!(
            "MEMZOO_SIMD={level} caps memzoo's kernels, but this build's matrix products still use \
             gemm's AVX-512 kernels on this CPU: build the harness without them, \
             `MEMZOO_SIMD={level} cargo run -q -p xtask --no-default-features --features \
             flex-avx2 -- bench ...` (best in its own CARGO_TARGET_DIR)"
        ));
    }
    Ok(level)
}

/// Caps a PyTorch peer's CPU code as `MEMZOO_SIMD` caps memzoo's, so that both sides run what
/// a CPU without AVX-512 (or AVX2) would: ATen's vectorised kernels (`ATEN_CPU_CAPABILITY`),
/// oneDNN (`ONEDNN_MAX_CPU_ISA`), faiss (`FAISS_OPT_LEVEL`) and MKL
/// (`MKL_ENABLE_INSTRUCTIONS`; on AMD CPUs MKL's single-precision products run its AVX2 Zen
/// kernel whatever the cap, as they would on an AVX2-only AMD CPU). Nothing for the default.
pub fn cap_peer(command: &mut std::process::Command) {
    use memzoo_backend::simd::{SimdLevel, simd_cap};
    let (aten, onednn, faiss, mkl) = match simd_cap() {
        SimdLevel::Avx512 => return,
        SimdLevel::Avx2 => ("avx2", "AVX2", "avx2", "AVX2"),
        SimdLevel::Portable => ("default", "SSE41", "generic", "SSE4_2"),
    };
    command
        .env("ATEN_CPU_CAPABILITY", aten)
        .env("ONEDNN_MAX_CPU_ISA", onednn)
        .env("FAISS_OPT_LEVEL", faiss)
        .env("MKL_ENABLE_INSTRUCTIONS", mkl);
}

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

//! SVG line charts of the suites, written by hand (a few lines of SVG; the `plotters` crate
//! would switch on `num-traits/default` and so rebuild Burn for the whole workspace).
//!
//! - `attention-time.svg`, `attention-memory.svg`: forward + backward time and peak RSS
//!   against sequence length, one line per attention kind;
//! - `generate.svg`: tokens/s against context length, with the XL memory and recomputing.
//!
//! Both axes are logarithmic; `quality-<family>.svg` (learning curves, see `quality.rs`) has
//! linear axes.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::measure::Measurement;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, both positive.
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const W: f64 = 680.0;
const H: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;

/// Writes the charts the results allow into `dir`; returns the files written.
pub fn write_plots(results: &[Measurement], dir: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    // name = <suite>-<kind>-<x>
    let split = |prefix: &str, m: &Measurement| -> Option<(String, f64)> {
        let rest = m.name.strip_prefix(prefix)?;
        let (kind, x) = rest.rsplit_once('-')?;
        Some((kind.to_string(), x.parse().ok()?))
    };
    let series = |prefix: &str, y: &dyn Fn(&Measurement) -> f64| -> Vec<Series> {
        let mut by_kind: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut order = Vec::new();
        for m in results {
            if let Some((kind, x)) = split(prefix, m) {
                if !by_kind.contains_key(&kind) {
                    order.push(kind.clone());
                }
                by_kind.entry(kind).or_default().push((x, y(m)));
            }
        }
        order
            .into_iter()
            .map(|k| {
                let mut points = by_kind.remove(&k).unwrap_or_default();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name: k, points }
            })
            .collect()
    };
    let backend = results
        .first()
        .map(|m| format!("{}, {} threads", m.backend, m.threads))
        .unwrap_or_default();
    let mut charts = Vec::new();
    let time = series("attention-", &|m| m.step_s_median);
    if !time.is_empty() {
        charts.push((
            "attention-time.svg",
            line_chart(
                &format!("Attention forward + backward ({backend})"),
                "sequence length (tokens)",
                "seconds",
                &time,
            ),
        ));
        let memory = series("attention-", &|m| m.peak_rss_mb);
        charts.push((
            "attention-memory.svg",
            line_chart(
                &format!("Attention peak memory ({backend})"),
                "sequence length (tokens)",
                "peak RSS (MiB)",
                &memory,
            ),
        ));
    }
    let generate = series("generate-", &|m| m.tokens_per_s);
    if !generate.is_empty() {
        let generate: Vec<Series> = generate
            .into_iter()
            .map(|s| Series {
                name: match s.name.as_str() {
                    "cached" => "XL memory (cached)".into(),
                    "recompute" => "recompute context".into(),
                    _ => s.name,
                },
                points: s.points,
            })
            .collect();
        charts.push((
            "generate.svg",
            line_chart(
                &format!("XL-small generation ({backend})"),
                "context (tokens)",
                "tokens / s",
                &generate,
            ),
        ));
    }
    if charts.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for (file, svg) in charts {
        let path = dir.join(file);
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// How a chart maps values to pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axes {
    /// Both axes logarithmic (values must be positive): sizes and rates over decades.
    Log,
    /// Both axes linear: learning curves.
    Linear,
}

/// A log-log line chart as an SVG document.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    chart(title, x_label, y_label, series, Axes::Log)
}

/// A line chart as an SVG document. x ticks are the data's own x values; y ticks are 1-2-5
/// values (per decade on log axes, evenly spaced on linear ones).
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series], axes: Axes) -> String {
    let log = axes == Axes::Log;
    let pts = || series.iter().flat_map(|s| s.points.iter().copied());
    let positive = |v: f64| v.is_finite() && (v > 0.0 || !log);
    let xs: Vec<f64> = pts().map(|p| p.0).filter(|&v| positive(v)).collect();
    let ys: Vec<f64> = pts().map(|p| p.1).filter(|&v| positive(v)).collect();
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() {
            (lo, hi)
        } else {
            (1.0, 10.0)
        }
    };
    let (x_lo, x_hi) = range(&xs);
    let (y_lo, y_hi) = range(&ys);
    let t = |v: f64| if log { v.log10() } else { v };
    // x: the data's own values as ticks, half a step of margin; y: whole 1-2-5 ticks.
    let (x_lo_l, x_hi_l) = pad(t(x_lo), t(x_hi), 0.08);
    let y_ticks = if log {
        ticks_125(y_lo, y_hi)
    } else {
        ticks_linear(y_lo, y_hi)
    };
    let y_lo_l = t(y_ticks.first().map_or(y_lo, |&v| v.min(y_lo)));
    let y_hi_l = t(y_ticks.last().map_or(y_hi, |&v| v.max(y_hi)));
    let (y_lo_l, y_hi_l) = pad(y_lo_l, y_hi_l, 0.04);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (t(x) - x_lo_l) / (x_hi_l - x_lo_l) * pw;
    let py = |y: f64| TOP + ph - (t(y) - y_lo_l) / (y_hi_l - y_lo_l) * ph;
    let y_text = |v: f64| {
        if log {
            short(v)
        } else {
            format!("{}", (v * 1e3).round() / 1e3)
        }
    };

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let mut x_ticks: Vec<f64> = xs.clone();
    x_ticks.sort_by(f64::total_cmp);
    x_ticks.dedup();
    for &x in &x_ticks {
        let sx = px(x);
        let _ = writeln!(
            s,
            r##"<line x1="{sx:.1}" y1="{TOP}" x2="{sx:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{sx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            short(x)
        );
    }
    for &y in &y_ticks {
        let sy = py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{sy:.1}" x2="{:.1}" y2="{sy:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            sy + 4.0,
            y_text(y)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 14.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    // Lines, points, legend.
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let valid: Vec<(f64, f64)> = ser
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| positive(x) && positive(y))
            .collect();
        let path: Vec<String> = valid
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(x, y) in &valid {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {} -> {}</title></circle>"#,
                px(x),
                py(y),
                esc(&ser.name),
                short(x),
                y_text(y)
            );
        }
        let ly = TOP + 12.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            esc(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// `[lo, hi]` widened by `frac` of its span on each side (a decade if it is empty).
fn pad(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = hi - lo;
    if span <= 0.0 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo - frac * span, hi + frac * span)
    }
}

/// Ticks `1, 2, 5 x 10^k` covering `[lo, hi]` (decades only when the range is wide), from
/// the largest tick `<= lo` to the smallest `>= hi`.
fn ticks_125(lo: f64, hi: f64) -> Vec<f64> {
    let wide = hi / lo > 1e3;
    let steps: &[f64] = if wide { &[1.0] } else { &[1.0, 2.0, 5.0] };
    let mut all = Vec::new();
    for k in (lo.log10().floor() as i32 - 1)..=(hi.log10().ceil() as i32 + 1) {
        for m in steps {
            all.push(m * 10f64.powi(k));
        }
    }
    let first = all
        .iter()
        .rposition(|&t| t <= lo * (1.0 + 1e-9))
        .unwrap_or(0);
    let last = all
        .iter()
        .position(|&t| t >= hi * (1.0 - 1e-9))
        .unwrap_or(all.len() - 1);
    all[first..=last].to_vec()
}

/// About five evenly spaced ticks `k x {1, 2, 5} x 10^e` covering `[lo, hi]`.
fn ticks_linear(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(hi.abs() * 1e-3).max(1e-12);
    let raw = span / 5.0;
    let e = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * e)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * e);
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// `1024` -> `1K`, `0.25` -> `0.25`, `1500` -> `1.5K`.
fn short(v: f64) -> String {
    if v >= 1024.0 && (v / 1024.0).fract() == 0.0 && (v as u64).is_power_of_two() {
        format!("{}K", v / 1024.0)
    } else if v >= 10_000.0 {
        format!("{:.0}K", v / 1000.0)
    } else if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{}", (v * 1e3).round() / 1e3)
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

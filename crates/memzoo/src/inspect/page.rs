//! The inspector's page: one self-contained HTML file (`page.html`, its script `page.js`),
//! the [`Inspection`] inlined as compact JSON.
//!
//! The page's data are quantised and packed as base64 blobs of little-endian numbers, so that a
//! 100 KB text stays a page a browser opens at once:
//!
//! | field | per | encoding |
//! |---|---|---|
//! | `lw`, `lo` | query | loss with / without memory, u16 millinats (saturating at 65.535) |
//! | layer `mass` | query, head | (compressive layers) u8 compressed-memory mass, u8 memory mass, (kNN layers) u8 kNN mass, each `round(255 m)`; the segment's is the rest |
//! | layer `np` | query, head, neighbour | u32 position + 1 (0: none) |
//! | layer `nw`, `ns` | query, head, neighbour | u8 weight `round(255 w)`, i8 cosine `round(127 s)` |
//! | layer `bk` | query, head, round | u16 bucket |

use serde_json::{Value, json};

use super::Inspection;

const TEMPLATE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");

/// Standard base64 (with padding).
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `round(255 x)` of `x` in [0, 1].
fn unit_u8(x: f32) -> u8 {
    (x.clamp(0.0, 1.0) * 255.0).round() as u8
}

fn millinats(losses: &[f32]) -> String {
    let bytes: Vec<u8> = losses
        .iter()
        .flat_map(|&l| ((l.max(0.0) * 1000.0).round().min(65535.0) as u16).to_le_bytes())
        .collect();
    base64(&bytes)
}

/// The page's data: the inspection, quantised and packed (see the module docs).
pub fn page_data(ins: &Inspection) -> Value {
    let layers: Vec<Value> = ins
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let knn = l.neighbours_per_head > 0;
            let mut layer = json!({"index": i, "kind": l.kind, "heads": l.heads, "knn": knn,
                "cm": l.compressed});
            if !l.mass.is_empty() {
                // [compressed, memory, knn, segment]: the parts the layer has, less the last.
                let parts = [l.compressed, true, knn];
                let mass: Vec<u8> = (l.mass.iter())
                    .flat_map(|m| (0..3).filter(|&p| parts[p]).map(|p| unit_u8(m[p])))
                    .collect();
                layer["mass"] = json!(base64(&mass));
            }
            if knn {
                let pos: Vec<u8> = l
                    .neighbours
                    .iter()
                    .flat_map(|n| ((n.position + 1).max(0) as u32).to_le_bytes())
                    .collect();
                let w: Vec<u8> = l.neighbours.iter().map(|n| unit_u8(n.weight)).collect();
                let s: Vec<u8> = l
                    .neighbours
                    .iter()
                    .map(|n| ((n.score.clamp(-1.0, 1.0) * 127.0).round() as i8) as u8)
                    .collect();
                layer["k"] = json!(l.neighbours_per_head);
                layer["np"] = json!(base64(&pos));
                layer["nw"] = json!(base64(&w));
                layer["ns"] = json!(base64(&s));
            }
            if l.rounds > 0 {
                let b: Vec<u8> = l
                    .buckets
                    .iter()
                    .flat_map(|&b| (b.min(65535) as u16).to_le_bytes())
                    .collect();
                layer["rounds"] = json!(l.rounds);
                layer["bk"] = json!(base64(&b));
            }
            layer
        })
        .collect();
    json!({
        "version": 1,
        "model": ins.model,
        "family": ins.family,
        "text": ins.text,
        "bytes_read": ins.bytes_read,
        "bytes_total": ins.bytes_total,
        "tgt_len": ins.tgt_len,
        "mem_len": ins.mem_len,
        "memory": ins.memory,
        "pieces": ins.pieces,
        "lw": millinats(&ins.loss_with),
        "lo": millinats(&ins.loss_without),
        "layers": layers,
        "summary": ins.summary,
    })
}

/// The page: `page.html` with its script and the data (`page_data`) inlined. Nothing is
/// fetched: no network, no CDN.
pub fn render(ins: &Inspection) -> String {
    // `</` inside a script would end it; `<\/` is the same JSON string.
    let data = page_data(ins).to_string().replace("</", "<\\/");
    let title = format!("memzoo inspect: {} on {}", ins.model, ins.text);
    let title = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('{', "&#123;");
    TEMPLATE
        .replacen("{{SCRIPT}}", SCRIPT, 1)
        .replacen("{{TITLE}}", &title, 1)
        .replacen("{{DATA}}", &data, 1)
}

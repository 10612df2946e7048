//! The memory inspector (`memzoo inspect`) against independent numbers: its losses with memory
//! average to `memzoo_train::evaluate`'s on the same text; its losses without memory are a
//! fresh-state `segment_nll` per segment; its attention masses are a naive softmax (host, f64)
//! of the layer's own `scores`, recomputed here from the layer inputs the XL memory cached;
//! its retrieved neighbours are an exact search over the stored keys done here. And the page
//! in a real browser (headless Chromium): it renders every token and the panels.

use burn::tensor::activation::sigmoid;
use burn::tensor::{Int, Tensor, TensorData};
use memzoo::inspect::{InspectOptions, Inspection, inspect, render};
use memzoo_data::OrderedBatcher;
use memzoo_knn::l2_normalize;
use memzoo_relative::{RelativeContext, linear_rows};
use memzoo_stack::{LayerAttention, RecurrentModel, TransformerXl, XlState};
use memzoo_tests::*;

const SEG: usize = 8;
const N: usize = 5 * SEG + 4;

fn model() -> TransformerXl {
    let model = tiny_memorizing().stack().init(&flex()).unwrap();
    seeded_weights(model, 26, |_| 0.3)
}

fn tokens() -> Vec<i64> {
    small_corpus()[..N].iter().map(|&t| i64::from(t)).collect()
}

fn pieces(tokens: &[i64]) -> Vec<String> {
    tokens
        .iter()
        .map(|&t| (t as u8 as char).to_string())
        .collect()
}

fn run(model: &TransformerXl, tokens: &[i64]) -> Inspection {
    let opts = InspectOptions {
        tgt_len: SEG,
        neighbours: 3,
        ..Default::default()
    };
    inspect(model, tokens, pieces(tokens), "corpus", &opts).unwrap()
}

fn ids(v: &[i64]) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [1, v.len()]), &flex())
}

#[test]
fn inspect_losses_are_the_evaluation_and_fresh_state_losses() {
    let model = model();
    let tokens = tokens();
    let ins = run(&model, &tokens);
    assert_eq!(ins.loss_with.len(), N - 1);
    assert_eq!(ins.loss_without.len(), N - 1);
    // With memory: the mean is memzoo eval's loss on the same text.
    let stream = tokens.iter().map(|&t| t as u16).collect();
    let mut source = OrderedBatcher::new(stream, 1, SEG).unwrap();
    let eval = memzoo_train::evaluate(&model, &mut source, SEG, None).unwrap();
    // The batcher drops the last, short segment; the inspector reads it too.
    let full = (N - 1) / SEG * SEG;
    assert_eq!(eval.tokens as usize, full);
    let mean = ins.loss_with[..full].iter().map(|&x| x as f64).sum::<f64>() / full as f64;
    assert!((mean - eval.loss).abs() < 1e-5, "{mean} vs {}", eval.loss);
    // Without: every segment from a fresh state.
    let mut fresh_losses = Vec::new();
    for start in (0..N - 1).step_by(SEG) {
        let len = SEG.min(N - 1 - start);
        let mut fresh = XlState::default();
        let nll = model
            .segment_nll(
                ids(&tokens[start..start + len]),
                ids(&tokens[start + 1..start + len + 1]),
                &mut fresh,
                &[true],
                false,
            )
            .unwrap()
            .nll;
        fresh_losses.extend(host(nll));
    }
    assert_close(
        &ins.loss_without,
        &fresh_losses,
        1e-5,
        "losses without memory",
    );
    // The memory changes them (this is not the same computation twice).
    assert!(max_abs_diff(&ins.loss_with[SEG..], &ins.loss_without[SEG..]) > 1e-3);
    // Summary: bits per token of both.
    let all = ins.loss_with.iter().map(|&x| x as f64).sum::<f64>() / (N - 1) as f64;
    assert!((ins.summary.bpc_with - all / std::f64::consts::LN_2).abs() < 1e-5);
}

/// `softmax` of `Some` scores in f64 (`None`: hidden).
fn softmax(scores: &[Option<f64>]) -> Vec<f64> {
    masked_softmax(scores)
}

/// Per segment: (memory before it, the segment's inputs) of layer `l`, read from the XL
/// memory the model caches (its layer inputs), segment by segment as the inspector reads.
fn layer_inputs(
    model: &TransformerXl,
    tokens: &[i64],
    l: usize,
) -> Vec<(Option<Tensor<3>>, Tensor<3>)> {
    let mut state = XlState::default();
    let mut out = Vec::new();
    for start in (0..tokens.len() - 1).step_by(SEG) {
        let len = SEG.min(tokens.len() - 1 - start);
        let before = state.xl.layer(l).cloned();
        model
            .forward_state(ids(&tokens[start..start + len]), &mut state, &[start == 0])
            .unwrap();
        let after = state.xl.layer(l).unwrap().clone();
        let m = after.dims()[1];
        out.push((before, after.narrow(1, m - len, len)));
    }
    out
}

#[test]
fn inspect_masses_are_a_naive_softmax_of_the_scores_and_neighbours_an_exact_search() {
    let model = model();
    let tokens = tokens();
    let ins = run(&model, &tokens);
    let dev = flex();
    let mask = model.default_mask();
    assert_eq!(ins.layers.len(), 2);
    assert_eq!(ins.layers[1].kind, "knn");
    let mut searched = 0;
    for (l, layer) in model.layers.iter().enumerate() {
        let att = layer.attention.local();
        let (h, dh) = (att.n_heads, att.d_head);
        let inputs = layer_inputs(&model, &tokens, l);
        // Layer 1's stored keys, per position (kNN layer: the segment's pairs, added after it).
        let mut stored: Vec<Vec<f32>> = Vec::new();
        let mut start = 0;
        for (memory, x) in inputs {
            let len = x.dims()[1];
            let mlen = memory.as_ref().map_or(0, |m| m.dims()[1]);
            let norm = |t: Tensor<3>| match layer.block.pre_ln {
                true => layer.block.norm_attention.forward(t),
                false => t,
            };
            let (x, memory) = (norm(x), memory.map(norm));
            let ctx = RelativeContext::new(&att.positions, model.d_model, len, mlen, &mask, &dev);
            let (q, k, _) = att.project(x.clone(), memory.clone(), &ctx).unwrap();
            let (qh, kh, knn) = match &layer.attention {
                LayerAttention::Knn(a) => {
                    let tau = a.log_scale.val().exp().reshape([1, h, 1, 1]);
                    let q = l2_normalize(q.swap_dims(1, 2)) * tau.mul_scalar((dh as f32).sqrt());
                    (q, l2_normalize(k.swap_dims(1, 2)), Some(a))
                }
                _ => (q.swap_dims(1, 2), k.swap_dims(1, 2), None),
            };
            let shared = model.shared_biases.as_ref();
            let scores = host(att.scores(qh, kh, &ctx, shared).unwrap()); // [1, h, len, klen]
            let klen = mlen + len;
            // kNN: the test's own exact search over the pairs stored before this segment.
            let (queries, gate, tau) = match knn {
                Some(a) => (
                    host(l2_normalize(
                        linear_rows(&att.query, x.clone()).reshape([1, len, h, dh]),
                    )),
                    host(sigmoid(a.gate.val())),
                    host(a.log_scale.val().exp()),
                ),
                None => (Vec::new(), Vec::new(), Vec::new()),
            };
            for t in 0..len {
                for hd in 0..h {
                    let row: Vec<Option<f64>> = (0..klen)
                        .map(|j| {
                            (j <= mlen + t).then(|| scores[((hd * len) + t) * klen + j] as f64)
                        })
                        .collect();
                    let p = softmax(&row);
                    let (mut mem, mut seg) =
                        (p[..mlen].iter().sum::<f64>(), p[mlen..].iter().sum::<f64>());
                    let mut knn_mass = 0.0;
                    if knn.is_some() && !stored.is_empty() {
                        let q = &queries[(t * h + hd) * dh..(t * h + hd + 1) * dh];
                        let mut hits: Vec<(f64, usize)> = stored
                            .iter()
                            .enumerate()
                            .map(|(pos, keys)| {
                                let k = &keys[hd * dh..(hd + 1) * dh];
                                (q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum(), pos)
                            })
                            .collect();
                        hits.sort_by(|a, b| b.0.total_cmp(&a.0));
                        hits.truncate(model.top_k);
                        let g = gate[hd] as f64;
                        knn_mass = g;
                        mem *= 1.0 - g;
                        seg *= 1.0 - g;
                        let w = softmax(
                            &hits
                                .iter()
                                .map(|(c, _)| Some(c * tau[hd] as f64))
                                .collect::<Vec<_>>(),
                        );
                        // The inspector's heaviest three: the search's best three.
                        let kept = &ins.layers[l].neighbours[((start + t) * h + hd) * 3..][..3];
                        searched += 1;
                        for (j, nb) in kept.iter().enumerate() {
                            assert_eq!(
                                nb.position,
                                hits[j].1 as i64,
                                "query {} head {hd} neighbour {j}",
                                start + t
                            );
                            assert!((nb.score as f64 - hits[j].0).abs() < 1e-4);
                            assert!((nb.weight as f64 - g * w[j]).abs() < 1e-4);
                        }
                    }
                    let got = ins.layers[l].mass[(start + t) * h + hd];
                    let want = [0.0, mem, knn_mass, seg];
                    for c in 0..4 {
                        assert!(
                            (got[c] as f64 - want[c]).abs() < 1e-4,
                            "layer {l} query {} head {hd}: {got:?} vs {want:?}",
                            start + t
                        );
                    }
                    assert!((got.iter().map(|&x| x as f64).sum::<f64>() - 1.0).abs() < 1e-4);
                }
            }
            if let Some(a) = knn {
                // After the segment: its pairs, as the layer stores them.
                let (keys, _) = a.memory_pairs(x);
                let keys = host(keys); // [1, len, kv heads = h, dh]
                stored.extend((0..len).map(|t| keys[t * h * dh..(t + 1) * h * dh].to_vec()));
                stored = stored.split_off(stored.len().saturating_sub(64));
            }
            start += len;
        }
    }
    // Every query after the first segment, every head.
    assert_eq!(searched, (N - 1 - SEG) * 2);
}

/// The page's inlined data.
fn page_json(page: &str) -> serde_json::Value {
    let open = "<script id=\"memzoo-data\" type=\"application/json\">";
    let at = page.find(open).unwrap() + open.len();
    let end = at + page[at..].find("</script>").unwrap();
    serde_json::from_str(&page[at..end]).unwrap()
}

fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .take_while(|&&c| c != b'=')
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (val(c) as u32) << (18 - 6 * i));
        let valid = chunk.iter().filter(|&&c| c != b'=').count() - 1;
        out.extend((0..valid).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    out
}

#[test]
fn inspect_page_is_self_contained_and_holds_the_data() {
    let model = model();
    let tokens = tokens();
    let ins = run(&model, &tokens);
    let page = render(&ins);
    for remote in ["http://", "https://", "<link", " src="] {
        assert!(
            !page.contains(remote),
            "the page must fetch nothing: {remote}"
        );
    }
    let data = page_json(&page);
    assert_eq!(data["pieces"].as_array().unwrap().len(), N);
    let lw = unbase64(data["lw"].as_str().unwrap());
    let got: Vec<f32> = lw
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as f32 / 1000.0)
        .collect();
    assert_close(&got, &ins.loss_with, 5.1e-4, "quantised losses");
    let knn = &data["layers"][1];
    let pos = unbase64(knn["np"].as_str().unwrap());
    let first: Vec<i64> = pos
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64 - 1)
        .collect();
    let want: Vec<i64> = ins.layers[1]
        .neighbours
        .iter()
        .map(|n| n.position)
        .collect();
    assert_eq!(first, want);
}

#[test]
fn inspect_refuses_bad_inputs_naming_them() {
    let model = model();
    let opts = InspectOptions::default();
    let err = inspect(&model, &[65], pieces(&[65]), "one.txt", &opts).unwrap_err();
    assert!(err.to_string().contains("one.txt"), "{err}");
    let bad = [65, 66, 300, 67];
    let err = inspect(&model, &bad, pieces(&bad), "bad.txt", &opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("token 2") && msg.contains("300") && msg.contains("256"),
        "{msg}"
    );
    let dir = std::env::temp_dir().join(format!("memzoo-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let args = |run_dir: std::path::PathBuf, text| memzoo::commands::InspectArgs {
        run_dir,
        checkpoint: None,
        text,
        out: None,
        max_bytes: 1000,
        tgt_len: None,
        mem_len: None,
        neighbours: 3,
    };
    let missing = dir.join("no-such-run");
    let err = memzoo::commands::inspect(&args(missing, empty.clone()), "flex", false).unwrap_err();
    assert!(err.to_string().contains("no-such-run"), "{err}");
    let err = memzoo::commands::inspect(&args(dir.clone(), empty), "flex", false).unwrap_err();
    assert!(
        err.to_string().contains("empty.txt") && err.to_string().contains("empty"),
        "{err}"
    );
    let err = memzoo::commands::inspect(&args(dir.clone(), dir.join("absent.txt")), "flex", false)
        .unwrap_err();
    assert!(err.to_string().contains("absent.txt"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The Chromium binary, or `None` (then the browser test skips, unless
/// `MEMZOO_REQUIRE_BROWSER` is set: CI installs it).
fn chromium() -> Option<std::path::PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join(name))
                    .find(|p| p.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var_os("MEMZOO_REQUIRE_BROWSER").is_none(),
            "MEMZOO_REQUIRE_BROWSER is set but no chromium is on PATH"
        );
        eprintln!("inspect page in a browser: SKIPPED (no chromium on PATH)");
    }
    found
}

#[test]
fn inspect_page_renders_tokens_and_panels_in_chromium() {
    let Some(browser) = chromium() else { return };
    let model = model();
    let tokens = tokens();
    let ins = run(&model, &tokens);
    let dir = std::env::temp_dir().join(format!("memzoo-inspect-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("page.html");
    std::fs::write(&page, render(&ins)).unwrap();
    let url = format!("file://{}#t=30", page.display());
    let headless = |extra: &[String]| {
        std::process::Command::new(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .args(["--window-size=1400,900", "--virtual-time-budget=5000"])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap()
    };
    let out = headless(&["--dump-dom".into()]);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        dom.contains("data-ready=\"yes\""),
        "the script did not finish"
    );
    assert_eq!(
        dom.matches("<span class=\"t ").count(),
        N,
        "every token rendered"
    );
    // The pinned token's panel: its losses, every layer, the kNN neighbours.
    assert!(dom.contains("<h2>token 30"), "no panel for token 30");
    assert!(dom.contains("layer 0: xl") && dom.contains("layer 1: knn"));
    assert!(dom.contains("retrieved neighbours"));
    assert!(dom.contains("bits/token with memory"));
    assert!(dom.contains("Regions where memory helped most"));
    let shot = dir.join("shot.png");
    let out = headless(&[format!("--screenshot={}", shot.display())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "screenshot of {} bytes",
        png.len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An LSH layer's record: the bucket of every query per head and round. In a one-layer
/// shared-QK Reformer without positions (no axial embedding, no memory) the layer reads the
/// token embedding alone, so two equal tokens of one segment have the same query and hash into
/// the same bucket in every round (`h(x) = argmax([xR; -xR])`, one set of rotations per pass),
/// while other tokens spread over the buckets.
#[test]
fn inspect_lsh_buckets_follow_the_tokens() {
    let sets: Vec<String> = tiny_lsh_layer(&["train.tgt_len=8"])
        .iter()
        .map(|s| s.to_string())
        .collect();
    let config = memzoo::config::RunConfig::resolve(None, &sets).unwrap();
    let model = seeded_weights(config.stack().init(&flex()).unwrap(), 27, |_| 0.5);
    // Two segments of 8, each with repeated bytes.
    let text = b"abcabcxyabcabcxy";
    let tokens: Vec<i64> = text.iter().map(|&b| i64::from(b)).collect();
    let ins = run(&model, &tokens);
    let layer = &ins.layers[0];
    assert_eq!(layer.kind, "lsh");
    let (heads, rounds) = (layer.heads, layer.rounds);
    assert!(rounds > 0, "an LSH layer records its rounds");
    // One query per input token: the text but its last token.
    let queries = tokens.len() - 1;
    assert_eq!(layer.buckets.len(), queries * heads * rounds);
    let n_buckets = config.stack().lsh.n_buckets.unwrap_or(usize::MAX) as u32;
    assert!(layer.buckets.iter().all(|&b| b < n_buckets.max(1)));
    let of = |t: usize| &layer.buckets[t * heads * rounds..(t + 1) * heads * rounds];
    let mut distinct = std::collections::BTreeSet::new();
    let mut pairs = 0;
    for start in (0..queries).step_by(SEG) {
        let segment = start..(start + SEG).min(queries);
        for a in segment.clone() {
            for b in a + 1..segment.end {
                if text[a] == text[b] {
                    assert_eq!(
                        of(a),
                        of(b),
                        "tokens {a} and {b} are both {:?}",
                        text[a] as char
                    );
                    pairs += 1;
                }
            }
            distinct.insert(of(a).to_vec());
        }
    }
    assert!(pairs >= 6, "the text repeats tokens within a segment");
    assert!(
        distinct.len() > 1,
        "the tokens hash into more than one bucket"
    );
}

/// Checks every mass of `ins` is in [0, 1] and each query's parts sum to 1, and returns, per
/// segment of `SEG` queries, the largest mass on each part `[compressed, memory, knn, segment]`
/// over the layer's queries and heads.
fn masses_by_segment(ins: &Inspection, layer: usize) -> Vec<[f32; 4]> {
    let l = &ins.layers[layer];
    assert_eq!(l.mass.len(), ins.loss_with.len() * l.heads, "layer {layer}");
    for (i, m) in l.mass.iter().enumerate() {
        assert!(
            m.iter().all(|&x| (-1e-5..=1.0 + 1e-5).contains(&x)),
            "{i}: {m:?}"
        );
        let sum: f32 = m.iter().sum();
        assert!(
            (sum - 1.0).abs() < 1e-4,
            "layer {layer} entry {i}: {m:?} sums to {sum}"
        );
    }
    l.mass
        .chunks(SEG * l.heads)
        .map(|seg| {
            let mut most = [0f32; 4];
            for m in seg {
                for p in 0..4 {
                    most[p] = most[p].max(m[p]);
                }
            }
            most
        })
        .collect()
}

/// The other memories' masses: a Compressive Transformer's compressed memory apart from its XL
/// memory (none before a memory left the XL memory), an RMT's memory tokens (read in every
/// segment), and an LSH layer's mass on the XL memory before its segment (from the same
/// hashes as its forward pass; none in the first segment). Each query's parts sum to 1.
#[test]
fn inspect_masses_of_compressed_memories_memory_tokens_and_lsh_layers() {
    let dev = flex();
    let tokens = tokens();
    let tiny = tiny_stack;
    // Compressive: XL memory of 8 (one segment), 2 compressed vectors at rate 4: the first
    // segment reads nothing, the second the XL memory, the third also a compressed memory.
    let compressive = tiny().with_mem_len(SEG).with_compressive(Some(
        memzoo_stack::CompressiveConfig::new()
            .with_cmem_len(2)
            .with_ratio(4),
    ));
    let model = seeded_weights(compressive.init(&dev).unwrap(), 28, |_| 0.3);
    let ins = run(&model, &tokens);
    for l in 0..2 {
        assert!(ins.layers[l].compressed);
        let most = masses_by_segment(&ins, l);
        assert_eq!(
            [most[0][0], most[0][1]],
            [0.0, 0.0],
            "layer {l}: no memory yet"
        );
        assert_eq!(most[1][0], 0.0, "layer {l}: nothing compressed yet");
        assert!(most[1][1] > 0.05, "layer {l} reads its XL memory: {most:?}");
        assert!(
            most[2][0] > 0.01,
            "layer {l} reads its compressed memory: {most:?}"
        );
        assert!(most.iter().all(|m| m[2] == 0.0), "no kNN layer");
    }
    // RMT: 3 memory tokens read before every segment, none from the XL memory.
    let rmt = tiny()
        .with_mem_len(0)
        .with_rmt(Some(memzoo_stack::RmtConfig::new().with_mem_tokens(3)));
    let model = seeded_weights(rmt.init(&dev).unwrap(), 29, |_| 0.3);
    let ins = run(&model, &tokens);
    assert_eq!(ins.memory, "memory tokens");
    for l in 0..2 {
        assert!(!ins.layers[l].compressed);
        for (s, m) in masses_by_segment(&ins, l).iter().enumerate() {
            assert!(
                m[1] > 0.05,
                "layer {l} segment {s} reads the memory tokens: {m:?}"
            );
        }
    }
    // An LSH layer over an XL layer's memory: nothing before the first segment.
    let lsh = tiny()
        .with_mem_len(SEG)
        .with_layers(vec![
            memzoo_stack::LayerKind::Xl,
            memzoo_stack::LayerKind::Lsh,
        ])
        .with_lsh(
            memzoo_stack::LshConfig::new()
                .with_chunk_len(4)
                .with_n_rounds(2),
        );
    let model = seeded_weights(lsh.init(&dev).unwrap(), 30, |_| 0.3);
    let ins = run(&model, &tokens);
    assert_eq!(ins.layers[1].kind, "lsh");
    assert!(
        ins.layers[1].rounds > 0,
        "the LSH layer still records its buckets"
    );
    let most = masses_by_segment(&ins, 1);
    assert_eq!(most[0][1], 0.0);
    assert!(
        most[1..].iter().any(|m| m[1] > 0.01),
        "the LSH layer attends to the memory: {most:?}"
    );
}

//! The Memorizing Transformer (the layer stack with kNN layers, `MemorizingConfig`): memories
//! filled and reset per row, gradients into the kNN layer, bad configs named, and multi-query
//! kNN memories against the layout of a store per query head.

use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_memory::{IndexKind, KnnMemoryConfig};
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::{KnnLayerConfig, MemorizingConfig, MemorizingState, Step, XlConfig};
use memzoo_tests::host;

fn device() -> Device {
    Device::flex()
}

/// Deterministic pseudo-random numbers in [-1, 1) (the numbers these tests were written with).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tiny(knn_layers: Vec<usize>) -> MemorizingConfig {
    MemorizingConfig::new()
        .with_xl(
            XlConfig::new()
                .with_vocab_size(32)
                .with_d_model(16)
                .with_n_layers(3)
                .with_n_heads(2)
                .with_d_inner(32)
                .with_dropout(0.0)
                .with_mem_len(6)
                .with_positions(PositionConfig::new().with_kind(PositionKind::T5)),
        )
        .with_knn_layers(knn_layers)
        .with_knn(KnnLayerConfig::new().with_top_k(4).with_max_memories(20))
}

/// [`tiny`] retrieving the best `top_k` pairs.
fn tiny_top(knn_layers: Vec<usize>, top_k: usize) -> MemorizingConfig {
    let cfg = tiny(knn_layers);
    let knn = cfg.knn.clone().with_top_k(top_k);
    cfg.with_knn(knn)
}

fn tokens(b: usize, l: usize, seed: u64, dev: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = noise(b * l, seed)
        .iter()
        .map(|x| ((x + 1.0) * 15.9) as i64)
        .collect();
    Tensor::from_data(TensorData::new(v, [b, l]), dev)
}

#[test]
fn model_fills_and_resets_memories_per_row() {
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    assert_eq!(model.layers.len(), 3);
    let mut state = MemorizingState::new();
    let h = model
        .forward_state(tokens(2, 8, 1, &dev), &mut state, &[true, true])
        .unwrap();
    assert_eq!(h.dims(), [2, 8, 16]);
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (8, 8));
    assert_eq!(state.xl.len(), 6);
    model
        .forward_state(tokens(2, 8, 2, &dev), &mut state, &[false, false])
        .unwrap();
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (16, 16));
    model
        .forward_state(tokens(2, 8, 3, &dev), &mut state, &[false, true])
        .unwrap();
    // Row 0: 24 added, capacity 20; row 1 cleared, then this segment.
    assert_eq!((state.knn_len(0, 0), state.knn_len(0, 1)), (20, 8));
    let err = model
        .forward_state(tokens(2, 8, 4, &dev), &mut state, &[false])
        .unwrap_err();
    assert!(err.to_string().contains("reset has 1 flags"), "{err}");
}

#[test]
fn reset_row_sees_nothing_of_the_previous_document() {
    // Segment B after segment A with reset = true must equal B read with a fresh state,
    // row by row, while the other row (no reset) differs.
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    model
        .forward_state(tokens(2, 8, 11, &dev), &mut state, &[true, true])
        .unwrap();
    let seg_b = tokens(2, 8, 12, &dev);
    let carried = host(
        model
            .forward_state(seg_b.clone(), &mut state, &[true, false])
            .unwrap(),
    );
    let mut fresh = MemorizingState::new();
    let alone = host(
        model
            .forward_state(seg_b, &mut fresh, &[true, true])
            .unwrap(),
    );
    let per_row = 8 * 16;
    for (a, f) in carried[..per_row].iter().zip(&alone[..per_row]) {
        assert!((a - f).abs() < 1e-4, "reset row differs: {a} vs {f}");
    }
    let diff: f32 = carried[per_row..]
        .iter()
        .zip(&alone[per_row..])
        .map(|(a, f)| (a - f).abs())
        .sum();
    assert!(diff > 1e-3, "the row without reset should use its memories");
}

#[test]
fn reset_hides_the_old_document_while_it_lingers_in_a_longer_xl_memory() {
    // mem_len 6 > qlen 4: after a reset, the XL memory still holds 2 positions of the old
    // document during the *next* segment too; they must stay hidden. Segments A | B C with a
    // reset at B must give, for C, what B C gives from a fresh state.
    let dev = device();
    let model = tiny(vec![1]).init(&dev).unwrap();
    let (a, b, c) = (
        tokens(1, 4, 31, &dev),
        tokens(1, 4, 32, &dev),
        tokens(1, 4, 33, &dev),
    );
    let mut carried = MemorizingState::new();
    model.forward_state(a, &mut carried, &[true]).unwrap();
    model
        .forward_state(b.clone(), &mut carried, &[true])
        .unwrap();
    assert_eq!(carried.xl.len(), 6);
    let with_old = host(
        model
            .forward_state(c.clone(), &mut carried, &[false])
            .unwrap(),
    );
    let mut fresh = MemorizingState::new();
    model.forward_state(b, &mut fresh, &[true]).unwrap();
    assert_eq!(fresh.xl.len(), 4);
    let alone = host(model.forward_state(c, &mut fresh, &[false]).unwrap());
    for (x, y) in with_old.iter().zip(&alone) {
        assert!((x - y).abs() < 1e-4, "old document leaked: {x} vs {y}");
    }
}

#[test]
fn loss_backpropagates_into_gate_temperature_and_projections() {
    let dev = device().autodiff();
    let model = tiny(vec![2]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    // First segment fills the memory; the second retrieves from it.
    let _ = model
        .eval_step(
            tokens(2, 8, 21, &dev),
            tokens(2, 8, 22, &dev),
            &mut state,
            &Step::reset(&[true, true]),
        )
        .unwrap();
    let loss = model
        .eval_step(
            tokens(2, 8, 23, &dev),
            tokens(2, 8, 24, &dev),
            &mut state,
            &Step::reset(&[false, false]),
        )
        .unwrap()
        .nll
        .mean();
    let value = loss.clone().into_scalar::<f32>();
    assert!(
        value.is_finite() && value > 2.0,
        "loss {value} (ln 32 = 3.47)"
    );
    let grads = loss.backward();
    let memzoo_stack::LayerAttention::Knn(att) = &model.layers[2].attention else {
        panic!("layer 2 is the kNN layer")
    };
    for (name, g) in [
        ("gate", att.gate.val().grad(&grads).map(host)),
        ("log_scale", att.log_scale.val().grad(&grads).map(host)),
        (
            "query",
            att.attention.query.weight.val().grad(&grads).map(host),
        ),
    ] {
        let g = g.unwrap_or_else(|| panic!("{name} has no gradient"));
        assert!(g.iter().any(|v| v.abs() > 0.0), "{name} gradient is zero");
    }
}

#[test]
fn bad_configs_name_the_value() {
    let dev = device();
    for (cfg, needle) in [
        (tiny(vec![3]), "knn_layers contains 3"),
        (tiny(vec![1, 1]), "twice"),
        (tiny(vec![0, 1, 2]), "all 3 layers"),
        (tiny_top(vec![1], 0), "knn.top_k"),
        (tiny_top(vec![1], 21), "exceeds knn.max_memories"),
    ] {
        let err = cfg.init(&dev).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    // No kNN layer: a plain XL of the same shape.
    let plain = tiny(vec![]).init(&dev).unwrap();
    let mut state = MemorizingState::new();
    plain
        .forward_state(tokens(1, 4, 1, &dev), &mut state, &[true])
        .unwrap();
    assert!(state.knn.is_empty());
}

/// The memory layout before stores were per kv head: a store per query head holding copies
/// of its kv head's pairs, behind the grouped config the layer checks.
#[derive(Debug)]
struct ExpandedCopies {
    grouped: KnnMemoryConfig,
    inner: Box<dyn memzoo_memory::KnnIndex>,
}

impl memzoo_memory::KnnIndex for ExpandedCopies {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }
    fn config(&self) -> &KnnMemoryConfig {
        &self.grouped
    }
    fn batch(&self) -> usize {
        self.inner.batch()
    }
    fn add(
        &mut self,
        keys: Tensor<4>,
        values: Tensor<4>,
    ) -> Result<(), memzoo_memory::MemoryError> {
        // [b, t, kv, d] -> [b, t, kv * group, d], kv head g copied to query heads g * group..
        let group = self.grouped.group();
        let expand = |x: Tensor<4>| {
            let [b, t, kv, d] = x.dims();
            x.reshape([b, t, kv, 1, d])
                .expand([b, t, kv, group, d])
                .reshape([b, t, kv * group, d])
        };
        self.inner.add(expand(keys), expand(values))
    }
    fn search(
        &self,
        queries: Tensor<4>,
        k: usize,
    ) -> Result<memzoo_memory::Retrieved, memzoo_memory::MemoryError> {
        self.inner.search(queries, k)
    }
    fn clear(&mut self, rows: &[usize]) -> Result<(), memzoo_memory::MemoryError> {
        self.inner.clear(rows)
    }
    fn rows(&self) -> &[memzoo_memory::RowState] {
        self.inner.rows()
    }
    fn snapshot(&self) -> Result<memzoo_memory::persist::Snapshot, memzoo_memory::MemoryError> {
        self.inner.snapshot()
    }
    fn save_extra(&self, dir: &std::path::Path) -> Result<Vec<u32>, memzoo_memory::MemoryError> {
        self.inner.save_extra(dir)
    }
}

#[test]
fn multi_query_model_equals_the_model_with_a_store_per_query_head() {
    // kv_heads 1 and 2 on 4 query heads: the memory stores each kv head once; the same model
    // reading a memory of per-query-head copies (the old layout) gives the same outputs,
    // segment after segment (the ring wraps at 20, row 1 resets), with the exact search's
    // top-k on the host and on the device.
    use memzoo_memory::TopkPlacement;
    let dev = device();
    for kv in [1, 2] {
        let mut config = tiny(vec![1]);
        config.xl = config
            .xl
            .clone()
            .with_d_model(32)
            .with_n_heads(4)
            .with_kv_heads(Some(kv));
        let model = config.init(&dev).unwrap();
        let memory = config.memory();
        assert_eq!((memory.n_heads, memory.kv_heads()), (4, kv));
        for topk in [TopkPlacement::Host, TopkPlacement::Device] {
            let memory = memory.clone().with_topk(topk);
            let mut grouped = MemorizingState::new();
            grouped.knn = vec![memory.init(2, &dev).unwrap()];
            let mut copies = MemorizingState::new();
            copies.knn = vec![Box::new(ExpandedCopies {
                grouped: memory.clone(),
                inner: memory.clone().with_n_kv_heads(None).init(2, &dev).unwrap(),
            })];
            let resets = [[true, true], [false, false], [false, true], [false, false]];
            for (s, reset) in resets.iter().enumerate() {
                let x = tokens(2, 8, 10 + s as u64, &dev);
                let a = host(model.forward_state(x.clone(), &mut grouped, reset).unwrap());
                let b = host(model.forward_state(x, &mut copies, reset).unwrap());
                for (p, q) in a.iter().zip(&b) {
                    assert!(
                        (p - q).abs() < 1e-5,
                        "kv {kv} {topk:?} segment {s}: {p} vs {q}"
                    );
                }
                assert_eq!(grouped.knn[0].rows(), copies.knn[0].rows(), "segment {s}");
            }
            // The memories themselves: the same pairs found for any queries.
            let d = memory.d_head;
            let q = Tensor::<4>::from_data(
                TensorData::new(noise(2 * 5 * 4 * d, 77), [2, 5, 4, d]),
                &dev,
            );
            let (a, b) = (
                grouped.knn[0].search(q.clone(), 4).unwrap(),
                copies.knn[0].search(q, 4).unwrap(),
            );
            assert_eq!(
                host(a.keys),
                host(b.keys),
                "kv {kv} {topk:?}: retrieved keys"
            );
            assert_eq!(
                host(a.values),
                host(b.values),
                "kv {kv} {topk:?}: retrieved values"
            );
            // The grouped memory holds kv heads: a quarter / half of the copies' floats.
            let (g, c) = (
                grouped.knn[0].snapshot().unwrap(),
                copies.knn[0].snapshot().unwrap(),
            );
            assert_eq!(g.keys.len() * (4 / kv), c.keys.len());
        }
        // A memory built for the query heads does not fit the grouped layer.
        let mut wrong = MemorizingState::new();
        wrong.knn = vec![memory.clone().with_n_kv_heads(None).init(2, &dev).unwrap()];
        let err = model
            .forward_state(tokens(2, 8, 1, &dev), &mut wrong, &[true, true])
            .unwrap_err();
        assert!(err.to_string().contains("kv heads"), "{err}");
    }
}

//! Tests of the kNN memory: every result is checked against a naive host computation.

use burn::tensor::{Device, Tensor, TensorData};

use crate::keys::{clustered_keys, recall, retrieved_ids, segment_tensors};
use crate::*;

fn device() -> Device {
    Device::flex()
}

fn config(kind: IndexKind, heads: usize, d: usize, max: usize) -> KnnMemoryConfig {
    KnnMemoryConfig::new(heads, d)
        .with_kind(kind)
        .with_max_memories(max)
}

const KINDS: [IndexKind; 2] = [IndexKind::Exact, IndexKind::Hnsw];

fn tensor4(data: Vec<f32>, shape: [usize; 4]) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data, shape), &device())
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap()
}

/// The `n` keys of one store, `[n, d]`, of row `row` and head `head` of `keys`, laid out
/// `[batch, n, heads, d]`.
fn store_keys(
    keys: &[f32],
    (n, heads, d): (usize, usize, usize),
    row: usize,
    head: usize,
) -> Vec<f32> {
    (0..n)
        .flat_map(|i| {
            let at = ((row * n + i) * heads + head) * d;
            keys[at..at + d].to_vec()
        })
        .collect()
}

/// Naive top-k ids over `keys[n, d]` for `q[d]`, by inner product, best first.
fn naive_topk(keys: &[f32], q: &[f32], d: usize, k: usize) -> Vec<usize> {
    let mut scored: Vec<(f32, usize)> = keys
        .chunks(d)
        .enumerate()
        .map(|(i, key)| (key.iter().zip(q).map(|(a, b)| a * b).sum(), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(k).map(|(_, i)| i).collect()
}

/// Exact search against a naive top-k, for 4 queries a row and for 1 (a generated token's:
/// the host store scores a single query without `gemm`).
#[test]
fn exact_search_equals_naive_topk_per_row_and_head() {
    for t in [4, 1] {
        exact_search_equals_naive_topk(t);
    }
}

fn exact_search_equals_naive_topk(t: usize) {
    let (b, h, d, n, k) = (2, 3, 8, 50, 5);
    let dev = device();
    let mut index = config(IndexKind::Exact, h, d, 64).init(b, &dev).unwrap();
    // Distinct keys per (row, head): [b, n, h, d]; value = [row, head, slot, 0...].
    let keys = clustered_keys(b * n * h, d, 0, 0.0, 1);
    let mut values = vec![0.0f32; b * n * h * d];
    for (o, v) in values.chunks_mut(d).enumerate() {
        let (row, i, head) = (o / (n * h), (o / h) % n, o % h);
        v[0] = row as f32;
        v[1] = head as f32;
        v[2] = i as f32;
    }
    index
        .add(
            tensor4(keys.clone(), [b, n, h, d]),
            tensor4(values, [b, n, h, d]),
        )
        .unwrap();
    let queries = clustered_keys(b * t * h, d, 0, 0.0, 2);
    let r = index
        .search(tensor4(queries.clone(), [b, t, h, d]), k)
        .unwrap();
    assert_eq!(r.keys.dims(), [b, t, h, k, d]);
    let rk = host(r.keys);
    let rv = host(r.values);
    for row in 0..b {
        for head in 0..h {
            let own = store_keys(&keys, (n, h, d), row, head);
            for ti in 0..t {
                let qa = ((row * t + ti) * h + head) * d;
                let want = naive_topk(&own, &queries[qa..qa + d], d, k);
                for (j, &slot) in want.iter().enumerate() {
                    let o = (((row * t + ti) * h + head) * k + j) * d;
                    assert_eq!(rv[o] as usize, row, "row of the retrieved value");
                    assert_eq!(rv[o + 1] as usize, head, "head of the retrieved value");
                    assert_eq!(rv[o + 2] as usize, slot, "rank {j} of query {ti}");
                    let key = &own[slot * d..(slot + 1) * d];
                    for (a, e) in rk[o..o + d].iter().zip(key) {
                        assert!((a - e).abs() < 1e-6);
                    }
                }
            }
        }
    }
}

#[test]
fn host_and_device_topk_agree() {
    let (b, h, d, n, t, k) = (1, 2, 16, 300, 6, 7);
    let dev = device();
    let keys = clustered_keys(b * n * h, d, 4, 0.5, 3);
    let q = clustered_keys(b * t * h, d, 4, 0.5, 4);
    let mut ids = Vec::new();
    for topk in [TopkPlacement::Host, TopkPlacement::Device] {
        let mut index = config(IndexKind::Exact, h, d, 512)
            .with_topk(topk)
            .init(b, &dev)
            .unwrap();
        let (kt, vt) = segment_tensors(&keys, n, 0, n, b, h, d, &dev);
        index.add(kt, vt).unwrap();
        ids.push(retrieved_ids(
            &index.search(tensor4(q.clone(), [b, t, h, d]), k).unwrap(),
        ));
    }
    assert_eq!(ids[0], ids[1]);
}

/// The device search scores every allocated slot (shapes fixed by the allocation, not the
/// fill) and hides each row's unfilled ones: rows of 320 and 20 entries in 600 slots give
/// the naive top-k of their own entries, the short row's missing ones masked.
#[test]
fn device_search_over_a_partly_filled_allocation_is_exact() {
    let (b, h, d, n, t, k) = (2, 2, 8, 320, 5, 32);
    let dev = device();
    let keys = clustered_keys(n, d, 4, 0.5, 41);
    let queries = clustered_keys(b * t * h, d, 4, 0.5, 42);
    for topk in [TopkPlacement::Host, TopkPlacement::Device] {
        let mut index = config(IndexKind::Exact, h, d, 1024)
            .with_topk(topk)
            .init(b, &dev)
            .unwrap();
        let (kt, vt) = segment_tensors(&keys, n, 0, 300, b, h, d, &dev);
        index.add(kt, vt).unwrap();
        index.clear(&[1]).unwrap();
        let (kt, vt) = segment_tensors(&keys, n, 300, 20, b, h, d, &dev);
        index.add(kt, vt).unwrap();
        assert_eq!((index.len(0), index.len(1)), (320, 20));
        let r = index
            .search(tensor4(queries.clone(), [b, t, h, d]), k)
            .unwrap();
        let ids = retrieved_ids(&r);
        let mask = r.mask.into_data().try_into_vec::<bool>().unwrap();
        for row in 0..b {
            let first = if row == 0 { 0 } else { 300 };
            let own = &keys[first * d..n * d];
            for ti in 0..t {
                for head in 0..h {
                    let qa = ((row * t + ti) * h + head) * d;
                    let mut want: Vec<i64> = naive_topk(own, &queries[qa..qa + d], d, k)
                        .into_iter()
                        .map(|i| (first + i) as i64)
                        .collect();
                    want.resize(k, -1);
                    let at = ((row * t + ti) * h + head) * k;
                    assert_eq!(ids[at..at + k], want[..], "{topk:?} row {row} query {ti}");
                    let empty: Vec<bool> = want.iter().map(|&i| i < 0).collect();
                    assert_eq!(mask[at..at + k], empty[..], "{topk:?} row {row} query {ti}");
                }
            }
        }
    }
}

/// A model trains on an autodiff device, so its kNN memory gets autodiff tensors; the device
/// store leaves autodiff out (Burn's autodiff top-k is a full sort, on the host for CubeCL's
/// backends; `topk` asserts it, so this fails when the store keeps autodiff), finds what a
/// naive search finds, and hands
/// back keys and values on the queries' autodiff device.
#[test]
fn device_search_from_an_autodiff_model_leaves_autodiff_out() {
    let (b, h, d, n, t, k) = (1, 2, 8, 100, 3, 4);
    let dev = device().autodiff();
    let keys = clustered_keys(n, d, 4, 0.5, 43);
    let queries = clustered_keys(b * t * h, d, 4, 0.5, 44);
    let mut index = config(IndexKind::Exact, h, d, 256)
        .with_topk(TopkPlacement::Device)
        .init(b, &dev)
        .unwrap();
    let (kt, vt) = segment_tensors(&keys, n, 0, n, b, h, d, &dev);
    assert!(kt.is_autodiff(), "the test feeds autodiff keys");
    index.add(kt, vt).unwrap();
    let q = Tensor::<4>::from_data(TensorData::new(queries.clone(), [b, t, h, d]), &dev);
    let r = index.search(q, k).unwrap();
    assert!(r.keys.is_autodiff() && r.values.is_autodiff());
    let ids = retrieved_ids(&r);
    for ti in 0..t {
        for head in 0..h {
            let qa = (ti * h + head) * d;
            let want: Vec<i64> = naive_topk(&keys, &queries[qa..qa + d], d, k)
                .into_iter()
                .map(|i| i as i64)
                .collect();
            let at = (ti * h + head) * k;
            assert_eq!(ids[at..at + k], want[..], "query {ti} head {head}");
        }
    }
}

#[test]
fn fewer_than_k_entries_are_masked_and_zero() {
    for kind in KINDS {
        let (h, d) = (2, 4);
        let dev = device();
        let mut index = config(kind, h, d, 16).init(1, &dev).unwrap();
        let keys = clustered_keys(3, d, 0, 0.0, 5);
        let (kt, vt) = segment_tensors(&keys, 3, 0, 3, 1, h, d, &dev);
        index.add(kt, vt).unwrap();
        let r = index
            .search(tensor4(keys[..d * h].to_vec(), [1, 1, h, d]), 5)
            .unwrap();
        let mask = r.mask.clone().into_data().try_into_vec::<bool>().unwrap();
        assert_eq!(
            mask,
            [false, false, false, true, true].repeat(h),
            "{kind:?}"
        );
        let ids = retrieved_ids(&r);
        let mut found: Vec<i64> = ids[..5].to_vec();
        found.sort();
        assert_eq!(found, vec![-1, -1, 0, 1, 2], "{kind:?}");
        let rk = host(r.keys);
        assert!(
            rk[3 * d..5 * d].iter().all(|&x| x == 0.0),
            "{kind:?}: empty keys are zero"
        );
    }
}

#[test]
fn fifo_evicts_the_oldest_entries() {
    for kind in KINDS {
        let (h, d, cap) = (2, 8, 8);
        let dev = device();
        let mut index = config(kind, h, d, cap).init(1, &dev).unwrap();
        let keys = clustered_keys(32, d, 0, 0.0, 6);
        let mut added = 0;
        for seg in [5, 6, 3, 20] {
            let (kt, vt) = segment_tensors(&keys, 32, added, seg, 1, h, d, &dev);
            index.add(kt, vt).unwrap();
            added += seg;
            assert_eq!(index.len(0), added.min(cap), "{kind:?}");
            // Query with every stored key's own vector: top-cap returns exactly the survivors.
            let r = index
                .search(tensor4(keys[..d * h].to_vec(), [1, 1, h, d]), cap)
                .unwrap();
            for head in 0..h {
                let mut ids: Vec<i64> = retrieved_ids(&r)[head * cap..(head + 1) * cap]
                    .iter()
                    .copied()
                    .filter(|&x| x >= 0)
                    .collect();
                ids.sort();
                let first = added.saturating_sub(cap) as i64;
                let want: Vec<i64> = (first..added as i64).collect();
                assert_eq!(ids, want, "{kind:?} after {added} adds, head {head}");
            }
        }
        assert_eq!(index.capacity(), cap);
    }
}

#[test]
fn clear_empties_only_the_given_rows() {
    for kind in KINDS {
        let (b, h, d) = (3, 2, 8);
        let dev = device();
        let mut index = config(kind, h, d, 64).init(b, &dev).unwrap();
        let keys = clustered_keys(40, d, 0, 0.0, 7);
        let (kt, vt) = segment_tensors(&keys, 40, 0, 40, b, h, d, &dev);
        index.add(kt, vt).unwrap();
        let q = tensor4(clustered_keys(b * 3 * h, d, 0, 0.0, 8), [b, 3, h, d]);
        let before = retrieved_ids(&index.search(q.clone(), 4).unwrap());
        index.clear(&[1]).unwrap();
        assert_eq!((index.len(0), index.len(1), index.len(2)), (40, 0, 40));
        let after = retrieved_ids(&index.search(q.clone(), 4).unwrap());
        let per_row = 3 * h * 4;
        assert_eq!(
            before[..per_row],
            after[..per_row],
            "{kind:?}: row 0 unchanged"
        );
        assert!(
            after[per_row..2 * per_row].iter().all(|&x| x == -1),
            "{kind:?}"
        );
        assert_eq!(
            before[2 * per_row..],
            after[2 * per_row..],
            "{kind:?}: row 2 unchanged"
        );
        // A cleared row refills from scratch, FIFO intact.
        let (kt, vt) = segment_tensors(&keys, 40, 100, 2, b, h, d, &dev);
        index.add(kt, vt).unwrap();
        assert_eq!((index.len(0), index.len(1)), (42, 2));
        assert!(index.clear(&[3]).is_err(), "row 3 of 3 is an error");
    }
}

#[test]
fn no_row_retrieves_another_rows_memories() {
    for kind in KINDS {
        let (b, h, d, n, t) = (3, 2, 8, 30, 5);
        let dev = device();
        let mut index = config(kind, h, d, 64).init(b, &dev).unwrap();
        // Distinct keys per row; the values name the row (1-based).
        let k = clustered_keys(b * n * h, d, 2, 0.3, 9);
        let mut v = vec![0.0f32; b * n * h * d];
        for (o, c) in v.chunks_mut(d).enumerate() {
            c[0] = (o / (n * h)) as f32 + 1.0;
        }
        index
            .add(tensor4(k.clone(), [b, n, h, d]), tensor4(v, [b, n, h, d]))
            .unwrap();
        index.clear(&[2]).unwrap();
        // Row r queries with exact copies of keys stored in row (r + 1) % b: perfect matches
        // that live in another row.
        let mut q = Vec::new();
        for r in 0..b {
            let other = (r + 1) % b;
            q.extend_from_slice(&k[other * n * h * d..(other * n + t) * h * d]);
        }
        let r = index.search(tensor4(q, [b, t, h, d]), 10).unwrap();
        let vals = host(r.values);
        let mask = r.mask.into_data().try_into_vec::<bool>().unwrap();
        for (o, &hidden) in mask.iter().enumerate() {
            let row = o / (t * h * 10);
            if row == 2 {
                assert!(hidden, "{kind:?}: cleared row 2 found an entry");
            } else {
                assert!(!hidden);
                assert_eq!(
                    vals[o * d],
                    row as f32 + 1.0,
                    "{kind:?}: row {row} got another row's value"
                );
            }
        }
    }
}

#[test]
fn bad_shapes_and_configs_are_errors() {
    let dev = device();
    let mut index = config(IndexKind::Exact, 2, 4, 8).init(2, &dev).unwrap();
    let err = index
        .add(
            Tensor::zeros([2, 3, 2, 5], &dev),
            Tensor::zeros([2, 3, 2, 5], &dev),
        )
        .unwrap_err();
    assert!(err.to_string().contains("[2, 3, 2, 5]"), "{err}");
    assert!(index.search(Tensor::zeros([1, 3, 2, 4], &dev), 2).is_err());
    assert!(index.search(Tensor::zeros([2, 3, 2, 4], &dev), 0).is_err());
    let err = config(IndexKind::Hnsw, 2, 0, 8).init(1, &dev).unwrap_err();
    assert!(err.to_string().contains("d_head"), "{err}");
    assert!(config(IndexKind::Exact, 2, 4, 0).init(1, &dev).is_err());
    let err = config(IndexKind::Exact, 2, 256, 8)
        .with_scoring(HostScoring::Int8)
        .init(1, &dev)
        .unwrap_err();
    assert!(err.to_string().contains("256"), "{err}");
    // `auto` falls back to f32 for such heads.
    assert!(config(IndexKind::Exact, 2, 256, 8).init(1, &dev).is_ok());
    assert_eq!("int8".parse::<HostScoring>(), Ok(HostScoring::Int8));
    assert_eq!("int8avx2".parse::<HostScoring>(), Ok(HostScoring::Int8Avx2));
    assert_eq!(
        "int8avxvnni".parse::<HostScoring>(),
        Ok(HostScoring::Int8AvxVnni)
    );
    assert!("int4".parse::<HostScoring>().unwrap_err().contains("int4"));
}

#[test]
fn auto_picks_exact_below_the_crossover() {
    let c = KnnMemoryConfig::new(8, 32);
    assert_eq!(c.kind, IndexKind::Auto);
    assert_eq!(c.resolved_kind(), IndexKind::Exact);
    let big = c.clone().with_max_memories(c.auto_crossover + 1);
    assert_eq!(big.resolved_kind(), IndexKind::Hnsw);
}

#[test]
fn hnsw_recall_at_defaults_on_random_and_clustered_keys() {
    // Default HNSW parameters, d_head 32 (Memorizing-small), 8,192 stored, k = 32.
    let (h, d, n, t, k) = (2, 32, 8192, 64, 32);
    let dev = device();
    for (name, clusters, min) in [("random", 0, 0.95), ("clustered", 64, 0.95)] {
        let keys = clustered_keys(n, d, clusters, 0.6, 10);
        let queries = clustered_keys(t, d, clusters, 0.6, 11);
        let mut ids = Vec::new();
        for kind in KINDS {
            let mut index = config(kind, h, d, n).init(1, &dev).unwrap();
            crate::keys::fill(index.as_mut(), &keys, n, 2048, &dev).unwrap();
            let (q, _) = segment_tensors(&queries, t, 0, t, 1, h, d, &dev);
            ids.push(retrieved_ids(&index.search(q, k).unwrap()));
        }
        let r = recall(&ids[1], &ids[0], k);
        println!("recall@{k} of HNSW (defaults) vs exact, {name} keys, {n} stored: {r:.4}");
        assert!(r >= min, "{name}: recall@{k} = {r:.4} < {min}");
    }
}

fn round_trip(kind: IndexKind, scoring: HostScoring) {
    let (b, h, d, cap) = (2, 2, 8, 32);
    let dev = device();
    let c = config(kind, h, d, cap).with_scoring(scoring);
    let mut index = c.init(b, &dev).unwrap();
    let keys = clustered_keys(64, d, 3, 0.5, 12);
    // Wrap the ring (45 > 32) and leave row 1 shorter.
    let (kt, vt) = segment_tensors(&keys, 64, 0, 45, b, h, d, &dev);
    index.add(kt, vt).unwrap();
    index.clear(&[1]).unwrap();
    let (kt, vt) = segment_tensors(&keys, 64, 45, 7, b, h, d, &dev);
    index.add(kt, vt).unwrap();
    let dir = tempfile::tempdir().unwrap();
    index.save(dir.path()).unwrap();
    let opened = open(dir.path(), &c, &dev).unwrap();
    assert_eq!(opened.kind(), kind);
    assert_eq!(opened.rows(), index.rows());
    let q = tensor4(clustered_keys(b * 4 * h, d, 3, 0.5, 13), [b, 4, h, d]);
    let (a, o) = (
        index.search(q.clone(), 9).unwrap(),
        opened.search(q, 9).unwrap(),
    );
    assert_eq!(host(a.keys), host(o.keys), "{kind:?}: keys");
    assert_eq!(host(a.values), host(o.values), "{kind:?}: values");
    assert_eq!(
        a.mask.into_data().try_into_vec::<bool>().unwrap(),
        o.mask.into_data().try_into_vec::<bool>().unwrap()
    );
    // The opened memory keeps working: FIFO continues where it stopped.
    let mut opened = opened;
    let (kt, vt) = segment_tensors(&keys, 64, 52, 3, b, h, d, &dev);
    opened.add(kt.clone(), vt.clone()).unwrap();
    index.add(kt, vt).unwrap();
    let q = tensor4(clustered_keys(b * 4 * h, d, 3, 0.5, 14), [b, 4, h, d]);
    let ids = retrieved_ids(&opened.search(q.clone(), 9).unwrap());
    assert_eq!(retrieved_ids(&index.search(q.clone(), 9).unwrap()), ids);
    if kind == IndexKind::Exact && scoring != HostScoring::F32 {
        // The same adds into an f32 memory find the same keys.
        let mut f32 = config(kind, h, d, cap)
            .with_scoring(HostScoring::F32)
            .init(b, &dev)
            .unwrap();
        for (first, count) in [(0, 45), (45, 7), (52, 3)] {
            if first == 45 {
                f32.clear(&[1]).unwrap();
            }
            let (kt, vt) = segment_tensors(&keys, 64, first, count, b, h, d, &dev);
            f32.add(kt, vt).unwrap();
        }
        assert_eq!(
            retrieved_ids(&f32.search(q, 9).unwrap()),
            ids,
            "{scoring:?}"
        );
    }
}

#[test]
fn save_open_round_trip_exact() {
    round_trip(IndexKind::Exact, HostScoring::F32);
}

/// With int8 scoring: the opened memory quantises its keys from the file; both find the f32
/// search's keys.
#[test]
fn save_open_round_trip_exact_int8() {
    round_trip(IndexKind::Exact, HostScoring::Int8);
}

#[test]
fn save_open_round_trip_hnsw() {
    round_trip(IndexKind::Hnsw, HostScoring::Auto);
}

#[test]
fn damaged_or_mismatched_files_are_errors() {
    let dev = device();
    for kind in KINDS {
        let c = config(kind, 2, 8, 32);
        let mut index = c.init(1, &dev).unwrap();
        let keys = clustered_keys(20, 8, 0, 0.0, 15);
        let (kt, vt) = segment_tensors(&keys, 20, 0, 20, 1, 2, 8, &dev);
        index.add(kt, vt).unwrap();
        let fresh = || {
            let dir = tempfile::tempdir().unwrap();
            index.save(dir.path()).unwrap();
            dir
        };
        let expect_err = |dir: &std::path::Path, c: &KnnMemoryConfig, what: &str, needle: &str| {
            let err = open(dir, c, &dev).expect_err(what).to_string();
            assert!(err.contains(needle), "{kind:?} {what}: {err}");
        };
        // A flipped byte in the values.
        let dir = fresh();
        let p = dir.path().join("values.f32");
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[17] ^= 0x40;
        std::fs::write(&p, bytes).unwrap();
        expect_err(
            dir.path(),
            &c,
            "flipped value byte",
            "values.f32 has CRC-32",
        );
        // Truncated keys.
        let dir = fresh();
        let p = dir.path().join("keys.f32");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 4]).unwrap();
        expect_err(dir.path(), &c, "truncated keys", "keys.f32 has");
        // Missing header, garbage header.
        let dir = fresh();
        std::fs::remove_file(dir.path().join("header.json")).unwrap();
        expect_err(dir.path(), &c, "missing header", "header.json");
        let dir = fresh();
        std::fs::write(dir.path().join("header.json"), "{ not json").unwrap();
        expect_err(dir.path(), &c, "garbage header", "header.json");
        // Config mismatches.
        let dir = fresh();
        expect_err(dir.path(), &config(kind, 2, 16, 32), "d_head", "d_head = 8");
        expect_err(
            dir.path(),
            &config(kind, 2, 8, 64),
            "max_memories",
            "max_memories = 32",
        );
        let other = if kind == IndexKind::Exact {
            IndexKind::Hnsw
        } else {
            IndexKind::Exact
        };
        expect_err(dir.path(), &config(other, 2, 8, 32), "kind", "kind");
        if kind == IndexKind::Hnsw {
            let p = dir.path().join(UsearchIndex::file_name(0, 1));
            let mut bytes = std::fs::read(&p).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x01;
            std::fs::write(&p, bytes).unwrap();
            expect_err(
                dir.path(),
                &c,
                "damaged index",
                "index-b0-h1.usearch has CRC-32",
            );
            std::fs::remove_file(&p).unwrap();
            expect_err(dir.path(), &c, "missing index", "index-b0-h1.usearch");
        }
    }
}

/// Uniform draws in `[0, 1)` from a xorshift generator started at `seed` (not 0).
pub(crate) fn uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The host top-k (block maxima, then the blocks that reach the floor) of every row of a
/// column-major score matrix, fed in chunks of columns (the search's 8,192, and sizes that are
/// not a multiple of the block), equals each row's full sort (score descending, index
/// ascending): single rows up to 262,144 scores, many rows, short rows and rows full of ties.
#[test]
fn host_top_k_of_columns_equals_a_full_sort_per_row() {
    use crate::host::ColumnsTopK;
    let mut rand = uniform(0x9e37_79b9_7f4a_7c15);
    let mut out = ColumnsTopK::default();
    for (n_rows, n, k, levels, chunk) in [
        (1, 9_000, 32, 0, 8192),
        (1, 5_003, 7, 0, 8192),
        (1, 2_049, 32, 0, 8192),
        (1, 100, 32, 0, 8192),
        (1, 40, 40, 0, 8192),
        (1, 4_000, 32, 5, 8192),
        (1, 70_001, 32, 0, 8192),
        (1, 262_144, 32, 0, 8192),
        (3, 100, 7, 0, 100),
        (64, 5_003, 32, 0, 2048),
        (8, 40_000, 32, 3, 1000),
        (5, 70_001, 32, 0, 2048),
        (1, 9_000, 1, 0, 7),
        (64, 32, 32, 0, 5),
        (4, 3_000, 40, 0, 13),
    ] {
        let scores: Vec<f32> = (0..n_rows * n)
            .map(|_| {
                let x = rand();
                if levels > 0 {
                    (x * levels as f32).round()
                } else {
                    x
                }
            })
            .collect();
        out.start(n_rows, k);
        for (c, part) in scores.chunks(chunk * n_rows).enumerate() {
            out.push(part, c * chunk);
        }
        out.finish();
        for r in 0..n_rows {
            let mut want: Vec<(f32, u32)> =
                (0..n).map(|j| (scores[j * n_rows + r], j as u32)).collect();
            want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            want.truncate(k);
            assert_eq!(
                out.rows[r], want,
                "rows {n_rows}, n {n}, k {k}, row {r}, chunk {chunk}"
            );
        }
    }
}

/// `when_full = reset` (memorizing-transformers-pytorch): an add that would take a row above
/// `max_memories` empties the row first; the pairs that add stored are not found by the next
/// search (the package's untrained faiss index), and are after the following add. Other rows
/// keep their pairs.
#[test]
fn reset_when_full_empties_the_row_and_hides_it_for_one_search() {
    for kind in KINDS {
        let (b, h, d, cap) = (2, 2, 4, 6);
        let dev = device();
        let mut index = config(kind, h, d, cap)
            .with_when_full(WhenFull::Reset)
            .init(b, &dev)
            .unwrap();
        let keys = clustered_keys(40, d, 0, 0.0, 3);
        let add = |index: &mut Box<dyn KnnIndex>, first: usize, t: usize| {
            let (k, v) = segment_tensors(&keys, 40, first, t, b, h, d, &dev);
            index.add(k, v).unwrap();
        };
        let t = 2;
        let q = tensor4(clustered_keys(b * t * h, d, 0, 0.0, 4), [b, t, h, d]);
        // Per row: the sorted distinct ids its queries found (-1: an empty slot).
        let found = |index: &dyn KnnIndex, k: usize| -> Vec<Vec<i64>> {
            let ids = retrieved_ids(&index.search(q.clone(), k).unwrap());
            ids.chunks(t * h * k)
                .map(|row| {
                    let mut r = row.to_vec();
                    r.sort_unstable();
                    r.dedup();
                    r
                })
                .collect()
        };
        add(&mut index, 0, 4);
        assert_eq!(
            found(index.as_ref(), 4),
            vec![vec![0, 1, 2, 3]; 2],
            "{kind:?}"
        );
        index.clear(&[1]).unwrap();
        // Row 0: 4 + 3 > 6 resets it to the 3 new pairs, hidden; row 1: 0 + 3 fits.
        add(&mut index, 4, 3);
        assert_eq!((index.len(0), index.len(1)), (3, 3), "{kind:?}");
        assert_eq!(
            found(index.as_ref(), 3),
            vec![vec![-1], vec![4, 5, 6]],
            "{kind:?}"
        );
        // The next add makes row 0's pairs searchable again: 3 + 2 fits.
        add(&mut index, 7, 2);
        assert_eq!((index.len(0), index.len(1)), (5, 5), "{kind:?}");
        assert_eq!(
            found(index.as_ref(), 6),
            vec![vec![-1, 4, 5, 6, 7, 8]; 2],
            "{kind:?}"
        );
    }
}

/// A grouped config: `heads` query heads sharing `kv` key/value heads.
fn grouped(kind: IndexKind, heads: usize, kv: usize, d: usize, max: usize) -> KnnMemoryConfig {
    config(kind, heads, d, max).with_n_kv_heads(Some(kv))
}

#[test]
fn grouped_exact_search_equals_naive_per_query_head() {
    // 8 query heads on 1 and 2 kv heads, host and device top-k; 400 stored per (row, kv
    // head) takes the host top-k's block pass (n >= 4 k 16). 5 queries a row, and 1 (a
    // generated token's: the host store searches each kv head in a task of its own).
    for t in [5, 1] {
        grouped_exact_search_equals_naive(t);
    }
}

fn grouped_exact_search_equals_naive(t: usize) {
    let (b, h, d, n, k) = (2, 8, 8, 400, 5);
    let dev = device();
    for kv in [1, 2, 4] {
        let group = h / kv;
        // Keys [b, n, kv, d]; value = [row, kv head, slot, 0...].
        let keys = clustered_keys(b * n * kv, d, 0, 0.0, 21 + kv as u64);
        let mut values = vec![0.0f32; b * n * kv * d];
        for (o, v) in values.chunks_mut(d).enumerate() {
            let (row, i, g) = (o / (n * kv), (o / kv) % n, o % kv);
            v[0] = row as f32;
            v[1] = g as f32;
            v[2] = i as f32;
        }
        let queries = clustered_keys(b * t * h, d, 0, 0.0, 31 + kv as u64);
        for (topk, scoring) in [
            (TopkPlacement::Host, HostScoring::F32),
            (TopkPlacement::Host, HostScoring::Int8),
            (TopkPlacement::Device, HostScoring::Auto),
        ] {
            let mut index = grouped(IndexKind::Exact, h, kv, d, 512)
                .with_topk(topk)
                .with_scoring(scoring)
                .init(b, &dev)
                .unwrap();
            index
                .add(
                    tensor4(keys.clone(), [b, n, kv, d]),
                    tensor4(values.clone(), [b, n, kv, d]),
                )
                .unwrap();
            let r = index
                .search(tensor4(queries.clone(), [b, t, h, d]), k)
                .unwrap();
            assert_eq!(r.keys.dims(), [b, t, h, k, d]);
            assert_eq!(r.mask.dims(), [b, t, h, k]);
            let (rk, rv) = (host(r.keys), host(r.values));
            let mask = r.mask.into_data().try_into_vec::<bool>().unwrap();
            assert!(
                mask.iter().all(|&m| !m),
                "kv {kv} {topk:?} {scoring:?}: every slot found"
            );
            for row in 0..b {
                for head in 0..h {
                    let g = head / group;
                    let own = store_keys(&keys, (n, kv, d), row, g);
                    for ti in 0..t {
                        let qa = ((row * t + ti) * h + head) * d;
                        let want = naive_topk(&own, &queries[qa..qa + d], d, k);
                        for (j, &slot) in want.iter().enumerate() {
                            let o = (((row * t + ti) * h + head) * k + j) * d;
                            let at = format!(
                                "kv {kv} {topk:?} {scoring:?} row {row} head {head} query \
                                 {ti} rank {j}"
                            );
                            assert_eq!(rv[o] as usize, row, "{at}: row");
                            assert_eq!(rv[o + 1] as usize, g, "{at}: kv head");
                            assert_eq!(rv[o + 2] as usize, slot, "{at}: slot");
                            let key = &own[slot * d..(slot + 1) * d];
                            for (a, e) in rk[o..o + d].iter().zip(key) {
                                assert!((a - e).abs() < 1e-6, "{at}: key");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `[b, t, kv, d]` data repeated for the `group` query heads of every kv head:
/// `[b, t, kv * group, d]` (what a grouped layer used to store).
fn expand_heads(data: &[f32], kv: usize, group: usize, d: usize) -> Vec<f32> {
    data.chunks(kv * d)
        .flat_map(|token| {
            token
                .chunks(d)
                .flat_map(move |head| std::iter::repeat_n(head, group).flatten().copied())
        })
        .collect()
}

#[test]
fn grouped_memory_equals_a_memory_of_expanded_copies() {
    // The same search through the public API: the grouped store, and a store of every kv
    // head copied to its query heads (the layout before stores were per kv head).
    let (b, h, kv, d, n, t, k) = (2, 8, 2, 16, 300, 6, 7);
    let dev = device();
    let keys = clustered_keys(b * n * kv, d, 8, 0.5, 41);
    let values = clustered_keys(b * n * kv, d, 0, 0.0, 42);
    let q = tensor4(clustered_keys(b * t * h, d, 8, 0.5, 43), [b, t, h, d]);
    for kind in KINDS {
        let mut ours = grouped(kind, h, kv, d, 512).init(b, &dev).unwrap();
        ours.add(
            tensor4(keys.clone(), [b, n, kv, d]),
            tensor4(values.clone(), [b, n, kv, d]),
        )
        .unwrap();
        let mut copies = config(kind, h, d, 512).init(b, &dev).unwrap();
        copies
            .add(
                tensor4(expand_heads(&keys, kv, h / kv, d), [b, n, h, d]),
                tensor4(expand_heads(&values, kv, h / kv, d), [b, n, h, d]),
            )
            .unwrap();
        let (a, e) = (
            ours.search(q.clone(), k).unwrap(),
            copies.search(q.clone(), k).unwrap(),
        );
        if kind == IndexKind::Exact {
            assert_eq!(host(a.keys), host(e.keys), "{kind:?}: keys");
            assert_eq!(host(a.values), host(e.values), "{kind:?}: values");
        } else {
            // Two HNSW graphs built from the same keys in the same order; compare recall.
            let exact = {
                let mut x = grouped(IndexKind::Exact, h, kv, d, 512)
                    .init(b, &dev)
                    .unwrap();
                x.add(
                    tensor4(keys.clone(), [b, n, kv, d]),
                    tensor4(values.clone(), [b, n, kv, d]),
                )
                .unwrap();
                x.search(q.clone(), k).unwrap()
            };
            let ids = |r: &Retrieved| {
                // Values are distinct random vectors: identify a pair by its first element.
                host(r.values.clone())
                    .chunks(d)
                    .map(|v| (v[0] * 1e6).round() as i64)
                    .collect::<Vec<_>>()
            };
            let r = recall(&ids(&a), &ids(&exact), k);
            assert!(r >= 0.95, "grouped HNSW recall@{k} {r:.4}");
        }
    }
}

#[test]
fn grouped_hnsw_recall_against_exact() {
    // 8 query heads on 2 kv heads, 4,096 stored per (row, kv head), k = 32.
    let (h, kv, d, n, t, k) = (8, 2, 32, 4096, 16, 32);
    let dev = device();
    let keys = clustered_keys(n, d, 64, 0.6, 51);
    let queries = clustered_keys(t, d, 64, 0.6, 52);
    let mut ids = Vec::new();
    for kind in KINDS {
        let mut index = grouped(kind, h, kv, d, n).init(1, &dev).unwrap();
        crate::keys::fill(index.as_mut(), &keys, n, 2048, &dev).unwrap();
        let (q, _) = segment_tensors(&queries, t, 0, t, 1, h, d, &dev);
        ids.push(retrieved_ids(&index.search(q, k).unwrap()));
    }
    let r = recall(&ids[1], &ids[0], k);
    assert!(r >= 0.95, "recall@{k} of grouped HNSW vs exact: {r:.4}");
}

#[test]
fn grouped_shapes_are_checked() {
    let dev = device();
    let err = grouped(IndexKind::Exact, 8, 3, 4, 8)
        .init(1, &dev)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("n_kv_heads (3) must divide n_heads (8)"),
        "{err}"
    );
    for kind in KINDS {
        let mut index = grouped(kind, 8, 2, 4, 8).init(1, &dev).unwrap();
        // Pairs come per kv head, queries per query head.
        let err = index
            .add(
                Tensor::zeros([1, 3, 8, 4], &dev),
                Tensor::zeros([1, 3, 8, 4], &dev),
            )
            .unwrap_err();
        assert!(err.to_string().contains("kv_heads = 2"), "{kind:?}: {err}");
        index
            .add(
                Tensor::zeros([1, 3, 2, 4], &dev),
                Tensor::zeros([1, 3, 2, 4], &dev),
            )
            .unwrap();
        let err = index
            .search(Tensor::zeros([1, 3, 2, 4], &dev), 2)
            .unwrap_err();
        assert!(err.to_string().contains("n_heads = 8"), "{kind:?}: {err}");
        index.search(Tensor::zeros([1, 3, 8, 4], &dev), 2).unwrap();
    }
}

/// Rewrites a saved memory's header as version 1 (no `n_kv_heads`).
fn as_version_1(dir: &std::path::Path) {
    let p = dir.join("header.json");
    let mut header: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let obj = header.as_object_mut().unwrap();
    obj.remove("n_kv_heads");
    obj.insert("version".into(), 1.into());
    std::fs::write(&p, serde_json::to_string(&header).unwrap()).unwrap();
}

#[test]
fn version_1_memories_of_copies_open_grouped() {
    // A version-1 memory of a grouped layer held every kv head copied to its query heads;
    // opened with n_kv_heads it keeps one head per group and searches as the grouped memory.
    let (b, h, d, cap) = (2, 4, 8, 32);
    let dev = device();
    let keys = clustered_keys(64, d, 3, 0.5, 61);
    for kind in KINDS {
        for kv in [1, 2] {
            let group = h / kv;
            let mut old = config(kind, h, d, cap).init(b, &dev).unwrap();
            let mut new = grouped(kind, h, kv, d, cap).init(b, &dev).unwrap();
            // 45 > 32 wraps the ring; row 1 cleared and shorter.
            for (first, t, clear) in [(0, 45, true), (45, 7, false)] {
                let (kt, vt) = segment_tensors(&keys, 64, first, t, b, kv, d, &dev);
                let (k_host, v_host) = (host(kt.clone()), host(vt.clone()));
                new.add(kt, vt).unwrap();
                old.add(
                    tensor4(expand_heads(&k_host, kv, group, d), [b, t, h, d]),
                    tensor4(expand_heads(&v_host, kv, group, d), [b, t, h, d]),
                )
                .unwrap();
                if clear {
                    old.clear(&[1]).unwrap();
                    new.clear(&[1]).unwrap();
                }
            }
            let dir = tempfile::tempdir().unwrap();
            old.save(dir.path()).unwrap();
            as_version_1(dir.path());
            let c = grouped(kind, h, kv, d, cap);
            let opened = open(dir.path(), &c, &dev).unwrap();
            assert_eq!(opened.rows(), new.rows());
            let q = tensor4(clustered_keys(b * 4 * h, d, 3, 0.5, 62), [b, 4, h, d]);
            let (a, o) = (
                new.search(q.clone(), 9).unwrap(),
                opened.search(q, 9).unwrap(),
            );
            assert_eq!(
                retrieved_ids(&a),
                retrieved_ids(&o),
                "{kind:?} kv {kv}: ids"
            );
            assert_eq!(host(a.keys), host(o.keys), "{kind:?} kv {kv}: keys");
            // The same files as version 2 are a mismatch (4 stored heads, kv asked).
            let dir2 = tempfile::tempdir().unwrap();
            old.save(dir2.path()).unwrap();
            let err = open(dir2.path(), &c, &dev).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "saved 4 key/value heads, the config asks for n_kv_heads = {kv}"
                )),
                "{err}"
            );
            // A grouped memory round-trips as version 2.
            let dir3 = tempfile::tempdir().unwrap();
            new.save(dir3.path()).unwrap();
            let reopened = open(dir3.path(), &c, &dev).unwrap();
            let q = tensor4(clustered_keys(b * 4 * h, d, 3, 0.5, 63), [b, 4, h, d]);
            assert_eq!(
                retrieved_ids(&new.search(q.clone(), 9).unwrap()),
                retrieved_ids(&reopened.search(q, 9).unwrap())
            );
        }
        // A version-1 memory whose heads differ (a layer without grouped heads) is refused.
        let mut distinct = config(kind, h, d, cap).init(1, &dev).unwrap();
        let k4 = clustered_keys(10 * h, d, 0, 0.0, 64);
        distinct
            .add(
                tensor4(k4.clone(), [1, 10, h, d]),
                tensor4(k4, [1, 10, h, d]),
            )
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        distinct.save(dir.path()).unwrap();
        as_version_1(dir.path());
        let err = open(dir.path(), &grouped(kind, h, 2, d, cap), &dev)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("head 1 differs from head 0"),
            "{kind:?}: {err}"
        );
        // Opened as what it is, it is fine.
        open(dir.path(), &config(kind, h, d, cap), &dev).unwrap();
    }
}

/// A memory saved and opened again draws the HNSW levels of its next additions as the memory
/// it was saved from does: after the same further additions both save the same graph, byte for
/// byte (a resumed run's kNN memory continues as the straight run's). usearch keeps its level
/// generator in no file and has no way to set it, so saving reloads the live graph from the
/// file it wrote: both continue from the loaded state.
#[test]
fn hnsw_levels_after_open_are_those_of_the_saved_memory() {
    let (b, h, d, cap) = (1, 1, 8, 512);
    let dev = device();
    let c = config(IndexKind::Hnsw, h, d, cap);
    let mut index = c.init(b, &dev).unwrap();
    let keys = clustered_keys(600, d, 0, 0.0, 21);
    let (kt, vt) = segment_tensors(&keys, 600, 0, 200, b, h, d, &dev);
    index.add(kt, vt).unwrap();
    let saved = tempfile::tempdir().unwrap();
    index.save(saved.path()).unwrap();
    let mut opened = open(saved.path(), &c, &dev).unwrap();
    for (at, n) in [(200, 150), (350, 250)] {
        let (kt, vt) = segment_tensors(&keys, 600, at, n, b, h, d, &dev);
        index.add(kt.clone(), vt.clone()).unwrap();
        opened.add(kt, vt).unwrap();
    }
    let (a, o) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    index.save(a.path()).unwrap();
    opened.save(o.path()).unwrap();
    let graph = |dir: &std::path::Path| std::fs::read(dir.join("index-b0-h0.usearch")).unwrap();
    assert!(
        graph(a.path()) == graph(o.path()),
        "the opened memory's graph differs from the saved memory's after the same additions"
    );
    let q = tensor4(clustered_keys(4 * h, d, 0, 0.0, 22), [b, 4, h, d]);
    assert_eq!(
        retrieved_ids(&index.search(q.clone(), 9).unwrap()),
        retrieved_ids(&opened.search(q, 9).unwrap())
    );
}

/// The int8 scan (`crate::int8`) against a full sort of f64 scores: at every rank the f64
/// top-k's score within 2e-6, from a slot of that score, best first, exact ties by slot.
/// Keys and queries: unit vectors (isotropic and clustered, as the kNN layer's normalised
/// keys), unnormalised ones, one cluster so tight that the int8 scores cannot rank it, widths
/// that are not a multiple of 4, a store that is not a multiple of the scan's 64-slot blocks,
/// duplicated keys (exact ties), a zero query (every score tied) and k above the store. The
/// keys are written one slot at a time over others (blocks quantised again as their scales
/// change). 37 queries, then 1 and 6 with the same scan state. The portable loop, and the
/// AVX2 and VNNI kernels where the CPU has them, which must agree bit for bit.
#[test]
fn int8_scan_equals_a_full_sort_per_query() {
    use crate::int8::{Int8Keys, Kernel, Scan};
    let kernels = Kernel::available();
    let cases: [(&str, usize, usize, usize, usize, f32, usize); 7] = [
        // name, d, stored, k, clusters, spread, duplicates (0: none)
        ("isotropic 32", 32, 3001, 32, 0, 0.0, 0),
        ("clustered 32", 32, 4096, 32, 8, 0.3, 0),
        // Scores closer together than the int8 error: only the bound keeps the right keys.
        ("one tight cluster", 32, 2000, 32, 1, 0.02, 0),
        ("clustered 7", 7, 500, 5, 4, 0.5, 0),
        ("isotropic 64", 64, 777, 40, 0, 0.0, 0),
        ("duplicates 16", 16, 1000, 32, 0, 0.0, 37),
        ("k above the store", 32, 20, 32, 0, 0.0, 0),
    ];
    for (case, (name, d, n, k, clusters, spread, dups)) in cases.into_iter().enumerate() {
        let seed = 100 + 2 * case as u64;
        let mut keys = clustered_keys(n, d, clusters, spread, seed);
        if dups > 0 {
            // Slot i holds key i % dups: every score is tied with others.
            for i in dups..n {
                let (src, dst) = keys.split_at_mut(i * d);
                dst[..d].copy_from_slice(&src[(i % dups) * d..(i % dups + 1) * d]);
            }
        }
        // Every third key scaled by 3 (not unit).
        for key in keys.chunks_mut(d).step_by(3) {
            key.iter_mut().for_each(|x| *x *= 3.0);
        }
        let mut queries = clustered_keys(37, d, clusters, spread, seed + 1);
        queries[..d].iter_mut().for_each(|x| *x *= 5.0);
        queries[d..2 * d].iter_mut().for_each(|x| *x = 0.0);
        let kk = k.min(n);
        let mut found = Vec::new();
        for &kernel in &kernels {
            // The keys in the second of two stores, written one slot at a time over other
            // keys (ten times larger in every fifth slot): a block's scale first grows, then
            // shrinks as its largest keys are overwritten.
            let mut int8 = Int8Keys::new(kernel, 2, d);
            int8.grow(n);
            int8.write(0, 0..n, &vec![1.0; n * d]);
            let mut current = clustered_keys(n, d, 0, 0.0, seed + 7);
            for key in current.chunks_mut(d).step_by(5) {
                key.iter_mut().for_each(|x| *x *= 10.0);
            }
            int8.write(1, 0..n, &current);
            for slot in 0..n {
                current[slot * d..(slot + 1) * d].copy_from_slice(&keys[slot * d..(slot + 1) * d]);
                int8.write(1, slot..slot + 1, &current);
            }
            // One scan state for 37 queries, then 1 and 6 (a generated token's few queries:
            // the kernels score whole quads or pairs of them, not the padded 16).
            let mut scan = Scan::default();
            for nq in [37, 1, 6] {
                let queries = &queries[..nq * d];
                int8.top_k(1, n, &keys, queries, kk, &mut scan);
                for (r, q) in queries.chunks(d).enumerate() {
                    let mut want: Vec<(f64, usize)> = keys
                        .chunks(d)
                        .enumerate()
                        .map(|(i, key)| {
                            (
                                key.iter().zip(q).map(|(a, b)| *a as f64 * *b as f64).sum(),
                                i,
                            )
                        })
                        .collect();
                    want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    let got = &scan.rows[r];
                    let at = format!("{name}, {kernel:?}, query {r}");
                    assert_eq!(got.len(), kk, "{at}: count");
                    // Rank by rank, the f64 top-k's score; each slot's own f64 score; no slot
                    // twice. (Scores within 2e-6 may swap between f32 and f64.)
                    let mut seen = std::collections::HashSet::new();
                    for (j, (c, w)) in got.iter().zip(&want).enumerate() {
                        let own = want.iter().find(|x| x.1 == c.1 as usize).unwrap().0;
                        assert!(
                            (c.0 as f64 - w.0).abs() < 2e-6 && (c.0 as f64 - own).abs() < 2e-6,
                            "{at}, rank {j}: slot {} scored {} (f64 {own}), the f64 top-k's {}",
                            c.1,
                            c.0,
                            w.0
                        );
                        assert!(seen.insert(c.1), "{at}: slot {} twice", c.1);
                    }
                    if dups > 0 || r == 1 {
                        // Exact ties: by slot.
                        let slots: Vec<usize> = got.iter().map(|c| c.1 as usize).collect();
                        let want_slots: Vec<usize> = want[..kk].iter().map(|c| c.1).collect();
                        assert_eq!(slots, want_slots, "{at}: ties by slot");
                    }
                }
                found.push((nq, scan.rows.clone()));
            }
        }
        for (nq, rows) in &found {
            let first = &found.iter().find(|(m, _)| m == nq).unwrap().1;
            assert_eq!(rows, first, "{name}, {nq} queries: the kernels disagree");
        }
    }
}

/// Non-finite keys in the int8 scan: as in the f32 search, a key whose score is +inf ranks
/// first, a NaN score is never kept; every other slot keeps its f32 rank.
#[test]
fn int8_scan_scores_non_finite_keys_in_f32() {
    use crate::int8::{Int8Keys, Kernel, Scan};
    let (d, n, k) = (8, 100, 3);
    let mut keys = clustered_keys(n, d, 0, 0.0, 7);
    keys[40 * d] = f32::INFINITY;
    keys[70 * d + 1] = f32::NAN;
    let query: Vec<f32> = (0..d).map(|i| if i == 0 { 1.0 } else { 0.1 }).collect();
    for kernel in Kernel::available() {
        let mut int8 = Int8Keys::new(kernel, 1, d);
        int8.grow(n);
        int8.write(0, 0..n, &keys);
        let mut scan = Scan::default();
        int8.top_k(0, n, &keys, &query, k, &mut scan);
        let mut finite: Vec<(f32, usize)> = keys
            .chunks(d)
            .enumerate()
            .filter(|(i, _)| ![40, 70].contains(i))
            .map(|(i, key)| (key.iter().zip(&query).map(|(a, b)| a * b).sum(), i))
            .collect();
        finite.sort_by(|a, b| b.0.total_cmp(&a.0));
        let slots: Vec<usize> = scan.rows[0].iter().map(|c| c.1 as usize).collect();
        assert_eq!(slots, vec![40, finite[0].1, finite[1].1], "{kernel:?}");
        assert_eq!(scan.rows[0][0].0, f32::INFINITY);
    }
}

/// The host store's int8 search with every kernel this CPU has (plain loops, AVX2, VNNI):
/// two rows of different lengths, two kv heads read by two query heads each, tokens in more
/// than one task; every (row, token, query head) gets the naive top-k of its row and kv head,
/// and the values stored with those keys.
#[test]
fn host_int8_search_of_every_kernel_equals_naive_topk() {
    use crate::host::HostStore;
    use crate::int8::{Kernel, Plan};
    let (batch, heads, group, d, n, tokens, k) = (2, 2, 2, 16, 700, 300, 7);
    let lens = [n, 451];
    // [batch, n, heads, d]; row 1 holds only its first 451 slots.
    let keys = clustered_keys(batch * n * heads, d, 6, 0.4, 21);
    let values: Vec<f32> = (0..keys.len()).map(|i| i as f32).collect();
    let queries = clustered_keys(batch * tokens * heads * group, d, 6, 0.4, 22);
    for kernel in Kernel::available() {
        let plan = Plan {
            kernel,
            from: 0,
            adaptive: false,
        };
        let mut store = HostStore::new(batch, heads, d, Some(plan));
        store.grow(n);
        for (b, &len) in lens.iter().enumerate() {
            store.write(&keys, &values, n, b, 0, 0, len);
        }
        let rows = lens.map(|len| RowState { len, next: 0 });
        let hits = store.search(&rows, &queries, tokens, group, k);
        for (b, &len) in lens.iter().enumerate() {
            for t in 0..tokens {
                for j in 0..heads * group {
                    let (g, at) = (j / group, ((b * tokens + t) * heads * group + j) * d);
                    let q = &queries[at..at + d];
                    // Row b, kv head g: slot s at ((b * n + s) * heads + g) * d.
                    let own: Vec<f32> = (0..len)
                        .flat_map(|s| {
                            let at = ((b * n + s) * heads + g) * d;
                            keys[at..at + d].to_vec()
                        })
                        .collect();
                    let want = naive_topk(&own, q, d, k);
                    for (r, &slot) in want.iter().enumerate() {
                        let out = (((b * tokens + t) * heads * group + j) * k + r) * d;
                        let src = ((b * n + slot) * heads + g) * d;
                        let at = format!("{kernel:?}, row {b}, token {t}, head {j}, rank {r}");
                        assert_eq!(&hits.keys[out..out + d], &keys[src..src + d], "{at}");
                        assert_eq!(&hits.values[out..out + d], &values[src..src + d], "{at}");
                    }
                }
            }
        }
    }
}

/// `auto` scoring sends the next 8 searches of a store to f32 after an int8 search that
/// scored more than 5% of its (query, key) pairs again in f32 (one cluster so tight that every
/// key is as close as the k-th best), and keeps int8 where few are (isotropic keys); every
/// search equals the naive top-k. Needs AVX2 or AVX-512 VNNI (elsewhere `auto` is f32
/// throughout).
#[test]
fn auto_scoring_rests_int8_where_it_rescored_too_much() {
    use crate::host::HostStore;
    let Some(plan) = HostScoring::Auto.plan(16, 1 << 16) else {
        return;
    };
    let (d, n, t, k) = (16, 1 << 16, 8, 4);
    for (clusters, spread, rests) in [(1, 0.002, true), (0, 0.0, false)] {
        let keys = clustered_keys(n, d, clusters, spread, 11);
        let mut store = HostStore::new(1, 1, d, Some(plan));
        store.grow(n);
        for slot in 0..n {
            store.write(&keys, &keys, n, 0, slot, slot, 1);
        }
        let rows = [RowState { len: n, next: 0 }];
        let queries = clustered_keys(t, d, clusters, spread, 12);
        for search in 0..3 {
            let hits = store.search(&rows, &queries, t, 1, k);
            for (ti, q) in queries.chunks(d).enumerate() {
                let want = naive_topk(&keys, q, d, k);
                let got: Vec<usize> = (0..k)
                    .map(|j| {
                        let key = &hits.keys[(ti * k + j) * d..(ti * k + j + 1) * d];
                        keys.chunks(d).position(|c| c == key).unwrap()
                    })
                    .collect();
                // Compare scores (near-ties may swap between orders of summation).
                let score = |i: usize| -> f32 {
                    keys[i * d..(i + 1) * d]
                        .iter()
                        .zip(q)
                        .map(|(a, b)| a * b)
                        .sum()
                };
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (score(*g) - score(*w)).abs() < 1e-6,
                        "search {search}, query {ti}"
                    );
                }
            }
            let rest = store.int8_rest.get();
            if rests {
                // The first search rested int8; each later one uses up one search of it.
                assert_eq!(rest, 8 - search as u32, "tight cluster, search {search}");
            } else {
                assert_eq!(rest, 0, "isotropic keys, search {search}");
            }
        }
    }
}

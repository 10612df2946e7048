//! Device selection from strings.

use memzoo_backend::{DeviceSpec, parse_device};

#[test]
fn device_strings_pick_backends_or_name_the_missing_feature() {
    assert!(parse_device("flex").is_ok());
    for name in ["wgpu", "cuda", "tch", "tch-cuda"] {
        let spec: DeviceSpec = name.parse().unwrap();
        if !spec.is_compiled() {
            let err = parse_device(name).unwrap_err().to_string();
            assert!(
                err.contains(&format!("--features {}", spec.feature())),
                "{err}"
            );
        }
    }
    let err = parse_device("gpu").unwrap_err().to_string();
    assert!(err.contains("unknown device `gpu`"), "{err}");
}

/// The softmax test's seeded input `x` (`8 (U - 1/2)`) and weights `w` (`2 (U - 1/2)`).
fn softmax_inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(7);
    let mut draw = |scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| scale * (rng.random::<f32>() - 0.5))
            .collect()
    };
    let x = draw(8.0);
    (x, draw(2.0))
}

/// What an autodiff graph through `f` holds on `ad` after the forward, in bytes of the device
/// allocator's live slices (`None` where the device has no pools), and the gradient it gives
/// `x`, for `loss = Σ w ⊙ f(x)` ([`softmax_inputs`] of `shape`, made on the host).
fn held_by_graph(
    ad: &burn::tensor::Device,
    shape: [usize; 4],
    f: fn(burn::tensor::Tensor<4>) -> burn::tensor::Tensor<4>,
) -> Option<(u64, Vec<f32>)> {
    use burn::tensor::{Tensor, TensorData};
    let (x, w) = softmax_inputs(shape.iter().product());
    let x = Tensor::<4>::from_data(TensorData::new(x, shape), ad).require_grad();
    let w = Tensor::<4>::from_data(TensorData::new(w, shape), ad);
    // Both on the device before the first reading.
    let _ = (x.clone().sum() + w.clone().sum()).into_scalar::<f32>();
    let in_use = || ad.memory_pool_usage().map(|u| u.bytes_in_use);
    let before = in_use()?;
    let loss = (f(x.clone()) * w).sum();
    let _ = loss.clone().into_scalar::<f32>();
    let held = in_use()?.saturating_sub(before);
    let grads = loss.backward();
    Some((
        held,
        memzoo_tests::host(x.grad(&grads).expect("x has a gradient")),
    ))
}

/// memzoo's softmax (`memzoo_fused::softmax`) keeps one score-sized tensor for its backward on
/// the devices that pool their memory (CubeCL's: wgpu, with or without fusion), where Burn's
/// composition keeps two (the exponentials and the probabilities); both give the gradient
/// `dS = P ⊙ (w - Σ_j P_j w_j)` computed here on the host in f64.
///
/// Read from the device allocator's bytes in use after the forward (Burn's
/// `Device::memory_pool_usage`): the claim of `docs/backends.md` ("one score-sized tensor per
/// layer fewer") on the allocator a GPU run uses. Skipped, with a line, on devices without
/// pools (flex, LibTorch).
///
/// The allocator's count is the whole device's, and the other tests allocate and free on the
/// same devices at the same time, so the readings are taken in a process of their own
/// ([`softmax_memory_child`]).
#[test]
fn backend_softmax_graph_holds_only_its_output() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "backend::softmax_memory_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env("MEMZOO_SOFTMAX_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let text = text + String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "the measuring process failed: {text}");
    assert!(
        text.contains("1 passed"),
        "the measuring test did not run: {text}"
    );
}

/// The readings of [`backend_softmax_graph_holds_only_its_output`], in a process where no other
/// test runs. Does nothing when run on its own.
#[test]
#[ignore = "run by backend_softmax_graph_holds_only_its_output in a child process"]
fn softmax_memory_child() {
    if std::env::var_os("MEMZOO_SOFTMAX_CHILD").is_none() {
        return;
    }
    let shape = [2, 4, 64, 256];
    let n: usize = shape.iter().product();
    let bytes = 4 * n as u64;
    let want = {
        let (x, w) = softmax_inputs(n);
        let cols = shape[3];
        let mut want = vec![0.0f32; n];
        for ((xr, wr), out) in x
            .chunks(cols)
            .zip(w.chunks(cols))
            .zip(want.chunks_mut(cols))
        {
            let scores: Vec<Option<f64>> = xr.iter().map(|&v| Some(v as f64)).collect();
            let p = memzoo_tests::masked_softmax(&scores);
            let pw: f64 = p.iter().zip(wr).map(|(p, &w)| p * w as f64).sum();
            for ((o, p), &w) in out.iter_mut().zip(&p).zip(wr) {
                *o = (p * (w as f64 - pw)) as f32;
            }
        }
        want
    };
    let specs = memzoo_backend::test_devices().unwrap_or_else(|e| panic!("{e}"));
    for spec in specs {
        let name = spec.to_string();
        let device = spec.init().unwrap_or_else(|e| panic!("{name}: {e}"));
        let ad = device.clone().autodiff();
        let ours = held_by_graph(&ad, shape, |x| memzoo_fused::softmax::softmax(x, 3));
        let Some((ours, g_ours)) = ours else {
            println!("{name}: no memory pools to read, skipped");
            continue;
        };
        let (burns, g_burn) =
            held_by_graph(&ad, shape, |x| burn::tensor::activation::softmax(x, 3))
                .expect("the same device reports pools");
        println!(
            "{name}: the graph holds {:.2} score-sized tensors with memzoo's softmax, {:.2} with Burn's",
            ours as f64 / bytes as f64,
            burns as f64 / bytes as f64
        );
        assert!(
            memzoo_fused::softmax::keeps_output_only(&device),
            "{name}: memzoo's softmax op does not run here"
        );
        assert!(
            ours < bytes * 3 / 2,
            "{name}: memzoo's softmax holds {ours} bytes for a {bytes}-byte output"
        );
        assert!(
            burns >= bytes * 19 / 10,
            "{name}: Burn's softmax holds {burns} bytes: the meter does not see its two tensors"
        );
        for (what, got) in [("memzoo's", &g_ours), ("Burn's", &g_burn)] {
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{name}: {what} softmax gradient off by {worst}"
            );
        }
    }
}

/// The seeded dropout masks a device builds from the packed bits it receives
/// (`memzoo_reformer::rng::dropout_mask`: `f32` values on the host CPU, bits elsewhere) are the
/// host's `f32` mask, element for element, on every test device: at sizes within one word,
/// across words and the host's parallel chunks, and with every element dropped. The bits'
/// rebuilding alone (`mask_from_keep_words`) is checked on `flex` too, where `dropout_mask`
/// itself takes the `f32` path.
#[test]
fn backend_dropout_masks_rebuilt_from_bits_are_the_hosts() {
    use memzoo_fused::dropout::{keep_words, mask_values};
    use memzoo_reformer::rng::{dropout_mask, mask_from_keep_words};
    let cases: [([usize; 3], f64, u64); 5] = [
        ([1, 1, 5], 0.1, 3),
        ([2, 3, 32], 0.5, 4),
        ([2, 40, 33], 0.2, 5),
        ([1, 2, (1 << 15) + 77], 0.1, 6),
        ([2, 2, 9], 1.0, 7),
    ];
    let specs = memzoo_backend::test_devices().unwrap_or_else(|e| panic!("{e}"));
    for spec in specs {
        let name = spec.to_string();
        let device = spec.init().unwrap_or_else(|e| panic!("{name}: {e}"));
        for (shape, p, seed) in cases {
            let n: usize = shape.iter().product();
            let want = mask_values(n, p, seed);
            let rebuilt = mask_from_keep_words(&keep_words(n, p, seed), shape, p, &device);
            let mask = dropout_mask(shape, p, seed, &device).expect("p > 0 gives a mask");
            for (what, got) in [("rebuilt", rebuilt), ("dropout_mask", mask)] {
                assert_eq!(got.dims(), shape, "{name}: {what}");
                let got = memzoo_tests::host(got);
                if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
                    panic!(
                        "{name}: {what} {shape:?}, p {p}: element {i} is {}, the host's {}",
                        got[i], want[i]
                    );
                }
            }
        }
    }
}

/// LSH attention (given buckets, tensor ops: what a GPU runs) and local attention past 65,536
/// positions, the Reformer's enwik8 length, agree with `flex` on every test device: the
/// positions, the device bucket sort and the gathers hold at that size. One row and head,
/// 66,560 positions (65,536 + 1,024) of width 16, chunks of 64, 2 rounds of 64 buckets.
#[test]
fn backend_reformer_attention_past_65536_positions_matches_flex() {
    use burn::tensor::{Int, Tensor, TensorData};
    use memzoo_reformer::attention::lsh_attention_with_buckets;
    use memzoo_reformer::{ChunkParams, LshKernel, LshScores, local_attention};
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let (l, dh, rounds, n_buckets) = (65_536 + 1_024, 16, 2, 64);
    let mut rng = StdRng::seed_from_u64(3);
    let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() - 0.5).collect() };
    let (qk, v, k) = (draw(l * dh), draw(l * dh), draw(l * dh));
    let buckets: Vec<i64> = (0..rounds * l)
        .map(|_| rng.random_range(0..n_buckets as i64))
        .collect();
    let params = ChunkParams {
        chunk_len: 64,
        before: 1,
        after: 0,
        causal: true,
        dedup_rounds: true,
        lsh_scores: LshScores::ScaledUnitKeys,
        kernel: LshKernel::Tensor,
        key_eps: 0.0,
    };
    let run = |device: &burn::tensor::Device| -> [Vec<f32>; 2] {
        let t = |x: &Vec<f32>| {
            Tensor::<4>::from_data(TensorData::new(x.clone(), [1, 1, l, dh]), device)
        };
        let b = Tensor::<4, Int>::from_data(
            TensorData::new(buckets.clone(), [1, 1, rounds, l]),
            device,
        );
        let lsh = lsh_attention_with_buckets(t(&qk), t(&v), b, n_buckets, None, params, None);
        let local = local_attention(t(&qk), t(&k), t(&v), None, params, None);
        [memzoo_tests::host(lsh), memzoo_tests::host(local)]
    };
    let want = run(&burn::tensor::Device::flex());
    let specs = memzoo_backend::test_devices().unwrap_or_else(|e| panic!("{e}"));
    for spec in specs {
        let name = spec.to_string();
        let device = spec.init().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = run(&device);
        for (what, got, want) in [("LSH", &got[0], &want[0]), ("local", &got[1], &want[1])] {
            let diff = |i: usize| (got[i] - want[i]).abs();
            let worst = (0..got.len())
                .max_by(|&a, &b| diff(a).total_cmp(&diff(b)))
                .unwrap();
            println!(
                "{name}: {what} attention over {l} positions, max |diff| {:.2e} at position {}",
                diff(worst),
                worst / dh
            );
            assert!(
                diff(worst) < 1e-4,
                "{name}: {what} attention differs at position {}",
                worst / dh
            );
        }
    }
}

/// `memzoo devices --verify` on every test device: the operations memzoo's workarounds stand
/// on (its host index ranges, the kNN memory's blocked device search, the Reformer's device
/// sort) give the host's answers everywhere, and on `flex` every check does; the others are
/// printed (on Mesa's drivers some of Burn's reductions past 65,535 elements are wrong:
/// `docs/backends.md`).
#[test]
fn backend_devices_verify_holds_what_memzoo_builds_on() {
    let specs = memzoo_backend::test_devices().unwrap_or_else(|e| panic!("{e}"));
    for spec in specs {
        let name = spec.to_string();
        let device = spec.init().unwrap_or_else(|e| panic!("{name}: {e}"));
        for v in memzoo::commands::verify(&device) {
            println!("{name}: {} -> {:?}", v.check, v.difference);
            let ours = v.role == memzoo::commands::Role::Memzoo;
            if ours || spec == memzoo_backend::DeviceSpec::Flex {
                assert_eq!(v.difference, None, "{name}: {}", v.check);
            }
        }
    }
}

//! Helpers shared by memzoo's integration tests: host copies of tensors and naive reference maths.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use memzoo_data::{ByteTokenizer, LongRangeConfig, Token, generate_corpus};
use memzoo_stack::XlConfig;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The flex device every reference test runs on.
pub fn flex() -> Device {
    memzoo_backend::parse_device("flex").expect("flex is compiled in")
}

/// A tiny Transformer-XL: 2 layers, d_model 32, 2 heads, memory 16, no dropout.
pub fn tiny_xl() -> XlConfig {
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(32)
        .with_n_heads(2)
        .with_d_inner(64)
        .with_mem_len(16)
        .with_dropout(0.0)
}

/// [`tiny_xl`] with a kNN layer at depth 1 (top 4 of up to 64 memories per row and head,
/// exact search): a tiny Memorizing Transformer.
pub fn tiny_memorizing() -> memzoo_stack::MemorizingConfig {
    memzoo_stack::MemorizingConfig::new()
        .with_xl(tiny_xl())
        .with_knn_layers(vec![1])
        .with_knn(tiny_knn())
}

/// The kNN layers of the tiny models: top 4 of up to 64 memories per row and head, exact
/// search.
pub fn tiny_knn() -> memzoo_stack::KnnLayerConfig {
    memzoo_stack::KnnLayerConfig::new()
        .with_top_k(4)
        .with_max_memories(64)
        .with_index(memzoo_memory::IndexKind::Exact)
}

/// The training split, as byte tokens, of a small generated long-range corpus (20 documents,
/// recalls 20-40 bytes back).
pub fn small_corpus() -> Vec<Token> {
    let cfg = LongRangeConfig {
        documents: 20,
        valid_documents: 2,
        test_documents: 2,
        min_gap: 20,
        max_gap: 40,
        ..Default::default()
    };
    ByteTokenizer::new().encode(&generate_corpus(&cfg).unwrap().train)
}

/// A small XL (vocabulary 40, 3 layers, d_model 32, 4 heads, d_inner 64, no dropout, weights
/// from N(0, 0.2)) with a memory of `mem_len`.
pub fn small_xl(mem_len: usize) -> XlConfig {
    XlConfig::new()
        .with_vocab_size(40)
        .with_d_model(32)
        .with_n_layers(3)
        .with_n_heads(4)
        .with_d_inner(64)
        .with_dropout(0.0)
        .with_mem_len(mem_len)
        .with_init_std(0.2)
}

/// `memzoo train --set` overrides (with [`tiny_cli`]'s) for a tiny Reformer: the
/// `reformer-tiny` stack (a local and an LSH layer) at d_model 16, 2 heads of 8, chunks of 4,
/// no axial positions, no memory.
pub const TINY_REFORMER: [&str; 9] = [
    "model.preset=reformer-tiny",
    "model.n_layers=2",
    "model.d_model=16",
    "model.n_heads=2",
    "model.d_head=8",
    "model.d_inner=32",
    "model.lsh.chunk_len=4",
    "model.axial=none",
    "model.mem_len=0",
];

/// `memzoo train --set` overrides (with [`tiny_cli`]'s) for a tiny Memorizing Transformer: the
/// `memorizing-tiny` stack as a T5 and a kNN layer at d_model 16, 2 heads, XL memory 8, top 4 of
/// 64 kNN memories.
pub const TINY_MEMORIZING: [&str; 9] = [
    "model.preset=memorizing-tiny",
    "model.n_layers=2",
    "model.d_model=16",
    "model.n_heads=2",
    "model.d_inner=32",
    "model.mem_len=8",
    "model.layers=[\"t5\", \"knn\"]",
    "model.knn.top_k=4",
    "model.knn.max_memories=64",
];

/// [`TINY_REFORMER`] with one LSH layer, then `extra`.
pub fn tiny_lsh_layer(extra: &[&'static str]) -> Vec<&'static str> {
    TINY_REFORMER
        .iter()
        .copied()
        .chain(["model.n_layers=1", "model.layers=[\"lsh\"]"])
        .chain(extra.iter().copied())
        .collect()
}

/// `memzoo train --set` overrides for a tiny XL run of 2 steps on the generated corpus, then
/// `extra`.
pub fn tiny_cli(extra: &[&str]) -> Vec<String> {
    [
        "model.n_layers=1",
        "model.d_model=16",
        "model.n_heads=2",
        "model.d_inner=32",
        "model.mem_len=8",
        "train.batch=2",
        "train.tgt_len=8",
        "train.steps=2",
        "train.eval_segments=1",
        "train.replicas=1",
        "train.log_every=1",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

/// `memzoo import --from format src` into the run directory `tmp/run` (returned), with
/// `text` (bytes below the model's vocabulary) as its data, written to `tmp/text.txt`.
pub fn import_with_data(
    format: &str,
    src: &std::path::Path,
    tmp: &std::path::Path,
    text: impl AsRef<[u8]>,
) -> std::path::PathBuf {
    let data = tmp.join("text.txt");
    std::fs::write(&data, text).unwrap();
    let run = tmp.join("run");
    memzoo::import::import(
        format,
        src,
        &run,
        Some(data.display().to_string()),
        false,
        true,
    )
    .unwrap();
    run
}

/// The safetensors file `ours` holds the tensors of `theirs` bit for bit: the same names in the
/// same order, the same shapes and values.
pub fn assert_same_tensors(theirs: &std::path::Path, ours: &std::path::Path) {
    use memzoo_import::TensorMap;
    let (theirs, ours) = (
        TensorMap::read(theirs).unwrap(),
        TensorMap::read(ours).unwrap(),
    );
    let names = |m: &TensorMap| m.names().map(String::from).collect::<Vec<_>>();
    assert_eq!(names(&ours), names(&theirs), "tensor names");
    for n in theirs.names() {
        let a = theirs.get(n).unwrap().clone();
        let b = ours.get(n).unwrap().clone();
        assert_eq!(a.shape(), b.shape(), "shape of {n}");
        assert_eq!(
            a.convert::<f32>().try_to_vec::<f32>().unwrap(),
            b.convert::<f32>().try_to_vec::<f32>().unwrap(),
            "values of {n}"
        );
    }
}

/// `memzoo generate` of `tokens` tokens after `prompt`, with the default sampler and the run's
/// own segment length and memory.
pub fn generate_options(prompt: &str, tokens: usize) -> memzoo::commands::GenerateOptions {
    memzoo::commands::GenerateOptions {
        prompt: prompt.into(),
        tokens,
        sampler: memzoo_train::generate::SampleConfig::new(),
        segment_len: None,
        mem_len: None,
        compare_recompute: false,
    }
}

/// The values of a training `metric` a run wrote to `dir/metrics.jsonl`, in step order.
pub fn train_metric(dir: &std::path::Path, metric: &str) -> Vec<f64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "train" && v["metric"] == metric)
        .map(|v| v["value"].as_f64().unwrap())
        .collect()
}

/// Host copy of a tensor, row-major.
pub fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// One standard normal value from `rng` (Box-Muller).
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f32 = rng.random_range(1e-7..1.0);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// A tensor of standard normal values from a seeded RNG (independent of Burn's RNG).
pub fn randn<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| normal(&mut rng)).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// `model` with its random parameters drawn again from a seeded host RNG, so that a test's
/// weights do not depend on Burn's device RNG (one generator for the whole process, which
/// concurrently running tests draw from in any order; seeding it in a test is not enough).
///
/// Every memzoo initialiser is a normal `N(c, s)` or a constant. A parameter the init left
/// constant (zero biases, unit gains) keeps its value; any other becomes `c + s z`,
/// `z ~ N(0, 1)` drawn in visiting order from `seed`, with `c` = 1 for a LayerNorm gain
/// (`gamma`) and 0 otherwise, and `s = std(path)` (`path`: the parameter's module path, e.g.
/// `layers.0.block.ff_in.weight`).
pub fn seeded_weights<M: Module>(model: M, seed: u64, std: impl Fn(&str) -> f64) -> M {
    let mut mapper = Redraw {
        rng: StdRng::seed_from_u64(seed),
        path: Vec::new(),
        std,
    };
    model.map(&mut mapper)
}

/// The standard deviation `cfg`'s initialisers give the parameter at `path`, for
/// [`seeded_weights`]: `embedding_std` for the token embedding, the axial positions' own,
/// `norm_gain_std` for LayerNorm gains, `init_std` for everything else (plain embeddings and
/// outputs only: an adaptive embedding's tables and projections have other scales).
pub fn xl_init_std(cfg: &XlConfig) -> impl Fn(&str) -> f64 + use<> {
    let init = cfg.init_std;
    let embedding = cfg.embedding_std.unwrap_or(init);
    let axial = cfg.axial.as_ref().and_then(|a| a.std).unwrap_or(embedding);
    let gain = cfg.norm_gain_std.unwrap_or(init);
    // A Block-Recurrent stack's state projections: N(0, 1/sqrt(fan_in)); c_0 and the state IDs
    // N(0, 1) (`BlockRecurrentConfig::init`).
    let (d, hd, inner) = (
        cfg.d_model as f64,
        (cfg.n_heads * cfg.head_width()) as f64,
        cfg.d_inner as f64,
    );
    let state = move |path: &str| -> Option<f64> {
        let rest = path.strip_prefix("block_recurrent.")?;
        let fan_in = match rest {
            "initial" | "state_ids" => return Some(1.0),
            _ if !rest.ends_with(".weight") || rest.starts_with("to_state_") => return None,
            _ if rest.starts_with("state_output") => 2.0 * hd,
            _ if rest.starts_with("ff.ff_out") => inner,
            _ => d,
        };
        Some(1.0 / fan_in.sqrt())
    };
    move |path: &str| {
        if let Some(std) = state(path) {
            std
        } else if path.starts_with("embedding.") {
            embedding
        } else if path.starts_with("axial.") {
            axial
        } else if path.ends_with("gamma") {
            gain
        } else {
            init
        }
    }
}

struct Redraw<F> {
    rng: StdRng,
    path: Vec<String>,
    std: F,
}

impl<F: Fn(&str) -> f64> ModuleMapper for Redraw<F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let path = self.path.join(".");
        param.map(|t| {
            let values = host(t.clone());
            if values.iter().all(|&v| v == values[0]) {
                return t;
            }
            let c = if path.ends_with("gamma") { 1.0 } else { 0.0 };
            let s = (self.std)(&path) as f32;
            let data: Vec<f32> = values
                .iter()
                .map(|_| c + s * normal(&mut self.rng))
                .collect();
            let grad = t.is_require_grad();
            let fresh = Tensor::from_data(TensorData::new(data, t.dims()), &t.device());
            if grad { fresh.require_grad() } else { fresh }
        })
    }
}

/// Host copies of every float parameter's value (`grads: None`) or gradient, in visiting order;
/// `None` for a parameter without a gradient.
pub fn param_vectors<M: Module>(
    model: &M,
    grads: Option<&GradientsParams>,
) -> Vec<Option<Vec<f32>>> {
    let mut c = Collect {
        grads,
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

struct Collect<'a> {
    grads: Option<&'a GradientsParams>,
    out: Vec<Option<Vec<f32>>>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = match self.grads {
            Some(g) => g.get::<D>(param.id),
            None => Some(param.val()),
        };
        self.out.push(t.map(host));
    }
}

/// Largest absolute difference, asserting equal lengths.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts `a` and `b` agree to `tol` (absolute), with a helpful message.
#[track_caller]
pub fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    let d = max_abs_diff(a, b);
    assert!(d <= tol, "{what}: max |diff| = {d:e} > {tol:e}");
    assert!(a.iter().all(|x| x.is_finite()), "{what}: non-finite values");
}

/// Row-major `[n, m]` matrix on the host.
#[derive(Clone, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Mat {
    pub fn from_tensor(t: Tensor<2>) -> Self {
        let [rows, cols] = t.dims();
        Self {
            rows,
            cols,
            data: host(t).into_iter().map(f64::from).collect(),
        }
    }
    pub fn at(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }
    /// `self · other`
    pub fn matmul(&self, other: &Mat) -> Mat {
        assert_eq!(self.cols, other.rows);
        let mut data = vec![0.0; self.rows * other.cols];
        for i in 0..self.rows {
            for k in 0..self.cols {
                let a = self.at(i, k);
                for j in 0..other.cols {
                    data[i * other.cols + j] += a * other.at(k, j);
                }
            }
        }
        Mat {
            rows: self.rows,
            cols: other.cols,
            data,
        }
    }
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Softmax of `scores` where `None` entries are hidden.
pub fn masked_softmax(scores: &[Option<f64>]) -> Vec<f64> {
    let max = scores
        .iter()
        .flatten()
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores
        .iter()
        .map(|s| s.map_or(0.0, |s| (s - max).exp()))
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Logits of one segment read on its own (no memory): the stack's plain forward and its head.
///
/// # Shapes
/// - `tokens`: `[batch, len]` → `[batch, len, vocab]`
pub fn window_logits(
    model: &memzoo_stack::TransformerXl,
    tokens: burn::tensor::Tensor<2, burn::tensor::Int>,
) -> Result<Tensor<3>, memzoo_stack::XlError> {
    let out = model.forward(tokens, &memzoo_stack::XlMemory::empty())?;
    Ok(model.logits(out.hidden))
}

/// Mean loss (nats) of one segment read on top of `memory`, and the next memory: the stack's
/// evaluation step ([`memzoo_stack::TransformerXl::eval_step`]) on an XL memory alone.
///
/// # Shapes
/// - `tokens`, `targets`: `[batch, len]`; loss: `[1]`
pub fn memory_loss(
    model: &memzoo_stack::TransformerXl,
    tokens: burn::tensor::Tensor<2, burn::tensor::Int>,
    targets: burn::tensor::Tensor<2, burn::tensor::Int>,
    memory: &memzoo_stack::XlMemory,
) -> Result<(Tensor<1>, memzoo_stack::XlMemory), memzoo_stack::XlError> {
    let mut state = memzoo_stack::XlState {
        xl: memory.clone(),
        ..Default::default()
    };
    let scores = model.eval_step(tokens, targets, &mut state, &memzoo_stack::Step::default())?;
    Ok((scores.nll.mean(), state.xl))
}

/// Mean loss of one segment read on its own under explicit seeded options, weighted per target
/// when `weights` are given, with the graph (plain autodiff: the reference of the reversible
/// training step).
///
/// # Shapes
/// - `tokens`, `targets`, `weights`: `[batch, len]`; loss: `[1]`
pub fn seeded_loss(
    model: &memzoo_stack::TransformerXl,
    tokens: burn::tensor::Tensor<2, burn::tensor::Int>,
    targets: burn::tensor::Tensor<2, burn::tensor::Int>,
    weights: Option<Tensor<2>>,
    opts: &memzoo_reformer::ForwardOptions,
) -> Result<Tensor<1>, memzoo_stack::XlError> {
    let step = memzoo_stack::Step::default().with_options(opts.clone());
    let scores = model.eval_step(tokens, targets, &mut memzoo_stack::XlState::new(), &step)?;
    Ok(memzoo_stack::mean_nll(scores.nll, weights))
}

/// `err` names every one of `parts`; `what` (the case) heads the failure message.
#[track_caller]
pub fn assert_mentions(err: &dyn std::fmt::Display, parts: &[&str], what: &str) {
    let err = err.to_string();
    for p in parts {
        assert!(err.contains(p), "{what}: `{p}` not in the error: {err}");
    }
}

/// The contract of a carried state (an RMT's memory, a Block-Recurrent state): after `state`'s
/// segment, the next one (`next`, two rows, row 1 starting a document) read with the carried
/// part alone (`carried(state)`) differs from a fresh read in row 0 and equals it in row 1;
/// and the model `without_carried_memory()` reads as a fresh one.
#[track_caller]
pub fn assert_carried_and_reset(
    model: &memzoo_stack::TransformerXl,
    state: &memzoo_stack::XlState,
    carried: impl Fn(&memzoo_stack::XlState) -> memzoo_stack::XlState,
    next: Tensor<2, burn::tensor::Int>,
) {
    let read =
        |m: &memzoo_stack::TransformerXl, s: &mut memzoo_stack::XlState, reset: [bool; 2]| {
            host(m.forward_state(next.clone(), s, &reset).unwrap())
        };
    let with = read(model, &mut carried(state), [false, true]);
    let fresh = read(model, &mut memzoo_stack::XlState::new(), [false, false]);
    let half = with.len() / 2;
    assert!(
        max_abs_diff(&with[..half], &fresh[..half]) > 1e-4,
        "row 0 carries"
    );
    assert!(
        max_abs_diff(&with[half..], &fresh[half..]) < 1e-5,
        "row 1 was reset"
    );
    let base = model.clone().without_carried_memory();
    let without = read(&base, &mut carried(state), [false, false]);
    assert!(
        max_abs_diff(&without, &fresh) < 1e-5,
        "without the carried state"
    );
}

/// The tiny stack the memory families' tests build on: 2 layers, d_model 16, 2 heads,
/// d_inner 32, no dropout (their own memory added by each test).
pub fn tiny_stack() -> XlConfig {
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(16)
        .with_n_heads(2)
        .with_d_inner(32)
        .with_dropout(0.0)
}

/// Memory-replay backpropagation (`replayed`: `model` with `memory_replay` on) against the
/// one-graph unroll, over two steps of `segments()` (the second on the memory the first
/// carried): the same losses, every gradient and the carried memory at 1e-5. Returns the
/// number of gradients compared.
pub fn assert_replay_matches_unroll(
    model: &memzoo_stack::TransformerXl,
    replayed: &memzoo_stack::TransformerXl,
    segments: impl Fn() -> Vec<memzoo_stack::UnrollSegment>,
) -> usize {
    use memzoo_stack::XlState;
    let (mut a, mut b) = (XlState::new(), XlState::new());
    let mut compared = 0;
    for step in 0..2 {
        let (la, ga) = model.train_unroll(segments(), &mut a).unwrap();
        let (lb, gb) = replayed.train_unroll(segments(), &mut b).unwrap();
        let (la, lb) = (la.into_scalar::<f64>(), lb.into_scalar::<f64>());
        assert!((la - lb).abs() < 1e-5, "step {step}: loss {la} vs {lb}");
        let (ga, gb) = (
            param_vectors(model, Some(&ga)),
            param_vectors(replayed, Some(&gb)),
        );
        for (x, y) in ga.iter().zip(&gb) {
            match (x, y) {
                (Some(x), Some(y)) => {
                    assert_close(x, y, 1e-5, &format!("step {step} gradient"));
                    compared += 1;
                }
                (x, y) => assert_eq!(x.is_some(), y.is_some(), "step {step}: a gradient missing"),
            }
        }
        let carried = |s: &XlState| {
            let v = s
                .rmt
                .value
                .clone()
                .or_else(|| s.block_recurrent.value.clone());
            host(v.expect("a carried memory"))
        };
        assert_close(&carried(&a), &carried(&b), 1e-5, "carried memory");
        assert!(!b.rmt.value.as_ref().is_some_and(|v| v.is_require_grad()));
    }
    compared
}

/// The training loss of every step of a run, from its `metrics.jsonl`.
pub fn train_losses(run_dir: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["split"] == "train" && r["metric"] == "loss")
        .map(|r| r["value"].as_f64().unwrap())
        .collect()
}

/// Resumes the run in `run` for two training steps (`memzoo train --resume` with `--set`
/// `extra` on top: e.g. another batch), and checks it wrote its step-2 checkpoint.
pub fn fine_tune_two_steps(run: &std::path::Path, extra: &[&str]) {
    let sets: Vec<String> = extra
        .iter()
        .copied()
        .chain([
            "train.steps=2",
            "train.log_every=1",
            "train.eval_every=0",
            "train.checkpoint_every=2",
        ])
        .map(String::from)
        .collect();
    let config = memzoo::config::RunConfig::resolve(Some(&run.join("config.toml")), &sets).unwrap();
    memzoo::commands::train(&config, "flex", run, true, false, true, true).unwrap();
    assert!(run.join("checkpoints/step-00000002").is_dir());
}

//! Learning quality: the optimizer against `torch.optim.AdamW`'s formula, the reference
//! initialisation, and short runs of every family on tiny Shakespeare that must get clearly
//! below the unigram bpc of the text (computed here, from the training split's byte counts).
//!
//! The runs read `tinyshakespeare.txt` from `$MEMZOO_TINY_SHAKESPEARE` or `../shared/data/`
//! beside the checkout; without it they say so and train on the generated long-range corpus
//! (English filler words) instead, unless `MEMZOO_REQUIRE_DATA=1` (CI sets it once it has the
//! file).

use std::path::PathBuf;

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use memzoo_data::{
    ByteTokenizer, Corpus, LongRangeConfig, OrderedBatcher, Split, SplitRule, generate_corpus,
};
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::{
    KnnLayerConfig, LshConfig, MemorizingConfig, Randomness, ReformerConfig, TransformerXl,
    XlConfig, XlMemory,
};
use memzoo_tests::*;
use memzoo_train::{
    AdamConfig, RunOptions, ScheduleConfig, SegmentModel, TrainConfig, TrainOutcome, evaluate,
    train,
};

/// `torch.optim.AdamW.step` (PyTorch 2.x, `amsgrad=False`, `maximize=False`), written out for
/// one tensor in f64: decoupled decay first, then the bias-corrected Adam step.
struct TorchAdamW {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl TorchAdamW {
    fn step(&mut self, p: &mut [f64], g: &[f64]) {
        self.t += 1;
        let (b1, b2) = self.betas;
        for i in 0..p.len() {
            p[i] *= 1.0 - self.lr * self.weight_decay;
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            let m_hat = self.m[i] / (1.0 - b1.powi(self.t));
            let v_hat = self.v[i] / (1.0 - b2.powi(self.t));
            p[i] -= self.lr * m_hat / (v_hat.sqrt() + self.eps);
        }
    }
}

/// A module of one parameter, so a gradient can be set by hand.
#[derive(Module, Debug)]
struct One {
    w: Param<Tensor<1>>,
}

#[test]
fn adamw_steps_equal_torch_formula() {
    let dev = flex().autodiff();
    let n = 64;
    let w0: Vec<f64> = (0..n)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) * 0.01)
        .collect();
    // Gradients of the size a clipped (global norm 0.25) step gives a weight of a large model:
    // ~1e-6..1e-4, where epsilon 1e-8 vs 1e-5 changes the step several-fold.
    let grads: Vec<Vec<f64>> = (0..3)
        .map(|s| {
            (0..n)
                .map(|i| ((i * 13 + s * 7) % 17) as f64 - 8.0)
                .map(|x| x * 10f64.powi(-4 - (n as i32 % 3)) * (1.0 + 0.3 * s as f64))
                .collect()
        })
        .collect();
    let config = TrainConfig::new().with_weight_decay(0.01);
    assert_eq!(config.adam, AdamConfig::new());
    let lr = 1e-3;
    let mut optim = config.optimizer();
    let mut module = One {
        w: Param::from_tensor(Tensor::from_data(
            TensorData::new(w0.iter().map(|&x| x as f32).collect(), [n]),
            &dev,
        )),
    };
    let mut torch = TorchAdamW {
        lr,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.01,
        m: vec![0.0; n],
        v: vec![0.0; n],
        t: 0,
    };
    let mut p = w0.clone();
    for g in &grads {
        let mut gp = GradientsParams::new();
        gp.register(
            module.w.id,
            Tensor::<1>::from_data(
                TensorData::new(g.iter().map(|&x| x as f32).collect(), [n]),
                &dev.clone().inner(),
            ),
        );
        module = optim.step(lr, module, gp);
        torch.step(&mut p, g);
        let got = host(module.w.val());
        for i in 0..n {
            let delta_ref = p[i] - w0[i];
            let delta = got[i] as f64 - w0[i];
            assert!(
                (delta - delta_ref).abs() <= 1e-3 * delta_ref.abs() + 1e-8,
                "step {}: weight {i} moved {delta:e}, torch's formula {delta_ref:e}",
                torch.t
            );
        }
    }
}

/// Mean and standard deviation of a host vector.
fn stats(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn xl_starts_from_hf_transfo_xl_initialisation() {
    let dev = flex();
    let config = XlConfig::new().with_n_layers(2).with_untie_rel_bias(true);
    let model = config.init(&dev).unwrap();
    let std = config.init_std;
    // Within 5 standard errors of the mean and the deviation (n draws: std / sqrt(n) and
    // std / sqrt(2n)): a fixed 0.2 std on the 256 LayerNorm gains was only 3.2 standard errors,
    // and the draws are not seeded here (other tests reseed the generator), so it failed about
    // once in a few hundred runs.
    let near = |v: Vec<f32>, mean: f64, what: &str| {
        let n = v.len() as f64;
        let (m, s) = stats(&v);
        assert!(
            (m - mean).abs() < 5.0 * std / n.sqrt(),
            "{what}: mean {m}, want {mean} (n = {n})"
        );
        assert!(
            (s - std).abs() < 5.0 * std / (2.0 * n).sqrt(),
            "{what}: std {s}, want {std} (n = {n})"
        );
    };
    near(
        host(model.embedding.plain().unwrap().weight.val()),
        0.0,
        "embedding",
    );
    let layer = &model.layers[0];
    near(
        host(layer.attention.local().query.weight.val()),
        0.0,
        "query",
    );
    near(host(layer.block.ff_in.weight.val()), 0.0, "ff_in");
    near(host(layer.block.norm_ff.gamma.val()), 1.0, "LayerNorm gain");
    for (what, b) in [
        ("ff_in bias", layer.block.ff_in.bias.as_ref()),
        ("ff_out bias", layer.block.ff_out.bias.as_ref()),
    ] {
        assert!(host(b.unwrap().val()).iter().all(|&x| x == 0.0), "{what}");
    }
    let beta = layer.block.norm_ff.beta.as_ref().unwrap().val();
    assert!(host(beta).iter().all(|&x| x == 0.0), "LayerNorm bias");

    // The tied model starts near the uniform guess, ln 256 = 5.55 nats (HF: 5.7): an embedding
    // drawn at unit scale made every token predict itself (11.3 nats) and stalled training.
    let dev = flex().autodiff();
    let model = XlConfig::new().with_n_layers(2).init(&dev).unwrap();
    let tokens: Vec<i64> = (0..8 * 64).map(|i| (i * 131 % 251) as i64).collect();
    let x = Tensor::<2, Int>::from_data(TensorData::new(tokens.clone(), [8, 64]), &dev);
    let y = Tensor::<2, Int>::from_data(
        TensorData::new(tokens.iter().map(|t| (t + 7) % 256).collect(), [8, 64]),
        &dev,
    );
    let (loss, _) = memory_loss(&model, x, y, &XlMemory::empty()).unwrap();
    let loss = loss.into_scalar::<f64>();
    let uniform = 256f64.ln();
    assert!(
        (loss - uniform).abs() < 0.5,
        "first loss {loss} nats, uniform {uniform}"
    );
}

/// tiny Shakespeare, when this machine has it (`$MEMZOO_TINY_SHAKESPEARE` alone when set).
fn tiny_shakespeare() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MEMZOO_TINY_SHAKESPEARE") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    [
        here.join("../../shared/data/tinyshakespeare.txt"),
        PathBuf::from("/work/shared/data/tinyshakespeare.txt"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The text the learning tests train on, split as `memzoo train --data` splits a file: tiny
/// Shakespeare, or where this machine lacks it (no `../shared`, no network) the generated
/// long-range corpus, whose filler is English words (`MEMZOO_REQUIRE_DATA=1` refuses that).
/// Returns the train and valid byte tokens and the bpc of the validation split under the
/// training split's unigram distribution (add-one smoothed): what a model that ignores context
/// gets at best.
fn text_splits() -> (Vec<u16>, Vec<u16>, f64) {
    let corpus = match tiny_shakespeare() {
        Some(path) => Corpus::load(&path, None, &SplitRule::generic()).unwrap(),
        None => {
            assert!(
                std::env::var("MEMZOO_REQUIRE_DATA").as_deref() != Ok("1"),
                "MEMZOO_REQUIRE_DATA=1 but tinyshakespeare.txt was not found \
                 (set MEMZOO_TINY_SHAKESPEARE)"
            );
            eprintln!(
                "tinyshakespeare.txt not found (set MEMZOO_TINY_SHAKESPEARE): \
                 training on the generated long-range corpus"
            );
            generate_corpus(&LongRangeConfig::default()).unwrap()
        }
    };
    let tok = ByteTokenizer::new();
    let train = tok.encode(corpus.get(Split::Train));
    let valid = tok.encode(corpus.get(Split::Valid));
    let mut counts = [1.0f64; 256];
    for &t in &train {
        counts[t as usize] += 1.0;
    }
    let total: f64 = counts.iter().sum();
    let bits: f64 = valid
        .iter()
        .map(|&t| -(counts[t as usize] / total).log2())
        .sum();
    let bpc = bits / valid.len() as f64;
    (train, valid, bpc)
}

/// Trains `model` for `steps` steps of `batch` rows of `tgt_len` tokens on `train_tokens`
/// (lr warmed up over the first tenth, then linear to 0; seed 0) and returns it with its
/// validation bpc on `valid_tokens` (rows of 8) when `valid_tokens` is given.
fn short_train<M: SegmentModel>(
    name: &str,
    model: M,
    train_tokens: &[u16],
    valid_tokens: Option<&[u16]>,
    steps: usize,
    [batch, tgt_len]: [usize; 2],
    lr: f64,
) -> (M, Option<f64>) {
    let dir = std::env::temp_dir().join(format!("memzoo-learning-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = TrainConfig::sized(steps, batch, tgt_len)
        .with_seed(0)
        .with_log_every(steps)
        .with_eval_every(0)
        .with_checkpoint_every(0)
        .with_schedule(ScheduleConfig::cosine(lr, steps / 10, 0.0));
    let mut train_data = OrderedBatcher::new(train_tokens.to_vec(), batch, tgt_len)
        .unwrap()
        .drop_last(true);
    let mut valid_data = valid_tokens.map(|v| OrderedBatcher::new(v.to_vec(), 8, tgt_len).unwrap());
    let options = RunOptions {
        run_dir: dir.clone(),
        resume: false,
        quiet: true,
    };
    let outcome: TrainOutcome<M> = train(
        model,
        &config,
        &mut train_data,
        valid_data
            .as_mut()
            .map(|d| d as &mut dyn memzoo_train::SegmentSource),
        &options,
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (outcome.model, outcome.valid.map(|v| v.bpc))
}

/// [`short_train`] of `model` on tiny Shakespeare at lr 3e-3 for `steps` steps of `shape`
/// (`[rows, tgt_len]`), then [`assert_learns`] on its validation bpc.
fn assert_short_run_learns<M: SegmentModel>(
    name: &str,
    family: &str,
    model: M,
    steps: usize,
    shape: [usize; 2],
) {
    let (train_tokens, valid_tokens, unigram) = text_splits();
    let (_, bpc) = short_train(
        name,
        model,
        &train_tokens,
        Some(&valid_tokens),
        steps,
        shape,
        3e-3,
    );
    assert_learns(family, bpc.expect("evaluated at the end"), unigram);
}

/// Validation bpc of `model` on the first 16K tokens of `valid_tokens`, in rows of 8.
fn valid_bpc(model: &TransformerXl, valid_tokens: &[u16], tgt_len: usize) -> f64 {
    let valid = &valid_tokens[..valid_tokens.len().min(16_384)];
    let mut data = OrderedBatcher::new(valid.to_vec(), 8, tgt_len).unwrap();
    evaluate(model, &mut data, tgt_len, None).unwrap().bpc
}

/// The bound a short run must get under: clearly below the unigram bpc (a stalled model sits
/// at it), i.e. it must have learnt to use context.
fn assert_learns(family: &str, bpc: f64, unigram: f64) {
    eprintln!("{family}: valid {bpc:.3} bpc after a short run; unigram {unigram:.3} bpc");
    assert!(
        bpc < unigram - 0.4,
        "{family} did not learn: valid {bpc:.3} bpc, unigram {unigram:.3} bpc"
    );
}

/// No run reads Burn's device RNG, which concurrently running tests share: every model's
/// weights are drawn as its initialisers do (`N(c, s)` by parameter) from a seeded host
/// generator ([`seeded_weights`]), and its randomness is seeded (dropout masks and rotations
/// from `train_seed`). A run replays bit for bit with `RAYON_NUM_THREADS=1`; with more threads
/// the order of the kernels' sums varies, and so do the last digits of the bpc.
fn device() -> Device {
    flex().autodiff()
}

#[test]
fn xl_tied_post_ln_learns_tiny_shakespeare() {
    // Shaped like the reference: tied output, post-LN, shared u/v untied per layer as HF,
    // N(0, 0.02) everywhere; only smaller.
    let model = XlConfig::new()
        .with_randomness(Randomness::Seeded)
        .with_n_layers(2)
        .with_d_model(64)
        .with_n_heads(4)
        .with_d_inner(256)
        .with_mem_len(32)
        .with_untie_rel_bias(true)
        // The tied logits start at a scale ~ d_model * embedding_std: 5 as XL-small's with HF's
        // 0.02 (at d_model 64 the 0.02 starts them at 1.3, and such a run sometimes sat at the
        // unigram level for 300 steps). The default's 0.02 is checked by the test above.
        .with_embedding_std(Some(5.0 / 64.0));
    let model = seeded_weights(model.init(&device()).unwrap(), 0, xl_init_std(&model));
    assert_short_run_learns("xl", "Transformer-XL (tied, post-LN)", model, 250, [16, 64]);
}

#[test]
fn reformer_learns_tiny_shakespeare() {
    let model = ReformerConfig::new()
        .with_n_layers(2)
        .with_d_model(64)
        .with_n_heads(2)
        .with_d_head(32)
        .with_d_ff(256)
        .with_max_seq_len(64)
        .with_lsh(LshConfig::new().with_chunk_len(16).with_n_rounds(2))
        .with_axial_shape(Some([8, 8]));
    let model = seeded_weights(
        model.init(&device()).unwrap(),
        0,
        xl_init_std(&model.stack()),
    );
    assert_short_run_learns(
        "reformer",
        "Reformer (LSH, reversible)",
        model,
        250,
        [16, 64],
    );
}

#[test]
fn memorizing_learns_tiny_shakespeare() {
    let xl = MemorizingConfig::new().xl;
    let model = MemorizingConfig::new()
        .with_xl(
            xl.with_randomness(Randomness::Seeded)
                .with_n_layers(3)
                .with_d_model(64)
                .with_n_heads(4)
                .with_d_inner(256)
                .with_mem_len(32)
                .with_positions(PositionConfig::new().with_kind(PositionKind::T5)),
        )
        .with_knn_layers(vec![1])
        .with_knn(KnnLayerConfig::new().with_top_k(8).with_max_memories(1024));
    let model = seeded_weights(
        model.init(&device()).unwrap(),
        0,
        xl_init_std(&model.stack()),
    );
    assert_short_run_learns(
        "memorizing",
        "Memorizing Transformer (kNN layer)",
        model,
        150,
        [8, 32],
    );
}

/// The Compressive Transformer (a compressed memory of 16 vectors at rate 2 beside an XL memory
/// of 16, conv compression trained by the reconstruction loss) learns the text and reads its
/// compressed memory to a lower bpc than the same weights without it.
#[test]
fn compressive_learns_tiny_shakespeare() {
    let compressive = memzoo_stack::CompressiveConfig::new()
        .with_cmem_len(16)
        .with_ratio(2);
    let config = memory_stack(16).with_compressive(Some(compressive));
    let (model, valid, unigram) = trained_memory_stack("compressive", config);
    let with = valid_bpc(&model, &valid, MEMORY_TGT_LEN);
    let without = valid_bpc(&model.with_cmem_len(0), &valid, MEMORY_TGT_LEN);
    assert_learns("compressive", with, unigram);
    assert_memory_helps("compressive", "compressed memory", with, without);
}

/// The Recurrent Memory Transformer (8 memory tokens, no XL memory, segments of 8 bytes,
/// backpropagation through 2 segments) learns the text and reads its carried memory to a
/// lower bpc than the same weights reading a fresh memory every segment. (600 steps of two
/// segments each; 300 did not yet use the memory: 3.614 vs 3.615 bpc.)
#[test]
fn rmt_learns_tiny_shakespeare() {
    let rmt = memzoo_stack::RmtConfig::new()
        .with_mem_tokens(8)
        .with_bptt_segments(2);
    let config = memory_stack(0).with_rmt(Some(rmt));
    let (model, valid, unigram) = trained_memory_stack("rmt", config);
    let with = valid_bpc(&model, &valid, MEMORY_TGT_LEN);
    let without = valid_bpc(&model.without_carried_memory(), &valid, MEMORY_TGT_LEN);
    assert_learns("rmt", with, unigram);
    assert_memory_helps("rmt", "carried memory", with, without);
}

/// RMT + Transformer-XL (8 memory tokens and an XL memory of 8 segment tokens, segments of 8
/// bytes, backpropagation through 2 segments) learns the text and reads both memories: its
/// bpc is lower than the same weights' without the XL memory and than theirs reading a fresh
/// memory every segment (measured: 3.161 against 3.312 and 3.263; the RMT alone, below,
/// 3.194).
#[test]
fn rmt_with_an_xl_memory_learns_tiny_shakespeare() {
    let rmt = memzoo_stack::RmtConfig::new()
        .with_mem_tokens(8)
        .with_bptt_segments(2);
    let config = memory_stack(8).with_rmt(Some(rmt));
    let (model, valid, unigram) = trained_memory_stack("rmt", config);
    let with = valid_bpc(&model, &valid, MEMORY_TGT_LEN);
    let no_xl = valid_bpc(&model.clone().with_mem_len(0), &valid, MEMORY_TGT_LEN);
    let no_tokens = valid_bpc(&model.without_carried_memory(), &valid, MEMORY_TGT_LEN);
    assert_learns("rmt-xl", with, unigram);
    assert_memory_helps("rmt-xl", "XL memory", with, no_xl);
    assert_memory_helps("rmt-xl", "carried memory tokens", with, no_tokens);
}

/// The Compressive Transformer with most-used compression (16 kept positions at rate 2 beside
/// an XL memory of 16) learns the text and reads what it kept to a lower bpc than the same
/// weights without it (measured: 3.291 against 3.338; the convolution, above, 3.266).
#[test]
fn most_used_compression_learns_tiny_shakespeare() {
    let compressive = memzoo_stack::CompressiveConfig::new()
        .with_cmem_len(16)
        .with_ratio(2)
        .with_function(memzoo_stack::CompressionKind::MostUsed);
    let config = memory_stack(16).with_compressive(Some(compressive));
    let (model, valid, unigram) = trained_memory_stack("compressive", config);
    let with = valid_bpc(&model, &valid, MEMORY_TGT_LEN);
    let without = valid_bpc(&model.with_cmem_len(0), &valid, MEMORY_TGT_LEN);
    assert_learns("most-used", with, unigram);
    assert_memory_helps("most-used", "kept positions", with, without);
}

/// The Block-Recurrent Transformer (the top layer recurrent with 8 state vectors, the fixed gate
/// and no feed-forward on the state, the paper's `fixed:skip`; no XL memory, blocks of 8 bytes,
/// backpropagation through 2 blocks) learns the text and reads its carried state to a lower bpc
/// than the same weights reading the initial state every block (measured: 3.160 against
/// 3.223; with the state's feed-forward 3.161 against 3.166, with an XL memory of 8 as well
/// 3.006 against 3.030).
#[test]
fn block_recurrent_learns_tiny_shakespeare() {
    let recurrent = memzoo_stack::BlockRecurrentConfig::new()
        .with_state_len(8)
        .with_layer(1)
        .with_state_ff(false)
        .with_bptt_segments(2);
    let config = memory_stack(0).with_block_recurrent(Some(recurrent));
    let (model, valid, unigram) = trained_memory_stack("block-recurrent", config);
    let with = valid_bpc(&model, &valid, MEMORY_TGT_LEN);
    let without = valid_bpc(&model.without_carried_memory(), &valid, MEMORY_TGT_LEN);
    assert_learns("block-recurrent", with, unigram);
    assert_memory_helps("block-recurrent", "carried state", with, without);
}

const STEPS: usize = 600;

/// The stack of the memory families' learning tests: 2 layers of 64 (4 heads), seeded, no
/// dropout, XL memory `mem_len`; each test adds its memory.
fn memory_stack(mem_len: usize) -> XlConfig {
    XlConfig::new()
        .with_randomness(Randomness::Seeded)
        .with_n_layers(2)
        .with_d_model(64)
        .with_n_heads(4)
        .with_d_inner(256)
        .with_mem_len(mem_len)
        .with_dropout(0.0)
        .with_untie_rel_bias(true)
        .with_embedding_std(Some(5.0 / 64.0))
}

/// Segment length of the memory families' learning tests.
const MEMORY_TGT_LEN: usize = 8;

/// `config` (a stack of `family`) seeded, trained [`STEPS`] steps of 16 rows of
/// [`MEMORY_TGT_LEN`] bytes of tiny Shakespeare at lr 3e-3; with the validation tokens and the
/// unigram bpc.
fn trained_memory_stack(family: &str, config: XlConfig) -> (TransformerXl, Vec<u16>, f64) {
    let (train_tokens, valid_tokens, unigram) = text_splits();
    let model = seeded_weights(config.init(&device()).unwrap(), 0, xl_init_std(&config));
    assert_eq!(model.stack_family(), family);
    let shape = [16, MEMORY_TGT_LEN];
    let (model, _) = short_train(family, model, &train_tokens, None, STEPS, shape, 3e-3);
    (model, valid_tokens, unigram)
}

/// The same weights read the validation text better with their memory than without it.
fn assert_memory_helps(family: &str, memory: &str, with: f64, without: f64) {
    eprintln!("{family}: {with:.3} bpc reading its {memory}, {without:.3} without");
    assert!(
        with < without - 0.02,
        "{family}: the {memory} does not help: {with:.3} bpc with it, {without:.3} without"
    );
}

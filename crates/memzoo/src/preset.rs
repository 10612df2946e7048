//! Named recipes: a layer stack and its training schedule (`memzoo train --preset NAME`).
//!
//! A preset is a starting point, not a family: it fills `[model]` (the layer stack, whose
//! family is derived from its layers: [`memzoo_stack::XlConfig::family`]) and `[train]`, and the
//! run's `config.toml` names it (`[model] preset = "..."`) beside the fields it set; `--config`
//! and `--set` apply on top. No value in a preset is tuned to a size a user can change without
//! it: the one value that was (the tiny XL's embedding at N(0, 0.1)) is gone, and every preset
//! initialises its embedding from `init_std` unless the paper's recipe says otherwise.

use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::presets::block_recurrent;
use memzoo_stack::{
    CompressionKind, CompressiveConfig, LayerKind, MemorizingConfig, ReformerConfig, RmtConfig,
    XlConfig,
};
use memzoo_train::{AdamConfig, ScheduleConfig, TrainConfig};
use serde::{Deserialize, Serialize};

/// A named recipe from the papers or memzoo's CPU references (`memzoo train --preset NAME`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// The default run: a tiny XL (2 layers, d_model 64, 8 heads of 8, memory 24) on segments
    /// of 8 bytes, 5,000 steps at lr 3e-3: it learns in about a minute on 2 cores to copy
    /// text from 22 bytes back, beyond its segment and within its memory.
    XlTiny,
    /// XL-small (6 x 256, memory 128; `XlConfig::small`), memzoo's CPU reference, with the
    /// quality recipe of HF TransfoXL's comparison (batch 8 x 128, AdamW lr 1e-3, 50 warm-up
    /// steps then cosine, clip 0.25).
    XlSmall,
    /// Transformer-XL's enwik8 base (12 x 512, memory 512; `XlConfig::enwik8_base`) with its
    /// authors' schedule (batch 22 x 512, Adam lr 2.5e-4, cosine over 400K steps).
    XlEnwik8Base,
    /// Transformer-XL's WikiText-103 base (16 x 410, memory 150, adaptive softmax;
    /// `XlConfig::wt103_base`) with its authors' schedule (batch 60 x 150, lr 2.5e-4, 200K
    /// steps).
    XlWt103Base,
    /// A tiny Reformer (2 layers: local and LSH, d_model 128, axial positions up to 1,024) on
    /// the default run's schedule (`memzoo train --model reformer`).
    ReformerTiny,
    /// Reformer-small (6 x 256, LSH; `ReformerConfig::small`), memzoo's CPU reference, on
    /// batch 8 x 256 with the quality recipe.
    ReformerSmall,
    /// The Reformer's enwik8 configuration (12 x 1024, 64K tokens; `ReformerConfig::enwik8`),
    /// one sequence of 65,536 bytes per step for 20K steps (Adam, not the paper's Adafactor).
    ReformerEnwik8,
    /// A tiny Memorizing Transformer (4 x 128, T5 positions, pre-LN, a kNN layer at depth 2,
    /// top-32 over 16K memories) on the default run's schedule (`memzoo train --model
    /// memorizing`).
    MemorizingTiny,
    /// Memorizing-small (6 x 256, kNN layer 4; `MemorizingConfig::small`), memzoo's CPU
    /// reference, on batch 8 x 128 with the quality recipe.
    MemorizingSmall,
    /// The Memorizing Transformer of Wu et al. 2022 (12 x 1024, kNN layer 9, 64K memories;
    /// `MemorizingConfig::paper`) on batch 8 x 512 (Adam, not the paper's Adafactor).
    MemorizingPaper,
    /// A tiny Compressive Transformer (2 layers, d_model 64, 8 heads of 8, memory 16,
    /// compressed memory 16 at rate 2 by convolution) on the default run's schedule.
    CompressiveTiny,
    /// The Compressive Transformer's enwik8 model (Rae et al. 2019, sec. 5.2/table 4: 24
    /// layers, d_model 1024, 8 heads, d_inner 3072, segments and memory 768, compressed
    /// memory 768 at rate 3, conv; `docs/paper-recipes.md` lists what the paper leaves
    /// unstated) with Transformer-XL's schedule as a stand-in (the paper: Adam, lr 2e-4 with a
    /// linear warm-up and cosine decay).
    CompressivePaper,
    /// A tiny Recurrent Memory Transformer (2 layers, d_model 64, 8 heads of 8, no XL
    /// memory, 8 memory tokens, backpropagation through 2 segments, memory reset at document
    /// starts) on the default run's schedule (each step reads 2 segments).
    RmtTiny,
    /// The Recurrent Memory Transformer on enwik8 (Bulatov et al. 2022): Transformer-XL's
    /// enwik8 base layers (12 x 512, 8 heads x 64, d_inner 2048) without XL memory, 10
    /// memory tokens, backpropagation through 2 segments of 128 bytes, with Transformer-XL's
    /// schedule; `docs/paper-recipes.md` says which of these were not checked against the
    /// paper.
    RmtPaper,
    /// A tiny Block-Recurrent Transformer (2 layers, d_model 64, 8 heads of 8, XL memory 8
    /// as the window over the previous block, the top layer recurrent with 8 state vectors and
    /// the fixed gate, backpropagation through 2 blocks, state reset at document starts;
    /// `memzoo_stack::presets::block_recurrent::tiny`) on the default run's schedule (each step
    /// reads 2 segments).
    BlockRecurrentTiny,
    /// The Block-Recurrent Transformer's PG-19 model (Hutchins et al. 2022: 12 x 1024, 8 heads
    /// of 128, T5 positions, window 512, the 10th layer recurrent with 512 state vectors, fixed
    /// gate; `memzoo_stack::presets::block_recurrent::paper`, which says what differs) on
    /// blocks of 512 with 8 unrolled per step (the paper's segments of 4096), batch 32, 500K
    /// steps, with Transformer-XL's schedule as a stand-in for the paper's Adafactor.
    BlockRecurrentPaper,
}

impl Preset {
    /// The preset's layer stack.
    pub fn model(self) -> XlConfig {
        match self {
            Preset::XlTiny => XlConfig::new()
                .with_n_layers(2)
                .with_d_model(64)
                .with_n_heads(8)
                .with_d_inner(128)
                .with_mem_len(24)
                .with_dropout(0.0),
            Preset::XlSmall => XlConfig::small(),
            // The attention's probabilities computed again in the backward pass: on the
            // 2-core CPU the run peaks at 10.8 GB instead of 14.7 and trains 12% faster (the
            // same losses; `docs/benchmarks.md`); no effect on a GPU.
            Preset::XlEnwik8Base => XlConfig::enwik8_base().with_recompute_attention(true),
            Preset::XlWt103Base => XlConfig::wt103_base(),
            Preset::ReformerTiny => Self::reformer_tiny().stack(),
            Preset::ReformerSmall => ReformerConfig::small().stack(),
            Preset::ReformerEnwik8 => ReformerConfig::enwik8().stack(),
            Preset::MemorizingTiny => Self::memorizing_tiny().stack(),
            Preset::MemorizingSmall => MemorizingConfig::small().stack(),
            // As the enwik8 base: 13.2 GB instead of 14.8 at 6-9% more tokens/s on the 2-core
            // CPU, the same losses.
            Preset::MemorizingPaper => MemorizingConfig::paper()
                .stack()
                .with_recompute_attention(true),
            Preset::CompressiveTiny => XlConfig::new()
                .with_n_layers(2)
                .with_d_model(64)
                .with_n_heads(8)
                .with_d_inner(128)
                .with_mem_len(16)
                .with_dropout(0.0)
                .with_compressive(Some(
                    CompressiveConfig::new().with_cmem_len(16).with_ratio(2),
                )),
            Preset::CompressivePaper => XlConfig::new()
                .with_n_layers(24)
                .with_d_model(1024)
                .with_n_heads(8)
                .with_d_head(Some(128))
                .with_d_inner(3072)
                .with_mem_len(768)
                .with_compressive(Some(
                    CompressiveConfig::new()
                        .with_cmem_len(768)
                        .with_ratio(3)
                        .with_function(CompressionKind::Conv),
                )),
            Preset::RmtTiny => XlConfig::new()
                .with_n_layers(2)
                .with_d_model(64)
                .with_n_heads(8)
                .with_d_inner(128)
                .with_mem_len(0)
                .with_dropout(0.0)
                .with_document_resets(true)
                .with_rmt(Some(RmtConfig::new().with_mem_tokens(8))),
            Preset::RmtPaper => XlConfig::enwik8_base()
                .with_mem_len(0)
                .with_document_resets(true)
                .with_rmt(Some(
                    RmtConfig::new().with_mem_tokens(10).with_bptt_segments(2),
                )),
            Preset::BlockRecurrentTiny => block_recurrent::tiny(),
            Preset::BlockRecurrentPaper => block_recurrent::paper(),
        }
    }

    /// The tiny Memorizing Transformer as its preset config (also what an old run's
    /// `[memorizing]` section was filled from).
    pub(crate) fn memorizing_tiny() -> MemorizingConfig {
        MemorizingConfig::new()
            .with_xl(
                MemorizingConfig::new()
                    .xl
                    .with_n_layers(4)
                    .with_d_model(128)
                    .with_n_heads(4)
                    .with_d_inner(512)
                    .with_mem_len(64)
                    .with_dropout(0.0)
                    .with_positions(PositionConfig::new().with_kind(PositionKind::T5)),
            )
            .with_knn_layers(vec![2])
    }

    /// The tiny Reformer as its preset config (also what an old run's `[reformer]` section was
    /// filled from).
    pub(crate) fn reformer_tiny() -> ReformerConfig {
        ReformerConfig::new()
            .with_n_layers(2)
            .with_d_model(128)
            .with_n_heads(4)
            .with_d_head(32)
            .with_d_ff(512)
            .with_max_seq_len(1024)
            .with_axial_shape(Some([32, 32]))
            .with_axial_dims(Some([64, 64]))
            .with_attn_layers(vec![LayerKind::Local, LayerKind::Lsh])
    }

    /// The preset's training recipe.
    pub fn train(self) -> TrainConfig {
        match self {
            // 5,000 steps of 16 rows x 8 bytes at lr 3e-3 (one replica: at this size a second
            // costs more than it saves); evaluation on the whole validation split (the first
            // segment of each row has no memory yet, so a partial evaluation over-weights it).
            Preset::XlTiny
            | Preset::ReformerTiny
            | Preset::MemorizingTiny
            | Preset::CompressiveTiny
            | Preset::RmtTiny
            | Preset::BlockRecurrentTiny => TrainConfig::sized(5000, 16, 8)
                .with_replicas(Some(1))
                .with_log_every(100)
                .with_eval_every(2500)
                .with_checkpoint_every(2500)
                .with_schedule(ScheduleConfig::new().with_lr(3e-3).with_warmup(50)),
            Preset::XlSmall => quality(8, 128),
            Preset::ReformerSmall => quality(8, 256),
            Preset::MemorizingSmall => quality(8, 128),
            // The authors' run_enwik8_base.sh: Adam lr 2.5e-4, no warm-up, cosine to 0 over
            // 400K steps, clip 0.25.
            Preset::XlEnwik8Base => paper(22, 512, 400_000),
            // run_wt103_base.sh: batch 60 x 150, 200K steps.
            Preset::XlWt103Base => paper(60, 150, 200_000),
            // The papers trained these two with Adafactor; memzoo's stand-in is Adam at XL's
            // rate. The Reformer's 20K steps are its 1.19-bpc point (docs/paper-recipes.md);
            // the Memorizing Transformer's 500K steps were not checked against its paper.
            Preset::ReformerEnwik8 => paper(1, 65_536, 20_000),
            Preset::MemorizingPaper => paper(8, 512, 500_000),
            // Segments of 768 (the paper's enwik8 window); batch and steps not verified.
            Preset::CompressivePaper => paper(8, 768, 400_000),
            // Segments of 128 with 2 unrolled per step; batch and steps not verified.
            Preset::RmtPaper => paper(22, 128, 400_000),
            // The paper's batch 32 and 500K steps, blocks of 512 (8 unrolled per step).
            Preset::BlockRecurrentPaper => paper(32, 512, 500_000),
        }
    }

    /// The default preset of each family's `memzoo train --model FAMILY`.
    pub fn tiny(family: crate::config::ModelKind) -> Self {
        match family {
            crate::config::ModelKind::Xl => Preset::XlTiny,
            crate::config::ModelKind::Reformer => Preset::ReformerTiny,
            crate::config::ModelKind::Memorizing => Preset::MemorizingTiny,
        }
    }

    /// The name `--preset` and `config.toml` use.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// The quality recipe of `cargo xtask bench quality` (the peers' side by side): AdamW lr 1e-3
/// with PyTorch's betas and epsilon, weight decay 0.01, 50 warm-up steps then cosine to 0 over
/// 400 steps, clip 0.25, a checkpoint every 100 steps.
pub fn quality(batch: usize, tgt_len: usize) -> TrainConfig {
    TrainConfig::sized(400, batch, tgt_len)
        .with_schedule(ScheduleConfig::cosine(1e-3, 50, 0.0))
        .with_weight_decay(0.01)
        // PyTorch's AdamW: betas (0.9, 0.999), eps 1e-8 (the defaults).
        .with_adam(AdamConfig::new())
        .with_clip_norm(Some(0.25))
        .with_log_every(50)
        .with_eval_every(100)
        .with_checkpoint_every(100)
}

/// Transformer-XL's schedule (its authors' scripts): Adam lr 2.5e-4, no warm-up, cosine to 0
/// over `steps`, clip 0.25; the other papers' presets use it as a stand-in.
fn paper(batch: usize, tgt_len: usize, steps: usize) -> TrainConfig {
    TrainConfig::sized(steps, batch, tgt_len)
        .with_schedule(ScheduleConfig::cosine(2.5e-4, 0, 0.0))
        .with_clip_norm(Some(0.25))
        .with_log_every(200)
        .with_eval_every(4000)
        .with_checkpoint_every(4000)
}

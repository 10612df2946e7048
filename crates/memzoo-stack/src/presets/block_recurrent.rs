//! The Block-Recurrent Transformer (Hutchins et al. 2022) as presets of the layer stack: a
//! stack with one recurrent layer ([`BlockRecurrentConfig`]); the block is the stack's segment
//! and the sliding window its XL memory.

use memzoo_relative::{PositionConfig, PositionKind};

use crate::block_recurrent::{BlockRecurrentConfig, GateKind};
use crate::stack::XlConfig;

/// A tiny Block-Recurrent Transformer for CPU runs: 2 post-LN layers of 64 (8 heads of 8,
/// feed-forward 128, no dropout), XL memory 8 (the window over the previous block of the tiny
/// schedule's 8-byte segments), the top layer recurrent with 8 state vectors, the fixed gate
/// and no feed-forward on the state, backpropagation through 2 blocks, state and memory reset at document starts.
pub fn tiny() -> XlConfig {
    XlConfig::new()
        .with_n_layers(2)
        .with_d_model(64)
        .with_n_heads(8)
        .with_d_inner(128)
        .with_mem_len(8)
        .with_dropout(0.0)
        .with_document_resets(true)
        .with_block_recurrent(Some(
            BlockRecurrentConfig::new()
                .with_state_len(8)
                .with_layer(1)
                .with_bptt_segments(2),
        ))
}

/// The paper's PG-19 model (Hutchins et al. 2022, sec. 4): 12 pre-LN layers, embedding 1024,
/// 8 heads of 128, feed-forward 4096, T5 relative positions, a window of 512 (here the XL
/// memory over the previous block of 512), the 10th layer recurrent with 512 state vectors, the
/// fixed gate and no feed-forward on the state (`Rec:fixed:skip`, the paper's best), segments of 4096 tokens (here 8 blocks of 512 unrolled per step), a 32K
/// SentencePiece vocabulary (memzoo's byte tokenizer needs `vocab_size` 256 instead).
///
/// What differs: the window is the XL memory, whose keys are detached (the paper's sliding
/// window keeps the previous block's keys in the graph within a segment); the dropout is the
/// stack's default (0.1), not checked against the paper; the paper's Adafactor is not
/// memzoo's (the `--preset` recipe uses Adam).
pub fn paper() -> XlConfig {
    super::meliad_decoder(XlConfig::new())
        .with_pre_ln(true)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5))
        .with_document_resets(true)
        .with_block_recurrent(Some(
            BlockRecurrentConfig::new()
                .with_state_len(512)
                .with_layer(9)
                .with_gate(GateKind::Fixed)
                .with_bptt_segments(8),
        ))
}

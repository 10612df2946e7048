//! The reference models of the long-range recall comparison (`memzoo recall`): the task is
//! `memzoo_data::tasks::recall` (passages recalled across gaps far beyond the XL memory), the
//! training `memzoo_train::tasks::recall`.

use memzoo_memory::IndexKind;
use memzoo_relative::{PositionConfig, PositionKind};
use memzoo_stack::XlConfig;

use crate::model::MemorizingConfig;

/// The reference model: 2 pre-LN layers, d_model 64, 4 heads x 16, T5 positions, XL memory
/// of 32, a vocabulary of `vocab_size`; with `knn`, layer 1 is a kNN layer (top-8 of up to
/// 1,024 exact memories per row and head), without it the same model is a plain
/// Transformer-XL.
pub fn reference_config(knn: bool, vocab_size: usize) -> MemorizingConfig {
    let xl = XlConfig::new()
        .with_vocab_size(vocab_size)
        .with_d_model(64)
        .with_n_layers(2)
        .with_n_heads(4)
        .with_d_inner(128)
        .with_dropout(0.0)
        .with_mem_len(32)
        .with_pre_ln(true)
        .with_positions(PositionConfig::new().with_kind(PositionKind::T5));
    MemorizingConfig::new()
        .with_xl(xl)
        .with_knn_layers(if knn { vec![1] } else { vec![] })
        .with_top_k(8)
        .with_max_memories(1024)
        .with_index(IndexKind::Exact)
}

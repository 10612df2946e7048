//! The papers' models as presets of the layer stack, one file per family: each builds an
//! [`XlConfig`](crate::XlConfig) (`stack()`) from the paper's parameters. Transformer-XL's own
//! presets are [`XlConfig::small`](crate::XlConfig::small),
//! [`enwik8_base`](crate::XlConfig::enwik8_base) and [`wt103_base`](crate::XlConfig::wt103_base).

pub mod block_recurrent;
pub mod memorizing;
pub mod reformer;

/// The decoder of the Memorizing and Block-Recurrent papers' PG-19 and arXiv models (both
/// Google's Meliad code): 12 layers, embedding 1024, 8 heads of 128, feed-forward 4096, a
/// memory (window) of 512, a 32K SentencePiece vocabulary (memzoo's byte tokenizer needs
/// `vocab_size` 256 instead); the rest of `c` as it is.
pub(crate) fn meliad_decoder(c: crate::XlConfig) -> crate::XlConfig {
    c.with_vocab_size(32_000)
        .with_n_layers(12)
        .with_d_model(1024)
        .with_n_heads(8)
        .with_d_head(Some(128))
        .with_d_inner(4096)
        .with_mem_len(512)
}

//! [`PeerCompat`]: the switches that exist only to reproduce a PyTorch peer's numerics.

use burn::config::Config;

use super::HeadInput;

/// Switches that make the stack compute exactly what one of the PyTorch peers computes
/// (`[model.compat]` in a run's config): `memzoo import` sets them from the peer's model and
/// `memzoo export` reads them back. A model trained here leaves them at their defaults,
/// memzoo's own choices, and a run's `config.toml` lists the section only where it differs
/// from its preset's. What a user tunes for modelling (dropout placement, embedding scale,
/// `untie_rel_bias`, `kv_heads`, ...) stays in the stack's config itself.
#[derive(Config, Debug, PartialEq)]
pub struct PeerCompat {
    /// A sequence starts from `mem_len` zero vectors per layer instead of no memory: its first
    /// segment attends to them like to any memory (they add zero values but take softmax
    /// weight). HF's TransfoXL does this when called with `mems=None` (`init_mems`); set it
    /// for an imported model to score its first segment as HF does. Default: false.
    #[config(default = false)]
    pub zero_first_memory: bool,
    /// Relative-attention layers (`xl`, `learned`, `t5`) get a value bias and an output bias
    /// (`RelativeAttentionConfig::value_output_bias`), as labml's attention has. Default: false.
    #[config(default = false)]
    pub value_output_bias: bool,
    /// Relative-attention layers' output projection has a bias (and their values none), as
    /// memorizing-transformers-pytorch's `Attention` (its kNN layer has none: kNN layers
    /// ignore this). Default: false.
    #[config(default = false)]
    pub attention_output_bias: bool,
    /// Gradients reach the layers (their LayerNorm, `W_k`, `W_v`) through the XL memory's keys
    /// and values, which memzoo computes from the cached layer inputs in every segment. false:
    /// the memory's keys and values are constants, as in a model that caches them detached
    /// (memorizing-transformers-pytorch); the same forward pass at fixed weights (in training,
    /// memzoo projects the memory with the current weights, such a model kept the old
    /// projections). Default: true.
    #[config(default = true)]
    pub memory_gradients: bool,
    /// The XL memory caches every layer's keys and values (detached, as computed when the
    /// segment was read; a kNN layer's keys normalised), `[batch, mlen, 2 kv_heads d_head]`
    /// per layer, instead of the layer inputs that each segment projects again (Dai et al.'s
    /// formulation, memzoo's default). With fixed weights the two are the same function
    /// (with `memory_gradients = false`, the same gradients too); in training the cached
    /// keys/values keep the projections of the step that computed them
    /// (memorizing-transformers-pytorch). Needs relative / kNN layers only, sequential
    /// residuals and no `zero_first_memory`. Default: false.
    #[config(default = false)]
    pub memory_keys_values: bool,
    /// `t5` layers read one T5 table of the model, and `knn` layers another, instead of one
    /// each (memorizing-transformers-pytorch's `rel_pos_bias` and `knn_rel_pos_bias`); the
    /// layers' own tables are then unused. Default: false.
    #[config(default = false)]
    pub shared_t5: bool,
    /// With `pre_ln`: a LayerNorm after the last layer (GPT-2's, memzoo's pre-LN stacks); HF's
    /// pre-LN TransfoXL (`pre_lnorm = true`) has none. Unused without `pre_ln`. Default: true.
    #[config(default = true)]
    pub final_norm: bool,
    /// What the head of a reversible stack reads: `(y_1 + y_2) / 2` or `cat(y_1, y_2)` (HF's
    /// Reformer; see [`HeadInput`]). Needs `residual = "reversible"` for `concat`. Default: mean.
    #[config(default = "HeadInput::Mean")]
    pub head_input: HeadInput,
    /// The feed-forward's two linear layers have biases (memzoo, Transformer-XL); false: none
    /// (recurrent-memory-transformer-pytorch's bias-free `Linear`s). Default: true.
    #[config(default = true)]
    pub ff_bias: bool,
    /// Every attention layer has a learned null key and value per head (`[2, n_heads,
    /// d_head]`), prepended to its keys and visible to every query, so that a query can
    /// attend to nothing (recurrent-memory-transformer-pytorch's `null_kv`): with `s =
    /// 1/sqrt(d_head)`, `softmax_j(s q·[k_null, k_j]) [v_null, v_j]`. Needs absolute layers
    /// (the null key has no position) with a key/value per head. Default: false.
    #[config(default = false)]
    pub null_key_value: bool,
    /// Value residual learning (Zhou et al. 2024, recurrent-memory-transformer-pytorch): every
    /// layer but the first mixes the first layer's values into its own by a learned gate per
    /// head and position, `v_l ← v_l + σ(W_g x)_h (v_1 − v_l)` (`W_g`: `d_model -> n_heads`,
    /// no bias, reading the attention's input `x`, normalised in a pre-LN block); `v_1` keeps
    /// its graph. Needs absolute layers with a key/value per head and `mem_len = 0` (`v_1`
    /// covers the segment's keys only). Default: false.
    #[config(default = false)]
    pub value_residual: bool,
    /// The gradient reaching the input embedding (token and position tables) is scaled by
    /// this factor, `e ← f e + (1 − f) stopgrad(e)`, the forward pass unchanged (CogView's
    /// trick; recurrent-memory-transformer-pytorch's `emb_gradient_frac`, 0.1). In `[0, 1]`.
    /// Default: 1 (plain gradients).
    #[config(default = 1.0)]
    pub embedding_gradient_scale: f64,
    /// Every LayerNorm has its bias `β` (blocks, final norm, a Block-Recurrent state's norms);
    /// false: `γ` alone, `LN(x) = (x − mean(x)) / sqrt(var(x) + eps) γ`
    /// (block-recurrent-transformer-pytorch's `LayerNorm`, whose `β` is a fixed zero). RMSNorm
    /// has none either way. Default: true.
    #[config(default = true)]
    pub norm_bias: bool,
    /// The untied linear output has a bias (`logits = W h + b`); false: `W h`
    /// (block-recurrent-transformer-pytorch's `to_logits`). Default: true.
    #[config(default = true)]
    pub output_bias: bool,
}

impl PeerCompat {
    /// The names of the switches that were `[model]` keys before they had a section of their
    /// own (`[model.compat]` keys of the same names; the switches added since have no older
    /// place).
    pub const KEYS: [&'static str; 8] = [
        "zero_first_memory",
        "value_output_bias",
        "attention_output_bias",
        "memory_gradients",
        "memory_keys_values",
        "shared_t5",
        "final_norm",
        "head_input",
    ];
}

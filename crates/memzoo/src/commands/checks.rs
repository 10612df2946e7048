//! The refusals shared by the commands: a run's flags against its family, token ids against the
//! model's vocabulary, and the model's (or the LSH attention's) memory against this machine's,
//! each naming the field to change instead of failing deep inside a run.

use std::path::Path;

use memzoo_data::{TextCodec, machine_memory};

use super::gib;
use crate::config::RunConfig;
use crate::error::CliError;

/// `--mem-len` (eval, generate) sets a Transformer-XL run's memory length: on a run of another
/// family it is refused, naming the family, not ignored.
pub(super) fn check_mem_len_flag(
    mem_len: Option<usize>,
    config: &RunConfig,
    run_dir: &Path,
) -> Result<(), CliError> {
    if mem_len.is_some() && config.family() == "reformer" {
        return Err(CliError::Conflict(format!(
            "--mem-len sets the XL memory of relative-attention layers, but {} holds a {} run \
             (LSH and local layers)",
            run_dir.display(),
            config.family()
        )));
    }
    Ok(())
}

/// The config field of the model's vocabulary size, and its value.
fn model_vocab(config: &RunConfig) -> (&'static str, usize) {
    ("model.vocab_size", config.model.vocab_size)
}

/// Token ids must index the model's vocabulary: the largest one in the data is named rather
/// than panicking inside the embedding lookup.
pub(super) fn check_vocab(
    config: &RunConfig,
    splits: &crate::data_setup::Splits,
) -> Result<(), CliError> {
    let (field, vocab) = model_vocab(config);
    for (split, tokens) in [
        ("train", &splits.train),
        ("valid", &splits.valid),
        ("test", &splits.test),
    ] {
        if let Some(&max) = tokens.iter().max()
            && max as usize >= vocab
        {
            return Err(CliError::Vocab {
                field,
                vocab,
                split,
                data: splits.name.clone(),
                id: max.into(),
                byte_offset: config.data.byte_offset,
            });
        }
    }
    Ok(())
}

/// The prompt's ids must index the model's vocabulary (named as [`check_vocab`] does).
pub(super) fn check_prompt_vocab(
    config: &RunConfig,
    codec: &TextCodec,
    prompt: &str,
) -> Result<(), CliError> {
    let (field, vocab) = model_vocab(config);
    if let Some(&max) = codec.encode_prompt(prompt)?.iter().max()
        && max as usize >= vocab
    {
        return Err(CliError::Vocab {
            field,
            vocab,
            split: "prompt",
            data: "--prompt".into(),
            id: max as u32,
            byte_offset: config.data.byte_offset,
        });
    }
    Ok(())
}

/// Refuses a Reformer whose LSH attention cannot fit in this machine's memory (the scores of
/// one layer: batch x heads x rounds x padded length x chunk window, f32, about four live
/// copies in the backward), naming the estimate, instead of being killed for memory. Every run
/// whose stack is a Reformer ([`RunConfig::family`]) is checked, imported or native; the
/// message names the `[model]` fields.
pub(super) fn check_machine_memory(config: &RunConfig) -> Result<(), CliError> {
    check_model_memory(config, true)?;
    if config.family() != "reformer" {
        return Ok(());
    }
    let (stack, t) = (config.stack(), &config.train);
    let lsh = &stack.lsh;
    let rounds = "model.lsh.n_rounds";
    let chunk = lsh.chunk_len.max(1);
    let len = t.tgt_len.div_ceil(chunk) * chunk;
    let window = chunk * (1 + lsh.n_chunks_before + lsh.n_chunks_after);
    let bytes = [stack.n_heads, lsh.n_rounds, len, window, 4 * 4]
        .iter()
        .map(|&v| v as f64)
        .product::<f64>()
        * t.batch as f64;
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "{rounds} = {} with train.batch {} x train.tgt_len {} ({} heads, chunk window \
                 {window}): one LSH layer's attention",
                lsh.n_rounds, t.batch, t.tgt_len, stack.n_heads,
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: format!("; lower {rounds}, train.batch or train.tgt_len"),
        });
    }
    Ok(())
}

/// About how many bytes a stack of `x` takes (f32): its parameters (with `training`, also
/// their gradients and AdamW's two moments: 4 copies), and one step's largest activations over
/// `batch` rows of `len` tokens (the logits, and every layer's attention scores over memory and
/// segment, three live copies each in a training step). Computed in f64: sizes whose product
/// overflows an integer are estimated all the same.
fn stack_bytes(x: &memzoo_stack::XlConfig, batch: usize, len: usize, training: bool) -> f64 {
    let f = |v: usize| v as f64;
    let (d, h, layers) = (f(x.d_model), f(x.n_heads.max(1)), f(x.n_layers));
    let dh = x.d_head.map_or(d / h, f);
    let embed = f(x.vocab_size) * f(x.d_embed.unwrap_or(x.d_model));
    let output = if x.tie_weights {
        0.0
    } else {
        f(x.vocab_size) * d
    };
    let layer = 5.0 * d * h * dh + 2.0 * d * f(x.d_inner);
    let params = embed + output + layers * layer;
    let (copies, live) = if training { (4.0, 3.0) } else { (1.0, 1.0) };
    let rows = f(batch) * f(len);
    let logits = rows * f(x.vocab_size) * live;
    let scores = layers * f(batch) * h * f(len) * (f(len) + f(x.mem_len)) * live;
    let hidden = layers * rows * (d + f(x.d_inner)) * live;
    4.0 * (params * copies + logits + scores + hidden)
}

/// Refuses a model whose parameters and one step's activations cannot fit in this machine's
/// memory ([`stack_bytes`]; every family: the XL stack, the Reformer's, the Memorizing
/// Transformer's with its kNN memories), naming the sizes, instead of aborting on the
/// allocation. `training`: with gradients and optimizer moments.
pub(super) fn check_model_memory(config: &RunConfig, training: bool) -> Result<(), CliError> {
    let t = &config.train;
    let (prefix, stack) = ("model", config.stack());
    // The kNN memories: keys and values, f32, per row, head and kNN layer.
    let knn_layers = stack
        .layer_kinds()
        .iter()
        .filter(|&&k| k == memzoo_stack::LayerKind::Knn)
        .count();
    let dh = stack.d_head.unwrap_or(stack.d_model / stack.n_heads.max(1)) as f64;
    let knn = [t.batch, stack.knn.max_memories, stack.n_heads, knn_layers]
        .iter()
        .map(|&v| v as f64)
        .product::<f64>()
        * dh
        * 2.0
        * 4.0;
    let bytes = stack_bytes(&stack, t.batch, t.tgt_len, training) + knn;
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "a {} model of {prefix}.n_layers {} x {prefix}.d_model {} ({prefix}.d_inner {}, \
                 {prefix}.vocab_size {}) with train.batch {} x train.tgt_len {}{}",
                config.family(),
                stack.n_layers,
                stack.d_model,
                stack.d_inner,
                stack.vocab_size,
                t.batch,
                t.tgt_len,
                if training {
                    " (weights, gradients, AdamW's moments and one step's activations)"
                } else {
                    " (weights and one pass's activations)"
                }
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: format!(
                "; lower {prefix}.d_model, {prefix}.d_inner, {prefix}.n_layers, \
                 {prefix}.vocab_size, train.batch or train.tgt_len"
            ),
        });
    }
    Ok(())
}

/// Refuses an import whose model (`xl`, read from the source's config alone) cannot fit in this
/// machine's memory: its weights twice (the tensors read and the model built from them,
/// [`stack_bytes`] without activations), naming the sizes, before either is allocated.
pub(crate) fn check_import_memory(from: &str, xl: &memzoo_stack::XlConfig) -> Result<(), CliError> {
    let bytes = 2.0 * stack_bytes(xl, 0, 0, false);
    let Some(total) = machine_memory() else {
        return Ok(());
    };
    if bytes > total as f64 {
        return Err(CliError::TooLarge {
            what: format!(
                "the {from} model of its config.json: n_layers {} x d_model {} (d_inner {}, \
                 vocabulary {}), its weights read and built",
                xl.n_layers, xl.d_model, xl.d_inner, xl.vocab_size
            ),
            need_gib: gib(bytes),
            have_gib: gib(total as f64),
            advice: String::new(),
        });
    }
    Ok(())
}

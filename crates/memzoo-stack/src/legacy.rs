//! Loading checkpoints written before the layer stack (memzoo 0.1 layouts).
//!
//! The stack renamed parameters in three ways: a layer's attention is an enum
//! ([`LayerAttention`](crate::LayerAttention)), so its parameters gained the variant
//! (`layers.3.attention.Relative.query.weight`); a relative attention keeps exactly the
//! parameters of its position scheme (`r_net` → `scheme.Xl.r_net`, `rel_bias` →
//! `scheme.T5.bias` or `scheme.Learned.key_bias`, ...); and the Memorizing Transformer, which
//! held its plain layers in an inner XL model (`xl.layers.j`) and its kNN layers beside it
//! (`knn.m`), is one list of layers by depth. Later the embedding and the output became enums
//! (plain or adaptive): `embedding.weight` → `embedding.Plain.weight`, `output.weight` →
//! `output.Linear.weight`, the tied output's `output_bias` → `output.Tied` ([`io_path`]).
//! [`legacy_path`] maps a name from before the stack to the current one; [`load_legacy`]
//! rewrites a whole burnpack record of either older layout and loads it, so old run
//! directories keep working (`--resume`, `eval`, `generate`).
//!
//! The Reformer was its own model (`ReformerLm` with `blocks`, `positions`, `norm`) before it
//! became a preset of the stack; [`reformer_path`] maps its names.

use std::path::Path;

use burn::module::Module;
use burn::store::ModuleRecord;
use burn_pack::{Reader, Tensor as PackTensor, Writer};
use memzoo_relative::PositionKind;

use crate::error::XlError;
use crate::stack::{LayerKind, TransformerXl};

/// The new name of an old parameter path, for a stack whose layers are `kinds` (bottom to top). `None`: a path the stack no longer has a place
/// for (e.g. shared `u`/`v` of a stack without XL layers, which old models created unused).
pub fn legacy_path(old: &str, kinds: &[LayerKind]) -> Option<String> {
    let plain: Vec<usize> = (0..kinds.len())
        .filter(|&d| kinds[d] != LayerKind::Knn)
        .collect();
    let knn: Vec<usize> = (0..kinds.len())
        .filter(|&d| kinds[d] == LayerKind::Knn)
        .collect();
    // Old Memorizing models kept the backbone under `xl.`.
    let path = old.strip_prefix("xl.").unwrap_or(old);
    let parts: Vec<&str> = path.split('.').collect();
    match parts.as_slice() {
        ["layers", j, "attention", rest @ ..] => {
            let depth = *plain.get(j.parse::<usize>().ok()?)?;
            let kind = kinds[depth].positions()?;
            Some(format!(
                "layers.{depth}.attention.Relative.{}",
                scheme_path(rest, kind)?
            ))
        }
        ["layers", j, rest @ ..] => {
            let depth = *plain.get(j.parse::<usize>().ok()?)?;
            Some(format!("layers.{depth}.{}", rest.join(".")))
        }
        ["knn", m, "attention", "attention", rest @ ..] => {
            let depth = *knn.get(m.parse::<usize>().ok()?)?;
            Some(format!(
                "layers.{depth}.attention.Knn.attention.{}",
                scheme_path(rest, PositionKind::T5)?
            ))
        }
        ["knn", m, "attention", rest @ ..] => {
            let depth = *knn.get(m.parse::<usize>().ok()?)?;
            Some(format!("layers.{depth}.attention.Knn.{}", rest.join(".")))
        }
        ["knn", m, rest @ ..] => {
            let depth = *knn.get(m.parse::<usize>().ok()?)?;
            Some(format!("layers.{depth}.{}", rest.join(".")))
        }
        ["shared_biases", ..] if !kinds.contains(&LayerKind::Xl) => None,
        _ => Some(io_path(path)),
    }
}

/// The current name of an embedding or output parameter named before they became enums
/// (other names are returned as they are).
pub fn io_path(old: &str) -> String {
    match old {
        "embedding.weight" => "embedding.Plain.weight".into(),
        "output_bias" => "output.Tied".into(),
        "output.weight" => "output.Linear.weight".into(),
        "output.bias" => "output.Linear.bias".into(),
        _ => old.to_string(),
    }
}

/// The stack's name of a parameter of the Reformer model from before the stack:
/// `blocks.i.{norm_attention, norm_ff}` → `layers.i.block.…`, `blocks.i.attention` →
/// `layers.i.attention.Hashed`, `blocks.i.ff.{inner, outer}` → `layers.i.block.{ff_in,
/// ff_out}`, `positions` → `axial`, `norm` → `final_norm`, the embedding and the (linear)
/// output as [`io_path`].
pub fn reformer_path(old: &str) -> String {
    let parts: Vec<&str> = old.split('.').collect();
    match parts.as_slice() {
        ["blocks", i, "attention", rest @ ..] => {
            format!("layers.{i}.attention.Hashed.{}", rest.join("."))
        }
        ["blocks", i, "ff", "inner", rest @ ..] => {
            format!("layers.{i}.block.ff_in.{}", rest.join("."))
        }
        ["blocks", i, "ff", "outer", rest @ ..] => {
            format!("layers.{i}.block.ff_out.{}", rest.join("."))
        }
        ["blocks", i, rest @ ..] => format!("layers.{i}.block.{}", rest.join(".")),
        ["positions", rest @ ..] => format!("axial.{}", rest.join(".")),
        ["norm", rest @ ..] => format!("final_norm.{}", rest.join(".")),
        _ => io_path(old),
    }
}

/// Whether a record's names are the Reformer model's from before the stack.
fn is_reformer_layout(names: &[String]) -> bool {
    names.iter().any(|n| n.starts_with("blocks."))
}

/// Whether a record's names are the layer stack's (its layers' attention is an enum), so that
/// only [`io_path`] applies.
fn is_stack_layout(names: &[String]) -> bool {
    names.iter().any(|n| {
        n.split('.')
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0] == "attention" && matches!(w[1], "Relative" | "Knn" | "Hashed"))
    })
}

/// The new name, inside a relative attention of scheme `kind`, of its old parameter `rest`.
fn scheme_path(rest: &[&str], kind: PositionKind) -> Option<String> {
    let tail = |from: usize| rest[from..].join(".");
    let joined = rest.join(".");
    Some(match (rest.first()?, kind) {
        (&"r_net", PositionKind::Xl) => format!("scheme.Xl.r_net.{}", tail(1)),
        (&"xl_biases", PositionKind::Xl) => format!("scheme.Xl.biases.{}", tail(1)),
        (&"rel_embedding", PositionKind::Learned) => "scheme.Learned.embedding".into(),
        (&"query_bias", PositionKind::Learned) => "scheme.Learned.query_bias".into(),
        (&"rel_bias", PositionKind::Learned) => "scheme.Learned.key_bias".into(),
        (&"rel_bias", PositionKind::T5) => "scheme.T5.bias".into(),
        _ => joined,
    })
}

/// Loads a checkpoint file of an older layout (before the layer stack, before the
/// embedding and output enums, or the Reformer's own model) into `model` (which fixes the
/// architecture), renaming every parameter with [`legacy_path`]. Every parameter of `model`
/// must be found (nothing is left at its initial value); an old parameter with no place in
/// the stack is an error naming it, except the unused shared `u`/`v` old non-XL stacks held.
pub fn load_legacy(model: TransformerXl, path: &Path) -> Result<TransformerXl, XlError> {
    let fail = |m: String| XlError::Input(format!("{}: {m}", path.display()));
    let kinds: Vec<LayerKind> = model.layers.iter().map(|l| l.attention.kind()).collect();
    // The names the stack expects.
    let ours = model
        .clone()
        .into_record()
        .into_bytes()
        .map_err(|e| fail(format!("{e}")))?;
    let ours = Reader::from_bytes(ours).map_err(|e| fail(format!("{e}")))?;
    let expected: Vec<String> = ours.tensor_names().iter().map(|s| s.to_string()).collect();
    let old = Reader::from_file(path).map_err(|e| fail(format!("{e}")))?;
    let names: Vec<String> = old.tensor_names().iter().map(|s| s.to_string()).collect();
    let stack = is_stack_layout(&names);
    let reformer = is_reformer_layout(&names);
    let mut tensors = Vec::new();
    for t in old.into_tensors().map_err(|e| fail(format!("{e}")))? {
        let (name, dtype, shape, id, bytes) = t.into_parts().map_err(|e| fail(format!("{e}")))?;
        let new = if reformer {
            Some(reformer_path(&name))
        } else if stack {
            Some(io_path(&name))
        } else {
            legacy_path(&name, &kinds)
        };
        match new {
            Some(new) if expected.contains(&new) => {
                tensors.push(PackTensor::new(new, dtype, shape, id, bytes));
            }
            Some(new) => {
                return Err(fail(format!(
                    "parameter {name} (as {new}) has no place in this model (layers {kinds:?})"
                )));
            }
            None => {} // unused by the old model too (see `legacy_path`)
        }
    }
    let bytes = Writer::new(tensors)
        .into_bytes()
        .map_err(|e| fail(format!("{e}")))?;
    let record = ModuleRecord::from_bytes(bytes).map_err(|e| fail(format!("{e}")))?;
    model
        .try_load_record(record)
        .map_err(|e| fail(format!("{e}")))
}

/// Loads a checkpoint file of either layout into `model`: the current one, else the layout
/// before the layer stack (converted on the fly; `Ok((model, true))`).
pub fn load_any(model: TransformerXl, path: &Path) -> Result<(TransformerXl, bool), XlError> {
    match model.clone().try_load_file(path) {
        Ok(m) => Ok((m, false)),
        Err(current) => match load_legacy(model, path) {
            Ok(m) => Ok((m, true)),
            Err(legacy) => Err(XlError::Input(format!(
                "{} does not fit this model: {current}; read as a checkpoint from before the \
                 layer stack: {legacy}",
                path.display()
            ))),
        },
    }
}

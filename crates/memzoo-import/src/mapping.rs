//! The one mapping module: how a peer's tensors go into memzoo's modules and back, shared by
//! every [`crate::format::PeerFormat`].
//!
//! PyTorch stores a linear layer's weight as `[out, in]`, Burn as `[in, out]`; PyTorch's
//! LayerNorm calls its gain and shift `weight` and `bias`, Burn `gamma` and `beta`. Both
//! directions of that convention live here:
//!
//! - in: [`linear`], [`norm`] and [`param`] take a tensor out of the checkpoint
//!   ([`TensorMap`]), with the shape the module built from the stack config has (so a tensor
//!   of another shape is an error naming it), and put it in place; [`set`] is the one place a
//!   parameter of a memzoo module is replaced, checking the new value's shape against it.
//! - out: [`put`], [`put_linear`], [`put_norm`] write a module's values or gradients
//!   ([`Source`]) under the peer's names ([`PeerTensors`]).
//! - where names alone suffice — a tied copy, which a peer's state dict holds under a second
//!   name — [`tied_copies`] maps them with burn-store's [`KeyRemapper`], Burn's own key
//!   remapping, and checks each copy against the tensor it duplicates.
//!
//! The files around the tensors are here too: [`locate`] and [`model_dir`] find a checkpoint's
//! weight file, [`read_json`] its `config.json`, [`read_rotations`] the Reformer peers' fixed
//! LSH rotations, and [`write_checkpoint`] writes an export.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use burn_store::KeyRemapper;
use memzoo_reformer::ReformerAttention;
use memzoo_stack::{
    LayerAttention, Norm, NormKind, Randomness, Residual, TransformerXl, XlBlock, XlConfig, XlError,
};
use serde::de::DeserializeOwned;

use crate::error::ImportError;
use crate::reader::TensorMap;

/// A peer's tensors by its state-dict names: what an export writes, and what the parity tests
/// compare (values or gradients).
pub type PeerTensors = BTreeMap<String, TensorData>;

/// Where the values of a peer-named map come from: the parameters themselves, or their
/// gradients in `grads` (for parity tests).
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// The parameters' values.
    Values,
    /// The parameters' gradients (a parameter without one is left out).
    Gradients(&'a GradientsParams),
}

impl Source<'_> {
    /// The value or gradient of `p` (`None`: a parameter without a gradient).
    pub fn get<const D: usize>(&self, p: &Param<Tensor<D>>) -> Option<Tensor<D>> {
        match self {
            Source::Values => Some(p.val()),
            Source::Gradients(g) => g.get::<D>(p.id),
        }
    }
}

// ---------------------------------------------------------------------------------------
// In: checkpoint tensors into memzoo's modules.

/// Replaces `param` by `value` — the one place an importer writes a parameter of a memzoo
/// module. `value` must have the parameter's shape (the stack config fixes it); an error names
/// the checkpoint's tensor `name` it came from.
pub fn set<const D: usize>(
    param: &mut Param<Tensor<D>>,
    value: Tensor<D>,
    name: &str,
) -> Result<(), ImportError> {
    let (want, got) = (param.dims(), value.dims());
    if want != got {
        return Err(ImportError::Shape {
            name: name.to_string(),
            found: got.to_vec(),
            expected: want.to_vec(),
        });
    }
    *param = Param::from_tensor(value);
    Ok(())
}

/// Takes `name` of the shape of `param` and puts it in place.
pub fn param<const D: usize>(
    map: &mut TensorMap,
    name: &str,
    param: &mut Param<Tensor<D>>,
    device: &Device,
) -> Result<(), ImportError> {
    let value = map.float(name, param.dims(), device)?;
    set(param, value, name)
}

/// A PyTorch linear weight `[out, in]` as Burn's `[in, out]`.
pub fn from_torch(weight: Tensor<2>) -> Tensor<2> {
    weight.transpose()
}

/// Sets `linear`'s weight to `weight` (Burn's `[in, out]`, e.g. a slice of a fused
/// projection) and its bias to `bias` (`None`: the peer's layer has none).
pub fn set_linear(
    linear: &mut Linear,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    name: &str,
) -> Result<(), ImportError> {
    set(&mut linear.weight, weight, name)?;
    linear.bias = bias.map(Param::from_tensor);
    Ok(())
}

/// Takes PyTorch's linear layer `{prefix}.weight` (`[out, in]`, the shape `linear` implies) and,
/// with `bias`, `{prefix}.bias`, into `linear` (without: the layer has no bias).
pub fn linear(
    map: &mut TensorMap,
    prefix: &str,
    linear: &mut Linear,
    bias: bool,
    device: &Device,
) -> Result<(), ImportError> {
    let [d_in, d_out] = linear.weight.dims();
    let name = format!("{prefix}.weight");
    let weight = from_torch(map.float(&name, [d_out, d_in], device)?);
    let bias = if bias {
        Some(map.float(&format!("{prefix}.bias"), [d_out], device)?)
    } else {
        None
    };
    set_linear(linear, weight, bias, &name)
}

/// Takes PyTorch's LayerNorm `{prefix}.weight` and `{prefix}.bias` into `norm`'s gain and
/// shift (an RMSNorm: `{prefix}.weight` alone).
pub fn norm(
    map: &mut TensorMap,
    prefix: &str,
    norm: &mut Norm,
    device: &Device,
) -> Result<(), ImportError> {
    param(map, &format!("{prefix}.weight"), &mut norm.gamma, device)?;
    if norm.kind == NormKind::Rms {
        return Ok(());
    }
    let name = format!("{prefix}.bias");
    let shift = map.float(&name, norm.gamma.dims(), device)?;
    norm.beta = Some(Param::from_tensor(shift));
    Ok(())
}

/// Takes an embedding table `name` (`[vocabulary, width]`) into `embedding`.
pub fn embedding(
    map: &mut TensorMap,
    name: &str,
    embedding: &mut Embedding,
    device: &Device,
) -> Result<(), ImportError> {
    param(map, name, &mut embedding.weight, device)
}

/// Takes the tied copies out of `map`: tensors a peer's state dict holds under a second name
/// (one storage in PyTorch: a block list kept twice, a bias under two module paths), found by
/// their names alone. Each rule (`(regex, replacement)`, `$1` for a group) names, for a copy,
/// the tensor it duplicates; the renaming is burn-store's [`KeyRemapper`], Burn's own key
/// remapping. A copy whose original is in `map` must equal it (else an error naming both) and
/// is dropped; a copy whose original is not there takes the original's name (a file that kept
/// only that name of the pair).
pub fn tied_copies<S: AsRef<str>>(
    map: &mut TensorMap,
    rules: &[(S, S)],
) -> Result<(), ImportError> {
    let rules = rules.iter().map(|(from, to)| (from.as_ref(), to.as_ref()));
    let remapper = KeyRemapper::from_pattern_iter(rules)
        .map_err(|e| ImportError::Unsupported(format!("a tied-copy rule is not a pattern: {e}")))?;
    let patterns = remapper.to_regex_pairs();
    let copies: Vec<String> = map
        .names()
        .filter(|n| patterns.iter().any(|(re, _)| re.is_match(n)))
        .map(String::from)
        .collect();
    let snapshots = copies
        .iter()
        .filter_map(|n| {
            Some(burn_store::bridge::from_data(
                map.remove(n)?,
                n.clone(),
                None,
            ))
        })
        .collect();
    let (renamed, names) = remapper.remap(snapshots);
    for (tensor, (original, copy)) in renamed.into_iter().zip(names) {
        let data = burn_store::bridge::into_data(tensor).map_err(|e| ImportError::Value {
            name: copy.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        let data = crate::reader::float_data(&copy, data)?;
        match map.get(&original) {
            Some(kept) => {
                let kept = crate::reader::float_data(&original, kept.clone())?;
                if kept != data {
                    return Err(ImportError::Value {
                        name: copy,
                        message: format!(
                            "differs from {original}, the tensor it is tied to (one storage in \
                             PyTorch)"
                        ),
                    });
                }
            }
            None => map.insert(original, data),
        }
    }
    Ok(())
}

/// A layer's residual block in a peer's state dict: the names (without `.weight` / `.bias`)
/// of its two norms and its feed-forward's two linear layers (with a bias where the block has
/// one, `compat.ff_bias`), memzoo's [`XlBlock`]. Both directions use it: [`take`](Self::take) and
/// [`put`](Self::put).
pub struct BlockNames {
    /// The norm before (pre-LN) or after (post-LN) the attention.
    pub norm_attention: String,
    /// The norm of the feed-forward branch.
    pub norm_ff: String,
    /// The feed-forward's first layer (`d_model → d_inner`).
    pub ff_in: String,
    /// Its second layer (`d_inner → d_model`).
    pub ff_out: String,
}

impl BlockNames {
    /// Takes the block's tensors (a weight and, where `block` has one, a bias each) into
    /// `block`.
    pub fn take(
        &self,
        map: &mut TensorMap,
        block: &mut XlBlock,
        device: &Device,
    ) -> Result<(), ImportError> {
        norm(map, &self.norm_attention, &mut block.norm_attention, device)?;
        norm(map, &self.norm_ff, &mut block.norm_ff, device)?;
        let (b_in, b_out) = (block.ff_in.bias.is_some(), block.ff_out.bias.is_some());
        linear(map, &self.ff_in, &mut block.ff_in, b_in, device)?;
        linear(map, &self.ff_out, &mut block.ff_out, b_out, device)
    }

    /// `block`'s values (or gradients) under these names.
    pub fn put(&self, out: &mut PeerTensors, block: &XlBlock, src: Source<'_>) {
        put_norm(out, &self.norm_attention, &block.norm_attention, src);
        put_norm(out, &self.norm_ff, &block.norm_ff, src);
        put_linear(out, &self.ff_in, &block.ff_in, src);
        put_linear(out, &self.ff_out, &block.ff_out, src);
    }
}

// ---------------------------------------------------------------------------------------
// Out: memzoo's modules under a peer's names.

/// Inserts `t` under `name` (nothing when `None`: a parameter without a gradient).
pub fn put<const D: usize>(out: &mut PeerTensors, name: String, t: Option<Tensor<D>>) {
    if let Some(t) = t {
        out.insert(name, t.into_data());
    }
}

/// `linear` as PyTorch's `{prefix}.weight` (`[out, in]`) and `{prefix}.bias` (if it has one).
pub fn put_linear(out: &mut PeerTensors, prefix: &str, linear: &Linear, src: Source<'_>) {
    put(
        out,
        format!("{prefix}.weight"),
        src.get(&linear.weight).map(|w| w.transpose()),
    );
    if let Some(b) = &linear.bias {
        put(out, format!("{prefix}.bias"), src.get(b));
    }
}

/// `norm` as PyTorch's `{prefix}.weight` and `{prefix}.bias` (an RMSNorm: no bias).
pub fn put_norm(out: &mut PeerTensors, prefix: &str, norm: &Norm, src: Source<'_>) {
    put(out, format!("{prefix}.weight"), src.get(&norm.gamma));
    if let Some(b) = &norm.beta {
        put(out, format!("{prefix}.bias"), src.get(b));
    }
}

// ---------------------------------------------------------------------------------------
// What a peer cannot express.

/// The first of `checks` (`(bad, what)`) that holds, as the error naming it: `{what}: {peer}
/// cannot express it`.
pub fn expressible(checks: &[(bool, &str)], peer: &str) -> Result<(), ImportError> {
    match checks.iter().find(|(bad, _)| *bad) {
        Some((_, what)) => Err(ImportError::Unsupported(format!(
            "{what}: {peer} cannot express it"
        ))),
        None => Ok(()),
    }
}

/// The layer options of recurrent-memory-transformer-pytorch and
/// block-recurrent-transformer-pytorch, which no other peer has, as checks for
/// [`expressible`]: hyper-connections, RMSNorm, GEGLU, bias-free feed-forward, a null
/// key/value, value residuals, learned absolute positions, a scaled embedding gradient, rotary
/// positions, qk-RMSNorm, bias-free LayerNorms, a bias-free output.
pub fn rmt_layer_checks(xl: &XlConfig) -> [(bool, &'static str); 12] {
    let c = &xl.compat;
    [
        (
            xl.layer_kinds().contains(&memzoo_stack::LayerKind::Rotary),
            "rotary layers",
        ),
        (xl.qk_norm.is_some(), "qk_norm"),
        (!c.norm_bias, "compat.norm_bias = false"),
        (
            !c.output_bias && !xl.tie_weights && !xl.is_adaptive(),
            "compat.output_bias = false",
        ),
        (
            xl.residual_streams > 1,
            "residual_streams above 1 (hyper-connections)",
        ),
        (xl.norm == NormKind::Rms, "norm = \"rms\""),
        (
            xl.ff_activation == memzoo_stack::Activation::Geglu,
            "ff_activation = \"geglu\"",
        ),
        (!c.ff_bias, "compat.ff_bias = false"),
        (c.null_key_value, "compat.null_key_value = true"),
        (c.value_residual, "compat.value_residual = true"),
        (xl.learned_positions.is_some(), "learned_positions"),
        (
            c.embedding_gradient_scale != 1.0,
            "compat.embedding_gradient_scale other than 1",
        ),
    ]
}

/// What every Reformer peer's model is, as checks for [`expressible`]: reversible pre-LN
/// layers with a final norm, an untied plain output, unscaled embeddings, no memory across
/// segments, causal LSH without de-duplicated rounds, seeded randomness.
pub fn reformer_checks(xl: &XlConfig) -> [(bool, &'static str); 8] {
    let lsh = &xl.lsh;
    [
        (
            xl.residual != Residual::Reversible,
            "residual other than reversible",
        ),
        (
            !xl.pre_ln || !xl.compat.final_norm,
            "pre_ln and compat.final_norm not both on",
        ),
        (
            xl.tie_weights || xl.is_adaptive(),
            "a tied or adaptive output",
        ),
        (xl.scale_embedding, "scale_embedding = true"),
        (xl.mem_len > 0, "an XL memory (mem_len > 0)"),
        (!lsh.causal, "lsh.causal = false"),
        (lsh.dedup_rounds, "lsh.dedup_rounds = true"),
        (
            xl.randomness != Randomness::Seeded,
            "randomness other than seeded",
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// Fixed LSH rotations (the Reformer peers draw new ones every pass; one pass's, saved beside
// the checkpoint, make an import compute that pass exactly).

/// The file of fixed LSH rotations beside a checkpoint (`layers.{l}` per LSH layer).
pub const ROTATIONS_FILE: &str = "rotations.safetensors";

/// The fixed rotations beside a checkpoint ([`ROTATIONS_FILE`]), if there.
pub fn read_rotations(at: &Located) -> Result<Option<TensorMap>, ImportError> {
    let path = at.beside(ROTATIONS_FILE);
    path.is_file().then(|| TensorMap::read(&path)).transpose()
}

/// Runs `f` with the fixed rotations beside the checkpoint (`None` without
/// [`ROTATIONS_FILE`]), then checks that it took every one of them.
pub fn with_rotations(
    at: &Located,
    f: impl FnOnce(Option<&mut TensorMap>) -> Result<(), ImportError>,
) -> Result<(), ImportError> {
    let mut rotations = read_rotations(at)?;
    f(rotations.as_mut())?;
    rotations.map_or(Ok(()), TensorMap::finish)
}

/// Layer `l`'s fixed rotations (`layers.{l}` of `rotations`, of the shape the layer has) into
/// `att`.
pub fn set_fixed_rotations(
    rotations: &mut TensorMap,
    l: usize,
    att: &mut ReformerAttention,
    device: &Device,
) -> Result<(), ImportError> {
    let shape = att
        .fixed_rotations()
        .map(|t| t.dims())
        .ok_or_else(|| XlError::Config(format!("layer {l}: no fixed rotations")))?;
    let t = rotations.float::<4>(&format!("layers.{l}"), shape, device)?;
    att.set_fixed_rotations(t).map_err(XlError::from)?;
    Ok(())
}

/// The LSH layers' fixed rotations as [`ROTATIONS_FILE`]'s tensors (`layers.{l}`).
pub fn rotations_of(model: &TransformerXl) -> PeerTensors {
    let mut out = PeerTensors::new();
    for (l, layer) in model.layers.iter().enumerate() {
        if let LayerAttention::Hashed(att) = &layer.attention
            && let Some(r) = att.fixed_rotations()
        {
            out.insert(format!("layers.{l}"), r.into_data());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Files.

/// Where a checkpoint is: its weight file, and the directory of the files beside it
/// (`config.json`, `rotations.safetensors`).
#[derive(Debug, Clone)]
pub struct Located {
    /// The weight file.
    pub weights: PathBuf,
    /// The directory it is in.
    pub dir: PathBuf,
}

impl Located {
    /// `name` beside the weights.
    pub fn beside(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The weight file of `src`: the file itself, or in a directory the first of `files`, else the
/// directory's only weight file of any name (`*.safetensors`, `*.pth`, `*.pt`, `*.bin`,
/// `*.ckpt`: labml's experiments save `state_dict.pt`). `what` names the peer in the error.
pub fn locate(src: &Path, files: &[&str], what: &str) -> Result<Located, ImportError> {
    if src.is_file() {
        let dir = src.parent().unwrap_or(Path::new(".")).to_path_buf();
        return Ok(Located {
            weights: src.to_path_buf(),
            dir,
        });
    }
    let at = |weights: PathBuf| Located {
        weights,
        dir: src.to_path_buf(),
    };
    if let Some(weights) = files.iter().map(|f| src.join(f)).find(|p| p.is_file()) {
        return Ok(at(weights));
    }
    let read_err = |message: String| ImportError::Read {
        path: src.to_path_buf(),
        message,
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(src)
        .map_err(|e| read_err(e.to_string()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "safetensors" | "pth" | "pt" | "bin" | "ckpt"))
                // Side files are not weights.
                && p.file_name().is_some_and(|n| n != ROTATIONS_FILE)
        })
        .collect();
    found.sort();
    match found.as_slice() {
        [one] => Ok(at(one.clone())),
        [] => Err(read_err(format!(
            "no {what} checkpoint here: looked for {}, or any one *.safetensors, *.pth, *.pt, \
             *.bin or *.ckpt file",
            files.join(", ")
        ))),
        many => Err(read_err(format!(
            "several weight files here ({}): give the one to import as the source",
            many.iter()
                .filter_map(|p| p.file_name()?.to_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// A model directory as HF's `save_pretrained` writes it: `config.json` (required; looked at
/// first) and `model.safetensors`, else `pytorch_model.bin`.
pub fn model_dir(src: &Path) -> Result<Located, ImportError> {
    crate::reader::check_config_file(&src.join("config.json"))?;
    let weights = ["model.safetensors", "pytorch_model.bin"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.is_file())
        .ok_or_else(|| ImportError::NoWeights {
            dir: src.to_path_buf(),
        })?;
    Ok(Located {
        weights,
        dir: src.to_path_buf(),
    })
}

/// A JSON file parsed into `T` (a bounded regular file, [`crate::reader::read_config_text`]);
/// an error names the file and the field.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, ImportError> {
    let text = crate::reader::read_config_text(path)?;
    serde_json::from_str(&text).map_err(|e| ImportError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// [`read_json`] when `path` is a file, else `T::default()` (a config the peer may leave out).
pub fn read_json_or_default<T: DeserializeOwned + Default>(path: &Path) -> Result<T, ImportError> {
    if path.is_file() {
        read_json(path)
    } else {
        Ok(T::default())
    }
}

/// Writes an export: `dir/config.json` (`config`, pretty-printed), `dir/model.safetensors`
/// (`tensors`, f32) and each of `extra` (a file name and its tensors) that is not empty.
pub fn write_checkpoint(
    dir: &Path,
    config: &serde_json::Value,
    tensors: PeerTensors,
    extra: &[(&str, PeerTensors)],
) -> Result<(), ImportError> {
    let write_err = |path: &Path, e: std::io::Error| ImportError::Read {
        path: path.to_path_buf(),
        message: format!("cannot write: {e}"),
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let path = dir.join("config.json");
    let json = serde_json::to_string_pretty(config).map_err(|e| ImportError::Read {
        path: path.clone(),
        message: format!("cannot write: {e}"),
    })?;
    std::fs::write(&path, json).map_err(|e| write_err(&path, e))?;
    crate::reader::write_safetensors(&dir.join("model.safetensors"), tensors)?;
    for (file, tensors) in extra {
        if !tensors.is_empty() {
            crate::reader::write_safetensors(&dir.join(file), tensors.clone())?;
        }
    }
    Ok(())
}

/// `config` as a JSON value (a peer's config: plain fields).
pub fn to_json<T: serde::Serialize>(config: &T) -> Result<serde_json::Value, ImportError> {
    serde_json::to_value(config)
        .map_err(|e| ImportError::Unsupported(format!("a config JSON cannot hold: {e}")))
}

/// Serde defaults shared by the lucidrains packages' constructor arguments (`config.json`
/// fields left out take the package's default).
pub(crate) mod defaults {
    /// `dim_head = 64`.
    pub(crate) fn dim_head() -> usize {
        64
    }
    /// `heads = 8`.
    pub(crate) fn heads() -> usize {
        8
    }
    /// `ff_mult = 4`.
    pub(crate) fn ff_mult() -> f64 {
        4.0
    }
    /// A flag that defaults to on.
    pub(crate) fn yes() -> bool {
        true
    }
}

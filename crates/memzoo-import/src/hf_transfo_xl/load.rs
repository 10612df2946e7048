//! HF's tensors into a [`TransformerXl`]: the layers, the adaptive embedding and log-softmax,
//! and the tied copies a `pytorch_model.bin` holds, checked against what they are tied to.

use burn::tensor::{Device, Tensor};
use memzoo_relative::{PositionParams, XlBiases};
use memzoo_stack::{
    AdaptiveEmbedding, AdaptiveLogSoftmax, AdaptiveLogSoftmaxTensors, InputEmbedding,
    LayerAttention, OutputLayer, TransformerXl, XlConfig, XlError, XlLayer,
};

use super::{HfTransfoXlConfig, block_names};
use crate::error::ImportError;
use crate::mapping;
use crate::reader::TensorMap;

/// Host values of a float tensor (for the tied-copy checks).
fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// Takes `{prefix}r_w_bias` and `{prefix}r_r_bias` (`u`, `v`) into `biases`.
fn biases(
    map: &mut TensorMap,
    prefix: &str,
    biases: &mut XlBiases,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::param(
        map,
        &format!("{prefix}r_w_bias"),
        &mut biases.content,
        device,
    )?;
    mapping::param(
        map,
        &format!("{prefix}r_r_bias"),
        &mut biases.position,
        device,
    )
}

/// The tied copies HF's `state_dict` (a `pytorch_model.bin`; `save_pretrained` leaves them
/// out) holds, as renaming rules for [`mapping::tied_copies`]: names alone say which tensor
/// each duplicates, given the config's ties. The shared `u`/`v` under every layer (without
/// `untie_r`), the softmax's tables (`tie_word_embeddings`: the embedding's), and each tied
/// projection of a projected cluster (`tie_projs`: the embedding's, of cluster 0 when
/// `div_val = 1`).
fn tied_copy_rules(cfg: &HfTransfoXlConfig) -> Vec<(String, String)> {
    let mut rules = Vec::new();
    if !cfg.untie_r {
        rules.push((
            r"^transformer\.layers\.\d+\.dec_attn\.(r_[wr]_bias)$".into(),
            "transformer.$1".into(),
        ));
    }
    if cfg.tie_word_embeddings {
        rules.push((
            r"^crit\.out_layers\.(\d+)\.weight$".into(),
            "transformer.word_emb.emb_layers.$1.weight".into(),
        ));
    }
    if !cfg.is_plain() {
        for (i, tied) in cfg.tie_projs().into_iter().enumerate() {
            if tied && cfg.projected(i) {
                let to = if cfg.div_val == 1 { 0 } else { i };
                rules.push((
                    format!(r"^crit\.out_projs\.{i}$"),
                    format!("transformer.word_emb.emb_projs.{to}"),
                ));
            }
        }
    }
    rules
}

/// Replaces the weights of `layers` (and the shared `u`/`v`) by the checkpoint's.
fn load_layers(
    map: &mut TensorMap,
    cfg: &HfTransfoXlConfig,
    layers: &mut [XlLayer],
    shared: &mut Option<XlBiases>,
    device: &Device,
) -> Result<(), ImportError> {
    let (d, hd) = (cfg.d_model, cfg.n_head * cfg.d_head);
    if !cfg.untie_r {
        let s = shared
            .as_mut()
            .ok_or_else(|| XlError::Config("tied u/v without the shared biases".into()))?;
        biases(map, "transformer.", s, device)?;
    }
    for (l, layer) in layers.iter_mut().enumerate() {
        let p = format!("transformer.layers.{l}.");
        let LayerAttention::Relative(att) = &mut layer.attention else {
            return Err(
                XlError::Config(format!("layer {l} is not a relative-attention layer")).into(),
            );
        };
        // qkv_net: [3 h dh, d] = [W_q; W_k; W_v]
        let name = format!("{p}dec_attn.qkv_net.weight");
        let qkv = map.float(&name, [3 * hd, d], device)?;
        let q = mapping::from_torch(qkv.clone().narrow(0, 0, hd));
        mapping::set_linear(&mut att.query, q, None, &name)?;
        let kv = mapping::from_torch(qkv.narrow(0, hd, 2 * hd));
        mapping::set_linear(&mut att.key_value, kv, None, &name)?;
        mapping::linear(
            map,
            &format!("{p}dec_attn.o_net"),
            &mut att.output,
            false,
            device,
        )?;
        let PositionParams::Xl(xp) = &mut att.scheme else {
            return Err(XlError::Config("XL attention without W_R".into()).into());
        };
        mapping::linear(
            map,
            &format!("{p}dec_attn.r_net"),
            &mut xp.r_net,
            false,
            device,
        )?;
        if cfg.untie_r {
            let own = xp
                .biases
                .as_mut()
                .ok_or_else(|| XlError::Config(format!("layer {l}: untied u/v missing")))?;
            biases(map, &format!("{p}dec_attn."), own, device)?;
        }
        block_names(l).take(map, &mut layer.block, device)?;
    }
    // The sinusoid's frequencies are a buffer HF saves; memzoo computes them.
    let name = "transformer.pos_emb.inv_freq";
    if map.contains(name) {
        let half = d / 2;
        let got = host(map.float::<1>(name, [half], device)?);
        for (k, g) in got.iter().enumerate() {
            let want = 1.0 / 10000f64.powf(2.0 * k as f64 / d as f64);
            if ((*g as f64) - want).abs() > 1e-6 * want.max(1e-30) + 1e-12 {
                return Err(ImportError::Value {
                    name: name.into(),
                    message: format!(
                        "frequency {k} is {g}, memzoo's sinusoid uses 10000^(-2k/d_model) = {want}"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// HF's tensors into `model` (built from `xl`, [`HfTransfoXlConfig::xl_config`]).
pub(super) fn map_in(
    cfg: &HfTransfoXlConfig,
    xl: &XlConfig,
    map: &mut TensorMap,
    model: &mut TransformerXl,
    device: &Device,
) -> Result<(), ImportError> {
    mapping::tied_copies(map, &tied_copy_rules(cfg))?;
    load_layers(
        map,
        cfg,
        &mut model.layers,
        &mut model.shared_biases,
        device,
    )?;
    if !cfg.is_plain() {
        let (embedding, softmax) = adaptive_from(cfg, xl, map, device)?;
        model.embedding = InputEmbedding::Adaptive(embedding);
        model.output = OutputLayer::Adaptive(softmax);
        return Ok(());
    }
    let InputEmbedding::Plain(embedding) = &mut model.embedding else {
        return Err(XlError::Config("a plain config built an adaptive embedding".into()).into());
    };
    let table_name = "transformer.word_emb.emb_layers.0.weight";
    mapping::embedding(map, table_name, embedding, device)?;
    match &mut model.output {
        // The tied copy of the table is checked with the others (`tied_copy_rules`).
        OutputLayer::Tied(b) => mapping::param(map, "crit.out_layers.0.bias", b, device)?,
        OutputLayer::Linear(output) => {
            mapping::linear(map, "crit.out_layers.0", output, true, device)?;
        }
        OutputLayer::Adaptive(_) => {
            return Err(XlError::Config("a plain config built an adaptive output".into()).into());
        }
    }
    Ok(())
}

/// The adaptive embedding and softmax of an adaptive checkpoint: owned tensors taken, tied
/// copies checked against the embedding's.
fn adaptive_from(
    cfg: &HfTransfoXlConfig,
    xl: &XlConfig,
    map: &mut TensorMap,
    device: &Device,
) -> Result<(AdaptiveEmbedding, AdaptiveLogSoftmax), ImportError> {
    let emb_cfg = xl.adaptive_embedding();
    let bounds = emb_cfg.validate()?;
    let n = bounds.len() - 1;
    let width = |i: usize| cfg.width(i);
    let size = |i: usize| bounds[i + 1] - bounds[i];
    let n_tables = if cfg.div_val == 1 { 1 } else { n };
    let table_rows = |i: usize| {
        if cfg.div_val == 1 {
            cfg.vocab_size
        } else {
            size(i)
        }
    };
    let mut tables = Vec::with_capacity(n_tables);
    let mut projections = Vec::with_capacity(n_tables);
    for i in 0..n_tables {
        let p = "transformer.word_emb.";
        tables.push(map.float(
            &format!("{p}emb_layers.{i}.weight"),
            [table_rows(i), width(i)],
            device,
        )?);
        projections.push(if cfg.projected(i) {
            Some(
                map.float(
                    &format!("{p}emb_projs.{i}"),
                    [cfg.d_model, width(i)],
                    device,
                )?
                .transpose(),
            )
        } else {
            None
        });
    }
    let embedding = AdaptiveEmbedding::from_tensors(&emb_cfg, tables.clone(), projections.clone())?;

    // The softmax: owned tensors taken, tied copies checked against the embedding's.
    let sm_cfg = xl.adaptive_softmax();
    let tie_projs = cfg.tie_projs();
    let (v, de, dp) = (cfg.vocab_size, cfg.d_embed, cfg.d_model);
    let clusters = n - 1;
    let (cluster_weight, cluster_bias) = if clusters > 0 {
        (
            Some(map.float("crit.cluster_weight", [clusters, de], device)?),
            Some(map.float("crit.cluster_bias", [clusters], device)?),
        )
    } else {
        (None, None)
    };
    let mut out = AdaptiveLogSoftmaxTensors {
        cluster_weight,
        cluster_bias,
        biases: Vec::with_capacity(n),
        tables: Vec::new(),
        projections: Vec::with_capacity(n),
    };
    if cfg.div_val == 1 {
        // One output layer over the whole vocabulary, split at the cutoffs.
        let bias = map.float::<1>("crit.out_layers.0.bias", [v], device)?;
        out.biases = (0..n)
            .map(|i| bias.clone().narrow(0, bounds[i], size(i)))
            .collect();
        // A tied table's copy was checked with the others (`tied_copy_rules`).
        if !cfg.tie_word_embeddings {
            let w = map.float::<2>("crit.out_layers.0.weight", [v, de], device)?;
            out.tables = (0..n)
                .map(|i| w.clone().narrow(0, bounds[i], size(i)))
                .collect();
        }
    } else {
        for i in 0..n {
            let p = format!("crit.out_layers.{i}.");
            out.biases
                .push(map.float(&format!("{p}bias"), [size(i)], device)?);
            if !cfg.tie_word_embeddings {
                out.tables
                    .push(map.float(&format!("{p}weight"), [size(i), width(i)], device)?);
            }
        }
    }
    for i in 0..n {
        let name = format!("crit.out_projs.{i}");
        let tied = tie_projs.get(i).copied().unwrap_or(false);
        if !cfg.projected(i) {
            out.projections.push(None);
            if map.contains(&name) {
                return Err(ImportError::Value {
                    name,
                    message: format!("present, but d_embed = d_model = {dp} needs no projection"),
                });
            }
        } else if tied {
            // The embedding's projection; its copy was checked (`tied_copy_rules`).
            out.projections.push(None);
        } else {
            out.projections
                .push(Some(map.float(&name, [dp, width(i)], device)?.transpose()));
        }
    }
    let softmax = AdaptiveLogSoftmax::from_tensors(&sm_cfg, out, device)?;
    Ok((embedding, softmax))
}

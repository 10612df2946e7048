//! A [`TransformerXl`]'s tensors under HF's names, and the state dict HF's `save_pretrained`
//! writes.

use burn::tensor::{Tensor, TensorData};
use memzoo_relative::{PositionParams, XlBiases};
use memzoo_stack::{
    AdaptiveEmbedding, AdaptiveLogSoftmax, InputEmbedding, OutputLayer, TransformerXl, XlLayer,
};

use super::{HfTransfoXlConfig, block_names};
use crate::mapping::{PeerTensors, Source, put};

/// The layers' tensors under HF's names (`transformer.layers.*`, the `u`/`v` biases).
fn layers_to_hf(
    out: &mut PeerTensors,
    layers: &[XlLayer],
    shared: Option<&XlBiases>,
    src: Source<'_>,
) {
    if let Some(s) = shared {
        for (name, p) in [("r_w_bias", &s.content), ("r_r_bias", &s.position)] {
            put(out, format!("transformer.{name}"), src.get(p));
            for l in 0..layers.len() {
                put(
                    out,
                    format!("transformer.layers.{l}.dec_attn.{name}"),
                    src.get(p),
                );
            }
        }
    }
    let tr = |t: Option<Tensor<2>>| t.map(|t| t.transpose());
    for (l, layer) in layers.iter().enumerate() {
        let p = format!("transformer.layers.{l}.");
        let Some(att) = layer.attention.relative() else {
            continue;
        };
        let qkv = match (src.get(&att.query.weight), src.get(&att.key_value.weight)) {
            (Some(q), Some(kv)) => Some(Tensor::cat(vec![q.transpose(), kv.transpose()], 0)),
            _ => None,
        };
        put(out, format!("{p}dec_attn.qkv_net.weight"), qkv);
        put(
            out,
            format!("{p}dec_attn.o_net.weight"),
            tr(src.get(&att.output.weight)),
        );
        let xp = match &att.scheme {
            PositionParams::Xl(xp) => Some(xp),
            _ => None,
        };
        if let Some(xp) = xp {
            put(
                out,
                format!("{p}dec_attn.r_net.weight"),
                tr(src.get(&xp.r_net.weight)),
            );
        }
        if let Some(b) = xp.and_then(|xp| xp.biases.as_ref()) {
            put(out, format!("{p}dec_attn.r_w_bias"), src.get(&b.content));
            put(out, format!("{p}dec_attn.r_r_bias"), src.get(&b.position));
        }
        block_names(l).put(out, &layer.block, src);
    }
}

/// A [`TransformerXl`]'s tensors (or gradients) under HF's names, tied copies included (as
/// HF's `state_dict` names them: `crit.out_layers.i.weight` is the embedding's table when
/// tied, and so on). Layers other than XL relative attention are left out.
pub fn transformer_xl_to_hf(model: &TransformerXl, src: Source<'_>) -> PeerTensors {
    let mut out = PeerTensors::new();
    layers_to_hf(&mut out, &model.layers, model.shared_biases.as_ref(), src);
    match (&model.embedding, &model.output) {
        (InputEmbedding::Adaptive(emb), OutputLayer::Adaptive(sm)) => {
            adaptive_to_hf(&mut out, emb, sm, src)
        }
        (InputEmbedding::Plain(emb), output) => {
            let table = src.get(&emb.weight);
            put(
                &mut out,
                "transformer.word_emb.emb_layers.0.weight".into(),
                table.clone(),
            );
            match output {
                OutputLayer::Linear(output) => {
                    put(
                        &mut out,
                        "crit.out_layers.0.weight".into(),
                        src.get(&output.weight).map(|w| w.transpose()),
                    );
                    if let Some(b) = &output.bias {
                        put(&mut out, "crit.out_layers.0.bias".into(), src.get(b));
                    }
                }
                OutputLayer::Tied(bias) => {
                    put(&mut out, "crit.out_layers.0.weight".into(), table);
                    put(&mut out, "crit.out_layers.0.bias".into(), src.get(bias));
                }
                OutputLayer::Adaptive(_) => {}
            }
        }
        (InputEmbedding::Adaptive(_), _) => {}
    }
    out
}

fn adaptive_to_hf(
    out: &mut PeerTensors,
    emb: &AdaptiveEmbedding,
    sm: &AdaptiveLogSoftmax,
    src: Source<'_>,
) {
    let div1 = emb.div_val() == 1;
    for (i, t) in emb.tables().iter().enumerate() {
        put(
            out,
            format!("transformer.word_emb.emb_layers.{i}.weight"),
            src.get(t),
        );
    }
    for (i, p) in emb.projections().iter().enumerate() {
        if let Some(p) = p {
            put(
                out,
                format!("transformer.word_emb.emb_projs.{i}"),
                src.get(p).map(|t| t.transpose()),
            );
        }
    }
    if let Some(w) = sm.cluster_weight() {
        put(out, "crit.cluster_weight".into(), src.get(w));
    }
    if let Some(b) = sm.cluster_bias() {
        put(out, "crit.cluster_bias".into(), src.get(b));
    }
    let biases: Vec<Option<Tensor<1>>> = sm.biases().iter().map(|b| src.get(b)).collect();
    if div1 {
        if biases.iter().all(Option::is_some) {
            let all = Tensor::cat(biases.into_iter().flatten().collect(), 0);
            put(out, "crit.out_layers.0.bias".into(), Some(all));
        }
    } else {
        for (i, b) in biases.into_iter().enumerate() {
            put(out, format!("crit.out_layers.{i}.bias"), b);
        }
    }
    // Output tables: the embedding's when tied.
    let tables: Vec<Option<Tensor<2>>> = if sm.tables().is_empty() {
        emb.tables().iter().map(|t| src.get(t)).collect()
    } else {
        let own: Vec<Option<Tensor<2>>> = sm.tables().iter().map(|t| src.get(t)).collect();
        if div1 && own.iter().all(Option::is_some) {
            vec![Some(Tensor::cat(own.into_iter().flatten().collect(), 0))]
        } else {
            own
        }
    };
    for (i, t) in tables.into_iter().enumerate() {
        put(out, format!("crit.out_layers.{i}.weight"), t);
    }
    for (i, p) in sm.projections().iter().enumerate() {
        let t = match p {
            Some(p) => src.get(p),
            None => emb.projections()[if div1 { 0 } else { i }]
                .as_ref()
                .and_then(|p| src.get(p)),
        };
        put(out, format!("crit.out_projs.{i}"), t.map(|t| t.transpose()));
    }
}

/// The tensors HF's `save_pretrained` writes for this model: [`transformer_xl_to_hf`]'s
/// values without the tied copies (`crit.out_layers.i.weight` when tied, tied
/// `crit.out_projs.i`, the layers' copies of shared `u`/`v`), plus the sinusoid's
/// `transformer.pos_emb.inv_freq` buffer (`10000^(-2k/d_model)`).
pub fn hf_state_dict(model: &TransformerXl, config: &HfTransfoXlConfig) -> PeerTensors {
    let mut out = transformer_xl_to_hf(model, Source::Values);
    let n = config.cutoffs.len() + 1;
    let tie_projs = config.tie_projs();
    for i in 0..n {
        if config.tie_word_embeddings {
            out.remove(&format!("crit.out_layers.{i}.weight"));
        }
        if tie_projs.get(i).copied().unwrap_or(false) {
            out.remove(&format!("crit.out_projs.{i}"));
        }
    }
    if !config.untie_r {
        for l in 0..config.n_layer {
            for name in ["r_w_bias", "r_r_bias"] {
                out.remove(&format!("transformer.layers.{l}.dec_attn.{name}"));
            }
        }
    }
    let d = config.d_model;
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|k| (1.0 / 10000f64.powf(2.0 * k as f64 / d as f64)) as f32)
        .collect();
    out.insert(
        "transformer.pos_emb.inv_freq".into(),
        TensorData::new(inv_freq, [d / 2]),
    );
    out
}

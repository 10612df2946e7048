//! [`XlConfig::validate`]: every field checked, the bad value named.

use super::*;
use crate::error::XlError;

impl XlConfig {
    /// Checks every field, naming the bad value.
    pub fn validate(&self) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        positive(&[
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_inner", self.d_inner),
        ])?;
        if self.d_head.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!(
                "d_model ({}) is not divisible by n_heads ({}); set d_head explicitly or change one",
                self.d_model, self.n_heads
            ));
        }
        if let Some(c) = &self.compressive {
            c.validate(self)?;
        }
        if let Some(r) = &self.rmt {
            r.validate(self)?;
        }
        if let Some(r) = &self.block_recurrent {
            r.validate(self)?;
        }
        if self.d_head == Some(0) {
            return bad("d_head must be positive, got 0".into());
        }
        if !self.train_memory_lengths.is_empty() {
            let other = [
                (self.compressive.is_some(), "a compressive stack"),
                (self.rmt.is_some(), "an RMT stack"),
                (self.block_recurrent.is_some(), "a Block-Recurrent stack"),
                (self.residual == Residual::Reversible, "a reversible stack"),
            ];
            if let Some((_, what)) = other.iter().find(|(is, _)| *is) {
                return bad(format!(
                    "train_memory_lengths is for sequential XL stacks, not {what}"
                ));
            }
        }
        if self.same_length && self.mem_len == 0 {
            return bad("same_length needs mem_len > 0 (every query sees mem_len keys)".into());
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return bad(format!("init_std must be positive, got {}", self.init_std));
        }
        if let Some(std) = self.embedding_std
            && !(std.is_finite() && std > 0.0)
        {
            return bad(format!("embedding_std must be positive, got {std}"));
        }
        if let Some(std) = self.norm_gain_std
            && !(std.is_finite() && std >= 0.0)
        {
            return bad(format!("norm_gain_std must be non-negative, got {std}"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout must be in [0, 1), got {}", self.dropout));
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0) {
            return bad(format!(
                "layer_norm_epsilon must be positive, got {}",
                self.layer_norm_epsilon
            ));
        }
        if self.is_adaptive() {
            self.adaptive_embedding().validate()?;
            self.adaptive_softmax().validate()?;
        } else if self.tie_projs.iter().any(|&t| t) {
            return bad(format!(
                "tie_projs = {:?} ties projections, but the stack is not adaptive (no cutoffs, \
                 div_val 1, d_embed = d_model): there are none",
                self.tie_projs
            ));
        }
        if !self.layers.is_empty() && self.layers.len() != self.n_layers {
            return bad(format!(
                "layers lists {} kinds ({:?}) for n_layers = {}",
                self.layers.len(),
                self.layers,
                self.n_layers
            ));
        }
        let kinds = self.layer_kinds();
        self.validate_peer_layers(&kinds)?;
        let hashed: Vec<LayerKind> = [LayerKind::Lsh, LayerKind::Local]
            .into_iter()
            .filter(|k| kinds.contains(k))
            .collect();
        if let Some(kind) = hashed.first() {
            // LSH and local layers attend over cat(memory, x) as one causal sequence: they
            // cannot hide part of the memory per row or per query.
            if self.same_length {
                return bad(format!(
                    "same_length = true is not supported with {kind:?} layers (they see all of \
                     cat(memory, segment) causally): set it to false"
                ));
            }
            if self.document_resets {
                return bad(format!(
                    "document_resets = true is not supported with {kind:?} layers (they cannot \
                     hide a finished document's memory per row): set it to false"
                ));
            }
        }
        if self.compat.memory_keys_values {
            let why = if kinds
                .iter()
                .any(|k| k.positions().is_none() && *k != LayerKind::Knn)
            {
                Some(format!(
                    "layers {kinds:?} include LSH / local ones, which cache no keys"
                ))
            } else if self.residual == Residual::Reversible {
                Some("residual = \"reversible\" caches the x_2 stream".into())
            } else if self.compat.zero_first_memory {
                Some("compat.zero_first_memory = true starts from zero layer inputs".into())
            } else {
                None
            };
            if let Some(why) = why {
                return bad(format!(
                    "compat.memory_keys_values = true is not supported here: {why}; set it to false"
                ));
            }
        }
        if self.compat.shared_t5
            && !kinds
                .iter()
                .any(|k| matches!(k, LayerKind::T5 | LayerKind::Knn))
        {
            return bad(format!(
                "compat.shared_t5 = true, but no layer of {kinds:?} reads a T5 table (t5 or knn)"
            ));
        }
        if kinds.contains(&LayerKind::Knn) {
            if self.same_length {
                // kNN layers attend under a plain causal mask; accepting the flag would
                // silently train another model than asked for.
                return bad(
                    "same_length = true is not supported with knn layers (they attend under a \
                     plain causal mask): set it to false"
                        .into(),
                );
            }
            if kinds.iter().all(|&k| k == LayerKind::Knn) {
                return bad(format!(
                    "all {} layers are knn layers; at least one must be a relative-attention layer",
                    kinds.len()
                ));
            }
            let knn = &self.knn;
            if knn.top_k == 0 {
                return bad("knn.top_k must be positive, got 0".into());
            }
            if knn.top_k > knn.max_memories {
                return bad(format!(
                    "knn.top_k ({}) exceeds knn.max_memories ({})",
                    knn.top_k, knn.max_memories
                ));
            }
            self.knn_attention().validate()?;
            self.knn_memory().validate()?;
        }
        for kind in kinds.iter().filter_map(|k| k.positions()) {
            self.attention(kind).validate()?;
        }
        for kind in [LayerKind::Lsh, LayerKind::Local] {
            if kinds.contains(&kind) {
                self.reformer_attention(kind)
                    .validate()
                    .map_err(|e| XlError::Config(format!("{kind:?} layers: {e}")))?;
            }
        }
        if self.compat.head_input == HeadInput::Concat
            && (self.residual != Residual::Reversible || self.is_adaptive() || self.tie_weights)
        {
            return bad(format!(
                "compat.head_input = \"concat\" reads the two streams of residual = \"reversible\" into a \
                 linear output of 2 d_model inputs: it needs residual = \"reversible\" (got {:?}), \
                 tie_weights = false and no adaptive output",
                self.residual
            ));
        }
        if kinds.contains(&LayerKind::Absolute) {
            // Absolute positions index one segment: a memory's keys would repeat the
            // positions of the segment's (the reason Transformer-XL made them relative).
            if kinds.iter().any(|&k| k != LayerKind::Absolute) {
                return bad(format!(
                    "absolute layers add positions to the embeddings, which every layer then \
                     reads: all layers must be absolute, got {kinds:?}"
                ));
            }
            if self.mem_len > 0 {
                return bad(format!(
                    "absolute positions index the positions of one segment, so with mem_len = \
                     {} the memory's keys would share the positions of the segment's: set \
                     mem_len = 0 (the vanilla Transformer), or use relative positions",
                    self.mem_len
                ));
            }
            if self.axial.is_some() {
                return bad("absolute layers add sinusoidal positions already: drop axial".into());
            }
        }
        if let Some(axial) = &self.axial {
            let ([a1, a2], [d1, d2]) = (axial.shape, axial.dims);
            let widths_fit = if axial.summed {
                d1 == self.d_model && d2 == self.d_model
            } else {
                d1 + d2 == self.d_model
            };
            if a1 == 0 || a2 == 0 || d1 == 0 || d2 == 0 || !widths_fit {
                return bad(format!(
                    "axial shape {:?} must be positive and axial dims ({d1}, {d2}) positive and \
                     {} d_model {}",
                    axial.shape,
                    if axial.summed {
                        "(summed) each"
                    } else {
                        "sum to"
                    },
                    self.d_model
                ));
            }
            if let Some(std) = axial.std
                && !(std.is_finite() && std > 0.0)
            {
                return bad(format!("axial.std must be positive, got {std}"));
            }
            if self.mem_len > 0 {
                return bad(format!(
                    "axial positions index the positions of one segment, so with mem_len = {} \
                     the memory's keys would share the positions of the segment's: set \
                     mem_len = 0, or drop axial and take positions from relative layers",
                    self.mem_len
                ));
            }
        }
        if self.residual == Residual::Reversible {
            if !self.pre_ln {
                return bad(
                    "residual = \"reversible\" needs pre_ln = true: a LayerNorm after \
                            each residual sum (post-LN) cannot be inverted"
                        .into(),
                );
            }
            if self.randomness != Randomness::Seeded {
                return bad(
                    "residual = \"reversible\" needs randomness = \"seeded\": its \
                            backward replays each layer's dropout masks and LSH rotations"
                        .into(),
                );
            }
            if self.dropatt > 0.0
                && kinds
                    .iter()
                    .any(|k| !matches!(k, LayerKind::Lsh | LayerKind::Local))
            {
                return bad(format!(
                    "residual = \"reversible\" with {kinds:?} layers needs dropatt = 0 (got {}): \
                     relative and kNN attention draw their attention dropout from the device \
                     generator, which the reversible backward cannot replay",
                    self.dropatt
                ));
            }
        }
        if self.recompute_attention && self.dropatt > 0.0 {
            return bad(format!(
                "recompute_attention = true needs dropatt = 0 (got {}): the probabilities are \
                 kept or computed again by the fused attention kernel, which runs only without \
                 attention dropout",
                self.dropatt
            ));
        }
        Ok(())
    }
}

/// Each `(name, value)` is positive, else an error naming the first that is 0.
pub(crate) fn positive(fields: &[(&str, usize)]) -> Result<(), XlError> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(XlError::Config(format!("{name} must be positive, got 0"))),
        None => Ok(()),
    }
}

impl XlConfig {
    /// The settings of recurrent-memory-transformer-pytorch's layers (RMSNorm, GEGLU,
    /// hyper-connections, learned absolute positions, a null key/value, value residuals, the
    /// embedding's gradient scale), each against what it needs.
    fn validate_peer_layers(&self, kinds: &[LayerKind]) -> Result<(), XlError> {
        let bad = |m: String| Err(XlError::Config(m));
        let absolute = kinds.iter().all(|&k| k == LayerKind::Absolute);
        if self.norm == NormKind::Rms && self.block_recurrent.is_some() {
            return bad(
                "norm = \"rms\" is not supported with block_recurrent (its recurrent layer's \
                 norms are LayerNorms): set norm = \"layer\""
                    .into(),
            );
        }
        if let Some(q) = &self.qk_norm {
            if !(q.scale.is_finite() && q.scale > 0.0) {
                return bad(format!("qk_norm.scale must be positive, got {}", q.scale));
            }
            if !q.all_layers && self.block_recurrent.is_none() {
                return bad(
                    "qk_norm.all_layers = false normalises the Block-Recurrent layer alone, and \
                     this stack has no block_recurrent: set all_layers = true"
                        .into(),
                );
            }
            if let Some((l, k)) = kinds.iter().enumerate().find(|(l, k)| {
                self.qk_norm_scale(*l).is_some()
                    && !matches!(k, LayerKind::Rotary | LayerKind::Absolute)
            }) {
                return bad(format!(
                    "qk_norm needs rotary or absolute layers where it applies; layer {l} is {k:?}"
                ));
            }
        }
        if self.residual_streams == 0 {
            return bad("residual_streams must be positive, got 0".into());
        }
        if self.residual_streams > 1 {
            let why = if !self.pre_ln {
                Some("pre_ln = false (hyper-connections wrap pre-norm branches)".to_string())
            } else if self.residual != Residual::Sequential {
                Some("residual = \"reversible\"".into())
            } else if self.mem_len != 0 {
                Some(format!(
                    "mem_len = {} (a memory of layer inputs of one stream)",
                    self.mem_len
                ))
            } else if self.block_recurrent.is_some() {
                Some("block_recurrent".into())
            } else {
                None
            };
            if let Some(why) = why {
                return bad(format!(
                    "residual_streams = {} (hyper-connections) is not supported with {why}",
                    self.residual_streams
                ));
            }
        }
        if let Some(len) = self.learned_positions {
            if len == 0 {
                return bad("learned_positions must be positive, got 0".into());
            }
            if !absolute {
                return bad(format!(
                    "learned_positions = {len} adds absolute positions to the embedding: all \
                     layers must be absolute, got {kinds:?}"
                ));
            }
        }
        let f = self.compat.embedding_gradient_scale;
        if !(0.0..=1.0).contains(&f) {
            return bad(format!(
                "compat.embedding_gradient_scale must be in [0, 1], got {f}"
            ));
        }
        for (name, on) in [
            ("compat.null_key_value", self.compat.null_key_value),
            ("compat.value_residual", self.compat.value_residual),
        ] {
            if !on {
                continue;
            }
            if !absolute {
                return bad(format!(
                    "{name} = true needs absolute layers (the null key has no position, the \
                     first layer's values one scheme's context), got {kinds:?}"
                ));
            }
            if self.kv_heads.is_some_and(|h| h != self.n_heads) {
                return bad(format!(
                    "{name} = true needs a key and value per head, got kv_heads = {:?}",
                    self.kv_heads
                ));
            }
        }
        if self.compat.value_residual {
            if self.mem_len != 0 {
                return bad(format!(
                    "compat.value_residual = true mixes the first layer's values of the segment \
                     into the later layers': mem_len must be 0, got {}",
                    self.mem_len
                ));
            }
            if self.residual != Residual::Sequential {
                return bad("compat.value_residual = true needs residual = \"sequential\"".into());
            }
            if self.n_layers < 2 {
                return bad(format!(
                    "compat.value_residual = true needs at least 2 layers, got {}",
                    self.n_layers
                ));
            }
        }
        Ok(())
    }
}

//! Adaptive input embedding (Baevski & Auli 2019, <https://arxiv.org/abs/1809.10853>) and the
//! projected adaptive log-softmax (Grave et al. 2017, <https://arxiv.org/abs/1609.04309>), as
//! Transformer-XL's code and HF's `TransfoXL` use them for large word vocabularies
//! (`transfo-xl-wt103`: 267,735 words, cutoffs 20k / 40k / 200k, `div_val` 4).
//!
//! The vocabulary is cut into clusters at `cutoffs`: cluster `i` holds the ids `[c_i, c_{i+1})`
//! with `c_0 = 0` and a last bound of `vocab_size`. With `div_val = k > 1` cluster `i` has its
//! own table of width `d_i = d_embed / k^i` and a projection `P_i` (`[d_i, d_proj]`) to the
//! model's width; with `div_val = 1` there is one table of width `d_embed` (and one projection
//! when `d_embed != d_proj`), the clusters only split the softmax.
//!
//! Every projection here is stored as `[d_i, d_proj]` (Burn's `Linear` orientation for the input
//! side, the transpose of HF's `emb_projs[i]` / `out_projs[i]`, which are `[d_proj, d_i]`): the
//! embedding computes `e P_i`, the softmax `h P_iᵀ`.
//!
//! Tying (HF's `tie_word_embeddings` and `tie_projs`) is expressed by the softmax *not owning*
//! the tied tensors: [`AdaptiveLogSoftmax::log_probs`] and [`AdaptiveLogSoftmax::nll`] take the
//! [`AdaptiveEmbedding`] and read its tables and projections, so one parameter receives both
//! gradients and an optimizer updates it once.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::error::XlError;

thread_local! {
    /// The widest output (columns per token) an [`AdaptiveLogSoftmax`] computed on this thread
    /// since [`AdaptiveLogSoftmax::take_widest_output`] last read it.
    static WIDEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn record_width(columns: usize) {
    WIDEST.with(|w| w.set(w.get().max(columns)));
}

/// The cluster bounds `[0, cutoffs..., vocab_size]`, checked: strictly increasing, every cluster
/// non-empty, and with `div_val > 1` every cluster's width `d_embed / div_val^i` positive.
fn cluster_bounds(
    vocab_size: usize,
    d_embed: usize,
    cutoffs: &[usize],
    div_val: usize,
) -> Result<Vec<usize>, XlError> {
    let bad = |m: String| Err(XlError::Config(m));
    if vocab_size == 0 || d_embed == 0 {
        return bad(format!(
            "vocab_size ({vocab_size}) and d_embed ({d_embed}) must be positive"
        ));
    }
    if div_val == 0 {
        return bad("div_val must be at least 1, got 0".into());
    }
    let mut bounds = Vec::with_capacity(cutoffs.len() + 2);
    bounds.push(0);
    for &c in cutoffs {
        if c <= *bounds.last().expect("non-empty") || c >= vocab_size {
            return bad(format!(
                "cutoffs {cutoffs:?} must be strictly increasing, positive and below vocab_size ({vocab_size}); {c} is not"
            ));
        }
        bounds.push(c);
    }
    bounds.push(vocab_size);
    if div_val > 1 {
        for i in 0..bounds.len() - 1 {
            if cluster_width(d_embed, div_val, i) == 0 {
                return bad(format!(
                    "cluster {i} would have width d_embed / div_val^{i} = {d_embed} / {div_val}^{i} = 0; use fewer cutoffs, a larger d_embed or a smaller div_val"
                ));
            }
        }
    }
    Ok(bounds)
}

/// `d_i = d_embed / div_val^i` (0 when it underflows).
fn cluster_width(d_embed: usize, div_val: usize, i: usize) -> usize {
    div_val.checked_pow(i as u32).map_or(0, |p| d_embed / p)
}

/// Configuration of an [`AdaptiveEmbedding`]. Defaults: one table, no cutoffs (a plain
/// embedding, projected when `d_embed != d_proj`), scaled by `sqrt(d_proj)`.
#[derive(Config, Debug)]
pub struct AdaptiveEmbeddingConfig {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Width of the first (most frequent) cluster's table.
    pub d_embed: usize,
    /// Width of the output (the model's `d_model`).
    pub d_proj: usize,
    /// Cluster bounds inside `[1, vocab_size)`, strictly increasing. Default: none (one cluster).
    #[config(default = "Vec::new()")]
    pub cutoffs: Vec<usize>,
    /// Cluster `i`'s table has width `d_embed / div_val^i`; 1 means one shared table.
    /// Default: 1.
    #[config(default = 1)]
    pub div_val: usize,
    /// Multiply the output by `sqrt(d_proj)`, as Transformer-XL's code and HF do. Default: true.
    #[config(default = true)]
    pub scale: bool,
    /// Initialiser of the tables. Default: N(0, 0.02), HF's `init_std`.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
    /// Initialiser of the projections. Default: N(0, 0.01), HF's `proj_init_std`.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.01 }")]
    pub proj_initializer: Initializer,
}

impl AdaptiveEmbeddingConfig {
    /// Checks the config, naming the bad value; returns the cluster bounds.
    pub fn validate(&self) -> Result<Vec<usize>, XlError> {
        if self.d_proj == 0 {
            return Err(XlError::Config("d_proj must be positive, got 0".into()));
        }
        cluster_bounds(self.vocab_size, self.d_embed, &self.cutoffs, self.div_val)
    }

    /// Validates the config and initialises the embedding.
    pub fn init(&self, device: &Device) -> Result<AdaptiveEmbedding, XlError> {
        let bounds = self.validate()?;
        let (tables, projections) = if self.div_val == 1 {
            let projection = (self.d_embed != self.d_proj).then(|| {
                self.proj_initializer
                    .init([self.d_embed, self.d_proj], device)
            });
            (
                vec![
                    self.initializer
                        .init([self.vocab_size, self.d_embed], device),
                ],
                vec![projection],
            )
        } else {
            (0..bounds.len() - 1)
                .map(|i| {
                    let d_i = cluster_width(self.d_embed, self.div_val, i);
                    (
                        self.initializer
                            .init([bounds[i + 1] - bounds[i], d_i], device),
                        Some(self.proj_initializer.init([d_i, self.d_proj], device)),
                    )
                })
                .unzip()
        };
        Ok(AdaptiveEmbedding {
            tables,
            projections,
            bounds,
            div_val: self.div_val,
            d_embed: self.d_embed,
            d_proj: self.d_proj,
            scale: if self.scale {
                (self.d_proj as f64).sqrt()
            } else {
                1.0
            },
        })
    }
}

/// Adaptive input embedding: token `t` of cluster `i` maps to `s · E_i[t - c_i] P_i`
/// (`s = sqrt(d_proj)` or 1; `P_i` absent when `div_val = 1` and `d_embed = d_proj`).
///
/// # Shapes
/// - `tokens`: `[batch, len]` → `[batch, len, d_proj]`
#[derive(Module, Debug)]
pub struct AdaptiveEmbedding {
    /// `E_i`: one table per cluster (`div_val > 1`, `[c_{i+1} - c_i, d_i]`) or one
    /// `[vocab, d_embed]` table (`div_val = 1`).
    tables: Vec<Param<Tensor<2>>>,
    /// `P_i`, `[d_i, d_proj]`, one per table.
    projections: Vec<Option<Param<Tensor<2>>>>,
    /// `[0, cutoffs..., vocab_size]`.
    #[module(skip)]
    bounds: Vec<usize>,
    div_val: usize,
    d_embed: usize,
    d_proj: usize,
    #[module(skip)]
    scale: f64,
}

impl AdaptiveEmbedding {
    /// Builds the embedding from given tensors (an imported checkpoint), checking every shape
    /// against the config. `tables` and `projections` are as the fields: `[n_i, d_i]` and
    /// `[d_i, d_proj]` per table.
    pub fn from_tensors(
        config: &AdaptiveEmbeddingConfig,
        tables: Vec<Tensor<2>>,
        projections: Vec<Option<Tensor<2>>>,
    ) -> Result<Self, XlError> {
        let device = tables
            .first()
            .map(|t| t.device())
            .ok_or_else(|| XlError::Input("no embedding table given".into()))?;
        let expected = config.init(&device)?;
        let check = |what: String, got: [usize; 2], want: [usize; 2]| {
            if got == want {
                Ok(())
            } else {
                Err(XlError::Input(format!(
                    "{what} has shape {got:?}, the config needs {want:?}"
                )))
            }
        };
        if tables.len() != expected.tables.len() || projections.len() != expected.tables.len() {
            return Err(XlError::Input(format!(
                "{} tables and {} projections given, the config needs {} of each",
                tables.len(),
                projections.len(),
                expected.tables.len()
            )));
        }
        for (i, (t, want)) in tables.iter().zip(&expected.tables).enumerate() {
            check(format!("embedding table {i}"), t.dims(), want.val().dims())?;
        }
        for (i, (p, want)) in projections.iter().zip(&expected.projections).enumerate() {
            match (p, want) {
                (Some(p), Some(w)) => check(
                    format!("embedding projection {i}"),
                    p.dims(),
                    w.val().dims(),
                )?,
                (None, None) => {}
                (Some(_), None) => {
                    return Err(XlError::Input(format!(
                        "embedding projection {i} given, but d_embed = d_proj needs none"
                    )));
                }
                (None, Some(w)) => {
                    return Err(XlError::Input(format!(
                        "embedding projection {i} missing (shape {:?})",
                        w.val().dims()
                    )));
                }
            }
        }
        Ok(Self {
            tables: tables.into_iter().map(Param::from_tensor).collect(),
            projections: projections
                .into_iter()
                .map(|p| p.map(Param::from_tensor))
                .collect(),
            ..expected
        })
    }

    /// The cluster bounds `[0, cutoffs..., vocab_size]`.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }

    /// The tables `E_i` (one when `div_val = 1`).
    pub fn tables(&self) -> &[Param<Tensor<2>>] {
        &self.tables
    }

    /// The projections `P_i`, `[d_i, d_proj]`, one per table.
    pub fn projections(&self) -> &[Option<Param<Tensor<2>>>] {
        &self.projections
    }

    /// `div_val` of the config.
    pub fn div_val(&self) -> usize {
        self.div_val
    }

    /// The output width.
    pub fn d_proj(&self) -> usize {
        self.d_proj
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        *self.bounds.last().expect("bounds hold 0 and vocab_size")
    }

    /// The rows of cluster `i`'s words, `[c_{i+1} - c_i, d_i]` (a slice of the one table when
    /// `div_val = 1`): what a tied softmax scores hidden states against.
    pub fn cluster_table(&self, i: usize) -> Tensor<2> {
        if self.div_val == 1 {
            let (l, r) = (self.bounds[i], self.bounds[i + 1]);
            self.tables[0].val().narrow(0, l, r - l)
        } else {
            self.tables[i].val()
        }
    }

    /// Cluster `i`'s projection `[d_i, d_proj]` (the one projection when `div_val = 1`), if any.
    pub fn cluster_projection(&self, i: usize) -> Option<Tensor<2>> {
        let t = if self.div_val == 1 { 0 } else { i };
        self.projections[t].as_ref().map(|p| p.val())
    }

    /// Embeds `tokens` (see the type docs). Every id must be below the vocabulary size (the
    /// caller checks; ids are not read back to the host here).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, len]` → `[batch, len, d_proj]`
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let [batch, len] = tokens.dims();
        let flat = tokens.reshape([batch * len]);
        let project = |e: Tensor<2>, p: &Option<Param<Tensor<2>>>| match p {
            Some(p) => e.matmul(p.val()),
            None => e,
        };
        let out = if self.div_val == 1 {
            // e = E[t] P
            project(self.tables[0].val().select(0, flat), &self.projections[0])
        } else {
            // e = Σ_i 1[c_i <= t < c_{i+1}] E_i[t - c_i] P_i: every cluster is looked up at a
            // clamped index and masked, so no id is read back to the host and the gradient of a
            // row outside the cluster is exactly 0.
            let mut sum: Option<Tensor<2>> = None;
            for (i, (table, proj)) in self.tables.iter().zip(&self.projections).enumerate() {
                let (l, r) = (self.bounds[i], self.bounds[i + 1]);
                let inside = flat
                    .clone()
                    .greater_equal_elem(l as i64)
                    .bool_and(flat.clone().lower_elem(r as i64));
                let local = flat
                    .clone()
                    .sub_scalar(l as i64)
                    .clamp(0, (r - l - 1) as i64);
                let e = project(table.val().select(0, local), proj)
                    * inside.float().unsqueeze_dim::<2>(1);
                sum = Some(match sum {
                    Some(s) => s + e,
                    None => e,
                });
            }
            sum.expect("at least one cluster")
        };
        out.mul_scalar(self.scale)
            .reshape([batch, len, self.d_proj])
    }
}

/// Configuration of an [`AdaptiveLogSoftmax`]. Defaults: no cutoffs, tied to the embedding's
/// tables, projections untied.
#[derive(Config, Debug)]
pub struct AdaptiveLogSoftmaxConfig {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Width of the first cluster's table.
    pub d_embed: usize,
    /// Width of the hidden states scored (the model's `d_model`).
    pub d_proj: usize,
    /// Cluster bounds, as the embedding's. Default: none (a plain softmax).
    #[config(default = "Vec::new()")]
    pub cutoffs: Vec<usize>,
    /// As the embedding's. Default: 1.
    #[config(default = 1)]
    pub div_val: usize,
    /// Score against the embedding's tables (HF's `tie_word_embeddings`). Default: true.
    #[config(default = true)]
    pub tie_weights: bool,
    /// Per cluster: use the embedding's projection (HF's `tie_projs`; `transfo-xl-wt103` ties
    /// all but the first). Missing entries are false. Default: none tied.
    #[config(default = "Vec::new()")]
    pub tie_projs: Vec<bool>,
    /// Initialiser of untied tables and the cluster weights. Default: N(0, 0.02).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
    /// Initialiser of untied projections. Default: N(0, 0.01).
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.01 }")]
    pub proj_initializer: Initializer,
}

impl AdaptiveLogSoftmaxConfig {
    /// Checks the config, naming the bad value; returns the cluster bounds.
    pub fn validate(&self) -> Result<Vec<usize>, XlError> {
        if self.d_proj == 0 {
            return Err(XlError::Config("d_proj must be positive, got 0".into()));
        }
        let bounds = cluster_bounds(self.vocab_size, self.d_embed, &self.cutoffs, self.div_val)?;
        if self.tie_projs.len() > bounds.len() - 1 {
            return Err(XlError::Config(format!(
                "tie_projs has {} entries for {} clusters",
                self.tie_projs.len(),
                bounds.len() - 1
            )));
        }
        Ok(bounds)
    }

    /// Whether cluster `i` uses the embedding's projection.
    fn tied_proj(&self, i: usize) -> bool {
        self.tie_projs.get(i).copied().unwrap_or(false)
    }

    /// Width of cluster `i`'s table.
    fn width(&self, i: usize) -> usize {
        if self.div_val == 1 {
            self.d_embed
        } else {
            cluster_width(self.d_embed, self.div_val, i)
        }
    }

    /// Whether cluster `i` has a projection at all (HF: always with `div_val > 1`, else only
    /// when `d_embed != d_proj`).
    fn projected(&self, i: usize) -> bool {
        self.div_val > 1 || self.width(i) != self.d_proj
    }

    /// Validates the config and initialises the layer (owned parts only; see the type docs).
    pub fn init(&self, device: &Device) -> Result<AdaptiveLogSoftmax, XlError> {
        let bounds = self.validate()?;
        let n = bounds.len() - 1;
        let sizes: Vec<usize> = (0..n).map(|i| bounds[i + 1] - bounds[i]).collect();
        let clusters = n - 1;
        Ok(AdaptiveLogSoftmax {
            cluster_weight: (clusters > 0)
                .then(|| self.initializer.init([clusters, self.d_embed], device)),
            cluster_bias: (clusters > 0).then(|| Initializer::Zeros.init([clusters], device)),
            biases: (0..n)
                .map(|i| Initializer::Zeros.init([sizes[i]], device))
                .collect(),
            tables: if self.tie_weights {
                Vec::new()
            } else {
                (0..n)
                    .map(|i| self.initializer.init([sizes[i], self.width(i)], device))
                    .collect()
            },
            projections: (0..n)
                .map(|i| {
                    (self.projected(i) && !self.tied_proj(i)).then(|| {
                        self.proj_initializer
                            .init([self.width(i), self.d_proj], device)
                    })
                })
                .collect(),
            bounds,
            div_val: self.div_val,
            d_proj: self.d_proj,
            tie_weights: self.tie_weights,
            tie_projs: (0..n)
                .map(|i| self.projected(i) && self.tied_proj(i))
                .collect(),
        })
    }
}

/// The owned tensors of an [`AdaptiveLogSoftmax`] from a checkpoint (see
/// [`AdaptiveLogSoftmax::from_tensors`]); every `Vec` has one entry per cluster.
#[derive(Debug, Clone)]
pub struct AdaptiveLogSoftmaxTensors {
    /// `[n_clusters, d_embed]` (HF's `cluster_weight`), with cutoffs only.
    pub cluster_weight: Option<Tensor<2>>,
    /// `[n_clusters]`, with cutoffs only.
    pub cluster_bias: Option<Tensor<1>>,
    /// `b_i`, `[c_{i+1} - c_i]` (HF's `out_layers[i].bias`, split at the cutoffs when
    /// `div_val = 1`).
    pub biases: Vec<Tensor<1>>,
    /// Untied tables `[c_{i+1} - c_i, d_i]`; empty when tied.
    pub tables: Vec<Tensor<2>>,
    /// Untied projections `[d_i, d_proj]` (HF's `out_projs[i]` transposed); `None` where tied
    /// or absent.
    pub projections: Vec<Option<Tensor<2>>>,
}

/// Projected adaptive log-softmax over a clustered vocabulary.
///
/// With `z_i = h P_iᵀ` (or `h` when cluster `i` has no projection), the head scores the first
/// cluster's words and one logit per tail cluster:
/// `log p_head = log_softmax([z_0 W_0ᵀ + b_0 ; z_0 W_cᵀ + b_c])`, and a word `w` of tail cluster
/// `i` gets `log p(w) = log p_head(cluster i) + log_softmax(z_i W_iᵀ + b_i)[w - c_i]`
/// (Grave et al. 2017, eq. 6). `W_i` (and `P_i` where tied) are the embedding's.
///
/// # Shapes
/// - `hidden`: `[n, d_proj]`; `targets`: `[n]`
/// - log-probs: `[n, vocab]`; nll: `[n]`
#[derive(Module, Debug)]
pub struct AdaptiveLogSoftmax {
    /// `W_c`: one row per tail cluster, `[n_clusters, d_embed]`.
    cluster_weight: Option<Param<Tensor<2>>>,
    /// `b_c`, `[n_clusters]`.
    cluster_bias: Option<Param<Tensor<1>>>,
    /// `b_i` per cluster.
    biases: Vec<Param<Tensor<1>>>,
    /// Untied `W_i`; empty when tied to the embedding.
    tables: Vec<Param<Tensor<2>>>,
    /// Untied `P_i`, `[d_i, d_proj]`.
    projections: Vec<Option<Param<Tensor<2>>>>,
    #[module(skip)]
    bounds: Vec<usize>,
    div_val: usize,
    d_proj: usize,
    tie_weights: bool,
    /// Per cluster: the projection is the embedding's.
    #[module(skip)]
    tie_projs: Vec<bool>,
}

impl AdaptiveLogSoftmax {
    /// Builds the layer from given tensors (an imported checkpoint), checking every shape
    /// against the config.
    pub fn from_tensors(
        config: &AdaptiveLogSoftmaxConfig,
        tensors: AdaptiveLogSoftmaxTensors,
        device: &Device,
    ) -> Result<Self, XlError> {
        let expected = config.init(device)?;
        let mismatch = |what: String, got: Vec<usize>, want: Vec<usize>| {
            XlError::Input(format!(
                "{what} has shape {got:?}, the config needs {want:?}"
            ))
        };
        let n = expected.biases.len();
        let two =
            |what: &str, got: Option<Tensor<2>>, want: &Option<Param<Tensor<2>>>| match (got, want)
            {
                (Some(g), Some(w)) if g.dims() == w.val().dims() => Ok(Some(Param::from_tensor(g))),
                (Some(g), Some(w)) => Err(mismatch(
                    what.to_string(),
                    g.dims().to_vec(),
                    w.val().dims().to_vec(),
                )),
                (None, None) => Ok(None),
                (Some(_), None) => Err(XlError::Input(format!(
                    "{what} given, but the config has none (tied or absent)"
                ))),
                (None, Some(w)) => Err(XlError::Input(format!(
                    "{what} missing (shape {:?})",
                    w.val().dims()
                ))),
            };
        let cluster_weight = two(
            "cluster_weight",
            tensors.cluster_weight,
            &expected.cluster_weight,
        )?;
        let cluster_bias = match (tensors.cluster_bias, &expected.cluster_bias) {
            (Some(g), Some(w)) if g.dims() == w.val().dims() => Some(Param::from_tensor(g)),
            (None, None) => None,
            (g, w) => {
                return Err(XlError::Input(format!(
                    "cluster_bias: got {:?}, the config needs {:?}",
                    g.map(|t| t.dims()),
                    w.as_ref().map(|p| p.val().dims())
                )));
            }
        };
        if tensors.biases.len() != n || tensors.projections.len() != n {
            return Err(XlError::Input(format!(
                "{} biases and {} projections given for {n} clusters",
                tensors.biases.len(),
                tensors.projections.len()
            )));
        }
        let biases = tensors
            .biases
            .into_iter()
            .zip(&expected.biases)
            .enumerate()
            .map(|(i, (g, w))| {
                if g.dims() == w.val().dims() {
                    Ok(Param::from_tensor(g))
                } else {
                    Err(mismatch(
                        format!("output bias {i}"),
                        g.dims().to_vec(),
                        w.val().dims().to_vec(),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if tensors.tables.len() != expected.tables.len() {
            return Err(XlError::Input(format!(
                "{} output tables given, the config needs {} (tie_weights = {})",
                tensors.tables.len(),
                expected.tables.len(),
                config.tie_weights
            )));
        }
        let tables = tensors
            .tables
            .into_iter()
            .zip(&expected.tables)
            .enumerate()
            .map(|(i, (g, w))| {
                two(&format!("output table {i}"), Some(g), &Some(w.clone()))
                    .map(|p| p.expect("given"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let projections = tensors
            .projections
            .into_iter()
            .zip(&expected.projections)
            .enumerate()
            .map(|(i, (g, w))| two(&format!("output projection {i}"), g, w))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            cluster_weight,
            cluster_bias,
            biases,
            tables,
            projections,
            ..expected
        })
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        *self.bounds.last().expect("bounds hold 0 and vocab_size")
    }

    /// `W_c`, `[n_clusters, d_embed]` (with cutoffs only).
    pub fn cluster_weight(&self) -> Option<&Param<Tensor<2>>> {
        self.cluster_weight.as_ref()
    }

    /// `b_c`, `[n_clusters]` (with cutoffs only).
    pub fn cluster_bias(&self) -> Option<&Param<Tensor<1>>> {
        self.cluster_bias.as_ref()
    }

    /// `b_i` per cluster.
    pub fn biases(&self) -> &[Param<Tensor<1>>] {
        &self.biases
    }

    /// Untied `W_i` per cluster; empty when tied.
    pub fn tables(&self) -> &[Param<Tensor<2>>] {
        &self.tables
    }

    /// Per cluster: the untied `P_i`, `[d_i, d_proj]`; `None` where tied or absent.
    pub fn projections(&self) -> &[Option<Param<Tensor<2>>>] {
        &self.projections
    }

    fn check_tied(&self, embedding: &AdaptiveEmbedding) -> Result<(), XlError> {
        let needs = self.tie_weights || self.tie_projs.iter().any(|&t| t);
        if needs
            && (embedding.bounds() != self.bounds.as_slice()
                || embedding.div_val() != self.div_val
                || embedding.d_proj() != self.d_proj)
        {
            return Err(XlError::Input(format!(
                "the softmax is tied to an embedding with other clusters: bounds {:?} / {:?}, div_val {} / {}, d_proj {} / {}",
                self.bounds,
                embedding.bounds(),
                self.div_val,
                embedding.div_val(),
                self.d_proj,
                embedding.d_proj()
            )));
        }
        Ok(())
    }

    /// The widest output, in columns per token, that any adaptive softmax computed on the
    /// calling thread since the last call (and resets it to 0): `vocab` once
    /// [`log_probs`](Self::log_probs) ran, the widest of the head (`c_1 + n_clusters`) and the
    /// target-holding clusters when only [`nll`](Self::nll) did. What shows that a loss never
    /// built the `[tokens, vocab]` log-probabilities.
    pub fn take_widest_output() -> usize {
        WIDEST.with(|w| w.replace(0))
    }

    /// `z_i W_iᵀ + b_i` for cluster `i` (`i = 0`: with the cluster logits appended).
    ///
    /// # Shapes
    /// - `hidden`: `[n, d_proj]` → `[n, c_{i+1} - c_i]` (+ `n_clusters` for `i = 0`)
    fn cluster_logits(&self, i: usize, hidden: Tensor<2>, emb: &AdaptiveEmbedding) -> Tensor<2> {
        // z_i = h P_iᵀ
        let proj = if self.tie_projs[i] {
            emb.cluster_projection(i)
        } else {
            self.projections[i].as_ref().map(|p| p.val())
        };
        let z = match proj {
            Some(p) => hidden.matmul(p.transpose()),
            None => hidden,
        };
        let table = if self.tie_weights {
            emb.cluster_table(i)
        } else {
            self.tables[i].val()
        };
        let mut bias = self.biases[i].val();
        let weight = match (i, &self.cluster_weight, &self.cluster_bias) {
            (0, Some(w), Some(b)) => {
                bias = Tensor::cat(vec![bias, b.val()], 0);
                Tensor::cat(vec![table, w.val()], 0)
            }
            _ => table,
        };
        record_width(weight.dims()[0]);
        z.matmul(weight.transpose()) + bias.unsqueeze_dim(0)
    }

    /// Log-probabilities of every word (see the type docs). `embedding` supplies the tied
    /// tensors.
    ///
    /// # Shapes
    /// - `hidden`: `[n, d_proj]` → `[n, vocab]`
    pub fn log_probs(
        &self,
        hidden: Tensor<2>,
        embedding: &AdaptiveEmbedding,
    ) -> Result<Tensor<2>, XlError> {
        self.check_tied(embedding)?;
        self.check_hidden(&hidden)?;
        let head_size = self.bounds[1];
        // log p_head = log_softmax([z_0 W_0ᵀ + b_0 ; z_0 W_cᵀ + b_c])
        let head = log_softmax(self.cluster_logits(0, hidden.clone(), embedding), 1);
        let n_clusters = self.biases.len();
        record_width(self.vocab_size());
        if n_clusters == 1 {
            return Ok(head);
        }
        let [n, _] = hidden.dims();
        let mut parts = vec![head.clone().narrow(1, 0, head_size)];
        for i in 1..n_clusters {
            // log p(w) = log p_head(cluster i) + log_softmax(z_i W_iᵀ + b_i)[w - c_i]
            let tail = log_softmax(self.cluster_logits(i, hidden.clone(), embedding), 1);
            let cluster = head.clone().narrow(1, head_size + i - 1, 1);
            let width = tail.dims()[1];
            parts.push(tail + cluster.expand([n, width]));
        }
        Ok(Tensor::cat(parts, 1))
    }

    /// Negative log-likelihood of each target, computing each tail cluster only for the rows
    /// whose target lies in it (the targets are read to the host once).
    ///
    /// # Shapes
    /// - `hidden`: `[n, d_proj]`, `targets`: `[n]` → `[n]`
    pub fn nll(
        &self,
        hidden: Tensor<2>,
        targets: Tensor<1, Int>,
        embedding: &AdaptiveEmbedding,
    ) -> Result<Tensor<1>, XlError> {
        self.check_tied(embedding)?;
        self.check_hidden(&hidden)?;
        let [n, _] = hidden.dims();
        if targets.dims() != [n] {
            return Err(XlError::Input(format!(
                "{:?} targets for {n} hidden states",
                targets.dims()
            )));
        }
        let device = hidden.device();
        let ids: Vec<i64> = targets
            .into_data()
            .convert::<i64>()
            .try_into_vec::<i64>()
            .map_err(|e| XlError::Input(format!("targets are not integers: {e:?}")))?;
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            return Err(XlError::Input(format!(
                "target id {bad} is outside the vocabulary [0, {vocab})"
            )));
        }
        let head_size = self.bounds[1];
        let cluster_of = |t: usize| self.bounds.partition_point(|&b| b <= t) - 1;
        // Head column of each row: its word (cluster 0) or its cluster's logit.
        let head_col: Vec<i64> = ids
            .iter()
            .map(|&t| match cluster_of(t as usize) {
                0 => t,
                c => (head_size + c - 1) as i64,
            })
            .collect();
        let head = log_softmax(self.cluster_logits(0, hidden.clone(), embedding), 1);
        let index = |v: Vec<i64>| {
            let len = v.len();
            Tensor::<1, Int>::from_data(TensorData::new(v, [len]), &device)
        };
        let head_lp = head.gather(1, index(head_col).reshape([n, 1])).reshape([n]);
        // Tail terms: computed per cluster on its rows, then put back in row order by one
        // `select` from `[0, tail terms...]` (row r reads position 0 when in the head).
        let mut gathered = vec![Tensor::<1>::zeros([1], &device)];
        let mut position = vec![0i64; n];
        let mut next = 1i64;
        for i in 1..self.biases.len() {
            let rows: Vec<usize> = (0..n)
                .filter(|&r| cluster_of(ids[r] as usize) == i)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let h_i = hidden
                .clone()
                .select(0, index(rows.iter().map(|&r| r as i64).collect()));
            let local: Vec<i64> = rows
                .iter()
                .map(|&r| ids[r] - self.bounds[i] as i64)
                .collect();
            let m = rows.len();
            let tail = log_softmax(self.cluster_logits(i, h_i, embedding), 1)
                .gather(1, index(local).reshape([m, 1]))
                .reshape([m]);
            for &r in &rows {
                position[r] = next;
                next += 1;
            }
            gathered.push(tail);
        }
        let tail_lp = Tensor::cat(gathered, 0).select(0, index(position));
        Ok((head_lp + tail_lp).neg())
    }

    fn check_hidden(&self, hidden: &Tensor<2>) -> Result<(), XlError> {
        let [_, d] = hidden.dims();
        if d != self.d_proj {
            return Err(XlError::Input(format!(
                "hidden states have width {d}, the softmax reads d_proj = {}",
                self.d_proj
            )));
        }
        Ok(())
    }
}

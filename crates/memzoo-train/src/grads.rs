//! Gradient utilities: global-norm clipping and scaling of a whole [`GradientsParams`].

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

/// Sums `‖g‖²` over every float parameter of a module.
struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: Option<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            let sq = g.powi_scalar(2).sum();
            self.total = Some(match self.total.take() {
                Some(t) => t + sq,
                None => sq,
            });
        }
    }
}

/// Finds the parameters whose gradient holds a NaN or an infinity, by module path.
struct NonFinite<'a> {
    grads: &'a GradientsParams,
    path: Vec<String>,
    found: Vec<(String, f64)>,
}

impl ModuleVisitor for NonFinite<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            // Σ g² is finite exactly when every entry is (or overflows, which is as bad).
            let sq: f64 = g.powi_scalar(2).sum().into_scalar();
            if !sq.is_finite() {
                self.found.push((dotted(&self.path), sq.sqrt()));
            }
        }
    }
}

/// The parameters (module paths, e.g. `blocks.0.attention.query.weight`) whose gradient holds
/// a NaN or an infinity, each with its gradient's norm (NaN or inf).
pub fn non_finite<M: Module>(model: &M, grads: &GradientsParams) -> Vec<(String, f64)> {
    let mut v = NonFinite {
        grads,
        path: Vec::new(),
        found: Vec::new(),
    };
    model.visit(&mut v);
    v.found
}

/// Multiplies every parameter gradient by `factor`.
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// The global L2 norm of all gradients, `sqrt(Σ_p ‖g_p‖²)` (one host read).
pub fn global_norm<M: Module>(model: &M, grads: &GradientsParams) -> f64 {
    let mut v = SquaredNorm { grads, total: None };
    model.visit(&mut v);
    v.total
        .map(|t| t.into_scalar::<f64>().sqrt())
        .unwrap_or(0.0)
}

/// Every parameter gradient multiplied by `factor`.
pub fn scale<M: Module>(model: &M, mut grads: GradientsParams, factor: f64) -> GradientsParams {
    if factor != 1.0 {
        model.visit(&mut Scale {
            grads: &mut grads,
            factor,
        });
    }
    grads
}

/// Scales the gradients by `scale` (e.g. `1 / accumulation steps`), then clips their global
/// norm to `max_norm` (as `torch.nn.utils.clip_grad_norm_`). Returns the norm before clipping.
/// A non-finite norm leaves the gradients as they are (scaling by `max / inf = 0` would turn
/// an infinity into a NaN): the caller stops there, and [`non_finite`] names the culprits.
pub fn scale_and_clip<M: Module>(
    model: &M,
    grads: GradientsParams,
    scale: f64,
    max_norm: Option<f64>,
) -> (GradientsParams, f64) {
    let norm = global_norm(model, &grads) * scale;
    if !norm.is_finite() {
        return (grads, norm);
    }
    let clip = match max_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    (self::scale(model, grads, scale * clip), norm)
}

/// Finds the parameters that hold a NaN or an infinity, by module path.
struct NonFiniteParams {
    path: Vec<String>,
    found: Vec<(String, f32)>,
}

impl ModuleVisitor for NonFiniteParams {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let data = param.val().into_data().convert::<f32>();
        let Ok(values) = data.as_slice::<f32>() else {
            return;
        };
        if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
            self.found.push((dotted(&self.path), *bad));
        }
    }
}

/// The parameters (module paths) that hold a NaN or an infinity, each with the first such
/// value. Reads every parameter to the host: for error paths.
pub fn non_finite_params<M: Module>(model: &M) -> Vec<(String, f32)> {
    let mut v = NonFiniteParams {
        path: Vec::new(),
        found: Vec::new(),
    };
    model.visit(&mut v);
    v.found
}

/// A module path as `a.b.c` (empty names skipped).
fn dotted(path: &[String]) -> String {
    path.iter()
        .filter(|p| !p.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(".")
}

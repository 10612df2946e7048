//! Learning-rate schedule: linear warm-up, then cosine decay.

use burn::config::Config;

/// Linear warm-up from 0 to `lr` over `warmup` steps, then cosine decay to `lr * min_ratio`
/// at `total` steps (and constant after).
#[derive(Config, Debug, PartialEq)]
pub struct ScheduleConfig {
    /// Peak learning rate. Default: 2.5e-4 (Transformer-XL's enwik8 setting).
    #[config(default = 2.5e-4)]
    pub lr: f64,
    /// Warm-up steps. Default: 100.
    #[config(default = 100)]
    pub warmup: usize,
    /// Final learning rate as a fraction of `lr`. Default: 0.1.
    #[config(default = 0.1)]
    pub min_ratio: f64,
}

impl ScheduleConfig {
    /// Warm-up to `lr` over `warmup` steps, then the cosine down to `lr * min_ratio`.
    pub fn cosine(lr: f64, warmup: usize, min_ratio: f64) -> Self {
        Self::new()
            .with_lr(lr)
            .with_warmup(warmup)
            .with_min_ratio(min_ratio)
    }

    /// The learning rate of optimizer step `step` (0-based) of `total`.
    ///
    /// `lr(s) = lr (s+1)/warmup` during warm-up, then
    /// `lr_min + (lr - lr_min) (1 + cos(pi p)) / 2`, `p = (s - warmup) / (total - warmup)`.
    pub fn lr_at(&self, step: usize, total: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let min = self.lr * self.min_ratio;
        let span = total.saturating_sub(self.warmup).max(1);
        let p = ((step - self.warmup) as f64 / span as f64).min(1.0);
        min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
    }

    /// Checks the values, naming the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!(
                "train.schedule.lr must be positive, got {}",
                self.lr
            ));
        }
        if !(0.0..=1.0).contains(&self.min_ratio) {
            return Err(format!(
                "train.schedule.min_ratio must be in [0, 1], got {}",
                self.min_ratio
            ));
        }
        Ok(())
    }
}

//! Learning-rate schedules: [`StepLr`] and [`CosineAnnealing`] (PyTorch's `StepLR` and
//! `CosineAnnealingLR`, closed forms).

use super::{Optimizer, check_finite};
use crate::error::{NdError, Result, unwrap};

/// A learning rate as a function of the epoch, stepped once per epoch.
///
/// The schedule counts epochs from 0 (where the rate is the base rate);
/// [`LrScheduler::step`] moves to the next epoch and sets the optimizer's learning
/// rate, like PyTorch's `scheduler.step()` after each epoch.
pub trait LrScheduler {
    /// The learning rate at `epoch`.
    fn lr_at(&self, epoch: u64) -> f64;

    /// The current epoch (0 before the first [`LrScheduler::step`]).
    fn epoch(&self) -> u64;

    /// Set the current epoch (to resume).
    fn set_epoch(&mut self, epoch: u64);

    /// The learning rate at the current epoch (PyTorch's `get_last_lr`).
    fn lr(&self) -> f64 {
        self.lr_at(self.epoch())
    }

    /// Move to the next epoch and set `optimizer`'s learning rate to its rate.
    fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.set_epoch(self.epoch() + 1);
        optimizer.set_learning_rate(self.lr());
    }
}

/// Decay by `gamma` every `step_size` epochs: `lr = base_lr · gamma^⌊epoch /
/// step_size⌋` (PyTorch's `StepLR`).
///
/// ```
/// use ndscope::optim::{LrScheduler, StepLr};
/// let s = StepLr::new(0.1, 2, 0.5);
/// let lrs: Vec<f64> = (0..5).map(|e| s.lr_at(e)).collect();
/// assert_eq!(lrs, [0.1, 0.1, 0.05, 0.05, 0.025]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepLr {
    base_lr: f64,
    step_size: u64,
    gamma: f64,
    epoch: u64,
}

impl StepLr {
    /// The schedule from `base_lr` (usually the optimizer's learning rate). Panics on
    /// invalid arguments (see [`StepLr::try_new`]).
    #[track_caller]
    pub fn new(base_lr: f64, step_size: u64, gamma: f64) -> StepLr {
        unwrap(StepLr::try_new(base_lr, step_size, gamma))
    }

    /// [`StepLr::new`], or `InvalidArgument` for a `step_size` of 0 or a negative or
    /// non-finite `base_lr` or `gamma`.
    pub fn try_new(base_lr: f64, step_size: u64, gamma: f64) -> Result<StepLr> {
        check_finite("step_lr", "base learning rate", base_lr, true)?;
        check_finite("step_lr", "gamma", gamma, true)?;
        if step_size == 0 {
            return Err(NdError::invalid("step_lr", "step_size must be at least 1"));
        }
        Ok(StepLr {
            base_lr,
            step_size,
            gamma,
            epoch: 0,
        })
    }
}

impl LrScheduler for StepLr {
    fn lr_at(&self, epoch: u64) -> f64 {
        let k = epoch / self.step_size;
        self.base_lr * self.gamma.powf(k as f64)
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
}

/// Cosine annealing from `base_lr` to `eta_min` over `t_max` epochs:
/// `lr = eta_min + (base_lr - eta_min) · (1 + cos(π · epoch / t_max)) / 2`
/// (PyTorch's `CosineAnnealingLR`, its closed form; past `t_max` the cosine goes on,
/// back up, as PyTorch's does).
///
/// ```
/// use ndscope::optim::{CosineAnnealing, LrScheduler};
/// let s = CosineAnnealing::new(1.0, 4, 0.0);
/// assert_eq!(s.lr_at(0), 1.0);
/// assert!((s.lr_at(2) - 0.5).abs() < 1e-15);
/// assert_eq!(s.lr_at(4), 0.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineAnnealing {
    base_lr: f64,
    t_max: u64,
    eta_min: f64,
    epoch: u64,
}

impl CosineAnnealing {
    /// The schedule from `base_lr` (usually the optimizer's learning rate) down to
    /// `eta_min` at epoch `t_max`. Panics on invalid arguments (see
    /// [`CosineAnnealing::try_new`]).
    #[track_caller]
    pub fn new(base_lr: f64, t_max: u64, eta_min: f64) -> CosineAnnealing {
        unwrap(CosineAnnealing::try_new(base_lr, t_max, eta_min))
    }

    /// [`CosineAnnealing::new`], or `InvalidArgument` for a `t_max` of 0 or a negative
    /// or non-finite `base_lr` or `eta_min`.
    pub fn try_new(base_lr: f64, t_max: u64, eta_min: f64) -> Result<CosineAnnealing> {
        check_finite("cosine_annealing", "base learning rate", base_lr, true)?;
        check_finite("cosine_annealing", "eta_min", eta_min, true)?;
        if t_max == 0 {
            return Err(NdError::invalid(
                "cosine_annealing",
                "t_max must be at least 1",
            ));
        }
        Ok(CosineAnnealing {
            base_lr,
            t_max,
            eta_min,
            epoch: 0,
        })
    }
}

impl LrScheduler for CosineAnnealing {
    fn lr_at(&self, epoch: u64) -> f64 {
        let c = (std::f64::consts::PI * epoch as f64 / self.t_max as f64).cos();
        self.eta_min + (self.base_lr - self.eta_min) * (1.0 + c) / 2.0
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
}

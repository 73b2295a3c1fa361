//! [`Adam`] and [`AdamW`] (PyTorch's `torch.optim.Adam` and `torch.optim.AdamW`).

#[cfg(feature = "gpu")]
use super::kernel::Scalars;
use super::kernel::{Update, update};
use super::sgd::decayed;
#[cfg(feature = "gpu")]
#[cfg(feature = "gpu")]
use super::sgd::{wd_name, write_decayed};
use super::{Optimizer, State, check_finite};
use crate::dtype::Float;
use crate::error::{NdError, Result, unwrap};
use crate::{NDArray, NDManager};
#[cfg(feature = "gpu")]
use std::fmt::Write;

/// Hyper-parameters of [`Adam`] and [`AdamW`]; the defaults are PyTorch's `Adam`
/// defaults (`lr` 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay). PyTorch's
/// `AdamW` defaults to a weight decay of 0.01: [`AdamConfig::adamw`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate (≥ 0).
    pub lr: f64,
    /// Decay rates of the first and second moment estimates (each in [0, 1)).
    pub betas: (f64, f64),
    /// Added to the denominator, outside the square root (≥ 0).
    pub eps: f64,
    /// Weight decay (≥ 0): an L2 term added to the gradient for [`Adam`], a decoupled
    /// decay of the parameter for [`AdamW`].
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

impl AdamConfig {
    /// PyTorch's `AdamW` defaults: those of `Adam` with a weight decay of 0.01.
    pub fn adamw() -> AdamConfig {
        AdamConfig {
            weight_decay: 0.01,
            ..AdamConfig::default()
        }
    }
}

/// `m = lerp(m, g, 1 - beta1)` with `g` decayed for Adam (inputs `g`, `p`). PyTorch's
/// `exp_avg.lerp_(grad, 1 - beta1)`, with its two-sided lerp formula.
struct FirstMoment {
    weight: f64,
    wd: f64,
}

impl Update for FirstMoment {
    #[inline(always)]
    fn apply<T: Float>(&self, m: T, g: T, p: T) -> T {
        let g = decayed(g, p, self.wd);
        let w = T::from_f64(self.weight);
        if self.weight < 0.5 {
            m.add(w.mul(g.sub(m)))
        } else {
            g.sub(g.sub(m).mul(T::from_f64(1.0 - self.weight)))
        }
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        let wd = wd_name(self.wd, s);
        let g = |out: &mut String| write_decayed(out, "x", "y", wd);
        if self.weight < 0.5 {
            let w = s.push(self.weight);
            let _ = write!(out, "t + {w} * (");
            g(out);
            out.push_str(" - t)");
        } else {
            let c = s.push(1.0 - self.weight);
            g(out);
            out.push_str(" - (");
            g(out);
            let _ = write!(out, " - t) * {c}");
        }
    }
}

/// `v = beta2 v + (1 - beta2) g²` (inputs `g`, `p`): PyTorch's
/// `exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)`.
struct SecondMoment {
    beta2: f64,
    wd: f64,
}

impl Update for SecondMoment {
    #[inline(always)]
    fn apply<T: Float>(&self, v: T, g: T, p: T) -> T {
        let g = decayed(g, p, self.wd);
        v.mul(T::from_f64(self.beta2))
            .add(T::from_f64(1.0 - self.beta2).mul(g).mul(g))
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        let wd = wd_name(self.wd, s);
        let (b, c) = (s.push(self.beta2), s.push(1.0 - self.beta2));
        let _ = write!(out, "t * {b} + {c} * ");
        write_decayed(out, "x", "y", wd);
        out.push_str(" * ");
        write_decayed(out, "x", "y", wd);
    }
}

/// `p = p·decay - step_size·m / (sqrt(v) / sqrt(bc2) + eps)` (inputs `m`, `v`).
struct AdamParam {
    decay: f64,
    neg_step_size: f64,
    bc2_sqrt: f64,
    eps: f64,
}

impl Update for AdamParam {
    #[inline(always)]
    fn apply<T: Float>(&self, p: T, m: T, v: T) -> T {
        let p = if self.decay != 1.0 {
            p.mul(T::from_f64(self.decay))
        } else {
            p
        };
        let denom = v
            .sqrt()
            .div(T::from_f64(self.bc2_sqrt))
            .add(T::from_f64(self.eps));
        p.add(T::from_f64(self.neg_step_size).mul(m).div(denom))
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        if self.decay != 1.0 {
            let _ = write!(out, "t * {}", s.push(self.decay));
        } else {
            out.push('t');
        }
        let (bc, eps, step) = (
            s.push(self.bc2_sqrt),
            s.push(self.eps),
            s.push(self.neg_step_size),
        );
        let _ = write!(out, " + {step} * x / (sqrt(y) / {bc} + {eps})");
    }
}

/// What Adam and AdamW share; `decoupled` selects AdamW's weight decay.
#[derive(Debug)]
struct Core {
    state: State,
    config: AdamConfig,
    decoupled: bool,
}

impl Core {
    fn new(
        op: &'static str,
        name: &str,
        m: &NDManager,
        params: &[NDArray],
        config: AdamConfig,
        decoupled: bool,
    ) -> Result<Core> {
        check_finite(op, "learning rate", config.lr, true)?;
        check_finite(op, "epsilon", config.eps, true)?;
        check_finite(op, "weight decay", config.weight_decay, true)?;
        for (i, b) in [config.betas.0, config.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&b) {
                return Err(NdError::invalid(
                    op,
                    format!("beta{} must be in [0, 1), got {b}", i + 1),
                ));
            }
        }
        let state = State::new(op, name, m, params, 2)?;
        Ok(Core {
            state,
            config,
            decoupled,
        })
    }

    fn step(&mut self, op: &'static str) -> Result<()> {
        self.state.check(op)?;
        let c = &self.config;
        let t = (self.state.steps + 1) as f64;
        let (beta1, beta2) = c.betas;
        // As PyTorch: the bias corrections in f64, step_size = lr / (1 - beta1^t).
        let bc1 = 1.0 - beta1.powf(t);
        let bc2 = 1.0 - beta2.powf(t);
        let l2 = if self.decoupled { 0.0 } else { c.weight_decay };
        let first = FirstMoment {
            weight: 1.0 - beta1,
            wd: l2,
        };
        let second = SecondMoment { beta2, wd: l2 };
        let param = AdamParam {
            decay: if self.decoupled {
                1.0 - c.lr * c.weight_decay
            } else {
                1.0
            },
            neg_step_size: -(c.lr / bc1),
            bc2_sqrt: bc2.sqrt(),
            eps: c.eps,
        };
        for (i, &p) in self.state.params.iter().enumerate() {
            let g = p.try_gradient()?;
            let (m, v) = (self.state.buffers[2 * i], self.state.buffers[2 * i + 1]);
            update(op, m, g, p, &first)?;
            update(op, v, g, p, &second)?;
            update(op, p, m, v, &param)?;
        }
        self.state.steps += 1;
        Ok(())
    }
}

macro_rules! adam_type {
    ($(#[$doc:meta])* $name:ident, $op:literal, $decoupled:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(Core);

        impl $name {
            /// An optimizer for `params` (each must require a gradient), its state in a
            /// new sub-manager of `m`. Panics on failure (see the `try_new` form).
            #[track_caller]
            pub fn new(m: &NDManager, params: &[NDArray], config: AdamConfig) -> $name {
                unwrap($name::try_new(m, params, config))
            }

            /// The optimizer. Errors: `InvalidArgument` (a negative or non-finite
            /// learning rate, epsilon or weight decay; a beta outside [0, 1); no
            /// parameter, a parameter twice, or one that does not require a gradient),
            /// `Closed` (a parameter), `ManagerClosed`/`ManagerCapped` (of `m`).
            /// Nothing is left in `m` on an error.
            pub fn try_new(m: &NDManager, params: &[NDArray], config: AdamConfig) -> Result<$name> {
                Ok($name(Core::new($op, stringify!($name), m, params, config, $decoupled)?))
            }

            /// The hyper-parameters (the learning rate as last set).
            pub fn config(&self) -> AdamConfig {
                self.0.config
            }
        }

        impl Optimizer for $name {
            fn try_step(&mut self) -> Result<()> {
                self.0.step($op)
            }

            fn parameters(&self) -> &[NDArray] {
                &self.0.state.params
            }

            fn learning_rate(&self) -> f64 {
                self.0.config.lr
            }

            fn set_learning_rate(&mut self, lr: f64) {
                self.0.config.lr = lr;
            }

            fn step_count(&self) -> u64 {
                self.0.state.steps
            }

            fn set_step_count(&mut self, steps: u64) {
                self.0.state.steps = steps;
            }

            fn manager(&self) -> &NDManager {
                &self.0.state.manager
            }

            fn named_state(&self) -> Vec<(String, NDArray)> {
                self.0.state.named(&["exp_avg", "exp_avg_sq"])
            }
        }
    };
}

adam_type! {
    /// Adam (Kingma & Ba, 2015), PyTorch's update rule exactly. With gradient `g` of
    /// parameter `p` at step `t` (from 1):
    ///
    /// ```text
    /// g = g + weight_decay * p                       (L2 penalty, if weight_decay != 0)
    /// m = beta1 * m + (1 - beta1) * g
    /// v = beta2 * v + (1 - beta2) * g²
    /// p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    /// ```
    ///
    /// (`eps` outside the square root, as PyTorch; `m` is updated with PyTorch's
    /// `lerp`; PyTorch's `amsgrad` and `maximize` options are not offered). The moments (`"<i>.exp_avg"` and `"<i>.exp_avg_sq"` in
    /// [`Optimizer::named_state`]) live in the optimizer's own sub-manager, made once by
    /// `new`; a step is three fused in-place passes per parameter and allocates nothing.
    ///
    /// ```
    /// use ndscope::optim::{Adam, AdamConfig, Optimizer};
    /// use ndscope::{GradientCollector, NDManager};
    /// let m = NDManager::new();
    /// let w = m.create(&[1.0f64, -2.0], [2]).set_requires_gradient(true);
    /// let mut opt = Adam::new(&m, &[w], AdamConfig { lr: 0.1, ..Default::default() });
    /// let gc = GradientCollector::new();
    /// gc.backward(w.square().sum())?;
    /// opt.step();
    /// // The first step moves each weight by about lr against the gradient's sign.
    /// let v = w.to_vec::<f64>()?;
    /// assert!((v[0] - 0.9).abs() < 1e-6 && (v[1] + 1.9).abs() < 1e-6);
    /// assert_eq!(opt.manager().memory().live_arrays, 2); // m and v
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    Adam, "adam", false
}

adam_type! {
    /// AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay, PyTorch's
    /// update rule exactly. At step `t` (from 1):
    ///
    /// ```text
    /// p = p - lr * weight_decay * p                  (decoupled decay, before the update)
    /// m = beta1 * m + (1 - beta1) * g
    /// v = beta2 * v + (1 - beta2) * g²
    /// p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    /// ```
    ///
    /// PyTorch's default weight decay for AdamW is 0.01 ([`AdamConfig::adamw`]). State
    /// and allocation as [`Adam`].
    ///
    /// ```
    /// use ndscope::optim::{AdamConfig, AdamW, Optimizer};
    /// use ndscope::NDManager;
    /// let m = NDManager::new();
    /// let w = m.create(&[2.0f64], [1]).set_requires_gradient(true);
    /// let mut opt = AdamW::new(&m, &[w], AdamConfig { lr: 0.1, weight_decay: 0.5, ..Default::default() });
    /// opt.step(); // zero gradient: only the decay acts, w = 2 (1 - 0.1 * 0.5)
    /// assert!((w.to_vec::<f64>()?[0] - 1.9).abs() < 1e-15);
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    AdamW, "adamw", true
}

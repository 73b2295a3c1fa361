//! [`Sgd`]: stochastic gradient descent with momentum, dampening, Nesterov momentum and
//! weight decay (PyTorch's `torch.optim.SGD`).

#[cfg(feature = "gpu")]
use super::kernel::Scalars;
use super::kernel::{Update, update};
use super::{Optimizer, State, check_finite};
use crate::dtype::Float;
use crate::error::{NdError, Result};
use crate::{NDArray, NDManager};
#[cfg(feature = "gpu")]
use std::fmt::Write;

/// Hyper-parameters of [`Sgd`]; the defaults are PyTorch's (`lr` 1e-3, no momentum,
/// no weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate (≥ 0).
    pub lr: f64,
    /// Momentum factor (≥ 0; 0 for plain SGD, which keeps no state).
    pub momentum: f64,
    /// Dampening of the momentum (0 by default; must be 0 with Nesterov).
    pub dampening: f64,
    /// Nesterov momentum (needs a momentum > 0 and no dampening).
    pub nesterov: bool,
    /// L2 penalty added to the gradient (≥ 0).
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

/// Stochastic gradient descent, PyTorch's update rule exactly. With gradient `g` of
/// parameter `p`, momentum buffer `b`, at step `t` (from 1):
///
/// ```text
/// g = g + weight_decay * p                          (if weight_decay != 0)
/// b = g                                             (t = 1)
/// b = momentum * b + (1 - dampening) * g            (t > 1)
/// g = g + momentum * b   (Nesterov)   or   g = b    (if momentum != 0)
/// p = p - lr * g
/// ```
///
/// The momentum buffers (`"<i>.momentum_buffer"` in [`Optimizer::named_state`]) live in
/// the optimizer's own sub-manager ([`Optimizer::manager`]), made once by
/// [`Sgd::new`]; a step updates them and the parameters in place and allocates
/// nothing.
///
/// ```
/// use ndscope::optim::{Optimizer, Sgd, SgdConfig};
/// use ndscope::{GradientCollector, NDManager};
/// let m = NDManager::new();
/// let w = m.create(&[1.0f64, -2.0], [2]).set_requires_gradient(true);
/// let mut opt = Sgd::new(&m, &[w], SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
/// for _ in 0..2 {
///     let gc = GradientCollector::new();
///     gc.backward(w.square().sum())?;               // gradient 2w
///     opt.step();
/// }
/// // Step 1: b = 2w = [2, -4], w = [0.8, -1.6];
/// // step 2: b = 0.9 b + 2w = [3.4, -6.8], w = [0.46, -0.92].
/// let v = w.to_vec::<f64>()?;
/// assert!((v[0] - 0.46).abs() < 1e-12 && (v[1] + 0.92).abs() < 1e-12);
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    state: State,
    config: SgdConfig,
}

/// First momentum step: `b = g + wd p` (inputs `g`, `p`).
struct BufInit {
    wd: f64,
}

impl Update for BufInit {
    #[inline(always)]
    fn apply<T: Float>(&self, _b: T, g: T, p: T) -> T {
        decayed(g, p, self.wd)
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        let wd = wd_name(self.wd, s);
        write_decayed(out, "x", "y", wd);
    }
}

/// Later momentum steps: `b = momentum b + (1 - dampening) (g + wd p)`.
struct Buf {
    momentum: f64,
    one_minus_dampening: f64,
    wd: f64,
}

impl Update for Buf {
    #[inline(always)]
    fn apply<T: Float>(&self, b: T, g: T, p: T) -> T {
        let g = decayed(g, p, self.wd);
        b.mul(T::from_f64(self.momentum))
            .add(T::from_f64(self.one_minus_dampening).mul(g))
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        let wd = wd_name(self.wd, s);
        let (m, d) = (s.push(self.momentum), s.push(self.one_minus_dampening));
        let _ = write!(out, "t * {m} + {d} * ");
        write_decayed(out, "x", "y", wd);
    }
}

/// The parameter: `p = p - lr d`, `d` by the momentum kind (inputs `g` and `b`; `b`
/// is `g` itself without momentum).
struct Param {
    lr: f64,
    wd: f64,
    momentum: f64,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    Momentum,
    Nesterov,
}

impl Update for Param {
    #[inline(always)]
    fn apply<T: Float>(&self, p: T, g: T, b: T) -> T {
        let g = decayed(g, p, self.wd);
        let d = match self.kind {
            Kind::Plain => g,
            Kind::Momentum => b,
            Kind::Nesterov => g.add(T::from_f64(self.momentum).mul(b)),
        };
        p.add(T::from_f64(-self.lr).mul(d))
    }

    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String) {
        let wd = wd_name(self.wd, s);
        let momentum = (self.kind == Kind::Nesterov).then(|| s.push(self.momentum));
        let _ = write!(out, "t + {} * ", s.push(-self.lr));
        match (self.kind, momentum) {
            (Kind::Momentum, _) => out.push('y'),
            (Kind::Nesterov, Some(m)) => {
                out.push('(');
                write_decayed(out, "x", "t", wd);
                let _ = write!(out, " + {m} * y)");
            }
            _ => write_decayed(out, "x", "t", wd),
        }
    }
}

/// The kernel's name for weight decay `wd` (bound once), or `None` when it is 0.
#[cfg(feature = "gpu")]
pub(super) fn wd_name(wd: f64, s: &mut Scalars) -> Option<&'static str> {
    (wd != 0.0).then(|| s.push(wd))
}

/// [`decayed`] in WGSL over the operands named `g` and `p`, with `wd` the name of the
/// weight decay ([`wd_name`]): `(g + wd * p)`, or `g`.
#[cfg(feature = "gpu")]
pub(super) fn write_decayed(out: &mut String, g: &str, p: &str, wd: Option<&str>) {
    match wd {
        Some(w) => {
            let _ = write!(out, "({g} + {w} * {p})");
        }
        None => out.push_str(g),
    }
}

/// `g + wd p` (PyTorch's `grad.add(param, alpha=weight_decay)`), or `g` when `wd` is 0.
#[inline(always)]
pub(super) fn decayed<T: Float>(g: T, p: T, wd: f64) -> T {
    if wd != 0.0 {
        g.add(T::from_f64(wd).mul(p))
    } else {
        g
    }
}

impl Sgd {
    /// An optimizer for `params` (each must require a gradient), its state in a new
    /// sub-manager of `m`. Panics on failure (see [`Sgd::try_new`]).
    #[track_caller]
    pub fn new(m: &NDManager, params: &[NDArray], config: SgdConfig) -> Sgd {
        crate::error::unwrap(Sgd::try_new(m, params, config))
    }

    /// [`Sgd::new`]. Errors: `InvalidArgument` (a negative or non-finite learning
    /// rate, momentum or weight decay; Nesterov without momentum or with dampening; no
    /// parameter, a parameter twice, or one that does not require a gradient), `Closed`
    /// (a parameter), `ManagerClosed`/`ManagerCapped` (of `m`). Nothing is left in `m`
    /// on an error.
    #[track_caller]
    pub fn try_new(m: &NDManager, params: &[NDArray], config: SgdConfig) -> Result<Sgd> {
        check_finite("sgd", "learning rate", config.lr, true)?;
        check_finite("sgd", "momentum", config.momentum, true)?;
        check_finite("sgd", "weight decay", config.weight_decay, true)?;
        check_finite("sgd", "dampening", config.dampening, false)?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(NdError::invalid(
                "sgd",
                "Nesterov momentum requires a momentum and zero dampening",
            ));
        }
        let buffers = usize::from(config.momentum != 0.0);
        let state = State::new("sgd", "Sgd", m, params, buffers)?;
        Ok(Sgd { state, config })
    }

    /// The hyper-parameters (the learning rate as last set).
    pub fn config(&self) -> SgdConfig {
        self.config
    }
}

impl Optimizer for Sgd {
    fn try_step(&mut self) -> Result<()> {
        self.state.check("sgd")?;
        let c = &self.config;
        let first = self.state.steps == 0;
        let kind = match (c.momentum != 0.0, c.nesterov) {
            (false, _) => Kind::Plain,
            (true, false) => Kind::Momentum,
            (true, true) => Kind::Nesterov,
        };
        let param = Param {
            lr: c.lr,
            wd: c.weight_decay,
            momentum: c.momentum,
            kind,
        };
        for (i, &p) in self.state.params.iter().enumerate() {
            let g = p.try_gradient()?;
            if kind == Kind::Plain {
                update("sgd", p, g, g, &param)?;
                continue;
            }
            let b = self.state.buffers[i];
            if first {
                update("sgd", b, g, p, &BufInit { wd: c.weight_decay })?;
            } else {
                let rule = Buf {
                    momentum: c.momentum,
                    one_minus_dampening: 1.0 - c.dampening,
                    wd: c.weight_decay,
                };
                update("sgd", b, g, p, &rule)?;
            }
            update("sgd", p, g, b, &param)?;
        }
        self.state.steps += 1;
        Ok(())
    }

    fn parameters(&self) -> &[NDArray] {
        &self.state.params
    }

    fn learning_rate(&self) -> f64 {
        self.config.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    fn step_count(&self) -> u64 {
        self.state.steps
    }

    fn set_step_count(&mut self, steps: u64) {
        self.state.steps = steps;
    }

    fn manager(&self) -> &NDManager {
        &self.state.manager
    }

    fn named_state(&self) -> Vec<(String, NDArray)> {
        self.state.named(&["momentum_buffer"])
    }
}

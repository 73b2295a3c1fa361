//! The elementwise ops by kind: the vocabulary that the array layer (which runs them),
//! the gradient tape (which records them) and the backends (whose kernels apply them)
//! share. Each kind's per-element function is beside its kernel (`array/ops.rs`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// A binary arithmetic op of two arrays, or of an array and a scalar.
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

impl BinOp {
    /// The op's name, in errors and profiles.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Pow => "pow",
            BinOp::Maximum => "maximum",
            BinOp::Minimum => "minimum",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// An elementwise unary op with a gradient rule of its own.
pub(crate) enum UnOp {
    Abs,
    Neg,
    Square,
    Relu,
    Exp,
    Log,
    Sqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
}

impl UnOp {
    /// The op's name, in errors and profiles.
    pub(crate) fn name(self) -> &'static str {
        match self {
            UnOp::Abs => "abs",
            UnOp::Neg => "neg",
            UnOp::Square => "square",
            UnOp::Relu => "relu",
            UnOp::Exp => "exp",
            UnOp::Log => "log",
            UnOp::Sqrt => "sqrt",
            UnOp::Sin => "sin",
            UnOp::Cos => "cos",
            UnOp::Tanh => "tanh",
            UnOp::Sigmoid => "sigmoid",
        }
    }
}

/// Elementwise comparisons (to Bool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl CmpOp {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The more elementwise math of `array/unary.rs` (`erf` to `sign`), each with its
/// derivative.
pub(crate) enum Fn1 {
    Erf,
    Gelu,
    Silu,
    Softplus,
    LeakyRelu,
    Reciprocal,
    Rsqrt,
    Log1p,
    Expm1,
    Floor,
    Ceil,
    Round,
    Sign,
}

impl Fn1 {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fn1::Erf => "erf",
            Fn1::Gelu => "gelu",
            Fn1::Silu => "silu",
            Fn1::Softplus => "softplus",
            Fn1::LeakyRelu => "leaky_relu",
            Fn1::Reciprocal => "reciprocal",
            Fn1::Rsqrt => "rsqrt",
            Fn1::Log1p => "log1p",
            Fn1::Expm1 => "expm1",
            Fn1::Floor => "floor",
            Fn1::Ceil => "ceil",
            Fn1::Round => "round",
            Fn1::Sign => "sign",
        }
    }

    pub(crate) fn backward_name(self) -> &'static str {
        match self {
            Fn1::Erf => "erf_backward",
            Fn1::Gelu => "gelu_backward",
            Fn1::Silu => "silu_backward",
            Fn1::Softplus => "softplus_backward",
            Fn1::LeakyRelu => "leaky_relu_backward",
            Fn1::Reciprocal => "reciprocal_backward",
            Fn1::Rsqrt => "rsqrt_backward",
            Fn1::Log1p => "log1p_backward",
            Fn1::Expm1 => "expm1_backward",
            Fn1::Floor | Fn1::Ceil | Fn1::Round | Fn1::Sign => "nondifferentiable",
        }
    }

    /// Piecewise constant: not recorded (documented as non-differentiable).
    pub(crate) fn differentiable(self) -> bool {
        !matches!(self, Fn1::Floor | Fn1::Ceil | Fn1::Round | Fn1::Sign)
    }

    /// Also defined on integer dtypes (floor, ceil, round: identity; sign).
    pub(crate) fn on_integers(self) -> bool {
        !self.differentiable()
    }
}

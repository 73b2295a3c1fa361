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

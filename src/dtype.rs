//! Element types: the [`DType`] tag, the [`Element`] trait for Rust types that can be
//! copied in and out of arrays, and the [`Scalar`] trait for operator right-hand sides.

use std::fmt;

/// The element type of an array.
///
/// `Bool` is stored as one byte per element holding `0` or `1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean (one byte, `0` or `1`).
    Bool,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// The lower-case name, as numpy spells it (`"f32"`, `"bool"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types whose bytes a buffer may be viewed as: every bit pattern of
/// `size_of::<Self>()` bytes is a valid value, there is no padding, and the alignment
/// is at most 64 (a buffer's). `Buffer::slice` (the CPU backend) relies on it, so implementing it is
/// `unsafe`; the engine implements it for the five machine types and `Native` (the
/// kernels' element trait) requires it.
///
/// # Safety
/// Implement only for types meeting the three conditions above.
pub(crate) unsafe trait Plain: Copy + 'static {}

// SAFETY: primitive integers and floats: no padding, every bit pattern valid (NaN
// payloads included), alignment <= 8.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for i64 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for f64 {}

/// The machine type an array's bytes hold (`Bool` is held as `u8`). Kernels are
/// written once over this trait and instantiated per dtype by `dispatch!`. Buffers
/// are viewed as slices of it, which [`Plain`] guarantees sound.
pub(crate) trait Native:
    Plain + Copy + Send + Sync + PartialOrd + PartialEq + fmt::Debug + 'static
{
    const ZERO: Self;
    const ONE: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_i64(v: i64) -> Self;
    fn to_i64(self) -> i64;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Division; integer division by zero gives 0 instead of trapping.
    fn div(self, o: Self) -> Self;
    fn pow(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn max_of(self, o: Self) -> Self {
        // NaN propagates, as in numpy's `maximum`.
        if self.is_nan() || self > o { self } else { o }
    }
    fn min_of(self, o: Self) -> Self {
        if self.is_nan() || self < o { self } else { o }
    }
    fn is_nan(self) -> bool;
    /// The larger of two values, a NaN ignored (`f32::max`): without a branch, unlike
    /// [`max_of`](Native::max_of), which propagates NaN.
    fn max_num(self, o: Self) -> Self;
    /// `if k { a } else { b }` through a bit mask, never a branch: a loop of it
    /// vectorises (LLVM turns a plain `if` between two loads into a load through a
    /// chosen pointer, one element at a time, and a branch on random masks).
    fn pick(k: bool, a: Self, b: Self) -> Self;
    /// Lowest value (the identity of `max`).
    const LOWEST: Self;
    /// Highest value (the identity of `min`).
    const HIGHEST: Self;
}

macro_rules! native_int {
    ($t:ty) => {
        impl Native for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn pow(self, o: Self) -> Self {
                if o < 0 {
                    // `1 / x^n` truncated toward zero: exact for 1 and -1 (-1 to an odd
                    // power is -1), 0 for every other base, 0 for a base of 0 too (as
                    // PyTorch's integer `pow`; numpy raises instead).
                    if self == 1 {
                        1
                    } else if self.wrapping_add(1) == 0 {
                        if o & 1 == 0 { 1 } else { self }
                    } else {
                        0
                    }
                } else if let Ok(e) = u32::try_from(o as i64) {
                    self.wrapping_pow(e)
                } else {
                    // An exponent past u32 (I64 only): square and multiply, wrapping.
                    let (mut base, mut e, mut acc) = (self, o as u64, 1 as $t);
                    while e > 0 {
                        if e & 1 == 1 {
                            acc = acc.wrapping_mul(base);
                        }
                        base = base.wrapping_mul(base);
                        e >>= 1;
                    }
                    acc
                }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                (0 as $t).wrapping_sub(self)
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn abs(self) -> Self {
                if self < 0 { self.neg() } else { self }
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                false
            }
            #[inline(always)]
            fn max_num(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn pick(k: bool, a: Self, b: Self) -> Self {
                let m = (0 as $t).wrapping_sub(k as $t);
                (a & m) | (b & !m)
            }
        }
    };
}
native_int!(i32);
native_int!(i64);
native_int!(u8);

macro_rules! native_float {
    ($t:ty, $bits:ty) => {
        impl Native for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn pow(self, o: Self) -> Self {
                self.powf(o)
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn abs(self) -> Self {
                self.abs()
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn max_num(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            #[inline(always)]
            fn pick(k: bool, a: Self, b: Self) -> Self {
                let m = (0 as $bits).wrapping_sub(k as $bits);
                <$t>::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
            }
        }
    };
}
native_float!(f32, u32);
native_float!(f64, u64);

/// Float-only math used by the unary kernels.
pub(crate) trait Float: Native {
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
}

macro_rules! float_math {
    ($t:ty) => {
        impl Float for $t {
            #[inline(always)]
            fn exp(self) -> Self {
                self.exp()
            }
            #[inline(always)]
            fn ln(self) -> Self {
                self.ln()
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                self.sqrt()
            }
            #[inline(always)]
            fn sin(self) -> Self {
                self.sin()
            }
            #[inline(always)]
            fn cos(self) -> Self {
                self.cos()
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                self.tanh()
            }
        }
    };
}
float_math!(f32);
float_math!(f64);

/// A Rust type that can be copied into and out of arrays.
///
/// Implemented for `f32`, `f64`, `i32`, `i64`, `u8` and `bool`. Sealed: the set of
/// element types is fixed by [`DType`].
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    /// The dtype arrays of this element type have.
    const DTYPE: DType;
    #[doc(hidden)]
    fn elem_to_f64(self) -> f64;
    #[doc(hidden)]
    fn elem_from_f64(v: f64) -> Self;
    #[doc(hidden)]
    fn elem_to_i64(self) -> i64;
    #[doc(hidden)]
    fn elem_from_i64(v: i64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn elem_to_f64(self) -> f64 {
                self as f64
            }
            fn elem_from_f64(v: f64) -> Self {
                v as $t
            }
            fn elem_to_i64(self) -> i64 {
                self as i64
            }
            fn elem_from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn elem_to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn elem_from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn elem_to_i64(self) -> i64 {
        self as i64
    }
    fn elem_from_i64(v: i64) -> Self {
        v != 0
    }
}

/// A scalar on the right-hand side of an operator (`a * 2.0`, `a + 1`).
///
/// The scalar takes the array's dtype (as numpy's "weak" Python scalars do for
/// same-kind operands): `int_array * 2.5` multiplies by `2`. Implemented for `f32`,
/// `f64`, `i32`, `i64` and `u8`.
pub trait Scalar: sealed::Sealed + Copy {
    #[doc(hidden)]
    fn value(self) -> ScalarValue;
}

/// A scalar held exactly: integers stay integers so `i64` values keep every bit.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarValue {
    Float(f64),
    Int(i64),
}

impl ScalarValue {
    pub(crate) fn cast<T: Native>(self) -> T {
        match self {
            ScalarValue::Float(v) => T::from_f64(v),
            ScalarValue::Int(v) => T::from_i64(v),
        }
    }

    /// The bits of `self` cast to `dtype` as [`ScalarValue::cast`] casts it, in the low
    /// bytes of a word (a GPU kernel's scalar).
    #[cfg(feature = "gpu")]
    pub(crate) fn bits(self, dtype: DType) -> u64 {
        match dtype {
            DType::F32 => u64::from(self.cast::<f32>().to_bits()),
            DType::F64 => self.cast::<f64>().to_bits(),
            DType::I32 => u64::from(self.cast::<i32>() as u32),
            DType::I64 => self.cast::<i64>() as u64,
            DType::U8 | DType::Bool => u64::from(self.cast::<u8>()),
        }
    }
}

macro_rules! scalar {
    ($t:ty, $variant:ident, $conv:ty) => {
        impl Scalar for $t {
            fn value(self) -> ScalarValue {
                ScalarValue::$variant(self as $conv)
            }
        }
    };
}
scalar!(f32, Float, f64);
scalar!(f64, Float, f64);
scalar!(i32, Int, i64);
scalar!(i64, Int, i64);
scalar!(u8, Int, i64);

/// Run `$body` with `$T` bound to the native type of `$dtype` (Bool as `u8`).
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U8 | $crate::DType::Bool => {
                type $T = u8;
                $body
            }
        }
    };
}

/// Like `dispatch!` for float dtypes only; other dtypes evaluate `$else`.
macro_rules! dispatch_float {
    ($dtype:expr, $T:ident => $body:expr, else $else:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => $else,
        }
    };
}

pub(crate) use {dispatch, dispatch_float};

#[cfg(test)]
mod tests {
    use super::Native;

    /// `pick` hands back the chosen value's exact bits (NaN payloads, -0.0, extremes)
    /// for every native type, whichever side is chosen.
    #[test]
    fn pick_keeps_the_chosen_bits() {
        fn check<T: Native + std::fmt::Debug>(a: T, b: T, bits: impl Fn(T) -> u64) {
            assert_eq!(bits(T::pick(true, a, b)), bits(a));
            assert_eq!(bits(T::pick(false, a, b)), bits(b));
            assert_eq!(bits(T::pick(true, b, a)), bits(b));
            assert_eq!(bits(T::pick(false, b, a)), bits(a));
        }
        let nan = f32::from_bits(0x7fc0_1234);
        check(nan, -0.0f32, |v| v.to_bits() as u64);
        check(f32::NEG_INFINITY, f32::MIN_POSITIVE, |v| v.to_bits() as u64);
        check(f64::from_bits(0xfff8_0000_0000_0abc), 0.0f64, f64::to_bits);
        check(-1.5f64, f64::MAX, f64::to_bits);
        check(i32::MIN, -1i32, |v| v as u32 as u64);
        check(i64::MAX, i64::MIN, |v| v as u64);
        check(0u8, 255u8, |v| v as u64);
    }
}

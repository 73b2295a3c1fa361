//! Indexing with DJL/numpy-style index strings: `a.get("1:3, :, 0")`, `a.set("..., 0", 1.0)`.
//!
//! Grammar: comma-separated items, one per axis from the left, each one of
//! * an integer `i` (negative counts from the end): selects one position and removes
//!   the axis; out of range is an error;
//! * a slice `start:stop` or `start:stop:step`, any part optional (`:`, `1:`, `::2`,
//!   `5::-1`): keeps the axis; bounds clamp like Python, the step must not be 0 and may
//!   be negative (the result then walks the axis backwards);
//! * `...`: as many `:` as needed to cover the axes not named (at most one).
//!
//! Axes left over at the end are taken whole. The empty string selects everything.

use super::NDArray;
use super::ops::Rhs;
use crate::DType;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::dtype::{Native, ScalarValue, dispatch};
use crate::engine::{self, Layout, Output};
use crate::error::{ArrayDesc, NdError, Result, SourceLocation, twins};
use crate::shape::{Dims, Shape};
use std::panic::Location;

/// One parsed index item.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Item {
    Index(isize),
    Slice(Option<isize>, Option<isize>, Option<isize>),
    Ellipsis,
}

fn parse_int(s: &str, what: &str) -> std::result::Result<isize, String> {
    s.parse::<isize>()
        .map_err(|_| format!("invalid {what} '{s}' (expected an integer)"))
}

/// `s` without surrounding whitespace (as [`str::trim`]); a part with printable ASCII at
/// both ends, the usual case, is returned as it is without decoding any character.
#[inline]
fn trim(s: &str) -> &str {
    match s.as_bytes() {
        [first, .., last] if first.is_ascii_graphic() && last.is_ascii_graphic() => s,
        [only] if only.is_ascii_graphic() => s,
        _ => s.trim(),
    }
}

/// `s` split at each `sep`, an ASCII byte (so every split falls on a char boundary);
/// a byte scan, cheaper than a char pattern for the few bytes of an index.
fn split_at(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.bytes().position(|b| b == sep) {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Parsed items: four inline (the parse allocates nothing for usual indices).
type Items = smallvec::SmallVec<[Item; 4]>;

fn parse(index: &str) -> std::result::Result<Items, String> {
    let trimmed = trim(index);
    let mut items = Items::new();
    if trimmed.is_empty() {
        return Ok(items);
    }
    let mut parts = split_at(trimmed, b',').map(trim).enumerate().peekable();
    while let Some((k, p)) = parts.next() {
        if p.is_empty() {
            // Python accepts one trailing comma (`a[1,]`).
            if k > 0 && parts.peek().is_none() {
                break;
            }
            return Err(format!("empty item {k} in index '{index}'"));
        }
        if p == "..." {
            if items.contains(&Item::Ellipsis) {
                return Err(format!("more than one '...' in index '{index}'"));
            }
            items.push(Item::Ellipsis);
        } else if p.as_bytes().contains(&b':') {
            let mut bounds = split_at(p, b':').map(trim);
            let b = [bounds.next(), bounds.next(), bounds.next()];
            if bounds.next().is_some() {
                return Err(format!("slice '{p}' has more than two ':'"));
            }
            let part = |i: usize, what: &str| -> std::result::Result<Option<isize>, String> {
                match b[i] {
                    None | Some("") => Ok(None),
                    Some(s) => parse_int(s, what).map(Some),
                }
            };
            let step = part(2, "slice step")?;
            if step == Some(0) {
                return Err(format!("slice step cannot be zero in '{p}'"));
            }
            items.push(Item::Slice(
                part(0, "slice start")?,
                part(1, "slice stop")?,
                step,
            ));
        } else {
            items.push(Item::Index(parse_int(p, "index")?));
        }
    }
    Ok(items)
}

/// Start and length of a Python slice over an axis of size `n` (i128 so extreme bounds
/// and steps cannot overflow).
fn slice_range(n: usize, start: Option<isize>, stop: Option<isize>, step: isize) -> (i128, i128) {
    let n = n as i128;
    let step = step as i128;
    let norm = |v: isize| {
        let v = v as i128;
        if v < 0 { v + n } else { v }
    };
    if step > 0 {
        let start = start.map_or(0, |v| norm(v).clamp(0, n));
        let stop = stop.map_or(n, |v| norm(v).clamp(0, n));
        let len = match stop - start {
            d if d <= 0 => 0,
            d if step == 1 => d, // the usual slice: no 128-bit division
            d => (d + step - 1) / step,
        };
        (start, len)
    } else {
        // -1 stands for "before the first element".
        let start = start.map_or(n - 1, |v| norm(v).clamp(-1, n - 1));
        let stop = stop.map_or(-1, |v| norm(v).clamp(-1, n - 1));
        let len = if start > stop {
            (start - stop - step - 1) / -step
        } else {
            0
        };
        (start, len)
    }
}

/// The layout `index` selects from `layout`; the message on error.
pub(crate) fn select(layout: &Layout, index: &str) -> std::result::Result<Layout, String> {
    let items = parse(index)?;
    let nd = layout.shape.ndim();
    let named = items.iter().filter(|i| **i != Item::Ellipsis).count();
    if named > nd {
        return Err(format!(
            "too many indices: '{index}' names {named} axes of a {nd}-d array"
        ));
    }
    let mut shape = Dims::new();
    let mut strides = crate::layout::Strides::new();
    let mut offset = layout.offset as i128;
    // One item per axis: `...` stands for the axes not named, and axes left over at
    // the end are taken whole.
    let whole = Item::Slice(None, None, None);
    let mut per_axis = items.iter().copied();
    let mut ellipsis_left = 0;
    for axis in 0..nd {
        let it = loop {
            if ellipsis_left > 0 {
                ellipsis_left -= 1;
                break Item::Ellipsis;
            }
            match per_axis.next() {
                Some(Item::Ellipsis) => ellipsis_left = nd - named,
                Some(it) => break it,
                None => break whole,
            }
        };
        let (n, stride) = (layout.shape.0[axis], layout.strides[axis]);
        match it {
            Item::Index(i) => {
                let j = if i < 0 {
                    i as i128 + n as i128
                } else {
                    i as i128
                };
                if j < 0 || j >= n as i128 {
                    return Err(format!(
                        "index {i} is out of bounds for axis {axis} with size {n}"
                    ));
                }
                offset += j * stride as i128;
            }
            Item::Slice(start, stop, step) => {
                let step = step.unwrap_or(1);
                let (start, len) = slice_range(n, start, stop, step);
                if len > 0 {
                    offset += start * stride as i128;
                }
                shape.push(len as usize);
                // A longer slice stays inside the axis, so `stride * step` is bounded
                // by the buffer size; a single element's stride is never used.
                strides.push(if len > 1 { stride * step } else { stride });
            }
            Item::Ellipsis => {
                shape.push(n);
                strides.push(stride);
            }
        }
    }
    Ok(Layout {
        shape: Shape(shape),
        strides,
        offset: offset as usize,
    })
}

fn index_error(op: &'static str, msg: String, array: Box<ArrayDesc>) -> NdError {
    NdError::Index { op, msg, array }
}

fn get(x: NDArray, index: &str, at: SourceLocation) -> Result<NDArray> {
    let id = engine::run_op_on("get", &[x.id], at, |o| {
        let o = &o[0];
        let layout = select(o.layout, index).map_err(|m| index_error("get", m, o.desc()))?;
        Ok(Output::View { of: 0, layout })
    })?;
    autograd::record(&[x.id], id, || GetRule(index.into()));
    Ok(NDArray { id })
}

/// `s` as a `T`, with `Bool` targets storing `0`/`1`.
fn scalar_as<T: Native>(s: ScalarValue, dtype: DType) -> T {
    if dtype != DType::Bool {
        return s.cast();
    }
    let nonzero = match s {
        ScalarValue::Float(v) => v != 0.0,
        ScalarValue::Int(v) => v != 0,
    };
    T::from_i64(nonzero as i64)
}

fn set(x: NDArray, index: &str, value: Rhs) -> Result<()> {
    crate::autograd::check_inplace("set", x.id)?;
    let ids = match value {
        Rhs::Array(v) => {
            crate::autograd::check_inplace_source("set", x.id, v.id)?;
            vec![v.id]
        }
        Rhs::Scalar(_) => Vec::new(),
    };
    engine::run_inplace_on("set", x.id, &ids, |mut t, ops| {
        let sub = select(&t.layout, index).map_err(|m| index_error("set", m, t.desc()))?;
        match value {
            Rhs::Array(_) => {
                let v = &ops[0];
                if v.dtype != t.dtype {
                    return Err(NdError::DTypeMismatch {
                        op: "set",
                        lhs: t.desc(),
                        rhs: v.desc(),
                    });
                }
                if Shape::broadcast(&sub.shape, v.shape()).as_ref() != Some(&sub.shape) {
                    let mut region = t.desc();
                    region.shape = sub.shape.clone();
                    return Err(NdError::ShapeMismatch {
                        op: "set",
                        lhs: region,
                        rhs: v.desc(),
                    });
                }
                t.layout = sub;
                #[cfg(feature = "gpu")]
                if let Some(g) = t.gpu() {
                    return crate::backend::wgpu::inplace::assign("set", g, v.gpu(), "x", 0);
                }
                dispatch!(t.dtype, T => cpu::assign_binary::<T>(&mut t, v, |_, y| y));
            }
            Rhs::Scalar(s) => {
                t.layout = sub;
                #[cfg(feature = "gpu")]
                if let Some(g) = t.gpu() {
                    let bits = match s {
                        _ if g.dtype == DType::Bool => scalar_as::<u8>(s, DType::Bool).into(),
                        _ => s.bits(g.dtype),
                    };
                    return crate::backend::wgpu::inplace::assign("set", g, None, "s", bits);
                }
                dispatch!(t.dtype, T => {
                    let s: T = scalar_as(s, t.dtype);
                    cpu::assign_unary::<T>(&mut t, move |_| s)
                });
            }
        }
        Ok(())
    })
}

impl NDArray {
    twins! {
        /// A view of the elements selected by a DJL/numpy-style index string, sharing
        /// storage with `self`. Panics on error (see [`NDArray::try_get`]).
        ///
        /// The string holds comma-separated items, one per axis from the left:
        /// * an integer `i` (negative counts from the end) selects one position and removes
        ///   the axis; out of range is an error;
        /// * a slice `start:stop` or `start:stop:step`, any part optional (`:`, `1:`,
        ///   `::2`, `5::-1`), keeps the axis; bounds clamp like Python, the step must not
        ///   be 0 and may be negative (the view then walks the axis backwards);
        /// * `...` stands for as many `:` as needed to cover the axes not named (at most
        ///   one).
        ///
        /// Axes left over at the end are taken whole; the empty string selects everything.
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.arange(0.0, 12.0, 1.0, DType::F32).reshape([3, 4]);
        /// assert_eq!(a.get("1").to_vec::<f32>()?, vec![4.0, 5.0, 6.0, 7.0]);
        /// assert_eq!(a.get(":, -1").to_vec::<f32>()?, vec![3.0, 7.0, 11.0]);
        /// assert_eq!(a.get("0, ::-2").to_vec::<f32>()?, vec![3.0, 1.0]);
        /// assert_eq!(a.get("1:, 1:3").shape().dims(), &[2, 2]);
        /// assert_eq!(a.get("..., 0").to_vec::<f32>()?, vec![0.0, 4.0, 8.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn get,
        /// [`NDArray::get`]. Errors: `Index` (malformed string, integer index out of range,
        /// too many indices), `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_get(self, index: &str) -> NDArray {
            get(self, index, Location::caller())
        }
    }

    twins! {
        /// Write `value` (a scalar, or an array of the same dtype that broadcasts to the
        /// selected region) into the region `index` selects, in place. Views sharing the
        /// storage see the change. Panics on error (see [`NDArray::try_set`]).
        ///
        /// The write is not recorded for autograd: while a [`GradientCollector`]
        /// records, writing into an array the tape depends on, or writing a `value` that
        /// is a parameter or a recorded result (its gradient would be lost), is an error.
        ///
        /// [`GradientCollector`]: crate::GradientCollector
        ///
        /// ```
        /// use ndscope::{DType, NDManager};
        /// let m = NDManager::new();
        /// let a = m.zeros([2, 3], DType::F32);
        /// a.set("0", 1.0);
        /// a.set(":, 2", m.create(&[7.0f32, 8.0], [2]));
        /// assert_eq!(a.to_vec::<f32>()?, vec![1.0, 1.0, 7.0, 0.0, 0.0, 8.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn set,

        /// [`NDArray::set`]. Errors: `Index` (as for [`NDArray::try_get`]),
        /// `DTypeMismatch`, `ShapeMismatch` (the value does not broadcast to the region),
        /// `InvalidArgument` (while a collector records: `self` is an array the tape
        /// depends on, or `value` is a parameter or a recorded result), `Closed`.
        pub fn try_set(self, index: &str, value: impl Into<Rhs>) -> () {
            set(self, index, value.into())
        }
    }
}

/// The gradient of an index view (`get`): `g` written into zeros of the input's shape
/// at the same index.
struct GetRule(Box<str>);

impl Backward for GetRule {
    fn name(&self) -> &'static str {
        "get"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let z = crate::array::grad::full_beside(g, cx.shapes[0].clone(), 0.0)?;
        z.try_set(&self.0, g)?;
        Ok([Some(z)].into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(shape: &[usize], index: &str) -> std::result::Result<Layout, String> {
        select(&Layout::contiguous(Shape::from(shape)), index)
    }

    #[test]
    fn parses_items() {
        assert_eq!(
            parse(" 1 : 3 , -1, ..., ::-2 ").unwrap()[..],
            [
                Item::Slice(Some(1), Some(3), None),
                Item::Index(-1),
                Item::Ellipsis,
                Item::Slice(None, None, Some(-2)),
            ]
        );
        assert_eq!(parse("1,").unwrap()[..], [Item::Index(1)]);
        assert_eq!(parse(" 1 , ").unwrap()[..], [Item::Index(1)]);
        assert_eq!(parse(",").unwrap_err(), "empty item 0 in index ','");
        assert_eq!(parse("1, ,").unwrap_err(), "empty item 1 in index '1, ,'");
        assert!(parse("1,,2").is_err());
        // Whitespace is trimmed as `str::trim` does, Unicode included.
        assert_eq!(
            parse("\t1\n,\u{3000}:2 ,x").unwrap_err(),
            "invalid index 'x' (expected an integer)"
        );
        assert_eq!(
            parse("\t1\n,\u{3000}:2\u{a0}").unwrap()[..],
            [Item::Index(1), Item::Slice(None, Some(2), None)]
        );
        assert_eq!(parse(":").unwrap()[..], [Item::Slice(None, None, None)]);
        assert_eq!(parse("::").unwrap()[..], [Item::Slice(None, None, None)]);
        assert_eq!(parse(" 7 ").unwrap()[..], [Item::Index(7)]);
        assert_eq!(
            parse("1:2:3, 4, 5, 6, 7").unwrap()[..],
            [
                Item::Slice(Some(1), Some(2), Some(3)),
                Item::Index(4),
                Item::Index(5),
                Item::Index(6),
                Item::Index(7)
            ]
        );
        assert!(parse("a").is_err());
        assert!(parse("1:2:3:4").is_err());
        assert!(parse("::0").is_err());
        assert!(parse("...,...").is_err());
    }

    #[test]
    fn slices_clamp_like_python() {
        let r = |n, a, b, s| slice_range(n, a, b, s);
        assert_eq!(r(5, None, None, 1), (0, 5));
        assert_eq!(r(5, Some(-2), None, 1), (3, 2));
        assert_eq!(r(5, Some(1), Some(100), 2), (1, 2));
        assert_eq!(r(5, None, None, -1), (4, 5));
        assert_eq!(r(5, Some(3), Some(0), -1), (3, 3));
        assert_eq!(r(5, Some(100), None, -2), (4, 3));
        assert_eq!(r(5, Some(-100), None, -1), (-1, 0));
        assert_eq!(r(5, Some(3), Some(1), 1), (3, 0));
        assert_eq!(r(0, None, None, -1), (-1, 0));
        assert_eq!(r(5, None, None, isize::MIN), (4, 1));
    }

    #[test]
    fn layouts() {
        let l = sel(&[3, 4], "1").unwrap();
        assert_eq!(
            (l.shape.dims(), &l.strides[..], l.offset),
            (&[4][..], &[1][..], 4)
        );
        let l = sel(&[3, 4], "::-1, 1").unwrap();
        assert_eq!(
            (l.shape.dims(), &l.strides[..], l.offset),
            (&[3][..], &[-4][..], 9)
        );
        let l = sel(&[2, 3, 4], "..., 1:").unwrap();
        assert_eq!(l.shape.dims(), &[2, 3, 3]);
        assert_eq!(l.offset, 1);
        assert_eq!(sel(&[2, 3], "").unwrap().shape.dims(), &[2, 3]);
        assert_eq!(sel(&[2, 3], "...").unwrap().shape.dims(), &[2, 3]);
        assert_eq!(
            sel(&[2, 3], "1, 2, ...").unwrap().shape.dims(),
            &[] as &[usize]
        );
        assert!(sel(&[2, 3], "2").unwrap_err().contains("out of bounds"));
        assert!(sel(&[2, 3], "-3").is_err());
        assert!(sel(&[2, 3], "0, 0, 0").unwrap_err().contains("too many"));
    }
}

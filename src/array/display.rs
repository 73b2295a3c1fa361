//! `Display` for [`NDArray`]: numpy-style printing.
//!
//! A port of numpy's `str(array)` with `precision=4`: floats print the shortest form
//! with at most 4 decimals and a trailing `.` when integral, aligned on the decimal
//! point (scientific notation when the magnitudes call for it, as numpy decides);
//! integers print plain and right-aligned; bools print `true` / `false`. Arrays with
//! more than 1000 elements are summarised with `...` (3 items at each edge of every
//! long axis), lines wrap at 75 columns, and a 0-d array prints its scalar. A closed
//! array prints `<closed array #uid>`; printing never panics.
//!
//! ```
//! use ndscope::NDManager;
//! let m = NDManager::new();
//! let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
//! assert_eq!(a.to_string(), "[[1., 2.],\n [3., 4.]]");
//! let b = m.create(&[1.0f64, 2.5, -3.25], [3]);
//! assert_eq!(b.to_string(), "[ 1.  ,  2.5 , -3.25]");
//! let i = m.create(&[1i32, -20, 300], [3]);
//! assert_eq!(i.to_string(), "[  1, -20, 300]");
//! a.close();
//! assert_eq!(a.to_string(), format!("<closed array #{}>", a.uid()));
//! ```

use super::NDArray;
use crate::DType;
use std::collections::HashMap;
use std::fmt;

/// Arrays with more elements than this are summarised (numpy's `threshold`).
const THRESHOLD: usize = 1000;
/// Items shown at each edge of a summarised axis (numpy's `edgeitems`).
const EDGE_ITEMS: usize = 3;
/// Line width for wrapping the last axis (numpy's `linewidth`).
const LINE_WIDTH: usize = 75;
/// Most decimals a float prints with (numpy's `precision`, here 4).
const PRECISION: usize = 4;

impl fmt::Display for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match render(*self) {
            Some(s) => f.write_str(&s),
            None => write!(f, "<closed array #{}>", self.uid()),
        }
    }
}

/// The element values of an array, converted for formatting.
enum Values {
    Float(Vec<f64>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

fn to_f64<T: Into<f64>>(v: Vec<T>) -> Values {
    Values::Float(v.into_iter().map(Into::into).collect())
}

fn to_i64<T: Into<i64>>(v: Vec<T>) -> Values {
    Values::Int(v.into_iter().map(Into::into).collect())
}

/// The text of a live array, or `None` if it is closed (even if it is closed by another
/// thread while being read).
fn render(a: NDArray) -> Option<String> {
    let dtype = a.try_dtype().ok()?;
    let shape = a.try_shape().ok()?;
    let values = match dtype {
        DType::F32 => to_f64(a.to_vec::<f32>().ok()?),
        DType::F64 => to_f64(a.to_vec::<f64>().ok()?),
        DType::I32 => to_i64(a.to_vec::<i32>().ok()?),
        DType::I64 => to_i64(a.to_vec::<i64>().ok()?),
        DType::U8 => to_i64(a.to_vec::<u8>().ok()?),
        DType::Bool => Values::Bool(a.to_vec::<bool>().ok()?),
    };
    Some(format_values(shape.dims(), &values))
}

/// Format row-major `values` of shape `dims` the way numpy's `str()` does.
fn format_values(dims: &[usize], values: &Values) -> String {
    let size: usize = dims.iter().product();
    if size == 0 {
        return "[]".to_string();
    }
    if dims.is_empty() {
        return format_scalar(values);
    }
    let layout = Layout::new(dims, size > THRESHOLD);
    let mut shown = Vec::new();
    layout.shown(0, 0, &mut shown);
    let cells = format_cells(values, &shown);
    let mut out = String::new();
    layout.block(&cells, 0, 0, " ", LINE_WIDTH, &mut out);
    out
}

/// A 0-d array prints like the scalar itself (`1.0`, `0.3333`, `7`, `true`).
fn format_scalar(values: &Values) -> String {
    let mut s = format_cells(values, &[0]).remove(&0).unwrap_or_default();
    if let Some(m) = s.strip_suffix('.') {
        s = format!("{m}.0");
    } else if s.contains(".e") {
        s = s.replacen(".e", "e", 1);
    }
    s
}

/// Shape walker: which elements are shown and how the nested brackets are laid out.
struct Layout<'a> {
    dims: &'a [usize],
    strides: Vec<usize>,
    summarise: bool,
}

impl<'a> Layout<'a> {
    fn new(dims: &'a [usize], summarise: bool) -> Self {
        let mut strides = vec![1; dims.len()];
        for k in (0..dims.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * dims[k + 1];
        }
        Layout {
            dims,
            strides,
            summarise,
        }
    }

    /// The indices shown along `axis`, with `None` standing for the `...` marker.
    fn items(&self, axis: usize) -> Vec<Option<usize>> {
        let n = self.dims[axis];
        if self.summarise && n > 2 * EDGE_ITEMS {
            (0..EDGE_ITEMS)
                .map(Some)
                .chain(std::iter::once(None))
                .chain((n - EDGE_ITEMS..n).map(Some))
                .collect()
        } else {
            (0..n).map(Some).collect()
        }
    }

    /// Collect the flat indices of every element that will be printed.
    fn shown(&self, axis: usize, offset: usize, out: &mut Vec<usize>) {
        for i in self.items(axis).into_iter().flatten() {
            let at = offset + i * self.strides[axis];
            if axis + 1 == self.dims.len() {
                out.push(at);
            } else {
                self.shown(axis + 1, at, out);
            }
        }
    }

    /// numpy's `_formatArray` recursion: one bracketed block along `axis`. Each line
    /// of the block starts with `hanging` (the first one's is replaced by `[`).
    fn block(
        &self,
        cells: &HashMap<usize, String>,
        axis: usize,
        offset: usize,
        hanging: &str,
        width: usize,
        out: &mut String,
    ) {
        let next_hanging = format!("{hanging} ");
        let next_width = width.saturating_sub(1);
        let items = self.items(axis);
        let last_axis = axis + 1 == self.dims.len();
        let mut s = String::new();
        if last_axis {
            let elem_width = width.saturating_sub(1);
            let mut line = hanging.to_string();
            for (k, item) in items.iter().enumerate() {
                let word = match item {
                    Some(i) => cells[&(offset + i * self.strides[axis])].as_str(),
                    None => "...",
                };
                extend_line(&mut s, &mut line, word, elem_width, hanging);
                if k + 1 < items.len() {
                    line.push_str(", ");
                }
            }
            s.push_str(&line);
        } else {
            let line_sep = format!(",{}", "\n".repeat(self.dims.len() - axis - 1));
            for (k, item) in items.iter().enumerate() {
                s.push_str(hanging);
                match item {
                    Some(i) => {
                        let at = offset + i * self.strides[axis];
                        self.block(cells, axis + 1, at, &next_hanging, next_width, &mut s);
                    }
                    None => s.push_str("..."),
                }
                if k + 1 < items.len() {
                    s.push_str(&line_sep);
                }
            }
        }
        out.push('[');
        out.push_str(&s[hanging.len()..]);
        out.push(']');
    }
}

/// numpy's `_extendLine`: append `word` to `line`, first wrapping to a new line (that
/// starts with `hanging`) when it would pass `width`, unless wrapping would not help.
fn extend_line(s: &mut String, line: &mut String, word: &str, width: usize, hanging: &str) {
    if line.len() + word.len() > width && line.len() > hanging.len() {
        s.push_str(line.trim_end());
        s.push('\n');
        *line = hanging.to_string();
    }
    line.push_str(word);
}

/// Format the elements at `shown`, padded to a common width.
fn format_cells(values: &Values, shown: &[usize]) -> HashMap<usize, String> {
    match values {
        Values::Float(v) => {
            let xs: Vec<f64> = shown.iter().map(|&i| v[i]).collect();
            let fmt = FloatFormat::new(&xs);
            shown.iter().map(|&i| (i, fmt.format(v[i]))).collect()
        }
        Values::Int(v) => pad_left(shown, |i| v[i].to_string()),
        Values::Bool(v) => pad_left(shown, |i| v[i].to_string()),
    }
}

fn pad_left(shown: &[usize], text: impl Fn(usize) -> String) -> HashMap<usize, String> {
    let texts: Vec<(usize, String)> = shown.iter().map(|&i| (i, text(i))).collect();
    let width = texts.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    texts
        .into_iter()
        .map(|(i, s)| (i, format!("{s:>width$}")))
        .collect()
}

/// numpy's `FloatingFormat` in `maxprec` mode: one layout shared by all printed values.
struct FloatFormat {
    exp: bool,
    /// Width of the integer part (sign included).
    pad_left: usize,
    /// Positional: width of the fraction part (padded with spaces). Scientific: digits
    /// of the mantissa's fraction (padded with zeros).
    pad_right: usize,
    /// Digits of the exponent (at least 2).
    exp_digits: usize,
}

/// A finite value split for alignment: integer part, fraction digits, exponent.
struct Parts {
    int: String,
    frac: String,
    exp: Option<i32>,
}

fn positional(x: f64) -> Parts {
    let s = format!("{x:.PRECISION$}");
    let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
    Parts {
        int: int.to_string(),
        frac: frac.trim_end_matches('0').to_string(),
        exp: None,
    }
}

fn scientific(x: f64) -> Parts {
    let s = format!("{x:.PRECISION$e}");
    let (mantissa, exp) = s.split_once('e').expect("`e` format has an exponent");
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    Parts {
        int: int.to_string(),
        frac: frac.trim_end_matches('0').to_string(),
        exp: Some(exp.parse().expect("`e` format has an integer exponent")),
    }
}

impl FloatFormat {
    fn new(xs: &[f64]) -> Self {
        let finite: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        let nonzero = finite.iter().map(|x| x.abs()).filter(|&x| x != 0.0);
        let (min, max) = nonzero.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        let exp = max > 0.0 && (max >= 1e8 || min < 1e-4 || max / min > 1e3);
        let parts: Vec<Parts> = finite
            .iter()
            .map(|&x| if exp { scientific(x) } else { positional(x) })
            .collect();
        let mut pad_left = parts.iter().map(|p| p.int.len()).max().unwrap_or(0);
        let pad_right = parts.iter().map(|p| p.frac.len()).max().unwrap_or(0);
        let exp_digits = parts
            .iter()
            .filter_map(|p| p.exp)
            .map(|e| e.unsigned_abs().to_string().len().max(2))
            .max()
            .unwrap_or(0);
        if finite.len() != xs.len() {
            // Make room for `nan`, `inf` and `-inf`, right-aligned to the full width.
            let neg_inf = xs.contains(&f64::NEG_INFINITY);
            let tail = if exp {
                pad_right + exp_digits + 3
            } else {
                pad_right + 1
            };
            let longest: usize = if neg_inf { 4 } else { 3 };
            pad_left = pad_left.max(longest.saturating_sub(tail));
        }
        FloatFormat {
            exp,
            pad_left,
            pad_right,
            exp_digits,
        }
    }

    fn width(&self) -> usize {
        if self.exp {
            self.pad_left + 1 + self.pad_right + 2 + self.exp_digits
        } else {
            self.pad_left + 1 + self.pad_right
        }
    }

    fn format(&self, x: f64) -> String {
        let width = self.width();
        if !x.is_finite() {
            let s = if x.is_nan() {
                "nan"
            } else if x > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            return format!("{s:>width$}");
        }
        let (pad_left, pad_right) = (self.pad_left, self.pad_right);
        if self.exp {
            let p = scientific(x);
            let e = p.exp.unwrap_or(0);
            let sign = if e < 0 { '-' } else { '+' };
            let digits = self.exp_digits;
            format!(
                "{:>pad_left$}.{:0<pad_right$}e{sign}{:0>digits$}",
                p.int,
                p.frac,
                e.unsigned_abs()
            )
        } else {
            let p = positional(x);
            format!("{:>pad_left$}.{:<pad_right$}", p.int, p.frac)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NDManager;

    fn floats(dims: &[usize], v: &[f64]) -> String {
        format_values(dims, &Values::Float(v.to_vec()))
    }

    #[test]
    fn floats_align_on_the_point() {
        assert_eq!(floats(&[2, 2], &[1., 2., 3., 4.]), "[[1., 2.],\n [3., 4.]]");
        assert_eq!(floats(&[3], &[1., 2.5, 3.25]), "[1.  , 2.5 , 3.25]");
        assert_eq!(floats(&[2], &[-1.5, 10.0]), "[-1.5, 10. ]");
        assert_eq!(floats(&[2], &[1.0 / 3.0, 2.0]), "[0.3333, 2.    ]");
        assert_eq!(floats(&[2], &[0.12345, 0.5]), "[0.1235, 0.5   ]");
    }

    #[test]
    fn floats_switch_to_scientific_like_numpy() {
        assert_eq!(floats(&[2], &[1e-5, 1.0]), "[1.e-05, 1.e+00]");
        assert_eq!(floats(&[2], &[1.5e10, 2.0]), "[1.5e+10, 2.0e+00]");
        assert_eq!(floats(&[1], &[1e100]), "[1.e+100]");
    }

    #[test]
    fn non_finite_values() {
        assert_eq!(
            floats(&[3], &[f64::NAN, 1.0, f64::NEG_INFINITY]),
            "[ nan,   1., -inf]"
        );
        assert_eq!(floats(&[2], &[f64::INFINITY, 0.5]), "[inf, 0.5]");
    }

    #[test]
    fn three_dims_separate_blocks_with_a_blank_line() {
        let v: Vec<f64> = (0..8).map(f64::from).collect();
        assert_eq!(
            floats(&[2, 2, 2], &v),
            "[[[0., 1.],\n  [2., 3.]],\n\n [[4., 5.],\n  [6., 7.]]]"
        );
    }

    #[test]
    fn long_rows_wrap_at_75_columns() {
        let v: Vec<i64> = (0..30).map(|x| x * 1000).collect();
        let s = format_values(&[30], &Values::Int(v));
        assert!(s.lines().count() > 1, "{s}");
        assert!(s.lines().all(|l| l.len() <= LINE_WIDTH), "{s}");
        assert!(s.starts_with("[    0,  1000,"), "{s}");
        assert!(s.lines().nth(1).unwrap().starts_with(" 10000,"), "{s}");
    }

    #[test]
    fn summarised_past_1000_elements() {
        let m = NDManager::new();
        let a = m.arange(0.0, 1001.0, 1.0, crate::DType::I64);
        assert_eq!(a.to_string(), "[   0,    1,    2, ...,  998,  999, 1000]");
        let v: Vec<i32> = (0..2000).collect();
        let b = m.create(&v, [40, 50]);
        assert_eq!(
            b.to_string(),
            "[[   0,    1,    2, ...,   47,   48,   49],\n \
             [  50,   51,   52, ...,   97,   98,   99],\n \
             [ 100,  101,  102, ...,  147,  148,  149],\n \
             ...,\n \
             [1850, 1851, 1852, ..., 1897, 1898, 1899],\n \
             [1900, 1901, 1902, ..., 1947, 1948, 1949],\n \
             [1950, 1951, 1952, ..., 1997, 1998, 1999]]"
        );
        let small = m.zeros([1000], crate::DType::U8);
        assert!(!small.to_string().contains("..."));
        m.close();
    }

    #[test]
    fn scalars_bools_empty_and_closed() {
        let m = NDManager::new();
        assert_eq!(m.scalar(1.0f32).to_string(), "1.0");
        assert_eq!(m.scalar(0.25f64).to_string(), "0.25");
        assert_eq!(m.scalar(7i64).to_string(), "7");
        assert_eq!(m.scalar(true).to_string(), "true");
        let b = m.create(&[true, false, true], [3]);
        assert_eq!(b.to_string(), "[ true, false,  true]");
        assert_eq!(m.create(&[true, true], [2]).to_string(), "[true, true]");
        assert_eq!(floats(&[0], &[]), "[]");
        assert_eq!(floats(&[2, 0], &[]), "[]");
        let u = m.create(&[1u8, 255], [2]);
        assert_eq!(u.to_string(), "[  1, 255]");
        let c = m.ones([2], crate::DType::F32);
        c.close();
        assert_eq!(c.to_string(), format!("<closed array #{}>", c.uid()));
        m.close();
        assert!(b.to_string().starts_with("<closed array #"));
    }

    #[test]
    fn empty_arrays_print_brackets() {
        let m = NDManager::new();
        assert_eq!(m.zeros([0], crate::DType::F32).to_string(), "[]");
        assert_eq!(m.zeros([2, 0], crate::DType::I64).to_string(), "[]");
        m.close();
    }
}

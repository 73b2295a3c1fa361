//! Data for training loops: minibatches over in-memory arrays ([`Batches`]), a
//! train/test split ([`train_test_split`]) and the bundled digits data set
//! ([`load_digits`]).
//!
//! A batch's arrays are made when the batch is taken (`next()`), so they belong to
//! the scope that is current there and are freed when it closes: with a scope per
//! training step, memory stays flat for any number of epochs. They are owned by the
//! source arrays' manager (an op's result belongs to its first input's manager).
//!
//! Take the batch after opening the step's scope:
//!
//! ```
//! use ndscope::{DType, NDManager, NDScope, data::Batches};
//! let m = NDManager::new();
//! let x = m.arange(0.0, 20.0, 1.0, DType::F32).reshape([10, 2]);
//! let y = m.arange(0.0, 10.0, 1.0, DType::I64);
//! let batches = Batches::new(&[x, y], 4).shuffle(7);
//! assert_eq!(batches.len(), 3);                     // 4 + 4 + 2 rows
//! let live = m.memory().live_arrays;
//! for _epoch in 0..3 {
//!     let mut it = batches.iter();                  // a new permutation each epoch
//!     loop {
//!         let _step = NDScope::new();               // frees the step's arrays,
//!         let Some(batch) = it.next() else { break }; // the batch included
//!         let (xb, yb) = (batch[0], batch[1]);
//!         let _loss = (xb.sum() + yb.to_dtype(DType::F32).sum()) * 0.5;
//!     }
//!     assert_eq!(m.memory().live_arrays, live);     // flat
//! }
//! ```
//!
//! In a `for batch in batches.iter()` loop the batch is taken before the body's
//! scope opens, so it belongs to the enclosing scope (an epoch's scope, say): memory
//! is then flat across epochs, and grows within one by a batch's arrays per step
//! (views of the data when unshuffled; copies when shuffled).
//! [`Batches::for_each_step`] runs a closure per batch with the scope opened first,
//! the same pattern without the loop.
// `load_digits` needs the default feature `io`.
#![cfg_attr(not(feature = "io"), allow(rustdoc::broken_intra_doc_links))]

use crate::backend::cpu::gather::index_select_kernel;
use crate::backend::cpu::new_overwritten;
use crate::dtype::dispatch;
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::ext::{self, Output};
use crate::{NDArray, Shape};
use std::cell::Cell;
use std::panic::Location;

// ------------------------------------------------------------------ permutations

/// SplitMix64: a tiny generator with a fixed definition, so a seed gives the same
/// permutation on every platform and with every version of the `rand` crate.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), unbiased (Lemire's multiply-and-reject).
    fn below(&mut self, n: u64) -> u64 {
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = (self.next() as u128) * (n as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// The permutation of `0..n` for `(seed, epoch)`: a Fisher-Yates shuffle driven by
/// SplitMix64 seeded from both. It depends on nothing else.
pub(crate) fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let key = SplitMix64(seed).next() ^ SplitMix64(!epoch).next();
    let mut rng = SplitMix64(key);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

// ------------------------------------------------------------------ row gather

/// A new contiguous array holding rows `rows` of `x` (any layout), owned by `x`'s
/// manager and registered in the current scope. Not recorded for autograd.
// The kernel is `index_select`'s; the op is not `x.index_select(0, rows)` itself
// because that takes the rows as an index array, which would cost one more array per
// batch.
fn gather_rows(x: NDArray, rows: &[usize], at: SourceLocation) -> Result<NDArray> {
    ext::custom_op("gather_rows", [x], at, |[o]| {
        let l = o.layout();
        let mut dims = l.shape.0.clone();
        dims[0] = rows.len();
        let shape = Shape(dims);
        let n = shape.size();
        let buf = dispatch!(o.dtype(), T => new_overwritten::<T>(n, |out| {
            index_select_kernel::<T>(o.view::<T>().data, l, 0, rows, out)
        }))?;
        Ok(Output::New {
            buf,
            shape,
            dtype: o.dtype(),
        })
    })
}

/// Rows `start..end` of `x` as a view (no copy).
fn row_slice(x: NDArray, start: usize, end: usize, at: SourceLocation) -> Result<NDArray> {
    ext::custom_op("row_slice", [x], at, |[o]| {
        let l = o.layout();
        let mut layout = l.clone();
        layout.shape.0[0] = end - start;
        if end > start {
            layout.offset = (l.offset as isize + start as isize * l.strides[0]) as usize;
        }
        Ok(Output::View { of: 0, layout })
    })
}

// ------------------------------------------------------------------ batches

/// The rows shared by `arrays` (all with the same first dimension), or an error.
fn common_rows(op: &'static str, arrays: &[NDArray]) -> Result<usize> {
    let Some(first) = arrays.first() else {
        return Err(NdError::invalid(op, "no arrays given"));
    };
    let shape0 = first.try_shape()?;
    if shape0.ndim() == 0 {
        return Err(NdError::shape(
            op,
            format!("{first:?} is 0-d: arrays need a first axis to split into rows"),
        ));
    }
    let rows = shape0.dims()[0];
    for a in &arrays[1..] {
        let s = a.try_shape()?;
        if s.ndim() == 0 || s.dims()[0] != rows {
            return Err(NdError::shape(
                op,
                format!(
                    "every array needs the same first dimension: {first:?} has {rows} rows, \
                     {a:?} has {}",
                    s.dims().first().map_or("none".into(), |d| d.to_string())
                ),
            ));
        }
    }
    Ok(rows)
}

/// Minibatches over in-memory arrays that share their first dimension (samples
/// along axis 0): `Batches::new(&[x, y], 32)`.
///
/// Each epoch ([`Batches::iter`]) yields `ceil(rows / batch_size)` batches (or
/// `floor` with [`Batches::drop_last`]); batch `i` holds the arrays' rows
/// `i * batch_size ..` in order, or, with [`Batches::shuffle`], those positions of a
/// permutation of the rows that is new each epoch. Every row appears exactly once
/// per epoch (except the dropped tail).
///
/// A batch is a `Vec` with one array per source array, in the same order, made when
/// the batch is taken: unshuffled batches are views of the sources (no copy), and
/// shuffled ones are new contiguous arrays gathered from the rows. Either way they
/// are owned by the sources' manager and registered in the scope that is current
/// where the batch is taken. Batches are data: they are not recorded for autograd.
///
/// ```
/// use ndscope::{DType, NDManager, data::Batches};
/// let m = NDManager::new();
/// let x = m.arange(0.0, 5.0, 1.0, DType::F64);
/// let batches = Batches::new(&[x], 2);
/// let got: Vec<Vec<f64>> = batches.iter().map(|b| b[0].to_vec().unwrap()).collect();
/// assert_eq!(got, vec![vec![0.0, 1.0], vec![2.0, 3.0], vec![4.0]]);
///
/// let shuffled = Batches::new(&[x], 2).shuffle(42).drop_last(true);
/// let epoch0: Vec<Vec<f64>> = shuffled.iter().map(|b| b[0].to_vec().unwrap()).collect();
/// assert_eq!(epoch0.len(), 2);                      // the fifth row is dropped
/// assert_eq!(shuffled.epoch(), 1);                  // the next iter() is epoch 1
/// let replay: Vec<Vec<f64>> = shuffled.iter_epoch(0).map(|b| b[0].to_vec().unwrap()).collect();
/// assert_eq!(replay, epoch0);                       // same seed, same epoch, same order
/// ```
#[derive(Debug)]
pub struct Batches {
    arrays: Vec<NDArray>,
    rows: usize,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    next_epoch: Cell<u64>,
}

impl Batches {
    /// Batches of `batch_size` rows over `arrays`. Panics on error (see
    /// [`Batches::try_new`]).
    #[track_caller]
    pub fn new(arrays: &[NDArray], batch_size: usize) -> Batches {
        unwrap(Batches::try_new(arrays, batch_size))
    }

    /// [`Batches::new`]. Errors: `InvalidArgument` (no arrays, `batch_size` 0),
    /// `InvalidShape` (a 0-d array, or first dimensions that differ), `Closed`.
    pub fn try_new(arrays: &[NDArray], batch_size: usize) -> Result<Batches> {
        const OP: &str = "Batches::new";
        let rows = common_rows(OP, arrays)?;
        if batch_size == 0 {
            return Err(NdError::invalid(OP, "batch_size must be at least 1"));
        }
        Ok(Batches {
            arrays: arrays.to_vec(),
            rows,
            batch_size,
            seed: None,
            drop_last: false,
            next_epoch: Cell::new(0),
        })
    }

    /// Shuffle the rows each epoch: epoch `e` uses a permutation that depends only
    /// on `(seed, e)` (a Fisher-Yates shuffle driven by SplitMix64, the same on every
    /// platform), so two `Batches` with one seed yield the same batches, and each
    /// epoch a different order. Not numpy's or PyTorch's stream.
    pub fn shuffle(mut self, seed: u64) -> Batches {
        self.seed = Some(seed);
        self
    }

    /// Drop the last batch of each epoch when it has fewer than `batch_size` rows
    /// (PyTorch's `DataLoader(drop_last=True)`); by default it is kept.
    pub fn drop_last(mut self, drop: bool) -> Batches {
        self.drop_last = drop;
        self
    }

    /// The number of rows (samples).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows per batch (the last batch of an epoch may have fewer).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        if self.drop_last {
            self.rows / self.batch_size
        } else {
            self.rows.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The epoch the next [`Batches::iter`] will yield (0 at first).
    pub fn epoch(&self) -> u64 {
        self.next_epoch.get()
    }

    /// The batches of the next epoch (then the epoch counter moves on, so each call
    /// gives the next epoch's order).
    pub fn iter(&self) -> BatchIter<'_> {
        let e = self.next_epoch.get();
        self.next_epoch.set(e.wrapping_add(1));
        self.iter_epoch(e)
    }

    /// The batches of epoch `epoch`, without moving the epoch counter (replay an
    /// epoch, or resume a run at a given epoch).
    pub fn iter_epoch(&self, epoch: u64) -> BatchIter<'_> {
        BatchIter {
            batches: self,
            order: self.seed.map(|s| permutation(self.rows, s, epoch)),
            next: 0,
            end: self.len(),
        }
    }

    /// Run `step` on each batch of the next epoch, each call inside a scope of its own
    /// that the batch is taken in: the step's arrays, the batch included, are freed
    /// when it returns, so memory stays flat within an epoch as well as across epochs
    /// (the `for batch in batches.iter()` form takes the batch before the body's scope
    /// opens). The step's return value is dropped with its scope; keep results in
    /// long-lived arrays (a parameter update) or as plain values.
    ///
    /// ```
    /// use ndscope::{DType, NDManager, data::Batches};
    /// let m = NDManager::new();
    /// let x = m.arange(0.0, 12.0, 1.0, DType::F32).reshape([6, 2]);
    /// let batches = Batches::new(&[x], 2).shuffle(3);
    /// let live = m.memory().live_arrays;
    /// let mut total = 0.0;
    /// batches.for_each_step(|b| {
    ///     total += b[0].sum().to_scalar::<f32>().unwrap();
    ///     assert_eq!(m.memory().live_arrays, live + 2); // the batch and its sum
    /// });
    /// assert_eq!(total, 66.0);
    /// assert_eq!(m.memory().live_arrays, live);
    /// ```
    #[track_caller]
    pub fn for_each_step(&self, mut step: impl FnMut(&[NDArray])) {
        unwrap(self.try_for_each_step(|b| {
            step(b);
            Ok(())
        }))
    }

    /// [`Batches::for_each_step`] with a fallible step: the first error (taking a batch
    /// or from `step`) ends the epoch early and is returned, after that step's scope
    /// has freed its arrays.
    #[track_caller]
    pub fn try_for_each_step(&self, mut step: impl FnMut(&[NDArray]) -> Result<()>) -> Result<()> {
        let mut it = self.iter();
        loop {
            let _step = crate::NDScope::new();
            let Some(batch) = it.try_next()? else {
                return Ok(());
            };
            step(&batch)?;
        }
    }

    /// The row order of epoch `epoch` (`0..rows` unshuffled).
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        match self.seed {
            Some(s) => permutation(self.rows, s, epoch),
            None => (0..self.rows).collect(),
        }
    }
}

impl<'a> IntoIterator for &'a Batches {
    type Item = Vec<NDArray>;
    type IntoIter = BatchIter<'a>;
    /// [`Batches::iter`]: the next epoch.
    fn into_iter(self) -> BatchIter<'a> {
        self.iter()
    }
}

/// The batches of one epoch (see [`Batches`]). Iterating panics if a source array
/// was closed; [`BatchIter::try_next`] returns the error instead.
#[derive(Debug)]
pub struct BatchIter<'a> {
    batches: &'a Batches,
    order: Option<Vec<usize>>,
    next: usize,
    end: usize,
}

impl BatchIter<'_> {
    /// The next batch, `Ok(None)` at the end of the epoch. Errors: `Closed` (a
    /// source array was closed), `ManagerClosed`/`ManagerCapped` (its manager takes
    /// no new arrays), `OutOfMemory`. Nothing is left allocated on error.
    #[track_caller]
    pub fn try_next(&mut self) -> Result<Option<Vec<NDArray>>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let at = Location::caller();
        let b = self.batches;
        let start = self.next * b.batch_size;
        let stop = (start + b.batch_size).min(b.rows);
        let mut out = Vec::with_capacity(b.arrays.len());
        for &a in &b.arrays {
            let made = match &self.order {
                None => row_slice(a, start, stop, at),
                Some(p) => gather_rows(a, &p[start..stop], at),
            };
            match made {
                Ok(x) => out.push(x),
                Err(e) => {
                    out.iter().for_each(|x| x.close());
                    return Err(e);
                }
            }
        }
        self.next += 1;
        Ok(Some(out))
    }
}

impl Iterator for BatchIter<'_> {
    type Item = Vec<NDArray>;

    #[track_caller]
    fn next(&mut self) -> Option<Vec<NDArray>> {
        unwrap(self.try_next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for BatchIter<'_> {}

// ------------------------------------------------------------------ split

/// How many rows [`train_test_split`] puts in the test set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TestSize {
    /// A fraction in `[0, 1]` of the rows, rounded up: `ceil(fraction * rows)`
    /// (scikit-learn's rule: 0.2 of 1,797 rows is 360).
    Fraction(f64),
    /// Exactly this many rows (at most all of them).
    Count(usize),
}

fn split_impl(
    arrays: &[NDArray],
    test: TestSize,
    shuffle: Option<u64>,
    at: SourceLocation,
) -> Result<(Vec<NDArray>, Vec<NDArray>)> {
    const OP: &str = "train_test_split";
    let rows = common_rows(OP, arrays)?;
    let n_test = match test {
        TestSize::Fraction(f) if (0.0..=1.0).contains(&f) => (f * rows as f64).ceil() as usize,
        TestSize::Fraction(f) => {
            return Err(NdError::invalid(
                OP,
                format!("the test fraction must be in [0, 1], got {f}"),
            ));
        }
        TestSize::Count(n) if n <= rows => n,
        TestSize::Count(n) => {
            return Err(NdError::invalid(
                OP,
                format!("{n} test rows asked of {rows} rows"),
            ));
        }
    };
    let n_train = rows - n_test;
    let order = shuffle.map(|s| permutation(rows, s, 0));
    let mut made: Vec<NDArray> = Vec::with_capacity(2 * arrays.len());
    let mut take = |a: NDArray, lo: usize, hi: usize| -> Result<NDArray> {
        let r = match &order {
            None => row_slice(a, lo, hi, at),
            Some(p) => gather_rows(a, &p[lo..hi], at),
        };
        if let Ok(x) = r {
            made.push(x);
        }
        r
    };
    let result = (|| {
        let train = arrays
            .iter()
            .map(|&a| take(a, 0, n_train))
            .collect::<Result<Vec<_>>>()?;
        let test = arrays
            .iter()
            .map(|&a| take(a, n_train, rows))
            .collect::<Result<Vec<_>>>()?;
        Ok((train, test))
    })();
    if result.is_err() {
        made.iter().for_each(|x| x.close());
    }
    result
}

/// Split arrays that share their first dimension into a train part and a test
/// part, row-wise: returns `(train, test)`, one array per input in each, in input
/// order.
///
/// Exact semantics: `n_test` rows go to the test set (see [`TestSize`]) and the
/// other `n_train = rows - n_test` to the train set. Without shuffling (`None`),
/// train is rows `0..n_train` and test is rows `n_train..rows`, as views of the
/// inputs (no copy). With `Some(seed)`, the rows are first permuted by
/// [`Batches`]' permutation for `(seed, epoch 0)`: train is rows
/// `perm[..n_train]` and test rows `perm[n_train..]`, in that order, gathered into new
/// arrays. (scikit-learn takes the test set first from its own permutation, so a
/// seed does not reproduce its split.) Results are owned by each input's manager and
/// registered in the current scope. Panics on error (see [`try_train_test_split`]).
///
/// ```
/// use ndscope::{DType, NDManager, data::{TestSize, train_test_split}};
/// let m = NDManager::new();
/// let x = m.arange(0.0, 10.0, 1.0, DType::F32).reshape([5, 2]);
/// let y = m.arange(0.0, 5.0, 1.0, DType::I64);
/// let (train, test) = train_test_split(&[x, y], TestSize::Count(2), None);
/// assert_eq!(train[0].shape().dims(), &[3, 2]);
/// assert_eq!(test[1].to_vec::<i64>()?, vec![3, 4]);           // the last two rows
/// let (train, test) = train_test_split(&[x, y], TestSize::Fraction(0.5), Some(1));
/// assert_eq!((train[1].size(), test[1].size()), (2, 3));      // ceil(2.5) = 3 test rows
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn train_test_split(
    arrays: &[NDArray],
    test: TestSize,
    shuffle: Option<u64>,
) -> (Vec<NDArray>, Vec<NDArray>) {
    unwrap(split_impl(arrays, test, shuffle, Location::caller()))
}

/// [`train_test_split`]. Errors: `InvalidArgument` (no arrays, a fraction outside
/// `[0, 1]` or not a number, more test rows than rows), `InvalidShape` (a 0-d array,
/// first dimensions that differ), `Closed`. Nothing is left allocated on error.
#[track_caller]
pub fn try_train_test_split(
    arrays: &[NDArray],
    test: TestSize,
    shuffle: Option<u64>,
) -> Result<(Vec<NDArray>, Vec<NDArray>)> {
    split_impl(arrays, test, shuffle, Location::caller())
}

// ------------------------------------------------------------------ digits

/// scikit-learn's `digits.csv.gz`, shipped in `data/` (see `data/README.md`).
#[cfg(feature = "io")]
const DIGITS_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// Samples and pixels per sample of the digits data set.
#[cfg(feature = "io")]
const DIGITS_SHAPE: (usize, usize) = (1797, 64);

#[cfg(feature = "io")]
#[track_caller]
fn load_digits_impl(m: &crate::NDManager, gz: &[u8]) -> Result<(NDArray, NDArray)> {
    use std::io::Read;
    const OP: &str = "load_digits";
    let path = std::path::Path::new("data/digits.csv.gz");
    let bad = |msg: String| NdError::Format {
        op: OP,
        path: path.to_path_buf(),
        msg,
    };
    let mut text = String::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("not a gzip'd text file: {e}")))?;
    let (n, d) = DIGITS_SHAPE;
    let mut pixels = Vec::with_capacity(n * d);
    let mut labels = Vec::with_capacity(n);
    for (i, line) in text.lines().enumerate() {
        let mut k = 0;
        for field in line.split(',') {
            let v: f64 = field
                .trim()
                .parse()
                .map_err(|_| bad(format!("line {}: '{field}' is not a number", i + 1)))?;
            if k < d {
                if !(0.0..=16.0).contains(&v) {
                    return Err(bad(format!("line {}: pixel {v} outside 0..16", i + 1)));
                }
                pixels.push((v / 16.0) as f32);
            } else if k == d && v.fract() == 0.0 && (0.0..=9.0).contains(&v) {
                labels.push(v as i64);
            } else {
                return Err(bad(format!(
                    "line {}: expected {d} pixels and a label 0..9",
                    i + 1
                )));
            }
            k += 1;
        }
        if k != d + 1 {
            return Err(bad(format!(
                "line {}: {k} fields, expected {}",
                i + 1,
                d + 1
            )));
        }
    }
    if labels.len() != n {
        return Err(bad(format!("{} samples, expected {n}", labels.len())));
    }
    let x = m.try_create(&pixels, [n, d])?;
    match m.try_create(&labels, [n]) {
        Ok(y) => Ok((x, y)),
        Err(e) => {
            x.close();
            Err(e)
        }
    }
}

/// scikit-learn's 8×8 handwritten digits (UCI "Optical Recognition of Handwritten
/// Digits", CC BY 4.0; the file ships in the crate as `data/digits.csv.gz`, see
/// `data/README.md`): `(x, y)` with `x` the pixels divided by 16 (`f32 [1797, 64]`,
/// values in `[0, 1]`, each row an 8×8 image in row-major order) and `y` the labels
/// (`i64 [1797]`, 0 to 9), in the file's order, as `sklearn.datasets.load_digits()`.
/// Both are new arrays of `m`, registered in the current scope. Needs the default
/// feature `io` (the file is gzip'd; it is embedded in the library, so no file is
/// read at run time). Panics on error (see [`try_load_digits`]).
///
/// ```
/// use ndscope::{NDManager, data};
/// let m = NDManager::new();
/// let (x, y) = data::load_digits(&m);
/// assert_eq!(x.shape().dims(), &[1797, 64]);
/// assert_eq!(y.get("0:5").to_vec::<i64>()?, vec![0, 1, 2, 3, 4]);
/// // The digits example's split: the first 1437 samples train, the last 360 test.
/// let (train, test) = data::train_test_split(&[x, y], data::TestSize::Count(360), None);
/// assert_eq!((train[0].shape().dims()[0], test[1].size()), (1437, 360));
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[cfg(feature = "io")]
#[track_caller]
pub fn load_digits(m: &crate::NDManager) -> (NDArray, NDArray) {
    unwrap(load_digits_impl(m, DIGITS_GZ))
}

/// [`load_digits`]. Errors: `ManagerClosed`/`ManagerCapped`, `OutOfMemory`
/// (`Format` only if the embedded file were damaged).
#[cfg(feature = "io")]
#[track_caller]
pub fn try_load_digits(m: &crate::NDManager) -> Result<(NDArray, NDArray)> {
    load_digits_impl(m, DIGITS_GZ)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;

    #[test]
    fn permutations_are_permutations_and_reproducible() {
        for n in [0, 1, 2, 7, 100] {
            let p = permutation(n, 3, 0);
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..n).collect::<Vec<_>>());
            assert_eq!(p, permutation(n, 3, 0));
        }
        assert_ne!(permutation(50, 3, 0), permutation(50, 3, 1));
        assert_ne!(permutation(50, 3, 0), permutation(50, 4, 0));
    }

    #[test]
    fn permutation_is_roughly_uniform() {
        // Position of element 0 over many epochs of a 4-permutation: each of the 4
        // places about a quarter of the time.
        let mut hits = [0usize; 4];
        for e in 0..4000 {
            let p = permutation(4, 11, e);
            hits[p.iter().position(|&v| v == 0).unwrap()] += 1;
        }
        for h in hits {
            assert!((850..1150).contains(&h), "{hits:?}");
        }
    }

    #[test]
    fn below_is_in_range() {
        let mut r = SplitMix64(5);
        for n in [1u64, 2, 3, 10, u64::MAX] {
            for _ in 0..100 {
                assert!(r.below(n) < n);
            }
        }
    }

    #[test]
    fn gathers_rows_of_any_layout() {
        // A [3, 2] array stored transposed: element (i, j) at j * 3 + i.
        let data: Vec<i32> = vec![0, 10, 20, 1, 11, 21];
        let l = Layout {
            shape: Shape::from(&[3usize, 2][..]),
            strides: [1isize, 3].into_iter().collect(),
            offset: 0,
        };
        let mut out = vec![0; 4];
        index_select_kernel(&data, &l, 0, &[2, 0], &mut out);
        assert_eq!(out, vec![20, 21, 0, 1]);
        // 1-d, reversed: element i at 4 - i.
        let data = vec![4, 3, 2, 1, 0];
        let l = Layout {
            shape: Shape::from(&[5usize][..]),
            strides: [-1isize].into_iter().collect(),
            offset: 4,
        };
        let mut out = vec![0; 3];
        index_select_kernel(&data, &l, 0, &[1, 3, 1], &mut out);
        assert_eq!(out, vec![1, 3, 1]);
    }
}

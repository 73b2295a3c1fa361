//! The safetensors format (through the `safetensors` crate): a JSON header naming
//! each array's dtype, shape and byte range, then the data, little-endian.

use super::bounded::claimed_size;
use super::raw::{
    Raw, check_manager, check_names, close_all, create, decode, format_error, io_error, not_a_dir,
    read_file, read_raw,
};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::shape::Dims;
use crate::{DType, NDArray, NDManager, Shape};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};
use std::borrow::Cow;
use std::panic::Location;
use std::path::Path;

/// The safetensors dtype of `dtype`.
fn to_st(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

/// The ndscope dtype of a safetensors dtype, if there is one.
fn from_st(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// An array's contents as the safetensors crate sees a tensor.
pub(crate) struct StView {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl From<Raw> for StView {
    fn from(r: Raw) -> Self {
        StView {
            dtype: to_st(r.dtype),
            shape: r.shape.dims().to_vec(),
            bytes: r.bytes,
        }
    }
}

impl View for &StView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn st_error(op: &'static str, path: &Path, e: SafeTensorError) -> NdError {
    match e {
        SafeTensorError::IoError(e) => io_error(op, path, e),
        e => format_error(op, path, format!("not a valid safetensors file: {e}")),
    }
}

/// Write named arrays (already checked) to `path`, replacing it atomically.
pub(crate) fn write<S: AsRef<str>>(
    op: &'static str,
    path: &Path,
    arrays: &[(S, NDArray)],
) -> Result<()> {
    check_names(op, arrays.iter().map(|(n, _)| n.as_ref()))?;
    let views = arrays
        .iter()
        .map(|(n, a)| Ok((n.as_ref(), StView::from(read_raw(*a)?))))
        .collect::<Result<Vec<_>>>()?;
    not_a_dir(op, path)?;
    safetensors::serialize_to_file(views.iter().map(|(n, v)| (*n, v)), None, path)
        .map_err(|e| st_error(op, path, e))
}

/// One tensor of a checked file.
pub(crate) struct Entry<'a> {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// Parse a whole file image and check every tensor (dtype, size); sorted by name.
pub(crate) fn entries<'a>(
    op: &'static str,
    path: &Path,
    bytes: &'a [u8],
) -> Result<Vec<Entry<'a>>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| st_error(op, path, e))?;
    let mut out = Vec::with_capacity(st.len());
    for (name, t) in st.iter() {
        let dtype = from_st(t.dtype()).ok_or_else(|| {
            format_error(
                op,
                path,
                format!(
                    "'{name}' has dtype {:?}, which has no ndscope counterpart (supported: \
                     F32, F64, I32, I64, U8, BOOL)",
                    t.dtype()
                ),
            )
        })?;
        let shape = t.shape().to_vec();
        let size = claimed_size(&shape, dtype.size_in_bytes(), dtype)
            .map_err(|m| format_error(op, path, format!("'{name}': {m}")))?
            .1;
        if size != t.data().len() {
            return Err(format_error(
                op,
                path,
                format!(
                    "'{name}': {} bytes do not hold shape {shape:?}",
                    t.data().len()
                ),
            ));
        }
        out.push(Entry {
            name: name.to_string(),
            dtype,
            shape,
            data: t.data(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn save_impl<S: AsRef<str>>(path: &Path, arrays: &[(S, NDArray)]) -> Result<()> {
    write("save_safetensors", path, arrays)
}

/// Write named arrays to `path` in the safetensors format (readable by the
/// `safetensors` Python package, PyTorch, candle, ...), row-major whatever their
/// layout. Names must be non-empty and distinct. The file is written beside `path`
/// and renamed over it, so an existing file is replaced whole or not at all. Panics
/// on error (see [`try_save_safetensors`]).
///
/// ```
/// use ndscope::{DType, NDManager, io};
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-st-doc-{}.safetensors", std::process::id()));
/// let w = m.ones([2, 2], DType::F64);
/// io::save_safetensors(&path, &[("layer.weight", w)]);
/// let loaded = io::load_safetensors(&m, &path);
/// assert_eq!(loaded[0].0, "layer.weight");
/// assert_eq!(loaded[0].1.to_vec::<f64>()?, vec![1.0; 4]);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save_safetensors<S: AsRef<str>>(path: impl AsRef<Path>, arrays: &[(S, NDArray)]) {
    unwrap(save_impl(path.as_ref(), arrays))
}

/// [`save_safetensors`]. Errors: `InvalidArgument` (an empty or repeated name),
/// `Closed`, `Io` (the file cannot be written; `path` is a directory). Nothing is
/// written when an argument is bad.
pub fn try_save_safetensors<S: AsRef<str>>(
    path: impl AsRef<Path>,
    arrays: &[(S, NDArray)],
) -> Result<()> {
    save_impl(path.as_ref(), arrays)
}

fn load_impl(m: &NDManager, path: &Path, at: SourceLocation) -> Result<Vec<(String, NDArray)>> {
    const OP: &str = "load_safetensors";
    check_manager(m)?;
    let bytes = read_file(OP, path)?;
    let entries = entries(OP, path, &bytes)?;
    let mut out: Vec<(String, NDArray)> = Vec::with_capacity(entries.len());
    for e in entries {
        let n = e.data.len() / e.dtype.size_in_bytes();
        let made = decode(e.dtype, n, e.data, false)
            .and_then(|buf| create(m, buf, Shape(Dims::from_slice(&e.shape)), e.dtype, at));
        match made {
            Ok(a) => out.push((e.name, a)),
            Err(err) => {
                close_all(out.into_iter().map(|(_, a)| a));
                return Err(err);
            }
        }
    }
    Ok(out)
}

/// Read a safetensors file into new arrays of `m`, registered in the current scope,
/// as `(name, array)` pairs sorted by name. Boolean bytes other than 0 read as
/// `true`. Panics on error (see [`try_load_safetensors`]).
#[track_caller]
pub fn load_safetensors(m: &NDManager, path: impl AsRef<Path>) -> Vec<(String, NDArray)> {
    unwrap(load_impl(m, path.as_ref(), Location::caller()))
}

/// [`load_safetensors`]. Errors: `Io` (missing file, a directory), `Format` (not a
/// safetensors file: a truncated or malformed header, data that does not match it;
/// a dtype ndscope has no counterpart for, such as `F16` or `BF16`),
/// `ManagerClosed`/`ManagerCapped`, `OutOfMemory`. The whole file is checked before
/// any array is created: nothing is allocated on error.
#[track_caller]
pub fn try_load_safetensors(
    m: &NDManager,
    path: impl AsRef<Path>,
) -> Result<Vec<(String, NDArray)>> {
    load_impl(m, path.as_ref(), Location::caller())
}

//! Saving and loading arrays: safetensors, numpy's `.npy` and `.npz`, checkpoints
//! that load back into existing arrays, and (feature `ndarray`) conversions to and
//! from the `ndarray` crate.
//!
//! | format | save | load |
//! |---|---|---|
//! | safetensors (named arrays) | [`save_safetensors`] | [`load_safetensors`] (sorted by name) |
//! | `.npy` (one array) | [`save_npy`] | [`load_npy`] |
//! | `.npz` (named arrays, a zip of `.npy` files) | [`save_npz`] | [`load_npz`] (archive order) |
//! | checkpoint (safetensors) | [`save_checkpoint`] | [`load_into`] (in place, all or nothing) |
//! | `ndarray::ArrayD<T>` (feature `ndarray`) | `NDArray::to_ndarray` | `NDArray::from_ndarray` |
//!
//! Every dtype is supported by every format: `f32`, `f64`, `i32`, `i64`, `u8` and
//! `bool` (safetensors `F32 F64 I32 I64 U8 BOOL`; numpy `<f4 <f8 <i4 <i8 |u1 |b1`).
//! Arrays are written in row-major order whatever their layout (a transposed or
//! sliced view is saved as the array it shows), little-endian, bit for bit (NaN
//! payloads and `-0.0` survive a round trip). Loaded arrays are new contiguous arrays
//! owned by the given manager and registered in the current scope, like any created
//! array.
//!
//! Errors: the operating system's failures are [`NdError::Io`](crate::NdError::Io) (with the path and
//! the error kind); a file that is not valid for the format, or holds a dtype ndscope
//! has no counterpart for (`float16`, `int8`, ...), is [`NdError::Format`](crate::NdError::Format); a bad
//! argument (an empty or repeated name) is [`NdError::InvalidArgument`](crate::NdError::InvalidArgument); a closed
//! array is `Closed`. A failing load leaves nothing allocated, and a failing
//! [`load_into`] changes no array. Every function has a panicking form and a `try_`
//! twin; the panic message is exactly the error's.
//!
//! Files from strangers: every length a file states (a header's size, a shape, a zip
//! member's size, a central directory's) is checked against the bytes the file holds
//! before memory is reserved for it, so a forged or damaged file is a `Format` error
//! naming the claim and what the file holds, never a large reservation; shapes whose
//! size overflows and more than 64 dimensions are `Format` errors too. The readers are
//! fuzzed (`fuzz/`, `.ci/fuzz`; RELIABILITY.md).
//!
//! The file functions need the default feature `io`.
//!
//! ```
//! use ndscope::{DType, NDManager, io};
//! let m = NDManager::new();
//! let dir = std::env::temp_dir().join(format!("ndscope-io-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let w = m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]);
//! let b = m.create(&[1i64, 2], [2]);
//!
//! io::save_safetensors(dir.join("model.safetensors"), &[("w", w), ("b", b)]);
//! let loaded = io::load_safetensors(&m, dir.join("model.safetensors"));
//! assert_eq!(loaded[0].0, "b");                               // sorted by name
//! assert_eq!(loaded[1].1.to_vec::<f32>()?, w.to_vec::<f32>()?);
//!
//! io::save_npy(dir.join("wt.npy"), w.transpose());            // saved as it looks
//! let wt = io::load_npy(&m, dir.join("wt.npy"));
//! assert_eq!(wt.shape().dims(), &[3, 2]);
//! assert_eq!(wt.to_vec::<f32>()?, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
//!
//! let err = io::try_load_npy(&m, dir.join("missing.npy")).unwrap_err();
//! assert!(matches!(err, ndscope::NdError::Io { .. }));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), ndscope::NdError>(())
//! ```
// Without the `io` feature the file functions named above do not exist.
#![cfg_attr(not(feature = "io"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "io")]
mod bounded;
#[cfg(feature = "io")]
mod checkpoint;
#[cfg(feature = "ndarray")]
mod ndarray;
#[cfg(feature = "io")]
mod npy;
#[cfg(feature = "io")]
mod npz;
#[cfg(feature = "io")]
mod safetensors;
#[cfg(feature = "io")]
mod zipdir;

#[cfg(feature = "io")]
pub use checkpoint::{load_into, save_checkpoint, try_load_into, try_save_checkpoint};
#[cfg(feature = "io")]
pub use npy::{load_npy, save_npy, try_load_npy, try_save_npy};
#[cfg(feature = "io")]
pub use npz::{load_npz, save_npz, try_load_npz, try_save_npz};
#[cfg(feature = "io")]
pub use safetensors::{
    load_safetensors, save_safetensors, try_load_safetensors, try_save_safetensors,
};

/// Conversions between arrays and raw little-endian bytes, shared by the formats.
#[cfg(feature = "io")]
mod raw {
    use crate::backend::cpu::{Buffer, new_overwritten};
    use crate::dtype::{Native, dispatch};
    use crate::error::{NdError, Result};
    use crate::ext;
    use crate::layout::for_each_row;
    use crate::{DType, NDArray, NDManager, Shape};
    use std::path::Path;

    /// A native element type with a fixed little/big-endian byte encoding.
    pub(crate) trait Bytes: Native {
        const SIZE: usize;
        fn put_le(self, out: &mut Vec<u8>);
        fn from_bytes(b: &[u8], big_endian: bool) -> Self;
    }

    macro_rules! bytes {
        ($($t:ty),*) => {$(
            impl Bytes for $t {
                const SIZE: usize = std::mem::size_of::<$t>();
                #[inline(always)]
                fn put_le(self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                #[inline(always)]
                fn from_bytes(b: &[u8], big_endian: bool) -> Self {
                    let a = b.try_into().expect("chunk of the element size");
                    if big_endian { <$t>::from_be_bytes(a) } else { <$t>::from_le_bytes(a) }
                }
            }
        )*};
    }
    bytes!(f32, f64, i32, i64, u8);

    /// An array's contents: dtype, shape and row-major little-endian bytes.
    pub(crate) struct Raw {
        pub dtype: DType,
        pub shape: Shape,
        pub bytes: Vec<u8>,
    }

    /// Room for `n` bytes, or `OutOfMemory` (never an allocation abort).
    pub(crate) fn byte_vec(n: usize) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| NdError::OutOfMemory {
            bytes: n,
            device: crate::Device::Cpu,
        })?;
        Ok(v)
    }

    /// Append the elements of `data` seen through `(shape, strides, offset)` in
    /// row-major order, little-endian.
    pub(crate) fn put_rows<T: Bytes>(
        data: &[T],
        shape: &[usize],
        strides: &[isize],
        offset: usize,
        out: &mut Vec<u8>,
    ) {
        if shape.contains(&0) {
            return; // a zero-size view may carry an offset past its buffer
        }
        for_each_row(shape, [strides], [offset], |off, n, s| {
            let (start, step) = (off[0], s[0]);
            if step == 1 {
                for &x in &data[start as usize..start as usize + n] {
                    x.put_le(out);
                }
            } else {
                for i in 0..n as isize {
                    data[(start + i * step) as usize].put_le(out);
                }
            }
        });
    }

    /// The contents of `x` (any layout) as row-major little-endian bytes.
    pub(crate) fn read_raw(x: NDArray) -> Result<Raw> {
        ext::read(x, |o| {
            let l = o.layout();
            let n = l.size() * o.dtype().size_in_bytes();
            let mut bytes = byte_vec(n)?;
            dispatch!(o.dtype(), T => put_rows::<T>(
                o.view::<T>().data, l.shape.dims(), &l.strides, l.offset, &mut bytes));
            debug_assert_eq!(bytes.len(), n);
            Ok(Raw {
                dtype: o.dtype(),
                shape: l.shape.clone(),
                bytes,
            })
        })?
    }

    /// A buffer of `n` elements of `dtype` decoded from `bytes` (exactly `n` elements;
    /// `bool` bytes other than 0 read as `true`).
    pub(crate) fn decode(dtype: DType, n: usize, bytes: &[u8], big_endian: bool) -> Result<Buffer> {
        debug_assert_eq!(bytes.len(), n * dtype.size_in_bytes());
        dispatch!(dtype, T => new_overwritten::<T>(n, |out| {
            let chunks = bytes.chunks_exact(T::SIZE);
            if dtype == DType::Bool {
                for (o, c) in out.iter_mut().zip(chunks) {
                    *o = T::from_i64((c[0] != 0) as i64);
                }
            } else {
                for (o, c) in out.iter_mut().zip(chunks) {
                    *o = T::from_bytes(c, big_endian);
                }
            }
        }))
    }

    /// A new contiguous array of `m` from a decoded buffer.
    pub(crate) use crate::ext::array_from_buffer as create;

    /// Fail fast (before reading a file) if `m` takes no new arrays.
    pub(crate) fn check_manager(m: &NDManager) -> Result<()> {
        ext::check_manager_open(m)?;
        if m.is_capped() {
            return Err(NdError::ManagerCapped { name: m.name() });
        }
        Ok(())
    }

    /// Close `arrays` (the partial result of a failed load).
    #[track_caller]
    pub(crate) fn close_all(arrays: impl IntoIterator<Item = NDArray>) {
        for a in arrays {
            a.close();
        }
    }

    pub(crate) fn io_error(op: &'static str, path: &Path, e: std::io::Error) -> NdError {
        NdError::Io {
            op,
            path: path.to_path_buf(),
            msg: e.to_string(),
            kind: e.kind(),
        }
    }

    pub(crate) fn format_error(op: &'static str, path: &Path, msg: impl Into<String>) -> NdError {
        NdError::Format {
            op,
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// An `Io` error if `path` is a directory.
    pub(crate) fn not_a_dir(op: &'static str, path: &Path) -> Result<()> {
        if path.is_dir() {
            return Err(NdError::Io {
                op,
                path: path.to_path_buf(),
                msg: "is a directory".into(),
                kind: std::io::ErrorKind::IsADirectory,
            });
        }
        Ok(())
    }

    /// Open a file for reading; a directory or a missing file is an `Io` error.
    pub(crate) fn open_file(op: &'static str, path: &Path) -> Result<std::fs::File> {
        not_a_dir(op, path)?;
        std::fs::File::open(path).map_err(|e| io_error(op, path, e))
    }

    /// Read a whole file; a directory or a missing file is an `Io` error. A regular
    /// file is read up to the length it had when opened, so what is reserved is what
    /// the file holds; another kind (a pipe) is read as its data arrives.
    pub(crate) fn read_file(op: &'static str, path: &Path) -> Result<Vec<u8>> {
        use std::io::Read;
        let f = open_file(op, path)?;
        let md = f.metadata().map_err(|e| io_error(op, path, e))?;
        let read = if md.is_file() {
            let len = md.len();
            let mut v = byte_vec(usize::try_from(len).unwrap_or(usize::MAX))?;
            f.take(len).read_to_end(&mut v).map(|_| v)
        } else {
            let mut v = Vec::new();
            { f }.read_to_end(&mut v).map(|_| v)
        };
        read.map_err(|e| io_error(op, path, e))
    }

    /// Names must be non-empty and distinct.
    pub(crate) fn check_names<'a>(
        op: &'static str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for n in names {
            if n.is_empty() {
                return Err(NdError::invalid(op, "an array name is empty"));
            }
            if !seen.insert(n) {
                return Err(NdError::invalid(op, format!("the name '{n}' is repeated")));
            }
        }
        Ok(())
    }
}

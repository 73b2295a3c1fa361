//! Checkpoints: named arrays saved as safetensors and loaded back **into** the
//! arrays they came from, in place, all or nothing.

use super::raw::{Bytes, check_names, format_error, read_file};
use super::safetensors::{entries, write};
use crate::dtype::dispatch;
use crate::error::{Result, unwrap};
use crate::ext;
use crate::layout::{Layout, for_each_row};
use crate::{Device, NDArray, NDManager};
use std::collections::HashMap;
use std::path::Path;

/// Write `named` arrays (a model's `named_parameters()`, an optimizer's state under
/// its own prefix, ...) to `path` as a safetensors file, replaced atomically.
/// The same as [`save_safetensors`](super::save_safetensors); read it back with
/// [`load_into`] (into existing arrays) or [`load_safetensors`](super::load_safetensors)
/// (as new arrays). Panics on error (see [`try_save_checkpoint`]).
///
/// ```
/// use ndscope::{DType, NDManager, io};
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-ckpt-doc-{}.safetensors", std::process::id()));
/// let w = m.random_normal(0.0, 1.0, [3, 2], DType::F32);
/// let b = m.zeros([2], DType::F32);
/// let named = vec![("fc.weight".to_string(), w), ("fc.bias".to_string(), b)];
/// io::save_checkpoint(&path, &named);
/// let saved = w.to_vec::<f32>()?;
/// w.set("", 0.0);                                // training goes on...
/// io::load_into(&path, &named);                  // ...and is rolled back, in place
/// assert_eq!(w.to_vec::<f32>()?, saved);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save_checkpoint<S: AsRef<str>>(path: impl AsRef<Path>, named: &[(S, NDArray)]) {
    unwrap(try_save_checkpoint(path, named))
}

/// [`save_checkpoint`]. Errors: `InvalidArgument` (an empty or repeated name),
/// `Closed`, `Io`.
pub fn try_save_checkpoint<S: AsRef<str>>(
    path: impl AsRef<Path>,
    named: &[(S, NDArray)],
) -> Result<()> {
    write("save_checkpoint", path.as_ref(), named)
}

/// Write little-endian `bytes` (row-major) into the elements `t`'s layout selects.
fn write_rows<T: Bytes>(out: &mut [T], l: &Layout, bytes: &[u8], is_bool: bool) {
    if l.shape.dims().contains(&0) {
        return;
    }
    let mut src = bytes.chunks_exact(T::SIZE).map(|c| {
        if is_bool {
            T::from_i64((c[0] != 0) as i64)
        } else {
            T::from_bytes(c, false)
        }
    });
    for_each_row(l.shape.dims(), [&l.strides], [l.offset], |off, n, s| {
        for i in 0..n as isize {
            out[(off[0] + i * s[0]) as usize] = src.next().expect("checked size");
        }
    });
}

fn load_into_impl<S: AsRef<str>>(path: &Path, named: &[(S, NDArray)]) -> Result<()> {
    const OP: &str = "load_into";
    check_names(OP, named.iter().map(|(n, _)| n.as_ref()))?;
    // Every target must be live and writable before the file is read.
    let mut targets = HashMap::with_capacity(named.len());
    for (name, a) in named {
        let (shape, dtype) = (a.try_shape()?, a.try_dtype()?);
        crate::autograd::check_inplace(OP, a.id)?;
        targets.insert(name.as_ref(), (*a, shape, dtype));
    }
    let bytes = read_file(OP, path)?;
    let entries = entries(OP, path, &bytes)?;
    // All or nothing: check every name, dtype and shape before writing anything.
    for e in &entries {
        let Some((a, shape, dtype)) = targets.get(e.name.as_str()) else {
            return Err(format_error(
                OP,
                path,
                format!(
                    "the file holds '{}', which is not among the arrays to load",
                    e.name
                ),
            ));
        };
        if *dtype != e.dtype || shape.dims() != e.shape.as_slice() {
            return Err(format_error(
                OP,
                path,
                format!(
                    "'{}' is {}{:?} in the file but {a:?} in memory",
                    e.name, e.dtype, e.shape
                ),
            ));
        }
    }
    if entries.len() != targets.len() {
        let mut missing: Vec<&str> = targets
            .keys()
            .copied()
            .filter(|n| !entries.iter().any(|e| e.name == *n))
            .collect();
        missing.sort_unstable();
        return Err(format_error(
            OP,
            path,
            format!("the file has no {}", missing.join(", ")),
        ));
    }
    for e in &entries {
        let (a, ref shape, dtype) = targets[e.name.as_str()];
        let write = |host: NDArray| {
            ext::update_in_place(host, [], |mut t, []| {
                let b = t.dtype() == crate::DType::Bool;
                dispatch!(t.dtype(), T => {
                    let t = t.view_mut::<T>();
                    write_rows::<T>(t.data, t.layout, e.data, b)
                });
                Ok(())
            })
        };
        let device = a.try_device()?;
        if device == Device::Cpu {
            write(a)?;
        } else {
            // A device array gets the values through a host array in a scope, uploaded
            // and copied into it in place (its handle and buffer stay).
            crate::scope(|| {
                let host = NDManager::system().try_zeros(shape.clone(), dtype)?;
                write(host)?;
                a.try_set("", host.try_to_device(device)?)
            })?;
        }
    }
    Ok(())
}

/// Load a checkpoint written by [`save_checkpoint`] (or any safetensors file) into
/// the existing `named` arrays, in place: each array receives the values saved
/// under its name, bit for bit, through its layout (a view writes into the data it
/// shows). Handles, managers, scopes and gradients of the arrays are unchanged.
///
/// All or nothing: the file must hold exactly the names of `named`, each with the
/// array's dtype and shape; otherwise no array is changed. An array on a GPU gets its
/// values through a host copy uploaded in a scope (there, running out of device
/// memory midway leaves the arrays before it written). Not recorded for
/// autograd; while a `GradientCollector` records, loading into an array its tape
/// depends on is an error. Panics on error (see [`try_load_into`]).
#[track_caller]
pub fn load_into<S: AsRef<str>>(path: impl AsRef<Path>, named: &[(S, NDArray)]) {
    unwrap(load_into_impl(path.as_ref(), named))
}

/// [`load_into`]. Errors: `Format` (the file holds a name that is not in `named`,
/// lacks one that is, or has another dtype or shape for one; or is not a valid
/// safetensors file), `Io`, `InvalidArgument` (an empty or repeated name in `named`;
/// an array the recording tape depends on), `Closed` (a target is closed). No
/// array is changed on error.
pub fn try_load_into<S: AsRef<str>>(path: impl AsRef<Path>, named: &[(S, NDArray)]) -> Result<()> {
    load_into_impl(path.as_ref(), named)
}

//! numpy's `.npz` format: a zip archive of `.npy` files (stored, as `numpy.savez`
//! writes, or deflated, as `numpy.savez_compressed` does).
//!
//! The archive's central directory is read by hand first ([`super::zipdir`]), so a
//! repeated member name is seen; then each member is read with the zip crate,
//! its `.npy` header's claims checked against the member's declared size, and the
//! member's bytes against the archive's length.

use super::bounded::Source;
use super::npy::{array_from_npy, npy_image, read_error, read_npy};
use super::raw::{
    check_manager, check_names, close_all, format_error, io_error, open_file, read_raw,
};
use super::zipdir;
use crate::error::{Result, SourceLocation, unwrap};
use crate::{NDArray, NDManager};
use std::io::Write;
use std::panic::Location;
use std::path::Path;

fn save_npz_impl<S: AsRef<str>>(path: &Path, arrays: &[(S, NDArray)]) -> Result<()> {
    const OP: &str = "save_npz";
    check_names(OP, arrays.iter().map(|(n, _)| n.as_ref()))?;
    let images = arrays
        .iter()
        .map(|(_, a)| read_raw(*a).and_then(|r| npy_image(&r)))
        .collect::<Result<Vec<_>>>()?;
    let file = std::fs::File::create(path).map_err(|e| io_error(OP, path, e))?;
    let zip_err = |e: zip::result::ZipError| match e {
        zip::result::ZipError::Io(e) => io_error(OP, path, e),
        e => format_error(OP, path, e.to_string()),
    };
    let mut z = zip::ZipWriter::new(std::io::BufWriter::new(file));
    for ((name, _), image) in arrays.iter().zip(&images) {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(image.len() as u64 >= u32::MAX as u64);
        z.start_file(format!("{}.npy", name.as_ref()), opts)
            .map_err(zip_err)?;
        z.write_all(image).map_err(|e| io_error(OP, path, e))?;
    }
    let mut w = z.finish().map_err(zip_err)?;
    w.flush().map_err(|e| io_error(OP, path, e))
}

/// Write named arrays to `path` as an `.npz` archive, as `numpy.savez` does: one
/// uncompressed member `NAME.npy` per array, in the order given. `numpy.load`
/// reads it (`np.load(path)["w"]`). Names must be non-empty and distinct. Overwrites
/// an existing file. Panics on error (see [`try_save_npz`]).
///
/// ```
/// use ndscope::{DType, NDManager, io};
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-npz-doc-{}.npz", std::process::id()));
/// let x = m.ones([2, 3], DType::F32);
/// let y = m.create(&[true, false], [2]);
/// io::save_npz(&path, &[("x", x), ("y", y)]);
/// let loaded = io::load_npz(&m, &path);
/// assert_eq!(loaded[1].0, "y");
/// assert_eq!(loaded[1].1.to_vec::<bool>()?, vec![true, false]);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save_npz<S: AsRef<str>>(path: impl AsRef<Path>, arrays: &[(S, NDArray)]) {
    unwrap(save_npz_impl(path.as_ref(), arrays))
}

/// [`save_npz`]. Errors: `InvalidArgument` (an empty or repeated name), `Closed`,
/// `Io`. Nothing is written when an argument is bad.
pub fn try_save_npz<S: AsRef<str>>(path: impl AsRef<Path>, arrays: &[(S, NDArray)]) -> Result<()> {
    save_npz_impl(path.as_ref(), arrays)
}

fn load_npz_impl(m: &NDManager, path: &Path, at: SourceLocation) -> Result<Vec<(String, NDArray)>> {
    const OP: &str = "load_npz";
    check_manager(m)?;
    let file = open_file(OP, path)?;
    let zip_err = |e: zip::result::ZipError| match e {
        zip::result::ZipError::Io(e) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
            io_error(OP, path, e)
        }
        e => format_error(OP, path, format!("not a valid zip archive: {e}")),
    };
    let len = file.metadata().map_err(|e| io_error(OP, path, e))?.len();
    let mut r = std::io::BufReader::new(file);
    // Every record of the central directory, repeated names included (the zip crate
    // keeps only the last member of a name).
    let records = zipdir::records(&mut r, len).map_err(|m| format_error(OP, path, m))?;
    if let Some(rec) = zipdir::repeated(&records) {
        return Err(format_error(
            OP,
            path,
            format!(
                "member '{}' appears more than once in the central directory (a repeated \
                 name)",
                rec.display()
            ),
        ));
    }
    let mut z = zip::ZipArchive::new(r).map_err(zip_err)?;
    if z.len() != records.len() {
        return Err(format_error(
            OP,
            path,
            format!(
                "the central directory lists {} members but the zip reader sees {} (names \
                 that differ as bytes but not as text)",
                records.len(),
                z.len()
            ),
        ));
    }
    // Read and check every member before creating any array.
    let mut members = Vec::with_capacity(z.len());
    for i in 0..z.len() {
        let mut f = z.by_index(i).map_err(zip_err)?;
        let full = f.name().map_err(zip_err)?.into_owned();
        let Some(name) = full.strip_suffix(".npy").map(str::to_string) else {
            return Err(format_error(
                OP,
                path,
                format!("member '{full}' is not a .npy file"),
            ));
        };
        let prefix = format!("member '{name}.npy': ");
        // A stored member's bytes lie in the archive: its size, once checked against
        // the archive's length, bounds what is reserved. A compressed member's
        // declared size is only a claim: its data is reserved as it arrives.
        let declared = f.size();
        let stored = f.compression() == zip::CompressionMethod::Stored;
        if stored && (f.compressed_size() != declared || declared > len) {
            return Err(format_error(
                OP,
                path,
                format!(
                    "{prefix}a stored member declares {declared} bytes ({} compressed) but \
                     the archive holds {len} bytes",
                    f.compressed_size()
                ),
            ));
        }
        let mut src = Source::new(&mut f, declared, stored, "the member");
        let (h, data) = read_npy(&mut src).map_err(|e| read_error(OP, path, &prefix, e, false))?;
        members.push((name, h, data));
    }
    check_names(OP, members.iter().map(|(n, _, _)| n.as_str()))
        .map_err(|e| format_error(OP, path, e.to_string()))?;
    let mut out: Vec<(String, NDArray)> = Vec::with_capacity(members.len());
    for (name, h, data) in members {
        match array_from_npy(m, &h, &data, at) {
            Ok(a) => out.push((name, a)),
            Err(e) => {
                close_all(out.into_iter().map(|(_, a)| a));
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Read an `.npz` archive (from `numpy.savez` or `numpy.savez_compressed`, or
/// [`save_npz`]) into new arrays of `m`, registered in the current scope, as
/// `(name, array)` pairs in archive order (the name is the member's name without
/// `.npy`). Members may be stored or deflated. Each member is read as [`load_npy`](super::load_npy)
/// reads a file, its header's claims checked against the member's declared size
/// (and a stored member's size against the archive's), and a compressed member's
/// data is reserved as it is decompressed, so a forged size costs no more memory
/// than the data actually there. Panics on error (see [`try_load_npz`]).
#[track_caller]
pub fn load_npz(m: &NDManager, path: impl AsRef<Path>) -> Vec<(String, NDArray)> {
    unwrap(load_npz_impl(m, path.as_ref(), Location::caller()))
}

/// [`load_npz`]. Errors: `Io` (missing file, a directory), `Format` (not a zip
/// archive, a member that is not a valid `.npy` file or not named `*.npy`, an
/// unsupported compression, a name the central directory lists twice, a truncated
/// central directory, a header claiming more than its member holds),
/// `ManagerClosed`/`ManagerCapped`,
/// `OutOfMemory`. Every member is checked before any array is created: nothing is
/// allocated on error.
#[track_caller]
pub fn try_load_npz(m: &NDManager, path: impl AsRef<Path>) -> Result<Vec<(String, NDArray)>> {
    load_npz_impl(m, path.as_ref(), Location::caller())
}

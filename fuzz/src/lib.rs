//! The checks behind ndscope's fuzz targets (issue 28: files from strangers).
//!
//! Each target feeds the fuzzer's bytes to one reader, as a file, and fails (a panic,
//! which libFuzzer reports as a crash and saves the input) when the reader:
//! * panics, or returns an error other than the one a bad file deserves (`Format`;
//!   `OutOfMemory` counts as a failure: a file must never ask for more than it holds);
//! * returns arrays holding more bytes than the file;
//! * leaves any array allocated, process-wide, after its arrays are closed;
//! * (`checkpoint`) changes a target array and then fails (loading is all or nothing).
//!
//! And the global allocator aborts the process (a crash too) on any single allocation
//! larger than [`BASE_CAP`] plus [`CAP_PER_INPUT_BYTE`] times the input's length: a
//! reader that reserves what a header claims instead of what the file holds is caught
//! even where the reservation would succeed.

use ndscope::{DType, NDArray, NDManager, NdError, io};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod shapes;

/// The single-allocation cap for an empty input (`NDSCOPE_FUZZ_BASE_CAP`, in bytes,
/// overrides it: a small value shows the cap at work on any seed).
pub const BASE_CAP: usize = 64 << 20;

fn base_cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("NDSCOPE_FUZZ_BASE_CAP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BASE_CAP)
    })
}
/// What each byte of input adds to the cap (a deflated npz member may hold about
/// 1,000 times its size; 16 is plenty for inputs of a few KiB under the base cap).
pub const CAP_PER_INPUT_BYTE: usize = 16;

static CAP: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The system allocator, aborting on any single allocation over the current cap.
pub struct CappedAllocator;

impl CappedAllocator {
    fn check(size: usize) {
        let cap = CAP.load(Ordering::Relaxed);
        if size > cap {
            // No allocation here: the message is assembled on the stack.
            let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
            let mut buf = [0u8; 128];
            let mut n = 0;
            for part in [
                &b"ndscope-fuzz: a single allocation of "[..],
                digits(size, &mut a),
                b" bytes, over the cap of ",
                digits(cap, &mut b),
                b"\n",
            ] {
                let k = part.len().min(buf.len() - n);
                buf[n..n + k].copy_from_slice(&part[..k]);
                n += k;
            }
            let _ = std::io::stderr().write_all(&buf[..n]);
            std::process::abort();
        }
    }
}

/// `v` in decimal, written at the end of `out` (no allocation).
fn digits(mut v: usize, out: &mut [u8; 20]) -> &[u8] {
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &out[i..]
}

// SAFETY: every method checks the size (which never allocates: see `check`, which
// aborts instead of returning when over the cap) and then forwards to `System` with
// the caller's arguments unchanged, so `System`'s guarantees hold.
unsafe impl GlobalAlloc for CappedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::check(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::check(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::check(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CappedAllocator = CappedAllocator;

/// The manager every target loads into (through a sub-manager per input).
fn root() -> &'static NDManager {
    static ROOT: OnceLock<NDManager> = OnceLock::new();
    ROOT.get_or_init(|| {
        let m = NDManager::new();
        m.set_name("fuzz");
        m
    })
}

/// Write `data` to this process's file for `target` (in /dev/shm where it exists)
/// and run `f` on its path with the allocation cap for `data` in force; then check
/// that no array is left.
fn with_file(target: &str, data: &[u8], f: impl FnOnce(&Path, &NDManager)) {
    let path = file_for(target);
    std::fs::write(&path, data).expect("write the input file");
    run_capped(data.len(), |m| f(&path, m));
}

/// Run `f` on a fresh sub-manager under the cap for an input of `len` bytes, close
/// the sub-manager, and check that the process holds no more arrays than before.
fn run_capped(len: usize, f: impl FnOnce(&NDManager)) {
    let before = ndscope::memory();
    let m = root().new_sub_manager();
    CAP.store(
        base_cap().saturating_add(len.saturating_mul(CAP_PER_INPUT_BYTE)),
        Ordering::Relaxed,
    );
    f(&m);
    CAP.store(usize::MAX, Ordering::Relaxed);
    m.close();
    let after = ndscope::memory();
    assert_eq!(
        (after.live_arrays, after.live_buffers, after.live_bytes),
        (before.live_arrays, before.live_buffers, before.live_bytes),
        "arrays left behind"
    );
}

fn file_for(target: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    });
    dir.join(format!("ndscope-fuzz-{}-{target}", std::process::id()))
}

/// A bad file's error must be `Format`; anything else is a failure.
fn expect_format(what: &str, e: &NdError) {
    assert!(
        matches!(e, NdError::Format { .. }),
        "{what}: a file from a stranger gave {e:?}, not a Format error"
    );
}

/// The bytes an array holds.
fn bytes_of(a: NDArray) -> usize {
    a.size() * a.dtype().size_in_bytes()
}

/// Read every element (checks the array is whole and readable).
fn read_all(a: NDArray) {
    let n = match a.dtype() {
        DType::F32 => a.to_vec::<f32>().map(|v| v.len()),
        DType::F64 => a.to_vec::<f64>().map(|v| v.len()),
        DType::I32 => a.to_vec::<i32>().map(|v| v.len()),
        DType::I64 => a.to_vec::<i64>().map(|v| v.len()),
        DType::U8 => a.to_vec::<u8>().map(|v| v.len()),
        DType::Bool => a.to_vec::<bool>().map(|v| v.len()),
    };
    assert_eq!(n.expect("a loaded array reads back"), a.size());
}

/// Named arrays loaded from a file of `len` bytes: no more bytes than the file, all
/// readable.
fn check_loaded(len: usize, arrays: &[(String, NDArray)]) {
    let total: usize = arrays.iter().map(|(_, a)| bytes_of(*a)).sum();
    assert!(total <= len, "{total} bytes loaded from a file of {len}");
    for (_, a) in arrays {
        read_all(*a);
    }
}

/// `io::try_load_npy`.
pub fn npy(data: &[u8]) {
    with_file("npy", data, |p, m| match io::try_load_npy(m, p) {
        Ok(a) => check_loaded(data.len(), &[(String::new(), a)]),
        Err(e) => expect_format("load_npy", &e),
    });
}

/// `io::try_load_npz`.
pub fn npz(data: &[u8]) {
    with_file("npz", data, |p, m| match io::try_load_npz(m, p) {
        // A deflated member may hold more than the archive's length: bound by the
        // largest expansion deflate allows (about 1,032 to 1).
        Ok(arrays) => check_loaded(data.len().saturating_mul(1100) + 4096, &arrays),
        Err(e) => expect_format("load_npz", &e),
    });
}

/// `io::try_load_safetensors`.
pub fn safetensors(data: &[u8]) {
    with_file("safetensors", data, |p, m| {
        match io::try_load_safetensors(m, p) {
            Ok(arrays) => check_loaded(data.len(), &arrays),
            Err(e) => expect_format("load_safetensors", &e),
        }
    });
}

/// Every element of `a` as f64 bits (to compare contents exactly).
fn snapshot(a: NDArray) -> Vec<u64> {
    a.to_dtype(DType::F64)
        .to_vec::<f64>()
        .expect("read a target")
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// `io::try_load_into` the arrays of [`shapes::checkpoint_targets`]: on error no
/// target has changed.
pub fn checkpoint(data: &[u8]) {
    with_file("checkpoint", data, |p, m| {
        let targets = shapes::checkpoint_targets(m);
        let before: Vec<Vec<u64>> = targets.iter().map(|(_, a)| snapshot(*a)).collect();
        match io::try_load_into(p, &targets) {
            Ok(()) => {
                for (_, a) in &targets {
                    read_all(*a);
                }
            }
            Err(e) => {
                expect_format("load_into", &e);
                let after: Vec<Vec<u64>> = targets.iter().map(|(_, a)| snapshot(*a)).collect();
                assert!(before == after, "a failed load_into changed a target");
            }
        }
    });
}

/// `NDArray::try_get` and `try_set` with the input as an index string, on arrays of
/// several shapes (0-d, zero-size, 1 to 4 dimensions): a view's elements are among
/// its base's, and a bad string is an `Index` error.
pub fn index(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    run_capped(data.len(), |m| {
        for shape in [&[][..], &[0], &[5], &[4, 4], &[2, 3, 4], &[3, 1, 0, 2]] {
            let n: usize = shape.iter().product();
            let a = m.arange(0.0, n as f64, 1.0, DType::F32).reshape(shape);
            match a.try_get(s) {
                Ok(v) => {
                    assert!(v.size() <= a.size(), "a view larger than its base");
                    let vals = v.to_vec::<f32>().expect("a view reads back");
                    assert!(
                        vals.iter().all(|&x| x >= 0.0 && (x as usize) < n.max(1)),
                        "a view shows an element outside its base"
                    );
                }
                Err(e) => assert!(
                    matches!(e, NdError::Index { .. }),
                    "get({s:?}) on {shape:?}: {e:?}"
                ),
            }
            match a.try_set(s, -1.0) {
                Ok(()) => read_all(a),
                Err(e) => assert!(
                    matches!(e, NdError::Index { .. }),
                    "set({s:?}) on {shape:?}: {e:?}"
                ),
            }
        }
    });
}

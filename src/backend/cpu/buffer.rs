//! Data buffers: 64-byte-aligned, initialised heap blocks shared by an array and its
//! views, recycled through a caching pool (see [`pool`]).
//!
//! A [`Buffer`] is always fully initialised (fresh blocks are zeroed; reused blocks hold
//! old values), so typed slices over it are valid for every native type. It is plain
//! memory: who may read or write it when is the engine's bookkeeping, kept beside it
//! in the engine's `Storage` (see `engine/storage.rs`).

use super::fork::{PARALLEL_ELEMS, fork, may_fork};
use super::pool::{self, ALIGN};
use crate::dtype::Native;
use crate::error::{NdError, Result};
use rayon::prelude::*;
use std::ptr::NonNull;

/// A type with the buffers' alignment, for the dangling pointer of empty buffers.
#[repr(align(64))]
struct AlignedBlock;
const _: () = assert!(std::mem::align_of::<AlignedBlock>() == ALIGN);

/// One heap block of array data.
pub(crate) struct Buffer {
    ptr: NonNull<u8>,
    bytes: usize,
    /// The pool size class of the block (its capacity), `pool::FRESH` set when it came
    /// zeroed from the system allocator; `pool::NO_CLASS` for empty buffers.
    class: u32,
}

// SAFETY: `Buffer` owns its block exclusively (like `Vec<u8>`); shared access is
// coordinated by the engine (`engine/storage.rs`): reads of immutable data from several
// threads are fine, and writes are only made under the lock of the buffer's shard with
// no outside read in flight.
unsafe impl Send for Buffer {}
// SAFETY: see `Send` above.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A buffer of no bytes (no block).
    pub(crate) fn empty() -> Buffer {
        Buffer {
            // An aligned dangling pointer is valid for zero-length slices. (`[u8; N]` is
            // only 1-aligned: its dangling pointer would be misaligned for f32.)
            ptr: NonNull::<AlignedBlock>::dangling().cast(),
            bytes: 0,
            class: pool::NO_CLASS,
        }
    }

    /// A zeroed block of `bytes` bytes, or `OutOfMemory` (never an abort).
    pub(crate) fn zeroed(bytes: usize) -> Result<Buffer> {
        let buf = Buffer::reused(bytes)?;
        if buf.fresh_or_empty() {
            return Ok(buf);
        }
        // SAFETY: the block is `bytes` long, owned by `buf` and not shared yet.
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr(), 0, buf.bytes) };
        Ok(buf)
    }

    /// A block of `bytes` bytes from the caching pool when one fits (holding old
    /// values: initialised, but arbitrary), else a fresh zeroed one.
    pub(crate) fn reused(bytes: usize) -> Result<Buffer> {
        if bytes == 0 {
            return Ok(Buffer::empty());
        }
        let (class, ptr) = pool::take(bytes)?;
        Ok(Buffer { ptr, bytes, class })
    }

    /// Whether the block came zeroed from the system (or is empty).
    fn fresh_or_empty(&self) -> bool {
        self.class & pool::FRESH != 0 || self.bytes == 0
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The whole block as a slice of `T`.
    ///
    /// # Safety
    /// No one may write the buffer while the returned slice lives (the engine lock is
    /// held by a writer only when `outside_readers` is zero and no reader under the
    /// lock exists).
    pub(crate) unsafe fn slice<T: Native>(&self) -> &[T] {
        debug_assert_eq!(self.ptr.as_ptr() as usize % std::mem::align_of::<T>(), 0);
        // SAFETY: the block is `bytes` long, aligned to 64 (>= align_of T), fully
        // initialised, and every bit pattern is a valid `T` (`T: Native: Plain`);
        // the caller guarantees no concurrent writer.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.as_ptr() as *const T,
                self.bytes / std::mem::size_of::<T>(),
            )
        }
    }

    /// The whole block as a mutable slice of `T`.
    ///
    /// # Safety
    /// The caller must have exclusive access: either the buffer is fresh (not yet
    /// shared), or the lock of its shard is held, `outside_readers` is zero and no other slice
    /// of this buffer is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<T: Native>(&self) -> &mut [T] {
        // SAFETY: as for `slice`, plus exclusivity guaranteed by the caller.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr() as *mut T,
                self.bytes / std::mem::size_of::<T>(),
            )
        }
    }

    /// Set every byte of the block to zero (split across the kernel pool when large).
    ///
    /// # Safety
    /// Exclusive access, as for [`Buffer::slice_mut`].
    pub(crate) unsafe fn fill_zero(&self) {
        // SAFETY: the block is `bytes` long and owned by `self`; the caller guarantees
        // no other access while it is written, so this is the only slice of it.
        let all = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.bytes) };
        const PART: usize = PARALLEL_ELEMS; // bytes per split, as many as an f32 split's
        if all.len() >= 4 * PARALLEL_ELEMS && may_fork() {
            fork(|| all.par_chunks_mut(PART).for_each(|c| c.fill(0)));
        } else {
            all.fill(0);
        }
    }

    /// Address identity, used to detect aliasing between an in-place target and inputs.
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.bytes != 0 {
            pool::give(self.class & !pool::FRESH, self.ptr);
        }
    }
}

/// A new buffer of `len` elements of `T`, zeroed, then filled by `fill`.
pub(crate) fn new_filled<T: Native>(len: usize, fill: impl FnOnce(&mut [T])) -> Result<Buffer> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| NdError::OutOfMemory {
            bytes: usize::MAX,
            device: crate::Device::Cpu,
        })?;
    let buf = Buffer::zeroed(bytes)?;
    // SAFETY: the buffer was just allocated and is not shared yet.
    fill(unsafe { buf.slice_mut::<T>() });
    Ok(buf)
}

/// `len` values of `T` in a block from the buffer pool, read and written as a slice: a
/// kernel's host-side result too large for a fresh `Vec` to be cheap (a `Vec` of
/// hundreds of KB comes from the system each call and faults in its pages again).
pub(crate) struct PoolVec<T: Native> {
    buf: Buffer,
    _t: std::marker::PhantomData<T>,
}

impl<T: Native> PoolVec<T> {
    /// `len` elements, each written by `fill` (the block may hold old values).
    pub(crate) fn new(len: usize, fill: impl FnOnce(&mut [T])) -> Result<PoolVec<T>> {
        Ok(PoolVec {
            buf: new_overwritten::<T>(len, fill)?,
            _t: std::marker::PhantomData,
        })
    }
}

impl<T: Native> std::ops::Deref for PoolVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the block is owned by `self` and never shared, and a mutable slice of
        // it exists only through `&mut self`, so none is alive while this one is.
        unsafe { self.buf.slice::<T>() }
    }
}

impl<T: Native> std::ops::DerefMut for PoolVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`: `&mut self` makes this the only slice of the block.
        unsafe { self.buf.slice_mut::<T>() }
    }
}

/// Run `f` on a scratch slice of `len` elements taken from the buffer pool (not
/// zeroed: `f` must write before it reads) and return its result; the memory goes
/// back to the pool, so repeated calls neither zero nor fault in fresh pages.
pub(crate) fn with_scratch<T: Native, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
    let mut r = None;
    let _buf = new_overwritten::<T>(len, |s| r = Some(f(s)))?;
    Ok(r.expect("new_overwritten calls its closure"))
}

/// A new buffer of `len` elements of `T` that `fill` must overwrite entirely: it may
/// come from the caching pool holding old values (never zeroed again, so large outputs
/// cost no extra pass). Use [`new_filled`] when `fill` relies on zeros.
pub(crate) fn new_overwritten<T: Native>(
    len: usize,
    fill: impl FnOnce(&mut [T]),
) -> Result<Buffer> {
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| NdError::OutOfMemory {
            bytes: usize::MAX,
            device: crate::Device::Cpu,
        })?;
    let buf = Buffer::reused(bytes)?;
    // SAFETY: the buffer was just allocated and is not shared yet.
    fill(unsafe { buf.slice_mut::<T>() });
    Ok(buf)
}

#[cfg(feature = "gpu")]
/// The first `len` bytes of `buf` (which the caller owns, so no one writes it).
pub(crate) fn into_bytes(buf: Buffer, len: usize) -> Vec<u8> {
    // SAFETY: `buf` is owned here, so no other slice of it exists and nothing writes it.
    let bytes = unsafe { buf.slice::<u8>() };
    bytes[..len].to_vec()
}

//! [`Storage`]: the data of an array as the engine holds it, a backend's block of
//! memory plus the engine's bookkeeping of who reads and writes it.
//!
//! A backend allocates and frees memory and computes on it; it does not decide who may
//! touch a block when. That is the engine's job (see `exec.rs`): writes happen only
//! under the lock of the buffer's shard with no read outside it in flight, which
//! `outside_readers` counts; a writer that finds reads in flight announces itself
//! (`writers`), and outside reads that would start meanwhile wait for it. So the
//! counters live here, beside the block, and a backend's buffer is plain memory.
//!
//! A block also knows whether it is all zeros: [`Storage::fill_zero`] sets `zero` and
//! [`Storage::slice_mut`], the only way to write a block in place, clears it. So a
//! gradient zeroed by a new collector and untouched since is known to be zero, and
//! backward may hand it the computed gradient's block instead of adding into it
//! (`grads::add_to_grads`).
//!
//! [`Mem`] names the device the block lives on: host memory (the CPU backend's
//! [`Buffer`]) or, with the `gpu` feature, a GPU buffer of the wgpu backend. The op
//! path dispatches on it: an op hands a CPU kernel only host operands (`exec::on_host`),
//! and a device-aware op branches on its operands' device.

use super::Buffer;
use crate::Device;
#[cfg(feature = "gpu")]
use crate::backend::wgpu::GpuBuffer;
use crate::dtype::Native;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// Where a block of array data lives.
pub(crate) enum Mem {
    /// Host memory from the CPU backend's pool.
    Host(Buffer),
    /// Device memory from a GPU's pool.
    #[cfg(feature = "gpu")]
    Gpu(GpuBuffer),
}

/// An array's data block and the engine's read/write bookkeeping for it.
pub(crate) struct Storage {
    mem: Mem,
    /// Number of ops currently reading this buffer without holding a shard lock.
    outside_readers: AtomicUsize,
    /// In-place writers that found outside reads in flight and have not written yet:
    /// new outside reads wait for them, so a stream of reads cannot starve a writer.
    writers: AtomicU32,
    /// Every byte is 0: set by [`Storage::fill_zero`], cleared by
    /// [`Storage::slice_mut`]. Read and written only with exclusive access (the
    /// buffer's shard lock held, no outside reader), so `Relaxed` suffices; an atomic
    /// only because `Storage` is shared between threads.
    zero: AtomicBool,
}

impl From<Buffer> for Storage {
    #[inline]
    fn from(buf: Buffer) -> Storage {
        Storage {
            mem: Mem::Host(buf),
            outside_readers: AtomicUsize::new(0),
            writers: AtomicU32::new(0),
            zero: AtomicBool::new(false),
        }
    }
}

#[cfg(feature = "gpu")]
impl From<GpuBuffer> for Storage {
    fn from(buf: GpuBuffer) -> Storage {
        Storage {
            mem: Mem::Gpu(buf),
            outside_readers: AtomicUsize::new(0),
            writers: AtomicU32::new(0),
            zero: AtomicBool::new(false),
        }
    }
}

impl Storage {
    /// The GPU buffer, if the block lives on a GPU.
    #[cfg(feature = "gpu")]
    #[inline]
    pub(crate) fn gpu(&self) -> Option<&GpuBuffer> {
        match &self.mem {
            Mem::Gpu(b) => Some(b),
            Mem::Host(_) => None,
        }
    }

    /// Storage of no bytes (on the host).
    pub(crate) fn empty() -> Storage {
        Storage::from(Buffer::empty())
    }

    /// The device the block lives on.
    #[inline]
    pub(crate) fn device(&self) -> Device {
        match &self.mem {
            Mem::Host(_) => Device::Cpu,
            #[cfg(feature = "gpu")]
            Mem::Gpu(b) => b.device(),
        }
    }

    /// The host block. Every op handed its operands to a CPU kernel only after checking
    /// that they live on the host, so this is infallible where kernels call it.
    #[inline]
    fn host(&self) -> &Buffer {
        match &self.mem {
            Mem::Host(b) => b,
            #[cfg(feature = "gpu")]
            Mem::Gpu(_) => {
                unreachable!("a CPU kernel was handed GPU memory: ops check devices first")
            }
        }
    }

    /// Size in bytes.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        match &self.mem {
            Mem::Host(b) => b.bytes(),
            #[cfg(feature = "gpu")]
            Mem::Gpu(b) => b.bytes(),
        }
    }

    /// Address identity, used to detect aliasing between an in-place target and inputs.
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        match &self.mem {
            Mem::Host(b) => b.addr(),
            #[cfg(feature = "gpu")]
            Mem::Gpu(b) => b.addr(),
        }
    }

    /// The whole host block as a slice of `T`.
    ///
    /// # Safety
    /// As [`Buffer::slice`]: no one may write the block while the slice lives.
    #[inline]
    pub(crate) unsafe fn slice<T: Native>(&self) -> &[T] {
        // SAFETY: forwarded; the caller guarantees no concurrent writer.
        unsafe { self.host().slice::<T>() }
    }

    /// The whole host block as a mutable slice of `T`.
    ///
    /// # Safety
    /// As [`Buffer::slice_mut`]: exclusive access (fresh, or the shard lock held with no
    /// outside read in flight and no other slice alive).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn slice_mut<T: Native>(&self) -> &mut [T] {
        // The caller may write through the slice: the block is no longer known zero.
        self.zero.store(false, Ordering::Relaxed);
        // SAFETY: forwarded; the caller guarantees exclusive access.
        unsafe { self.host().slice_mut::<T>() }
    }

    /// Set every byte to zero (and remember it: [`Storage::is_zero`]).
    ///
    /// # Safety
    /// Exclusive access, as for [`Storage::slice_mut`].
    pub(crate) unsafe fn fill_zero(&self) {
        // SAFETY: forwarded; the caller guarantees exclusive access.
        unsafe { self.host().fill_zero() };
        self.zero.store(true, Ordering::Relaxed);
    }

    /// Whether every byte is known to be 0: [`Storage::fill_zero`] ran and no
    /// [`Storage::slice_mut`] since. `false` says nothing. Call it with the access
    /// a write would need (the shard lock held, no outside reader).
    #[inline]
    pub(crate) fn is_zero(&self) -> bool {
        self.zero.load(Ordering::Relaxed)
    }

    pub(crate) fn begin_outside_read(&self) {
        self.outside_readers.fetch_add(1, Ordering::SeqCst);
    }

    // SeqCst throughout: a reader ends (readers down, then writers read) while a writer
    // announces (writers up, then readers read); one of them must see the other.

    /// Ends an outside read; true when it was the last one and a writer waits for it.
    pub(crate) fn end_outside_read(&self) -> bool {
        self.outside_readers.fetch_sub(1, Ordering::SeqCst) == 1 && self.has_writers()
    }

    /// An in-place writer found outside reads in flight: until [`Storage::writer_done`],
    /// new outside reads wait.
    pub(crate) fn announce_writer(&self) {
        self.writers.fetch_add(1, Ordering::SeqCst);
    }

    /// An announced writer has written (or given up); true when it was the last one, so
    /// that the reads waiting for it may start.
    pub(crate) fn writer_done(&self) -> bool {
        self.writers.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// Whether an announced writer has not written yet.
    pub(crate) fn has_writers(&self) -> bool {
        self.writers.load(Ordering::SeqCst) != 0
    }

    pub(crate) fn has_outside_readers(&self) -> bool {
        self.outside_readers.load(Ordering::SeqCst) != 0
    }
}

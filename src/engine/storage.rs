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
//! A block also knows whether it reads as zeros (`zero`): [`Storage::zero_lazily`] says
//! so without writing a byte, and the zeros are written by the first [`Storage::slice`]
//! or [`Storage::slice_mut`], the only ways to read or write a block's bytes;
//! `slice_mut` forgets it (its caller may write). So a
//! gradient zeroed by a new collector costs no pass over memory until it is read, and
//! backward, finding it untouched, may hand it the computed gradient's block instead of
//! adding into it (`grads::add_to_grads`): then the zeros are never written at all.
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
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};

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
    /// Whether the block reads as zeros: [`UNKNOWN`], [`ZERO`] (every byte is 0),
    /// [`PENDING`] (it reads as zeros, and the first access writes them) or
    /// [`ZEROING`] (a reader is writing them).
    zero: AtomicU8,
}

/// [`Storage::zero`]: nothing known.
const UNKNOWN: u8 = 0;
/// [`Storage::zero`]: every byte is 0.
const ZERO: u8 = 1;
/// [`Storage::zero`]: the block reads as zeros, but its bytes are not written yet.
const PENDING: u8 = 2;
/// [`Storage::zero`]: a reader found [`PENDING`] and is writing the zeros; other
/// readers wait for [`ZERO`].
const ZEROING: u8 = 3;

impl From<Buffer> for Storage {
    #[inline]
    fn from(buf: Buffer) -> Storage {
        Storage {
            mem: Mem::Host(buf),
            outside_readers: AtomicUsize::new(0),
            writers: AtomicU32::new(0),
            zero: AtomicU8::new(UNKNOWN),
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
            zero: AtomicU8::new(UNKNOWN),
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
        if self.zero.load(Ordering::Acquire) >= PENDING {
            self.write_pending_zeros();
        }
        // SAFETY: forwarded; the caller guarantees no concurrent writer (the pending
        // zeros were written above, by this reader or another, before any slice).
        unsafe { self.host().slice::<T>() }
    }

    /// Write the zeros of a [`PENDING`] block for a reader: readers may run on
    /// several threads at once, so one of them writes (`ZEROING`) while the others
    /// wait for [`ZERO`]. No slice of the block exists meanwhile: every reader
    /// gets its slice only after this returns, and a writer excludes readers.
    #[cold]
    fn write_pending_zeros(&self) {
        loop {
            match self
                .zero
                .compare_exchange(PENDING, ZEROING, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: winning the exchange makes this the only access to the
                    // bytes (see above); on this thread, not the kernel pool, so a
                    // waiting pool thread cannot hold it up.
                    unsafe { self.host().slice_mut::<u8>() }.fill(0);
                    self.zero.store(ZERO, Ordering::Release);
                    return;
                }
                Err(ZEROING) => std::hint::spin_loop(),
                Err(_) => return, // written meanwhile
            }
        }
    }

    /// The whole host block as a mutable slice of `T`.
    ///
    /// # Safety
    /// As [`Buffer::slice_mut`]: exclusive access (fresh, or the shard lock held with no
    /// outside read in flight and no other slice alive).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn slice_mut<T: Native>(&self) -> &mut [T] {
        // Exclusive access: no reader writes the pending zeros meanwhile.
        if self.zero.load(Ordering::Relaxed) == PENDING {
            // SAFETY: the caller guarantees exclusive access.
            unsafe { self.host().fill_zero() };
        }
        // The caller may write through the slice: the block is no longer known zero.
        self.zero.store(UNKNOWN, Ordering::Relaxed);
        // SAFETY: forwarded; the caller guarantees exclusive access.
        unsafe { self.host().slice_mut::<T>() }
    }

    /// Make the block read as zeros without writing them now: the first
    /// [`Storage::slice`] or [`Storage::slice_mut`] writes them, and a block freed
    /// unread never has them written.
    ///
    /// # Safety
    /// Exclusive access, as for [`Storage::slice_mut`] (no slice of the block alive).
    pub(crate) unsafe fn zero_lazily(&self) {
        self.zero.store(PENDING, Ordering::Release);
    }

    /// Whether the block reads as zeros: [`Storage::zero_lazily`] ran and no
    /// [`Storage::slice_mut`] since. `false` says
    /// nothing. Call it with the access a write would need (the shard lock held, no
    /// outside reader).
    #[inline]
    pub(crate) fn is_zero(&self) -> bool {
        matches!(self.zero.load(Ordering::Relaxed), ZERO | PENDING)
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

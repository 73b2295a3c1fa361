//! When and where large kernels split their work across threads.

/// Contiguous element counts above which elementwise loops are split across threads.
pub(super) const PARALLEL_ELEMS: usize = 1 << 18;

/// Multiply-adds above which a matrix product (or a stack of them) is split across
/// threads.
pub(crate) const PARALLEL_FLOPS: usize = 1 << 21;

/// Multiply-adds above which a convolution or one of its gradients that cannot be split
/// by samples (fewer samples than threads; see `conv::sample_parts`) is split step by
/// step (im2col, gemm and col2im each across the threads). Higher than a lone
/// product's: on 2 vCPUs a [32,16,8,8] 3×3 convolution (9.4M) and its gradients ran
/// 760 µs a step on one thread and 805 µs split step by step (`examples/bench --only
/// conv2d`, 2026-12-04).
pub(super) const CONV_PARALLEL_FLOPS: usize = 1 << 24;

// Large kernels split their work across ndscope's own rayon pool ([`fork`]), never
// rayon's global pool, and never from a rayon worker. A rayon worker that waits in a
// join runs other tasks of its pool meanwhile (from its own queue, or stolen). Were
// kernels split on the pool that runs user code (data-parallel training in `par_iter`),
// such a task could run in the middle of the interrupted op, on the same thread: its
// ops would block on a shard lock that the thread already holds, it would see that
// thread's open scopes and recording collector, and an in-place write it made to an
// array the op reads with no lock held would wait for the op, which waits for that
// worker (the stolen-writer deadlock). The kernel pool runs nothing but kernel splits,
// which take no lock and wait for nothing but each other. A thread outside any pool
// waits for `install` without running anything else, so it may fork, even while it
// holds shard locks: nothing that runs meanwhile can wait for them. A rayon worker may
// not: waiting for another pool, it would run its own pool's tasks meanwhile.
//
// The engine takes [`NoFork`] where the work under its locks is small by design: an
// op computes under the locks only below `exec::OUTSIDE_LOCK_WORK` input elements
// (larger ones compute unlocked, where they may fork), and a read of an array's data
// is the caller's own loop. The exceptions of that rule (a broadcast to a big result,
// a mid-size matmul) stay on the calling thread. An in-place write has no unlocked
// path, whatever its size (it must exclude every reader of the buffer), so the
// in-place paths take no `NoFork`: a large update, a gradient zeroed or added into,
// splits like any large kernel. Kernels called from inside rayon tasks run on the
// calling thread alone.
thread_local! {
    static LOCKED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    static HANDED_OVER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many forks this thread has handed to the kernel pool so far (tests only: which
/// engine paths split their kernels).
#[cfg(test)]
pub(crate) fn forks_handed_over() -> u64 {
    HANDED_OVER.with(|c| c.get())
}

/// Keeps the kernels the calling thread runs on it while alive ([`may_fork`] is false):
/// taken by the engine where it computes small work under a lock (right after locking,
/// kept until unlocking), and by [`fork_if`] for a kernel too small to split.
pub(crate) struct NoFork(());

impl NoFork {
    #[inline]
    pub(crate) fn new() -> NoFork {
        LOCKED.with(|c| c.set(c.get() + 1));
        NoFork(())
    }
}

impl Drop for NoFork {
    #[inline]
    fn drop(&mut self) {
        LOCKED.with(|c| c.set(c.get() - 1));
    }
}

/// Whether a kernel may split its work across the kernel pool ([`fork`]): not while a
/// [`NoFork`] of this thread is alive; not
/// when the pool has a single thread (handing the work to it and waiting would only add
/// two thread switches); on a thread of the kernel pool itself, yes (a kernel run
/// inside a [`fork`] splits its loops on the pool it is on, which runs nothing but
/// kernel splits); on a worker thread of another rayon pool (one that runs user code),
/// no.
#[inline]
pub(crate) fn may_fork() -> bool {
    if LOCKED.with(|c| c.get() != 0) {
        return false;
    }
    let pool = kernel_pool();
    pool.current_num_threads() > 1
        && (pool.current_thread_index().is_some() || rayon::current_thread_index().is_none())
}

/// ndscope's kernel pool: the threads that run the splits of large kernels, and only
/// those (see the comment above [`NoFork`]). Started on the first fork; as many threads
/// as rayon's global pool would have (`RAYON_NUM_THREADS`, else one per CPU).
fn kernel_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("ndscope-kernel-{i}"))
            .build()
            .expect("ndscope could not start its kernel threads")
    })
}

/// Run `f`, whose parallel loops split across the kernel pool, and wait for it. Call
/// only where [`may_fork`] holds: the calling thread then waits without running
/// anything else. On a thread of the kernel pool (inside an outer fork) `f` just runs:
/// a kernel with several parallel steps forks once around all of them
/// ([`fork_if`]), so the pool is woken and waited for once, not once a step.
pub(crate) fn fork<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    debug_assert!(may_fork());
    let pool = kernel_pool();
    if pool.current_thread_index().is_some() {
        return f();
    }
    #[cfg(test)]
    HANDED_OVER.with(|c| c.set(c.get() + 1));
    pool.install(f)
}

/// [`fork`] when `big` and [`may_fork`] hold; else run `f` on this thread, where the
/// steps inside it do not fork either (a kernel too small to split as a whole gains
/// nothing from handing each of its steps to the pool).
pub(crate) fn fork_if<R: Send>(big: bool, f: impl FnOnce() -> R + Send) -> R {
    if big && may_fork() {
        fork(f)
    } else {
        let _inline = NoFork::new();
        f()
    }
}

/// The number of threads a forked kernel splits its work across.
pub(crate) fn fork_threads() -> usize {
    kernel_pool().current_num_threads()
}

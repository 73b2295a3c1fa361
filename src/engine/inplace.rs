//! In-place writes: lock the shards of the target and the inputs (and of every record
//! that reads the target's buffer), wait until no outside read of that buffer is in
//! flight (the snapshot path of `exec` reads with no lock held), copy out inputs that
//! alias the target, and write under the locks.

use super::devices::{on_host, on_one_device};
use super::exec::{Operand, OperandMut, READS_DONE, materialize};
use super::records::Store;
use super::shard::{Ctx, Shards, add, lock_needed};
use super::slab::ArrayId;
use super::{Layout, Storage};
use crate::error::Result;
use smallvec::SmallVec;
use std::sync::Arc;

/// Park until `buf` has no outside reader (re-checked by the caller under its lock).
/// The caller has announced itself ([`WriterTurn`]), so no new outside read starts.
fn wait_for_readers(buf: &Storage) {
    let mut g = READS_DONE.0.lock();
    while buf.has_outside_readers() {
        // (The last reader notifies under this mutex; the timeout is a safety net.)
        READS_DONE
            .1
            .wait_for(&mut g, std::time::Duration::from_millis(1));
    }
}

/// An in-place writer's announcement on a buffer with reads in flight: while it lives,
/// new outside reads of the buffer wait. Dropped once the write is done (or failed).
struct WriterTurn(Arc<Storage>);

impl WriterTurn {
    fn announce(buf: Arc<Storage>) -> WriterTurn {
        buf.announce_writer();
        WriterTurn(buf)
    }
}

impl Drop for WriterTurn {
    fn drop(&mut self) {
        if self.0.writer_done() {
            let _g = READS_DONE.0.lock();
            READS_DONE.1.notify_all();
        }
    }
}

/// Run an in-place op writing `target`, reading `inputs`, with a CPU kernel: a target
/// or an input on another device is `Unsupported` (or a `DeviceMismatch`).
pub(crate) fn run_inplace(
    target: ArrayId,
    inputs: &[ArrayId],
    f: impl FnOnce(OperandMut<'_>, &[Operand<'_>]) -> Result<()>,
) -> Result<()> {
    run_inplace_inner("in-place update", target, inputs, false, f)
}

/// [`run_inplace`] for an in-place op `name` with kernels on more than one device: `f`
/// also sees a target and inputs on one GPU (`OperandMut::gpu`) and branches on it.
/// Inputs on another device than the target's are a `DeviceMismatch`, nothing written.
pub(crate) fn run_inplace_on(
    name: &'static str,
    target: ArrayId,
    inputs: &[ArrayId],
    f: impl FnOnce(OperandMut<'_>, &[Operand<'_>]) -> Result<()>,
) -> Result<()> {
    run_inplace_inner(name, target, inputs, cfg!(feature = "gpu"), f)
}

fn run_inplace_inner(
    name: &'static str,
    target: ArrayId,
    inputs: &[ArrayId],
    any_device: bool,
    f: impl FnOnce(OperandMut<'_>, &[Operand<'_>]) -> Result<()>,
) -> Result<()> {
    // The shards of the target and the inputs, and every shard that reads the target's
    // data through its own record (the home's and the proxies').
    let mut first: Shards = smallvec::smallvec![target.shard];
    for i in inputs {
        add(&mut first, i.shard);
    }
    let need = |ctx: &Ctx, out: &mut Shards| {
        let Ok(r) = ctx.array(target) else { return };
        let Store::Shared(b) = r.store else { return };
        let home = ctx.buffer(b).home_of(b);
        add(out, home.shard);
        if ctx.holds(home.shard)
            && let Some(hm) = ctx.shr(home.shard).buffers.get(home)
        {
            for p in &hm.proxies {
                add(out, p.shard);
            }
        }
    };
    // Wait until no op reads the target outside a lock (they hold none, so they
    // finish; new ones cannot start while we hold the shards of the buffer's records,
    // nor, once we are announced, while we wait). Declared before the locks, so that
    // the announcement ends after the write, once the locks are released.
    let mut turn: Option<WriterTurn> = None;
    let ctx = loop {
        let ctx = lock_needed(&first, need);
        // An array that owns its buffer has no outside reader (a snapshot shares it).
        let Store::Shared(b) = ctx.array(target)?.store else {
            break ctx;
        };
        let buf = &ctx.buffer(b).buf;
        if !buf.has_outside_readers() {
            break ctx;
        }
        let buf = buf.clone();
        if !turn.as_ref().is_some_and(|t| Arc::ptr_eq(&t.0, &buf)) {
            turn = Some(WriterTurn::announce(buf.clone()));
        }
        drop(ctx);
        wait_for_readers(&buf);
    };
    // No `NoFork`: a write holds the locks whatever its size (there is no unlocked
    // path), so a large one splits across the kernel pool (see `cpu::fork`).
    let r = ctx.array(target)?;
    let tbuf = ctx.shr(target.shard).data_of(r);
    // Inputs sharing the target's buffer are copied out first so reads never alias
    // the write (declared first: the operands may point into it).
    let copies: SmallVec<[Option<(Storage, Layout)>; 2]>;
    let mut ops = SmallVec::<[Operand<'_>; 2]>::new();
    for &id in inputs {
        ops.push(ctx.operand(id)?);
    }
    // The target first: a device check names it and its device.
    let mut all = SmallVec::<[Operand<'_>; 3]>::new();
    all.push(Operand::of(target, r, tbuf));
    all.extend(ops.iter().copied());
    if any_device {
        on_one_device(name, &all)?;
    } else {
        on_host(name, &all)?;
    }
    drop(all);
    let aliases = |o: &Operand<'_>| o.buf.addr() == tbuf.addr() && o.buf.bytes() != 0;
    if ops.iter().any(aliases) {
        copies = ops
            .iter()
            .map(|o| aliases(o).then(|| copy_out(o)).transpose())
            .collect::<Result<_>>()?;
        for (o, c) in ops.iter_mut().zip(&copies) {
            if let Some((b, l)) = c {
                o.buf = b;
                o.layout = l;
            }
        }
    }
    let t = OperandMut {
        buf: tbuf,
        layout: r.layout.clone(),
        dtype: r.dtype,
        id: target,
        created_at: r.created_at,
    };
    f(t, &ops)
}

/// A contiguous copy of an input that shares an in-place target's buffer, on the
/// input's device.
fn copy_out(o: &Operand<'_>) -> Result<(Storage, Layout)> {
    #[cfg(feature = "gpu")]
    if let Some(g) = o.gpu() {
        let buf = crate::backend::wgpu::kernels::convert("in-place update", g, o.dtype)?;
        return Ok((buf.into(), Layout::contiguous(o.layout.shape.clone())));
    }
    materialize(o).map(|(b, l)| (Storage::from(b), l))
}

#[cfg(test)]
mod tests {
    /// An in-place update, which holds the locks whatever its size, may fork from a
    /// thread outside any rayon pool, never from a rayon worker (a read or an op under
    /// a lock never forks: `exec`'s tests).
    #[test]
    fn an_inplace_write_forks_only_outside_a_rayon_pool() {
        let m = crate::NDManager::new();
        let a = m.ones([4], crate::DType::F32);
        let threads = crate::backend::cpu::fork_threads();
        let inplace = || {
            let mut seen = None;
            super::run_inplace(a.id, &[], |_, _| {
                seen = Some(crate::backend::cpu::may_fork());
                Ok(())
            })
            .unwrap();
            seen
        };
        assert_eq!(inplace(), Some(threads > 1));
        let in_task = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
            .install(inplace);
        assert_eq!(in_task, Some(false));
        assert_eq!(crate::backend::cpu::may_fork(), threads > 1);
        m.close();
    }
}

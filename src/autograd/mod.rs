//! Reverse-mode automatic differentiation, DJL-style: [`GradientCollector`].
//!
//! ```
//! use ndscope::{DType, GradientCollector, NDManager};
//! let m = NDManager::new();
//! let w = m.create(&[1.0f32, 2.0], [2, 1]);
//! w.set_requires_gradient(true);
//! let x = m.create(&[3.0f32, 4.0], [1, 2]);
//! {
//!     let gc = GradientCollector::new();        // zeroes w's gradient, starts recording
//!     let loss = x.matmul(w).square().sum();    // (3*1 + 4*2)^2 = 121
//!     gc.backward(loss)?;                       // d/dw = 2 * 11 * x^T
//! }
//! assert_eq!(w.gradient().to_vec::<f32>()?, vec![66.0, 88.0]);
//! assert_eq!(w.gradient(), w.gradient());       // always the same handle
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! # Design
//!
//! * **Parameters.** `w.set_requires_gradient(true)` creates `w`'s gradient array once:
//!   zeros of `w`'s shape and dtype, owned by `w`'s manager and registered in no scope.
//!   The engine's array record links it to `w` (so it is freed with `w`, however `w`
//!   dies), and each engine shard lists the parameters created on its thread, so a new
//!   collector zeroes gradients by visiting its thread's parameters only, never all
//!   live arrays (the walk that slowed DJL down) nor other threads' parameters.
//!   `set_requires_gradient` is atomic: two threads racing get one gradient.
//!   [`NDArray::gradient`] returns that handle on every call; backward writes into it in
//!   place, so it never creates an array in a long-lived manager.
//! * **Recording.** A collector sets a thread-local flag. Every differentiable op calls
//!   [`record`] after its result exists; with the flag off that is one thread-local
//!   read. With it on, the op is appended to this thread's tape only if an input is
//!   *tracked*: a parameter or the result of an op already on the tape. A tape node
//!   holds the rule (op and its constants), its inputs, their shapes, its output and a
//!   mask of the inputs that need a gradient, so backward does no work for data arrays.
//! * **Lifetime of intermediates.** A node holds (engine "tape holds") the arrays its
//!   rule reads, e.g. both inputs of `mul`, the output of `exp`. A hold is a reference
//!   count that keeps the array alive when the scope it was created in closes, like
//!   `retain()`. Unlike `retain()` it is not a user reference: the tape also holds
//!   parameters and data arrays that live in no scope, and a plain `retain`/`release`
//!   pair would free those (rule 5: `release()` of an array with no other reference
//!   frees it), as it would an array the user escaped out of every scope. So dropping
//!   the last hold frees the array only if a scope close found it held only by tapes.
//!   Holds are dropped when `backward` returns (it consumes the tape) or when the
//!   collector drops; then nothing the tape kept is live.
//! * **Backward.** `backward(loss)` seeds `ones` of the loss's shape (a non-scalar loss
//!   is summed), walks the tape in reverse applying the rules in [`backward`], reduces
//!   each input's gradient over broadcast axes back to the input's shape, and adds the
//!   results into the parameters' gradient arrays in place. Its temporaries live in an
//!   `NDScope` it opens and closes itself. Ops run during backward are not recorded.
//! * **Zeroing.** [`GradientCollector::new`] zeroes the gradients of the parameters
//!   created on its thread when it starts, and those of any other parameter when its
//!   tape first records it (DJL and `optimizer.zero_grad()` in PyTorch); so a
//!   collector touches only its own thread's parameters and the ones it uses, and
//!   collectors on two threads training their own parameters never interfere.
//!   The zeros are written when a gradient is first read or written, and a gradient
//!   nothing touched before backward takes the buffer backward computed for it
//!   instead of adding it in (PyTorch assigns a first gradient the same way); its
//!   handle stays the same.
//!   [`GradientCollector::accumulating`] leaves gradients as they are, so they add up
//!   over several collectors (PyTorch's default). Two collectors that train the *same*
//!   parameter at once both add into its one gradient array.
//! * **In-place ops** on an array the current tape depends on (a parameter or a
//!   recorded result) are an error while the tape is not empty, as in PyTorch; update
//!   parameters after `backward` (which empties the tape) or after the collector drops.
//! * **Pausing.** [`no_grad`] turns recording off on its thread while its closure runs
//!   (nesting, and restored on panic); [`NDArray::stop_gradient`] cuts one value out of
//!   the graph. Non-differentiable ops (comparisons, `floor`, `round`, `sign`, integer
//!   and Bool results) are never recorded, so a loss computed only through them is an
//!   error in `backward`, never a silent zero gradient.
//! * One collector per thread at a time; recording covers only ops run on its thread.

pub(crate) mod backward;
mod lazy;

pub(crate) use lazy::{Base, Env, LazyGrad};

use crate::dtype::ScalarValue;
use crate::engine::{self, ArrayId};
use crate::error::{NdError, Result, twins, unwrap};
use crate::{NDArray, NDScope, Shape};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::marker::PhantomData;

/// A tape node's gradient rule: the op's [`Backward`] impl with its constants, boxed
/// ([`Backward::into_rule`]), or a `'static` one where the op alone is the constant
/// (`add`, `exp`: no allocation per recorded op). Rules without data (matmul, reshape,
/// where) are zero-sized, so boxing them allocates nothing either.
pub(crate) enum Rule {
    /// A rule that is a constant.
    Static(&'static dyn Backward),
    /// A rule with constants of its own.
    Owned(Box<dyn Backward>),
}

impl std::ops::Deref for Rule {
    type Target = dyn Backward;
    fn deref(&self) -> &(dyn Backward + 'static) {
        match self {
            Rule::Static(r) => *r,
            Rule::Owned(b) => &**b,
        }
    }
}

/// What a [`Backward`] rule sees: the node's inputs ([`BackwardCtx::input`]; live where [`Backward::saves`]
/// asked for them), their shapes, the output, which inputs need a gradient, and where
/// a lazy gradient becomes an array ([`LazyGrad::array`]).
pub(crate) struct BackwardCtx<'a> {
    pub ids: &'a [ArrayId],
    pub shapes: &'a [Shape],
    pub output: NDArray,
    pub needs: u8,
    pub env: &'a Env,
}

impl BackwardCtx<'_> {
    /// Input `i`.
    pub fn input(&self, i: usize) -> NDArray {
        arr(self.ids[i])
    }

    /// Whether input `i` needs a gradient.
    pub fn need(&self, i: usize) -> bool {
        self.needs & (1 << i) != 0
    }

    /// Every input's bit (for [`Backward::saves`] of an op that reads them all).
    pub fn all(n_inputs: usize) -> u8 {
        ((1u16 << n_inputs) - 1) as u8
    }
}

/// The gradient rule of one op, written beside the op (the one mechanism: every
/// differentiable op records a `Backward` value when a collector records it).
///
/// `backward` is called with ops unrecorded, inside the scope `backward` opens; it
/// returns one gradient per input (`None` where [`BackwardCtx::need`] is false or the
/// input has no gradient), each of its input's shape or broadcastable to it: the pass
/// sums it over the broadcast axes ([`LazyGrad::unbroadcast`]). It is written with
/// ndscope ops, so it runs wherever the ops run.
pub(crate) trait Backward: Send + Sync + 'static {
    /// The op's name (for `Debug`).
    fn name(&self) -> &'static str;
    /// Which inputs (bit mask) and whether the output `backward` reads: the tape holds
    /// exactly those, so they outlive the scope they were made in.
    fn saves(&self, n_inputs: usize) -> (u8, bool);
    /// Further arrays the rule reads (a dropout mask, saved batch statistics): the
    /// tape holds them too.
    fn extra(&self) -> SmallVec<[ArrayId; 2]> {
        SmallVec::new()
    }
    /// The inputs' gradients given the output's gradient `g`.
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads>;
    /// This rule as a tape node stores it: boxed, unless the rule overrides this with a
    /// `'static` value.
    fn into_rule(self) -> Rule
    where
        Self: Sized,
    {
        Rule::Owned(Box::new(self))
    }
    /// [`Backward::backward`] on a lazy gradient. A rule that only scales, reshapes or
    /// passes `g` on overrides it to keep `g` lazy (no op run); the default makes `g`
    /// an array: [`via_arrays`].
    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        via_arrays(self, cx, g)
    }
}

/// One optional gradient per input of a node.
pub(crate) type Grads = SmallVec<[Option<NDArray>; 3]>;
/// One optional lazy gradient per input of a node.
pub(crate) type LazyGrads = SmallVec<[Option<LazyGrad>; 3]>;

/// [`Backward::backward_lazy`] through arrays: `g` made an array, `rule.backward`, and
/// each needed gradient marked to be summed to its input's shape.
pub(crate) fn via_arrays<B: Backward + ?Sized>(
    rule: &B,
    cx: &BackwardCtx<'_>,
    g: LazyGrad,
) -> Result<LazyGrads> {
    let g = g.array(cx.env)?;
    with_array(rule, cx, g)
}

/// [`via_arrays`] once `g` is an array: the rule's gradients, each to be summed over
/// its input's broadcast axes.
pub(crate) fn with_array<B: Backward + ?Sized>(
    rule: &B,
    cx: &BackwardCtx<'_>,
    g: NDArray,
) -> Result<LazyGrads> {
    let gs = rule.backward(cx, g)?;
    let mut r = nones(cx.ids.len());
    for (i, gi) in gs.into_iter().enumerate().take(cx.ids.len()) {
        if let Some(v) = gi
            && cx.need(i)
        {
            r[i] = Some(LazyGrad::arr(v).unbroadcast(&cx.shapes[i])?);
        }
    }
    Ok(r)
}

impl std::fmt::Debug for dyn Backward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `n` times `None` (without `from_elem`'s clones).
pub(crate) fn nones<T>(n: usize) -> SmallVec<[Option<T>; 3]> {
    let mut r = SmallVec::with_capacity(n);
    for _ in 0..n {
        r.push(None);
    }
    r
}

/// The handle of array `id`.
pub(crate) fn arr(id: ArrayId) -> NDArray {
    NDArray { id }
}

/// A scalar operand as f64.
pub(crate) fn scalar_f64(s: ScalarValue) -> f64 {
    match s {
        ScalarValue::Float(v) => v,
        ScalarValue::Int(v) => v as f64,
    }
}

/// One recorded op.
pub(crate) struct Node {
    pub rule: Rule,
    pub inputs: SmallVec<[ArrayId; 3]>,
    pub shapes: SmallVec<[Shape; 3]>,
    /// Bit `i`: input `i` needs a gradient (it is tracked).
    pub needs: u8,
    pub output: ArrayId,
    /// Per input that needs a gradient, where its gradient goes: the index of the node
    /// that computed it, or `LEAF | slot` for a parameter (its slot in
    /// [`Tape::leaves`]); [`NO_SLOT`] for the others.
    pub dest: SmallVec<[u32; 3]>,
}

/// [`Node::dest`] of a parameter: `LEAF | slot`.
pub(crate) const LEAF: u32 = 1 << 31;
/// [`Node::dest`] of an input that needs no gradient.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// A fast hasher for ids (already well-mixed generational indices).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(32) ^ v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(crate) type IdMap<V> = HashMap<ArrayId, V, BuildHasherDefault<IdHasher>>;
pub(crate) type IdSet = HashSet<ArrayId, BuildHasherDefault<IdHasher>>;

/// This thread's recording. Its containers keep their capacity from one collector to
/// the next (up to [`Tape::KEEP`] nodes), so a training loop does not reallocate them.
#[derive(Default)]
pub(crate) struct Tape {
    pub nodes: Vec<Node>,
    /// Outputs of the nodes, with the index of the (last) node that computed each.
    pub tracked: IdMap<u32>,
    /// The parameters the nodes read, each with its slot (index in `leaf_ids`).
    leaves: IdMap<u32>,
    /// The parameters by slot.
    pub leaf_ids: Vec<ArrayId>,
    /// Arrays the nodes hold (released by [`Tape::clear`]).
    held: Vec<ArrayId>,
    /// Scratch for backward: the gradients of the nodes' outputs, then of the leaves.
    slots: Vec<Option<LazyGrad>>,
}

impl Tape {
    /// Capacity (nodes) a cleared tape keeps for the next collector.
    const KEEP: usize = 4096;

    /// Drop every hold (one engine lock when they are all this thread's) and forget
    /// the nodes.
    fn clear(&mut self) {
        if self.nodes.is_empty() && self.held.is_empty() {
            return;
        }
        engine::unhold_all(&self.held);
        self.held.clear();
        self.nodes.clear();
        self.tracked.clear();
        self.leaves.clear();
        self.leaf_ids.clear();
        if self.nodes.capacity() > Self::KEEP {
            *self = Tape::default();
        }
    }

    /// The slot of parameter `id`, added on first use.
    fn leaf(&mut self, id: ArrayId) -> u32 {
        let next = self.leaf_ids.len() as u32;
        let slot = *self.leaves.entry(id).or_insert(next);
        if slot == next {
            self.leaf_ids.push(id);
        }
        slot
    }
}

thread_local! {
    /// Whether a collector records on this thread (and is not paused by backward).
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    /// Whether a collector is alive on this thread.
    static COLLECTING: Cell<bool> = const { Cell::new(false) };
    static TAPE: RefCell<Tape> = RefCell::new(Tape::default());
    /// Whether the live collector accumulates (does not zero gradients).
    static ACCUMULATE: Cell<bool> = const { Cell::new(false) };
    /// Parameters of other threads this collector has zeroed on first use.
    static ZEROED: RefCell<IdSet> = RefCell::new(IdSet::default());
    /// How many [`no_grad`] calls are running on this thread.
    static NO_GRAD: Cell<u32> = const { Cell::new(0) };
}

/// Run `f` with gradient recording off on this thread (PyTorch's `torch.no_grad()`):
/// no op run inside is recorded on this thread's tape, so results computed inside
/// carry no gradient, even from parameters. Returns what `f` returns.
///
/// Recording is restored when `f` returns or panics; calls nest. A collector
/// created inside starts recording when the outermost `no_grad` returns. In-place
/// updates (an optimizer step) are allowed inside only when the tape does not depend
/// on the array, as outside (see [`GradientCollector`]).
///
/// ```
/// use ndscope::{GradientCollector, NDManager};
/// let m = NDManager::new();
/// let w = m.create(&[3.0f64], [1]).set_requires_gradient(true);
/// let gc = GradientCollector::new();
/// let frozen = ndscope::no_grad(|| w * 2.0);     // not recorded
/// let loss = (w * frozen).sum();                 // d/dw = frozen = 6, not 2 * 2w = 12
/// gc.backward(loss)?;
/// assert_eq!(w.gradient().to_vec::<f64>()?, vec![6.0]);
/// # Ok::<(), ndscope::NdError>(())
/// ```
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    /// Restores the state on return and on unwind: what it was, unless a collector
    /// started or stopped inside `f`.
    struct Restore {
        recording: bool,
        collecting: bool,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            let depth = NO_GRAD.with(|d| {
                d.set(d.get() - 1);
                d.get()
            });
            let recording = match (self.collecting, COLLECTING.with(Cell::get)) {
                (_, false) => false,
                (true, true) => self.recording,
                (false, true) => depth == 0,
            };
            RECORDING.with(|c| c.set(recording));
        }
    }
    NO_GRAD.with(|d| d.set(d.get() + 1));
    let _restore = Restore {
        recording: RECORDING.with(|c| c.replace(false)),
        collecting: COLLECTING.with(Cell::get),
    };
    f()
}

/// Record op `rule` with `inputs` and result `output` on this thread's tape, if a
/// collector is recording and an input is tracked. One thread-local read otherwise.
#[inline]
pub(crate) fn record<B: Backward>(inputs: &[ArrayId], output: ArrayId, rule: impl FnOnce() -> B) {
    if RECORDING.with(Cell::get) {
        let mut rule = Some(rule);
        record_slow(inputs, output, &mut || {
            rule.take().expect("called once")().into_rule()
        });
    }
}

/// [`record`] when recording: the rule is built only if the op is recorded. Two engine
/// lock round trips for a recorded op (its inputs' state, then the holds), one for an
/// op on untracked data.
#[cold]
#[inline(never)]
fn record_slow(inputs: &[ArrayId], output: ArrayId, rule: &mut dyn FnMut() -> Rule) {
    let mut tracked = 0u8;
    let mut dest: SmallVec<[u32; 3]> = SmallVec::with_capacity(inputs.len());
    TAPE.with(|t| {
        let t = t.borrow();
        for (i, id) in inputs.iter().enumerate() {
            match t.tracked.get(id) {
                Some(&node) => {
                    tracked |= 1 << i;
                    dest.push(node);
                }
                None => dest.push(NO_SLOT),
            }
        }
    });
    let Some(engine::TapeInfo {
        params,
        float,
        shapes,
    }) = engine::tape_info(inputs, output, tracked)
    else {
        return;
    };
    let needs = params | tracked;
    if needs == 0 || !float {
        return; // integer/bool results carry no gradient
    }
    // Built with no lock and no borrow of the tape held (a rule may create an array).
    let rule = rule();
    // A parameter made on another thread is zeroed when this collector first
    // records it (this thread's own were zeroed when the collector started).
    if params != 0 && !ACCUMULATE.with(Cell::get) {
        for (i, &id) in inputs.iter().enumerate() {
            if params & (1 << i) != 0
                && !engine::is_mine(id)
                && ZEROED.with(|z| z.borrow_mut().insert(id))
                && let Ok(Some(g)) = engine::grad(id)
            {
                let _ = engine::zero_fill(g);
            }
        }
    }
    let (mask, out) = rule.saves(inputs.len());
    let mut held: SmallVec<[ArrayId; 4]> = SmallVec::new();
    for (i, &id) in inputs.iter().enumerate() {
        if mask & (1 << i) != 0 {
            held.push(id);
        }
    }
    if out {
        held.push(output);
    }
    let extra = rule.extra();
    if !extra.is_empty() {
        held.extend_from_slice(&extra); // most rules read no further array
    }
    engine::hold_all(&mut held);
    TAPE.with(|t| {
        let mut t = t.borrow_mut();
        t.held.extend_from_slice(&held);
        for (i, &id) in inputs.iter().enumerate() {
            if tracked & (1 << i) == 0 && params & (1 << i) != 0 {
                dest[i] = LEAF | t.leaf(id);
            }
        }
        let index = t.nodes.len() as u32;
        t.tracked.insert(output, index);
        t.nodes.push(Node {
            rule,
            inputs: SmallVec::from_slice(inputs),
            shapes,
            needs,
            output,
            dest,
        });
    });
}

/// Error if an in-place write to `id` would invalidate the recording tape (also
/// inside [`no_grad`], where the tape is not recording but still reads `id` later).
pub(crate) fn check_inplace(op: &'static str, id: ArrayId) -> Result<()> {
    if !COLLECTING.with(Cell::get) {
        return Ok(());
    }
    let depends = TAPE.with(|t| {
        let t = t.borrow();
        !t.nodes.is_empty() && (t.tracked.contains_key(&id) || engine::is_param(id))
    });
    if depends {
        return Err(NdError::invalid(
            op,
            "in-place update of an array the gradient tape depends on (a parameter or a \
             recorded result) while a GradientCollector is recording; update after \
             backward() or after the collector is dropped",
        ));
    }
    Ok(())
}

/// Error if writing `source` into `target` in place (`set`, `addi`, ...) would drop
/// its gradient: while a collector records, `source` is a parameter or a recorded
/// result, and the write is never recorded. Writes into a parameter (a leaf: an
/// optimizer update, a parameter copy) are left to [`check_inplace`].
pub(crate) fn check_inplace_source(
    op: &'static str,
    target: ArrayId,
    source: ArrayId,
) -> Result<()> {
    if !RECORDING.with(Cell::get) {
        return Ok(());
    }
    let (target_is_param, source_is_param) = (engine::is_param(target), engine::is_param(source));
    if target_is_param {
        return Ok(());
    }
    if source_is_param || TAPE.with(|t| t.borrow().tracked.contains_key(&source)) {
        return Err(NdError::invalid(
            op,
            "the value requires a gradient (a parameter or a recorded result) but an \
             in-place write is not recorded, so its gradient would be lost; build the \
             result with recorded ops instead (e.g. concat, where_, arithmetic), or \
             compute the value outside the GradientCollector if no gradient is wanted",
        ));
    }
    Ok(())
}

/// Records differentiable ops on this thread while alive, for
/// [`GradientCollector::backward`]. Intermediates the tape needs stay alive past the
/// close of their scope until `backward` returns or the collector drops.
///
/// Only one collector may be alive per thread. Dropping it (with or without calling
/// [`GradientCollector::backward`]) releases everything its tape held.
pub struct GradientCollector {
    _not_send: PhantomData<*const ()>,
}

impl GradientCollector {
    /// Start recording on this thread, zeroing the gradients of the parameters created
    /// on this thread now and of any other parameter when the tape first records it
    /// (so collectors on two threads training their own parameters never interfere).
    /// Panics if a collector is already alive on this thread.
    #[allow(clippy::new_without_default)]
    #[track_caller]
    pub fn new() -> GradientCollector {
        unwrap(Self::try_new())
    }

    /// [`GradientCollector::new`]; `InvalidArgument` if a collector is already alive on
    /// this thread.
    pub fn try_new() -> Result<GradientCollector> {
        Self::start("GradientCollector::new", false)
    }

    /// Start recording without zeroing gradients: `backward` adds to them (PyTorch's
    /// behaviour, for gradient accumulation over several batches). Panics if a collector
    /// is already alive on this thread.
    #[track_caller]
    pub fn accumulating() -> GradientCollector {
        unwrap(Self::try_accumulating())
    }

    /// [`GradientCollector::accumulating`]; `InvalidArgument` if a collector is already
    /// alive on this thread.
    pub fn try_accumulating() -> Result<GradientCollector> {
        Self::start("GradientCollector::accumulating", true)
    }

    fn start(op: &'static str, accumulate: bool) -> Result<GradientCollector> {
        if COLLECTING.with(Cell::get) {
            return Err(NdError::invalid(
                op,
                "a GradientCollector is already recording on this thread",
            ));
        }
        if !accumulate {
            zero_gradients()?;
        }
        ACCUMULATE.with(|c| c.set(accumulate));
        ZEROED.with(|z| z.borrow_mut().clear());
        COLLECTING.with(|c| c.set(true));
        // Inside `no_grad` recording starts when the outermost `no_grad` returns.
        RECORDING.with(|c| c.set(NO_GRAD.with(Cell::get) == 0));
        Ok(GradientCollector {
            _not_send: PhantomData,
        })
    }

    /// Number of ops on the tape now.
    pub fn tape_len(&self) -> usize {
        TAPE.with(|t| t.borrow().nodes.len())
    }

    /// Compute the gradient of `loss` (summed first if it is not a scalar) with respect
    /// to every array that requires a gradient and was used to compute it, adding it
    /// into their [`NDArray::gradient`] arrays. Consumes the tape: the intermediates it
    /// held are released when this returns, and a second `backward` needs a new
    /// forward pass.
    ///
    /// Errors: `InvalidArgument` if `loss` was not computed from an array requiring a
    /// gradient under this collector, `Closed` if an array the tape needs was closed
    /// explicitly or by its manager.
    pub fn backward(&self, loss: NDArray) -> Result<()> {
        // The tape is empty while backward runs (so its in-place writes are allowed).
        let mut tape = TAPE.with(|t| std::mem::take(&mut *t.borrow_mut()));
        // Off while backward runs; restored after (still off inside `no_grad`).
        let recording = RECORDING.with(|c| c.replace(false));
        let result = {
            let scope = NDScope::new();
            let r = backward::run(&mut tape, loss, scope.id());
            drop(scope);
            r
        };
        RECORDING.with(|c| c.set(recording));
        tape.clear();
        // Give the emptied tape (and its capacity) back for the next collector.
        TAPE.with(|t| {
            let mut t = t.borrow_mut();
            if t.nodes.is_empty() && t.held.is_empty() {
                *t = tape;
            }
        });
        result
    }
}

impl Drop for GradientCollector {
    fn drop(&mut self) {
        RECORDING.with(|c| c.set(false));
        COLLECTING.with(|c| c.set(false));
        TAPE.with(|t| t.borrow_mut().clear());
    }
}

impl std::fmt::Debug for GradientCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GradientCollector({} ops recorded)", self.tape_len())
    }
}

/// Zero the gradients of this thread's live parameters (those created on it).
fn zero_gradients() -> Result<()> {
    // Gradients that own their buffer are zeroed by the engine in one lock; the rest
    // (viewed or shared ones) here.
    for gr in engine::zero_my_param_grads() {
        // A gradient closed by hand is skipped; `gradient()` reports it.
        let _ = engine::zero_fill(gr);
    }
    Ok(())
}

impl NDArray {
    twins! {
        /// Mark this array as a parameter (`true`): its gradient array is created now (zeros
        /// of its shape and dtype, owned by its manager, in no scope) and is filled by
        /// [`GradientCollector::backward`]. `false` frees the gradient. Only float arrays
        /// can require a gradient. Panics on failure.
        pub fn set_requires_gradient,
        /// [`NDArray::set_requires_gradient`]. Errors: `Closed`, `UnsupportedDType` (not a
        /// float array), `ManagerClosed`/`ManagerCapped` (the gradient cannot be created).
        pub fn try_set_requires_gradient(self, requires: bool) -> NDArray {
            let current = engine::grad(self.id)?;
            match (requires, current) {
                (true, None) => {
                    let (shape, dtype) = (self.try_shape()?, self.try_dtype()?);
                    if !dtype.is_float() {
                        return Err(NdError::UnsupportedDType {
                            op: "set_requires_gradient",
                            dtype,
                            array: engine::desc(self.id)?,
                        });
                    }
                    // Beside the parameter: on its device, owned by its manager.
                    let at = std::panic::Location::caller();
                    let grad = NDArray {
                        id: engine::full_beside(self.id, shape, 0.0, dtype, at)?,
                    };
                    grad.keep();
                    // Atomic: a racing call's gradient wins and this one is freed.
                    engine::install_grad(self.id, grad.id)?;
                }
                (false, Some(g)) => {
                    let _ = g;
                    engine::drop_grad(self.id, std::panic::Location::caller())?;
                }
                _ => {}
            }
            Ok(self)
        }
    }

    /// Whether this array requires a gradient (false for a closed array).
    pub fn requires_gradient(self) -> bool {
        engine::is_param(self.id)
    }

    twins! {
        /// The gradient array: the same handle on every call (no array is created), owned
        /// by this array's manager. Panics if it does not require a gradient.
        pub fn gradient,
        /// [`NDArray::gradient`]. Errors: `Closed`, `InvalidArgument` (does not require a
        /// gradient).
        pub fn try_gradient(self) -> NDArray {
            match engine::grad(self.id)? {
                Some(id) => Ok(NDArray { id }),
                None => Err(NdError::invalid(
                    "gradient",
                    "this array does not require a gradient; call set_requires_gradient(true)",
                )),
            }
        }
    }
}

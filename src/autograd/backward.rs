//! The backward pass: walks the tape from the loss back to the leaves, asks each
//! node's rule (the op's [`super::Backward`] impl, beside the op) for its inputs'
//! gradients, kept lazy ([`LazyGrad`]) where a rule only scales or passes them on, and
//! adds them into the parameters' gradients in place.

use super::{BackwardCtx, Base, Env, LEAF, LazyGrad, LazyGrads, NO_SLOT, Node, Tape};
use crate::NDArray;
use crate::engine::{self, ArrayId};
use crate::error::{NdError, Result};
use smallvec::SmallVec;

/// Run backward over `tape`'s nodes from `loss`, adding into the parameters'
/// gradients. The gradient of a node's output is kept in its slot (the node's index)
/// and a parameter's in its leaf slot, so no map is built. `scope` is the scope
/// backward runs in, closed when this returns: a parameter's zeroed gradient may take
/// over the buffer of a value dying with it (see `engine::add_to_grads`).
pub(super) fn run(tape: &mut Tape, loss: NDArray, scope: engine::ScopeId) -> Result<()> {
    let mut slots = std::mem::take(&mut tape.slots);
    let r = run_in(tape, loss, &mut slots, scope);
    slots.clear();
    tape.slots = slots;
    r
}

/// [`run`] with `slots` (empty) as the scratch for the gradients.
fn run_in(
    tape: &Tape,
    loss: NDArray,
    slots: &mut Vec<Option<LazyGrad>>,
    scope: engine::ScopeId,
) -> Result<()> {
    let nodes = &tape.nodes;
    let (shape, dtype, loss_is_param) = engine::loss_info(loss.id)?;
    let env = Env { loss, dtype };
    let seed = LazyGrad {
        base: Base::Ones(shape),
        scale: 1.0,
    };
    // One slot per node, one per parameter, and one for a loss that is a parameter
    // the tape never read.
    slots.resize(nodes.len() + tape.leaf_ids.len() + 1, None);
    let (grads, leaves) = slots.split_at_mut(nodes.len());
    let mut loss_leaf: Option<ArrayId> = None;
    match tape.tracked.get(&loss.id) {
        Some(&i) => grads[i as usize] = Some(seed),
        None if loss_is_param => {
            let slot = match tape.leaf_ids.iter().position(|&id| id == loss.id) {
                Some(s) => s,
                None => {
                    loss_leaf = Some(loss.id);
                    tape.leaf_ids.len()
                }
            };
            leaves[slot] = Some(seed);
        }
        None => {
            return Err(NdError::invalid(
                "backward",
                "the loss was not computed from an array that requires a gradient while \
                 this GradientCollector was recording",
            ));
        }
    }
    for (n, node) in nodes.iter().enumerate().rev() {
        let Some(g) = grads[n].take() else {
            continue;
        };
        let inputs = input_grads(node, g, &env)?;
        for (i, gi) in inputs.into_iter().enumerate() {
            let Some(gi) = gi else { continue };
            let d = node.dest[i];
            let slot = match d {
                NO_SLOT => continue,
                _ if d & LEAF != 0 => &mut leaves[(d & !LEAF) as usize],
                _ => &mut grads[d as usize],
            };
            *slot = Some(match slot.take() {
                Some(prev) => prev.add(gi, &env)?,
                None => gi,
            });
        }
    }
    // Add into the parameters' gradients in place, all or nothing: if one gradient
    // array was freed (e.g. with a manager the parameter has left), fail before
    // changing any of them. The common case takes one engine lock for all of them.
    let ids = tape.leaf_ids.iter().copied().chain(loss_leaf);
    let mut params: SmallVec<[ArrayId; 4]> = SmallVec::new();
    let mut gs: SmallVec<[LazyGrad; 4]> = SmallVec::new();
    for (id, g) in ids.zip(leaves.iter_mut()) {
        if let Some(g) = g.take() {
            params.push(id);
            gs.push(g);
        }
    }
    let values: SmallVec<[Option<(ArrayId, bool)>; 4]> = gs
        .iter()
        .map(|g| match &g.base {
            Base::Arr(a) => Some((a.id, false)),
            Base::Unreduced(a, _) => Some((a.id, true)),
            Base::Ones(_) => None,
        })
        .collect();
    let scales: SmallVec<[f64; 4]> = gs.iter().map(|g| g.scale).collect();
    let done = engine::add_to_grads(&params, &values, &scales, scope);
    if done {
        return Ok(());
    }
    let mut updates: SmallVec<[(NDArray, LazyGrad); 4]> = SmallVec::new();
    for (id, g) in params.into_iter().zip(gs) {
        if let Ok(Some(pg)) = engine::grad(id) {
            updates.push((NDArray { id: pg }, g.settle()?));
        }
    }
    for (pg, _) in &updates {
        pg.try_shape()?;
    }
    for (pg, g) in updates {
        accumulate(pg, g)?;
    }
    Ok(())
}

/// `pg += g` in place, with `g`'s scale fused into the kernel.
fn accumulate(pg: NDArray, g: LazyGrad) -> Result<()> {
    let v = match g.base {
        Base::Unreduced(..) => unreachable!("settled"),
        Base::Ones(_) => None,
        Base::Arr(b) => Some(b.id),
    };
    engine::add_into("backward", pg.id, v, g.scale, false)
}

/// The gradients of `node`'s inputs (None where not needed) given its output's `g`,
/// from the node's rule.
fn input_grads(node: &Node, g: LazyGrad, env: &Env) -> Result<LazyGrads> {
    let g = g.settle()?;
    let cx = BackwardCtx {
        ids: &node.inputs,
        shapes: &node.shapes,
        output: arr(node.output),
        needs: node.needs,
        env,
    };
    let mut r = node.rule.backward_lazy(&cx, g)?;
    if r.len() != node.inputs.len() {
        r.resize(node.inputs.len(), None);
    }
    for (i, gi) in r.iter_mut().enumerate() {
        if !cx.need(i) {
            *gi = None;
        }
    }
    Ok(r)
}

use super::arr;

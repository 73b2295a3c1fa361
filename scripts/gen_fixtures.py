#!/usr/bin/env python3
"""Generate the numpy reference fixtures in tests/fixtures/ops/*.json.

Run from anywhere: `python3 scripts/gen_fixtures.py` (needs numpy; written against
numpy 2.4). The output is deterministic (every family has its own seeded generator),
so regenerating without changing this script reproduces the committed files byte for
byte. `tests/ops/fixtures.rs` (part of `cargo test --test ops`) reads the committed
files; CI needs no Python.

Where the reference values come from
------------------------------------
* Outputs: numpy. Float ops are computed in float64 from the (f32 or f64) inputs and
  rounded once to the output dtype, so an f32 expectation is the correctly rounded
  true value and the runner allows f32 rounding (rtol/atol 1e-5; f64: 1e-12). Integer
  ops are computed in the array's own dtype with wrapping, exactly.
* Gradients: PyTorch could not be installed here (PyPI's Linux wheel pulls ~3 GB of
  CUDA packages, and the CPU-only index is unreachable from this machine), so the
  expected gradient of `sum(out * r)` (r random, of the output's shape) with respect to
  each float input is computed with numpy by *complex-step differentiation* in float64:
  d/dx_j sum(f(x) * r) = Im(sum(f(x + i*h*e_j) * r)) / h with h = 1e-30. Unlike finite
  differences this has no cancellation error, so it is exact to float64 rounding; each
  op's numpy function is written to be complex-safe for that (comparisons and
  selections use the real part, see `cmax`, `cabs`, `crelu`). Every gradient is also
  cross-checked against central differences (eps 1e-6) before it is written, and
  generation stops on a disagreement; cases with a kink on purpose (e.g. clip at a
  bound) say `fd_check=False`. Gradients at kinks follow PyTorch's conventions
  (relu'(0) = 0, abs'(0) = 0, clip's gradient is 1 at the bounds, max/min reductions
  share the gradient among ties), which ndscope documents.

Where the fixtures follow ndscope's documented semantics instead of numpy's
----------------------------------------------------------------------------
* Integer `div` truncates toward zero and gives 0 on division by zero (Rust's
  `wrapping_div`; PyTorch's `div(rounding_mode='trunc')`); numpy's `/` gives floats.
* Integer `pow` with a negative exponent gives 1 / x^n truncated toward zero (1 for
  a base of 1, +-1 for a base of -1, 0 otherwise; PyTorch's integer semantics); numpy
  raises.
* A scalar right-hand side takes the array's dtype (`int_array * 2.5` multiplies by
  2; floats to integers truncate and saturate as Rust's `as`; integers wrap).
  Comparisons of integer and Bool arrays with a scalar compare as numbers (as numpy).
* `maximum`/`minimum` give the gradient of a tie to the left operand (PyTorch
  splits it); the generated gradient cases contain no ties.
* `max`/`min`/`argmax`/`argmin` over a zero-length axis are an error only when the
  result is not empty (numpy raises even for an empty result, e.g. `zeros((0, 0))`
  reduced over axis 0).
* `mean` of an integer array gives f64 (as numpy); `sum`/`prod` of integer arrays
  keep the dtype and wrap (numpy promotes to int64).
* `clip` on an integer array rounds the bounds inward; `to_dtype` from a float to an
  integer truncates toward zero (only in-range values are generated: numpy's
  out-of-range float casts are undefined).
* `broadcast_to` copies (numpy gives a read-only view); values are the same.
* `dot` of N-D operands follows `matmul` (batched), not numpy's tensor `dot`.

The case format (one JSON file per op family)
---------------------------------------------
    {"family": "binary", "cases": [case, ...]}
    case = {
      "id": "binary/add/f32/007",      # unique; KNOWN_FAILURES in the runner names it
      "op": "add",                     # the runner's match arm
      "params": {"scalar": 2.5, ...},  # op parameters (axes, index strings, ...)
      "inputs": [array, ...],          # an array may add "view"/"perm" (below)
      "expected": array | {"error": "ShapeMismatch"},   # NdError variant name
      "grad": null | {"r": array, "inputs": [array | null, ...]}
    }
    array = {"shape": [2, 3], "dtype": "f32", "data": [flat row-major values]}
Float data may hold the strings "nan", "inf", "-inf"; Bool data is true/false.
An input with "view": "1:, ::-1" is `base.get(view)` and with "perm": [1, 0] then
`.permute(perm)`: a non-contiguous (or offset zero-size) input. Gradients are with
respect to the base array (the leaf the runner creates), so they have its shape.

How to add an op (e.g. `gather`, `var`, `conv2d` of issue 11)
--------------------------------------------------------------
1. Here, one entry in `OPS` (below the op helpers), e.g.
       OPS["var"] = Op(lambda xs, p, d: cvar(xs[0], p))
       OPS["gather"] = Op(lambda xs, p, d: np.take_along_axis(xs[0], xs[1], p["axis"]))
       OPS["erf"] = Op(lambda xs, p, d: np.vectorize(math.erf)(xs[0]), complex_safe=False)
   `fwd(xs, p, dtypes)` gets the effective inputs (float inputs as float64, or as
   complex128 while gradients are computed; integer and Bool inputs in their own
   dtype), the params dict and the input dtype names, and returns the result. For a
   differentiable op it should be complex-safe: compare and select on `.real`
   (`cmaximum`, `cabs`, `crelu`, `cextreme` show how), never np.abs/np.maximum/np.max
   of a complex array; if it cannot be (math.erf), say `complex_safe=False`. Give
   `out=fixed("i64")` or `out=same_as(1)` when the output dtype is not the first
   input's; `grad=False` for a non-differentiable op. An op returning several arrays
   (`split`) is compared stacked: numpy `np.stack(np.split(...))`, runner
   `NDArray::try_stack(&parts, 0)`. Random ops (dropout) do not belong here.
   Then the cases, in an existing `gen_<family>()` or a new one added to `FAMILIES`
   (its own JSON file and seed, so the other files do not change):
       f.add("var", [f.input((3, 4), "f64")], {"axes": [-1], "keep_dims": True})
       f.add("gather", [f.input((3, 4), "f32"), arr([[0], [3], [1]], "i64")], {"axis": 1})
       f.error("gather", [...], {"axis": 1}, "Index")      # the NdError variant
   `f.input` makes random values, sometimes as a non-contiguous view; `arr` exact
   values. A float output gets a gradient case unless `grad=False`; `tol=(rtol, atol)`
   loosens the comparison; `fd_check=False` skips the central-difference cross-check
   where a case sits on a kink on purpose.
2. In tests/ops/fixtures.rs, one match arm in `apply`, e.g.
       "var" => match axes(p) {
           None => x[0].try_var(),
           Some(a) => x[0].try_var_axes(&a, keep_dims(p)),
       },
       "gather" => x[0].try_gather(int(p, "axis") as isize, x[1]),
   (helpers for params: `int`, `float`, `string`, `usizes`, `isizes`, `axes`,
   `keep_dims`, `rhs`).
3. `python3 scripts/gen_fixtures.py && cargo test --test ops fixtures`, and commit the
   JSON. Keep the files under ~2 MB in all (small shapes; this script prints sizes).
   A case that finds an ndscope bug stays; list its id in `KNOWN_FAILURES` in the
   runner with the reason until the bug is fixed.
"""

import json
import math
import os
import sys

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ops")

NP = {
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "bool": np.bool_,
}
FLOATS = ["f32", "f64"]
INTS = ["i32", "i64", "u8"]
ALL = FLOATS + INTS + ["bool"]
NUMERIC = FLOATS + INTS
H = 1e-30  # complex step


# --------------------------------------------------------------------------------------
# Arrays and their JSON encoding


class Arr:
    """An input: a base array (what the runner creates) and an optional view of it."""

    def __init__(self, base, dtype, view=None, perm=None):
        self.dtype = dtype
        self.base = base
        self.view = view
        self.perm = perm

    @property
    def base(self):
        return self._base

    @base.setter
    def base(self, values):
        self._base = np.array(values).astype(NP[self.dtype])  # always an ndarray

    def effective(self, base=None):
        b = self.base if base is None else base
        if self.view is not None:
            b = b[np_index(self.view)]
        b = np.asarray(b)
        if self.perm is not None:
            b = np.transpose(b, self.perm)
        return b


def arr(values, dtype, view=None, perm=None):
    return Arr(values, dtype, view, perm)


def enc_value(v, dtype):
    if dtype == "bool":
        return bool(v)
    if dtype in INTS:
        return int(v)
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if dtype == "f32":
        s = str(np.float32(v))
        # The runner parses an f64 and rounds it to f32: make sure that gives v back.
        assert np.float32(float(s)) == np.float32(v), (s, v)
        out = json.loads(s)
        return out
    return f  # json writes the shortest repr that round-trips


def enc_array(a, dtype):
    a = np.asarray(a)
    return {
        "shape": list(a.shape),
        "dtype": dtype,
        "data": [enc_value(v, dtype) for v in a.reshape(-1)],
    }


def enc_input(x):
    d = enc_array(x.base, x.dtype)
    if x.view is not None:
        d["view"] = x.view
    if x.perm is not None:
        d["perm"] = list(x.perm)
    return d


# --------------------------------------------------------------------------------------
# Index strings (src/array/index.rs grammar) to numpy basic indexing


def np_index(s):
    s = s.strip()
    if not s:
        return ()
    parts = [p.strip() for p in s.split(",")]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    items = []
    for p in parts:
        if p == "...":
            items.append(Ellipsis)
        elif ":" in p:
            b = [q.strip() for q in p.split(":")]
            conv = [int(q) if q else None for q in b] + [None] * (3 - len(b))
            items.append(slice(*conv))
        else:
            items.append(int(p))
    return tuple(items)


# --------------------------------------------------------------------------------------
# Complex-safe numpy helpers (differentiable by complex step)


def cmaximum(a, b):
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.where(np.real(a) >= np.real(b), a, b)
    return np.maximum(a, b)


def cminimum(a, b):
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.where(np.real(a) <= np.real(b), a, b)
    return np.minimum(a, b)


def cabs(x):
    if np.iscomplexobj(x):
        return np.where(x.real > 0, x, np.where(x.real < 0, -x, 0 * x))
    return np.abs(x)


def crelu(x):
    if np.iscomplexobj(x):
        return np.where(x.real > 0, x, 0 * x)
    return np.maximum(x, np.zeros((), x.dtype))  # NaN propagates


def csigmoid(x):
    if np.iscomplexobj(x):
        return 0.5 * (1.0 + np.tanh(x / 2))  # no overflow to inf * 0 in the imaginary part
    return 1.0 / (1.0 + np.exp(-x))


def ax_tuple(p, nd):
    if p.get("axes") is None:
        return tuple(range(nd))
    return tuple(a % nd for a in p["axes"])


def cextreme(x, p, is_max):
    """max/min over p["axes"]; ties share the gradient (as PyTorch's amax)."""
    axes = ax_tuple(p, x.ndim)
    keep = p.get("keep_dims", False)
    re = np.real(x)
    if re.size == 0:
        shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if keep else [
            n for i, n in enumerate(x.shape) if i not in axes
        ]
        return np.zeros(shape, dtype=x.dtype)
    m = (np.max if is_max else np.min)(re, axis=axes, keepdims=True)
    if not np.iscomplexobj(x):
        return np.squeeze(m, axis=axes) if not keep else m
    mask = re == m
    count = np.sum(mask, axis=axes, keepdims=True)
    out = m + np.sum(np.where(mask, x - m, 0), axis=axes, keepdims=True) / count
    return out if keep else np.squeeze(out, axis=axes)


def softmax(x, axis, log):
    if x.size == 0:
        return x.copy()
    m = np.max(np.real(x), axis=axis, keepdims=True)
    z = x - m
    s = np.sum(np.exp(z), axis=axis, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


# --------------------------------------------------------------------------------------
# Integer semantics (Rust wrapping arithmetic)

BITS = {"i32": 32, "i64": 64, "u8": 8, "bool": 8}


def wrap(v, dtype):
    bits = BITS[dtype]
    v &= (1 << bits) - 1
    if dtype in ("i32", "i64") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def int_div(a, b, dtype):
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return wrap(q, dtype)


def int_pow(a, e, dtype):
    if e < 0:
        if a == 1:
            return 1
        if a == -1:
            return 1 if e % 2 == 0 else -1
        return 0
    return wrap(pow(a, e, 1 << BITS[dtype]), dtype)


def elementwise_int(f, a, b, dtype):
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(a.shape):
        out[i] = f(int(a[i]), int(b[i]), dtype)
    return out


def rust_as_int(v, dtype):
    """Rust's `f64 as iN/u8`: truncate, saturate, NaN to 0."""
    if math.isnan(v):
        return 0
    lo, hi = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u8": (0, 255)}[dtype]
    if math.isinf(v):
        return hi if v > 0 else lo
    return max(lo, min(hi, int(v)))


def scalar_as(s, dtype):
    """A scalar right-hand side converted to the array's dtype (ScalarValue::cast)."""
    if dtype in FLOATS:
        return np.float64(NP[dtype](s))
    if isinstance(s, float):
        return NP[dtype](rust_as_int(s, dtype))
    return NP[dtype](wrap(s, dtype))


# --------------------------------------------------------------------------------------
# Ops: the numpy forward of every op ndscope has, by the runner's names


class Op:
    """An op's numpy reference: `fwd(xs, p, dtypes)` gives its result, `out(dtypes, p)`
    its dtype name; `grad`: differentiable (gradient cases for float outputs);
    `complex_safe=False` when `fwd` cannot run on complex inputs (e.g. it needs
    `math.erf`): gradients then come from a 5-point central difference (h = 1e-3,
    error about 1e-12 on smooth functions) and its cases carry `tol` 1e-8 (the
    runner's floor for rtol and atol)."""

    def __init__(self, fwd, out=None, grad=True, complex_safe=True):
        self.fwd = fwd
        self.out = out or same
        self.grad = grad
        self.complex_safe = complex_safe


def same(dtypes, p):
    return dtypes[0]


def same_as(i):
    return lambda dtypes, p: dtypes[i]


def fixed(d):
    return lambda dtypes, p: d


def binary_fwd(name):
    def f(xs, p, dtypes):
        d = dtypes[0]
        a = xs[0]
        if "scalar" in p:
            b = scalar_as(p["scalar"], d)
            if p.get("scalar_left"):
                a, b = b, a
        else:
            b = xs[1]
        if d in INTS:
            if name == "div":
                return elementwise_int(int_div, a, b, d)
            if name == "pow":
                return elementwise_int(int_pow, a, b, d)
            a64, b64 = np.asarray(a).astype(object), np.asarray(b).astype(object)
            r = {
                "add": lambda: a64 + b64,
                "sub": lambda: a64 - b64,
                "mul": lambda: a64 * b64,
                "maximum": lambda: np.maximum(a64, b64),
                "minimum": lambda: np.minimum(a64, b64),
            }[name]()
            return np.vectorize(lambda v: wrap(int(v), d), otypes=[object])(r)
        return {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "div": lambda: a / b,
            "pow": lambda: np.power(a, b),
            "maximum": lambda: cmaximum(a, b),
            "minimum": lambda: cminimum(a, b),
        }[name]()

    return f


def compare_fwd(name):
    fn = {
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
    }[name]

    def f(xs, p, dtypes):
        d = dtypes[0]
        a = xs[0]
        if "scalar" not in p:
            return fn(a, xs[1])
        s = p["scalar"]
        if d in FLOATS:
            return fn(a, scalar_as(s, d))
        # Integer and Bool arrays compare as numbers: an int scalar exactly, a float
        # scalar against the element converted to f64.
        if isinstance(s, int):
            return np.vectorize(lambda v: fn(int(v), s), otypes=[bool])(a)
        return np.vectorize(lambda v: fn(float(int(v)), s), otypes=[bool])(a)

    return f


def unary_fwd(name):
    def f(xs, p, dtypes):
        x = xs[0]
        if dtypes[0] in INTS:
            o = np.asarray(x).astype(object)
            r = {
                "abs": lambda: np.abs(o),
                "neg": lambda: -o,
                "square": lambda: o * o,
                "relu": lambda: np.maximum(o, 0),
            }[name]()
            return np.vectorize(lambda v: wrap(int(v), dtypes[0]), otypes=[object])(r)
        return {
            "abs": lambda: cabs(x),
            "neg": lambda: -x,
            "square": lambda: x * x,
            "relu": lambda: crelu(x),
            "exp": lambda: np.exp(x),
            "log": lambda: np.log(x),
            "sqrt": lambda: np.sqrt(x),
            "sin": lambda: np.sin(x),
            "cos": lambda: np.cos(x),
            "tanh": lambda: np.tanh(x),
            "sigmoid": lambda: csigmoid(x),
        }[name]()

    return f


def reduce_fwd(name):
    def f(xs, p, dtypes):
        x, d = xs[0], dtypes[0]
        axes = ax_tuple(p, x.ndim)
        keep = p.get("keep_dims", False)
        if name in ("max", "min"):
            return cextreme(x, p, name == "max")
        if d in INTS:
            if name == "mean":
                n = int(np.prod([x.shape[a] for a in axes]))
                s = np.sum(x.astype(np.float64), axis=axes, keepdims=keep)
                return s / n if n else s * np.nan
            o = x.astype(object)
            r = (np.sum if name == "sum" else np.prod)(o, axis=axes, keepdims=keep)
            # (an empty sum is 0 and an empty product 1, as in ndscope)
            r = np.asarray(r, dtype=object)
            if r.size == 0:
                return r
            return np.vectorize(lambda v: wrap(int(v), d), otypes=[object])(r)
        if name == "sum":
            return np.sum(x, axis=axes, keepdims=keep)
        if name == "prod":
            return np.prod(x, axis=axes, keepdims=keep)
        n = int(np.prod([x.shape[a] for a in axes]))
        s = np.sum(x, axis=axes, keepdims=keep)
        return s / n if n else s * np.nan

    return f


def arg_fwd(is_max):
    def f(xs, p, dtypes):
        x = xs[0]
        fn = np.argmax if is_max else np.argmin
        if x.dtype == np.bool_:
            x = x.astype(np.int64)
        if "axis" in p:
            return fn(x, axis=p["axis"], keepdims=p.get("keep_dims", False))
        return np.asarray(fn(x))

    return f


def matmul_fwd(dot):
    def f(xs, p, dtypes):
        a, b = xs
        if dtypes[0] in INTS:
            # Accumulating in int64 and wrapping at the end equals wrapping at each
            # step (modular arithmetic); the generated values cannot overflow int64.
            a, b = a.astype(np.int64), b.astype(np.int64)
        r = a * b if dot and (a.ndim == 0 or b.ndim == 0) else np.matmul(a, b)
        if dtypes[0] in INTS:
            return np.vectorize(lambda v: wrap(int(v), dtypes[0]), otypes=[object])(np.asarray(r))
        return r

    return f


def clip_fwd(xs, p, dtypes):
    x, d = xs[0], dtypes[0]
    lo, hi = p["min"], p["max"]
    if d in INTS:
        lo, hi = rust_as_int(math.ceil(lo), d), rust_as_int(math.floor(hi), d)
        return np.clip(x, NP[d](lo), NP[d](hi))
    lo, hi = float(NP[d](lo)), float(NP[d](hi))
    if np.iscomplexobj(x):
        inside = (x.real >= lo) & (x.real <= hi)
        return np.where(inside, x, np.clip(x.real, lo, hi))
    return np.clip(x, lo, hi)


def cast_fwd(xs, p, dtypes):
    x, src, dst = xs[0], dtypes[0], p["dtype"]
    if dst == "bool":
        return x != 0
    if dst in FLOATS:
        if src in INTS:
            return np.vectorize(lambda v: float(NP[dst](int(v))), otypes=[np.float64])(x) if x.size else x.astype(np.float64)
        return x if np.iscomplexobj(x) else x.astype(np.float64)
    if src in FLOATS:
        return np.vectorize(lambda v: rust_as_int(float(v), dst), otypes=[object])(x) if x.size else x.astype(object)
    return np.vectorize(lambda v: wrap(int(v), dst), otypes=[object])(x) if x.size else x.astype(object)


def stack_like(fn):
    return lambda xs, p, dtypes: fn(list(xs), axis=p["axis"])


OPS = {}
for _n in ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]:
    OPS[_n] = Op(lambda xs, p, d, _f=binary_fwd(_n): _f(xs, p, d))
for _n in ["eq", "ne", "gt", "ge", "lt", "le"]:
    OPS[_n] = Op(lambda xs, p, d, _f=compare_fwd(_n): _f(xs, p, d), out=fixed("bool"), grad=False)
for _n in ["abs", "neg", "square", "relu", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid"]:
    OPS[_n] = Op(lambda xs, p, d, _f=unary_fwd(_n): _f(xs, p, d))
for _n in ["sum", "mean", "max", "min", "prod"]:
    OPS[_n] = Op(lambda xs, p, d, _f=reduce_fwd(_n): _f(xs, p, d))
OPS["mean"].out = lambda dtypes, p: dtypes[0] if dtypes[0] in FLOATS else "f64"
OPS["argmax"] = Op(lambda xs, p, d: arg_fwd(True)(xs, p, d), out=fixed("i64"), grad=False)
OPS["argmin"] = Op(lambda xs, p, d: arg_fwd(False)(xs, p, d), out=fixed("i64"), grad=False)
OPS["matmul"] = Op(lambda xs, p, d: matmul_fwd(False)(xs, p, d))
OPS["dot"] = Op(lambda xs, p, d: matmul_fwd(True)(xs, p, d))
OPS["reshape"] = Op(lambda xs, p, d: np.reshape(xs[0], p["shape"]))
OPS["reshape_infer"] = Op(lambda xs, p, d: np.reshape(xs[0], p["dims"]))
OPS["flatten"] = Op(lambda xs, p, d: np.reshape(xs[0], -1))
OPS["transpose"] = Op(lambda xs, p, d: np.transpose(xs[0]))
OPS["permute"] = Op(lambda xs, p, d: np.transpose(xs[0], p["perm"]))
OPS["squeeze"] = Op(lambda xs, p, d: np.squeeze(xs[0], axis=p.get("axis")))
OPS["expand_dims"] = Op(lambda xs, p, d: np.expand_dims(xs[0], p["axis"]))
OPS["broadcast_to"] = Op(lambda xs, p, d: np.broadcast_to(xs[0], p["shape"]))
OPS["concat"] = Op(stack_like(np.concatenate))
OPS["stack"] = Op(stack_like(np.stack))
OPS["get"] = Op(lambda xs, p, d: np.asarray(xs[0][np_index(p["index"])]))
OPS["softmax"] = Op(lambda xs, p, d: softmax(xs[0], p["axis"], False))
OPS["log_softmax"] = Op(lambda xs, p, d: softmax(xs[0], p["axis"], True))
OPS["clip"] = Op(clip_fwd)
OPS["where"] = Op(lambda xs, p, d: np.where(xs[0], xs[1], xs[2]), out=same_as(1))
OPS["to_dtype"] = Op(cast_fwd, out=lambda dtypes, p: p["dtype"])


# --------------------------------------------------------------------------------------
# Case construction: expected output and complex-step gradients


def to_out(v, dtype):
    v = np.asarray(v)
    if dtype in FLOATS:
        with np.errstate(all="ignore"):
            return np.asarray(np.real(v) if np.iscomplexobj(v) else v).astype(np.float64).astype(NP[dtype])
    if dtype == "bool":
        return v.astype(np.bool_)
    return np.vectorize(lambda t: int(t), otypes=[object])(v) if v.size else v.astype(object)


def run_fwd(op, inputs, params, bases=None):
    """Apply op to the effective inputs (float inputs as float64 or complex128)."""
    xs = []
    for k, x in enumerate(inputs):
        b = x.base if bases is None else bases[k]
        if x.dtype in FLOATS and not np.iscomplexobj(b):
            b = b.astype(np.float64)
        xs.append(x.effective(b))
    dtypes = [x.dtype for x in inputs]
    with np.errstate(all="ignore"):
        return OPS[op].fwd(xs, params, dtypes)


def sum_out_r(op, inputs, params, bases, r):
    out = np.asarray(run_fwd(op, inputs, params, bases))
    assert out.shape == r.shape, (out.shape, r.shape)
    return np.sum(out * r)


def gradients(op, inputs, params, r, fd_check):
    complex_safe = OPS[op].complex_safe
    grads = []
    for k, x in enumerate(inputs):
        if x.dtype not in FLOATS:
            grads.append(None)
            continue
        base = x.base.astype(np.float64)
        g = np.zeros(base.shape)
        for j in np.ndindex(base.shape):
            bases = [y.base.astype(np.float64) if y.dtype in FLOATS else y.base for y in inputs]
            if complex_safe:
                bc = base.astype(np.complex128)
                bc[j] += 1j * H
                bases[k] = bc
                g[j] = np.imag(sum_out_r(op, inputs, params, bases, r)) / H
            else:
                h, acc = 1e-3, 0.0
                for step, weight in ((2, -1), (1, 8), (-1, -8), (-2, 1)):
                    bp = base.copy()
                    bp[j] += step * h
                    bases[k] = bp
                    acc += weight * float(sum_out_r(op, inputs, params, bases, r))
                g[j] = acc / (12 * h)
            if fd_check:
                eps = 1e-6
                vals = []
                for sgn in (1, -1):
                    bp = base.copy()
                    bp[j] += sgn * eps
                    bases[k] = bp
                    vals.append(float(sum_out_r(op, inputs, params, bases, r)))
                fd = (vals[0] - vals[1]) / (2 * eps)
                assert abs(fd - g[j]) <= 1e-5 * (1 + abs(fd)), (
                    f"{op} {params}: complex step {g[j]} vs central difference {fd} "
                    f"at input {k} element {j}"
                )
        grads.append(g)
    return grads


class Family:
    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.cases = []
        self.counts = {}

    def _id(self, op, dtypes):
        dtype = next((d for d in dtypes if d != "bool"), "bool") if dtypes else "-"
        key = (op, dtype)
        self.counts[key] = self.counts.get(key, 0) + 1
        return f"{self.name}/{op}/{dtype}/{self.counts[key]:03d}"

    def add(self, op, inputs, params=None, grad=True, fd_check=True, tol=None):
        """A case whose expected output (and gradient, for float outputs) numpy
        computes; `tol=(rtol, atol)` loosens the runner's tolerances for it."""
        params = params or {}
        spec = OPS[op]
        dtypes = [x.dtype for x in inputs]
        out_dtype = spec.out(dtypes, params)
        out = to_out(run_fwd(op, inputs, params), out_dtype)
        case = {
            "id": self._id(op, dtypes),
            "op": op,
            "params": params,
            "inputs": [enc_input(x) for x in inputs],
            "expected": enc_array(out, out_dtype),
            "grad": None,
        }
        if tol is not None:
            case["tol"] = list(tol)
        finite = all(
            np.all(np.isfinite(x.base)) for x in inputs if x.dtype in FLOATS
        ) and (out_dtype not in FLOATS or np.all(np.isfinite(out.astype(np.float64))))
        if grad and spec.grad and out_dtype in FLOATS and finite and any(d in FLOATS for d in dtypes):
            r = np.round(self.rng.uniform(-1, 1, out.shape), 2).astype(NP[out_dtype])
            r64 = r.astype(np.float64)
            gs = gradients(op, inputs, params, r64, fd_check)
            if not spec.complex_safe:
                case["tol"] = [max(a, 1e-8) for a in case.get("tol", [0.0, 0.0])]
            case["grad"] = {
                "r": enc_array(r, out_dtype),
                "inputs": [
                    None if g is None else enc_array(g.astype(NP[x.dtype]) if x.dtype == "f32" else g, x.dtype)
                    for g, x in zip(gs, inputs)
                ],
            }
        self.cases.append(case)

    def error(self, op, inputs, params, variant):
        dtypes = [x.dtype for x in inputs]
        self.cases.append(
            {
                "id": self._id(op, dtypes),
                "op": op,
                "params": params or {},
                "inputs": [enc_input(x) for x in inputs],
                "expected": {"error": variant},
                "grad": None,
            }
        )

    # ---- random data

    def values(self, shape, dtype, lo=-3.0, hi=3.0, special=False):
        shape = tuple(shape)
        rng = self.rng
        if dtype in FLOATS:
            v = np.round(rng.uniform(lo, hi, shape), 2)
            if special and v.size:
                flat = v.reshape(-1)
                for _ in range(max(1, v.size // 4)):
                    flat[rng.integers(v.size)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
            return v.astype(NP[dtype])
        if dtype == "bool":
            return rng.integers(0, 2, shape).astype(np.bool_)
        if dtype == "u8":
            return rng.integers(0, 256 if special else 10, shape).astype(np.uint8)
        info = np.iinfo(NP[dtype])
        if special:
            v = rng.integers(-1000, 1000, shape).astype(NP[dtype])
            flat = v.reshape(-1)
            for _ in range(max(1, v.size // 4)) if v.size else []:
                flat[rng.integers(v.size)] = rng.choice([info.min, info.max, -1, 0, 1])
            return v
        return rng.integers(-9, 10, shape).astype(NP[dtype])

    def shape(self, max_nd=3, max_dim=4, zero=0.1):
        nd = int(self.rng.integers(0, max_nd + 1))
        return tuple(
            0 if self.rng.random() < zero else int(self.rng.integers(1, max_dim + 1)) for _ in range(nd)
        )

    def input(self, shape, dtype, noncontig=0.3, **kw):
        """An input of `shape`, sometimes as a non-contiguous view of a larger base."""
        shape = tuple(shape)
        rng = self.rng
        if len(shape) and rng.random() < noncontig:
            trick = rng.integers(3)
            if 0 in shape:
                base = self.values((2,) + shape, dtype, **kw)
                return arr(base, dtype, view=str(int(rng.choice([1, -1]))))
            if trick == 0 and len(shape) >= 2:
                perm = list(rng.permutation(len(shape)))
                inv = list(np.argsort(perm))
                base = self.values(tuple(shape[i] for i in inv), dtype, **kw)
                return arr(base, dtype, perm=[int(i) for i in perm])
            if trick == 1:
                base = self.values((2 * shape[0],) + shape[1:], dtype, **kw)
                return arr(base, dtype, view="::-2" if rng.random() < 0.5 else "1::2")
            base = self.values(shape[:-1] + (shape[-1] + 2,), dtype, **kw)
            return arr(base, dtype, view="..., 1:-1")
        return arr(self.values(shape, dtype, **kw), dtype)


def broadcast_pair(f, max_nd=3):
    """Two shapes that broadcast (numpy rules), sometimes with 0-d or zero-size dims."""
    rng = f.rng
    out = f.shape(max_nd=max_nd, zero=0.08)
    a, b = [], []
    for n in out:
        r = rng.random()
        if r < 0.2:
            a.append(1), b.append(n)
        elif r < 0.4:
            a.append(n), b.append(1)
        else:
            a.append(n), b.append(n)
    a = a[int(rng.integers(0, len(a) + 1)) :] if rng.random() < 0.3 else a
    b = b[int(rng.integers(0, len(b) + 1)) :] if rng.random() < 0.3 else b
    return tuple(a), tuple(b)


# --------------------------------------------------------------------------------------
# Families


def gen_binary():
    f = Family("binary", 1)
    ops = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
    for op in ops:
        for d in NUMERIC:
            # Float `pow` gradients need a positive base, `div` a divisor away from 0.
            ka = {"lo": 0.2, "hi": 2.5} if op == "pow" and d in FLOATS else {}
            kb = {"lo": 0.5, "hi": 3.0} if op == "div" and d in FLOATS else {}
            for k in range(6):
                sa, sb = broadcast_pair(f)
                a = f.input(sa, d, **ka)
                b = f.input(sb, d, **kb)
                if op == "pow" and d in INTS:
                    b.base = (b.base.astype(np.int64) % 4).astype(NP[d])  # small exponents
                if op == "div" and d in FLOATS and k % 2:
                    b.base = np.negative(b.base)
                if op in ("maximum", "minimum") and d in FLOATS:
                    b.base = b.base + 0.005  # no ties (a tie's gradient goes to x, see above)
                f.add(op, [a, b])
            # Special values: NaN/inf/0 for floats, extremes (wrapping) for integers.
            for k in range(2):
                s = (int(f.rng.integers(1, 6)),)
                f.add(op, [f.input(s, d, special=True), f.input(s, d, special=True)], grad=False)
            # A scalar right-hand side (int and float scalars), and scalar-left forms.
            for sc in [2, -1, 0.5, 2.75] if d in FLOATS else [3, -2, 2.7, -1.5]:
                kx = {"lo": 0.2, "hi": 2.5} if op in ("pow", "div") and d in FLOATS else {}
                f.add(op, [f.input(f.shape(max_nd=2, zero=0.1), d, **kx)], {"scalar": sc})
                if op in ("add", "sub", "mul", "div"):
                    kx = {"lo": 0.5, "hi": 3.0} if op == "div" and d in FLOATS else {}
                    x = f.input(f.shape(max_nd=2, zero=0.1), d, **kx)
                    f.add(op, [x], {"scalar": sc, "scalar_left": True})
    # Integer scalars that do not fit the dtype wrap; float scalars truncate/saturate.
    for d in INTS:
        f.add("add", [arr([0, 1, 2, 250], d)], {"scalar": 300})
        f.add("mul", [arr([1, 2, 3], d)], {"scalar": -2.9})
        f.add("add", [arr([1, 2, 3], d)], {"scalar": 1e20})
    f.add("div", [arr([7, -7, 7, -7, 5, -(2**31)], "i32"), arr([2, 2, -2, -2, 0, -1], "i32")])
    f.add("div", [arr([7, -7, 0, -(2**63)], "i64"), arr([-3, 3, 0, -1], "i64")])
    f.add("pow", [arr([2, -2, 3, 10, 1, -1, -1, 0, 5], "i32"), arr([31, 31, 21, 10, -5, -3, -4, -1, -1], "i32")])
    f.add("pow", [arr([2, 3, 7], "i64"), arr([63, 40, 3], "i64")])
    f.add("pow", [arr([2, 3, 255], "u8"), arr([8, 5, 2], "u8")])
    f.add("pow", [arr([-8.0, -2.0, 0.0, 0.0, np.nan, 1.0, -1.5], "f64"), arr([1 / 3, 3.0, -1.0, 0.0, 0.0, np.nan, 2.0], "f64")])
    # Errors: Bool arithmetic, mixed dtypes, shapes that do not broadcast.
    for op in ops:
        f.error(op, [arr([True, False], "bool"), arr([True, True], "bool")], {}, "UnsupportedDType")
    f.error("add", [arr([1.0, 2.0], "f32"), arr([1.0, 2.0], "f64")], {}, "DTypeMismatch")
    f.error("mul", [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((4,)), "f64")], {}, "ShapeMismatch")
    f.error("maximum", [arr(np.zeros((2, 0)), "i32"), arr(np.zeros((3,)), "i32")], {}, "ShapeMismatch")
    return f


def gen_compare():
    f = Family("compare", 2)
    for op in ["eq", "ne", "gt", "ge", "lt", "le"]:
        for d in ALL:
            for k in range(3):
                sa, sb = broadcast_pair(f)
                a = f.input(sa, d, lo=-2, hi=2)
                b = f.input(sb, d, lo=-2, hi=2)
                if d in FLOATS:  # round to halves so that ties happen
                    a.base = np.round(a.base * 2) / 2
                    b.base = np.round(b.base * 2) / 2
                elif d != "bool":
                    a.base = (a.base % 4).astype(NP[d])
                    b.base = (b.base % 4).astype(NP[d])
                f.add(op, [a, b])
            s = (5,)
            f.add(op, [f.input(s, d, special=True), f.input(s, d, special=True)])
            for sc in [0, 1, -3, 0.5, 1.5, -0.5, 2, 300, 0.1]:
                if d == "bool" and sc in (2, 300):
                    continue
                vals = {
                    "bool": [False, True],
                    "u8": [0, 1, 2, 255],
                    "i32": [-4, -3, 0, 1, 2, 3],
                    "i64": [-4, -3, 0, 1, 2, 3, 2**62],
                    "f32": [-3.0, -0.5, 0.0, 0.1, 0.5, 1.0, 1.5, np.nan],
                    "f64": [-3.0, -0.5, 0.0, 0.1, 0.5, 1.0, 1.5, np.nan],
                }[d]
                f.add(op, [arr(vals, d)], {"scalar": sc})
    f.error("lt", [arr([1, 2], "i32"), arr([1, 2], "i64")], {}, "DTypeMismatch")
    f.error("eq", [arr(np.zeros((2, 3)), "f32"), arr(np.zeros((2,)), "f32")], {}, "ShapeMismatch")
    return f


def gen_unary():
    f = Family("unary", 3)
    domain = {
        "log": (0.1, 4.0),
        "sqrt": (0.1, 4.0),
    }
    for op in ["exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "abs", "neg", "square", "relu"]:
        for d in ALL:
            if d == "bool" or (d in INTS and op not in ("abs", "neg", "square", "relu")):
                f.error(op, [arr([1, 0, 1], d)], {}, "UnsupportedDType")
                continue
            lo, hi = domain.get(op, (-3.0, 3.0))
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.1)
                x = f.input(shp, d, lo=lo, hi=hi)
                if op in ("abs", "relu") and d in FLOATS:
                    x.base = np.where(x.base == 0, 0.5, x.base).astype(NP[d])  # away from the kink
                f.add(op, [x])
            f.add(op, [f.input((7,), d, special=True)], grad=False)
        # Kinks: the gradient at 0 is 0 (PyTorch's convention, ndscope's rule).
        if op in ("abs", "relu"):
            f.add(op, [arr([0.0, -1.5, 2.0], "f64")], fd_check=False)
    f.add("exp", [arr([-1000.0, 700.0, 80.0, -80.0], "f32")], grad=False)
    f.add("sigmoid", [arr([-800.0, 800.0, -30.0, 30.0], "f64")])
    f.add("sigmoid", [arr([-100.0, 100.0, -20.0, 20.0], "f32")], grad=False)
    f.add("log", [arr([0.0, -1.0, 1.0, np.inf], "f64")], grad=False)
    f.add("sqrt", [arr([0.0, -1.0, 4.0, np.inf], "f32")], grad=False)
    f.add("tanh", [arr([-50.0, 50.0, 1e-8], "f64")])
    f.add("abs", [arr([-(2**31), 2**31 - 1, -1, 0], "i32")])
    f.add("neg", [arr([-(2**63), 2**63 - 1, 0], "i64")])
    f.add("neg", [arr([0, 1, 255], "u8")])
    f.add("square", [arr([46341, -46341, 3], "i32")])
    f.add("relu", [arr([np.nan, -np.inf, np.inf, -0.0], "f64")], grad=False)
    return f


def gen_reduce():
    f = Family("reduce", 4)
    for op in ["sum", "mean", "max", "min", "prod"]:
        for d in ALL:
            if d == "bool" and op in ("sum", "mean", "prod"):
                f.error(op, [arr([True, False], d)], {}, "UnsupportedDType")
                continue
            for k in range(10):
                shp = f.shape(max_nd=3, max_dim=4, zero=0.12)
                kw = {"lo": 0.5, "hi": 1.6} if op == "prod" and d in FLOATS else {}
                x = f.input(shp, d, **kw)
                if op == "prod" and d in INTS:
                    x.base = (x.base % 3 + (1 if d == "u8" else -1)).astype(NP[d])
                nd = len(shp)
                params = {}
                if k % 5 != 0 and nd:
                    n_ax = int(f.rng.integers(0, nd + 1))
                    axes = sorted(f.rng.choice(nd, n_ax, replace=False).tolist())
                    axes = [a - nd if f.rng.random() < 0.5 else a for a in axes]
                    params = {"axes": [int(a) for a in axes], "keep_dims": bool(f.rng.random() < 0.5)}
                if op in ("max", "min"):
                    xe = x.effective()
                    axes_n = ax_tuple(params, xe.ndim)
                    count = int(np.prod([xe.shape[a] for a in axes_n]))
                    out_size = int(np.prod([n for i, n in enumerate(xe.shape) if i not in axes_n]))
                    if count == 0 and out_size > 0:
                        f.error(op, [x], params, "InvalidArgument")
                        continue
                f.add(op, [x], params)
            if d != "bool":
                f.add(op, [f.input((2, 3), d, special=True)], {"axes": [-1], "keep_dims": False}, grad=False)
    # Ties share the gradient of max/min (as PyTorch's amax/amin).
    f.add("max", [arr([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], "f64")], {"axes": [1], "keep_dims": True}, fd_check=False)
    f.add("min", [arr([1.0, 1.0, 3.0, 1.0], "f32")], {}, fd_check=False)
    # prod's gradient with one and with two zeros in a group.
    f.add("prod", [arr([[0.0, 2.0, 3.0], [0.0, 0.0, 4.0], [1.5, 2.0, -1.0]], "f64")], {"axes": [-1], "keep_dims": False})
    f.add("prod", [arr([0.0, 2.0, 3.0, 0.5], "f32")], {})
    # Integer sums and products wrap in the dtype; integer mean gives f64.
    f.add("sum", [arr([200, 100, 7], "u8")], {})
    f.add("sum", [arr([2**31 - 1, 1, 5], "i32")], {})
    f.add("prod", [arr([2**20, 2**20, 3], "i64")], {})
    f.add("prod", [arr([2**16, 2**16, 3], "i32")], {})
    f.add("mean", [arr([[1, 2], [4, 8]], "i32")], {"axes": [0], "keep_dims": False})
    f.add("mean", [arr(np.zeros((0, 3)), "f64")], {"axes": [0], "keep_dims": False})
    f.add("sum", [arr(np.zeros((0, 3)), "i64")], {"axes": [-2], "keep_dims": True})
    f.add("prod", [arr(np.zeros((2, 0)), "f32")], {"axes": [1], "keep_dims": False})
    # An empty reduction with an empty result is fine (numpy raises); a non-empty one errs.
    f.add("max", [arr(np.zeros((0, 0)), "f64")], {"axes": [0], "keep_dims": False})
    f.error("min", [arr(np.zeros((0,)), "f64")], {}, "InvalidArgument")
    f.error("sum", [arr(np.zeros((2, 3)), "f64")], {"axes": [2], "keep_dims": False}, "AxisOutOfRange")
    f.error("sum", [arr(np.zeros((2, 3)), "f64")], {"axes": [1, -1], "keep_dims": False}, "InvalidArgument")
    # argmax/argmin: flattened and along an axis (negative too), NaN wins, first tie.
    for op in ["argmax", "argmin"]:
        for d in ALL:
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.0)
                shp = shp if shp else (3,)
                x = f.input(shp, d, lo=-2, hi=2)
                if d in FLOATS:
                    x.base = np.round(x.base).astype(NP[d])  # ties
                params = {}
                if k % 3:
                    nd = len(shp)
                    ax = int(f.rng.integers(-nd, nd))
                    params = {"axis": ax, "keep_dims": bool(k % 2)}
                f.add(op, [x], params)
        f.add(op, [arr([1.0, np.nan, 5.0, np.nan, -1.0], "f64")], {})
        f.add(op, [arr([[1.0, 2.0], [np.nan, 0.0]], "f32")], {"axis": 1, "keep_dims": False})
        f.add(op, [arr(np.zeros((0, 3)), "f64")], {"axis": 1, "keep_dims": True})
        f.error(op, [arr(np.zeros((0, 3)), "i32")], {"axis": 0, "keep_dims": False}, "InvalidArgument")
        f.error(op, [arr(np.zeros((0,)), "f64")], {}, "InvalidArgument")
    # Longer rows: the 8-lane contiguous kernels (and their remainders), and a long
    # strided reduction (axis 0 of a row-major matrix).
    for op in ["sum", "mean", "max", "min", "prod", "argmax", "argmin"]:
        for d in ["f32", "f64", "i32"]:
            lo, hi = (0.9, 1.1) if op == "prod" else (0.0, 1.0)  # no cancellation in f32
            x = f.input((37,), d, noncontig=0.0, lo=lo, hi=hi)
            if op == "prod" and d == "i32":
                x.base = x.base % 3 + 1  # wraps
            f.add(op, [x], {} if op.startswith("arg") else {"axes": [0], "keep_dims": False})
            x = f.input((5, 23), d, noncontig=0.5, lo=lo, hi=hi)
            if op == "prod" and d == "i32":
                x.base = x.base % 2 + 1
            ax = {"axis": 0, "keep_dims": True} if op.startswith("arg") else {"axes": [0], "keep_dims": True}
            f.add(op, [x], ax)
            f.add(op, [x], {"axis": -1, "keep_dims": False} if op.startswith("arg") else {})
    return f


def gen_matmul():
    f = Family("matmul", 5)
    for op in ["matmul", "dot"]:
        for d in NUMERIC:
            for k in range(10):
                rng = f.rng
                m, kk, n = (int(v) for v in rng.integers(0, 5, 3))
                kind = k % 5
                if kind == 0:
                    sa, sb = (kk,), (kk,)
                elif kind == 1:
                    sa, sb = (m, kk), (kk,)
                elif kind == 2:
                    sa, sb = (kk,), (kk, n)
                elif kind == 3:
                    sa, sb = (m, kk), (kk, n)
                else:
                    b1, b2 = int(rng.integers(1, 4)), int(rng.integers(1, 3))
                    pa = [(b1,), (b2, b1), (1,), (), (b2, 1)][int(rng.integers(5))]
                    pb = [(b1,), (1, b1), (), (b2, 1), (1,)][int(rng.integers(5))]
                    sa, sb = pa + (m, kk), pb + (kk, n)
                    try:
                        np.broadcast_shapes(pa, pb)
                    except ValueError:
                        sb = (kk, n)
                f.add(op, [f.input(sa, d), f.input(sb, d)])
        f.error(op, [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((4, 2)), "f64")], {}, "ShapeMismatch")
        f.error(op, [arr([[True]], "bool"), arr([[True]], "bool")], {}, "UnsupportedDType")
    f.error("matmul", [arr(np.zeros((2, 2, 3)), "f32"), arr(np.zeros((3, 3, 2)), "f32")], {}, "ShapeMismatch")
    f.error("matmul", [arr(2.0, "f64"), arr([1.0, 2.0], "f64")], {}, "InvalidArgument")
    f.add("dot", [arr(2.5, "f64"), arr([[1.0, 2.0], [3.0, 4.0]], "f64")])
    f.add("dot", [arr([1.5, -2.0], "f32"), arr(-3.0, "f32")])
    f.add("matmul", [arr([[100, 100], [3, 4]], "u8"), arr([[2, 1], [3, 0]], "u8")])
    f.add("matmul", [arr([[2**30, 2**30]], "i32"), arr([[2], [2]], "i32")])
    return f


def gen_shape():
    f = Family("shape", 6)
    rng = f.rng
    for d in ALL:
        for k in range(4):
            shp = f.shape(max_nd=3, zero=0.1)
            size = int(np.prod(shp))
            x = f.input(shp, d)
            # reshape to a random factorisation of the size
            if size == 0:
                new = [0, int(rng.integers(1, 4))]
            else:
                new, rest = [], size
                for p in (2, 3, 5, 7):
                    while rest % p == 0 and rng.random() < 0.7:
                        new.append(p)
                        rest //= p
                new = [rest] + new
                rng.shuffle(new)
            f.add("reshape", [x], {"shape": [int(v) for v in new]})
            if size:
                dims = [int(v) for v in new]
                dims[int(rng.integers(len(dims)))] = -1
                f.add("reshape_infer", [f.input(shp, d)], {"dims": dims})
            f.add("flatten", [f.input(shp, d)])
            f.add("transpose", [f.input(shp, d)])
            perm = [int(v) for v in rng.permutation(len(shp))]
            f.add("permute", [f.input(shp, d)], {"perm": perm})
            # squeeze: insert size-1 axes
            s1 = list(shp)
            for _ in range(int(rng.integers(1, 3))):
                s1.insert(int(rng.integers(0, len(s1) + 1)), 1)
            f.add("squeeze", [f.input(s1, d)])
            ones = [i for i, n in enumerate(s1) if n == 1]
            ax = ones[int(rng.integers(len(ones)))]
            f.add("squeeze", [f.input(s1, d)], {"axis": ax - len(s1) if k % 2 else ax})
            ax = int(rng.integers(-len(shp) - 1, len(shp) + 1))
            f.add("expand_dims", [f.input(shp, d)], {"axis": ax})
            # broadcast_to: some axes of size 1 grow, and new leading axes appear
            src = [1 if rng.random() < 0.4 else n for n in shp]
            lead = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))]
            target = lead + [int(rng.integers(1, 4)) if n == 1 else n for n in src]
            f.add("broadcast_to", [f.input(src, d)], {"shape": target})
            # concat / stack of 1..3 arrays
            if shp:
                nd = len(shp)
                ax = int(rng.integers(-nd, nd))
                parts = []
                for _ in range(int(rng.integers(1, 4))):
                    s = list(shp)
                    s[ax] = int(rng.integers(0, 4))
                    parts.append(f.input(s, d))
                f.add("concat", parts, {"axis": ax})
            ax = int(rng.integers(-len(shp) - 1, len(shp) + 1))
            f.add("stack", [f.input(shp, d) for _ in range(int(rng.integers(1, 4)))], {"axis": ax})
    f.error("reshape", [arr(np.zeros((2, 3)), "f64")], {"shape": [4]}, "InvalidShape")
    f.error("reshape_infer", [arr(np.zeros((2, 3)), "f64")], {"dims": [-1, 4]}, "InvalidShape")
    f.error("squeeze", [arr(np.zeros((2, 3)), "f64")], {"axis": 1}, "InvalidShape")
    f.error("expand_dims", [arr(np.zeros((2, 3)), "f64")], {"axis": 3}, "AxisOutOfRange")
    f.error("broadcast_to", [arr(np.zeros((2, 3)), "f64")], {"shape": [3, 3]}, "InvalidShape")
    f.error("permute", [arr(np.zeros((2, 3)), "f64")], {"perm": [0, 0]}, "InvalidArgument")
    f.error("concat", [arr(1.0, "f64"), arr(2.0, "f64")], {"axis": 0}, "InvalidShape")
    f.error("concat", [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((2, 2)), "f64")], {"axis": 0}, "InvalidShape")
    f.error("concat", [arr(np.zeros((2,)), "f64"), arr(np.zeros((2,)), "f32")], {"axis": 0}, "DTypeMismatch")
    f.error("stack", [arr(np.zeros((2,)), "i32"), arr(np.zeros((3,)), "i32")], {"axis": 0}, "InvalidShape")
    f.error("stack", [arr(np.zeros((2,)), "i32")], {"axis": 2}, "AxisOutOfRange")
    return f


def random_index(rng, shape):
    """A random index string for `shape` in ndscope's grammar (numpy basic indexing)."""
    nd = len(shape)
    items = []
    n_items = int(rng.integers(1, nd + 1)) if nd else 0
    for axis in range(n_items):
        n = shape[axis]
        r = rng.random()
        if r < 0.25 and n > 0:
            i = int(rng.integers(-n, n))
            items.append(str(i))
        else:
            def bound():
                if rng.random() < 0.35:
                    return ""
                return str(int(rng.integers(-n - 2, n + 3)))

            step = ["", "", "1", "2", "-1", "-1", "-2", "3", "-3"][int(rng.integers(9))]
            s = f"{bound()}:{bound()}"
            if step or rng.random() < 0.2:
                s += f":{step}"
            items.append(s)
    if nd and rng.random() < 0.25:
        pos = int(rng.integers(0, len(items) + 1))
        items.insert(pos, "...")
        # `...` covers the axes not named: drop items so that they still fit.
    sep = ", " if rng.random() < 0.5 else ","
    return sep.join(items)


def gen_index():
    f = Family("index", 7)
    rng = f.rng
    for d in ALL:
        for k in range(40):
            shp = f.shape(max_nd=3, max_dim=5, zero=0.06) or (int(rng.integers(1, 6)),)
            index = random_index(rng, shp)
            x = f.input(shp, d, noncontig=0.2)
            try:
                x.effective()[np_index(index)]
            except IndexError:  # an integer out of range after `...` moved it
                f.error("get", [x], {"index": index}, "Index")
                continue
            f.add("get", [x], {"index": index})
    # Fixed strings with negative steps, clamping and the ellipsis.
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 4
    for index in ["", "...", "1", "-1, ::-1", "..., ::-2", ":, 2:0:-1, -1", "::-1, ::-1, ::-1",
                  "0, 10:-10:-1", "-2:100, 1, 3::-3", "1:1", "..., 1:3, 0", "1,", " 0 , : , 1 "]:
        f.add("get", [arr(base, "f64")], {"index": index})
        f.add("get", [arr(base, "i64")], {"index": index})
    f.add("get", [arr(2.5, "f32")], {"index": ""})
    f.add("get", [arr(2.5, "f32")], {"index": "..."})
    # get of a get: a view of a reversed view (the input is a view with a negative stride)
    f.add("get", [arr(base, "f32", view="::-1, 1:")], {"index": "..., ::-1"})
    for bad in ["2", "0, 3", "0, 0, 0, 0", "::0", "a", "..., ...", "1,,2"]:
        f.error("get", [arr(base, "f64")], {"index": bad}, "Index")
    return f


def gen_nn():
    f = Family("nn", 8)
    rng = f.rng
    for op in ["softmax", "log_softmax"]:
        for d in FLOATS:
            for k in range(8):
                shp = f.shape(max_nd=3, zero=0.08)
                shp = shp if shp else (int(rng.integers(1, 5)),)
                nd = len(shp)
                f.add(op, [f.input(shp, d)], {"axis": int(rng.integers(-nd, nd))})
            f.add(op, [arr([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], d)], {"axis": -1})
            f.add(op, [arr([0.5, np.inf, 1.0], d)], {"axis": 0}, grad=False)
        for d in INTS + ["bool"]:
            f.error(op, [arr([1, 2], d)], {"axis": 0}, "UnsupportedDType")
        f.error(op, [arr([1.0, 2.0], "f64")], {"axis": 1}, "AxisOutOfRange")
    for d in NUMERIC:
        for k in range(8):
            shp = f.shape(max_nd=3, zero=0.08)
            x = f.input(shp, d, lo=-3, hi=3)
            lo = float(np.round(rng.uniform(-2, 0.5), 1))
            hi = float(np.round(lo + rng.uniform(0, 2.5), 1))
            if d in FLOATS:
                x.base = np.where(np.isin(np.round(x.base.astype(np.float64), 2), [lo, hi]), 2.9, x.base).astype(NP[d])
            elif math.ceil(lo) > math.floor(hi):  # no integer in [lo, hi]
                f.error("clip", [x], {"min": lo, "max": hi}, "InvalidArgument")
                continue
            f.add("clip", [x], {"min": lo, "max": hi})
        f.add("clip", [f.input((6,), d, special=True)], {"min": -1.5, "max": 2.5}, grad=False)
    # Bounds are inclusive for the gradient (PyTorch's clamp: 1 at min and at max).
    f.add("clip", [arr([-1.0, 0.5, 2.0, 3.0, -2.0], "f64")], {"min": -1.0, "max": 2.0}, fd_check=False)
    f.add("clip", [arr([0, 1, 2, 3, 4, 5], "i32")], {"min": 0.5, "max": 3.5})
    f.add("clip", [arr([-5, 0, 200, 255], "u8")], {"min": -10.0, "max": 300.0})
    f.add("clip", [arr([1.0, 2.0], "f64")], {"min": 1.5, "max": 1.5})
    f.error("clip", [arr([1.0, 2.0], "f64")], {"min": 2.0, "max": 1.0}, "InvalidArgument")
    f.error("clip", [arr([1, 2], "i64")], {"min": 1.2, "max": 1.8}, "InvalidArgument")
    f.error("clip", [arr([True], "bool")], {"min": 0.0, "max": 1.0}, "UnsupportedDType")
    for d in ALL:
        for k in range(6):
            sc, sx = broadcast_pair(f)
            sy = sx[int(rng.integers(0, len(sx) + 1)) :] if rng.random() < 0.5 else sx
            f.add("where", [f.input(sc, "bool"), f.input(sx, d), f.input(sy, d)])
    f.error("where", [arr([1, 0], "i32"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f64")], {}, "UnsupportedDType")
    f.error("where", [arr([True, False], "bool"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f32")], {}, "DTypeMismatch")
    f.error("where", [arr([True, False, True], "bool"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f64")], {}, "ShapeMismatch")
    return f


def gen_cast():
    f = Family("cast", 9)
    samples = {
        "f64": [0.0, -0.0, 1.5, -2.75, 3.9999, 100.25, 1e-3, 254.9],
        "f32": [0.0, -0.0, 1.5, -2.75, 3.9999, 100.25, 1e-3, 254.9],
        "i32": [0, 1, -1, 127, 255, 256, -129, 2**31 - 1, -(2**31), 16777217],
        "i64": [0, 1, -1, 255, 256, 2**31, -(2**31) - 1, 2**53, -(2**40) + 3, 33554433],
        "u8": [0, 1, 127, 128, 255],
        "bool": [True, False, True],
    }
    for src in ALL:
        for dst in ALL:
            vals = list(samples[src])
            if src in FLOATS and dst == "u8":
                vals = [abs(v) for v in vals]
            f.add("to_dtype", [arr(vals, src)], {"dtype": dst})
            shp = f.shape(max_nd=3, zero=0.1)
            x = f.input(shp, src, lo=0.0 if dst == "u8" else -100.0, hi=100.0)
            f.add("to_dtype", [x], {"dtype": dst})
        if src in FLOATS:
            sp = [np.nan, np.inf, -np.inf, 1e300 if src == "f64" else 3e38, -1e-320 if src == "f64" else -1e-40, 0.0]
            for dst in FLOATS + ["bool"]:
                f.add("to_dtype", [arr(sp, src)], {"dtype": dst}, grad=False)
    f.add("to_dtype", [arr([1 / 3, 1e-50, 3.4028235677973366e38, 1 + 2**-24, 1 + 3 * 2**-24], "f64")], {"dtype": "f32"})
    return f


FAMILIES = [gen_binary, gen_compare, gen_unary, gen_reduce, gen_matmul, gen_shape, gen_index, gen_nn, gen_cast]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    only = set(sys.argv[1:])
    total_cases, total_bytes = 0, 0
    for gen in FAMILIES:
        fam = gen()
        if only and fam.name not in only:
            continue
        path = os.path.join(OUT_DIR, f"{fam.name}.json")
        ids = [c["id"] for c in fam.cases]
        assert len(ids) == len(set(ids)), "duplicate case ids"
        lines = [json.dumps(c, separators=(",", ":"), allow_nan=False) for c in fam.cases]
        text = '{"family":' + json.dumps(fam.name) + ',"cases":[\n' + ",\n".join(lines) + "\n]}\n"
        with open(path, "w") as fh:
            fh.write(text)
        total_cases += len(fam.cases)
        total_bytes += len(text)
        n_grad = sum(1 for c in fam.cases if c["grad"])
        print(f"{fam.name:8} {len(fam.cases):5} cases ({n_grad} with gradients) {len(text) / 1024:7.1f} KiB")
    print(f"total    {total_cases:5} cases {total_bytes / 1024:7.1f} KiB")


if __name__ == "__main__":
    main()

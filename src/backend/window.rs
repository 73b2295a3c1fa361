//! The geometry of a 2-D sliding window over NCHW data, shared by the convolution
//! and pooling kernels of every backend: sizes, strides, padding and dilation
//! ([`Geom`]), which output positions a kernel tap reaches ([`span`]), and the element
//! strides of an NCHW layout.

use crate::layout::Layout;

/// The geometry of a 2-D sliding window over `[N, C, H, W]` (pools also accept
/// `[C, H, W]`, seen as `N = 1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Geom {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) ph: usize,
    pub(crate) pw: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

impl Geom {
    /// Output positions per plane.
    pub(crate) fn l(&self) -> usize {
        self.oh * self.ow
    }

    /// The valid output columns `ox` for kernel column `kj`: those whose input column
    /// `ox*sw + kj*dw - pw` lies in `0..w`.
    pub(crate) fn cols(&self, kj: usize) -> (usize, usize) {
        span(self.ow, self.sw, kj * self.dw, self.pw, self.w)
    }

    /// The valid output rows `oy` for kernel row `ki`.
    pub(crate) fn rows(&self, ki: usize) -> (usize, usize) {
        span(self.oh, self.sh, ki * self.dh, self.ph, self.h)
    }
}

/// `lo..hi`: the `o < out` with `0 <= o*s + k - p < len`.
pub(crate) fn span(out: usize, s: usize, k: usize, p: usize, len: usize) -> (usize, usize) {
    let lo = if p > k { (p - k).div_ceil(s) } else { 0 };
    let hi = if len + p > k {
        ((len + p - k - 1) / s + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// Element strides `[n, c, h, w]` and offset of a 4-D (or 3-D, `n` stride 0) layout.
pub(crate) fn nchw_strides(l: &Layout) -> ([isize; 4], isize) {
    let s = &l.strides;
    let st = if s.len() == 4 {
        [s[0], s[1], s[2], s[3]]
    } else {
        [0, s[0], s[1], s[2]]
    };
    (st, l.offset as isize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_match_a_brute_force_scan() {
        for (out, s, k, p, len) in [
            (4, 1, 0, 1, 4),
            (3, 2, 2, 1, 5),
            (2, 3, 4, 2, 3),
            (5, 1, 9, 0, 3),
        ] {
            let ok: Vec<usize> = (0..out)
                .filter(|&o| {
                    let i = (o * s + k) as isize - p as isize;
                    i >= 0 && i < len as isize
                })
                .collect();
            let (lo, hi) = span(out, s, k, p, len);
            assert_eq!((lo..hi).collect::<Vec<_>>(), ok, "{out} {s} {k} {p} {len}");
        }
    }
}

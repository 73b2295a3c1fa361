//! Checked reading of files from strangers: every length a file states (a header's
//! size, a shape, a zip member's size) is a claim, checked against the bytes the file
//! can actually give before any memory is reserved for it.
//!
//! A [`Source`] is a reader that knows the most bytes it can still give: the rest of
//! a file, or a zip member's declared size. A claim larger than that is a `Format`
//! error naming the claim and what the source holds. Memory is then reserved
//! either at once, when the bytes are known to be present (a file's length, a stored
//! member inside the archive), or as the data arrives, when the bound is itself only
//! a claim (a compressed member's declared size): reading never reserves more than
//! what arrived plus [`CHUNK`], doubling, so a forged size costs at most twice the
//! bytes actually there.

use std::io::Read;

/// Arrays with more dimensions than this are refused when read from a file (numpy's
/// own limit, `NPY_MAXDIMS`, is 64).
pub(crate) const MAX_NDIM: usize = 64;

/// The first step of reading data whose size is not known to be present.
pub(crate) const CHUNK: usize = 64 << 10;

/// Why reading from a [`Source`] failed.
#[derive(Debug)]
pub(crate) enum ReadErr {
    /// Not a valid file (the message says why).
    Format(String),
    /// The reader failed for another reason than reaching the end early.
    Io(std::io::Error),
    /// The data is present but does not fit in memory.
    OutOfMemory(usize),
}

impl From<String> for ReadErr {
    fn from(m: String) -> Self {
        ReadErr::Format(m)
    }
}

/// A reader and the most bytes it can still give.
pub(crate) struct Source<'a> {
    r: &'a mut dyn Read,
    /// Bytes the source can still give at most (`u64::MAX`: no bound is known).
    left: u64,
    /// Whether the `left` bytes are known to be present (stored in the file), so
    /// reserving up to `left` at once is bounded by the file's size.
    present: bool,
    /// How messages name the source ("the file", "the member").
    name: &'static str,
}

impl<'a> Source<'a> {
    /// A source of at most `left` bytes; `present`: they are in the file (see the
    /// field).
    pub(crate) fn new(r: &'a mut dyn Read, left: u64, present: bool, name: &'static str) -> Self {
        Source {
            r,
            left,
            present,
            name,
        }
    }

    /// A source whose size is unknown (memory is reserved as data arrives).
    #[cfg(test)]
    pub(crate) fn unbounded(r: &'a mut dyn Read) -> Self {
        Source::new(r, u64::MAX, false, "the stream")
    }

    /// Check a claim of `n` more bytes against what the source can give: a `Format`
    /// error "`claim` but the file holds N bytes`suffix`" if it cannot (never for a
    /// source of unknown size).
    pub(crate) fn check_claim(
        &self,
        n: u64,
        claim: impl FnOnce() -> String,
        suffix: &str,
    ) -> Result<(), ReadErr> {
        if n > self.left {
            return Err(ReadErr::Format(format!(
                "{} but {} holds {} bytes{suffix}",
                claim(),
                self.name,
                self.left
            )));
        }
        Ok(())
    }

    /// Exactly `n` bytes, claimed by the file as `claim` (checked first, see
    /// [`Source::check_claim`]). Reaching the end early is a `Format` error.
    pub(crate) fn read_vec(
        &mut self,
        n: usize,
        claim: impl Fn() -> String,
        suffix: &str,
    ) -> Result<Vec<u8>, ReadErr> {
        self.check_claim(n as u64, &claim, suffix)?;
        let mut v = Vec::new();
        if self.present {
            reserve(&mut v, n)?;
        }
        while v.len() < n {
            let step = if self.present {
                n - v.len()
            } else {
                (n - v.len()).min(v.len().max(CHUNK))
            };
            reserve(&mut v, step)?;
            let start = v.len();
            v.resize(start + step, 0);
            let got = read_full(self.r, &mut v[start..]).map_err(read_err)?;
            v.truncate(start + got);
            self.left = self.left.saturating_sub(got as u64);
            if got < step {
                return Err(ReadErr::Format(format!(
                    "truncated: {} but {} ended after {} bytes{suffix}",
                    claim(),
                    self.name,
                    v.len()
                )));
            }
        }
        Ok(v)
    }

    /// Fill `buf`; reaching the end early is a `Format` error "truncated `what`".
    pub(crate) fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<(), ReadErr> {
        if buf.len() as u64 > self.left {
            return Err(ReadErr::Format(format!("truncated {what}")));
        }
        let got = read_full(self.r, buf).map_err(read_err)?;
        self.left = self.left.saturating_sub(got as u64);
        if got < buf.len() {
            return Err(ReadErr::Format(format!("truncated {what}")));
        }
        Ok(())
    }

    /// Whether the source has no byte left (reads at most one).
    pub(crate) fn at_end(&mut self) -> Result<bool, ReadErr> {
        let mut probe = [0u8; 1];
        Ok(read_full(self.r, &mut probe).map_err(read_err)? == 0)
    }
}

/// Reserve room for `n` more bytes, or `OutOfMemory` (never an allocation abort).
fn reserve(v: &mut Vec<u8>, n: usize) -> Result<(), ReadErr> {
    v.try_reserve_exact(n)
        .map_err(|_| ReadErr::OutOfMemory(v.len().saturating_add(n)))
}

/// Read until `buf` is full or the reader ends; the number of bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A reader's error: data a decompressor or checksum rejects is `Format`.
fn read_err(e: std::io::Error) -> ReadErr {
    match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
            ReadErr::Format(format!("corrupt data: {e}"))
        }
        _ => ReadErr::Io(e),
    }
}

/// The element count and byte size of `shape` for elements of `elem` bytes, or a
/// `Format` message naming the claim when either overflows the address space or
/// the shape has more than [`MAX_NDIM`] dimensions.
pub(crate) fn claimed_size(
    shape: &[usize],
    elem: usize,
    dtype: impl std::fmt::Display,
) -> Result<(usize, usize), String> {
    if shape.len() > MAX_NDIM {
        return Err(format!(
            "header claims {} dimensions (at most {MAX_NDIM} are supported)",
            shape.len()
        ));
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("header claims shape {shape:?}, whose element count overflows"))?;
    let b = n
        .checked_mul(elem)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            format!(
                "header claims shape {shape:?} of {dtype}, {n} elements whose byte size \
                 overflows the address space"
            )
        })?;
    Ok((n, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_beyond_the_source_is_refused_before_reading() {
        let data = [1u8; 16];
        let mut r = &data[..];
        let mut s = Source::new(&mut r, 16, true, "the file");
        let e = s
            .read_vec(1 << 40, || "header claims 2^40 bytes".into(), " of data")
            .unwrap_err();
        let ReadErr::Format(m) = e else { panic!() };
        assert_eq!(
            m,
            "header claims 2^40 bytes but the file holds 16 bytes of data"
        );
        assert_eq!(s.read_vec(16, String::new, "").unwrap(), data);
        assert!(s.at_end().unwrap());
    }

    #[test]
    fn an_unbounded_source_reads_in_chunks_and_reports_the_truncation() {
        let data = vec![7u8; 3 * CHUNK + 5];
        let mut r = &data[..];
        let mut s = Source::unbounded(&mut r);
        let e = s
            .read_vec(1 << 40, || "header claims 2^40 bytes".into(), "")
            .unwrap_err();
        let ReadErr::Format(m) = e else { panic!() };
        assert!(
            m.contains(&format!("ended after {} bytes", data.len())),
            "{m}"
        );
        let mut r = &data[..];
        let mut s = Source::unbounded(&mut r);
        assert_eq!(s.read_vec(data.len(), String::new, "").unwrap(), data);
    }

    #[test]
    fn claimed_sizes() {
        assert_eq!(claimed_size(&[2, 3], 4, "f32"), Ok((6, 24)));
        assert_eq!(claimed_size(&[], 8, "f64"), Ok((1, 8)));
        assert!(
            claimed_size(&[usize::MAX, 2], 1, "u8")
                .unwrap_err()
                .contains("element count overflows")
        );
        assert!(
            claimed_size(&[1 << 62], 4, "f32")
                .unwrap_err()
                .contains("byte size")
        );
        assert!(
            claimed_size(&[1; 65], 4, "f32")
                .unwrap_err()
                .contains("65 dimensions")
        );
    }
}

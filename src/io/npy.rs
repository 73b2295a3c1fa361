//! numpy's `.npy` format (one array) and `.npz` (a zip archive of `.npy` files), with
//! our own header code (format versions 1.0, 2.0 and 3.0; see numpy's
//! `numpy.lib.format`).

use super::bounded::{MAX_NDIM, ReadErr, Source, claimed_size};
use super::raw::{
    Raw, byte_vec, check_manager, create, decode, format_error, io_error, open_file, read_raw,
};
use crate::error::{NdError, Result, SourceLocation, unwrap};
use crate::layout::for_each_row;
use crate::shape::Dims;
use crate::{DType, NDArray, NDManager, Shape};
use std::panic::Location;
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy pads the header so the data starts at a multiple of this.
const ALIGN: usize = 64;

/// numpy's type string for `dtype` (little-endian; `|` where byte order does not
/// apply).
fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
    }
}

/// The dtype and byte order (true: big-endian) of a numpy type string.
fn parse_descr(s: &str) -> std::result::Result<(DType, bool), String> {
    let (order, code) = match s.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (s.as_bytes()[0], &s[1..]),
        _ => (b'=', s),
    };
    let dtype = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "b1" | "?" => DType::Bool,
        _ => {
            return Err(format!(
                "numpy dtype '{s}' has no ndscope counterpart (supported: \
                 float32, float64, int32, int64, uint8, bool)"
            ));
        }
    };
    let big = match order {
        b'>' => true,
        b'=' => cfg!(target_endian = "big"),
        _ => false,
    };
    Ok((dtype, big))
}

/// The complete header (magic, version, length, dict, padding) for an array.
pub(crate) fn header(dtype: DType, shape: &[usize]) -> Vec<u8> {
    let shape_str = match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        ds => format!(
            "({})",
            ds.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_str}, }}",
        descr(dtype)
    );
    // Version 1.0 has a u16 header length; 2.0 a u32 one.
    let (version, prefix) = if dict.len() + 1 + 10 <= u16::MAX as usize {
        (1u8, 10)
    } else {
        (2u8, 12)
    };
    let total = (prefix + dict.len() + 1).next_multiple_of(ALIGN);
    let pad = total - prefix - dict.len() - 1;
    dict.extend(std::iter::repeat_n(' ', pad));
    dict.push('\n');
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    debug_assert_eq!(out.len() % ALIGN, 0);
    out
}

/// A parsed header: dtype, byte order, fortran order, shape, and where the data
/// starts.
#[derive(Debug, PartialEq)]
pub(crate) struct Header {
    pub dtype: DType,
    pub big_endian: bool,
    pub fortran: bool,
    pub shape: Vec<usize>,
    pub data_start: usize,
}

/// A value of the header dict (the subset of Python literals numpy writes).
#[derive(Debug, PartialEq)]
enum Lit {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    Other,
}

/// A tiny parser for the header dict: `{'key': value, ...}` where a value is a
/// string, `True`/`False`, or a tuple of integers; anything else (a list of fields
/// of a structured dtype) parses as `Other`.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "malformed header: expected '{}' at byte {}",
                c as char, self.i
            ))
        }
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        self.ws();
        let q = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => {
                return Err(format!(
                    "malformed header: expected a string at byte {}",
                    self.i
                ));
            }
        };
        let start = self.i + 1;
        let end = self.s[start..]
            .iter()
            .position(|&c| c == q)
            .ok_or("malformed header: unterminated string")?;
        self.i = start + end + 1;
        String::from_utf8(self.s[start..start + end].to_vec())
            .map_err(|_| "malformed header: a string is not UTF-8".to_string())
    }

    fn int(&mut self) -> std::result::Result<usize, String> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        let digits = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII digits");
        let v = digits.parse::<usize>().map_err(|_| {
            format!(
                "malformed header: bad dimension at byte {start} (expected a non-negative integer)"
            )
        })?;
        // Python 2 wrote longs as `3L`.
        if self.s.get(self.i) == Some(&b'L') {
            self.i += 1;
        }
        Ok(v)
    }

    fn value(&mut self) -> std::result::Result<Lit, String> {
        self.ws();
        let rest = &self.s[self.i..];
        if rest.starts_with(b"True") {
            self.i += 4;
            return Ok(Lit::Bool(true));
        }
        if rest.starts_with(b"False") {
            self.i += 5;
            return Ok(Lit::Bool(false));
        }
        match rest.first() {
            Some(b'\'' | b'"') => Ok(Lit::Str(self.string()?)),
            Some(b'(') => {
                self.i += 1;
                let mut dims = Vec::new();
                loop {
                    if self.eat(b')') {
                        break;
                    }
                    if dims.len() == MAX_NDIM {
                        return Err(format!(
                            "header claims more than {MAX_NDIM} dimensions (at most \
                             {MAX_NDIM} are supported)"
                        ));
                    }
                    dims.push(self.int()?);
                    if !self.eat(b',') {
                        self.expect(b')')?;
                        break;
                    }
                }
                Ok(Lit::Tuple(dims))
            }
            Some(b'[') => {
                // A structured dtype's field list: skip to the matching bracket.
                let mut depth = 0usize;
                while let Some(&c) = self.s.get(self.i) {
                    self.i += 1;
                    match c {
                        b'[' | b'(' => depth += 1,
                        b']' | b')' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(Lit::Other);
                            }
                        }
                        _ => {}
                    }
                }
                Err("malformed header: unterminated list".into())
            }
            _ => Err(format!(
                "malformed header: unexpected value at byte {}",
                self.i
            )),
        }
    }

    fn dict(&mut self) -> std::result::Result<Vec<(String, Lit)>, String> {
        self.expect(b'{')?;
        let mut items = Vec::new();
        loop {
            if self.eat(b'}') {
                break;
            }
            let k = self.string()?;
            self.expect(b':')?;
            let v = self.value()?;
            items.push((k, v));
            if !self.eat(b',') {
                self.expect(b'}')?;
                break;
            }
        }
        self.ws();
        if self.i != self.s.len() {
            return Err("malformed header: text after the dict".into());
        }
        Ok(items)
    }
}

/// Parse the header at the start of `bytes` (which may hold more than the header).
pub(crate) fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, prefix): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated header".into());
            }
            let l = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            (l as usize, 12)
        }
        _ => return Err(format!("unsupported .npy format version {major}.{minor}")),
    };
    let end = prefix
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| format!("truncated header (it claims {len} bytes)"))?;
    let text = &bytes[prefix..end];
    // Versions 1 and 2 are latin-1; a header that is not ASCII is not numpy's.
    if major < 3 && !text.is_ascii() {
        return Err("malformed header: not ASCII".into());
    }
    let items = Parser { s: text, i: 0 }.dict()?;
    let get = |k: &str| items.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    let (dtype, big_endian) = match get("descr") {
        Some(Lit::Str(s)) => parse_descr(s)?,
        Some(_) => return Err("structured numpy dtypes are not supported".into()),
        None => return Err("malformed header: no 'descr'".into()),
    };
    let fortran = match get("fortran_order") {
        Some(Lit::Bool(b)) => *b,
        _ => return Err("malformed header: no boolean 'fortran_order'".into()),
    };
    let shape = match get("shape") {
        Some(Lit::Tuple(d)) => d.clone(),
        _ => return Err("malformed header: no tuple 'shape'".into()),
    };
    if items.len() != 3 {
        return Err("malformed header: keys other than descr, fortran_order, shape".into());
    }
    Ok(Header {
        dtype,
        big_endian,
        fortran,
        shape,
        data_start: end,
    })
}

/// Headers longer than this are refused (numpy itself refuses more than 10,000
/// bytes unless told otherwise).
const MAX_HEADER: usize = 1 << 20;

/// Read one `.npy` image from `src`: its header and exactly the data bytes the header
/// promises, then check that nothing follows. Every length the file states (the
/// header's, the shape's) is checked against what `src` can give before memory is
/// reserved for it.
pub(crate) fn read_npy(src: &mut Source<'_>) -> std::result::Result<(Header, Vec<u8>), ReadErr> {
    let mut head = [0u8; 12];
    src.fill(&mut head[..10], "header")?;
    if &head[..6] != MAGIC {
        return Err("not a .npy file (no \\x93NUMPY magic)".to_string().into());
    }
    let (len, prefix) = match head[6] {
        1 => (u16::from_le_bytes([head[8], head[9]]) as usize, 10),
        2 | 3 => {
            src.fill(&mut head[10..12], "header")?;
            let l = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
            (usize::try_from(l).unwrap_or(usize::MAX), 12)
        }
        v => return Err(format!("unsupported .npy format version {v}.{}", head[7]).into()),
    };
    if len > MAX_HEADER {
        return Err(format!("header of {len} bytes is too large").into());
    }
    let text = src.read_vec(
        len,
        || format!("truncated header: it claims {len} bytes"),
        " after its length",
    )?;
    let mut whole = Vec::new();
    whole
        .try_reserve_exact(prefix + len)
        .map_err(|_| ReadErr::OutOfMemory(prefix + len))?;
    whole.extend_from_slice(&head[..prefix]);
    whole.extend_from_slice(&text);
    drop(text);
    let h = parse_header(&whole)?;
    let (n, size) = claimed_size(&h.shape, h.dtype.size_in_bytes(), h.dtype)?;
    let data = src.read_vec(
        size,
        || format!("header claims {n} {} elements ({size} bytes)", h.dtype),
        " of data",
    )?;
    if !src.at_end()? {
        return Err(format!("bytes after the data of shape {:?} of {}", h.shape, h.dtype).into());
    }
    Ok((h, data))
}

/// `read_npy`'s error as an `NdError`: a reader failure is `Io` for a file, and a
/// `Format` error inside an archive (`io` false), whose reader is a decompressor.
pub(crate) fn read_error(
    op: &'static str,
    path: &Path,
    prefix: &str,
    e: ReadErr,
    io: bool,
) -> NdError {
    match e {
        ReadErr::Format(m) => format_error(op, path, format!("{prefix}{m}")),
        ReadErr::Io(e) if io => io_error(op, path, e),
        ReadErr::Io(e) => format_error(op, path, format!("{prefix}{e}")),
        ReadErr::OutOfMemory(bytes) => NdError::OutOfMemory {
            bytes,
            device: crate::Device::Cpu,
        },
    }
}

/// Column-major bytes of `shape` reordered to row-major.
fn fortran_to_c(bytes: &[u8], shape: &[usize], elem: usize) -> Result<Vec<u8>> {
    let mut out = byte_vec(bytes.len())?;
    if bytes.is_empty() {
        return Ok(out);
    }
    let mut strides = Vec::with_capacity(shape.len());
    let mut s = 1isize;
    for &d in shape {
        strides.push(s);
        s *= d as isize;
    }
    for_each_row(shape, [&strides], [0], |off, n, st| {
        for i in 0..n as isize {
            let e = (off[0] + i * st[0]) as usize * elem;
            out.extend_from_slice(&bytes[e..e + elem]);
        }
    });
    Ok(out)
}

/// A new array of `m` from a checked header and its data.
pub(crate) fn array_from_npy(
    m: &NDManager,
    h: &Header,
    data: &[u8],
    at: SourceLocation,
) -> Result<NDArray> {
    let n = data.len() / h.dtype.size_in_bytes();
    let buf = if h.fortran && h.shape.len() > 1 {
        let c = fortran_to_c(data, &h.shape, h.dtype.size_in_bytes())?;
        decode(h.dtype, n, &c, h.big_endian)?
    } else {
        decode(h.dtype, n, data, h.big_endian)?
    };
    create(m, buf, Shape(Dims::from_slice(&h.shape)), h.dtype, at)
}

/// The complete `.npy` image of an array's contents.
pub(crate) fn npy_image(raw: &Raw) -> Result<Vec<u8>> {
    let h = header(raw.dtype, raw.shape.dims());
    let mut out = byte_vec(h.len() + raw.bytes.len())?;
    out.extend_from_slice(&h);
    out.extend_from_slice(&raw.bytes);
    Ok(out)
}

// ------------------------------------------------------------------ .npy

fn save_npy_impl(path: &Path, x: NDArray) -> Result<()> {
    const OP: &str = "save_npy";
    let image = npy_image(&read_raw(x)?)?;
    std::fs::write(path, image).map_err(|e| io_error(OP, path, e))
}

/// Write `x` to `path` as a `.npy` file (format 1.0, or 2.0 for a huge header),
/// row-major whatever its layout, little-endian. `numpy.load` reads it. Overwrites
/// an existing file. Panics on error (see [`try_save_npy`]).
///
/// ```
/// use ndscope::{NDManager, io};
/// let m = NDManager::new();
/// let path = std::env::temp_dir().join(format!("ndscope-npy-doc-{}.npy", std::process::id()));
/// let x = m.create(&[1.0f64, 2.0, 3.0, 4.0], [2, 2]);
/// io::save_npy(&path, x);
/// let y = io::load_npy(&m, &path);
/// assert_eq!(y.to_vec::<f64>()?, vec![1.0, 2.0, 3.0, 4.0]);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), ndscope::NdError>(())
/// ```
#[track_caller]
pub fn save_npy(path: impl AsRef<Path>, x: NDArray) {
    unwrap(save_npy_impl(path.as_ref(), x))
}

/// [`save_npy`]. Errors: `Closed`, `Io` (the file cannot be written).
pub fn try_save_npy(path: impl AsRef<Path>, x: NDArray) -> Result<()> {
    save_npy_impl(path.as_ref(), x)
}

fn load_npy_impl(m: &NDManager, path: &Path, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "load_npy";
    check_manager(m)?;
    let file = open_file(OP, path)?;
    // A regular file's length bounds every claim; another kind (a pipe) is read as
    // its data arrives.
    let (len, present) = match file.metadata() {
        Ok(md) if md.is_file() => (md.len(), true),
        _ => (u64::MAX, false),
    };
    let mut r = std::io::BufReader::new(file);
    let mut src = Source::new(&mut r, len, present, "the file");
    let (h, data) = read_npy(&mut src).map_err(|e| read_error(OP, path, "", e, true))?;
    array_from_npy(m, &h, &data, at)
}

/// Read a `.npy` file (format 1.0, 2.0 or 3.0, as `numpy.save` writes) into a new
/// array of `m`, registered in the current scope.
///
/// Accepts numpy's `float32`, `float64`, `int32`, `int64`, `uint8` and `bool`, in
/// either byte order, C or Fortran order (a Fortran-order file is reordered to
/// row-major). Boolean bytes other than 0 read as `true`. The file must hold exactly
/// the bytes its header promises: the header's length and the shape's byte size are
/// checked against the file's length before any memory is reserved, so a forged
/// header over a small file is a `Format` error, never a large reservation. Panics
/// on error (see [`try_load_npy`]).
#[track_caller]
pub fn load_npy(m: &NDManager, path: impl AsRef<Path>) -> NDArray {
    unwrap(load_npy_impl(m, path.as_ref(), Location::caller()))
}

/// [`load_npy`]. Errors: `Io` (missing file, a directory, unreadable), `Format` (not
/// a `.npy` file, a malformed header, an unsupported dtype such as `float16` or a
/// structured dtype, more than 64 dimensions, a shape whose size overflows, a header
/// claiming more data than the file holds, truncated or extra data),
/// `ManagerClosed`/`ManagerCapped`, `OutOfMemory` (data that is in the file but does
/// not fit in memory). Nothing is allocated on error.
#[track_caller]
pub fn try_load_npy(m: &NDManager, path: impl AsRef<Path>) -> Result<NDArray> {
    load_npy_impl(m, path.as_ref(), Location::caller())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        for (dtype, shape) in [
            (DType::F32, vec![]),
            (DType::F64, vec![3]),
            (DType::I64, vec![2, 0, 4]),
            (DType::Bool, vec![1, 2, 3, 4, 5]),
        ] {
            let h = header(dtype, &shape);
            assert_eq!(h.len() % 64, 0);
            assert_eq!(h.last(), Some(&b'\n'));
            let p = parse_header(&h).unwrap();
            assert_eq!(
                p,
                Header {
                    dtype,
                    big_endian: false,
                    fortran: false,
                    shape,
                    data_start: h.len(),
                }
            );
        }
    }

    #[test]
    fn header_text_is_numpys() {
        let h = header(DType::F32, &[2, 3]);
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
        let h = header(DType::U8, &[7]);
        assert!(
            std::str::from_utf8(&h[10..])
                .unwrap()
                .contains("'shape': (7,)")
        );
    }

    fn hdr(dict: &str) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        v.extend_from_slice(dict.as_bytes());
        v
    }

    #[test]
    fn parses_variants() {
        let p = parse_header(&hdr(
            "{\"shape\": (3L, 4L), \"fortran_order\": True, \"descr\": \">i8\"}\n",
        ))
        .unwrap();
        assert_eq!(p.shape, vec![3, 4]);
        assert!(p.fortran && p.big_endian);
        assert_eq!(p.dtype, DType::I64);
        let p = parse_header(&hdr("{'descr':'|b1','fortran_order':False,'shape':()}")).unwrap();
        assert_eq!((p.dtype, p.shape.len()), (DType::Bool, 0));
    }

    #[test]
    fn rejects_bad_headers() {
        let bad = |d: &str| parse_header(&hdr(d)).unwrap_err();
        assert!(bad("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }").contains("'<f2'"));
        assert!(
            bad("{'descr': '|i1', 'fortran_order': False, 'shape': (1,), }").contains("no ndscope")
        );
        assert!(
            bad("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }")
                .contains("structured")
        );
        assert!(bad("{'descr': '<f4', 'shape': (1,), }").contains("fortran_order"));
        assert!(
            bad("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }").contains("malformed")
        );
        assert!(
            bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}")
                .contains("malformed")
        );
        assert!(
            bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,) ").contains("malformed")
        );
        assert!(bad("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x").contains("after"));
        assert!(parse_header(b"\x93NUMPY").unwrap_err().contains("magic"));
        assert!(
            parse_header(b"PK\x03\x04 not npy")
                .unwrap_err()
                .contains("magic")
        );
        let mut v = hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }");
        v[6] = 9;
        assert!(parse_header(&v).unwrap_err().contains("version 9"));
        let v = hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }");
        assert!(parse_header(&v[..20]).unwrap_err().contains("truncated"));
    }

    #[test]
    fn fortran_reorders() {
        // Shape (2, 3) column-major: a[i][j] = 10 i + j stored a00 a10 a01 a11 a02 a12.
        let col: Vec<u8> = vec![0, 10, 1, 11, 2, 12];
        assert_eq!(
            fortran_to_c(&col, &[2, 3], 1).unwrap(),
            vec![0, 1, 2, 10, 11, 12]
        );
    }
}

//! The central directory of a zip archive, read by hand: the zip crate keeps one
//! entry per name (a repeated name silently replaces the earlier one), so the
//! records are read here to see every name the archive lists.
//!
//! Every offset and size comes from the file and is checked against its length with
//! checked arithmetic; nothing is reserved for a count the file states. Memory used:
//! the last 64 KiB of the file at most (where the end record is searched), plus the
//! names read.

use std::io::{BufReader, Read, Seek, SeekFrom};

/// End of central directory record: signature and fixed size.
const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD_LEN: u64 = 22;
/// Zip64 end of central directory locator and record.
const LOC64_SIG: u32 = 0x0706_4b50;
const LOC64_LEN: u64 = 20;
const EOCD64_SIG: u32 = 0x0606_4b50;
const EOCD64_LEN: u64 = 56;
/// Central directory file header: signature and fixed size.
const CDFH_SIG: u32 = 0x0201_4b50;
const CDFH_LEN: usize = 46;

/// One member as the central directory lists it.
#[derive(Debug, PartialEq)]
pub(crate) struct Record {
    /// The name's bytes as stored (UTF-8 when flag bit 11 is set, else CP437).
    pub name: Vec<u8>,
}

impl Record {
    /// The name for messages.
    pub(crate) fn display(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// Read exactly `buf.len()` bytes at `pos`.
fn read_at<R: Read + Seek>(f: &mut R, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
    f.seek(SeekFrom::Start(pos))?;
    f.read_exact(buf)
}

/// Where the central directory is and how many records it claims.
#[derive(Debug, PartialEq)]
struct Directory {
    start: u64,
    size: u64,
    entries: u64,
}

/// Find the end record in the last bytes of the file (`len` bytes long) and the
/// directory it describes (zip64 when a locator precedes the end record).
fn directory<R: Read + Seek>(f: &mut R, len: u64) -> Result<Directory, String> {
    let io = |e: std::io::Error| format!("not a valid zip archive: {e}");
    if len < EOCD_LEN {
        return Err(format!(
            "not a valid zip archive: {len} bytes cannot hold an end of central directory \
             record"
        ));
    }
    // The record is 22 bytes followed by a comment of at most 65,535.
    let tail_len = len.min(EOCD_LEN + u16::MAX as u64);
    let tail_start = len - tail_len;
    let mut tail = vec![0u8; tail_len as usize];
    read_at(f, tail_start, &mut tail).map_err(io)?;
    // The last signature whose comment runs exactly to the end of the file; failing
    // that, the last signature (a comment length that lies, as Python's zipfile
    // tolerates).
    let last = tail.len() - EOCD_LEN as usize;
    let candidates = (0..=last).rev().filter(|&i| u32_at(&tail, i) == EOCD_SIG);
    let exact = candidates
        .clone()
        .find(|&i| i + EOCD_LEN as usize + u16_at(&tail, i + 20) as usize == tail.len());
    let Some(at) = exact.or_else(|| candidates.clone().next()) else {
        return Err("not a valid zip archive: no end of central directory record".into());
    };
    let e = &tail[at..at + EOCD_LEN as usize];
    let eocd_pos = tail_start + at as u64;
    let (disk, cd_disk) = (u16_at(e, 4), u16_at(e, 6));
    let mut dir = Directory {
        entries: u16_at(e, 10) as u64,
        size: u32_at(e, 12) as u64,
        start: u32_at(e, 16) as u64,
    };
    // Where the directory ends: the zip64 record when there is one, else this record.
    let mut end = eocd_pos;
    if let Some(loc_pos) = eocd_pos.checked_sub(LOC64_LEN) {
        let mut loc = [0u8; LOC64_LEN as usize];
        read_at(f, loc_pos, &mut loc).map_err(io)?;
        if u32_at(&loc, 0) == LOC64_SIG {
            let pos = loc_pos
                .checked_sub(EOCD64_LEN)
                .ok_or_else(|| "malformed zip64 archive: no room for its end record".to_string())?;
            let mut r = [0u8; EOCD64_LEN as usize];
            read_at(f, pos, &mut r).map_err(io)?;
            if u32_at(&r, 0) != EOCD64_SIG {
                return Err("malformed zip64 archive: no zip64 end record before its \
                            locator"
                    .into());
            }
            dir = Directory {
                entries: u64_at(&r, 32),
                size: u64_at(&r, 40),
                start: u64_at(&r, 48),
            };
            end = pos;
        }
    }
    if disk != 0 || cd_disk != 0 {
        return Err("multi-disk zip archives are not supported".into());
    }
    // The directory lies just before its end record; the stated offset may be off by
    // data prepended to the archive, so the position is taken from the end.
    let start = end.checked_sub(dir.size).ok_or_else(|| {
        format!(
            "truncated central directory: the end record claims {} bytes of central \
             directory but the file holds {end} bytes before it",
            dir.size
        )
    })?;
    dir.start = start;
    Ok(dir)
}

/// Every record of the central directory of the archive `f` (`len` bytes), in order,
/// repeated names included. A directory whose records do not fill exactly the size
/// and count its end record states is a `Format` message (a truncated directory).
pub(crate) fn records<R: Read + Seek>(f: &mut R, len: u64) -> Result<Vec<Record>, String> {
    let dir = directory(f, len)?;
    f.seek(SeekFrom::Start(dir.start))
        .map_err(|e| format!("not a valid zip archive: {e}"))?;
    let mut r = BufReader::new(f.take(dir.size));
    let mut out = Vec::new();
    let mut used = 0u64;
    let mut fixed = [0u8; CDFH_LEN];
    while used < dir.size {
        let truncated = |what: &str| {
            format!(
                "truncated central directory: record {} ({what}) runs past the {} bytes \
                 the end record claims",
                out.len(),
                dir.size
            )
        };
        r.read_exact(&mut fixed)
            .map_err(|_| truncated("its header"))?;
        if u32_at(&fixed, 0) != CDFH_SIG {
            return Err(format!(
                "malformed central directory: record {} at byte {} has no signature",
                out.len(),
                dir.start + used
            ));
        }
        let (n, m, k) = (
            u16_at(&fixed, 28) as usize,
            u16_at(&fixed, 30) as u64,
            u16_at(&fixed, 32) as u64,
        );
        let mut name = vec![0u8; n];
        r.read_exact(&mut name).map_err(|_| truncated("its name"))?;
        let skip = m + k;
        if std::io::copy(&mut (&mut r).take(skip), &mut std::io::sink()).ok() != Some(skip) {
            return Err(truncated("its extra field and comment"));
        }
        used += CDFH_LEN as u64 + n as u64 + skip;
        out.push(Record { name });
    }
    if out.len() as u64 != dir.entries {
        return Err(format!(
            "truncated central directory: the end record claims {} members but the \
             directory holds {}",
            dir.entries,
            out.len()
        ));
    }
    Ok(out)
}

/// The first name `records` lists twice, if any.
pub(crate) fn repeated(records: &[Record]) -> Option<&Record> {
    let mut seen = std::collections::HashSet::with_capacity(records.len());
    records.iter().find(|r| !seen.insert(r.name.as_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A stored archive of empty members named `names`, with a comment.
    fn archive(names: &[&str], comment: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut cd = Vec::new();
        for n in names {
            let off = out.len() as u32;
            out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&[0; 12]);
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(n.as_bytes());
            cd.extend_from_slice(&CDFH_SIG.to_le_bytes());
            cd.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            cd.extend_from_slice(&[0; 12]);
            cd.extend_from_slice(&(n.len() as u16).to_le_bytes());
            cd.extend_from_slice(&[0; 8]);
            cd.extend_from_slice(&[0; 4]);
            cd.extend_from_slice(&off.to_le_bytes());
            cd.extend_from_slice(n.as_bytes());
        }
        let cd_start = out.len() as u32;
        out.extend_from_slice(&cd);
        out.extend_from_slice(&EOCD_SIG.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
        out.extend_from_slice(&cd_start.to_le_bytes());
        out.extend_from_slice(&(comment.len() as u16).to_le_bytes());
        out.extend_from_slice(comment);
        out
    }

    fn names(z: &[u8]) -> Result<Vec<String>, String> {
        let r = records(&mut Cursor::new(z), z.len() as u64)?;
        Ok(r.iter().map(Record::display).collect())
    }

    #[test]
    fn lists_every_record_repeated_names_included() {
        let z = archive(&["a.npy", "b.npy", "a.npy"], b"");
        assert_eq!(names(&z).unwrap(), ["a.npy", "b.npy", "a.npy"]);
        let r = records(&mut Cursor::new(&z), z.len() as u64).unwrap();
        assert_eq!(repeated(&r).unwrap().display(), "a.npy");
        // A comment that holds a fake end record signature.
        let mut comment = EOCD_SIG.to_le_bytes().to_vec();
        comment.extend_from_slice(&[0; 30]);
        let z = archive(&["x.npy"], &comment);
        assert_eq!(names(&z).unwrap(), ["x.npy"]);
        assert!(repeated(&records(&mut Cursor::new(&z), z.len() as u64).unwrap()).is_none());
    }

    #[test]
    fn forged_directories_are_refused() {
        let z = archive(&["a.npy", "b.npy"], b"");
        let eocd = z.len() - 22;
        // A count larger than the records.
        let mut more = z.clone();
        more[eocd + 10] = 3;
        assert!(names(&more).unwrap_err().contains("claims 3 members"));
        // A size larger than the file.
        let mut big = z.clone();
        big[eocd + 12..eocd + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            names(&big)
                .unwrap_err()
                .contains("truncated central directory")
        );
        // A size cutting a record in two.
        let mut cut = z.clone();
        cut[eocd + 12] -= 3;
        assert!(names(&cut).unwrap_err().contains("central directory"));
        assert!(names(&z[..10]).unwrap_err().contains("cannot hold"));
        assert!(names(&[0u8; 40]).unwrap_err().contains("no end of central"));
    }
}

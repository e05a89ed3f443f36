//! A small `.npy` reader/writer for what the CLI needs: little-endian f32 (`<f4`) and f16 (`<f2`),
//! C order, any shape. Format: magic `\x93NUMPY`, version, header length, a Python dict literal
//! padded so the data starts at a multiple of 64 bytes.

use std::io::{Read, Write};
use std::path::Path;

/// Element type of a `.npy` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDType {
    F32,
    F16,
}

impl NpyDType {
    fn descr(self) -> &'static str {
        match self {
            NpyDType::F32 => "<f4",
            NpyDType::F16 => "<f2",
        }
    }
}

/// An array widened to f32, with the dtype it was stored in.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub dtype: NpyDType,
    pub data: Vec<f32>,
}

type Error = Box<dyn std::error::Error>;

pub fn read(path: &Path) -> Result<NpyArray, Error> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&bytes).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Parses a whole `.npy` file. A malformed file is an `Err`, never a panic; the data's declared
/// size is checked against the bytes present before anything is allocated for it.
pub fn parse(bytes: &[u8]) -> Result<NpyArray, Error> {
    let rest = bytes.strip_prefix(b"\x93NUMPY").ok_or("not a .npy file")?;
    let le_bytes = |range: std::ops::Range<usize>| bytes.get(range).ok_or("truncated header");
    let (header_len, start) = match rest.first() {
        Some(1) => {
            let b = le_bytes(8..10)?;
            (u16::from_le_bytes([b[0], b[1]]) as usize, 10usize)
        }
        Some(2 | 3) => {
            let b = le_bytes(8..12)?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        Some(v) => return Err(format!("unsupported .npy version {v}").into()),
        None => return Err("truncated header".into()),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or("the header runs past the end of the file")?;
    let header = std::str::from_utf8(&bytes[start..end])?;
    let field = |key: &str| -> Result<&str, Error> {
        let quoted = format!("'{key}'");
        let at = header
            .find(&quoted)
            .ok_or(format!("header lacks '{key}'"))?;
        Ok(header[at + quoted.len()..]
            .trim_start()
            .trim_start_matches(':')
            .trim_start())
    };
    let descr = field("descr")?;
    let dtype = if descr.starts_with("'<f4'") {
        NpyDType::F32
    } else if descr.starts_with("'<f2'") {
        NpyDType::F16
    } else {
        let shown = descr.split(',').next().unwrap_or_default();
        return Err(format!("dtype {shown} is not supported (f32 '<f4' or f16 '<f2')").into());
    };
    if !field("fortran_order")?.starts_with("False") {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_text = field("shape")?
        .strip_prefix('(')
        .and_then(|t| t.split_once(')'))
        .ok_or("malformed shape")?
        .0;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("malformed shape ({shape_text}): {e}"))?;
    if shape.is_empty() {
        return Err("a 0-d array (shape ()) is not a tensor".into());
    }
    let width = match dtype {
        NpyDType::F32 => 4,
        NpyDType::F16 => 2,
    };
    let need = shape
        .iter()
        .try_fold(width, |acc: usize, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows the address space"))?;
    let body = &bytes[end..];
    if body.len() != need {
        return Err(format!(
            "shape {shape:?} needs {need} data bytes, the file has {}",
            body.len()
        )
        .into());
    }
    let data = match dtype {
        NpyDType::F32 => body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        NpyDType::F16 => body
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    };
    Ok(NpyArray { shape, dtype, data })
}

pub fn to_bytes(shape: &[usize], dtype: NpyDType, data: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        dtype.descr()
    );
    // Pad with spaces and end with a newline so the data starts on a 64-byte boundary.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = Vec::with_capacity(total + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &x in data {
        match dtype {
            NpyDType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            NpyDType::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        }
    }
    out
}

pub fn write(path: &Path, shape: &[usize], dtype: NpyDType, data: &[f32]) -> Result<(), Error> {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(&to_bytes(shape, dtype, data)))
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_f32_and_f16() {
        let data = [1.0, -2.5, 0.125, 65504.0, 3.0, 7.0];
        for dtype in [NpyDType::F32, NpyDType::F16] {
            let bytes = to_bytes(&[1, 2, 3], dtype, &data);
            assert_eq!(
                (bytes.len() - data.len() * if dtype == NpyDType::F32 { 4 } else { 2 }) % 64,
                0
            );
            let back = parse(&bytes).unwrap();
            assert_eq!(
                back,
                NpyArray {
                    shape: vec![1, 2, 3],
                    dtype,
                    data: data.to_vec()
                }
            );
        }
    }

    #[test]
    fn reads_what_numpy_writes_and_refuses_other_dtypes() {
        // np.save of np.arange(3, dtype=np.float32): numpy's own header spacing.
        let mut bytes =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
                .to_vec();
        bytes.resize(10 + 118, b' ');
        bytes[127] = b'\n';
        for x in [0.0f32, 1.0, 2.0] {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(parse(&bytes).unwrap().data, vec![0.0, 1.0, 2.0]);
        let mut f8 = bytes.clone();
        let at = bytes.windows(3).position(|w| w == b"<f4").unwrap();
        f8[at + 2] = b'8';
        assert!(parse(&f8).unwrap_err().to_string().contains("<f8"));
        assert!(parse(b"PK\x03\x04").is_err());
    }

    /// A file with `header` as its dict text verbatim and `data` zero bytes after it.
    fn file(version: u8, header: &str, data: usize) -> Vec<u8> {
        let mut out = b"\x93NUMPY".to_vec();
        out.extend_from_slice(&[version, 0]);
        if version == 1 {
            out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 0);
        out
    }

    fn dict(descr: &str, shape: &str) -> String {
        format!("{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}\n")
    }

    /// Parses `bytes` catching any panic: `Err` is fine, `Ok` must hold exactly the elements of
    /// its shape and no more data than the file has; a panic fails with `case`.
    fn parse_checked(case: &str, bytes: &[u8]) -> Result<NpyArray, String> {
        let parsed = std::panic::catch_unwind(|| parse(bytes).map_err(|e| e.to_string()))
            .unwrap_or_else(|_| panic!("{case}: parse panicked on {bytes:?}"));
        if let Ok(a) = &parsed {
            let width = if a.dtype == NpyDType::F32 { 4 } else { 2 };
            assert_eq!(a.data.len(), a.shape.iter().product::<usize>(), "{case}");
            assert!(a.data.len() * width <= bytes.len(), "{case}");
        }
        parsed
    }

    #[test]
    fn malformed_headers_are_errors() {
        let f4 = "'<f4'";
        assert_eq!(
            parse_checked("valid", &file(1, &dict(f4, "( 2 , 3 )"), 24))
                .unwrap()
                .shape,
            vec![2, 3]
        );
        let bad_shapes = [
            "()",
            "(,)",
            "(é,)",
            "(\u{ff13},)",
            "(-1,)",
            "(2, -3)",
            "(1e3,)",
            "(0x10,)",
            "(18446744073709551616,)",
            "(18446744073709551615, 2)",
            "(4294967295, 4294967295, 4294967295)",
            "(1099511627776,)",
            "(3",
            "3,)",
            ")(",
            "",
            "[3]",
        ];
        for shape in bad_shapes {
            for (version, data) in [(1, 0), (1, 16), (2, 16), (3, 4)] {
                let bytes = file(version, &dict(f4, shape), data);
                assert!(
                    parse_checked(shape, &bytes).is_err(),
                    "shape {shape} accepted"
                );
            }
        }
        for descr in ["'<f8'", "'>f4'", "'<f\u{ff14}'", "''", "'", "<f4", "None"] {
            let bytes = file(1, &dict(descr, "(3,)"), 12);
            assert!(parse_checked(descr, &bytes).is_err(), "descr {descr}");
        }
        // Short and long data, for both dtypes.
        for (descr, width) in [(f4, 4), ("'<f2'", 2)] {
            for data in [0, 6 * width - 1, 6 * width + 1, 12 * width] {
                let bytes = file(1, &dict(descr, "(2, 3)"), data);
                assert!(parse_checked("data length", &bytes).is_err(), "{data}");
            }
        }
        // Every truncation of a valid file, from an empty file to one missing its last byte.
        let good = to_bytes(&[2, 3], NpyDType::F16, &[1.0; 6]);
        for len in 0..good.len() {
            assert!(parse_checked("truncated", &good[..len]).is_err(), "{len}");
        }
        // Header lengths past the end of the file, versions 1 and 2.
        for (version, at, len) in [(1u8, 8, 2), (2, 8, 4)] {
            let mut bytes = file(version, &dict(f4, "(1,)"), 4);
            bytes[at..at + len].fill(0xff);
            assert!(parse_checked("header length", &bytes).is_err());
        }
        for version in [0u8, 4, 255] {
            let bytes = file(version, &dict(f4, "(1,)"), 4);
            assert!(parse_checked("version", &bytes).is_err());
        }
        let mut not_utf8 = file(1, &dict(f4, "(1,)"), 4);
        not_utf8[12] = 0xff;
        assert!(parse_checked("not UTF-8", &not_utf8).is_err());
        let fortran = dict(f4, "(1,)").replace("False", "True");
        assert!(parse_checked("fortran", &file(1, &fortran, 4)).is_err());
    }

    /// Thousands of randomly mutated valid files (seeded, so any failure replays): each parses
    /// to an error or to a consistent array, never a panic.
    #[test]
    fn mutated_files_never_panic() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};

        const TOKENS: [&str; 10] = [
            "()",
            "-",
            "é",
            ")",
            "(",
            ",",
            "99999999999999999999",
            "'<f8'",
            "'",
            "\u{0}",
        ];
        for seed in 0..4000u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let dims = rng.gen_range(1..=4);
            let shape: Vec<usize> = (0..dims).map(|_| rng.gen_range(1..5)).collect();
            let dtype = if rng.gen_bool(0.5) {
                NpyDType::F32
            } else {
                NpyDType::F16
            };
            let data: Vec<f32> = (0..shape.iter().product()).map(|i| i as f32).collect();
            let mut bytes = to_bytes(&shape, dtype, &data);
            let header_end = bytes.len() - data.len() * if dtype == NpyDType::F32 { 4 } else { 2 };
            for _ in 0..rng.gen_range(1..=4) {
                let len = bytes.len();
                match rng.gen_range(0..6) {
                    // Any byte of the header (where the structure is) to any value.
                    0 if len > 0 => {
                        let at = rng.gen_range(0..header_end.min(len));
                        bytes[at] = rng.r#gen();
                    }
                    1 => bytes.truncate(rng.gen_range(0..=len)),
                    2 => {
                        let at = rng.gen_range(0..=len);
                        let extra: Vec<u8> =
                            (0..rng.gen_range(1..8)).map(|_| rng.r#gen()).collect();
                        bytes.splice(at..at, extra);
                    }
                    3 if len > 0 => {
                        let at = rng.gen_range(0..len);
                        let end = rng.gen_range(at..=len.min(at + 8));
                        bytes.drain(at..end);
                    }
                    4 if len >= 10 => {
                        let header_len: u16 = rng.r#gen();
                        bytes[8..10].copy_from_slice(&header_len.to_le_bytes());
                    }
                    _ => {
                        let at = rng.gen_range(10.min(len)..=header_end.min(len));
                        let token = TOKENS[rng.gen_range(0..TOKENS.len())];
                        bytes.splice(at..at, token.bytes());
                    }
                }
            }
            let _ = parse_checked(&format!("seed {seed}"), &bytes);
        }
    }
}

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

pub fn parse(bytes: &[u8]) -> Result<NpyArray, Error> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}").into()),
    };
    let header = std::str::from_utf8(
        bytes
            .get(start..start + header_len)
            .ok_or("truncated header")?,
    )?;
    let field = |key: &str| -> Result<&str, Error> {
        let at = header
            .find(&format!("'{key}'"))
            .ok_or(format!("header lacks '{key}'"))?;
        Ok(header[at + key.len() + 2..]
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
        return Err(format!(
            "dtype {} is not supported (f32 '<f4' or f16 '<f2')",
            &descr[..descr.find(',').unwrap_or(descr.len())]
        )
        .into());
    };
    if !field("fortran_order")?.starts_with("False") {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_text = field("shape")?;
    let shape_text = &shape_text[1..shape_text.find(')').ok_or("malformed shape")?];
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    let count: usize = shape.iter().product();
    let body = &bytes[start + header_len..];
    let width = match dtype {
        NpyDType::F32 => 4,
        NpyDType::F16 => 2,
    };
    if body.len() != count * width {
        return Err(format!(
            "shape {shape:?} needs {} data bytes, the file has {}",
            count * width,
            body.len()
        )
        .into());
    }
    let data = match dtype {
        NpyDType::F32 => body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
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
}

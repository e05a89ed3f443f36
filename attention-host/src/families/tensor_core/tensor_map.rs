//! The tensor maps of the `wgmma` forward's accelerator-loaded instances
//! (`attention_kernels::kernels::sm90::tma_loads`): K and V each as a four-dimensional tensor
//! `[batch, rows, heads, head_dim]` (innermost last) with the call's strides, read in boxes of 64
//! columns by one block's keys with the 128-byte swizzle of the kernels' panel tiles. The driver
//! encodes them (`cuTensorMapEncodeTiled`); what lies outside the tensor reads as zeros.

use attention_kernels::abi::layout::TensorStrides;
use attention_kernels::abi::params::TensorMap;
use cudarc::driver::sys;

use crate::dtype::DType;
use crate::error::{Result, invalid};

/// Bytes of one box's row: a 128-byte panel (64 16-bit or 128 8-bit elements).
const BOX_BYTES: u32 = 128;

/// One 16-bit tensor of `rows` rows of `heads` heads of `head_dim` columns per batch item, at
/// device address `ptr` with element strides `strides`.
pub(crate) struct Operand {
    pub ptr: u64,
    pub batch: u32,
    pub rows: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub strides: TensorStrides,
}

/// The map of `t` in boxes of `box_rows` rows. An empty tensor gets a zeroed map: its kernels
/// issue no load.
pub(crate) fn encode(dtype: DType, t: &Operand, box_rows: u32) -> Result<TensorMap> {
    let data_type = match dtype {
        DType::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => return Err(invalid!("tensor maps are made for 16-bit tensors only")),
    };
    encode_elements(data_type, 2, t, box_rows)
}

/// The map of an f32 tensor `t` (the backward's dQ accumulator), in boxes of `box_rows` rows of
/// 32 columns: one 128-byte swizzle row each, as the backward stages dQ for its bulk reductions
/// (`attention_kernels::kernels::sm90::bulk_dq`).
pub(crate) fn encode_f32(t: &Operand, box_rows: u32) -> Result<TensorMap> {
    let data_type = sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    encode_elements(data_type, 4, t, box_rows)
}

/// The map of a one-byte (e4m3) tensor `t`, in boxes of `box_rows` rows of 128 columns: one
/// 128-byte swizzle row each, as the FP8 forward's tiles hold them.
pub(crate) fn encode_bytes(t: &Operand, box_rows: u32) -> Result<TensorMap> {
    let data_type = sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8;
    encode_elements(data_type, 1, t, box_rows)
}

/// The map of `t` with elements of `es` bytes, boxes of 128 bytes by `box_rows` rows.
fn encode_elements(
    data_type: sys::CUtensorMapDataType,
    es: u64,
    t: &Operand,
    box_rows: u32,
) -> Result<TensorMap> {
    if t.batch == 0 || t.rows == 0 || t.heads == 0 || t.head_dim == 0 {
        return Ok(TensorMap::default());
    }
    let dims = [t.head_dim, t.heads, t.rows, t.batch].map(u64::from);
    // Byte strides of dims 1..3. The stride over an extent of 1 is never stepped: any valid
    // value does (the row's bytes, whole 16-byte chunks).
    let row_bytes = (t.head_dim as u64 * es).next_multiple_of(16);
    let strides = [
        (t.strides.head, t.heads),
        (t.strides.seq, t.rows),
        (t.strides.batch, t.batch),
    ]
    .map(
        |(stride, extent)| {
            if extent <= 1 { row_bytes } else { stride * es }
        },
    );
    let boxes = [BOX_BYTES / es as u32, 1, box_rows, 1];
    let element_strides = [1u32; 4];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer is to a live array of the rank's length; the driver only reads them
    // and writes `map`.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            4,
            t.ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    status.result().map_err(|e| {
        invalid!(
            "the tensor memory accelerator cannot read a tensor of dims {dims:?} (innermost first) \
             with byte strides {strides:?} at {:#x}: {e}",
            t.ptr
        )
    })?;
    Ok(TensorMap(map.opaque))
}

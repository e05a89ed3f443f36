//! Device tensors of f32, f16 or bf16 elements, with upload/download that converts through f32.
//!
//! Every device allocation of the library lives in a [`DeviceArray`], which retains device 0's
//! primary context (see [`crate::runtime`]) and makes it current before each driver call,
//! including the free: buffers work from any thread and may outlive the `Gpu`.

use std::sync::Arc;

use cust::context::Context;
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};

use crate::dtype::DType;
use crate::error::{CudaContext, Result, invalid};
use crate::runtime::{make_current, primary_context};

/// A cust `DeviceBuffer` that keeps the context it was allocated in alive and current where it
/// is used and freed.
pub(crate) struct DeviceArray<T: DeviceCopy> {
    // Field order is drop order: the buffer is freed before the context is released.
    buffer: DeviceBuffer<T>,
    context: Arc<Context>,
}

// Buffers are shared between threads and moved to others.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<DeviceArray<f32>>();
    send_sync::<DeviceTensor>();
    send_sync::<DeviceF32>();
};

impl<T: DeviceCopy> DeviceArray<T> {
    /// Bytes of `len` elements, refused (before any allocation) when they do not fit an `isize`.
    fn checked_bytes(len: usize) -> Result<usize> {
        len.checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                invalid!(
                    "{len} elements of {} bytes overflow the address space",
                    size_of::<T>()
                )
            })
    }

    pub(crate) fn from_slice(host: &[T]) -> Result<Self> {
        let context = primary_context()?;
        let buffer = DeviceBuffer::from_slice(host).cuda("uploading a buffer")?;
        Ok(DeviceArray { buffer, context })
    }

    /// `len` elements whose every byte is written by `fill` (a memset) before anything reads them.
    fn filled(
        len: usize,
        fill: impl FnOnce(&mut DeviceBuffer<T>) -> cust::error::CudaResult<()>,
    ) -> Result<Self> {
        Self::checked_bytes(len)?;
        let context = primary_context()?;
        // SAFETY: `fill` writes every element below before the buffer is handed out.
        let mut buffer = unsafe { DeviceBuffer::uninitialized(len) }.cuda("allocating a buffer")?;
        if len > 0 {
            fill(&mut buffer).cuda("filling a buffer")?;
        }
        Ok(DeviceArray { buffer, context })
    }

    pub(crate) fn len(&self) -> usize {
        self.buffer.len()
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.buffer.as_device_ptr().as_raw()
    }

    pub(crate) fn to_vec(&self) -> Result<Vec<T>>
    where
        T: Default + Clone,
    {
        make_current(&self.context)?;
        let mut out = vec![T::default(); self.buffer.len()];
        self.buffer
            .copy_to(&mut out[..])
            .cuda("downloading a buffer")?;
        Ok(out)
    }
}

impl DeviceArray<f32> {
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        Self::checked_bytes(len)?;
        let context = primary_context()?;
        let buffer = DeviceBuffer::zeroed(len).cuda("allocating a buffer")?;
        Ok(DeviceArray { buffer, context })
    }

    fn nan(len: usize) -> Result<Self> {
        Self::filled(len, |b| b.set_32(f32::NAN.to_bits()))
    }
}

impl DeviceArray<u16> {
    fn splat(len: usize, bits: u16) -> Result<Self> {
        Self::filled(len, |b| b.set_16(bits))
    }
}

impl<T: DeviceCopy> Drop for DeviceArray<T> {
    fn drop(&mut self) {
        // cust frees the buffer in the current context; make it ours on whichever thread this is.
        let _ = make_current(&self.context);
    }
}

enum Storage {
    F32(DeviceArray<f32>),
    /// f16 or bf16 bit patterns (`half`'s types are not `DeviceCopy`).
    Bits16(DeviceArray<u16>),
}

/// A flat device buffer tagged with its storage dtype.
pub struct DeviceTensor {
    dtype: DType,
    storage: Storage,
}

impl DeviceTensor {
    /// Uploads `host`, rounding each value to `dtype`.
    pub fn from_f32(dtype: DType, host: &[f32]) -> Result<DeviceTensor> {
        let storage = match dtype {
            DType::F32 => Storage::F32(DeviceArray::from_slice(host)?),
            _ => {
                let bits: Vec<u16> = host.iter().map(|&x| dtype.bits16(x).unwrap()).collect();
                Storage::Bits16(DeviceArray::from_slice(&bits)?)
            }
        };
        Ok(DeviceTensor::tracked(dtype, storage))
    }

    /// Registers the tensor's bytes with `memory`; `Drop` releases them.
    fn tracked(dtype: DType, storage: Storage) -> DeviceTensor {
        let tensor = DeviceTensor { dtype, storage };
        crate::memory::allocated(tensor.size_bytes());
        tensor
    }

    /// Uploads raw 16-bit patterns of `dtype` (f16 or bf16), e.g. from `half::f16::to_bits`.
    pub fn from_bits16(dtype: DType, bits: &[u16]) -> Result<DeviceTensor> {
        if dtype == DType::F32 {
            return Err(invalid!(
                "from_bits16 takes f16 or bf16 bit patterns, not f32"
            ));
        }
        let buf = DeviceArray::from_slice(bits)?;
        Ok(DeviceTensor::tracked(dtype, Storage::Bits16(buf)))
    }

    /// Uploads `half::f16` values as an f16 tensor, bit for bit.
    pub fn from_f16(host: &[half::f16]) -> Result<DeviceTensor> {
        let bits: Vec<u16> = host.iter().map(|x| x.to_bits()).collect();
        DeviceTensor::from_bits16(DType::F16, &bits)
    }

    /// Uploads `half::bf16` values as a bf16 tensor, bit for bit.
    pub fn from_bf16(host: &[half::bf16]) -> Result<DeviceTensor> {
        let bits: Vec<u16> = host.iter().map(|x| x.to_bits()).collect();
        DeviceTensor::from_bits16(DType::Bf16, &bits)
    }

    /// Downloads an f16 tensor as `half::f16`, bit for bit.
    pub fn to_f16(&self) -> Result<Vec<half::f16>> {
        self.check_dtype(DType::F16)?;
        Ok(self
            .to_bits16()?
            .into_iter()
            .map(half::f16::from_bits)
            .collect())
    }

    /// Downloads a bf16 tensor as `half::bf16`, bit for bit.
    pub fn to_bf16(&self) -> Result<Vec<half::bf16>> {
        self.check_dtype(DType::Bf16)?;
        Ok(self
            .to_bits16()?
            .into_iter()
            .map(half::bf16::from_bits)
            .collect())
    }

    fn check_dtype(&self, want: DType) -> Result<()> {
        if self.dtype != want {
            return Err(invalid!("the tensor is {}, not {want}", self.dtype));
        }
        Ok(())
    }

    /// A tensor of `len` elements filled with NaN on the device, so any element a kernel fails to
    /// write shows.
    pub fn poisoned(dtype: DType, len: usize) -> Result<DeviceTensor> {
        let storage = match dtype {
            DType::F32 => Storage::F32(DeviceArray::nan(len)?),
            _ => Storage::Bits16(DeviceArray::splat(len, dtype.bits16(f32::NAN).unwrap())?),
        };
        Ok(DeviceTensor::tracked(dtype, storage))
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::F32(b) => b.len(),
            Storage::Bits16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype.size_bytes()
    }

    /// Device address for kernel parameters.
    pub fn device_ptr(&self) -> u64 {
        match &self.storage {
            Storage::F32(b) => b.device_ptr(),
            Storage::Bits16(b) => b.device_ptr(),
        }
    }

    /// Downloads and widens every element to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::F32(b) => b.to_vec(),
            Storage::Bits16(b) => Ok(b
                .to_vec()?
                .into_iter()
                .map(|x| self.dtype.widen16(x))
                .collect()),
        }
    }

    /// Downloads the raw 16-bit patterns of an f16/bf16 tensor.
    pub fn to_bits16(&self) -> Result<Vec<u16>> {
        match &self.storage {
            Storage::F32(_) => Err(invalid!("to_bits16 on an f32 tensor")),
            Storage::Bits16(b) => b.to_vec(),
        }
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        crate::memory::released(self.size_bytes());
    }
}

/// A device buffer of f32 (the saved `LSE` and f32 accumulators).
pub struct DeviceF32(DeviceArray<f32>);

impl DeviceF32 {
    /// `len` NaNs, written on the device.
    pub fn poisoned(len: usize) -> Result<DeviceF32> {
        let buf = DeviceArray::nan(len)?;
        crate::memory::allocated(len * 4);
        Ok(DeviceF32(buf))
    }
    pub fn from_slice(host: &[f32]) -> Result<DeviceF32> {
        let buf = DeviceArray::from_slice(host)?;
        crate::memory::allocated(buf.len() * 4);
        Ok(DeviceF32(buf))
    }
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        self.0.to_vec()
    }
}

impl Drop for DeviceF32 {
    fn drop(&mut self) {
        crate::memory::released(self.0.len() * 4);
    }
}

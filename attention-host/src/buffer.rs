//! Device tensors of f32, f16 or bf16 elements, with upload/download that converts through f32.

use cust::memory::{CopyDestination, DeviceBuffer};

use crate::dtype::DType;
use crate::error::{CudaContext, Result, invalid};

enum Storage {
    F32(DeviceBuffer<f32>),
    /// f16 or bf16 bit patterns (`half`'s types are not `DeviceCopy`).
    Bits16(DeviceBuffer<u16>),
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
            DType::F32 => Storage::F32(DeviceBuffer::from_slice(host).cuda("uploading a tensor")?),
            _ => {
                let bits: Vec<u16> = host.iter().map(|&x| dtype.bits16(x).unwrap()).collect();
                Storage::Bits16(DeviceBuffer::from_slice(&bits).cuda("uploading a tensor")?)
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
        let buf = DeviceBuffer::from_slice(bits).cuda("uploading a tensor")?;
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
        // SAFETY: every element is written by the memset below before anything reads it.
        let storage = unsafe {
            match dtype {
                DType::F32 => {
                    let mut b =
                        DeviceBuffer::<f32>::uninitialized(len).cuda("allocating a tensor")?;
                    if len > 0 {
                        b.set_32(f32::NAN.to_bits()).cuda("poisoning a tensor")?;
                    }
                    Storage::F32(b)
                }
                _ => {
                    let mut b =
                        DeviceBuffer::<u16>::uninitialized(len).cuda("allocating a tensor")?;
                    if len > 0 {
                        b.set_16(dtype.bits16(f32::NAN).unwrap())
                            .cuda("poisoning a tensor")?;
                    }
                    Storage::Bits16(b)
                }
            }
        };
        Ok(DeviceTensor::tracked(dtype, storage))
    }

    /// `len` elements of `dtype` as the allocator left them, for outputs a kernel writes in full
    /// (every bit pattern is a valid f32 or 16-bit value, so reading them is defined).
    pub(crate) fn uninitialized(dtype: DType, len: usize) -> Result<DeviceTensor> {
        // SAFETY: f32 and u16 have no invalid bit patterns.
        let storage = unsafe {
            match dtype {
                DType::F32 => Storage::F32(
                    DeviceBuffer::<f32>::uninitialized(len).cuda("allocating a tensor")?,
                ),
                _ => Storage::Bits16(
                    DeviceBuffer::<u16>::uninitialized(len).cuda("allocating a tensor")?,
                ),
            }
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
            Storage::F32(b) => b.as_device_ptr().as_raw(),
            Storage::Bits16(b) => b.as_device_ptr().as_raw(),
        }
    }

    /// Downloads and widens every element to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::F32(b) => {
                let mut out = vec![0.0f32; b.len()];
                b.copy_to(&mut out[..]).cuda("downloading a tensor")?;
                Ok(out)
            }
            Storage::Bits16(b) => Ok(self
                .to_bits16_of(b)?
                .into_iter()
                .map(|x| self.dtype.widen16(x))
                .collect()),
        }
    }

    /// Downloads the raw 16-bit patterns of an f16/bf16 tensor.
    pub fn to_bits16(&self) -> Result<Vec<u16>> {
        match &self.storage {
            Storage::F32(_) => Err(invalid!("to_bits16 on an f32 tensor")),
            Storage::Bits16(b) => self.to_bits16_of(b),
        }
    }

    fn to_bits16_of(&self, b: &DeviceBuffer<u16>) -> Result<Vec<u16>> {
        let mut out = vec![0u16; b.len()];
        b.copy_to(&mut out[..]).cuda("downloading a tensor")?;
        Ok(out)
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        crate::memory::released(self.size_bytes());
    }
}

/// A device buffer of f32 (the saved `LSE` and f32 accumulators).
pub struct DeviceF32(DeviceBuffer<f32>);

impl DeviceF32 {
    /// `len` NaNs, written on the device.
    pub fn poisoned(len: usize) -> Result<DeviceF32> {
        // SAFETY: every element is written by the memset before anything reads it.
        let mut buf =
            unsafe { DeviceBuffer::<f32>::uninitialized(len) }.cuda("allocating an f32 buffer")?;
        if len > 0 {
            buf.set_32(f32::NAN.to_bits())
                .cuda("poisoning an f32 buffer")?;
        }
        crate::memory::allocated(len * 4);
        Ok(DeviceF32(buf))
    }
    /// `len` f32 as the allocator left them, for buffers a kernel writes in full (every bit
    /// pattern is a valid f32, so reading them is defined).
    pub(crate) fn uninitialized(len: usize) -> Result<DeviceF32> {
        // SAFETY: f32 has no invalid bit patterns.
        let buf =
            unsafe { DeviceBuffer::<f32>::uninitialized(len) }.cuda("allocating an f32 buffer")?;
        crate::memory::allocated(len * 4);
        Ok(DeviceF32(buf))
    }
    pub fn from_slice(host: &[f32]) -> Result<DeviceF32> {
        let buf = DeviceBuffer::from_slice(host).cuda("uploading an f32 buffer")?;
        crate::memory::allocated(buf.len() * 4);
        Ok(DeviceF32(buf))
    }
    pub fn device_ptr(&self) -> u64 {
        self.0.as_device_ptr().as_raw()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; self.0.len()];
        self.0
            .copy_to(&mut out[..])
            .cuda("downloading an f32 buffer")?;
        Ok(out)
    }
}

impl Drop for DeviceF32 {
    fn drop(&mut self) {
        crate::memory::released(self.0.len() * 4);
    }
}

//! Device tensors of f32, f16 or bf16 elements, with upload/download that converts through f32.
//!
//! Every device allocation of the library lives in a `DeviceArray`, which retains device 0's
//! primary context (see [`crate::runtime`]) and makes it current before each driver call,
//! including the free: buffers work from any thread and may outlive the `Gpu`. Arrays come from
//! the library's stream-ordered memory pool (`runtime::memory_pool`): allocation and
//! free cost microseconds once the pool holds the memory, and the free waits for queued work in
//! stream order instead of synchronising the device.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, DeviceRepr};

use crate::dtype::DType;
use crate::error::{Result, driver, invalid};
use crate::runtime::{make_current, memory_pool, primary_context};

/// `len` elements of `T` on the device, freed in stream order; keeps the context it was
/// allocated in alive and current where it is used and freed. Its bytes count in
/// [`crate::runtime::memory`].
pub(crate) struct DeviceArray<T: DeviceRepr> {
    ptr: CUdeviceptr,
    len: usize,
    context: Arc<CudaContext>,
    _elem: PhantomData<T>,
}

// The array owns its allocation; the pointer is a device address, valid from any thread in the
// context the array retains.
unsafe impl<T: DeviceRepr> Send for DeviceArray<T> {}
unsafe impl<T: DeviceRepr> Sync for DeviceArray<T> {}

// Buffers are shared between threads and moved to others.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<DeviceArray<f32>>();
    send_sync::<DeviceTensor>();
    send_sync::<DeviceF32>();
};

impl<T: DeviceRepr> DeviceArray<T> {
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

    /// `len` elements as the pool left them. Only element types without invalid bit patterns
    /// are allocated this way (f32, u16, u32), so reading them before a kernel writes them is
    /// defined, if meaningless.
    fn uninitialized(len: usize) -> Result<Self> {
        let bytes = Self::checked_bytes(len)?;
        let context = primary_context()?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let pool = memory_pool()?;
            // SAFETY: an out-pointer and a pool of this context; the legacy default stream orders
            // the allocation before every later copy, memset and launch of the library.
            driver(
                unsafe {
                    sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, std::ptr::null_mut())
                },
                "allocating device memory",
            )?;
        }
        crate::runtime::memory::allocated(bytes);
        Ok(DeviceArray {
            ptr,
            len,
            context,
            _elem: PhantomData,
        })
    }

    pub(crate) fn from_slice(host: &[T]) -> Result<Self> {
        let array = Self::uninitialized(host.len())?;
        if !host.is_empty() {
            // SAFETY: `host` holds `len` elements of `T` and the array as many on the device.
            driver(
                unsafe { sys::cuMemcpyHtoD_v2(array.ptr, host.as_ptr().cast(), size_of_val(host)) },
                "uploading a buffer",
            )?;
        }
        Ok(array)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn to_vec(&self) -> Result<Vec<T>>
    where
        T: Default + Clone,
    {
        make_current(&self.context)?;
        let mut out = vec![T::default(); self.len];
        if self.len > 0 {
            // SAFETY: both sides hold `len` elements of `T`; the copy waits for queued work.
            driver(
                unsafe {
                    sys::cuMemcpyDtoH_v2(
                        out.as_mut_ptr().cast(),
                        self.ptr,
                        self.len * size_of::<T>(),
                    )
                },
                "downloading a buffer",
            )?;
        }
        Ok(out)
    }
}

impl DeviceArray<f32> {
    /// `len` copies of the f32 with bit pattern `bits`.
    fn splat32(len: usize, bits: u32) -> Result<Self> {
        let array = Self::uninitialized(len)?;
        if len > 0 {
            // SAFETY: the array holds `len` 32-bit words.
            driver(
                unsafe { sys::cuMemsetD32_v2(array.ptr, bits, len) },
                "filling a buffer",
            )?;
        }
        Ok(array)
    }

    fn nan(len: usize) -> Result<Self> {
        Self::splat32(len, f32::NAN.to_bits())
    }
}

impl DeviceArray<u16> {
    fn splat(len: usize, bits: u16) -> Result<Self> {
        let array = Self::uninitialized(len)?;
        if len > 0 {
            // SAFETY: the array holds `len` 16-bit words.
            driver(
                unsafe { sys::cuMemsetD16_v2(array.ptr, bits, len) },
                "filling a buffer",
            )?;
        }
        Ok(array)
    }
}

impl<T: DeviceRepr> Drop for DeviceArray<T> {
    fn drop(&mut self) {
        crate::runtime::memory::released(self.len * size_of::<T>());
        if self.ptr != 0 && make_current(&self.context).is_ok() {
            // SAFETY: the pointer came from the pool and is freed once; the legacy default stream
            // waits for the library's queued work before the memory returns to the pool.
            unsafe { sys::cuMemFreeAsync(self.ptr, std::ptr::null_mut()) };
        }
    }
}

enum Storage {
    F32(DeviceArray<f32>),
    /// f16 or bf16 bit patterns, which the kernels read as such.
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
        Ok(DeviceTensor { dtype, storage })
    }

    /// Uploads raw 16-bit patterns of `dtype` (f16 or bf16), e.g. from `half::f16::to_bits`.
    pub fn from_bits16(dtype: DType, bits: &[u16]) -> Result<DeviceTensor> {
        if dtype == DType::F32 {
            return Err(invalid!(
                "from_bits16 takes f16 or bf16 bit patterns, not f32"
            ));
        }
        let buf = DeviceArray::from_slice(bits)?;
        Ok(DeviceTensor {
            dtype,
            storage: Storage::Bits16(buf),
        })
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
        Ok(DeviceTensor { dtype, storage })
    }

    /// `len` elements of `dtype` as the allocator left them, for outputs a kernel writes in full
    /// (every bit pattern is a valid f32 or 16-bit value, so reading them is defined).
    pub(crate) fn uninitialized(dtype: DType, len: usize) -> Result<DeviceTensor> {
        let storage = match dtype {
            DType::F32 => Storage::F32(DeviceArray::uninitialized(len)?),
            _ => Storage::Bits16(DeviceArray::uninitialized(len)?),
        };
        Ok(DeviceTensor { dtype, storage })
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

/// A device buffer of f32 (the saved `LSE` and f32 accumulators).
pub struct DeviceF32(DeviceArray<f32>);

impl DeviceF32 {
    /// `len` NaNs, written on the device.
    pub fn poisoned(len: usize) -> Result<DeviceF32> {
        Ok(DeviceF32(DeviceArray::nan(len)?))
    }
    /// `len` f32 as the allocator left them, for buffers a kernel writes in full (every bit
    /// pattern is a valid f32, so reading them is defined).
    pub(crate) fn uninitialized(len: usize) -> Result<DeviceF32> {
        Ok(DeviceF32(DeviceArray::uninitialized(len)?))
    }
    pub fn from_slice(host: &[f32]) -> Result<DeviceF32> {
        Ok(DeviceF32(DeviceArray::from_slice(host)?))
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

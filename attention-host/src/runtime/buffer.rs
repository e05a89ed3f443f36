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
use crate::runtime::{make_current, memory_pool_for, primary_context};

/// `len` elements of `T` on the device, freed in stream order; keeps the context it was
/// allocated in alive and current where it is used and freed. Its bytes count in
/// [`crate::runtime::memory`].
pub(crate) struct DeviceArray<T: DeviceRepr> {
    ptr: CUdeviceptr,
    len: usize,
    context: Arc<CudaContext>,
    release: Release,
    _elem: PhantomData<T>,
}

/// How a [`DeviceArray`] gives its memory back.
#[derive(Clone, Copy)]
enum Release {
    /// Allocated and freed on the legacy default stream (the library's own buffers).
    Legacy,
    /// Allocated and freed on this stream (a call on a caller's stream): the holder keeps the
    /// stream alive longer than the array.
    Stream(sys::CUstream),
    /// Memory the caller owns: never freed here, not counted.
    Borrowed,
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
        // A size that cannot be allocated is refused before the driver is asked for anything.
        Self::checked_bytes(len)?;
        Self::uninitialized_on(len, &primary_context()?, std::ptr::null_mut())
    }

    /// `len` elements allocated in `context` from the library's pool, in stream order on
    /// `stream` (null: the legacy default stream) and freed on it. A non-null stream must outlive
    /// the array.
    pub(crate) fn uninitialized_on(
        len: usize,
        context: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<Self> {
        let bytes = Self::checked_bytes(len)?;
        let mut ptr: CUdeviceptr = 0;
        if bytes > 0 {
            let pool = memory_pool_for(context)?;
            // SAFETY: an out-pointer and a pool of this context's device; the stream orders the
            // allocation before every later copy, memset and launch on it (the legacy default
            // stream: of the library).
            driver(
                unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream) },
                "allocating device memory",
            )?;
        }
        crate::runtime::memory::allocated(bytes);
        Ok(DeviceArray {
            ptr,
            len,
            context: context.clone(),
            release: match stream.is_null() {
                true => Release::Legacy,
                false => Release::Stream(stream),
            },
            _elem: PhantomData,
        })
    }

    /// `len` elements at `ptr` that the caller owns, in `context`: never freed here.
    pub(crate) fn borrowed(ptr: CUdeviceptr, len: usize, context: &Arc<CudaContext>) -> Self {
        DeviceArray {
            ptr,
            len,
            context: context.clone(),
            release: Release::Borrowed,
            _elem: PhantomData,
        }
    }

    pub(crate) fn from_slice(host: &[T]) -> Result<Self> {
        Self::from_slice_on(host, &primary_context()?, std::ptr::null_mut())
    }

    /// Uploads `host` into an array of [`DeviceArray::uninitialized_on`]. On a stream the copy
    /// is asynchronous (staged from pageable memory before it returns, so `host` may go at once);
    /// a stream being captured into a CUDA graph is refused, since the graph would read `host`
    /// again at each replay.
    pub(crate) fn from_slice_on(
        host: &[T],
        context: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<Self> {
        if !stream.is_null() && !host.is_empty() && capturing(stream)? {
            return Err(invalid!(
                "this call uploads {} host values (sequence lengths, ALiBi slopes or sink logits), \
                 which a stream under CUDA graph capture cannot take: call it outside the capture",
                host.len()
            ));
        }
        let array = Self::uninitialized_on(host.len(), context, stream)?;
        if !host.is_empty() {
            // SAFETY: `host` holds `len` elements of `T` and the array as many on the device.
            let status = unsafe {
                match stream.is_null() {
                    true => {
                        sys::cuMemcpyHtoD_v2(array.ptr, host.as_ptr().cast(), size_of_val(host))
                    }
                    false => sys::cuMemcpyHtoDAsync_v2(
                        array.ptr,
                        host.as_ptr().cast(),
                        size_of_val(host),
                        stream,
                    ),
                }
            };
            driver(status, "uploading a buffer")?;
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

    /// Zeroes words `first .. first + len`, in order on the stream the array was allocated on.
    fn zero_words(&self, first: usize, len: usize) -> Result<()> {
        if first.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(invalid!(
                "words {first}..+{len} are outside a buffer of {}",
                self.len
            ));
        }
        let stream = match self.release {
            Release::Stream(stream) => stream,
            Release::Legacy | Release::Borrowed => std::ptr::null_mut(),
        };
        make_current(&self.context)?;
        if len > 0 {
            // SAFETY: the words are inside the array (checked above); the stream orders the fill
            // after the allocation and before every later use on it.
            driver(
                unsafe { sys::cuMemsetD32Async(self.ptr + 4 * first as u64, 0, len, stream) },
                "zeroing a buffer",
            )?;
        }
        Ok(())
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
        let stream = match self.release {
            Release::Borrowed => return,
            Release::Legacy => std::ptr::null_mut(),
            Release::Stream(stream) => stream,
        };
        crate::runtime::memory::released(self.len * size_of::<T>());
        if self.ptr != 0 && make_current(&self.context).is_ok() {
            // SAFETY: the pointer came from the pool and is freed once, on the stream that used
            // it (the legacy default stream waits for the library's queued work), before the
            // memory returns to the pool.
            unsafe { sys::cuMemFreeAsync(self.ptr, stream) };
        }
    }
}

/// Whether `stream` is being captured into a CUDA graph.
pub(crate) fn capturing(stream: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a valid stream handle and an out-pointer.
    driver(
        unsafe { sys::cuStreamIsCapturing(stream, &mut status) },
        "asking whether the stream is being captured",
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
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

    /// `len` elements of `dtype` allocated on `stream` in `context` (see
    /// [`DeviceArray::uninitialized_on`]): staging copies of a call on a caller's stream.
    pub(crate) fn uninitialized_on(
        dtype: DType,
        len: usize,
        context: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<DeviceTensor> {
        let storage = match dtype {
            DType::F32 => Storage::F32(DeviceArray::uninitialized_on(len, context, stream)?),
            _ => Storage::Bits16(DeviceArray::uninitialized_on(len, context, stream)?),
        };
        Ok(DeviceTensor { dtype, storage })
    }

    /// A view of `len` elements of `dtype` at `ptr` that the caller owns (never freed here).
    pub(crate) fn borrowed(
        dtype: DType,
        ptr: CUdeviceptr,
        len: usize,
        context: &Arc<CudaContext>,
    ) -> DeviceTensor {
        let storage = match dtype {
            DType::F32 => Storage::F32(DeviceArray::borrowed(ptr, len, context)),
            _ => Storage::Bits16(DeviceArray::borrowed(ptr, len, context)),
        };
        DeviceTensor { dtype, storage }
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
    /// As [`DeviceArray::from_slice_on`].
    pub(crate) fn from_slice_on(
        host: &[f32],
        context: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<DeviceF32> {
        Ok(DeviceF32(DeviceArray::from_slice_on(
            host, context, stream,
        )?))
    }
    /// As [`DeviceArray::uninitialized_on`].
    pub(crate) fn uninitialized_on(
        len: usize,
        context: &Arc<CudaContext>,
        stream: sys::CUstream,
    ) -> Result<DeviceF32> {
        Ok(DeviceF32(DeviceArray::uninitialized_on(
            len, context, stream,
        )?))
    }
    /// A view of `len` f32 at `ptr` that the caller owns (never freed here).
    pub(crate) fn borrowed(ptr: CUdeviceptr, len: usize, context: &Arc<CudaContext>) -> DeviceF32 {
        DeviceF32(DeviceArray::borrowed(ptr, len, context))
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
    /// As [`DeviceArray::zero_words`].
    pub(crate) fn zero_words(&self, first: usize, len: usize) -> Result<()> {
        self.0.zero_words(first, len)
    }
}

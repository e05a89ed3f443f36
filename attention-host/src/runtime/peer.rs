//! Copies between two devices of one process: partial results of one device brought to another
//! (the merge of `(O, LSE)` parts computed over disjoint key sets on different GPUs, the first
//! step towards the ring of `docs/ring-attention.md`).
//!
//! The direct path is `cuMemcpyPeerAsync` with the destination device given access to the source's
//! memory (NVLink or PCIe, no host memory). Where the devices cannot reach each other,
//! the copy goes through host memory, and the caller is told which path ran.

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream};

use crate::borrowed::{TensorMut, TensorRef, View};
use crate::error::{AttentionError, CudaContext as _, Result, driver, invalid};
use crate::runtime::buffer::capturing;
use crate::runtime::make_current;

/// Which path a copy may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyRoute {
    /// Device to device where the destination device can access the source's memory, else
    /// through the host.
    Auto,
    /// Through the host whatever the devices can do (the fallback, chosen explicitly: tests).
    Staged,
}

/// The path a copy took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPath {
    /// `cuMemcpyPeerAsync` on the destination stream, the destination device given access to the
    /// source memory ([`copy_across_devices`]): asynchronous.
    Peer,
    /// Downloaded on the source stream (the call waits for it), uploaded on the destination
    /// stream from pageable memory, which the driver stages before the call returns.
    Staged,
}

impl std::fmt::Display for CopyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyPath::Peer => "peer (cuMemcpyPeerAsync, device to device)",
            CopyPath::Staged => "staged through host memory",
        })
    }
}

/// Whether device `to`'s contexts may be given access to device `from`'s memory
/// (`cuDeviceCanAccessPeer`): the condition for [`CopyPath::Peer`].
pub fn can_access_peer(to: &CudaStream, from: &CudaStream) -> Result<bool> {
    let (to, from) = (to.context().cu_device(), from.context().cu_device());
    if to == from {
        return Ok(false);
    }
    let mut can = 0;
    // SAFETY: an out-pointer and two device handles of contexts that exist.
    driver(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, to, from) },
        "asking whether one device can access another's memory",
    )?;
    Ok(can != 0)
}

/// Copies `src`, memory of `src_stream`'s device, into `dst`, memory of `dst_stream`'s device
/// (another device): whole contiguous views of one dtype and length. Ordered after the work
/// queued on both streams before the call; work queued on either stream after it comes after the
/// copy (the source may be overwritten, the destination read, in stream order). Returns the path
/// that ran ([`CopyRoute::Auto`]: [`CopyPath::Peer`] when the destination device can access the
/// source's, else [`CopyPath::Staged`]).
///
/// The peer path leaves the destination device with access to the source memory: peer access
/// from the destination's context to the source's, and, for stream-ordered memory, read-write
/// access to the source's whole memory pool. The driver keeps both until the context or the pool
/// goes.
///
/// Refused before anything is queued: views of different dtypes or lengths, strided views, both
/// streams on one device, a view whose memory is not on its stream's device, a stream under
/// CUDA graph capture.
///
/// # Example
///
/// ```no_run
/// use attention_host::runtime::peer::{CopyRoute, copy_across_devices};
/// use attention_host::{TensorMut, TensorRef};
/// use attention_host::cudarc::driver::CudaContext;
///
/// let (s0, s1) = (CudaContext::new(0).unwrap().new_stream().unwrap(),
///                 CudaContext::new(1).unwrap().new_stream().unwrap());
/// let part = s1.clone_htod(&[1.0f32; 256]).unwrap();
/// let mut here = s0.alloc_zeros::<f32>(256).unwrap();
/// let path = copy_across_devices(
///     &TensorRef::new(&part, &s1),
///     &s1,
///     &mut TensorMut::new(&mut here, &s0),
///     &s0,
///     CopyRoute::Auto,
/// )?;
/// println!("copied {path}");
/// # Ok::<(), attention_host::AttentionError>(())
/// ```
pub fn copy_across_devices(
    src: &TensorRef,
    src_stream: &CudaStream,
    dst: &mut TensorMut,
    dst_stream: &CudaStream,
    route: CopyRoute,
) -> Result<CopyPath> {
    let bytes = check(&src.view, src_stream, &dst.view, dst_stream)?;
    let path = match route {
        CopyRoute::Auto if can_access_peer(dst_stream, src_stream)? => CopyPath::Peer,
        _ => CopyPath::Staged,
    };
    if bytes == 0 {
        return Ok(path);
    }
    match path {
        CopyPath::Peer => peer_copy(src.view.ptr, src_stream, dst.view.ptr, dst_stream, bytes)?,
        CopyPath::Staged => staged_copy(src.view.ptr, src_stream, dst.view.ptr, dst_stream, bytes)?,
    }
    Ok(path)
}

/// The bytes to copy, once both views and streams are checked.
fn check(
    src: &View,
    src_stream: &CudaStream,
    dst: &View,
    dst_stream: &CudaStream,
) -> Result<usize> {
    if src.strides.is_some() || dst.strides.is_some() {
        return Err(invalid!(
            "copy_across_devices copies whole contiguous buffers: the views take no strides"
        ));
    }
    if src.dtype != dst.dtype || src.len != dst.len {
        return Err(invalid!(
            "the source holds {} {} and the destination {} {}: a copy needs the same dtype and length",
            src.len,
            src.dtype,
            dst.len,
            dst.dtype
        ));
    }
    let (from, to) = (src_stream.context(), dst_stream.context());
    if from.cu_device() == to.cu_device() {
        return Err(invalid!(
            "both streams are on device {}: copy_across_devices copies between two devices",
            from.ordinal()
        ));
    }
    for (name, stream) in [("source", src_stream), ("destination", dst_stream)] {
        make_current(stream.context())?;
        if capturing(stream.cu_stream())? {
            return Err(invalid!(
                "the {name} stream is being captured into a CUDA graph: copy across devices outside the capture"
            ));
        }
    }
    let bytes = src
        .len
        .checked_mul(src.dtype.size_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| invalid!("{} elements overflow the address space", src.len))?;
    if bytes > 0 {
        for (name, view, stream) in [
            ("source", src, src_stream),
            ("destination", dst, dst_stream),
        ] {
            let want = stream.context().ordinal();
            let last = view
                .ptr
                .checked_add(bytes as u64 - 1)
                .ok_or_else(|| invalid!("the {name} runs past the address space"))?;
            // The first and the last byte: a view that runs past the memory the driver knows of
            // fails the query (one that runs into a neighbouring allocation cannot be told).
            for at in [view.ptr, last] {
                let got = device_of(at, stream)?;
                if got != want {
                    return Err(invalid!(
                        "the {name} is memory of device {got}, its stream is on device {want}"
                    ));
                }
            }
        }
    }
    Ok(bytes)
}

/// The ordinal of the device holding the byte at `ptr` (asked with `stream`'s context current).
fn device_of(ptr: u64, stream: &CudaStream) -> Result<usize> {
    make_current(stream.context())?;
    let mut ordinal: std::ffi::c_int = -1;
    // SAFETY: an out-pointer to an int, the size this attribute writes; any address may be asked
    // about (an unknown one gives an error, not a read).
    let status = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut std::ffi::c_int).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    match status {
        CUresult::CUDA_SUCCESS => Ok(ordinal.max(0) as usize),
        CUresult::CUDA_ERROR_INVALID_VALUE => Err(invalid!(
            "{ptr:#x} is not device memory this process allocated"
        )),
        other => driver(other, "asking which device holds a pointer").map(|()| 0),
    }
}

/// One `cuMemcpyPeerAsync` on the destination stream, between two event waits that order it
/// after the source stream's queued work and the source stream's later work after it.
fn peer_copy(
    src: u64,
    src_stream: &CudaStream,
    dst: u64,
    dst_stream: &CudaStream,
    bytes: usize,
) -> Result<()> {
    let (from, to) = (src_stream.context(), dst_stream.context());
    grant_access(src, from, to)?;
    dst_stream
        .join(src_stream)
        .cuda("ordering the copy after the source stream")?;
    make_current(to)?;
    // SAFETY: `check` showed `bytes` bytes of the source on its device and as many of the
    // destination on its own; the copy is queued on the destination stream after the source's
    // work (the join above).
    driver(
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                to.cu_ctx(),
                src,
                from.cu_ctx(),
                bytes,
                dst_stream.cu_stream(),
            )
        },
        "copying between devices",
    )?;
    src_stream
        .join(dst_stream)
        .cuda("ordering the source stream after the copy")
}

/// Gives `to`'s device direct access to the source memory at `src`. CUDA has two mechanisms:
/// peer access between contexts covers ordinary allocations (`cuMemAlloc`), and a memory pool's
/// own access list covers stream-ordered ones (cudarc's slices, this library's buffers), which
/// peer access does not reach. Without either, `cuMemcpyPeerAsync` still copies, staged by the
/// driver, so this decides the speed of the copy, not its result.
fn grant_access(src: u64, from: &CudaContext, to: &CudaContext) -> Result<()> {
    make_current(to)?;
    // SAFETY: two live contexts; access from the current (destination) one to the source's.
    match unsafe { sys::cuCtxEnablePeerAccess(from.cu_ctx(), 0) } {
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        other => driver(other, "enabling peer access between the devices")?,
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer of the attribute's type; `check` showed `src` is device memory.
    let status = unsafe {
        sys::cuPointerGetAttribute(
            (&mut pool as *mut sys::CUmemoryPool).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            src,
        )
    };
    match status {
        CUresult::CUDA_SUCCESS if !pool.is_null() => {}
        // Device memory (`check` asked) that no pool holds: peer access above covers it.
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(()),
        other => return driver(other, "asking which memory pool holds the source"),
    }
    let mut location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: to.cu_device(),
    };
    let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
    // SAFETY: a pool handle the driver returned, an out-pointer and a location.
    driver(
        unsafe { sys::cuMemPoolGetAccess(&mut flags, pool, &mut location) },
        "reading the source pool's access list",
    )?;
    if flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
        return Ok(());
    }
    // The whole pool becomes readable and writable from the destination device (pools grant
    // read-write or nothing), as PyTorch's allocator does for peer copies; it stays so.
    let access = sys::CUmemAccessDesc {
        location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one valid descriptor for a device other than the pool's own.
    driver(
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) },
        "giving the destination device access to the source's memory pool",
    )
}

/// Through host memory: the source downloaded on its stream and waited for, then uploaded on the
/// destination stream.
fn staged_copy(
    src: u64,
    src_stream: &CudaStream,
    dst: u64,
    dst_stream: &CudaStream,
    bytes: usize,
) -> Result<()> {
    let mut host = vec![0u8; bytes];
    make_current(src_stream.context())?;
    // SAFETY: `host` holds `bytes` bytes, as does the source (`check`); the stream is waited for
    // before `host` is read or dropped.
    driver(
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), src, bytes, src_stream.cu_stream())
        },
        "downloading the source for a staged copy",
    )?;
    src_stream
        .synchronize()
        .map_err(|source| AttentionError::Cuda {
            what: "waiting for the source of a staged copy",
            source,
        })?;
    make_current(dst_stream.context())?;
    // SAFETY: as above for the destination; from pageable memory the driver stages `host` before
    // returning, so it may be dropped after (as `DeviceArray::from_slice_on` relies on).
    driver(
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, host.as_ptr().cast(), bytes, dst_stream.cu_stream())
        },
        "uploading a staged copy",
    )
}

//! Tensors the caller owns: device memory of cudarc's slices and views (or raw device pointers)
//! seen as `[batch, seq, heads, head_dim]` with per-tensor strides, for the entry points of
//! [`crate::stream_api`].
//!
//! What is checked: each view's elements lie inside the memory it was made from; an output's rows
//! do not overlap one another; no input's memory overlaps an output's, and no two outputs overlap
//! (the byte ranges each view spans are compared, so interleaved views that never share an
//! element are refused too). What cannot be: that a raw pointer stays valid until the queued
//! work has run, and that no other stream writes the memory meanwhile (see [`TensorRef::from_raw`]).

use std::marker::PhantomData;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop};

use crate::dtype::DType;
use crate::error::{Result, invalid};

mod sealed {
    pub trait Sealed {}
}

/// An element type the kernels take, as cudarc stores it: `f32`, `half::f16`, `half::bf16`.
pub trait Element: DeviceRepr + sealed::Sealed {
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
        }
    )*};
}

element!(f32 => DType::F32, half::f16 => DType::F16, half::bf16 => DType::Bf16);

/// Element strides of a `[batch, seq, heads, head_dim]` view; `head_dim` is contiguous (stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    pub batch: usize,
    pub seq: usize,
    pub head: usize,
}

impl Strides {
    /// Contiguous `[batch, seq, heads, head_dim]`: the layout of the library's own tensors.
    pub fn bnhd(seq_len: u32, heads: u32, head_dim: u32) -> Strides {
        let (n, h, d) = (seq_len as usize, heads as usize, head_dim as usize);
        Strides {
            batch: n * h * d,
            seq: h * d,
            head: d,
        }
    }

    /// Contiguous `[batch, heads, seq, head_dim]`.
    pub fn bhnd(seq_len: u32, heads: u32, head_dim: u32) -> Strides {
        let (n, h, d) = (seq_len as usize, heads as usize, head_dim as usize);
        Strides {
            batch: h * n * d,
            seq: d,
            head: n * d,
        }
    }

    /// One of Q, K, V inside a fused projection `[batch, seq, 3, heads, head_dim]`: the views
    /// start `0`, `heads·head_dim` and `2·heads·head_dim` elements into it.
    pub fn fused_qkv(seq_len: u32, heads: u32, head_dim: u32) -> Strides {
        let (n, h, d) = (seq_len as usize, heads as usize, head_dim as usize);
        Strides {
            batch: n * 3 * h * d,
            seq: 3 * h * d,
            head: d,
        }
    }
}

/// The extents of a `[batch, seq, heads, head_dim]` view (the shape's, for one tensor's role).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dims {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl Dims {
    pub fn elems(&self) -> usize {
        self.batch * self.seq * self.heads * self.head_dim
    }
}

/// A device view: address, elements reachable from it, dtype, and strides (`None`: contiguous in
/// the role's layout, or a flat f32 array such as LSE).
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub ptr: CUdeviceptr,
    pub len: usize,
    pub dtype: DType,
    pub strides: Option<Strides>,
}

impl View {
    /// The strides the view is read with for `dims`.
    pub fn strides_for(&self, dims: &Dims) -> Strides {
        self.strides.unwrap_or(View::contiguous(dims))
    }

    /// Whether kernels read and write the view in place for `dims`: at a 16-byte aligned
    /// address (the kernels' loads and stores are 16-byte chunks), and, for kernels that take
    /// strides (`strided`), with every stride over an extent above 1 a whole number of 16-byte
    /// chunks (8 elements of f16 or bf16), else in the contiguous layout. Any other view goes
    /// through a staging copy.
    pub fn in_place(&self, dims: &Dims, strided: bool) -> bool {
        if !self.ptr.is_multiple_of(16) {
            return false;
        }
        let s = self.strides_for(dims);
        if !strided {
            return s == View::contiguous(dims);
        }
        let es = self.dtype.size_bytes();
        [
            (s.batch, dims.batch),
            (s.seq, dims.seq),
            (s.head, dims.heads),
        ]
        .into_iter()
        .all(|(stride, extent)| extent <= 1 || stride.checked_mul(es).is_some_and(|b| b % 16 == 0))
            && (dims.head_dim * es).is_multiple_of(16)
    }

    fn contiguous(dims: &Dims) -> Strides {
        Strides {
            batch: dims.seq * dims.heads * dims.head_dim,
            seq: dims.heads * dims.head_dim,
            head: dims.head_dim,
        }
    }

    /// Bytes from the view's address to one past its last element for `dims` (0 when empty).
    pub fn span_bytes(&self, dims: &Dims) -> Result<usize> {
        let s = self.strides_for(dims);
        if dims.elems() == 0 {
            return Ok(0);
        }
        let last = [
            (dims.batch - 1).checked_mul(s.batch),
            (dims.seq - 1).checked_mul(s.seq),
            (dims.heads - 1).checked_mul(s.head),
            Some(dims.head_dim),
        ]
        .into_iter()
        .try_fold(0usize, |acc, x| acc.checked_add(x?));
        last.and_then(|e| e.checked_mul(self.dtype.size_bytes()))
            .ok_or_else(|| invalid!("the view's strides {s:?} overflow the address space"))
    }

    /// Checks the view as tensor `name` of `dims` and `dtype`: its elements lie inside its
    /// memory, and, for an output, no two of its rows (`head_dim` elements each) overlap.
    pub fn check(&self, name: &str, dims: &Dims, dtype: DType, output: bool) -> Result<()> {
        if self.dtype != dtype {
            return Err(invalid!("{name} is {} but the call is {dtype}", self.dtype));
        }
        let s = self.strides_for(dims);
        let span = self.span_bytes(dims)?;
        let bytes = self.len.checked_mul(dtype.size_bytes());
        if bytes.is_none_or(|b| span > b) {
            return Err(invalid!(
                "{name} with strides {s:?} over {dims:?} reaches {span} bytes, its memory holds {} elements",
                self.len
            ));
        }
        if output && !rows_disjoint(dims, &s) {
            return Err(invalid!(
                "{name} with strides {s:?} over {dims:?} has rows that overlap: an output's rows must be disjoint"
            ));
        }
        Ok(())
    }

    /// The device byte range the view spans for `dims`.
    pub fn range(&self, dims: &Dims) -> Result<(u64, u64)> {
        let span = self.span_bytes(dims)? as u64;
        let end = self
            .ptr
            .checked_add(span)
            .ok_or_else(|| invalid!("a view at {:#x} overflows the address space", self.ptr))?;
        Ok((self.ptr, end))
    }
}

/// Whether rows `(b, n, h)` of `head_dim` contiguous elements never share an element.
fn rows_disjoint(dims: &Dims, s: &Strides) -> bool {
    axes_disjoint(
        dims.head_dim,
        [
            (s.head, dims.heads),
            (s.seq, dims.seq),
            (s.batch, dims.batch),
        ],
    )
}

/// Whether the rows of `row` contiguous elements at every combination of `axes` (stride, extent)
/// are disjoint: sorted by stride, each extent-1 axis is skipped and each other stride must
/// clear everything the smaller ones span.
fn axes_disjoint<const N: usize>(row: usize, mut axes: [(usize, usize); N]) -> bool {
    axes.sort_unstable();
    let mut span = row;
    for (stride, extent) in axes {
        if extent <= 1 {
            continue;
        }
        if stride < span {
            return false;
        }
        // Saturating: a span past the address space is refused by `View::check` anyway.
        span = span.saturating_add(stride.saturating_mul(extent - 1));
    }
    true
}

/// A view of the call as [`check_aliasing`] sees it: its name, the view, and its extents.
pub(crate) type Named<'v> = (&'static str, &'v View, Dims);

/// Whether two views share no element. Views whose byte ranges are apart are disjoint; views of
/// one dtype, extents and strides at an element-multiple distance (Q, K, V of a fused projection,
/// or their gradients) are when their rows together are (the distance as one more axis of
/// extent 2); any other overlapping ranges count as aliasing.
fn views_disjoint(a: &Named, b: &Named) -> Result<bool> {
    let (ra, rb) = (a.1.range(&a.2)?, b.1.range(&b.2)?);
    if ra.0 >= ra.1 || rb.0 >= rb.1 || ra.1 <= rb.0 || rb.1 <= ra.0 {
        return Ok(true);
    }
    let (sa, sb) = (a.1.strides_for(&a.2), b.1.strides_for(&b.2));
    let es = a.1.dtype.size_bytes() as u64;
    let distance = ra.0.abs_diff(rb.0);
    if a.1.dtype != b.1.dtype || a.2 != b.2 || sa != sb || distance % es != 0 {
        return Ok(false);
    }
    let d = &a.2;
    Ok(axes_disjoint(
        d.head_dim,
        [
            (sa.head, d.heads),
            (sa.seq, d.seq),
            (sa.batch, d.batch),
            ((distance / es) as usize, 2),
        ],
    ))
}

/// Refuses the call when an output shares memory with an input or with another output.
pub(crate) fn check_aliasing(inputs: &[Named], outputs: &[Named]) -> Result<()> {
    for (i, out) in outputs.iter().enumerate() {
        for other in inputs.iter().chain(&outputs[..i]) {
            if !views_disjoint(out, other)? {
                return Err(invalid!(
                    "{} and {} overlap in device memory: an output may not alias another tensor of the call",
                    other.0,
                    out.0
                ));
            }
        }
    }
    Ok(())
}

/// A tensor the call reads, in memory the caller owns, borrowed for `'a`.
pub struct TensorRef<'a> {
    pub(crate) view: View,
    /// cudarc's record of the read, made on the call's stream when the view is dropped (after the
    /// call queued its kernels), so cudarc orders later writes of the slice after them.
    _read: Option<SyncOnDrop<'a>>,
    _life: PhantomData<&'a ()>,
}

/// A tensor the call writes, in memory the caller owns, borrowed mutably for `'a`.
pub struct TensorMut<'a> {
    pub(crate) view: View,
    _write: Option<SyncOnDrop<'a>>,
    _life: PhantomData<&'a mut ()>,
}

impl<'a> TensorRef<'a> {
    /// A cudarc `CudaSlice` or `CudaView` read on `stream` (which waits for cudarc's recorded
    /// writes of it), contiguous in its role's layout until [`TensorRef::strided`].
    pub fn new<T: Element>(slice: &'a impl DevicePtr<T>, stream: &'a CudaStream) -> TensorRef<'a> {
        let (ptr, read) = slice.device_ptr(stream);
        TensorRef {
            view: View {
                ptr,
                len: slice.len(),
                dtype: T::DTYPE,
                strides: None,
            },
            _read: Some(read),
            _life: PhantomData,
        }
    }

    /// `len` elements of `dtype` at `ptr`.
    ///
    /// # Safety
    /// `ptr` is a device address in the context of the `Gpu` the view is passed with, holding
    /// `len` elements of `dtype`, that stays allocated until the work the call queues has run
    /// (not merely until the call returns), and that no other stream writes until then unless
    /// ordered with the call's stream by the caller.
    pub unsafe fn from_raw(ptr: CUdeviceptr, len: usize, dtype: DType) -> TensorRef<'static> {
        TensorRef {
            view: View {
                ptr,
                len,
                dtype,
                strides: None,
            },
            _read: None,
            _life: PhantomData,
        }
    }

    /// The view read with `strides` instead of its role's contiguous layout.
    pub fn strided(mut self, strides: Strides) -> TensorRef<'a> {
        self.view.strides = Some(strides);
        self
    }
}

impl<'a> TensorMut<'a> {
    /// A cudarc `CudaSlice` or `CudaViewMut` written on `stream`, contiguous in its role's layout
    /// until [`TensorMut::strided`].
    pub fn new<T: Element>(
        slice: &'a mut impl DevicePtrMut<T>,
        stream: &'a CudaStream,
    ) -> TensorMut<'a> {
        let len = slice.len();
        let (ptr, write) = slice.device_ptr_mut(stream);
        TensorMut {
            view: View {
                ptr,
                len,
                dtype: T::DTYPE,
                strides: None,
            },
            _write: Some(write),
            _life: PhantomData,
        }
    }

    /// `len` elements of `dtype` at `ptr`, written by the call.
    ///
    /// # Safety
    /// As [`TensorRef::from_raw`]; besides, nothing else reads or writes the memory until the
    /// call's work has run.
    pub unsafe fn from_raw(ptr: CUdeviceptr, len: usize, dtype: DType) -> TensorMut<'static> {
        TensorMut {
            view: View {
                ptr,
                len,
                dtype,
                strides: None,
            },
            _write: None,
            _life: PhantomData,
        }
    }

    /// The view written with `strides` instead of its role's contiguous layout.
    pub fn strided(mut self, strides: Strides) -> TensorMut<'a> {
        self.view.strides = Some(strides);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Dims {
        Dims {
            batch,
            seq,
            heads,
            head_dim,
        }
    }

    fn view(ptr: u64, len: usize, strides: Option<Strides>) -> View {
        View {
            ptr,
            len,
            dtype: DType::F16,
            strides,
        }
    }

    #[test]
    fn layouts_are_disjoint_and_fit_their_memory() {
        let d = dims(2, 5, 3, 64);
        for s in [
            Strides::bnhd(5, 3, 64),
            Strides::bhnd(5, 3, 64),
            Strides::fused_qkv(5, 3, 64),
        ] {
            assert!(rows_disjoint(&d, &s), "{s:?}");
        }
        let fused = 2 * 5 * 3 * 3 * 64;
        // V, the last view of the fused projection, ends exactly at its end.
        let v = view(
            2 * 3 * 64 * 2,
            fused - 2 * 3 * 64,
            Some(Strides::fused_qkv(5, 3, 64)),
        );
        v.check("v", &d, DType::F16, true).unwrap();
    }

    #[test]
    fn aligned_views_run_in_place_where_the_kernels_take_strides() {
        let d = dims(2, 5, 3, 64);
        let n = 3 * d.elems();
        let bhnd = view(0, n, Some(Strides::bhnd(5, 3, 64)));
        // K of a fused projection: 3·64 elements = 384 bytes in.
        let fused = view(384, n, Some(Strides::fused_qkv(5, 3, 64)));
        let contiguous = view(0, n, None);
        for v in [&bhnd, &fused, &contiguous] {
            assert!(v.in_place(&d, true), "{v:?}");
        }
        // Kernels without strides: the contiguous layout only.
        assert!(contiguous.in_place(&d, false));
        assert!(!bhnd.in_place(&d, false));
        assert!(!fused.in_place(&d, false));
        // 8 bytes is not 16-byte aligned: staged for every family.
        for strided in [true, false] {
            assert!(!view(8, n, None).in_place(&d, strided));
        }
        // A sequence stride of 68 elements (136 bytes) splits 16-byte chunks: staged.
        let odd = Strides {
            batch: 344,
            seq: 68,
            head: 0,
        };
        let d1 = dims(2, 5, 1, 64);
        assert!(!view(0, n, Some(odd)).in_place(&d1, true));
        // ... unless that axis has extent 1 (its stride is never applied).
        let one_row = dims(2, 1, 1, 64);
        assert!(view(0, n, Some(odd)).in_place(&one_row, true));
        // A head dim of 4 f16 (8 bytes) is not a whole chunk.
        let narrow = dims(1, 2, 1, 4);
        assert!(!view(0, 8, Some(Strides::bnhd(2, 1, 8))).in_place(&narrow, true));
    }

    #[test]
    fn a_view_past_its_memory_is_refused() {
        let d = dims(2, 5, 3, 64);
        let e = view(0, d.elems() - 1, None)
            .check("q", &d, DType::F16, false)
            .unwrap_err();
        assert!(e.to_string().contains("memory holds"), "{e}");
        let fused = view(0, d.elems(), Some(Strides::fused_qkv(5, 3, 64)));
        assert!(fused.check("q", &d, DType::F16, false).is_err());
    }

    #[test]
    fn overlapping_output_rows_are_refused_inputs_may_overlap() {
        let d = dims(1, 4, 2, 64);
        // Sequence stride of one head: rows of different heads share elements.
        let s = Strides {
            batch: 4 * 64,
            seq: 64,
            head: 32,
        };
        let v = view(0, 1 << 20, Some(s));
        let e = v.check("o", &d, DType::F16, true).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        v.check("q", &d, DType::F16, false).unwrap();
        // Broadcast over the batch (stride 0) is fine to read, not to write.
        let d = dims(2, 4, 2, 64);
        let b = view(
            0,
            1 << 20,
            Some(Strides {
                batch: 0,
                ..Strides::bnhd(4, 2, 64)
            }),
        );
        b.check("k", &d, DType::F16, false).unwrap();
        assert!(b.check("dk", &d, DType::F16, true).is_err());
    }

    #[test]
    fn wrong_dtype_is_refused() {
        let d = dims(1, 4, 2, 64);
        assert!(
            view(0, d.elems(), None)
                .check("q", &d, DType::Bf16, false)
                .is_err()
        );
    }

    #[test]
    fn aliasing_outputs_are_refused() {
        let d = dims(2, 5, 3, 64);
        let n = d.elems();
        let (q, o) = (view(0, n, None), view(2 * n as u64 + 64, n, None));
        check_aliasing(&[("q", &q, d)], &[("o", &o, d)]).unwrap();
        // O starting inside Q's last row.
        let o = view(2 * n as u64 - 2, n, None);
        let e = check_aliasing(&[("q", &q, d)], &[("o", &o, d)]).unwrap_err();
        assert!(e.to_string().contains("q and o overlap"), "{e}");
        // Touching ranges do not overlap.
        let o = view(2 * n as u64, n, None);
        check_aliasing(&[("q", &q, d)], &[("o", &o, d)]).unwrap();
        // Two outputs in one buffer.
        assert!(check_aliasing(&[], &[("dk", &q, d), ("dv", &q, d)]).is_err());
    }

    #[test]
    fn views_of_one_fused_projection_do_not_alias() {
        let d = dims(2, 5, 3, 64);
        let s = Strides::fused_qkv(5, 3, 64);
        let row = 3 * 64 * 2;
        let fused = 3 * d.elems();
        let at = |i: usize| view((i * row) as u64, fused - i * 3 * 64, Some(s));
        let (dq, dk, dv) = (at(0), at(1), at(2));
        check_aliasing(&[], &[("dq", &dq, d), ("dk", &dk, d), ("dv", &dv, d)]).unwrap();
        // Q of the same projection as an input and dQ written over it: refused.
        let q = at(0);
        assert!(check_aliasing(&[("q", &q, d)], &[("dq", &dq, d)]).is_err());
        // Half a head apart: rows share elements.
        let half = view(64, fused, Some(s));
        assert!(check_aliasing(&[("q", &q, d)], &[("o", &half, d)]).is_err());
        // [B, H, N, d] interleaved with [B, N, H, d] in one buffer: different strides, refused.
        let t = view(0, fused, Some(Strides::bhnd(5, 3, 64)));
        assert!(check_aliasing(&[("k", &t, d)], &[("o", &dq, d)]).is_err());
    }

    #[test]
    fn huge_strides_are_refused_not_wrapped() {
        let d = dims(2, 2, 1, 64);
        let v = view(
            0,
            usize::MAX,
            Some(Strides {
                batch: usize::MAX / 2,
                seq: 64,
                head: 64,
            }),
        );
        assert!(v.check("q", &d, DType::F16, false).is_err());
        // A span past 2^32 elements that its memory holds: accepted, in place (the kernels'
        // offsets are 64-bit).
        let far = Strides {
            batch: 1 << 33,
            seq: 64,
            head: 64,
        };
        let v = view(1 << 20, (1 << 33) + 2 * 64, Some(far));
        v.check("q", &d, DType::F16, false).unwrap();
        assert_eq!(v.span_bytes(&d).unwrap(), ((1usize << 33) + 2 * 64) * 2);
        assert!(v.in_place(&d, true));
    }
}

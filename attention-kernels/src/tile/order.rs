//! Program order for accumulators. `mma.sync` is a pure instruction to the compiler, `ldmatrix`
//! one with effects: left alone, LLVM issues every `ldmatrix` of an unrolled product first and
//! the `mma.sync` after, holding all B fragments at once (160 registers for one `K·Qᵀ` at
//! d = 128). Pinning the accumulators after each k-step keeps loads and products interleaved;
//! `ptxas` still schedules the result freely.

use core::arch::asm;

use super::mma::FragC;

impl FragC {
    /// The values must exist here: later instructions with effects (the next loads) cannot move
    /// above the products that made them. Emits only a PTX comment.
    #[inline(always)]
    pub fn pin(&mut self) {
        let c = &mut self.0;
        // SAFETY: a PTX comment; the operands only order the surrounding code.
        unsafe {
            asm!("// pin {0} {1} {2} {3}", inout(reg32) c[0], inout(reg32) c[1], inout(reg32) c[2], inout(reg32) c[3],
                 options(nomem, nostack));
        }
    }
}

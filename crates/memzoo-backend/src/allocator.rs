//! Keeping freed tensor memory in the process (glibc's malloc).
//!
//! Training allocates and frees the same large buffers (activations, gradients, attention
//! scores of several MB) every step. glibc's defaults hand them back to the kernel and fault
//! them in again: buffers above a threshold that adapts up to 32 MiB are `mmap`ed and
//! `munmap`ed each time, and the heaps are trimmed whenever 2 x that threshold sits free at their
//! top. Every fresh page then costs a page fault and zeroing, and every unmap a TLB shootdown
//! on the other cores. On the 2-core reference machine that was 20 s of kernel time in a 58 s
//! Reformer-small benchmark (4,096 tokens per step), and with the fix below the step ran 1.4x
//! faster; XL-small and Memorizing-small gained 5-15% (`cargo xtask bench`, README).
//!
//! [`tune_allocator`] fixes the `mmap` threshold at its maximum (32 MiB) and turns trimming
//! off, so freed buffers are reused from the heap. The process's resident memory then stays at
//! its peak instead of breathing, which is what a training run reaches every step anyway.
//!
//! Buffers above the largest threshold (32 MiB: a Reformer step over 64K tokens holds many of
//! 64 MB and more) would still be mapped and unmapped per use, so `mmap` is turned off for
//! allocations altogether (`M_MMAP_MAX = 0`): they come from the heap and are reused too (a
//! thread's arena that cannot hold one hands it to the main heap; glibc still maps memory when
//! the heap cannot grow). Measured on the 2-core machine, quiet: one Reformer-small step over
//! 65,536 tokens took 122 s with 57 s in the kernel before, 80 s with 3 s after, at the same
//! peak memory (2.56 / 2.63 GB).

/// Tunes glibc's malloc for training (see the module docs): no `mmap` for allocations (the
/// threshold at 32 MiB for any that still are), no trimming, 64 MiB of padding per heap
/// extension. memzoo's binaries (the CLI, the examples,
/// `cargo xtask bench`) call it first thing; a program using memzoo as a library may too.
///
/// Does nothing when the environment already sets `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_` or `GLIBC_TUNABLES` (the
/// user's choice wins),
/// when `MEMZOO_MALLOC=default`, or on a C library other than glibc. Returns whether it
/// changed anything.
pub fn tune_allocator() -> bool {
    let user_set = [
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_TOP_PAD_",
        "MALLOC_MMAP_MAX_",
        "GLIBC_TUNABLES",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    let opted_out = std::env::var("MEMZOO_MALLOC").is_ok_and(|v| v.trim() == "default");
    if user_set || opted_out {
        return false;
    }
    tune_glibc()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_glibc() -> bool {
    const MIB: libc::c_int = 1024 * 1024;
    // SAFETY: mallopt only changes malloc's parameters; it is thread-safe (it takes the arena
    // locks) and every value is within the documented range.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 * MIB) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) == 1
            && libc::mallopt(libc::M_TOP_PAD, 64 * MIB) == 1
            && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_glibc() -> bool {
    false
}

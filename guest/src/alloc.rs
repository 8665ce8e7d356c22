//! The guest's global allocator: a counting bump allocator.
//!
//! Why not dlmalloc (Rust's default on wasm32): every call of the component
//! allocates a handful of short-lived blocks (its argument, the parsed
//! items, the output) and frees them all before the next call. A bump
//! pointer hands them out in a few instructions and a count of live blocks
//! tells when the whole heap is free again, at which point the pointer goes
//! back to the start. dlmalloc's bins, headers and coalescing cost ~25 % of
//! a single check's guest time for a property this workload never needs.
//!
//! Bounds: within one call, memory only grows (a freed block is reused only
//! if it was the last one handed out, and `realloc` of the last block grows
//! in place), so a call's peak is at most the sum of its allocations, which
//! every guest function keeps linear in its input; the runtime's memory
//! limit refuses the rest (an allocation that cannot grow memory returns
//! null, which Rust turns into a trap the host reports). Between calls
//! nothing is live (wit-bindgen frees the argument, the post-return frees
//! the result) and the heap is empty again.
//!
//! The component is single-threaded (one store, one call at a time), which
//! is what makes the unsynchronised state below sound.

use core::alloc::{GlobalAlloc, Layout};
use core::arch::wasm32;
use core::cell::UnsafeCell;
use core::ptr::null_mut;

const PAGE: usize = 65_536;

struct Heap {
    /// Where the heap starts: the end of linear memory when it was first
    /// used, so nothing the linker placed (data, stack) is ever handed out.
    start: usize,
    /// The next free byte.
    next: usize,
    /// The end of linear memory as far as the heap knows.
    end: usize,
    /// Blocks handed out and not yet freed.
    live: usize,
}

struct Bump(UnsafeCell<Heap>);

// SAFETY: wasm32 without the threads proposal: one thread, and a component
// instance is never re-entered.
unsafe impl Sync for Bump {}

#[global_allocator]
static HEAP: Bump = Bump(UnsafeCell::new(Heap {
    start: 0,
    next: 0,
    end: 0,
    live: 0,
}));

impl Heap {
    /// `[at, at + size)` aligned to `align`, growing memory if needed.
    fn take(&mut self, size: usize, align: usize) -> Option<usize> {
        if self.end == 0 {
            let end = wasm32::memory_size::<0>().checked_mul(PAGE)?;
            (self.start, self.next, self.end) = (end, end, end);
        }
        let at = self.next.checked_add(align.checked_sub(1)?)? & !(align.checked_sub(1)?);
        let to = at.checked_add(size)?;
        self.reach(to)?;
        self.next = to;
        Some(at)
    }

    /// Make `[.., to)` part of linear memory.
    fn reach(&mut self, to: usize) -> Option<()> {
        if to > self.end {
            let pages = to.checked_sub(self.end)?.div_ceil(PAGE);
            if wasm32::memory_grow::<0>(pages) == usize::MAX {
                return None;
            }
            self.end = self.end.checked_add(pages.checked_mul(PAGE)?)?;
        }
        Some(())
    }
}

// SAFETY: every block is inside linear memory the heap grew for it, aligned
// as asked, and never handed out twice while live: `next` only moves back
// over a block being freed (the last one) or when no block is live.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: single-threaded (see `Sync` above), and no reference to
        // the heap outlives this call.
        let heap = unsafe { &mut *self.0.get() };
        match heap.take(layout.size(), layout.align()) {
            Some(at) => {
                heap.live = heap.live.wrapping_add(1);
                at as *mut u8
            }
            None => null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as in `alloc`.
        let heap = unsafe { &mut *self.0.get() };
        heap.live = heap.live.saturating_sub(1);
        if heap.live == 0 {
            heap.next = heap.start;
        } else if (ptr as usize).wrapping_add(layout.size()) == heap.next {
            heap.next = ptr as usize;
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let heap = unsafe { &mut *self.0.get() };
        let at = ptr as usize;
        // The last block grows or shrinks in place: a Vec being filled (the
        // output) never copies itself.
        if at.wrapping_add(layout.size()) == heap.next {
            let Some(to) = at.checked_add(new_size) else {
                return null_mut();
            };
            if heap.reach(to).is_none() {
                return null_mut();
            }
            heap.next = to;
            return ptr;
        }
        // SAFETY: `layout`'s alignment with the new size is valid (the
        // caller guarantees `new_size` does not overflow when aligned).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as in `alloc`.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe { core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated here with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

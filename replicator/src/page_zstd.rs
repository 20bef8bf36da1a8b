//! zstd for a record's page images: one frame per record, compressed and
//! decompressed with contexts kept per thread (a context costs more to
//! make than a page costs to compress). The layout around the frame is
//! `record`'s; this module only turns bytes into a frame and back.

use std::cell::RefCell;

/// zstd's fast level -1: on a 4 KiB leaf page of random 100-byte values,
/// about 3.5 us to compress to 0.51x here, against 11 us at level 1 for
/// the same size (a throwaway measurement, papers/performance-log.md).
const LEVEL: i32 = -1;

/// Scratch kept between records up to this size; a larger one (a big
/// transaction's chunk) is freed after use.
const KEEP_SCRATCH_BYTES: usize = 1 << 20;

thread_local! {
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One frame of `images` concatenated, if it is at most `max_bytes` long
/// (`None` when it is not, or when zstd fails: the caller stores the
/// images as they are, which is always valid).
pub(crate) fn compress<'a>(
    images: impl Iterator<Item = &'a [u8]>,
    raw_bytes: usize,
    max_bytes: usize,
) -> Option<Vec<u8>> {
    SCRATCH.with(|scratch| {
        let mut raw = scratch.borrow_mut();
        raw.clear();
        raw.reserve(raw_bytes);
        images.for_each(|image| raw.extend_from_slice(image));
        debug_assert_eq!(raw.len(), raw_bytes);
        let frame = COMPRESSOR.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                *c = zstd::bulk::Compressor::new(LEVEL).ok();
            }
            let mut out = Vec::with_capacity(max_bytes);
            // Fails when the frame would not fit `max_bytes`.
            c.as_mut()?.compress_to_buffer(&raw[..], &mut out).ok()?;
            Some(out)
        });
        if raw.capacity() > KEEP_SCRATCH_BYTES {
            *raw = Vec::new();
        }
        frame
    })
}

/// Whether `frame` is exactly one zstd frame that states `content_bytes`
/// of content: read from its headers alone, without decompressing.
pub(crate) fn frame_states(frame: &[u8], content_bytes: u64) -> bool {
    zstd::zstd_safe::find_frame_compressed_size(frame).is_ok_and(|n| n == frame.len())
        && matches!(
            zstd::zstd_safe::get_frame_content_size(frame),
            Ok(Some(n)) if n == content_bytes
        )
}

/// The content of `frame`, which must be exactly `content_bytes` long: the
/// buffer is allocated at that size (which the caller bounded) and never
/// grows.
pub(crate) fn decompress(frame: &[u8], content_bytes: usize) -> Option<Vec<u8>> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = zstd::bulk::Decompressor::new().ok();
        }
        let mut out = Vec::with_capacity(content_bytes);
        let n = d.as_mut()?.decompress_to_buffer(frame, &mut out).ok()?;
        (n == content_bytes && out.len() == content_bytes).then_some(out)
    })
}

//! The WAL cut back to the persisted watermark on open, before SQLite
//! reads it (the crash-safety rule in the parent module).

use super::{ReplicaOpenError, io_err, salt_bytes};
use crate::page_set::FrameNo;
use crate::wal_format::{FrameHeader, WAL_HEADER_BYTES, WalHeader, frame_bytes, frame_offset};
use crate::watermark::Watermark;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Cuts the WAL back to the watermark before SQLite reads it. Returns the
/// WAL header kept, if the watermark names frames of its generation.
pub(super) fn cut_wal(
    db: &Path,
    wal_path: &Path,
    mark: &Watermark,
) -> Result<Option<WalHeader>, ReplicaOpenError> {
    let corrupt = |reason: String| ReplicaOpenError::Corrupt {
        path: db.to_path_buf(),
        reason,
    };
    let f = match OpenOptions::new().read(true).write(true).open(wal_path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if mark.frame > 0 {
                return Err(corrupt(
                    "the WAL holding confirmed frames is missing".into(),
                ));
            }
            return Ok(None);
        }
        Err(e) => {
            return Err(ReplicaOpenError::Io {
                path: wal_path.to_path_buf(),
                source: e,
            });
        }
    };
    if mark.frame == 0 {
        // Nothing confirmed in this generation: all of it is unconfirmed or
        // already backfilled into the database file.
        f.set_len(0).map_err(io_err(wal_path))?;
        return Ok(None);
    }
    let mut hb = [0u8; WAL_HEADER_BYTES];
    f.read_exact_at(&mut hb, 0)
        .map_err(|_| corrupt("the WAL header is missing".into()))?;
    let h = WalHeader::decode(&hb).map_err(|e| corrupt(format!("WAL header: {e}")))?;
    if salt_bytes(&h) != mark.salt || h.page_size != mark.page_size {
        return Err(corrupt(
            "the WAL is not the generation the watermark names".into(),
        ));
    }
    let end = frame_offset(h.page_size, FrameNo::new(mark.frame)) + frame_bytes(h.page_size);
    let len = f.metadata().map_err(io_err(wal_path))?.len();
    if len < end {
        return Err(corrupt(format!(
            "the WAL ends at {len} bytes, before confirmed frame {}",
            mark.frame
        )));
    }
    let mut fh = [0u8; 24];
    f.read_exact_at(&mut fh, frame_offset(h.page_size, FrameNo::new(mark.frame)))
        .map_err(io_err(wal_path))?;
    let frame = FrameHeader::decode(&fh);
    if frame.checksum != mark.checksum || !frame.is_commit() {
        return Err(corrupt(format!(
            "frame {} is not the confirmed commit frame",
            mark.frame
        )));
    }
    f.set_len(end).map_err(io_err(wal_path))?;
    f.sync_all().map_err(io_err(wal_path))?;
    Ok(Some(h))
}

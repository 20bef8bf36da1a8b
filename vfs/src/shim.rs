//! The raw `sqlite3_vfs` / `sqlite3_io_methods` (version 3) wrapper around
//! SQLite's `unix-excl` VFS.
//!
//! `unix-excl` is `unix` for a process that owns its databases: the first
//! lock on a database takes one exclusive POSIX lock on it for the
//! process, after which the locks between the process's own connections,
//! the wal-index's included, are kept in memory (no `fcntl` per lock) and
//! the wal-index lives in heap memory, shared by those connections,
//! instead of a `-shm` file. Another process that opens the database
//! gets `SQLITE_BUSY`: an `sqlite3` shell cannot read a running node's
//! files, and in particular cannot read a replica's WAL past its
//! watermark or checkpoint it. (A walrelay process is refused earlier,
//! by [`crate::owner_lock`].) The wal-index is rebuilt from the WAL at
//! every open, as after a crash.
//!
//! Every method is forwarded to the real file, so locks, the wal-index
//! and `xFetch` memory mapping behave exactly as in `unix-excl`. Only
//! these are intercepted:
//!
//! | method | file | why |
//! |---|---|---|
//! | `xOpen` | main db | refuse databases not attached; force `PERSIST_WAL` |
//! | `xOpen` | rollback journal | refused: a WAL database never has one |
//! | `xWrite`, `xTruncate` | WAL | shadow every byte into the capture; refuse writes outside a hold; keep a run of frames back and write it as one (`write_behind`) |
//! | `xRead`, `xSync`, `xFileSize` | WAL | write the frames kept back first, when they are needed |
//! | `xWrite`, `xTruncate` | main db | only a checkpoint (CKPT lock held) may write: anything else bypasses the WAL |
//! | `xShmLock` | main db | WAL write lock taken → begin hold; released → capture, sink, then release |
//! | `xFileControl` | main db | `PRAGMA` policy; keep `PERSIST_WAL` on |
//!
//! No panic crosses the boundary: every entry point runs under
//! `catch_unwind` and turns a panic into an SQLite error code.

use crate::attach::DbShared;
use crate::attach::lookup;
use crate::capture::{Capture, CaptureError};
use crate::write_behind::Route;
// Lock indexes of `xShmLock` (not byte offsets), as in wal.c.
use crate::wal_index::{WAL_CKPT_LOCK, WAL_WRITE_LOCK};
use libsqlite3_sys as ffi;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;
use std::sync::OnceLock;

/// The name the VFS registers under.
pub const VFS_NAME: &str = "walrelay";
const VFS_NAME_C: &CStr = c"walrelay";

enum Kind {
    MainDb(Arc<DbShared>),
    Wal(Arc<DbShared>),
    Other,
}

/// Our file object. SQLite allocates `szOsFile` bytes and treats the first
/// field as a `sqlite3_file`; the real unix file lives right after this
/// header in the same allocation.
#[repr(C)]
struct WrFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    kind: Kind,
    /// Bit i set: this handle holds shm lock i exclusively.
    exclusive_locks: u8,
}

const HEADER_BYTES: usize = std::mem::size_of::<WrFile>().next_multiple_of(16);

struct Registered(*mut ffi::sqlite3_vfs);
// SAFETY: the pointer is to a leaked, never-freed sqlite3_vfs that SQLite
// owns after registration; we only read it.
unsafe impl Send for Registered {}
// SAFETY: as above, shared read-only access to a 'static value.
unsafe impl Sync for Registered {}

static VFS: OnceLock<Result<Registered, c_int>> = OnceLock::new();

/// Error from [`crate::register`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("registering the walrelay VFS failed with SQLite code {0}")]
pub struct RegisterError(c_int);

impl RegisterError {
    pub fn code(&self) -> i32 {
        self.0
    }
}

/// Registers the walrelay VFS (not as the default). Idempotent.
pub fn register() -> Result<(), RegisterError> {
    match VFS.get_or_init(register_once) {
        Ok(_) => Ok(()),
        Err(rc) => Err(RegisterError(*rc)),
    }
}

fn register_once() -> Result<Registered, c_int> {
    // SAFETY: sqlite3_initialize is safe to call any number of times.
    let rc = unsafe { ffi::sqlite3_initialize() };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    // SAFETY: looking up a VFS by a valid NUL-terminated name.
    let real = unsafe { ffi::sqlite3_vfs_find(c"unix-excl".as_ptr()) };
    if real.is_null() {
        return Err(ffi::SQLITE_ERROR);
    }
    // SAFETY: `real` is the registered unix-excl VFS, valid for the process.
    let r = unsafe { &*real };
    let vfs = Box::new(ffi::sqlite3_vfs {
        iVersion: r.iVersion.min(3),
        szOsFile: (HEADER_BYTES + r.szOsFile as usize) as c_int,
        mxPathname: r.mxPathname,
        pNext: ptr::null_mut(),
        zName: VFS_NAME_C.as_ptr(),
        pAppData: real.cast(),
        xOpen: Some(x_open),
        xDelete: Some(x_delete),
        xAccess: Some(x_access),
        xFullPathname: Some(x_full_pathname),
        xDlOpen: r.xDlOpen.map(|_| x_dl_open as _),
        xDlError: r.xDlError.map(|_| x_dl_error as _),
        xDlSym: r.xDlSym.map(|_| x_dl_sym as _),
        xDlClose: r.xDlClose.map(|_| x_dl_close as _),
        xRandomness: Some(x_randomness),
        xSleep: Some(x_sleep),
        xCurrentTime: Some(x_current_time),
        xGetLastError: Some(x_get_last_error),
        xCurrentTimeInt64: Some(x_current_time_int64),
        xSetSystemCall: None,
        xGetSystemCall: None,
        xNextSystemCall: None,
    });
    let p = Box::into_raw(vfs);
    // SAFETY: `p` is a valid, leaked sqlite3_vfs that lives for the process,
    // as SQLite requires of registered VFSes.
    let rc = unsafe { ffi::sqlite3_vfs_register(p, 0) };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    Ok(Registered(p))
}

fn real_vfs() -> Option<*mut ffi::sqlite3_vfs> {
    match VFS.get() {
        // SAFETY: the registered VFS is valid for the process; pAppData was
        // set to the unix VFS at registration.
        Some(Ok(Registered(p))) => Some(unsafe { (**p).pAppData.cast() }),
        _ => None,
    }
}

/// The absolute path SQLite will use for `path` (the unix VFS's
/// xFullPathname): the key under which a database is attached.
pub(crate) fn full_pathname(path: &std::path::Path) -> Result<String, String> {
    let real = real_vfs().ok_or("walrelay VFS not registered")?;
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "path contains a NUL byte".to_string())?;
    // SAFETY: `real` is valid; mxPathname bounds the output buffer we pass.
    unsafe {
        let n = (*real).mxPathname.max(512) as usize + 1;
        let mut out = vec![0 as c_char; n];
        let f = (*real)
            .xFullPathname
            .ok_or("unix VFS lacks xFullPathname")?;
        let rc = f(real, c.as_ptr(), n as c_int, out.as_mut_ptr());
        if rc != ffi::SQLITE_OK && rc != ffi::SQLITE_OK_SYMLINK {
            return Err(format!("xFullPathname failed with SQLite code {rc}"));
        }
        Ok(CStr::from_ptr(out.as_ptr()).to_string_lossy().into_owned())
    }
}

/// Runs an entry point's body, turning a panic into `on_panic`.
fn guard(on_panic: c_int, f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

// ---------------------------------------------------------------- VFS methods

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    guard(ffi::SQLITE_CANTOPEN, || {
        // SAFETY: SQLite passes our registered VFS and a file buffer of
        // szOsFile bytes, which holds a WrFile followed by the real file.
        unsafe {
            let f = file.cast::<WrFile>();
            (*f).base.pMethods = ptr::null();
            let real_vfs: *mut ffi::sqlite3_vfs = (*vfs).pAppData.cast();
            let real = file
                .cast::<u8>()
                .add(HEADER_BYTES)
                .cast::<ffi::sqlite3_file>();
            (*real).pMethods = ptr::null();

            let kind = if z_name.is_null() {
                Kind::Other
            } else if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
                let name = CStr::from_ptr(z_name).to_string_lossy();
                match lookup(&name) {
                    Some(s) => Kind::MainDb(s),
                    None => return ffi::SQLITE_CANTOPEN,
                }
            } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
                let db = ffi::sqlite3_filename_database(z_name);
                let name = if db.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(db).to_string_lossy().into_owned()
                };
                match lookup(&name) {
                    Some(s) => {
                        let wal = CStr::from_ptr(z_name).to_string_lossy().into_owned();
                        s.wal.set_path(wal.into());
                        Kind::Wal(s)
                    }
                    None => return ffi::SQLITE_CANTOPEN,
                }
            } else if flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0 {
                // A database in WAL mode never opens its rollback journal.
                // SQLite reaches for one only when page 1 no longer says
                // WAL (a damaged header), to write or to roll back a hot
                // journal: both would write the database file outside a
                // checkpoint, which is refused anyway, and a journal
                // created here would stay behind, hot, failing every
                // later open. Refused before anything is created.
                return ffi::SQLITE_CANTOPEN;
            } else {
                Kind::Other
            };

            let Some(open) = (*real_vfs).xOpen else {
                return ffi::SQLITE_CANTOPEN;
            };
            let rc = open(real_vfs, z_name, real, flags, out_flags);
            if rc != ffi::SQLITE_OK {
                if !(*real).pMethods.is_null()
                    && let Some(close) = (*(*real).pMethods).xClose
                {
                    close(real);
                }
                return rc;
            }
            if let Kind::MainDb(_) = kind
                && let Some(fc) = (*(*real).pMethods).xFileControl
            {
                let mut on: c_int = 1;
                fc(real, ffi::SQLITE_FCNTL_PERSIST_WAL, (&raw mut on).cast());
            }
            ptr::write(&raw mut (*f).real, real);
            ptr::write(&raw mut (*f).kind, kind);
            ptr::write(&raw mut (*f).exclusive_locks, 0);
            (*f).base.pMethods = &IO_METHODS;
            ffi::SQLITE_OK
        }
    })
}

macro_rules! forward_vfs {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $ret:ty, $default:expr) => {
        #[allow(clippy::unused_unit)] // some forwarded methods return void
        unsafe extern "C" fn $name(_vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> $ret {
            let Some(real) = real_vfs() else { return $default };
            // SAFETY: `real` is the unix VFS, valid for the process; the
            // arguments are SQLite's own, passed through unchanged.
            unsafe {
                match (*real).$method {
                    Some(m) => m(real, $($arg),*),
                    None => $default,
                }
            }
        }
    };
}

forward_vfs!(x_delete, xDelete, (z: *const c_char, sync_dir: c_int), c_int, ffi::SQLITE_IOERR_DELETE);
forward_vfs!(x_access, xAccess, (z: *const c_char, flags: c_int, out: *mut c_int), c_int, ffi::SQLITE_IOERR_ACCESS);
forward_vfs!(x_full_pathname, xFullPathname, (z: *const c_char, n: c_int, out: *mut c_char), c_int, ffi::SQLITE_CANTOPEN);
forward_vfs!(x_dl_open, xDlOpen, (z: *const c_char), *mut c_void, ptr::null_mut());
forward_vfs!(x_dl_error, xDlError, (n: c_int, out: *mut c_char), (), ());
forward_vfs!(x_dl_close, xDlClose, (h: *mut c_void), (), ());
forward_vfs!(x_randomness, xRandomness, (n: c_int, out: *mut c_char), c_int, 0);
forward_vfs!(x_sleep, xSleep, (us: c_int), c_int, 0);
forward_vfs!(x_current_time, xCurrentTime, (out: *mut f64), c_int, ffi::SQLITE_ERROR);
forward_vfs!(x_get_last_error, xGetLastError, (n: c_int, out: *mut c_char), c_int, 0);
forward_vfs!(x_current_time_int64, xCurrentTimeInt64, (out: *mut ffi::sqlite3_int64), c_int, ffi::SQLITE_ERROR);

type DlSym = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn x_dl_sym(
    _vfs: *mut ffi::sqlite3_vfs,
    h: *mut c_void,
    z: *const c_char,
) -> DlSym {
    let real = real_vfs()?;
    // SAFETY: forwarding to the unix VFS with SQLite's own arguments.
    unsafe { (*real).xDlSym.and_then(|m| m(real, h, z)) }
}

// ----------------------------------------------------------- file methods

/// The real file behind one of ours.
///
/// # Safety
/// `f` must be a file opened by `x_open` and not yet closed.
unsafe fn parts<'a>(f: *mut ffi::sqlite3_file) -> (&'a mut WrFile, *mut ffi::sqlite3_file) {
    // SAFETY: per the contract, `f` points to a live WrFile.
    unsafe {
        let w = &mut *f.cast::<WrFile>();
        let real = w.real;
        (w, real)
    }
}

macro_rules! forward_file {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $ret:ty, $default:expr) => {
        #[allow(clippy::unused_unit)] // some forwarded methods return void
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file, $($arg: $ty),*) -> $ret {
            // SAFETY: SQLite only calls io methods on files x_open opened;
            // the real file's methods are called with its own pointer.
            unsafe {
                let (_, real) = parts(f);
                match (*(*real).pMethods).$method {
                    Some(m) => m(real, $($arg),*),
                    None => $default,
                }
            }
        }
    };
}

/// The most one call to the real xWrite writes of a run.
const WRITE_PIECE_BYTES: usize = 64 << 10;

/// Writes `run`, frames of the current hold kept back in the capture's
/// shadow (see `write_behind`), to the WAL file through `real`.
///
/// # Safety
/// `real` must be a live unix file of this database's WAL (any
/// connection's: they all write the same file, at the same offsets).
unsafe fn write_run(
    real: *mut ffi::sqlite3_file,
    shared: &DbShared,
    cap: &mut Capture,
    run: Option<(u64, u64)>,
) -> c_int {
    // The run is taken: whatever happens below, it is no longer kept back.
    shared.note_run(cap);
    let Some(run) = run else {
        return ffi::SQLITE_OK;
    };
    // SAFETY: per this function's contract, `real` is live and open.
    let Some(write) = (unsafe { (*(*real).pMethods).xWrite }) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let Some(bytes) = cap.run_bytes(run) else {
        cap.poison_with(CaptureError::UnwrittenCommit);
        return ffi::SQLITE_IOERR_WRITE;
    };
    // unix's xWrite takes under 128 KiB a call.
    let (mut rc, mut writes) = (ffi::SQLITE_OK, 0);
    for (i, piece) in bytes.chunks(WRITE_PIECE_BYTES).enumerate() {
        let at = run.0 + (i * WRITE_PIECE_BYTES) as u64;
        // SAFETY: `piece` is the shadow's, alive while `cap` is borrowed,
        // and xWrite only reads it during the call; WRITE_PIECE_BYTES fits
        // a c_int.
        rc = unsafe {
            write(
                real,
                piece.as_ptr().cast(),
                piece.len() as c_int,
                at as ffi::sqlite3_int64,
            )
        };
        if rc != ffi::SQLITE_OK {
            break;
        }
        writes += 1;
    }
    cap.count_file_writes(writes);
    rc
}

/// Writes the hold's kept-back frames, if any, before `real` is read past
/// them, synced, sized or truncated.
///
/// # Safety
/// As for [`write_run`].
unsafe fn write_kept_back(real: *mut ffi::sqlite3_file, shared: &DbShared) -> c_int {
    let mut cap = shared.capture.lock();
    let run = cap.take_run();
    // SAFETY: per this function's contract.
    unsafe { write_run(real, shared, &mut cap, run) }
}

/// For a WAL file: writes the frames kept back if a call on `len` bytes at
/// `offset` reaches them (`usize::MAX` from 0: any). OK for other files.
///
/// # Safety
/// `w` and `real` as [`parts`] returns them for a file x_open opened.
unsafe fn kept_back_written(
    w: &WrFile,
    real: *mut ffi::sqlite3_file,
    offset: u64,
    len: usize,
) -> c_int {
    match &w.kind {
        Kind::Wal(shared) if shared.run_reaches(offset, len) => {
            // SAFETY: `real` is this database's live WAL file.
            unsafe { write_kept_back(real, shared) }
        }
        _ => ffi::SQLITE_OK,
    }
}

unsafe extern "C" fn x_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    n: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guard(ffi::SQLITE_IOERR_READ, || {
        // SAFETY: SQLite only calls io methods on files x_open opened; the
        // real file's method is called with its own pointer, and `buf` is
        // SQLite's, `n` bytes long.
        unsafe {
            let (w, real) = parts(f);
            let rc = kept_back_written(w, real, off.max(0) as u64, n.max(0) as usize);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match (*(*real).pMethods).xRead {
                Some(read) => read(real, buf, n, off),
                None => ffi::SQLITE_IOERR_READ,
            }
        }
    })
}

unsafe extern "C" fn x_file_size(f: *mut ffi::sqlite3_file, out: *mut ffi::sqlite3_int64) -> c_int {
    guard(ffi::SQLITE_IOERR_FSTAT, || {
        // SAFETY: as for x_read; `out` is SQLite's.
        unsafe {
            let (w, real) = parts(f);
            let rc = kept_back_written(w, real, 0, usize::MAX);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match (*(*real).pMethods).xFileSize {
                Some(size) => size(real, out),
                None => ffi::SQLITE_IOERR_FSTAT,
            }
        }
    })
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_FSYNC, || {
        // SAFETY: SQLite only calls io methods on files x_open opened; the
        // real file's method is called with its own pointer.
        unsafe {
            let (w, real) = parts(f);
            let Some(sync) = (*(*real).pMethods).xSync else {
                return ffi::SQLITE_IOERR_FSYNC;
            };
            if let Kind::Wal(shared) = &w.kind
                && shared.take_injected_wal_sync_failure()
            {
                return ffi::SQLITE_IOERR_FSYNC;
            }
            let rc = kept_back_written(w, real, 0, usize::MAX);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let rc = sync(real, flags);
            if rc == ffi::SQLITE_OK {
                match &w.kind {
                    Kind::MainDb(shared) => shared.count_sync(false),
                    Kind::Wal(shared) => shared.count_sync(true),
                    Kind::Other => {}
                }
            }
            rc
        }
    })
}
forward_file!(x_lock, xLock, (level: c_int), c_int, ffi::SQLITE_IOERR_LOCK);
forward_file!(x_unlock, xUnlock, (level: c_int), c_int, ffi::SQLITE_IOERR_UNLOCK);
forward_file!(x_check_reserved_lock, xCheckReservedLock, (out: *mut c_int), c_int, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);
forward_file!(x_sector_size, xSectorSize, (), c_int, 4096);
forward_file!(
    x_device_characteristics,
    xDeviceCharacteristics,
    (),
    c_int,
    0
);
forward_file!(x_shm_map, xShmMap, (pg: c_int, sz: c_int, extend: c_int, pp: *mut *mut c_void), c_int, ffi::SQLITE_IOERR_SHMMAP);
forward_file!(x_shm_barrier, xShmBarrier, (), (), ());
forward_file!(x_shm_unmap, xShmUnmap, (delete: c_int), c_int, ffi::SQLITE_OK);
forward_file!(x_unfetch, xUnfetch, (off: ffi::sqlite3_int64, p: *mut c_void), c_int, ffi::SQLITE_OK);

unsafe extern "C" fn x_fetch(
    f: *mut ffi::sqlite3_file,
    off: ffi::sqlite3_int64,
    amt: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    // SAFETY: as for every forwarded method; a real file without xFetch
    // means "no mapping", which SQLite handles by reading instead.
    unsafe {
        let (_, real) = parts(f);
        match (*(*real).pMethods).xFetch {
            Some(m) if (*(*real).pMethods).iVersion >= 3 => m(real, off, amt, pp),
            _ => {
                *pp = ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    guard(ffi::SQLITE_IOERR_CLOSE, || {
        // SAFETY: SQLite closes each file x_open opened exactly once; after
        // this the WrFile's fields are dropped and never read again.
        unsafe {
            let (w, real) = parts(f);
            let rc = match (*(*real).pMethods).xClose {
                Some(m) => m(real),
                None => ffi::SQLITE_OK,
            };
            ptr::drop_in_place(&raw mut w.kind);
            w.base.pMethods = ptr::null();
            rc
        }
    })
}

fn refuse(shared: &DbShared, e: CaptureError) -> c_int {
    shared.capture.lock().poison_with(e);
    ffi::SQLITE_IOERR_WRITE
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    n: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guard(ffi::SQLITE_IOERR_WRITE, || {
        // SAFETY: `buf` holds `n` bytes for the duration of the call, per the
        // xWrite contract; `f` is one of our open files.
        unsafe {
            let (w, real) = parts(f);
            let Some(write) = (*(*real).pMethods).xWrite else {
                return ffi::SQLITE_IOERR_WRITE;
            };
            match &w.kind {
                Kind::Other => write(real, buf, n, off),
                Kind::MainDb(shared) => {
                    if w.exclusive_locks & (1 << WAL_CKPT_LOCK) == 0 {
                        return refuse(shared, CaptureError::WriteOutsideHold);
                    }
                    write(real, buf, n, off)
                }
                Kind::Wal(shared) if shared.is_replica() => ffi::SQLITE_READONLY,
                Kind::Wal(shared) => {
                    let data = std::slice::from_raw_parts(buf.cast::<u8>(), n.max(0) as usize);
                    let mut cap = shared.capture.lock();
                    if cap.check_write().is_err() {
                        return ffi::SQLITE_IOERR_WRITE;
                    }
                    if cap.exceeds_limit(off as u64, data.len()) {
                        // SQLite rolls the transaction back; nothing was
                        // written and capture is not poisoned.
                        return ffi::SQLITE_FULL;
                    }
                    let note = match cap.route(off as u64, data.len()) {
                        Route::Through => {
                            let run = cap.take_run();
                            let rc = write_run(real, shared, &mut cap, run);
                            if rc != ffi::SQLITE_OK {
                                return rc;
                            }
                            let rc = write(real, buf, n, off);
                            if rc != ffi::SQLITE_OK {
                                return rc;
                            }
                            cap.count_file_writes(1);
                            let Ok(note) = cap.record_write(off as u64, data, &shared.wal) else {
                                return ffi::SQLITE_IOERR_WRITE;
                            };
                            cap.written_through(off as u64, data.len(), note);
                            note
                        }
                        Route::Defer => {
                            // Into the shadow only; the file gets it with
                            // the rest of its run (see `write_behind`).
                            let Ok(note) = cap.record_write(off as u64, data, &shared.wal) else {
                                return ffi::SQLITE_IOERR_WRITE;
                            };
                            let due = cap.deferred(off as u64, data.len(), note);
                            let rc = write_run(real, shared, &mut cap, due);
                            if rc != ffi::SQLITE_OK {
                                return rc;
                            }
                            note
                        }
                    };
                    drop(cap);
                    if note.commit_frame_header() {
                        shared.mark_in_flight();
                    }
                    ffi::SQLITE_OK
                }
            }
        }
    })
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    guard(ffi::SQLITE_IOERR_TRUNCATE, || {
        // SAFETY: `f` is one of our open files.
        unsafe {
            let (w, real) = parts(f);
            let Some(truncate) = (*(*real).pMethods).xTruncate else {
                return ffi::SQLITE_IOERR_TRUNCATE;
            };
            match &w.kind {
                Kind::Other => truncate(real, size),
                Kind::MainDb(shared) => {
                    if w.exclusive_locks & (1 << WAL_CKPT_LOCK) == 0 {
                        refuse(shared, CaptureError::WriteOutsideHold);
                        return ffi::SQLITE_IOERR_TRUNCATE;
                    }
                    truncate(real, size)
                }
                Kind::Wal(shared) if shared.is_replica() => ffi::SQLITE_READONLY,
                Kind::Wal(shared) => {
                    let mut cap = shared.capture.lock();
                    let run = cap.take_run();
                    let rc = write_run(real, shared, &mut cap, run);
                    if rc != ffi::SQLITE_OK {
                        return rc;
                    }
                    let rc = truncate(real, size);
                    if rc == ffi::SQLITE_OK {
                        cap.wal_truncated(size.max(0) as u64);
                    }
                    rc
                }
            }
        }
    })
}

/// The wal-index header (copy 0) as this connection's shared memory holds
/// it, read while the connection still holds the WAL write lock: what
/// SQLite published for the transaction it is ending.
///
/// # Safety
/// `real` must be the live unix file of a connection that has mapped
/// region 0 of its wal-index (every WAL-mode connection has, before it
/// takes the write lock).
unsafe fn published_header(real: *mut ffi::sqlite3_file) -> Option<crate::wal_index::IndexHeader> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: per this function's contract; with extend=0 xShmMap only
    // returns the existing mapping of region 0 (or null).
    let rc = unsafe {
        match (*(*real).pMethods).xShmMap {
            Some(map) => map(real, 0, crate::wal_index::REGION_BYTES as c_int, 0, &mut p),
            None => return None,
        }
    };
    if rc != ffi::SQLITE_OK || p.is_null() {
        return None;
    }
    // SAFETY: SQLite's shm regions are page-aligned, REGION_BYTES long and
    // stay mapped while the connection is open, which outlives this call.
    let region = unsafe { crate::wal_index::Region::new(p.cast(), 0) };
    crate::wal_index::IndexHeader::from_words(&region.read_header_words(0))
}

unsafe extern "C" fn x_shm_lock(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    guard(ffi::SQLITE_IOERR_SHMLOCK, || {
        // SAFETY: `f` is one of our open files.
        unsafe {
            let (w, real) = parts(f);
            let Some(lock) = (*(*real).pMethods).xShmLock else {
                return ffi::SQLITE_IOERR_SHMLOCK;
            };
            let exclusive = flags & ffi::SQLITE_SHM_EXCLUSIVE != 0;
            if !exclusive {
                // Shared (reader) locks: nothing to track.
                return lock(real, ofst, n, flags);
            }
            // Lock indexes are 0..8 (SQLITE_SHM_NLOCK); the bits this call covers.
            let mask: u8 = if (0..=8).contains(&ofst) && n > 0 && ofst + n <= 8 {
                (((1u16 << n) - 1) << ofst) as u8
            } else {
                0
            };
            let covers_write = mask & (1 << WAL_WRITE_LOCK) != 0;
            if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
                if covers_write
                    && w.exclusive_locks & (1 << WAL_WRITE_LOCK) != 0
                    && let Kind::MainDb(shared) = &w.kind
                    && !shared.is_replica()
                {
                    // Capture and hand off before any other writer can start:
                    // sink order is commit order. What SQLite published
                    // says whether the hold's commit really happened.
                    shared.end_hold(published_header(real));
                }
                w.exclusive_locks &= !mask;
                return lock(real, ofst, n, flags);
            }
            let rc = lock(real, ofst, n, flags);
            if rc == ffi::SQLITE_OK {
                w.exclusive_locks |= mask;
                if covers_write
                    && let Kind::MainDb(shared) = &w.kind
                    && !shared.is_replica()
                {
                    shared.capture.lock().begin_hold();
                }
            }
            rc
        }
    })
}

/// What the walrelay VFS allows a `PRAGMA` to do. `None` value = a query.
fn pragma_policy(name: &str, value: Option<&str>) -> Result<(), String> {
    let name = name.to_ascii_lowercase();
    let value = value.map(|v| {
        v.trim_matches(|c| c == '\'' || c == '"')
            .to_ascii_lowercase()
    });
    match (name.as_str(), value.as_deref()) {
        ("locking_mode", Some(v)) if v != "normal" => Err(
            "walrelay: locking_mode=EXCLUSIVE is refused: it moves the WAL index into heap memory, where commits escape capture".into(),
        ),
        ("journal_mode", Some(v)) if v != "wal" => Err(format!(
            "walrelay: journal_mode={v} is refused: walrelay databases stay in WAL mode so that every commit is captured"
        )),
        ("wal_autocheckpoint", Some(v)) if v.parse::<i64>().map_or(true, |n| n > 0) => Err(
            "walrelay: wal_autocheckpoint is refused: checkpoints are run by the walrelay engine".into(),
        ),
        ("wal_checkpoint", _) => Err(
            "walrelay: PRAGMA wal_checkpoint is refused: checkpoints are run by the walrelay engine".into(),
        ),
        _ => Ok(()),
    }
}

unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    guard(ffi::SQLITE_ERROR, || {
        // SAFETY: `f` is one of our open files; `arg` has the type the op
        // documents (char*[3] for PRAGMA, int* for PERSIST_WAL).
        unsafe {
            let (w, real) = parts(f);
            if let Kind::MainDb(_) = w.kind {
                if op == ffi::SQLITE_FCNTL_PRAGMA {
                    let a = arg.cast::<*mut c_char>();
                    let name = *a.add(1);
                    let value = *a.add(2);
                    if !name.is_null() {
                        let n = CStr::from_ptr(name).to_string_lossy();
                        let v = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy());
                        if let Err(msg) = pragma_policy(&n, v.as_deref()) {
                            let msg = CString::new(msg).unwrap_or_default();
                            *a = ffi::sqlite3_mprintf(c"%s".as_ptr(), msg.as_ptr());
                            return ffi::SQLITE_ERROR;
                        }
                    }
                } else if op == ffi::SQLITE_FCNTL_PERSIST_WAL {
                    let v = arg.cast::<c_int>();
                    if *v >= 0 {
                        *v = 1;
                    }
                }
            }
            match (*(*real).pMethods).xFileControl {
                Some(m) => m(real, op, arg),
                None => ffi::SQLITE_NOTFOUND,
            }
        }
    })
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

#[cfg(test)]
mod tests {
    use super::pragma_policy;

    #[test]
    fn pragmas_that_would_bypass_capture_are_refused() {
        assert!(pragma_policy("locking_mode", Some("EXCLUSIVE")).is_err());
        assert!(pragma_policy("LOCKING_MODE", Some("normal")).is_ok());
        assert!(pragma_policy("locking_mode", None).is_ok());
        assert!(pragma_policy("journal_mode", Some("delete")).is_err());
        assert!(pragma_policy("journal_mode", Some("OFF")).is_err());
        assert!(pragma_policy("journal_mode", Some("wal")).is_ok());
        assert!(pragma_policy("wal_autocheckpoint", Some("1000")).is_err());
        assert!(pragma_policy("wal_autocheckpoint", Some("0")).is_ok());
        assert!(pragma_policy("wal_checkpoint", Some("TRUNCATE")).is_err());
        assert!(pragma_policy("cache_size", Some("-2000")).is_ok());
    }
}

//! The object store behind the archive, chosen by URL:
//!
//! - `file:///abs/dir` (or a plain path): the local filesystem, every put
//!   written to a staging file, fsynced and published by hard link
//!   (create-only) — what `walrelay up` uses under its data directory;
//! - `s3://bucket/prefix?endpoint=http://host:port&region=r`: S3 or an
//!   S3-compatible store, conditional puts by `If-None-Match`; credentials
//!   from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (or
//!   `anonymous=true` for unsigned requests; `access_key_id=` and
//!   `secret_access_key=` for a local emulator);
//! - `memory://`: in memory, for tests.
//!
//! The archive only ever creates objects (never overwrites one), reads,
//! lists and deletes them, so it needs nothing a backend lacks. The API is
//! blocking: the store owns a small tokio runtime and every call waits on
//! it. Call it from plain threads (or `spawn_blocking`), never from inside
//! another tokio runtime's worker.

use crate::error::StoreError;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{
    GetResult, GetResultPayload, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use std::sync::Arc;

/// How many object requests run at once in a parallel get.
pub const PARALLEL_REQUESTS: usize = 8;

/// A store and the prefix every key lives under.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    runtime: Arc<tokio::runtime::Runtime>,
    url: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

/// An object in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

/// What a create-only put found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The object is new.
    New,
    /// The key already held exactly these bytes (another uploader got
    /// there first).
    Existed,
}

/// `bytes` as a put's payload in pieces of at most
/// [`crate::image::WRITE_BYTES`] (no copy): a store on the local filesystem
/// writes each piece with one write, and one write of a whole object (16
/// MiB) held a CPU for a millisecond on a kernel that does not preempt its
/// own code, whatever the uploader's scheduling class (see
/// `crate::image::READ_BYTES`). A remote store sends the pieces as one
/// body.
fn in_pieces(bytes: &Bytes) -> PutPayload {
    (0..bytes.len())
        .step_by(crate::image::WRITE_BYTES)
        .map(|at| bytes.slice(at..bytes.len().min(at + crate::image::WRITE_BYTES)))
        .collect()
}

/// An object's bytes. A file of a store on the local filesystem is read
/// in reads of at most [`crate::image::READ_BYTES`] (object_store reads
/// it with one read of its whole size), on the runtime's blocking pool as
/// object_store does, so that a [`Store::get_many`] still reads its
/// objects side by side; any other payload is collected as object_store
/// does.
async fn object_bytes(r: GetResult) -> object_store::Result<Bytes> {
    match r.payload {
        GetResultPayload::File(file, path) => {
            let range = r.range;
            let read = tokio::task::spawn_blocking(move || read_in_pieces(file, range)).await;
            let failed = |why: String| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: format!("reading {}: {why}", path.display()).into(),
            };
            match read {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(failed(e.to_string())),
                Err(e) => Err(failed(e.to_string())),
            }
        }
        payload => GetResult { payload, ..r }.bytes().await,
    }
}

/// `range` of `file`, in reads of at most [`crate::image::READ_BYTES`],
/// into a buffer that is not zeroed first (zeroing it cost a restore of
/// 16 MiB parts about a fifth of its time).
fn read_in_pieces(mut file: std::fs::File, range: std::ops::Range<u64>) -> std::io::Result<Bytes> {
    use std::io::{Read, Seek, SeekFrom};
    let len = usize::try_from(range.end.saturating_sub(range.start))
        .map_err(|_| std::io::Error::other("an object larger than memory"))?;
    file.seek(SeekFrom::Start(range.start))?;
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let piece = (len - buf.len()).min(crate::image::READ_BYTES) as u64;
        if (&mut file).take(piece).read_to_end(&mut buf)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than the object",
            ));
        }
    }
    Ok(Bytes::from(buf))
}

fn url_err(url: &str, why: impl Into<String>) -> StoreError {
    StoreError::Url {
        url: url.to_string(),
        why: why.into(),
    }
}

impl Store {
    /// Opens the store a URL names (see the module docs).
    pub fn open(url: &str) -> Result<Store, StoreError> {
        let inner: Arc<dyn ObjectStore> = if url == "memory://" || url == "memory:" {
            Arc::new(object_store::memory::InMemory::new())
        } else if let Some(rest) = url.strip_prefix("s3://") {
            Arc::new(open_s3(url, rest)?)
        } else {
            let path = url.strip_prefix("file://").unwrap_or(url);
            if !path.starts_with('/') {
                return Err(url_err(url, "a filesystem store needs an absolute path"));
            }
            std::fs::create_dir_all(path).map_err(|e| url_err(url, e.to_string()))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(path)
                .map_err(|e| url_err(url, e.to_string()))?
                .with_fsync(true)
                .with_automatic_cleanup(true);
            Arc::new(fs)
        };
        Store::from_object_store(inner, url)
    }

    /// A store over any `object_store` backend (a custom one, or a test
    /// double); `label` names it in messages.
    pub fn from_object_store(
        inner: Arc<dyn ObjectStore>,
        label: &str,
    ) -> Result<Store, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("walrelay-store")
            .enable_all()
            .build()
            .map_err(StoreError::Runtime)?;
        Ok(Store {
            inner,
            runtime: Arc::new(runtime),
            url: label.to_string(),
        })
    }

    /// The backend itself (to wrap it, e.g. under another prefix).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.inner)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(key: &str) -> Key {
        Key::from(key)
    }

    /// The object at `key`, or None if there is none.
    pub fn get(&self, key: &str) -> Result<Option<Bytes>, StoreError> {
        let k = Self::key(key);
        self.runtime
            .block_on(async {
                match self.inner.get(&k).await {
                    Ok(r) => object_bytes(r).await.map(Some),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .map_err(backend("get", key))
    }

    /// Several objects at once (up to [`PARALLEL_REQUESTS`] in flight), in
    /// the order asked; a missing one is None.
    pub fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let inner = &self.inner;
        self.runtime.block_on(
            futures::stream::iter(keys.iter().map(|key| async move {
                let k = Self::key(key);
                match inner.get(&k).await {
                    Ok(r) => object_bytes(r).await.map(Some),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
                .map_err(backend("get", key))
            }))
            .buffered(PARALLEL_REQUESTS)
            .try_collect(),
        )
    }

    /// Creates `key` holding `bytes`, never overwriting: if the key
    /// exists with the same bytes that is [`Created::Existed`]; with other
    /// bytes, [`StoreError::Conflict`].
    pub fn create(&self, key: &str, bytes: Bytes) -> Result<Created, StoreError> {
        let k = Self::key(key);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let put = self
            .runtime
            .block_on(self.inner.put_opts(&k, in_pieces(&bytes), opts));
        match put {
            Ok(_) => Ok(Created::New),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get(key)? {
                Some(held) if held == bytes => Ok(Created::Existed),
                _ => Err(StoreError::Conflict {
                    key: key.to_string(),
                }),
            },
            Err(e) => Err(backend("put", key)(e)),
        }
    }

    /// Every object under `prefix` whose key sorts after `offset` (all if
    /// None), in key order.
    pub fn list(&self, prefix: &str, offset: Option<&str>) -> Result<Vec<Listed>, StoreError> {
        let p = Self::key(prefix.trim_end_matches('/'));
        let mut out: Vec<Listed> = self
            .runtime
            .block_on(async {
                let stream = match offset {
                    Some(o) => self.inner.list_with_offset(Some(&p), &Self::key(o)),
                    None => self.inner.list(Some(&p)),
                };
                stream
                    .map_ok(|m| Listed {
                        key: m.location.to_string(),
                        size: m.size,
                    })
                    .try_collect::<Vec<_>>()
                    .await
            })
            .map_err(backend("list", prefix))?;
        // Not every backend lists in order.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes `key`; deleting what is not there is not an error.
    pub fn delete(&self, key: &str) -> Result<(), StoreError> {
        let k = Self::key(key);
        match self.runtime.block_on(self.inner.delete(&k)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(backend("delete", key)(e)),
        }
    }

    /// Makes `to` hold what `from` holds without moving the bytes through
    /// this process where the store allows: a hard link on the local
    /// filesystem, a server-side copy on S3. Never overwrites `to` with
    /// different bytes.
    pub fn copy(&self, from: &str, to: &str) -> Result<Created, StoreError> {
        let (f, t) = (Self::key(from), Self::key(to));
        match self.runtime.block_on(self.inner.copy_if_not_exists(&f, &t)) {
            Ok(()) => Ok(Created::New),
            Err(object_store::Error::AlreadyExists { .. }) => self.copy_verify(from, to),
            Err(
                object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. },
            ) => {
                // S3 without a configured copy-if-not-exists: copy server
                // side only if nothing is there yet.
                if self.get(to)?.is_some() {
                    return self.copy_verify(from, to);
                }
                self.runtime
                    .block_on(self.inner.copy(&f, &t))
                    .map_err(backend("copy", to))?;
                Ok(Created::New)
            }
            Err(e) => Err(backend("copy", to)(e)),
        }
    }

    fn copy_verify(&self, from: &str, to: &str) -> Result<Created, StoreError> {
        match (self.get(from)?, self.get(to)?) {
            (Some(a), Some(b)) if a == b => Ok(Created::Existed),
            _ => Err(StoreError::Conflict { key: to.into() }),
        }
    }
}

fn backend(op: &'static str, key: &str) -> impl FnOnce(object_store::Error) -> StoreError {
    let key = key.to_string();
    move |source| StoreError::Backend { op, key, source }
}

/// `s3://bucket[/prefix][?endpoint=URL&region=R]`.
fn open_s3(
    url: &str,
    rest: &str,
) -> Result<object_store::prefix::PrefixStore<object_store::aws::AmazonS3>, StoreError> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    if bucket.is_empty() {
        return Err(url_err(url, "no bucket"));
    }
    let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        b = match k {
            "endpoint" => b.with_endpoint(v).with_allow_http(v.starts_with("http://")),
            "region" => b.with_region(v),
            // Unsigned requests (a public bucket).
            "anonymous" => b.with_skip_signature(v == "true"),
            // For local emulators and tests; real deployments should
            // leave credentials to the environment.
            "access_key_id" => b.with_access_key_id(v),
            "secret_access_key" => b.with_secret_access_key(v),
            _ => return Err(url_err(url, format!("unknown parameter {k:?}"))),
        };
    }
    let s3 = b.build().map_err(|e| url_err(url, e.to_string()))?;
    Ok(object_store::prefix::PrefixStore::new(
        s3,
        prefix.trim_matches('/'),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that differ at every offset, so that a piece put or read at
    /// the wrong place shows.
    fn object(len: usize) -> Bytes {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn an_object_of_many_pieces_comes_back_whole_from_a_local_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().to_string_lossy()).unwrap();
        let len = 3 * crate::image::READ_BYTES + 5;
        let (big, small) = (object(len), object(3));
        assert_eq!(store.create("a/big", big.clone()).unwrap(), Created::New);
        assert_eq!(
            store.create("a/small", small.clone()).unwrap(),
            Created::New
        );
        assert_eq!(store.create("a/empty", Bytes::new()).unwrap(), Created::New);
        assert_eq!(store.get("a/big").unwrap(), Some(big.clone()));
        let many = ["a/small", "a/none", "a/big", "a/empty"].map(String::from);
        assert_eq!(
            store.get_many(&many).unwrap(),
            vec![Some(small), None, Some(big.clone()), Some(Bytes::new())]
        );
        // The same bytes again: found, not overwritten; others: refused.
        assert_eq!(store.create("a/big", big).unwrap(), Created::Existed);
        assert!(matches!(
            store.create("a/big", object(len - 1)),
            Err(StoreError::Conflict { .. })
        ));
    }
}

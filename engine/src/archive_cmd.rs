//! `walrelay restore` and `walrelay fork`: a database's history in cold
//! storage, read without any node running.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::time::Instant;
use walrelay_archive::{Archive, Progress, Store, restore_to_file};
use walrelay_engine::http::time_travel::parse_timestamp_us;
use walrelay_replicator::{Bookmark, DatabaseId};

/// Where in the history: a bookmark, or a time (neither: the newest
/// archived state).
#[derive(clap::Args, Debug, Clone)]
#[group(required = false, multiple = false)]
pub struct PointArgs {
    /// A bookmark (as the API returns them).
    #[arg(long)]
    pub bookmark: Option<Bookmark>,
    /// A time: RFC 3339 (`2026-11-30T18:00:00Z`) or Unix seconds. Names
    /// the last transaction committed at or before it.
    #[arg(long, value_parser = parse_timestamp_us)]
    pub timestamp: Option<u64>,
}

/// Which history: a store, a database in it, and a point.
#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    /// The store: a directory, `file:///dir`, or
    /// `s3://bucket/prefix?endpoint=...` (see the README).
    #[arg(long)]
    pub store: String,
    /// The database's id (`walrelay up` serves `main` as 1).
    #[arg(long)]
    pub database: u64,
    #[command(flatten)]
    pub point: PointArgs,
}

impl HistoryArgs {
    /// The store, the database's history in it, its manifest, and the
    /// bookmark the point names.
    fn open(&self) -> Result<(Store, Archive, walrelay_archive::Manifest, Bookmark)> {
        let store = Store::open(&self.store)?;
        let archive = Archive::new(store.clone(), DatabaseId(self.database));
        let m = archive.manifest()?;
        let at = resolve(&archive, &m, &self.point)?;
        Ok((store, archive, m, at))
    }
}

/// Options of `walrelay restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub history: HistoryArgs,
    /// The SQLite file to write (replaced if it exists).
    #[arg(long)]
    pub out: PathBuf,
}

/// Options of `walrelay fork`.
#[derive(clap::Args, Debug)]
pub struct ForkArgs {
    #[command(flatten)]
    pub history: HistoryArgs,
    /// The new database's id (must not exist in the store).
    #[arg(long)]
    pub to: u64,
}

/// The bookmark a point names in `archive`'s current manifest.
pub fn resolve(
    archive: &Archive,
    m: &walrelay_archive::Manifest,
    point: &PointArgs,
) -> Result<Bookmark, walrelay_archive::RestoreError> {
    match (point.bookmark, point.timestamp) {
        (Some(b), _) => Ok(b),
        (None, Some(t)) => archive.bookmark_at_time(m, t),
        (None, None) => Ok(m.log_end),
    }
}

/// A progress bar on a terminal (nothing when stderr is not one).
struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn start(&self, objects: u64) {
        self.0.set_length(objects);
    }
    fn advance(&self, objects: u64) {
        self.0.inc(objects);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

fn bar() -> Bar {
    let b = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "restoring {bar:40} {pos}/{len} objects {elapsed} (eta {eta})",
    ) {
        b.set_style(style);
    }
    Bar(b)
}

pub fn restore(a: RestoreArgs) -> Result<()> {
    let (_, archive, m, target) = a.history.open()?;
    let database = a.history.database;
    let started = Instant::now();
    let r = restore_to_file(&archive, &m, target, &a.out, &bar())
        .with_context(|| format!("restoring database {database} at {target}"))?;
    println!(
        "restored database {} at {} into {} ({} pages of {} bytes) in {:.2} s",
        database,
        r.bookmark,
        a.out.display(),
        r.db_pages,
        r.page_size,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn fork(a: ForkArgs) -> Result<()> {
    let database = a.history.database;
    if a.to == database {
        bail!("--to must name a new database");
    }
    let (store, _, _, at) = a.history.open()?;
    let f = walrelay_archive::fork(&store, DatabaseId(database), at, DatabaseId(a.to))?;
    println!(
        "forked database {} at {} into database {} ({} snapshot parts reused, {} log objects written)",
        database, f.bookmark, a.to, f.parts_reused, f.log_objects
    );
    Ok(())
}

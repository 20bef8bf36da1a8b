//! `walrelay token ...`, and the token `walrelay up` mints on its first
//! start. The store's format is `walrelay_engine::http::token_store`'s.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use walrelay_engine::http::auth::{Permission, Scope};
use walrelay_engine::http::token_store;

/// Writes a secret to a new file readable by its owner only.
fn write_secret(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    // An existing file keeps its mode through open(): set it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{secret}")?;
    f.sync_all()?;
    Ok(())
}

/// `up`'s authentication: the flags every node gets. On the first start
/// it mints an admin token into DIR/tokens and writes it to DIR/token.
pub fn up_auth(dir: &Path, insecure: bool) -> Result<Vec<String>> {
    if insecure {
        crate::cmd::warn(
            "WARNING: walrelay up --insecure: the HTTP API has no authentication; anyone who can reach its ports can read and write",
        );
        return Ok(vec!["--insecure".into()]);
    }
    let tokens = dir.join("tokens");
    let token_file = dir.join("token");
    if !tokens.exists() {
        let admin = token_store::create(&tokens, Scope::All, Permission::ReadWrite)
            .context("creating the API token store")?;
        write_secret(&token_file, &admin.expose())?;
        println!(
            "walrelay up: minted an admin API token (all databases, read-write) into {}",
            token_file.display()
        );
    } else if !token_file.exists() {
        println!(
            "walrelay up: {} is missing; mint a token with `walrelay token create --tokens {} --all`",
            token_file.display(),
            tokens.display()
        );
    }
    println!(
        "walrelay up: HTTP API authentication on, tokens in {}",
        tokens.display()
    );
    Ok(vec!["--tokens".into(), tokens.display().to_string()])
}

/// `walrelay token ...`.
#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// Mint an API token into a token store (created if absent) and print
    /// it: the only time it is shown. Nodes pick it up within a second.
    Create(TokenCreateArgs),
    /// Remove a token from a token store by its id (the part after
    /// `wrt_`, up to the next `_`).
    Revoke(TokenRevokeArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["database", "all"])))]
pub struct TokenCreateArgs {
    /// The token store file.
    #[arg(long)]
    pub tokens: PathBuf,
    /// The token reaches this database only.
    #[arg(long)]
    pub database: Option<String>,
    /// The token reaches every database, and /metrics.
    #[arg(long)]
    pub all: bool,
    /// The token runs only statements SQLite calls read-only.
    #[arg(long)]
    pub read_only: bool,
}

#[derive(clap::Args)]
pub struct TokenRevokeArgs {
    /// The token store file.
    #[arg(long)]
    pub tokens: PathBuf,
    /// The token's id (16 hex digits).
    pub id: String,
}

pub fn token(c: TokenCommand) -> Result<()> {
    match c {
        TokenCommand::Create(a) => {
            let scope = match a.database {
                Some(d) if d.is_empty() => bail!("--database needs a name"),
                Some(d) => Scope::Database(d),
                None => Scope::All,
            };
            let permission = if a.read_only {
                Permission::Read
            } else {
                Permission::ReadWrite
            };
            let t = token_store::create(&a.tokens, scope.clone(), permission)?;
            eprintln!(
                "minted token {} ({scope}, {permission}) into {}; it is shown only now:",
                t.id(),
                a.tokens.display()
            );
            println!("{}", t.expose());
            Ok(())
        }
        TokenCommand::Revoke(a) => {
            let id =
                a.id.parse()
                    .map_err(|e| anyhow::anyhow!("{:?} is not a token id: {e}", a.id))?;
            if token_store::revoke(&a.tokens, id)? {
                eprintln!("revoked token {id} from {}", a.tokens.display());
                Ok(())
            } else {
                bail!("no token {id} in {}", a.tokens.display())
            }
        }
    }
}

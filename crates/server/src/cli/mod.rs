//! Command line and environment configuration, with clap: the only module
//! besides `main` that knows the flags. [`ServeArgs::settings`] and
//! [`DbArgs::settings`] turn them into the typed [`settings`](crate::settings)
//! the rest of the service takes.
//!
//! Every flag has an environment fallback (`PGBATCH_*`, and `DATABASE_URL`),
//! so the same binary is configured the same way in a shell, a container or
//! a service manager. Defaults are the settings' own constants.

//!
//! `mod.rs` holds the command tree; `flags` the options of `serve` and the
//! database; `values` the flags' value types and parsers; `convert` the
//! conversion of flags to settings.

mod convert;
mod flags;
mod values;

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

pub use self::flags::{DbArgs, SeedArgs, ServeArgs};
pub use self::values::{
    parse_expiry, parse_lag, AdmissionArg, ConcurrencyArg, OnOff, PolicyArg, PoolerArg, ReadPathArg,
};

/// The object-metadata service.
///
/// `serve` is the default command, so its flags are also accepted without
/// it (`pgbatch-server --listen ...`), as before it owned them.
#[derive(Debug, Parser)]
#[command(
    name = "pgbatch-server",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Where the data lives.
    #[command(flatten)]
    pub db: DbArgs,
    /// Serving options, when no command is named.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// How log lines are written, to standard error: `text` (coloured only
    /// on a terminal, and never with `NO_COLOR` set) or `json`, one object
    /// per line. Verbosity follows `RUST_LOG` (default `info`).
    #[arg(long, global = true, env = "PGBATCH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl From<LogFormat> for crate::logs::Format {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Text => Self::Text,
            LogFormat::Json => Self::Json,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations, seed demo data if the tables are empty, and serve
    /// HTTP (the default).
    Serve(Box<ServeArgs>),
    /// Bulk-load demo objects and `random_read_test` rows with binary COPY,
    /// into tables that are still empty, then exit.
    Seed(SeedArgs),
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `server user ...`
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user with the given access.
    Create {
        /// The user's name (1-64 of A-Z a-z 0-9 . _ -).
        name: String,
        /// A repository (or `*` for all) the user may read; repeatable.
        #[arg(long = "read", value_name = "REPO")]
        read: Vec<String>,
        /// A repository (or `*` for all) the user may read and write;
        /// repeatable.
        #[arg(long = "write", value_name = "REPO")]
        write: Vec<String>,
    },
    /// List users and their grants.
    List,
    /// Delete a user with their tokens and grants.
    Delete {
        /// The user's name.
        name: String,
    },
}

/// `server token ...`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a user and print it (it is stored only hashed,
    /// so it cannot be shown again).
    Create {
        /// The user the token authenticates as.
        user: String,
        /// What the token is for.
        #[arg(long, default_value = "")]
        description: String,
        /// Make it stop working this long from now: a number with `s`,
        /// `m`, `h` or `d` (`90d`, `12h`). Without it, it never expires.
        #[arg(long, value_name = "DURATION", value_parser = parse_expiry)]
        expires_in: Option<Duration>,
    },
    /// List tokens (ids, users, descriptions; never the tokens).
    List {
        /// Only this user's.
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by the id `token list` shows. Running servers stop
    /// accepting it when the database's change notification reaches them
    /// (milliseconds).
    Revoke {
        /// The token's id (16 hex digits).
        id: String,
    },
}

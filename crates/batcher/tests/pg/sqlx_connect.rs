//! sqlx's connection settings for the test harness's databases.

use sqlx::postgres::PgConnectOptions;

/// sqlx settings for what `config` (the test harness's tokio-postgres
/// settings) names: a Unix socket directory or a TCP host, port, user,
/// password and database.
pub(crate) fn connect_options(config: &tokio_postgres::Config) -> PgConnectOptions {
    let mut options = PgConnectOptions::new_without_pgpass();
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Unix(dir)) => options = options.socket(dir),
        Some(tokio_postgres::config::Host::Tcp(host)) => options = options.host(host),
        None => {}
    }
    if let Some(port) = config.get_ports().first() {
        options = options.port(*port);
    }
    if let Some(user) = config.get_user() {
        options = options.username(user);
    }
    if let Some(password) = config.get_password() {
        options = options.password(&String::from_utf8_lossy(password));
    }
    if let Some(dbname) = config.get_dbname() {
        options = options.database(dbname);
    }
    options
}

//! Flags to typed settings: what the rest of the service takes.

use std::time::Duration;

use crate::settings::{
    AuthSettings, BatchSettings, CacheSettings, DbSettings, ImportSettings, InvalidationSettings,
    Limits, ReadSettings, ReplicaSettings, Settings, TlsOverrides, WriteSettings,
};

use super::flags::{DbArgs, ServeArgs};
use super::values::OnOff;
use crate::settings::defaults::SEED_ROWS;

impl ServeArgs {
    /// The demo rows to seed on start, (objects, `random_read_test` rows):
    /// on the embedded cluster the defaults unless given; on an external
    /// database none unless asked for (`--seed-demo`, or a count given).
    pub fn seed_rows(&self, embedded: bool) -> (u64, u64) {
        let default = if embedded || self.seed_demo {
            SEED_ROWS
        } else {
            0
        };
        (
            self.seed_objects.unwrap_or(default),
            self.seed_kv_rows.unwrap_or(default),
        )
    }

    /// Whether to create the admin user on first start: always on the
    /// embedded cluster; on an external database only when asked
    /// (`--bootstrap-admin`, or an `--admin-token` given).
    pub fn creates_admin(&self, embedded: bool) -> bool {
        embedded || self.bootstrap_admin || self.admin_token.is_some()
    }

    /// The typed settings these flags ask for.
    pub fn settings(&self) -> Settings {
        let batch = BatchSettings {
            max_batch_size: self.batch_size,
            policy: self.batch_policy.into(),
            max_delay: Duration::from_micros(self.batch_delay_us),
            concurrency: self.batch_concurrency.0,
            queue_capacity: self.queue_capacity,
        };
        Settings {
            read: ReadSettings {
                path: self.read_path.into(),
                batch,
                timeout: Duration::from_millis(self.request_timeout_ms),
                admission_wait: Duration::from_millis(self.admission_wait_ms),
                cache: CacheSettings {
                    capacity: self.cache_capacity,
                    ttl: Duration::from_millis(self.cache_ttl_ms),
                    jitter: Duration::from_millis(self.cache_jitter_ms),
                    negative_ttl: (self.cache_negative_ttl_ms > 0)
                        .then(|| Duration::from_millis(self.cache_negative_ttl_ms)),
                    admission: self.cache_admission.into(),
                },
            },
            write: WriteSettings {
                batch: BatchSettings {
                    max_batch_size: self.write_batch_size,
                    concurrency: pgbatch::Concurrency::Fixed(self.write_concurrency),
                    ..batch
                },
                timeout: Duration::from_millis(self.write_timeout_ms),
            },
            import: ImportSettings {
                max_bytes: self.max_import_bytes,
                concurrency: self.import_concurrency,
                idle_timeout: Duration::from_millis(self.import_idle_timeout_ms),
                timeout: Duration::from_millis(self.import_timeout_ms),
            },
            auth: AuthSettings {
                cache: (self.auth_cache == OnOff::On).then(|| CacheSettings {
                    capacity: self.auth_cache_capacity,
                    ttl: Duration::from_millis(self.auth_cache_ttl_ms),
                    jitter: Duration::from_millis(self.auth_cache_jitter_ms),
                    negative_ttl: None,
                    // Few, hot keys: each is worth storing at once.
                    admission: pgbatch::cache::Admission::Always,
                }),
            },
            limits: Limits {
                max_stat_paths: self.max_stat_paths,
                max_body_bytes: self.max_body_bytes,
                body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
                body_timeout: Duration::from_millis(self.body_timeout_ms),
            },
            invalidation: InvalidationSettings::default(),
            replicas: ReplicaSettings {
                max_lag: self.max_replica_lag,
                ..ReplicaSettings::default()
            },
        }
    }
}

impl DbArgs {
    /// The typed settings these flags ask for.
    pub fn settings(&self) -> DbSettings {
        DbSettings {
            url: self.database_url.clone(),
            data_dir: self.data_dir.clone(),
            pool_size: self.pool_size,
            tls: TlsOverrides {
                mode: self.sslmode,
                root_cert: self.sslrootcert.clone(),
            },
            replica_urls: self.replica_urls.clone(),
            pooler: self.pooler.into(),
            direct_url: self.direct_url.clone(),
        }
    }
}

impl ServeArgs {
    /// The limits on clients these flags ask for.
    pub fn edge(&self) -> crate::settings::EdgeSettings {
        crate::settings::EdgeSettings {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_header_bytes: self.max_header_bytes,
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            ..crate::settings::EdgeSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use std::path::PathBuf;

    use crate::cli::{parse_lag, Cli, Command, ConcurrencyArg, PolicyArg};
    use crate::settings::{defaults, ReadPath};
    use pgbatch::cache::Admission;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn replica_flags_parse_and_default_to_the_settings_default() {
        let cli = parse(&[]);
        assert_eq!(
            cli.serve.settings().replicas.max_lag,
            defaults::MAX_REPLICA_LAG
        );
        assert!(cli.db.settings().replica_urls.is_empty());
        let cli = parse(&[
            "--replica-url",
            "postgres://r1/x",
            "--replica-url",
            "postgres://r2/x",
            "--max-replica-lag",
            "250ms",
        ]);
        assert_eq!(cli.db.settings().replica_urls.len(), 2);
        let replicas = cli.serve.settings().replicas;
        assert_eq!(replicas.max_lag, Duration::from_millis(250));
        assert_eq!(parse_lag("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "5", "0s", "5h", "ms", "-1s", "2h"] {
            assert!(parse_lag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_external_database_gets_demo_data_and_an_admin_only_when_asked() {
        let quiet = parse(&["--database-url", "postgres://db/x"]);
        assert_eq!(quiet.serve.seed_rows(false), (0, 0));
        assert!(!quiet.serve.creates_admin(false));
        assert_eq!(quiet.serve.seed_rows(true), (SEED_ROWS, SEED_ROWS));
        assert!(quiet.serve.creates_admin(true));
        let asked = parse(&["--seed-demo", "--bootstrap-admin"]);
        assert_eq!(asked.serve.seed_rows(false), (SEED_ROWS, SEED_ROWS));
        assert!(asked.serve.creates_admin(false));
        let counts = parse(&["--seed-objects", "5", "--admin-token", "t"]);
        assert_eq!(counts.serve.seed_rows(false), (5, 0));
        assert!(counts.serve.creates_admin(false));
        let none = parse(&["--seed-objects", "0", "--seed-kv-rows", "0"]);
        assert_eq!(none.serve.seed_rows(true), (0, 0));
    }

    #[test]
    fn serve_owns_its_flags_and_they_still_work_without_it() {
        let cli = parse(&[
            "serve",
            "--listen",
            "127.0.0.1:9001",
            "--read-path",
            "naive",
        ]);
        let Some(Command::Serve(args)) = &cli.command else {
            panic!("serve: {:?}", cli.command);
        };
        assert_eq!(args.listen.to_string(), "127.0.0.1:9001");
        assert_eq!(args.settings().read.path, ReadPath::Naive);
        let cli = parse(&["--listen", "127.0.0.1:9002"]);
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen.to_string(), "127.0.0.1:9002");
        // The database flags are global; serving flags are not the token
        // command's.
        let cli = parse(&["token", "create", "alice", "--data-dir", "/tmp/x"]);
        assert_eq!(cli.db.data_dir, PathBuf::from("/tmp/x"));
        let err = Cli::try_parse_from(["server", "token", "create", "alice", "--listen", "x"])
            .unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
        let help = Cli::try_parse_from(["server", "serve", "--help"])
            .unwrap_err()
            .to_string();
        for heading in ["Reads:", "Imports:", "HTTP edge:", "--listen"] {
            assert!(
                help.contains(heading),
                "serve --help lacks {heading}:\n{help}"
            );
        }
    }

    /// One test, because it changes the process's environment: the flags'
    /// defaults are the settings' defaults, and flags and environment
    /// variables reach the fields they name.
    #[test]
    fn flags_and_environment_map_to_settings() {
        for (name, _) in std::env::vars() {
            if name.starts_with("PGBATCH_") {
                std::env::remove_var(name);
            }
        }
        let cli = parse(&[]);
        assert_eq!(cli.serve.settings(), Settings::default());
        assert_eq!(
            DbSettings {
                url: None,
                ..cli.db.settings()
            },
            DbSettings::default()
        );
        assert_eq!(cli.serve.seed_rows(true), (SEED_ROWS, SEED_ROWS));

        let cli = parse(&[
            "--read-path",
            "cached",
            "--batch-size",
            "7",
            "--batch-policy",
            "fixed-delay",
            "--batch-delay-us",
            "250",
            "--batch-concurrency",
            "3",
            "--queue-capacity",
            "9",
            "--request-timeout-ms",
            "1500",
            "--cache-negative-ttl-ms",
            "40",
            "--auth-cache",
            "off",
            "--write-batch-size",
            "11",
            "--write-concurrency",
            "2",
            "--write-timeout-ms",
            "700",
            "--max-import-bytes",
            "2000",
            "--max-stat-paths",
            "5",
            "--max-body-bytes",
            "4096",
            "--pool-size",
            "6",
        ]);
        let s = cli.serve.settings();
        let batch = BatchSettings {
            max_batch_size: 7,
            policy: pgbatch::FlushPolicy::FixedDelay,
            max_delay: Duration::from_micros(250),
            concurrency: pgbatch::Concurrency::Fixed(3),
            queue_capacity: 9,
        };
        assert_eq!(s.read.path, ReadPath::Cached);
        assert_eq!(s.read.batch, batch);
        assert_eq!(s.read.timeout, Duration::from_millis(1500));
        assert_eq!(s.read.cache.negative_ttl, Some(Duration::from_millis(40)));
        assert_eq!(s.read.cache.admission, Admission::SecondMiss);
        assert_eq!(s.auth.cache, None);
        // The writer batches with its own size and concurrency, and the
        // shared policy, delay and queue.
        assert_eq!(
            s.write.batch,
            BatchSettings {
                max_batch_size: 11,
                concurrency: pgbatch::Concurrency::Fixed(2),
                ..batch
            }
        );
        assert_eq!(s.write.timeout, Duration::from_millis(700));
        assert_eq!(s.import.max_bytes, 2000);
        assert_eq!(
            s.limits,
            Limits {
                max_stat_paths: 5,
                max_body_bytes: 4096,
                ..Limits::default()
            }
        );
        assert_eq!(cli.db.settings().pool_size, 6);

        std::env::set_var("PGBATCH_CACHE_TTL_MS", "1234");
        std::env::set_var("PGBATCH_AUTH_CACHE_JITTER_MS", "0");
        std::env::set_var("PGBATCH_READ_PATH", "naive");
        std::env::set_var("PGBATCH_CACHE_ADMISSION", "always");
        let s = parse(&[]).serve.settings();
        std::env::remove_var("PGBATCH_CACHE_TTL_MS");
        std::env::remove_var("PGBATCH_AUTH_CACHE_JITTER_MS");
        std::env::remove_var("PGBATCH_READ_PATH");
        std::env::remove_var("PGBATCH_CACHE_ADMISSION");
        assert_eq!(s.read.cache.ttl, Duration::from_millis(1234));
        assert_eq!(s.read.cache.admission, Admission::Always);
        // The token cache's keys are few and hot: always stored.
        assert_eq!(s.auth.cache.map(|c| c.admission), Some(Admission::Always));
        assert_eq!(s.auth.cache.map(|c| c.jitter), Some(Duration::ZERO));
        assert_eq!(s.read.path, ReadPath::Naive);
    }

    #[test]
    fn batch_concurrency_is_auto_or_a_number() {
        assert_eq!(
            parse(&[]).serve.settings().read.batch.concurrency,
            defaults::READ_CONCURRENCY
        );
        for auto in ["auto", "AUTO"] {
            let s = parse(&["--batch-concurrency", auto]).serve.settings();
            assert!(s.read.batch.concurrency.is_auto());
        }
        for bad in ["0", "1.5", "many", ""] {
            let err = Cli::try_parse_from(["pgbatch-server", "--batch-concurrency", bad])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("neither `auto` nor a number"), "{bad}: {err}");
        }
        assert_eq!(
            ConcurrencyArg(defaults::READ_CONCURRENCY).to_string(),
            "auto"
        );
    }

    #[test]
    fn every_policy_has_a_flag() {
        for policy in [
            pgbatch::FlushPolicy::Eager,
            pgbatch::FlushPolicy::FixedDelay,
            pgbatch::FlushPolicy::Adaptive,
        ] {
            assert_eq!(
                PolicyArg::of(policy).map(pgbatch::FlushPolicy::from),
                Some(policy)
            );
        }
    }
}

//! Where a run's CPU time went: the server under test (this process), the
//! load generator (a child process, such as wrk), Postgres (the embedded
//! cluster's processes) and what the machine left idle.
//!
//! When all of them share the machine's cores and it is saturated (idle
//! near zero), one route's throughput against another's is the inverse of
//! their CPU time per request, summed over every process. These figures
//! say which process a gap between two routes comes from, measured in the
//! same run as the throughput.
//!
//! Read from `getrusage` and `/proc` rather than through a crate: the
//! few fields needed here are one line of each, and Linux is the only
//! platform the benchmarks run on.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use nix::sys::resource::{getrusage, Usage, UsageWho};

/// The kernel's unit for the times in `/proc/<pid>/stat` and `/proc/stat`
/// (`USER_HZ`): 100 on every Linux architecture the benchmarks run on.
const TICKS_PER_SECOND: u64 = 100;

/// CPU times at one moment, to subtract from a later one.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    server: Duration,
    children: Duration,
    /// CPU time of each of the cluster's processes by (PID, start time),
    /// so that a PID used again by a new process is not taken for the old.
    postgres: Option<HashMap<(i32, u64), Duration>>,
    /// Idle and total ticks of the whole machine.
    machine: Option<(u64, u64)>,
}

/// CPU time spent between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    /// This process: the server under test (its runtime's threads and its
    /// log writer).
    pub server: Duration,
    /// Child processes that ended in between: the load generator.
    pub load: Duration,
    /// The cluster's processes; `None` without an embedded cluster (a
    /// `DATABASE_URL` elsewhere) or when they could not be read.
    pub postgres: Option<Duration>,
    /// The share of the machine's CPU time nobody used, from 0 to 1.
    pub idle: Option<f64>,
}

/// The Postgres server whose CPU a run counts: an embedded cluster, or a
/// server of this machine found from one of its connections.
#[derive(Debug, Clone, Copy)]
pub enum Postgres<'a> {
    /// An embedded cluster's processes.
    Cluster(&'a embedded_pg::Cluster),
    /// The postmaster's PID.
    Postmaster(i32),
}

impl Postgres<'_> {
    /// The server `client` is connected to, if it runs on this machine
    /// (its backend's process is here, a `postgres` child of a `postgres`
    /// postmaster): a `DATABASE_URL` server's CPU counts too. `None` for
    /// one elsewhere (a container's own PIDs, another host).
    pub async fn of_connection(client: &tokio_postgres::Client) -> Option<Postgres<'static>> {
        let row = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .ok()?;
        let backend: i32 = row.get(0);
        let (name, parent) = name_and_parent(backend)?;
        let (postmaster_name, _) = name_and_parent(parent)?;
        (name == "postgres" && postmaster_name == "postgres")
            .then_some(Postgres::Postmaster(parent))
    }

    fn processes(self) -> Option<Vec<i32>> {
        match self {
            Postgres::Cluster(c) => c.processes().ok(),
            Postgres::Postmaster(pid) => Some(embedded_pg::processes_of(pid)),
        }
    }
}

/// A process's command name and its parent's PID, from `/proc/<pid>/stat`.
fn name_and_parent(pid: i32) -> Option<(String, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    let parent = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((name, parent))
}

impl CpuSnapshot {
    /// CPU times now, the Postgres processes' read from `cluster`'s.
    pub fn take(cluster: Option<&embedded_pg::Cluster>) -> Self {
        Self::take_of(cluster.map(Postgres::Cluster))
    }

    /// CPU times now, the Postgres processes' read from `postgres`'s.
    pub fn take_of(postgres: Option<Postgres<'_>>) -> Self {
        Self {
            server: usage(UsageWho::RUSAGE_SELF),
            children: usage(UsageWho::RUSAGE_CHILDREN),
            postgres: postgres.and_then(Postgres::processes).map(|pids| {
                pids.into_iter()
                    .filter_map(|pid| {
                        let (start, cpu) = process_cpu(pid)?;
                        Some(((pid, start), cpu))
                    })
                    .collect()
            }),
            machine: machine_ticks(),
        }
    }

    /// What was spent from `earlier` to this snapshot. A Postgres process
    /// that started in between counts whole; one that ended in between is
    /// not counted (a run's pooled connections outlive it).
    pub fn since(&self, earlier: &Self) -> CpuUse {
        let postgres = match (&self.postgres, &earlier.postgres) {
            (Some(now), Some(before)) => Some(
                now.iter()
                    .map(|(id, cpu)| {
                        cpu.saturating_sub(before.get(id).copied().unwrap_or_default())
                    })
                    .sum(),
            ),
            _ => None,
        };
        let idle = match (self.machine, earlier.machine) {
            (Some((idle, total)), Some((idle0, total0))) if total > total0 => {
                Some(idle.saturating_sub(idle0) as f64 / (total - total0) as f64)
            }
            _ => None,
        };
        CpuUse {
            server: self.server.saturating_sub(earlier.server),
            load: self.children.saturating_sub(earlier.children),
            postgres,
            idle,
        }
    }
}

impl CpuUse {
    /// Microseconds of CPU per request, of `spent` over `requests`.
    pub fn per_request_us(spent: Duration, requests: u64) -> f64 {
        spent.as_secs_f64() * 1e6 / requests.max(1) as f64
    }

    /// One line for a run of `requests` requests: CPU per request by
    /// process, and the idle share.
    pub fn describe(&self, requests: u64) -> String {
        let us = |d: Duration| Self::per_request_us(d, requests);
        let mut line = format!(
            "CPU per request: server {:.1} µs, load generator {:.1} µs",
            us(self.server),
            us(self.load)
        );
        if let Some(pg) = self.postgres {
            let _ = write!(line, ", Postgres {:.1} µs", us(pg));
        }
        if let Some(idle) = self.idle {
            let _ = write!(line, "; machine idle {:.0}%", idle * 100.0);
        }
        line
    }
}

fn usage(who: UsageWho) -> Duration {
    getrusage(who).map_or(Duration::ZERO, |u: Usage| {
        // Never negative: these are times spent.
        let time = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
        };
        time(u.user_time()) + time(u.system_time())
    })
}

/// A process's start time (in ticks since boot) and its user plus system
/// CPU time, from `/proc/<pid>/stat`; `None` once it has ended.
fn process_cpu(pid: i32) -> Option<(u64, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_process_stat(&stat)
}

/// [`process_cpu`] of the text of a `/proc/<pid>/stat`.
fn parse_process_stat(stat: &str) -> Option<(u64, Duration)> {
    // The command, in parentheses, may hold spaces and parentheses: the
    // fields are counted from after the last `)`. There, field 3 (state)
    // is the first; utime and stime are fields 14 and 15, starttime 22.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = field(14)? + field(15)?;
    Some((field(22)?, ticks_to_duration(ticks)))
}

/// The machine's idle ticks (idle and waiting for I/O) and all its ticks,
/// from the first line of `/proc/stat`.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine_ticks(stat.lines().next()?)
}

/// [`machine_ticks`] of the `cpu` line of `/proc/stat`.
fn parse_machine_ticks(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal; guest time is
    // already part of user time, so the columns after steal are left out.
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if ticks.len() < 5 {
        return None;
    }
    Some((ticks[3] + ticks[4], ticks.iter().sum()))
}

fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_stat_is_read_past_a_command_with_spaces_and_parentheses() {
        // A postgres backend's line (fields 3 to 22, then the rest).
        let stat = "4242 (postgres: a) b) S 4200 4200 4200 0 -1 4194560 900 0 0 0 \
                    250 37 0 0 20 0 1 0 123456 2000000 500 18446744073709551615";
        assert_eq!(
            parse_process_stat(stat),
            Some((123_456, Duration::from_millis(2_870)))
        );
        assert_eq!(parse_process_stat("4242 (cut short) S 1 2"), None);
    }

    #[test]
    fn the_machine_line_gives_idle_and_total_ticks() {
        let line = "cpu  100 5 50 800 20 1 2 7 30 0";
        // idle 800 + iowait 20; total of the first eight (guest is in user).
        assert_eq!(parse_machine_ticks(line), Some((820, 985)));
        assert_eq!(parse_machine_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
    }

    /// A snapshot of the given Postgres processes ((PID, start), ms) and
    /// idle and total machine ticks.
    fn snapshot(
        server_ms: u64,
        postgres: &[((i32, u64), u64)],
        machine: (u64, u64),
    ) -> CpuSnapshot {
        CpuSnapshot {
            server: Duration::from_millis(server_ms),
            children: Duration::from_millis(server_ms / 2),
            postgres: Some(
                postgres
                    .iter()
                    .map(|&(id, ms)| (id, Duration::from_millis(ms)))
                    .collect(),
            ),
            machine: Some(machine),
        }
    }

    #[test]
    fn postgres_processes_count_what_they_spent_in_between() {
        let before = snapshot(
            1_000,
            &[((10, 5), 300), ((11, 5), 200), ((12, 5), 50)],
            (100, 1_000),
        );
        let after = snapshot(
            1_600,
            // 10 ran on; 11 ended (its PID now names a new process, 40 ms
            // old); 12 ended; 13 started in between.
            &[((10, 5), 450), ((11, 900), 40), ((13, 950), 70)],
            (130, 1_200),
        );
        let spent = after.since(&before);
        assert_eq!(spent.server, Duration::from_millis(600));
        assert_eq!(spent.load, Duration::from_millis(300));
        assert_eq!(spent.postgres, Some(Duration::from_millis(150 + 40 + 70)));
        assert_eq!(spent.idle, Some(30.0 / 200.0));
        assert_eq!(CpuUse::per_request_us(spent.server, 1_000), 600.0);
        assert_eq!(
            spent.describe(1_000),
            "CPU per request: server 600.0 µs, load generator 300.0 µs, \
             Postgres 260.0 µs; machine idle 15%"
        );
    }

    #[test]
    fn without_a_cluster_or_machine_figures_those_parts_are_left_out() {
        let mut before = snapshot(0, &[], (0, 0));
        let mut after = snapshot(10, &[], (0, 0));
        before.postgres = None;
        after.postgres = None;
        let spent = after.since(&before);
        assert_eq!((spent.postgres, spent.idle), (None, None));
        assert_eq!(
            spent.describe(1),
            "CPU per request: server 10000.0 µs, load generator 5000.0 µs"
        );
    }

    #[test]
    fn this_process_is_charged_for_the_work_it_does() {
        let before = CpuSnapshot::take(None);
        // Bounded by the wall clock, as a busy machine may lend this test
        // little of its CPU.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let spent = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let spent = CpuSnapshot::take(None).since(&before);
            if spent.server >= Duration::from_millis(30) {
                break spent;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no CPU time charged: {spent:?}"
            );
        };
        // Other tests' threads count too, but no more than every core
        // for the whole time (with a tick of slack): a unit read wrong
        // would be out by a factor of a thousand.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let most = started.elapsed() * u32::try_from(cores).unwrap_or(u32::MAX)
            + Duration::from_millis(20);
        assert!(spent.server <= most, "{spent:?} in {:?}", started.elapsed());
        assert_eq!(spent.postgres, None);
        let idle = spent.idle.expect("/proc/stat is readable");
        assert!((0.0..=1.0).contains(&idle), "{idle}");
    }
}

//! The standard `process_*` metrics (CPU time, resident memory, open and
//! most file descriptors, threads, start time), read from `/proc/self` at
//! scrape time, and the process's log lines dropped
//! (`log_lines_dropped_total`, see [`crate::logs`]).
//!
//! Hand-written because prometheus-client has no process collector, and
//! the crates that add one pull in a second metrics stack; these are a few
//! reads of `/proc`. On systems without `/proc` nothing is exported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Reads `/proc/self` on each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What one scrape read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Threads.
    pub threads: u64,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit on open file descriptors.
    pub max_fds: u64,
}

impl ProcessStats {
    /// This process's, or `None` where `/proc` cannot be read.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces and parentheses: the
        // fields after it start after its last ')'.
        let after_name = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // Counting from the state (field 3) at index 0.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let ticks = clock_ticks()?;
        let page = page_size()?;
        let boot_time = boot_time()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let (max_fds, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            resident_bytes: field(24)? * page,
            threads: field(20)?,
            start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
            // Minus the one `read_dir` itself held open.
            open_fds: open_fds.saturating_sub(1),
            max_fds,
        })
    }
}

/// The system's boot time (Unix seconds), read from `/proc/stat` once:
/// it does not change while the process runs.
fn boot_time() -> Option<u64> {
    static BOOT_TIME: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BOOT_TIME.get_or_init(|| {
        std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
    })
}

fn clock_ticks() -> Option<f64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    (ticks > 0).then_some(ticks as f64)
}

fn page_size() -> Option<u64> {
    let size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok()??;
    u64::try_from(size).ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(dropped) = crate::logs::dropped_lines() {
            let dropped = ConstCounter::new(dropped);
            dropped.encode(encoder.encode_descriptor(
                "log_lines_dropped",
                "Log lines dropped: standard error could not keep up, or refused them",
                None,
                dropped.metric_type(),
            )?)?;
        }
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "User and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<&Unit>, f64); 5] = [
            (
                "process_resident_memory",
                "Resident memory size",
                Some(&Unit::Bytes),
                p.resident_bytes as f64,
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(&Unit::Seconds),
                p.start_time_seconds,
            ),
            ("process_threads", "Threads", None, p.threads as f64),
            (
                "process_open_fds",
                "Open file descriptors",
                None,
                p.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Most open file descriptors (the soft limit)",
                None,
                p.max_fds as f64,
            ),
        ];
        for (name, help, unit, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, unit, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_sensibly() {
        let Some(p) = ProcessStats::read() else {
            return; // no /proc here
        };
        assert!(p.resident_bytes > 1 << 20, "{p:?}");
        assert!(p.threads >= 1);
        assert!(p.open_fds >= 3 && p.open_fds <= p.max_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0,
            "{p:?}"
        );
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        let later = ProcessStats::read().unwrap();
        assert!(later.cpu_seconds >= p.cpu_seconds);
    }
}

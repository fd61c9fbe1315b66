//! The `timeline` part: the defaults while the round trip and a competing
//! load change, every 100 ms; how long each change took to settle, and
//! what each phase settles at beside the best fixed limit under the same
//! conditions.

use super::*;

/// What changes at the start of each phase of the timeline.
#[derive(Debug, Clone, Copy)]
struct Phase {
    name: &'static str,
    rtt: Duration,
    competing: bool,
}

const PHASES: [Phase; 5] = [
    Phase {
        name: "+0 ms",
        rtt: Duration::ZERO,
        competing: false,
    },
    Phase {
        name: "+5 ms",
        rtt: Duration::from_millis(5),
        competing: false,
    },
    Phase {
        name: "+0 ms again",
        rtt: Duration::ZERO,
        competing: false,
    },
    Phase {
        name: "+0 ms, competing bulk load",
        rtt: Duration::ZERO,
        competing: true,
    },
    Phase {
        name: "+0 ms, competing load stopped",
        rtt: Duration::ZERO,
        competing: false,
    },
];

/// Another client's load on the same database: back-to-back 1,000-key
/// `= ANY` statements on `connections` connections of its own, while
/// `on` is set.
async fn competing_load(
    config: tokio_postgres::Config,
    connections: usize,
    rows: u64,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, conn) = config.connect(NoTls).await?;
        tokio::spawn(conn);
        let stmt = client.prepare(KvQuery.batch_sql()).await?;
        let (on, stop) = (Arc::clone(&on), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut stream = KeyStream::new(77 + c as u64);
            while !stop.load(Relaxed) {
                if !on.load(Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                let keys: Vec<String> = (0..1_000)
                    .map(|_| reads::key(stream.next_below(rows)))
                    .collect();
                client.query(&stmt, &[&keys]).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

pub(super) async fn timeline(args: &Args, db: &Database) -> anyhow::Result<()> {
    let (upstream, direct_tcp) = reads::tcp_target(db).await?;
    let rows = args.table.rows;
    let proxy = Arc::new(DelayProxy::start_adjustable(upstream, Duration::ZERO)?);
    let pool: Pool = pgbatch::pg::pool(
        reads::via(&direct_tcp, proxy.addr()),
        &PoolOptions::with_max_size(args.pool_size),
    )?;
    let phase = Duration::from_secs_f64(args.phase_seconds);
    let interval = Duration::from_millis(100);
    let total = phase * PHASES.len() as u32;
    let n = 300;

    // The world changes on a schedule of its own.
    let (on, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let competitor = tokio::spawn(competing_load(
        db.config.clone(),
        2,
        rows,
        Arc::clone(&on),
        Arc::clone(&stop),
    ));
    let best = best_fixed(args, &pool, &proxy, &on).await?;
    // Built after the reference runs, so its limit starts as the
    // defaults' does: cold.
    let lookup = Arc::new(Lookup::new(
        "kv",
        KvQuery,
        pool,
        &reads::read_settings(ReadPath::Batched, BatchSettings::default()),
    )?);
    let limits: Arc<Vec<AtomicU64>> = Arc::new(
        (0..=(total.as_millis() / interval.as_millis()) as usize)
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let start = Instant::now();
    let schedule = {
        let (lookup, limits, on) = (Arc::clone(&lookup), Arc::clone(&limits), Arc::clone(&on));
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            let mut phase_seen = usize::MAX;
            loop {
                tick.tick().await;
                let at = start.elapsed();
                let p = (at.as_nanos() / phase.as_nanos()) as usize;
                if p >= PHASES.len() {
                    break;
                }
                if p != phase_seen {
                    phase_seen = p;
                    proxy.set_rtt(PHASES[p].rtt);
                    on.store(PHASES[p].competing, Relaxed);
                }
                let i = (at.as_nanos() / interval.as_nanos()) as usize;
                if let (Some(slot), Some(s)) = (limits.get(i), lookup.batcher_stats()) {
                    slot.store(s.concurrency_limit, Relaxed);
                }
            }
        })
    };
    eprintln!(
        "timeline: {n} initiators, {} phases of {:.1} s",
        PHASES.len(),
        phase.as_secs_f64()
    );
    let reader = Arc::clone(&lookup);
    let series = closed_loop_timeline(n, total, interval, rows, move |k| {
        let lookup = Arc::clone(&reader);
        async move {
            if let Err(e) = lookup.get(reads::key(k)).await {
                panic!("{lookup:?} read failed: {e:#}");
            }
        }
    })
    .await;
    schedule.await?;
    stop.store(true, Relaxed);
    competitor.await??;
    lookup.shutdown().await;
    drop(proxy);

    let limits: Vec<u64> = limits.iter().map(|l| l.load(Relaxed)).collect();
    report_timeline(args, &series, &limits, &best, phase)?;
    Ok(())
}

/// The best fixed limit, and its reads/s, under each phase's conditions.
#[derive(Debug, Clone, Copy)]
struct BestFixed {
    limit: usize,
    per_sec: f64,
}

/// Runs every fixed limit of `--fixed` under the conditions of each
/// distinct phase (its round trip, the competing load on or off), at the
/// timeline's 300 initiators, each for `--seconds` after `--warmup`, in
/// `--rounds` interleaved rounds: the best median is the line the
/// timeline's limit and throughput are drawn against. Medians, because
/// the best of single runs is biased up (with the competing load, one run
/// per limit ranged 0.65-1.0 of the best between neighbouring limits).
/// Measured before the timeline rather than beside it, so the table's
/// ratio also carries the machine's drift over those minutes.
async fn best_fixed(
    args: &Args,
    pool: &Pool,
    proxy: &DelayProxy,
    competing: &AtomicBool,
) -> anyhow::Result<Vec<BestFixed>> {
    let run = Duration::from_secs_f64(args.runs.seconds);
    let warmup = Duration::from_secs_f64(args.runs.warmup);
    // The distinct conditions, and which of them each phase has.
    let mut conditions: Vec<Phase> = Vec::new();
    let of_phase: Vec<usize> = PHASES
        .iter()
        .map(|ph| {
            conditions
                .iter()
                .position(|q| q.rtt == ph.rtt && q.competing == ph.competing)
                .unwrap_or_else(|| {
                    conditions.push(*ph);
                    conditions.len() - 1
                })
        })
        .collect();
    let mut per_sec: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for round in 0..args.runs.rounds {
        for (k, cond) in conditions.iter().enumerate() {
            proxy.set_rtt(cond.rtt);
            competing.store(cond.competing, Relaxed);
            let mut fixed = args.fixed.clone();
            let turn = round % fixed.len().max(1);
            fixed.rotate_left(turn);
            for c in fixed {
                eprint!(
                    "timeline reference, round {}: {}, fixed {c}:",
                    round + 1,
                    cond.name
                );
                let r = reads::batched_run_warm(
                    pool,
                    settings(Setting::Fixed(c)),
                    300,
                    warmup,
                    run,
                    args.table.rows,
                )
                .await?;
                eprintln!(
                    "  {:.0} reads/s, p99 {:.2} ms, {:.1} keys per load",
                    r.report.per_sec(),
                    ms(r.report.quantile(0.99)),
                    r.mean_batch
                );
                per_sec.entry((k, c)).or_default().push(r.report.per_sec());
            }
        }
    }
    proxy.set_rtt(Duration::ZERO);
    competing.store(false, Relaxed);
    let best: Vec<BestFixed> = (0..conditions.len())
        .map(|k| {
            per_sec
                .range((k, 0)..(k + 1, 0))
                .map(|(&(_, limit), v)| BestFixed {
                    limit,
                    per_sec: median(v),
                })
                .max_by(|a, b| a.per_sec.total_cmp(&b.per_sec))
                .context("--fixed names at least one limit")
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(of_phase.into_iter().map(|k| best[k]).collect())
}

fn report_timeline(
    args: &Args,
    series: &Timeline,
    limits: &[u64],
    best: &[BestFixed],
    phase: Duration,
) -> anyhow::Result<()> {
    let per_phase = (phase.as_nanos() / series.interval.as_nanos()) as usize;
    let rates: Vec<f64> = series
        .intervals
        .iter()
        .map(|r| r.requests as f64 / series.interval.as_secs_f64())
        .collect();
    println!(
        "\nTimeline: 300 initiators, server defaults, through the adjustable proxy; every {} ms\n",
        series.interval.as_millis()
    );
    let mut rows = Vec::new();
    for (p, ph) in PHASES.iter().enumerate() {
        let from = p * per_phase;
        let to = ((p + 1) * per_phase).min(rates.len());
        if from >= to {
            break;
        }
        // What the phase settles at: its second half.
        let settled_from = from + (to - from) / 2;
        let settled = median(&rates[settled_from..to]);
        let p99 = median(
            &series.intervals[settled_from..to]
                .iter()
                .map(|r| ms(r.quantile(0.99)))
                .collect::<Vec<_>>(),
        );
        let lims: Vec<f64> = limits[from..to].iter().map(|&l| l as f64).collect();
        let (llo, lhi) = lims
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        // The first interval from which five in a row average 90% of it.
        let back = (from..to.saturating_sub(4))
            .find(|&i| rates[i..i + 5].iter().sum::<f64>() / 5.0 >= 0.9 * settled)
            .map(|i| (i - from) as f64 * series.interval.as_secs_f64());
        rows.push(vec![
            ph.name.to_owned(),
            format!("{:.1}", (from as f64) * series.interval.as_secs_f64()),
            format!("{settled:.0}"),
            format!("{p99:.2}"),
            format!("{:.0} ({llo:.0}-{lhi:.0})", median(&lims)),
            format!("{} ({:.0})", best[p].limit, best[p].per_sec),
            format!("{:.3}", settled / best[p].per_sec),
            back.map_or("never".to_owned(), |s| format!("{s:.1} s")),
        ]);
    }
    print_markdown(
        &[
            ("phase", Align::Left),
            ("from s", Align::Right),
            ("settled reads/s", Align::Right),
            ("settled p99 ms", Align::Right),
            ("limits (median, range)", Align::Left),
            ("best fixed (reads/s)", Align::Left),
            ("settled / best fixed", Align::Right),
            ("back to 90% after", Align::Right),
        ],
        rows,
    );
    plot_timeline(&args.timeline_svg, series, &rates, limits, best, per_phase)?;
    eprintln!("drew {}", args.timeline_svg.display());
    Ok(())
}

fn plot_timeline(
    path: &Path,
    series: &Timeline,
    rates: &[f64],
    limits: &[u64],
    best: &[BestFixed],
    per_phase: usize,
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let secs = |i: usize| i as f64 * series.interval.as_secs_f64();
    let end = secs(rates.len());
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((3, 1));
    let p99: Vec<f64> = series
        .intervals
        .iter()
        .map(|r| ms(r.quantile(0.99)))
        .collect();
    let lims: Vec<f64> = limits.iter().take(rates.len()).map(|&l| l as f64).collect();
    let captions = [
        "reads/s (100 ms intervals)",
        "p99 latency, ms",
        "concurrency limit chosen; dashed: the best fixed limit",
    ];
    // The best fixed setting's reads/s and limit per phase, drawn dashed
    // in the first and third panels (none for p99).
    let reference = |k: usize, p: usize| match k {
        0 => Some(best[p].per_sec),
        2 => Some(best[p].limit as f64),
        _ => None,
    };
    for (k, (area, values)) in panels.iter().zip([rates, &p99[..], &lims[..]]).enumerate() {
        let y_max = values
            .iter()
            .copied()
            .chain((0..best.len()).filter_map(|p| reference(k, p)))
            .fold(1.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(captions[k], ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..y_max)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .draw()
            .map_err(plot_err)?;
        for (p, ph) in PHASES.iter().enumerate().skip(1) {
            let x = secs(p * per_phase);
            chart
                .draw_series(LineSeries::new(vec![(x, 0.0), (x, y_max)], BLACK.mix(0.3)))
                .map_err(plot_err)?;
            if k == 0 {
                chart
                    .draw_series(std::iter::once(Text::new(
                        ph.name,
                        (x + 0.1, y_max * 0.95),
                        ("sans-serif", 12),
                    )))
                    .map_err(plot_err)?;
            }
        }
        chart
            .draw_series(LineSeries::new(
                values.iter().enumerate().map(|(i, &v)| (secs(i), v)),
                [BLUE, RED, GREEN][k].stroke_width(2),
            ))
            .map_err(plot_err)?;
        for p in 0..PHASES.len() {
            let Some(y) = reference(k, p) else { continue };
            let (from, to) = (secs(p * per_phase), secs((p + 1) * per_phase).min(end));
            chart
                .draw_series(DashedLineSeries::new(
                    [(from, y), (to, y)],
                    6,
                    4,
                    BLACK.stroke_width(2),
                ))
                .map_err(plot_err)?;
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

//! The `baseline` part: the hand-written minimal batcher swept for its
//! best setting, then that best, pgbatch at its defaults and pgbatch at
//! the best's connection count, in interleaved rounds.

use super::*;

/// A batcher the baseline part runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    /// pgbatch as the server sets it up by default.
    Defaults,
    /// pgbatch at the server's defaults but a fixed limit of as many loads
    /// as the minimal batcher's best setting has connections: what the
    /// engine costs, apart from the limit it chooses.
    Fixed(usize),
    /// The hand-written eager batcher (`benches::minimal`).
    Minimal {
        connections: usize,
        max_batch: usize,
    },
}

impl Contender {
    fn label(self) -> String {
        match self {
            Contender::Defaults => "pgbatch defaults".to_owned(),
            Contender::Fixed(n) => format!("pgbatch, fixed {n} loads"),
            Contender::Minimal {
                connections,
                max_batch,
            } => format!("minimal, {connections} connections, batches of {max_batch}"),
        }
    }
}

/// One baseline run of `contender` against the database direct, after the
/// warm-up.
async fn contend(
    args: &Args,
    db: &Database,
    pool: &Pool,
    contender: Contender,
) -> anyhow::Result<Sample> {
    let (n_initiators, rows) = (args.baseline_initiators, args.table.rows);
    let run = Duration::from_secs_f64(args.runs.seconds);
    let warmup = Duration::from_secs_f64(args.runs.warmup);
    eprintln!("baseline: {n_initiators} initiators, {}", contender.label());
    Ok(match contender {
        Contender::Defaults | Contender::Fixed(_) => {
            let setting = match contender {
                Contender::Fixed(loads) => Setting::Fixed(loads),
                _ => Setting::Auto,
            };
            let r =
                reads::batched_run_warm(pool, settings(setting), n_initiators, warmup, run, rows)
                    .await?;
            Sample::of(&r.report, r.mean_batch, r.limit, r.running)
        }
        Contender::Minimal {
            connections,
            max_batch,
        } => {
            let r = reads::minimal_run(
                &db.config,
                connections,
                max_batch,
                n_initiators,
                warmup,
                run,
                rows,
            )
            .await?;
            Sample::of(&r.report, r.mean_batch, 0, r.running)
        }
    })
}

/// Per round, `f` of the defaults over `f` of the minimal batcher.
fn per_round_ratio(
    defaults: &[Sample],
    minimal: &[Sample],
    f: impl Fn(&Sample) -> f64,
) -> Vec<f64> {
    defaults
        .iter()
        .zip(minimal)
        .map(|(d, m)| f(d) / f(m))
        .collect()
}

pub(super) async fn baseline(args: &Args, db: &Database) -> anyhow::Result<()> {
    // As the sweep's pool without added round trip.
    let pool = pgbatch::pg::pool(
        db.config.clone(),
        &PoolOptions::with_max_size(args.pool_size),
    )?;

    // Once each: the sweep only has to find the best, which the rounds
    // below then measure as carefully as the defaults.
    let mut swept = Vec::new();
    for &connections in &args.baseline_connections {
        for &max_batch in &args.baseline_caps {
            let m = Contender::Minimal {
                connections,
                max_batch,
            };
            swept.push(((connections, max_batch), contend(args, db, &pool, m).await?));
        }
    }
    let ((connections, max_batch), best_swept) = swept
        .iter()
        .copied()
        .max_by(|a, b| a.1.per_sec.total_cmp(&b.1.per_sec))
        .context("--baseline-connections and --baseline-caps give no setting")?;
    let best = Contender::Minimal {
        connections,
        max_batch,
    };
    println!(
        "\nMinimal eager batcher, {} rows, {} initiators, the database direct; each setting once, {:.1} s after {:.1} s of warm-up\n",
        args.table.rows, args.baseline_initiators, args.runs.seconds, args.runs.warmup
    );
    print_markdown(
        &[
            ("connections", Align::Right),
            ("batch cap", Align::Right),
            ("reads/s", Align::Right),
            ("p99 ms", Align::Right),
            ("mean batch", Align::Right),
        ],
        swept.iter().map(|((c, cap), s)| {
            vec![
                c.to_string(),
                cap.to_string(),
                format!("{:.0}", s.per_sec),
                format!("{:.2}", ms(s.p99)),
                format!("{:.1}", s.mean_batch),
            ]
        }),
    );
    println!(
        "\nbest: {} ({:.0} reads/s)",
        best.label(),
        best_swept.per_sec
    );

    let contenders = [Contender::Defaults, Contender::Fixed(connections), best];
    let mut runs: [Vec<Sample>; 3] = Default::default();
    for round in 0..args.runs.rounds {
        eprintln!("baseline round {} of {}", round + 1, args.runs.rounds);
        // Rotated each round, so none always runs first.
        let mut order = [0, 1, 2];
        order.rotate_left(round % 3);
        for i in order {
            runs[i].push(contend(args, db, &pool, contenders[i]).await?);
        }
    }
    println!(
        "\n{} rows, {} initiators, the database direct; pgbatch at the server's defaults on a pool of {} (and with a fixed limit of the minimal batcher's connections), the minimal batcher at its best setting above; {} interleaved rounds of {:.1} s after {:.1} s of warm-up; medians (range)\n",
        args.table.rows, args.baseline_initiators, args.pool_size, args.runs.rounds, args.runs.seconds, args.runs.warmup
    );
    print_markdown(
        &[
            ("batcher", Align::Left),
            ("reads/s", Align::Right),
            ("p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("mean batch", Align::Right),
            // Below the connections of a fixed setting, the database waited
            // between a connection's loads; below the fixed setting's, the
            // automatic limit ran fewer.
            ("loads running", Align::Right),
        ],
        contenders.iter().zip(&runs).map(|(c, v)| {
            vec![
                c.label(),
                spread(&v.iter().map(|s| s.per_sec).collect::<Vec<_>>(), 0),
                format!("{:.2}", median_by(v, |s| ms(s.p50))),
                format!("{:.2}", median_by(v, |s| ms(s.p99))),
                format!("{:.1}", median_by(v, |s| s.mean_batch)),
                spread(&v.iter().map(|s| s.running).collect::<Vec<_>>(), 2),
            ]
        }),
    );
    let [defaults, fixed, minimal] = &runs;
    let reads = per_round_ratio(defaults, minimal, |s| s.per_sec);
    let p99 = per_round_ratio(defaults, minimal, |s| ms(s.p99));
    println!();
    print_markdown(
        &[
            ("defaults / minimal best, per round", Align::Left),
            ("median (range)", Align::Right),
            ("target", Align::Left),
            ("verdict", Align::Left),
        ],
        [
            vec![
                "reads/s".to_owned(),
                spread(&reads, 3),
                "at least 1.0".to_owned(),
                verdict(median(&reads) >= 1.0).to_owned(),
            ],
            vec![
                "p99".to_owned(),
                spread(&p99, 3),
                "below 1.0".to_owned(),
                verdict(median(&p99) < 1.0).to_owned(),
            ],
        ],
    );
    // No target: where the defaults fall short, this says whether the
    // limit's choice or the engine's cost per load is why.
    let engine = per_round_ratio(fixed, minimal, |s| s.per_sec);
    let engine_p99 = per_round_ratio(fixed, minimal, |s| ms(s.p99));
    println!(
        "\npgbatch fixed at {connections} loads / minimal best, per round: reads/s {}, p99 {}",
        spread(&engine, 3),
        spread(&engine_p99, 3)
    );
    Ok(())
}

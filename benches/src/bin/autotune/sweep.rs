//! The `sweep` part: auto beside every fixed limit at each round trip and
//! number of initiators, in interleaved rounds; its table, CSV and plot.

use super::*;

pub(super) async fn sweep(args: &Args, db: &Database) -> anyhow::Result<()> {
    let (upstream, direct_tcp) = reads::tcp_target(db).await?;
    let rows = args.table.rows;
    let run = Duration::from_secs_f64(args.runs.seconds);
    let warmup = Duration::from_secs_f64(args.runs.warmup);
    // One pool per round trip, kept across rounds (and its proxy alive).
    let mut targets = Vec::new();
    for &ms in &args.rtt_ms {
        anyhow::ensure!(
            (0.0..=1_000.0).contains(&ms),
            "--rtt-ms {ms}: 0 to 1,000 ms"
        );
        let (config, proxy) = if ms == 0.0 {
            (db.config.clone(), None)
        } else {
            let proxy = DelayProxy::start(upstream, Duration::from_secs_f64(ms / 1e3))?;
            (reads::via(&direct_tcp, proxy.addr()), Some(proxy))
        };
        let pool = pgbatch::pg::pool(config, &PoolOptions::with_max_size(args.pool_size))?;
        targets.push((ms, pool, proxy));
    }
    let mut settings_list = vec![Setting::Auto];
    settings_list.extend(args.fixed.iter().map(|&n| Setting::Fixed(n)));

    eprintln!("warming up");
    reads::batched_run_warm(
        &targets[0].1,
        settings(Setting::Auto),
        300,
        warmup,
        run,
        rows,
    )
    .await?;

    let mut samples = Samples::new();
    let mut ceilings = Vec::new();
    for round in 0..args.runs.rounds {
        eprintln!("round {} of {}: ceiling", round + 1, args.runs.rounds);
        ceilings.push(reads::ceiling(&db.config, 10, 10_000, rows, run).await?);
        for (t, (ms, pool, _)) in targets.iter().enumerate() {
            for &n in &args.initiators {
                let mut these = settings_list.clone();
                if n == 1 {
                    these.push(Setting::Naive);
                }
                // Rotated each round, so no setting always runs first.
                let turn = round % these.len();
                these.rotate_left(turn);
                for setting in these {
                    eprintln!(
                        "round {}: +{ms} ms, {n} initiators, {}",
                        round + 1,
                        setting.label()
                    );
                    let sample = if setting == Setting::Naive {
                        let r = reads::naive_run(pool, n, run, rows).await;
                        Sample::of(&r, 1.0, 0, 0.0)
                    } else {
                        let r =
                            reads::batched_run_warm(pool, settings(setting), n, warmup, run, rows)
                                .await?;
                        Sample::of(&r.report, r.mean_batch, r.limit, r.running)
                    };
                    samples.entry((t, n, setting)).or_default().push(sample);
                }
            }
        }
    }
    let ceiling = median(&ceilings);
    print_sweep(args, &samples, &ceilings);
    append_csv(&args.csv, args, &samples, ceiling)?;
    plot_sweep(&args.svg, args, &samples)?;
    eprintln!(
        "appended to {} and drew {}",
        args.csv.display(),
        args.svg.display()
    );
    Ok(())
}

fn print_sweep(args: &Args, samples: &Samples, ceilings: &[f64]) {
    let rate = |s: &Sample| s.per_sec;
    println!(
        "\n{} rows, pool of {}, server defaults but the concurrency; {} interleaved rounds of {:.1} s after {:.1} s of warm-up; medians (range)\n",
        args.table.rows, args.pool_size, args.runs.rounds, args.runs.seconds, args.runs.warmup
    );
    let mut verdicts = Vec::new();
    let mut rows = Vec::new();
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        for &n in &args.initiators {
            let Some(auto) = samples.get(&(t, n, Setting::Auto)) else {
                continue;
            };
            let best = args
                .fixed
                .iter()
                .filter_map(|&c| {
                    samples
                        .get(&(t, n, Setting::Fixed(c)))
                        .map(|v| (c, median_by(v, rate), v))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let a = median_by(auto, rate);
            let (lo, hi) = range_by(auto, rate);
            let limits: Vec<String> = auto.iter().map(|s| s.limit.to_string()).collect();
            let (best_label, best_rate, ratio) = match best {
                Some((c, r, v)) => {
                    let (blo, bhi) = range_by(v, rate);
                    (c.to_string(), format!("{r:.0} ({blo:.0}-{bhi:.0})"), a / r)
                }
                None => ("-".to_owned(), "-".to_owned(), f64::NAN),
            };
            rows.push(vec![
                format!("{rtt} ms"),
                n.to_string(),
                format!("{a:.0} ({lo:.0}-{hi:.0})"),
                format!("{:.2}", median_by(auto, |s| ms(s.p99))),
                limits.join(", "),
                best_label,
                best_rate,
                format!("{ratio:.3}"),
                verdict(ratio >= 0.95).to_owned(),
            ]);
            if ratio.is_finite() {
                verdicts.push(ratio >= 0.95);
            }
        }
    }
    print_markdown(
        &[
            ("added RTT", Align::Right),
            ("initiators", Align::Right),
            ("auto reads/s", Align::Right),
            ("auto p99 ms", Align::Right),
            ("auto limit (end)", Align::Right),
            ("best fixed", Align::Right),
            ("its reads/s", Align::Right),
            ("auto / best", Align::Right),
            ("within 5%", Align::Left),
        ],
        rows,
    );
    println!(
        "\ntarget: auto within 5% of the best fixed concurrency at every point: {} ({} of {})",
        verdict(verdicts.iter().all(|&ok| ok)),
        verdicts.iter().filter(|&&ok| ok).count(),
        verdicts.len()
    );
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        let (Some(naive), Some(auto)) = (
            samples.get(&(t, 1, Setting::Naive)),
            samples.get(&(t, 1, Setting::Auto)),
        ) else {
            continue;
        };
        let (n50, a50) = (
            median_by(naive, |s| ms(s.p50)),
            median_by(auto, |s| ms(s.p50)),
        );
        println!(
            "target: +{rtt} ms, 1 initiator, p50 at most 1.05x naive: {} ({a50:.3} ms vs {n50:.3} ms, {:.3}x)",
            verdict(a50 <= 1.05 * n50),
            a50 / n50
        );
    }
    let direct = args.rtt_ms.iter().position(|&ms| ms == 0.0);
    if let Some(auto) = direct.and_then(|t| samples.get(&(t, 300, Setting::Auto))) {
        let ceiling = median(ceilings);
        let a = median_by(auto, rate);
        let p99 = median_by(auto, |s| ms(s.p99));
        println!(
            "target: 300 initiators, defaults, at least 0.75 of the bulk ceiling: {} ({a:.0} of {ceiling:.0} keys/s, {:.2}; ceiling rounds {})",
            verdict(a >= 0.75 * ceiling),
            a / ceiling,
            ceilings.iter().map(|c| format!("{c:.0}")).collect::<Vec<_>>().join(", ")
        );
        println!(
            "target: 300 initiators, defaults, p99 at most 3 ms: {} ({p99:.2} ms)",
            verdict(p99 <= 3.0)
        );
    }
}

fn append_csv(path: &Path, args: &Args, samples: &Samples, ceiling: f64) -> anyhow::Result<()> {
    let (mut f, now) = benches::append_csv(
        path,
        "unix_time,rows,added_rtt_ms,initiators,concurrency,round,reads_per_sec,p50_ms,p99_ms,mean_batch,limit_at_end,ceiling_keys_per_sec",
    )?;
    for ((t, n, setting), runs) in samples {
        for (round, s) in runs.iter().enumerate() {
            writeln!(
                f,
                "{now},{},{},{n},{},{},{:.0},{:.3},{:.3},{:.1},{},{ceiling:.0}",
                args.table.rows,
                args.rtt_ms[*t],
                setting.label(),
                round + 1,
                s.per_sec,
                ms(s.p50),
                ms(s.p99),
                s.mean_batch,
                s.limit
            )?;
        }
    }
    Ok(())
}

fn plot_sweep(path: &Path, args: &Args, samples: &Samples) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let (rows, cols) = (args.rtt_ms.len(), args.initiators.len());
    let root = SVGBackend::new(path, (280 * cols as u32, 240 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let panels = root.split_evenly((rows, cols));
    let max_c = args.fixed.iter().copied().max().unwrap_or(16) as f64;
    for (t, &rtt) in args.rtt_ms.iter().enumerate() {
        for (i, &n) in args.initiators.iter().enumerate() {
            let area = &panels[t * cols + i];
            let fixed: Vec<(f64, f64)> = args
                .fixed
                .iter()
                .filter_map(|&c| {
                    samples
                        .get(&(t, n, Setting::Fixed(c)))
                        .map(|v| (c as f64, median_by(v, |s| s.per_sec)))
                })
                .collect();
            let auto = samples
                .get(&(t, n, Setting::Auto))
                .map(|v| median_by(v, |s| s.per_sec));
            let y_max = fixed.iter().map(|p| p.1).chain(auto).fold(1.0, f64::max) * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(format!("+{rtt} ms, {n} initiators"), ("sans-serif", 14))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(48)
                .build_cartesian_2d(0.5f64..max_c + 0.5, 0f64..y_max)
                .map_err(plot_err)?;
            chart
                .configure_mesh()
                .x_desc("fixed concurrency")
                .y_desc("reads/s")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&reads_label)
                .draw()
                .map_err(plot_err)?;
            chart
                .draw_series(LineSeries::new(fixed.clone(), BLUE.stroke_width(2)))
                .map_err(plot_err)?
                .label("fixed")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
            chart
                .draw_series(fixed.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
                .map_err(plot_err)?;
            if let Some(a) = auto {
                chart
                    .draw_series(LineSeries::new(
                        vec![(0.5, a), (max_c + 0.5, a)],
                        RED.stroke_width(2),
                    ))
                    .map_err(plot_err)?
                    .label("auto")
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE)
                .border_style(BLACK)
                .draw()
                .map_err(plot_err)?;
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

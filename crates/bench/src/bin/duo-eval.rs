//! `./dev eval`: the evaluation sets (tool selection, grounded answers, QA
//! judged by a model) run through the whole system, a table per set, JSON
//! for later, and a comparison with the stored baseline. See
//! `docs/evaluation.md` and `crates/bench/src/eval/`.
//!
//! Options:
//! - `--model fake|bundled|real`: without it, `real` when
//!   `REAL_AI_REQUEST=1` and `ANTHROPIC_API_KEY` or `OPENAI_BASE_URL` is
//!   set, `bundled` otherwise.
//! - `--judge fake|bundled|anthropic|openai`: the QA judge (by default the
//!   one that goes with the model; `DUO_EVAL_JUDGE_MODEL`,
//!   `DUO_EVAL_JUDGE_BASE_URL` and `DUO_EVAL_JUDGE_API_KEY` configure it).
//! - `--set full|tiny|tool-selection|grounded|qa|ID,ID`: which cases (full).
//! - `--out PATH`: the JSON (default `target/duo-eval/<model>-<set>.json`).
//! - `--baseline PATH`: the baseline (default `eval/baseline-<model>.json`).
//! - `--update-baseline`: write this run's results into the baseline.
//! - `--fail-on-regression`: exit 1 when a case did worse than the baseline.
//! - `--timeout SECS`: how long one answer may take.
//! - `DUO_EVAL_VERBOSE=1` prints each case as it finishes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bench::eval::report::{self, Baseline};
use bench::eval::{self, JudgeKind, ModelKind, RunConfig};
use bench::load_average;

struct Args {
    config: RunConfig,
    out: Option<PathBuf>,
    baseline: Option<PathBuf>,
    update_baseline: bool,
    fail_on_regression: bool,
}

const USAGE: &str = "duo-eval [--model fake|bundled|real] [--judge fake|bundled|anthropic|openai] [--set full|tiny|tool-selection|grounded|qa|ID,ID] [--out PATH] [--baseline PATH] [--update-baseline] [--fail-on-regression] [--timeout SECS]";

fn parse_args() -> anyhow::Result<Args> {
    let mut model = None;
    let mut judge = None;
    let mut selection = "full".to_owned();
    let mut timeout = None;
    let (mut out, mut baseline) = (None, None);
    let (mut update_baseline, mut fail_on_regression) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => {
                let v = value()?;
                model = Some(ModelKind::from_name(&v).with_context(|| format!("--model {v}?"))?);
            }
            "--judge" => {
                let v = value()?;
                judge = Some(JudgeKind::from_name(&v).with_context(|| format!("--judge {v}?"))?);
            }
            "--set" => selection = value()?,
            "--out" => out = Some(PathBuf::from(value()?)),
            "--baseline" => baseline = Some(PathBuf::from(value()?)),
            "--timeout" => {
                timeout = Some(Duration::from_secs(
                    value()?.parse().context("--timeout SECS")?,
                ));
            }
            "--update-baseline" => update_baseline = true,
            "--fail-on-regression" => fail_on_regression = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown option {other}\nusage: {USAGE}"),
        }
    }
    let model = model.unwrap_or_else(ModelKind::default_from_env);
    let mut config = RunConfig::new(model, &selection);
    if let Some(judge) = judge {
        config.judge = judge;
    }
    if let Some(timeout) = timeout {
        config.timeout = timeout;
    }
    config.verbose = std::env::var_os("DUO_EVAL_VERBOSE").is_some();
    Ok(Args {
        config,
        out,
        baseline,
        update_baseline,
        fail_on_regression,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    let args = parse_args()?;
    let config = &args.config;
    println!(
        "eval: set {}, model {}, {} build; {} CPUs, load average {}",
        config.selection,
        config.model.name(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    let run = eval::run(config).await?;
    println!("model: {}; judge: {}\n", run.model_detail, run.judge);
    print!("{}", report::render_table(&run.results));

    let out = args.out.clone().unwrap_or_else(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| e2e_tests::repo_root().join("target"));
        let name = config.selection.replace([',', '/'], "_");
        target
            .join("duo-eval")
            .join(format!("{}-{name}.json", config.model.name()))
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&run.to_json())?)
        .with_context(|| out.display().to_string())?;
    println!("\nJSON: {}", out.display());

    let baseline_path = args
        .baseline
        .clone()
        .unwrap_or_else(|| eval::baseline_path(&config.dir, config.model));
    let stored = Baseline::load(&baseline_path)?;
    let mut regressions = 0;
    match &stored {
        Some(baseline) => {
            let comparison = report::compare(&run.results, baseline);
            regressions = comparison.regressions().len();
            println!("\nagainst {}:", baseline_path.display());
            print!("{}", report::render_comparison(&comparison));
        }
        None => println!(
            "\nno baseline at {} (write one with --update-baseline)",
            baseline_path.display()
        ),
    }
    if args.update_baseline {
        let fresh = Baseline::from_results(&run.results);
        let merged = stored.unwrap_or_default().merged(&fresh);
        merged.save(&baseline_path, config.model.name())?;
        println!("baseline updated: {}", baseline_path.display());
    }
    if args.fail_on_regression && regressions > 0 {
        eprintln!("{regressions} case(s) did worse than the baseline");
        std::process::exit(1);
    }
    Ok(())
}

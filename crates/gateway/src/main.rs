//! `duo-gateway`: the AI gateway server.

use gateway::Config;
use std::process::ExitCode;

// jemalloc gives freed memory back to the system a few seconds after a burst
// of large requests; glibc's allocator kept most of a burst's peak for good
// (measured with `./dev bench hostile`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[actix_web::main]
async fn main() -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(err) => {
            // Logging is configured from the same variables, so use stderr.
            eprintln!("duo-gateway: {err}");
            return ExitCode::from(2);
        }
    };
    let _telemetry = gateway::observability::init_logging(&config.log_level, config.log_json);
    match gateway::app::serve(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "gateway failed");
            eprintln!("duo-gateway: {err}");
            ExitCode::FAILURE
        }
    }
}

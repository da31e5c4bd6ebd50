//! Generates the Duo Workflow messages and the gRPC service (server and
//! client) from `proto/duo_workflow.proto` with tonic.
//!
//! protoc and the well-known types it imports (`google/protobuf/struct.proto`)
//! come from the `protoc-bin-vendored` package, so the build needs no system
//! protoc and no download. protoc is handed to prost-build directly rather
//! than through the `PROTOC` variable: changing the environment is `unsafe` in
//! edition 2024, which the workspace forbids.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = proto_dir.join("duo_workflow.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            config,
            &[proto],
            &[proto_dir, protoc_bin_vendored::include_path()?],
        )?;
    Ok(())
}

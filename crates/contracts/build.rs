//! Generates the Duo Workflow message types from `proto/duo_workflow.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` package, so the build needs no
//! system protoc and no download. It is handed to prost-build directly rather
//! than through the `PROTOC` variable: changing the environment is `unsafe` in
//! edition 2024, which the workspace forbids.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = proto_dir.join("duo_workflow.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    prost_build::Config::new()
        .protoc_executable(protoc_bin_vendored::protoc_bin_path()?)
        .compile_protos(&[proto], &[proto_dir])?;
    Ok(())
}

//! Compiles `proto/duo_workflow.proto` into a descriptor set, so the executor
//! socket can translate protojson frames to and from the service's binary
//! messages (`workflows::protojson`). protoc comes from `protoc-bin-vendored`:
//! no system protoc, no download.

use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = proto_dir.join("duo_workflow.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    // The migrations are embedded at compile time (`refinery::embed_migrations!`);
    // rustc does not notice a new file in their directory, cargo does.
    println!("cargo:rerun-if-changed=migrations");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("duo_workflow_descriptor.bin");
    let status = Command::new(protoc_bin_vendored::protoc_bin_path()?)
        .arg("--include_imports")
        .arg(format!("--descriptor_set_out={}", out.display()))
        .arg(format!("-I{}", proto_dir.display()))
        .arg(format!(
            "-I{}",
            protoc_bin_vendored::include_path()?.display()
        ))
        .arg(&proto)
        .status()?;
    if !status.success() {
        return Err(format!("protoc failed on {}", proto.display()).into());
    }
    Ok(())
}

//! llama.cpp is linked as shared libraries (`libllama.so.0`, `libggml*.so.0`)
//! so that its CPU code can be loaded per instruction level at run time
//! (src/cpu_variant.rs). The run path finds them, without `LD_LIBRARY_PATH`,
//! in an install's `lib/` beside `bin/` (the container image), beside the
//! binary, and, for binaries run from the target directory, in
//! llama-cpp-sys-2's own output (its copies into `target/<profile>/` are
//! links to version symlinks that do not resolve there).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    let mut runpath = vec!["$ORIGIN/../lib".to_owned(), "$ORIGIN".to_owned()];
    if let Some(out_dir) = std::env::var_os("DEP_LLAMA_BACKENDS_DIR")
        .map(std::path::PathBuf::from)
        .and_then(|backends| backends.parent().map(|out| out.join("lib")))
    {
        runpath.push(out_dir.display().to_string());
    }
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", runpath.join(":"));
}

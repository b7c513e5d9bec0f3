//! Build script: writes every kernel family's interface (`interfaces.rs`:
//! push constants and flag bits, in Rust and GLSL), compiles every kernel
//! variant of `kernels.rs` from `glsl/*.comp` to SPIR-V with shaderc (or,
//! without the default `compile-shaders` feature, copies them from a normal
//! build's output: see `shaders.rs`), emits
//! the `Kernel` enum with the embedded SPIR-V into `OUT_DIR`, and
//! regenerates `include/combs.h` with cbindgen from `src/ffi`.

mod interfaces;
mod kernels;
mod shaders;

use std::path::{Path, PathBuf};

fn write_header(root: &Path) {
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable and valid");
    // Only src/ffi is parsed: the header holds the C API and nothing else
    // (a `#[repr(u32)]` enum elsewhere in the crate would otherwise leak into it).
    let bindings = cbindgen::Builder::new()
        .with_src(root.join("src").join("ffi").join("mod.rs"))
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate include/combs.h: {e}"));
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    let path = root.join("include").join("combs.h");
    // Rewrite only on change so the header's mtime (and dependent C builds) stay stable.
    if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
        std::fs::create_dir_all(root.join("include")).expect("include/ is creatable");
        std::fs::write(&path, bytes).expect("include/combs.h is writable");
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let glsl_dir = root.join("glsl");
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=glsl");
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=cbindgen.toml");

    // libcombs.so carries the soname libcombs.so.<major> (scripts/install.sh
    // installs libcombs.so.<version> with the .so.<major> and .so links).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcombs.so.{major}");
    }

    let ifaces = interfaces::interfaces();
    if let Err(e) = interfaces::check(&ifaces) {
        eprintln!("build/interfaces.rs: {e}");
        std::process::exit(1);
    }
    std::fs::write(
        out_dir.join("interfaces.rs"),
        interfaces::rust_source(&ifaces),
    )
    .expect("OUT_DIR is writable");
    let iface_dir = out_dir.join("glsl");
    std::fs::create_dir_all(iface_dir.join("iface")).expect("OUT_DIR is writable");
    for i in &ifaces {
        let path = iface_dir.join("iface").join(format!("{}.glsl", i.family));
        std::fs::write(path, interfaces::glsl_source(i)).expect("OUT_DIR is writable");
    }

    let table = kernels::kernels();
    shaders::build(&glsl_dir, &iface_dir, &out_dir, &table);
    std::fs::write(out_dir.join("kernels.rs"), kernels::enum_source(&table))
        .expect("OUT_DIR is writable");
    write_header(&root);
}

//! Build script: writes every kernel family's interface (`interfaces.rs`:
//! push constants and flag bits, in Rust and GLSL), compiles every kernel
//! variant of `kernels.rs` from `glsl/*.comp` to SPIR-V with shaderc, emits
//! the `Kernel` enum with the embedded SPIR-V into `OUT_DIR`, and
//! regenerates `include/combs.h` with cbindgen from `src/ffi`.

mod interfaces;
mod kernels;

use std::path::{Path, PathBuf};

use kernels::KernelDef;

fn compile(glsl_dir: &Path, iface_dir: &Path, out_dir: &Path, k: &KernelDef) -> Result<(), String> {
    let compiler = shaderc::Compiler::new().map_err(|e| format!("shaderc: {e}"))?;
    let mut opts = shaderc::CompileOptions::new().map_err(|e| format!("shaderc: {e}"))?;
    if k.vulkan13 {
        opts.set_target_env(
            shaderc::TargetEnv::Vulkan,
            shaderc::EnvVersion::Vulkan1_3 as u32,
        );
        opts.set_target_spirv(shaderc::SpirvVersion::V1_6);
    } else {
        opts.set_target_env(
            shaderc::TargetEnv::Vulkan,
            shaderc::EnvVersion::Vulkan1_2 as u32,
        );
        opts.set_target_spirv(shaderc::SpirvVersion::V1_5);
    }
    opts.set_optimization_level(shaderc::OptimizationLevel::Performance);
    for (name, value) in &k.defines {
        opts.add_macro_definition(name, Some(value));
    }
    let base = glsl_dir.to_path_buf();
    // The generated interfaces (`iface/<family>.glsl`) live in OUT_DIR.
    let generated = iface_dir.to_path_buf();
    opts.set_include_callback(move |requested, _kind, requester, _depth| {
        let from = Path::new(requester).parent().unwrap_or(&base).to_path_buf();
        let candidates = [
            from.join(requested),
            base.join(requested),
            generated.join(requested),
        ];
        for path in candidates {
            if let Ok(content) = std::fs::read_to_string(&path) {
                return Ok(shaderc::ResolvedInclude {
                    resolved_name: path.display().to_string(),
                    content,
                });
            }
        }
        Err(format!("cannot find include `{requested}`"))
    });
    let path = glsl_dir.join(k.file);
    let source = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let artifact = compiler
        .compile_into_spirv(
            &source,
            shaderc::ShaderKind::Compute,
            &path.display().to_string(),
            "main",
            Some(&opts),
        )
        .map_err(|e| format!("kernel `{}` ({}):\n{e}", k.name, k.file))?;
    std::fs::write(
        out_dir.join(format!("{}.spv", k.name)),
        artifact.as_binary_u8(),
    )
    .map_err(|e| format!("writing {}.spv: {e}", k.name))
}

fn compile_all(glsl_dir: &Path, iface_dir: &Path, out_dir: &Path, table: &[KernelDef]) {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .min(table.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(k) = table.get(i) else { break };
                    if let Err(e) = compile(glsl_dir, iface_dir, out_dir, k) {
                        errors.lock().expect("no panics while held").push(e);
                    }
                }
            });
        }
    });
    let errors = errors.into_inner().expect("threads joined");
    if !errors.is_empty() {
        // Exit rather than panic: the compiler's file:line messages are the report.
        eprintln!("shader compilation failed:\n{}", errors.join("\n"));
        std::process::exit(1);
    }
}

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
    compile_all(&glsl_dir, &iface_dir, &out_dir, &table);
    std::fs::write(out_dir.join("kernels.rs"), kernels::enum_source(&table))
        .expect("OUT_DIR is writable");
    write_header(&root);
}

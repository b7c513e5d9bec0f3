//! SPIR-V for every kernel variant: compiled with shaderc (the default
//! `compile-shaders` feature), or copied from a directory of kernels an
//! earlier build compiled (`COMBS_SPIRV_DIR`). The second way exists for
//! builds with another toolchain or sanitizer flags (`fuzz/`), where building
//! shaderc from source again would take a quarter of an hour; a stamp of the
//! sources keeps it from embedding kernels of another revision.

use std::path::Path;

use crate::kernels::KernelDef;

/// File in the output directory that names the sources the kernels came from.
const STAMP: &str = "kernels.stamp";

/// FNV-1a over the GLSL sources and the variant table: what decides the SPIR-V.
fn stamp(glsl_dir: &Path, iface_dir: &Path, table: &[KernelDef]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    for dir in [glsl_dir, &iface_dir.join("iface")] {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            if f.is_file() {
                eat(f.file_name().map_or(&[][..], |n| n.as_encoded_bytes()));
                eat(&std::fs::read(&f).unwrap_or_default());
            }
        }
    }
    for k in table {
        eat(k.name.as_bytes());
        eat(k.file.as_bytes());
        for (n, v) in &k.defines {
            eat(n.as_bytes());
            eat(v.as_bytes());
        }
        eat(&[u8::from(k.vulkan13)]);
    }
    format!("{h:016x}\n")
}

/// Writes `<name>.spv` for every variant of `table` into `out_dir`.
pub fn build(glsl_dir: &Path, iface_dir: &Path, out_dir: &Path, table: &[KernelDef]) {
    let stamp = stamp(glsl_dir, iface_dir, table);
    #[cfg(feature = "compile-shaders")]
    compile::compile_all(glsl_dir, iface_dir, out_dir, table);
    #[cfg(not(feature = "compile-shaders"))]
    copy_prebuilt(out_dir, table, &stamp);
    std::fs::write(out_dir.join(STAMP), stamp).expect("OUT_DIR is writable");
}

#[cfg(not(feature = "compile-shaders"))]
fn copy_prebuilt(out_dir: &Path, table: &[KernelDef], stamp: &str) {
    println!("cargo:rerun-if-env-changed=COMBS_SPIRV_DIR");
    let fail = |msg: String| -> ! {
        eprintln!(
            "{msg}\nWithout the `compile-shaders` feature, COMBS_SPIRV_DIR must name the OUT_DIR \
             of a normal build of this same revision (target/release/build/combs-*/out, the one \
             holding {STAMP}); `fuzz/run.sh` finds it."
        );
        std::process::exit(1);
    };
    let Some(dir) = std::env::var_os("COMBS_SPIRV_DIR") else {
        fail("COMBS_SPIRV_DIR is not set.".into());
    };
    let dir = Path::new(&dir);
    println!("cargo:rerun-if-changed={}", dir.join(STAMP).display());
    match std::fs::read_to_string(dir.join(STAMP)) {
        Ok(s) if s == stamp => {}
        Ok(_) => fail(format!(
            "{} holds kernels compiled from other sources than these.",
            dir.display()
        )),
        Err(e) => fail(format!("{}: {e}", dir.join(STAMP).display())),
    }
    for k in table {
        let name = format!("{}.spv", k.name);
        if let Err(e) = std::fs::copy(dir.join(&name), out_dir.join(&name)) {
            fail(format!("{}: {e}", dir.join(&name).display()));
        }
    }
}

#[cfg(feature = "compile-shaders")]
mod compile {
    use std::path::Path;

    use crate::kernels::KernelDef;

    fn compile(
        glsl_dir: &Path,
        iface_dir: &Path,
        out_dir: &Path,
        k: &KernelDef,
    ) -> Result<(), String> {
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
        let source =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
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

    pub fn compile_all(glsl_dir: &Path, iface_dir: &Path, out_dir: &Path, table: &[KernelDef]) {
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
}

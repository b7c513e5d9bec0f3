//! Build script: compiles every kernel variant in `KERNELS` from `glsl/*.comp`
//! to SPIR-V with shaderc, emits `kernels.rs` (the `Kernel` enum with the
//! embedded SPIR-V) into `OUT_DIR`, and regenerates `include/combs.h` with
//! cbindgen from `src/ffi`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Every weight format a dequantizing kernel is built for, as (variant token, GLSL define).
const WEIGHT_TYPES: &[(&str, &str)] = &[
    ("f32", "DATA_A_F32"),
    ("f16", "DATA_A_F16"),
    ("bf16", "DATA_A_BF16"),
    ("q4_0", "DATA_A_Q4_0"),
    ("q4_1", "DATA_A_Q4_1"),
    ("q5_0", "DATA_A_Q5_0"),
    ("q5_1", "DATA_A_Q5_1"),
    ("q8_0", "DATA_A_Q8_0"),
    ("q2_k", "DATA_A_Q2_K"),
    ("q3_k", "DATA_A_Q3_K"),
    ("q4_k", "DATA_A_Q4_K"),
    ("q5_k", "DATA_A_Q5_K"),
    ("q6_k", "DATA_A_Q6_K"),
];

/// One kernel variant: its name (`<family>_<weights>_<activations>[_<feature>]`),
/// the `.comp` file, the defines that select the variant, and whether it needs
/// the Vulkan 1.3 / SPIR-V 1.6 target (cooperative matrix).
struct KernelDef {
    name: String,
    file: &'static str,
    defines: Vec<(String, String)>,
    vulkan13: bool,
}

fn def(name: impl Into<String>, file: &'static str, defines: &[(&str, &str)]) -> KernelDef {
    KernelDef {
        name: name.into(),
        file,
        defines: defines
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        vulkan13: false,
    }
}

/// The one table of kernel variants.
fn kernels() -> Vec<KernelDef> {
    let mut k = Vec::new();
    for (t, d) in WEIGHT_TYPES {
        k.push(def(format!("dequant_{t}_f32"), "dequant.comp", &[(d, "1")]));
        k.push(def(
            format!("get_rows_{t}_f32"),
            "get_rows.comp",
            &[(d, "1")],
        ));
        k.push(def(format!("matvec_{t}_f32"), "matvec.comp", &[(d, "1")]));
        k.push(def(format!("matmul_{t}_f32"), "matmul.comp", &[(d, "1")]));
        k.push(def(
            format!("matmul_rows_{t}_f32"),
            "matmul_rows.comp",
            &[(d, "1")],
        ));
        k.push(KernelDef {
            vulkan13: true,
            ..def(
                format!("matmul_coop_{t}_f32"),
                "matmul_coop.comp",
                &[(d, "1")],
            )
        });
        k.push(KernelDef {
            vulkan13: true,
            ..def(
                format!("matmul_skinny_{t}_f32"),
                "matmul_skinny.comp",
                &[(d, "1")],
            )
        });
        k.push(KernelDef {
            vulkan13: true,
            ..def(
                format!("matmul_skinny_{t}_f32_norm"),
                "matmul_skinny.comp",
                &[(d, "1"), ("NORM_IN", "1")],
            )
        });
        k.push(KernelDef {
            vulkan13: true,
            ..def(
                format!("matmul_skinny_{t}_f16"),
                "matmul_skinny.comp",
                &[(d, "1"), ("X_F16", "1")],
            )
        });
    }
    // Q4_K matvec over 32-column units (one sub-block per invocation):
    // half the registers for x of the 64-column units.
    k.push(def(
        "matvec_q4_k_u32_f32",
        "matvec.comp",
        &[("DATA_A_Q4_K", "1"), ("Q4K_UNIT32", "1")],
    ));
    k.push(def("rms_norm_f32", "rms_norm.comp", &[]));
    k.push(def(
        "rms_norm_f32_f16",
        "rms_norm.comp",
        &[("OUT_F16", "1")],
    ));
    k.push(def("rope_f32", "rope.comp", &[]));
    k.push(def("kv_store_f32_f16", "kv_store.comp", &[]));
    k.push(def("attention_f16_f32", "attention.comp", &[]));
    k.push(def(
        "attention_f16_f16",
        "attention.comp",
        &[("O_F16", "1")],
    ));
    k.push(def("attention_rows_f16_f32", "attention_rows.comp", &[]));
    k.push(def(
        "attention_blocks_f16_f32",
        "attention_blocks.comp",
        &[],
    ));
    k.push(def("glu_silu_f32", "glu.comp", &[("ACT_SILU", "1")]));
    k.push(def("glu_gelu_f32", "glu.comp", &[("ACT_GELU_TANH", "1")]));
    for (name, d) in [
        ("q8_0", "ROUND_Q8_0"),
        ("q8_k", "ROUND_Q8_K"),
        ("f16", "ROUND_F16"),
        ("bf16", "ROUND_BF16"),
    ] {
        k.push(def(
            format!("act_round_{name}_f32"),
            "act_round.comp",
            &[(d, "1")],
        ));
    }
    k
}

fn camel(name: &str) -> String {
    name.split('_')
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn compile(glsl_dir: &Path, out_dir: &Path, k: &KernelDef) -> Result<(), String> {
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
    opts.set_include_callback(move |requested, _kind, requester, _depth| {
        let from = Path::new(requester).parent().unwrap_or(&base).to_path_buf();
        let candidates = [from.join(requested), base.join(requested)];
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

fn compile_all(glsl_dir: &Path, out_dir: &Path, table: &[KernelDef]) {
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
                    if let Err(e) = compile(glsl_dir, out_dir, k) {
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

fn write_kernel_enum(out_dir: &Path, table: &[KernelDef]) {
    let mut s = String::new();
    s.push_str("/// Every compiled kernel variant (generated by build.rs from its table).\n");
    s.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n");
    for k in table {
        let _ = writeln!(s, "    /// `{}` from `glsl/{}`.", k.name, k.file);
        let _ = writeln!(s, "    {},", camel(&k.name));
    }
    s.push_str("}\n\nimpl Kernel {\n");
    s.push_str(
        "    /// All variants, in table order.\n    pub const ALL: &'static [Kernel] = &[\n",
    );
    for k in table {
        let _ = writeln!(s, "        Kernel::{},", camel(&k.name));
    }
    s.push_str("    ];\n\n");
    s.push_str("    /// The variant's name, `<family>_<weights>_<activations>[_<feature>]`.\n");
    s.push_str("    pub fn name(self) -> &'static str {\n        match self {\n");
    for k in table {
        let _ = writeln!(
            s,
            "            Kernel::{} => \"{}\",",
            camel(&k.name),
            k.name
        );
    }
    s.push_str("        }\n    }\n\n");
    s.push_str("    /// The variant's SPIR-V, embedded at build time.\n");
    s.push_str("    pub fn spirv(self) -> &'static [u8] {\n        match self {\n");
    for k in table {
        let _ = writeln!(
            s,
            "            Kernel::{} => include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{}.spv\")),",
            camel(&k.name),
            k.name
        );
    }
    s.push_str("        }\n    }\n\n");
    s.push_str("    /// Looks a variant up by name.\n");
    s.push_str("    pub fn by_name(name: &str) -> Option<Kernel> {\n");
    s.push_str("        Self::ALL.iter().copied().find(|k| k.name() == name)\n    }\n}\n");
    std::fs::write(out_dir.join("kernels.rs"), s).expect("OUT_DIR is writable");
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
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=glsl");
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=cbindgen.toml");

    // libcombs.so carries the soname libcombs.so.<major> (scripts/install.sh
    // installs libcombs.so.<version> with the .so.<major> and .so links).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcombs.so.{major}");
    }

    let table = kernels();
    compile_all(&glsl_dir, &out_dir, &table);
    write_kernel_enum(&out_dir, &table);
    write_header(&root);
}

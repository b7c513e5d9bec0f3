//! The one table of kernel variants: which `.comp` file, which defines, which
//! SPIR-V target. The build compiles each and emits the `Kernel` enum with a
//! typed constructor per family: `Kernel::matvec(QuantType::Q4_0)` rather
//! than a name put together at run time.

use std::fmt::Write as _;

/// Every weight format a dequantizing kernel is built for: (variant token,
/// GLSL define, `QuantType` variant).
pub const WEIGHT_TYPES: &[(&str, &str, &str)] = &[
    ("f32", "DATA_A_F32", "F32"),
    ("f16", "DATA_A_F16", "F16"),
    ("bf16", "DATA_A_BF16", "BF16"),
    ("q4_0", "DATA_A_Q4_0", "Q4_0"),
    ("q4_1", "DATA_A_Q4_1", "Q4_1"),
    ("q5_0", "DATA_A_Q5_0", "Q5_0"),
    ("q5_1", "DATA_A_Q5_1", "Q5_1"),
    ("q8_0", "DATA_A_Q8_0", "Q8_0"),
    ("q2_k", "DATA_A_Q2_K", "Q2K"),
    ("q3_k", "DATA_A_Q3_K", "Q3K"),
    ("q4_k", "DATA_A_Q4_K", "Q4K"),
    ("q5_k", "DATA_A_Q5_K", "Q5K"),
    ("q6_k", "DATA_A_Q6_K", "Q6K"),
];

/// One kernel variant: its name (`<family>_<weights>_<activations>[_<feature>]`),
/// the `.comp` file, the defines that select the variant, and whether it needs
/// the Vulkan 1.3 / SPIR-V 1.6 target (cooperative matrix).
pub struct KernelDef {
    pub name: String,
    pub file: &'static str,
    pub defines: Vec<(String, String)>,
    pub vulkan13: bool,
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

/// A family built once per weight format: `Kernel::<ctor>(QuantType)` picks
/// the variant `<prefix>_<type><suffix>`.
pub struct PerWeight {
    pub ctor: &'static str,
    pub prefix: &'static str,
    pub suffix: &'static str,
    pub file: &'static str,
    pub defines: &'static [(&'static str, &'static str)],
    pub vulkan13: bool,
    pub doc: &'static str,
}

/// The families built for every weight format.
pub const PER_WEIGHT: &[PerWeight] = &[
    PerWeight {
        ctor: "dequant",
        prefix: "dequant",
        suffix: "_f32",
        file: "dequant.comp",
        defines: &[],
        vulkan13: false,
        doc: "Dequantization to f32 (validation).",
    },
    PerWeight {
        ctor: "get_rows",
        prefix: "get_rows",
        suffix: "_f32",
        file: "get_rows.comp",
        defines: &[],
        vulkan13: false,
        doc: "Rows of a table by token id (embeddings).",
    },
    PerWeight {
        ctor: "matvec",
        prefix: "matvec",
        suffix: "_f32",
        file: "matvec.comp",
        defines: &[],
        vulkan13: false,
        doc: "Matrix-vector products (decode).",
    },
    PerWeight {
        ctor: "tiled",
        prefix: "matmul",
        suffix: "_f32",
        file: "matmul.comp",
        defines: &[],
        vulkan13: false,
        doc: "Products tiled through shared memory.",
    },
    PerWeight {
        ctor: "rows",
        prefix: "matmul_rows",
        suffix: "_f32",
        file: "matmul_rows.comp",
        defines: &[],
        vulkan13: false,
        doc: "Products with one invocation per row (CPU devices).",
    },
    PerWeight {
        ctor: "coop",
        prefix: "matmul_coop",
        suffix: "_f32",
        file: "matmul_coop.comp",
        defines: &[],
        vulkan13: true,
        doc: "Cooperative-matrix products.",
    },
    PerWeight {
        ctor: "coop_f16",
        prefix: "matmul_coop",
        suffix: "_f16",
        file: "matmul_coop.comp",
        defines: &[("X_F16", "1")],
        vulkan13: true,
        doc: "Cooperative-matrix products of f16 input.",
    },
    PerWeight {
        ctor: "cm2",
        prefix: "matmul_cm2",
        suffix: "_f32",
        file: "matmul_cm2.comp",
        defines: &[],
        vulkan13: true,
        doc: "Workgroup-scope cooperative-matrix products (VK_NV_cooperative_matrix2).",
    },
    PerWeight {
        ctor: "cm2_f16",
        prefix: "matmul_cm2",
        suffix: "_f16",
        file: "matmul_cm2.comp",
        defines: &[("X_F16", "1")],
        vulkan13: true,
        doc: "Workgroup-scope cooperative-matrix products of f16 input (VK_NV_cooperative_matrix2).",
    },
    PerWeight {
        ctor: "skinny_f32",
        prefix: "matmul_skinny",
        suffix: "_f32",
        file: "matmul_skinny.comp",
        defines: &[],
        vulkan13: true,
        doc: "Cooperative-matrix products of 9-128 tokens, f32 input.",
    },
    PerWeight {
        ctor: "skinny_f32_norm",
        prefix: "matmul_skinny",
        suffix: "_f32_norm",
        file: "matmul_skinny.comp",
        defines: &[("NORM_IN", "1")],
        vulkan13: true,
        doc: "Cooperative-matrix products of 9-128 tokens, an RMS norm folded into the f32 input.",
    },
    PerWeight {
        ctor: "skinny_f16",
        prefix: "matmul_skinny",
        suffix: "_f16",
        file: "matmul_skinny.comp",
        defines: &[("X_F16", "1")],
        vulkan13: true,
        doc: "Cooperative-matrix products of 9-128 tokens, f16 input.",
    },
];

/// The one table of kernel variants.
pub fn kernels() -> Vec<KernelDef> {
    let mut k = Vec::new();
    for fam in PER_WEIGHT {
        for (t, d, _) in WEIGHT_TYPES {
            let mut defines = vec![(*d, "1")];
            defines.extend_from_slice(fam.defines);
            k.push(KernelDef {
                vulkan13: fam.vulkan13,
                ..def(
                    format!("{}_{t}{}", fam.prefix, fam.suffix),
                    fam.file,
                    &defines,
                )
            });
        }
    }
    // Q4_K matvec over 32-column units (one sub-block per invocation):
    // half the registers for x of the 64-column units.
    k.push(def(
        "matvec_q4_k_u32_f32",
        "matvec.comp",
        &[("DATA_A_Q4_K", "1"), ("Q4K_UNIT32", "1")],
    ));
    // Integer dot products of Q4_0 / Q8_0 weights with x quantized to 8-bit
    // blocks (SPIR-V 1.6: DotProduct is core there).
    for (t, d) in [("q4_0", "DATA_A_Q4_0"), ("q8_0", "DATA_A_Q8_0")] {
        k.push(KernelDef {
            vulkan13: true,
            ..def(format!("matvec_{t}_q8_1"), "matvec_q8.comp", &[(d, "1")])
        });
        // The same with x in f32, quantized by each workgroup.
        k.push(KernelDef {
            vulkan13: true,
            ..def(
                format!("matvec_{t}_q8_1_xf32"),
                "matvec_q8.comp",
                &[(d, "1"), ("X_F32", "1")],
            )
        });
    }
    // Q4_K with x quantized to q8_K blocks in every workgroup, 64 columns
    // per step, and over 32-column units.
    k.push(KernelDef {
        vulkan13: true,
        ..def(
            "matvec_q4_k_q8_k_xf32",
            "matvec_q8.comp",
            &[("DATA_A_Q4_K", "1"), ("X_F32", "1")],
        )
    });
    k.push(KernelDef {
        vulkan13: true,
        ..def(
            "matvec_q4_k_u32_q8_k_xf32",
            "matvec_q8.comp",
            &[("DATA_A_Q4_K", "1"), ("Q4K_UNIT32", "1"), ("X_F32", "1")],
        )
    });
    k.push(def("quantize_q8_1_f32", "quantize_q8_1.comp", &[]));
    k.push(def("rms_norm_f32", "rms_norm.comp", &[]));
    k.push(def(
        "rms_norm_f32_f16",
        "rms_norm.comp",
        &[("OUT_F16", "1")],
    ));
    k.push(def("rope_f32", "rope.comp", &[]));
    k.push(def("softcap_f32", "softcap.comp", &[]));
    // Top-k of logit rows: candidates per chunk of a row, then one merge per row.
    k.push(def("topk_f32", "topk.comp", &[]));
    k.push(def("topk_merge", "topk.comp", &[("TOPK_MERGE", "1")]));
    k.push(def("kv_store_f32_f16", "kv_store.comp", &[]));
    k.push(def("attention_f16_f32", "attention.comp", &[]));
    k.push(def(
        "attention_f16_f16",
        "attention.comp",
        &[("O_F16", "1")],
    ));
    // Decode with each (token, head)'s keys split over several workgroups.
    k.push(def(
        "attention_split_f16_f32",
        "attention.comp",
        &[("ATTN_SPLIT", "1")],
    ));
    k.push(def(
        "attention_split_f16_f16",
        "attention.comp",
        &[("ATTN_SPLIT", "1"), ("O_F16", "1")],
    ));
    k.push(def("attention_rows_f16_f32", "attention_rows.comp", &[]));
    k.push(def(
        "attention_blocks_f16_f32",
        "attention_blocks.comp",
        &[],
    ));
    k.push(KernelDef {
        vulkan13: true,
        ..def("attention_coop_f16_f32", "attention_coop.comp", &[])
    });
    k.push(KernelDef {
        vulkan13: true,
        ..def(
            "attention_coop_f16_f16",
            "attention_coop.comp",
            &[("O_F16", "1")],
        )
    });
    k.push(def("layer_norm_f32", "layer_norm.comp", &[]));
    k.push(def(
        "unary_gelu_erf_f32",
        "unary.comp",
        &[("OP_GELU_ERF", "1")],
    ));
    k.push(def(
        "unary_gelu_tanh_f32",
        "unary.comp",
        &[("OP_GELU_TANH", "1")],
    ));
    k.push(def("unary_copy_f32", "unary.comp", &[("OP_COPY", "1")]));
    k.push(def("copy_u32x4", "copy.comp", &[]));
    k.push(def("im2col_f32", "im2col.comp", &[]));
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

/// The `Kernel` enum: one variant per table row, its name and SPIR-V, and
/// the typed constructors of the per-weight families.
pub fn enum_source(table: &[KernelDef]) -> String {
    let mut s = String::new();
    s.push_str(
        "/// Every compiled kernel variant (generated by build/kernels.rs from its table).\n",
    );
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
    s.push_str("        }\n    }\n");
    for fam in PER_WEIGHT {
        let _ = writeln!(
            s,
            "\n    /// {} The variant for weights of type `t`.",
            fam.doc
        );
        let _ = writeln!(
            s,
            "    pub fn {}(t: crate::quant::QuantType) -> Kernel {{\n        match t {{",
            fam.ctor
        );
        for (t, _, variant) in WEIGHT_TYPES {
            let _ = writeln!(
                s,
                "            crate::quant::QuantType::{variant} => Kernel::{},",
                camel(&format!("{}_{t}{}", fam.prefix, fam.suffix))
            );
        }
        s.push_str("        }\n    }\n");
    }
    s.push_str("}\n");
    s
}

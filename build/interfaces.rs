//! The one declaration of every kernel family's interface: its push
//! constants and its flag bits. From this table the build writes both sides
//! of each interface, so they cannot drift apart:
//!
//! - Rust (`OUT_DIR/interfaces.rs`, included by `src/ops/params.rs`): a
//!   `#[repr(C)]` struct per family with a compile-time size check, and the
//!   family's flag bits as associated constants (`MatvecParams::ROPE`).
//! - GLSL (`OUT_DIR/iface/<family>.glsl`, included by the `.comp` files as
//!   `#include "iface/<family>.glsl"`): the `push_constant` block `p` and the
//!   flag bits as `const uint <PREFIX>_<FLAG>` (`LINEAR_ROPE`).
//!
//! Families whose kernels share GLSL code (the linear epilogues) share flag
//! lists and a GLSL prefix, so the shared code names each bit the same way.

use std::fmt::Write as _;

/// The type of one push-constant field (every field is 4 bytes: no padding).
#[derive(Clone, Copy)]
pub enum Ty {
    U32,
    F32,
}

/// One push-constant field.
pub struct Field {
    pub name: &'static str,
    pub ty: Ty,
    pub doc: &'static str,
}

/// One flag bit of a family's `flags` field.
pub struct Flag {
    pub name: &'static str,
    pub bit: u32,
    pub doc: &'static str,
}

/// Fields several interfaces share, as one Rust struct (flattened in GLSL).
pub struct Group {
    /// The Rust struct.
    pub rust: &'static str,
    /// What it holds.
    pub doc: &'static str,
    pub fields: Vec<Field>,
}

/// One entry of an interface: a field, or a group of fields under a name.
pub enum Item {
    Field(Field),
    Group {
        /// The member's name in Rust.
        member: &'static str,
        group: Group,
    },
}

impl Item {
    /// The fields it lays out, in order.
    fn fields(&self) -> &[Field] {
        match self {
            Item::Field(f) => std::slice::from_ref(f),
            Item::Group { group, .. } => &group.fields,
        }
    }
}

impl From<Field> for Item {
    fn from(f: Field) -> Self {
        Item::Field(f)
    }
}

/// One kernel family's interface.
pub struct Interface {
    /// The include file's name: `iface/<family>.glsl`.
    pub family: &'static str,
    /// The Rust struct.
    pub rust: &'static str,
    /// Which kernels use it.
    pub doc: &'static str,
    /// Prefix of the GLSL flag constants.
    pub glsl_prefix: &'static str,
    pub fields: Vec<Item>,
    pub flags: Vec<Flag>,
}

impl Interface {
    /// Every field, groups flattened.
    fn flat(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().flat_map(Item::fields)
    }
}

const fn u(name: &'static str, doc: &'static str) -> Field {
    Field {
        name,
        ty: Ty::U32,
        doc,
    }
}

const fn f(name: &'static str, doc: &'static str) -> Field {
    Field {
        name,
        ty: Ty::F32,
        doc,
    }
}

/// Plain fields as interface items.
fn items(fields: Vec<Field>) -> Vec<Item> {
    fields.into_iter().map(Item::Field).collect()
}

const fn flag(name: &'static str, bit: u32, doc: &'static str) -> Flag {
    Flag { name, bit, doc }
}

/// The sizes and offsets every tiled linear kernel starts with, and its flags.
fn linear_base() -> Vec<Item> {
    let dims = Group {
        rust: "LinearDims",
        doc: "The sizes and offsets of a tiled product over one chunk of a weight.",
        fields: vec![
            u("k", "Columns (a multiple of 32)."),
            u("m", "Rows in this chunk of the weight."),
            u("nb", "Blocks in this chunk."),
            u("row_offset", "Output column of the chunk's first row."),
            u("n", "Tokens."),
            u(
                "ld_x",
                "Stride between tokens of X in the kernel's units of X (floats, vec4s, elements).",
            ),
            u("ld_d", "Elements between tokens of D."),
            u("x_offset", "Index of X[0, 0] in the kernel's units of X."),
            u("d_offset", "Element index of D[0, 0]."),
        ],
    };
    vec![
        Item::Group {
            member: "dims",
            group: dims,
        },
        u("flags", "Flag bits (the associated constants).").into(),
    ]
}

/// The fields of a rope folded into a product's stores.
fn rope_fields() -> Item {
    Item::Group {
        member: "rope",
        group: Group {
            rust: "RopeFold",
            doc: "A rope folded into a product's stores.",
            fields: vec![
                u(
                    "rope_rows",
                    "Output rows the folded rope rotates (q and k heads).",
                ),
                u("head_dim", "Floats per head of the folded rope."),
                u("n_rot", "Rotated dimensions per head."),
                f("attn_factor", "Multiplier of the rope's cos and sin."),
            ],
        },
    }
}

/// What every linear kernel's epilogue (`common/linear_out.glsl`) reads.
fn store_flags() -> Vec<Flag> {
    vec![
        flag("ACCUMULATE", 1, "D += result (the residual add)."),
        flag("BIAS", 2, "Add bias[row_offset + row]."),
    ]
}

/// The steps the matvec and the cooperative-matrix epilogue
/// (`common/coop_out.glsl`) fold into their stores.
fn fold_flags() -> Vec<Flag> {
    vec![
        flag(
            "NORM_ZERO_CENTRED",
            8,
            "The folded RMS norm scales by (1 + w).",
        ),
        flag(
            "GLU",
            16,
            "Rows alternate gate, up: D[(row_offset + row) / 2] = act(gate) * up.",
        ),
        flag(
            "GELU",
            32,
            "The gate's activation is GELU-tanh (else SiLU).",
        ),
        flag(
            "ROPE",
            64,
            "Adjacent-pair rope of the output rows below rope_rows at each token's position.",
        ),
    ]
}

/// Every interface.
pub fn interfaces() -> Vec<Interface> {
    let matvec_fields: Vec<Item> = vec![
        u("k", "Columns (a multiple of 32; of 256 for K-quants).").into(),
        u("m", "Rows in this chunk of the weight.").into(),
        u("nb", "Blocks in this chunk.").into(),
        u("row_offset", "Output index of the chunk's first row.").into(),
        u("x_offset", "vec4 index of the input vector.").into(),
        u("d_offset", "Output index of row 0 of the whole weight.").into(),
        u("flags", "Flag bits (the associated constants).").into(),
        f("eps", "Epsilon of the folded RMS norm.").into(),
        rope_fields(),
        u("n_tok", "Tokens (workgroups interleave them).").into(),
        u("ld_x", "vec4s between tokens of x.").into(),
        u("ld_d", "Floats between tokens of d.").into(),
    ];
    let mut matvec_flags = store_flags();
    matvec_flags.push(flag(
        "NORM",
        4,
        "x is the raw residual: use x * w / rms(x) (an RMS norm folded into the input).",
    ));
    matvec_flags.extend(fold_flags());

    let matvec_q8_fields: Vec<Item> = vec![
        u("k", "Columns (a multiple of 32).").into(),
        u("m", "Rows in this chunk of the weight.").into(),
        u("nb", "Blocks in this chunk.").into(),
        u("row_offset", "Output index of the chunk's first row.").into(),
        u(
            "x_offset",
            "Word index of token 0's quantized row (a multiple of 4).",
        )
        .into(),
        u("d_offset", "Output index of row 0 of the whole weight.").into(),
        u("flags", "Flag bits (the associated constants).").into(),
        rope_fields(),
        u("n_tok", "Tokens (workgroups interleave them).").into(),
        u(
            "ld_x",
            "Words between tokens' quantized rows (a multiple of 4).",
        )
        .into(),
        u("ld_d", "Floats between tokens of d.").into(),
        f("eps", "Epsilon of the norm folded into the input (X_F32).").into(),
    ];
    let mut matvec_q8_flags = store_flags();
    matvec_q8_flags.push(flag(
        "NORM",
        4,
        "X_F32: x is the raw residual, quantized as x * w / rms(x).",
    ));
    matvec_q8_flags.extend(fold_flags());

    let mut coop_fields = linear_base();
    coop_fields.push(rope_fields());
    let mut coop_flags = store_flags();
    coop_flags.extend(
        fold_flags()
            .into_iter()
            .filter(|f| f.name != "NORM_ZERO_CENTRED"),
    );
    coop_flags.push(flag(
        "OUT_F16",
        128,
        "The gated output goes out as f16 (the next product's input; f16-input variants).",
    ));

    let mut skinny_fields = linear_base();
    skinny_fields.push(rope_fields());
    skinny_fields.extend(items(vec![
        u(
            "sq_offset",
            "Float index of token 0's first sum of squares.",
        ),
        u(
            "sq_groups",
            "Sums of squares per token: the producer's rows / 16, rounded up.",
        ),
        f("eps", "Epsilon of the norm folded into the input."),
    ]));
    let mut skinny_flags = store_flags();
    skinny_flags.extend(fold_flags());
    skinny_flags.extend([
        flag(
            "OUT_F16",
            128,
            "The gated output goes out as f16 (the next product's input).",
        ),
        flag(
            "SQUARES_OUT",
            256,
            "Write each token's sums of squares of the stored values, 16 rows at a time.",
        ),
        flag(
            "NORM_IN",
            512,
            "Normalize the f32 input first from the sums of squares a producer wrote.",
        ),
    ]);

    vec![
        Interface {
            family: "matvec",
            rust: "MatvecParams",
            doc: "`glsl/matvec.comp`: one token (or a few) through a quantized weight.",
            glsl_prefix: "LINEAR",
            fields: matvec_fields,
            flags: matvec_flags,
        },
        Interface {
            family: "matvec_q8",
            rust: "MatvecQ8Params",
            doc: "`glsl/matvec_q8.comp`: integer dot products of Q4_0 / Q8_0 weights with 8-bit x.",
            glsl_prefix: "LINEAR",
            fields: matvec_q8_fields,
            flags: matvec_q8_flags,
        },
        Interface {
            family: "quantize_q8_1",
            rust: "QuantizeQ81Params",
            doc: "`glsl/quantize_q8_1.comp`: token rows to 8-bit blocks for `matvec_q8.comp`.",
            glsl_prefix: "QUANTIZE",
            fields: items(vec![
                u("k", "Floats per token row (a multiple of 32)."),
                u("n_tokens", "Tokens."),
                u("ld_x", "vec4s between tokens of x."),
                u("x_offset", "vec4 index of x's token 0."),
                u("ld_d", "Words between tokens of the output."),
                u("d_offset", "Word index of the output's token 0."),
                u("flags", "Flag bits (the associated constants)."),
                f("eps", "Epsilon of the folded RMS norm."),
            ]),
            flags: vec![
                flag(
                    "NORM",
                    1,
                    "x is the raw residual: quantize x / rms(x) * w (an RMS norm folded in).",
                ),
                flag("NORM_ZERO_CENTRED", 2, "The folded norm scales by (1 + w)."),
            ],
        },
        Interface {
            family: "tiled",
            rust: "TiledParams",
            doc: "`glsl/matmul.comp`: tiles through shared memory.",
            glsl_prefix: "LINEAR",
            fields: linear_base(),
            flags: store_flags(),
        },
        Interface {
            family: "rows",
            rust: "RowsParams",
            doc: "`glsl/matmul_rows.comp`: one invocation per row, for CPU devices.",
            glsl_prefix: "LINEAR",
            fields: linear_base(),
            flags: store_flags(),
        },
        Interface {
            family: "coop",
            rust: "CoopParams",
            doc: "`glsl/matmul_coop.comp`: cooperative-matrix tiles.",
            glsl_prefix: "LINEAR",
            fields: coop_fields,
            flags: coop_flags,
        },
        Interface {
            family: "skinny",
            rust: "SkinnyParams",
            doc: "`glsl/matmul_skinny.comp`: cooperative-matrix products of 9-128 tokens.",
            glsl_prefix: "LINEAR",
            fields: skinny_fields,
            flags: skinny_flags,
        },
        Interface {
            family: "attention",
            rust: "AttentionParams",
            doc: "`glsl/attention.comp`, `attention_rows.comp`, `attention_blocks.comp`.",
            glsl_prefix: "ATTN",
            fields: items(vec![
                u("n_tokens", "Query tokens."),
                u("n_head", "Query heads."),
                u("n_head_kv", "KV heads."),
                u("head_dim", "Floats per head."),
                u("ld_q", "Floats between tokens of q."),
                u("q_offset", "Float index of q's token 0."),
                u("ld_o", "Elements between tokens of o."),
                u("o_offset", "Element index of o's token 0."),
                f("scale", "Multiplier of q.k."),
                f("softcap", "Soft-cap of the scores (0: none)."),
                u(
                    "window",
                    "Sliding window in positions (0: full causal attention).",
                ),
                u("page_size", "Cache rows per page."),
                u("ring", "Ring size of a window-only cache (0: none)."),
                u("flags", "Flag bits (the associated constants)."),
                u("ld_new", "Floats between tokens of the new K and V rows."),
                u("k_new", "Float index of token 0's new K row."),
                u("v_new", "Float index of token 0's new V row."),
            ]),
            flags: vec![flag(
                "STORE_NEW",
                1,
                "The decode kernel also stores the new K/V rows into the cache.",
            )],
        },
        Interface {
            family: "kv_store",
            rust: "KvStoreParams",
            doc: "`glsl/kv_store.comp`: new K or V rows into an f16 cache.",
            glsl_prefix: "KV_STORE",
            fields: items(vec![
                u("n_tokens", "Tokens."),
                u(
                    "width",
                    "Floats per token row (n_head_kv * head_dim, even).",
                ),
                u("ld", "Floats between tokens of the source."),
                u("offset", "Float index of the source's token 0."),
                u("page_size", "Cache rows per page."),
                u("ring", "Ring size (0: none)."),
            ]),
            flags: vec![],
        },
        Interface {
            family: "rms_norm",
            rust: "RmsNormParams",
            doc: "`glsl/rms_norm.comp`.",
            glsl_prefix: "RMS_NORM",
            fields: items(vec![
                u("n_cols", "Elements per row."),
                u("n_rows", "Rows."),
                u("ld_x", "Floats between rows of x."),
                u("ld_d", "Elements between rows of d."),
                u("x_offset", "Float index of x's row 0."),
                u("d_offset", "Element index of d's row 0."),
                f("eps", "Epsilon inside the square root."),
                u("flags", "Flag bits (the associated constants)."),
                u(
                    "group",
                    "Rows per group (a token's heads); rows of a group are ld_x / ld_d apart.",
                ),
                u("ld_group_x", "Floats between groups of x."),
                u("ld_group_d", "Floats between groups of d."),
            ]),
            flags: vec![
                flag("ZERO_CENTRED", 1, "Scale by (1 + w)."),
                flag("ADD", 2, "Add the result into d."),
                flag("NO_WEIGHT", 4, "Normalize only."),
            ],
        },
        Interface {
            family: "rope",
            rust: "RopeParams",
            doc: "`glsl/rope.comp`.",
            glsl_prefix: "ROPE",
            fields: items(vec![
                u("n_tokens", "Tokens."),
                u("n_heads", "Heads per token."),
                u("head_dim", "Floats per head."),
                u(
                    "n_rot",
                    "Rotated dimensions per head (even, at most head_dim).",
                ),
                u("ld", "Floats between tokens."),
                u("offset", "Float index of token 0, head 0."),
                u("flags", "Flag bits (the associated constants)."),
                f(
                    "attn_factor",
                    "Multiplier of cos and sin (YaRN / LongRoPE magnitude scaling; 1 otherwise).",
                ),
            ]),
            flags: vec![flag(
                "NEOX",
                1,
                "NeoX pairs (i, i + n_rot/2) instead of adjacent ones (2i, 2i+1).",
            )],
        },
        Interface {
            family: "glu",
            rust: "GluParams",
            doc: "`glsl/glu.comp`.",
            glsl_prefix: "GLU",
            fields: items(vec![
                u("n_tokens", "Tokens."),
                u("width", "Elements per token."),
                u("ld_g", "Floats between tokens of g."),
                u("ld_u", "Floats between tokens of u."),
                u("ld_d", "Floats between tokens of d."),
                u("g_offset", "Float index of g's token 0."),
                u("u_offset", "Float index of u's token 0."),
                u("d_offset", "Float index of d's token 0."),
                u(
                    "step",
                    "Floats between consecutive columns of g and u (2: interleaved pairs).",
                ),
            ]),
            flags: vec![],
        },
        Interface {
            family: "get_rows",
            rust: "GetRowsParams",
            doc: "`glsl/get_rows.comp`.",
            glsl_prefix: "GET_ROWS",
            fields: items(vec![
                u("k", "Columns (a multiple of 32)."),
                u("nb", "Blocks in the chunk."),
                u("row_start", "First row of the chunk."),
                u("n_rows", "Rows in the chunk."),
                u("n_tokens", "Tokens."),
                u("ld_d", "vec4s between tokens of d."),
                u("d_offset", "vec4 index of d's token 0."),
                f(
                    "scale",
                    "Multiplier (Gemma scales embeddings by sqrt(n_embd)).",
                ),
            ]),
            flags: vec![],
        },
        Interface {
            family: "act_round",
            rust: "ActRoundParams",
            doc: "`glsl/act_round.comp`.",
            glsl_prefix: "ACT_ROUND",
            fields: items(vec![
                u("n_tokens", "Tokens."),
                u("width", "Elements per token (a multiple of the block)."),
                u("ld_x", "Floats between tokens of x."),
                u("ld_d", "Floats between tokens of d."),
                u("x_offset", "Float index of x's token 0."),
                u("d_offset", "Float index of d's token 0."),
            ]),
            flags: vec![],
        },
        Interface {
            family: "dequant",
            rust: "DequantParams",
            doc: "`glsl/dequant.comp`.",
            glsl_prefix: "DEQUANT",
            fields: items(vec![
                u("n", "Weights to expand."),
                u("nb", "Blocks in the bound weight buffer (plane stride)."),
                u(
                    "first",
                    "Index (within the buffer) of the first weight to expand.",
                ),
            ]),
            flags: vec![],
        },
        Interface {
            family: "layer_norm",
            rust: "LayerNormParams",
            doc: "`glsl/layer_norm.comp`: `d = (x - mean) / sqrt(var + eps) * w + b` per row.",
            glsl_prefix: "LAYER_NORM",
            fields: items(vec![
                u("n_rows", "Rows."),
                u("n_cols", "Floats per row."),
                u("ld_x", "Floats between rows of x."),
                u("ld_d", "Floats between rows of d."),
                u("x_offset", "Float index of x's row 0."),
                u("d_offset", "Float index of d's row 0."),
                f("eps", "Epsilon added to the variance."),
            ]),
            flags: vec![],
        },
        Interface {
            family: "copy",
            rust: "CopyParams",
            doc: "`glsl/copy.comp`: a plain copy in 16-byte words.",
            glsl_prefix: "COPY",
            fields: items(vec![u("n_words", "16-byte words to copy.")]),
            flags: vec![],
        },
        Interface {
            family: "unary",
            rust: "UnaryParams",
            doc: "`glsl/unary.comp`: `d = f(x)` or `d += f(x)` elementwise.",
            glsl_prefix: "UNARY",
            fields: items(vec![
                u("n_rows", "Rows."),
                u("width", "Floats per row."),
                u("ld_x", "Floats between rows of x."),
                u("ld_d", "Floats between rows of d."),
                u("x_offset", "Float index of x's row 0."),
                u("d_offset", "Float index of d's row 0."),
                u("flags", "Flag bits (the associated constants)."),
            ]),
            flags: vec![flag("ADD", 1, "Add the result into d.")],
        },
        Interface {
            family: "im2col",
            rust: "Im2colParams",
            doc: "`glsl/im2col.comp`: the rows of a 1-D convolution's patches.",
            glsl_prefix: "IM2COL",
            fields: items(vec![
                u("n_out", "Output positions (rows of d)."),
                u("n_in", "Input positions."),
                u("channels", "Input channels."),
                u("kernel", "Taps per channel."),
                u("stride", "Input positions between output positions."),
                u("pad", "Zero positions before the input."),
                u("stride_c", "Floats between channels of x."),
                u("stride_t", "Floats between positions of x."),
                u("x_offset", "Float index of x's first value."),
                u(
                    "width",
                    "Floats written per row of d (channels * kernel, zero-padded).",
                ),
                u("ld_d", "Floats between rows of d."),
                u("d_offset", "Float index of d's row 0."),
            ]),
            flags: vec![],
        },
        Interface {
            family: "softcap",
            rust: "SoftcapParams",
            doc: "`glsl/softcap.comp`: `d = cap * tanh(d / cap)` in place.",
            glsl_prefix: "SOFTCAP",
            fields: items(vec![
                u("n_rows", "Rows."),
                u("width", "Floats per row."),
                u("ld", "Floats between rows."),
                u("offset", "Float index of row 0."),
                f("cap", "The cap."),
            ]),
            flags: vec![],
        },
        Interface {
            family: "topk",
            rust: "TopKParams",
            doc: "`glsl/topk.comp`: the k largest values of each row with their indices.",
            glsl_prefix: "TOPK",
            fields: items(vec![
                u("n_rows", "Rows."),
                u(
                    "width",
                    "Values per row (the first pass) or candidate lists per row (the merge).",
                ),
                u("ld", "Floats between rows of x (the first pass)."),
                u("offset", "Float index of x's row 0 (the first pass)."),
                u("k", "Candidates kept per row (and per list)."),
                u("chunk", "Values one workgroup of the first pass takes."),
            ]),
            flags: vec![],
        },
    ]
}

fn glsl_type(t: Ty) -> &'static str {
    match t {
        Ty::U32 => "uint",
        Ty::F32 => "float",
    }
}

fn rust_type(t: Ty) -> &'static str {
    match t {
        Ty::U32 => "u32",
        Ty::F32 => "f32",
    }
}

/// A `#[repr(C)]` struct of `(member, type, doc)` fields, each 4 bytes or
/// a struct of them (no padding).
fn rust_struct(s: &mut String, name: &str, doc: &str, fields: &[(&str, &str, &str)]) {
    let _ = writeln!(s, "/// {doc}");
    s.push_str("#[repr(C)]\n");
    s.push_str("#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]\n");
    let _ = writeln!(s, "pub struct {name} {{");
    for (member, ty, doc) in fields {
        let _ = writeln!(s, "    /// {doc}");
        let _ = writeln!(s, "    pub {member}: {ty},");
    }
    s.push_str("}\n");
}

fn size_check(s: &mut String, name: &str, words: usize) {
    let _ = writeln!(
        s,
        "const _: () = assert!(std::mem::size_of::<{name}>() == {});",
        4 * words
    );
}

/// The Rust side of every interface: the shared groups once, then each
/// family's struct and flag constants.
pub fn rust_source(all: &[Interface]) -> String {
    let mut s = String::new();
    let mut groups: Vec<&str> = Vec::new();
    for i in all {
        for item in &i.fields {
            if let Item::Group { group, .. } = item
                && !groups.contains(&group.rust)
            {
                groups.push(group.rust);
                let fields: Vec<_> = group
                    .fields
                    .iter()
                    .map(|f| (f.name, rust_type(f.ty), f.doc))
                    .collect();
                rust_struct(&mut s, group.rust, group.doc, &fields);
                size_check(&mut s, group.rust, group.fields.len());
                s.push('\n');
            }
        }
        let members: Vec<_> = i
            .fields
            .iter()
            .map(|item| match item {
                Item::Field(f) => (f.name, rust_type(f.ty), f.doc),
                Item::Group { member, group } => (*member, group.rust, group.doc),
            })
            .collect();
        rust_struct(
            &mut s,
            i.rust,
            &format!("Push constants of {}", i.doc),
            &members,
        );
        size_check(&mut s, i.rust, i.flat().count());
        if !i.flags.is_empty() {
            let _ = writeln!(s, "impl {} {{", i.rust);
            for fl in &i.flags {
                let _ = writeln!(s, "    /// {}", fl.doc);
                let _ = writeln!(s, "    pub const {}: u32 = {};", fl.name, fl.bit);
            }
            s.push_str("}\n");
        }
        s.push('\n');
    }
    s
}

/// The GLSL include of one interface (groups flattened).
pub fn glsl_source(i: &Interface) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by build/interfaces.rs (the `{}` interface): do not edit.",
        i.family
    );
    s.push_str("layout(push_constant) uniform Params {\n");
    for fl in i.flat() {
        let _ = writeln!(s, "    {} {}; // {}", glsl_type(fl.ty), fl.name, fl.doc);
    }
    s.push_str("} p;\n");
    for fl in &i.flags {
        let _ = writeln!(
            s,
            "const uint {}_{} = {}u; // {}",
            i.glsl_prefix, fl.name, fl.bit, fl.doc
        );
    }
    s
}

/// Checks the table: unique names, no flag bit used twice within a family.
pub fn check(all: &[Interface]) -> Result<(), String> {
    for (n, i) in all.iter().enumerate() {
        if all[..n]
            .iter()
            .any(|o| o.family == i.family || o.rust == i.rust)
        {
            return Err(format!("interface `{}` declared twice", i.family));
        }
        for (k, fl) in i.flags.iter().enumerate() {
            if !fl.bit.is_power_of_two() || i.flags[..k].iter().any(|o| o.bit == fl.bit) {
                return Err(format!(
                    "flag {}::{} reuses or is not a bit",
                    i.rust, fl.name
                ));
            }
        }
    }
    Ok(())
}

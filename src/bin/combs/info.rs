//! `combs info`: describes a GGUF file or a Hugging Face directory as the
//! GGUF combs converts it to (version, metadata with long values
//! summarized, the tensor table, totals per type) and/or lists the Vulkan
//! devices with the limits and features that pick kernel variants.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use combs::ModelError;
use combs::formats::gguf::{GgufFile, MetaArray, MetaValue};
use combs::gpu::{DeviceInfo, list_devices};

use crate::CliError;

/// Strings longer than this many characters are truncated unless `--full`.
const MAX_STR_CHARS: usize = 72;
/// Strings inside arrays are truncated to this many characters.
const MAX_ELEM_CHARS: usize = 24;
/// Array elements shown unless `--full`.
const MAX_ITEMS: usize = 6;

/// Arguments of `combs info`.
#[derive(Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true)))]
pub struct InfoArgs {
    /// GGUF model file to describe, or a Hugging Face model directory
    /// (described as the GGUF combs converts it to).
    #[arg(short = 'm', long = "model", value_name = "FILE|DIR", group = "what")]
    model: Option<PathBuf>,
    /// List the Vulkan devices and what each supports.
    #[arg(long, group = "what")]
    devices: bool,
    /// Print whole strings and every array element.
    #[arg(long)]
    full: bool,
}

/// Runs `combs info`, writing the report to `out`.
pub fn run(args: &InfoArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if let Some(path) = &args.model {
        let file = combs::models::registry::ModelRegistry::new()
            .open(path, &combs::models::registry::LoadOptions::default())
            .map_err(|e| CliError::in_file(path, e))?;
        print_model(&file, &path.display().to_string(), args.full, out)?;
    }
    if args.devices {
        if args.model.is_some() {
            writeln!(out)?;
        }
        print_devices(&list_devices()?, out)?;
    }
    Ok(())
}

/// `n` bytes as a short human size.
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `s` quoted and escaped, cut to `max` characters (with `…`) unless `max` is `None`.
fn quote(s: &str, max: Option<usize>) -> String {
    match max {
        Some(m) if s.chars().count() > m => {
            let cut: String = s.chars().take(m).collect();
            format!("{cut:?}…")
        }
        _ => format!("{s:?}"),
    }
}

/// Raw non-UTF-8 bytes, escaped, cut to `max` bytes unless `max` is `None`.
fn quote_bytes(b: &[u8], max: Option<usize>) -> String {
    match max {
        Some(m) if b.len() > m => format!("b\"{}\"…", b[..m].escape_ascii()),
        _ => format!("b\"{}\"", b.escape_ascii()),
    }
}

/// Formats the first elements of an array (all of them with `full`).
fn array_items(a: &MetaArray, full: bool) -> String {
    let limit = if full { usize::MAX } else { MAX_ITEMS };
    let elem = (!full).then_some(MAX_ELEM_CHARS);
    fn list<T>(v: &[T], limit: usize, f: impl Fn(&T) -> String) -> String {
        let mut s: Vec<String> = v.iter().take(limit).map(f).collect();
        if v.len() > limit {
            s.push("…".into());
        }
        s.join(", ")
    }
    match a {
        MetaArray::U8(v) => list(v, limit, |x| x.to_string()),
        MetaArray::I8(v) => list(v, limit, |x| x.to_string()),
        MetaArray::U16(v) => list(v, limit, |x| x.to_string()),
        MetaArray::I16(v) => list(v, limit, |x| x.to_string()),
        MetaArray::U32(v) => list(v, limit, |x| x.to_string()),
        MetaArray::I32(v) => list(v, limit, |x| x.to_string()),
        MetaArray::U64(v) => list(v, limit, |x| x.to_string()),
        MetaArray::I64(v) => list(v, limit, |x| x.to_string()),
        MetaArray::F32(v) => list(v, limit, |x| x.to_string()),
        MetaArray::F64(v) => list(v, limit, |x| x.to_string()),
        MetaArray::Bool(v) => list(v, limit, |x| x.to_string()),
        MetaArray::Str(v) => list(v, limit, |x| quote(x, elem)),
        MetaArray::StrBytes(v) => list(v, limit, |x| match std::str::from_utf8(x) {
            Ok(s) => quote(s, elem),
            Err(_) => quote_bytes(x, elem),
        }),
        MetaArray::Array(v) => list(v, limit, |x| {
            format!("{} [{}]", x.type_desc(), array_items(x, full))
        }),
    }
}

/// One metadata value as `combs info` shows it.
fn format_value(v: &MetaValue, full: bool) -> String {
    let max = (!full).then_some(MAX_STR_CHARS);
    match v {
        MetaValue::U8(x) => x.to_string(),
        MetaValue::I8(x) => x.to_string(),
        MetaValue::U16(x) => x.to_string(),
        MetaValue::I16(x) => x.to_string(),
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I32(x) => x.to_string(),
        MetaValue::U64(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::F32(x) => x.to_string(),
        MetaValue::F64(x) => x.to_string(),
        MetaValue::Bool(x) => x.to_string(),
        MetaValue::Str(s) if !full && (s.chars().count() > MAX_STR_CHARS || s.contains('\n')) => {
            format!("({} bytes) {}", s.len(), quote(s, max))
        }
        MetaValue::Str(s) => quote(s, None),
        MetaValue::Bytes(b) => format!("({} bytes, not UTF-8) {}", b.len(), quote_bytes(b, max)),
        MetaValue::Array(a) => format!("[{}]", array_items(a, full)),
    }
}

fn print_model(g: &GgufFile, path: &str, full: bool, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "file: {path}")?;
    writeln!(
        out,
        "GGUF version {}, {} bytes ({}), alignment {}, data section at byte {}",
        g.version(),
        g.data().len(),
        human(g.data().len() as u64),
        g.alignment(),
        g.data_offset()
    )?;

    writeln!(out, "\nmetadata ({} keys):", g.metadata().len())?;
    let key_w = g.metadata().iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let ty_w = g
        .metadata()
        .iter()
        .map(|(_, v)| v.type_desc().len())
        .max()
        .unwrap_or(0);
    for (k, v) in g.metadata() {
        writeln!(
            out,
            "  {k:key_w$}  {:ty_w$}  {}",
            v.type_desc(),
            format_value(v, full)
        )?;
    }

    print_spec(g, out)?;

    let tensors = g.tensors();
    writeln!(out, "\ntensors ({}):", tensors.len())?;
    let rows: Vec<[String; 5]> = tensors
        .iter()
        .map(|t| {
            let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
            let ty = match t.qtype {
                Some(_) => t.type_name(),
                None => format!("{}*", t.type_name()),
            };
            [
                t.name.clone(),
                ty,
                dims.join(" x "),
                t.n_bytes.to_string(),
                t.offset.to_string(),
            ]
        })
        .collect();
    let header = ["name", "type", "dims", "bytes", "offset"].map(String::from);
    let mut w = [0usize; 5];
    for r in rows.iter().chain(std::iter::once(&header)) {
        for (wi, c) in w.iter_mut().zip(r) {
            *wi = (*wi).max(c.chars().count());
        }
    }
    let [w0, w1, w2, w3, w4] = w;
    for r in std::iter::once(&header).chain(&rows) {
        writeln!(
            out,
            "  {:w0$}  {:w1$}  {:w2$}  {:>w3$}  {:>w4$}",
            r[0], r[1], r[2], r[3], r[4]
        )?;
    }
    if tensors.iter().any(|t| t.qtype.is_none()) {
        writeln!(out, "  (* = a type combs lists but cannot run)")?;
    }

    let mut per_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in tensors {
        let e = per_type.entry(t.type_name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let total: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    let mut by_bytes: Vec<_> = per_type.into_iter().collect();
    by_bytes.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(&b.0)));
    let parts: Vec<String> = by_bytes
        .iter()
        .map(|(ty, (n, b))| format!("{ty}: {}, {b} bytes ({})", tensors_n(*n), human(*b)))
        .collect();
    writeln!(
        out,
        "\ntotal: {}, {total} bytes ({}){}{}",
        tensors_n(tensors.len()),
        human(total),
        if parts.is_empty() { "" } else { "; " },
        parts.join("; ")
    )?;
    Ok(())
}

/// The architecture combs resolves from the metadata, or why it cannot.
fn print_spec(g: &GgufFile, out: &mut dyn Write) -> std::io::Result<()> {
    let sp = match combs::models::ModelRegistry::new().resolve(g) {
        Ok(sp) => sp,
        Err(e) => return writeln!(out, "\nresolved architecture: none ({e})"),
    };
    writeln!(
        out,
        "\nresolved architecture: {} ({:?} family)",
        sp.arch, sp.family
    )?;
    writeln!(
        out,
        "  layers {}, embedding {}, feed-forward {}, vocabulary {}, trained context {}",
        sp.n_layer, sp.n_embd, sp.n_ff, sp.n_vocab, sp.n_ctx_train
    )?;
    writeln!(
        out,
        "  heads {} (KV {}), head dim {}, attention scale {}, softcap {} (final {})",
        sp.n_head, sp.n_head_kv, sp.head_dim, sp.attn_scale, sp.attn_softcap, sp.final_softcap
    )?;
    writeln!(
        out,
        "  rope {:?} over {} dims, base {} (local layers {}), scaling {}, attn factor {}",
        sp.rope_style,
        sp.n_rot,
        sp.rope_base,
        sp.rope_base_local,
        sp.rope_scaling,
        sp.rope_attn_factor
    )?;
    writeln!(
        out,
        "  norm {:?} eps {}, activation {:?}, embedding scale {}, QKV bias {}, Q/K norm {}, \
         post-norms {}, fused QKV {}, fused gate/up {}, tied output {}",
        sp.norm_flavor,
        sp.norm_eps,
        sp.activation,
        sp.embed_scale,
        yes(sp.qkv_bias),
        yes(sp.qk_norm),
        yes(sp.post_norms),
        yes(sp.fused_qkv),
        yes(sp.fused_gate_up),
        yes(sp.tied_embeddings)
    )?;
    let windows: Vec<String> = sp
        .layers
        .iter()
        .enumerate()
        .filter_map(|(i, k)| match k {
            combs::models::LayerKind::SlidingWindow { window } => Some(format!("{i}:{window}")),
            combs::models::LayerKind::Full => None,
        })
        .collect();
    if windows.is_empty() {
        writeln!(out, "  every layer attends to the full context")
    } else {
        writeln!(
            out,
            "  sliding-window layers (layer:window) {}; the others full",
            windows.join(" ")
        )
    }
}

/// "1 tensor", "2 tensors".
fn tensors_n(n: usize) -> String {
    if n == 1 {
        "1 tensor".into()
    } else {
        format!("{n} tensors")
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn print_devices(devices: &[DeviceInfo], out: &mut dyn Write) -> Result<(), CliError> {
    if devices.is_empty() {
        return Err(ModelError::NoDevice(
            "the Vulkan loader lists no devices; install a driver, e.g. \
             `apt-get install mesa-vulkan-drivers` for lavapipe"
                .into(),
        )
        .into());
    }
    for (i, d) in devices.iter().enumerate() {
        let c = &d.caps;
        let v = c.api_version;
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(
            out,
            "device {}: {} ({:?}, vendor 0x{:04x}, Vulkan {}.{}.{})",
            d.index,
            c.name,
            c.device_type,
            c.vendor_id,
            (v >> 22) & 0x7f,
            (v >> 12) & 0x3ff,
            v & 0xfff
        )?;
        writeln!(
            out,
            "  subgroup size {} (min {}, max {}; size control {}, arithmetic {})",
            c.subgroup_size,
            c.min_subgroup_size,
            c.max_subgroup_size,
            yes(c.subgroup_size_control),
            yes(c.subgroup_arithmetic)
        )?;
        writeln!(
            out,
            "  maxStorageBufferRange {} ({}), max allocation {}, shared memory {} bytes, \
             workgroup invocations {}",
            c.max_storage_buffer_range,
            human(c.max_storage_buffer_range),
            human(c.max_memory_allocation_size),
            c.max_shared_memory,
            c.max_workgroup_invocations
        )?;
        let coop: Vec<String> = c
            .coop_mat_f16
            .iter()
            .map(|s| format!("{}x{}x{}", s.m, s.n, s.k))
            .collect();
        writeln!(
            out,
            "  fp16 {}, 16-bit storage {}, int8 {}, int8 dot product {}, memory model {}, coop matrix {}",
            yes(c.shader_float16),
            yes(c.storage_16bit),
            yes(c.shader_int8),
            yes(c.int_dot_accelerated),
            yes(c.vulkan_memory_model),
            if coop.is_empty() {
                "no".to_string()
            } else {
                format!("f16 {}", coop.join(" "))
            }
        )?;
        if let Some(m2) = &c.coop_mat2 {
            let shapes: Vec<String> = m2
                .shapes
                .iter()
                .map(|s| format!("{}x{}x{}/{}", s.m, s.n, s.k, s.invocations))
                .collect();
            writeln!(
                out,
                "  workgroup-scope coop matrix (VK_NV_cooperative_matrix2): f16 granularity \
                 MxNxK/invocations {}, up to {} invocations, {} bytes of shared memory reserved",
                shapes.join(" "),
                m2.max_workgroup_size,
                m2.reserved_shared_memory
            )?;
        }
        writeln!(
            out,
            "  device-local memory {} ({} bytes), timestamps {}, multiprocessors {}",
            human(c.device_local_bytes),
            c.device_local_bytes,
            match c.timestamp_period_ns {
                Some(p) => format!("{p} ns/tick"),
                None => "no".into(),
            },
            c.sm_count
                .map_or_else(|| "not reported".to_string(), |n| n.to_string())
        )?;
        match &d.unusable {
            None => writeln!(out, "  usable: yes")?,
            Some(why) => writeln!(out, "  usable: no ({why})")?,
        }
    }
    Ok(())
}

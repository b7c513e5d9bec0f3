//! Which type each tensor of a requantized file gets, and in which order the
//! tensors are written: a port of llama.cpp's `src/llama-quant.cpp`
//! (`tensor_get_category`, `tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`, and the tensor order
//! of `llama_model_loader::weights_map`), without an importance matrix,
//! `--pure`, or per-tensor overrides.
//!
//! Only the branches reachable from the targets in [`FileType`] are ported
//! (the IQ*, TQ* and MXFP4 rules are not). Architecture-specific rules: the
//! `falcon` exceptions, the 70B `attn_v` bump (llama and qwen2 with 80
//! layers), and the 8-expert MoE rules; the `glm5-next` rules are not ported.
//! The counters that index layers (`i_attention_wv`, `i_ffn_down`, …) advance
//! in the output order, exactly as llama.cpp's do.

use std::cmp::Ordering;

use super::FileType;
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::quant::QuantType;

/// What happens to one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    /// Index of the tensor in the input's tensor table.
    pub input_index: usize,
    /// Tensor name.
    pub name: String,
    /// Dimensions as written (`ne0` first, trailing 1s dropped as `ggml_n_dims` does).
    pub dims: Vec<u64>,
    /// Number of elements.
    pub n_elements: u64,
    /// GGML type id in the input.
    pub from: u32,
    /// GGML type id in the output; equal to `from` means the bytes are copied.
    pub to: u32,
    /// The type the rules chose before a row length forced `to` instead.
    pub fallback_from: Option<QuantType>,
}

impl TensorPlan {
    /// Whether the tensor is converted (rather than copied byte for byte).
    pub fn converts(&self) -> bool {
        self.from != self.to
    }
}

/// Broad role of a tensor, from its name (llama.cpp's `tensor_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionV,
    AttentionK,
    AttentionQkv,
    AttentionKvB,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Category {
    fn of(name: &str) -> Self {
        // Tested in this order, as llama.cpp does: the first fragment found wins.
        const BY_FRAGMENT: [(&str, Category); 9] = [
            ("attn_qkv.weight", Category::AttentionQkv),
            ("attn_kv_b.weight", Category::AttentionKvB),
            ("attn_v.weight", Category::AttentionV),
            ("attn_k.weight", Category::AttentionK),
            ("attn_q.weight", Category::AttentionQ),
            ("attn_output.weight", Category::AttentionOutput),
            ("ffn_up", Category::FfnUp),
            ("ffn_gate", Category::FfnGate),
            ("ffn_down", Category::FfnDown),
        ];
        if name == "output.weight" {
            Category::Output
        } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            Category::TokenEmbd
        } else {
            BY_FRAGMENT
                .iter()
                .find(|(fragment, _)| name.contains(fragment))
                .map_or(Category::Other, |&(_, c)| c)
        }
    }

    /// The value projections, which take more bits (`category_is_attn_v`).
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB
        )
    }
}

/// Name fragments of 2-D+ weights that are never quantized (`tensor_allows_quantization`).
const KEEP_AS_IS: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// `ggml_n_dims`: the dimension count without trailing 1s (at least 1).
fn n_dims(dims: &[u64]) -> usize {
    (1..dims.len())
        .rev()
        .find(|&i| dims[i] > 1)
        .map_or(1, |i| i + 1)
}

/// Whether a weight may change type at all (`tensor_allows_quantization`).
fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    n_dims(dims) >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !KEEP_AS_IS.iter().any(|k| name.contains(k))
}

/// The layer of `blk.N.…` names as C's `sscanf(name, "blk.%d.", &layer)` reads it; -1 otherwise.
fn block_index(name: &str) -> i64 {
    let Some(rest) = name.strip_prefix("blk.") else {
        return -1;
    };
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return -1;
    }
    let v = digits[..end].bytes().fold(0i64, |a, b| {
        a.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    if neg { -v } else { v }
}

/// llama.cpp's `weight_name_comparer`: by block index (non-block tensors first), then by name.
fn weight_order(a: &str, b: &str) -> Ordering {
    block_index(a)
        .cmp(&block_index(b))
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// The hyperparameters the rules read.
struct Hparams {
    arch: String,
    n_layer: i32,
    n_gqa: u32,
    n_expert: u32,
    is_70b: bool,
}

/// First element of a per-layer array, or the scalar.
fn first_u32(file: &GgufFile, key: &str) -> Result<Option<u32>> {
    if let Some(v) = file.get(key)
        && v.as_array().is_some()
    {
        return Ok(file.get_arr_u32(key)?.and_then(|a| a.first().copied()));
    }
    file.get_u32(key)
}

impl Hparams {
    fn read(file: &GgufFile) -> Result<Self> {
        let arch = file.architecture()?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let n_layer_key = key("block_count");
        let n_layer =
            i32::try_from(file.require_u32(&n_layer_key)?).map_err(|_| ModelError::Metadata {
                key: n_layer_key.clone(),
                reason: "out of range".into(),
            })?;
        let n_head = first_u32(file, &key("attention.head_count"))?.unwrap_or(0);
        let n_head_kv = first_u32(file, &key("attention.head_count_kv"))?.unwrap_or(n_head);
        let n_expert = file.get_u32(&key("expert_count"))?.unwrap_or(0);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0);
        // LLM_TYPE_70B, set by the llama and qwen2 loaders for 80-layer models.
        let is_70b = n_layer == 80
            && match arch.as_str() {
                "llama" => n_expert != 8 && n_head != n_head_kv,
                "qwen2" => true,
                _ => false,
            };
        Ok(Hparams {
            arch,
            n_layer,
            n_gqa,
            n_expert,
            is_70b,
        })
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// `use_more_bits`: the first and last eighth of the layers, and every third one between.
fn use_more_bits(i_layer: i32, n_layers: i32) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// Running state of the rules (llama.cpp's `quantize_state_impl`).
struct State {
    hp: Hparams,
    ftype: FileType,
    has_tied_embeddings: bool,
    n_attention_wv: i32,
    i_attention_wv: i32,
    i_ffn_down: i32,
    i_ffn_gate: i32,
    i_ffn_up: i32,
}

impl State {
    /// The layer a per-layer FFN rule applies to: the running counter, or for
    /// MoE models the index in the name (experts are not stored in layer order).
    fn layer_info(&self, counter: i32, name: &str) -> Result<(i32, i32)> {
        let n_layer = self.hp.n_layer;
        if self.hp.n_expert <= 1 {
            return Ok((counter, n_layer));
        }
        let i = block_index(name);
        if !name.starts_with("blk.") || i < 0 || i >= i64::from(n_layer) {
            return Err(ModelError::invalid(
                "tensor",
                format!("cannot tell the layer (of {n_layer}) of tensor `{name}`"),
            ));
        }
        Ok((i as i32, n_layer))
    }

    /// `llama_tensor_get_type_impl` for the targets of [`FileType`].
    fn rule_type(
        &mut self,
        mut t: QuantType,
        name: &str,
        ne0: u64,
        cat: Category,
    ) -> Result<QuantType> {
        use FileType as F;
        use QuantType as Q;
        let ft = self.ftype;
        let falcon = self.hp.is_falcon();
        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            if falcon || !ne0.is_multiple_of(t.block_size() as u64) {
                t = Q::Q8_0;
            } else if t != Q::Q8_0 {
                t = Q::Q6K;
            }
        } else if cat == Category::TokenEmbd {
            // Only IQ/TQ targets change an untied embedding.
        } else if cat.is_attn_v() {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            if ft == F::Q2K {
                t = if self.hp.n_gqa >= 4 { Q::Q4K } else { Q::Q3K };
            } else if ft == F::Q3KM {
                t = if i < 2 { Q::Q5K } else { Q::Q4K };
            } else if ft == F::Q3KL {
                t = Q::Q5K;
            } else if matches!(ft, F::Q4KM | F::Q5KM) && use_more_bits(i, n) {
                t = Q::Q6K;
            } else if ft == F::Q4KS && i < 4 {
                t = Q::Q5K;
            }
            if self.hp.is_70b && matches!(t, Q::Q3K | Q::Q4K) {
                // 8 heads share each attn_v: more bits cost little.
                t = Q::Q5K;
            }
            if self.hp.n_expert == 8 {
                t = Q::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttentionK {
            if self.hp.n_expert == 8 {
                t = Q::Q8_0;
            }
        } else if cat == Category::AttentionQ {
            // Only IQ targets change attn_q.
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, name)?;
            match ft {
                F::Q2K => t = Q::Q3K,
                F::Q3KM => {
                    t = if i < n / 16 {
                        Q::Q5K
                    } else if !falcon || use_more_bits(i, n) {
                        Q::Q4K
                    } else {
                        Q::Q3K
                    }
                }
                F::Q3KL => t = if falcon { Q::Q4K } else { Q::Q5K },
                F::Q4KM => {
                    if falcon {
                        t = if i < n / 16 {
                            Q::Q6K
                        } else if use_more_bits(i, n) {
                            Q::Q5K
                        } else {
                            Q::Q4K
                        };
                    } else if use_more_bits(i, n) {
                        t = Q::Q6K;
                    }
                }
                F::Q5KM if use_more_bits(i, n) => t = Q::Q6K,
                F::Q4KS if !falcon && i < n / 8 => t = Q::Q5K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttentionOutput {
            if !falcon {
                if self.hp.n_expert == 8 {
                    if matches!(ft, F::Q2K | F::Q3KS | F::Q3KM | F::Q4KS | F::Q4KM) {
                        t = Q::Q5K;
                    }
                } else {
                    match ft {
                        F::Q2K => t = Q::Q3K,
                        F::Q3KM => t = Q::Q4K,
                        F::Q3KL => t = Q::Q5K,
                        _ => {}
                    }
                }
            } else if ft == F::Q3KL {
                t = Q::Q4K;
            }
        } else if cat == Category::FfnGate {
            // Only IQ3_XS changes ffn_gate, but the layer is still checked.
            self.layer_info(self.i_ffn_gate, name)?;
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.layer_info(self.i_ffn_up, name)?;
            self.i_ffn_up += 1;
        }
        Ok(t)
    }
}

/// `tensor_type_fallback`: a type whose blocks divide a row of `ne0` weights.
fn fallback(t: QuantType, ne0: u64, name: &str) -> Result<QuantType> {
    let fits = |t: QuantType| ne0.is_multiple_of(t.block_size() as u64);
    if fits(t) {
        return Ok(t);
    }
    let f = match t {
        QuantType::Q2K | QuantType::Q3K => QuantType::Q4_0,
        QuantType::Q4K => QuantType::Q5_0,
        QuantType::Q5K => QuantType::Q5_1,
        QuantType::Q6K => QuantType::Q8_0,
        t if t.block_size() <= 32 => t,
        t => {
            return Err(ModelError::invalid(
                "type",
                format!("no fallback type for {t} on tensor `{name}`"),
            ));
        }
    };
    Ok(if fits(f) { f } else { QuantType::F16 })
}

/// The output tensors of requantizing `input` to `ftype`, in output order,
/// with the type each gets.
///
/// # Errors
/// [`ModelError::Metadata`] when `general.architecture` or
/// `<arch>.block_count` is missing; [`ModelError::InvalidArgument`] when a
/// MoE FFN tensor's name does not give its layer.
pub fn plan(input: &GgufFile, ftype: FileType) -> Result<Vec<TensorPlan>> {
    let hp = Hparams::read(input)?;
    let tensors = input.tensors();
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| weight_order(&tensors[a].name, &tensors[b].name));

    let cats: Vec<Category> = tensors.iter().map(|t| Category::of(&t.name)).collect();
    let mut st = State {
        hp,
        ftype,
        has_tied_embeddings: !cats.contains(&Category::Output),
        n_attention_wv: cats.iter().filter(|c| c.is_attn_v()).count() as i32,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };
    let default = ftype.default_type();
    let mut plans = Vec::with_capacity(tensors.len());
    for &i in &order {
        let t = &tensors[i];
        let dims = t.dims[..n_dims(&t.dims).min(t.dims.len())].to_vec();
        let ne0 = dims.first().copied().unwrap_or(1);
        let mut to = t.ggml_type;
        let mut fallback_from = None;
        if allows_quantization(&t.name, &t.dims) {
            to = default as u32;
            if !default.is_dense() {
                let chosen = st.rule_type(default, &t.name, ne0, cats[i])?;
                let fitted = fallback(chosen, ne0, &t.name)?;
                if fitted != chosen {
                    fallback_from = Some(chosen);
                }
                to = fitted as u32;
            }
        }
        plans.push(TensorPlan {
            input_index: i,
            name: t.name.clone(),
            dims,
            n_elements: t.n_elements,
            from: t.ggml_type,
            to,
            fallback_from,
        });
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_index_reads_like_sscanf() {
        assert_eq!(block_index("blk.12.attn_q.weight"), 12);
        assert_eq!(block_index("blk.3"), 3);
        assert_eq!(block_index("output.weight"), -1);
        assert_eq!(block_index("blk.x.y"), -1);
    }

    #[test]
    fn weight_order_puts_globals_first_then_layers_numerically() {
        let mut v = vec![
            "blk.10.attn_q.weight",
            "blk.2.ffn_up.weight",
            "token_embd.weight",
            "blk.2.attn_k.weight",
            "output_norm.weight",
        ];
        v.sort_by(|a, b| weight_order(a, b));
        assert_eq!(
            v,
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_up.weight",
                "blk.10.attn_q.weight",
            ]
        );
    }

    #[test]
    fn use_more_bits_matches_llama_cpp_for_30_layers() {
        let picked: Vec<i32> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
    }

    #[test]
    fn n_dims_drops_trailing_ones() {
        assert_eq!(n_dims(&[576]), 1);
        assert_eq!(n_dims(&[576, 1]), 1);
        assert_eq!(n_dims(&[576, 3, 1]), 2);
        assert_eq!(n_dims(&[1, 1, 4]), 3);
    }
}

//! `include/combs.h` against the C API contract of DESIGN.md: every
//! declaration there appears in the generated header with the same
//! signature (struct fields in order, new fields only appended), and the
//! header declares nothing but `combs_` / `COMBS_` items.

/// The contract's declarations, as DESIGN.md writes them.
const CONTRACT: &[&str] = &[
    "typedef enum combs_status {
      COMBS_OK = 0, COMBS_ERR_INVALID_ARGUMENT, COMBS_ERR_IO, COMBS_ERR_FORMAT,
      COMBS_ERR_UNSUPPORTED, COMBS_ERR_OUT_OF_MEMORY, COMBS_ERR_DEVICE,
      COMBS_ERR_CONTEXT_FULL, COMBS_ERR_INTERNAL, COMBS_ERR_BUFFER_TOO_SMALL
    } combs_status;",
    "typedef int32_t combs_token;",
    "typedef struct combs_runtime combs_runtime;",
    "typedef struct combs_model combs_model;",
    "typedef struct combs_session combs_session;",
    "typedef struct combs_sampler combs_sampler;",
    "typedef enum combs_kv_kind { COMBS_KV_CONTIGUOUS = 0, COMBS_KV_PAGED = 1 } combs_kv_kind;",
    "const char  *combs_version(void);",
    "const char  *combs_last_error(void);",
    "const char  *combs_status_str(combs_status s);",
    "combs_runtime_options combs_runtime_default_options(void);",
    "combs_status combs_runtime_create(const combs_runtime_options *opts, combs_runtime **out);",
    "void         combs_runtime_free(combs_runtime *rt);",
    "combs_model_options combs_model_default_options(void);",
    "combs_status combs_model_load(combs_runtime *rt, const char *path,
                              const combs_model_options *opts, combs_model **out);",
    "void         combs_model_free(combs_model *m);",
    "int32_t      combs_model_n_vocab(const combs_model *m);",
    "int32_t      combs_model_n_ctx_train(const combs_model *m);",
    "combs_token  combs_model_token_bos(const combs_model *m);",
    "combs_token  combs_model_token_eos(const combs_model *m);",
    "bool         combs_model_token_is_eog(const combs_model *m, combs_token t);",
    "combs_status combs_tokenize(const combs_model *m, const char *text, size_t len,
                            bool add_special, combs_token *out, size_t cap, size_t *n_out);",
    "combs_status combs_token_to_piece(const combs_model *m, combs_token t,
                                  char *buf, size_t cap, size_t *len_out);",
    "combs_status combs_chat_apply_template(const combs_model *m, const char *const *roles,
                                       const char *const *contents, size_t n_messages,
                                       bool add_generation_prompt,
                                       char *buf, size_t cap, size_t *len_out);",
    "combs_session_options combs_session_default_options(void);",
    "combs_status combs_session_create(combs_model *m, const combs_session_options *opts,
                                  combs_session **out);",
    "void         combs_session_free(combs_session *s);",
    "combs_status combs_session_prefill(combs_session *s, const combs_token *tokens, size_t n);",
    "combs_status combs_session_decode(combs_session *s, combs_token t);",
    "const float *combs_session_logits(const combs_session *s);",
    "size_t       combs_session_len(const combs_session *s);",
    "combs_status combs_session_rewind(combs_session *s, size_t n_keep);",
    "combs_sampler_options combs_sampler_default_options(void);",
    "combs_status combs_sampler_create(const combs_sampler_options *opts, combs_sampler **out);",
    "void         combs_sampler_free(combs_sampler *smp);",
    "combs_token  combs_sampler_sample(combs_sampler *smp, const float *logits, size_t n_vocab);",
    "typedef bool (*combs_token_callback)(combs_token t, const char *piece, size_t len, void *user_data);",
    "combs_status combs_generate(combs_session *s, combs_sampler *smp, size_t max_tokens,
                            combs_token_callback cb, void *user_data);",
    "combs_status combs_batch_decode(combs_model *m, combs_session *const *sessions,
                                const combs_token *tokens, size_t n);",
    "combs_status combs_session_decode_sample(combs_session *s, combs_token t, combs_sampler *smp,
                                         combs_token *out);",
    "combs_status combs_batch_decode_sample(combs_model *m, combs_session *const *sessions,
                                       combs_sampler *const *samplers, const combs_token *tokens,
                                       size_t n, combs_token *out);",
];

/// Option structs: the contract's fields, which must open the struct in this order.
const STRUCT_PREFIXES: &[&str] = &[
    "typedef struct combs_runtime_options { int32_t device_index;",
    "typedef struct combs_model_options { bool show_progress;",
    "typedef struct combs_session_options { uint32_t n_ctx; combs_kv_kind kv_kind; uint32_t page_size;",
    "typedef struct combs_sampler_options { float temperature; int32_t top_k; float top_p;
       float min_p; float repeat_penalty; int32_t repeat_last_n; uint64_t seed;",
];

fn header() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/combs.h");
    std::fs::read_to_string(path).expect("include/combs.h exists (cargo build writes it)")
}

/// The header without comments and preprocessor lines.
fn code(h: &str) -> String {
    h.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// No whitespace, no trailing commas before a closing brace, and `struct` /
/// `enum` only where a typedef defines them (cbindgen writes `enum
/// combs_status f(const struct combs_runtime_options *o)`, the same types as
/// the contract's `combs_status f(const combs_runtime_options *o)`).
fn squash(s: &str) -> String {
    s.replace("typedef struct ", "\u{1}")
        .replace("typedef enum ", "\u{2}")
        .replace("struct ", "")
        .replace("enum ", "")
        .replace('\u{1}', "typedef struct ")
        .replace('\u{2}', "typedef enum ")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .replace(",}", "}")
}

#[test]
fn ffi_header_declares_the_contract() {
    let h = squash(&code(&header()));
    for decl in CONTRACT.iter().chain(STRUCT_PREFIXES) {
        let d = squash(decl);
        let d = d.strip_suffix('}').unwrap_or(&d);
        assert!(
            h.contains(d),
            "include/combs.h lacks the contract's\n{decl}"
        );
    }
}

#[test]
fn ffi_header_has_include_guard_and_cpp_linkage() {
    let h = header();
    assert!(h.starts_with("#ifndef COMBS_H\n#define COMBS_H\n"));
    assert!(h.contains("#ifdef __cplusplus\nextern \"C\" {"));
    assert!(h.contains("Generated by cbindgen"));
    // Doc comments are carried over.
    assert!(h.contains("// The logits of the session's last position"));
}

#[test]
fn ffi_header_declares_only_api_items() {
    let c = code(&header());
    let words: Vec<&str> = c
        .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    // Names that follow `struct` / `enum` and names of typedefs and functions.
    for (i, w) in words.iter().enumerate() {
        if matches!(*w, "struct" | "enum") {
            let name = words.get(i + 1).copied().unwrap_or("");
            assert!(
                name.starts_with("combs_"),
                "non-API type `{name}` in include/combs.h"
            );
        }
    }
    for line in c.lines() {
        let t = line.trim();
        // Enumerators.
        if line.starts_with("  ") && t.chars().next().is_some_and(|ch| ch.is_ascii_uppercase()) {
            assert!(t.starts_with("COMBS_"), "non-API enumerator `{t}`");
        }
        // Function declarations: `<type> name(` at the start of a line.
        if !line.starts_with(' ')
            && !t.starts_with("typedef")
            && !t.starts_with('}')
            && let Some(open) = t.find('(')
        {
            let name = t[..open].rsplit([' ', '*']).next().unwrap_or("");
            assert!(
                name.starts_with("combs_"),
                "non-API function `{name}` in `{t}`"
            );
        }
    }
}

//! The pre-tokenizer each `tokenizer.ggml.pre` value selects: its regex
//! list and flags, as the pre-type switch in llama.cpp's
//! `llama_vocab::impl::load` and the `llm_tokenizer_bpe` constructor
//! (`src/llama-vocab.cpp`) define them. Patterns are llama.cpp's, byte for
//! byte (non-ASCII characters written as `\u{..}` so no editor can
//! normalize them); the matching lives in `pretokenize`.

/// GPT-2's pattern (scanned by hand, as `unicode_regex_split_custom_gpt2`).
pub(crate) const GPT2: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
/// Llama 3's pattern, case-insensitive contractions written out.
pub(crate) const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Qwen2's pattern: Llama 3's with single digits.
pub(crate) const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Qwen3.5's pattern: Qwen2's with combining marks inside words.
pub(crate) const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Runs of newlines and runs of everything else.
pub(crate) const NEWLINES: &str = "[^\\n]+|[\\n]+";
const JAIS2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const PORO: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";

/// The regex list and flags of one `tokenizer.ggml.pre` value.
pub(crate) struct PreSpec {
    /// Regexes applied in turn, each splitting the previous one's pieces.
    pub(crate) regexes: &'static [&'static str],
    /// llama.cpp's `clean_spaces`.
    pub(crate) clean_spaces: bool,
    /// llama.cpp's `ignore_merges`.
    pub(crate) ignore_merges: bool,
    /// The pre type turns `add_bos` on.
    pub(crate) add_bos: bool,
    /// The pre type has no default BOS token.
    pub(crate) no_bos: bool,
}

const fn spec(regexes: &'static [&'static str], clean_spaces: bool) -> PreSpec {
    PreSpec {
        regexes,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    }
}

/// The pre-tokenizer settings llama.cpp applies for a `tokenizer.ggml.pre` value.
pub(crate) fn pre_spec(pre: &str) -> Option<PreSpec> {
    const DEFAULT: &[&str] = &[
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        GPT2,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ];
    const DEEPSEEK_LLM: &[&str] = &[
        "[\r\n]",
        "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
        "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
        "\\s+$",
        "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
        "\\p{N}+",
    ];
    const DEEPSEEK3: &[&str] = &[
        "\\p{N}{1,3}",
        "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
        DEEPSEEK3_MAIN,
    ];
    const SPARK2_5: &[&str] = &[
        "\\p{N}{1,3}",
        "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}",
    ];
    const YOUTU: &[&str] = &[
        "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const DEEPSEEK_CODER: &[&str] = &[
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
        "\\p{N}",
    ];
    const FALCON: &[&str] = &["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "[0-9][0-9][0-9]"];
    const STARCODER: &[&str] = &["\\p{N}", GPT2];
    const TEKKEN: &[&str] = &[
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const CHAMELEON: &[&str] = &[
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]",
        GPT2,
    ];
    const GRANITE_EMB_MULTI: &[&str] = &[
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const BAILINGMOE: &[&str] = &[
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ];
    const SEED_CODER: &[&str] = &[
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const UFAKZEKA: &[&str] = &[
        "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];
    const EXAONE_MOE: &[&str] = &[
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ];
    const MINICPM5: &[&str] = &[
        "\\p{N}{1,3}",
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ];

    let s = match pre {
        "default" => spec(DEFAULT, true),
        "minicpm5" => PreSpec {
            ignore_merges: true,
            ..spec(MINICPM5, true)
        },
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec(&[LLAMA3], true)
        },
        "deepseek-llm" => spec(DEEPSEEK_LLM, false),
        "deepseek-coder" => spec(DEEPSEEK_CODER, false),
        "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => spec(DEEPSEEK3, false),
        "spark2_5" => spec(SPARK2_5, false),
        "youtu" => PreSpec {
            ignore_merges: true,
            ..spec(YOUTU, false)
        },
        "falcon" => spec(FALCON, true),
        "mpt" | "olmo" | "jais" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat"
        | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => spec(&[GPT2], true),
        "trillion" | "granite-docling" => spec(&[GPT2], false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec(STARCODER, true)
        }
        "command-r" | "smollm" => spec(STARCODER, false),
        "jais-2" => spec(&[JAIS2], true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => spec(&[QWEN2], false),
        "megrez" | "stablelm2" => spec(&[QWEN2], true),
        "qwen35" => spec(&[QWEN35], false),
        "dbrx" | "smaug-bpe" => spec(&[LLAMA3], true),
        "poro-chat" => spec(&[PORO], false),
        "bloom" | "gpt3-finnish" => spec(&[PORO], true),
        "chatglm-bpe" => PreSpec {
            no_bos: true,
            ..spec(&[LLAMA3], true)
        },
        "glm4" | "glm5" => PreSpec {
            no_bos: true,
            ignore_merges: true,
            ..spec(&[LLAMA3], true)
        },
        "viking" => spec(&[PORO, "\\p{N}"], false),
        "tekken" => PreSpec {
            ignore_merges: true,
            add_bos: true,
            ..spec(TEKKEN, false)
        },
        "chameleon" => PreSpec {
            add_bos: true,
            ..spec(CHAMELEON, false)
        },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec(&[GPT4O], false),
        "granite-embed-multi-97m" => PreSpec {
            ignore_merges: true,
            ..spec(GRANITE_EMB_MULTI, false)
        },
        "bailingmoe" | "bailingmoe2" | "llada-moe" => spec(BAILINGMOE, false),
        "seed-coder" => spec(SEED_CODER, false),
        "ufakzeka" => spec(UFAKZEKA, false),
        "laguna" => spec(&[NEWLINES, QWEN2], false),
        "exaone-moe" => spec(EXAONE_MOE, true),
        _ => return None,
    };
    Some(s)
}

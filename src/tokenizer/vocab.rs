//! The vocabulary: token texts, scores and attributes, the text → id map, the
//! special ids and the end-of-generation set, built the way llama.cpp's
//! `llama_vocab::impl::load` builds them (`src/llama-vocab.cpp`): defaults
//! per tokenizer model, GGUF keys overriding them when in range, special
//! tokens recognised by their text, and the special-token cache used to split
//! them out of the input.

use super::hash::hash_bytes;
use crate::error::{ModelError, Result};

/// Token attribute bits (`llama_token_attr`).
pub(crate) mod attr {
    pub(crate) const UNKNOWN: u32 = 1 << 0;
    pub(crate) const UNUSED: u32 = 1 << 1;
    pub(crate) const NORMAL: u32 = 1 << 2;
    pub(crate) const CONTROL: u32 = 1 << 3;
    pub(crate) const USER_DEFINED: u32 = 1 << 4;
    pub(crate) const BYTE: u32 = 1 << 5;
    pub(crate) const LSTRIP: u32 = 1 << 7;
    pub(crate) const RSTRIP: u32 = 1 << 8;
}

/// The two vocabulary families combs reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VocabKind {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece-style, scores and `<0xXX>` bytes.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merges.
    Bpe,
}

/// One token: its text as stored in the file, its score and attributes.
#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub(crate) text: Vec<u8>,
    pub(crate) score: f32,
    pub(crate) attr: u32,
}

/// Ids of the special tokens (`LLAMA_TOKEN_NULL` is `None`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialIds {
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) sep: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) mask: Option<u32>,
    pub(crate) fim_pre: Option<u32>,
    pub(crate) fim_suf: Option<u32>,
    pub(crate) fim_mid: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
}

/// One id of [`SpecialIds`], as a field accessor.
pub(crate) type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;

impl SpecialIds {
    /// Every id with its GGUF key (`tokenizer.ggml.<key>`), in llama.cpp's order.
    pub(crate) const KEYS: [(&'static str, Slot); 14] = [
        ("bos_token_id", |s| &mut s.bos),
        ("eos_token_id", |s| &mut s.eos),
        ("eot_token_id", |s| &mut s.eot),
        ("eom_token_id", |s| &mut s.eom),
        ("unknown_token_id", |s| &mut s.unk),
        ("seperator_token_id", |s| &mut s.sep),
        ("padding_token_id", |s| &mut s.pad),
        ("mask_token_id", |s| &mut s.mask),
        ("fim_pre_token_id", |s| &mut s.fim_pre),
        ("fim_suf_token_id", |s| &mut s.fim_suf),
        ("fim_mid_token_id", |s| &mut s.fim_mid),
        ("fim_pad_token_id", |s| &mut s.fim_pad),
        ("fim_rep_token_id", |s| &mut s.fim_rep),
        ("fim_sep_token_id", |s| &mut s.fim_sep),
    ];
}

/// Special-token ids as the GGUF keys give them (`None`: key absent).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SpecialKeys {
    /// The keys of [`SpecialIds::KEYS`].
    pub(crate) ids: SpecialIds,
    /// Deprecated spellings of the FIM keys, applied after the new ones.
    pub(crate) prefix: Option<u32>,
    pub(crate) suffix: Option<u32>,
    pub(crate) middle: Option<u32>,
}

/// Token texts that llama.cpp takes for EOT when no key names one.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Token texts that end generation (llama.cpp's `special_eog_ids` by text).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Everything [`Vocab::build`] needs besides the token list.
pub(crate) struct VocabInput<'a> {
    pub(crate) kind: VocabKind,
    pub(crate) tokens: Vec<Vec<u8>>,
    pub(crate) scores: Option<Vec<f32>>,
    pub(crate) token_types: Option<Vec<i32>>,
    pub(crate) keys: SpecialKeys,
    /// Default special ids of the tokenizer model, after pre-type tweaks.
    pub(crate) defaults: SpecialIds,
    pub(crate) general_name: Option<&'a str>,
    pub(crate) general_arch: Option<&'a str>,
    pub(crate) pre: Option<&'a str>,
}

/// Open-addressing table from token text to id; the texts stay in the
/// token list, so the 262k strings of a large vocabulary are stored once.
#[derive(Debug)]
struct TextIndex {
    /// Token ids, `u32::MAX` for an empty slot.
    slots: Vec<u32>,
    /// `64 - log2(slots.len())`: the slot is the top bits of the hash.
    shift: u32,
}

impl TextIndex {
    fn with_capacity(n: usize) -> TextIndex {
        let len = (n * 2).next_power_of_two().max(16);
        TextIndex {
            slots: vec![u32::MAX; len],
            shift: 64 - len.trailing_zeros(),
        }
    }

    fn start(&self, text: &[u8]) -> usize {
        (hash_bytes(text) >> self.shift) as usize
    }

    fn get(&self, tokens: &[TokenData], text: &[u8]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = self.start(text);
        loop {
            let id = self.slots[i];
            if id == u32::MAX {
                return None;
            }
            if tokens[id as usize].text == text {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `tokens[id]`; returns the id already holding the same text, if any.
    fn insert(&mut self, tokens: &[TokenData], id: u32) -> Option<u32> {
        let text = &tokens[id as usize].text;
        let mask = self.slots.len() - 1;
        let mut i = self.start(text);
        loop {
            let other = self.slots[i];
            if other == u32::MAX {
                self.slots[i] = id;
                return None;
            }
            if tokens[other as usize].text == *text {
                return Some(other);
            }
            i = (i + 1) & mask;
        }
    }
}

/// The vocabulary of a model.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) kind: VocabKind,
    pub(crate) tokens: Vec<TokenData>,
    to_id: TextIndex,
    pub(crate) ids: SpecialIds,
    /// End-of-generation flag per token.
    eog: Vec<bool>,
    /// Control, user-defined and unknown tokens, longest text first.
    pub(crate) special_cache: Vec<u32>,
}

fn meta_err(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn attr_of_type(t: i32) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

impl Vocab {
    /// Builds the vocabulary, following `llama_vocab::impl::load` step by step.
    pub(crate) fn build(input: VocabInput<'_>) -> Result<Vocab> {
        let n = input.tokens.len();
        if n == 0 {
            return Err(meta_err("tokenizer.ggml.tokens", "the vocabulary is empty"));
        }
        if n > i32::MAX as usize {
            return Err(meta_err("tokenizer.ggml.tokens", "too many tokens"));
        }
        if let Some(s) = &input.scores
            && s.len() < n
        {
            return Err(meta_err(
                "tokenizer.ggml.scores",
                format!("{} scores for {n} tokens", s.len()),
            ));
        }
        if let Some(t) = &input.token_types
            && t.len() < n
        {
            return Err(meta_err(
                "tokenizer.ggml.token_type",
                format!("{} token types for {n} tokens", t.len()),
            ));
        }

        let mut tokens = Vec::with_capacity(n);
        let mut to_id = TextIndex::with_capacity(n);
        for (i, raw) in input.tokens.into_iter().enumerate() {
            // llama.cpp reads each token as a C string: it ends at the first NUL.
            let mut text = match raw.iter().position(|&b| b == 0) {
                Some(p) => raw[..p].to_vec(),
                None => raw,
            };
            if text.is_empty() {
                text = format!("[EMPTY_{i}]").into_bytes();
            }
            let score = input.scores.as_ref().map_or(0.0, |s| s[i]);
            let attr = input
                .token_types
                .as_ref()
                .map_or(attr::NORMAL, |t| attr_of_type(t[i]));
            tokens.push(TokenData { text, score, attr });
            if let Some(first) = to_id.insert(&tokens, i as u32) {
                return Err(meta_err(
                    "tokenizer.ggml.tokens",
                    format!(
                        "tokens {first} and {i} are both {:?}",
                        String::from_utf8_lossy(&tokens[i].text)
                    ),
                ));
            }
        }

        let mut vocab = Vocab {
            kind: input.kind,
            tokens,
            to_id,
            ids: SpecialIds::default(),
            eog: vec![false; n],
            special_cache: Vec::new(),
        };
        vocab.ids = vocab.resolve_special_ids(input.defaults, &input.keys);
        vocab.detect_special_by_text();
        vocab.mark_unused();
        vocab.build_eog();
        vocab.build_special_cache();
        vocab.apply_model_attrs(input.general_name, input.general_arch, input.pre);
        Ok(vocab)
    }

    /// Defaults out of range are dropped; keys in range replace them.
    fn resolve_special_ids(&self, defaults: SpecialIds, keys: &SpecialKeys) -> SpecialIds {
        let n = self.tokens.len() as u32;
        let pick = |default: Option<u32>, key: Option<u32>| -> Option<u32> {
            let default = default.filter(|&d| d < n);
            match key {
                Some(k) if k < n => Some(k),
                _ => default,
            }
        };
        let (mut ids, mut from_keys) = (defaults, keys.ids);
        for (_, slot) in SpecialIds::KEYS {
            *slot(&mut ids) = pick(*slot(&mut ids), *slot(&mut from_keys));
        }
        ids.fim_pre = pick(ids.fim_pre, keys.prefix);
        ids.fim_suf = pick(ids.fim_suf, keys.suffix);
        ids.fim_mid = pick(ids.fim_mid, keys.middle);
        ids
    }

    /// Finds EOT, EOM and FIM tokens by their text when no key named them,
    /// and makes sure each is a control token. llama.cpp walks a hash map
    /// here; combs walks ids in order, so the lowest matching id wins.
    fn detect_special_by_text(&mut self) {
        let slots: [(Slot, &[&str]); 8] = [
            (|s| &mut s.eot, EOT_TEXTS),
            (|s| &mut s.eom, EOM_TEXTS),
            (|s| &mut s.fim_pre, FIM_PRE_TEXTS),
            (|s| &mut s.fim_suf, FIM_SUF_TEXTS),
            (|s| &mut s.fim_mid, FIM_MID_TEXTS),
            (|s| &mut s.fim_pad, FIM_PAD_TEXTS),
            (|s| &mut s.fim_rep, FIM_REP_TEXTS),
            (|s| &mut s.fim_sep, FIM_SEP_TEXTS),
        ];
        for (slot, texts) in slots {
            if slot(&mut self.ids).is_some() {
                continue;
            }
            let found = texts.iter().filter_map(|t| self.id(t.as_bytes())).min();
            if let Some(id) = found {
                *slot(&mut self.ids) = Some(id);
                self.tokens[id as usize].attr |= attr::CONTROL;
            }
        }
    }

    /// Control tokens whose text contains "unused" are marked unused.
    fn mark_unused(&mut self) {
        for t in &mut self.tokens {
            if t.attr & attr::CONTROL != 0 && t.text.windows(6).any(|w| w == b"unused") {
                t.attr |= attr::UNUSED;
            }
        }
    }

    fn build_eog(&mut self) {
        for id in [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep]
            .into_iter()
            .flatten()
        {
            self.eog[id as usize] = true;
        }
        for text in EOG_TEXTS {
            if let Some(id) = self.id(text.as_bytes()) {
                self.eog[id as usize] = true;
                self.tokens[id as usize].attr |= attr::CONTROL;
            }
        }
        // gpt-oss: these are always rendered, never control.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(text.as_bytes()) {
                self.tokens[id as usize].attr = attr::USER_DEFINED;
            }
        }
        for id in [self.ids.eos, self.ids.eot, self.ids.eom]
            .into_iter()
            .flatten()
        {
            self.eog[id as usize] = true;
        }
        // o200k_harmony and solar-open: "<|end|>" is not EOG when the
        // vocabulary also has "<|return|>"/"<|call|>" or "<|calls|>"/"<|flush|>".
        let eog_with = |v: &Vocab, t: &str| v.id(t.as_bytes()).filter(|&i| v.eog[i as usize]);
        let has_return = eog_with(self, "<|return|>").is_some();
        let has_call =
            eog_with(self, "<|call|>").is_some() || eog_with(self, "<|calls|>").is_some();
        let has_flush = eog_with(self, "<|flush|>").is_some();
        if let Some(end) = eog_with(self, "<|end|>")
            && has_call
            && (has_return || has_flush)
        {
            self.eog[end as usize] = false;
            self.tokens[end as usize].attr = attr::USER_DEFINED;
        }
        // gemma4 and plamo2 have an ordinary "</s>".
        let normal_s_marker = eog_with(self, "<|tool_response>").is_some()
            || eog_with(self, "<|plamo:eos|>").is_some();
        if let Some(s) = eog_with(self, "</s>")
            && normal_s_marker
        {
            self.eog[s as usize] = false;
            self.tokens[s as usize].attr = attr::NORMAL;
        }
    }

    fn build_special_cache(&mut self) {
        let mut cache: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&i| {
                self.tokens[i as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN)
                    != 0
            })
            .collect();
        // llama.cpp uses an unstable sort on length; ties keep id order here.
        cache.sort_by_key(|&i| std::cmp::Reverse(self.tokens[i as usize].text.len()));
        self.special_cache = cache;
    }

    /// Per-model strip attributes that the GGUF file does not carry.
    fn apply_model_attrs(&mut self, name: Option<&str>, arch: Option<&str>, pre: Option<&str>) {
        let name = name.unwrap_or("").to_ascii_lowercase();
        let pre = pre.unwrap_or("");
        let arch = arch.unwrap_or("");
        let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        let set = |v: &mut Vocab, text: &str, bit: u32, on: bool| {
            if let Some(id) = v.id(text.as_bytes()) {
                let a = &mut v.tokens[id as usize].attr;
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            set(self, "<mask>", attr::LSTRIP, true);
        } else if any(&name, &["phi-3", "phi3"]) {
            for id in self.special_cache.clone() {
                self.tokens[id as usize].attr |= attr::RSTRIP;
            }
            set(self, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(self, "[MASK]", attr::LSTRIP, true);
        }
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The id of a token text (`text_to_token`).
    pub(crate) fn id(&self, text: &[u8]) -> Option<u32> {
        self.to_id.get(&self.tokens, text)
    }

    /// The token of one byte (`llama_vocab::byte_to_token`).
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the vocabulary has no token for the byte
    /// (llama.cpp throws `std::out_of_range` there).
    pub(crate) fn byte_to_token(&self, b: u8) -> Result<u32> {
        let found = match self.kind {
            VocabKind::Spm => {
                let hex = format!("<0x{b:02X}>");
                self.id(hex.as_bytes()).or_else(|| self.id(&[b]))
            }
            VocabKind::Bpe => {
                let mut buf = [0u8; 4];
                let s = super::unicode::BYTE_TO_CHAR[b as usize].encode_utf8(&mut buf);
                self.id(s.as_bytes())
            }
        };
        found.ok_or_else(|| {
            meta_err(
                "tokenizer.ggml.tokens",
                format!("no token for byte 0x{b:02X} (byte fallback impossible)"),
            )
        })
    }

    /// `true` when the token ends generation.
    pub(crate) fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    /// All end-of-generation ids, ascending.
    pub(crate) fn eog_ids(&self) -> Vec<u32> {
        (0..self.eog.len() as u32)
            .filter(|&i| self.eog[i as usize])
            .collect()
    }
}
